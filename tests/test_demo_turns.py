"""Turns with pauses inside them in the demo corpus (demo_model/turns.py, `demo_model.data --turns`):
one <EOU> at the turn's end whatever its pauses, the pauses inside the rendered speech, and the
corpora made without turns left as they were."""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from demo_model import data, turns
from parakeet_stream.model.config import ModelConfig
from parakeet_stream.model.parakeet import ParakeetModel
from parakeet_stream.model.tokenizer import Tokenizer
from parakeet_stream.training.data import DB, Example, collate, example_features, speech_end
from parakeet_stream.training.objective import Transducer

ROOT = Path(__file__).resolve().parent.parent
SENTENCES = ["the dog is very big", "it was a good day", "please bring the red box home",
             "we can paint it tomorrow morning", "where is the old car"]
ESPEAK_ONLY = {"augment": False, "mix": {"espeak": 1.0}, "reverb_prob": 0.0, "telephone_prob": 0.0}


def plan(n: int, opts: dict = ESPEAK_ONLY) -> list[dict]:
    return turns.plan_turns(n, SENTENCES, 7, lambda rng, split: data.pick_voice(rng, split, opts["mix"]),
                            lambda rng: data.pick_augment(rng, opts))


class Feats:  # the part of FeatureSet that collate reads
    def feats(self, i: int) -> np.ndarray:
        return np.zeros((50, 80), np.float16)


def test_a_turn_is_its_sentences_with_pauses_inside_and_one_eou_at_its_end():
    tok = Tokenizer(ROOT / "weights" / "demo" / "tokenizer.model")
    items = plan(40)
    kinds = set()
    for it in items:
        # the words are the segments' words: the pauses cut the text, they do not change it
        assert " ".join(s.rstrip(".") for s in it["segments"]) == it["text"]
        assert len(it["pauses_s"]) == len(it["segments"]) - 1 == len(it["pause_kinds"]) >= 1
        assert all(turns.PAUSE_RANGE[0] <= p <= turns.PAUSE_RANGE[1] for p in it["pauses_s"])
        assert it["split"] == "train" and it["synth"] == "espeak"
        kinds |= set(it["pause_kinds"])
    assert kinds == {"word", "sentence"}
    # the trainer's targets (demo_model/train.py): a turn alone ends with its only <EOU> ...
    targets = [tok.encode(it["text"]) for it in items[:2]]
    b = collate(Feats(), targets, [Example((0,), 50)], np.random.default_rng(0), tok.eou_id, augment=False)
    y = b.targets[0, : b.target_lengths[0]].tolist()
    assert y.count(tok.eou_id) == 1 and y[-1] == tok.eou_id
    assert tok.decode(y) == items[0]["text"]
    # ... and two joined by the trainer still get one after each: a finished turn ends
    b = collate(Feats(), targets, [Example((0, 1), 100)], np.random.default_rng(0), tok.eou_id, augment=False)
    y = b.targets[0, : b.target_lengths[0]].tolist()
    assert [k for k, t in enumerate(y) if t == tok.eou_id] == [len(targets[0]), len(y) - 1]


def quiet_runs(y: np.ndarray, shortest: float) -> list[tuple[float, float]]:
    """(start, length) in seconds of the runs of 10 ms frames 40 dB under the loudest, at least `shortest` long."""
    frames = y[: len(y) // 160 * 160].astype(np.float64).reshape(-1, 160)
    quiet = np.concatenate([[False], (frames ** 2).mean(1) <= (frames ** 2).mean(1).max() * 1e-4, [False]])
    edges = np.flatnonzero(np.diff(quiet.astype(int)))
    return [(a / 100, (b - a) / 100) for a, b in zip(edges[::2], edges[1::2]) if (b - a) / 100 >= shortest]


@pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="espeak-ng is not installed")
def test_the_pauses_are_silence_inside_one_rendering_of_the_turn():
    it = {**plan(1)[0], "segments": ["the dog is very big.", "it was a", "good day"], "pauses_s": [0.6, 0.9],
          "pause_kinds": ["sentence", "word"], "text": "the dog is very big it was a good day"}
    y = data.render_audio(it)  # no augmentation: speech alone, dithered
    speech = np.flatnonzero(np.abs(y) > 300)
    inside = [(s, n) for s, n in quiet_runs(y, 0.25) if speech[0] / 16000 < s and s + n < speech[-1] / 16000]
    assert [round(n, 1) for _, n in inside] == [0.6, 0.9]
    assert turns.ssml(it["segments"], it["pauses_s"]) == (
        '<speak>the dog is very big. <break time="600ms"/> it was a <break time="900ms"/> good day</speak>')


def test_turns_are_drawn_from_train_voices_only():
    mix = {"espeak": 0.5, "flite": 0.35, "festival": 0.15}
    items = plan(300, {"augment": True, "mix": mix, "reverb_prob": 0.25, "telephone_prob": 0.15})
    held = {("flite", "rms"), ("festival", "ked_diphone")}
    for it in items:
        assert (it["synth"], it["voice"]) not in held
        assert it["voice"] not in data.HELDOUT_ACCENTS and it["variant"] not in data.HELDOUT_VARIANTS
    assert {it["synth"] for it in items} == set(mix)


def test_a_corpus_without_turns_keeps_its_configuration():
    opts = data.synth_options(data.parse_args([]))
    plain = data.corpus_config(data.parse_args([]), opts)
    with_turns = data.corpus_config(data.parse_args(["--turns", "10", "--train-limit", "5"]), opts)
    assert "turns" not in plain
    assert {k: v for k, v in with_turns.items() if k != "turns"} == plain
    assert with_turns["turns"]["n"] == 10


def test_hesitations_only_keeps_the_same_turns_without_the_pauses_between_sentences():
    opts = ESPEAK_ONLY
    every = {it["id"]: it for it in plan(60)}
    kept = turns.plan_turns(10, SENTENCES, 7, lambda rng, split: data.pick_voice(rng, split, opts["mix"]),
                            lambda rng: data.pick_augment(rng, opts), sentence_pauses=False)
    assert len(kept) == 10
    for it in kept:
        assert set(it["pause_kinds"]) == {"word"}
        assert it == every[it["id"]]  # the same item (and so the same audio) as in a corpus with all pauses


def test_end_silence_lengthens_the_silence_after_the_last_word_only():
    class Speech:  # 50 loud frames, then 20 quiet ones
        def feats(self, i: int) -> np.ndarray:
            return np.concatenate([np.full((50, 80), 5.0), np.full((20, 80), -10.0)]).astype(np.float16)

    one = Example((0,), 70)
    assert example_features(Speech(), one, np.random.default_rng(0))[0].shape == (70, 80)  # off: as before
    lengths = []
    for seed in range(8):
        x, ends = example_features(Speech(), one, np.random.default_rng(seed), end_silence=2.0)
        assert ends == [50]
        assert np.array_equal(x[:70], Speech().feats(0)) and (x[70:] == -10.0).all()
        lengths.append(len(x) - 70)
    assert max(lengths) > 30 and all(n <= 200 for n in lengths)
    # the targets do not change: the <EOU> may come anywhere in the longer silence
    plain = collate(Speech(), [[3, 4]], [one], np.random.default_rng(1), 9, augment=True)
    longer = collate(Speech(), [[3, 4]], [one], np.random.default_rng(1), 9, augment=True, end_silence=2.0)
    assert plain.targets.tolist() == longer.targets.tolist() == [[3, 4, 9]]


def speech(n_before: int, n_speech: int, n_after: int, floor: float, seed: int = 0) -> np.ndarray:
    """Log-mel frames: noise at `floor`, then speech 30 dB above it, then noise again."""
    rng = np.random.default_rng(seed)
    x = floor + rng.normal(0, 0.3, (n_before + n_speech + n_after, 80))
    x[n_before:n_before + n_speech] += 30 * DB + rng.normal(0, 1.0, (n_speech, 80))
    return x.astype(np.float16)


def test_speech_end_is_the_frame_after_the_last_one_above_the_noise():
    assert speech_end(speech(30, 50, 40, floor=-15.0)) == 80
    assert speech_end(speech(0, 50, 70, floor=-5.0)) == 50  # no lead-in silence, a louder floor
    assert speech_end(speech(0, 60, 0, floor=-15.0)) == 60  # speech to the last frame
    quiet_tail = speech(20, 50, 40, floor=-15.0)
    quiet_tail[60:70] -= 20 * DB  # the last word 20 dB softer: 10 dB above the noise, still speech
    assert speech_end(quiet_tail) == 70
    quiet_tail[60:70] -= 8 * DB  # 2 dB above the noise: not speech
    assert speech_end(quiet_tail) == 60
    quiet_tail[90:92] += 35 * DB  # a click: too short for speech
    assert speech_end(quiet_tail) == 60


def test_each_eou_target_carries_where_its_speech_ends():
    class Parts:
        def feats(self, i: int) -> np.ndarray:
            return speech(10, 40 + 20 * i, 30, floor=-15.0, seed=i)

    b = collate(Parts(), [[3, 4], [5]], [Example((0, 1), 200)], np.random.default_rng(3), 9, augment=False)
    assert b.targets.tolist() == [[3, 4, 9, 5, 9]]
    first, pause = len(Parts().feats(0)), int(b.lengths[0]) - 80 - 100
    assert pause > 0  # a pair is joined by a pause made of the first part's silence
    assert b.eou_frames.tolist() == [[-1, -1, 50, -1, first + pause + 10 + 60]]


def test_the_trainer_counts_only_alignments_with_the_eou_in_its_window():
    torch.manual_seed(0)
    trainer = Transducer(ParakeetModel(ModelConfig.load(ROOT / "weights" / "demo" / "config.json")))
    feats = torch.randn(2, 160, 80)
    lengths, targets = torch.tensor([160, 120]), torch.tensor([[5, 6, 7, 256], [8, 256, 0, 0]])
    eou = torch.tensor([[-1, -1, -1, 90], [-1, 60, -1, -1]])
    args = (feats, lengths, targets, torch.tensor([4, 2]))
    with torch.no_grad():
        free = trainer(*args, ctc_weight=0.0)["rnnt"]
        tight = trainer(*args, ctc_weight=0.0, eou_frames=eou, eou_window=2)["rnnt"]
        wide = trainer(*args, ctc_weight=0.0, eou_frames=eou, eou_window=100)["rnnt"]
    assert tight > free + 0.01
    # a window reaching every frame from the speech's end on keeps the alignments that put the
    # <EOU> there; only the earlier ones go
    assert free <= wide < tight


def test_turn_synths_leaves_out_only_the_other_synthesizers_turns():
    from argparse import Namespace

    from demo_model.train import train_subset

    class Train:  # what train_subset reads of a FeatureSet
        def __init__(self, records):
            self.records = records
            self.lengths = np.arange(len(records)) * 10

        def __len__(self):
            return len(self.records)

        def feats(self, i):
            return np.full((2, 80), i, np.float16)

    train = Train([{"synth": "espeak"}, {"synth": "flite"}, {"synth": "flite", "segments": ["a", "b"]},
                   {"synth": "espeak", "segments": ["c", "d"]}, {"synth": "festival", "segments": ["e", "f"]}])
    args = Namespace(train_limit=0, turn_synths="espeak", turn_repeat=1)
    kept = train_subset(train, args)
    assert [r["synth"] for r in kept.records] == ["espeak", "flite", "espeak"]
    assert kept.lengths.tolist() == [0, 10, 30] and kept.feats(2)[0, 0] == 3
    assert train_subset(train, Namespace(train_limit=0, turn_synths="", turn_repeat=1)) is train
    assert len(train_subset(train, Namespace(train_limit=3, turn_synths="", turn_repeat=1))) == 3
    twice = train_subset(train, Namespace(train_limit=0, turn_synths="espeak", turn_repeat=2))
    assert twice.lengths.tolist() == [0, 10, 30, 30]  # the sentences once, the espeak-ng turn twice
    # another corpus's turns (not its sentences) join them
    more = Train([{"synth": "espeak"}, {"synth": "espeak", "segments": ["g", "h"]}])
    joined = train_subset(train, args, more)
    assert joined.lengths.tolist() == [0, 10, 30, 10] and joined.feats(3)[0, 0] == 1
    assert joined.records[3] is more.records[1]


@pytest.mark.parametrize("flag,value,said", [("--turn-repeat", "0", "at least 1"),
                                             ("--eou-window", "0.01", "at least one encoder frame"),
                                             ("--eou-window", "-1", "0 (off)"),
                                             ("--turns-from", "/nonexistent", "no train.jsonl")])
def test_the_trainer_refuses_bad_turn_options_before_building_anything(tmp_path, flag, value, said):
    from demo_model.train import main

    with pytest.raises(SystemExit) as refused:
        main(["--data", str(tmp_path / "corpus"), flag, value, "--nice", "0"])
    assert said in str(refused.value) and flag in str(refused.value)
    assert not (tmp_path / "corpus").exists()  # no corpus build started
