"""bench/verify.py runs and prints the JSON it documents (tiny sizes; timings are not asserted)."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_verify_bench_prints_json():
    cmd = [
        sys.executable,
        str(ROOT / "bench" / "verify.py"),
        "--batch",
        "4",
        "--vocab",
        "512",
        "--repeats",
        "1",
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, check=True)
    out = json.loads(res.stdout)
    assert set(out["ratio_to_softmax"]) == {
        f"{r}/{d}" for r in ("strict", "mars", "mars_code") for d in ("greedy_draft", "full_draft")
    }
    assert all(v > 0 for v in out["ratio_to_softmax"].values())
