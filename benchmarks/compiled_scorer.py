"""Time of the filtered head's span scorer run eagerly and compiled with ``torch.compile``.

    python benchmarks/compiled_scorer.py

The span scorer of the default config (``sum_endpoints_neighbors``, D 96, H 128, K 10, the
document vector, 2 x 5 outputs: four labels and null, local and global) with random weights, on
random token vectors of documents of one length, one thread, without gradients (compiled with
static shapes, one compilation per batch shape, which the table leaves out; with ``--dynamic``
one for all). The two run in turn
call by call; the table gives the median wall time of each per document, their ratio, and
whether the compiled scores are the eager ones bit for bit. The compiler is PyTorch's default
(Inductor, which builds C++ on a CPU: it needs a C++ compiler). This measures what compiling the
head's largest dense part would give, not a setting of the package.
"""
import argparse
import sys
from pathlib import Path
from typing import List, Tuple

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from span_terms import interleaved  # noqa: E402

from spacy_fsemicrf.structured.heads import FilteredSemiCRFHead  # noqa: E402

SETTINGS: List[Tuple[int, int]] = [(1, 10), (1, 35), (1, 150), (64, 10), (64, 35)]  # (batch, L)


def count(text: str) -> int:
    """An argparse type: an int of at least 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def main(argv: List[str] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=count, default=400, help="calls of each per setting")
    parser.add_argument("--dynamic", action="store_true", help="compile with dynamic shapes")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    head = FilteredSemiCRFHead(96, 4, doc_vector=True).eval()
    scorer = head.scorer
    compiled = torch.compile(scorer.forward, dynamic=args.dynamic)
    print("| batch | length | eager µs per document | compiled µs per document | compiled / "
          "eager | same bits |")
    print("|---:|---:|---:|---:|---:|:---|")
    with torch.no_grad():
        for batch, length in SETTINGS:
            x, lengths = torch.randn(batch, length, 96), torch.full((batch,), length)
            eager_out = scorer(x, lengths)
            same = all(torch.equal(eager_out, compiled(x, lengths)) for _ in range(2))
            med = interleaved({"eager": lambda: scorer(x, lengths),
                               "compiled": lambda: compiled(x, lengths)}, args.rounds)
            print(f"| {batch} | {length} | {med['eager'] / batch:.1f} | "
                  f"{med['compiled'] / batch:.1f} | {med['compiled'] / med['eager']:.2f} | "
                  f"{'yes' if same else 'no'} |")


if __name__ == "__main__":
    main()
