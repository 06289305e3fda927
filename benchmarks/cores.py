"""How much a second process gains on plain compute: the ceiling of any parallel way.

    python benchmarks/cores.py --output benchmarks/results/cores.json

The same fixed work (a Python loop; a 512x512 matrix product on one PyTorch thread) in one
process, then in two forked processes at once; wall time, best of ``--repeats``. Two real
cores give close to 2x the throughput; two hyperthreads of one core, or a busy machine, less.
"""
import argparse
import json
import os
import sys
import time
from multiprocessing import get_context
from pathlib import Path
from typing import Callable, Dict

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from arguments import count  # noqa: E402


def python_loop(n: int = 6_000_000) -> int:
    total = 0
    for i in range(n):
        total += i * i
    return total


def matrix_product(repeats: int = 300) -> None:
    import torch

    torch.set_num_threads(1)
    a = torch.randn(512, 512)
    for _ in range(repeats):
        a @ a


def wall(work: Callable[[], object], processes: int) -> float:
    """Seconds for ``processes`` forked processes that each do ``work`` once."""
    ctx = get_context("fork")
    start = time.perf_counter()
    children = [ctx.Process(target=work) for _ in range(processes)]
    for child in children:
        child.start()
    for child in children:
        child.join()
    return time.perf_counter() - start


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", type=Path, default=Path("benchmarks/results/cores.json"))
    parser.add_argument("--repeats", type=count, default=3)
    args = parser.parse_args(argv)
    if args.output.is_dir():  # written after every run
        parser.error(f"--output {args.output} is a directory")
    rows: Dict[str, Dict[str, float]] = {}
    for name, work in (("python loop", python_loop), ("matrix product", matrix_product)):
        one = min(wall(work, 1) for _ in range(args.repeats))
        two = min(wall(work, 2) for _ in range(args.repeats))
        rows[name] = {"one_process_s": round(one, 3), "two_processes_s": round(two, 3),
                      "throughput_ratio": round(2 * one / two, 2)}
        print(f"{name}: one process {one:.2f} s, two at once {two:.2f} s: "
              f"{2 * one / two:.2f}x the throughput")
    result = {"cpus": os.cpu_count(), "load_average_before": list(os.getloadavg()),
              "repeats": args.repeats, "rows": rows}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
