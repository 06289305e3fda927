"""Entities across sentence boundaries: how many a pipeline predicts, and its scores, with the
test set's sentence boundaries given to it and without them.

    python benchmarks/sentence_boundaries.py --test corpus/test.spacy \
        --models fsemicrf=training/fsemicrf/model-best crf=training/crf/model-best

Each document of ``--test`` is run twice as a fresh document of its words and spaces: without
sentence boundaries, and with those of the corpus (as a ``senter`` or ``sentencizer`` would
set them). Prints, for each pipeline and setting, the predicted entities that cross a boundary
of the corpus's sentences (the gold entities cross none) and precision, recall and F1 of
``doc.ents`` against the corpus (spaCy's scorer).
"""
import argparse
import sys
from pathlib import Path
from typing import List

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from arguments import check_file, count, named_pipelines  # noqa: E402


def parse_args(argv: List[str] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", required=True, help="NAME=PATH")
    parser.add_argument("--test", required=True)
    parser.add_argument("--batch-size", type=count, default=64)
    args = parser.parse_args(argv)
    args.models = named_pipelines(parser, "--models", args.models)
    check_file(parser, "--test", args.test)
    return args


def crossing(doc, gold) -> int:
    """The entities of ``doc`` that hold a sentence start of ``gold`` after their first token."""
    return sum(any(gold[i].is_sent_start for i in range(e.start + 1, e.end)) for e in doc.ents)


def main(argv: List[str] = None) -> None:
    args = parse_args(argv)
    import spacy
    from spacy.scorer import Scorer
    from spacy.tokens import Doc, DocBin
    from spacy.training import Example

    torch.set_num_threads(1)
    for name, path in args.models.items():
        nlp = spacy.load(path)
        gold = list(DocBin().from_disk(args.test).get_docs(nlp.vocab))
        for given in (False, True):
            docs = [Doc(nlp.vocab, words=[t.text for t in g],
                        spaces=[bool(t.whitespace_) for t in g],
                        sent_starts=[bool(t.is_sent_start) for t in g] if given else None)
                    for g in gold]
            docs = list(nlp.pipe(docs, batch_size=args.batch_size))
            scores = Scorer.score_spans([Example(d, g) for d, g in zip(docs, gold)], "ents")
            print(f"{name}, sentence boundaries {'given' if given else 'not given'}: "
                  f"{sum(crossing(d, g) for d, g in zip(docs, gold))} of "
                  f"{sum(len(d.ents) for d in docs)} entities cross one; "
                  f"P {100 * scores['ents_p']:.2f} R {100 * scores['ents_r']:.2f} "
                  f"F1 {100 * scores['ents_f']:.2f}")


if __name__ == "__main__":
    main()
