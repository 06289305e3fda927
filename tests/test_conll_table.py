"""benchmarks/conll_table.py: the README's results table, from committed results files."""
import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("conll_table", ROOT / "benchmarks" / "conll_table.py")
conll_table = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(conll_table)


def _run(pipeline, seed, dev, test):
    return {"encoder": "CNN", "pipeline": pipeline, "trained": "a config", "seed": seed,
            "dev_f1": dev, "test_f1": test}


def test_seeds_are_averaged_and_paired_by_seed():
    data = {"runs": [
        _run("fsemicrf", "seed0", 90.0, 84.0), _run("fsemicrf", "seed1", 92.0, 86.0),
        _run("semicrf", "seed0", 89.0, 83.0), _run("semicrf", "seed1", 90.0, 83.0),
        _run("semicrf", "seed5", 50.0, 50.0)]}
    table = conll_table.build(data)
    rows = {(r["encoder"], r["pipeline"]): r for r in table["rows"]}
    assert set(rows) == {("CNN", "fsemicrf"), ("CNN", "semicrf")}
    filtered = rows["CNN", "fsemicrf"]
    assert filtered["test_f1"]["mean"] == pytest.approx(85.0)
    assert filtered["test_f1"]["se"] == pytest.approx(1.0)  # sd 1.414 / sqrt(2)
    speed = json.loads((ROOT / "benchmarks" / "results" / "speed_cnn.json").read_text())["speed"]
    # the speed table's row of the same name: the present config's seed-0 model
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
    assert json.loads(json.dumps(conll_table.build(json.loads(conll_table.RUNS.read_text())))) == committed
