"""Filtered decoding of this checkout against another git revision, and the exact semi-CRF's
Viterbi, side by side in one process.

    python research/scripts/compare_revisions.py --base REVISION --lengths 64 256

The structured layer of ``--base`` (plain PyTorch, relative imports only) is exported with
``git archive`` and imported under another module name, so both versions decode the same
inputs (``bench_structured.plausible_inputs``) in the same process. Every decoder runs in
blocks of calls; each block starts right after the semi-CRF's work (so its first call is
*cold*: the scores and the code are out of the caches), the other calls are *warm*. Medians
over rounds, the order of the two filtered decoders alternating. Absolute times drift on a
shared virtual machine; the ratios, measured in the same rounds, are what to read.
"""
import argparse
import importlib.util
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path

import torch

from repo import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_structured import plausible_inputs  # noqa: E402

from spacy_fsemicrf.structured import filtered  # noqa: E402
from spacy_fsemicrf.structured.semicrf import semicrf_viterbi  # noqa: E402


def load_structured(revision: str, into: Path):
    """The ``filtered`` module of ``revision``'s structured layer, as package ``structured_base``."""
    archive = subprocess.run(
        ["git", "archive", revision, "spacy_fsemicrf/structured"], check=True, capture_output=True
    ).stdout
    tarfile.open(fileobj=BytesIO(archive)).extractall(into, filter="data")
    root = into / "spacy_fsemicrf" / "structured"
    spec = importlib.util.spec_from_file_location(
        "structured_base", root / "__init__.py", submodule_search_locations=[str(root)]
    )
    package = importlib.util.module_from_spec(spec)
    sys.modules["structured_base"] = package
    spec.loader.exec_module(package)
    return importlib.import_module("structured_base.filtered")


def decoder(module, spans, lengths):
    """Viterbi decoding of the filtered graph to entity rows (doc, start, end, label), through
    the node-list API where the revision has it, else through the grid API."""
    if hasattr(module, "decode_node_set"):
        def decode():
            nodes = module.inference_node_set(spans, spans, lengths)
            best, _ = module.decode_node_set(nodes, marginals=False)
            return nodes.spans(best)
    else:
        def decode():
            nodes = module.inference_node_set(spans, spans, lengths)
            chosen, _ = module.filtered_viterbi(
                nodes.scores, nodes.mask, nodes.labels, node_index=nodes.index
            )
            doc, start, width = chosen.nonzero(as_tuple=True)
            return torch.stack([doc, start, start + width, nodes.labels[doc, start, width]], 1)
    return decode


def compare(base, length: int, n_classes: int, rounds: int, block: int) -> dict:
    spans, _, _, lengths, _ = plausible_inputs(32, length, n_classes, 10)
    T = torch.randn((n_classes + 1, n_classes + 1), generator=torch.Generator().manual_seed(0)) * 0.1
    semi = spans.clone()
    semi[:, :, 1:, 0] = -1e4  # null segments have width 1
    fns = {
        "this checkout": decoder(filtered, spans, lengths),
        "base": decoder(base, spans, lengths),
        "semi-CRF": lambda: semicrf_viterbi(semi, lengths, T)[0],
    }
    if not torch.equal(fns["this checkout"](), fns["base"]()):
        raise AssertionError("the two revisions decode different entities")
    times = {k: {"cold": [], "warm": []} for k in fns}
    pair = ["this checkout", "base"]
    with torch.no_grad():
        for r in range(rounds + 1):  # the first round warms up and is dropped
            for name in pair[r % 2:] + pair[: r % 2] + ["semi-CRF"]:
                if name != "semi-CRF":
                    fns["semi-CRF"]()  # evict
                calls = []
                for _ in range(block):
                    start = time.perf_counter()
                    fns[name]()
                    calls.append(time.perf_counter() - start)
                if r:
                    times[name]["cold"].append(calls[0])
                    times[name]["warm"].append(statistics.median(calls[1:]))
    return {k: {w: statistics.median(v) for w, v in d.items()} for k, d in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="git revision to compare with")
    parser.add_argument("--lengths", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--labels", type=int, default=19, help="classes including null")
    parser.add_argument("--rounds", type=int, default=16)
    parser.add_argument("--block", type=int, default=6)
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        base = load_structured(args.base, Path(tmp))
        print(f"Batch 32, K = 10, C = {args.labels}, 1 thread, median of {args.rounds} rounds; "
              f"ms per batch; base = {args.base}\n")
        print("| L | decoder | warm | cold | semi-CRF / decoder, warm | cold |")
        print("|---|---|---|---|---|---|")
        for length in args.lengths:
            t = compare(base, length, args.labels, args.rounds, args.block)
            semi = t["semi-CRF"]
            for name in ("this checkout", "base"):
                d = t[name]
                print(f"| {length} | {name} | {d['warm'] * 1e3:.3f} | {d['cold'] * 1e3:.3f} "
                      f"| {semi['warm'] / d['warm']:.1f}x | {semi['cold'] / d['cold']:.1f}x |")
            print(f"| {length} | semi-CRF Viterbi | {semi['warm'] * 1e3:.2f} | {semi['cold'] * 1e3:.2f} | | |")


if __name__ == "__main__":
    main()
