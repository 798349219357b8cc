"""The Scheduler's lifecycle on its own: admission, queue positions, final, cancel, failure, slot reuse.

Sequences here carry only what the Scheduler touches (lifecycle and inbox): their front end and
decoder progress are None, so any reach into another party's state fails.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

from parakeet_stream.engine.errors import QueueFull
from parakeet_stream.engine.inbox import Inbox
from parakeet_stream.engine.policy import StepCost
from parakeet_stream.engine.admission import PROVEN, RAMP
from parakeet_stream.engine.scheduler import Scheduler
from parakeet_stream.engine.sequence import Sequence, Status
from parakeet_stream.model.conformer import chunk_spec

MODE = (70, 1)
SPEC = chunk_spec(MODE, 8)
HOP, N_FFT, RATE = 160, 512, 16000
_ids = iter(range(1, 10**6))


def seq(bulk: bool = False) -> Sequence:
    return Sequence(next(_ids), MODE, Inbox(SPEC, HOP, N_FFT), front=None, decoding=None, bulk=bulk)


def scheduler(slots: int = 2, queue: int = 3) -> Scheduler:
    return Scheduler(slots, queue, target=0.32, sample_rate=RATE, max_in_flight=2)


def give_chunks(s: Sequence, n: int) -> None:
    """Exactly enough samples to make the stream's next `n` chunks ready."""
    need = s.inbox.samples_for(s.inbox.chunks_ready + n - 1) - s.inbox.samples_in
    s.inbox.add(np.zeros(need, np.float32))


def test_admits_up_to_the_slots_then_queues_in_order():
    sch = scheduler()
    seqs = [seq() for _ in range(5)]
    assert [sch.add(s) for s in seqs] == [True, True, False, False, False]
    assert [s.status for s in seqs] == [Status.RUNNING] * 2 + [Status.WAITING] * 3
    assert sorted(s.slot for s in seqs[:2]) == [0, 1] and seqs[2].slot is None
    assert [sch.position(s) for s in seqs] == [0, 0, 1, 2, 3]
    with pytest.raises(QueueFull):
        sch.add(seq())
    assert sch.stats() == {"active": 2, "queued": 3, "free_slots": 0, "capacity": 2, "max_num_streams": 2, "max_queue": 3,
                           "streams_behind": 0, "longest_backlog_chunks": 0, "oldest_chunk_wait_s": 0.0}


def test_stats_say_how_far_behind_the_live_streams_were_at_the_last_plan(monkeypatch):
    now = [100.0]
    monkeypatch.setattr("parakeet_stream.engine.inbox.time.monotonic", lambda: now[0])
    sch = Scheduler(4, 4, target=0.32, sample_rate=RATE, max_in_flight=4)
    behind, on_time, idle = seq(), seq(), seq()
    for s in (behind, on_time, idle):
        sch.add(s)
    give_chunks(behind, 3)
    now[0] = 100.5
    give_chunks(on_time, 1)
    sch._plan(101.0)
    stats = sch.stats()
    assert (stats["streams_behind"], stats["longest_backlog_chunks"], stats["oldest_chunk_wait_s"]) == (1, 3, 1.0)


def test_a_plan_finds_the_streams_with_work_in_the_table_and_misses_none():
    """A plan takes the streams with a ready chunk (or their final) from the table (stream_table.py),
    without asking each stream; one with nothing is not among them, and none with a chunk, a final
    or audio sent while it was queued is missed."""
    sch = Scheduler(8, 8, target=0.32, sample_rate=RATE, max_in_flight=8)
    quiet, talking, waiting = seq(), seq(), seq()
    for s in (quiet, talking):
        sch.add(s)
    give_chunks(talking, 1)
    assert [item.seq for item in sch.schedule()] == [talking]
    assert sch.slots.with_work(sch._finals) == ([], []) and sch._plan(0.0) == (None, None)  # nobody has work left
    give_chunks(quiet, 2)
    assert [(r.item, r.chunks) for r in sch.slots.with_work(sch._finals)[0]] == [(quiet, 2)]
    sch.finalize(talking)
    assert {(item.seq, item.chunks, item.last) for item in sch.schedule()} == {(quiet, 2, False), (talking, 0, True)}
    give_chunks(waiting, 1)  # sent while queued (the scheduler knows nothing of it yet)
    sch.add(waiting)
    assert [item.seq for item in sch.schedule()] == [waiting]


def test_a_step_takes_the_ready_chunks():
    sch = scheduler()
    s = seq()
    sch.add(s)
    give_chunks(s, 3)
    step = sch.schedule()
    (item,) = step.items
    assert (item.seq, item.slot, item.chunks, item.first, item.last) == (s, s.slot, 3, True, False)
    assert item.samples_upto == s.inbox.samples_for(2) and len(item.ready_times) == 3
    assert (s.in_flight, s.inbox.chunks_taken) == (1, 3)
    give_chunks(s, 1)
    assert sch.schedule().items[0].first is False


def test_final_makes_the_last_step_then_the_stream_finishes_and_its_slot_goes_to_the_next():
    sch = scheduler(slots=1)
    s, waiter = seq(), seq()
    sch.add(s)
    sch.add(waiter)
    give_chunks(s, 1)
    assert sch.finalize(s) is True and sch.finalize(s) is False
    assert s.status is Status.FINALIZING and s.final_at is not None
    step = sch.schedule()
    item = step.items[0]
    assert item.last and item.chunks == 1 and item.samples_upto is None and item.final_at == s.final_at
    assert s.last_scheduled
    failed, changed = sch.postprocess(step)
    assert failed == [] and changed == [waiter]
    assert s.status is Status.FINISHED and s.slot is None
    assert waiter.status is Status.RUNNING and waiter.slot == 0 and sch.position(waiter) == 0


def test_final_with_nothing_ready_is_a_step_of_its_own():
    sch = scheduler()
    s = seq()
    sch.add(s)
    s.inbox.add(np.zeros(100, np.float32))  # less than a chunk
    sch.finalize(s)
    item = sch.schedule().items[0]
    assert item.last and item.chunks == 0 and item.ready_times == []


def test_a_long_backlog_goes_in_several_steps():
    sch = Scheduler(1, 1, target=0.32, sample_rate=RATE, max_chunks_per_step=4)
    s = seq()
    sch.add(s)
    give_chunks(s, 10)
    sch.finalize(s)
    steps = []
    while not s.last_scheduled:
        steps.append(sch.schedule())
        sch.postprocess(steps[-1])
    assert [(st.items[0].chunks, st.items[0].last) for st in steps] == [(4, False), (4, False), (2, True)]


def measured(sch: Scheduler, *batches: tuple[int, float]) -> None:
    """Give the Scheduler these measured round costs, (batch, seconds) each, and nothing else."""
    sch.admission.cost = StepCost()
    for batch, seconds in batches:
        sch.cost.record(batch, seconds)


def test_a_bulk_stream_takes_many_chunks_a_step_once_steps_are_measured():
    sch = Scheduler(1, 1, target=0.32, sample_rate=RATE, max_chunks_per_step=8)
    b = seq(bulk=True)
    sch.add(b)
    give_chunks(b, 20)
    first = sch.schedule()
    assert first.items[0].chunks == 1  # nothing measured: one round
    sch.postprocess(first)
    measured(sch, (1, 0.01))
    second = sch.schedule()
    assert second.items[0].chunks == 8
    sch.postprocess(second)
    measured(sch, (1, 0.05))
    assert sch.schedule().items[0].chunks == 5  # 5 rounds of 50 ms leave a 50 ms step for a new live chunk in 320


def live_and_bulk() -> tuple[Scheduler, Sequence, Sequence]:
    """A live stream with one chunk ready and a file with 20, on a Scheduler that measured 50 ms for
    one stream's step, 60 ms for two."""
    sch = Scheduler(2, 1, target=0.32, sample_rate=RATE, max_in_flight=2)
    live, b = seq(), seq(bulk=True)
    sch.add(live)
    sch.add(b)
    measured(sch, (1, 0.05), (2, 0.06))
    give_chunks(b, 20)
    give_chunks(live, 1)
    return sch, live, b


def test_bulk_work_gives_way_to_live_chunks_ready_and_due():
    sch, live, b = live_and_bulk()
    step = sch.schedule()
    # one bulk row would make the live chunk 10 ms later, more than a tenth of a one-stream step
    assert [(item.seq, item.chunks) for item in step] == [(live, 1)]
    sch.postprocess(step)
    measured(sch, (1, 0.05), (2, 0.06))
    (item,) = sch.schedule().items
    # it ends before the live stream's next chunk, predicted 2 packets (of 96 ms) after the first: 3 rounds,
    # where the budget alone would allow 5
    assert item.seq is b and 1 <= item.chunks <= 3


def test_bulk_work_waits_while_a_live_step_is_in_flight():
    sch, live, b = live_and_bulk()
    step = sch.schedule()
    later: list = []
    waiter = threading.Thread(target=lambda: later.append(sch.schedule()))
    waiter.start()
    waiter.join(0.2)
    assert waiter.is_alive()
    sch.postprocess(step)
    waiter.join(5)
    assert [item.seq for item in later[0]] == [b]


def test_a_bulk_stream_with_its_final_ends_in_one_step():
    sch = Scheduler(1, 1, target=0.32, sample_rate=RATE)
    b = seq(bulk=True)
    sch.add(b)
    measured(sch, (1, 0.01))
    give_chunks(b, 3)
    b.inbox.add(np.zeros(100, np.float32))
    sch.finalize(b)
    (item,) = sch.schedule().items
    assert (item.chunks, item.last) == (3, True)


def test_final_while_waiting_is_kept_until_admission():
    sch = scheduler(slots=1)
    running, waiting = seq(), seq()
    sch.add(running)
    sch.add(waiting)
    sch.finalize(waiting)
    assert waiting.status is Status.WAITING and waiting.final_at is not None
    sch.cancel(running)
    assert waiting.status is Status.FINALIZING


def test_cancel_while_waiting_moves_the_ones_behind_up():
    sch = scheduler(slots=1)
    seqs = [seq() for _ in range(4)]
    for s in seqs:
        sch.add(s)
    assert sch.cancel(seqs[1]) == seqs[2:]
    assert seqs[1].status is Status.CANCELLED
    assert [sch.position(s) for s in seqs] == [0, 0, 1, 2]


def test_cancel_while_running_frees_the_slot_for_the_next_waiter():
    sch = scheduler(slots=1)
    running, waiting = seq(), seq()
    sch.add(running)
    sch.add(waiting)
    assert sch.cancel(running) == [waiting]
    assert running.status is Status.CANCELLED and running.slot is None
    assert waiting.status is Status.RUNNING and sch.stats()["active"] == 1


def test_cancel_while_in_flight_keeps_the_slot_until_the_step_is_back():
    sch = scheduler(slots=1)
    s, waiting = seq(), seq()
    sch.add(s)
    sch.add(waiting)
    give_chunks(s, 1)
    step = sch.schedule()
    assert sch.cancel(s) == []
    assert s.status is Status.CANCELLED and s.slot == 0 and waiting.status is Status.WAITING
    assert not step.items[0].live
    _, changed = sch.postprocess(step)
    assert changed == [waiting] and s.slot is None and waiting.slot == 0
    assert sch.cancel(s) == []  # twice: nothing more


def test_a_failed_step_fails_its_streams_once_and_frees_their_slots():
    sch = scheduler(slots=2)
    a, b, waiting = seq(), seq(), seq()
    for s in (a, b, waiting):
        sch.add(s)
    give_chunks(a, 1)
    give_chunks(b, 1)
    step = sch.schedule()
    assert len(step) == 2
    failed, changed = sch.postprocess(step, failed=True)
    assert set(failed) == {a, b} and changed == [waiting]
    assert a.status is Status.FAILED and b.status is Status.FAILED and a.slot is None
    assert sch.finalize(a) is False
    assert sch.stats()["free_slots"] == 1


def test_a_third_step_waits_for_one_of_the_two_in_flight():
    sch = scheduler(slots=3)
    seqs = [seq() for _ in range(3)]
    steps = []
    for s in seqs[:2]:
        sch.add(s)
        give_chunks(s, 1)
        steps.append(sch.schedule())
    sch.add(seqs[2])
    give_chunks(seqs[2], 1)
    third: list = []
    waiter = threading.Thread(target=lambda: third.append(sch.schedule()))
    waiter.start()
    waiter.join(0.2)
    assert waiter.is_alive()
    sch.postprocess(steps[0])
    waiter.join(5)
    assert third[0].items[0].seq is seqs[2]


def test_stop_ends_schedule():
    sch = scheduler()
    sch.stop()
    assert sch.schedule() is None


# Admission by measured capacity: 160 ms chunks (SPEC's 16 mel frames of 10 ms), HEADROOM 0.8: a round of
# every live stream within 128 ms.
def admit_all(sch: Scheduler, seqs: list[Sequence]) -> list[bool]:
    """Add every stream, taking a step back after each (the pace admission lets streams in at)."""
    admitted = []
    for s in seqs:
        admitted.append(sch.add(s))
        sch.admission._admitted = 0  # as after a step taken back
    return admitted


def test_live_streams_wait_beyond_the_measured_capacity_however_many_slots_are_free():
    sch = Scheduler(200, 100, target=0.32, sample_rate=RATE)
    measured(sch, (1, 0.0735), (11, 0.0785))  # a line of 73 ms + 0.5 ms per stream: 110 streams in 128 ms
    assert sch.cost.most_streams(0.128, 1000) == 110
    measured(sch, (1, 0.076), (21, 0.086))  # 75.5 ms + 0.5 ms per stream: 105 streams
    seqs = [seq() for _ in range(110)]
    assert admit_all(sch, seqs) == [True] * 105 + [False] * 5
    assert sch.position(seqs[105]) == 1 and sch.stats()["free_slots"] == 0 and sch.stats()["capacity"] == 105
    assert not sch.add(seq(bulk=True))  # first come, first served: behind the waiting live streams


def test_bulk_streams_take_free_slots_beyond_the_live_capacity():
    sch = Scheduler(3, 3, target=0.32, sample_rate=RATE)
    measured(sch, (1, 0.060), (2, 0.110))  # 2 live streams
    assert admit_all(sch, [seq() for _ in range(2)]) == [True, True]
    assert sch.stats()["free_slots"] == 0  # for live streams
    assert sch.add(seq(bulk=True))  # files fill what live streams leave: slots alone decide


def test_a_waiting_stream_is_admitted_when_a_live_one_ends_or_steps_prove_cheaper():
    sch = Scheduler(10, 10, target=0.32, sample_rate=RATE)
    measured(sch, (1, 0.060), (2, 0.110))  # 10 ms + 50 ms per stream: 2 streams
    seqs = [seq() for _ in range(4)]
    assert [sch.add(s) for s in seqs] == [True, True, False, False]
    sch.finalize(seqs[0])
    step = sch.schedule()
    assert [item.seq for item in step] == [seqs[0]] and step.items[0].last
    measured(sch, (1, 0.060), (2, 0.110))
    sch.cost.alpha = 0.0  # the costs stay as set: this step's own time (no model ran) does not count
    failed, changed = sch.postprocess(step)
    assert not failed and changed[:1] == [seqs[2]] and seqs[2].status is Status.RUNNING  # the slot and the room
    assert seqs[3].status is Status.WAITING and sch.position(seqs[3]) == 1
    give_chunks(seqs[1], 1)
    step = sch.schedule()
    measured(sch, (1, 0.010), (2, 0.012))  # cheaper: 8 ms + 2 ms per stream, room for all
    sch.cost.alpha = 0.0
    sch.postprocess(step)
    assert seqs[3].status is Status.RUNNING and sch.stats()["queued"] == 0


def test_a_live_stream_stops_counting_against_capacity_when_cancelled_in_flight_or_failed():
    """Admission counts live streams as they come and go (no loop over every stream): one
    cancelled while its step is in flight, or failed by a step, makes room at once; a bulk
    stream never counts; a stream counted twice or taken back twice changes nothing."""
    sch = Scheduler(10, 10, target=0.32, sample_rate=RATE)
    measured(sch, (1, 0.060), (2, 0.110))  # 2 live streams
    a, b, waiting = seq(), seq(), seq()
    assert [sch.add(s) for s in (a, b, waiting)] == [True, True, False]
    bulk = seq(bulk=True)
    assert sch.add(bulk) is False  # behind the waiting live one, first come first served
    give_chunks(a, 1)
    give_chunks(b, 1)
    step = sch.schedule()
    sch.cancel(a)  # in flight: its slot stays until the step is back, its share of the capacity not
    assert len(sch.admission.live) == 1 and a.slot is not None
    sch.cost.alpha = 0.0
    failed, _ = sch.postprocess(step, failed=True)
    assert failed == [b] and waiting.status is Status.RUNNING and bulk.status is Status.RUNNING
    assert len(sch.admission.live) == 1 and sch.stats()["free_slots"] == 1  # the waiting one counts, the file not
    sch.cancel(a)
    sch.cancel(waiting)
    sch.cancel(waiting)
    assert len(sch.admission.live) == 0 and sch.stats()["free_slots"] == 9  # no live stream: slots alone (the file holds one)


def test_a_burst_is_let_in_a_quarter_more_at_a_time_past_what_ran_in_time():
    sch = Scheduler(100, 100, target=0.32, sample_rate=RATE)  # nothing measured: slots and the pace decide
    seqs = [seq() for _ in range(PROVEN + 14)]
    assert [sch.add(s) for s in seqs] == [True] * (PROVEN + RAMP) + [False] * (14 - RAMP)
    running = PROVEN + RAMP
    for expected in (5, 5):  # at most max(RAMP, a quarter of those running) a step
        for s in seqs[:running]:
            give_chunks(s, 1)
        sch.postprocess(sch.schedule())
        assert sch.stats()["active"] == running + expected
        running += expected


def test_past_what_was_proven_no_live_stream_is_let_in_after_a_step_in_time_without_room():
    sch = Scheduler(100, 100, target=0.32, sample_rate=RATE)  # nothing measured: slots and the pace decide
    seqs = [seq() for _ in range(PROVEN + 14)]
    assert [sch.add(s) for s in seqs] == [True] * (PROVEN + RAMP) + [False] * (14 - RAMP)
    running = PROVEN + RAMP
    for s in seqs[:running]:
        give_chunks(s, 1)
    step = sch.schedule()
    step.started -= 0.9 * 0.16  # its round took 90% of the 160 ms chunk period: in time, no room to spare
    sch.postprocess(step)
    assert sch.stats()["active"] == running and sch.stats()["queued"] == 14 - RAMP
    for s in seqs[:running]:
        give_chunks(s, 1)
    sch.postprocess(sch.schedule())  # a step with room: the pace goes on
    assert sch.stats()["active"] == running + 5


def test_the_cost_line_is_least_squares_never_negative():
    cost = StepCost()
    for batch, seconds in [(1, 0.010), (2, 0.012), (4, 0.016)]:
        cost.record(batch, seconds)
    fixed, per_stream = cost.line()
    assert fixed == pytest.approx(0.008) and per_stream == pytest.approx(0.002)
    flat = StepCost()
    for batch, seconds in [(1, 0.010), (64, 0.009)]:  # a GPU's flat step, noise making it fall
        flat.record(batch, seconds)
    assert flat.line()[1] == 0.0 and flat.most_streams(0.128, 4096) == 4096 and flat.most_streams(0.005, 4096) == 0


def test_past_what_ran_in_time_no_live_stream_is_admitted_for_a_while_after_a_live_chunk_came_late():
    sch = Scheduler(PROVEN + 10, 10, target=0.32, sample_rate=RATE)
    measured(sch, (1, 0.010), (2, 0.011))  # room for every slot
    seqs = [seq() for _ in range(PROVEN)]
    assert all(sch.add(s) for s in seqs)  # up to PROVEN: admitted at once
    give_chunks(seqs[0], 1)
    step = sch.schedule()
    step.items[0].ready_times[0] -= 0.5  # its chunk had waited half a second
    seqs[0].admitted_at -= 0.5  # (in its slot, not in the queue)
    sch.postprocess(step)
    assert not sch.add(seq()) and not sch.add(seq(bulk=True))  # the bulk one: behind the waiting live one
    sch.admission._behind_until = 0.0  # BEHIND_HOLD later
    give_chunks(seqs[0], 1)
    sch.postprocess(sch.schedule())
    assert sch.stats()["queued"] == 0 and sch.stats()["active"] == PROVEN + 2


def test_a_backlog_from_the_wait_for_a_slot_is_not_a_late_chunk_that_holds_admissions_back():
    sch = Scheduler(PROVEN + 10, 10, target=0.32, sample_rate=RATE)
    measured(sch, (1, 0.010), (2, 0.011))
    seqs = [seq() for _ in range(PROVEN)]
    assert all(sch.add(s) for s in seqs)
    give_chunks(seqs[0], 3)
    step = sch.schedule()
    # its chunks came while it waited in the queue, a second before it took its slot, and the step
    # carrying them ends more than the latency target after its admission: a catch-up, not a late step
    step.items[0].ready_times[:] = [t - 2.0 for t in step.items[0].ready_times]
    seqs[0].admitted_at -= 1.0
    sch.postprocess(step)
    assert sch.add(seq())
    give_chunks(seqs[0], 1)
    step = sch.schedule()
    step.items[0].ready_times[0] -= 0.5  # a chunk that came after its admission and waited: late
    sch.postprocess(step)
    assert not sch.add(seq())


def test_a_machine_slower_than_real_time_still_serves_one_live_stream_at_a_time():
    sch = Scheduler(4, 4, target=0.32, sample_rate=RATE)
    measured(sch, (1, 0.5), (2, 0.9))  # a round of one stream takes 0.5 s of a 0.16 s chunk
    assert [sch.add(seq()) for _ in range(3)] == [True, False, False] and sch.stats()["capacity"] == 1


def test_why_streams_wait_is_logged_once_each_time_the_reason_changes(caplog):
    caplog.set_level("INFO", logger="parakeet_stream.engine.admission")
    sch = Scheduler(3, 3, target=0.32, sample_rate=RATE)
    measured(sch, (1, 0.060), (2, 0.110))  # 2 live streams
    assert admit_all(sch, [seq() for _ in range(4)]) == [True, True, False, False]
    sch._admit_waiting()  # (the scheduling loop's turn)
    sch._admit_waiting()
    said = [r.getMessage() for r in caplog.records]
    assert said == ["admission: 2 stream(s) wait: the measured step cost serves 2 live streams in real time"]
    measured(sch, (1, 0.060), (2, 0.110), (3, 0.160))  # still 2: nothing new to say
    sch._admit_waiting()
    assert len(caplog.records) == 1


def test_steps_held_up_for_a_while_do_not_hold_admission_down_once_the_machine_recovered():
    """Each batch size's cost moves only while steps of that size run. Steps of two streams held up
    for seconds (the CPU taken by other work) left that size dear and the line said one stream; then
    only one-stream steps ran and nothing measured two again. What the last live step's batch serves
    at its own measured cost counts too, so a recovered machine admits what it did before."""
    sch = Scheduler(4, 4, target=0.32, sample_rate=RATE)
    measured(sch, (1, 0.007), (2, 0.009))  # the start-up measure: room for every slot
    a, b = seq(), seq()
    assert [sch.add(s) for s in (a, b)] == [True, True]
    for _ in range(2):  # two steps of both streams, held up 3 s each
        give_chunks(a, 1)
        give_chunks(b, 1)
        step = sch.schedule()
        step.started -= 3.0
        sch.postprocess(step)
    assert sch.cost.most_streams(0.128, 4) == 0  # the line: not even one stream in real time
    sch.cancel(b)
    give_chunks(a, 1)
    step = sch.schedule()  # the machine recovered: a step of one stream as cheap as ever
    sch.cost.alpha = 0.0
    sch.postprocess(step)
    assert sch.stats()["capacity"] == 4
    assert [sch.add(seq()) for _ in range(3)] == [True, True, True]
