"""The beam search for streams with key phrases (model/beam.py) and what the host commits of it
(engine/runner/beams.py): a batch gives each stream what it gets alone, eagerly and in fixed shapes (the
CUDA graphs' way); what every hypothesis agrees on is committed, a late disagreement is settled by
the best hypothesis, and the end takes the best by its final score."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_greedy import random_decoder

from parakeet_stream.engine.runner.beams import BeamCommits
from parakeet_stream.model.beam import BeamPass, BeamPool
from parakeet_stream.model.boosting import BoostingTree, BoostLimits, BoostPool, PhrasePath

LIMITS = BoostLimits(root_width=8, nodes=64, arcs=128, arc_width=16)
STARTS = np.arange(21) % 3 == 0  # the random decoder's labels that start a word (blank, 20, does not)
STARTS[20] = False
TREES = [[([3, 5, 1], 2.0), ([7, 7], 1.0)], None, [([2, 9], 3.0), ([2, 4, 4, 6], 1.5)], [([11], 4.0)]]
BEAM, SYMBOLS = 3, 3


def search(decoder, enc, lengths, trees, fixed: bool, chunk: int = 4, max_lag: int = 6,
           evidence: float = -4.0) -> list[list[int]]:
    """The beam search over `enc` in chunks of `chunk` frames, its beams carried between them in a
    BeamPool and committed as the engine commits them; every stream's labels."""
    b = enc.size(0)
    boost = BoostPool(b + 1, LIMITS, torch.device("cpu"), STARTS)
    beams, commits = BeamPool(decoder, b + 1, BEAM, torch.device("cpu")), BeamCommits(BEAM, max_lag)
    slots = torch.arange(b)
    for slot, phrases in enumerate(trees):
        boost.load(slot, BoostingTree([PhrasePath(*p) for p in phrases], LIMITS, evidence) if phrases else None)
        commits.start(slot, True)
    beams.reset(slots)
    out: list[list[int]] = [[] for _ in range(b)]
    widths = None if fixed else tuple(boost.widths[:b].max(0).tolist())
    for at in range(0, enc.size(1), chunk):
        valid = (lengths - at).clamp(0, chunk)
        found = BeamPass(decoder, enc[:, at : at + chunk], valid, beams.gather(slots), boost, slots, SYMBOLS,
                         widths=widths).run(fixed)
        beams.scatter(slots, found.hyps)
        for row, packed in enumerate(found.packed().numpy()):
            done = commits.take(row, packed, int(valid[row]))
            beams.drop(row, done.drop)
            if done.lead is not None:
                beams.lead(row, done.lead)
            out[row] += [label for label, _, _ in done.labels]
    return [labels + [label for label, _, _ in commits.finish(row)] for row, labels in enumerate(out)]


def random_batch(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Encoder output for one stream per tree of TREES, 24 frames, and their valid lengths."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(len(TREES), 24, 32, generator=gen), torch.tensor([24, 20, 13, 24])


@pytest.mark.parametrize("blank_bias", [-1.0, 1.0])
def test_a_batch_gives_each_stream_its_labels_alone_eagerly_and_in_fixed_shapes(blank_bias):
    decoder = random_decoder(blank_bias)
    enc, lengths = random_batch(7)
    with torch.inference_mode():
        together = search(decoder, enc, lengths, TREES, fixed=False)
        assert together == search(decoder, enc, lengths, TREES, fixed=True)
        for row, phrases in enumerate(TREES):
            alone = search(decoder, enc[row : row + 1], lengths[row : row + 1], [phrases], fixed=False)
            assert together[row] == alone[0], row
    assert any(together) and all(len(labels) <= n * SYMBOLS for labels, n in zip(together, lengths.tolist()))


@pytest.mark.parametrize("blank_bias", [-1.0, 1.0])
def test_phrases_never_heard_leave_the_greedy_decoders_labels(blank_bias):
    """A stream's phrases that are never heard (here: no label is ever likely enough to earn a
    reward) change nothing: the beam keeps the greedy path and its text is the greedy decoder's,
    though the phrases' loans pull other hypotheses ahead of it."""
    decoder = random_decoder(blank_bias)
    enc, lengths = random_batch(11)
    b = len(TREES)
    with torch.inference_mode():
        emission, _ = decoder.decode(enc, lengths, decoder.initial_state(b))
        greedy = [[label for label, _ in labels] for labels in emission.per_stream(b)]
        unheard = search(decoder, enc, lengths, TREES, fixed=False, evidence=0.0)
        heard = search(decoder, enc, lengths, TREES, fixed=False)
    assert unheard == greedy
    assert heard != greedy  # the same phrases, where they can be heard, do change the text


def test_the_text_is_the_greedy_paths_unless_another_hypothesis_holds_more_phrases():
    commits = BeamCommits(2, max_lag_frames=2)
    commits.start(0, True)
    commits.take(0, packed([([1], 0, 0.0, 0.0), ([2], 0, -1.0, -1.0, True, 0.0)]), 2)
    late = commits.take(0, packed([([7], 0, 0.0, 0.0), ([8], 1, -0.5, -0.5, True, 0.0)]), 2)
    assert [label for label, _, _ in late.labels] == [2] and late.drop == [0] and late.lead is None
    commits.start(1, True)
    commits.take(1, packed([([3], 0, 0.0, 0.0, False, 2.0), ([4], 0, -1.0, -1.0, True, 0.0)]), 2)
    phrase = commits.take(1, packed([([5], 0, 0.0, 0.0, False, 2.0), ([6], 1, -0.5, -0.5, True, 0.0)]), 2)
    assert [label for label, _, _ in phrase.labels] == [3] and phrase.drop == [1] and phrase.lead == -1
    assert [label for label, _, _ in commits.finish(1)] == [5]  # no greedy path left: the best
    ends = BeamCommits(2, max_lag_frames=10, eou=9)  # until the utterance ends: then the text sent is its start
    ends.start(0, True)
    ended = ends.take(0, packed([([3, 9], 0, 0.0, 0.0, False, 2.0), ([4], 0, -1.0, -1.0, True, 0.0)]), 2)
    assert [label for label, _, _ in ended.labels] == [3, 9] and ended.drop == [1] and ended.lead == 0


def packed(beams: list[tuple], frames: int = 2) -> np.ndarray:
    """A stream's row of BeamPass.packed: per hypothesis (labels this pass, origin, score, final[,
    greedy, context]); by default none is the greedy path and none holds a phrase."""
    width = max(1, max(len(labels) for labels, *_ in beams))
    rows = []
    for labels, origin, score, final, *rest in beams:
        greedy, context = rest or (False, 0.0)
        pad = width - len(labels)
        eou, ctx = np.array([0.25, context], np.float32).view(np.int32)
        head = [len(labels), origin, *np.array([score, final], np.float32).view(np.int32), eou, int(greedy), ctx]
        probs = np.full(width, 0.5, np.float32).view(np.int32)
        rows.append(head + labels + [0] * pad + [frames - 1] * width + probs.tolist())
    return np.array(rows, dtype=np.int32)


def test_what_every_hypothesis_agrees_on_is_committed_the_rest_waits():
    commits = BeamCommits(3, max_lag_frames=10)
    commits.start(0, True)
    first = commits.take(0, packed([([1, 2], 0, 0.0, 0.0), ([1, 3], 0, -1.0, -1.0), ([1, 2, 4], 0, -2.0, -2.0)]), 2)
    assert [label for label, _, _ in first.labels] == [1] and first.drop == [] and first.eou == 0.25
    assert first.labels[0][1] == 1  # its frame within the chunk
    # hypothesis 1 (written [1 3]) goes on alone in all three: [3] is agreed
    second = commits.take(0, packed([([5], 1, 0.0, 0.0), ([6], 1, -1.0, -1.0), ([], 1, -3.0, -3.0)]), 2)
    assert [label for label, _, _ in second.labels] == [3]
    assert second.labels[0][1] == -1  # written in the chunk before
    assert [label for label, _, _ in commits.finish(0)] == [5]


def test_a_disagreement_older_than_the_lag_is_settled_by_the_best_hypothesis():
    commits = BeamCommits(2, max_lag_frames=2)
    commits.start(0, True)
    commits.take(0, packed([([1], 0, 0.0, 0.0), ([2], 0, -1.0, -1.0)]), 2)
    late = commits.take(0, packed([([7], 0, 0.0, 0.0), ([8], 1, -0.5, -0.5)]), 2)
    assert [label for label, _, _ in late.labels] == [1] and late.drop == [1]  # frame 1, 3 frames before the end: past the lag
    assert [label for label, _, _ in commits.finish(0)] == [7]


def test_the_end_takes_the_best_hypothesis_by_its_final_score():
    commits = BeamCommits(2, max_lag_frames=10)
    commits.start(0, True)
    agreed = commits.take(0, packed([([4, 5], 0, 0.0, -6.0), ([4, 6], 0, -1.0, -1.0)]), 2)  # 5: a loan not earned
    assert [label for label, _, _ in agreed.labels] == [4] and [label for label, _, _ in commits.finish(0)] == [6]
    assert 0 not in commits
    commits.start(0, True)
    commits.start(0, False)  # the slot's next stream has no phrases: nothing is left of the last one
    assert 0 not in commits


def test_a_hypothesis_far_behind_with_and_without_its_loans_does_not_hold_text_back():
    commits = BeamCommits(3, max_lag_frames=10, margin=3.0)
    commits.start(0, True)
    done = commits.take(0, packed([([1, 2], 0, 0.0, 0.0), ([1, 2], 0, -1.0, -1.0), ([1, 5], 0, -4.0, -4.0)]), 2)
    assert [label for label, _, _ in done.labels] == [1, 2] and done.drop == [2]  # 4 behind: out
    commits.start(1, True)
    loan = commits.take(1, packed([([1, 2], 0, -1.0, 0.0), ([1, 5], 0, 0.0, -8.0), ([], 0, -9.0, -9.0)]), 2)  # on loan
    assert [label for label, _, _ in loan.labels] == [1] and loan.drop == [2]  # [1 5] ahead by its score: it counts


def test_the_best_hypothesis_ending_its_utterance_commits_it_at_once():
    commits = BeamCommits(2, max_lag_frames=10, eou=9)
    commits.start(0, True)
    ended = commits.take(0, packed([([1, 9], 0, 0.0, 0.0), ([2, 9], 0, -1.0, -1.0)]), 2)
    assert [label for label, _, _ in ended.labels] == [1, 9] and ended.drop == [1]
    commits.start(1, True)  # another hypothesis's <EOU> settles nothing
    open_ = commits.take(1, packed([([1], 0, 0.0, 0.0), ([2, 9], 0, -1.0, -1.0)]), 2)
    assert open_.labels == [] and open_.drop == []
    without = BeamCommits(2, max_lag_frames=10)  # a model without <EOU>: label 9 is a label like any
    without.start(0, True)
    assert without.take(0, packed([([1, 9], 0, 0.0, 0.0), ([2, 9], 0, -1.0, -1.0)]), 2).labels == []


def test_half_the_beam_goes_to_what_the_audio_prefers_without_the_loans():
    """Labels to write and hypotheses to keep are both chosen this way: half by score, the rest by
    score less the loan of an open phrase match, so a phrase's pull cannot push out every label the
    audio prefers ("red ball" lost to "red blo..." when all four followed Blockchain)."""
    from parakeet_stream.model.beam import _two_halves

    score = torch.tensor([[9.0, 8.0, 7.0, 2.0, 1.0], [1.0, 2.0, 3.0, 4.0, 5.0]])
    loan = torch.tensor([[8.0, 8.0, 8.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0, 0.0]])
    picked = _two_halves(score, loan, 4)
    assert picked[0].tolist() == [0, 1, 3, 4]  # two by score (loaned), two without their loans
    assert picked[1].tolist() == [4, 3, 2, 1]  # no loans: simply the best four
    assert _two_halves(score, loan, 3)[0].tolist() == [0, 1, 3]
