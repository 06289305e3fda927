"""Rejected suggestions, as binary annotation gives them: a partly annotated corpus with the
wrong entities a pipeline suggests in its unannotated sentences marked as known to be wrong.

    python benchmarks/incorrect_spans.py --corpus training/partial-s0/unknown.spacy \
        --gold corpus/quick_train.spacy --model training/partial-s0-unknown-fsemicrf/model-best \
        --output training/partial-s0/rejected.spacy

``--corpus`` is a partly annotated corpus (``benchmarks/partial_annotation.py``: sentences
without entity annotation) and ``--gold`` the same documents fully annotated. ``--model``
predicts on each document; its entities that lie in a sentence without annotation and are not a
gold entity with that label are what an annotator would reject: they go to
``doc.spans[--key]`` (train with ``incorrect_spans_key`` set to it). The annotation is
otherwise as in ``--corpus``. Prints how many suggestions were made there, right and wrong.
"""
import argparse
import sys
from pathlib import Path
from typing import List

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from arguments import check_file, check_pipeline  # noqa: E402


def parse_args(argv: List[str] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", required=True, help="the partly annotated .spacy corpus")
    parser.add_argument("--gold", required=True, help="the same documents fully annotated")
    parser.add_argument("--model", required=True, help="the pipeline whose suggestions are judged")
    parser.add_argument("--output", required=True, help="the .spacy file to write")
    parser.add_argument("--key", default="incorrect_spans", help="doc.spans key of the rejected")
    args = parser.parse_args(argv)
    check_file(parser, "--corpus", args.corpus)
    check_file(parser, "--gold", args.gold)
    check_pipeline(parser, "--model", args.model)
    return args


def main(argv: List[str] = None) -> None:
    args = parse_args(argv)
    import spacy
    from spacy.tokens import Doc, DocBin, Span

    nlp = spacy.load(args.model)
    docs = list(DocBin().from_disk(args.corpus).get_docs(nlp.vocab))
    gold = list(DocBin().from_disk(args.gold).get_docs(nlp.vocab))
    if [d.text for d in docs] != [g.text for g in gold]:
        sys.exit("--corpus and --gold do not hold the same documents in the same order")
    out = DocBin(store_user_data=True)
    right = wrong = 0
    # the corpus's own tokens, unannotated, so that the suggestions are spans of its documents
    bare = (Doc(nlp.vocab, words=[t.text for t in d], spaces=[bool(t.whitespace_) for t in d])
            for d in docs)
    for doc, ref, predicted in zip(docs, gold, nlp.pipe(bare)):
        entities = {(e.start, e.end, e.label_) for e in ref.ents}
        rejected = []
        for ent in predicted.ents:
            if any(doc[i].ent_iob != 0 for i in range(ent.start, ent.end)):
                continue  # an annotated sentence: no suggestion is asked there
            if (ent.start, ent.end, ent.label_) in entities:
                right += 1
            else:
                wrong += 1
                rejected.append(Span(doc, ent.start, ent.end, label=ent.label_))
        doc.spans[args.key] = rejected
        out.add(doc)
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    out.to_disk(args.output)
    print(f"{len(docs)} documents; in the sentences without annotation the pipeline suggested "
          f"{right + wrong} entities, {right} right and {wrong} wrong: the wrong ones are in "
          f"doc.spans[{args.key!r}] of {args.output}")


if __name__ == "__main__":
    main()
