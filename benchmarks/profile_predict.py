"""Where ``fsemicrf_ner`` spends its prediction time, stage by stage.

    python benchmarks/profile_predict.py --model training/fsemicrf/model-best \
        --test corpus/test.spacy --output benchmarks/results/profile

Documents of 10, 35, 150 and 1,500 tokens are cut from the test set's running text (the last
short piece is dropped), and the pipeline predicts them in batches of 64 and of 1, on one
thread. Each stage is timed by wrapping the function that does it (inclusive thread CPU time
summed over calls, which other processes on the machine do not inflate); ``tok2vec`` is the pipeline's components before ``fsemicrf_ner``, and ``other`` is
what ``predict`` spends outside the listed stages (Thinc glue, grouping, copies). Each setting
also gives the head's time per document and the number of PyTorch operators one ``predict``
call dispatches (top-level ``aten::`` calls, from ``torch.profiler``): on short documents the
head's cost is mostly a fixed cost per operator. Writes ``<output>.json`` and ``<output>.md``.
"""
import argparse
import contextlib
import json
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Tuple

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from arguments import check_file, check_pipeline, count  # noqa: E402

# CPU time of the calling thread: on one thread it is the work done, and unlike wall time it does
# not grow when other processes share the cores.
CLOCK = time.thread_time

# (label, owner, attribute, parent): the functions wrapped with a timer. The parent is the stage
# that contains this one, for the exclusive times.
STAGES: List[Tuple[str, str, str, str]] = [
    ("word ids", "spacy_fsemicrf.architectures", "word_ids", "predict"),
    ("padding and copy to torch", "spacy_fsemicrf.head_model", "_to_torch_args", "predict"),
    ("span scores", "spacy_fsemicrf.structured.heads:FilteredSemiCRFHead", "_encode", "predict"),
    ("token context (BiLSTM)", "spacy_fsemicrf.structured.context:TokenContext", "forward", "span scores"),
    ("word pooling", "spacy_fsemicrf.structured.context:WordPool", "forward", "span scores"),
    ("doc vector", "spacy_fsemicrf.structured.heads", "document_mean", "span scores"),
    ("span features: token terms", "spacy_fsemicrf.structured.spans:SpanFeaturizer", "terms", "span scorer output layer"),
    ("span features: span grid", "spacy_fsemicrf.structured.spans:SpanFeaturizer", "grid", "span scorer output layer"),
    ("span scorer output layer", "spacy_fsemicrf.structured.heads:_SpanScorer", "_score", "span scores"),
    ("filter and node set", "spacy_fsemicrf.structured.filtered", "inference_node_set", "predict"),
    ("decode and marginals", "spacy_fsemicrf.structured.filtered", "decode_node_set_log_z",
     "predict"),
    ("node rows", "spacy_fsemicrf.structured.filtered:NodeSet", "spans", "predict"),
    ("local label probability", "spacy_fsemicrf.structured.heads", "local_label_probability", "predict"),
    ("path probability", "spacy_fsemicrf.structured.heads", "filtered_path_scores", "predict"),
]


def _owner(path: str):
    module, _, cls = path.partition(":")
    obj = __import__(module, fromlist=["_"])
    return getattr(obj, cls) if cls else obj


@contextlib.contextmanager
def timed_stages(totals: Dict[str, float]) -> Iterator[None]:
    """Wrap every function of STAGES with a timer that adds to ``totals[label]``."""
    saved = []
    for label, owner_path, attr, _ in STAGES:
        owner = _owner(owner_path)
        original = owner.__dict__[attr] if isinstance(owner, type) else getattr(owner, attr)

        def make(fn: Callable, label: str) -> Callable:
            def wrapper(*args, **kwargs):
                t0 = CLOCK()
                try:
                    return fn(*args, **kwargs)
                finally:
                    totals[label] += CLOCK() - t0
            return wrapper

        setattr(owner, attr, make(original, label))
        saved.append((owner, attr, original))
    try:
        yield
    finally:
        for owner, attr, original in saved:
            setattr(owner, attr, original)


def cut_docs(nlp, docs, length: int, n_tokens: int):
    """Documents of exactly ``length`` tokens from the running text of ``docs``, about
    ``n_tokens`` tokens in all (at least one document)."""
    from spacy.tokens import Doc

    words = [t.text for doc in docs for t in doc]
    if not 1 <= length <= len(words):  # one shorter document would be timed as this length
        raise ValueError(f"documents of {length} tokens from a running text of {len(words)}")
    n_docs = max(1, min(len(words) // length, max(1, n_tokens // length)))
    return [Doc(nlp.vocab, words=words[i * length:(i + 1) * length]) for i in range(n_docs)]


def check_lengths(parser: argparse.ArgumentParser, docs, lengths: List[int],
                  option: str = "--lengths") -> None:
    """argparse's error for a document length that the running text of ``docs`` (the test
    set) does not fill: :func:`cut_docs` would fail on it after the settings before it ran."""
    n_words = sum(len(doc) for doc in docs)
    for length in lengths:
        if length > n_words:
            parser.error(f"{option}: {length} tokens is longer than the test set "
                         f"({n_words} tokens)")


def profile(nlp, docs, batch_size: int, repeats: int) -> Dict[str, float]:
    """Seconds per stage (inclusive), the best of ``repeats`` runs by total."""
    ner = nlp.get_pipe("fsemicrf_ner")
    before = [(name, pipe) for name, pipe in nlp.pipeline[: nlp.pipe_names.index("fsemicrf_ner")]]
    best: Dict[str, float] = {}
    for _ in range(repeats + 1):  # the first run warms caches and is dropped
        totals: Dict[str, float] = defaultdict(float)
        with timed_stages(totals):
            for i in range(0, len(docs), batch_size):
                batch = [d.copy() for d in docs[i:i + batch_size]]
                t0 = CLOCK()
                for _, pipe in before:
                    batch = list(pipe.pipe(batch, batch_size=batch_size))
                t1 = CLOCK()
                scores = ner.predict(batch)
                t2 = CLOCK()
                ner.set_annotations(batch, scores)
                t3 = CLOCK()
                totals["tok2vec"] += t1 - t0
                totals["predict"] += t2 - t1
                totals["set doc.ents and doc.spans"] += t3 - t2
        totals["total"] = totals["tok2vec"] + totals["predict"] + totals["set doc.ents and doc.spans"]
        if not best or totals["total"] < best["total"]:
            best = dict(totals)
        totals.clear()
    return best


def operators_per_call(nlp, docs) -> int:
    """How many PyTorch operators (top-level ``aten::`` calls, not those they call) one
    ``predict`` of ``docs`` dispatches."""
    from torch.profiler import ProfilerActivity, profile as torch_profile

    ner = nlp.get_pipe("fsemicrf_ner")
    batch = list(nlp.pipe([d.copy() for d in docs], disable=["fsemicrf_ner"]))
    ner.predict(batch)  # warm
    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        ner.predict(batch)
    return sum(1 for e in prof.events() if e.name.startswith("aten::")
               and (e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::")))


def small_operator_us(repeats: int = 5, number: int = 20000) -> float:
    """Microseconds of one PyTorch operator on a tiny tensor (``x + 0.0``, 10 x 8, inference
    mode), best of ``repeats``: the fixed cost of an operator call on this machine."""
    import timeit

    x = torch.zeros((10, 8))
    with torch.inference_mode():
        return 1e6 * min(timeit.repeat(lambda: x + 0.0, number=number, repeat=repeats)) / number


def exclusive(times: Dict[str, float]) -> Dict[str, float]:
    """Each stage's time minus that of the stages it contains; ``other`` = predict's rest,
    including what ``span_scores`` spends outside its listed stages (masks, module calls)."""
    out = dict(times)
    for label, _, _, parent in STAGES:
        if label in times and parent not in times:  # its time would be counted twice
            raise RuntimeError(f"stage {parent!r} was not timed: the function it wraps is no "
                               "longer called; update STAGES")
        if parent in out and label in times:
            out[parent] -= times[label]
    out["other (in predict)"] = out.pop("predict") + out.pop("span scores", 0.0)
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--test", required=True)
    parser.add_argument("--output", required=True, help="path prefix of the .json/.md files")
    parser.add_argument("--lengths", type=count, nargs="+", default=[10, 35, 150, 1500])
    parser.add_argument("--batch-sizes", type=count, nargs="+", default=[64, 1])
    parser.add_argument("--tokens", type=count, default=30000, help="tokens per setting")
    parser.add_argument("--repeats", type=count, default=3)
    args = parser.parse_args(argv)
    check_pipeline(parser, "--model", args.model)
    check_file(parser, "--test", args.test)
    torch.set_num_threads(1)
    import spacy
    from spacy.tokens import DocBin

    nlp = spacy.load(args.model)
    test = list(DocBin().from_disk(args.test).get_docs(nlp.vocab))
    check_lengths(parser, test, args.lengths)
    rows = []
    for length in args.lengths:
        docs = cut_docs(nlp, test, length, args.tokens)
        n_words = sum(len(d) for d in docs)
        for batch_size in args.batch_sizes:
            # batch 1 pays its fixed costs per document: fewer tokens keep the run short
            subset = docs if batch_size > 1 else docs[: max(1, len(docs) // 4)]
            times = profile(nlp, subset, batch_size, args.repeats)
            n = sum(len(d) for d in subset)
            excl = exclusive(times)
            rows.append({"length": length, "batch_size": batch_size, "docs": len(subset),
                         "words": n, "words_per_s": n / times["total"],
                         "head_share": 1 - times["tok2vec"] / times["total"],
                         "head_us_per_doc": 1e6 * (times["total"] - times["tok2vec"]) / len(subset),
                         "operators_per_call": operators_per_call(nlp, subset[:batch_size]),
                         "seconds": {k: round(v, 5) for k, v in excl.items()}})
            print(f"length {length:5d} batch {batch_size:3d}: {n / times['total']:9.0f} words/s, "
                  f"head {100 * rows[-1]['head_share']:.0f}% of the time")
        del n_words
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"model": args.model, "test": args.test, "threads": 1, "repeats": args.repeats,
            "torch": torch.__version__, "small_operator_us": round(small_operator_us(), 2)}
    out.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    # a stage a setting never reached (no entity to score, say) takes no time there
    stages = list(dict.fromkeys(k for r in rows for k in r["seconds"] if k != "total"))
    lines = ["# Prediction time of fsemicrf_ner by stage", "",
             f"Model `{args.model}`, documents cut from `{args.test}`, one thread; share of each "
             "stage in the total time (exclusive), words/s, and the head's share (everything "
             "but the tok2vec). One PyTorch operator on a tiny tensor costs "
             f"{meta['small_operator_us']} µs on this machine. Made by `python "
             f"benchmarks/profile_predict.py --model {args.model} --test {args.test} --output "
             f"{args.output}`.", "",
             "| stage | " + " | ".join(f"L={r['length']} b={r['batch_size']}" for r in rows) + " |",
             "|---|" + "---:|" * len(rows)]
    for stage in stages:
        lines.append(f"| {stage} | " + " | ".join(
            f"{100 * r['seconds'].get(stage, 0.0) / r['seconds']['total']:.1f}%" for r in rows)
            + " |")
    lines.append("| words/s | " + " | ".join(f"{r['words_per_s']:.0f}" for r in rows) + " |")
    lines.append("| head share | " + " | ".join(f"{100 * r['head_share']:.1f}%" for r in rows) + " |")
    lines.append("| head µs per document | "
                 + " | ".join(f"{r['head_us_per_doc']:.0f}" for r in rows) + " |")
    lines.append("| PyTorch operators per predict call | "
                 + " | ".join(str(r["operators_per_call"]) for r in rows) + " |")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
