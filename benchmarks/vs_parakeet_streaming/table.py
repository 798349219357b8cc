"""Markdown tables from bench.py outputs ("ps": parakeet-streaming).

    python3 -m benchmarks.vs_parakeet_streaming.table results/vs_parakeet_streaming/default.json ...
"""

import json
import sys
from collections import defaultdict


def ms(x):
    return "-" if x is None else f"{x * 1000:.0f}"


def cell(runs):
    if not runs:
        return "not run", "-"
    if runs[0].get("skipped"):
        return "skipped", "-"
    lag = " ; ".join(f"{ms(r.get('lag_p50'))}/{ms(r.get('lag_p95'))}" + ("" if r.get("ok") else "✗") for r in runs)
    over = " ; ".join(ms(r.get("over_max")) for r in runs)
    return lag, over


def chunk_cell(runs):
    """Ours' own chunk latency p50/p95 (its /metrics over the run: every chunk, not one lag per stream)."""
    figures = [r["server_metrics"] for r in runs if r.get("server_metrics")]
    return " ; ".join(f"{ms(f.get('chunk_p50'))}/{ms(f.get('chunk_p95'))}" for f in figures) or "-"


LINES = (0.32, 0.5, 1.0)  # p95 lines: voice agents draw theirs near 320-500 ms, live captions near 1 s


def within(t, line):
    """A run meets a p95 line: lag p95 under it, every stream finished, the worst overrun at most
    180 ms past it (320 ms -> 500 ms, bench.py's own rule for `ok`)."""
    if line == LINES[0]:
        return t["ok"]
    return (t.get("finished") == t["clients"] and t.get("lag_p95") is not None and t["lag_p95"] <= line
            and (t.get("over_max") or 0) <= line + 0.18)


def capacity(trials, name, line=LINES[0]):
    by = defaultdict(list)
    for t in trials:
        if t["server"] == name and "ok" in t:
            by[t["clients"]].append(within(t, line))
    good = [n for n, oks in by.items() if all(oks)]
    return max(good) if good else 0


def memory_per_stream(r, name):
    """MB per stream: (RSS peak at the largest N run - RSS after warm-up) / N."""
    runs = [t for t in r["trials"] if t["server"] == name and t.get("rss_peak_mb")]
    idle = (r.get(name + "_idle") or {}).get("rss_after_warmup_mb")
    if not runs or not idle:
        return None
    top = max(runs, key=lambda t: t["clients"])
    return top["clients"], (top["rss_peak_mb"] - idle) / top["clients"]


for path in sys.argv[1:]:
    r = json.load(open(path))
    tr = r["trials"]
    print("(✗ = run failed: p95 lag > 320 ms, max overrun > 500 ms or unfinished; ';' separates repeated runs)")
    print(f"\n### threads={r['threads']}  (load avg start {r['load_start']}, end {r['load_end']})\n")
    print("| N | ours lag p50/p95 ms | ours max overrun ms | ours chunk latency p50/p95 ms | parakeet-streaming lag "
          "p50/p95 ms | parakeet-streaming max overrun ms | server CPU-s ours/ps | RSS peak MB ours/ps |")
    print("|---|---|---|---|---|---|---|---|")
    for n in sorted({t["clients"] for t in tr}):
        a = [t for t in tr if t["server"] == "ours" and t["clients"] == n]
        b = [t for t in tr if t["server"] == "ps" and t["clients"] == n]
        (al, ao), (bl, bo) = cell(a), cell(b)
        cpu = f"{a[0].get('server_cpu_s', '-') if a else '-'}/{b[0].get('server_cpu_s', '-') if b else '-'}"
        rss = f"{a[0].get('rss_peak_mb', '-') if a else '-'}/{b[0].get('rss_peak_mb', '-') if b else '-'}"
        print(f"| {n} | {al} | {ao} | {chunk_cell(a)} | {bl} | {bo} | {cpu} | {rss} |")
    print()
    for line in LINES:
        ca, cb = capacity(tr, "ours", line), capacity(tr, "ps", line)
        print(f"capacity at p95 <= {line * 1000:.0f} ms: ours {ca}, parakeet-streaming {cb}, "
              f"ratio {ca / cb if cb else float('nan'):.2f}")
    for s in ("ours", "ps"):
        m = memory_per_stream(r, s)
        if m:
            print(f"{s}: memory per stream {m[1]:.1f} MB (RSS peak at N={m[0]} less RSS after warm-up)")
    for s in ("ours", "ps"):
        print(f"{s}: idle {r.get(s + '_idle')}, alive at end {r.get(s + '_alive_at_end')}, "
              f"RSS peak overall {max((t.get('rss_peak_mb') or 0) for t in tr if t['server'] == s)} MB")
    errs = {e for t in tr for e in t.get("errors", [])}
    if errs:
        print("errors:", sorted(errs)[:5])
