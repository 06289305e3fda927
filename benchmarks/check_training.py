"""Digests of the heads' weights after a few training steps: a change that must leave training as
it was (a faster featurizer, say) must print the same digests before and after.

    python benchmarks/check_training.py            # on the version before, then after

Each head is built with a fixed seed and trained with Adam on random token vectors, padded and
unpadded batches in turn, with word pooling (and the document vector or max pooling); the digest
is a SHA-256 of its parameters' bytes, so it also changes when a result differs in its last bit.
"""
import argparse
import hashlib

import torch

from spacy_fsemicrf.structured.heads import FilteredSemiCRFHead, SemiCRFHead

HEADS = [
    ("filtered", FilteredSemiCRFHead, dict(doc_vector=True, word_pool=True)),
    ("exact semi-CRF", SemiCRFHead, dict(doc_vector=True, word_pool=True)),
    ("filtered, max pooling", FilteredSemiCRFHead,
     dict(span_repr="sum_endpoints_neighbors_max", word_pool=True)),
]


def digest(head_cls, kwargs, steps: int) -> str:
    torch.manual_seed(0)
    head = head_cls(16, 3, max_width=4, hidden_width=12, **kwargs)
    optimizer = torch.optim.Adam(head.parameters(), lr=0.01)
    gold = torch.tensor([[0, 1, 2, 1], [1, 0, 0, 2], [2, 3, 4, 3], [3, 6, 6, 1]])
    for step in range(steps):
        X = torch.randn(4, 9, 16)
        lengths = torch.tensor([9, 9, 5, 7]) if step % 2 else torch.full((4,), 9)
        words = torch.randint(0, 5, (4, 9))
        loss = head(X, lengths, gold=gold, words=words)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    data = b"".join(p.detach().numpy().tobytes() for p in head.parameters())
    return hashlib.sha256(data).hexdigest()[:16]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    torch.set_num_threads(1)
    for name, head_cls, kwargs in HEADS:
        print(f"{name}: {digest(head_cls, kwargs, args.steps)}")


if __name__ == "__main__":
    main()
