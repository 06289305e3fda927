"""research/scripts/sweep.py: job files, and the tables it builds from finished runs (no training here;
the shipped job files are checked against the shipped configs)."""
import json
from pathlib import Path

import pytest
import sweep

RESEARCH = Path(__file__).resolve().parents[1]


def _finished_run(out: Path, name: str, dev_f: float, test_f: float, key: str = "ents") -> None:
    run = out / name
    run.mkdir(parents=True)
    summary = {"wall_time_s": 10.0, "steps_run": 20, "best_step": 10, "time_to_best_s": 5.0,
               "dev_performance_model_best": {f"{key}_f": dev_f}}
    (run / "train_summary.json").write_text(json.dumps(summary))
    metrics = {f"{key}_p": test_f, f"{key}_r": test_f, f"{key}_f": test_f, f"{key}_per_type": {}}
    (run / "test_metrics.json").write_text(json.dumps(metrics))


def test_jobs_take_the_defaults_and_names_must_be_unique(tmp_path):
    path = tmp_path / "jobs.json"
    path.write_text(json.dumps({"defaults": {"training.max_steps": 5, "system.seed": 0},
                                "jobs": [{"name": "a@seed1", "config": "c.cfg", "overrides": {"system.seed": 1}},
                                         {"name": "b", "config": "c.cfg"}]}))
    jobs = sweep.load_jobs(path)
    assert jobs[0]["overrides"] == {"training.max_steps": 5, "system.seed": 1}
    assert jobs[1]["overrides"] == {"training.max_steps": 5, "system.seed": 0}
    path.write_text(json.dumps([{"name": "a", "config": "c.cfg"}, {"name": "a", "config": "d.cfg"}]))
    with pytest.raises(ValueError, match="duplicate"):
        sweep.load_jobs(path)


def test_collect_groups_seeds_and_skips_unfinished_runs(tmp_path):
    jobs = tmp_path / "jobs.json"
    jobs.write_text(json.dumps([{"name": f"x@seed{i}", "config": "c.cfg"} for i in range(3)]
                               + [{"name": "y", "config": "c.cfg"}]))
    out = tmp_path / "runs"
    _finished_run(out, "x@seed0", 0.80, 0.70)
    _finished_run(out, "x@seed1", 0.90, 0.74, key="spans_sc")  # spancat's score names
    _finished_run(out, "y", 0.5, 0.5)  # x@seed2 never finished
    sweep.main([str(jobs), "--output", str(out), "--results", str(tmp_path / "res"), "--collect",
                "--reference", "y"])
    groups = {g["group"]: g for g in json.loads((tmp_path / "res.json").read_text())["groups"]}
    assert groups["x"]["runs"] == 2
    assert groups["x"]["dev_f1_mean"] == pytest.approx(85.0)
    assert groups["x"]["test_f1_mean"] == pytest.approx(72.0)
    assert groups["x"]["test_f1_sd"] == pytest.approx(2.83, abs=0.01)
    assert groups["y"]["test_f1_sd"] is None
    assert "| x | 2 | 85.00 (7.07) | 72.00 (2.83) | 70.00, 74.00 | +22.00 |" in (tmp_path / "res.md").read_text()


def test_a_failed_rerun_keeps_no_figure_of_the_run_before(tmp_path, monkeypatch):
    """The training fails (status 1, no summary written): the earlier run's summary and test
    metrics in the same folder were read as this run's."""
    import argparse

    _finished_run(tmp_path / "runs", "x@seed0", 0.80, 0.70)
    monkeypatch.setattr(sweep.subprocess, "call", lambda *a, **k: 1)
    args = argparse.Namespace(output=tmp_path / "runs", train=Path("t.spacy"),
                              dev=Path("d.spacy"), test=Path("e.spacy"), no_test=False)
    result = sweep.run_job({"name": "x@seed0", "config": "c.cfg", "overrides": {}}, args)
    assert result["returncode"] == 1 and "dev" not in result and "test" not in result


def test_earlier_runs_join_the_table_unless_rerun(tmp_path):
    jobs = tmp_path / "jobs.json"
    jobs.write_text(json.dumps([{"name": "x@seed0", "config": "c.cfg"}]))
    out = tmp_path / "runs"
    _finished_run(out, "x@seed0", 0.80, 0.70)
    earlier = tmp_path / "earlier.json"
    earlier.write_text(json.dumps({"runs": [
        {"name": "x@seed0", "dev": {"ents_f": 0.1}, "test": {"ents_f": 0.1}},  # rerun here: dropped
        {"name": "ner@seed0", "dev": {"ents_f": 0.6}, "test": {"ents_f": 0.6}},
        {"name": "spancat@seed0", "dev": {"ents_f": 0.9}, "test": {"ents_f": 0.9}},  # not asked for
    ]}))
    again = tmp_path / "again.json"  # names ner@seed0 a second time: taken once
    again.write_text(json.dumps({"runs": [
        {"name": "ner@seed0", "dev": {"ents_f": 0.2}, "test": {"ents_f": 0.2}},
    ]}))
    sweep.main([str(jobs), "--output", str(out), "--results", str(tmp_path / "res"), "--collect",
                "--add-runs", str(earlier), str(again), "--add-groups", "x", "ner",
                "--reference", "ner"])
    groups = {g["group"]: g for g in json.loads((tmp_path / "res.json").read_text())["groups"]}
    assert set(groups) == {"x", "ner"}
    assert groups["x"]["test_f1_runs"] == [70.0] and groups["ner"]["test_f1_runs"] == [60.0]
    text = (tmp_path / "res.md").read_text()
    assert "+10.00 |" in text and f"runs added from `{earlier}`; runs added from `{again}`" in text


JOBS_FILES = sorted(path.name for path in (RESEARCH / "sweeps").glob("*.json")
                    if "jobs" in json.loads(path.read_text()))


@pytest.mark.parametrize("name", JOBS_FILES)
def test_shipped_job_files_name_existing_files(name):
    """Every config, ``--code`` file and earlier results file a jobs file names exists."""
    path = RESEARCH / "sweeps" / name
    for job in sweep.load_jobs(path):
        assert (sweep.ROOT / job["config"]).exists(), job
        assert "code" not in job or (sweep.ROOT / job["code"]).exists(), job
    for added in sweep.table_options(path).get("add_runs", []):
        assert (sweep.ROOT / added).exists(), added


def test_table_options_come_from_the_jobs_file_unless_given(tmp_path, monkeypatch):
    jobs = tmp_path / "jobs.json"
    jobs.write_text(json.dumps({"jobs": [{"name": "x", "config": "c.cfg"}],
                                "table": {"output": "training/x", "reference": "ner",
                                          "add_runs": ["research/results/sweeps/a.json"]}}))
    monkeypatch.chdir(tmp_path)
    args = sweep.argparse.Namespace(jobs=Path("jobs.json"), output=None, results=Path("res"),
                                    reference=None, add_runs=None, add_groups=None, paired=None)
    sweep.resolve_options(args)
    assert args.output == sweep.ROOT / "training" / "x"  # from the file: the repository root
    assert args.results == tmp_path / "res"  # from the command line: the working directory
    assert args.reference == "ner" and args.paired == [] and args.add_groups is None
    assert args.add_runs == [sweep.ROOT / "research" / "results" / "sweeps" / "a.json"]
    jobs.write_text(json.dumps({"jobs": [], "table": {"results_dir": "x"}}))
    with pytest.raises(ValueError, match="results_dir"):
        sweep.table_options(jobs)


def test_paired_differences_match_seeds_by_name(tmp_path):
    jobs = tmp_path / "jobs.json"
    jobs.write_text(json.dumps([{"name": f"new@seed{i}", "config": "c.cfg"} for i in range(3)]
                               + [{"name": f"old@seed{i}", "config": "c.cfg"} for i in (0, 1, 5)]))
    out = tmp_path / "runs"
    for i, (dev_new, dev_old) in enumerate([(0.90, 0.88), (0.86, 0.85), (0.80, 0.70)]):
        _finished_run(out, f"new@seed{i}", dev_new, dev_new)
        _finished_run(out, f"old@seed{(0, 1, 5)[i]}", dev_old, dev_old - 0.01)
    sweep.main([str(jobs), "--output", str(out), "--results", str(tmp_path / "res"), "--collect",
                "--paired", "new", "old"])
    (row,) = json.loads((tmp_path / "res.json").read_text())["paired"]
    assert row["seeds"] == ["seed0", "seed1"]  # new@seed2 and old@seed5 have no partner
    assert row["dev_diffs"] == [2.0, 1.0]
    assert row["dev_mean"] == pytest.approx(1.5)
    assert row["dev_se"] == pytest.approx(0.5)  # sd 0.707 over sqrt(2)
    assert row["test_mean"] == pytest.approx(2.5)
    assert "| new | old | 2 | +1.50 (0.50) | +2.50 (0.50) | +2.00, +1.00 |" in (tmp_path / "res.md").read_text()
