"""Worker processes keep the memory they free for their next batch.

A batch of prediction allocates and frees tens of MB (the head scores every candidate span).
glibc's ``free`` hands the top of the heap back to the system once more than its trim threshold
is free there, and the next batch then faults every page in again. That happened on nearly
every batch in workers forked by ``nlp.pipe(n_process=N)`` from a process that had not predicted
yet (glibc adapts its thresholds to the allocations it has seen, and there were none) and in
Dask's workers, whose nanny sets ``MALLOC_TRIM_THRESHOLD_=65536``
(``benchmarks/results/worker_heap.md``). A worker exists to run batch after batch, so it keeps
up to :data:`TRIM_THRESHOLD` of free heap instead; memory is returned when the process ends.
"""
import ctypes
import functools
import platform
from typing import Optional

# glibc's mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3

# Free heap a worker keeps before returning it to the system: above what a batch of 64
# documents of a few hundred tokens allocates.
TRIM_THRESHOLD = 128 * 2**20
# Allocations of this size and more get their own mapping, returned as soon as they are freed
# (glibc's own upper bound for its adaptive threshold, which setting the trim threshold fixes).
MMAP_THRESHOLD = 32 * 2**20


@functools.lru_cache(maxsize=None)
def _glibc() -> Optional[ctypes.CDLL]:
    """The symbols this process has loaded, glibc's among them; None without glibc. (Not
    ``ctypes.util.find_library``, which runs ``ldconfig``: this runs in every forked child.)"""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    return ctypes.CDLL(None)


def keep_freed_heap() -> bool:
    """Set this process's malloc to keep up to :data:`TRIM_THRESHOLD` of freed heap.

    Returns whether the settings were applied (only with glibc; elsewhere a no-op).
    """
    libc = _glibc()
    if libc is None:
        return False
    # mallopt returns 1 on success.
    trim = libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    mmap = libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)
    return trim == 1 and mmap == 1
