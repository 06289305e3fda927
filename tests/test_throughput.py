"""benchmarks/throughput.py: ratios and head shares taken within each repeat."""
import importlib.util
import os
from pathlib import Path

import pytest

from .script_checks import refused, stand_in_files

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("throughput", ROOT / "benchmarks" / "throughput.py")
throughput = importlib.util.module_from_spec(_spec)
# the script sets OPENBLAS_NUM_THREADS for its own process: keep this one's as it was
_blas_threads = os.environ.get("OPENBLAS_NUM_THREADS")
_spec.loader.exec_module(throughput)
if _blas_threads is None:
    os.environ.pop("OPENBLAS_NUM_THREADS", None)


def test_ratios_pair_the_pipelines_of_one_repeat():
    # the machine slows down during the second repeat, after ner ran: a ratio of the medians
    # (1.0 / 2.4) would pair ner's fast repeat with the head's slow one
    times = {"ner": [1.0, 1.0, 3.0], "head": [0.8, 2.4, 2.4]}
    ratios = throughput.relative_speed(times, "head", "ner")
    assert ratios == pytest.approx([1.25, 1.0 / 2.4, 1.25])
    assert throughput.spread(ratios) == pytest.approx(
        {"median": 1.25, "min": 1.0 / 2.4, "max": 1.25})
    assert throughput.relative_speed(times, "ner", "ner") == [1.0, 1.0, 1.0]


def test_spread_of_an_even_number_of_repeats_is_the_mean_of_the_middle_two():
    assert throughput.spread([4.0, 1.0, 2.0, 3.0]) == {"median": 2.5, "min": 1.0, "max": 4.0}


def test_the_table_gives_each_ratio_and_share_with_its_range():
    times = {"ner": [1.0, 1.0, 3.0], "head": [0.8, 2.4, 2.4], "head:tok2vec": [0.6, 2.5, 1.8]}
    limits = {"head": "head:tok2vec"}
    row = {"length": 10, "batch_size": 64, "words_per_s": {n: 100.0 for n in times},
           **throughput.side_by_side(times, "ner", limits)}
    text = throughput.markdown([row], list(times), "ner", limits, 3, "test.spacy",
                               "python benchmarks/throughput.py ARGS")
    # head share per repeat: 1 - 0.6/0.8, 1 - 2.5/2.4, 1 - 1.8/2.4 = 25%, -4.2%, 25%
    assert ("| 10 | 64 | 100 (1.00x) | 100 (1.25x, 0.42-1.25) | 100 (1.67x, 0.40-1.67) "
            "| 25.0% (-4.2 to 25.0) |") in text.splitlines()
    assert "| length | batch | ner | head | head:tok2vec | head share head |" in text
    assert text.endswith("Made by `python benchmarks/throughput.py ARGS`.\n")


def test_pipelines_take_turns_part_by_part_in_a_rotating_order():
    calls = []

    def time_part(name, part):
        calls.append((name, part))
        return {"a": 1.0, "b": 2.0, "c": 4.0}[name] * len(part)

    parts = [[1], [2, 3]]
    times = throughput.interleaved_times(["a", "b", "c"], parts, 2, time_part)
    # each pipeline's seconds in a repeat are its sum over the parts
    assert times == {"a": [3.0, 3.0], "b": [6.0, 6.0], "c": [12.0, 12.0]}
    assert [name for name, _ in calls] == ["a", "b", "c", "b", "c", "a",
                                           "b", "c", "a", "c", "a", "b"]
    assert [part for _, part in calls] == [[1]] * 3 + [[2, 3]] * 3 + [[1]] * 3 + [[2, 3]] * 3


def test_turns_are_one_batch_and_at_batch_one_sixteen_documents():
    docs = list(range(150))
    assert [len(t) for t in throughput.turns(docs, 64)] == [64, 64, 22]
    assert [len(t) for t in throughput.turns(docs, 1)] == [16] * 9 + [6]
    assert sum(throughput.turns(docs, 1), []) == docs


@pytest.mark.parametrize("args, message", [
    (["--models", "{tmp}/model"], "--models takes NAME=PATH, got '{tmp}/model'"),
    (["--models", "ner={tmp}/none"], "--models {tmp}/none is not a pipeline directory"),
    (["--models", "head={tmp}/model"], "--reference ner is not one of the --models names (head)"),
    (["--encoder-only", "head"], "--encoder-only head is not one of the --models names (ner)"),
    (["--test", "{tmp}/none.spacy"], "--test: no such file: {tmp}/none.spacy"),
    (["--repeats", "0"], "argument --repeats: must be at least 1, got 0"),
    (["--batch-sizes", "0"], "argument --batch-sizes: must be at least 1, got 0"),
])
def test_bad_arguments_are_named_before_any_pipeline_loads(tmp_path, capsys, monkeypatch, args,
                                                           message):
    """Before: a traceback, for a --reference not among the pipelines after every timing, and
    --repeats 0 after the warm-up."""
    stand_in_files(tmp_path, monkeypatch)
    argv = ["--models", f"ner={tmp_path}/model", "--test", f"{tmp_path}/test.spacy",
            "--output", f"{tmp_path}/out/throughput"]
    argv += [a.format(tmp=tmp_path) for a in args]
    assert message.format(tmp=tmp_path) in refused(throughput.main, argv, capsys)
    assert not (tmp_path / "out").exists()
