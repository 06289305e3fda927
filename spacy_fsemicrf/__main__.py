"""``python -m spacy_fsemicrf COMMAND ...``: the package's command-line tools.

    annotate    annotate a corpus with any spaCy pipeline on Dask (spacy_fsemicrf.annotate)
    calibrate   fit the score calibration map of a trained pipeline (spacy_fsemicrf.calibration)
    debug-data  the entity checks of spacy debug data for fsemicrf_ner (spacy_fsemicrf.debug_data)

``python -m spacy_fsemicrf COMMAND --help`` describes each.
"""
import importlib
import sys
from typing import List

# command -> module with a ``main(argv) -> int``; imported only when its command runs.
COMMANDS = {
    "annotate": "spacy_fsemicrf.annotate.cli",
    "calibrate": "spacy_fsemicrf.calibration",
    "debug-data": "spacy_fsemicrf.debug_data",
}


def main(argv: List[str]) -> int:
    """Run the command ``argv[0]`` with the rest of ``argv``; its exit status."""
    usage = __doc__.strip().replace("``", "")  # (reST marks, for the docs, not the terminal)
    if argv and argv[0] in COMMANDS:
        return importlib.import_module(COMMANDS[argv[0]]).main(argv[1:])
    if argv[:1] in (["-h"], ["--help"]):  # asked for: on standard output, as argparse's help
        print(usage)
        return 0
    if argv:
        print(f"unknown command {argv[0]!r}\n", file=sys.stderr)
    print(usage, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
