"""The preload of ``annotate``'s local cluster workers, given to Dask as a file: imported as a
module of the package it would import spaCy, seconds before the worker is up.

The terminal sends Ctrl-C to the whole process group: the workers ignore it, and the driver,
which gets it too, closes them, without the traceback each worker would print. A worker that
is busy when the driver closes the cluster may still send a heartbeat to the scheduler being
closed in the driver and log the failure: that is the driver going away on purpose, not news.
"""
import logging
import signal

HEARTBEAT_FAILED = "Failed to communicate with scheduler during heartbeat"


def _not_a_heartbeat_failure(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith(HEARTBEAT_FAILED)


def dask_setup(worker) -> None:
    """Called by Dask in the worker's main thread, where signal handlers are set."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.getLogger("distributed.worker").addFilter(_not_a_heartbeat_failure)
