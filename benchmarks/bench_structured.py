"""Structured-core benchmark: the three heads' decoding and loss+backward, side by side.

    python benchmarks/bench_structured.py                # full table (minutes on 2 CPU cores)
    python benchmarks/bench_structured.py --quick        # L <= 256, fewer repeats
    python benchmarks/bench_structured.py --memory       # + peak memory of filtered log Z + backward

All heads read the same inputs: a random-but-plausible scorer (see ``plausible_inputs``). Each
document gets a random gold segmentation (entities on about 15% of the tokens, widths 1-4),
and noisy scores under which the local classifier keeps the gold spans plus distractors that
overlap them and a few stray false positives, as a trained model's filter does (compare the
kept-node counts with those of the trained pipeline in the project benchmark). The span scores feed the filtered and exact
semi-CRFs; the token emissions of the linear CRF are derived from the same gold and noise.
Timings are medians over rounds, measured interleaved (head by head within each round) in one
process, single-threaded unless ``--threads`` says otherwise: in each round a head runs each
task a few times in a row, the first call timed *cold* (right after another head's work) and
the rest *warm* (the steady state of decoding batch after batch). Prints a Markdown table and
writes it next to the JSON (``--output X.json`` gives ``X.md`` too).
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict

import torch

from spacy_fsemicrf.structured import filtered

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from arguments import count  # noqa: E402
from spacy_fsemicrf.structured.linear_crf import (
    crf_log_partition,
    crf_score,
    crf_viterbi,
    spans_to_tags,
    tag_scheme,
    tags_to_spans,
)
from spacy_fsemicrf.structured.semicrf import (
    semicrf_gold_score,
    semicrf_log_partition,
    semicrf_viterbi,
)
from spacy_fsemicrf.structured.semiring import masked_fill_neg
from spacy_fsemicrf.structured.spans import gold_label_grid, span_mask

HEADS = ("filtered", "semicrf", "crf")


def plausible_inputs(
    batch: int, length: int, n_classes: int, max_width: int, seed: int = 0,
    distractors: float = 1.0, false_positives: float = 0.01,
):
    """Span scores ``[B, L, K, C]``, token emissions ``[B, L, n_tags]``, gold rows, lengths.

    Gold entities cover about 15% of the tokens (widths 1-4). The local scores put null first
    by a wide margin everywhere except on the gold spans and on the distractors: on average
    ``distractors`` spans per gold span that overlap it (a boundary moved by one token), and
    ``false_positives`` short spans per token anywhere. Each kept span's winning label gets
    unit-Gaussian noise, as do all other scores.
    """
    gen = torch.Generator().manual_seed(seed)
    K, C = max_width, n_classes
    lengths = torch.full((batch,), length, dtype=torch.long)
    rows = []
    for b in range(batch):
        i = 0
        while i < length:
            if torch.rand((1,), generator=gen).item() < 0.08:
                w = min(int(torch.randint(0, 4, (1,), generator=gen)), length - 1 - i, K - 1)
                rows.append((b, i, i + w, int(torch.randint(1, C, (1,), generator=gen))))
                i += w + 1
            else:
                i += 1
    gold = torch.tensor(rows, dtype=torch.long).view(-1, 4)
    grid = gold_label_grid(gold, lengths, length, K)
    valid = span_mask(lengths, length, K)
    kept = grid > 0
    # distractors: gold spans with one boundary moved by one token
    n_d = torch.poisson(torch.full((gold.shape[0],), distractors), generator=gen).long()
    src = gold.repeat_interleave(n_d, 0)
    shift = torch.randint(0, 4, (src.shape[0],), generator=gen)
    d_start = src[:, 1] + torch.where(shift == 0, -1, torch.where(shift == 1, 1, 0))
    d_end = src[:, 2] + torch.where(shift == 2, -1, torch.where(shift == 3, 1, 0))
    ok = (d_start >= 0) & (d_end < length) & (d_end >= d_start) & (d_end - d_start < K)
    kept[src[ok, 0], d_start[ok], (d_end - d_start)[ok]] = True
    kept |= (torch.rand(valid.shape, generator=gen) < false_positives / K) & (
        torch.arange(K).view(1, 1, -1) < 3)
    kept &= valid
    labels = torch.where(grid > 0, grid, torch.randint(1, C, grid.shape, generator=gen))
    spans = torch.randn((batch, length, K, C), generator=gen)
    spans[..., 0] += 6.0 * ~kept  # null wins by a wide margin off the kept spans...
    spans.scatter_add_(-1, labels.unsqueeze(-1), 3.0 * kept.unsqueeze(-1).float())  # ...else a label
    spans = masked_fill_neg(spans, valid.unsqueeze(-1))
    # the span heads lay their scores out label-major in memory (see heads._SpanScorer)
    spans = spans.permute(3, 0, 1, 2).contiguous().permute(1, 2, 3, 0)
    scheme = tag_scheme(C - 1, "BIO")
    tags = spans_to_tags(gold, lengths, length, scheme)
    emissions = torch.randn((batch, length, scheme.n_tags), generator=gen)
    emissions.scatter_add_(-1, tags.unsqueeze(-1), torch.full_like(emissions[..., :1], 3.0))
    return spans, emissions, gold, lengths, scheme


def make_runs(spans, emissions, gold, lengths, scheme) -> Dict[str, Dict[str, Callable]]:
    C = spans.shape[-1]
    device = spans.device
    T_semi = (torch.randn(C + 1, C + 1) * 0.1).to(device)
    T_crf = (torch.randn(scheme.n_tags + 1, scheme.n_tags + 1) * 0.1).to(device)
    allowed = scheme.allowed.to(device)
    B, L, K, _ = spans.shape
    grid = gold_label_grid(gold, lengths, L, K)
    semi_scores = spans.clone()
    semi_scores[:, :, 1:, 0] = -1e4  # null segments have width 1

    def filtered_decode():  # the entity rows, as semicrf_viterbi and crf_decode return them
        nodes = filtered.inference_node_set(spans, spans, lengths)
        best, _ = filtered.decode_node_set(nodes, marginals=False)
        return nodes.spans(best)

    def filtered_loss():
        glob = spans.clone().requires_grad_(True)
        mask, labels = filtered.training_nodes(spans, lengths, grid)
        node_scores = glob.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
        log_z = filtered.filtered_log_partition(node_scores, mask, labels)
        loss = (log_z - filtered.path_score(node_scores, grid > 0, labels)).sum()
        loss.backward()

    def semicrf_decode():
        return semicrf_viterbi(semi_scores, lengths, T_semi)

    def semicrf_loss():
        s = semi_scores.clone().requires_grad_(True)
        loss = (semicrf_log_partition(s, lengths, T_semi) - semicrf_gold_score(s, lengths, gold, T_semi)).sum()
        loss.backward()

    tags = spans_to_tags(gold, lengths, L, scheme)

    def crf_decode():
        best, _ = crf_viterbi(emissions, T_crf, lengths, allowed)
        return tags_to_spans(best, lengths, scheme)

    def crf_loss():
        e = emissions.clone().requires_grad_(True)
        loss = (crf_log_partition(e, T_crf, lengths, allowed) - crf_score(e, T_crf, tags, lengths, allowed)).sum()
        loss.backward()

    return {
        "filtered": {"decode": filtered_decode, "loss": filtered_loss},
        "semicrf": {"decode": semicrf_decode, "loss": semicrf_loss},
        "crf": {"decode": crf_decode, "loss": crf_loss},
    }


def time_interleaved(
    runs: Dict[str, Dict[str, Callable]], repeats: int, device: torch.device = torch.device("cpu"),
    block: int = 5,
) -> Dict[str, Dict[str, Dict[str, float]]]:
    """Per head and task (decode, loss), the median over ``repeats`` rounds of two timings.

    Within a round every head runs each task ``block`` times in a row: ``cold`` is the first
    call, right after another head's work has evicted this one's data and code from the
    caches; ``warm`` is the median of the other calls, the steady state of decoding batch
    after batch. Both come from the same rounds, interleaved head by head.
    """
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    times = {h: {w: {"cold": [], "warm": []} for w in fns} for h, fns in runs.items()}
    for _ in range(repeats + 1):  # the first round warms up and is dropped
        for head, fns in runs.items():
            for what, fn in fns.items():
                calls = []
                for _ in range(block):
                    sync()
                    start = time.perf_counter()
                    with torch.no_grad() if what == "decode" else torch.enable_grad():
                        fn()
                    sync()  # a GPU call returns before its kernels finish
                    calls.append(time.perf_counter() - start)
                times[head][what]["cold"].append(calls[0])
                times[head][what]["warm"].append(statistics.median(calls[1:] or calls))
    return {
        h: {w: {k: statistics.median(v[1:]) for k, v in d.items()} for w, d in tasks.items()}
        for h, tasks in times.items()
    }


def kept_nodes(spans, lengths) -> Dict[str, float]:
    mask, _ = filtered.inference_nodes(spans, lengths)
    counts = filtered.count_nodes(mask).float()
    candidates = span_mask(lengths, spans.shape[1], spans.shape[2]).sum((1, 2)).float()
    return {"kept_nodes_mean": counts.mean().item(), "kept_nodes_max": counts.max().item(),
            "candidates_mean": candidates.mean().item()}


def training_nodes_file(length: int, n_classes: int, max_width: int, batch: int, path: Path) -> None:
    """Write the node-level inputs of filtered log Z (a few ``[B, L, K]`` tensors) to ``path``,
    so that the measuring process never holds the much larger ``[B, L, K, C]`` scores."""
    spans, _, gold, lengths, _ = plausible_inputs(batch, length, n_classes, max_width)
    grid = gold_label_grid(gold, lengths, length, max_width)
    mask, labels = filtered.training_nodes(spans, lengths, grid)
    node_scores = spans.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    torch.save({"scores": node_scores, "mask": mask, "labels": labels, "gold": grid > 0}, path)


def peak_memory_child(path: str) -> None:
    """Run in a fresh process: print the peak resident-memory growth of filtered log Z plus
    its backward, over the inputs written by :func:`training_nodes_file`."""
    torch.set_num_threads(1)
    inputs = torch.load(path, weights_only=True)
    scores = inputs["scores"].requires_grad_(True)
    filtered.filtered_log_partition(scores[:1, :8], inputs["mask"][:1, :8])  # warm up
    # Reset the kernel's peak-RSS mark (Linux clear_refs 5), so that the peak read afterwards
    # is this computation's and not the import's.
    Path("/proc/self/clear_refs").write_text("5")
    before = _rss_kb("VmRSS")
    log_z = filtered.filtered_log_partition(scores, inputs["mask"], inputs["labels"])
    (log_z - filtered.path_score(scores, inputs["gold"])).sum().backward()
    print(json.dumps({"peak_rss_growth_mb": (_rss_kb("VmHWM") - before) / 1024}))


def _rss_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", type=count, nargs="+", default=[16, 64, 256, 1024, 4096])
    parser.add_argument("--labels", type=int, nargs="+", default=[5, 19],
                        help="classes including null (CoNLL 5, OntoNotes 19)")
    parser.add_argument("--batch", type=count, default=32)
    parser.add_argument("--max-width", type=count, default=10)
    parser.add_argument("--repeats", type=count, default=3)
    parser.add_argument("--threads", type=count, default=1)
    parser.add_argument("--block", type=count, default=5,
                        help="calls in a row per head and task in each round: the first is "
                             "timed cold, the median of the rest warm")
    parser.add_argument("--quick", action="store_true", help="L in 16, 64, 256 and 2 repeats")
    parser.add_argument("--memory", action="store_true", help="also measure peak memory")
    parser.add_argument("--distractors", type=float, default=1.0,
                        help="kept non-gold spans overlapping each gold span, on average (the "
                             "trained CoNLL pipeline keeps about 0.02)")
    parser.add_argument("--false-positives", type=float, default=0.01,
                        help="stray kept spans per token")
    parser.add_argument("--device", default="cpu", help="e.g. cuda (timings then synchronize)")
    parser.add_argument("--output", type=Path, default=Path("benchmarks/out/structured.json"))
    parser.add_argument("--memory-child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_child:
        peak_memory_child(args.memory_child)
        return
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    load_before = os.getloadavg()  # other work on the machine skews the timings: record it
    if args.quick:
        args.lengths = [L for L in args.lengths if L <= 256]
        args.repeats = 2
    rows = []
    for C in args.labels:
        for L in args.lengths:
            spans, emissions, gold, lengths, scheme = plausible_inputs(
                args.batch, L, C, args.max_width, distractors=args.distractors,
                false_positives=args.false_positives)
            spans, emissions, gold, lengths = (x.to(device) for x in (spans, emissions, gold, lengths))
            timing = time_interleaved(
                make_runs(spans, emissions, gold, lengths, scheme), args.repeats, device, args.block)
            row = {"classes": C, "length": L, **kept_nodes(spans, lengths)}
            for head in HEADS:
                row[f"{head}_decode_s"] = timing[head]["decode"]["warm"]
                row[f"{head}_decode_cold_s"] = timing[head]["decode"]["cold"]
                row[f"{head}_loss_s"] = timing[head]["loss"]["warm"]
            for base in ("semicrf", "crf"):
                for kind in ("", "_cold"):
                    row[f"decode{kind}_speedup_vs_{base}"] = (
                        row[f"{base}_decode{kind}_s"] / row[f"filtered_decode{kind}_s"])
            row["filtered_decode_us_per_token"] = 1e6 * row["filtered_decode_s"] / (L * args.batch)
            rows.append(row)
            print(f"C={C} L={L}: " + ", ".join(f"{k}={v:.4g}" for k, v in row.items()
                                                  if isinstance(v, float)), file=sys.stderr)
    memory = []
    if args.memory:
        with tempfile.TemporaryDirectory() as tmp:
            for L in args.lengths:
                path = Path(tmp) / f"nodes_{L}.pt"
                training_nodes_file(L, max(args.labels), args.max_width, args.batch, path)
                out = subprocess.run(
                    [sys.executable, __file__, "--memory-child", str(path)],
                    check=True, capture_output=True, text=True,
                ).stdout
                memory.append({"length": L, **json.loads(out.strip().splitlines()[-1])})
    meta = {
        "batch": args.batch, "max_width": args.max_width, "repeats": args.repeats, "block": args.block,
        "threads": args.threads, "device": str(device), "distractors": args.distractors,
        "false_positives": args.false_positives, "torch": torch.__version__, "machine": platform.machine(),
        "processor": platform.processor(), "command": " ".join(sys.argv),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "cpu_count": os.cpu_count(), "load_average_before": load_before[0],
        "load_average_after": os.getloadavg()[0],
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps({"meta": meta, "rows": rows, "memory": memory}, indent=2) + "\n")
    table = markdown(rows, memory, meta)
    args.output.with_suffix(".md").write_text(table + "\n")
    print(table)


def markdown(rows, memory, meta) -> str:
    lines = [
        f"Batch {meta['batch']}, K = {meta['max_width']}, {meta.get('device', 'cpu')}, {meta['threads']} thread(s), "
        f"median of {meta['repeats']} rounds of {meta.get('block', 1)} calls in a row per head; seconds "
        f"per batch, warm (the steady state: median of the calls after the first of each round), "
        f"and cold (the first call of a round, right after another head's work); "
        f"{meta['distractors']} distractors per gold span, {meta['false_positives']} stray spans per token"
        + (f"; load average {meta['load_average_before']:.1f} before, {meta['load_average_after']:.1f} "
           f"after, {meta['cpu_count']} CPUs" if "load_average_before" in meta else "") + ".",
        "",
        "| C | L | kept nodes / doc (L·K cand.) | filtered decode | semi-CRF decode | CRF decode "
        "| vs semi-CRF | vs CRF | cold: filtered | cold: vs semi-CRF | cold: vs CRF "
        "| filtered µs/token | filtered loss+bwd | semi-CRF loss+bwd | CRF loss+bwd |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['classes']} | {r['length']} | {r['kept_nodes_mean']:.1f} ({r['candidates_mean']:.0f}) "
            f"| {r['filtered_decode_s']:.5f} | {r['semicrf_decode_s']:.4f} | {r['crf_decode_s']:.4f} "
            f"| {r['decode_speedup_vs_semicrf']:.1f}x | {r['decode_speedup_vs_crf']:.1f}x "
            f"| {r['filtered_decode_cold_s']:.5f} | {r['decode_cold_speedup_vs_semicrf']:.1f}x "
            f"| {r['decode_cold_speedup_vs_crf']:.1f}x "
            f"| {r['filtered_decode_us_per_token']:.2f} | {r['filtered_loss_s']:.4f} "
            f"| {r['semicrf_loss_s']:.4f} | {r['crf_loss_s']:.4f} |"
        )
    if memory:
        lines += ["", "| L | filtered log Z + backward, peak RSS growth (MB) | per token (KB) |",
                  "|---|---|---|"]
        for m in memory:
            per_token = 1024 * m["peak_rss_growth_mb"] / (m["length"] * meta["batch"])
            lines.append(f"| {m['length']} | {m['peak_rss_growth_mb']:.1f} | {per_token:.2f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
