"""argparse types and checks the project's scripts share: a count or a duration out of range, or
a missing pipeline or file, is argparse's one-line usage error (exit status 2), not a traceback or
a silent wrong result later."""
import argparse
from pathlib import Path
from typing import Callable, Dict, List


def count(text: str) -> int:
    """An integer of at least 1 (documents, sentences, repeats, seeds, steps, workers...)."""
    value = int(text)  # not an integer: argparse's "invalid count value"
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def duration(unit: str) -> Callable[[str], float]:
    """The argparse type of a duration above 0 ``unit`` (0 would read as no limit, a negative
    one as over at once)."""

    def parse(text: str) -> float:
        value = float(text)  # not a number: argparse's "invalid <unit> value"
        if not value > 0:  # (NaN too)
            raise argparse.ArgumentTypeError(f"must be above 0 {unit}, got {text}")
        return value

    parse.__name__ = unit
    return parse


seconds = duration("seconds")


# Checks of paths, called after parse_args: the documented commands name files that only a
# trained project has, and tests/argparse_only.py parses them without those files.
def check_pipeline(parser: argparse.ArgumentParser, option: str, path: str) -> None:
    """argparse's error, before anything loads, where ``path`` is no pipeline directory."""
    if not (Path(path) / "config.cfg").is_file():
        parser.error(f"{option} {path} is not a pipeline directory")


def named_pipelines(parser: argparse.ArgumentParser, option: str,
                    specs: List[str]) -> Dict[str, str]:
    """``{NAME: PATH}`` of ``NAME=PATH`` entries; argparse's error for one without ``=`` or
    that names no pipeline directory."""
    out = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not name or not sep:
            parser.error(f"{option} takes NAME=PATH, got {spec!r}")
        check_pipeline(parser, option, path)
        out[name] = path
    return out


def check_file(parser: argparse.ArgumentParser, option: str, path) -> None:
    """argparse's error where ``path`` is no file (read only after the pipelines load)."""
    if not Path(path).is_file():
        parser.error(f"{option}: no such file: {path}")
