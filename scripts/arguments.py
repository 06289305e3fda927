"""argparse types the project's scripts share: a count or a duration out of range is argparse's
one-line usage error (exit status 2), not a traceback or a silent wrong result later."""
import argparse


def count(text: str) -> int:
    """An integer of at least 1 (documents, sentences, repeats, seeds, steps, workers...)."""
    value = int(text)  # not an integer: argparse's "invalid count value"
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def seconds(text: str) -> float:
    """A duration above 0 seconds (0 would read as no limit, a negative one as over at once)."""
    value = float(text)
    if not value > 0:  # (NaN too)
        raise argparse.ArgumentTypeError(f"must be above 0 seconds, got {text}")
    return value
