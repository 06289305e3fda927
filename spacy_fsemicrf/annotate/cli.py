"""``python -m spacy_fsemicrf annotate``: the command line of :func:`.engine.annotate`."""
import argparse
import sys
from pathlib import Path
from typing import List, Optional

from .inputs import DEFAULT_SHARD_SIZE, AnnotateError

DESCRIPTION = """Annotate INPUT (a .spacy file, a .jsonl file with a "text" field and an
optional "id" per line, or a directory of them) with the spaCy pipeline MODEL (a directory or
an installed package) into OUTPUT: shards/NNNNNN.spacy (the annotated documents, their ids in
doc.user_data["id"]) and entities.jsonl (id, start and end character, label, text, score).
Runs on a Dask LocalCluster, or on the cluster whose scheduler is given. Rerun the same command
after a crash: finished shards are kept, the others are annotated. After fixing or extending
INPUT, rerun with --update: only the shards whose documents changed are annotated again."""


def parse_args(argv: List[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m spacy_fsemicrf annotate",
                                     description=DESCRIPTION)
    parser.add_argument("model", help="pipeline directory or installed pipeline package")
    parser.add_argument("input", type=Path, help=".spacy or .jsonl file, or a directory of them")
    parser.add_argument("output", type=Path, help="output directory (created)")
    parser.add_argument("--workers", type=int, default=None,
                        help="worker processes of the local cluster (default: one per core "
                        "this process may use)")
    parser.add_argument("--scheduler", default=None,
                        help="address of a running Dask scheduler, e.g. tcp://10.0.0.1:8786")
    parser.add_argument("--batch-size", type=int, default=None,
                        help="nlp.pipe batch size (default: the pipeline's)")
    parser.add_argument("--shard-size", type=int, default=DEFAULT_SHARD_SIZE,
                        help="documents per shard, the unit of work and of output "
                        f"(default {DEFAULT_SHARD_SIZE})")
    parser.add_argument("--update", action="store_true",
                        help="accept an INPUT that changed since the run in OUTPUT: annotate "
                        "the shards whose documents changed, keep the others")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser.parse_args(argv)


def main(argv: List[str]) -> int:
    args = parse_args(argv)
    from .engine import Interrupted, annotate

    try:
        summary = annotate(args.model, args.input, args.output, workers=args.workers,
                           scheduler=args.scheduler, batch_size=args.batch_size,
                           shard_size=args.shard_size, progress=not args.no_progress,
                           update=args.update)
    except AnnotateError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as err:  # an Interrupted once the run has its shards
        what = str(err) if isinstance(err, Interrupted) else (
            "run the same command again to finish (finished shards are kept)")
        print(f"interrupted: {what}", file=sys.stderr)
        return 130
    kept = f", {summary.skipped_shards} kept from an earlier run" if summary.skipped_shards else ""
    if summary.changed_shards:
        kept += f", {summary.changed_shards} changed since then"
    print(f"{_count(summary.docs, 'document')} in {_count(summary.shards, 'shard')}{kept}; "
          f"{_count(summary.entities, 'entity', 'entities')} in {summary.entities_path}; "
          f"{summary.seconds:.1f} s")
    return 0


def _count(n: int, one: str, many: Optional[str] = None) -> str:
    """``n`` and the noun, singular for 1 ("1 shard", "3 shards")."""
    return f"{n} {one if n == 1 else many or one + 's'}"
