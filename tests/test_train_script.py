"""scripts/train.py --from-log: a run stopped before spaCy wrote its summary (e.g. by a time
limit) gets one rebuilt from its console log, naming the command that trained it."""
import json
import subprocess
import sys
from pathlib import Path

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
