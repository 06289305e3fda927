"""The repository the research scripts work in: its root (where configs, corpus and training
live), with the product's scripts (train.py, benchmark.py, kept_nodes.py) made importable."""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT / "scripts") not in sys.path:
    sys.path.insert(0, str(ROOT / "scripts"))
