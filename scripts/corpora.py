"""The multi-corpus benchmark: the three heads and averaged spaCy `ner` on several corpora.

    python scripts/corpora.py --output benchmarks/results/corpora --seeds 4 --steps 6000 \
        --eval-frequency 1000 [--corpora conll,nemo,msra] [--pipelines fsemicrf,semicrf,crf,ner] \
        [--workers 2] [--gpu-id 0] [--time-limit SECONDS]

Prepares each corpus that corpus/<name>/ lacks (CoNLL-2003 with scripts/prepare_conll.py, the
others with scripts/prepare_corpus.py), then trains every pipeline on every corpus with the same
budget (``--steps`` and ``--eval-frequency``, the configs' batcher) for seeds 0..N-1, one CPU
thread per run (scripts/train.py), scores model-best on dev and test with ``spacy evaluate`` and
writes OUTPUT.{json,md,png} (scripts/corpora_report.py). With ``--gpu-id`` the runs train on
that GPU (scoring stays on the CPU); with ``--time-limit`` a run still training after that many
seconds is stopped and scored at its model-best, its record saying at which step it stopped.
A run whose run.json exists is not run again, and a finished training without scores is only
evaluated (an interrupted one is trained again), so an interrupted benchmark resumes.
Non-English corpora override ``[nlp] lang`` (and Chinese its character tokenizer); the product
configs are used as they are otherwise. `ner` is the project's baseline with parameter averaging.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import corpora_report  # noqa: E402
from arguments import count, seconds  # noqa: E402
from prepare_corpus import CORPORA  # noqa: E402
from train import TIME_LIMIT_STATUS, thread_env  # noqa: E402

PIPELINES: Dict[str, List[str]] = {
    "fsemicrf": ["configs/fsemicrf_cnn.cfg"],
    "semicrf": ["configs/semicrf_cnn.cfg"],
    "crf": ["configs/crf_cnn.cfg"],
    "ner": ["configs/baselines/ner_cnn.cfg", "--training.optimizer.use_averages", "true"],
}
ZH_TOKENIZER = '{"@tokenizers":"spacy.zh.ChineseTokenizer","segmenter":"char"}'
LANG_OVERRIDES: Dict[str, List[str]] = {
    "en": [],
    "he": ["--nlp.lang", "he"],
    "zh": ["--nlp.lang", "zh", "--nlp.tokenizer", ZH_TOKENIZER],
}
ALL_CORPORA = ["conll", *CORPORA]


def corpus_lang(corpus: str) -> str:
    return "en" if corpus == "conll" else CORPORA[corpus].lang


def prepare_command(corpus: str, folder: Path) -> List[str]:
    if corpus == "conll":
        return [sys.executable, str(HERE / "prepare_conll.py"), "--output", str(folder)]
    return [sys.executable, str(HERE / "prepare_corpus.py"), corpus, "--output", str(folder)]


def prepare(corpus: str, corpus_dir: Path) -> Path:
    folder = corpus_dir / corpus
    if not all((folder / f"{split}.spacy").exists() for split in ("train", "dev", "test")):
        subprocess.run(prepare_command(corpus, folder), check=True)
    return folder


@dataclass
class Run:
    """One training run: a pipeline on a corpus with a seed."""

    corpus: str
    pipeline: str
    seed: int
    folder: Path  # the corpus's .spacy files
    out: Path  # training output: model-best, train_log.txt, metrics, run.json
    steps: int
    eval_frequency: int
    gpu_id: int = -1
    time_limit: Optional[float] = None
    extra: List[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"{self.corpus}/{self.pipeline}@seed{self.seed}"

    def train_command(self) -> List[str]:
        config, *pipeline_overrides = PIPELINES[self.pipeline]
        return [sys.executable, str(HERE / "train.py"), config, str(self.out), "--name",
                self.name.replace("/", "-"),
                "--paths.train", str(self.folder / "train.spacy"),
                "--paths.dev", str(self.folder / "dev.spacy"),
                "--training.max_steps", str(self.steps),
                "--training.eval_frequency", str(self.eval_frequency),
                "--system.seed", str(self.seed), "--gpu-id", str(self.gpu_id),
                *(["--time-limit", str(self.time_limit)] if self.time_limit else []),
                *LANG_OVERRIDES[corpus_lang(self.corpus)], *pipeline_overrides, *self.extra]

    def evaluate_command(self, split: str) -> List[str]:
        return [sys.executable, "-m", "spacy", "evaluate", str(self.out / "model-best"),
                str(self.folder / f"{split}.spacy"), "--output", str(self.out / f"{split}_metrics.json")]


def entity_scores(scores: Dict[str, Any]) -> Dict[str, Any]:
    """``ents_p/r/f`` of a ``spacy evaluate`` score dict."""
    return {f"ents_{k}": scores.get(f"ents_{k}") for k in ("p", "r", "f")}


def record(run: Run) -> Dict[str, Any]:
    summary = json.loads((run.out / "train_summary.json").read_text())
    rec: Dict[str, Any] = {"name": run.name, "corpus": run.corpus, "pipeline": run.pipeline,
                           "seed": run.seed, "command": " ".join(run.train_command()),
                           **{k: summary.get(k) for k in ("wall_time_s", "steps_run", "best_step")}}
    if summary.get("stopped_by_time_limit"):
        rec["stopped_by_time_limit"] = summary["stopped_by_time_limit"]
    rec["dev_curve"] = corpora_report.dev_curve(summary)
    for split in ("dev", "test"):
        rec[split] = entity_scores(json.loads((run.out / f"{split}_metrics.json").read_text()))
    return rec


def execute(run: Run) -> Dict[str, Any]:
    """Train (unless a finished training left train_summary.json) and score one run; returns
    its record. A training cut off before its end has a model-best but no summary: trained again."""
    done = run.out / "run.json"
    if done.exists():
        return json.loads(done.read_text())
    run.out.mkdir(parents=True, exist_ok=True)
    if not (run.out / "train_summary.json").exists():
        train(run)
    for split in ("dev", "test"):
        subprocess.run(run.evaluate_command(split), check=True, env=thread_env(),
                       stdout=subprocess.DEVNULL)
    rec = record(run)
    done.write_text(json.dumps(rec, indent=2) + "\n")
    print(f"[corpora] {run.name}: dev F1 {100 * rec['dev']['ents_f']:.2f} "
          f"test F1 {100 * rec['test']['ents_f']:.2f} ({rec['wall_time_s']} s)", flush=True)
    return rec


def train(run: Run) -> None:
    """Train one run (scripts/train.py, which stops it at ``run.time_limit`` seconds)."""
    with open(run.out / "stdout.txt", "w") as log:
        rc = subprocess.call(run.train_command(), stdout=log, stderr=subprocess.STDOUT,
                             env=thread_env())
    if rc == TIME_LIMIT_STATUS and not (run.out / "model-best").exists():
        raise RuntimeError(f"{run.name}: stopped by the time limit before its first evaluation")
    if rc not in (0, TIME_LIMIT_STATUS):
        raise RuntimeError(f"{run.name}: training failed (rc={rc}), see {run.out / 'stdout.txt'}")


def attempt(run: Run) -> Optional[Dict[str, Any]]:
    """`execute`, a failure reported instead of raised so that the other runs go on."""
    try:
        return execute(run)
    except (RuntimeError, subprocess.CalledProcessError, OSError, ValueError) as err:
        print(f"[corpora] {run.name} failed: {err}", flush=True)
        return None


def plan(args: argparse.Namespace, folders: Dict[str, Path]) -> List[Run]:
    return [Run(corpus, pipeline, seed, folders[corpus], args.training_dir / corpus / f"{pipeline}@seed{seed}",
                args.steps, args.eval_frequency, args.gpu_id, args.time_limit)
            for seed in range(args.seeds) for corpus in args.corpora for pipeline in args.pipelines]


def csv_choice(allowed: List[str]):
    def parse(text: str) -> List[str]:
        items = [t for t in text.split(",") if t]
        bad = [t for t in items if t not in allowed]
        if bad:
            raise argparse.ArgumentTypeError(f"unknown {bad}; choose from {allowed}")
        return items
    return parse


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--output", type=Path, default=Path("benchmarks/results/corpora"),
                   help="path stem of the .json/.md/.png results")
    p.add_argument("--seeds", type=count, default=4, help="seeds 0..N-1")
    p.add_argument("--steps", type=count, default=6000)
    p.add_argument("--eval-frequency", type=count, default=1000)
    p.add_argument("--corpora", type=csv_choice(ALL_CORPORA), default=ALL_CORPORA)
    p.add_argument("--pipelines", type=csv_choice(list(PIPELINES)), default=list(PIPELINES))
    p.add_argument("--workers", type=count, default=2, help="parallel runs, one thread each")
    p.add_argument("--gpu-id", type=int, default=-1, help="train on this GPU (-1: the CPU)")
    p.add_argument("--time-limit", type=seconds, default=None,
                   help="stop a run after this many seconds and score its model-best")
    p.add_argument("--corpus-dir", type=Path, default=Path("corpus"))
    p.add_argument("--training-dir", type=Path, default=Path("training/corpora"))
    args = p.parse_args(argv)

    folders = {corpus: prepare(corpus, args.corpus_dir) for corpus in args.corpora}
    runs = plan(args, folders)
    print(f"[corpora] {len(runs)} runs ({len(args.corpora)} corpora x {len(args.pipelines)} pipelines "
          f"x {args.seeds} seeds), {args.workers} at a time", flush=True)
    with ThreadPoolExecutor(max_workers=args.workers) as pool:
        results = list(pool.map(attempt, runs))
    records = [r for r in results if r is not None]
    stats = {c: json.loads((folders[c] / "stats.json").read_text()) for c in args.corpora
             if (folders[c] / "stats.json").exists()}
    command = "python scripts/corpora.py " + " ".join(argv if argv is not None else sys.argv[1:])
    corpora_report.write(records, args.output, stats, command, args.corpora, list(PIPELINES))
    print(f"[corpora] wrote {args.output.with_suffix('.md')}", flush=True)
    if len(records) < len(runs):
        sys.exit(f"[corpora] {len(runs) - len(records)} run(s) failed; run the command again to resume")


if __name__ == "__main__":
    main()
