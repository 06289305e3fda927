"""Accuracy only: test P/R/F1 (overall and per entity type) of every trained pipeline.

    python scripts/evaluate.py [--models ...] [--test corpus/test.spacy] [--output benchmarks/results]

Same options as scripts/benchmark.py (which also measures speed); writes OUTPUT/accuracy.{json,md,png}.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchmark import main  # noqa: E402

if __name__ == "__main__":
    argv = sys.argv[1:]
    if "--prefix" not in argv:
        argv += ["--prefix", "accuracy"]
    main(argv + ["--no-speed"])
