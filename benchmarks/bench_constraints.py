"""Constrained decoding and n-best: their cost against the unconstrained decode, per head.

    python benchmarks/bench_constraints.py --output benchmarks/out/constraints.json
    python benchmarks/bench_constraints.py --quick --output /tmp/constraints.json
    python benchmarks/bench_constraints.py --model training/fsemicrf/model-best \\
        --data corpus/test.spacy --output benchmarks/results/constraints.json

Random mode (the default) decodes CoNLL-like documents (``--length`` tokens, a sentence every
``--sentence`` tokens, 4 entity labels) with the scorer of ``bench_structured.py``
(``plausible_inputs``), for the three heads, with 0, 1 and 3 constraints per document:

* 1: at most one L1 entity per sentence;
* 3: that, L2 and L3 never in the same sentence, and an L4 needs an L1 in the document.

Each decode is what the head does at prediction from its scores (filtered: the node set, the
best path and the marginals; semi-CRF / CRF: Viterbi and the span marginals), plus the
constrained decode for the documents that have constraints, or plus the 5 best segmentations.
Timings are medians of interleaved rounds (``time_interleaved``); the table gives seconds per
batch, words per second of the decode stage and the ratio to the unconstrained decode, and the
solver's outcomes: the share of documents whose unconstrained best path already obeys the
constraints (no search), solved by the exact search, infeasible. The search is exact by
construction and never branches.

``--model`` times a trained pipeline on a corpus instead (words per second of ``nlp.pipe``
with the component's ``constraints`` set to the same rules over its first four labels, and of
``component.nbest(doc, 5)``), on the corpus's tokens and sentence boundaries (no entity crosses
one); it needs a component that has those settings.
"""
import argparse
import collections
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Dict, List

import torch

sys.path.insert(0, str(Path(__file__).parent))
from bench_structured import plausible_inputs, time_interleaved  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from arguments import check_file, check_pipeline, count  # noqa: E402

from spacy_fsemicrf.structured import filtered  # noqa: E402
from spacy_fsemicrf.structured.constrained import (  # noqa: E402
    crf_constrained,
    filtered_constrained,
    semicrf_constrained,
)
from spacy_fsemicrf.structured.constraints import DocConstraints, compile_constraints  # noqa: E402
from spacy_fsemicrf.structured.linear_crf import (  # noqa: E402
    crf_span_marginals,
    crf_viterbi,
    tags_to_spans,
)
from spacy_fsemicrf.structured.nbest import crf_nbest, filtered_nbest, semicrf_nbest  # noqa: E402
from spacy_fsemicrf.structured.semicrf import semicrf_marginals, semicrf_viterbi  # noqa: E402

HEADS = ("filtered", "semicrf", "crf")
SETTINGS = ("0", "1", "3", "nbest5")


def rule_sets(labels: List[str]) -> Dict[str, List[dict]]:
    """The constraint sets of the benchmark over the first four ``labels``."""
    a, b, c, d = labels[:4]
    one = [{"kind": "at_most", "label": a, "n": 1, "scope": "sentence"}]
    three = one + [
        {"kind": "excludes", "label": b, "other": c, "scope": "sentence"},
        {"kind": "requires", "label": d, "other": a, "scope": "doc"},
    ]
    return {"1": one, "3": three}


def make_runs(spans, emissions, lengths, scheme, docs: Dict[str, list]):
    """Per head, the decode functions of each setting."""
    C = spans.shape[-1]
    gen = torch.Generator().manual_seed(1)
    T_semi = torch.randn((C + 1, C + 1), generator=gen) * 0.1
    T_crf = torch.randn((scheme.n_tags + 1, scheme.n_tags + 1), generator=gen) * 0.1
    allowed = scheme.allowed
    semi = spans.clone()
    semi[:, :, 1:, 0] = -1e4  # null segments have width 1

    def filtered_decode(constraints=None, k=None):
        nodes = filtered.inference_node_set(spans, spans, lengths)
        best, marginals = filtered.decode_node_set(nodes)
        if k:
            return filtered_nbest(nodes, lengths, None, k)
        if constraints:
            return filtered_constrained(nodes, lengths, None, constraints, best, spans)
        return nodes.spans(best), marginals[best]

    def semicrf_decode(constraints=None, k=None):
        viterbi = semicrf_viterbi(semi, lengths, T_semi)
        marginals = semicrf_marginals(semi, lengths, T_semi)
        if k:
            return semicrf_nbest(semi, lengths, T_semi, k)
        if constraints:
            return semicrf_constrained(semi, lengths, T_semi, constraints, viterbi), marginals
        return viterbi, marginals

    def crf_decode(constraints=None, k=None):
        viterbi = crf_viterbi(emissions, T_crf, lengths, allowed)
        spans_ = tags_to_spans(viterbi[0], lengths, scheme)
        conf = crf_span_marginals(emissions, T_crf, lengths, spans_, scheme, allowed)
        if k:
            return crf_nbest(emissions, T_crf, lengths, scheme, k, allowed)
        if constraints:
            return crf_constrained(emissions, T_crf, lengths, scheme, constraints, allowed, viterbi)
        return spans_, conf

    fns = {"filtered": filtered_decode, "semicrf": semicrf_decode, "crf": crf_decode}
    return {
        head: {
            "0": lambda fn=fn: fn(),
            "1": lambda fn=fn: fn(docs["1"]),
            "3": lambda fn=fn: fn(docs["3"]),
            "nbest5": lambda fn=fn: fn(k=5),
        }
        for head, fn in fns.items()
    }


def outcomes(result) -> collections.Counter:
    """Solver statuses of a constrained decode's reports."""
    decoded = result[0] if isinstance(result, tuple) and not hasattr(result, "reports") else result
    return collections.Counter(r.status for r in decoded.reports if r is not None)


def random_mode(args) -> dict:
    labels = ["L1", "L2", "L3", "L4"]
    starts = tuple(range(args.sentence, args.length, args.sentence))
    programs = {n: compile_constraints(rules, labels) for n, rules in rule_sets(labels).items()}
    totals = {h: {s: [] for s in SETTINGS} for h in HEADS}
    counts = {h: {n: collections.Counter() for n in programs} for h in HEADS}
    nodes_per_doc = []
    for seed in range(args.batches):
        spans, emissions, _, lengths, scheme = plausible_inputs(
            args.batch, args.length, 5, args.max_width, seed=seed,
            distractors=args.distractors, false_positives=args.false_positives,
        )
        docs = {n: [DocConstraints(p, starts)] * args.batch for n, p in programs.items()}
        runs = make_runs(spans, emissions, lengths, scheme, docs)
        nodes = filtered.inference_node_set(spans, spans, lengths)
        nodes_per_doc.append(nodes.counts().float().mean().item())
        for head in HEADS:
            for n in programs:
                counts[head][n] += outcomes(runs[head][n]())
        timing = time_interleaved(runs, args.repeats, block=args.block)
        for head in HEADS:
            for setting in SETTINGS:
                totals[head][setting].append(timing[head][setting]["warm"])
    words = args.batch * args.length
    rows = []
    for head in HEADS:
        base = statistics.median(totals[head]["0"])
        for setting in SETTINGS:
            seconds = statistics.median(totals[head][setting])
            row = {
                "head": head, "setting": setting, "seconds_per_batch": seconds,
                "words_per_second": words / seconds, "ratio_to_unconstrained": base / seconds,
            }
            if setting in programs:
                c = counts[head][setting]
                n = sum(c.values())
                row.update({f"share_{s}": c[s] / n for s in ("satisfied", "optimal", "infeasible")})
                row["states"] = programs[setting].automaton.n_states
            rows.append(row)
    meta = {
        "mode": "random", "batch": args.batch, "batches": args.batches, "length": args.length,
        "sentence": args.sentence, "max_width": args.max_width, "labels": 4,
        "distractors": args.distractors, "false_positives": args.false_positives,
        "kept_nodes_per_doc": statistics.mean(nodes_per_doc), "repeats": args.repeats,
        "block": args.block, "rules": rule_sets(labels),
    }
    return {"meta": meta, "rows": rows}


def model_mode(args) -> dict:
    """A trained pipeline on a corpus: words/s of ``nlp.pipe`` with 0, 1, 3 constraints and of
    n-best (k = 5), and the solver's outcomes from ``doc.spans[key].attrs["constraints"]``."""
    import spacy
    from spacy.tokens import DocBin

    nlp = spacy.load(args.model)
    pipe = nlp.get_pipe(args.component)
    if not hasattr(pipe, "constraints") or not hasattr(pipe, "nbest"):
        raise SystemExit(f"{args.component} has no 'constraints' setting or 'nbest' method yet")
    gold = list(DocBin().from_disk(args.data).get_docs(nlp.vocab))
    words = sum(len(doc) for doc in gold)
    if len(pipe.labels) < 4:  # (the rules name four labels)
        raise SystemExit(f"{args.model}: the benchmark's rules need 4 entity labels, "
                         f"{args.component} has {len(pipe.labels)}")
    rules = rule_sets(list(pipe.labels))

    def fresh():
        # the corpus's tokens and sentence boundaries, without its entities
        out = []
        for doc in gold:
            new = spacy.tokens.Doc(nlp.vocab, words=[t.text for t in doc],
                                   spaces=[bool(t.whitespace_) for t in doc],
                                   sent_starts=[t.is_sent_start for t in doc])
            out.append(new)
        return out

    def run(setting, docs):
        if setting == "nbest5":
            pipe.constraints = []
            return [pipe.nbest(d, 5) for d in nlp.pipe(docs, batch_size=args.batch)]
        pipe.constraints = rules.get(setting, [])
        return list(nlp.pipe(docs, batch_size=args.batch))

    # thread CPU time (one thread), the settings interleaved within each repeat after a
    # warm-up pass: other processes on the machine neither inflate nor skew the ratios
    settings = ["0", "1", "3", "nbest5"]
    for setting in settings:
        run(setting, fresh()[:64])
    times = {setting: [] for setting in settings}
    for r in range(args.repeats):
        for setting in settings[r % 4:] + settings[: r % 4]:
            docs = fresh()
            start = time.thread_time()
            run(setting, docs)
            times[setting].append(time.thread_time() - start)
    base = statistics.median(times["0"])
    rows = []
    for setting in settings:
        seconds = statistics.median(times[setting])
        row = {"setting": setting, "seconds": seconds, "words_per_second": words / seconds,
               "ratio_to_unconstrained": base / seconds}
        if setting != "nbest5":
            reports = [doc.spans[pipe.spans_key].attrs.get("constraints") for doc in run(setting, fresh())]
            c = collections.Counter(r["status"] for r in reports if r)
            n = max(sum(c.values()), 1)
            row.update({f"share_{s}": c[s] / n for s in ("satisfied", "optimal", "infeasible")})
        rows.append(row)
    pipe.constraints = []
    meta = {"mode": "model", "model": str(args.model), "data": str(args.data), "words": words,
            "docs": len(gold), "batch": args.batch, "repeats": args.repeats, "rules": rules}
    return {"meta": meta, "rows": rows}


def markdown(result: dict) -> str:
    meta, rows = result["meta"], result["rows"]
    names = {"0": "unconstrained", "1": "1 constraint", "3": "3 constraints", "nbest5": "5-best"}
    if meta["mode"] == "random":
        head = (
            f"Random CoNLL-like documents: {meta['batches']} batches of {meta['batch']} x "
            f"{meta['length']} tokens, a sentence every {meta['sentence']} tokens, 4 labels, "
            f"K = {meta['max_width']}, {meta['kept_nodes_per_doc']:.1f} kept nodes per document. "
            "Decode stage only (from the head's scores), seconds per batch (median of warm calls)."
        )
        lines = [head, "", "| head | decode | s / batch | words/s | vs unconstrained | no search "
                 "| exact search | infeasible | states |", "|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            shares = " | ".join(
                f"{100 * r[k]:.0f}%" if k in r else "" for k in
                ("share_satisfied", "share_optimal", "share_infeasible"))
            lines.append(
                f"| {r['head']} | {names[r['setting']]} | {r['seconds_per_batch']:.4f} "
                f"| {r['words_per_second']:,.0f} | {r['ratio_to_unconstrained']:.2f}x | {shares} "
                f"| {r.get('states', '')} |")
    else:
        lines = [f"{meta['model']} on {meta['data']} ({meta['docs']} docs, {meta['words']} words), "
                 f"nlp.pipe batch {meta['batch']}, median of {meta['repeats']} interleaved runs, thread CPU time (one thread).", "",
                 "| decode | words/s | vs unconstrained | no search | exact search | infeasible |",
                 "|---|---|---|---|---|---|"]
        for r in rows:
            shares = " | ".join(
                f"{100 * r[k]:.0f}%" if k in r else "" for k in
                ("share_satisfied", "share_optimal", "share_infeasible"))
            lines.append(f"| {names[r['setting']]} | {r['words_per_second']:,.0f} "
                         f"| {r['ratio_to_unconstrained']:.2f}x | {shares} |")
    lines += ["", "Rules: " + json.dumps(meta["rules"]), "",
              "The exact search never branches: it runs over (path, constraint state) pairs."]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", type=Path, required=True,
                        help="JSON path; the Markdown table goes beside it (.md)")
    parser.add_argument("--batch", type=count, default=32)
    parser.add_argument("--batches", type=count, default=4, help="random batches (seeds)")
    parser.add_argument("--length", type=count, default=134, help="tokens per document")
    parser.add_argument("--sentence", type=count, default=14, help="tokens per sentence")
    parser.add_argument("--max-width", type=count, default=10)
    parser.add_argument("--distractors", type=float, default=0.2,
                        help="kept spans overlapping each gold span, on average")
    parser.add_argument("--false-positives", type=float, default=0.01,
                        help="stray kept spans per token")
    parser.add_argument("--repeats", type=count, default=3)
    parser.add_argument("--block", type=count, default=3)
    parser.add_argument("--threads", type=count, default=1)
    parser.add_argument("--quick", action="store_true", help="1 batch, 2 rounds")
    parser.add_argument("--model", type=Path, help="a trained pipeline (timed with nlp.pipe)")
    parser.add_argument("--data", type=Path, help="with --model: a .spacy corpus, e.g. CoNLL test")
    parser.add_argument("--component", default="fsemicrf_ner")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.quick:
        args.batches, args.repeats = 1, 2
    load_before = os.getloadavg()[0]
    if args.model:
        if args.data is None:
            parser.error("--model needs --data")
        check_pipeline(parser, "--model", args.model)
        check_file(parser, "--data", args.data)
        result = model_mode(args)
    else:
        result = random_mode(args)
    result["meta"].update({
        "command": " ".join(sys.argv), "threads": args.threads, "torch": torch.__version__,
        "machine": platform.machine(), "cpu_count": os.cpu_count(),
        "load_average_before": load_before, "load_average_after": os.getloadavg()[0],
    })
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    table = markdown(result)
    args.output.with_suffix(".md").write_text(table + "\n")
    print(table)


if __name__ == "__main__":
    main()
