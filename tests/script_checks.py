"""Shared by the tests of the benchmark and project scripts' command lines: stand-in files
that pass the scripts' checks of their paths, and the check that a command line is refused
with argparse's one-line error."""
from pathlib import Path

import pytest
import spacy
from spacy.tokens import Doc, DocBin


def stand_in_files(path: Path, monkeypatch) -> Path:
    """``path`` with a ``model`` directory holding a config.cfg (a pipeline as far as the checks
    go) and ``test.spacy``, three documents of four tokens; ``spacy.load`` fails the test, so
    nothing may load."""
    (path / "model").mkdir()
    (path / "model" / "config.cfg").write_text("")
    vocab = spacy.blank("en").vocab
    docs = [Doc(vocab, words=["a", "b", "c", "d"]) for _ in range(3)]
    DocBin(docs=docs).to_disk(path / "test.spacy")
    monkeypatch.setattr(spacy, "load", lambda *a, **k: pytest.fail("nothing loads"))
    return path


def refused(main, argv, capsys) -> str:
    """argparse's error output of ``main(argv)``, which must exit with status 2, no traceback."""
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "Traceback" not in err
    return err
