"""Cost of very long documents: time and peak memory per pipeline component.

    python benchmarks/bench_long_docs.py training/fsemicrf/model-best      # trained pipeline
    python benchmarks/bench_long_docs.py --untrained                      # an untrained head

A document of N tokens is made by repeating the words of the CoNLL-2003 test corpus
(``corpus/test.spacy``); each component runs on it alone, one thread, and the peak resident
memory it adds is read after resetting the kernel's peak mark (Linux ``clear_refs``). With
``--untrained``, a freshly initialised ``FilteredSemiCRFHead`` runs on random vectors: its
local classifier keeps most spans, so every document is one large cluster and goes through
the position scan, the slow case.
"""
import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from arguments import check_file, check_pipeline, count  # noqa: E402


def rss_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def measure(fn):
    """``(result, seconds, peak MB added)`` of ``fn()``."""
    Path("/proc/self/clear_refs").write_text("5")
    before = rss_kb("VmRSS")
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start, (rss_kb("VmHWM") - before) / 1024


def trained(model: str, test: Path, sizes) -> None:
    import spacy
    from spacy.tokens import Doc, DocBin

    nlp = spacy.load(model)
    words = [t.text for d in DocBin().from_disk(test).get_docs(nlp.vocab) for t in d]
    for n in sizes:
        doc = Doc(nlp.vocab, words=(words * (n // len(words) + 1))[:n])
        parts = []
        for name, proc in nlp.pipeline:
            doc, seconds, mb = measure(lambda: proc(doc))
            parts.append(f"{name} {seconds:.2f} s, +{mb:.0f} MB")
        print(f"{n} tokens: " + "; ".join(parts) + f"; {len(doc.ents)} entities")


def untrained(sizes) -> None:
    from spacy_fsemicrf.structured.heads import FilteredSemiCRFHead

    torch.manual_seed(0)
    head = FilteredSemiCRFHead(96, 4).eval()
    for n in sizes:
        X, lengths = torch.randn(1, n, 96), torch.tensor([n])
        with torch.no_grad():
            (spans, _), seconds, mb = measure(lambda: head(X, lengths))
        nodes = int(head.count_nodes(X, lengths))
        print(f"{n} tokens: {nodes} kept nodes, {spans.shape[0]} entities, {seconds:.2f} s "
              f"({1e6 * seconds / n:.0f} us/token), +{mb:.0f} MB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", nargs="?", help="a trained pipeline directory")
    parser.add_argument("--untrained", action="store_true")
    parser.add_argument("--test", type=Path, default=Path("corpus/test.spacy"))
    parser.add_argument("--sizes", type=count, nargs="+", default=[1000, 10_000, 100_000])
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.untrained:
        untrained(args.sizes)
    elif args.model:
        check_pipeline(parser, "model", args.model)
        check_file(parser, "--test", args.test)
        trained(args.model, args.test, args.sizes)
    else:
        parser.error("give a pipeline directory or --untrained")


if __name__ == "__main__":
    main()
