"""The research tests use the fixtures of the package's own suite (tests/conftest.py) and import
the research scripts as modules.

    .venv/bin/python -m pytest -q research/tests
"""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
for path in (ROOT, ROOT / "research" / "scripts"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from tests.conftest import *  # noqa: E402,F401,F403  (fixtures: trained, trained_nlp, corpus_paths)
