"""`parakeet-transcribe`: transcribe audio files through the cache-aware streaming engine.

Every file becomes a bulk stream of the engine, fed by the server's file path (server/protocols/files:
decoded block by block, pushed as fast as the engine takes it); as many files as the engine has
slots are decoded together in its batches, many chunks a step, in the model's longest lookahead
mode unless --lookahead says otherwise. Output: text, JSON, or SRT / WebVTT subtitles, printed or
written to `--out DIR`. `--offline` runs the whole-utterance forward instead, for comparison.
`--phrases FILE` boosts key phrases (names, products, jargon) in every file's decoding; `--language`
is what a multilingual model transcribes (default: its automatic language identification).
`--diarizer NAME` gives each word its speaker: JSON words carry `speaker`, subtitles a speaker per
cue, text a line per speaker turn (`[A] ...`, speakers named in the order they first speak).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import trio
from tqdm import tqdm

from .. import subtitles
from ..arguments import ArgumentParser
from ..audio import AudioError, check_file, read_audio
from ..engine import ASREngine, EngineError
from ..engine.languages import Languages
from ..engine.options import add_engine_arguments, engine_options
from ..engine.phrases import MAX_WEIGHT, Phrase, PhraseError, boosting_tree, check_phrases
from ..engine.diarizer_model import load_diarizer
from ..engine.policy import bulk_lookahead
from ..host import single_threaded_host
from ..model.device import AUTO, resolve_device
from ..model.config import UnsupportedModel
from ..model.convert import ConvertError
from ..model.errors import ModelNotFound
from ..model.loading import check_lookaheads, load_model
from ..model.parakeet import ParakeetModel
from ..model.precision import set_precision
from ..model.registry import HUB_ALIASES
from ..server.protocols.files.batch import ArraySource, FileSource, transcribe_files
from ..server.protocols.files.transcript import FileTranscript

FORMATS = ("txt", "json", "srt", "vtt")


@dataclass
class Transcript:
    file: str
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    token_times: list[float] = field(default_factory=list)
    utterances: list[str] = field(default_factory=list)
    error: str | None = None
    words: list[dict] = field(default_factory=list)
    language: str | None = None  # a multilingual model's: the file's, or the one it identified last

    def as_json(self) -> str:
        fields = {k: v for k, v in self.__dict__.items() if v is not None}
        fields["token_times"] = [round(t, 3) for t in self.token_times]  # ms: frame times carry float noise
        return json.dumps(fields, ensure_ascii=False)


def transcribe_streaming(engine: ASREngine, audios: dict[str, np.ndarray], lookahead=None) -> dict[str, Transcript]:
    """Feed every file as its own stream, as many at once as the engine has slots."""
    sources = {name: ArraySource(audio) for name, audio in audios.items()}
    return {name: as_transcript(name, t) for name, t in _run(transcribe_files, engine, sources, lookahead).items()}


def _run(fn, *args):
    """trio.run; from inside a running Trio loop (a blocking call made from async code, as the
    old synchronous transcribe_streaming allowed), in a thread of its own."""
    try:
        trio.lowlevel.current_trio_token()
    except RuntimeError:
        return trio.run(fn, *args)
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(trio.run, fn, *args).result()


def as_transcript(name: str, t: FileTranscript) -> Transcript:
    if t.error and not t.token_ids:
        return Transcript(name, error=t.error)
    return Transcript(name, t.token_ids, t.text, t.token_times, [u.text for u in t.utterances], t.error, t.words,
                      t.language)


def transcribe_offline(model: ParakeetModel, audios: dict[str, np.ndarray], lookahead=None,
                       language: str | None = None) -> dict[str, Transcript]:
    """Whole-utterance forward with the same chunked-limited attention, files batched with padding,
    in `language` (a multilingual model's prompt name, as Languages.resolve gives it)."""
    names = list(audios)
    feats = [model.features(torch.from_numpy(audios[n]))[0] for n in names]
    lengths = torch.tensor([f.size(0) for f in feats])
    batch = torch.nn.utils.rnn.pad_sequence(feats, batch_first=True)
    with torch.inference_mode():
        enc, enc_len = model.encoder(batch.to(model.encoder_dtype), lengths, lookahead)
        state = model.decoder.initial_state(len(names))
        prompts = None if language is None else torch.full((len(names),), model.cfg.prompt.index(language))
        emission, _ = model.decoder.decode(model.prompted(enc.float(), prompts), enc_len, state)
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
    ap = ArgumentParser(prog="parakeet-transcribe", description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", metavar="FILE")
    ap.add_argument("--model", default="demo",
                    help="demo, small, large, multilingual, a Hugging Face ORG/NAME[@REVISION] (downloaded and converted once) "
                         "or a model folder (default: demo)")
    ap.add_argument("--device", default=AUTO,
                    help="torch device: auto (cuda where torch sees a GPU, else cpu; the default), cpu, cuda or cuda:N")
    ap.add_argument("--offline", action="store_true", help="whole-utterance forward instead of streaming")
    ap.add_argument("--json", action="store_true", help="one JSON object per file per line (--format json)")
    ap.add_argument("--format", choices=FORMATS, default=None,
                    help="txt (default), json, srt or vtt (subtitles: a cue ends with its utterance or when its "
                         "2 lines of --max-line-chars are full)")
    ap.add_argument("--out", type=Path, default=None, metavar="DIR",
                    help="write NAME.FORMAT in DIR for each file (default: print)")
    ap.add_argument("--max-line-chars", type=int, default=subtitles.MAX_LINE_CHARS,
                    help=f"subtitle line length (default {subtitles.MAX_LINE_CHARS})")
    ap.add_argument("--max-num-streams", type=int, default=32, help="files decoded together")
    ap.add_argument("--language", default=None,
                    help="a multilingual model's language: a locale such as de-DE, a language such as de, or auto "
                         "(its automatic language identification; the default)")
    ap.add_argument("--diarizer", default="off",
                    help="who spoke each word: demo (bundled, synthetic voices only), sortformer (NVIDIA's "
                         "diar_streaming_sortformer_4spk-v2, downloaded once), a Hugging Face ORG/NAME, a .nemo file or "
                         "a folder holding one; off: none (default)")
    ap.add_argument("--phrases", type=Path, default=None, metavar="FILE",
                    help="key phrases to boost: one per line, optionally followed by a TAB and a weight "
                         f"(above 0, at most {MAX_WEIGHT:g}; default 1: the default boost, 2 twice it)")
    add_engine_arguments(ap)
    args = ap.parse_args(argv)
    args.device = resolve_device(args.device)
    single_threaded_host()
    if args.model == "demo":
        print("parakeet-transcribe: the demo model understands synthetic speech only (espeak-ng, flite, festival); "
              "--model small transcribes real speech", file=sys.stderr)
    args.format = args.format or ("json" if args.json else "txt")
    if problem := output_problem(args):
        print(f"parakeet-transcribe: error: {problem}", file=sys.stderr)
        return 2
    try:
        check_lookaheads(args.model, [args.lookahead] if args.lookahead else [])  # before the weights load
        model = set_precision(load_model(args.model, args.device), args.dtype, args.quantize)
        modes = model.cfg.encoder.att_context_sizes
        lookahead = model.encoder.check_lookahead(args.lookahead or bulk_lookahead(modes))
        language = Languages(tuple(model.cfg.prompt.languages) if model.cfg.prompt else ()).resolve(args.language)
        args.diarizer = None if args.diarizer == "off" else load_diarizer(args.diarizer)
    except EngineError as exc:
        print(f"parakeet-transcribe: error: --language: {exc.message}", file=sys.stderr)
        return 2
    except (ModelNotFound, ValueError, ConvertError, UnsupportedModel) as exc:  # (DeviceError, PrecisionError: ValueErrors)
        offline = getattr(exc, "unreachable", False) and args.model in HUB_ALIASES
        hint = "; --model demo (the bundled demo model) needs no network" if offline else ""
        print(f"parakeet-transcribe: error: {exc}{hint}", file=sys.stderr)
        return 2
    try:
        phrases = read_phrases(args.phrases, model) if args.phrases else ()
    except (OSError, UnicodeDecodeError, PhraseError) as exc:
        reason = exc.message if isinstance(exc, PhraseError) else getattr(exc, "strerror", None) or "not UTF-8 text"
        print(f"parakeet-transcribe: error: --phrases {args.phrases}: {reason}", file=sys.stderr)
        return 2
    if args.offline:
        audios, results = load_audios(args.files)
        if audios:
            results.update(transcribe_offline(model, audios, lookahead, language))
        for f in args.files:
            emit(results[f], None, args)
    else:
        results = _transcribe_paths(args, model, lookahead, phrases, language)
    return 1 if any(r.error for r in results.values()) else 0


def read_phrases(path: Path, model: ParakeetModel) -> tuple[Phrase, ...]:
    """A --phrases file: one phrase a line, `TEXT` or `TEXT<TAB>WEIGHT`; empty lines skipped.
    PhraseError names the first problem, the model's token limit included."""
    items = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        text, tab, weight = line.partition("\t")
        if not text.strip() and not tab:
            continue
        try:
            items.append((text, float(weight) if tab else None))
        except ValueError:
            raise PhraseError(f"line {n}: the weight after the TAB must be a number, got {weight!r}") from None
    phrases = check_phrases(items)
    boosting_tree(phrases, model.tokenizer)  # the streams build it again: here its errors come first
    return phrases


def output_problem(args: argparse.Namespace) -> str | None:
    """Why the output options cannot work together (and, with --out, the folder made)."""
    subtitle = args.format in ("srt", "vtt")
    if args.phrases and args.offline:
        return "--phrases boosts the streaming decoder: it does not apply to --offline"
    if args.diarizer not in ("off", None) and args.offline:
        return "--diarizer gives the streaming path's words their speakers: it does not apply to --offline"
    if subtitle and args.offline:
        return f"--format {args.format} needs word times, which --offline does not give"
    if args.out is None:
        return f"--format {args.format} prints one file: for several, give --out DIR" if (
            subtitle and len(args.files) > 1) else None
    names = [Path(f).stem for f in args.files]
    if len(set(names)) < len(names):
        twice = sorted({n for n in names if names.count(n) > 1})
        return f"--out: several files would write {args.out / twice[0]}.{args.format}"
    try:
        args.out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return f"--out {args.out}: {exc.strerror}"
    return None


def _transcribe_paths(args, model, lookahead, phrases: tuple[Phrase, ...], language: str | None) -> dict[str, Transcript]:
    """The streaming path: files decoded block by block. With --out each file is written as soon
    as it is done; printed output comes in the order of the command line, at the end."""
    results, sources = {}, {}
    for f in args.files:
        try:
            sources[f] = FileSource(str(check_file(f)))
        except AudioError as exc:
            results[f] = Transcript(f, error=str(exc))
    details: dict[str, FileTranscript] = {}
    if sources:
        options = engine_options(args) | {"dtype": model.encoder_dtype, "quantize": None, "lookahead": lookahead}  # already applied
        with ASREngine(model, args.device, max_num_streams=args.max_num_streams, max_queue=len(sources), calibrate=False,
                       diarizer=args.diarizer, **options) \
                as engine, tqdm(total=len(sources), unit="file", disable=len(args.files) < 2) as bar:

            def done(name: str, transcript: FileTranscript) -> None:
                results[name] = as_transcript(name, transcript)
                if args.out is not None:
                    emit(results[name], transcript, args)
                bar.update()

            details = trio.run(transcribe_files, engine, sources, lookahead, done, phrases, language,
                               args.diarizer is not None)
    for f in args.files:
        if args.out is None or f not in details:
            emit(results[f], details.get(f), args)
    return results


def emit(t: Transcript, detail: FileTranscript | None, args: argparse.Namespace) -> None:
    """One file's output: printed (text and JSON as one line each; text with speakers a line per
    turn after the file's name), or written to --out."""
    if args.out is None and not t.error and args.format == "txt" and _speakers(detail):
        sys.stdout.write(f"{t.file}:\n" + render(t, detail, "txt", args.max_line_chars))
    elif args.out is None and args.format in ("txt", "json"):
        _print(t, args.format == "json")
    elif t.error:
        print(f"{t.file}: error: {t.error}", file=sys.stderr)
    elif args.out is None:
        sys.stdout.write(render(t, detail, args.format, args.max_line_chars))
    else:
        path = args.out / f"{Path(t.file).stem}.{args.format}"
        try:
            path.write_text(render(t, detail, args.format, args.max_line_chars))
        except OSError as exc:
            t.error = f"cannot write {path}: {exc.strerror}"
            print(f"{t.file}: error: {t.error}", file=sys.stderr)


def render(t: Transcript, detail: FileTranscript | None, fmt: str, max_line_chars: int) -> str:
    if fmt == "txt" and _speakers(detail):  # a line per speaker turn
        turns = subtitles.cues((u.words for u in detail.utterances), max_line_chars=math.inf)
        return "".join(f"[{c.speaker}] {' '.join(c.lines)}\n" for c in turns)
    if fmt == "txt":
        return t.text + "\n"
    if fmt == "json":
        return t.as_json() + "\n"
    cues = subtitles.cues((u.words for u in detail.utterances), max_line_chars)
    return subtitles.srt(cues) if fmt == "srt" else subtitles.vtt(cues)


def _speakers(detail: FileTranscript | None) -> bool:
    return detail is not None and any("speaker" in w for w in detail.words)


def _print(t: Transcript, as_json: bool) -> None:
    if as_json:
        print(t.as_json(), flush=True)
    elif t.error:  # (it names the file)
        print(f"parakeet-transcribe: error: {t.error}", file=sys.stderr)
    else:
        print(f"{t.file}: {t.text}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
