"""Key-phrase boosting trees (model/boosting.py, engine/phrases.py): the tree (shared prefixes,
failure arcs, rewards), what each next label does to a hypothesis's phrase match (banked rewards,
loans given back, no reward for a repeat or a match the model did not hear), and the phrase checks.
The beam search that uses them: tests/test_beam.py."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from parakeet_stream.engine.phrases import (
    MAX_PHRASE_TOKENS,
    LabelPriors,
    Phrase,
    PhraseError,
    boosting_tree,
    check_phrases,
)
from parakeet_stream.model.boosting import FIRST_SHARE as H
from parakeet_stream.model.boosting import BoostingTree, BoostLimits, BoostPool, Matches, PhrasePath, word_starts
from parakeet_stream.model.tokenizer import Tokenizer
from parakeet_stream.tools.transcribe import read_phrases

LIMITS = BoostLimits(root_width=8, nodes=64, arcs=128, arc_width=16)
DEMO_TOKENIZER = Path(__file__).resolve().parent.parent / "weights" / "demo" / "tokenizer.model"


def walk(tree: BoostingTree, node: int, token: int) -> tuple[int, float]:
    """The tree's transition from `node` on `token`, read from its arrays as the decoder reads them:
    (next node, what it has earned); (0, 0.0) back at the root."""
    start, end = tree.arc_start[node], tree.arc_start[node + 1]
    for k, n, v in zip(tree.arc_token[start:end], tree.arc_next[start:end], tree.arc_value[start:end]):
        if k == token:
            return int(n), float(v)
    for k, n, v in zip(tree.root_token, tree.root_next, tree.root_value):
        if k == token:
            return int(n), float(v)
    return 0, 0.0


def tree(*phrases: tuple[list[int], float] | tuple[list[int], float, float], **need) -> BoostingTree:
    """(tokens, bonus per token[, reward factor[, prior per token]]) each; `need`: evidence, prior_share."""
    return BoostingTree([PhrasePath(*p) for p in phrases], LIMITS, **need)


def example() -> BoostingTree:
    # nodes by insertion: 1 = [1], 2 = [1 2], 3 = [1 2 3], 4 = [1 2 4], 5 = [2], 6 = [2 3]
    return tree(([1, 2, 3], 1.0), ([1, 2, 4], 2.0), ([2, 3], 1.0, 3.0))


def test_shared_prefixes_are_one_path_worth_the_largest_bonus():
    tree = example()
    assert tree.nodes == 7
    assert walk(tree, 0, 1) == (1, 2 * H)  # [1] shared by bonuses 1 and 2: 2 (a first token: its share)
    assert walk(tree, 1, 2) == (2, 2 * H + 2)
    assert walk(tree, 2, 3) == (3, 2 * H + 3) and walk(tree, 2, 4) == (4, 2 * H + 4)
    assert walk(tree, 0, 2) == (5, H) and walk(tree, 5, 3) == (6, H + 1)
    assert tree.done.tolist() == [0, 0, 0, 2 * H + 3, 2 * H + 4, 0, 3 * (H + 1)]  # a full match's reward
    assert tree.done_id.tolist() == [0, 0, 0, 3, 4, 0, 6] and tree.depth.tolist() == [0, 1, 2, 3, 3, 1, 2]


def test_failure_arcs_fall_back_to_the_longest_suffix_still_matching():
    tree = example()
    assert tree.done[2] == 0 and walk(tree, 2, 2) == (5, H)  # [1 2] then 2: only [2] still matches
    assert walk(tree, 4, 1) == (1, 2 * H)  # a phrase done, the next one starts
    assert walk(tree, 6, 2) == (5, H)
    assert walk(tree, 2, 9) == (0, 0.0) and walk(tree, 3, 7) == (0, 0.0)  # the match broken: back to the root
    assert walk(tree, 5, 1) == (1, 2 * H)


def test_a_node_earns_its_best_suffix_match():
    # [5 1] at a small bonus, [1] at a large one: after 5 1, the match worth more is the suffix [1]
    t = tree(([5, 1, 7], 0.5), ([1, 8], 3.0))
    node, value = walk(t, walk(t, 0, 5)[0], 1)
    assert value == 3 * H and walk(t, node, 8)[1] == 3 * H + 3 and walk(t, node, 7)[1] == 0.5 * H + 1


def test_trees_past_the_pool_limits_are_refused():
    with pytest.raises(ValueError):
        tree(*[([k], 1.0) for k in range(9)])  # 9 first tokens, room for 8
    with pytest.raises(ValueError):
        tree(*[([1, k], 1.0) for k in range(17)])  # 17 arcs from node [1], room for 16
    with pytest.raises(ValueError):
        tree(([1] * 64, 1.0))


@pytest.mark.skipif(not DEMO_TOKENIZER.is_file(), reason="weights/demo is absent")
def test_phrases_past_the_token_limit_are_refused_and_an_uncased_model_gets_lower_case():
    tok = Tokenizer(DEMO_TOKENIZER)
    long = " ".join("qzx"[k % 3] for k in range(45))  # 45 one-letter words, 89 characters
    assert len(tok.encode(long)) > MAX_PHRASE_TOKENS
    with pytest.raises(PhraseError) as err:
        boosting_tree(check_phrases([long]), tok)
    assert err.value.code == "invalid_phrases" and str(MAX_PHRASE_TOKENS) in err.value.message
    assert boosting_tree((), tok) is None
    upper, lower = boosting_tree((Phrase("Kowalski"),), tok), boosting_tree((Phrase("kowalski"),), tok)
    assert upper.root_token.tolist() == lower.root_token.tolist()
    assert upper.arc_token.tolist() == lower.arc_token.tolist() == tok.encode("kowalski")[1:]


@pytest.mark.skipif(not DEMO_TOKENIZER.is_file(), reason="weights/demo is absent")
def test_a_phrase_the_model_cannot_write_is_refused_a_hint_left_out_and_accents_dropped_where_that_helps():
    tok = Tokenizer(DEMO_TOKENIZER)  # lower-case letters and the apostrophe
    assert tok.unk_id in tok.encode("日本") and tok.unk_id in tok.encode("zoë")
    zoe = boosting_tree((Phrase("Zoë"),), tok)
    assert [*zoe.root_token.tolist(), *zoe.arc_token.tolist()] == tok.encode("zoe")
    with pytest.raises(PhraseError) as err:
        boosting_tree((Phrase("kowalski"), Phrase("R2-D2")), tok)
    assert err.value.message == "the phrase 'R2-D2' has characters this model cannot write: '-2'"
    assert boosting_tree((Phrase("R2-D2", hint=True), Phrase("日本", hint=True)), tok) is None
    kept = boosting_tree((Phrase("R2-D2", hint=True), Phrase("kowalski", hint=True)), tok)
    assert [*kept.root_token.tolist(), *kept.arc_token.tolist()] == tok.encode("kowalski")


@pytest.mark.skipif(not DEMO_TOKENIZER.is_file(), reason="weights/demo is absent")
def test_an_apostrophe_does_not_start_a_word_so_a_complete_name_gives_back_its_bonus_before_it():
    """"metformin" + "'" + "s" is one word: the apostrophe glues letters on (measured: the name
    boosted to completion, then "'t" or "'s" glued on, missed the phrase)."""
    tok = Tokenizer(DEMO_TOKENIZER)
    starts = word_starts(tok, tok.vocab_size + 1)
    piece = {tok.piece(i): i for i in range(tok.vocab_size)}
    assert not starts[piece["'"]] and not starts[piece["s"]]
    assert starts[piece["▁"]] and starts[piece["▁the"]] and starts[tok.eou_id]
    assert not starts[tok.vocab_size]  # blank


@pytest.mark.skipif(not DEMO_TOKENIZER.is_file(), reason="weights/demo is absent")
def test_a_phrases_file_has_a_phrase_a_line_and_an_optional_tab_weight(tmp_path):
    model = SimpleNamespace(tokenizer=Tokenizer(DEMO_TOKENIZER))
    path = tmp_path / "phrases.txt"
    path.write_text("Kowalski\n\nnew  york city\t2.5\nkowalski\t0.5\n")
    assert read_phrases(path, model) == (Phrase("Kowalski"), Phrase("new york city", 2.5), Phrase("kowalski", 0.5))
    for bad, reason in (("kowalski\theavy\n", "line 1"), ("zanzibar\t11\n", "at most 10"),
                        (" ".join("qzx"[k % 3] for k in range(45)), "at most 32")):
        path.write_text(bad)
        with pytest.raises(PhraseError, match=reason):
            read_phrases(path, model)


STARTS = np.arange(10) < 3  # labels 0, 1, 2 start a word; 9 is blank
NO_BOUND = -1e9  # no evidence needed


def expand(pool: BoostPool, node: int, banked: float = 0.0, last: int = -1, heard: float = 0.0, logp: float = -1.0):
    """What every label does to one hypothesis of slot 0 at `node`, the model giving each label `logp`."""
    matches = Matches(torch.tensor([node]), torch.tensor([banked]), torch.tensor([last]), torch.tensor([heard]))
    found = pool.expand(torch.tensor([0]), matches, torch.full((1, 10), logp), (8, 16))
    return SimpleNamespace(**{k: v[0].tolist() for k, v in vars(found).items()})


def pool_of(*phrases, evidence: float = NO_BOUND, prior_share: float = 0.0) -> BoostPool:
    pool = BoostPool(2, LIMITS, torch.device("cpu"), STARTS)
    pool.load(0, tree(*phrases, evidence=evidence, prior_share=prior_share))
    return pool


def test_a_label_earns_a_loan_along_a_phrase_and_a_broken_match_gives_it_back():
    pool = pool_of(([4, 5, 6], 2.0))  # nodes 1 = [4], 2 = [4 5], 3 = [4 5 6]
    start = expand(pool, 0)
    assert start.node[4] == 1 and start.after[4] == 2 * H and start.after[3] == 0.0
    inside = expand(pool, 1)
    assert inside.node[5] == 2 and inside.after[5] == 2 * H + 2
    assert inside.node[3] == 0 and inside.after[3] == 0.0  # broken: the loan is gone
    assert inside.banked == [0.0] * 10


def test_a_full_match_banks_its_reward_when_a_word_starts_and_gluing_letters_on_banks_nothing():
    pool = pool_of(([2, 5], 2.0, 3.0))  # the reward: 3 x (2 H + 2)
    reward = 3 * (2 * H + 2)
    done = expand(pool, 2)
    assert done.banked[1] == reward and done.after[1] == reward and done.last[1] == 2  # label 1 starts a word
    assert done.banked[7] == 0.0 and done.after[7] == 0.0  # label 7 glues letters on: the name was not whole
    assert done.banked[2] == reward and done.node[2] == 1  # the same phrase starts again, its first loan on top
    assert done.after[2] == reward + 2 * H


def test_a_weighted_phrase_completed_holds_its_whole_reward_so_no_word_after_it_is_rushed():
    """Weight 3: the label completing the heard phrase brings the hypothesis its whole reward as a
    loan; the word after it then adds nothing (any word start alike, or waiting a frame), where it
    used to add the weight's share and so pushed the search to start any word at once after a name."""
    pool = pool_of(([4, 5], 2.0, 3.0))
    reward = 3 * (2 * H + 2)
    inside = expand(pool, 1)
    assert inside.node[5] == 2 and inside.after[5] == reward
    done = expand(pool, 2, heard=-2.0)
    assert done.banked[0] == done.banked[1] == reward and done.after[0] == done.after[1] == reward
    again = expand(pool, 1, last=2)  # right after itself: no more than the bonuses it earned
    assert again.after[5] == 2 * H + 2


def test_a_phrase_right_after_itself_banks_nothing_but_after_another_word_it_does():
    pool = pool_of(([4, 5], 2.0))
    again = expand(pool, 2, banked=9.0, last=2)  # [4 5] banked last, [4 5] again
    assert again.banked[1] == 9.0 and again.last[1] == -1  # nothing banked; label 1 is a word outside them
    other = expand(pool, 0, banked=9.0, last=2)  # a word outside the phrases resets it
    assert other.last[1] == -1 and other.last[4] == 2
    later = expand(pool, 2, banked=9.0, last=-1)
    assert later.banked[1] == 9.0 + 2 * H + 2


def test_a_match_the_model_did_not_hear_earns_no_reward():
    pool = pool_of(([4, 5], 2.0), evidence=-3.0)  # the mean log-probability per label must be >= -3
    assert expand(pool, 2, heard=-6.0).banked[1] == 2 * H + 2
    assert expand(pool, 2, heard=-6.5).banked[1] == 0.0
    heard = expand(pool, 1, heard=-2.0, logp=-1.5)
    assert heard.heard[5] == -3.5 and heard.heard[4] == -1.5 and heard.heard[3] == 0.0  # continued, restarted, left
    assert heard.after[5] == 2 * H + 2  # completed, heard: the loan stands
    unheard = expand(pool, 1, heard=-2.0, logp=-4.5)
    assert unheard.heard[5] == -6.5 and unheard.after[5] == 0.0  # completed, not heard: the loan is gone
    end_ok = Matches(torch.tensor([2]), torch.tensor([1.0]), torch.tensor([-1]), torch.tensor([-6.0]))
    end_bad = Matches(torch.tensor([2]), torch.tensor([1.0]), torch.tensor([-1]), torch.tensor([-7.0]))
    assert pool.final(torch.tensor([0]), end_ok).item() == 1.0 + 2 * H + 2
    assert pool.final(torch.tensor([0]), end_bad).item() == 1.0


def test_a_match_needs_less_where_the_model_expects_its_labels_less():
    """The need of a match: evidence per label plus prior_share of its labels' prior (what the model
    expects of them without audio): a label the model finds unlikely whatever it hears asks less."""
    plain = tree(([4, 5], 2.0, 1.0, (-1.0, -1.0)), ([4, 6], 2.0, 1.0, (-1.0, -5.0)), evidence=-2.0, prior_share=0.5)
    assert plain.need[0] == -np.inf  # the root: no match
    assert plain.need.tolist()[1:] == [-2.5, -5.0, -7.0]  # [4]: -2 - 0.5; [4 5]: -4 - 1; [4 6]: -4 - 3
    pool = pool_of(([4, 5], 2.0, 1.0, (-1.0, -1.0)), ([4, 6], 2.0, 1.0, (-1.0, -5.0)), evidence=-2.0, prior_share=0.5)
    assert expand(pool, 2, heard=-5.5).banked[1] == 0.0  # [4 5]: likely labels, heard -5.5 < -5
    assert expand(pool, 3, heard=-5.5).banked[1] == 2 * H + 2  # [4 6]: an unlikely label, -5.5 >= -7
    assert expand(pool, 3, heard=-7.5).banked[1] == 0.0


def test_a_label_the_model_expects_little_without_audio_earns_a_larger_loan():
    """The loan adds prior_loan of what the prior takes from a label (times the phrase's pull, its
    weight below 1): the search weighs a phrase's labels by the audio, not by their spelling's odds."""
    full = tree(([4, 5], 2.0, 1.0, (-1.0, -6.0)), prior_loan=0.5)
    assert walk(full, 0, 4) == (1, 2 * H + 0.5) and walk(full, 1, 5) == (2, 2 * H + 0.5 + 2 + 3.0)
    half = tree(([4, 5], 1.0, 0.5, (-1.0, -6.0), 0.5), prior_loan=0.5)  # weight 0.5: half the pull
    assert walk(half, 1, 5) == (2, H + 0.25 + 1 + 1.5)
    assert walk(tree(([4, 5], 2.0)), 1, 5) == (2, 2 * H + 2)  # no prior: the bonus alone


def test_a_shorter_phrase_inside_a_longer_one_banks_only_where_the_longer_one_stops():
    pool = pool_of(([4], 2.0), ([4, 1, 5], 2.0))  # "anna" and "anna kowalski": 1 starts a word
    done = expand(pool, 1)  # [4] complete
    assert done.node[1] == 2 and done.banked[1] == 0.0  # the longer phrase goes on: nothing banked yet
    assert done.banked[0] == 2 * H  # another word: [4] is banked


def test_a_slot_reused_without_phrases_has_none():
    pool = pool_of(([4, 5], 2.0))
    assert pool.has_phrases([0, 1]).tolist() == [True, False]
    pool.load(0, None)
    assert not pool.has_phrases([0]).any() and expand(pool, 0).after == [0.0] * 10


def test_label_priors_are_computed_once_per_sequence_and_kept_for_the_most_recent():
    calls = []

    def prior(sequences):
        calls.append([tuple(s) for s in sequences])
        return [np.array([-float(sum(s))]) for s in sequences]

    priors = LabelPriors(prior, size=3)
    assert [p.tolist() for p in priors([[1], [2, 3], [1]])] == [[-1.0], [-5.0], [-1.0]]
    assert calls == [[(1,), (2, 3)]]  # a repeat in one call is computed once
    assert [p.tolist() for p in priors([[2, 3], [4]])] == [[-5.0], [-4.0]] and calls[-1] == [(4,)]
    priors([[5]])  # four known: the least recently used, [1], goes
    priors([[1], [4]])
    assert calls[-1] == [(1,)]
