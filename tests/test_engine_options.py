"""The engine's options outside its API: flags, the slot count sized to memory, stage thread policy."""

from __future__ import annotations

import argparse
import dataclasses
import os
import threading

import numpy as np
import pytest
import torch

from parakeet_stream import host
from parakeet_stream.engine import ASREngine
from parakeet_stream.engine import options
from parakeet_stream.engine.config import EngineConfig
from parakeet_stream.engine.runner.model_runner import ModelRunner
from parakeet_stream.model.conformer import EncoderCache

from helpers import run_stream


def test_flags_become_engine_keyword_arguments():
    ap = argparse.ArgumentParser()
    options.add_engine_arguments(ap)
    kwargs = options.engine_options(ap.parse_args(["--att-context-size", "70,6", "--threads", "3"]))
    assert kwargs["lookahead"] == (70, 6) and kwargs["threads"] == 3 and kwargs["dtype"] == "auto"
    assert set(kwargs) <= {field.name for field in dataclasses.fields(EngineConfig)}  # ASREngine's **options
    with pytest.raises(SystemExit):
        ap.parse_args(["--lookahead", "70"])


@pytest.mark.parametrize("value", ["0", "-1", "1.5", "two"])
def test_a_thread_count_below_one_or_not_a_whole_number_is_refused_by_the_flag_and_the_engine(value, capsys):
    ap = argparse.ArgumentParser()
    options.add_engine_arguments(ap)
    with pytest.raises(SystemExit):
        ap.parse_args(["--threads", value])
    assert "--threads: must be a whole number of threads, at least 1" in capsys.readouterr().err
    with pytest.raises(ValueError, match="threads must be at least 1"):
        ASREngine("demo", threads=0)


def test_auto_slots_fill_half_the_free_memory(eou_model, monkeypatch):
    per_slot = EncoderCache.slot_bytes(eou_model.cfg.encoder, torch.float32)
    cache = EncoderCache.zeros(eou_model.cfg.encoder, 1)
    assert per_slot == sum(t.numel() * t.element_size() for t in (cache.keys, cache.values, cache.conv))
    monkeypatch.setattr(options, "free_memory", lambda device: 20 * per_slot)
    assert options.auto_num_streams(eou_model, torch.device("cpu"), torch.float32) == 10
    assert options.auto_num_streams(eou_model, torch.device("cpu"), torch.float32, cap=4) == 4
    monkeypatch.setattr(options, "free_memory", lambda device: 0)
    assert options.auto_num_streams(eou_model, torch.device("cpu"), torch.float32) == 1


def test_only_the_encode_stage_gets_an_openmp_team_on_cpu():
    cpu = torch.device("cpu")
    assert host.stage_threads(cpu, encoder=True, threads=3) == 3
    assert host.stage_threads(cpu, encoder=True) == host.usable_cores()
    assert host.stage_threads(cpu, encoder=False, threads=3) == 1
    assert host.stage_threads(torch.device("cuda"), encoder=True, threads=3) is None


ALONE = {"pre_encode": ("pre-encode", 1), "encode": ("encode", 2), "decode": ("decode", 1)}
ONE_THREAD = {"pre_encode": ("step", 2), "encode": ("step", 2), "decode": ("step", 2)}


@pytest.mark.parametrize("cores, expected", [(4, ALONE), (2, ONE_THREAD)])
def test_each_stage_thread_runs_with_its_own_openmp_team(eou_model, monkeypatch, cores, expected):
    """The team sizes the stage threads set are the ones their work runs with (a thread's first
    query of its team used to reset it to the size another thread set last: the encoder ran on one).
    A team of 2 leaves cores free on 4 (pre-encode and decode have threads of their own,
    single-threaded); on 2 it takes every core, and the whole step runs on its thread, with its team."""
    monkeypatch.setattr(host, "usable_cores", lambda: cores)
    seen: dict[str, tuple[str, int]] = {}
    for name in ("pre_encode", "encode", "decode"):
        run = getattr(ModelRunner, name)

        def counted(self, step, run=run, name=name):
            seen[name] = (threading.current_thread().name, torch.get_num_threads())
            return run(self, step)

        monkeypatch.setattr(ModelRunner, name, counted)
    with ASREngine(eou_model, "cpu", max_num_streams=2, threads=2) as engine:
        results = run_stream(engine, np.zeros(16000, np.float32))
        totals = engine.step_totals()
    assert seen == expected
    # whichever thread ran it, each stage's time is counted under its own name (/metrics reports it)
    assert set(totals.seconds) == {"pre-encode", "encode", "decode", "results"} and all(totals.seconds.values())
    assert totals.chunks == sum(not r.is_final for r in results) and 1 <= totals.steps <= totals.chunks + 1


def test_other_stages_have_threads_of_their_own_only_where_the_encoders_team_leaves_a_core(monkeypatch):
    monkeypatch.setattr(host, "usable_cores", lambda: 4)
    cpu = torch.device("cpu")
    assert not host.stages_beside(cpu, 4)
    assert host.stages_beside(cpu, 3)
    assert host.stages_beside(torch.device("cuda"), None)


def test_the_cpu_quota_of_the_processs_cgroup_is_read_v2_and_v1(tmp_path, monkeypatch):
    membership = tmp_path / "cgroup"
    (tmp_path / "app").mkdir()
    membership.write_text("0::/app\n")
    (tmp_path / "app" / "cpu.max").write_text("150000 100000\n")
    assert host.cpu_quota(tmp_path, membership) == 1.5
    (tmp_path / "app" / "cpu.max").write_text("max 100000\n")
    assert host.cpu_quota(tmp_path, membership) is None
    v1 = tmp_path / "cpu" / "docker" / "x"
    v1.mkdir(parents=True)
    (v1 / "cpu.cfs_quota_us").write_text("50000\n")
    (v1 / "cpu.cfs_period_us").write_text("100000\n")
    membership.write_text("4:memory:/docker/x\n3:cpu,cpuacct:/docker/x\n")
    assert host.cpu_quota(tmp_path, membership) == 0.5
    monkeypatch.setattr(host, "cpu_quota", lambda: 0.5)  # a quota below one CPU still leaves one thread
    assert host.usable_cores() == 1
    monkeypatch.setattr(host, "cpu_quota", lambda: None)
    assert host.usable_cores() == len(os.sched_getaffinity(0))
