"""Worker processes keep freed heap: a batch's memory is not faulted in again for the next.

glibc reads ``MALLOC_TRIM_THRESHOLD_`` when a process starts, so each check runs a fresh
interpreter with Dask's nanny setting (65536: large blocks are mapped and unmapped at every
allocation) and counts the page faults of allocating and freeing the same block repeatedly.
"""
import json
import os
import subprocess
import sys

import pytest

from spacy_fsemicrf.worker_heap import _glibc

BLOCK = 24 * 2**20  # below worker_heap.MMAP_THRESHOLD, so it comes from the heap once kept
CYCLES = 8
PAGES = BLOCK // os.sysconf("SC_PAGE_SIZE")


def _huge_pages_always() -> bool:
    """Whether the kernel backs anonymous memory with 2 MiB pages everywhere (a block then
    faults in a few pages, kept or not, and the counts below say nothing)."""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            return "[always]" in f.read()
    except OSError:
        return False


pytestmark = [
    pytest.mark.skipif(_glibc() is None, reason="malloc settings need glibc"),
    pytest.mark.skipif(_huge_pages_always(), reason="transparent huge pages hide page faults"),
]

# Page faults of CYCLES allocations of BLOCK zeroed bytes, each freed before the next.
REFAULTS = f"""
import resource

def refaults():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range({CYCLES}):
        block = bytearray({BLOCK})
        del block
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
"""

SCRIPT = REFAULTS + """
import json, multiprocessing
import spacy
from spacy_fsemicrf.worker_heap import keep_freed_heap

spacy.blank("en").add_pipe("fsemicrf_ner")  # a process that holds the component

def child(queue):
    queue.put(refaults())

ctx = multiprocessing.get_context("fork")
queue = ctx.Queue()
worker = ctx.Process(target=child, args=(queue,))
worker.start()
forked = queue.get(timeout=120)
worker.join()
parent = refaults()
kept = keep_freed_heap()
print(json.dumps({"forked": forked, "parent": parent, "kept": kept, "after": refaults()}))
"""


def test_forked_workers_keep_freed_heap_and_the_parent_is_left_alone():
    env = {**os.environ, "MALLOC_TRIM_THRESHOLD_": "65536"}
    proc = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True,
                          text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    # Making the component changes nothing in the process itself: every block is faulted in.
    assert got["parent"] >= CYCLES * PAGES
    # A forked child and a process that asked for it fault a block in once, then reuse it.
    assert got["forked"] < 2 * PAGES
    assert got["kept"] is True and got["after"] < 2 * PAGES
