"""Run command lines only as far as their argument parsing, for tests/test_documented_commands.py.

    python tests/argparse_only.py < jobs.json

Reads ``[[cwd, argv], ...]`` on stdin, where ``argv`` is ``[SCRIPT, ARG...]`` or
``["-m", MODULE, ARG...]``, and prints ``[status, ...]`` as JSON: ``"ok"``, or what went wrong
(argparse's error message, an exception, or ``"no parse"`` for a script that ended without
parsing its arguments). Each script runs as ``__main__`` until its outermost
``parse_args``/``parse_known_args`` returns, which raises instead, so nothing after the parsing
runs. All the jobs share one process: torch and spaCy are imported once.
"""
import argparse
import contextlib
import io
import json
import os
import runpy
import site
import sys
from pathlib import Path
from typing import Any, List, Optional, Sequence, Tuple

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "spacy_fsemicrf"
_parse_known_args = argparse.ArgumentParser.parse_known_args
_depth = 0  # nesting of parse calls: subparsers parse inside their parent's call


class Parsed(Exception):
    """Raised where the outermost parse of a script returns."""


def _parse(parser: argparse.ArgumentParser, args: Optional[Sequence[str]],
           namespace: Any) -> Tuple[Any, List[str]]:
    """argparse's own parse, tracking how deep the calls are nested."""
    global _depth
    _depth += 1
    try:
        return _parse_known_args(parser, args, namespace)
    finally:
        _depth -= 1


def parse_known_args(self: argparse.ArgumentParser, args: Optional[Sequence[str]] = None,
                     namespace: Any = None) -> Tuple[Any, List[str]]:
    """``parse_known_args`` that stops the script once its own parse is done."""
    result = _parse(self, args, namespace)
    if _depth == 0:
        raise Parsed()
    return result


def parse_args(self: argparse.ArgumentParser, args: Optional[Sequence[str]] = None,
               namespace: Any = None) -> Any:
    """``parse_args`` (unknown arguments are errors) that stops the script after parsing."""
    namespace, extra = _parse(self, args, namespace)
    if extra:
        self.error("unrecognized arguments: " + " ".join(extra))
    if _depth == 0:
        raise Parsed()
    return namespace


def run(argv: List[str]) -> None:
    """Run ``argv`` as ``python ARGV`` would, in this process."""
    if argv[0] == "-m":
        sys.argv = [argv[1], *argv[2:]]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(argv)
        sys.path.insert(0, str(Path(argv[0]).resolve().parent))  # as python SCRIPT does
        runpy.run_path(argv[0], run_name="__main__")


def forget_script_modules() -> None:
    """Drop the repository's script modules (not the package's) from ``sys.modules``, so the
    next script imports its helpers afresh, with their ``sys.path`` side effects."""
    # a virtual environment inside the repository (.venv) holds installed modules: kept
    keep = (str(PACKAGE), sys.prefix, *site.getsitepackages())
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None) or ""
        if path.startswith(str(ROOT)) and not path.startswith(keep):
            del sys.modules[name]


def status(cwd: str, argv: List[str]) -> str:
    """What parsing ``argv`` in ``cwd`` gives: ``"ok"`` or the error."""
    stderr, path = io.StringIO(), list(sys.path)
    try:
        os.chdir(cwd)
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
            run(argv)
        return "no parse"
    except Parsed:
        return "ok"
    except SystemExit as exit:
        lines = stderr.getvalue().strip().splitlines()
        return "ok" if exit.code == 0 else (lines[-1] if lines else f"exit status {exit.code}")
    except Exception as error:  # an import or a file that is gone: the command fails too
        return f"{type(error).__name__}: {error}"
    finally:
        sys.path[:] = path
        forget_script_modules()
        os.chdir(ROOT)


def main() -> None:
    argparse.ArgumentParser.parse_known_args = parse_known_args
    argparse.ArgumentParser.parse_args = parse_args
    jobs = json.load(sys.stdin)
    print(json.dumps([status(cwd, argv) for cwd, argv in jobs]))


if __name__ == "__main__":
    main()
