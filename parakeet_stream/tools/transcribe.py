"""`parakeet-transcribe`: transcribe audio files through the cache-aware streaming engine.

Every file becomes a stream of the engine, fed in chunk-sized packets; many files are
decoded together in the engine's batches. `--offline` runs the whole-utterance forward
instead, for comparison.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field

import numpy as np
import torch

from ..audio import AudioError, read_audio
from ..engine import ASREngine
from ..engine.options import add_engine_arguments, engine_options
from ..host import single_threaded_host
from ..model.errors import ModelNotFound
from ..model.loading import load_model
from ..model.parakeet import ParakeetModel
from ..model.precision import set_precision
from ..model.registry import HUB_ALIASES


@dataclass
class Transcript:
    file: str
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    token_times: list[float] = field(default_factory=list)
    utterances: list[str] = field(default_factory=list)
    error: str | None = None

    def as_json(self) -> str:
        fields = {k: v for k, v in self.__dict__.items() if v is not None}
        fields["token_times"] = [round(t, 3) for t in self.token_times]  # ms: frame times carry float noise
        return json.dumps(fields, ensure_ascii=False)


def transcribe_streaming(engine: ASREngine, audios: dict[str, np.ndarray], lookahead=None) -> dict[str, Transcript]:
    """Feed every file as its own stream, all at once; the engine queues what does not fit."""
    packet = int(engine.chunk_seconds(lookahead) * engine.sample_rate)
    out = {name: Transcript(name) for name in audios}
    sids = {}
    for name, audio in audios.items():
        sid = engine.create_stream(lookahead)
        for i in range(0, len(audio), packet):
            engine.push_audio(sid, audio[i : i + packet])
        engine.finalize(sid)
        sids[name] = sid
    for name, sid in sids.items():
        _collect(engine, sid, out[name])
    return out


def _collect(engine: ASREngine, sid: int, t: Transcript) -> None:
    utterance = ""
    while True:
        engine.wait_for_update(sid, timeout=1.0)
        for r in engine.collect(sid):
            if r.error:
                t.error = f"{t.file}: the model failed on this file ({r.error})"
            t.token_ids += r.token_ids
            t.token_times += r.token_times
            t.text += r.text
            utterance += r.text
            if r.utterance_end or r.is_final:
                if utterance.strip():
                    t.utterances.append(utterance.strip())
                utterance = ""
            if r.is_final:
                t.text = t.text.strip()
                return


def transcribe_offline(model: ParakeetModel, audios: dict[str, np.ndarray], lookahead=None) -> dict[str, Transcript]:
    """Whole-utterance forward with the same chunked-limited attention, files batched with padding."""
    names = list(audios)
    feats = [model.features(torch.from_numpy(audios[n]))[0] for n in names]
    lengths = torch.tensor([f.size(0) for f in feats])
    batch = torch.nn.utils.rnn.pad_sequence(feats, batch_first=True)
    with torch.inference_mode():
        enc, enc_len = model.encoder(batch.to(model.encoder_dtype), lengths, lookahead)
        state = model.decoder.initial_state(len(names))
        emission, _ = model.decoder.decode(enc.float(), enc_len, state)
    out = {}
    for name, toks in zip(names, emission.per_stream(len(names))):
        ids = [tok for tok, _ in toks]
        out[name] = Transcript(name, ids, model.tokenizer.decode(ids).strip())
    return out


def load_audios(files: list[str]) -> tuple[dict[str, np.ndarray], dict[str, Transcript]]:
    audios, failed = {}, {}
    for f in files:
        try:
            audios[f] = read_audio(f)
        except AudioError as exc:
            failed[f] = Transcript(f, error=str(exc))
    return audios, failed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="parakeet-transcribe", description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", metavar="FILE")
    ap.add_argument("--model", default="demo",
                    help="demo, small, large, a Hugging Face ORG/NAME[@REVISION] (downloaded and converted once) "
                         "or a model folder (default: demo)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                    help="torch device: cpu, cuda or cuda:N (default: cuda where available, else cpu)")
    ap.add_argument("--offline", action="store_true", help="whole-utterance forward instead of streaming")
    ap.add_argument("--json", action="store_true", help="one JSON object per file per line")
    ap.add_argument("--max-num-streams", type=int, default=32, help="files decoded together")
    add_engine_arguments(ap)
    args = ap.parse_args(argv)
    single_threaded_host()
    try:
        model = set_precision(load_model(args.model, args.device), args.dtype, args.quantize)
        lookahead = model.encoder.check_lookahead(args.lookahead)
    except (ModelNotFound, ValueError) as exc:  # (DeviceError and PrecisionError are ValueErrors)
        offline = getattr(exc, "unreachable", False) and args.model in HUB_ALIASES
        hint = "; --model demo (the bundled demo model) needs no network" if offline else ""
        print(f"parakeet-transcribe: error: {exc}{hint}", file=sys.stderr)
        return 2
    audios, results = load_audios(args.files)
    if audios and args.offline:
        results.update(transcribe_offline(model, audios, lookahead))
    elif audios:
        options = engine_options(args) | {"dtype": model.encoder_dtype, "quantize": None, "lookahead": lookahead}  # already applied
        with ASREngine(model, args.device, max_num_streams=args.max_num_streams, max_queue=len(audios), **options) as engine:
            results.update(transcribe_streaming(engine, audios, lookahead))
    for f in args.files:
        _print(results[f], args.json)
    return 1 if any(r.error for r in results.values()) else 0


def _print(t: Transcript, as_json: bool) -> None:
    if as_json:
        print(t.as_json(), flush=True)
    elif t.error:  # (it names the file)
        print(f"parakeet-transcribe: error: {t.error}", file=sys.stderr)
    else:
        print(f"{t.file}: {t.text}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
