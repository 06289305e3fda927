"""scripts/benchmark.py (and scripts/evaluate.py, which runs it): options out of range and a
missing test file stop it with argparse's message, before any pipeline is loaded or scored."""
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_script(script: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "scripts" / script), *args],
                          capture_output=True, text=True, cwd=ROOT)


@pytest.mark.parametrize("option, value", [("--batch-size", "0"), ("--repeats", "0"),
                                           ("--threads", "0"), ("--limit", "-1")])
def test_an_option_below_one_is_refused(tmp_path, option, value):
    """Before: --batch-size 0 scored every pipeline 0 (nlp.pipe yielded no document) and wrote
    the results, --repeats 0 failed after the accuracy pass, --limit -1 left out the last
    document."""
    done = run_script("benchmark.py", "--models", f"x={tmp_path}", "--output",
                      str(tmp_path / "out"), option, value)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert f"error: argument {option}: must be at least 1, got {value}" in done.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("script", ["benchmark.py", "evaluate.py"])
def test_a_missing_test_file_is_named(tmp_path, script):
    (tmp_path / "model" / "meta.json").parent.mkdir()
    (tmp_path / "model" / "meta.json").write_text("{}")
    test = tmp_path / "no_such_test.spacy"
    done = run_script(script, "--models", f"x={tmp_path / 'model'}", "--test", str(test),
                      "--output", str(tmp_path / "out"))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert f"error: no such test file: {test}" in done.stderr
