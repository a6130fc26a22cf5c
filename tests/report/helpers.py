"""Synthetic experiment folders in the layout ``marsrl train`` writes (see marsrl/report/load.py).

Every arm logs 10 steps with deliberate holes: ``train/bias/top2_excess`` is NaN at step 3,
``train/rollout/tau`` is null at step 5, ``train/draft/loss`` is absent at step 7, and ``train/kl`` is
never logged.  Rewards and wall-clock are given per arm so tests know when each arm reaches what.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import yaml

STEPS = 10
STRICT_REWARDS = [0.10, 0.15, 0.20, 0.25, 0.30, 0.35, 0.40, 0.45, 0.50, 0.55]  # final (last 2): 0.525
MARS_REWARDS = [0.10, 0.20, 0.30, 0.40, 0.45, 0.50, 0.55, 0.60, 0.60, 0.62]  # 2-step mean >= 0.525 at step 6
CODE_REWARDS = [0.10, 0.12, 0.14, 0.16, 0.18, 0.20, 0.22, 0.24, 0.26, 0.28]  # never reaches 0.525

ARMS = {
    # name: (rule, rewards, seconds per step, tokens/s, tau, relaxed fraction, top-2 excess, eval accuracy)
    "strict": ("strict", STRICT_REWARDS, 10.0, 100.0, 2.0, 0.0, 0.0, (120, 200)),
    "mars": ("mars", MARS_REWARDS, 6.0, 180.0, 3.0, 0.08, 0.02, (126, 200)),
    "mars_code": ("mars_code", CODE_REWARDS, 5.0, 200.0, 3.2, 0.12, 0.05, (60, 200)),
}


def wilson(k: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return centre - half, centre + half


def metric_rows(name: str) -> list[dict]:
    _, rewards, dt, tps, tau, relaxed, excess, _ = ARMS[name]
    rows = []
    for s in range(STEPS):
        row = {
            "step": s,
            "wall_s": (s + 1) * dt,
            "train/reward": rewards[s],
            "train/reward_std": 0.1 + 0.01 * s,
            "train/loss": 1.0 / (s + 1),
            "train/rollout/tau": tau + 0.01 * s,
            "train/rollout/tokens_per_s": tps + s,
            "train/rollout/seconds": 0.7 * dt,
            "train/rollout/share_of_step": 0.7 - 0.01 * s,
            "train/rollout/relaxed_frac": relaxed + 0.001 * s,
            "train/bias/relaxed_frac": relaxed,
            "train/bias/top1_excess": -excess + 0.001 * s,
            "train/bias/top1_excess_se": 0.01,
            "train/bias/top2_excess": excess + 0.002 * s,
            "train/bias/top2_excess_se": 0.005 + 0.001 * s,
            "train/bias/top1_rate": 0.7,
            "train/bias/top1_rate_expected": 0.7 + excess,
            "train/bias/top2_rate": 0.2 + excess,
            "train/bias/top2_rate_expected": 0.2,
            "train/bias/unsupported_mass": relaxed / 100,
            "train/bias/is_ratio_mean": 1.0 - relaxed / 10 + 0.001 * s,
            "train/bias/is_ratio_min": 0.9 - s * 0.01,
            "train/bias/is_ratio_max": 1.1 + s * 0.02,
            "train/bias/is_ratio_ess_frac": 0.99 - relaxed,
            "train/bias/is_ratio_mean_relaxed": 0.8 if relaxed else float("nan"),
            "train/bias/kl_behavior": relaxed / 20,
            "train/draft/loss": 3.0 - 0.1 * s,
            "train/draft/refreshes": s // 3,
            "train/policy/version": s,
            "train/step_seconds": dt,
        }
        if s == 3:
            row["train/bias/top2_excess"] = float("nan")
        if s == 5:
            row["train/rollout/tau"] = None
        if s == 7:
            del row["train/draft/loss"]
        rows.append(row)
    return rows


def samples(name: str) -> list[dict]:
    """Three trajectories; tokens carry HTML metacharacters; the last position of one is PAD."""
    rule = ARMS[name][0]
    relaxed = 2 if rule != "strict" else 1
    out = []
    for i in range(3):
        tokens = ["The", " answer", " <b>", " &", ' "42"', "\n"]
        prov = [1, relaxed, 3, 1, 4, 0 if i == 0 else 1]
        out.append(
            {
                "step": 3 * i,
                "prompt": f"Q{i}: what is 6 * 7? <script>alert(1)</script>",
                "completion": "".join(tokens),
                "tokens": tokens,
                "token_ids": [10, 11, 12, 13, 14, 15],
                "provenance": prov,
                "target_logprobs": [-0.1, -1.25, -0.5, -0.2, -0.3, -0.05],
                "behavior_logprobs": [-0.1, -0.75 if relaxed == 2 else -1.25, -0.5, -0.2, -0.3, -0.05],
                "reward": float(i == 1),
            }
        )
    return out


def write_arm(root: Path, name: str, experiment: str = "exp", rows: list[dict] | None = None) -> Path:
    rule = ARMS[name][0]
    k, n = ARMS[name][7]
    folder = root / name
    folder.mkdir(parents=True)
    config = {
        "experiment": experiment,
        "arm": {
            "name": name,
            "rule": rule,
            "theta": 0.9,
            "relax_prob": 1.0,
            "is_correction": "token_truncate",
        },
        "seed": 0,
    }
    (folder / "config.yaml").write_text(yaml.safe_dump(config))
    rows = metric_rows(name) if rows is None else rows
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    lo, hi = wilson(k, n)
    before = (k // 2, n)
    blo, bhi = wilson(*before)
    evaluation = {
        "before": {"accuracy": before[0] / n, "ci_low": blo, "ci_high": bhi, "n": n},
        "after": {"accuracy": k / n, "ci_low": lo, "ci_high": hi, "n": n},
        "tau": ARMS[name][4],
    }
    (folder / "eval.json").write_text(json.dumps(evaluation))
    (folder / "samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples(name)))
    return folder


def write_experiment(root: Path, arms=("mars", "strict"), experiment: str = "exp") -> Path:
    """``root/<experiment>/<arm>/...`` for the named arms (written in the given order)."""
    out = root / experiment
    for name in arms:
        write_arm(out, name, experiment)
    return out


def logged_to_wandb(row: dict) -> dict:
    """A metrics row as the trainer logs it to wandb: without ``step`` / ``wall_s`` and null keys."""
    return {k: v for k, v in row.items() if k not in ("step", "wall_s") and v is not None}


def same(a, b) -> bool:
    """Equality where NaN equals NaN."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b
