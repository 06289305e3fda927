"""Write the wheels a deployment machine needs into OUTPUT_DIR: the model and spacy-fsemicrf.

    python scripts/package.py MODEL_DIR OUTPUT_DIR --name NAME --version VERSION

``spacy package`` builds the model wheel ``<lang>_<NAME>-<VERSION>+model.<digest>-*.whl``, which
requires ``spacy-fsemicrf`` (the package that provides the ``fsemicrf_ner`` factory). That
package is on no index, so its wheel is built from this repository and written beside the model
wheel: ``pip install OUTPUT_DIR/*.whl`` then installs both (and fetches spaCy and the other
public dependencies from the package index; install torch first, the build you want). A
transformer pipeline's wheel holds the encoder's weights: it needs no model download.

Older wheels of the same two packages in OUTPUT_DIR are removed first, because pip refuses two
versions of one package in a single install command. Both wheels' versions carry a digest as a
local label: of the pipeline's files (``0.1.0+model.1a2b3c4d5e6f``) and of the spacy-fsemicrf
source (``0.1.0+src.1a2b3c4d5e6f``). pip keeps an installed package whose version equals the
wheel's, so without them a machine that has the wheels of an earlier build (another training
run, or another pipeline under the same name) would keep running that build's model or code.
"""
import argparse
import hashlib
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import List

import srsly

REPO = Path(__file__).resolve().parent.parent
# What the spacy-fsemicrf wheel is built from (setup.cfg names the package data).
SOURCE_FILES = ["setup.cfg", "pyproject.toml", "README.md", "LICENSE"]
SOURCE_PACKAGE = "spacy_fsemicrf"


def parse_args(argv: List[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model_dir", type=Path, help="a trained pipeline directory (model-best)")
    parser.add_argument("output_dir", type=Path, help="where the two wheels are written")
    parser.add_argument("--name", required=True, help="package name without the language prefix")
    parser.add_argument("--version", required=True, help="version of the model package (a digest "
                        "of the pipeline's files is added as a local label)")
    args = parser.parse_args(argv)
    # spaCy's rules for a package name (an identifier, and a name that starts and ends with a
    # letter or digit), checked before building
    from spacy.cli.package import _is_permitted_package_name  # (spacy package's own check)

    if not (args.name.isidentifier() and _is_permitted_package_name(args.name)):
        suggestion = re.sub(r"^[\d_]+|_+$", "", re.sub(r"\W", "_", args.name, flags=re.A))
        parser.error(f"--name {args.name!r}: ASCII letters, digits and underscores only, "
                     f"starting with a letter and not ending with an underscore, as spacy "
                     f"package requires" + (f" (say {suggestion!r})" if suggestion else ""))
    return args


def build_model_wheel(model_dir: Path, output_dir: Path, name: str, version: str) -> Path:
    """``spacy package --build wheel`` in a scratch directory, its version labelled with a digest
    of the pipeline's files (:func:`model_version`); the wheel moved to output_dir."""
    lang = srsly.read_json(model_dir / "meta.json")["lang"]
    remove_wheels(output_dir, f"{lang}_{name}")
    with tempfile.TemporaryDirectory() as scratch:
        meta = Path(scratch) / "meta.json"
        srsly.write_json(meta, model_meta(model_dir))
        run([sys.executable, "-m", "spacy", "package", str(model_dir), scratch,
             "--meta-path", str(meta), "--name", name,
             "--version", model_version(version, source_digest(model_dir)),
             "--build", "wheel", "--force"])
        (wheel,) = Path(scratch).glob(f"*/dist/{lang}_{name}-*.whl")
        return Path(shutil.move(str(wheel), output_dir / wheel.name))


def model_version(version: str, digest: str) -> str:
    """``version`` with the local label ``model.<digest>`` (appended to a label it has)."""
    return f"{version}{'.' if '+' in version else '+'}model.{digest}"


def model_meta(model_dir: Path) -> dict:
    """The pipeline's meta.json with the requirements ``spacy package`` would add, on public
    versions: it ranges a package from its installed version, and the local label of a
    spacy-fsemicrf wheel of :func:`build_package_wheel` installed here made a range that
    setuptools and pip refuse (``spacy-fsemicrf>=0.1.0+src.1a2b3c4d5e6f,<0.2.0``)."""
    from spacy.cli.package import get_third_party_dependencies
    from spacy.util import load_model_from_path, split_requirement

    meta = srsly.read_json(model_dir / "meta.json")
    given = list(meta.get("requirements", []))
    config = load_model_from_path(model_dir).config  # (as spacy package: registers its code)
    found = get_third_party_dependencies(config, exclude=[split_requirement(r)[0] for r in given])
    meta["requirements"] = given + [re.sub(r"\+[0-9A-Za-z.]+", "", r) for r in found]
    return meta


def build_package_wheel(output_dir: Path) -> Path:
    """The spacy-fsemicrf wheel, built from a clean copy of the source: setuptools' in-tree
    ``build/`` directory would keep modules deleted since the last build."""
    remove_wheels(output_dir, "spacy_fsemicrf")
    with tempfile.TemporaryDirectory() as scratch:
        src = Path(scratch) / "src"
        src.mkdir()
        for name in SOURCE_FILES:
            shutil.copy2(REPO / name, src / name)
        shutil.copytree(REPO / SOURCE_PACKAGE, src / SOURCE_PACKAGE,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        label_version(src / SOURCE_PACKAGE / "__init__.py", source_digest(src))
        dist = Path(scratch) / "dist"
        run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
             "--quiet", "--wheel-dir", str(dist), str(src)])
        (wheel,) = dist.glob("spacy_fsemicrf-*.whl")
        return Path(shutil.move(str(wheel), output_dir / wheel.name))


def source_digest(src: Path) -> str:
    """A digest of every file under ``src`` (names and content)."""
    digest = hashlib.sha256()
    for path in sorted(p for p in src.rglob("*") if p.is_file()):
        digest.update(path.relative_to(src).as_posix().encode("utf8") + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()[:12]


def label_version(init: Path, digest: str) -> str:
    """Give ``__version__`` in ``init`` the local label ``src.<digest>``; the new version."""
    text = init.read_text(encoding="utf8")
    match = re.search(r'^__version__ = "([^"+]+)"$', text, flags=re.M)
    if match is None:
        raise ValueError(f"no __version__ = \"X.Y.Z\" line in {init}")
    version = f"{match.group(1)}+src.{digest}"
    init.write_text(text[:match.start(1)] + version + text[match.end(1):], encoding="utf8")
    return version


def remove_wheels(output_dir: Path, dist_name: str) -> None:
    for old in output_dir.glob(f"{dist_name}-*.whl"):
        old.unlink()


def run(cmd: List[str]) -> None:
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def main(argv: List[str]) -> int:
    args = parse_args(argv)
    if not (args.model_dir / "meta.json").is_file():
        print(f"{args.model_dir} is not a trained pipeline directory (no meta.json)",
              file=sys.stderr)
        return 1
    try:
        args.output_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:  # a file of that name, a parent that is a file, no permission
        print(f"cannot make the output directory {args.output_dir}: {err}", file=sys.stderr)
        return 1
    try:
        wheels = [
            build_model_wheel(args.model_dir, args.output_dir, args.name, args.version),
            build_package_wheel(args.output_dir),
        ]
    except subprocess.CalledProcessError as err:  # its output says why
        print(f"failed: {' '.join(err.cmd)} (exit status {err.returncode})", file=sys.stderr)
        return 1
    for wheel in wheels:
        print(f"wrote {wheel}")
    print(f"install on the deployment machine (torch first): pip install {args.output_dir}/*.whl")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
