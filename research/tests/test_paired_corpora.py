"""research/scripts/paired_corpora.py: two sweep groups, paired by seed, over corpora."""
import pytest

import paired_corpora


def _run(name, f, r=None):
    split = {"ents_f": f, "ents_p": f, "ents_r": f if r is None else r}
    return {"name": name, "dev": split, "test": split}


def test_d_is_the_mean_of_the_corpora_paired_by_seed():
    results = {
        "a": {"runs": [_run("x@seed0", 0.80, 0.5), _run("x@seed1", 0.70),
                       _run("y@seed0", 0.75, 0.6), _run("y@seed1", 0.70), _run("y@seed2", 0.10)]},
        "b": {"runs": [_run("x@seed0", 0.50), _run("y@seed0", 0.60)]},
    }
    row = paired_corpora.compare(results, "x", "y")
    a, b = row["corpora"]["a"], row["corpora"]["b"]
    assert a["seeds"] == ["seed0", "seed1"]  # y's seed 2 has no x run
    assert a["dev_f"]["mean"] == pytest.approx(2.5) and a["dev_f"]["se"] == pytest.approx(2.5)
    assert a["dev_r"]["mean"] == pytest.approx((-10.0 + 0.0) / 2)
    assert b["dev_f"]["mean"] == pytest.approx(-10.0) and b["dev_f"]["se"] == 0.0
    assert row["D"] == pytest.approx((2.5 - 10.0) / 2)
    assert row["se_D"] == pytest.approx(2.5 / 2)
    assert "**-3.75 (1.25)**" in paired_corpora.markdown([row])
    with pytest.raises(ValueError, match="no seed"):
        paired_corpora.compare(results, "x", "z")
