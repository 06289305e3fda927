"""Every command line the documentation and the project files give still works as written.

The command lines are the ``python ...`` lines of the fenced shell blocks of README.md,
docs/*.md and research/README.md, the inline code of those files that gives a script with its
arguments, the usage lines of the scripts' docstrings (what ``--help`` shows) and the scripts of
project.yml and research/project.yml. For each one that runs a script of this repository or
``python -m spacy_fsemicrf``, the script exists and its own argparse parser accepts the
arguments (tests/argparse_only.py parses them without running anything after the parse), and
the options of a synopsis's optional groups (``[--workers N]``) are options it knows; a
``spacy project run`` names a command or workflow of that project and only variables it has; a
``spacy train`` config exists. In project.yml, every dependency exists or is an output of a
command. Nothing is trained or timed.
"""
import ast
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Dict, Iterator, List, NamedTuple, Optional, Tuple

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
RESEARCH = ROOT / "research"
SCRIPT_DIRS = ("scripts", "benchmarks", "research/scripts")
SEPARATORS = {";", "&&", "||", "|", "&"}
SHELL_WORDS = {"do", "then", "else", "time", "nice"}
ASSIGNMENT = re.compile(r"^[A-Za-z_]\w*=")
# a script that parses its arguments, itself or through another script's main (evaluate.py);
# any other script would run in full, so it is only checked to exist
PARSES = re.compile(r"\bparse_(known_)?args\(|^from \w+ import main\b", re.M)


class Command(NamedTuple):
    where: str  # file:line, or project.yml:command
    cwd: Path
    argv: List[str]  # the arguments of ``python``


def markdown_files() -> List[Tuple[Path, Path]]:
    """The documents with commands, each with the folder its commands run in."""
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    return [(path, ROOT) for path in docs] + [(RESEARCH / "README.md", RESEARCH)]


def fenced_shell_lines(text: str) -> Iterator[Tuple[int, str]]:
    """``(line number, logical line)`` of the shell blocks, continuation lines joined."""
    in_shell = in_code = False
    pending, start = "", 0
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            in_code = not in_code
            in_shell = in_code and line.strip()[3:].strip() in ("bash", "sh", "shell", "")
            continue
        if not in_shell:
            continue
        start = start or number
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        yield start, pending + line
        pending, start = "", 0


def inline_commands(text: str) -> Iterator[Tuple[int, str]]:
    """Inline code outside fenced blocks that runs a script or the package with arguments."""
    text = re.sub(r"```.*?```", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    pattern = r"`(python3? (?:(?:scripts|benchmarks|research)/|-m spacy_fsemicrf )[^`\s]+ [^`]+)`"
    for match in re.finditer(pattern, text):
        yield text.count("\n", 0, match.start()) + 1, match.group(1).replace("\n", " ")


def docstring_commands(path: Path) -> Iterator[Tuple[int, str]]:
    """The usage lines (``python ...``) of a script's module docstring."""
    docstring = ast.get_docstring(ast.parse(path.read_text()), clean=False) or ""
    lines = docstring.splitlines()
    pending, start = "", 0
    for number, line in enumerate(lines, 1):
        if not pending and not re.match(r"\s*python3? ", line):
            continue
        start = start or number
        pending += line.strip()
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        yield start, pending
        pending, start = "", 0


def expand(token: str, variables: Dict[str, str]) -> List[str]:
    """A token with the shell variables set earlier in the block put in (an unquoted
    ``$VAR`` alone splits into words, as the shell does)."""
    whole = re.fullmatch(r"\$\{?(\w+)\}?", token)
    if whole and whole.group(1) in variables:
        return variables[whole.group(1)].split()
    for name, value in variables.items():
        token = re.sub(r"\$(?:\{%s\}|%s\b)" % (name, name), value, token)
    return [token]


def python_argvs(line: str, variables: Dict[str, str]) -> Iterator[List[str]]:
    """The arguments of each ``python`` in a shell line; assignments ``VAR=value`` on their
    own are recorded in ``variables``."""
    commands = list(python_commands(line, variables))
    # a synopsis (``[--option VALUE]``) is not a command line: synopsis_probes reads it
    if "[" not in line:
        yield from commands


def python_commands(line: str, variables: Dict[str, str]) -> Iterator[List[str]]:
    """:func:`python_argvs`, synopses included."""
    line = re.sub(r"\$\([^)]*\)", "SUBST", line)  # command substitution: a placeholder word
    lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|")
    lexer.whitespace_split, lexer.commenters = True, "#"
    words: List[List[str]] = [[]]
    for token in lexer:
        if token in SEPARATORS:
            words.append([])
        else:
            words[-1].append(token)
    for command in words:
        while command and (command[0] in SHELL_WORDS or ASSIGNMENT.match(command[0])):
            if len(command) == 1 and ASSIGNMENT.match(command[0]):
                name, value = command[0].split("=", 1)
                variables[name] = value
            command = command[1:]
        if command and re.search(r"(^|/)python3?$", command[0]):
            yield [word for token in command[1:] for word in expand(token, variables)]


def synopsis_probes(line: str) -> Iterator[List[str]]:
    """For each ``python`` of a synopsis, a line with optional groups (``[--workers N]``): the
    arguments outside the groups with those of one group added, for each group that names an
    option (the words of a group go in as written, ``...`` left out)."""
    if "[" not in line:
        return
    for argv in python_commands(line, {}):
        base: List[str] = []
        groups: List[List[str]] = []
        depth = 0
        for part in (p for word in argv for p in re.findall(r"\[|\]|[^\[\]]+", word)):
            if part == "[":
                depth += 1
                if depth == 1:
                    groups.append([])
            elif part == "]":
                depth -= 1
            elif part != "...":
                (groups[-1] if depth else base).append(part)
        for group in groups:
            if any(word.startswith("--") for word in group):
                yield base + group


def documented_commands() -> List[Command]:
    """Every ``python`` command line of the documents, the docstrings and the project files."""
    found = []
    for path, cwd in markdown_files():
        text, name = path.read_text(), str(path.relative_to(ROOT))
        variables: Dict[str, str] = {}
        lines = [*fenced_shell_lines(text), *inline_commands(text)]
        for number, line in lines:
            found += [Command(f"{name}:{number}", cwd, argv)
                      for argv in python_argvs(line, variables)]
    for folder in SCRIPT_DIRS:
        for path in sorted((ROOT / folder).glob("*.py")):
            for number, line in docstring_commands(path):
                found += [Command(f"{path.relative_to(ROOT)}:{number}", ROOT, argv)
                          for argv in python_argvs(line, {})]
    for project in (ROOT / "project.yml", RESEARCH / "project.yml"):
        found += project_commands(project)
    return found


def project_commands(path: Path) -> List[Command]:
    """The ``python`` lines of a project file's commands, its variables put in."""
    config = yaml.safe_load(path.read_text())
    found = []
    for command in config["commands"]:
        for line in command.get("script", []):
            line = substitute(line, config.get("vars", {}))
            found += [Command(f"{path.relative_to(ROOT)}:{command['name']}", path.parent, argv)
                      for argv in python_argvs(line, {})]
    return found


def substitute(text: str, variables: Dict[str, object]) -> str:
    """``${vars.NAME}`` of a project file replaced by its value."""
    return re.sub(r"\$\{vars\.(\w+)\}", lambda m: str(variables[m.group(1)]), text)


def script_of(command: Command) -> Optional[Path]:
    """The repository script a command runs (None: a module or ``-c``)."""
    first = command.argv[0] if command.argv else "-c"
    return None if first.startswith("-") else (command.cwd / first).resolve()


def documented_synopses() -> List[Command]:
    """A probe (:func:`synopsis_probes`) of each optional group of the synopses of the documents
    and of the scripts' docstrings."""
    found = []
    for path, cwd in markdown_files():
        text, name = path.read_text(), str(path.relative_to(ROOT))
        for number, line in [*fenced_shell_lines(text), *inline_commands(text)]:
            found += [Command(f"{name}:{number}", cwd, argv) for argv in synopsis_probes(line)]
    for folder in SCRIPT_DIRS:
        for path in sorted((ROOT / folder).glob("*.py")):
            for number, line in docstring_commands(path):
                found += [Command(f"{path.relative_to(ROOT)}:{number}", ROOT, argv)
                          for argv in synopsis_probes(line)]
    return found


def parsed_commands() -> List[Command]:
    """The commands tests/argparse_only.py can check: this repository's scripts that parse
    their arguments with argparse, and ``python -m spacy_fsemicrf``."""
    return [command for command in documented_commands() if parses(command)]


def parses(command: Command) -> bool:
    """Whether tests/argparse_only.py can check ``command``: it runs a script of this repository
    that parses its arguments with argparse, or ``python -m spacy_fsemicrf``."""
    script = script_of(command)
    if script is None:
        return command.argv[:2] == ["-m", "spacy_fsemicrf"]
    return script.is_file() and bool(PARSES.search(script.read_text()))


def parse_statuses(commands: List[Command]) -> List[str]:
    """What each command's own parser says to its arguments (``"ok"`` or the error)."""
    jobs = [[str(c.cwd), c.argv] for c in commands]
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "argparse_only.py")],
                          input=json.dumps(jobs), capture_output=True, text=True, cwd=ROOT,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def describe(command: Command) -> str:
    """Where a command is written, and the command."""
    return f"{command.where}: python {shlex.join(command.argv)}"


def test_the_documents_give_commands():
    """The extraction finds the commands it should (an empty list would pass everything)."""
    wheres = {c.where.split(":")[0] for c in documented_commands()}
    assert {"README.md", "docs/results.md", "research/README.md", "project.yml",
            "research/project.yml", "scripts/benchmark.py"} <= wheres


def test_documented_scripts_exist():
    missing = [describe(c) for c in documented_commands()
               if script_of(c) is not None and not script_of(c).is_file()]
    assert not missing, "scripts that are not there:\n" + "\n".join(missing)


def test_documented_commands_parse():
    commands = parsed_commands()
    assert len(commands) > 50
    failed = [f"{describe(c)}\n    {s}" for c, s in zip(commands, parse_statuses(commands))
              if s != "ok"]
    assert not failed, "commands their script does not accept:\n" + "\n".join(failed)


# what a probe's parser may say to a placeholder such as ``N`` or to an option without its
# value: the option is known
VALUE_ERROR = re.compile(r"invalid .*value|invalid choice|expected (one|at least one) argument")


def test_synopsis_options_are_options_of_their_script():
    """Each optional group of a synopsis names options its script knows (the placeholders of
    their values may be refused as values)."""
    probes = [c for c in documented_synopses() if parses(c)]
    assert len(probes) > 10
    failed = [f"{describe(c)}\n    {s}" for c, s in zip(probes, parse_statuses(probes))
              if s != "ok" and not VALUE_ERROR.search(s)]
    assert not failed, "synopses their script does not accept:\n" + "\n".join(failed)


def project_of(command: Command) -> Path:
    """The project file a ``spacy project`` command reads (its directory argument)."""
    rest = [a for a in command.argv[5:] if not a.startswith("-")]
    folder = (command.cwd / rest[0]) if rest else command.cwd
    return (folder / "project.yml").resolve()


def test_project_runs_name_commands_and_variables():
    wrong = []
    for command in documented_commands():
        if command.argv[:4] != ["-m", "spacy", "project", "run"] or len(command.argv) < 5:
            continue
        config = yaml.safe_load(project_of(command).read_text())
        names = {c["name"] for c in config["commands"]} | set(config.get("workflows", {}))
        overrides = [a.split("=")[0][len("--vars."):] for a in command.argv
                     if a.startswith("--vars.")]
        if command.argv[4] not in names or not set(overrides) <= set(config.get("vars", {})):
            wrong.append(describe(command))
    assert not wrong, "unknown project commands or variables:\n" + "\n".join(wrong)


def test_spacy_train_configs_exist():
    missing = [describe(c) for c in documented_commands()
               if c.argv[:3] == ["-m", "spacy", "train"] and not (c.cwd / c.argv[3]).is_file()]
    assert not missing, "\n".join(missing)


@pytest.mark.parametrize("project", [ROOT / "project.yml", RESEARCH / "project.yml"],
                         ids=["project", "research"])
def test_project_deps_exist_or_are_made(project: Path):
    """A dependency is in the repository or an output of a command of the same project."""
    config = yaml.safe_load(project.read_text())
    variables = config.get("vars", {})
    outputs = {substitute(o, variables) for c in config["commands"] for o in c.get("outputs", [])}
    missing = [f"{c['name']}: {dep}" for c in config["commands"]
               for dep in map(lambda d: substitute(d, variables), c.get("deps", []))
               if dep not in outputs and not (project.parent / dep).exists()]
    assert not missing, "dependencies nothing provides:\n" + "\n".join(missing)


def test_project_workflows_name_commands():
    for project in (ROOT / "project.yml", RESEARCH / "project.yml"):
        config = yaml.safe_load(project.read_text())
        names = {c["name"] for c in config["commands"]}
        for workflow, steps in config.get("workflows", {}).items():
            assert set(steps) <= names, (project.name, workflow, set(steps) - names)


def test_shell_line_extraction():
    variables: Dict[str, str] = {}
    lines = ['M="a=x b=y"', "for c in x y; do python scripts/t.py $c --m $M  # note",
             "R=out && python -m spacy_fsemicrf annotate M I $R/o | tee log"]
    got = [argv for line in lines for argv in python_argvs(line, variables)]
    assert got == [["scripts/t.py", "$c", "--m", "a=x", "b=y"],
                   ["-m", "spacy_fsemicrf", "annotate", "M", "I", "out/o"]]
    synopsis = "python -m m A [--n N] [B ...] [--f] [--s S [--t]] && python c.py [--x]"
    assert list(synopsis_probes(synopsis)) == [
        ["-m", "m", "A", "--n", "N"], ["-m", "m", "A", "--f"],
        ["-m", "m", "A", "--s", "S", "--t"], ["c.py", "--x"]]
    assert list(python_argvs(synopsis, {})) == []
    block = "text\n```bash\npython a.py \\\n    --x 1\n```\n`python scripts/b.py --y 2`"
    assert [shlex.split(line) for _, line in fenced_shell_lines(block)] == [
        ["python", "a.py", "--x", "1"]]
    assert list(inline_commands(block)) == [(6, "python scripts/b.py --y 2")]
