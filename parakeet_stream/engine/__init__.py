"""Multi-stream engine: Sequence, Scheduler, ModelRunner behind the ASREngine API.

One step, in order (`ASREngine.step`, step_route.py; spread over threads by pipeline.py): the
Scheduler picks it (scheduler.py, planner.py, policy.py), the runner pre-encodes, encodes and decodes it on
three stage threads (runner/model_runner.py, pipeline.py), the engine turns its tokens into results, the
Scheduler takes it back (postprocess) and the results are published to the streams' outboxes.

Beside the engine: the engine across processes (ipc/: service.py serves an ASREngine on a
Unix socket, engine_client.py's EngineClient offers the same stream API in another process, messages.py).

Glossary (one word per concept):
- stream: one client's audio, from create_stream to its final result; the API names it by id (`sid`).
- live / bulk: a live stream's audio arrives in real time and its chunks have deadlines; a bulk
  stream's audio (a file) is all there at once: no deadlines, the capacity live streams leave (policy.py).
- sequence (`Sequence`, `seq`): the engine's object for one stream (sequence.py).
- chunk: the audio one encoder step takes from one stream, lookahead included; it is ready
  once the samples whose frames reach its end (ChunkSpec.frames_through) arrived.
- step: the chunks of the streams the Scheduler chose to run together (step.py).
- stage: pre-encode, encode, decode: one thread each (pipeline.py).
- round: within a step, one chunk of each of its streams through the encoder and the decoder.
- batch: the chunks of one round in one lookahead mode: what the encoder and the decoder run at
  once (step.py's `Batch`; on CUDA one replay of a captured graph each, runner/cuda_graphs.py).
- slot: a stream's row in the encoder cache and decoder state pools.
- final: the client's end of input (`finalize`, `final_at`, `Status.FINALIZING`), and the
  stream's last result, which answers it (`StreamResult.is_final`).
- last: a stream's last step, which takes everything left (`StepItem.last`, `last_scheduled`).
- finished: the end of a stream's lifecycle: its final result is out and its slot released.
- end: only the end of an utterance (`utterance_end`) and the end time of a result (`end`).
- publish: put a result in the stream's outbox and wake its listeners.
"""

from .asr_engine import ASREngine
from .errors import EngineError, QueueFull
from .info import EngineInfo
from .results import StreamResult

__all__ = ["ASREngine", "EngineError", "EngineInfo", "QueueFull", "StreamResult"]
