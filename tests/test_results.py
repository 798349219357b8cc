"""The result builder (text, times, end of utterance) and the outbox results wait in."""

from __future__ import annotations

import pytest

from parakeet_stream.engine.results import MAX_PENDING_RESULTS, DecoderProgress, Outbox, ResultBuilder, StreamResult

FS = 0.08  # seconds per encoder frame


@pytest.fixture(scope="module")
def eou_tok(eou_model):
    assert eou_model.tokenizer.eou_id is not None
    return eou_model.tokenizer


@pytest.fixture(scope="module")
def plain_tok(nemotron_model):
    assert nemotron_model.tokenizer.eou_id is None
    return nemotron_model.tokenizer


def test_text_of_the_chunks_adds_up_to_the_tokenizers_and_the_final_flushes(plain_tok):
    ids = plain_tok.encode("hello world again")
    builder, progress = ResultBuilder(FS, None, 10), DecoderProgress(plain_tok)
    parts = [builder.build(1, progress, [(i, 0, 1.0)], 2, False, 0.01) for i in ids]
    final = builder.build(1, progress, [], 0, True, None)
    assert "".join(r.text for r in parts) + final.text == plain_tok.decode(ids)
    assert [r.token_ids for r in parts] == [[i] for i in ids] and final.token_ids == []
    assert final.is_final and not any(r.is_final for r in parts)
    assert parts[0].stream_id == 1 and parts[0].latency == 0.01 and final.latency is None


def test_token_times_count_from_the_start_of_the_stream(plain_tok):
    a, b, c = plain_tok.encode("one two three")[:3]
    builder, progress = ResultBuilder(FS, None, 100), DecoderProgress(plain_tok)
    first = builder.build(1, progress, [(a, 1, 0.9), (b, 3, 0.5)], 4, False, 0.0)
    empty = builder.build(1, progress, [], 4, False, 0.0)
    third = builder.build(1, progress, [(c, 2, 1.0)], 4, False, 0.0)
    assert first.token_times == pytest.approx([1 * FS, 3 * FS])
    assert first.token_confidences == [0.9, 0.5] and empty.token_confidences == []
    assert (first.start, first.end) == pytest.approx((1 * FS, 3 * FS))
    assert (empty.start, empty.end, empty.token_times) == (None, None, [])
    assert third.token_times == pytest.approx([10 * FS]) and third.start == pytest.approx(10 * FS)
    assert [r.audio_seconds for r in (first, empty, third)] == pytest.approx([4 * FS, 8 * FS, 12 * FS])


def test_eou_token_ends_the_utterance(eou_tok):
    word = eou_tok.encode("hello")[0]
    eou = eou_tok.eou_id
    builder, progress = ResultBuilder(FS, eou, 1), DecoderProgress(eou_tok)
    assert not builder.build(1, progress, [(word, 0, 1.0)], 4, False, 0.0).utterance_end
    assert not builder.build(1, progress, [], 4, False, 0.0).utterance_end  # blanks do not end it with <EOU>
    ended = builder.build(1, progress, [(word, 0, 1.0), (eou, 1, 1.0)], 4, False, 0.0)
    assert ended.utterance_end and "<EOU>" not in ended.text
    assert not progress.utterance_has_tokens
    after = builder.build(1, progress, [(eou, 0, 1.0), (word, 2, 1.0)], 4, False, 0.0)
    assert after.utterance_end and progress.utterance_has_tokens  # a token after <EOU> opens the next one


def test_without_eou_a_run_of_blank_frames_ends_the_utterance_once(plain_tok):
    word = plain_tok.encode("hello")[0]
    builder, progress = ResultBuilder(FS, None, 6), DecoderProgress(plain_tok)
    ends = [builder.build(1, progress, tokens, 4, False, 0.0).utterance_end
            for tokens in ([], [(word, 1, 1.0)], [], [], [], [])]
    # the token is at frame 5; frames 6..11 are the six blank ones: the third chunk (frames 8..11) ends it
    assert ends == [False, False, True, False, False, False]
    assert not progress.utterance_has_tokens


def test_no_utterance_ends_before_any_token(plain_tok):
    builder, progress = ResultBuilder(FS, None, 2), DecoderProgress(plain_tok)
    assert not any(builder.build(1, progress, [], 4, False, 0.0).utterance_end for _ in range(5))


def test_a_chunk_without_tokens_says_how_far_decoding_got_and_how_sure_the_end_is(plain_tok, eou_tok):
    word = plain_tok.encode("hello")[0]
    builder, progress = ResultBuilder(FS, None, 8), DecoderProgress(plain_tok, language="en")
    builder.build(1, progress, [(word, 1, 1.0)], 4, False, 0.0)  # the token at frame 1
    quiet = [builder.build(1, progress, [], 4, False, 0.02) for _ in range(2)]
    assert [r.end_of_utterance for r in quiet] == pytest.approx([6 / 8, 1.0])  # frames 2..7, then 2..11
    assert [r.utterance_end for r in quiet] == [False, True]
    assert [r.audio_seconds for r in quiet] == pytest.approx([8 * FS, 12 * FS])
    assert quiet[0].latency == 0.02 and quiet[0].language == "en" and quiet[0].text == "" and not quiet[0].is_final
    eou_builder, eou_progress = ResultBuilder(FS, eou_tok.eou_id, 1), DecoderProgress(eou_tok)
    heard = eou_builder.build(2, eou_progress, [], 4, False, 0.0, eou=0.37)
    assert heard.end_of_utterance == pytest.approx(0.37) and not heard.utterance_end and heard.stream_id == 2


def test_outbox_merges_beyond_its_limit_and_take_empties_it():
    box = Outbox()
    for i in range(MAX_PENDING_RESULTS + 3):
        box.publish(StreamResult(1, [i], f"{i} ", is_final=False))
    taken, waited = box.take()
    assert len(taken) == MAX_PENDING_RESULTS and box.take() == ([], None)
    assert waited is not None and 0 <= waited < 5  # since the first publish
    assert [t for r in taken for t in r.token_ids] == list(range(MAX_PENDING_RESULTS + 3))
    assert taken[-1].text == "".join(f"{i} " for i in range(MAX_PENDING_RESULTS - 1, MAX_PENDING_RESULTS + 3))


def test_outbox_listeners_hear_every_publish_and_notify():
    box, heard = Outbox(), []
    box.listen(lambda: heard.append("a"))
    box.publish(StreamResult(1, [], "", is_final=False))
    box.notify()
    assert heard == ["a", "a"]
    assert box.listen(lambda: heard.append("b"), unless_waiting=True) is False  # a result is waiting
    box.take()
    listener = lambda: heard.append("c")  # noqa: E731
    assert box.listen(listener, unless_waiting=True) is True
    box.unlisten(listener)
    box.notify()
    assert heard == ["a", "a", "a"]


def test_merge_keeps_the_first_start_and_the_last_end():
    early = StreamResult(1, [5], "a", is_final=False, start=0.1, end=0.2, token_times=[0.1], audio_seconds=0.5)
    later = StreamResult(1, [6], "b", is_final=True, utterance_end=True, start=0.4, end=0.6, token_times=[0.6],
                         audio_seconds=1.0, latency=0.03)
    early.merge(later)
    assert (early.token_ids, early.text, early.token_times) == ([5, 6], "ab", [0.1, 0.6])
    assert (early.start, early.end, early.audio_seconds, early.latency) == (0.1, 0.6, 1.0, 0.03)
    assert early.is_final and early.utterance_end
