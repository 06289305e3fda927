"""The structured layer: plain PyTorch, no spaCy, usable on its own.

* :mod:`.spans` — candidate spans on a padded batch, gold grids, span featurizers;
* :mod:`.filtered` — the filtered semi-CRF (node sets, log Z, Viterbi, marginals);
* :mod:`.semicrf` — the exact semi-Markov CRF;
* :mod:`.linear_crf` — the linear-chain CRF over BIO / BILUO tags;
* :mod:`.heads` — the three as ``nn.Module`` heads with one interface;
* :mod:`.compaction` — how the filtered graph is solved: clusters, cliques, scanned rows;
* :mod:`.semiring` — the log-space helpers the dynamic programs share;
* :mod:`.growth` — growing a trained head by new entity labels (the heads' ``add_labels``);
* :mod:`.context`, :mod:`.null_tokens`, :mod:`.mean_field` — the heads' optional parts (a
  BiLSTM and same-word pooling, null tokens, mean-field refinement of the node scores);
* :mod:`.confidences`, :mod:`.prediction` — entity confidences, candidates, path
  probabilities, and what a head returns;
* :mod:`.constraints`, :mod:`.itemgraphs`, :mod:`.constrained`, :mod:`.pathsearch`,
  :mod:`.lattice`, :mod:`.nbest` — exact constrained and k-best decoding for the three heads.

Each dynamic program is described in docs/algorithm.md and tested against brute force.
"""
from .filtered import (
    NodeSet,
    consistent_log_score,
    decode_node_set,
    decode_node_set_log_z,
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
    "consistent_log_score",
    "decode_node_set",
    "decode_node_set_log_z",
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
