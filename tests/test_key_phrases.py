"""Key phrases on every API: each API's field reaches the engine as the same validated phrases (a
spy around the real engine notes what every stream is created with; what boosting does to a
transcript is the decoder's, tested with it), through each API's official client where its other
tests use one, and bad phrase input (empty, 10,000 phrases, a 1 MB phrase, control characters,
wrong types, bad weights) is refused in that API's own error shape while a good stream beside it
transcribes exactly as it does alone."""
from __future__ import annotations

import grpc
import openai
import pytest
import riva.client as riva_client
import test_deepgram as dg
import test_openai_realtime as oai
import test_riva as rv
import test_uploads_deepgram as dg_files
import test_uploads_openai as oai_files
import trio
from helpers import (
    Raw,
    SpyEngine,
    audio_file,
    audio_messages,
    multipart,
    openai_error,
    post,
    result_tokens,
    running_server,
    transcribe_raw,
    url,
    wait_until,
)
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from parakeet_stream.client import encode_audio
from parakeet_stream.engine.phrases import MAX_PHRASES, Phrase, boosting_tree
from parakeet_stream.server.protocols.deepgram import parse_phrases
from parakeet_stream.server.protocols.riva.errors import RivaError
from parakeet_stream.server.protocols.riva.options import parse_config
from parakeet_stream.server.streams.phrases import FieldPhraseError, openai_phrases, prompt_phrases
from parakeet_stream.server.transport.codes import ProtocolError


@pytest.fixture(scope="module")
def engine(either_engine):
    """Every test here in-process and across the engine client API."""
    return either_engine


ASKED = ("Anya Okafor", "Kubernetes")
EXPECTED = (Phrase("Anya Okafor"), Phrase("Kubernetes"))
HINTED = tuple(Phrase(p.text, hint=True) for p in EXPECTED)  # the same, read out of a prompt
# bad phrase lists every API refuses, and a word of what it says
BAD = {
    "empty": ([""], "must not be empty"),
    "10,000 phrases": ([f"w{i}" for i in range(10_000)], f"at most {MAX_PHRASES} phrases"),
    "1 MB phrase": (["x" * 1_000_000], "at most 100 characters"),
    "control characters": (["Anya\x00Okafor"], "control"),
}
TOO_LONG = "supercalifragilisticexpialidocious"  # what the spy refuses as too many tokens long, as the engine does


async def good_beside(ctx, sentence, solo_tokens, attack) -> None:
    """`attack(ctx)` while a good native stream runs; that stream's tokens are its solo ones."""
    good = {}

    async def run_good() -> None:
        good["results"] = await transcribe_raw(url(ctx, "tcp"), sentence, paced=0.02)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run_good)
        await attack(ctx)
    assert result_tokens(good["results"]) == solo_tokens


# -- the rules, alone -------------------------------------------------------------------------


@pytest.mark.parametrize("prompt, named", [
    ("Names: Anya Okafor, Kubernetes", ASKED),
    ("Names:\nAnya Okafor\nkubectl\n\netcd at 10:30", ("Anya Okafor", "kubectl", "etcd at 10:30")),
    ("The call is with Anya Okafor about our Kubernetes cluster and the new iPhone app.",
     ("Anya Okafor", "Kubernetes", "iPhone")),
    ("Expect words related to technology and medicine", ()),
    ("Please transcribe the GPT-4o release notes; k8s", ("GPT-4o", "k8s")),
    ("", ()),
])
def test_openai_prompt_names_its_list_items_or_the_names_in_its_sentences(prompt, named):
    assert prompt_phrases(prompt) == tuple(Phrase(text, hint=True) for text in named)


def test_openai_keywords_come_first_and_the_prompt_fills_the_room_left():
    keywords = [f"k{i}" for i in range(MAX_PHRASES - 2)]
    prompt = ", ".join(["k1", *(f"p{i}" for i in range(10))])
    phrases = openai_phrases(keywords, prompt)
    assert [p.text for p in phrases] == [*keywords, "p0", "p1"]  # k1 once; room for two more
    assert openai_phrases([], "Kubernetes, Kubernetes") == (Phrase("Kubernetes", hint=True),)
    with pytest.raises(FieldPhraseError) as error:
        openai_phrases([""], "Kubernetes")
    assert error.value.field == "keywords"
    with pytest.raises(FieldPhraseError) as error:
        openai_phrases(["Acme"], "Anya\x07Okafor")
    assert error.value.field == "prompt" and error.value.code == "invalid_phrases"


def test_deepgram_keyterms_are_phrases_and_keyword_intensifiers_weights():
    params = [("keyterm", "customer service"), ("keywords", "Acme:2.5"), ("keywords", "Zed"), ("keyterm", "Acme"),
              ("model", "nova-3")]
    assert parse_phrases(params) == (Phrase("customer service"), Phrase("Acme", 2.5), Phrase("Zed"))
    assert parse_phrases([("keyterm", "term:0.15")]) == (Phrase("term:0.15"),)  # Deepgram: a keyterm is literal
    for value, said in [("Acme:-3", "suppressing"), ("Acme:0", "above 0"), ("Acme:11", "at most 10"),
                        ("Acme:high", "must be a number"), ("Acme:", "must be a number"), (":2", "empty")]:
        with pytest.raises(ProtocolError) as error:
            parse_phrases([("keywords", value)])
        assert error.value.code == "invalid_phrases" and said in error.value.message, (value, error.value.message)


def test_riva_boost_is_a_weight_of_twenty_per_unit():
    config = rv.recognition_config()
    riva_client.add_word_boosting_to_config(config, ["Anya Okafor", "Kubernetes"], 20.0)
    riva_client.add_word_boosting_to_config(config, ["kubectl"], 4.0)
    config.speech_contexts.append(rv.rasr.SpeechContext(phrases=["etcd"]))  # boost 0
    assert parse_config(config).phrases == (*EXPECTED, Phrase("kubectl", 0.2), Phrase("etcd"))
    for boost, said in [(-5.0, "negative"), (201.0, "from 0 to 200"), (float("nan"), "from 0 to 200")]:
        config = rv.recognition_config()
        riva_client.add_word_boosting_to_config(config, ["Kubernetes"], boost)
        with pytest.raises(RivaError) as error:
            parse_config(config)
        assert error.value.status == grpc.StatusCode.INVALID_ARGUMENT and said in error.value.message


# -- native protocol (TCP and WebSocket) --------------------------------------------------------


@pytest.mark.parametrize("kind", ["tcp", "ws"])
async def test_native_start_phrases_reach_the_engine_and_show_in_started(engine, sentence, kind):
    spy = SpyEngine(engine)
    asked = ["Anya  Okafor", {"text": "Kubernetes", "weight": 2}, {"text": "Kubernetes"}, "Zoë Ünal"]
    async with running_server(spy) as ctx, Raw.open(url(ctx, kind)) as conn:
        await conn.send({"type": "start", "phrases": asked})
        started = (await conn.until("started"))[-1]
        for message in audio_messages(sentence):
            await conn.send(message)
        await conn.until("result", is_final=True)
    # echoed as the model writes them (the demo model: lower case, no accents)
    assert started["phrases"] == [{"text": "anya okafor", "weight": 1.0}, {"text": "kubernetes", "weight": 2.0},
                                  {"text": "zoe unal", "weight": 1.0}]
    assert spy.created[-1] == (started["stream_id"], (Phrase("Anya Okafor"), Phrase("Kubernetes", 2.0), Phrase("Zoë Ünal")))
    assert spy.phrases()[0] == ()  # the stream opened at connect, before the start: reopened


NATIVE_BAD = {
    **{name: (phrases, said) for name, (phrases, said) in BAD.items()},
    "not a list": ("Kubernetes", "Expected `array"),
    "a number": ([5], "Expected `str | object`"),
    "weight as text": ([{"text": "Kubernetes", "weight": "high"}], "Expected `float | null`"),
    "weight 0": ([{"text": "Kubernetes", "weight": 0}], "weight must be a number above 0"),
    "weight 11": ([{"text": "Kubernetes", "weight": 11}], "at most 10"),
    "characters the model cannot write": (["Anya Okafor", "日本"], "cannot write: '日本'"),
    "no text": ([{"weight": 2}], "'phrases[0].text' is required"),
    "a misspelled field": ([{"text": "Kubernetes", "boost": 2}], "unknown field"),
}


async def test_native_bad_phrases_are_refused_and_a_good_stream_is_unaffected(engine, sentence, solo_tokens):
    async def attack(ctx) -> None:
        for name, (phrases, said) in NATIVE_BAD.items():
            async with Raw.open(url(ctx, "tcp")) as conn:
                await conn.send({"type": "start", "phrases": phrases})
                errors = [m for m in await conn.rest() if m["type"] == "error"]
            assert [e["code"] for e in errors] == ["invalid_phrases"], (name, errors)
            assert said in errors[0]["message"] and len(errors[0]["message"]) < 200, (name, errors[0])
        async with Raw.open(url(ctx, "ws")) as conn:
            await conn.send({"type": "config", "phrases": [""]})
            assert (await conn.rest())[-1]["code"] == "invalid_phrases"
        assert conn.close_code == 1008

    async with running_server(SpyEngine(engine)) as ctx:
        await good_beside(ctx, sentence, solo_tokens, attack)


async def test_the_engines_token_limit_is_refused_the_same_way(engine):
    async with running_server(SpyEngine(engine, too_many_tokens=(TOO_LONG,))) as ctx:
        async with Raw.open(url(ctx, "tcp")) as conn:
            await conn.send({"type": "start", "phrases": ["Anya Okafor", TOO_LONG]})
            errors = [m for m in await conn.rest() if m["type"] == "error"]
    assert [e["code"] for e in errors] == ["invalid_phrases"] and "tokens" in errors[0]["message"]


# -- Deepgram live and pre-recorded ---------------------------------------------------------------


async def test_deepgram_keyterms_and_keywords_reach_every_segment(engine, sentence):
    """Two segments (Finalize between them): each boosts the phrases of the URL."""
    pcm = encode_audio(sentence, "pcm16")

    def script(socket) -> None:
        for _ in range(2):
            for piece in dg.chunks(pcm, 16000, 2):
                socket.send_media(piece)
            socket.send_finalize()
        socket.send_close_stream()

    spy = SpyEngine(engine)
    async with running_server(spy) as ctx:
        messages = await dg.in_thread(dg.run_sdk(
            ctx, script, encoding="linear16", sample_rate=16000, keyterm=["Anya Okafor", "Kubernetes"],
            keywords=["kubectl:3", "etcd"],
        ))
    expected = (*EXPECTED, Phrase("kubectl", 3.0), Phrase("etcd"))
    assert messages[-1]["type"] == "Metadata"
    assert spy.phrases() == [expected, expected]


DEEPGRAM_BAD = {
    "empty": ("keyterm=", 400, "must not be empty"),
    "101 phrases": ("&".join(f"keyterm=w{i}" for i in range(101)), 400, f"at most {MAX_PHRASES} phrases"),
    "a 101-character phrase": ("keyterm=" + "x" * 101, 400, "at most 100 characters"),
    "control characters": ("keyterm=Anya%00Okafor", 400, "control"),
    "suppression": ("keywords=Acme:-5", 400, "suppressing"),
    "intensifier as text": ("keywords=Acme:high", 400, "must be a number"),
    # what the model cannot take: at the handshake too, not at the first audio
    "too many tokens for the model": (f"keyterm={TOO_LONG}", 400, "tokens"),
    "characters the model cannot write": ("keyterm=%E6%97%A5%E6%9C%AC", 400, "cannot write"),
    # beyond what a WebSocket handshake may carry (16 KiB): refused by the WebSocket layer
    "10,000 phrases": ("&".join(f"keyterm=w{i}" for i in range(10_000)), 400, ""),
    "1 MB phrase": ("keyterm=" + "x" * 1_000_000, 400, ""),
}


async def test_deepgram_live_bad_phrases_fail_the_handshake_in_deepgrams_shape(engine, sentence, solo_tokens):
    async def attack(ctx) -> None:
        base = f"ws://127.0.0.1:{ctx.config.ports['ws']}/v1/listen?encoding=linear16&sample_rate=16000&"

        def attempt(query: str):
            with pytest.raises(InvalidStatus) as info:
                connect(base + query)
            return info.value.response

        for name, (query, status, said) in DEEPGRAM_BAD.items():
            response = await trio.to_thread.run_sync(attempt, query)
            assert response.status_code == status, (name, response.status_code, response.body[:300])
            body = response.body.decode()
            assert said in body, (name, body[:300])
            if said:  # Deepgram's shape, naming the field
                assert '"err_code":"INVALID_QUERY_PARAMETER","err_msg":"key' in body, body

    async with running_server(SpyEngine(engine, too_many_tokens=(TOO_LONG,))) as ctx:
        await good_beside(ctx, sentence, solo_tokens, attack)


async def test_deepgram_files_take_the_same_phrases_and_refusals(engine, sentence):
    wav = audio_file(sentence)
    spy = SpyEngine(engine, too_many_tokens=(TOO_LONG,))
    async with running_server(spy) as ctx:
        response = await dg_files.transcribe_file(ctx, wav, keyterm=["Anya Okafor"], keywords=["kubectl:3"])
        empty = await dg_files.refused(ctx, lambda media: media.transcribe_file(request=wav, keyterm=[""]))
        many = await dg_files.refused(ctx, lambda media: media.transcribe_file(
            request=wav, keyterm=[f"w{i}" for i in range(101)]))
        negative = await dg_files.refused(ctx, lambda media: media.transcribe_file(request=wav, keywords=["Acme:-1"]))
        tokens = await dg_files.refused(ctx, lambda media: media.transcribe_file(request=wav, keyterm=[TOO_LONG]))
        huge = "&".join(f"keyterm=w{i}" for i in range(10_000))
        oversized = await post(ctx.config.ports["http"], f"/v1/listen?{huge}", wav, "audio/wav")
    assert dg_files.alternative(response)["transcript"]
    assert spy.phrases() == [(Phrase("Anya Okafor"), Phrase("kubectl", 3.0))]
    assert oversized.status == 431  # the HTTP port's limit on a request's head (16 KiB)
    for error, said in [(empty, "empty"), (many, "at most 100 phrases"), (negative, "suppressing"), (tokens, "tokens")]:
        assert error.status_code == 400 and error.body["err_code"] == "INVALID_QUERY_PARAMETER", error.body
        assert said in error.body["err_msg"] and set(error.body) == {"err_code", "err_msg", "request_id"}


# -- OpenAI Realtime and file transcriptions ----------------------------------------------------------


def transcription(**fields) -> dict:
    return {"type": "transcription", "audio": {"input": {"turn_detection": None, "transcription": fields}}}


async def test_openai_realtime_keywords_and_prompt_apply_from_the_next_item(engine, sentence):
    pcm = encode_audio(oai.at_rate(sentence, oai.RATE), "pcm16")

    async def script(session) -> None:
        updated = await session.update(transcription(keywords=["kubectl"], prompt="Names: Anya Okafor, Kubernetes"))
        assert updated["session"]["audio"]["input"]["transcription"]["keywords"] == ["kubectl"]
        await session.transcribe(pcm)
        await session.update(transcription(prompt="A call with Anya Okafor about the iPhone."))
        await session.transcribe(pcm)
        await session.update(transcription(model="gpt-4o-transcribe"))  # no keywords, no prompt: none
        await session.transcribe(pcm)

    spy = SpyEngine(engine)
    async with running_server(spy) as ctx:
        await oai.in_thread(oai.run_sdk(ctx, script))
    assert spy.phrases() == [
        (Phrase("kubectl"), *HINTED), (Phrase("Anya Okafor", hint=True), Phrase("iPhone", hint=True)), (),
    ]


OPENAI_PATH = "session.audio.input.transcription"
OPENAI_BAD = {
    "empty": ({"keywords": [""]}, "keywords", "must not be empty"),
    "10,000 phrases": ({"keywords": [f"w{i}" for i in range(10_000)]}, "keywords", "length <= 100"),
    "1 MB phrase": ({"keywords": ["x" * 1_000_000]}, "keywords", "at most 100 characters"),
    "control characters": ({"keywords": ["Anya\x00Okafor"]}, "keywords", "control"),
    "keywords not a list": ({"keywords": "Kubernetes"}, "keywords", "Expected `array"),
    "a 1 MB prompt": ({"prompt": "x" * 1_000_000}, "prompt", "length <= 4096"),  # the prompt's own limit
    "control characters in the prompt": ({"prompt": "Anya\x07Okafor"}, "prompt", "control"),
    "too many tokens for the model": ({"keywords": [TOO_LONG]}, "keywords", "tokens"),
    "characters the model cannot write": ({"keywords": ["日本"]}, "keywords", "cannot write: '日本'"),
}


async def test_openai_realtime_bad_phrases_are_error_events_and_the_session_goes_on(engine, sentence, solo_tokens):
    pcm = encode_audio(oai.at_rate(sentence, oai.RATE), "pcm16")
    errors = []

    async def script(session) -> None:
        await session.update(transcription(keywords=["Kubernetes"]))
        for fields, _, _ in OPENAI_BAD.values():
            await session.connection.session.update(session=transcription(**fields))
            errors.append(await session.until("error", len(errors) + 1))
        await session.transcribe(pcm)  # with the settings before the refused updates

    spy = SpyEngine(engine, too_many_tokens=(TOO_LONG,))

    async def attack(ctx) -> None:
        await oai.in_thread(oai.run_sdk(ctx, script))

    async with running_server(spy) as ctx:
        await good_beside(ctx, sentence, solo_tokens, attack)
    for (name, (_, field, said)), event in zip(OPENAI_BAD.items(), errors):
        error = event["error"]
        code = "invalid_field" if name == "a 1 MB prompt" else "invalid_phrases"
        assert error["code"] == code and error["type"] == "invalid_request_error", (name, error)
        assert error["param"] == f"{OPENAI_PATH}.{field}" and said in error["message"], (name, error)
    assert (Phrase("Kubernetes"),) in spy.phrases()


async def test_openai_prompt_names_the_model_cannot_write_are_left_out_not_refused(engine, sentence):
    """A prompt is a hint: a name in it with characters the model has no piece for is left out
    (an explicit keyword would be refused), accents are dropped where that makes a name writable."""
    pcm = encode_audio(oai.at_rate(sentence, oai.RATE), "pcm16")

    async def script(session) -> None:
        await session.update(transcription(prompt="Names: 日本, Zoë, Anya Okafor"))
        await session.transcribe(pcm)

    spy = SpyEngine(engine)
    async with running_server(spy) as ctx:
        events = await oai.in_thread(oai.run_sdk(ctx, script))
    assert not [e for e in events if e["type"] == "error"]
    assert spy.phrases() == [tuple(Phrase(text, hint=True) for text in ("日本", "Zoë", "Anya Okafor"))]
    tree = boosting_tree(spy.phrases()[0], engine.info.tokenizer)
    assert tree.root_token.tolist() == sorted({engine.info.tokenizer.encode(w)[0] for w in ("zoe", "anya okafor")})


async def test_openai_files_keywords_and_prompt(engine, sentence):
    wav = audio_file(sentence)
    spy = SpyEngine(engine, too_many_tokens=(TOO_LONG,))
    form = "multipart/form-data; boundary=b0undary"
    async with running_server(spy) as ctx:
        port = ctx.config.ports["http"]
        result = await oai_files.create(ctx, wav, keywords=["kubectl"], prompt="Names: Anya Okafor, Kubernetes.")
        spied = spy.phrases()
        refusals = {}
        for name, (phrases, _) in BAD.items():
            body = multipart({}, wav)[: -len("--b0undary--\r\n")]
            body += b"".join(f'--b0undary\r\nContent-Disposition: form-data; name="keywords[]"\r\n\r\n{p}\r\n'.encode()
                             for p in phrases) + b"--b0undary--\r\n"
            refusals[name] = await post(port, oai_files.PATH, body, form)
        with pytest.raises(openai.BadRequestError) as sdk_error:
            await oai_files.create(ctx, wav, keywords=["Acme"], prompt="Anya\x07Okafor")
        tokens = await post(port, oai_files.PATH, multipart({"keywords[]": TOO_LONG}, wav), form)
    assert result.text is not None and spied == [(Phrase("kubectl"), *HINTED)]
    assert sdk_error.value.body["code"] == "invalid_phrases" and sdk_error.value.body["param"] == "prompt"
    for name in ("empty", "control characters"):
        assert BAD[name][1] in openai_error(refusals[name], 400, "invalid_phrases")["message"], name
    assert openai_error(refusals["10,000 phrases"], 400, "invalid_phrases")["param"] == "keywords[]"
    assert "65536 bytes" in openai_error(refusals["1 MB phrase"], 400, "invalid_request")["message"]  # the form's
    assert "tokens" in openai_error(tokens, 400, "invalid_phrases")["message"]


# -- NVIDIA Riva ------------------------------------------------------------------------------------


async def test_riva_speech_contexts_reach_the_engine_streaming_and_offline(engine, sentence):
    pcm = encode_audio(sentence, "pcm16")
    config = rv.streaming_config()
    riva_client.add_word_boosting_to_config(config, list(ASKED), 20.0)
    riva_client.add_word_boosting_to_config(config, ["kubectl"], 60.0)
    expected = (*EXPECTED, Phrase("kubectl", 3.0))

    def run(ctx):
        streamed = rv.stream(ctx, rv.chunks(pcm), config)
        offline = rv.service(ctx).offline_recognize(pcm, config.config)
        return streamed, offline

    spy = SpyEngine(engine)
    async with running_server(spy) as ctx:
        streamed, offline = await rv.in_thread(run, ctx)
    assert rv.finals(streamed) and offline.results
    # streaming: the stream that held the call's place until its config came, then the config's
    assert spy.phrases() == [(), expected, expected]


async def test_riva_bad_speech_contexts_are_invalid_argument(engine, sentence, solo_tokens):
    def contexts(phrases, boost=20.0):
        config = rv.streaming_config()
        riva_client.add_word_boosting_to_config(config, phrases, boost)
        return config

    cases = {name: (contexts(phrases), said) for name, (phrases, said) in BAD.items()}
    cases["negative boost"] = (contexts(["Acme"], -10.0), "negative")
    cases["too many tokens"] = (contexts([TOO_LONG]), "tokens")
    cases["characters the model cannot write"] = (contexts(["日本"]), "cannot write")

    def run(ctx):
        out = {}
        for name, (config, _) in cases.items():
            out[name] = rv.rpc_error(lambda: rv.stream(ctx, iter([b"\0\0"]), config))
            out[f"{name}, offline"] = rv.rpc_error(lambda: rv.service(ctx).offline_recognize(b"\0\0", config.config))
        return out

    async def attack(ctx) -> None:
        errors.update(await rv.in_thread(run, ctx))

    errors = {}
    async with running_server(SpyEngine(engine, too_many_tokens=(TOO_LONG,))) as ctx:
        await good_beside(ctx, sentence, solo_tokens, attack)
        await wait_until(lambda: engine.stats()["active"] == engine.stats()["queued"] == 0)
    for name, (_, said) in cases.items():
        for error in (errors[name], errors[f"{name}, offline"]):
            assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, (name, error)
            assert said in error.details() and "speech_contexts" in error.details(), (name, error.details())
