"""Markdown tables from bench.py outputs ("ps": parakeet-streaming).

    python3 benchmarks/vs_parakeet_streaming/table.py results/vs_parakeet_streaming/default.json ...
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


def capacity(trials, name):
    by = defaultdict(list)
    for t in trials:
        if t["server"] == name and "ok" in t:
            by[t["clients"]].append(t["ok"])
    good = [n for n, oks in by.items() if all(oks)]
    return max(good) if good else 0


for path in sys.argv[1:]:
    r = json.load(open(path))
    tr = r["trials"]
    print("(✗ = run failed: p95 lag > 320 ms, max overrun > 500 ms or unfinished; ';' separates repeated runs)")
    print(f"\n### threads={r['threads']}  (load avg start {r['load_start']}, end {r['load_end']})\n")
    print("| N | ours lag p50/p95 ms | ours max overrun ms | parakeet-streaming lag p50/p95 ms "
          "| parakeet-streaming max overrun ms | server CPU-s ours/ps | RSS peak MB ours/ps |")
    print("|---|---|---|---|---|---|---|")
    for n in sorted({t["clients"] for t in tr}):
        a = [t for t in tr if t["server"] == "ours" and t["clients"] == n]
        b = [t for t in tr if t["server"] == "ps" and t["clients"] == n]
        (al, ao), (bl, bo) = cell(a), cell(b)
        cpu = f"{a[0].get('server_cpu_s', '-') if a else '-'}/{b[0].get('server_cpu_s', '-') if b else '-'}"
        rss = f"{a[0].get('rss_peak_mb', '-') if a else '-'}/{b[0].get('rss_peak_mb', '-') if b else '-'}"
        print(f"| {n} | {al} | {ao} | {bl} | {bo} | {cpu} | {rss} |")
    ca, cb = capacity(tr, "ours"), capacity(tr, "ps")
    print(f"\ncapacity: ours {ca}, parakeet-streaming {cb}, ratio {ca / cb if cb else float('nan'):.2f}")
    for s in ("ours", "ps"):
        print(f"{s}: idle {r.get(s + '_idle')}, alive at end {r.get(s + '_alive_at_end')}, "
              f"RSS peak overall {max((t.get('rss_peak_mb') or 0) for t in tr if t['server'] == s)} MB")
    errs = {e for t in tr for e in t.get("errors", [])}
    if errs:
        print("errors:", sorted(errs)[:5])
