"""What keeping freed heap in worker processes is worth: the same two parallel ways, side by side,
with :func:`spacy_fsemicrf.worker_heap.keep_freed_heap` and without it.

    python benchmarks/worker_heap.py MODEL [--test corpus/test.spacy] \
        [--output benchmarks/results/worker_heap]

* ``nlp.pipe(n_process=2)``, in a new process right after ``spacy.load`` (only the call is
  timed) and in this process, which has predicted; "without" skips the call in the fork
  handler, so the workers keep the heap settings they inherit;
* ``annotate`` on a warm Dask LocalCluster of 2 workers; "without" skips the call when the worker
  loads the pipeline, so the nanny's ``MALLOC_TRIM_THRESHOLD_=65536`` stays.

Reported per way: the median wall time of ``--repeats`` interleaved runs, the speedup over
``nlp.pipe`` (PyTorch's default threads) in the same state in the same runs (in a new process
right after loading for the ways timed there, in this process for the others), and for
``n_process`` the page faults and system CPU time of its worker processes (their resource use
once they have exited). Writes OUTPUT.json and OUTPUT.md.
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List

import spacy
import srsly
from spacy.tokens import DocBin

import spacy_fsemicrf.annotate.engine as engine
import spacy_fsemicrf.fork_safety as fork_safety
from spacy_fsemicrf.worker_heap import keep_freed_heap
from scale import Dask, checked, common_arguments, entity_tuples, load_average, time_interleaved


def parse_args() -> argparse.Namespace:
    parser = common_arguments(__doc__, "benchmarks/results/worker_heap", repeats=5)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--n-process", type=int, default=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    # a child reads its texts from stdin: it is not given the --test of its parent
    return args if args.child is not None else checked(parser)


def no_op() -> bool:
    return False


def skip_keep_freed_heap() -> None:
    """On a Dask worker: load pipelines without the heap setting."""
    engine.keep_freed_heap = no_op


class PipeRun:
    """``nlp.pipe(texts, n_process=n)``, with or without the fork handler's heap setting, in this
    process (which has predicted) or, ``fresh``, in a new process right after ``spacy.load``
    (timing only the call); records its workers' page faults and system time."""

    def __init__(self, nlp, model: str, texts: List[str], batch_size: int, keep: bool,
                 fresh: bool, n_process: int = 2) -> None:
        self.nlp, self.model, self.texts, self.batch_size = nlp, model, texts, batch_size
        self.keep, self.fresh, self.n_process = keep, fresh, n_process
        self.faults: List[int] = []
        self.sys_s: List[float] = []
        self.seconds: List[float] = []

    def __call__(self) -> List[tuple]:
        if self.fresh:
            proc = subprocess.run(
                [sys.executable, __file__, self.model, "--child", str(int(self.keep)),
                 "--batch-size", str(self.batch_size), "--n-process", str(self.n_process)],
                input=json.dumps(self.texts), capture_output=True, text=True, check=True)
            out = json.loads(proc.stdout.strip().splitlines()[-1])
        else:
            out = pipe_timed(self.nlp, self.texts, self.batch_size, self.keep, self.n_process)
        self.faults.append(out["faults"])
        self.sys_s.append(out["sys_s"])
        self.seconds.append(out["seconds"])
        return [tuple(tuple(e) for e in doc) for doc in out["entities"]]


def pipe_timed(nlp, texts: List[str], batch_size: int, keep: bool, n_process: int) -> Dict:
    """One timed ``nlp.pipe(texts, n_process=n_process)``: seconds, entities, the workers'
    faults and system time."""
    fork_safety.keep_freed_heap = keep_freed_heap if keep else no_op
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    try:
        got = entity_tuples(nlp.pipe(texts, batch_size=batch_size, n_process=n_process))
    finally:
        fork_safety.keep_freed_heap = keep_freed_heap
    seconds = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"seconds": seconds, "entities": got, "faults": after.ru_minflt - before.ru_minflt,
            "sys_s": after.ru_stime - before.ru_stime}


def child(args: argparse.Namespace) -> None:
    """``--child KEEP``: load the pipeline, run :func:`pipe_timed` on the texts of stdin."""
    nlp = spacy.load(args.model)
    out = pipe_timed(nlp, json.loads(sys.stdin.read()), args.batch_size, bool(int(args.child)),
                     args.n_process)
    print(json.dumps(out))


def main() -> None:
    args = parse_args()
    if args.child is not None:
        return child(args)
    model = str(Path(args.model).resolve())
    nlp = spacy.load(model)
    texts = [doc.text for doc in DocBin().from_disk(args.test).get_docs(nlp.vocab)]
    load_before = load_average()
    reference = entity_tuples(nlp.pipe(texts, batch_size=args.batch_size))  # also the warm-up
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        corpus = scratch / "test.jsonl"
        srsly.write_jsonl(corpus, [{"id": i, "text": t} for i, t in enumerate(texts)])
        without = Dask(2, model, corpus, len(texts), scratch, args, name="without",
                       on_workers=skip_keep_freed_heap)
        kept = Dask(2, model, corpus, len(texts), scratch, args)
        forked = {(fresh, keep): PipeRun(nlp, model, texts, args.batch_size, keep, fresh)
                  for fresh in (True, False) for keep in (True, False)}
        ways: Dict[str, Callable[[], List[tuple]]] = {
            "nlp.pipe right after loading": PipeRun(nlp, model, texts, args.batch_size, True,
                                                   True, n_process=1),
            "nlp.pipe(n_process=2) right after loading, heap kept": forked[True, True],
            "nlp.pipe(n_process=2) right after loading, without": forked[True, False],
            "nlp.pipe": lambda: entity_tuples(nlp.pipe(texts, batch_size=args.batch_size)),
            "nlp.pipe(n_process=2) after predicting, heap kept": forked[False, True],
            "nlp.pipe(n_process=2) after predicting, without": forked[False, False],
            "Dask, 2 workers, heap kept": kept,
            "Dask, 2 workers, without": without,
        }
        # a PipeRun's own timing of the call (in a fresh process: without its start and load)
        seconds, same, _ = time_interleaved(ways, args.repeats, reference)
        for cluster in (kept, without):
            cluster.close()
    rows = []
    for name, values in seconds.items():
        # each way against one process in the same state: right after loading, or warm
        baseline = "nlp.pipe right after loading" if "right after" in name else "nlp.pipe"
        median = statistics.median(values)
        row = {"way": name, "seconds": [round(v, 3) for v in values], "median_s": round(median, 3),
               "baseline": baseline,
               "speedup": round(statistics.median(seconds[baseline]) / median, 2),
               "same_entities_as_nlp_pipe": same[name]}
        way = ways[name]
        if isinstance(way, PipeRun) and way.n_process > 1:
            row["worker_faults"] = int(statistics.median(way.faults))
            row["worker_sys_s"] = round(statistics.median(way.sys_s), 3)
        rows.append(row)
    result = {"corpus": {"file": str(args.test), "docs": len(texts)}, "model": args.model,
              "batch_size": args.batch_size, "shard_size": args.shard_size,
              "repeats": args.repeats, "rows": rows,
              "machine": {"cpus": os.cpu_count(), "load_average_before": load_before,
                          "load_average_after": load_average()}}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    args.output.with_suffix(".md").write_text(markdown(result))
    print(markdown(result))


def markdown(result: Dict) -> str:
    lines = [
        "# Worker processes with and without kept heap, side by side",
        "",
        f"Written by `benchmarks/worker_heap.py`. Corpus: `{result['corpus']['file']}` "
        f"({result['corpus']['docs']} documents), as plain texts. Model: `{result['model']}`. "
        f"Batches of {result['batch_size']} documents; Dask tasks of {result['shard_size']}. "
        f"Median of {result['repeats']} interleaved runs. Speedup against `nlp.pipe` in one "
        f"process in the same state: right after `spacy.load` in a new process (only the call "
        f"is timed), or in this process, which has predicted. Worker faults and system time: the `n_process` workers' minor page faults "
        f"and system CPU seconds per run, both workers together (median).",
        "",
        f"Machine: {result['machine']['cpus']} CPUs; load average "
        f"{result['machine']['load_average_before']} before and "
        f"{result['machine']['load_average_after']} after (1, 5, 15 min).",
        "",
        "| way | runs (s) | median s | speedup | worker faults | worker system s | same entities |",
        "| --- | --- | ---: | ---: | ---: | ---: | --- |",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['way']} | {', '.join(str(s) for s in r['seconds'])} | {r['median_s']} | "
            f"{r['speedup']}x | {r.get('worker_faults', '')} | {r.get('worker_sys_s', '')} | "
            f"{'yes' if r['same_entities_as_nlp_pipe'] else 'NO'} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
