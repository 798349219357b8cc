"""benchmarks.turn_probabilities: the demo model's <EOU> along a greedy pass, where the server's
turn ends come from, on the two-sentence fixture (1.5 s apart)."""
from __future__ import annotations

import numpy as np

from benchmarks.turn_probabilities import eou_per_frame, first_written, heard
from benchmarks.turns import silences, speech_end
from parakeet_stream.model.loading import load_model


def test_the_demo_model_writes_eou_after_each_sentence_and_nowhere_else(wavs):
    audio = np.concatenate([wavs["pause"], np.zeros(16000, np.float32)])
    (gap_start, gap_end), = [s for s in silences(audio, 1.0) if s[1] < len(audio) / 16000 - 0.5]
    ends = [gap_start, speech_end(audio)]
    p = eou_per_frame(load_model("demo").eval(), audio)
    at = heard(p)
    assert abs(len(p) - len(audio) / 1280) <= 2 and ((p >= 0) & (p <= 1)).all()
    written = at[p == 1]
    # one <EOU> (a frame or two) after each sentence's end, none inside a sentence
    assert len(written) and all(any(0 <= t - end < 0.6 for end in ends) for t in written), (written, ends)
    delays = [first_written(p, end) for end in ends]
    assert all(d is not None and 0 <= d < 0.6 for d in delays), delays
