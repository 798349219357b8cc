"""evaluations/demo_eval.py: how a model's word confidences tell its right words from its wrong ones."""
from __future__ import annotations

import numpy as np
import pytest

from evaluations.demo_eval import report, separation


def test_auc_is_the_chance_a_right_word_outranks_a_wrong_one():
    right, wrong = np.array([0.9, 0.8, 0.4]), np.array([0.5, 0.4])
    pairs = [(r > w) + 0.5 * (r == w) for r in right for w in wrong]  # every (right, wrong) pair, ties half
    got = separation(right, wrong)
    assert got["auc"] == pytest.approx(np.mean(pairs), abs=1e-3) == pytest.approx(4.5 / 6, abs=1e-3)
    assert got["confidence_right"] == 0.7 and got["confidence_wrong"] == 0.45
    assert got["right_under_0.5"] == pytest.approx(1 / 3, abs=1e-3) and got["wrong_under_0.5"] == 0.5
    assert separation(np.array([0.3]), np.array([0.9]))["auc"] == 0.0
    assert separation(right, np.array([])) == {}  # no wrong word: nothing to separate


def test_report_counts_words_by_the_alignment_and_scores_their_confidences():
    utts = [("the quick brown fox", ["the", "quick", "brawn", "fox"], [0.9, 0.8, 0.3, 0.7]),
            ("a b c", ["a", "x", "b", "c"], [0.6, 0.2, 0.9, 0.8])]
    got = report(utts)
    assert got["wer"] == pytest.approx(2 / 7, abs=1e-4) and got["utterances"] == 2
    assert (got["words_right"], got["words_wrong"]) == (6, 2)
    assert got["confidence_wrong"] == 0.25 and got["auc"] == 1.0  # both wrong words under every right one
