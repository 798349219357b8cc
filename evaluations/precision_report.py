"""Token agreement of each reduced-precision mode with float32, and the demo model's WER per mode.

Sets: the NeMo fixture models (tests/fixtures/nemo, every lookahead mode, the three fixture
wavs) and the demo model on the 40 held-out espeak-ng sentences of tests/fixtures/demo_sentences.json
(needs espeak-ng). Agreement = matched tokens / tokens (difflib alignment), over all streams.

    python -m evaluations.precision_report            # writes results/precision_report.json
"""

from __future__ import annotations

import difflib
import json
import tempfile
from pathlib import Path

from demo_model.speech import FIXTURE, synth  # the tests' own espeak-ng rendering
from parakeet_stream.audio import read_audio
from parakeet_stream.engine import ASREngine
from parakeet_stream.tools.convert import convert
from parakeet_stream.tools.transcribe import transcribe_streaming
from parakeet_stream.training.data import edit_distance

ROOT = Path(__file__).resolve().parent.parent

MODES = {"float32": ("float32", None), "bfloat16": ("bfloat16", None), "float16": ("float16", None),
         "int8": ("float32", "int8")}


def transcribe(model_dir, audios: dict, mode: str, lookahead=None, device: str = "cpu") -> dict:
    dtype, quantize = MODES[mode]
    with ASREngine(model_dir, device, max_num_streams=len(audios), dtype=dtype, quantize=quantize) as engine:
        return transcribe_streaming(engine, audios, lookahead)


def agreement(ref: dict, out: dict) -> float:
    matched = total = 0
    for name, t in ref.items():
        sm = difflib.SequenceMatcher(a=t.token_ids, b=out[name].token_ids, autojunk=False)
        matched += sum(b.size for b in sm.get_matching_blocks())
        total += max(len(t.token_ids), len(out[name].token_ids))
    return matched / max(total, 1)


def wer(texts: dict, refs: dict) -> float:
    errors = sum(edit_distance(refs[n].split(), texts[n].text.split()) for n in refs)
    return errors / sum(len(r.split()) for r in refs.values())


def fixture_agreement(modes: list[str], device: str = "cpu") -> dict[str, list[float]]:
    """Agreement of each mode on `device` with float32 on CPU: both NeMo fixture models, every
    lookahead mode, the three fixture wavs; one figure per (model, lookahead) per mode."""
    out: dict[str, list[float]] = {}
    wavs = {p.stem: read_audio(p) for p in sorted((ROOT / "tests/fixtures/audio").glob("*.wav"))}
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("eou_tiny", "nemotron_tiny"):
            folder = Path(tmp) / name
            convert(str(ROOT / f"tests/fixtures/nemo/{name}.nemo"), folder)
            with ASREngine(folder) as probe:
                lookaheads = probe.lookahead_modes
            for la in lookaheads:
                ref = transcribe(folder, wavs, "float32", la)
                for mode in modes:
                    agree = agreement(ref, transcribe(folder, wavs, mode, la, device))
                    out.setdefault(mode, []).append(agree)
                    print(f"{name} {la} {mode} on {device}: {agree:.4f}", flush=True)
    return out


def main() -> None:
    report = {"fixtures": fixture_agreement(list(MODES)), "demo": {}}
    sentences = json.loads(FIXTURE.read_text())
    items = {f"{s}/{k}": (item, k) for s in ("seen_voices", "heldout_voices") for k, item in enumerate(sentences[s])}
    audios = {n: synth(item, seed=k) for n, (item, k) in items.items()}
    refs = {n: item["text"] for n, (item, _) in items.items()}
    ref = transcribe("demo", audios, "float32")
    for mode in MODES:
        out = ref if mode == "float32" else transcribe("demo", audios, mode)
        report["demo"][mode] = {"agreement": agreement(ref, out), "wer": wer(out, refs)}
        print(f"demo {mode}: {report['demo'][mode]}", flush=True)
    report["fixtures"] = {m: min(v) for m, v in report["fixtures"].items()}  # worst over models and modes
    out_path = ROOT / "results" / "precision_report.json"
    out_path.parent.mkdir(exist_ok=True)
    out_path.write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
