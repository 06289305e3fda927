"""Time of the span featurizer's per-token terms, against another version of them.

    git show REVISION:spacy_fsemicrf/structured/spans.py > /tmp/spans_before.py
    python benchmarks/span_terms.py --reference /tmp/spans_before.py

``SpanFeaturizer.terms`` of the installed package and of ``--reference`` (a ``spans.py`` from
another checkout; it only imports torch and numpy) run on the same random inputs with the same
weights (the default configs' featurizer: ``sum_endpoints_neighbors``, D 96, H 128, K 10, with
the document vector), interleaved call by call on one thread under ``torch.inference_mode``;
the table gives the median wall time of each and their ratio. Differences between processes on
a shared machine are often larger than a few percent: this compares both in one process.
Without ``--reference`` it times the package alone. The outputs are checked equal first.
"""
import argparse
import importlib.util
import statistics
import time
from pathlib import Path
from typing import Callable, Dict, List

import torch

from spacy_fsemicrf.structured import spans

SETTINGS = [(1, 10), (1, 35), (64, 10), (64, 35), (64, 150), (1, 1500)]  # (batch, length)


def load_reference(path: str):
    spec = importlib.util.spec_from_file_location("reference_spans", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def interleaved(fns: Dict[str, Callable[[], object]], rounds: int) -> Dict[str, float]:
    """Median µs of each function, called in turn ``rounds`` times (the first tenth dropped)."""
    times: Dict[str, List[int]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            t0 = time.perf_counter_ns()
            fn()
            times[name].append(time.perf_counter_ns() - t0)
    return {name: statistics.median(ts[rounds // 10:]) / 1e3 for name, ts in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reference", default=None, help="another version's spans.py")
    parser.add_argument("--tokens", type=int, default=2_000_000, help="tokens timed per setting")
    args = parser.parse_args()
    if args.reference and not Path(args.reference).is_file():
        parser.error(f"--reference: no such file: {args.reference}")
    torch.set_num_threads(1)
    torch.manual_seed(0)
    versions = {"package": spans}
    if args.reference:
        versions["reference"] = load_reference(args.reference)
    feats = {name: module.SpanFeaturizer(96, 128, 10, "sum_endpoints_neighbors", doc_vector=True)
             for name, module in versions.items()}
    for feat in feats.values():
        feat.load_state_dict(feats["package"].state_dict())
        feat.eval()
    print("| batch | length | " + " | ".join(f"{name} µs" for name in feats)
          + (" | package / reference |" if args.reference else " |"))
    print("|---:|---:|" + "---:|" * (len(feats) + bool(args.reference)))
    with torch.inference_mode():
        for batch, length in SETTINGS:
            x, doc = torch.randn(batch, length, 96), torch.randn(batch, 96)
            outputs = [feat(x, doc) for feat in feats.values()]
            if any(not torch.equal(outputs[0], out) for out in outputs[1:]):
                raise SystemExit(f"the versions differ at batch {batch}, length {length}")
            rounds = max(20, min(2000, args.tokens // (batch * length)))
            calls = {name: (lambda f=feat: f.terms(x, doc)) for name, feat in feats.items()}
            med = interleaved(calls, rounds)
            cells = [f"{med[name]:.1f}" for name in feats]
            if args.reference:
                cells.append(f"{med['package'] / med['reference']:.2f}")
            print(f"| {batch} | {length} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
