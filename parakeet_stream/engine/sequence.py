"""One stream's data: its lifecycle, and its parts, each written by one party.

A Sequence holds state; behaviour lives with its writer.
- lifecycle (here): the Scheduler only, under its lock;
- `inbox` (inbox.py): client threads add samples; the others only take what was added;
- `front` (chunker.py): the pre-encode stage;
- `decoding` (results.py): the decode stage;
- `outbox` (results.py): the engine publishes results (on the decode thread; a failed step's error on
  the thread of the stage that failed), client threads take them; a stream with a `sink` (an
  engine service's WorkerConnection, ipc/service.py) gets its results there as rows instead (result_rows.py),
  and only errors and queue news in its outbox.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from ..model.boosting import BoostingTree
from ..model.config import Lookahead
from .chunker import FrontEnd
from .inbox import Inbox
from .results import DecoderProgress, Outbox


class Status(enum.Enum):
    WAITING = "waiting"  # queued for a slot
    RUNNING = "running"  # holds a slot, takes audio
    FINALIZING = "finalizing"  # the client's final came: the rest of its audio is being transcribed
    CANCELLED = "cancelled"  # the client left; in-flight work is dropped
    FAILED = "failed"  # a model stage raised on its step
    FINISHED = "finished"  # its final result is out and its slot released


DEAD = (Status.CANCELLED, Status.FAILED)


@dataclass(eq=False)  # identity: a stream is itself, not its field values
class Sequence:
    stream_id: int
    lookahead: Lookahead
    inbox: Inbox
    front: FrontEnd
    decoding: DecoderProgress
    outbox: Outbox = field(default_factory=Outbox)
    bulk: bool = False  # its audio is all there at once (a file): no deadlines, spare capacity only (policy.py)
    boosting: BoostingTree | None = None  # its key phrases (phrases.py), loaded into its slot at its first step
    prompt: int | None = None  # its language prompt (languages.py), written into its slot at its first step
    diarize: bool = False  # its results wait for the diarizer and carry speakers (diarizer.py)
    sink: Any = None  # where its results go as rows, a step's at once (`ASREngine.send_rows`); None: its outbox
    # lifecycle: written by the Scheduler only, under its lock; the others read it
    status: Status = Status.WAITING
    slot: int | None = None
    in_flight: int = 0  # scheduled steps not yet taken back (its chunks taken: its inbox's `chunks_taken`)
    last_scheduled: bool = False  # its last step is scheduled: nothing more to schedule
    final_at: float | None = None  # when the client's final came
    admitted_at: float | None = None  # when it took its slot
