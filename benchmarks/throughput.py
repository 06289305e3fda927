"""Prediction words/s of several pipelines at several document lengths, side by side.

    python benchmarks/throughput.py --test corpus/test.spacy \
        --models ner=training/ner/model-best fsemicrf=training/fsemicrf/model-best \
                 semicrf=training/semicrf/model-best crf=training/crf/model-best \
                 spancat=training/spancat/model-best \
        --encoder-only fsemicrf --reference ner --output benchmarks/results/throughput

Documents of each length are cut from the test set's running text (as in
``profile_predict.py``); every pipeline predicts the same documents with ``nlp.pipe`` on one
thread, and words/s is the median over the repeats of the words divided by the thread's CPU time
(which other processes on the machine do not inflate). Within a repeat the pipelines take turns
batch by batch (at batch 1, 16 documents at a time; the order rotates from one turn to the
next), so each pipeline's time in a repeat is summed over the same stretch of the run: a shared
machine's speed drifts within a minute, and pipelines timed one after the other over a whole
repeat each met a different part of that drift. ``<name>:tok2vec`` is the pipeline of
``--encoder-only`` with only its tok2vec component: the limit of any head on that encoder.
``head share`` = 1 - pipeline words/s / tok2vec-only words/s. Ratios and head shares are taken
within each repeat and reported as their median and range over the repeats: a ratio of two
medians can pair a fast repeat of one pipeline with a slow repeat of the other. With
``--numpy-blas`` every pipeline is also loaded under thinc's ``NumpyOps(use_blis=False)`` and
timed as ``<name>+numpy``: the same pipelines with their matrix products through NumPy's BLAS
(one thread) instead of blis. Writes ``<output>.json`` (with every repeat's seconds), ``.md``
and ``.png``.
"""
import os

# One thread for NumPy's BLAS as for everything else (with --numpy-blas it does thinc's matrix
# products); read when NumPy is first imported, so set before any import that brings it in.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, Callable, Dict, List  # noqa: E402

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from profile_predict import check_lengths, cut_docs  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from arguments import check_file, count, named_pipelines  # noqa: E402


def time_pipe(nlp, docs, batch_size: int, disable: List[str]) -> float:
    """Thread CPU seconds of ``nlp.pipe`` over copies of ``docs``."""
    batch = [d.copy() for d in docs]
    t0 = time.thread_time()
    for _ in nlp.pipe(batch, batch_size=batch_size, disable=disable):
        pass
    return time.thread_time() - t0


def turns(docs: List[Any], batch_size: int) -> List[List[Any]]:
    """``docs`` cut into the parts the pipelines take turns on: one batch each, and at batch 1
    16 documents (a pipeline that switched every document would run with the other's caches)."""
    size = max(batch_size, 16)
    return [docs[i: i + size] for i in range(0, len(docs), size)]


def interleaved_times(names: List[str], parts: List[Any], repeats: int,
                      time_part: Callable[[str, Any], float]) -> Dict[str, List[float]]:
    """Each pipeline's seconds in each repeat, summed over ``parts``: every part is timed by
    every pipeline in turn (``time_part(name, part)``), the order rotated part by part and
    repeat by repeat so that no pipeline always runs first."""
    times: Dict[str, List[float]] = {name: [] for name in names}
    for r in range(repeats):
        totals = dict.fromkeys(names, 0.0)
        for j, part in enumerate(parts):
            k = (r + j) % len(names)
            for name in names[k:] + names[:k]:
                totals[name] += time_part(name, part)
        for name in names:
            times[name].append(totals[name])
    return times


def relative_speed(times: Dict[str, List[float]], name: str, other: str) -> List[float]:
    """Words/s of ``name`` relative to ``other`` in each repeat (both time the same words):
    ``other``'s time over ``name``'s, repeat by repeat."""
    return [t_other / t_name for t_name, t_other in zip(times[name], times[other])]


def spread(values: List[float]) -> Dict[str, float]:
    """The median, minimum and maximum of ``values``."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def side_by_side(times: Dict[str, List[float]], reference: str,
                 limits: Dict[str, str]) -> Dict[str, Dict[str, Dict[str, float]]]:
    """``vs_reference``: each pipeline's words/s relative to ``reference``, and ``head_share``:
    1 - words/s relative to its tok2vec alone for each pipeline of ``limits``, each taken
    within every repeat and summarised by :func:`spread`."""
    return {
        "vs_reference": {name: spread(relative_speed(times, name, reference)) for name in times},
        "head_share": {name: spread([1 - r for r in relative_speed(times, name, limit)])
                       for name, limit in limits.items()},
    }


def markdown(rows: List[Dict[str, Any]], names: List[str], reference: str,
             limits: Dict[str, str], repeats: int, test: str, command: str) -> str:
    """The table of ``rows``: each pipeline's words/s with its ratio to ``reference`` (median
    and range over the repeats), and the head share of each pipeline of ``limits``."""
    lines = ["# Prediction words/s by document length", "",
             f"One thread, median of {repeats} repeats, the pipelines taking turns batch by "
             f"batch, thread CPU time; documents cut from `{test}`. Ratios to `{reference}` and "
             "head shares are taken within each repeat: their median, and in brackets their "
             "range over the repeats.", "",
             "| length | batch | " + " | ".join(names + [f"head share {n}" for n in limits])
             + " |",
             "|---:|---:|" + "---:|" * (len(names) + len(limits))]
    for row in rows:
        w, vs, hs = row["words_per_s"], row["vs_reference"], row["head_share"]
        cells = [f"{w[n]:.0f} ({vs[n]['median']:.2f}x" + ("" if n == reference else
                 f", {vs[n]['min']:.2f}-{vs[n]['max']:.2f}") + ")" for n in names]
        # "to", as a share can come out below zero in a repeat
        share = [f"{100 * hs[n]['median']:.1f}% "
                 f"({100 * hs[n]['min']:.1f} to {100 * hs[n]['max']:.1f})" for n in limits]
        lines.append(f"| {row['length']} | {row['batch_size']} | " + " | ".join(cells + share) + " |")
    lines += ["", f"Made by `{command}`."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", required=True, help="name=path")
    parser.add_argument("--test", required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--encoder-only", default=None, help="a pipeline whose tok2vec alone is timed")
    parser.add_argument("--reference", default="ner")
    parser.add_argument("--lengths", type=count, nargs="+", default=[10, 35, 150, 1500])
    parser.add_argument("--batch-sizes", type=count, nargs="+", default=[64, 1])
    parser.add_argument("--tokens", type=count, default=24000, help="tokens per length (batch 64)")
    parser.add_argument("--repeats", type=count, default=9)
    parser.add_argument("--numpy-blas", action="store_true",
                        help="also time every pipeline (as <name>+numpy) with thinc's CPU matrix "
                             "products through NumPy's BLAS instead of blis")
    args = parser.parse_args(argv)
    paths = named_pipelines(parser, "--models", args.models)
    # the ratios are to the reference and the head shares to the tok2vec of --encoder-only:
    # one that is not among the pipelines failed after every timing, or gave no head share
    for option, name in (("--reference", args.reference), ("--encoder-only", args.encoder_only)):
        if name is not None and name not in paths:
            parser.error(f"{option} {name} is not one of the --models names ({', '.join(paths)})")
    check_file(parser, "--test", args.test)
    torch.set_num_threads(1)
    import spacy
    from spacy.tokens import DocBin

    nlps = {name: spacy.load(path) for name, path in paths.items()}
    if args.numpy_blas:  # a model takes the current ops when it is made, so load under them
        from thinc.api import use_ops
        with use_ops("numpy", use_blis=False):
            nlps.update({f"{name}+numpy": spacy.load(path) for name, path in paths.items()})
    runs = [(name, nlp, []) for name, nlp in nlps.items()]
    for name in [args.encoder_only, f"{args.encoder_only}+numpy"] if args.encoder_only else []:
        if name in nlps:
            nlp = nlps[name]
            runs.append((f"{name}:tok2vec", nlp, [p for p in nlp.pipe_names if p != "tok2vec"]))
    names = [name for name, _, _ in runs]
    # each pipeline whose tok2vec alone is timed, and that run's name: its head share is reported
    limits = {name: f"{name}:tok2vec" for name in names if f"{name}:tok2vec" in names}
    vocab = next(iter(nlps.values())).vocab
    test = list(DocBin().from_disk(args.test).get_docs(vocab))
    check_lengths(parser, test, args.lengths)
    rows = []
    for length in args.lengths:
        docs = cut_docs(next(iter(nlps.values())), test, length, args.tokens)
        for batch_size in args.batch_sizes:
            subset = docs if batch_size > 1 else docs[: max(1, len(docs) // 4)]
            n_words = sum(len(d) for d in subset)
            by_name = {name: (nlp, disable) for name, nlp, disable in runs}
            for nlp, disable in by_name.values():  # warm-up
                time_pipe(nlp, subset[:batch_size], batch_size, disable)
            times = interleaved_times(
                names, turns(subset, batch_size), args.repeats,
                lambda name, part: time_pipe(by_name[name][0], part, batch_size, by_name[name][1]))
            wps = {name: n_words / statistics.median(t) for name, t in times.items()}
            rows.append({"length": length, "batch_size": batch_size, "docs": len(subset),
                         "words": n_words, "words_per_s": wps,
                         **side_by_side(times, args.reference, limits), "seconds": times})
            print(f"length {length} batch {batch_size}: " + ", ".join(f"{k} {v:.0f}" for k, v in wps.items()))
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"models": paths, "test": args.test, "threads": 1, "repeats": args.repeats,
            "clock": "thread CPU time", "torch": torch.__version__, "spacy": spacy.__version__}
    out.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    command = "python benchmarks/throughput.py " + " ".join(argv or sys.argv[1:])
    text = markdown(rows, names, args.reference, limits, args.repeats, args.test, command)
    out.with_suffix(".md").write_text(text)
    print(text)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # pragma: no cover
        return
    fig, axes = plt.subplots(1, len(args.batch_sizes), figsize=(6 * len(args.batch_sizes), 4))
    for ax, batch_size in zip(axes if len(args.batch_sizes) > 1 else [axes], args.batch_sizes):
        sel = [r for r in rows if r["batch_size"] == batch_size]
        for name in names:
            ax.plot([r["length"] for r in sel], [r["words_per_s"][name] for r in sel], marker="o", label=name)
        ax.set_xscale("log")
        ax.set_xlabel("document length (tokens)")
        ax.set_ylabel("words/s (one thread)")
        ax.set_title(f"batch {batch_size}")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out.with_suffix(".png"), dpi=100)


if __name__ == "__main__":
    main()
