"""Annotation on Dask distributed: one task per shard, the pipeline loaded once per worker.

Without a scheduler address a ``LocalCluster`` of worker processes (one thread each) runs on
this machine; with one, the same tasks run on that cluster, whose workers must reach the
model, the input and OUTPUT at the same paths (docs/scaling.md). A task reads its shard,
annotates it with ``nlp.pipe`` and writes the shard atomically (:mod:`.shards`), so a task
that is retried after its worker died, or rerun after the whole run was interrupted, rewrites
the same complete shard: no document is lost or annotated twice.

This is the only module that imports Dask.
"""
import hashlib
import logging
import os
import signal
import socket
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple, Union

import spacy
from spacy.language import Language
from tqdm import tqdm

from ..msgpack_lookups import remember_msgpack_lookups
from ..worker_heap import keep_freed_heap
from .inputs import DEFAULT_SHARD_SIZE, AnnotateError, Shard, plan_shards, read_shard
from .shards import (entity_records, finished_shards, merge_entities, prepare_output,
                     remove_temporary, score_keys, write_shard)

try:
    import dask.system
    from distributed import Client, LocalCluster, as_completed
except ImportError:  # pragma: no cover - the annotate extra is not installed
    Client = LocalCluster = as_completed = None

NO_DASK = "annotate needs Dask distributed: pip install 'spacy-fsemicrf[annotate]'"
# Worker state: the pipelines this process has loaded, by model, and how often each was loaded.
_PIPELINES: Dict[str, Language] = {}
_LOADS: Dict[str, int] = {}
# One load at a time, and one shard at a time on a pipeline, on workers with several threads.
_LOAD_LOCK = threading.Lock()
_PIPE_LOCK = threading.Lock()
# the preload of the local cluster's workers (Ctrl-C), by path: see the module
WORKER_PRELOAD = str(Path(__file__).with_name("worker_preload.py"))


@dataclass
class Summary:
    """What a run did."""

    docs: int  # documents in the input
    shards: int
    skipped_shards: int  # finished by an earlier run
    entities: int
    workers: int
    seconds: float
    entities_path: Path
    changed_shards: int = 0  # with ``update``: whose documents changed, or new since that run

    @property
    def docs_per_second(self) -> float:
        return self.docs / self.seconds if self.seconds else float("inf")


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during a run, with what OUTPUT holds by then: a KeyboardInterrupt still, for
    callers that handle one."""

    def __init__(self, output: Path, written: int, total: int):
        super().__init__(output, written, total)
        self.output, self.written, self.total = output, written, total

    def __str__(self) -> str:
        if self.written == self.total:  # stopped while its own cluster closed
            return (f"all {self.total} shards are written in {self.output}; run the same "
                    f"command again to merge their entities")
        return (f"{self.written} of {self.total} shards are written in {self.output}; run the "
                f"same command again to annotate the other {self.total - self.written}")


def load_pipeline(model: str) -> Language:
    """The pipeline ``model`` (a path or an installed package), loaded once in this process."""
    with _LOAD_LOCK:
        if model not in _PIPELINES:
            remember_msgpack_lookups()
            keep_freed_heap()  # overrides the nanny's MALLOC_TRIM_THRESHOLD_=65536
            try:
                _PIPELINES[model] = spacy.load(model)
            except Exception as err:  # a missing model is an OSError, a broken one anything
                raise AnnotateError(
                    f"cannot load the pipeline {model!r} on {socket.gethostname()}: {err}"
                ) from err
            _LOADS[model] = _LOADS.get(model, 0) + 1
        return _PIPELINES[model]


def load_counts() -> Dict[str, int]:
    """How many times this process loaded each pipeline (1 each, unless it was evicted)."""
    return dict(_LOADS)


def annotate_shard(
    model: str, shard: Shard, output: str, batch_size: Optional[int]
) -> Dict[str, Any]:
    """The task: annotate one shard and write it. Returns its counts, this worker's pid and the
    seconds the task took."""
    start = time.perf_counter()
    nlp = load_pipeline(model)
    try:
        inputs, ids = read_shard(shard, nlp.vocab, nlp.max_length)
    except AnnotateError as err:  # OUTPUT's manifest holds the digests of the input as it is
        raise AnnotateError(f"{err}; fix INPUT, then rerun with --update: the shards written "
                            f"are kept") from err
    keys = score_keys(nlp)
    docs, records = [], []
    with _PIPE_LOCK:
        for doc, doc_id in zip(nlp.pipe(inputs, batch_size=batch_size), ids):
            doc.user_data["id"] = doc_id
            docs.append(doc)
            records.extend(entity_records(doc, doc_id, keys))
    try:
        write_shard(Path(output), shard.index, docs, records)
    except OSError as err:  # a full disk, a read-only or vanished OUTPUT
        raise AnnotateError(f"cannot write shard {shard.index} into {output} on "
                            f"{socket.gethostname()}: {err}") from err
    return {"index": shard.index, "docs": len(docs), "entities": len(records), "pid": os.getpid(),
            "seconds": time.perf_counter() - start}


def shard_task(
    model: str, shard: Shard, output: str, batch_size: Optional[int]
) -> Union[Dict[str, Any], AnnotateError]:
    """:func:`annotate_shard`, with an AnnotateError (a bad input, a model that does not load)
    returned, not raised: a worker logs every exception a task raises, with its traceback, which
    is noise for an error that is the user's to fix. Any other exception is raised: a bug."""
    try:
        return annotate_shard(model, shard, output, batch_size)
    except AnnotateError as err:
        return err


def resolve_model(model: str, must_exist_here: bool) -> str:
    """An absolute path for a pipeline directory here, or for a path that is not here (on a
    remote cluster's storage), else the name as given (an installed package). Without a remote
    cluster the model must be loadable here: checked before any worker starts."""
    path = Path(model)
    if path.exists():
        if not (path / "config.cfg").is_file():
            raise AnnotateError(f"MODEL {model} is not a spaCy pipeline directory (no config.cfg)")
        return str(path.resolve())
    if must_exist_here and not spacy.util.is_package(model):
        raise AnnotateError(
            f"MODEL {model!r} not found: it is neither a pipeline directory nor an installed "
            f"pipeline package"
        )
    if len(path.parts) > 1 or model.startswith("."):  # no package name: a path
        # relative to this process's directory, as INPUT and OUTPUT are: a worker would read it
        # from its own, and load another pipeline or none
        return os.path.abspath(model)
    return model


def model_build(model: str) -> Optional[str]:
    """What tells the builds of ``model`` (as :func:`resolve_model` gives it) apart, where this
    machine has it: a digest of a pipeline directory's files, or an installed package's version
    (``scripts/package.py`` labels it with a digest of the pipeline's files); else None."""
    path = Path(model)
    if path.is_dir():
        digest = hashlib.blake2b(digest_size=16)
        try:
            for file in sorted(p for p in path.rglob("*") if p.is_file()):
                name = file.relative_to(path).as_posix().encode("utf8")
                digest.update(name + b"\0" + file.stat().st_size.to_bytes(8, "little"))
                with file.open("rb") as f:
                    for block in iter(lambda: f.read(1 << 20), b""):
                        digest.update(block)
        except OSError as err:
            raise AnnotateError(f"cannot read the pipeline {model}: {err}") from err
        return f"files:{digest.hexdigest()}"
    if spacy.util.is_package(model):
        return f"version:{spacy.util.get_package_version(model)}"
    return None


def connect(scheduler: Optional[str], workers: Optional[int]) -> Tuple[Any, Any]:
    """``(client, cluster)``: a client of the scheduler at ``scheduler``, or of a new
    ``LocalCluster`` of ``workers`` processes with one thread each (cluster None otherwise)."""
    if Client is None:
        raise AnnotateError(NO_DASK)
    if scheduler:
        try:
            return Client(scheduler, timeout="30s"), None
        except OSError as err:
            raise AnnotateError(f"cannot reach the Dask scheduler at {scheduler}: {err}") from err
        except ValueError as err:  # Dask's parse of the address: an unknown scheme, a bad port
            raise AnnotateError(f"{scheduler!r} is not a Dask scheduler address (such as "
                                f"tcp://10.0.0.1:8786): {err}") from err
    # the cores this process may use (its CPU affinity, a container's CPU quota), as Dask counts
    # them; os.cpu_count() counts the machine's
    n_workers = workers or dask.system.CPU_COUNT or 1
    # for callers that keep the cluster (annotate wraps more)
    with nanny_environment_restored(), ctrl_c_ignored():
        # No dashboard; the scheduler's HTTP endpoints on a free port, not 8787, so that two
        # annotate jobs on one machine do not fight over it (Dask warns when they do).
        cluster = LocalCluster(n_workers=n_workers, threads_per_worker=1, processes=True,
                               dashboard_address=None, scheduler_kwargs={"dashboard_address": ":0"},
                               silence_logs=logging.ERROR, preload=[WORKER_PRELOAD])
        try:
            return Client(cluster), cluster
        except BaseException:  # no client to close it: its workers would outlive the call
            cluster.close()
            raise


@contextmanager
def _ctrl_c_handled_by(handler: Any) -> Iterator[None]:
    """``handler`` for Ctrl-C (SIGINT) within the block, the present one back after it. Left
    alone outside the main thread (handlers belong to it) and where the present handler was set
    outside Python (``getsignal`` gives None: it could not be put back)."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is None):
        yield
        return
    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@contextmanager
def ctrl_c_ignored() -> Iterator[None]:
    """Ctrl-C ignored while the local cluster and its client start (a few seconds): the worker
    processes started meanwhile inherit that and cannot die of it while they import, each with
    a traceback, before their preload ignores it; and a cluster interrupted while it starts is
    left to Dask to close at exit, workers after their scheduler, with more tracebacks."""
    with _ctrl_c_handled_by(signal.SIG_IGN):
        yield


@contextmanager
def ctrl_c_deferred() -> Iterator[None]:
    """A first Ctrl-C held back until the block ends, then delivered to the handler that was
    set before; a second one interrupts at once. Around the client's blocking calls
    (``Future.result``, ``cancel``, ``scheduler_info``, ``close``): Dask's ``sync`` interrupted
    before its coroutine starts has its event loop log a NameError traceback (its cancel
    callback reads a variable not yet set)."""
    pending = []

    def hold(signum: int, frame: Any) -> None:
        pending.append(signum)
        if len(pending) > 1:
            raise KeyboardInterrupt

    try:
        with _ctrl_c_handled_by(hold):
            yield
    finally:  # the handler that was set before gets it, once put back
        if len(pending) == 1:
            signal.raise_signal(signal.SIGINT)


@contextmanager
def nanny_environment_restored() -> Iterator[None]:
    """Undo, on leaving, what Dask writes into this process's ``os.environ`` to pass to the
    workers its nannies start (``distributed.nanny.pre-spawn-environ``: OMP_NUM_THREADS=1,
    MALLOC_TRIM_THRESHOLD_=65536, ...; PYTHONHASHSEED; ``__DASK_PARENT_PID``); left there,
    every process the caller starts later would inherit them."""
    saved = dict(os.environ)
    try:
        yield
    finally:
        for key in set(os.environ) - set(saved):
            del os.environ[key]
        os.environ.update(saved)


def annotate(
    model: str,
    input_path: Path,
    output: Path,
    *,
    workers: Optional[int] = None,
    scheduler: Optional[str] = None,
    batch_size: Optional[int] = None,
    shard_size: int = DEFAULT_SHARD_SIZE,
    client: Any = None,
    progress: bool = True,
    on_shard_done: Optional[Callable[[Dict[str, Any]], None]] = None,
    update: bool = False,
) -> Summary:
    """Annotate every document of ``input_path`` with the pipeline ``model`` into ``output``.

    Shards finished by an earlier run into the same ``output`` are kept; the others are
    annotated. An input that changed since that run is refused, unless ``update``: then the
    shards whose documents changed are annotated again and the others kept. ``client`` runs
    the tasks on an existing Dask client (it is left open);
    otherwise one is made from ``scheduler`` or a new LocalCluster of ``workers`` processes.
    ``on_shard_done`` is called with each finished task's result, in the order they finish.
    """
    start = time.perf_counter()
    for name, value in (("batch size", batch_size), ("number of workers", workers)):
        if value is not None and value < 1:  # nlp.pipe(batch_size=0) yields no document
            raise AnnotateError(f"the {name} must be at least 1, got {value}")
    if client is None and Client is None:
        raise AnnotateError(NO_DASK)
    model = resolve_model(model, must_exist_here=client is None and not scheduler)
    output = Path(output)
    if Path(input_path).is_dir() and output.resolve().is_relative_to(Path(input_path).resolve()):
        # the next run into it (a rerun after a crash, say) would read the output as input
        raise AnnotateError(f"OUTPUT {output} is inside the INPUT directory {input_path}: "
                            f"write it elsewhere")
    shards = plan_shards(Path(input_path), shard_size)
    changed = prepare_output(output, model, shard_size, shards, update=update,
                             build=model_build(model))
    remove_temporary(output)
    done = finished_shards(output, shards)
    todo = [shard for shard in shards if shard.index not in done]
    try:
        n_workers = _run_todo(client, scheduler, workers, model, todo, shards, output,
                              batch_size, progress, on_shard_done)
    except KeyboardInterrupt as err:  # the shards written are kept for the rerun
        raise Interrupted(output, len(finished_shards(output, shards)), len(shards)) from err
    remove_temporary(output)  # left by workers killed while writing (their shards were redone)
    missing = [s.index for s in shards if s.index not in finished_shards(output, shards)]
    if missing:  # pragma: no cover - every task either wrote its shard or raised
        raise AnnotateError(f"shards {missing[:10]} were not written; rerun to finish them")
    entities_path = merge_entities(output, shards)
    with entities_path.open("rb") as f:
        n_entities = sum(1 for _ in f)
    return Summary(
        docs=sum(s.count for s in shards),
        shards=len(shards),
        skipped_shards=len(done),
        entities=n_entities,
        workers=n_workers,
        seconds=time.perf_counter() - start,
        entities_path=entities_path,
        changed_shards=len(changed),
    )


def _run_todo(client, scheduler: Optional[str], workers: Optional[int], model: str,
              todo: List[Shard], shards: List[Shard], output: Path, batch_size: Optional[int],
              progress: bool, on_shard_done) -> int:
    """Annotate the shards of ``todo`` on ``client``, or on a client made from ``scheduler`` or
    ``workers`` (none if nothing is left to do) and closed afterwards; the number of workers."""
    cluster = None
    # nannies that restart a worker during the run write into os.environ again
    with nanny_environment_restored():
        own_client = bool(todo) and client is None
        if own_client:
            client, cluster = connect(scheduler, workers)
        try:
            with ctrl_c_deferred():
                n_workers = len(client.scheduler_info()["workers"]) if client is not None else 0
            if todo and not n_workers:  # Dask holds the tasks until a worker joins, silently
                at = f" at {scheduler}" if scheduler else ""
                print(f"the Dask scheduler{at} has no workers: the {len(todo)} shards wait until "
                      f"one joins (Ctrl-C stops the run)", file=sys.stderr)
            _run_tasks(client, model, todo, shards, output, batch_size, progress, on_shard_done)
        finally:
            if own_client:
                with ctrl_c_deferred():
                    client.close()
                    if cluster is not None:
                        cluster.close()
    return n_workers


def _run_tasks(client, model: str, todo: List[Shard], shards: List[Shard], output: Path,
               batch_size: Optional[int], progress: bool, on_shard_done) -> None:
    """Submit one task per shard of ``todo`` and wait for all; the first failure cancels the
    rest and is raised as an AnnotateError."""
    if not todo:
        return
    by_key = {}
    futures = []
    # absolute, as the input files and a model directory are: workers run in their own cwd
    where = os.path.abspath(output)
    for shard in todo:
        future = client.submit(shard_task, model, shard, where, batch_size, pure=False)
        by_key[future.key] = shard
        futures.append(future)
    total = sum(s.count for s in shards)
    initial = total - sum(s.count for s in todo)
    with tqdm(total=total, initial=initial, unit="doc", disable=not progress) as bar:
        # Ctrl-C while as_completed waits stops there; in the client's calls, right after them
        for future in as_completed(futures):
            with ctrl_c_deferred():
                try:
                    result = future.result()
                except Exception as err:  # a bug, or a shard that killed its workers
                    client.cancel(futures)
                    raise _task_error(by_key[future.key], err) from err
                if isinstance(result, AnnotateError):
                    client.cancel(futures)
                    raise result
            bar.update(result["docs"])
            if on_shard_done is not None:
                on_shard_done(result)


def _task_error(shard: Shard, err: Exception) -> AnnotateError:
    where = f"{shard.name}, documents {shard.start}..{shard.start + shard.count - 1}"
    return AnnotateError(f"shard {shard.index} ({where}) failed: {type(err).__name__}: {err}")
