"""The README's config reference gives the settings and defaults the code has.

Its component table lists every setting of the ``fsemicrf_ner`` factory with the factory's
default; its architectures table lists every setting of each head's default model block
(``DEFAULT_MODELS``, which the builders' parameters match and the shipped configs repeat),
"–" where a head has no such setting and "same" where it repeats the first head's default.
"""
import inspect
import json
import re
from pathlib import Path
from typing import Any, Dict, List

import pytest
from spacy.language import Language
from thinc.api import Config

from spacy_fsemicrf import DEFAULT_MODELS, architectures

ROOT = Path(__file__).resolve().parent.parent
BUILDERS = {
    "FilteredSemiCRF": architectures.build_filtered_semicrf,
    "SemiCRF": architectures.build_semicrf,
    "LinearCRF": architectures.build_linear_crf,
}
CONFIGS = sorted((ROOT / "configs").glob("*.cfg"))
NOT_A_SETTING = ("–", "always")  # no such setting; a part of the head that is not optional


def section(title: str) -> str:
    text = (ROOT / "README.md").read_text(encoding="utf8")
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, flags=re.M | re.S)
    assert match, f"the README has no section {title!r}"
    return match.group(1)


def tables(text: str) -> List[List[List[str]]]:
    """The Markdown tables of ``text``: their rows (header first, no separator), as cells."""
    found: List[List[List[str]]] = []
    previous = ""
    for line in text.splitlines():
        if line.startswith("|"):
            cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
            if not previous.startswith("|"):
                found.append([])
            if not all(re.fullmatch(r":?-+:?", cell) for cell in cells):
                found[-1].append(cells)
        previous = line
    return found


def value(cell: str) -> Any:
    """A cell's value: the JSON literal of a cell that is one piece of code or a number, else
    the text (of the code)."""
    code = re.fullmatch(r"`([^`]*)`", cell)
    text = code.group(1) if code else cell
    try:
        return json.loads(text)
    except ValueError:
        return text


def component_table() -> Dict[str, str]:
    first = tables(section("Config reference"))[0]
    assert first[0][:2] == ["setting", "default"]
    return {row[0].strip("`"): row[1] for row in first[1:]}


def architecture_table() -> Dict[str, Dict[str, str]]:
    """``{architecture: {setting: cell}}``."""
    second = tables(section("Config reference"))[1]
    header = second[0]
    archs = [name[: -len(".v1")] for name in header[1:-1]]
    assert sorted(archs) == sorted(DEFAULT_MODELS)
    return {arch: {row[0].strip("`"): row[1 + i] for row in second[1:]}
            for i, arch in enumerate(archs)}


def test_the_component_settings_and_defaults():
    defaults = Language.get_factory_meta("fsemicrf_ner").default_config
    documented = component_table()
    assert sorted(documented) == sorted(defaults)
    for name, cell in documented.items():
        if name == "model":
            model = defaults["model"]
            tok2vec = model["tok2vec"]
            for part in (model["@architectures"], tok2vec["@architectures"],
                         f"width {tok2vec['width']}", f"depth {tok2vec['depth']}"):
                assert part in cell, (name, part)
        elif name == "scorer":
            assert value(cell) == defaults["scorer"]["@scorers"]
        else:
            assert value(cell) == defaults[name], name


@pytest.mark.parametrize("arch", sorted(DEFAULT_MODELS))
def test_the_architecture_settings_and_defaults(arch):
    block = {k: v for k, v in DEFAULT_MODELS[arch].items() if k not in ("@architectures",
                                                                         "tok2vec")}
    parameters = [name for name in inspect.signature(BUILDERS[arch]).parameters
                  if name != "tok2vec"]
    assert sorted(block) == sorted(parameters)  # a block written by hand needs them all
    table = architecture_table()
    first = table["FilteredSemiCRF"]
    documented = {}
    for name, cell in table[arch].items():
        if cell in NOT_A_SETTING:
            continue
        documented[name] = value(first[name] if cell == "same" else cell)
    assert documented == block


@pytest.mark.parametrize("path", CONFIGS, ids=lambda path: path.name)
def test_the_shipped_configs_repeat_the_defaults(path):
    model = dict(Config().from_disk(path, interpolate=False)["components"]["fsemicrf_ner"]["model"])
    arch = model["@architectures"].split(".")[1]
    default = dict(DEFAULT_MODELS[arch])
    del model["tok2vec"], default["tok2vec"]  # a listener in the configs
    assert model == default
