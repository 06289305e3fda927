"""How many nodes does the filtered graph keep? (the paper's Figure 1; CoNLL-2003 test by default)

For every test document, run the trained fsemicrf pipeline and record the number of nodes of the
inference graph (spans whose local label is not null, `FilteredSemiCRFHead.count_nodes`) next to
the document length L and the L*K candidate spans an exact semi-CRF scores (K = max_width; the
exact count of valid spans, sum_i min(K, L - i), is recorded too).

    python scripts/kept_nodes.py --model training/fsemicrf/model-best

The head sees the token vectors through a forward pre-hook on the PyTorch head module (the
component's `torch_head`), so the count uses exactly the inputs of normal inference. Documents
are processed one at a time, so each hook call belongs to one known document. The documents keep the gold tokens of the test corpus (as spaCy's
Corpus reader does for these docs in training and evaluation). Writes OUTPUT/kept_nodes.{json,md,png}.
"""
from __future__ import annotations

import os
import sys

for _k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_k, "1")

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
from pathlib import Path  # noqa: E402

import spacy  # noqa: E402
import torch  # noqa: E402
from spacy.tokens import Doc, DocBin  # noqa: E402


def find_head(nlp, component=None):
    """``(name, head)``: the first ``fsemicrf_ner`` component (or ``component``) whose PyTorch
    head is a filtered semi-CRF (the one that counts its nodes)."""
    names = [component] if component else [
        n for n in nlp.pipe_names if nlp.get_pipe_meta(n).factory == "fsemicrf_ner"]
    for name in names:
        head = nlp.get_pipe(name).torch_head
        if hasattr(head, "count_nodes"):
            return name, head
    sys.exit("no fsemicrf_ner component with a FilteredSemiCRFHead (count_nodes) in this pipeline")


def n_candidates(L: int, K: int) -> int:
    return sum(min(K, L - i) for i in range(L))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, default=Path("training/fsemicrf/model-best"))
    p.add_argument("--component", default=None)
    p.add_argument("--test", type=Path, default=Path("corpus/test.spacy"))
    p.add_argument("--limit", type=int, default=None)
    p.add_argument("--output", type=Path, default=Path("benchmarks/results"))
    p.add_argument("--prefix", default="kept_nodes")
    p.add_argument("--filter-margin", type=float, default=None,
                   help="prediction-time filter margin (default: the pipeline's own)")
    args = p.parse_args(argv)
    if not (args.model / "config.cfg").is_file():  # before spaCy's traceback, and its load
        p.error(f"--model {args.model} is not a pipeline directory")
    if not args.test.is_file():
        p.error(f"no such test file: {args.test}")
    torch.set_num_threads(1)

    nlp = spacy.load(args.model)
    name, head = find_head(nlp, args.component)
    if args.filter_margin is not None:
        nlp.get_pipe(name).filter_margin = args.filter_margin
    K = int(head.max_width)
    C = int(head.n_labels) + 1
    captured = []

    def hook(module, hargs, hkwargs):
        X = hargs[0] if hargs else hkwargs["X"]
        lengths = hargs[1] if len(hargs) > 1 else hkwargs["lengths"]
        if hkwargs.get("gold") is None and (len(hargs) < 3 or hargs[2] is None):
            captured.append((lengths.detach().cpu().tolist(),
                             module.count_nodes(X, lengths, hkwargs.get("filter_margin", 0.0),
                                                words=hkwargs.get("words"))
                             .detach().cpu().tolist()))

    handle = head.register_forward_pre_hook(hook, with_kwargs=True)
    gold = list(DocBin().from_disk(args.test).get_docs(nlp.vocab))
    if args.limit:
        gold = gold[: args.limit]
    rows = []
    try:
        for i, g in enumerate(gold):
            captured.clear()
            # the gold tokens, as in training and in scripts/benchmark.py
            doc = nlp(Doc(nlp.vocab, words=[t.text for t in g],
                          spaces=[bool(t.whitespace_) for t in g]))
            lengths = [n for ls, _ in captured for n in ls]
            counts = [c for _, cs in captured for c in cs]
            assert len(counts) <= 1 and (not counts or lengths[0] == len(doc)), (lengths, len(doc))
            L = len(doc)
            rows.append({"doc": i, "L": L, "kept_nodes": counts[0] if counts else 0,
                         "LK": L * K, "candidates": n_candidates(L, K),
                         "gold_entities": len(g.ents), "predicted_entities": len(doc.ents)})
    finally:
        handle.remove()

    tot_nodes = sum(r["kept_nodes"] for r in rows)
    tot_cand = sum(r["candidates"] for r in rows)
    tot_tok = sum(r["L"] for r in rows)
    ratios = [r["kept_nodes"] / r["candidates"] for r in rows if r["candidates"]]
    summary = {
        "model": str(args.model), "test": str(args.test), "component": name,
        "max_width_K": K, "classes_C": C,
        "filter_margin": nlp.get_pipe(name).filter_margin,
        "docs": len(rows), "tokens": tot_tok,
        "kept_nodes_total": tot_nodes, "candidates_total": tot_cand,
        "LK_total": tot_tok * K,
        "semicrf_lattice_total_LKC": tot_tok * K * C,
        "kept_fraction_of_candidates": tot_nodes / tot_cand if tot_cand else 0.0,
        "median_doc_kept_fraction": statistics.median(ratios) if ratios else 0.0,
        "kept_nodes_per_token": tot_nodes / tot_tok if tot_tok else 0.0,
        "kept_nodes_per_predicted_entity": tot_nodes / max(1, sum(r["predicted_entities"] for r in rows)),
        "max_kept_nodes": max((r["kept_nodes"] for r in rows), default=0),
        "max_L": max((r["L"] for r in rows), default=0),
    }
    args.output.mkdir(parents=True, exist_ok=True)
    stem = args.output / args.prefix
    Path(f"{stem}.json").write_text(json.dumps({"summary": summary, "docs": rows}, indent=1) + "\n")
    s = summary
    md = [
        "# Kept filtered nodes vs candidate spans",
        "",
        f"Pipeline `{s['model']}` (component `{s['component']}`), K = {K}, C = {C} classes; "
        f"test corpus `{s['test']}`: {s['docs']} docs, {s['tokens']} tokens"
        + (f", filter margin {s['filter_margin']:g}." if s["filter_margin"] else "."),
        "",
        "| quantity | total | per token |",
        "|---|---:|---:|",
        f"| kept nodes (filtered graph) | {tot_nodes} | {s['kept_nodes_per_token']:.3f} |",
        f"| candidate spans (width <= K) | {tot_cand} | {tot_cand / max(1, tot_tok):.3f} |",
        f"| L*K | {s['LK_total']} | {K} |",
        f"| semi-CRF lattice L*K*C | {s['semicrf_lattice_total_LKC']} | {K * C} |",
        "",
        f"Kept nodes are {100 * s['kept_fraction_of_candidates']:.2f}% of the candidate spans "
        f"(median per doc {100 * s['median_doc_kept_fraction']:.2f}%), "
        f"{s['kept_nodes_per_predicted_entity']:.2f} nodes per predicted entity; "
        f"largest graph {s['max_kept_nodes']} nodes (longest doc L = {s['max_L']}).",
    ]
    Path(f"{stem}.md").write_text("\n".join(md) + "\n")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    Ls = [r["L"] for r in rows]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    xs = sorted(set(Ls))
    axes[0].plot(xs, [L * K for L in xs], color="tab:red", label=f"L*K (K={K})")
    axes[0].plot(xs, [n_candidates(L, K) for L in xs], color="tab:orange", ls="--",
                 label="candidate spans")
    axes[0].scatter(Ls, [r["kept_nodes"] for r in rows], s=8, color="tab:blue", label="kept nodes")
    axes[0].set_xlabel("document length L (tokens)")
    axes[0].set_ylabel("nodes")
    axes[0].legend()
    axes[0].set_title("filtered graph size vs candidates")
    axes[1].scatter(Ls, [r["kept_nodes"] for r in rows], s=8, color="tab:blue", label="kept nodes")
    axes[1].scatter(Ls, [r["gold_entities"] for r in rows], s=8, color="tab:green", marker="x",
                    label="gold entities")
    axes[1].set_xlabel("document length L (tokens)")
    axes[1].set_ylabel("count")
    axes[1].legend()
    axes[1].set_title("kept nodes vs gold entities")
    fig.tight_layout()
    fig.savefig(f"{stem}.png", dpi=120)
    plt.close(fig)
    print(f"[kept_nodes] {tot_nodes} kept nodes / {tot_cand} candidates "
          f"({100 * s['kept_fraction_of_candidates']:.2f}%), wrote {stem}.json/.md/.png")


if __name__ == "__main__":
    main()
