"""Annotate a corpus at scale with any spaCy pipeline, on Dask distributed.

    python -m spacy_fsemicrf annotate MODEL INPUT OUTPUT [--workers N] [--scheduler ADDRESS]
        [--batch-size B] [--shard-size S] [--update] [--no-progress]

:mod:`.inputs` reads INPUT and splits it into shards, :mod:`.shards` writes OUTPUT,
:mod:`.engine` runs one Dask task per shard (the only module that needs Dask, the
``annotate`` extra). docs/scaling.md describes running it on a cluster of several machines.
"""
from .inputs import AnnotateError, Shard, plan_shards, read_shard
from .shards import read_entities, read_output

__all__ = ["AnnotateError", "Shard", "annotate", "plan_shards", "read_entities", "read_output",
           "read_shard"]


def annotate(*args, **kwargs):
    """:func:`spacy_fsemicrf.annotate.engine.annotate` (imported on first use: it needs Dask)."""
    from .engine import annotate as run

    return run(*args, **kwargs)
