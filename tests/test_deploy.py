"""The wheels of ``scripts/package.py`` install and run on a machine without this repository.

A small trained pipeline is packaged; a fresh virtual environment gets only ``torch`` (the
build this environment runs), then ``pip install <packages>/*.whl`` from a directory outside
the repository with PYTHONPATH cleared, which must pull spacy-fsemicrf from its own wheel and
the rest from the package index; the installed pipeline, loaded by its package name, must
predict what the pipeline predicts here.
"""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parent.parent
NAME, VERSION = "fsemicrf_deploy_check", "0.0.1"
TEXTS = [
    "John Smith works for Google in Paris .",
    "Mary flew to Berlin on Monday .",
    "Nobody said anything about it .",
    "Laura Palmer moved to Rome with Amazon .",
]
PREDICT = """
import json, sys
import spacy, spacy_fsemicrf
nlp = spacy.load(sys.argv[1])
docs = nlp.pipe(json.loads(sys.argv[2]))
out = [[[e.start_char, e.end_char, e.label_] for e in doc.ents] for doc in docs]
print(json.dumps({"ents": out, "package_file": spacy_fsemicrf.__file__}))
"""


def outside_env() -> dict:
    """This environment without anything that points Python at this repository or its venv."""
    drop = ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["PYTHONNOUSERSITE"] = "1"
    return env


def run(cmd, cwd: Path, timings: dict, step: str) -> str:
    start = time.perf_counter()
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, env=outside_env(),
                          capture_output=True, text=True, timeout=900)
    timings[step] = round(time.perf_counter() - start, 1)
    assert proc.returncode == 0, f"{step} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


@pytest.mark.slow
def test_wheels_install_into_a_fresh_venv_and_predict(trained_nlp, tmp_path):
    timings: dict = {}
    trained_nlp.to_disk(tmp_path / "model")
    packages = tmp_path / "packages"
    run([sys.executable, REPO / "scripts" / "package.py", tmp_path / "model", packages,
         "--name", NAME, "--version", VERSION], REPO, timings, "package")
    wheels = sorted(p.name for p in packages.glob("*.whl"))
    assert len(wheels) == 2
    assert wheels[0].startswith(f"en_{NAME}-{VERSION}+model.")
    assert wheels[1].startswith("spacy_fsemicrf-")

    # A deployment machine: elsewhere on disk, a venv holding only torch.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", venv], elsewhere, timings, "venv")
    python = venv / "bin" / "python"
    torch_version = torch.__version__.split("+")[0]
    run([python, "-m", "pip", "install", "--quiet", f"torch=={torch_version}"], elsewhere,
        timings, "install torch")
    run([python, "-m", "pip", "install", "--quiet", *sorted(packages.glob("*.whl"))], elsewhere,
        timings, "install wheels")
    out = json.loads(run([python, "-c", PREDICT, f"en_{NAME}", json.dumps(TEXTS)], elsewhere,
                         timings, "load and predict").strip().splitlines()[-1])
    print("fresh-venv timings (s):", timings)

    assert Path(out["package_file"]).is_relative_to(venv)
    expected = [[[e.start_char, e.end_char, e.label_] for e in doc.ents]
                for doc in trained_nlp.pipe(TEXTS)]
    assert any(expected)
    assert out["ents"] == expected
