"""Time of ``fsemicrf_ner`` (predict and set_annotations) with some of its functions as they
were at another revision, against the working tree's, in one process.

    python benchmarks/head_ab.py --model training/quick-fsemicrf/model-best \
        --test corpus/test.spacy --reference REVISION \
        --swap spacy_fsemicrf/component.py:FSemiCRFEntityRecognizer.set_annotations \
               spacy_fsemicrf/structured/heads.py:_SpanScorer._score

Each ``--swap FILE:QUALNAME`` names a function or method; its source at ``--reference`` (read
with ``git show``) is compiled in the namespace of the working tree's module, so it calls its
helpers, and the other swapped functions of that module as they were: a helper that the change
removed or renamed must be swapped too (a name missing from the working tree's code is added
for the reference runs only). Modules that imported a swapped function by name get the swap as well.
Documents of each length are cut from the test set's running text (as in
``profile_predict.py``) and run through the tok2vec once; then both versions predict and
annotate copies of them, alternating batch by batch, in ``--rounds`` rounds (the first two
dropped; the median of the rest), on one thread, thread CPU time. Separate processes on a
shared machine differed by up to 40%, more than most changes this compares, so both run in one
process; ``--swap`` of a function that did not change shows how far apart the same code
lands. A method that the reference does not define is taken out for its runs (the class
inherits it again). With ``--tok2vec`` the components before this one run on each batch
before it is timed, as in a pipeline: at batch 1 the head then meets the caches the tok2vec
left, which costs it more than the alternation alone.
"""
import argparse
import ast
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Tuple

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from profile_predict import check_lengths, cut_docs  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from arguments import check_file, check_pipeline, count  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SETTINGS = [(10, 64), (35, 64), (150, 64), (1500, 1), (10, 1), (35, 1)]  # (length, batch)

Slot = Tuple[Any, str]  # (module or class, attribute)
_NAMESPACES: Dict[str, Dict[str, Any]] = {}


def reference_source(revision: str, path: str) -> str:
    """The file ``path`` at ``revision``; a ``ValueError`` with git's message if it has none."""
    shown = subprocess.run(["git", "-C", str(ROOT), "show", f"{revision}:{path}"],
                           capture_output=True, text=True)
    if shown.returncode:
        raise ValueError(shown.stderr.strip().splitlines()[-1] if shown.stderr.strip()
                         else f"git show {revision}:{path} failed")
    return shown.stdout


def reference_function(revision: str, spec: str) -> Tuple[List[Slot], Any]:
    """The slots that hold the function ``spec`` (``FILE:QUALNAME``) in the working tree, and
    its source at ``revision`` compiled in the working tree's module namespace."""
    path, qualname = spec.split(":")
    source = reference_source(revision, path)
    module = __import__(path[:-3].replace("/", "."), fromlist=["_"])
    node: Any = ast.parse(source)
    for name in qualname.split("."):
        children = ast.iter_child_nodes(node)
        node = next((n for n in children if getattr(n, "name", None) == name), None)
        if node is None:  # new in the working tree: the reference runs without it (or inherits it)
            owner = _owner(module, qualname)
            return [(owner, qualname.split(".")[-1])], None
    # one namespace per module: reference functions that call each other get each other
    namespace = _NAMESPACES.setdefault(module.__name__, dict(vars(module)))
    func_source = textwrap.dedent(ast.get_source_segment(source, node))
    static = any(getattr(d, "id", None) == "staticmethod" for d in node.decorator_list)
    exec(func_source.replace("@staticmethod\n", "", 1), namespace)
    function = namespace[node.name]
    owner = _owner(module, qualname)
    slots = [(owner, node.name)]
    if owner is module and hasattr(module, node.name):  # imported by name elsewhere
        current = getattr(module, node.name)
        slots += [(m, node.name) for name, m in sys.modules.items()
                  if name.startswith("spacy_fsemicrf") and m is not module
                  and getattr(m, node.name, None) is current]
    return slots, staticmethod(function) if static else function


def _owner(module: Any, qualname: str) -> Any:
    """The module or class that holds ``qualname`` in ``module``."""
    owner = module
    for name in qualname.split(".")[:-1]:
        owner = getattr(owner, name)
    return owner


def switcher(revision: str, specs: List[str]) -> Callable[[str], None]:
    """``use("reference")`` puts the reference functions in place, ``use("current")`` the
    working tree's."""
    versions: Dict[str, Dict[Slot, Any]] = {"reference": {}, "current": {}}
    for spec in specs:
        slots, function = reference_function(revision, spec)
        for owner, attr in slots:
            versions["reference"][owner, attr] = function
            current = (owner.__dict__.get(attr) if isinstance(owner, type)
                       else getattr(owner, attr, None))
            versions["current"][owner, attr] = current

    def use(which: str) -> None:
        for (owner, attr), value in versions[which].items():
            if value is not None:
                setattr(owner, attr, value)
            elif attr in vars(owner):
                delattr(owner, attr)

    return use


def setting(text: str) -> Tuple[int, int]:
    """``LENGTHxBATCH``, both at least 1."""
    length, sep, batch = text.partition("x")
    if not sep:
        raise argparse.ArgumentTypeError(f"takes LENGTHxBATCH, got {text!r}")
    return count(length), count(batch)


def rounds(text: str) -> int:
    """More rounds than the two dropped."""
    value = int(text)
    if value < 3:
        raise argparse.ArgumentTypeError(f"must be at least 3 (the first two are dropped), "
                                         f"got {value}")
    return value


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--test", required=True)
    parser.add_argument("--reference", required=True, help="a git revision")
    parser.add_argument("--swap", nargs="+", required=True, help="FILE:QUALNAME")
    parser.add_argument("--tokens", type=count, default=6400, help="tokens per setting")
    parser.add_argument("--rounds", type=rounds, default=12)
    parser.add_argument("--settings", type=setting, nargs="+", default=SETTINGS,
                        help="LENGTHxBATCH, e.g. 10x1 (default: all six)")
    parser.add_argument("--tok2vec", action="store_true",
                        help="run the components before this one on each batch before timing it, "
                             "as a pipeline does: they leave the caches cold for the head")
    args = parser.parse_args(argv)
    check_pipeline(parser, "--model", args.model)
    check_file(parser, "--test", args.test)
    for spec in args.swap:  # before the pipeline loads: a bad revision or path is one line
        path, sep, qualname = spec.partition(":")
        if not sep or not qualname:
            parser.error(f"--swap takes FILE:QUALNAME, got {spec!r}")
        try:
            reference_source(args.reference, path)
        except ValueError as err:
            parser.error(f"--reference {args.reference}, --swap {spec}: {err}")
    torch.set_num_threads(1)
    import spacy
    from spacy.tokens import DocBin

    nlp = spacy.load(args.model)
    ner = nlp.get_pipe("fsemicrf_ner")
    use = switcher(args.reference, args.swap)
    before = nlp.pipeline[: nlp.pipe_names.index(ner.name)]
    test = list(DocBin().from_disk(args.test).get_docs(nlp.vocab))
    check_lengths(parser, test, [length for length, _ in args.settings], "--settings")
    print(f"| length | batch | {args.reference} µs/doc | working tree µs/doc | ratio |")
    print("|---:|---:|---:|---:|---:|")
    for length, batch_size in args.settings:
        docs = cut_docs(nlp, test, length, args.tokens)
        for _, pipe in before:
            docs = list(pipe.pipe(docs, batch_size=64))
        # the two versions alternate batch by batch, so that both meet the same load
        times: Dict[str, List[float]] = {"reference": [], "current": []}
        for r in range(args.rounds):
            total = {"reference": 0.0, "current": 0.0}
            for k, i in enumerate(range(0, len(docs), batch_size)):
                for which in ("reference", "current") if (r + k) % 2 else ("current", "reference"):
                    use(which)
                    batch = [d.copy() for d in docs[i:i + batch_size]]
                    if args.tok2vec:
                        for _, pipe in before:
                            batch = list(pipe.pipe(batch, batch_size=batch_size))
                    t0 = time.thread_time()
                    ner.set_annotations(batch, ner.predict(batch))
                    total[which] += time.thread_time() - t0
            for which, seconds in total.items():
                times[which].append(seconds / len(docs) * 1e6)
        use("current")
        ref, current = (statistics.median(times[w][2:]) for w in ("reference", "current"))
        print(f"| {length} | {batch_size} | {ref:.1f} | {current:.1f} | {current / ref:.3f}x |",
              flush=True)


if __name__ == "__main__":
    main()
