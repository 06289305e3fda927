"""benchmarks/conll_table.py: the README's results table, from committed results files."""
import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("conll_table", ROOT / "benchmarks" / "conll_table.py")
conll_table = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(conll_table)


def _run(name, dev, test):
    return {"name": name, "dev": {"ents_f": dev}, "test": {"ents_f": test}}


def test_seeds_are_averaged_and_paired_by_name(tmp_path):
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    first.write_text(json.dumps({"runs": [
        _run("fsemicrf-bs0.2-s22@seed0", 0.90, 0.84), _run("fsemicrf-bs0.2-s22@seed1", 0.92, 0.86),
        _run("semicrf-wordpool@seed0", 0.89, 0.83)]}))
    second.write_text(json.dumps({"runs": [
        _run("fsemicrf-bs0.2-s22@seed0", 0.10, 0.10),  # read once: the first file's record wins
        _run("semicrf-wordpool@seed1", 0.90, 0.83), _run("semicrf-wordpool@seed5", 0.5, 0.5)]}))
    runs = conll_table.load_runs([first, second])
    table = conll_table.build(runs)
    rows = {(r["encoder"], r["pipeline"]): r for r in table["rows"]}
    assert set(rows) == {("CNN", "fsemicrf"), ("CNN", "semicrf")}
    filtered = rows["CNN", "fsemicrf"]
    assert filtered["test_f1"]["mean"] == pytest.approx(85.0)
    assert filtered["test_f1"]["se"] == pytest.approx(1.0)  # sd 1.414 / sqrt(2)
    speed = json.loads((ROOT / "benchmarks" / "results" / "speed_cnn.json").read_text())["speed"]
    assert filtered["speed"]["relative_to_ner"] == pytest.approx(
        speed["fsemicrf"]["wps"] / speed["ner"]["wps"])
    (pair,) = table["paired"]
    assert pair["minus"] == "semicrf" and pair["test_seeds"] == ["seed0", "seed1"]  # not seed5
    assert pair["test"]["mean"] == pytest.approx(2.0)  # +1 on seed0, +3 on seed1
    assert pair["test"]["se"] == pytest.approx(1.0)
    assert pair["dev"]["mean"] == pytest.approx(1.5)
    assert "| CNN | `semicrf` | 2 | +2.00 ± 1.00 | +1.50 ± 0.50 |" in conll_table.markdown(table)


def test_the_committed_table_is_what_the_committed_files_give():
    committed = json.loads((ROOT / "benchmarks" / "results" / "conll.json").read_text())
    runs = conll_table.load_runs([conll_table.SWEEPS / name for name in conll_table.RUN_FILES])
    assert json.loads(json.dumps(conll_table.build(runs))) == committed
