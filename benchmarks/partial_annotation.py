"""A partly annotated training corpus, two ways: sentences left without entity annotation, or
the same sentences annotated as holding no entity.

    python benchmarks/partial_annotation.py --train corpus/quick_train.spacy \
        --output training/partial --fraction 0.5 --seed 0

Each sentence of each document of ``--train`` is left without entity annotation with
probability ``--fraction`` (seeded): ``OUTPUT/unknown.spacy`` has its tokens without annotation
(``ENT_IOB`` 0, which the heads learn as unknown), ``OUTPUT/outside.spacy`` the same tokens
annotated ``O`` (what a corpus that marks nothing there says, and how a loss that reads
missing annotation as "no entity" learns it). Training a pipeline on each and scoring both on
a fully annotated test set measures what reading the missing annotation as unknown is worth.
Prints how many gold entities the skipped sentences held.
"""
import argparse
import random
import sys
from pathlib import Path
from typing import List, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from arguments import check_file  # noqa: E402


def parse_args(argv: List[str] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--train", required=True, help="a .spacy corpus with sentence starts")
    parser.add_argument("--output", required=True, help="directory for the two corpora")
    parser.add_argument("--fraction", type=float, default=0.5,
                        help="share of the sentences left without annotation")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    check_file(parser, "--train", args.train)
    if not 0.0 <= args.fraction <= 1.0:
        parser.error(f"--fraction must be in [0, 1], got {args.fraction}")
    return args


def skip_sentences(doc, rng: random.Random, fraction: float) -> Tuple[List[str], List[str], int]:
    """The IOB tags of ``doc`` with the sentences skipped by ``rng`` without annotation (``""``)
    and, second, annotated ``O``; and the number of gold entities they held."""
    tags = [f"{t.ent_iob_}-{t.ent_type_}" if t.ent_type_ else t.ent_iob_ or "" for t in doc]
    unknown, outside = list(tags), list(tags)
    lost = 0
    for sent in doc.sents:
        if rng.random() >= fraction:
            continue
        lost += sum(1 for t in sent if t.ent_iob_ == "B")
        for i in range(sent.start, sent.end):
            unknown[i], outside[i] = "", "O"
    return unknown, outside, lost


def main(argv: List[str] = None) -> None:
    args = parse_args(argv)
    import spacy
    from spacy.tokens import Doc, DocBin

    nlp = spacy.blank("en")
    docs = list(DocBin().from_disk(args.train).get_docs(nlp.vocab))
    rng = random.Random(args.seed)
    out = {"unknown": DocBin(), "outside": DocBin()}
    total = lost = 0
    for doc in docs:
        unknown, outside, n = skip_sentences(doc, rng, args.fraction)
        total, lost = total + len(doc.ents), lost + n
        words, spaces = [t.text for t in doc], [bool(t.whitespace_) for t in doc]
        starts = [bool(t.is_sent_start) for t in doc]
        for name, tags in (("unknown", unknown), ("outside", outside)):
            out[name].add(Doc(nlp.vocab, words=words, spaces=spaces, sent_starts=starts,
                              ents=tags))
    path = Path(args.output)
    path.mkdir(parents=True, exist_ok=True)
    for name, docbin in out.items():
        docbin.to_disk(path / f"{name}.spacy")
    print(f"{len(docs)} documents, {total} gold entities; {lost} of them in the sentences left "
          f"without annotation: {path / 'unknown.spacy'} (unknown), {path / 'outside.spacy'} "
          f"(annotated O)")


if __name__ == "__main__":
    main()
