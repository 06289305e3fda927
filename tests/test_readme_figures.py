"""Every figure the README quotes comes from a committed results file.

A *figure* is a number with a decimal point, or with a ``%`` or ``x`` suffix, in the README's
prose and tables. Not figures: code (fenced blocks and inline code), link targets, version
numbers (``2.13.0``, ``Thinc 8.3``), arXiv identifiers, and the settings of the config
reference section (defaults, checked against the code by tests/test_readme_settings.py).

A figure is found when a results file, a ``.md`` or ``.json`` under ``benchmarks/results/`` or
one that ``docs/results.md`` names, holds it: as written (``83.98``, ``1.16x``, ``+2.81``) in
a Markdown file, or as a JSON number that rounds to it (to the figure's decimals; a
percentage also as a fraction).
"""
import json
import re
import subprocess
from pathlib import Path
from typing import Iterator, List, NamedTuple, Set

ROOT = Path(__file__).resolve().parent.parent

NUMBER = re.compile(r"(?<![\w.])([+\-−]?)(\d+(?:\.\d+)?)(%|x\b)?(?![\w.]*\d)")
VERSION = re.compile(
    r"\b\d+\.\d+\.\d+\w*|"  # 2.13.0, 0.1.0
    r"\b(?:python|thinc|spacy|torch|pytorch|cuda|transformers|version|v)\s*\d+(?:\.\d+)+",
    re.IGNORECASE,
)
# arXiv identifiers (YYMM.NNNNN), also where a line break parts them from "arXiv"
ARXIV = re.compile(r"(?:arxiv:?\s*)?\b\d{4}\.\d{4,5}\b", re.IGNORECASE)
SETTINGS_SECTION = re.compile(r"config(uration)? reference|settings", re.IGNORECASE)


class Figure(NamedTuple):
    text: str  # as written, sign and suffix included
    value: float  # signed
    decimals: int
    percent: bool
    line: int


def prose(markdown: str) -> Iterator[tuple]:
    """``(line number, text)`` of the README outside code, link targets and settings sections."""
    in_code = skip_section = False
    for number, line in enumerate(markdown.splitlines(), 1):
        if line.lstrip().startswith("```"):
            in_code = not in_code
            continue
        if in_code:
            continue
        if line.startswith("#"):
            skip_section = bool(SETTINGS_SECTION.search(line))
            continue
        if skip_section:
            continue
        line = re.sub(r"`[^`]*`", " ", line)  # inline code
        line = re.sub(r"\]\([^)]*\)", "] ", line)  # link targets
        line = re.sub(r"https?://\S+", " ", line)
        line = ARXIV.sub(" ", VERSION.sub(" ", line))
        yield number, line


def figures(markdown: str) -> List[Figure]:
    """The figures of a Markdown text (see the module docstring)."""
    out = []
    for number, line in prose(markdown):
        for match in NUMBER.finditer(line):
            sign, digits, suffix = match.groups()
            if "." not in digits and not suffix:
                continue  # a count, a year, a setting: not a figure
            decimals = len(digits.split(".")[1]) if "." in digits else 0
            value = float(digits) * (-1 if sign in "-−" and sign else 1)
            out.append(Figure(match.group(0), value, decimals, suffix == "%", number))
    return out


def results_files() -> List[Path]:
    """The committed results files: ``benchmarks/results/*.{md,json}`` and the ``.md`` and
    ``.json`` files that ``docs/results.md`` names."""
    try:
        tracked = set(subprocess.run(
            ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.split())
    except (OSError, subprocess.CalledProcessError):  # not a git checkout: what is there
        tracked = None
    named = re.findall(r"[\w./-]+\.(?:md|json)", (ROOT / "docs" / "results.md").read_text())
    candidates = {str(p.relative_to(ROOT)) for p in (ROOT / "benchmarks" / "results").glob("*")
                  if p.suffix in (".md", ".json")}
    candidates |= {name for name in named if (ROOT / name).is_file()}
    return [ROOT / name for name in sorted(candidates) if tracked is None or name in tracked]


def json_numbers(value) -> Iterator[float]:
    if isinstance(value, bool):
        return
    if isinstance(value, (int, float)):
        yield float(value)
    elif isinstance(value, dict):
        for item in value.values():
            yield from json_numbers(item)
    elif isinstance(value, list):
        for item in value:
            yield from json_numbers(item)


def found(figure: Figure, markdown_numbers: Set[str], numbers: Set[float]) -> bool:
    unsigned = figure.text.lstrip("+−-")
    written = {figure.text.replace("−", "-"), unsigned, unsigned.rstrip("%x")}
    if figure.value < 0:
        written = {w if w.startswith("-") else "-" + w for w in written}
    if written & markdown_numbers:
        return True
    targets = [figure.value] + ([figure.value / 100] if figure.percent else [])
    decimals = [figure.decimals] + ([figure.decimals + 2] if figure.percent else [])
    return any(
        round(n, d) == round(t, d) for t, d in zip(targets, decimals) for n in numbers
    )


def test_every_readme_figure_is_in_a_results_file():
    files = results_files()
    assert any(f.suffix == ".md" for f in files) and any(f.suffix == ".json" for f in files)
    markdown_numbers, numbers = set(), set()
    for path in files:
        text = path.read_text()
        if path.suffix == ".md":
            markdown_numbers |= {m.group(0).replace("−", "-") for m in NUMBER.finditer(text)}
            markdown_numbers |= {m.group(2) for m in NUMBER.finditer(text)}
            markdown_numbers |= {m.group(1) + m.group(2) for m in NUMBER.finditer(text)}
        else:
            numbers |= set(json_numbers(json.loads(text)))
    readme = figures((ROOT / "README.md").read_text())
    assert readme, "the README quotes no figure: is the extraction broken?"
    missing = [f"line {f.line}: {f.text}" for f in readme if not found(f, markdown_numbers, numbers)]
    assert not missing, "README figures in no results file: " + ", ".join(missing)


def test_figure_extraction():
    text = "\n".join([
        "F1 **83.98 ± 0.17** (8), 1.16x faster, 12.5% fewer, +2.81 and -0.65.",
        "Install torch 2.13.0 or Python 3.11; Thinc 8.3's shim; arXiv 2311.18028, or",
        "2311.18028 alone.",
        "Set `filter_margin = 0.5` [link](https://example.org/v1.2/3.4) for 10 seeds in 2023.",
        "```bash",
        "pip install spacy==3.7.5  # 0.99",
        "```",
        "## Config reference",
        "| `null_weight` | 0.75 |",
        "## Results",
        "| pipeline | 0.62x |",
    ])
    got = [(f.text, f.value, f.decimals, f.percent, f.line) for f in figures(text)]
    assert got == [
        ("83.98", 83.98, 2, False, 1), ("0.17", 0.17, 2, False, 1), ("1.16x", 1.16, 2, False, 1),
        ("12.5%", 12.5, 1, True, 1), ("+2.81", 2.81, 2, False, 1), ("-0.65", -0.65, 2, False, 1),
        ("0.62x", 0.62, 2, False, 11),
    ]
    figure = figures("a 12.5% gain")[0]
    assert found(figure, set(), {0.1251})  # a fraction in a JSON file
    assert not found(figure, set(), {0.1349, 12.4})
    assert found(figures("-0.65 below")[0], {"-0.65"}, set())
    assert not found(figures("-0.65 below")[0], set(), {0.65})
