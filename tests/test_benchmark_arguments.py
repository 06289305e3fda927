"""Command lines of the benchmarks without a test file of their own (profile_predict.py,
check_predictions.py, head_ab.py, cores.py, gpu_check.py,
compiled_scorer.py): bad arguments are argparse's one-line
error, exit status 2, before any pipeline loads; documents cut to a length are that long."""
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import spacy
from spacy.tokens import Doc, DocBin

from .script_checks import refused, stand_in_files

ROOT = Path(__file__).resolve().parents[1]


def load(name: str):
    """A module of benchmarks/, with sys.path as it was (the scripts put their folders first)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    path = list(sys.path)
    spec.loader.exec_module(module)
    sys.path[:] = path
    return module


profile_predict = load("profile_predict")

# head_ab reads its reference functions from git: these cases need the checkout's history
NEEDS_GIT = pytest.mark.skipif(
    subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True).returncode
    != 0, reason="not a git checkout")


@pytest.fixture
def files(tmp_path, monkeypatch):
    """Stand-in pipeline and test files (:func:`stand_in_files`): nothing may load."""
    return stand_in_files(tmp_path, monkeypatch)


def test_documents_are_cut_to_their_length_or_refused():
    """A length longer than the running text gave one shorter document, timed as that
    length; 0 divided by zero."""
    vocab = spacy.blank("en").vocab
    docs = [Doc(vocab, words=["w"] * 7), Doc(vocab, words=["v"] * 5)]
    assert [len(d) for d in profile_predict.cut_docs(spacy.blank("en"), docs, 5, 100)] == [5, 5]
    assert [len(d) for d in profile_predict.cut_docs(spacy.blank("en"), docs, 12, 1)] == [12]
    for length in (13, 0, -1):
        with pytest.raises(ValueError):
            profile_predict.cut_docs(spacy.blank("en"), docs, length, 100)


@pytest.mark.parametrize("args, message", [
    (["--model", "{tmp}/none"], "--model {tmp}/none is not a pipeline directory"),
    (["--test", "{tmp}/none.spacy"], "--test: no such file: {tmp}/none.spacy"),
    (["--repeats", "0"], "argument --repeats: must be at least 1, got 0"),
    (["--lengths", "10", "0"], "argument --lengths: must be at least 1, got 0"),
    (["--batch-sizes", "-1"], "argument --batch-sizes: must be at least 1, got -1"),
    (["--tokens", "0"], "argument --tokens: must be at least 1, got 0"),
])
def test_profile_predict_refuses_bad_arguments(files, capsys, args, message):
    """Before: spaCy's or DocBin's traceback for a missing model or test file, a repeat count
    of 0 reported the warm-up run as the best of 0, and a length or batch size below 1 failed
    in range() or divided by zero after the first settings ran."""
    argv = ["--model", f"{files}/model", "--test", f"{files}/test.spacy",
            "--output", f"{files}/out/profile"]
    argv += [a.format(tmp=files) for a in args]
    assert message.format(tmp=files) in refused(profile_predict.main, argv, capsys)
    assert not (files / "out").exists()


def test_a_length_longer_than_the_test_set_is_named():
    parser = profile_predict.argparse.ArgumentParser()
    vocab = spacy.blank("en").vocab
    docs = [Doc(vocab, words=["w"] * 7)]
    profile_predict.check_lengths(parser, docs, [7])
    with pytest.raises(SystemExit):
        profile_predict.check_lengths(parser, docs, [3, 8])


@pytest.mark.parametrize("args, message", [
    (["--compare", "{tmp}/none.pkl"], "--compare: no such file: {tmp}/none.pkl"),
    (["--save", "{tmp}/no_dir/p.pkl"], "--save {tmp}/no_dir/p.pkl: no such directory"),
    (["--save", "{tmp}/p.pkl", "--model", "{tmp}/none"], "--model {tmp}/none is not a pipeline"),
    (["--save", "{tmp}/p.pkl", "--batch-sizes", "0"], "--batch-sizes: must be at least 1, got 0"),
    (["--save", "{tmp}/p.pkl", "--lengths", "-1"], "--lengths: must be 0 (the test documents)"),
    (["--save", "{tmp}/p.pkl", "--tokens", "0"], "--tokens: must be at least 1, got 0"),
])
def test_check_predictions_refuses_bad_arguments(files, capsys, args, message):
    """Before: a missing --compare file or --save folder failed with a traceback once every
    prediction was made, and --batch-sizes 0 saved no document and exited 0 (a compare of
    nothing then found it identical)."""
    check_predictions = load("check_predictions")
    argv = ["--model", f"{files}/model", "--test", f"{files}/test.spacy"]
    argv += [a.format(tmp=files) for a in args]
    assert message.format(tmp=files) in refused(check_predictions.main, argv, capsys)
    assert not (files / "p.pkl").exists()


@pytest.mark.parametrize("arch", ["LinearCRF", "SemiCRF"])
def test_check_predictions_checks_the_heads_without_a_filter(tmp_path, capsys, arch):
    """The second pass set the default --margin on every head, which only the filtered head
    takes: the other heads stopped with the component's ValueError before saving anything; and
    with a margin of 0 the second pass's records replaced the first's."""
    from .conftest import make_examples, model_config, train_pipeline

    check_predictions = load("check_predictions")
    nlp = spacy.blank("en")
    nlp.add_pipe("fsemicrf_ner", config={"model": model_config(f"spacy-fsemicrf.{arch}.v1")})
    examples = make_examples(nlp)
    train_pipeline(nlp, examples, n_iter=3)
    nlp.to_disk(tmp_path / "model")
    DocBin(docs=[eg.reference for eg in examples]).to_disk(tmp_path / "test.spacy")
    argv = ["--model", f"{tmp_path}/model", "--test", f"{tmp_path}/test.spacy", "--lengths", "0",
            "5", "--batch-sizes", "1", "3", "--tokens", "20"]
    check_predictions.main(argv + ["--save", f"{tmp_path}/p.pkl"])
    check_predictions.main(argv + ["--compare", f"{tmp_path}/p.pkl"])
    out = capsys.readouterr().out
    # two passes of 8 test documents and 4 cut ones, at two batch sizes: the second pass with
    # the candidates (and margin 0 here) was saved over the first
    assert "saved 48 documents" in out and "identical: 48 documents" in out


def test_check_predictions_compares_the_number_of_documents(tmp_path, capsys):
    """Predictions saved for fewer documents of a length than the compare cuts (another
    --tokens) differ: the compare went over the saved ones only and called every document
    identical."""
    from .conftest import make_examples, model_config, train_pipeline

    check_predictions = load("check_predictions")
    nlp = spacy.blank("en")
    nlp.add_pipe("fsemicrf_ner", config={"model": model_config("spacy-fsemicrf.LinearCRF.v1")})
    examples = make_examples(nlp)
    train_pipeline(nlp, examples, n_iter=3)
    nlp.to_disk(tmp_path / "model")
    DocBin(docs=[eg.reference for eg in examples]).to_disk(tmp_path / "test.spacy")
    argv = ["--model", f"{tmp_path}/model", "--test", f"{tmp_path}/test.spacy", "--lengths", "5",
            "--batch-sizes", "2"]
    check_predictions.main(argv + ["--tokens", "10", "--save", f"{tmp_path}/p.pkl"])
    with pytest.raises(SystemExit) as exit_info:
        check_predictions.main(argv + ["--tokens", "20", "--compare", f"{tmp_path}/p.pkl"])
    out = capsys.readouterr().out
    assert exit_info.value.code == 1 and "identical" not in out
    assert "length 5 batch 2 margin 0.0: 4 documents, 2 in" in out


@pytest.mark.parametrize("args, message", [
    (["--rounds", "2"], "--rounds: must be at least 3 (the first two are dropped), got 2"),
    (["--settings", "10x0"], "--settings: must be at least 1, got 0"),
    (["--settings", "10"], "--settings: takes LENGTHxBATCH, got '10'"),
    (["--model", "{tmp}/none"], "--model {tmp}/none is not a pipeline directory"),
    (["--test", "{tmp}/none.spacy"], "--test: no such file: {tmp}/none.spacy"),
    pytest.param(["--reference", "no-such-revision"], "invalid object name 'no-such-revision'",
                 marks=NEEDS_GIT),
    pytest.param(["--swap", "spacy_fsemicrf/none.py:f"],
                 "path 'spacy_fsemicrf/none.py' does not exist", marks=NEEDS_GIT),
    (["--swap", "spacy_fsemicrf/component.py"], "--swap takes FILE:QUALNAME"),
])
def test_head_ab_refuses_bad_arguments(files, capsys, args, message):
    """Before: --rounds 2 failed with a traceback once every round of the first setting ran
    (no round left after the two dropped), a batch of 0 in range(); a revision or a swapped
    file that git does not know, and a --swap without its function, were tracebacks once the
    pipeline had loaded."""
    head_ab = load("head_ab")
    argv = ["--model", f"{files}/model", "--test", f"{files}/test.spacy", "--reference", "HEAD",
            "--swap", "spacy_fsemicrf/component.py:FSemiCRFEntityRecognizer.set_annotations"]
    argv += [a.format(tmp=files) for a in args]
    assert message.format(tmp=files) in refused(head_ab.main, argv, capsys)


def test_cores_refuses_no_repeat_and_writes_into_a_new_folder(tmp_path, capsys, monkeypatch):
    """Before: --repeats 0 was min()'s traceback, and an --output in a missing folder failed
    once every run was timed."""
    cores = load("cores")
    monkeypatch.setattr(cores, "wall", lambda work, processes: 1.0 * processes)
    for argv, message in ((["--repeats", "0"], "--repeats: must be at least 1, got 0"),
                          (["--output", str(tmp_path)], f"--output {tmp_path} is a directory")):
        assert message in refused(cores.main, argv, capsys)
    cores.main(["--repeats", "1", "--output", str(tmp_path / "new" / "cores.json")])
    assert json.loads((tmp_path / "new" / "cores.json").read_text())["repeats"] == 1


@pytest.mark.parametrize("args, message", [
    (["--limit", "-1"], "--limit: must be at least 1, got -1"),
    (["--limit", "0"], "--limit: must be at least 1, got 0"),
    (["--models", "{tmp}/model"], "--models takes NAME=PATH, got '{tmp}/model'"),
    (["--models", "a={tmp}/none"], "--models {tmp}/none is not a pipeline directory"),
    (["--test", "{tmp}/none.spacy"], "--test: no such file: {tmp}/none.spacy"),
])
def test_gpu_check_agree_refuses_bad_arguments(files, capsys, monkeypatch, args, message):
    """Before: --limit -1 compared all but the last document and reported that count, 0 none;
    a missing pipeline or test file was a traceback."""
    gpu_check = load("gpu_check")
    monkeypatch.setattr(gpu_check, "agree", lambda *a: pytest.fail("nothing is compared"))
    argv = ["agree", "--models", f"a={files}/model", "--test", f"{files}/test.spacy",
            "--output", f"{files}/agree.json"] + [a.format(tmp=files) for a in args]
    assert message.format(tmp=files) in refused(gpu_check.main, argv, capsys)


def test_gpu_check_agree_writes_into_a_new_folder(files, monkeypatch):
    """Before: an --output in a missing folder failed once both devices had predicted."""
    gpu_check = load("gpu_check")
    monkeypatch.setattr(gpu_check, "agree", lambda *a: {"a": {"docs": 3}})
    out = files / "new" / "agree.json"
    gpu_check.main(["agree", "--models", f"a={files}/model", "--test", f"{files}/test.spacy",
                    "--output", str(out)])
    assert json.loads(out.read_text()) == {"a": {"docs": 3}}


def test_gpu_check_report_renders_the_same_from_its_json(tmp_path):
    """Before: the batch sizes were integers in the data and strings in gpu_check.json, so the
    table made again from the JSON file had no transformer-alone figures."""
    gpu_check = load("gpu_check")
    speed = {"machine": {"gpu": "stand-in"}, "pipelines": {"fsemicrf-trf": {
        "accuracy": {"f": 0.9}, "speed": {"wps": 500.0}}},
        "speed": {"ner-trf": {"wps": 400.0}, "ner-trf:transformer alone": {"wps": 1234.0}}}
    (tmp_path / "speed_b64.json").write_text(json.dumps(speed))
    data = gpu_check.report(tmp_path, tmp_path / "out")
    table = (tmp_path / "out" / "gpu_check.md").read_text()
    assert "Transformer alone: 1234 words/s at batch 64, – at batch 512." in table
    assert "| 500 | 1.25x | 0.41x |" in table
    again = json.loads((tmp_path / "out" / "gpu_check.json").read_text())
    assert again == data
    assert gpu_check.markdown(again) == table


@pytest.mark.parametrize("script, args, message", [
    ("bench_structured", ["--repeats", "0"], "--repeats: must be at least 1, got 0"),
    ("bench_structured", ["--lengths", "16", "0"], "--lengths: must be at least 1, got 0"),
    ("bench_constraints", ["--batches", "0"], "--batches: must be at least 1, got 0"),
    ("bench_constraints", ["--sentence", "0"], "--sentence: must be at least 1, got 0"),
    ("bench_constraints", ["--model", "{tmp}/none", "--data", "{tmp}/test.spacy"],
     "--model {tmp}/none is not a pipeline directory"),
    ("bench_constraints", ["--model", "{tmp}/model", "--data", "{tmp}/none.spacy"],
     "--data: no such file: {tmp}/none.spacy"),
    ("bench_long_docs", ["{tmp}/model", "--sizes", "-5"], "--sizes: must be at least 1, got -5"),
    ("bench_long_docs", ["{tmp}/none"], "model {tmp}/none is not a pipeline directory"),
    ("bench_long_docs", ["{tmp}/model", "--test", "{tmp}/none.spacy"], "no such file"),
    ("scale", ["{tmp}/model", "--batch-size", "0"], "--batch-size: must be at least 1, got 0"),
    ("scale", ["{tmp}/model", "--copies", "0"], "--copies: must be at least 1, got 0"),
    ("scale", ["{tmp}/model", "--repeats", "0"], "--repeats: must be at least 1, got 0"),
    ("scale", ["{tmp}/none"], "model {tmp}/none is not a pipeline directory"),
    ("scale", ["{tmp}/model", "--test", "{tmp}/none.spacy"], "--test: no such file"),
    ("sentence_boundaries", ["--models", "a={tmp}/none", "--test", "{tmp}/test.spacy"],
     "--models {tmp}/none is not a pipeline directory"),
    ("sentence_boundaries", ["--models", "a={tmp}/model", "--test", "{tmp}/none.spacy"],
     "--test: no such file"),
    ("sentence_boundaries", ["--models", "a={tmp}/model", "--test", "{tmp}/test.spacy",
                             "--batch-size", "0"], "--batch-size: must be at least 1, got 0"),
])
def test_counts_below_one_and_missing_files_are_refused(files, capsys, monkeypatch, script, args,
                                                       message):
    """Before: --repeats or --batches 0 failed with a traceback after the warm-up runs, a
    --sizes of -5 reported an empty document as '-5 tokens', scale's --batch-size 0 (nlp.pipe
    then yields no document) and --copies 0 left no text to annotate, and a missing pipeline or
    corpus was a traceback."""
    module = load(script)
    argv = [a.format(tmp=files) for a in args]
    if script.startswith("bench_") and script != "bench_long_docs":
        argv += ["--output", f"{files}/out/result.json"]
    monkeypatch.setattr(sys, "argv", [script] + argv)
    main = module.parse_args if script in ("scale", "sentence_boundaries") else module.main
    assert message.format(tmp=files) in refused(lambda _: main(), None, capsys)
    assert not (files / "out").exists()


def test_worker_heap_times_a_fresh_process_without_the_default_test_file(tmp_path, monkeypatch):
    """The child process that times nlp.pipe right after loading reads its texts from stdin.
    Before: it checked the default --test, so a run given another --test from a directory
    without corpus/test.spacy failed there (exit status 2)."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))  # as a script has it: scale.py
    worker_heap = load("worker_heap")
    spacy.blank("en").to_disk(tmp_path / "model")
    monkeypatch.chdir(tmp_path)
    run = worker_heap.PipeRun(None, str(tmp_path / "model"), ["a b", "c"], 2, keep=True,
                              fresh=True, n_process=1)
    assert run() == [(), ()] and len(run.seconds) == 1


def test_span_terms_refuses_a_missing_reference(capsys, monkeypatch):
    """Before: a FileNotFoundError traceback from importlib."""
    span_terms = load("span_terms")
    monkeypatch.setattr(sys, "argv", ["span_terms", "--reference", "/no/such/spans.py"])
    assert "--reference: no such file" in refused(lambda _: span_terms.main(), None, capsys)


def test_bench_constraints_names_a_pipeline_of_fewer_than_four_labels(trained_nlp, tmp_path,
                                                                      monkeypatch):
    """Its rules name four labels: a pipeline of three failed to unpack them (a traceback)."""
    bench_constraints = load("bench_constraints")
    trained_nlp.to_disk(tmp_path / "model")
    DocBin(docs=[trained_nlp.make_doc("Anna flew to Rome .")]).to_disk(tmp_path / "test.spacy")
    monkeypatch.setattr(sys, "argv", ["bench_constraints", "--model", f"{tmp_path}/model",
                                      "--data", f"{tmp_path}/test.spacy", "--quick",
                                      "--output", f"{tmp_path}/out/c.json"])
    with pytest.raises(SystemExit, match="rules need 4 entity labels, fsemicrf_ner has 3"):
        bench_constraints.main()
    assert not (tmp_path / "out").exists()


def test_partial_annotation_writes_the_skipped_sentences_unknown_and_outside(tmp_path, capsys):
    """The two corpora differ exactly in the skipped sentences: without annotation in one,
    annotated O in the other; the other sentences keep their entities."""
    script = load("partial_annotation")
    nlp = spacy.blank("en")
    texts = [("Anna met Bob in Rome . Then Carl left .", ["B-PER", "O", "B-PER", "O", "B-LOC",
                                                      "O", "O", "B-PER", "O", "O"])] * 6
    db = DocBin()
    for text, ents in texts:
        words = text.split()
        db.add(Doc(nlp.vocab, words=words, ents=ents,
                   sent_starts=[i in (0, 6) for i in range(len(words))]))
    db.to_disk(tmp_path / "train.spacy")
    script.main(["--train", str(tmp_path / "train.spacy"), "--output", str(tmp_path / "out"),
                 "--fraction", "0.5", "--seed", "1"])
    unknown = list(DocBin().from_disk(tmp_path / "out/unknown.spacy").get_docs(nlp.vocab))
    outside = list(DocBin().from_disk(tmp_path / "out/outside.spacy").get_docs(nlp.vocab))
    skipped = 0
    for u, o in zip(unknown, outside):
        for su, so in zip(u.sents, o.sents):
            iob_u = [t.ent_iob_ for t in su]
            if iob_u == [""] * len(su):  # skipped: annotated O in the other corpus
                skipped += 1
                assert [t.ent_iob_ for t in so] == ["O"] * len(so)
            else:
                assert [(t.ent_iob_, t.ent_type_) for t in su] == [
                    (t.ent_iob_, t.ent_type_) for t in so]
    kept = sum(len(d.ents) for d in unknown)
    assert 0 < skipped < 12 and 0 < kept < 24
    assert capsys.readouterr().out.startswith(f"6 documents, 24 gold entities; {24 - kept} of")
    for fraction in ("-0.1", "1.5"):
        with pytest.raises(SystemExit):
            script.main(["--train", str(tmp_path / "train.spacy"), "--output", "x",
                         "--fraction", fraction])


def test_incorrect_spans_marks_the_wrong_suggestions_of_unannotated_sentences(
    trained_nlp, tmp_path, capsys
):
    """The pipeline's entities in the documents without annotation that are not gold entities
    with their label go to doc.spans["incorrect_spans"]; an annotated document gets none, and
    the annotation is as it was."""
    from .conftest import make_examples

    script = load("incorrect_spans")
    trained_nlp.to_disk(tmp_path / "model")
    refs = [eg.reference for eg in make_examples(trained_nlp)]
    gold = [Doc(trained_nlp.vocab, words=[t.text for t in d], spaces=[bool(t.whitespace_)
                                                                      for t in d]) for d in refs]
    for doc, ref in zip(gold, refs):  # the gold of the first entity of each doc has no label
        doc.ents = [e for e in ref.ents][1:]  # ... there: its suggestion is wrong
    partial = [refs[0]] + [Doc(trained_nlp.vocab, words=[t.text for t in d],
                               spaces=[bool(t.whitespace_) for t in d]) for d in refs[1:]]
    DocBin(docs=gold).to_disk(tmp_path / "gold.spacy")
    DocBin(docs=partial).to_disk(tmp_path / "partial.spacy")
    script.main(["--corpus", str(tmp_path / "partial.spacy"), "--gold",
                 str(tmp_path / "gold.spacy"), "--model", str(tmp_path / "model"),
                 "--output", str(tmp_path / "out.spacy")])
    out = list(DocBin().from_disk(tmp_path / "out.spacy").get_docs(trained_nlp.vocab))
    predicted = [trained_nlp(Doc(trained_nlp.vocab, words=[t.text for t in d],
                                 spaces=[bool(t.whitespace_) for t in d])) for d in refs]
    right = wrong = 0
    for i, (doc, pred, g) in enumerate(zip(out, predicted, gold)):
        assert [t.ent_iob for t in doc] == [t.ent_iob for t in partial[i]]
        expected = [] if i == 0 else [
            (e.start, e.end, e.label_) for e in pred.ents
            if (e.start, e.end, e.label_) not in {(x.start, x.end, x.label_) for x in g.ents}]
        assert [(s.start, s.end, s.label_) for s in doc.spans["incorrect_spans"]] == expected
        if i:
            wrong += len(expected)
            right += len(pred.ents) - len(expected)
    assert wrong > 0 and right > 0
    assert f"suggested {right + wrong} entities, {right} right and {wrong} wrong" in (
        capsys.readouterr().out)
    with pytest.raises(SystemExit):
        script.main(["--corpus", str(tmp_path / "none.spacy"), "--gold", "x", "--model", "y",
                     "--output", "z"])


def test_compiled_scorer_refuses_a_round_count_below_one(capsys):
    compiled_scorer = load("compiled_scorer")
    err = refused(compiled_scorer.main, ["--rounds", "0"], capsys)
    assert "argument --rounds: must be at least 1, got 0" in err
