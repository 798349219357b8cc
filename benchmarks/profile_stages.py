"""Where a loaded server's time goes, by engine stage: py-spy's raw samples summed per stage.

    pip install py-spy
    py-spy record -r 100 --format raw -o results/spy.txt -- parakeet-serve --model weights/random-small
    (load it, e.g. with python -m benchmarks.vs_parakeet_streaming.loadgen; stop it with Ctrl-C)
    python -m benchmarks.profile_stages results/spy.txt

Prints each stage's share of all samples (every thread, idle waits included), the calls under it
that took most, and the functions where its samples landed (leaves).
"""

from __future__ import annotations

import argparse
from collections import Counter, defaultdict

# the first frame of a stack that names one of these decides its stage
STAGES = {
    "ModelRunner.pre_encode": "pre-encode", "ModelRunner.encode": "encode", "ModelRunner.decode": "decode",
    "StepRoute.deliver": "deliver", "Scheduler.schedule": "scheduler (waiting)", "Queue.get": "stage queues (waiting)",
}


def stage_of(frames: list[str]) -> tuple[str, int]:
    for i, frame in enumerate(frames):
        for prefix, stage in STAGES.items():
            if frame.startswith(prefix):
                return stage, i
        if "trio/" in frame:
            return "server (Trio)", i
    return "other: " + frames[0].split(" (")[0], 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("raw", help="py-spy record --format raw output")
    ap.add_argument("--top", type=int, default=5)
    args = ap.parse_args()
    stages, calls, leaves = Counter(), defaultdict(Counter), defaultdict(Counter)
    for number, line in enumerate(open(args.raw, errors="replace"), 1):
        stack, _, count = line.rstrip("\n").rpartition(" ")
        if not stack or not count.isdigit():
            raise SystemExit(f"{args.raw}:{number}: not py-spy raw output ('frame;frame;... count'): "
                             "record with `py-spy record --format raw`")
        frames, n = stack.split(";"), int(count)
        stage, i = stage_of(frames)
        stages[stage] += n
        calls[stage][" > ".join(f.split(" (")[0] for f in frames[i + 1 : i + 3])] += n
        leaves[stage][frames[-1].split(" (")[0]] += n
    total = sum(stages.values())
    print(f"{total} samples")
    for stage, n in stages.most_common():
        print(f"{100 * n / total:5.1f}%  {stage}")
        for call, c in calls[stage].most_common(args.top):
            print(f"        {100 * c / total:5.1f}%  {call}")
        print("        leaves: " + ", ".join(f"{k} {100 * c / total:.1f}%" for k, c in leaves[stage].most_common(args.top)))


if __name__ == "__main__":
    main()
