"""scripts/gpu_check.sh --dry-run: the GPU check's code, on CPU at tiny sizes, so it does not rot
before the GPU machine it is for runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_gpu_check_runs_every_part_on_cpu(tmp_path):
    env = os.environ | {"PYTHON": os.environ.get("PYTHON", sys.executable)}
    proc = subprocess.run(["bash", str(ROOT / "scripts/gpu_check.sh"), "--dry-run", "--out", str(tmp_path / "check"),
                           "--work", str(tmp_path / "models")], capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((tmp_path / "check.json").read_text())
    parts = report["parts"]
    assert report["dry_run"] and not [name for name, rec in parts.items() if not rec["ok"]]
    for name in ("eou_tiny", "nemotron_tiny"):
        assert parts[f"graphs {name}"]["equal"] and parts[f"graphs {name}"]["eager_calls"] == 0
        assert parts[f"ceiling {name}"]["step_ms"] and parts[f"capacity {name} 100ms"]["levels"]
    assert parts["precision"]["fixture_agreement"] == {"float32": 1.0}
    table = (tmp_path / "check.md").read_text()
    assert "| nemotron_tiny | 1.0 | float32 |" in table and "capacity p95 <= 100 ms" in table
