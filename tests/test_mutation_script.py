"""scripts/mutation.py: the mutmut settings each group's copy of the tree gets."""
import importlib.util
import json
import sys
from pathlib import Path

import pytest

from .script_checks import refused

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("mutation", ROOT / "scripts" / "mutation.py")
mutation = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("mutation", mutation)  # its dataclasses look their module up there
_spec.loader.exec_module(mutation)


def test_a_copy_without_some_test_files_keeps_the_group_s_other_settings(tmp_path):
    group = mutation.GROUPS["structured"]
    (tmp_path / "tests").mkdir()
    (tmp_path / group.tests[1]).write_text("")
    present = mutation.tests_present(group, tmp_path)
    assert present.tests == [group.tests[1]]
    assert (present.modules, present.deselect) == (group.modules, group.deselect)
    assert present.timeout_constant == group.timeout_constant == 10.0
    config = mutation.mutmut_config(present).splitlines()
    assert "timeout_constant = 10.0" in config and f"    {group.tests[0]}" not in config


def test_modules_replace_those_of_the_only_group_run_and_split_among_several():
    """``--modules`` mutates a module outside the group's globs when one group runs (e.g.
    calibration.py with the component's tests), and with several groups gives each the modules
    of its globs."""
    structured = mutation.GROUPS["structured"]
    component = mutation.GROUPS["component"]
    calibration = "spacy_fsemicrf/calibration.py"
    filtered = "spacy_fsemicrf/structured/filtered.py"
    assert mutation.modules_of(component, [calibration], 1) == [calibration]
    assert mutation.modules_of(structured, [filtered, calibration], 2) == [filtered]
    assert mutation.modules_of(component, [filtered], 2) == component.modules


def test_every_group_names_modules_and_test_files_that_exist():
    """A module glob that matches nothing or a misspelt test file would only shrink a run."""
    for name, group in mutation.GROUPS.items():
        for module in group.modules:
            assert list(ROOT.glob(module)), (name, module)
        for test in group.tests:
            assert (ROOT / test).is_file(), (name, test)
    assert set(mutation.DEFAULT_GROUPS) <= set(mutation.GROUPS)


@pytest.mark.parametrize("args, message", [
    (["--sample", "0"], "--sample: must be above 0 and at most 1, got 0"),
    (["--sample", "1.5"], "--sample: must be above 0 and at most 1, got 1.5"),
    (["--minutes", "0"], "--minutes: must be above 0 minutes, got 0"),
    (["--max-children", "0"], "--max-children: must be at least 1, got 0"),
    (["--output", "{tmp}/no_dir/mutation.md"], "must be a file in an existing folder"),
    (["--output", "{tmp}"], "must be a file in an existing folder"),
    (["--report-only"], "--report-only: no finished run of component in {tmp}/work"),
])
def test_options_that_would_waste_or_lose_a_run_are_refused(tmp_path, capsys, monkeypatch, args,
                                                            message):
    """Before: --sample 0 ran every mutant (mutmut run without names), above 1 failed after
    the copy, --minutes 0 stopped every group before its first mutant, --max-children 0 was
    mutmut's error, an --output in a missing folder failed once every group had run, and
    --report-only without runs was a traceback."""
    monkeypatch.setattr(mutation, "run_group", lambda *a, **k: pytest.fail("nothing runs"))
    argv = ["--workdir", str(tmp_path / "work"), "--output", str(tmp_path / "mutation.md")]
    argv += [a.format(tmp=tmp_path) for a in args]
    assert message.format(tmp=tmp_path) in refused(mutation.main, argv, capsys)


def test_a_sample_that_draws_no_mutant_runs_none(tmp_path, monkeypatch):
    """A fraction too small to draw one mutant of any module gave mutmut no names, and mutmut
    then ran every mutant."""
    monkeypatch.setattr(mutation, "export_tree", lambda dest, source: None)
    monkeypatch.setattr(mutation, "sample_mutants", lambda *a: [])
    monkeypatch.setattr(mutation.subprocess, "Popen", lambda *a, **k: pytest.fail("mutmut ran"))
    tree = mutation.run_group("support", mutation.GROUPS["support"], tmp_path, 1, "head",
                              sample=0.001)
    assert (tree / "mutmut.seconds").is_file()
    assert json.loads((tree / "mutation_group.json").read_text())["sample"] == 0.001
