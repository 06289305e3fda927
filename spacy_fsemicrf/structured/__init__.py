"""The structured layer: plain PyTorch, no spaCy, usable on its own.

* :mod:`.spans` — candidate spans on a padded batch, gold grids, span featurizers;
* :mod:`.filtered` — the filtered semi-CRF (node sets, log Z, Viterbi, marginals);
* :mod:`.semicrf` — the exact semi-Markov CRF;
* :mod:`.linear_crf` — the linear-chain CRF over BIO / BILUO tags;
* :mod:`.heads` — the three as ``nn.Module`` heads with one interface.
"""
from .filtered import (
    NodeSet,
    decode_node_set,
    filtered_decode,
    filtered_log_partition,
    filtered_marginals,
    filtered_viterbi,
    inference_node_set,
    inference_nodes,
    path_score,
    training_nodes,
)
from .heads import HEADS, FilteredSemiCRFHead, LinearCRFHead, SemiCRFHead
from .semiring import NEG
from .spans import SpanFeaturizer, gold_label_grid, span_mask

__all__ = [
    "FilteredSemiCRFHead",
    "HEADS",
    "LinearCRFHead",
    "NEG",
    "NodeSet",
    "SemiCRFHead",
    "SpanFeaturizer",
    "decode_node_set",
    "filtered_decode",
    "filtered_log_partition",
    "filtered_marginals",
    "filtered_viterbi",
    "gold_label_grid",
    "inference_node_set",
    "inference_nodes",
    "path_score",
    "span_mask",
    "training_nodes",
]
