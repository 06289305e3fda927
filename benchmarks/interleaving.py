"""What a pipeline's components cost at batch 1 on their own and when they take turns.

    python benchmarks/interleaving.py --test corpus/test.spacy \
        --models ner=training/ner/model-best fsemicrf=training/fsemicrf/model-best \
        --output benchmarks/results/interleaving

At batch 1 a pipeline runs its tok2vec and its head in turn on every document, so each starts
with the caches and predictors the other left. This script times both ways on documents cut from
the test set's running text (as ``profile_predict.py``), one thread, thread CPU time: *apart*,
the tok2vec on every document and then the head on every document; *in turn*, tok2vec then head
on each document, as ``nlp.pipe(..., batch_size=1)`` does. ``penalty`` is how much longer a
document takes in turn than apart: what neither component costs on its own, so what timing one
component alone does not show. The pipelines take turns repeat by repeat (the order
rotates); figures are medians over the repeats, in microseconds per document. For an
``fsemicrf_ner`` head, one more repeat times its stages apart and in turn (the stages of
``profile_predict.py``). Writes ``<output>.json`` (every repeat's seconds) and ``<output>.md``.

With ``--dense-part``, each ``fsemicrf_ner`` pipeline with the default span scorer
(``sum_endpoints_neighbors``, word pooling, document vector, one hidden layer) also gets a row
``NAME:dense`` whose "head" is only what no head of that size can skip: its five matrix
products (word pooling's, the token, neighbour and document projections, the output layer)
and the span grid between them (running sum, windows, width and document terms, ReLU), in 16
PyTorch calls on the document's tok2vec vectors, with the pipeline's weights; no word grouping,
filter, decoding, confidences or writing. It bounds what trimming the head's other steps could
reach.
"""
import argparse
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Callable, Dict, List

import numpy
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from profile_predict import check_lengths, cut_docs, timed_stages  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from arguments import check_file, count, named_pipelines  # noqa: E402

CLOCK = time.thread_time
PARTS = ("tok2vec apart", "head apart", "tok2vec in turn", "head in turn", "head after traffic")
# what the head meets between documents in the third way: NumPy reads this many bytes and
# writes as many elsewhere, more than a core's L2 cache holds (1 MB on common server CPUs)
TRAFFIC_BYTES = 4 << 20


def time_apart(tok2vec: Callable, head: Callable, docs: List) -> Dict[str, float]:
    """Seconds of the tok2vec over all ``docs``, then of the head over all of them."""
    t0 = CLOCK()
    for doc in docs:
        tok2vec(doc)
    t1 = CLOCK()
    for doc in docs:
        head(doc)
    return {"tok2vec apart": t1 - t0, "head apart": CLOCK() - t1}


def time_in_turn(tok2vec: Callable, head: Callable, docs: List) -> Dict[str, float]:
    """Seconds of the tok2vec and of the head, summed over ``docs``, running one after the
    other on each document."""
    spent = {"tok2vec in turn": 0.0, "head in turn": 0.0}
    for doc in docs:
        t0 = CLOCK()
        tok2vec(doc)
        t1 = CLOCK()
        head(doc)
        spent["tok2vec in turn"] += t1 - t0
        spent["head in turn"] += CLOCK() - t1
    return spent


def time_after_traffic(head: Callable, docs: List) -> Dict[str, float]:
    """Seconds of the head over ``docs`` (their tok2vec already run), each document after a
    pass of NumPy through memory that is not the tok2vec's (:data:`TRAFFIC_BYTES`)."""
    source = numpy.ones(TRAFFIC_BYTES // 8)
    target = numpy.empty_like(source)
    spent = 0.0
    for doc in docs:
        numpy.sqrt(source, out=target)
        t0 = CLOCK()
        head(doc)
        spent += CLOCK() - t0
    return {"head after traffic": spent}


def stage_times(tok2vec: Callable, head: Callable, docs: List) -> Dict[str, Dict[str, float]]:
    """Seconds of each stage of an ``fsemicrf_ner`` head (``profile_predict.STAGES``,
    inclusive) and of the whole head, apart and in turn; empty for another head."""
    out = {}
    for way, name in ((time_apart, "apart"), (time_in_turn, "in turn")):
        totals: Dict[str, float] = defaultdict(float)
        with timed_stages(totals):
            spent = way(tok2vec, head, [d.copy() for d in docs])
        if not totals:
            return {}
        out[name] = {**totals, "head": spent[f"head {name}"]}
    return out


def dense_part(component) -> Callable:
    """The ``--dense-part`` callable of an ``fsemicrf_ner`` component (see the module
    docstring), or a ``ValueError`` for a head of another make-up."""
    from spacy_fsemicrf.head_model import torch_head

    head = torch_head(component.model.get_ref("head"))
    scorer = getattr(head, "scorer", None)
    featurizer = getattr(scorer, "featurizer", None)
    if (getattr(featurizer, "span_repr", None) != "sum_endpoints_neighbors"
            or featurizer.doc_proj is None or getattr(head, "word_pool", None) is None
            or head.word_pool.proj is None or len(scorer.hidden)):
        raise ValueError("--dense-part needs the default filtered head's span scorer")
    H, K = featurizer.width_emb.shape[1], featurizer.max_width
    weight, bias = scorer.output.weight, scorer.output.bias.unsqueeze(1)

    def run(doc) -> None:
        with torch.inference_mode():
            x = torch.from_numpy(doc.tensor).unsqueeze(0)
            x = x + head.word_pool.proj(x)
            proj = featurizer.token_proj(x)  # start, end and sum terms
            # the neighbour terms added at each token, not one token over: the same work
            near = featurizer.neighbor_proj(x)
            width = featurizer.width_emb + featurizer.doc_proj(x.mean(1)).unsqueeze(1)
            total = proj[..., 2 * H:].cumsum(1)
            ends = torch.nn.functional.pad(total + proj[..., H:2 * H] + near[..., H:], (0, 0, 0, K))
            starts = total - proj[..., :H] - near[..., :H]
            grid = ends.unfold(1, K, 1)[:, : x.shape[1]].transpose(-1, -2) - starts.unsqueeze(2)
            torch.addmm(bias, weight, grid.add_(width).relu_().reshape(-1, H).T)

    return run


def summary(repeats: List[Dict[str, float]], n_docs: int) -> Dict[str, float]:
    """Microseconds per document of each part (median over ``repeats``), and the penalty: the
    median over the repeats of (in turn - apart), both components together."""
    per_doc = 1e6 / n_docs
    out = {part: statistics.median(r[part] for r in repeats) * per_doc for part in PARTS}
    out["penalty"] = statistics.median(
        (r["tok2vec in turn"] + r["head in turn"] - r["tok2vec apart"] - r["head apart"])
        for r in repeats) * per_doc
    return out


def markdown(rows: List[Dict], stages: Dict[int, Dict[str, Dict[str, Dict[str, float]]]],
             repeats: int, test: str, command: str) -> str:
    lines = ["# Batch 1: the tok2vec and the head apart and in turn", "",
             f"One thread, thread CPU time, microseconds per document, median of {repeats} "
             f"repeats; documents cut from `{test}`. Apart: the tok2vec on every document, then "
             "the head on every document; in turn: both on each document before the next. "
             "Penalty: in turn minus apart, both components."
             + (" `NAME:dense`: the filtered head's five matrix products and its span grid "
                "alone, in 16 PyTorch calls, as its head (`--dense-part`)."
                if any(row["pipeline"].endswith(":dense") for row in rows) else ""), "",
             "| length | pipeline | " + " | ".join(PARTS) + " | penalty |",
             "|---:|---|" + "---:|" * (len(PARTS) + 1)]
    for row in rows:
        cells = [f"{row[part]:.0f}" for part in PARTS + ("penalty",)]
        lines.append(f"| {row['length']} | {row['pipeline']} | " + " | ".join(cells) + " |")
    for length, by_name in stages.items():
        for name, ways in by_name.items():
            n_docs = ways["docs"]
            lines += ["", f"Stages of `{name}`'s head at {length} tokens, one extra repeat "
                      "(microseconds per document, inclusive: a stage's time holds the stages "
                      "it calls):", "", "| stage | apart | in turn | in turn / apart |",
                      "|---|---:|---:|---:|"]
            for stage, apart in ways["apart"].items():
                turn = ways["in turn"].get(stage, 0.0)
                lines.append(f"| {stage} | {1e6 * apart / n_docs:.0f} | "
                             f"{1e6 * turn / n_docs:.0f} | {turn / apart:.2f} |")
    lines += ["", f"Made by `{command}`."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", required=True,
                        help="name=path of pipelines of a tok2vec and one head")
    parser.add_argument("--test", required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--lengths", type=count, nargs="+", default=[10, 35])
    parser.add_argument("--docs", type=count, default=400, help="documents per length")
    parser.add_argument("--repeats", type=count, default=5)
    parser.add_argument("--dense-part", action="store_true",
                        help="also time the filtered head's matrix products and span grid alone")
    args = parser.parse_args(argv)
    paths = named_pipelines(parser, "--models", args.models)
    check_file(parser, "--test", args.test)
    torch.set_num_threads(1)
    import spacy
    from spacy.tokens import DocBin

    nlps = {name: spacy.load(path) for name, path in paths.items()}
    for name, nlp in nlps.items():
        if len(nlp.pipe_names) != 2 or nlp.pipe_names[0] != "tok2vec":
            parser.error(f"{name}: a pipeline of a tok2vec and one head, not {nlp.pipe_names}")
    heads = {name: nlp.get_pipe(nlp.pipe_names[1]) for name, nlp in nlps.items()}
    if args.dense_part:
        for name, nlp in list(nlps.items()):
            if nlp.pipe_names[1] == "fsemicrf_ner":
                try:
                    heads[f"{name}:dense"] = dense_part(heads[name])
                except ValueError as err:
                    parser.error(f"{name}: {err}")
                nlps[f"{name}:dense"] = nlp
    names = list(nlps)
    first = nlps[names[0]]
    test = list(DocBin().from_disk(args.test).get_docs(first.vocab))
    check_lengths(parser, test, args.lengths)
    rows, seconds, stages = [], {}, {}
    for length in args.lengths:
        docs = cut_docs(first, test, length, length * args.docs)
        runs: Dict[str, List[Dict[str, float]]] = {name: [] for name in names}
        for r in range(-1, args.repeats):  # repeat -1 warms up
            k = r % len(names)
            for name in names[k:] + names[:k]:
                tok2vec, head = nlps[name].get_pipe("tok2vec"), heads[name]
                ways = (time_apart, time_in_turn) if r % 2 else (time_in_turn, time_apart)
                spent = {}
                for way in ways:  # which way runs first alternates from repeat to repeat
                    spent.update(way(tok2vec, head, [d.copy() for d in docs]))
                spent.update(time_after_traffic(head, [tok2vec(d.copy()) for d in docs]))
                if r >= 0:
                    runs[name].append(spent)
        for name in names:
            rows.append({"length": length, "pipeline": name, **summary(runs[name], len(docs))})
            print(rows[-1])
            if name.endswith(":dense"):
                continue
            found = stage_times(nlps[name].get_pipe("tok2vec"), heads[name], docs)
            if found:
                stages.setdefault(length, {})[name] = {**found, "docs": len(docs)}
        seconds[length] = runs
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"models": paths, "test": args.test, "threads": 1, "repeats": args.repeats,
            "docs": args.docs, "clock": "thread CPU time", "torch": torch.__version__,
            "spacy": spacy.__version__}
    out.with_suffix(".json").write_text(json.dumps(
        {"meta": meta, "rows": rows, "seconds": seconds, "stages": stages}, indent=2))
    command = "python benchmarks/interleaving.py " + " ".join(argv or sys.argv[1:])
    text = markdown(rows, stages, args.repeats, args.test, command)
    out.with_suffix(".md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
