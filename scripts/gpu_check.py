"""The GPU check: one command on a new GPU machine (no network; a copy of the repository and its
Python environment with a CUDA build of torch) that says whether the GPU path is right and what it
holds, in under 10 minutes. It writes one JSON and a markdown table for docs/performance.md.

    bash scripts/gpu_check.sh                 # results/gpu_check.json, results/gpu_check.md
    bash scripts/gpu_check.sh --dry-run       # the same code on CPU at tiny sizes (tests/test_gpu_check.py)

Parts, in order; each is timed and recorded, and one that fails does not stop the others:
1. machine: torch, CUDA, the GPU and its memory, bfloat16, CUDA-graph conditional nodes;
2. tests: tests/test_cuda.py and the CUDA test of tests/test_precision.py;
3. models: random-weight `large` and `small` made on the spot (scripts/random_model.py);
4. precision: agreement of float32 / bfloat16 / float16 on the GPU with float32 on CPU (the NeMo
   fixture set of scripts/precision_report.py), and every encoder layer finite per precision;
5. graphs: per model, mixed-mode streams through CUDA graphs and eagerly, float32: token agreement;
then per model and latency target (100 ms, 320 ms), the engine's `latency_target` set to it:
6. sizing: `--max-num-streams auto` in the serving precision (bfloat16): slots, largest step, bytes
   per stream and per slot, start-up time with every graph captured, memory left;
7. ceiling (once per model): pre-encode + encode + decode time of one step by batch size in the
   160 ms mode, and the most streams such steps keep in real time;
8. capacity: in-process capacity in the 160 ms mode (scripts/bench_engine.py's real-time streams),
   p95 chunk latency within the target; levels that would end past `--minutes` are not run.
"""

from __future__ import annotations

import argparse
import difflib
import gc
import json
import subprocess
import sys
import tempfile
import time
import traceback
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

from bench_engine import keeps_up, run_level, speech  # noqa: E402
from precision_report import fixture_agreement  # noqa: E402
from random_model import build  # noqa: E402
from parakeet_stream.engine import ASREngine  # noqa: E402
from parakeet_stream.engine.cuda_graphs import loop_guard, unconditional  # noqa: E402
from parakeet_stream.engine.memory import slot_bytes, stream_bytes  # noqa: E402
from parakeet_stream.host import single_threaded_host  # noqa: E402
from parakeet_stream.model.loading import load_model  # noqa: E402
from parakeet_stream.model.precision import set_precision  # noqa: E402
from parakeet_stream.tools.convert import convert  # noqa: E402

TARGETS_MS = (100, 320)
FULL = {"device": "cuda", "models": ("large", "small"), "graph_streams": 16, "slots": "auto",  # large: the target
        "levels": (128, 256, 512, 1024, 1536, 2048), "seconds": 8.0, "batches": (1, 16, 64, 256, 512, 1024),
        "tests": ["tests/test_cuda.py", "tests/test_precision.py::test_cuda_engine_matches_cpu_tokens"],
        "precisions": ("float32", "bfloat16", "float16")}
DRY = {"device": "cpu", "models": ("eou_tiny", "nemotron_tiny"), "graph_streams": 4, "slots": 4,
       "levels": (1, 2), "seconds": 1.5, "batches": (1, 2), "tests": ["tests/test_cuda.py"], "precisions": ("float32",)}


class Report:
    def __init__(self):
        self.parts: dict[str, dict] = {}

    @contextmanager
    def part(self, name: str):
        record: dict = {}
        start = time.perf_counter()
        print(f"== {name}", flush=True)
        try:
            yield record
            record["ok"] = True
        except Exception as exc:  # noqa: BLE001 - one part's failure is a finding; the others still run
            record["ok"], record["error"] = False, repr(exc)
            traceback.print_exc()
        record["seconds"] = round(time.perf_counter() - start, 1)
        self.parts[name] = record
        print(json.dumps({name: record}, default=str), flush=True)


def machine(device: str) -> dict:
    out = {"torch": torch.__version__, "cuda": torch.version.cuda, "device": device}
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        out |= {"gpu": props.name, "memory_gib": round(props.total_memory / 2**30, 1),
                "capability": f"{props.major}.{props.minor}", "bf16": torch.cuda.is_bf16_supported(),
                "conditional_nodes": loop_guard(torch.device("cuda")) is not unconditional}
    return out


def run_tests(args: list[str]) -> dict:
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args], cwd=ROOT,
                          capture_output=True, text=True)
    lines = proc.stdout.strip().splitlines()
    out = {"returncode": proc.returncode, "summary": lines[-1] if lines else ""}
    if proc.returncode:
        out["tail"] = "\n".join(lines[-40:]) + proc.stderr[-2000:]
        raise AssertionError(out["summary"] or proc.stderr[-500:])
    return out


def make_models(names: tuple[str, ...], work: Path) -> dict[str, Path]:
    out = {}
    for name in names:
        folder = work / name
        if not (folder / "config.json").exists():
            if name.endswith("_tiny"):
                convert(str(ROOT / f"tests/fixtures/nemo/{name}.nemo"), folder)
            else:
                build(name, folder)
        out[name] = folder
    return out


def mode_160ms(engine: ASREngine):
    """The lookahead mode with 160 ms chunks (the model's default where it has none)."""
    return next((m for m in engine.lookahead_modes if abs(engine.chunk_seconds(m) - 0.16) < 1e-6), engine.default_lookahead)


def streams_tokens(engine: ASREngine, audios: list[np.ndarray]) -> list[list[int]]:
    modes = engine.lookahead_modes
    sids = [engine.create_stream(modes[i % len(modes)]) for i in range(len(audios))]
    for at in range(0, max(map(len, audios)), 2560):
        for sid, audio in zip(sids, audios):
            if at < len(audio):
                engine.push_audio(sid, audio[at : at + 2560])
    for sid in sids:
        engine.finalize(sid)
    out = []
    for sid in sids:
        tokens, done = [], False
        while not done:
            engine.wait_for_update(sid, timeout=1.0)
            for r in engine.collect(sid):
                if r.error:
                    raise RuntimeError(f"stream {sid}: {r.error}")
                tokens += r.token_ids
                done = done or r.is_final
        out.append(tokens)
    return out


def graphs_vs_eager(folder: Path, device: str, streams: int) -> dict:
    audios = [speech(6.0, seed) for seed in range(streams)]
    found = {}
    for graphs in (True, False):
        with ASREngine(folder, device, max_num_streams=streams, max_batch=streams, cuda_graphs=graphs) as engine:
            found[graphs] = streams_tokens(engine, audios)
            if graphs:
                static = [*engine.runner.encoders.values(), *engine.runner.decoders.values()]
                eager_calls = sum(s.eager_calls for s in static)
    pairs = list(zip(found[True], found[False]))
    matched = sum(b.size for x, y in pairs for b in difflib.SequenceMatcher(a=x, b=y, autojunk=False).get_matching_blocks())
    total = sum(max(len(x), len(y)) for x, y in pairs)
    return {"equal": found[True] == found[False], "agreement": round(matched / max(total, 1), 4), "tokens": total,
            "eager_calls": eager_calls}


def sized_engine(folder: Path, settings: dict, dtype: str, target_s: float) -> tuple[ASREngine, dict]:
    device = settings["device"]
    start = time.perf_counter()
    engine = ASREngine(folder, device, max_num_streams=settings["slots"], dtype=dtype, latency_target=target_s,
                       cuda_graphs=True)
    sizing = {"dtype": dtype, "slots": engine.scheduler.max_num_streams, "max_batch": engine.scheduler.max_batch,
              "start_seconds": round(time.perf_counter() - start, 1), "slot_mib": round(slot_bytes(engine.model) / 2**20, 2),
              "graphs": sum(len(s.sizes) for s in [*engine.runner.encoders.values(), *engine.runner.decoders.values()])}
    if device == "cuda":
        free, total = torch.cuda.mem_get_info()
        sizing |= {"stream_mib": round(stream_bytes(engine.model) / 2**20, 2), "free_gib_after": round(free / 2**30, 1),
                   "reserved_gib": round(torch.cuda.memory_reserved() / 2**30, 1)}
    return engine, sizing


@torch.inference_mode()
def ceiling(engine: ASREngine, batches: tuple[int, ...]) -> dict:
    """Step time by batch size (pre-encode + encoder layers + greedy decode, the graphs the engine replays)."""
    runner, model = engine.runner, engine.model
    mode = mode_160ms(engine)
    spec, cuda = model.encoder.chunk_spec(mode), runner.device.type == "cuda"
    rows = {}
    for b in (b for b in batches if b <= runner.max_batch):
        feats = torch.randn(b, spec.window, model.cfg.features.n_mels, device=runner.device).to(model.encoder_dtype)
        full = torch.full((b,), spec.window, device=runner.device)
        slots = torch.arange(b, device=runner.device)

        def step():
            x, lengths = model.encoder.stream_pre_encode(feats, full, torch.zeros_like(full), mode)
            enc = runner.encoders[mode](x, lengths, slots)
            runner.decoders[mode](enc, lengths, slots)

        times = []
        for i in range(13):
            if cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            step()
            if cuda:
                torch.cuda.synchronize()
            if i >= 3:
                times.append(time.perf_counter() - t0)
        rows[b] = round(float(np.median(times)) * 1000, 2)
    chunk_ms = engine.chunk_seconds(mode) * 1000
    real_time = [b for b, ms in rows.items() if ms <= chunk_ms]
    return {"mode": list(mode), "chunk_ms": chunk_ms, "step_ms": rows, "streams_in_real_time": max(real_time, default=0)}


def capacity(engine: ASREngine, target_ms: float, levels: tuple[int, ...], seconds: float, deadline: float) -> dict:
    mode = mode_160ms(engine)
    chunk_ms = engine.chunk_seconds(mode) * 1000
    runs, best, complete = [], 0, True
    for n in (n for n in levels if n <= engine.scheduler.max_num_streams):
        if time.monotonic() + seconds + 10 > deadline:  # a level takes its audio's length and a drain
            complete = False
            break
        level = run_level(engine, n, seconds, mode)
        runs.append({k: round(v, 1) if isinstance(v, float) else v for k, v in level.items()})
        if not keeps_up(level, target_ms, chunk_ms):
            break
        best = n
    else:
        complete = False  # every level tried held: the capacity is at least the highest one
    return {"target_ms": target_ms, "capacity": best, "at_least": not complete or best == levels[-1], "levels": runs}


def finite_layers(folder: Path, device: str, dtype: str) -> bool:
    """Every encoder layer's output finite on 4 s of speech (features made on CPU)."""
    feats, valid = load_model(folder).features(torch.from_numpy(speech(4.0, 0)))
    model = set_precision(load_model(folder, device), dtype)
    bad = []
    for layer in [model.encoder.pre_encode, *model.encoder.layers]:
        layer.register_forward_hook(lambda m, a, out: bad.append(1) if not torch.isfinite(
            out[0] if isinstance(out, tuple) else out).all() else None)
    with torch.inference_mode():
        model.encoder(feats[None].to(device, model.encoder_dtype), torch.tensor([valid], device=device))
    return not bad


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="on CPU, tiny models and sizes: the code, not the figures")
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "gpu_check")
    ap.add_argument("--work", type=Path, default=None, help="where the random models go (default: a temporary folder)")
    ap.add_argument("--minutes", type=float, default=9.5,
                    help="the whole check ends by then: capacity levels that would end later are not tried")
    args = ap.parse_args()
    settings = DRY if args.dry_run else FULL
    if not args.dry_run and not torch.cuda.is_available():
        sys.exit("gpu_check: no CUDA device visible to torch (use --dry-run on CPU)")
    single_threaded_host()
    deadline = time.monotonic() + args.minutes * 60
    report = Report()
    with tempfile.TemporaryDirectory() as tmp:
        models = checks(report, settings, args.work or Path(tmp))
        for name, folder in models.items():  # the capacity runs last: they take what time is left
            for target in TARGETS_MS:
                serve(report, settings, name, folder, target, deadline)
    write(report.parts, args.out, args.dry_run)


def checks(report: Report, settings: dict, work: Path) -> dict[str, Path]:
    """Everything but the capacity: machine, tests, models, precision, graphs vs eager. Returns the models."""
    device, models = settings["device"], {}
    with report.part("machine") as rec:
        rec |= machine(device)
    with report.part("tests") as rec:
        rec |= run_tests(settings["tests"])
    with report.part("models") as rec:
        models = make_models(settings["models"], work)
        rec["models"] = list(models)
    with report.part("precision") as rec:
        worst = fixture_agreement(list(settings["precisions"]), device)
        rec["fixture_agreement"] = {mode: min(v) for mode, v in worst.items()}
        rec["finite"] = {f"{name} {dtype}": finite_layers(folder, device, dtype)
                         for name, folder in models.items() for dtype in settings["precisions"]}
    for name, folder in models.items():
        with report.part(f"graphs {name}") as rec:
            rec |= graphs_vs_eager(folder, device, settings["graph_streams"])
    return models


def serve(report: Report, settings: dict, name: str, folder: Path, target: int, deadline: float) -> None:
    """One model sized automatically with the latency target at `target`: its sizing, its step-time
    ceiling (once per model) and its capacity at that target."""
    device = settings["device"]
    serving = "bfloat16" if device == "cuda" and torch.cuda.is_bf16_supported() else "float32"
    engine = None
    try:
        with report.part(f"sizing {name} {target}ms") as rec:
            engine, sizing = sized_engine(folder, settings, serving, target / 1000)
            rec |= sizing
        if engine is None:
            return
        if target == TARGETS_MS[0]:
            with report.part(f"ceiling {name}") as rec:
                rec |= ceiling(engine, settings["batches"])
        with report.part(f"capacity {name} {target}ms") as rec, engine:
            rec |= capacity(engine, target, settings["levels"], settings["seconds"], deadline)
    finally:
        del engine
        gc.collect()
        if device == "cuda":
            torch.cuda.empty_cache()


def write(parts: dict, out: Path, dry_run: bool) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({"dry_run": dry_run, "parts": parts}, indent=2, default=str))
    out.with_suffix(".md").write_text(markdown(parts))
    failed = [name for name, rec in parts.items() if not rec.get("ok")]
    print(f"gpu_check: {len(parts) - len(failed)}/{len(parts)} parts ok" + (f"; failed: {', '.join(failed)}" if failed else ""))
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.md')}")


def markdown(parts: dict) -> str:
    m = parts.get("machine", {})
    lines = [f"GPU check: {m.get('gpu', m.get('device'))}, {m.get('memory_gib', '-')} GiB, torch {m.get('torch')} "
             f"(CUDA {m.get('cuda')}), conditional nodes: {m.get('conditional_nodes', '-')}; "
             f"tests: {parts.get('tests', {}).get('summary', parts.get('tests', {}).get('error'))}", "",
             "| model | graphs = eager (float32 tokens) | precision | slots (auto) | largest step | MiB per stream / slot "
             "| start (s, graphs) | real-time ceiling, 160 ms steps | capacity p95 <= 100 ms | capacity p95 <= 320 ms |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name in parts.get("models", {}).get("models", []):
        graphs, sizing = parts.get(f"graphs {name}", {}), parts.get(f"sizing {name} {TARGETS_MS[0]}ms", {})
        ceil = parts.get(f"ceiling {name}", {})
        caps = [parts.get(f"capacity {name} {t}ms", {}) for t in TARGETS_MS]
        cap_text = [("at least " if c.get("at_least") else "") + str(c.get("capacity", "-")) if c.get("ok") else "failed"
                    for c in caps]
        lines.append(f"| {name} | {graphs.get('agreement', '-') if graphs.get('ok') else 'failed'} | {sizing.get('dtype', '-')} "
                     f"| {sizing.get('slots', '-')} | {sizing.get('max_batch', '-')} | {sizing.get('stream_mib', '-')} / "
                     f"{sizing.get('slot_mib', '-')} | {sizing.get('start_seconds', '-')} ({sizing.get('graphs', '-')}) "
                     f"| {ceil.get('streams_in_real_time', '-')} | {cap_text[0]} | {cap_text[1]} |")
    prec = parts.get("precision", {})
    lines += ["", "| precision | worst token agreement with CPU float32 (NeMo fixtures) |", "|---|---|"]
    lines += [f"| {mode} | {value:.4f} |" for mode, value in prec.get("fixture_agreement", {}).items()]
    lines += ["", "Encoder layers finite: " + ", ".join(f"{k}: {v}" for k, v in prec.get("finite", {}).items())]
    failed = [f"{name} ({rec.get('error')})" for name, rec in parts.items() if not rec.get("ok")]
    if failed:
        lines += ["", "Failed parts: " + "; ".join(failed)]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
