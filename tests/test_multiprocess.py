"""``nlp.pipe(..., n_process=2)`` on a pipeline loaded from disk, after the parent has predicted.

PyTorch's OpenMP thread pool does not survive ``fork``: before ``spacy_fsemicrf.fork_safety``
the forked workers waited forever. This test process runs PyTorch on one thread
(tests/conftest.py), which hides the hang, so each check runs in a fresh Python process with
PyTorch's default thread count and a timeout: a hang fails the test instead of blocking it.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import spacy

try:
    from .conftest import make_examples
    from .test_train import _minilm_path
except ImportError:  # pragma: no cover - tests run as a plain directory
    from conftest import make_examples
    from test_train import _minilm_path

CONFIGS = Path(__file__).parent.parent / "configs"
TIMEOUT_S = 180
TEXTS = [
    "John Smith works for Google in Paris .",
    "Mary flew to Berlin on Monday .",
    "Microsoft hired Anna Lee last year .",
    "Nobody said anything about it .",
    "Laura Palmer moved to Rome with Amazon .",
    "The mayor of Madrid met Peter .",
] * 7

# Run by a fresh interpreter: load, predict in the parent, then fork two workers.
PIPE_SCRIPT = """
import json, sys
import spacy, torch

def output(docs, key):
    return [
        {"ents": [[e.start_char, e.end_char, e.label_] for e in doc.ents],
         "scores": [float(s) for s in doc.spans[key].attrs["scores"]] if key in doc.spans else []}
        for doc in docs
    ]

nlp = spacy.load(sys.argv[1])
key = nlp.get_pipe("fsemicrf_ner").spans_key
texts = json.loads(sys.argv[2])
threads = torch.get_num_threads()
one = output(nlp.pipe(texts, batch_size=8), key)
two = output(nlp.pipe(texts, batch_size=8, n_process=2), key)
print(json.dumps({"threads": threads, "one": one, "two": two}))
"""


def default_thread_env() -> dict:
    """This environment without the variables that would cap PyTorch's thread count."""
    caps = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
    return {k: v for k, v in os.environ.items() if k not in caps}


def run_python(code: str, *args: str) -> dict:
    """Run ``code`` in a fresh interpreter with the default thread count; its JSON output."""
    try:
        proc = subprocess.run(
            [sys.executable, "-c", code, *args],
            env=default_thread_env(),
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"the subprocess hung (no answer in {TIMEOUT_S} s)")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def check_same_output(model_dir: Path, *, expect_entities: bool = True) -> None:
    result = run_python(PIPE_SCRIPT, str(model_dir), json.dumps(TEXTS))
    if (os.cpu_count() or 1) > 1:
        # The hang needs a multi-threaded parent; on one core there is nothing to reproduce.
        assert result["threads"] > 1
    one, two = result["one"], result["two"]
    assert len(two) == len(one) == len(TEXTS)
    assert [d["ents"] for d in two] == [d["ents"] for d in one]
    assert any(d["ents"] for d in one) or not expect_entities
    for a, b in zip(one, two):
        assert b["scores"] == pytest.approx(a["scores"], abs=1e-5)


def test_forked_children_run_pytorch_on_one_thread_once_the_process_holds_the_component():
    """A process that makes an fsemicrf_ner component forks children that run PyTorch on one
    thread; before that (spaCy imports the package through its entry points in any pipeline,
    here a blank one with spaCy's ner) its children keep the parent's setting."""
    code = (
        "import json, multiprocessing, torch, spacy\n"
        "import spacy_fsemicrf\n"
        "torch.set_num_threads(2)\n"
        "torch.ones(256, 256) @ torch.ones(256, 256)\n"
        "ctx = multiprocessing.get_context('fork')\n"
        "nlp = spacy.blank('en')\n"
        "nlp.add_pipe('ner')\n"
        "with ctx.Pool(1) as pool:\n"
        "    before = pool.apply(torch.get_num_threads)\n"
        "nlp.add_pipe('fsemicrf_ner')\n"
        "with ctx.Pool(1) as pool:\n"
        "    child = pool.apply(torch.get_num_threads)\n"
        "print(json.dumps({'parent': torch.get_num_threads(), 'before': before, 'child': child}))\n"
    )
    assert run_python(code) == {"parent": 2, "before": 2, "child": 1}


def test_pipe_n_process_on_a_loaded_cnn_pipeline(trained_nlp, tmp_path):
    trained_nlp.to_disk(tmp_path / "cnn")
    check_same_output(tmp_path / "cnn")


@pytest.mark.skipif(_minilm_path() is None, reason="spacy-transformers or the MiniLM model missing")
def test_pipe_n_process_on_a_loaded_transformer_pipeline(tmp_path):
    config = spacy.util.load_config(
        CONFIGS / "fsemicrf_trf.cfg",
        overrides={"paths.transformer": _minilm_path()},
        interpolate=True,
    )
    nlp = spacy.util.load_model_from_config(config, auto_fill=True, validate=True)
    examples = make_examples(nlp)
    optimizer = nlp.initialize(lambda: examples)
    for _ in range(3):
        nlp.update(examples, sgd=optimizer)
    nlp.to_disk(tmp_path / "trf")
    check_same_output(tmp_path / "trf")


def test_an_unpickled_pipeline_prepares_its_process_before_it_forks(trained_nlp):
    """Unpickling does not run the component's __init__ (spawned n_process workers, joblib and
    celery payloads get their pipeline so): its first prediction prepares the process, so that
    its forked children run PyTorch on one thread (else n_process hung after it predicted)."""
    import pickle

    code = (
        "import json, multiprocessing, pickle, sys, torch\n"
        "from srsly.msgpack import msgpack_encoders\n"
        "nlp = pickle.loads(bytes.fromhex(sys.stdin.read()))\n"
        "from spacy_fsemicrf import fork_safety\n"
        "before = fork_safety._registered\n"
        "torch.set_num_threads(2)\n"
        "nlp('Mary flew to Berlin .')\n"
        "ctx = multiprocessing.get_context('fork')\n"
        "with ctx.Pool(1) as pool:\n"
        "    child = pool.apply(torch.get_num_threads)\n"
        "print(json.dumps({'before': before, 'child': child,\n"
        "                  'remembered': msgpack_encoders.get_all.remembers}))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], input=pickle.dumps(trained_nlp).hex(),
                          env=default_thread_env(), capture_output=True, text=True,
                          timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {
        "before": False, "child": 1, "remembered": True}


# Run by a fresh interpreter from a file (a spawned worker imports it as __mp_main__, where it
# finds the probe component): the PyTorch threads of each worker of nlp.pipe(n_process=2).
SPAWN_SCRIPT = """
import json, multiprocessing, sys
from spacy.language import Language

@Language.component("torch_threads")
def torch_threads(doc):
    import torch
    doc.user_data["threads"] = torch.get_num_threads()
    return doc

if __name__ == "__main__":
    multiprocessing.set_start_method(sys.argv[2])
    import spacy, torch
    nlp = spacy.load(sys.argv[1])
    nlp.add_pipe("torch_threads")
    texts = json.loads(sys.argv[3])
    docs = list(nlp.pipe(texts, batch_size=8, n_process=2))
    print(json.dumps({"parent": torch.get_num_threads(),
                      "workers": sorted({doc.user_data["threads"] for doc in docs}),
                      "ents": [[e.start_char, e.end_char, e.label_]
                               for doc in docs for e in doc.ents],
                      "one": [[e.start_char, e.end_char, e.label_]
                              for doc in nlp.pipe(texts) for e in doc.ents]}))
"""


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_spawned_workers_run_pytorch_on_one_thread(trained_nlp, tmp_path, method):
    """Under the start methods that do not fork (spawn: the default on macOS and Windows;
    forkserver), nlp.pipe(n_process=N)'s workers, which unpickle the pipeline, run PyTorch on
    one thread as forked ones do, not on one thread per core each (N workers on N cores)."""
    trained_nlp.to_disk(tmp_path / "cnn")
    script = tmp_path / "spawn_pipe.py"
    script.write_text(SPAWN_SCRIPT)
    # two threads by default in every process, whatever the machine's number of cores
    env = {**default_thread_env(), "OMP_NUM_THREADS": "2"}
    proc = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "cnn"), method, json.dumps(TEXTS[:12])],
        env=env, capture_output=True, text=True, timeout=TIMEOUT_S,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["parent"] == 2
    assert result["workers"] == [1]
    assert result["ents"] == result["one"] and result["ents"]
