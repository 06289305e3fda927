"""research/scripts/versus_corpora.py: a scored group against the corpora benchmark, by seed."""
import json

import pytest
import versus_corpora


def _scores(f, p, r):
    split = {"f": f, "p": p, "r": r}
    return {"2.0": {"dev": split, "test": split}}


def test_differences_pair_each_seed_with_the_benchmark_run_of_that_seed(tmp_path):
    scored = tmp_path / "scores.json"
    scored.write_text(json.dumps({"runs": [
        {"name": "cand@seed0", "scores": _scores(0.70, 0.80, 0.60)},
        {"name": "cand@seed1", "scores": _scores(0.60, 0.70, 0.50)},
        {"name": "other@seed0", "scores": _scores(0.10, 0.10, 0.10)},
    ]}))
    run = lambda pipeline, seed, f: {  # noqa: E731
        "corpus": "nemo", "pipeline": pipeline, "seed": seed,
        **{split: {"ents_f": f, "ents_p": f, "ents_r": f} for split in ("dev", "test")}}
    benchmark = {"runs": [run("semicrf", 0, 0.65), run("semicrf", 1, 0.60), run("ner", 0, 0.1),
                          run("semicrf", 2, 0.5)]}
    res = versus_corpora.compare({"nemo": str(scored)}, "cand", 2, "semicrf", benchmark)["nemo"]
    assert res["seeds"] == ["seed0", "seed1"]  # seed 2 has no candidate
    assert res["test_f"]["diffs"] == pytest.approx([5.0, 0.0])
    assert res["dev_r"]["diffs"] == pytest.approx([-5.0, -10.0])
    assert res["test_f"]["mean"] == pytest.approx(2.5) and res["test_f"]["se"] == pytest.approx(2.5)
    with pytest.raises(ValueError, match="no seed"):
        versus_corpora.compare({"nemo": str(scored)}, "cand", 2, "crf", benchmark)
    # outputs keep a stem's dots: x_0.25 writes x_0.25.json, not x_0.json
    # the result as main records it: the table names the benchmark file it was paired with
    versus_corpora.write_outputs({"candidate": "cand", "margin": 2.0, "pipeline": "semicrf",
                                  "benchmark": "bench.json", "corpora": {"nemo": res}},
                                 tmp_path / "x_0.25", versus_corpora.write_markdown)
    text = (tmp_path / "x_0.25.md").read_text()
    assert (tmp_path / "x_0.25.json").exists() and "| nemo | 2 |" in text
    assert "`semicrf` (`bench.json`)" in text
