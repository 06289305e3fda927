"""Record what a pipeline predicts, or check that it still predicts exactly that.

    python benchmarks/check_predictions.py --model training/quick-fsemicrf/model-best \
        --test corpus/test.spacy --save /tmp/predictions.pkl
    python benchmarks/check_predictions.py --model training/quick-fsemicrf/model-best \
        --test corpus/test.spacy --compare /tmp/predictions.pkl

Documents of several lengths are cut from the test set's running text (as in
``profile_predict.py``; without sentence boundaries), and the test documents as they are (mixed
lengths: padded batches; with the corpus's sentence boundaries where it has them, which no
predicted entity then crosses), run through ``nlp.pipe`` at several batch sizes, on one thread.
For each document it records ``doc.ents``, the span group of the ``fsemicrf_ner`` component
with the bytes of its ``attrs["scores"]`` and its ``attrs["path_probability"]``: a speed change
of the prediction path must leave all of them bit for bit the same. A second pass with a
``filter_margin`` (``--margin``) and a candidates key also records the candidates: a wider
filter keeps overlapping nodes, so that the marginals, the path probabilities below 1 and the
solvers of larger clusters are checked too (the other heads have no filter: their second pass
only adds the candidates). ``--compare`` exits with status 1 and names the first differences
when they are not.
"""
import argparse
import pickle
import sys
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from profile_predict import check_lengths, cut_docs  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from arguments import check_file, check_pipeline, count  # noqa: E402

Record = Tuple[tuple, tuple, bytes, float, tuple]


def record(nlp, docs, batch_size: int, key: str, candidates: Optional[str]) -> List[Record]:
    """``(ents, spans, score bytes, path probability, candidates)`` of each document after
    ``nlp.pipe`` (candidates ``()`` without a ``candidates`` key)."""
    out = []
    for doc in nlp.pipe([d.copy() for d in docs], batch_size=batch_size):
        group = doc.spans[key]
        cands = ()
        if candidates is not None:
            found = doc.spans[candidates]
            cands = (tuple((s.start, s.end, s.label_) for s in found), found.attrs["scores"].tobytes())
        out.append((
            tuple((e.start, e.end, e.label_) for e in doc.ents),
            tuple((s.start, s.end, s.label_) for s in group),
            group.attrs["scores"].tobytes(),
            group.attrs["path_probability"],
            cands,
        ))
    return out


def doc_length(text: str) -> int:
    """A document length, or 0 for the test documents as they are."""
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 (the test documents) or more, got {value}")
    return value


def described(setting: Tuple[int, int, float, bool]) -> str:
    length, batch_size, margin, candidates = setting
    return f"length {length} batch {batch_size} margin {margin}" + (
        " with candidates" if candidates else "")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--test", required=True)
    parser.add_argument("--lengths", type=doc_length, nargs="+", default=[0, 10, 35, 150, 1500],
                        help="document lengths; 0 for the test documents as they are")
    parser.add_argument("--batch-sizes", type=count, nargs="+", default=[1, 7, 64])
    parser.add_argument("--tokens", type=count, default=20000, help="tokens per length")
    parser.add_argument("--margin", type=float, default=3.0, help="filter_margin of the second pass")
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--save")
    group.add_argument("--compare")
    args = parser.parse_args(argv)
    check_pipeline(parser, "--model", args.model)
    check_file(parser, "--test", args.test)
    if args.compare:  # read after every prediction is made
        check_file(parser, "--compare", args.compare)
    elif not Path(args.save).parent.is_dir():
        parser.error(f"--save {args.save}: no such directory: {Path(args.save).parent}")
    torch.set_num_threads(1)
    import spacy
    from spacy.tokens import DocBin

    nlp = spacy.load(args.model)
    ner = nlp.get_pipe("fsemicrf_ner")
    key = ner.spans_key
    test = list(DocBin().from_disk(args.test).get_docs(nlp.vocab))
    if not test:  # nothing predicted would compare as identical
        parser.error(f"--test {args.test} has no document")
    check_lengths(parser, test, args.lengths)
    # (length, batch size, margin, whether the candidates are recorded): a margin of 0 in the
    # second pass must not write over the first pass's records
    results: Dict[Tuple[int, int, float, bool], List[Record]] = {}
    # only the filtered head has a filter to widen; the others' second pass adds the candidates
    margin = args.margin if ner.model.attrs.get("arch") == "FilteredSemiCRF" else 0.0
    for margin, candidates in ((0.0, None), (margin, "check_candidates")):
        ner.filter_margin, ner.candidates_key = margin, candidates
        for length in args.lengths:
            # 0: the test documents as they are, of mixed lengths, so that batches are padded
            docs = [d.copy() for d in test] if length == 0 else cut_docs(nlp, test, length, args.tokens)
            for batch_size in args.batch_sizes:
                setting = (length, batch_size, margin, candidates is not None)
                results[setting] = record(nlp, docs, batch_size, key, candidates)
    n_docs = sum(len(r) for r in results.values())
    n_ents = sum(len(rec[1]) for r in results.values() for rec in r)
    path_below_1 = sum(rec[3] < 1 for r in results.values() for rec in r)
    if args.save:
        Path(args.save).write_bytes(pickle.dumps(results))
        print(f"saved {n_docs} documents ({n_ents} entities, {path_below_1} paths of probability "
              f"below 1) to {args.save}")
        return
    expected = pickle.loads(Path(args.compare).read_bytes())
    bad = 0
    for setting, recs in results.items():
        if setting not in expected:
            print(f"{described(setting)}: not in {args.compare}")
            bad += 1
            continue
        if len(recs) != len(expected[setting]):  # zip would compare the shorter list only
            print(f"{described(setting)}: {len(recs)} documents, {len(expected[setting])} in "
                  f"{args.compare}")
            bad += 1
            continue
        for i, (got, want) in enumerate(zip(recs, expected[setting])):
            if got != want:
                bad += 1
                if bad <= 10:
                    print(f"{described(setting)} doc {i}:\n"
                          f"  got  {got}\n  want {want}")
    if bad:
        print(f"{bad} documents differ")
        sys.exit(1)
    print(f"identical: {n_docs} documents ({n_ents} entities), scores and path probabilities bit for bit")


if __name__ == "__main__":
    main()
