"""How the component reports the gold entities it cannot learn (wider than ``max_width``)."""
import logging

import spacy


def test_wide_entities_are_reported_at_each_new_power_of_ten(caplog):
    """One warning when the running count reaches 1, 10, 100, ... (a new digit), with the count
    and the widest entity so far: never silent, never one warning per batch."""
    ner = spacy.blank("en").add_pipe("fsemicrf_ner")
    batches = [(1, 12), (3, 11), (5, 15), (1, 12), (80, 13), (9, 20), (1, 12)]
    warned = []
    for n, widest in batches:
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="spacy_fsemicrf"):
            ner._report_wide(n, widest)
        warned.append([r.getMessage() for r in caplog.records])
    totals = [1, 4, 9, 10, 90, 99, 100]
    assert [len(w) for w in warned] == [1, 0, 0, 1, 0, 0, 1]
    for (n, total, widest) in [(0, 1, 12), (3, 10, 15), (6, 100, 20)]:
        assert totals[n] == total
        assert f": {total} gold entities wider than max_width={ner.max_width} tokens" in warned[n][0]
        assert f"max_width={widest} would keep them all" in warned[n][0]
    assert ner.n_wide_dropped == 100 and ner.widest_dropped == 20
