"""scripts/package.py: the wheels' versions name the spacy-fsemicrf source and the pipeline's
files, so that pip replaces installed wheels of an earlier build (it keeps a package whose
version equals the wheel's)."""
import importlib.util
import json
import re
import zipfile
from pathlib import Path

import pytest

import spacy_fsemicrf

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("package_script", ROOT / "scripts" / "package.py")
package = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(package)


def make_source(root: Path, body: str) -> Path:
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "__init__.py").write_text(f'"""Doc."""\n__version__ = "0.1.0"\n{body}\n')
    (root / "setup.cfg").write_text("[metadata]\nname = pkg\n")
    return root


def test_the_version_label_changes_with_the_source_and_only_with_it(tmp_path):
    a = make_source(tmp_path / "a", "X = 1")
    same = make_source(tmp_path / "same", "X = 1")
    other = make_source(tmp_path / "other", "X = 2")
    assert package.source_digest(a) == package.source_digest(same) != package.source_digest(other)
    (same / "pkg" / "extra.py").write_text("")
    assert package.source_digest(same) != package.source_digest(a)

    version = package.label_version(a / "pkg" / "__init__.py", package.source_digest(a))
    assert re.fullmatch(r"0\.1\.0\+src\.[0-9a-f]{12}", version)
    text = (a / "pkg" / "__init__.py").read_text()
    assert f'__version__ = "{version}"\n' in text and text.endswith("X = 1\n")


@pytest.mark.slow
def test_the_package_wheel_carries_the_labelled_version(tmp_path):
    wheel = package.build_package_wheel(tmp_path)
    version = spacy_fsemicrf.__version__
    pattern = rf"spacy_fsemicrf-{re.escape(version)}\+src\.[0-9a-f]{{12}}-py3-none-any\.whl"
    assert re.fullmatch(pattern, wheel.name)
    with zipfile.ZipFile(wheel) as zf:
        init = zf.read("spacy_fsemicrf/__init__.py").decode("utf8")
    assert wheel.name.split("-")[1] in init


def test_a_name_spacy_package_refuses_is_a_usage_error_before_building(tmp_path, capsys):
    """``--name quick-crf`` built nothing and ended in a CalledProcessError traceback after
    spaCy's own message."""
    with pytest.raises(SystemExit) as exit_info:
        package.main([str(tmp_path), str(tmp_path / "out"), "--name", "quick-crf",
                      "--version", "0.1.0"])
    assert exit_info.value.code == 2 and "say 'quick_crf'" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_the_model_wheel_requires_public_versions(tmp_path, monkeypatch):
    """``spacy package`` ranges spacy-fsemicrf from its installed version: with a wheel of this
    script installed (``0.1.0+src.<digest>``) that range, ``>=0.1.0+src.<digest>,<0.2.0``, is
    one setuptools and pip refuse, and the model wheel failed to build. The script gives it
    the requirements on public versions."""
    import spacy
    import spacy.util
    from packaging.requirements import Requirement
    from spacy.cli.package import get_meta

    try:
        from .conftest import make_examples, model_config
    except ImportError:  # pragma: no cover - tests run as a plain directory
        from conftest import make_examples, model_config
    nlp = spacy.blank("en")
    nlp.add_pipe("fsemicrf_ner", config={"model": model_config()})
    nlp.initialize(lambda: make_examples(nlp))
    nlp.to_disk(tmp_path / "model")
    installed = spacy.util.get_package_version
    labelled = f"{spacy_fsemicrf.__version__}+src.1a2b3c4d5e6f"
    monkeypatch.setattr(spacy.util, "get_package_version", lambda name: labelled
                        if name == "spacy-fsemicrf" else installed(name))
    metas = []

    def fake_run(cmd):  # spacy package: its meta (requirements included), a wheel
        given = Path(cmd[cmd.index("--meta-path") + 1]) if "--meta-path" in cmd else None
        metas.append(get_meta(cmd[4], json.loads((given or Path(cmd[4]) / "meta.json")
                                                 .read_text())))
        dist = Path(cmd[5]) / "en_small-0.1.0" / "dist"
        dist.mkdir(parents=True)
        (dist / "en_small-0.1.0-py3-none-any.whl").write_bytes(b"")

    monkeypatch.setattr(package, "run", fake_run)
    (tmp_path / "out").mkdir()
    package.build_model_wheel(tmp_path / "model", tmp_path / "out", "small", "0.1.0")
    (meta,) = metas
    public = spacy_fsemicrf.__version__
    assert "spacy-fsemicrf" in {Requirement(r).name for r in meta["requirements"]}
    for requirement in map(Requirement, meta["requirements"]):
        assert "+" not in str(requirement.specifier)
        if requirement.name == "spacy-fsemicrf":
            assert requirement.specifier.contains(public)
            assert requirement.specifier.contains(labelled)


@pytest.mark.parametrize("name, suggestion", [("quick_", "quick"), ("_quick", "quick"),
                                              ("modèle", "mod_le"), ("1model", "model")])
def test_names_spacy_package_refuses_as_not_permitted_are_usage_errors(tmp_path, capsys, name,
                                                                       suggestion):
    """Identifiers, which spaCy refuses as package names (they must start and end with an ASCII
    letter or digit): the first step failed after spaCy's own message."""
    with pytest.raises(SystemExit) as exit_info:
        package.main([str(tmp_path), str(tmp_path / "out"), "--name", name, "--version", "0.1"])
    assert exit_info.value.code == 2 and f"say {suggestion!r}" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("name", ["quick_crf", "q", "Quick2", "a_b_c"])
def test_names_spacy_package_takes_pass_the_check(name):
    assert package.parse_args(["m", "o", "--name", name, "--version", "0.1"]).name == name


def package_version(model_dir: Path, out: Path, monkeypatch) -> str:
    """The version build_model_wheel gives spacy package for ``model_dir`` (nothing built)."""
    versions = []

    def fake_run(cmd: list) -> None:
        """spacy package: the version it was given, an empty wheel of that version."""
        versions.append(cmd[cmd.index("--version") + 1])
        dist = Path(cmd[5]) / "pkg" / "dist"
        dist.mkdir(parents=True)
        (dist / f"en_small-{versions[-1]}-py3-none-any.whl").write_bytes(b"")

    monkeypatch.setattr(package, "run", fake_run)
    monkeypatch.setattr(package, "model_meta", lambda path: json.loads(
        (path / "meta.json").read_text()))
    out.mkdir(exist_ok=True)
    wheel = package.build_model_wheel(model_dir, out, "small", "0.1.0")
    assert wheel.name == f"en_small-{versions[-1]}-py3-none-any.whl" and wheel.parent == out
    return versions[-1]


def make_model(root: Path, weights: bytes) -> Path:
    """A pipeline directory as build_model_wheel reads it: meta.json and one weights file."""
    (root / "ner").mkdir(parents=True)
    (root / "meta.json").write_text('{"lang": "en", "name": "pipeline", "version": "0.0.0"}')
    (root / "ner" / "model").write_bytes(weights)
    return root


def test_the_model_wheel_version_names_the_pipeline(tmp_path, monkeypatch):
    """pip keeps an installed package whose version equals the wheel's: a retrained pipeline, or
    a transformer pipeline packaged under the name and version of a CNN one, left the earlier
    model installed ("already installed with the same version"). The version's local label is a
    digest of the pipeline's files, so another pipeline gets another version."""
    out = tmp_path / "out"
    first = package_version(make_model(tmp_path / "a", b"\x01"), out, monkeypatch)
    same = package_version(make_model(tmp_path / "same", b"\x01"), out, monkeypatch)
    other = package_version(make_model(tmp_path / "other", b"\x02"), out, monkeypatch)
    assert re.fullmatch(r"0\.1\.0\+model\.[0-9a-f]{12}", first)
    assert first == same != other
    assert [p.name for p in out.iterdir()] == [f"en_small-{other}-py3-none-any.whl"]


def test_a_given_local_label_is_kept_before_the_digest():
    assert package.model_version("1.2.0+gpu", "ab12") == "1.2.0+gpu.model.ab12"
    assert package.model_version("1.2.0", "ab12") == "1.2.0+model.ab12"


def test_an_output_dir_that_is_a_file_is_an_error_before_building(tmp_path, capsys, monkeypatch):
    """An OUTPUT_DIR that is a file failed with a FileExistsError traceback."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "meta.json").write_text('{"lang": "en"}')
    (tmp_path / "out").write_text("")
    monkeypatch.setattr(package, "run", lambda cmd: pytest.fail("nothing should be built"))
    code = package.main([str(model), str(tmp_path / "out"), "--name", "x", "--version", "0.1.0"])
    assert code == 1 and "cannot make the output directory" in capsys.readouterr().err
    assert (tmp_path / "out").read_text() == ""
