"""EngineAPI (engine/api.py): the in-process engine and the engine client both implement every
member, with the same parameters, so a door cannot tell which one it holds."""

from __future__ import annotations

import inspect

import pytest
from helpers import behind_service

from parakeet_stream.engine import ASREngine
from parakeet_stream.engine.api import EngineAPI
from parakeet_stream.engine.ipc.engine_client import EngineClient
from parakeet_stream.server.context import ServerContext

MEMBERS = [name for name in dir(EngineAPI) if not name.startswith("_")]


def test_the_protocol_names_what_the_doors_call():
    assert {"create_stream", "push_audio", "finalize", "cancel", "collect", "add_listener", "wait_for_update",
            "queue_position", "check_phrases", "check_language", "healthy", "stats", "latency_figures",
            "step_totals"} <= set(MEMBERS)
    assert {"sample_rate", "info"} <= set(EngineAPI.__annotations__)
    assert ServerContext.__annotations__["engine"] == "EngineAPI"  # (the server is typed against it)


@pytest.mark.parametrize("cls", [ASREngine, EngineClient])
def test_both_engines_take_every_member_s_parameters(cls):
    for name in MEMBERS:
        ours, theirs = getattr(EngineAPI, name), getattr(cls, name, None)
        assert callable(theirs), f"{cls.__name__} has no {name}"
        expected = [(p.name, p.kind, p.default) for p in inspect.signature(ours).parameters.values()]
        got = [(p.name, p.kind, p.default) for p in inspect.signature(theirs).parameters.values()]
        assert got == expected, (cls.__name__, name)


def test_a_live_engine_and_its_client_are_both_engine_apis(tiny_model_dir):
    with ASREngine(tiny_model_dir, max_num_streams=2) as engine, behind_service(engine) as client:
        assert isinstance(engine, EngineAPI) and isinstance(client, EngineAPI)
        assert client.info.sample_rate == engine.info.sample_rate == client.sample_rate
        assert not isinstance(object(), EngineAPI)
