"""Optional token context at the bottom of a head: a BiLSTM, and same-word pooling.

The paper's released code runs a one-layer BiLSTM (half the encoder width per direction)
between the encoder and the span representation. Here it is part of the head, so the
encoder (a spaCy ``tok2vec`` or a transformer listener) stays the same for every component
it feeds; ``depth = 0`` leaves the vectors as they are and has no parameters.
"""
from typing import Optional

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from .spans import check_integer, same_word_mean


class TokenContext(nn.Module):
    """``[B, L, D] -> [B, L, D']``: ``depth`` BiLSTM layers of ``D // 2`` units per direction
    (``D' = 2 * (D // 2)``), or the identity when ``depth`` is 0.

    Padded positions never reach a real token: the rows are packed by their lengths, so the
    backward direction of a short document starts at its own last token. Positions past a
    document's length come out as zeros.
    """

    def __init__(self, input_width: int, depth: int = 0) -> None:
        super().__init__()
        check_integer("input_width", input_width, 1)
        check_integer("context_depth", depth, 0)  # (True built an LSTM that failed to run)
        self.input_width = input_width
        self.depth = depth
        if depth == 0:
            self.lstm = None
            self.output_width = input_width
            return
        hidden = max(1, input_width // 2)
        self.lstm = nn.LSTM(input_width, hidden, num_layers=depth, batch_first=True,
                            bidirectional=True)
        self.output_width = 2 * hidden

    def forward(self, X: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        if self.lstm is None:
            return X
        B, L, _ = X.shape
        if L == 0:
            return X.new_zeros((B, 0, self.output_width))
        # Empty documents get one (padding) step: packing needs lengths >= 1.
        on_host = lengths.cpu()
        steps = on_host.clamp(1, L)
        packed = pack_padded_sequence(X, steps, batch_first=True, enforce_sorted=False)
        out, _ = self.lstm(packed)
        out = pad_packed_sequence(out, batch_first=True, total_length=L)[0]
        empty = on_host == 0
        if bool(empty.any()):  # that step's output is padding too: zeros, as the docstring says
            out = out.masked_fill(empty.to(out.device).view(-1, 1, 1), 0.0)
        return out


class WordPool(nn.Module):
    """``[B, L, D] -> [B, L, D]``: adds to each token vector ``P m``, where ``m`` is the mean
    vector of the tokens of its document with the same word (:func:`~.spans.same_word_mean`),
    or the identity when disabled.

    A name that recurs in a document nearly always keeps its type (a club in a results table is
    an ORG in every row), but a CNN ``tok2vec`` labels each mention from its own few tokens of
    context; pooling the mentions lets the clearest one inform the others. ``P`` has no bias,
    so padding stays zero. It reads whole documents: callers pool before splitting a long
    document into blocks.
    """

    def __init__(self, input_width: int, enabled: bool = False) -> None:
        super().__init__()
        check_integer("input_width", input_width, 1)
        self.proj = nn.Linear(input_width, input_width, bias=False) if enabled else None

    def forward(
        self, X: torch.Tensor, lengths: torch.Tensor, words: Optional[torch.Tensor] = None
    ) -> torch.Tensor:
        if self.proj is None:
            return X
        if words is None:
            raise ValueError("A head with word_pool needs the word ids of the tokens (words=...)")
        if not isinstance(words, torch.Tensor):
            raise TypeError(f"words must be an integer tensor [B, L], got {type(words).__name__}")
        if words.is_floating_point() or words.is_complex() or words.shape != X.shape[:2]:
            # (another shape pooled tokens with the word ids of others; 1.2 and 1.7 were one id)
            raise ValueError(
                f"words must be an integer tensor [B, L], one id per token row of the "
                f"{tuple(X.shape)} vectors, got {tuple(words.shape)} {words.dtype}"
            )
        return X + self.proj(same_word_mean(X, words, lengths))
