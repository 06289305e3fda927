"""One loaded pipeline predicting from several threads (a web service's thread pool): a
prediction never runs on a head that another thread is switching to eval mode halfway.

The head is switched to eval mode by the first prediction after training (its dropout off);
a thread starting a prediction while another is inside that switch must not run with some of
the head's submodules still in training mode. The other thread is held inside the switch by
an event, not by timing, so that the tests are deterministic."""
import threading

import pytest
import spacy
import torch

try:  # tests/ as a package (tests/__init__.py) or as a plain directory
    from .conftest import make_examples, model_config
except ImportError:  # pragma: no cover
    from conftest import make_examples, model_config

TEXT = "John Smith works for Google in Paris ."
WAIT_S = 30  # only reached if a thread is stuck: the test then fails instead of hanging


@pytest.fixture(scope="module")
def pipeline():
    """``(nlp, ner)``: an initialized filtered-head pipeline with dropout in its head."""
    nlp = spacy.blank("en")
    ner = nlp.add_pipe("fsemicrf_ner", config={"model": model_config(dropout=0.5)})
    examples = make_examples(nlp)
    nlp.initialize(lambda: examples)
    return nlp, ner


def _modes(head: torch.nn.Module):
    """The submodules of ``head`` in training mode, by name."""
    return [name for name, module in head.named_modules() if module.training]


@pytest.mark.parametrize("second", ["call", "nbest"])
def test_a_prediction_started_during_the_switch_to_eval_mode_runs_in_eval_mode(
    pipeline, second
):
    """A first thread starts the switch to eval mode and is held inside it, in the span
    scorer's switch; a second thread then predicts (a call, or n-best decoding): the span
    scorer must see every submodule of the head in eval mode."""
    nlp, ner = pipeline
    head = ner.torch_head
    head.train()  # as a training step leaves it
    scorer = head.scorer
    first_inside, second_done = threading.Event(), threading.Event()
    switch = scorer.train

    def held_switch(mode=True):
        if not first_inside.is_set():  # the first thread's switch waits for the second
            first_inside.set()
            second_done.wait(WAIT_S)
        return switch(mode)

    seen = []
    hook = scorer.register_forward_pre_hook(
        lambda module, args: seen.append(_modes(head)) if first_inside.is_set() else None)
    scorer.train = held_switch
    first = threading.Thread(target=nlp, args=(TEXT,))
    try:
        first.start()
        assert first_inside.wait(WAIT_S)
        if second == "call":
            nlp(TEXT)
        else:
            ner.nbest(nlp.make_doc(TEXT), 2)
    finally:
        second_done.set()
        first.join(WAIT_S)
        hook.remove()
        del scorer.train
    assert not first.is_alive()
    assert seen, "the second thread's prediction did not reach the span scorer"
    assert seen[0] == [], f"a prediction ran with {seen[0]} in training mode"


def test_a_loaded_pipeline_predicts_without_switching_modes(pipeline, monkeypatch):
    """A loaded pipeline's head is in eval mode: its predictions, from any number of threads,
    change no module's mode (nothing for one thread to see half done by another)."""
    nlp, _ = pipeline
    loaded = spacy.blank("en")
    loaded.add_pipe("fsemicrf_ner", config={"model": model_config(dropout=0.5)})
    loaded.from_bytes(nlp.to_bytes())
    loaded_ner = loaded.get_pipe("fsemicrf_ner")
    assert _modes(loaded_ner.torch_head) == []

    def no_switch(module, mode=True):
        raise AssertionError(f"prediction switched {type(module).__name__} to mode {mode}")

    monkeypatch.setattr(torch.nn.Module, "train", no_switch)
    doc = loaded(TEXT)
    list(loaded.pipe([TEXT, "Mary flew to Berlin ."]))
    loaded_ner.nbest(doc, 2)
