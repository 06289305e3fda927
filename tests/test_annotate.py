"""``python -m spacy_fsemicrf annotate``: a Dask LocalCluster of two worker processes annotates a
few hundred short documents (a directory of a .jsonl and a .spacy file) like ``nlp.pipe`` in one
process, every document exactly once, also when a worker is killed mid-run and when the whole
run is killed and run again; bad models and inputs fail clearly and leave no partial shard.
"""
import hashlib
import json
import os
import pathlib
import pickle
import random
import re
import shutil
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path
from types import SimpleNamespace

import numpy
import pytest
import spacy
from spacy.tokens import Doc, DocBin

pytest.importorskip("distributed")

from spacy_fsemicrf.annotate import (  # noqa: E402
    AnnotateError, annotate, read_entities, read_output)
from spacy_fsemicrf.annotate.cli import main as cli_main  # noqa: E402
from spacy_fsemicrf.annotate.engine import connect, load_counts  # noqa: E402
from spacy_fsemicrf.annotate.inputs import plan_shards, read_shard  # noqa: E402
from spacy_fsemicrf.annotate.shards import entity_records, shard_paths, write_shard  # noqa: E402
from spacy_fsemicrf.worker_heap import _glibc  # noqa: E402

try:
    from .test_worker_heap import PAGES, REFAULTS
except ImportError:  # pragma: no cover - tests run as a plain directory
    from test_worker_heap import PAGES, REFAULTS

N_JSONL, N_SPACY = 160, 80
SHARD, BATCH = 20, 10  # shards are whole batches, so the batches equal nlp.pipe's
PEOPLE = ["John Smith", "Mary", "Anna Lee", "Peter", "Laura Palmer"]
ORGS = ["Google", "Microsoft", "Tesla", "Amazon", "Apple"]
PLACES = ["Paris", "Berlin", "Rome", "Madrid", "London", "Norway"]
TEMPLATES = [
    "{p} works for {o} in {l} .",
    "{p} flew to {l} on Monday .",
    "{o} hired {p} last year .",
    "Sales at {o} rose in {l} .",
    "Nobody said anything about {l} .",
]


def make_texts(n: int, seed: int):
    rng = random.Random(seed)
    return [rng.choice(TEMPLATES).format(p=rng.choice(PEOPLE), o=rng.choice(ORGS),
                                         l=rng.choice(PLACES))
            for _ in range(n)]


@pytest.fixture(scope="module")
def model_dir(trained_nlp, tmp_path_factory):
    path = tmp_path_factory.mktemp("annotate") / "model"
    trained_nlp.to_disk(path)
    return path


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A directory with a.jsonl (ids given) and b.spacy (ids given to every other document,
    a wrong "gold" entity on each that annotation must not keep)."""
    root = tmp_path_factory.mktemp("corpus")
    with (root / "a.jsonl").open("w") as f:
        for i, text in enumerate(make_texts(N_JSONL, 0)):
            f.write(json.dumps({"id": f"a-{i}", "text": text}) + "\n")
            if i % 50 == 7:
                f.write("\n")  # blank lines are skipped
    nlp = spacy.blank("en")
    db = DocBin(store_user_data=True)
    for i, text in enumerate(make_texts(N_SPACY, 1)):
        doc = nlp.make_doc(text)
        doc.ents = [doc.char_span(0, len(doc[0].text), label="MISC")]
        if i % 2:
            doc.user_data["id"] = f"b-{i}"
        db.add(doc)
    db.to_disk(root / "b.spacy")
    return root


@pytest.fixture(scope="module")
def expected(model_dir, corpus):
    """(ids, entity tuples per document, entities.jsonl records) of nlp.pipe in one process."""
    nlp = spacy.load(model_dir)
    records_in = [json.loads(line) for line in (corpus / "a.jsonl").open() if line.strip()]
    ids = [r["id"] for r in records_in]
    docs = list(nlp.pipe([r["text"] for r in records_in], batch_size=BATCH))
    fresh = []
    for i, doc in enumerate(DocBin().from_disk(corpus / "b.spacy").get_docs(nlp.vocab)):
        ids.append(doc.user_data.get("id", f"b.spacy:{i}"))
        fresh.append(spacy.tokens.Doc(nlp.vocab, words=[t.text for t in doc],
                                      spaces=[bool(t.whitespace_) for t in doc]))
    docs += list(nlp.pipe(fresh, batch_size=BATCH))
    key = nlp.get_pipe("fsemicrf_ner").spans_key
    records = [r for doc, i in zip(docs, ids) for r in entity_records(doc, i, [key])]
    assert sum(r["score"] is not None for r in records) == len(records) > 100
    return ids, [ents(doc) for doc in docs], records


@pytest.fixture(scope="module")
def client():
    """The LocalCluster of two worker processes that ``annotate`` makes without a scheduler."""
    c, cluster = connect(None, 2)
    yield c
    c.close()
    cluster.close()


def ents(doc):
    return [(e.start_char, e.end_char, e.label_) for e in doc.ents]


def check_output(out: Path, expected, vocab) -> None:
    ids, doc_ents, records = expected
    docs = read_output(out, vocab)
    assert [doc.user_data["id"] for doc in docs] == ids  # every document once, in input order
    assert [ents(doc) for doc in docs] == doc_ents
    got = read_entities(out)
    assert [{**r, "score": None} for r in got] == [{**r, "score": None} for r in records]
    assert [r["score"] for r in got] == pytest.approx([r["score"] for r in records], abs=1e-5)
    assert not list((out / "shards").glob(".*"))  # no temporary file left
    # the output directory as a string, as in docs/scaling.md
    assert [doc.user_data["id"] for doc in read_output(str(out), vocab)] == ids
    assert read_entities(str(out)) == got


def test_two_workers_annotate_like_nlp_pipe(client, model_dir, corpus, expected, tmp_path):
    done = []
    summary = annotate(str(model_dir), corpus, tmp_path / "out", client=client, shard_size=SHARD,
                       batch_size=BATCH, progress=False, on_shard_done=done.append)
    check_output(tmp_path / "out", expected, spacy.blank("en").vocab)
    assert summary.docs == N_JSONL + N_SPACY and summary.shards == len(done) == 12
    assert summary.entities == len(expected[2]) and summary.workers == 2
    assert sorted(r["index"] for r in done) == list(range(12))
    # The pipeline was loaded once in each worker, not once per task.
    assert list(client.run(load_counts).values()) == [{str(model_dir): 1}] * 2
    # One PyTorch thread per worker.
    assert list(client.run(lambda: os.environ.get("OMP_NUM_THREADS")).values()) == ["1"] * 2
    # Loading the pipeline made the worker keep freed heap, against its nanny's
    # MALLOC_TRIM_THRESHOLD_=65536: a freed block is reused, not faulted in again.
    if _glibc() is not None:
        namespace = {}
        exec(REFAULTS, namespace)
        faults = client.run(namespace["refaults"])
        assert all(n < 2 * PAGES for n in faults.values()), faults


def test_the_tasks_run_in_this_process_annotate_like_nlp_pipe(model_dir, corpus, expected,
                                                             tmp_path, monkeypatch):
    """What a worker runs for each shard, run in the test's process, where a test sees every
    call: the same output as the cluster's, each task's counts, and the batch size asked for."""
    from spacy.language import Language

    from spacy_fsemicrf.annotate.engine import shard_task
    from spacy_fsemicrf.annotate.shards import merge_entities, prepare_output

    batch_sizes = []
    pipe = Language.pipe

    def recording_pipe(self, texts, **kwargs):
        batch_sizes.append(kwargs.get("batch_size"))
        return pipe(self, texts, **kwargs)

    monkeypatch.setattr(Language, "pipe", recording_pipe)

    out = tmp_path / "out"
    shards = plan_shards(corpus, SHARD)
    prepare_output(out, str(model_dir), SHARD, shards)
    results = []
    for shard in shards:
        start = time.perf_counter()
        results.append(shard_task(str(model_dir), shard, str(out), BATCH))
        elapsed = time.perf_counter() - start
        assert 0 < results[-1]["seconds"] <= elapsed
    assert [(r["index"], r["docs"], r["pid"]) for r in results] == [
        (s.index, s.count, os.getpid()) for s in shards]
    assert sum(r["entities"] for r in results) == len(expected[2])
    assert load_counts()[str(model_dir)] == 1  # loaded once for every task
    assert batch_sizes == [BATCH] * len(shards)  # --batch-size reaches nlp.pipe
    merge_entities(out, shards)
    check_output(out, expected, spacy.blank("en").vocab)
    # a bad input is returned, not raised (a worker would log it with its traceback)
    (tmp_path / "bad.jsonl").write_text("{not json\n")
    (bad,) = plan_shards(tmp_path / "bad.jsonl", SHARD)
    error = shard_task(str(model_dir), bad, str(out), BATCH)
    assert isinstance(error, AnnotateError) and str(error).endswith(
        "; fix INPUT, then rerun with --update: the shards written are kept")


def test_a_killed_worker_loses_no_document(client, model_dir, corpus, expected, tmp_path):
    killed = []

    def kill_a_busy_worker(result):
        if killed:
            return
        busy = [addr for addr, keys in client.processing().items() if keys]
        if not busy:
            return  # try again when the next shard is done
        pid = client.run(os.getpid, workers=busy[:1])[busy[0]]
        os.kill(pid, signal.SIGKILL)
        killed.append(pid)

    annotate(str(model_dir), corpus, tmp_path / "out", client=client, shard_size=SHARD // 2,
             batch_size=BATCH, progress=False, on_shard_done=kill_a_busy_worker)
    assert killed
    check_output(tmp_path / "out", expected, spacy.blank("en").vocab)
    client.wait_for_workers(2, timeout=120)  # the nanny restarts it for the next tests


def cli(*args: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "spacy_fsemicrf", "annotate", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_relative_output_is_written_where_the_driver_runs(client, model_dir, corpus, expected,
                                                           tmp_path, monkeypatch):
    """Workers started elsewhere (``dask worker`` in another directory) write OUTPUT at the
    path the driver means."""
    (tmp_path / "driver").mkdir()
    (tmp_path / "workers").mkdir()
    monkeypatch.chdir(tmp_path / "driver")
    cwds = client.run(os.getcwd)
    client.run(os.chdir, str(tmp_path / "workers"))
    try:
        annotate(str(model_dir), corpus, Path("out"), client=client, shard_size=SHARD,
                 batch_size=BATCH, progress=False)
    finally:
        for cwd in set(cwds.values()):
            client.run(os.chdir, cwd)
    check_output(tmp_path / "driver" / "out", expected, spacy.blank("en").vocab)
    assert not list((tmp_path / "workers").iterdir())


def test_an_interrupted_run_finishes_on_rerun(client, model_dir, corpus, expected, tmp_path):
    out = tmp_path / "out"
    args = [str(model_dir), str(corpus), str(out), "--shard-size", str(SHARD // 2),
            "--batch-size", str(BATCH), "--no-progress"]
    # Kill the command and its whole local cluster (its process group) mid-run.
    run = cli(*args, "--workers", "2", start_new_session=True)
    deadline = time.monotonic() + 300
    while len(list((out / "shards").glob("*.spacy"))) < 3 and run.poll() is None:
        assert time.monotonic() < deadline, "no shard written in 300 s"
        time.sleep(0.02)
    os.killpg(run.pid, signal.SIGKILL)
    run.wait()
    while _group_alive(run.pid):  # its workers too, before looking at what they left
        assert time.monotonic() < deadline
        time.sleep(0.05)
    before = {p.name: p.stat().st_mtime_ns for p in (out / "shards").glob("*.spacy")}
    assert 3 <= len(before) < 24 and not (out / "entities.jsonl").exists()

    rerun = cli(*args, "--scheduler", client.scheduler.address)
    stdout, stderr = rerun.communicate(timeout=600)
    assert rerun.returncode == 0, stderr[-3000:]
    assert f"{len(before)} kept from an earlier run" in stdout
    after = {p.name: p.stat().st_mtime_ns for p in (out / "shards").glob("*.spacy")}
    assert len(after) == 24 and all(after[name] == t for name, t in before.items())
    check_output(out, expected, spacy.blank("en").vocab)


def test_ctrl_c_says_what_was_written_and_a_rerun_finishes(client, model_dir, corpus, expected,
                                                           tmp_path):
    """The terminal sends SIGINT to the whole process group: the command and its workers."""
    out = tmp_path / "out"
    args = [str(model_dir), str(corpus), str(out), "--shard-size", str(SHARD // 2),
            "--batch-size", str(BATCH), "--no-progress"]
    # Ctrl-C's default handler, as a terminal's foreground job has it: a suite started in the
    # background (`cmd &`) ignores SIGINT, which the command would inherit and run to its end
    run = cli(*args, "--workers", "1", start_new_session=True,
              preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 300
    while not list((out / "shards").glob("*.spacy")) and run.poll() is None:
        assert time.monotonic() < deadline, "no shard written in 300 s"
        time.sleep(0.02)
    os.killpg(run.pid, signal.SIGINT)
    _, stderr = run.communicate(timeout=120)
    assert run.returncode == 130, stderr[-3000:]
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr[-3000:]
    written = len(list((out / "shards").glob("*.spacy")))
    assert stderr.splitlines()[-1] == (f"interrupted: {written} of 24 shards are written in "
                                       f"{out}; run the same command again to annotate the other "
                                       f"{24 - written}")

    rerun = cli(*args, "--scheduler", client.scheduler.address)
    stdout, stderr = rerun.communicate(timeout=600)
    assert rerun.returncode == 0, stderr[-3000:]
    check_output(out, expected, spacy.blank("en").vocab)


def test_annotate_leaves_this_process_environment_as_it_was(model_dir, tmp_path, monkeypatch,
                                                           capsys):
    # Dask's nannies write their workers' variables (OMP_NUM_THREADS=1, ...) into the
    # environment of the process that starts them; every process started later inherited them.
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    # absent before, whichever test made a cluster first (Dask sets them for the workers)
    for key in ("MALLOC_TRIM_THRESHOLD_", "PYTHONHASHSEED", "__DASK_PARENT_PID"):
        monkeypatch.delenv(key, raising=False)
    corpus = tmp_path / "in.jsonl"
    corpus.write_text('{"text": "John Smith works for Google in Paris ."}\n', encoding="utf8")
    before = dict(os.environ)
    summary = annotate(str(model_dir), corpus, tmp_path / "out", workers=1, progress=True)
    assert (summary.docs, summary.workers) == (1, 1)
    assert dict(os.environ) == before
    assert "1/1" in capsys.readouterr().err  # the progress bar, in documents
    # nothing left to do: no cluster is started
    again = annotate(str(model_dir), corpus, tmp_path / "out", workers=1, progress=False)
    assert (again.workers, again.skipped_shards) == (0, 1)


def test_a_run_on_a_scheduler_runs_on_its_cluster(client, model_dir, tmp_path):
    corpus = tmp_path / "in.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in make_texts(4, 6)))
    done = []
    summary = annotate(str(model_dir), corpus, tmp_path / "out", scheduler=client.scheduler.address,
                       shard_size=1, progress=False, on_shard_done=done.append)
    assert summary.workers == 2 and len(done) == 4
    assert {r["pid"] for r in done} <= set(client.run(os.getpid).values())


def test_connect_asks_dask_for_what_annotate_needs(monkeypatch):
    import logging

    import dask.system

    from spacy_fsemicrf.annotate import engine

    made, calls = [], []

    class Cluster:
        def __init__(self, **kwargs):
            made.append(kwargs)

        def close(self):
            pass

    def client(*args, **kwargs):
        calls.append((args, kwargs))
        return "client"

    monkeypatch.setattr(engine, "LocalCluster", Cluster)
    monkeypatch.setattr(engine, "Client", client)
    monkeypatch.setattr(dask.system, "CPU_COUNT", 3)
    for workers, n_workers in ((None, 3), (2, 2)):
        _, cluster = connect(None, workers)
        assert made[-1] == {
            "n_workers": n_workers, "threads_per_worker": 1, "processes": True,
            "dashboard_address": None, "scheduler_kwargs": {"dashboard_address": ":0"},
            "silence_logs": logging.ERROR, "preload": [engine.WORKER_PRELOAD]}
        assert calls[-1] == ((cluster,), {})
    monkeypatch.setattr(dask.system, "CPU_COUNT", None)
    connect(None, None)
    assert made[-1]["n_workers"] == 1
    assert connect("tcp://scheduler:8786", None) == ("client", None)
    assert calls[-1] == (("tcp://scheduler:8786",), {"timeout": "30s"})

    def unreachable(*args, **kwargs):
        raise OSError("connection refused")

    monkeypatch.setattr(engine, "Client", unreachable)
    with pytest.raises(AnnotateError) as err:
        connect("tcp://scheduler:8786", None)
    assert str(err.value) == (
        "cannot reach the Dask scheduler at tcp://scheduler:8786: connection refused")
    monkeypatch.setattr(engine, "Client", None)
    with pytest.raises(AnnotateError) as err:
        connect(None, 1)
    assert str(err.value) == (
        "annotate needs Dask distributed: pip install 'spacy-fsemicrf[annotate]'")


@pytest.mark.parametrize("address,cause", [
    ("foo://scheduler:8786", "unknown address scheme 'foo'"),
    ("tcp://scheduler:port", "invalid literal for int()"),
])
def test_a_malformed_scheduler_address_fails_clearly(address, cause, monkeypatch):
    """Dask refuses such an address with a ValueError, which was the command's traceback (a
    stand-in client raises it here as Dask does: the test makes no client of its own)."""
    from spacy_fsemicrf.annotate import engine

    def refuse(address, timeout):
        raise ValueError(cause + " (as Dask says it)")

    monkeypatch.setattr(engine, "Client", refuse)
    with pytest.raises(AnnotateError) as err:
        connect(address, None)
    assert str(err.value).startswith(
        f"{address!r} is not a Dask scheduler address (such as tcp://10.0.0.1:8786): {cause}")


class StandInClient:
    """A Dask client in the test's process. Each task's result is ``results(shard)`` (an
    exception other than an AnnotateError is raised by ``Future.result``, as a failed task's);
    it records what was submitted and cancelled and which blocking calls returned. Those calls
    receive Ctrl-C midway (as the terminal sends it while Dask's ``sync`` waits for the event
    loop) as often as ``interrupts`` gives for each call's name."""

    def __init__(self, results=None, **interrupts: int):
        self.results = results or (lambda shard: {"index": shard.index, "docs": shard.count})
        self.interrupts = interrupts
        self.submitted, self.cancelled, self.returned = [], [], []

    def call(self, name, value=None):
        for _ in range(self.interrupts.get(name, 0)):
            signal.raise_signal(signal.SIGINT)
        self.returned.append(name)
        return value

    def submit(self, task, *args, **kwargs):
        self.submitted.append((task, args, kwargs))
        shard = args[1]
        return SimpleNamespace(key=f"task-{shard.index}", result=lambda: self.result(shard))

    def result(self, shard):
        result = self.call("result", self.results(shard))
        if isinstance(result, BaseException) and not isinstance(result, AnnotateError):
            raise result
        return result

    def cancel(self, futures):
        self.cancelled.extend(futures)
        self.call("cancel")

    def scheduler_info(self):
        return self.call("scheduler_info", {"workers": {"w": {}}})

    def close(self):
        self.call("close")


def test_the_tasks_are_submitted_counted_and_their_failures_named(tmp_path, monkeypatch, capsys):
    """Each shard's task is impure (run again, never a cached result) and gets the batch size;
    the progress bar counts documents from those already written; the first failure cancels
    the rest."""
    from spacy_fsemicrf.annotate import engine
    from spacy_fsemicrf.annotate.inputs import Shard

    shards = [Shard(i, "in.jsonl", "in.jsonl", 10 * i, 10) for i in range(3)]
    monkeypatch.setattr(engine, "as_completed", iter)
    fine = StandInClient()
    for progress in (False, True):
        done = []
        engine._run_tasks(fine, "model", shards[1:], shards, tmp_path, 7, progress, done.append)
        assert [r["index"] for r in done] == [1, 2]
        bar = capsys.readouterr().err
        assert (bar == "") != progress
    where = os.path.abspath(tmp_path)
    assert fine.submitted[:2] == [(engine.shard_task, ("model", shard, where, 7), {"pure": False})
                                  for shard in shards[1:]]
    assert "10/30" in bar and "30/30" in bar and "doc/s" in bar
    bug = StandInClient(lambda shard: ValueError("boom") if shard.index == 1 else {"docs": 10})
    with pytest.raises(AnnotateError) as err:
        engine._run_tasks(bug, "model", shards, shards, tmp_path, 7, False, None)
    assert str(err.value) == "shard 1 (in.jsonl, documents 10..19) failed: ValueError: boom"
    assert len(bug.cancelled) == 3
    user = StandInClient(
        lambda shard: AnnotateError("bad input") if shard.index == 0 else {"docs": 10})
    with pytest.raises(AnnotateError, match="^bad input$"):
        engine._run_tasks(user, "model", shards, shards, tmp_path, 7, False, None)
    assert len(user.cancelled) == 3


def test_the_default_local_cluster_has_a_worker_per_usable_core(monkeypatch):
    """A process confined to fewer cores than the machine has (CPU affinity, a container's CPU
    quota: what Dask's CPU_COUNT counts) starts that many workers, not one per core of the
    machine."""
    import dask.system

    monkeypatch.setattr(dask.system, "CPU_COUNT", 1)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    c, cluster = connect(None, None)
    try:
        assert len(c.scheduler_info()["workers"]) == 1
    finally:
        c.close()
        cluster.close()


def test_a_second_local_cluster_does_not_compete_for_the_first_ones_port(client):
    # `client` holds one LocalCluster; a second annotate job on the machine makes another
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        second, cluster = connect(None, 1)
        second.close()
        cluster.close()
    assert not [w for w in caught if "already in use" in str(w.message)]


def test_a_missing_model_fails_before_any_output(corpus, tmp_path, capsys):
    assert cli_main([str(tmp_path / "no-model"), str(corpus), str(tmp_path / "out")]) == 1
    assert "not found" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_model_missing_on_the_workers_fails_clearly(client, corpus, tmp_path):
    with pytest.raises(AnnotateError, match="cannot load the pipeline 'no_such_pipeline'"):
        annotate("no_such_pipeline", corpus, tmp_path / "out", client=client, progress=False)


@pytest.mark.parametrize(
    "bad_line,message",
    [("{not json", r"in.jsonl:\d+: not valid JSON"),
     (json.dumps({"id": "x"}), r"in.jsonl:\d+: the document has no text"),
     (json.dumps({"id": "x", "text": " "}), r"in.jsonl:\d+: the document has no text")],
)
def test_a_bad_record_fails_its_shard_and_leaves_nothing_of_it(client, model_dir, tmp_path,
                                                              bad_line, message, capfd):
    lines = [json.dumps({"text": t}) for t in make_texts(30, 2)]
    lines.insert(25, bad_line)  # in the third shard of 10
    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    with pytest.raises(AnnotateError, match=message + ".*rerun with --update"):
        annotate(str(model_dir), tmp_path / "in.jsonl", out, client=client, shard_size=10,
                 progress=False)
    # the error is the user's to fix: no worker logs it with a traceback
    assert "Traceback" not in capfd.readouterr().err
    assert not shard_paths(out, 2)["docs"].exists() and not shard_paths(out, 2)["entities"].exists()
    # (Shards in flight elsewhere may still be writing theirs: only shard 2 is checked.)
    assert not list((out / "shards").glob(".000002.*")) and not (out / "entities.jsonl").exists()

    # the line fixed, the run finishes in the same OUTPUT with --update, keeping what it wrote
    lines[25] = json.dumps({"text": "Mary flew to Rome ."})
    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(AnnotateError, match="1 of 4 shards differ.*--update"):
        annotate(str(model_dir), tmp_path / "in.jsonl", out, client=client, shard_size=10,
                 progress=False)
    time.sleep(0.5)  # for the shards that were still being written when the run failed
    written = {i for i in range(4) if shard_paths(out, i)["docs"].exists()}
    summary = annotate(str(model_dir), tmp_path / "in.jsonl", out, client=client, shard_size=10,
                       progress=False, update=True)
    assert summary.changed_shards == 1 and summary.skipped_shards == len(written - {2})
    assert [r["id"] for r in read_entities(out)].count("in.jsonl:25") >= 1


@pytest.mark.parametrize("line", ['{"text": "Mary \\ud800 flew to Rome ."}',
                                  '{"id": "\\udc00", "text": "Mary flew to Rome ."}'])
def test_a_lone_surrogate_fails_with_its_line(tmp_path, line):
    (tmp_path / "in.jsonl").write_text('{"text": "John lives in Paris ."}\n' + line + "\n")
    (shard,) = plan_shards(tmp_path / "in.jsonl", 10)
    with pytest.raises(AnnotateError, match="in.jsonl:2: not valid Unicode"):
        read_shard(shard, spacy.blank("en").vocab)


@pytest.mark.parametrize("doc_id, message", [
    (10 ** 30, "the 'id' holds an integer out of the 64-bit range the output can store: give "
               "it as a string"),
    ([1, -(2 ** 64)], "the 'id' holds an integer out of the 64-bit range"),
    (["\ud800"], "not valid Unicode"),
    (float("nan"), "the 'id' holds NaN or Infinity, which the output's JSON cannot: give it as "
                   "a string"),
    ({"k": [1, float("-inf")]}, "the 'id' holds NaN or Infinity"),
], ids=["integer", "integer in a list", "lone surrogate in a list", "NaN", "nested -Infinity"])
def test_an_id_the_output_cannot_store_fails_with_its_line(model_dir, tmp_path, doc_id,
                                                            message):
    """Before, the shard's write failed with msgpack's error (a worker traceback, no line), and
    a NaN id went into entities.jsonl as a bare NaN, which strict JSON readers refuse."""
    from spacy_fsemicrf.annotate.engine import annotate_shard

    (tmp_path / "in.jsonl").write_text(json.dumps({"id": 2 ** 64 - 1, "text": "Paris ."}) + "\n"
                                       + json.dumps({"id": doc_id, "text": "Rome ."}) + "\n")
    (shard,) = plan_shards(tmp_path / "in.jsonl", 10)
    with pytest.raises(AnnotateError, match=re.escape(f"in.jsonl:2: {message}")):
        annotate_shard(str(model_dir), shard, str(tmp_path / "out"), None)
    assert not list((tmp_path / "out").glob("**/*.spacy"))


def test_a_line_that_is_not_utf8_fails_with_its_line(tmp_path):
    (tmp_path / "in.jsonl").write_bytes(b'{"text": "Paris ."}\n{"text": "Caf\xe9 ."}\n')
    (shard,) = plan_shards(tmp_path / "in.jsonl", 10)
    with pytest.raises(AnnotateError, match=r"in.jsonl:2: not UTF-8 \(byte 0xe9 at column 14\)"):
        read_shard(shard, spacy.blank("en").vocab)


@pytest.mark.parametrize("line, message", [
    ("{not json", "in.jsonl:3: not valid JSON (Expecting property name enclosed in double "
                  "quotes: line 1 column 2 (char 1))"),
    ('["Mary flew to Rome ."]', "in.jsonl:3: expected a JSON object with a 'text' field"),
    ('{"id": "x"}', "in.jsonl:3: the document has no text (its 'text' field must be a "
                    "non-empty string)"),
    ('{"id": "x", "text": " "}', "in.jsonl:3: the document has no text (its 'text' field must "
                                 "be a non-empty string)"),
])
def test_a_bad_record_is_named_by_its_file_and_line(tmp_path, line, message):
    """As a worker reads it (the run's message adds what to do next)."""
    first = json.dumps({"text": "John lives in Paris ."})
    (tmp_path / "in.jsonl").write_text(first + "\n\n" + line + "\n")
    (shard,) = plan_shards(tmp_path / "in.jsonl", 10)
    with pytest.raises(AnnotateError) as err:
        read_shard(shard, spacy.blank("en").vocab)
    assert str(err.value) == message


def test_an_input_that_changed_or_vanished_since_the_plan_is_named(tmp_path):
    vocab = spacy.blank("en").vocab
    texts = ["John lives in Paris .", "Mary flew to Rome .", "Anna stayed ."]
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    shards = plan_shards(path, 2)
    # the default ids count the documents of the file, whatever the shard
    assert [read_shard(s, vocab) for s in shards] == [
        (texts[:2], ["in.jsonl:0", "in.jsonl:1"]), (texts[2:], ["in.jsonl:2"])]
    path.write_text(json.dumps({"text": texts[0]}) + "\n")
    with pytest.raises(AnnotateError) as err:
        read_shard(shards[0], vocab)
    assert str(err.value) == "in.jsonl ended before line 2: it changed since the run started"
    path.unlink()
    with pytest.raises(AnnotateError, match=f"^cannot read {path}: .*No such file"):
        read_shard(shards[0], vocab)
    DocBin(docs=[spacy.blank("en").make_doc(t) for t in texts]).to_disk(tmp_path / "b.spacy")
    (shard,) = plan_shards(tmp_path / "b.spacy", 10)
    (tmp_path / "b.spacy").unlink()
    with pytest.raises(AnnotateError, match="^cannot read .*b.spacy: .*No such file"):
        read_shard(shard, vocab)
    from spacy_fsemicrf.annotate.inputs import _read_bytes, file_digest

    for read in (file_digest, _read_bytes):
        with pytest.raises(AnnotateError, match="^cannot read .*b.spacy: .*No such file"):
            read(tmp_path / "b.spacy")


def test_a_spacy_file_is_read_as_it_was_saved(tmp_path):
    """Without stored user data (DocBin's default), with a document whose spacing is unknown;
    a document with no text is named."""
    nlp = spacy.blank("en")
    docs = [nlp.make_doc("Mary flew to Rome ."), Doc(nlp.vocab, words=["Anna", "stayed"])]
    assert docs[1].has_unknown_spaces
    DocBin(docs=docs).to_disk(tmp_path / "b.spacy")
    (shard,) = plan_shards(tmp_path / "b.spacy", 10)
    read, ids = read_shard(shard, nlp.vocab)
    assert ids == ["b.spacy:0", "b.spacy:1"]
    assert [(d.text, d.has_unknown_spaces) for d in read] == [
        ("Mary flew to Rome .", False), ("Anna stayed ", True)]
    DocBin(docs=docs + [nlp.make_doc("")]).to_disk(tmp_path / "c.spacy")
    (shard,) = plan_shards(tmp_path / "c.spacy", 10)
    with pytest.raises(AnnotateError) as err:
        read_shard(shard, nlp.vocab)
    assert str(err.value) == "c.spacy: document 2 has no text"


def test_a_spacy_file_is_read_once_to_plan_its_shards(tmp_path, monkeypatch):
    DocBin(docs=[spacy.blank("en").make_doc("Mary flew to Rome .")]).to_disk(tmp_path / "b.spacy")
    opened = []
    path_open = Path.open

    def counting_open(self, *args, **kwargs):
        opened.append(self.name)
        return path_open(self, *args, **kwargs)

    monkeypatch.setattr(Path, "open", counting_open)
    (shard,) = plan_shards(tmp_path / "b.spacy", 10)
    assert shard.count == 1 and opened == ["b.spacy"]


def test_a_shard_that_cannot_be_written_fails_clearly(model_dir, tmp_path):
    from spacy_fsemicrf.annotate.engine import annotate_shard

    (shard,) = plan_shards_of_one_text(tmp_path)
    with pytest.raises(AnnotateError, match="cannot write shard 0 into .*nowhere"):
        annotate_shard(str(model_dir), shard, str(tmp_path / "nowhere"), None)


def test_a_text_longer_than_the_pipeline_takes_fails_with_its_line(model_dir, tmp_path):
    """nlp.pipe refuses a text over nlp.max_length with a bare ValueError (spaCy's E088), which
    a worker logs with its traceback: the task names the line instead."""
    from spacy_fsemicrf.annotate.engine import annotate_shard, load_pipeline

    limit = load_pipeline(str(model_dir)).max_length
    long_text = "Paris " * (limit // 6 + 1)
    (tmp_path / "in.jsonl").write_text(json.dumps({"text": "John lives in Paris ."}) + "\n"
                                       + json.dumps({"text": long_text}) + "\n")
    (shard,) = plan_shards(tmp_path / "in.jsonl", 10)
    with pytest.raises(AnnotateError, match=(
            rf"^in.jsonl:2: the document has {len(long_text)} characters, more than the "
            rf"pipeline's nlp.max_length \({limit}\): split it; fix INPUT")):
        annotate_shard(str(model_dir), shard, str(tmp_path / "out"), None)
    assert not (tmp_path / "out").exists()


def test_unreadable_inputs_fail_clearly(tmp_path):
    (tmp_path / "broken.spacy").write_bytes(b"not a DocBin")
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(AnnotateError, match="cannot read .*broken.spacy"):
        plan_shards(tmp_path / "broken.spacy", 10)
    with pytest.raises(AnnotateError, match="neither a .spacy nor a .jsonl"):
        plan_shards(tmp_path / "notes.txt", 10)
    with pytest.raises(AnnotateError, match="does not exist"):
        plan_shards(tmp_path / "missing.jsonl", 10)
    (tmp_path / "empty").mkdir()
    with pytest.raises(AnnotateError, match="no .spacy or .jsonl"):
        plan_shards(tmp_path / "empty", 10)


@pytest.mark.parametrize("settings, message", [
    ({"batch_size": 0}, "the batch size must be at least 1, got 0"),
    ({"workers": 0}, "the number of workers must be at least 1, got 0"),
])
def test_settings_that_would_annotate_nothing_fail_before_any_output(
        model_dir, corpus, tmp_path, settings, message):
    """``nlp.pipe(batch_size=0)`` yields no document: every shard was written empty, counted as
    finished, and a rerun kept it."""
    with pytest.raises(AnnotateError, match=f"^{message}$"):
        annotate(str(model_dir), corpus, tmp_path / "out", progress=False, **settings)
    assert not (tmp_path / "out").exists()


def test_an_output_that_is_a_file_fails_clearly(model_dir, corpus, tmp_path):
    (tmp_path / "out").write_text("a file")
    with pytest.raises(AnnotateError, match="must be a directory: .*out is a file"):
        annotate(str(model_dir), corpus, tmp_path / "out", progress=False)


def test_an_output_that_cannot_be_created_fails_clearly(model_dir, corpus, tmp_path):
    (tmp_path / "a_file").write_text("a file")
    with pytest.raises(AnnotateError, match="cannot create OUTPUT .*a_file/out: .*Not a dir"):
        annotate(str(model_dir), corpus, tmp_path / "a_file" / "out", progress=False)


def test_an_output_inside_the_input_directory_is_refused(model_dir, tmp_path):
    corpus = tmp_path / "in"
    corpus.mkdir()
    (corpus / "a.jsonl").write_text(json.dumps({"text": "Mary flew to Berlin ."}) + "\n")
    for output in (corpus / "annotated", corpus):
        with pytest.raises(AnnotateError, match="inside the INPUT directory"):
            annotate(str(model_dir), corpus, output, progress=False)
    assert sorted(p.name for p in corpus.iterdir()) == ["a.jsonl"]


def test_an_output_not_finished_or_not_readable_is_named(tmp_path):
    from spacy_fsemicrf.annotate.shards import prepare_output

    out = tmp_path / "out"
    prepare_output(out, "model", 10, plan_shards_of_one_text(tmp_path))
    with pytest.raises(AnnotateError) as err:
        read_output(out, spacy.blank("en").vocab)
    assert str(err.value) == (
        f"{shard_paths(out, 0)['docs']} is missing: the run has not finished; rerun it")
    (out / "manifest.json").write_text("{")
    with pytest.raises(AnnotateError, match="^" + re.escape(
            f"cannot read {out / 'manifest.json'}: Expecting")):
        read_output(out, spacy.blank("en").vocab)


def test_the_entities_of_an_output_not_finished_are_named_missing(tmp_path):
    """An interrupted run has no entities.jsonl (even with all its shards written): a bare
    FileNotFoundError said neither why nor what to do."""
    from spacy_fsemicrf.annotate.shards import merge_entities, prepare_output

    out = tmp_path / "out"
    with pytest.raises(AnnotateError, match="^cannot read .*manifest.json"):
        read_entities(out)
    shards = plan_shards_of_one_text(tmp_path)
    prepare_output(out, "model", 10, shards)
    write_shard(out, 0, [spacy.blank("en")("Hello there .")], [{"id": "x"}])
    with pytest.raises(AnnotateError) as err:
        read_entities(out)
    assert str(err.value) == (
        f"{out / 'entities.jsonl'} is missing: the run has not finished; rerun it")
    merge_entities(out, shards)
    assert read_entities(out) == [{"id": "x"}]


def test_output_files_are_readable_as_the_umask_allows(tmp_path):
    """mkstemp creates 0600 files; renamed into place they kept that mode, so another user's
    downstream job could not read the shards."""
    from spacy_fsemicrf.annotate.shards import FILE_MODE, merge_entities, prepare_output

    mask = os.umask(0o022)
    os.umask(mask)
    assert FILE_MODE == 0o666 & ~mask
    nlp = spacy.blank("en")
    shards = plan_shards_of_one_text(tmp_path)
    prepare_output(tmp_path / "out", "model", 10, shards)
    write_shard(tmp_path / "out", 0, [nlp("Hello there .")], [{"id": "x"}])
    merge_entities(tmp_path / "out", shards)
    files = [tmp_path / "out" / "manifest.json", tmp_path / "out" / "entities.jsonl",
             *shard_paths(tmp_path / "out", 0).values()]
    assert [f.stat().st_mode & 0o777 for f in files] == [FILE_MODE] * 4


def plan_shards_of_one_text(tmp_path):
    (tmp_path / "in.jsonl").write_text(json.dumps({"text": "Hello there ."}) + "\n")
    return plan_shards(tmp_path / "in.jsonl", 10)


def test_a_rerun_with_other_settings_is_refused(model_dir, corpus, tmp_path):
    out = tmp_path / "out"
    from spacy_fsemicrf.annotate.shards import prepare_output

    prepare_output(out, str(model_dir), 10, plan_shards(corpus, 10))
    with pytest.raises(AnnotateError, match="another shard size"):
        annotate(str(model_dir), corpus, out, shard_size=20, progress=False)


def test_a_rerun_with_another_build_of_the_model_is_refused(model_dir, tmp_path, monkeypatch):
    """A pipeline directory trained again, or a package reinstalled from another build, keeps
    its path or name: a rerun kept the earlier build's shards beside the new build's."""
    from spacy_fsemicrf.annotate import engine

    def run_todo(client, scheduler, workers, model, todo, shards, output, *rest):
        for shard in todo:  # (the stand-in task loop writes empty shards)
            write_shard(output, shard.index, [], [])
        return 1

    monkeypatch.setattr(engine, "_run_todo", run_todo)
    (tmp_path / "in.jsonl").write_text(json.dumps({"text": "Hello there ."}) + "\n")

    def run(model: str, out: str):
        return annotate(model, tmp_path / "in.jsonl", tmp_path / out, client=object(),
                        progress=False)

    model = tmp_path / "model"
    shutil.copytree(model_dir, model)
    run(str(model), "dir")
    assert run(str(model), "dir").skipped_shards == 1  # the same build: its shard is kept
    meta = json.loads((model / "meta.json").read_text())
    (model / "meta.json").write_text(json.dumps({**meta, "description": "trained again"}))
    with pytest.raises(AnnotateError, match="another build of the model " + re.escape(
            str(model))):
        run(str(model), "dir")

    for version in ("0.1.0+model.aaaa", "0.1.0+model.bbbb"):  # as scripts/package.py labels
        info = tmp_path / version / f"en_built-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: en_built\n"
                                       f"Version: {version}\n")
    monkeypatch.syspath_prepend(str(tmp_path / "0.1.0+model.aaaa"))
    run("en_built", "package")
    assert run("en_built", "package").skipped_shards == 1
    monkeypatch.syspath_prepend(str(tmp_path / "0.1.0+model.bbbb"))  # found first
    with pytest.raises(AnnotateError, match="another build of the model en_built"):
        run("en_built", "package")
    assert run("a_model_only_the_workers_have", "remote").skipped_shards == 0
    assert run("a_model_only_the_workers_have", "remote").skipped_shards == 1


def test_shards_read_every_record_once(corpus):
    nlp = spacy.blank("en")
    for size in (1, 7, 50, 1000):
        shards = plan_shards(corpus, size)
        assert [s.index for s in shards] == list(range(len(shards)))
        texts, ids = [], []
        for shard in shards:
            inputs, shard_ids = read_shard(shard, nlp.vocab)
            assert len(inputs) == len(shard_ids) == shard.count <= size
            texts += [x if isinstance(x, str) else x.text for x in inputs]
            ids += shard_ids
        assert ids == [f"a-{i}" for i in range(N_JSONL)] + [
            f"b-{i}" if i % 2 else f"b.spacy:{i}" for i in range(N_SPACY)]
        assert texts == make_texts(N_JSONL, 0) + make_texts(N_SPACY, 1)


def test_planning_a_large_jsonl_file_keeps_only_the_shards_starts(tmp_path):
    """The driver plans the shards of one file of many records without a tuple per record."""
    import tracemalloc

    n = 200_000
    (tmp_path / "big.jsonl").write_bytes(b'{"text": "Hi ."}\n\n' * n)
    tracemalloc.start()
    try:
        shards = plan_shards(tmp_path / "big.jsonl", 1000)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert [(s.start, s.count, s.line, s.offset) for s in shards[:2]] == [(0, 1000, 1, 0),
                                                                          (1000, 1000, 2001, 18000)]
    assert len(shards) == n // 1000 and sum(s.count for s in shards) == n
    assert peak < 2_000_000  # a tuple per record: about 100 bytes each, 20 MB


def test_entity_scores_come_from_the_span_group(trained_nlp):
    doc = trained_nlp("John Smith works for Google in Paris .")
    key = trained_nlp.get_pipe("fsemicrf_ner").spans_key
    group = doc.spans[key]
    records = entity_records(doc, 7, [key])
    assert [(r["start"], r["end"], r["label"]) for r in records] == ents(doc) and records
    by_span = {(s.start_char, s.end_char): float(x) for s, x in zip(group, group.attrs["scores"])}
    assert [r["score"] for r in records] == [by_span[(r["start"], r["end"])] for r in records]
    assert all(r["id"] == 7 for r in records)
    assert all(r["score"] is None for r in entity_records(doc, 7, ["other"]))
    # a key without a group before the one that has it: the scores are found all the same
    assert entity_records(doc, 7, [key, "other"]) == records
    assert entity_records(doc, 7, ["other", key]) == records
    fields = ["end", "id", "label", "score", "start", "text"]
    assert [sorted(r) for r in records] == [fields] * len(records)
    assert [r["text"] for r in records] == [doc.text[r["start"]:r["end"]] for r in records]


def test_the_score_keys_are_those_of_the_span_writers_once_each():
    from spacy_fsemicrf.annotate.shards import score_keys

    nlp = spacy.blank("en")
    nlp.add_pipe("sentencizer")  # no spans_key
    nlp.add_pipe("fsemicrf_ner")
    nlp.add_pipe("fsemicrf_ner", name="again")  # the same key
    nlp.add_pipe("fsemicrf_ner", name="other", config={"spans_key": "other"})
    assert score_keys(nlp) == ["fsemicrf", "other"]


def test_a_failed_shard_write_leaves_nothing(tmp_path):
    nlp = spacy.blank("en")
    doc = nlp("Hello there .")
    doc.user_data["id"] = object()  # not serializable: the write fails midway
    (tmp_path / "shards").mkdir()
    with pytest.raises(Exception):
        write_shard(tmp_path, 0, [doc], [{"id": "x"}])
    assert list((tmp_path / "shards").iterdir()) == []


def test_a_pipeline_that_does_not_load_is_named_with_the_machine(tmp_path):
    """As a worker says it, where the model may be missing on that machine only."""
    import socket

    from spacy_fsemicrf.annotate.engine import load_pipeline

    model = str(tmp_path / "no-model")
    with pytest.raises(AnnotateError, match="^" + re.escape(
            f"cannot load the pipeline {model!r} on {socket.gethostname()}: ")):
        load_pipeline(model)
    assert model not in load_counts()


def test_what_a_failed_task_and_an_interrupted_run_say(tmp_path):
    """A task that raised something else than an AnnotateError (a bug, a worker it killed)
    is named by its documents; an interrupted run says what is written, also when it was
    pickled on its way (its arguments rebuild it)."""
    from spacy_fsemicrf.annotate.engine import Interrupted, _task_error
    from spacy_fsemicrf.annotate.inputs import Shard

    shard = Shard(3, str(tmp_path / "in.jsonl"), "in.jsonl", 20, 10)
    error = _task_error(shard, ValueError("boom"))
    assert isinstance(error, AnnotateError)
    assert str(error) == "shard 3 (in.jsonl, documents 20..29) failed: ValueError: boom"
    stop = Interrupted(tmp_path / "out", 3, 24)
    assert isinstance(stop, KeyboardInterrupt) and stop.args == (tmp_path / "out", 3, 24)
    message = (f"3 of 24 shards are written in {tmp_path / 'out'}; run the same command again "
               f"to annotate the other 21")
    assert str(stop) == str(pickle.loads(pickle.dumps(stop))) == message
    assert str(Interrupted(tmp_path / "out", 24, 24)) == (
        f"all 24 shards are written in {tmp_path / 'out'}; run the same command again to merge "
        f"their entities")


def test_a_shard_s_entities_are_utf8_text(tmp_path):
    (tmp_path / "shards").mkdir()
    write_shard(tmp_path, 0, [spacy.blank("en")("Zürich .")], [{"id": "x", "text": "Zürich"}])
    assert shard_paths(tmp_path, 0)["entities"].read_bytes() == (
        '{"id": "x", "text": "Zürich"}\n'.encode("utf8"))


def test_a_shard_whose_files_cannot_be_renamed_into_place_leaves_nothing(tmp_path,
                                                                        monkeypatch):
    """Both temporary files written, the first rename fails (a full or vanished disk)."""
    from spacy_fsemicrf.annotate import shards

    def fail(src, dst):
        raise OSError("No space left on device")

    (tmp_path / "shards").mkdir()
    monkeypatch.setattr(shards.os, "replace", fail)
    with pytest.raises(OSError, match="No space left"):
        write_shard(tmp_path, 0, [spacy.blank("en")("Hello there .")], [{"id": "x"}])
    assert list((tmp_path / "shards").iterdir()) == []


def test_a_shard_docbin_is_the_docbin_of_its_documents(trained_nlp):
    """shard_docbin builds, column by column, what DocBin.add builds token by token: the same
    strings, token columns, spaces, flags, cats, user data and span groups."""
    from spacy.tokens import Span

    from spacy_fsemicrf.annotate.shards import shard_docbin

    docs = list(trained_nlp.pipe(["John Smith works for Google in Paris .", "Mary flew to Berlin .",
                                  "Nobody said anything .", ""]))
    docs[0][0].tag_, docs[0][1].lemma_, docs[0][2].dep_ = "NNP", "smith", "nsubj"
    docs[0][0].set_morph("Number=Sing")
    docs[0][3].ent_kb_id_ = "Q42"
    docs[1].user_data["id"], docs[2].cats = "doc-1", {"NEWS": 1.0}
    docs[2].spans["sc"] = [Span(docs[2], 0, 2, label="THING", kb_id="Q1", span_id="first")]
    expected, built = DocBin(store_user_data=True, docs=docs), shard_docbin(docs)
    assert built.strings == expected.strings and "Q42" in built.strings and "THING" in built.strings
    for field in ("tokens", "spaces"):
        for mine, theirs in zip(getattr(built, field), getattr(expected, field)):
            assert mine.dtype == theirs.dtype and numpy.array_equal(mine, theirs)
    for field in ("flags", "cats", "user_data", "span_groups"):
        assert getattr(built, field) == getattr(expected, field)
    back = [DocBin().from_bytes(b.to_bytes()).get_docs(trained_nlp.vocab)
            for b in (built, expected)]
    assert [d.to_json() for d in back[0]] == [d.to_json() for d in back[1]]
    assert shard_docbin([]).to_bytes() == DocBin(store_user_data=True).to_bytes()


def test_msgpack_lookups_remembered_keep_every_encoder(trained_nlp):
    """A registry's entry-point functions are registered directly and its contents remembered
    until something new is registered; srsly's own registries then write a document's bytes
    exactly as before."""
    import catalogue

    from spacy_fsemicrf.msgpack_lookups import remember_msgpack_lookups

    registry = catalogue.create("fsemicrf_test", "msgpack_encoders", entry_points=True)
    encoder = lambda obj, chain=None: obj  # noqa: E731
    registry.get_entry_points = lambda: {"from_a_package": encoder}
    remember_msgpack_lookups((registry,))
    remember_msgpack_lookups((registry,))  # a second call changes nothing
    assert not registry.entry_points and registry.get_all() == {"from_a_package": encoder}
    registry.get_all()["changed by a caller"] = None
    assert registry.get_all() == {"from_a_package": encoder}
    later = lambda obj, chain=None: obj  # noqa: E731
    registry.register("registered_later", func=later)
    assert registry.get_all() == {"from_a_package": encoder, "registered_later": later}

    doc = trained_nlp("John Smith works for Google in Paris .")
    doc.user_data["id"] = "doc-1"
    before = DocBin(store_user_data=True, docs=[doc]).to_bytes()
    doc_bytes = doc.to_bytes()
    remember_msgpack_lookups()
    assert DocBin(store_user_data=True, docs=[doc]).to_bytes() == before
    assert doc.to_bytes() == doc_bytes
    assert Doc(trained_nlp.vocab).from_bytes(doc_bytes).to_json() == doc.to_json()


def test_the_command_passes_update_and_says_what_it_annotated_again(monkeypatch, capsys):
    from spacy_fsemicrf.annotate import engine

    calls = []

    def fake_annotate(model, input_path, output, **kwargs):
        calls.append(kwargs["update"])
        return engine.Summary(docs=30, shards=3, skipped_shards=2, entities=7, workers=2,
                              seconds=1.0, entities_path=Path(output) / "entities.jsonl",
                              changed_shards=1 if kwargs["update"] else 0)

    monkeypatch.setattr(engine, "annotate", fake_annotate)
    assert cli_main(["model", "in.jsonl", "out", "--update"]) == 0
    assert "2 kept from an earlier run, 1 changed since then" in capsys.readouterr().out
    assert cli_main(["model", "in.jsonl", "out"]) == 0 and calls == [True, False]
    printed = capsys.readouterr().out
    assert "changed since" not in printed
    assert printed.startswith("30 documents in 3 shards, 2 kept from an earlier run; 7 entities ")


def test_the_command_counts_one_document_shard_and_entity_in_the_singular(monkeypatch, capsys):
    from spacy_fsemicrf.annotate import engine

    monkeypatch.setattr(engine, "annotate", lambda model, input_path, output, **kwargs:
                        engine.Summary(docs=1, shards=1, skipped_shards=0, entities=1, workers=1,
                                       seconds=0.5, entities_path=Path("out/entities.jsonl")))
    assert cli_main(["model", "in.jsonl", "out"]) == 0
    assert capsys.readouterr().out == (
        "1 document in 1 shard; 1 entity in out/entities.jsonl; 0.5 s\n")


def test_the_module_command_dispatches(capsys):
    from spacy_fsemicrf.__main__ import main

    assert main([]) == 2
    assert "annotate" in capsys.readouterr().err
    assert main(["--help"]) == 0 and main(["-h"]) == 0
    printed = capsys.readouterr()
    assert printed.out.count("annotate    annotate a corpus") == 2 and printed.err == ""
    assert "``" not in printed.out  # the docstring's reST marks are not for the terminal
    assert main(["calibrat"]) == 2
    assert capsys.readouterr().err.startswith("unknown command 'calibrat'\n")
    with pytest.raises(SystemExit) as exit_info:
        main(["annotate", "--help"])
    assert exit_info.value.code == 0 and "--scheduler" in capsys.readouterr().out


def test_a_rerun_after_the_input_was_edited_is_refused(model_dir, tmp_path):
    """An edit that keeps every line's length keeps the layout of the shards, not the content."""
    corpus = tmp_path / "in"
    corpus.mkdir()
    texts = ["John Smith works for Google in Paris .", "Mary flew to Berlin on Monday ."]
    (corpus / "a.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    db = DocBin(docs=[spacy.blank("en").make_doc(t) for t in texts])
    db.to_disk(corpus / "b.spacy")
    out = tmp_path / "out"
    from spacy_fsemicrf.annotate.shards import prepare_output

    prepare_output(out, str(model_dir), 10, plan_shards(corpus, 10))
    prepare_output(out, str(model_dir), 10, plan_shards(corpus, 10))  # the same input: accepted
    (corpus / "a.jsonl").write_text("".join(json.dumps({"text": t.replace("Paris", "Rome.")})
                                            + "\n" for t in texts))
    with pytest.raises(AnnotateError, match="another input"):
        prepare_output(out, str(model_dir), 10, plan_shards(corpus, 10))
    (corpus / "a.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    prepare_output(out, str(model_dir), 10, plan_shards(corpus, 10))
    DocBin(docs=[spacy.blank("en").make_doc(t.replace("Mary", "Anna")) for t in texts]).to_disk(
        corpus / "b.spacy")
    with pytest.raises(AnnotateError, match="another input"):
        prepare_output(out, str(model_dir), 10, plan_shards(corpus, 10))


@pytest.mark.parametrize("earlier", ["no digests", "a digest of each file"])
def test_an_earlier_manifest_is_compared_by_layout_and_file_digest(model_dir, tmp_path, earlier):
    """Format 1 held each file's digest in its shards: an input edited since, with the same
    layout, was accepted as the same input, its shards of the earlier input kept."""
    from spacy_fsemicrf.annotate.shards import prepare_output

    corpus, out = tmp_path / "in", tmp_path / "out"
    corpus.mkdir()
    texts = make_texts(25, 5)
    (corpus / "a.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    DocBin(docs=[spacy.blank("en").make_doc(t) for t in texts[:12]]).to_disk(corpus / "b.spacy")
    shards = plan_shards(corpus, 10)
    prepare_output(out, str(model_dir), 10, shards)
    current = (out / "manifest.json").read_text()

    def write_earlier():
        manifest = json.loads(current)
        manifest["format"] = 1
        for shard in manifest["shards"]:
            del shard["digest"]
            if earlier == "a digest of each file":
                shard["digest"] = hashlib.blake2b(Path(shard["source"]).read_bytes(),
                                                  digest_size=16).hexdigest()
        (out / "manifest.json").write_text(json.dumps(manifest))

    write_earlier()
    with pytest.raises(AnnotateError, match="1 of 4 shards differ"):
        prepare_output(out, str(model_dir), 10, shards[:-1])
    assert prepare_output(out, str(model_dir), 10, shards) == []
    assert (out / "manifest.json").read_text() == current  # rewritten in the current format
    write_earlier()
    _touch_shards(out, range(5))
    (corpus / "a.jsonl").write_text("".join(json.dumps({"text": t.upper()}) + "\n"
                                            for t in texts))
    shards = plan_shards(corpus, 10)
    if earlier == "no digests":  # nothing but the layout to compare
        assert prepare_output(out, str(model_dir), 10, shards) == []
        write_earlier()
        (corpus / "a.jsonl").write_text("".join(json.dumps({"text": t}) + "\n"
                                                for t in texts + texts[:1]))
        assert prepare_output(out, str(model_dir), 10, plan_shards(corpus, 10),
                              update=True) == [2]  # 6 records, not 5: another layout
        return
    with pytest.raises(AnnotateError, match="3 of 5 shards differ"):
        prepare_output(out, str(model_dir), 10, shards)
    assert prepare_output(out, str(model_dir), 10, shards, update=True) == [0, 1, 2]
    assert _written(out) == [3, 4] and not (out / "entities.jsonl").exists()


def _touch_shards(out: Path, indices) -> None:
    for i in indices:
        for path in shard_paths(out, i).values():
            path.write_text("")
    (out / "entities.jsonl").write_text("")


def _written(out: Path):
    return [i for i in range(10) if shard_paths(out, i)["docs"].exists()]


def test_an_update_annotates_again_only_the_shards_whose_documents_changed(model_dir, tmp_path):
    from spacy_fsemicrf.annotate.shards import prepare_output

    texts = make_texts(25, 3)
    records = [json.dumps({"text": t}) for t in texts]
    path, out = tmp_path / "in.jsonl", tmp_path / "out"
    path.write_text("\n".join(records) + "\n")
    assert prepare_output(out, str(model_dir), 10, plan_shards(path, 10)) == []
    _touch_shards(out, range(3))
    records[12] = json.dumps({"text": "Anna Lee flew to Oslo ."})  # shard 1
    path.write_text("\n".join(records) + "\n")
    with pytest.raises(AnnotateError, match="1 of 3 shards differ"):
        prepare_output(out, str(model_dir), 10, plan_shards(path, 10))
    assert _written(out) == [0, 1, 2]  # refused: nothing removed
    assert prepare_output(out, str(model_dir), 10, plan_shards(path, 10), update=True) == [1]
    assert _written(out) == [0, 2] and not (out / "entities.jsonl").exists()
    assert prepare_output(out, str(model_dir), 10, plan_shards(path, 10)) == []  # recorded
    _touch_shards(out, [1])

    # blank lines are part of the shard they follow; a record removed moves every later one
    path.write_text("\n".join(records[:15]) + "\n\n" + "\n".join(records[15:]) + "\n")
    assert prepare_output(out, str(model_dir), 10, plan_shards(path, 10), update=True) == [1]
    _touch_shards(out, [1])
    path.write_text("\n".join(records[1:]) + "\n")
    assert prepare_output(out, str(model_dir), 10, plan_shards(path, 10), update=True) == [0, 1, 2]
    path.write_text("\n".join(records) + "\n")
    assert prepare_output(out, str(model_dir), 10, plan_shards(path, 10), update=True) == [0, 1, 2]
    _touch_shards(out, range(3))
    # records added: the last shard grows, a new one follows; removed: the shards beyond go
    path.write_text("\n".join(records + records[:10]) + "\n")
    assert prepare_output(out, str(model_dir), 10, plan_shards(path, 10), update=True) == [2, 3]
    _touch_shards(out, range(4))
    path.write_text("\n".join(records[:12]) + "\n")
    assert prepare_output(out, str(model_dir), 10, plan_shards(path, 10), update=True) == [1]
    assert _written(out) == [0]
    manifest = json.loads((out / "manifest.json").read_text())
    assert len(manifest["shards"]) == 2


def test_an_update_reads_a_spacy_shard_as_annotate_reads_it(model_dir, tmp_path):
    """Only what annotation reads counts: the words, their spacing, the id; not gold entities."""
    from spacy_fsemicrf.annotate.shards import prepare_output

    nlp = spacy.blank("en")
    docs = [nlp.make_doc(t) for t in make_texts(6, 4)]
    path, out = tmp_path / "in.spacy", tmp_path / "out"

    def save(docs):
        DocBin(docs=docs, store_user_data=True).to_disk(path)
        return prepare_output(out, str(model_dir), 2, plan_shards(path, 2), update=True)

    assert save(docs) == []
    docs[0].ents = [docs[0].char_span(0, len(docs[0][0].text), label="MISC")]
    assert save(docs) == []
    docs[2] = nlp.make_doc(docs[2].text.replace(" .", "."))
    assert save(docs) == [1]
    docs[5].user_data["id"] = "x"
    assert save(docs) == [2]
    assert save(docs[:4] + [Doc(nlp.vocab, words=["A", "B"]), Doc(nlp.vocab, words=["C"])]) == [2]
    assert save(docs[:4] + [Doc(nlp.vocab, words=["A"]), Doc(nlp.vocab, words=["B", "C"])]) == [2]
    # the same words and spaces, the spacing now known: annotation reads it otherwise
    known = Doc(nlp.vocab, words=["B", "C"], spaces=[True, True])
    assert save(docs[:4] + [Doc(nlp.vocab, words=["A"]), known]) == [2]


def test_a_local_cluster_whose_client_fails_is_closed(monkeypatch):
    """A client that cannot be made for the new local cluster (a connection timeout) left the
    cluster's worker processes running until the interpreter's exit."""
    from spacy_fsemicrf.annotate import engine

    closed = []

    class Cluster:
        def __init__(self, **kwargs):
            pass

        def close(self):
            closed.append(self)

    def client(cluster):
        raise OSError("timed out")

    monkeypatch.setattr(engine, "LocalCluster", Cluster)
    monkeypatch.setattr(engine, "Client", client)
    # Ctrl-C's handler as in a terminal (a job started in the background ignores SIGINT)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(OSError, match="timed out"):
            connect(None, 1)
    finally:
        restored = signal.signal(signal.SIGINT, previous)
    assert len(closed) == 1
    assert restored is signal.default_int_handler


def test_ctrl_c_is_left_alone_where_its_handler_could_not_be_put_back(monkeypatch):
    """A SIGINT handler set outside Python (``signal.getsignal`` gives None, as in a process
    that embeds Python) cannot be restored: ``signal.signal(SIGINT, None)`` raises TypeError,
    which ended a run whose cluster had started fine. The handler is then left as it is."""
    from spacy_fsemicrf.annotate import engine

    set_to = []
    monkeypatch.setattr(engine.signal, "getsignal", lambda signum: None)
    monkeypatch.setattr(engine.signal, "signal",
                        lambda signum, handler: set_to.append(handler) or None)
    for left_alone in (engine.ctrl_c_ignored, engine.ctrl_c_deferred):
        with left_alone():
            pass
    assert set_to == []


@pytest.fixture
def terminal_ctrl_c():
    """Ctrl-C's handler as in a terminal (a job started in the background ignores SIGINT)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    assert signal.signal(signal.SIGINT, previous) is signal.default_int_handler


def test_ctrl_c_in_a_client_call_lands_after_it_returns(tmp_path, monkeypatch, terminal_ctrl_c):
    """Ctrl-C during ``Future.result`` (Dask's ``sync``) before its coroutine started had the
    event loop log a NameError traceback (distributed's cancel callback reads a variable not
    yet set) under the command's one-line message. The call now finishes first; the
    KeyboardInterrupt follows it, and a second Ctrl-C interrupts at once."""
    from spacy_fsemicrf.annotate import engine
    from spacy_fsemicrf.annotate.inputs import Shard

    monkeypatch.setattr(engine, "as_completed", iter)
    shards = [Shard(i, "in.jsonl", "in.jsonl", 10 * i, 10) for i in range(3)]
    once, done = StandInClient(result=1), []
    with pytest.raises(KeyboardInterrupt):
        engine._run_tasks(once, "model", shards, shards, tmp_path, 7, False, done.append)
    assert once.returned == ["result"] and done == []

    failing = StandInClient(lambda shard: AnnotateError("bad input"), cancel=1)
    with pytest.raises(KeyboardInterrupt):
        engine._run_tasks(failing, "model", shards, shards, tmp_path, 7, False, None)
    assert failing.returned == ["result", "cancel"]

    twice = StandInClient(result=2)
    with pytest.raises(KeyboardInterrupt):
        engine._run_tasks(twice, "model", shards, shards, tmp_path, 7, False, None)
    assert twice.returned == []

    # ignored (a background job): nothing is raised, every shard is done
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        engine._run_tasks(once, "model", shards, shards, tmp_path, 7, False, done.append)
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    assert [r["index"] for r in done] == [0, 1, 2]


def test_the_run_hands_its_options_to_the_task_loop(tmp_path, monkeypatch):
    """``_run_todo`` passes the batch size (and the rest) on to the tasks of a given client,
    counts its workers and leaves that client open."""
    from spacy_fsemicrf.annotate import engine

    client, calls = StandInClient(), []
    monkeypatch.setattr(engine, "_run_tasks", lambda *args: calls.append(args))
    done = []
    n_workers = engine._run_todo(client, None, None, "model", ["todo"], ["all"], tmp_path, 7,
                                 True, done.append)
    assert calls == [(client, "model", ["todo"], ["all"], tmp_path, 7, True, done.append)]
    assert n_workers == 1 and client.returned == ["scheduler_info"]


def test_a_scheduler_without_workers_is_said(tmp_path, monkeypatch, capsys):
    """Dask holds the tasks until a worker joins: the command waited without a word."""
    from spacy_fsemicrf.annotate import engine

    client = StandInClient()
    client.scheduler_info = lambda: {"workers": {}}
    monkeypatch.setattr(engine, "connect", lambda scheduler, workers: (client, None))
    monkeypatch.setattr(engine, "_run_tasks", lambda *args: None)
    address = "tcp://10.0.0.1:8786"
    assert engine._run_todo(None, address, None, "model", ["a", "b"], [], tmp_path, None, False,
                            None) == 0
    assert capsys.readouterr().err == (
        f"the Dask scheduler at {address} has no workers: the 2 shards wait until one joins "
        f"(Ctrl-C stops the run)\n")


def test_ctrl_c_while_the_own_cluster_closes_lets_it_close(tmp_path, monkeypatch,
                                                          terminal_ctrl_c):
    """The run's own client and cluster close even when Ctrl-C comes while they do (the client
    first: a cluster closed under it logs its lost connections)."""
    from spacy_fsemicrf.annotate import engine

    client, closed = StandInClient(scheduler_info=1, close=1), []
    cluster = type("Cluster", (), {"close": lambda self: closed.append("cluster")})()
    monkeypatch.setattr(engine, "connect", lambda scheduler, workers: (client, cluster))
    monkeypatch.setattr(engine, "_run_tasks", lambda *args: None)
    with pytest.raises(KeyboardInterrupt):
        engine._run_todo(None, None, 1, "model", ["shard"], [], tmp_path, None, False, None)
    assert client.returned == ["scheduler_info", "close"] and closed == ["cluster"]


def test_the_output_layout_and_the_temporary_files_a_rerun_removes(tmp_path):
    """Shards are ``shards/NNNNNN.spacy`` with their ``.jsonl``; a file being written is a
    hidden temporary beside its final name, and a rerun removes those a killed run left: in
    ``shards/`` and, for the manifest and the merged entities, in OUTPUT itself (which were
    left there before). Nothing else is touched."""
    from spacy_fsemicrf.annotate.shards import (TMP_SUFFIX, _mkstemp, prepare_output,
                                                remove_temporary)

    out = tmp_path / "out"
    prepare_output(out, "model", 10, plan_shards_of_one_text(tmp_path))
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "shards"]
    assert shard_paths(out, 3) == {"docs": out / "shards" / "000003.spacy",
                                   "entities": out / "shards" / "000003.jsonl"}
    left = []
    for final in (*shard_paths(out, 0).values(), out / "manifest.json", out / "entities.jsonl"):
        fd, tmp = _mkstemp(final)
        os.close(fd)
        tmp = Path(tmp)
        assert tmp.parent == final.parent
        assert tmp.name.startswith(f".{final.name}.") and tmp.name.endswith(TMP_SUFFIX)
        left.append(tmp)
    (out / ".notes.tmp").write_text("the user's")
    assert remove_temporary(out) == 4
    assert not any(tmp.exists() for tmp in left) and (out / ".notes.tmp").exists()
    assert remove_temporary(out) == 0


def test_a_failed_write_leaves_no_temporary_file(tmp_path, monkeypatch):
    from spacy_fsemicrf.annotate import shards

    def no_space(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(shards.os, "fsync", no_space)
    with pytest.raises(OSError, match="No space left"):
        shards._write_tmp(tmp_path / "manifest.json", b"{}")
    assert list(tmp_path.iterdir()) == []
    monkeypatch.undo()
    out = tmp_path / "out"
    one = plan_shards_of_one_text(tmp_path)
    shards.prepare_output(out, "model", 10, one)
    with pytest.raises(FileNotFoundError):  # the shard's entities are not there to merge
        shards.merge_entities(out, one)
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "shards"]


def test_an_output_that_cannot_be_checked_updated_or_written_says_why(tmp_path, monkeypatch):
    from spacy_fsemicrf.annotate import shards

    one = plan_shards_of_one_text(tmp_path)
    out = tmp_path / "out"
    (out).mkdir()
    (out / "shards").write_text("a file")
    with pytest.raises(AnnotateError, match="^" + re.escape(
            f"OUTPUT {out} must be a directory: {out / 'shards'} is a file") + "$"):
        shards.prepare_output(out, "model", 10, one)
    (out / "shards").unlink()
    # a manifest without its shards (written by hand, or cut short) holds no finished shard
    (out / "manifest.json").write_text(json.dumps(
        {"format": shards.MANIFEST_FORMAT, "model": "model", "shard_size": 10}))
    with pytest.raises(AnnotateError, match=re.escape("another input (1 of 1 shards differ)")):
        shards.prepare_output(out, "model", 10, one)

    def read_only(*args, **kwargs):
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(pathlib.Path, "unlink", read_only)
    with pytest.raises(AnnotateError, match="^" + re.escape(
            f"cannot update OUTPUT {out}: [Errno 30] Read-only file system") + "$"):
        shards.prepare_output(out, "model", 10, one, update=True)
    monkeypatch.undo()
    monkeypatch.setattr(shards, "_replace", read_only)
    with pytest.raises(AnnotateError, match="^" + re.escape(
            f"cannot write into OUTPUT {out}: [Errno 30] Read-only file system") + "$"):
        shards.prepare_output(out, "model", 10, one, update=True)


def test_inputs_found_and_refused_by_name(tmp_path):
    """In a directory, only files named .jsonl or .spacy are inputs (not a folder so named);
    a shard size below 1 and an input that cannot be read are refused with what is wrong."""
    from spacy_fsemicrf.annotate import inputs

    (tmp_path / "in.jsonl").write_text(json.dumps({"text": "Hello ."}) + "\n")
    (tmp_path / "notes.txt").write_text("not an input")
    (tmp_path / "more.jsonl").mkdir()
    (tmp_path / "more.jsonl" / "a.jsonl").write_text(json.dumps({"text": "Hi ."}) + "\n")
    assert [name for _, name in inputs.input_files(tmp_path)] == ["in.jsonl", "more.jsonl/a.jsonl"]
    with pytest.raises(AnnotateError, match="^the shard size must be at least 1, got 0$"):
        plan_shards(tmp_path, 0)
    with pytest.raises(AnnotateError, match="^" + re.escape(
            f"cannot read {tmp_path / 'more.jsonl'}: [Errno 21] Is a directory")):
        inputs._jsonl_shard_starts(tmp_path / "more.jsonl", 10)


def test_a_model_is_a_pipeline_directory_or_an_installed_package(tmp_path, monkeypatch):
    from spacy_fsemicrf.annotate.engine import resolve_model

    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(AnnotateError) as err:
        resolve_model("empty", must_exist_here=True)
    assert str(err.value) == "MODEL empty is not a spaCy pipeline directory (no config.cfg)"
    assert resolve_model("spacy", must_exist_here=True) == "spacy"  # an installed package
    with pytest.raises(AnnotateError, match="^MODEL 'no_such_pipeline' not found: it is "):
        resolve_model("no_such_pipeline", must_exist_here=True)
    assert resolve_model("no_such_pipeline", must_exist_here=False) == "no_such_pipeline"


def test_a_model_path_only_the_workers_have_is_made_absolute_here(tmp_path, monkeypatch):
    """The workers of a remote cluster run in their own directories: a relative path sent as
    it is loaded the pipeline at that path under a worker's directory, or none."""
    from spacy_fsemicrf.annotate.engine import resolve_model

    monkeypatch.chdir(tmp_path)
    for model in ("models/ner", "./ner", "../ner"):
        assert resolve_model(model, must_exist_here=False) == os.path.abspath(model)
    assert resolve_model("/shared/ner", must_exist_here=False) == "/shared/ner"


def test_annotate_hands_its_settings_on_and_sums_up_the_run(tmp_path, monkeypatch):
    """What ``annotate`` gives its task loop (stood in for here: it writes some of the shards,
    then returns or is interrupted) and what it makes of the result: the summary, the
    interrupted run's counts, the shards a loop did not write."""

    from spacy_fsemicrf.annotate import engine

    nlp = spacy.blank("en")
    (tmp_path / "in.jsonl").write_text(
        "".join(json.dumps({"text": f"Text {i} ."}) + "\n" for i in range(25)))
    calls, loop = [], {"writes": 1, "interrupted": True}

    def run_todo(client, scheduler, workers, model, todo, shards, output, batch_size, progress,
                 on_shard_done):
        calls.append((client, scheduler, workers, model, [s.index for s in todo], batch_size,
                      progress, on_shard_done))
        for shard in todo[:loop["writes"]]:
            write_shard(output, shard.index, [nlp("Text .")], [{"id": shard.index}])
        if loop["interrupted"]:
            raise KeyboardInterrupt
        return 3

    monkeypatch.setattr(engine, "_run_todo", run_todo)
    monkeypatch.setattr(engine, "Client", None)  # a client given needs no Dask import here
    monkeypatch.chdir(tmp_path)
    client, out = object(), tmp_path / "out"
    with pytest.raises(engine.Interrupted) as err:
        annotate("a_package", tmp_path / "in.jsonl", out, client=client, shard_size=10)
    assert err.value.args == (out, 1, 3)
    assert calls[-1] == (client, None, None, "a_package", [0, 1, 2], None, True, None)
    assert json.loads((out / "manifest.json").read_text())["shard_size"] == 10

    loop.update(writes=2, interrupted=False)
    start = time.perf_counter()
    summary = annotate("a_package", tmp_path / "in.jsonl", out, client=client, shard_size=10,
                       batch_size=4, progress=False, on_shard_done=print)
    elapsed = time.perf_counter() - start
    assert calls[-1] == (client, None, None, "a_package", [1, 2], 4, False, print)
    assert summary == engine.Summary(docs=25, shards=3, skipped_shards=1, entities=3, workers=3,
                                     seconds=summary.seconds, entities_path=out / "entities.jsonl")
    assert 0 < summary.seconds <= elapsed

    shutil.rmtree(out)
    loop.update(writes=1)
    with pytest.raises(AnnotateError, match="^" + re.escape(
            f"shards {list(range(1, 11))} were not written; rerun to finish them") + "$"):
        annotate("a_package", tmp_path / "in.jsonl", out, client=client, shard_size=2)
    with pytest.raises(AnnotateError, match="^" + re.escape(engine.NO_DASK) + "$"):
        annotate("a_package", tmp_path / "in.jsonl", tmp_path / "other", shard_size=2)
