"""Key-phrase boosting (model/boosting.py, its use in model/greedy.py, engine/phrases.py): the tree
(shared prefixes, failure arcs, weights), the choice it makes at one label, and greedy passes over
batches that mix streams with and without phrases, eagerly and in fixed shapes: a stream without
phrases gets the labels of the frame-looping reference, every stream those it gets alone."""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from frame_looping import frame_looping
from test_greedy import random_decoder

from parakeet_stream.engine.phrases import MAX_PHRASE_TOKENS, Phrase, PhraseError, boosting_tree, check_phrases
from parakeet_stream.model.boosting import FIRST_SHARE as H
from parakeet_stream.model.boosting import BoostingTree, BoostLimits, BoostPool, BoostRows, word_starts
from parakeet_stream.model.greedy import GreedyPass, unpack
from parakeet_stream.model.rnnt import DecoderState
from parakeet_stream.model.tokenizer import Tokenizer
from parakeet_stream.tools.transcribe import read_phrases

LIMITS = BoostLimits(root_width=8, nodes=64, arcs=128, arc_width=16)
STARTS = np.arange(21) % 3 == 0  # the random decoder's labels (blank, 20, aside) that start a word
STARTS[20] = False
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


def example() -> BoostingTree:
    # nodes by insertion: 1 = [1], 2 = [1 2], 3 = [1 2 3], 4 = [1 2 4], 5 = [2], 6 = [2 3]
    return BoostingTree([([1, 2, 3], 1.0), ([1, 2, 4], 2.0), ([2, 3], 1.0)], LIMITS)


def test_shared_prefixes_are_one_path_worth_the_largest_bonus():
    tree = example()
    assert tree.nodes == 7
    assert walk(tree, 0, 1) == (1, 2 * H)  # [1] shared by bonuses 1 and 2: 2 (a first token: its share)
    assert walk(tree, 1, 2) == (2, 2 * H + 2)
    assert walk(tree, 2, 3) == (3, 2 * H + 3) and walk(tree, 2, 4) == (4, 2 * H + 4)
    assert walk(tree, 0, 2) == (5, H) and walk(tree, 5, 3) == (6, H + 1)
    assert tree.done.tolist() == [0, 0, 0, 2 * H + 3, 2 * H + 4, 0, H + 1]  # what a complete phrase keeps


def test_failure_arcs_fall_back_to_the_longest_suffix_still_matching():
    tree = example()
    assert walk(tree, 2, 2) == (5, H)  # [1 2] then 2: only [2] still matches
    assert walk(tree, 4, 1) == (1, 2 * H)  # a phrase done, the next one starts
    assert walk(tree, 6, 2) == (5, H)
    assert walk(tree, 2, 9) == (0, 0.0) and walk(tree, 3, 7) == (0, 0.0)  # the match broken: back to the root
    assert walk(tree, 5, 1) == (1, 2 * H)


def test_a_node_earns_its_best_suffix_match():
    # [5 1] at a small bonus, [1] at a large one: after 5 1, the match worth more is the suffix [1]
    tree = BoostingTree([([5, 1, 7], 0.5), ([1, 8], 3.0)], LIMITS)
    node, value = walk(tree, walk(tree, 0, 5)[0], 1)
    assert value == 3 * H and walk(tree, node, 8)[1] == 3 * H + 3 and walk(tree, node, 7)[1] == 0.5 * H + 1


def test_trees_past_the_pool_limits_are_refused():
    with pytest.raises(ValueError):
        BoostingTree([([k], 1.0) for k in range(9)], LIMITS)  # 9 first tokens, room for 8
    with pytest.raises(ValueError):
        BoostingTree([([1, k], 1.0) for k in range(17)], LIMITS)  # 17 arcs from node [1], room for 16
    with pytest.raises(ValueError):
        BoostingTree([([1] * 64, 1.0)], LIMITS)


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


def test_boosting_chooses_which_label_only_where_the_model_emits_one():
    pool = BoostPool(3, LIMITS, torch.device("cpu"), np.zeros(9, dtype=bool))
    bonus = 1.5 / H  # the first token earns 1.5, the second 1.5 / H more
    pool.load(0, BoostingTree([([4, 6], bonus)], LIMITS))
    pool.load(2, BoostingTree([([4, 6], bonus)], LIMITS))
    pool.node[2] = 1  # slot 2 has matched [4] already
    rows = pool.rows(torch.arange(3), [0, 1, 2])
    logits = torch.zeros(3, 9)
    logits[:, 3] = 2.0  # the model's label: 3
    logits[:, 4] = 1.0  # 4 starts the phrase: 1 + 1.5 > 2
    label, node = rows.choose(logits, torch.full((3,), 3))  # and 6 continues it after [4]: 0 + 1.5 + bonus > 2
    assert label.tolist() == [4, 3, 6] and node.tolist() == [1, 0, 2]
    logits[:, 3] = 1.5 + bonus  # the model is surer: 3 wins over 1 + 1.5 and ties with 0 + 1.5 + bonus
    label, node = rows.choose(logits, torch.full((3,), 3))
    assert label.tolist() == [3, 3, 3] and node.tolist() == [0, 0, 0]  # ties keep the model's label


def test_a_complete_phrase_keeps_its_bonus_only_if_a_word_starts_next():
    starts = np.arange(9) < 3  # labels 0, 1, 2 start a word
    pool = BoostPool(2, LIMITS, torch.device("cpu"), starts)
    for slot in (0, 1):
        pool.load(slot, BoostingTree([([4, 6], 1.0)], LIMITS))
    pool.node[1] = 2  # slot 1 has just completed [4 6]
    rows = pool.rows(torch.arange(2), [0, 1])
    logits = torch.zeros(2, 9)
    logits[:, 5] = 1.0  # the model's label glues letters on: 5
    logits[:, 1] = 0.5  # the best label that starts a word: 1
    label, node = rows.choose(logits, torch.full((2,), 5))
    assert label.tolist() == [5, 1] and node.tolist() == [0, 0]


@pytest.mark.parametrize("seed", range(3))
def test_the_cpus_numpy_choice_is_the_torch_choice(seed):
    """HostBoostRows (eager passes on the CPU) against BoostRows at full widths (fixed shapes) and on
    row subsets (eager passes on a GPU): random trees and nodes, logits in steps of 0.5 and bonuses
    in steps of 0.25, so that candidates often tie exactly (the first in order must win)."""
    gen = np.random.default_rng(seed)
    pool = BoostPool(8, LIMITS, torch.device("cpu"), STARTS)
    nodes = []
    for slot in range(7):  # slot 7 has no phrases
        tree = BoostingTree([(gen.integers(0, 20, gen.integers(1, 5)).tolist(), float(gen.choice([0.5, 1.0, 2.0])))
                             for _ in range(3)], LIMITS)
        pool.load(slot, tree)
        nodes.append(tree.nodes)
    slots = torch.arange(8)
    for _ in range(60):
        pool.node[:7] = torch.from_numpy(gen.integers(0, nodes))
        host, fixed = pool.rows(slots, slots.tolist()), pool.rows(slots)
        device = BoostRows(pool, slots, *pool.widths.max(0).tolist())
        logits = torch.from_numpy(gen.integers(-6, 6, (8, 21)) / 2).float()
        logits[:, 20] = -9.0  # blank: the model emits a label
        label = logits.argmax(1)
        rows = torch.from_numpy(np.sort(gen.choice(8, gen.integers(1, 9), replace=False)))
        expected = [found[rows].tolist() for found in fixed.choose(logits, label)]
        for eager in (host, device):
            assert [found.tolist() for found in eager.choose(logits[rows], label[rows], rows)] == expected


TREES = [[([3, 5, 1], 2.0), ([7, 7], 1.0)], None, [([2, 9], 3.0), ([2, 4, 4, 6], 1.5)], None,
         [([3, 5, 1], 2.0), ([7, 7], 1.0)], [([11], 4.0)]]


def passes(decoder, enc, lengths, state, trees, fixed: bool, chunk: int = 4):
    """Greedy over `enc` in chunks of `chunk` frames, the decoder state and the boosting nodes
    carried between them as the runner carries them in its pools; [(label, frame)] per stream."""
    b = enc.size(0)
    pool = BoostPool(b + 1, LIMITS, torch.device("cpu"), STARTS)
    for slot, phrases in enumerate(trees):
        pool.load(slot, BoostingTree(phrases, LIMITS) if phrases else None)
    slots = torch.arange(b)
    out: list[list[tuple[int, int]]] = [[] for _ in range(b)]
    for at in range(0, enc.size(1), chunk):
        valid = (lengths - at).clamp(0, chunk)
        boost = pool.rows(slots) if fixed else pool.rows(slots, slots.tolist())
        done = GreedyPass(decoder, enc[:, at : at + chunk], valid, state, boost=boost)
        done.run(guard=(lambda active: nullcontext()) if fixed else None)
        if boost is not None:
            boost.save()
        state = DecoderState(*done.state())
        for stream, found in zip(out, unpack(done.packed().numpy())):
            stream += [(label, at + frame) for label, frame in found]
    return out


@pytest.mark.parametrize("fixed", [False, True])
@pytest.mark.parametrize("blank_bias", [-1.0, 1.0])
def test_a_mixed_batch_gives_each_stream_its_tokens_alone(fixed, blank_bias):
    decoder = random_decoder(blank_bias)
    gen = torch.Generator().manual_seed(7)
    b, frames = len(TREES), 24
    enc = torch.randn(b, frames, 32, generator=gen)
    lengths = torch.tensor([24, 20, 24, 9, 17, 24])
    state = decoder.initial_state(b)
    with torch.inference_mode():
        together = passes(decoder, enc, lengths, state, TREES, fixed)
        plain, _ = frame_looping(decoder, enc, lengths, state)
        for row, phrases in enumerate(TREES):
            alone = passes(decoder, enc[row : row + 1], lengths[row : row + 1], state.gather(torch.tensor([row])),
                           [phrases], fixed)
            assert together[row] == alone[0], row
            if phrases is None:
                assert together[row] == plain[row], row  # no phrases: the decoder without boosting
    assert sum(together[r] != plain[r] for r, phrases in enumerate(TREES) if phrases) >= 2  # boosting did act


def test_without_phrases_in_the_batch_there_is_nothing_to_boost():
    pool = BoostPool(4, LIMITS, torch.device("cpu"), STARTS)
    pool.load(1, BoostingTree([([1], 1.0)], LIMITS))
    assert pool.rows(torch.tensor([0, 2]), [0, 2]) is None
    assert pool.rows(torch.tensor([0, 1]), [0, 1]) is not None
    pool.load(1, None)  # the slot reused by a stream without phrases
    assert pool.rows(torch.tensor([0, 1]), [0, 1]) is None and int(pool.node[1]) == 0
