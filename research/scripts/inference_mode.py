"""The head's prediction under ``torch.inference_mode()`` (what the pipeline does) against the
same calls under ``torch.no_grad()``, side by side in one process.

    python research/scripts/inference_mode.py --model training/quick-fsemicrf/model-best \
        --test corpus/test.spacy --output research/results/inference_mode.json

Documents of 10 and 35 tokens are cut from the test set's running text and run through the
pipeline's components before ``fsemicrf_ner`` once; then ``fsemicrf_ner`` alone annotates
fresh copies of them, the two ways alternating, on one thread (thread CPU time, median of the
repeats). Prints and writes microseconds of the head per word.
"""
import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List

import spacy
import torch
from spacy.tokens import DocBin

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from profile_predict import cut_docs  # noqa: E402

from spacy_fsemicrf import head_model  # noqa: E402

INFERENCE_MODE = head_model.HeadShim.predict


def no_grad_predict(self, inputs):
    """``HeadShim.predict`` with ``no_grad`` in place of ``inference_mode``."""
    if self._model.training:
        self._model.eval()
    with torch.no_grad():
        with torch.autocast(device_type="cuda", enabled=self._mixed_precision):
            return self._model(*inputs.args, **inputs.kwargs)


def head_times(args: argparse.Namespace, ways: Dict[str, Callable[[], None]]) -> List[dict]:
    """Microseconds of ``fsemicrf_ner`` per word for each way (a function that sets the way up
    before its runs) at each of ``args.settings``, the ways alternating, on one thread."""
    torch.set_num_threads(1)
    nlp = spacy.load(args.model)
    source = list(DocBin().from_disk(args.test).get_docs(nlp.vocab))
    ner = nlp.get_pipe("fsemicrf_ner")
    before = nlp.pipeline[: nlp.pipe_names.index("fsemicrf_ner")]
    rows = []
    for setting in args.settings:
        length, batch, tokens = (int(x) for x in setting.split(":"))
        docs = cut_docs(nlp, source, length, tokens)
        for _, pipe in before:
            docs = list(pipe.pipe(docs, batch_size=batch))
        words = sum(len(d) for d in docs)
        times: Dict[str, List[float]] = {way: [] for way in ways}
        for _ in range(args.repeats):
            for way, set_up in ways.items():
                set_up()
                copies = [d.copy() for d in docs]
                t0 = time.thread_time()
                for _ in ner.pipe(copies, batch_size=batch):
                    pass
                times[way].append((time.thread_time() - t0) / words * 1e6)
        row = {"length": length, "batch_size": batch, "words": words,
               "us_per_word": {way: statistics.median(v) for way, v in times.items()},
               "runs": times}
        rows.append(row)
        print(length, batch, {k: round(v, 2) for k, v in row["us_per_word"].items()}, "µs per word")
    return rows


def parse_args(description: str, settings: List[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--test", required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--settings", nargs="+", default=settings, help="length:batch:tokens")
    parser.add_argument("--repeats", type=int, default=5)
    return parser.parse_args()


def write(args: argparse.Namespace, rows: List[dict]) -> None:
    meta = {"model": args.model, "test": args.test, "threads": 1, "repeats": args.repeats,
            "torch": torch.__version__, "command": " ".join(["python", *sys.argv])}
    Path(args.output).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))


def main() -> None:
    args = parse_args(__doc__, ["10:64:12000", "10:1:3000", "35:1:6000"])

    def use(predict: Callable) -> Callable[[], None]:
        return lambda: setattr(head_model.HeadShim, "predict", predict)

    rows = head_times(args, {"no_grad": use(no_grad_predict),
                             "inference_mode": use(INFERENCE_MODE)})
    head_model.HeadShim.predict = INFERENCE_MODE
    write(args, rows)


if __name__ == "__main__":
    main()
