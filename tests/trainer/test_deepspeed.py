"""MarsGRPOTrainer under DeepSpeed ZeRO-2 and ZeRO-3 on CPU (gloo), on 1 rank and on 2 ranks
(``torchrun --nproc_per_node 2``), 2 steps each, through tests/trainer/ds_run.py: rank 0 alone calls the
pool (prompts gathered to it, trajectories scattered back in order), every rank gets its slice, all
ranks gather ZeRO-3 weights for the sync. The 1-rank run (once, ZeRO-3) and each stage's 2-rank run of
the same global batch (8 completions) give the same first-step loss: |difference| <= 1e-6 (measured
2.2e-8, float32 sums in another order)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from tests.rollout.helpers import save_tiny_world

RUNNER = Path(__file__).with_name("ds_run.py")


def _port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def _start(folder, out: Path, stage: int, ranks: int) -> tuple[subprocess.Popen, Path, int]:
    env = dict(os.environ, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1")
    if ranks == 1:
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=_port(), RANK="0", LOCAL_RANK="0", WORLD_SIZE="1")
        cmd = [sys.executable]
    else:
        for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_PORT"):
            env.pop(key, None)
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            str(ranks),
            "--master_addr",
            "127.0.0.1",
            "--master_port",
            _port(),
        ]
    cmd += [str(RUNNER), str(folder), str(out), "--stage", str(stage), "--per-device", str(8 // ranks)]
    # output to a file, not a pipe: a run started beside another must not stall on a full pipe
    with open(f"{out}.log", "w") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    return proc, out, ranks


def _wait(run: tuple[subprocess.Popen, Path, int]) -> list[dict]:
    proc, out, ranks = run
    try:
        proc.wait(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == 0, Path(f"{out}.log").read_text()[-3000:]
    return [json.loads(Path(f"{out}.rank{r}").read_text()) for r in range(ranks)]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return save_tiny_world(tmp_path_factory.mktemp("ds_policy"))


@pytest.fixture(scope="module")
def runs(folder, tmp_path_factory):
    """The one-rank reference (once, under ZeRO-3: on one rank nothing is partitioned across processes,
    so ZeRO-2 and ZeRO-3 take the same batches and the same first-step loss) and the ZeRO-2 two-rank
    run, started together (three processes on two cores beat two runs in turn); the ZeRO-3 two-rank
    run starts when its test does."""
    tmp = tmp_path_factory.mktemp("ds_runs")
    first = [_start(folder, tmp / "one.json", 3, 1), _start(folder, tmp / "two2.json", 2, 2)]
    (one,), two2 = (_wait(r) for r in first)
    assert one["zero_stage"] == 3 and one["global_step"] == 2 and one["versions"] == [0.0, 1.0]
    return {"one": one, 2: two2}


@pytest.mark.parametrize("stage", [2, 3])
def test_one_and_two_ranks_agree(folder, runs, tmp_path, stage):
    one = runs["one"]
    two = runs[stage] if stage in runs else _wait(_start(folder, tmp_path / "two.json", stage, 2))
    for r in two:
        assert r["zero_stage"] == stage and r["global_step"] == 2
        assert r["versions"] == [0.0, 1.0]  # the policy was synced before each step
    assert one["pool_version"] == two[0]["pool_version"] == 1 and two[1]["pool_version"] is None
    # every rank trained on its own slice, and together they saw the one-rank batch of each step
    for step in range(2):
        a, b = two[0]["received"][step], two[1]["received"][step]
        assert len(a) == len(b) == 4 and Counter(map(tuple, a + b)) == Counter(
            map(tuple, one["received"][step])
        )
    assert two[0]["losses"] == two[1]["losses"]  # ranks log the same (reduced) loss
    assert abs(two[0]["losses"][0] - one["losses"][0]) <= 1e-6
