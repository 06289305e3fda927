"""An optional BiLSTM over the token vectors, at the bottom of a head.

The paper's released code runs a one-layer BiLSTM (half the encoder width per direction)
between the encoder and the span representation. Here it is part of the head, so the
encoder (a spaCy ``tok2vec`` or a transformer listener) stays the same for every component
it feeds; ``depth = 0`` leaves the vectors as they are and has no parameters.
"""
import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence


class TokenContext(nn.Module):
    """``[B, L, D] -> [B, L, D']``: ``depth`` BiLSTM layers of ``D // 2`` units per direction
    (``D' = 2 * (D // 2)``), or the identity when ``depth`` is 0.

    Padded positions never reach a real token: the rows are packed by their lengths, so the
    backward direction of a short document starts at its own last token. Positions past a
    document's length come out as zeros.
    """

    def __init__(self, input_width: int, depth: int = 0) -> None:
        super().__init__()
        if depth < 0:
            raise ValueError(f"context_depth must be >= 0, got {depth}")
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
        # Empty documents get one (padding) step: packing needs lengths >= 1, and no span of
        # theirs reads the output.
        steps = lengths.clamp(1, L).cpu()
        packed = pack_padded_sequence(X, steps, batch_first=True, enforce_sorted=False)
        out, _ = self.lstm(packed)
        return pad_packed_sequence(out, batch_first=True, total_length=L)[0]
