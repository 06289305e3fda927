"""Mutation testing of the structured layer and the pipeline component, with mutmut 3.

    python scripts/mutation.py --output docs/mutation.md

mutmut rewrites every function of the mutated modules into many small variants (an operator
swapped, a constant changed, an argument dropped, ...) and runs, for each variant, the tests
that call that function (it records which ones once, on the clean code). A variant that no
test notices *survives*: either the tests miss a behaviour, or the change makes no difference
(an *equivalent* mutant, listed with its reason in ``scripts/mutation_equivalent.json``).

Each group of modules runs in its own copy of the committed tree (``git archive HEAD``) under
``--workdir``, never in the working tree, since mutmut writes a ``mutants/`` copy of the code
next to the sources and other work may be running there. Each group has its test files; tests
whose run time would dominate every mutant (long trainings, subprocesses) are deselected there.
Hypothesis runs derandomized, without its example database and without shrinking, so that a
run gives the same verdicts every time and a failing example costs no shrinking time.

The report (``--output``): killed / survived / timeout / equivalent per module, the mutation
score (killed and timed-out over the non-equivalent mutants), every survivor with its change,
and the functions mutmut does not mutate (decorated ones, e.g. ``@torch.no_grad()`` wrappers
and properties).
"""
from __future__ import annotations

import argparse
import ast
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from fnmatch import fnmatch
from io import BytesIO
from pathlib import Path
from typing import Dict, List, Optional, Tuple

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
from arguments import count, duration  # noqa: E402

EQUIVALENT_FILE = ROOT / "scripts" / "mutation_equivalent.json"


@dataclass
class Group:
    """Modules mutated together, with the test files that may kill their mutants."""

    modules: List[str]
    tests: List[str]
    deselect: List[str] = field(default_factory=list)  # ``-k`` expressions left out
    # seconds added to a mutant's estimated test time before doubling it into its time limit:
    # mutmut's estimate counts test calls only, not fixtures (such as pipelines trained)
    timeout_constant: float = 30.0


GROUPS: Dict[str, Group] = {
    "structured": Group(
        modules=["spacy_fsemicrf/structured/*.py"],
        tests=[
            "tests/test_filtered.py",
            "tests/test_semicrf.py",
            "tests/test_linear_crf.py",
            "tests/test_spans.py",
            "tests/test_heads.py",
            "tests/test_head_distributions.py",
            "tests/test_calibration.py",
            "tests/test_constraints.py",
            "tests/test_nbest.py",
            "tests/test_null_tokens.py",
            "tests/test_mean_field.py",
            "tests/test_predict_paths.py",
            "tests/test_sentence_boundaries.py",
            "tests/test_partial_annotation.py",
            "tests/test_growth.py",  # the heads' add_labels and growth.py
        ],
        # the toy-task trainings and 40 s of long-document gradients would dominate every
        # head mutant (the losses and decodes are checked exactly by test_head_distributions),
        # a subprocess cannot see the mutants, and the tests of whole pipelines (training,
        # saving, the calibration fit) are the component's: every mutant that survives the
        # structured tests would sit through them
        deselect=["learns_the_toy_task", "two_threads", "works_without_spacy",
                  "learns_saves_and_loads", "scores_are_calibrated", "fit_uses_only",
                  "threshold_drops", "settings_round_trip", "pipeline_without_a_map",
                  "training_entities_are_recorded", "map_by_novelty_scores", "callback",
                  "command_calibrates", "benchmark_measures", "left_out_of_the_fit",
                  "saves_nothing", "learns_from_partly_annotated"],
        timeout_constant=10.0,  # no pipeline is trained in these tests
    ),
    "component": Group(
        modules=["spacy_fsemicrf/component.py"],
        tests=[
            "tests/test_component.py",
            "tests/test_component_units.py",
            "tests/test_architectures.py",
            "tests/test_calibration.py",
            "tests/test_component_constraints.py",
            "tests/test_nbest.py",
            "tests/test_predict_paths.py",
            "tests/test_sentence_boundaries.py",
            "tests/test_partial_annotation.py",
            "tests/test_augment.py",  # initialize leaves made-up names out of the seen ones
            "tests/test_null_tokens.py",  # a head without constrained decoding
            "tests/test_growth.py",  # add_label on a trained component
        ],
        # a subprocess pipeline (it imports the installed package, not the mutants)
        deselect=["two_processes"],
    ),
    "support": Group(
        # what the component saves and loads its head with, the constraints of each document,
        # the training augmenter (its factory is decorated: only its helpers are mutated) and
        # which training tokens have annotation
        modules=[
            "spacy_fsemicrf/serialize.py",
            "spacy_fsemicrf/doc_constraints.py",
            "spacy_fsemicrf/augment.py",
            "spacy_fsemicrf/partial.py",
        ],
        tests=[
            "tests/test_architectures.py",  # serialize_head and deserialize_head directly
            "tests/test_component.py",
            "tests/test_component_units.py",
            "tests/test_component_constraints.py",
            "tests/test_null_tokens.py",  # a head without constrained decoding
            "tests/test_augment.py",
            "tests/test_calibration.py",
            "tests/test_nbest.py",
            "tests/test_predict_paths.py",
            "tests/test_sentence_boundaries.py",
            "tests/test_partial_annotation.py",
        ],
        deselect=["two_processes"],  # a subprocess pipeline, as in the component's
    ),
    "annotate": Group(
        # the driver's side runs in the test's process; a task runs in a worker process of a
        # LocalCluster, or in the test's process where a test calls it
        modules=[
            "spacy_fsemicrf/annotate/shards.py",
            "spacy_fsemicrf/annotate/inputs.py",
            "spacy_fsemicrf/annotate/engine.py",
        ],
        tests=["tests/test_annotate.py"],
        # the runs of the command in a subprocess, killed or interrupted mid-run, and a worker
        # killed mid-run: a minute each, for what the other runs of a cluster check too
        deselect=["interrupted_run", "ctrl_c_says", "killed_worker"],
    ),
}
"""Test files that are not in the tree are left out (the list names those of every module)."""
# what a run without --groups mutates (docs/mutation.md): the structured core and the component
DEFAULT_GROUPS = ["component", "structured"]

# What mutmut's exit codes mean (mutmut.stats.status_by_exit_code), folded into the report's
# columns. A timeout or a crash is a mutant the tests noticed.
STATUS = {1: "killed", 3: "killed", 0: "survived", 5: "no tests", 33: "no tests",
          36: "timeout", 24: "timeout", -24: "timeout", 152: "timeout", 255: "timeout",
          -11: "crashed", -9: "crashed", None: "not run"}

HYPOTHESIS_PROFILE = '''"""Pytest plugin for mutation runs (loaded with -p).

Hypothesis: same examples every run, no example database, no shrinking (a failure is all a
mutation run needs to know), at most MAX_EXAMPLES examples per test (a survivor runs every
test of its function, and the few tests with hundreds of brute-force examples were most of
what survivors cost). The objects loaded by collection are frozen out of the garbage
collector's way (gc.freeze), as they live as long as the process.

Cheapest test first: mutmut stops a mutant's run at its first failing test (-x) but hands
pytest the selected tests in no particular order, so a mutant the fastest test would catch
could first sit through a training fixture. The first run (mutmut's run on the clean code)
records what each test costs: its call plus the setup of each fixture it uses, by fixture
name (a fixture shared by many tests is paid by whichever runs first). Later runs sort by it.
"""
import gc
import json
import os
import sys
import time

import pytest
from hypothesis import Phase, settings

settings.register_profile(
    "mutation", derandomize=True, database=None,
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
)
settings.load_profile("mutation")
MAX_EXAMPLES = 200

COSTS = os.path.abspath("mutation_costs.json")  # in mutants/, where mutmut runs pytest
RUNS = os.path.abspath("mutation_runs.jsonl")  # one line per mutant: what its run cost
_calls, _fixtures = {}, {}
_started = 0.0
_warm = False


def pytest_configure(config):
    global _started
    _started = time.perf_counter()


def _known():
    """The recorded costs, read when needed: this module may be imported before they exist
    by a process that forks the runs."""
    if not os.path.exists(COSTS):
        return None
    with open(COSTS) as f:
        return json.load(f)


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef, request):
    start = time.perf_counter()
    yield
    name = fixturedef.argname
    _fixtures[name] = max(_fixtures.get(name, 0.0), time.perf_counter() - start)


def pytest_runtest_logreport(report):
    if report.when == "call":
        _calls[report.nodeid] = report.duration


def pytest_collection_finish():
    global _warm
    if not _warm and "spacy" in sys.modules:
        # spaCy reads its registries and language data on the first pipeline a process makes
        # (about 1.5 s): made here once, in the collection mutmut forks every mutant's run
        # from, instead of once per mutant
        import spacy
        spacy.blank("en")
        _warm = True
    # Everything loaded so far (torch, spaCy, the test modules) lives as long as the process:
    # out of the collector's way, a full collection during a test does not walk it again.
    gc.freeze()


def pytest_collection_modifyitems(items):
    for item in items:
        test = getattr(item, "obj", None)
        # a test's own @settings win over the profile; hypothesis reads them from the test at
        # each call
        own = getattr(test, "_hypothesis_internal_use_settings", None)
        if own is not None and own.max_examples > MAX_EXAMPLES:
            test._hypothesis_internal_use_settings = settings(own, max_examples=MAX_EXAMPLES)
    known = _known()
    if known is not None:
        calls, fixtures = known["calls"], known["fixtures"]
        cost = {item.nodeid: calls.get(item.nodeid, 60.0)
                + sum(fixtures.get(f, 0.0) for f in getattr(item, "fixturenames", ()))
                for item in items}
        items.sort(key=lambda item: cost[item.nodeid])  # stable: ties keep their order


def pytest_unconfigure():  # the end of the run: record the costs once, and this run's
    mutant = os.environ.get("MUTANT_UNDER_TEST")
    if mutant and mutant not in ("fail", "stats", "list_all_tests"):
        line = json.dumps({"mutant": mutant, "seconds": round(time.perf_counter() - _started, 3),
                           "tests": len(_calls)})
        with open(RUNS, "a") as f:  # one short append per process: lines do not interleave
            f.write(line + "\\n")
    if _calls and not os.path.exists(COSTS):
        tmp = COSTS + f".{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump({"calls": _calls, "fixtures": _fixtures}, f)
        os.replace(tmp, COSTS)
'''


def export_tree(dest: Path, source: str) -> None:
    """The committed tree (``git archive HEAD``), or with ``source == "worktree"`` the working
    tree's files (tracked and untracked, not ignored), into ``dest``."""
    if source == "head":
        archive = subprocess.run(
            ["git", "archive", "--format=tar", "HEAD"], cwd=ROOT, check=True, capture_output=True
        ).stdout
        with tarfile.open(fileobj=BytesIO(archive)) as tar:
            try:
                tar.extractall(dest, filter="data")
            except TypeError:  # Python without extraction filters (before 3.10.12 / 3.11.4)
                tar.extractall(dest)
        return
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, check=True, capture_output=True, text=True,
    ).stdout.split("\0")
    for name in filter(None, listed):
        if (ROOT / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dest / name)


def tests_present(group: Group, tree: Path) -> Group:
    """``group`` with only the test files that ``tree`` holds (a copy of an older commit may
    lack a newer one), every other setting kept."""
    return replace(group, tests=[t for t in group.tests if (tree / t).exists()])


def mutmut_config(group: Group) -> str:
    """The ``[mutmut]`` section of the copy's setup.cfg for ``group``."""
    # pytest's unraisable-exception plugin runs gc.collect() five times as each pytest run
    # ends, 0.34 of the 0.38 s a run of a few tests takes in a process that holds torch, spaCy
    # and the test modules: most of what a mutant the first test kills costs
    args = ["-p", "mutation_profile", "-p", "no:cacheprovider", "-p", "no:unraisableexception"]
    if group.deselect:
        args += ["-k", " and ".join(f"not {name}" for name in group.deselect)]
    # what the tests read besides the package and tests/ (mutmut runs them in mutants/)
    also_copy = ["mutation_profile.py", "configs", "scripts", "benchmarks"]
    lines = ["[mutmut]", "source_paths = spacy_fsemicrf", "also_copy ="]
    lines += [f"    {path}" for path in also_copy]
    lines += ["only_mutate ="] + [f"    {m}" for m in group.modules]
    lines += ["pytest_add_cli_args_test_selection ="] + [f"    {t}" for t in group.tests]
    lines += ["pytest_add_cli_args ="] + [f"    {a}" for a in args]
    # torch does not survive a fork of a process that has run it: fork from a clean server
    # CPU seconds per mutant: 4 x (the selected tests' call time + the group's constant)
    lines += ["process_isolation = forkserver", "timeout_multiplier = 2.0",
              f"timeout_constant = {group.timeout_constant}", ""]
    return "\n".join(lines)


GENERATE = """
import os
from mutmut.__main__ import create_mutants
from mutmut.utils.file_utils import copy_also_copy_files, copy_src_dir, setup_source_paths
os.makedirs("mutants", exist_ok=True)
copy_src_dir(); copy_also_copy_files(); setup_source_paths(); create_mutants(1)
"""


def sample_mutants(tree: Path, env: Dict[str, str], fraction: float, seed: int = 0) -> List[str]:
    """Generate the mutants (without running them) and draw ``fraction`` of each module's,
    the same draw for the same code."""
    subprocess.run([sys.executable, "-c", GENERATE], cwd=tree, env=env, check=True,
                   stdout=subprocess.DEVNULL)
    names = []
    for meta in sorted((tree / "mutants").rglob("*.py.meta")):
        keys = sorted(json.loads(meta.read_text())["exit_code_by_key"])
        rng = random.Random(f"{seed}:{meta.name}")
        names += rng.sample(keys, round(fraction * len(keys))) if keys else []
    return names


def run_group(
    name: str, group: Group, workdir: Path, max_children: int, source: str,
    minutes: Optional[float] = None, sample: Optional[float] = None,
) -> Path:
    """Copy the tree, configure mutmut and run it (on a random ``sample`` of each module's
    mutants, the same for the same code; stopped after ``minutes``, the mutants not reached by
    then reported as not run); returns the copy's directory."""
    tree = workdir / name
    if tree.exists():
        shutil.rmtree(tree)
    tree.mkdir(parents=True)
    export_tree(tree, source)
    group = tests_present(group, tree)
    with open(tree / "setup.cfg", "a") as cfg:
        cfg.write("\n" + mutmut_config(group))
    (tree / "mutation_profile.py").write_text(HYPOTHESIS_PROFILE)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    start = time.time()
    names = [] if sample is None else sample_mutants(tree, env, sample)
    (tree / "mutation_group.json").write_text(
        json.dumps({**group.__dict__, "workers": max_children, "sample": sample,
                    "command": " ".join(["python", "scripts/mutation.py", *sys.argv[1:]])}))
    if sample is not None and not names:  # mutmut run without names runs every mutant
        print(f"[mutation] {name}: --sample {sample} draws no mutant; none is run", flush=True)
        return _finish(tree, start)
    with open(tree / "mutmut.log", "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "mutmut", "run", "--max-children", str(max_children), *names],
            cwd=tree, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        try:
            proc.wait(timeout=None if minutes is None else 60 * minutes)
        except subprocess.TimeoutExpired:  # stop mutmut and its workers (their own group)
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait()
            (tree / "mutmut.stopped").write_text(f"stopped after {minutes} min\n")
            return _finish(tree, start)
        except BaseException:  # Ctrl-C or a kill of this script: take mutmut's group down too
            os.killpg(proc.pid, signal.SIGTERM)
            raise
    _finish(tree, start)
    if proc.returncode != 0:
        sys.exit(f"mutmut failed for {name} (exit {proc.returncode}); see {tree / 'mutmut.log'}")
    return tree


def _finish(tree: Path, start: float) -> Path:
    """Record the run's wall time."""
    (tree / "mutmut.seconds").write_text(f"{time.time() - start:.0f}\n")
    return tree


def _wall(tree: Path) -> int:
    """A finished run's wall time in seconds (recorded by :func:`_finish`)."""
    return int((tree / "mutmut.seconds").read_text().split()[0])


# ----------------------------------------------------------------------------- results


@dataclass
class Mutant:
    name: str
    module: str
    status: str
    removed: str  # the original line(s) the mutant changes
    added: str  # what it puts there
    reason: Optional[str] = None  # why it is equivalent, when it is


def changed_lines(diff: str) -> Tuple[str, str]:
    """The removed and added lines of a unified diff, stripped and joined."""
    body = [line for line in diff.splitlines() if not line.startswith(("---", "+++", "@@"))]
    removed = " / ".join(l[1:].strip() for l in body if l.startswith("-"))
    added = " / ".join(l[1:].strip() for l in body if l.startswith("+"))
    return removed, added


DEVICE_ONLY = "changes only the device a tensor is made on or moved to: the run is on CPU, " \
    "where that is the default (tests/test_cuda.py checks the GPU path on a GPU)"


def _without_devices(line: str) -> str:
    """``line`` with every device argument, ``.to(<device>)`` move and device assignment taken
    out (``None`` counts as a device here: ``.to(None)`` and ``device=None`` are no-ops)."""
    line = re.sub(r"^(\s*device) = .*$", r"\1 = D", line)
    line = re.sub(r"\.to\((?:[\w.]*device|None)\)", "", line)
    line = re.sub(r"\.to\((?:[\w.]*device|None),\s*", ".to(", line)
    line = re.sub(r",?\s*device=(?:[\w.]+(?:\([^()]*\))?)", "", line)
    return re.sub(r",\s*\)", ")", line).replace("(, ", "(")


def device_only(removed: str, added: str) -> bool:
    """Whether a mutant differs from the original only in device arguments."""
    return bool(removed) and _without_devices(removed) == _without_devices(added)


def load_equivalent() -> Dict[Tuple[str, str, str], str]:
    """Equivalent mutants keyed by ``(module, original line, mutated line)``: stable while the
    line stays as it is, whatever mutmut numbers the mutant."""
    entries = json.loads(EQUIVALENT_FILE.read_text()) if EQUIVALENT_FILE.exists() else []
    return {(e["module"], e["original"], e["mutant"]): e["reason"] for e in entries}


def collect(tree: Path) -> List[Mutant]:
    """Every mutant of a finished run, with its status and change."""
    sys.path.insert(0, str(tree))  # mutmut reads its files relative to the copy
    from mutmut.mutation.data import SourceFileMutationData
    from mutmut.mutation.diff_apply import get_diff_for_mutant

    equivalent = load_equivalent()
    mutants = []
    cwd = os.getcwd()
    os.chdir(tree)
    try:
        for meta in sorted(Path("mutants").rglob("*.py.meta")):
            path = str(meta.relative_to("mutants"))[: -len(".meta")]
            data = SourceFileMutationData(path=path)
            data.load()
            for key, code in sorted(data.exit_code_by_key.items(), key=lambda kv: _order(kv[0])):
                status = STATUS.get(code, "crashed")
                removed = added = ""
                if status in ("survived", "no tests"):
                    removed, added = changed_lines(get_diff_for_mutant(key, path=path))
                reason = equivalent.get((path, removed, added))
                if not reason and status == "survived" and device_only(removed, added):
                    reason = DEVICE_ONLY
                mutants.append(Mutant(key, path, "equivalent" if reason else status, removed, added, reason))
    finally:
        os.chdir(cwd)
        sys.path.remove(str(tree))
    return mutants


def _order(key: str) -> Tuple[str, int]:
    base, _, number = key.rpartition("__mutmut_")
    return base, int(number) if number.isdigit() else 0


def undecorated(module_glob: str, tree: Path) -> List[str]:
    """Functions mutmut 3 leaves alone in ``module_glob``: decorated ones (other than
    staticmethod and classmethod)."""
    out = []
    for path in sorted(tree.glob(module_glob)):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.decorator_list:
                names = [ast.unparse(d) for d in node.decorator_list]
                if names not in (["staticmethod"], ["classmethod"]):
                    short = ", ".join("@" + n.split("(")[0] for n in names)
                    out.append(f"`{path.relative_to(tree)}:{node.name}` ({short})")
    return out


COLUMNS = ["killed", "timeout", "crashed", "survived", "no tests", "equivalent", "not run"]


def score(counts: Counter) -> Tuple[int, float]:
    """``(non-equivalent mutants, share of them detected)``."""
    total = sum(counts[c] for c in COLUMNS if c not in ("equivalent", "not run"))
    detected = counts["killed"] + counts["timeout"] + counts["crashed"]
    return total, (detected / total if total else 1.0)


def report(results: Dict[str, Tuple[Path, List[Mutant]]]) -> str:
    lines = [
        "# Mutation testing",
        "",
        "What the test suite notices when the code is wrong: [mutmut](https://github.com/boxed/mutmut) 3 "
        "changes one thing at a time in `spacy_fsemicrf/structured/` and "
        "`spacy_fsemicrf/component.py` and runs the tests that reach the changed function.",
        "Produced by `python scripts/mutation.py --output docs/mutation.md` "
        "(`python -m spacy project run mutation`; not part of CI).",
        "",
        "*Score* = (killed + timeout + crashed) / (all - equivalent). A *survivor* is a change no "
        "test noticed; *no tests*: no selected test calls the function. Equivalent mutants "
        "(the change makes no observable difference) are listed in "
        "`scripts/mutation_equivalent.json`, each with its reason, except those that only "
        "change a device argument (`device=...`, `.to(device)`): the run is on CPU, where "
        "that is the default, so they count as equivalent here (`tests/test_cuda.py` covers "
        "the GPU path on a GPU machine).",
        "",
        "Every mutant of both groups (the tables count them) takes the two groups' run times "
        "below on two cores, even with each mutant's tests run cheapest first, most of it in the mutants "
        "that survive (they run every test of their function); `--minutes M` stops each group "
        "after M minutes (the mutants not reached, the slowest by mutmut's estimate, are *not run*), and "
        "`--sample` runs a fixed random fraction of each module's mutants instead; the score "
        "then estimates the module's.",
        "",
    ]
    total = sum(_wall(tree) for tree, _ in results.values())
    lines += [f"The groups below ran for {round(total / 60)} minutes in all.", ""]
    for name, (tree, mutants) in results.items():
        saved = json.loads((tree / "mutation_group.json").read_text())  # what the run used
        workers, sample = saved.pop("workers"), saved.pop("sample", None)
        command = saved.pop("command", None)
        group = Group(**saved)
        wall = _wall(tree)
        stopped = (tree / "mutmut.stopped").exists()
        lines += [f"## {name}", "",
                  f"Mutated: {', '.join('`' + m + '`' for m in group.modules)}. "
                  f"Tests: {', '.join('`' + t + '`' for t in group.tests)}"
                  + (f" (deselected: {', '.join(group.deselect)})" if group.deselect else "")
                  + f". Run time: {wall // 60} min with {workers} workers"
                  + (" (stopped at the time limit: the mutants not run are not in the score)."
                     if stopped else ".")
                  + (f" A random {100 * sample:.0f}% of each module's mutants was run (the "
                     "others are *not run*); the score estimates the whole module's."
                     if sample else "")
                  + (f" Command: `{command}`." if command else "")
                  + run_costs(tree, mutants), ""]
        lines += ["| module | mutants | " + " | ".join(COLUMNS) + " | score |",
                  "|---" * (len(COLUMNS) + 3) + "|"]
        by_module: Dict[str, Counter] = {}
        for m in mutants:
            by_module.setdefault(m.module, Counter())[m.status] += 1
        by_module = {k: v for k, v in by_module.items() if sum(v.values())}
        total = Counter()
        for module, counts in sorted(by_module.items()):
            total += counts
            lines.append(_row(f"`{module}`", counts))
        lines.append(_row("**all**", total))
        lines += ["", "### Survivors", ""]
        survivors = [m for m in mutants if m.status in ("survived", "no tests")]
        if not survivors:
            lines.append("None.")
        for m in survivors:
            lines.append(f"- `{m.name.split('.')[-1]}` ({m.status}): `{m.removed}` → `{m.added}`")
        lines += ["", "### Equivalent", ""]
        equivalent = [m for m in mutants if m.status == "equivalent"]
        if not equivalent:
            lines.append("None.")
        for m in equivalent:
            lines.append(f"- `{m.name.split('.')[-1]}`: `{m.removed}` → `{m.added}`: {m.reason}")
        lines += ["", "### Not mutated", "",
                  "mutmut 3 does not mutate decorated functions (their decorators run at import) "
                  "nor module-level constants:", ""]
        for module in group.modules:
            lines += [f"- {f}" for f in undecorated(module, tree)]
        lines.append("")
    return "\n".join(lines)


def run_costs(tree: Path, mutants: List[Mutant]) -> str:
    """A sentence on where a run's test time went: the time each mutant spent in pytest (from
    its configuration to its end, recorded by the plugin), summed for the mutants that
    survived and for the others."""
    path = tree / "mutants" / "mutation_runs.jsonl"
    if not path.exists():
        return ""
    seconds = {}
    for line in path.read_text().splitlines():
        run = json.loads(line)
        seconds[run["mutant"]] = run["seconds"]
    status = {m.name: m.status for m in mutants}
    by_kind: Dict[str, List[float]] = {"detected": [], "survived": []}
    for name, secs in seconds.items():
        kind = "survived" if status.get(name) in ("survived", "equivalent") else "detected"
        by_kind[kind].append(secs)
    detected, survived = sorted(by_kind["detected"]), by_kind["survived"]
    median = detected[len(detected) // 2] if detected else 0.0
    return (f" Time in pytest, summed over the workers: {sum(detected) / 60:.0f} min for the "
            f"{len(detected)} mutants the tests detected (median {median:.2f} s each), "
            f"{sum(survived) / 60:.0f} min for the {len(survived)} that survived (or "
            "are equivalent), which run every test of their function.")


def _row(label: str, counts: Counter) -> str:
    total, share = score(counts)
    cells = [str(sum(counts.values()))] + [str(counts[c]) for c in COLUMNS]
    return f"| {label} | " + " | ".join(cells) + f" | {100 * share:.1f}% |"


def modules_of(group: Group, modules: List[str], n_groups: int) -> List[str]:
    """The modules a run of ``group`` mutates given ``--modules``: all of them when it is the
    only group run (a module of no group's globs, such as one its tests cover, included), else
    those that match one of its globs, or its own modules when none does."""
    if n_groups == 1:
        return list(modules)
    return [m for m in modules if any(fnmatch(m, own) for own in group.modules)] or group.modules


def fraction(text: str) -> float:
    """A share of the mutants above 0 and at most 1."""
    value = float(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be above 0 and at most 1, got {text}")
    return value


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--output", type=Path, default=Path("docs/mutation.md"))
    p.add_argument("--groups", nargs="+", choices=sorted(GROUPS), default=DEFAULT_GROUPS,
                   help=f"default: {' '.join(DEFAULT_GROUPS)}")
    p.add_argument("--workdir", type=Path, default=Path("/tmp/spacy-fsemicrf-mutation"),
                   help="where the copies of the tree go (outside the working tree)")
    p.add_argument("--max-children", type=count, default=os.cpu_count() or 2)
    p.add_argument("--source", choices=["head", "worktree"], default="head",
                   help="mutate the committed tree (default) or the working tree as it is")
    p.add_argument("--report-only", action="store_true", help="report the runs in --workdir again")
    p.add_argument("--nice", type=int, default=15, help="niceness of the run (shared machines)")
    p.add_argument("--minutes", type=duration("minutes"), default=None,
                   help="stop each group after this long and report what ran")
    p.add_argument("--sample", type=fraction, default=None,
                   help="run this fraction of each module's mutants (a fixed random draw)")
    p.add_argument("--modules", nargs="+", default=None,
                   help="mutate only these modules (globs), e.g. spacy_fsemicrf/structured/filtered.py")
    args = p.parse_args(argv)
    workdir = args.workdir.resolve()
    if ROOT in workdir.parents or workdir == ROOT:
        sys.exit("--workdir must be outside the repository")
    # the report is written once every group has run: a folder missing then lost its hours
    if args.output.is_dir() or not args.output.parent.is_dir():
        p.error(f"--output {args.output} must be a file in an existing folder")
    if args.report_only:
        for name in args.groups:
            if not (workdir / name / "mutmut.seconds").is_file():
                p.error(f"--report-only: no finished run of {name} in {workdir}")
    os.nice(args.nice)
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # a kill stops mutmut too
    results = {}
    for name in args.groups:
        group = GROUPS[name]
        if args.modules:
            group = replace(group, modules=modules_of(group, args.modules, len(args.groups)))
            GROUPS[name] = group
        tree = workdir / name if args.report_only else run_group(
            name, group, workdir, args.max_children, args.source, args.minutes, args.sample)
        results[name] = (tree, collect(tree))
    args.output.write_text(report(results))
    for name, (_, mutants) in results.items():
        total, share = score(Counter(m.status for m in mutants))
        print(f"{name}: {total} non-equivalent mutants, {100 * share:.1f}% detected")


if __name__ == "__main__":
    main()
