"""scripts/mutation.py: the mutmut settings each group's copy of the tree gets."""
import importlib.util
import sys
from pathlib import Path

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
