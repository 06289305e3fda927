"""Forked worker processes run PyTorch on one intra-op thread and keep their freed heap.

PyTorch's CPU wheels parallelize with GNU OpenMP, whose thread pool does not survive ``fork``:
once the parent process has run a parallel operation (any prediction with more than one thread),
a forked child that enters a parallel region waits forever for threads that do not exist in it.
``nlp.pipe(texts, n_process=N)`` forks its workers on Linux, so it hung after the parent had
predicted. With one thread the child never enters the pool; that is also the right setting for
N worker processes sharing N cores (PyTorch's own DataLoader workers do the same). A forked
child also keeps the memory it frees for its next batch (:mod:`spacy_fsemicrf.worker_heap`).

Making, training or running an ``fsemicrf_ner`` component registers the handler (an unpickled
one was never made), so a process that has run such a pipeline has it before it forks; others,
where installing the package makes spaCy import it through its entry points, keep their
children as they are. A process not forked from the one holding the component (the ``spawn``
and ``forkserver`` start methods; ``spawn`` is the default on macOS and Windows) gets it
pickled, and runs :func:`one_thread_in_child` when it unpickles it (:func:`unpickled_in_child`).
"""
import os
from typing import Any, Callable, Tuple

import torch

from .worker_heap import keep_freed_heap

_registered = False


def one_thread_in_child() -> None:
    """Set PyTorch to one intra-op thread and keep freed heap (run in the child right after
    ``fork``)."""
    torch.set_num_threads(1)
    keep_freed_heap()


def unpickled_in_child(rebuild: Callable[..., Any], args: Tuple[Any, ...]) -> Any:
    """``rebuild(*args)`` in a process that multiprocessing started with the object pickled
    (``spawn``, ``forkserver``), after :func:`one_thread_in_child` (the object's ``__reduce__``
    names this function while a process is being started)."""
    one_thread_in_child()
    return rebuild(*args)


def register() -> None:
    """Run :func:`one_thread_in_child` in every process forked from this one (once; a no-op on
    platforms without ``fork``)."""
    global _registered
    if _registered or not hasattr(os, "register_at_fork"):
        return
    os.register_at_fork(after_in_child=one_thread_in_child)
    _registered = True
