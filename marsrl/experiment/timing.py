"""Per-step rollout cost of every arm, measured interleaved inside the job (``timing.json``).

The arms train one after the other, so their wall-clock absorbs whatever else the machine does while
each runs. What differs between arms is the rollout (the rule changes how many tokens each target
forward accepts; the trainer's forward and backward see completions of the same length distribution),
so after training the job times one step's rollout of every arm round-robin in this process, with the
same threads, prompts and seed, the arms' order rotated each repeat: load that drifts over the minutes
falls on every arm alike. The repeats are rounded up to whole rotations (``whole_rotations``), so every
arm runs in every position equally often: a position effect (the call after another pool's) cannot fall
on one arm more than another. A copy of the reference arm (``<reference> (A/A)``) runs in the rotation as a
control: its ratio to the reference must read 1.00 within its interval.

Every arm times the experiment's initial policy and drafter (the rule's effect on the same models,
not what training did to them). The step-time estimate of an arm adds the reference's median non-rollout
seconds per training step (``step_seconds * (1 - share_of_step)`` over its logged steps: the same trainer
work for every arm) to the arm's interleaved rollout seconds.

timing.json:
    {"method": str, "repeats": R, "prompts": P, "group": G, "reference": name,
     "arms": {name: {"seconds": [R floats, in repeat order], "tokens": [R ints]}},
     "train_seconds": float | null}
"""

from __future__ import annotations

import json
import time
from pathlib import Path

TIMING_FILE = "timing.json"
METHOD = (
    "interleaved A/B after training: one step's rollout of every arm (initial policy and drafter, same "
    "prompts and seed), round-robin in one process with the order rotated each repeat"
)
AA_SUFFIX = " (A/A)"


def rotation(names: list[str], repeat: int) -> list[str]:
    """The arms' order in repeat ``repeat``: the list rotated by ``repeat`` places."""
    k = repeat % len(names)
    return names[k:] + names[:k]


def whole_rotations(repeats: int, n_arms: int) -> int:
    """``repeats`` rounded up to a multiple of ``n_arms`` (0 stays 0): whole rotations, so each arm is
    timed in each position of the order the same number of times."""
    if n_arms < 1:
        raise ValueError(f"n_arms must be >= 1, got {n_arms}")
    return -(-repeats // n_arms) * n_arms


def measure(
    pools: dict, prompt_ids: list[list[int]], sampling, repeats: int, clock=time.perf_counter, say=None
):
    """{name: {"seconds": [...], "tokens": [...]}}: ``pools[name].generate(prompt_ids, sampling)`` timed
    ``repeats`` times per pool, round-robin in rotated order (``rotation``); the same sampling (seed
    included) every time, so every repeat of an arm does the same work. The caller picks ``repeats``
    (``whole_rotations`` balances the positions)."""
    names = list(pools)
    out = {n: {"seconds": [0.0] * repeats, "tokens": [0] * repeats} for n in names}
    for r in range(repeats):
        for name in rotation(names, r):
            start = clock()
            trajs = pools[name].generate(prompt_ids, sampling)
            out[name]["seconds"][r] = clock() - start
            out[name]["tokens"][r] = sum(len(t.completion_ids) for t in trajs)
        if say:
            say(f"timing: repeat {r + 1}/{repeats}")
    return out


def train_seconds(rows: list[dict]) -> float | None:
    """Median non-rollout seconds of a training step: ``step_seconds * (1 - share_of_step)`` over the
    logged steps that carry both."""
    values = sorted(
        float(r["train/step_seconds"]) * (1.0 - float(r["train/rollout/share_of_step"]))
        for r in rows
        if isinstance(r.get("train/step_seconds"), (int, float))
        and isinstance(r.get("train/rollout/share_of_step"), (int, float))
    )
    if not values:
        return None
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else 0.5 * (values[mid - 1] + values[mid])


def timing_record(
    arms: dict, reference: str, repeats: int, prompts: int, group: int, rows: list[dict]
) -> dict:
    """timing.json's content (module docstring) from ``measure``'s result and the reference's metric rows."""
    return {
        "method": METHOD,
        "repeats": repeats,
        "prompts": prompts,
        "group": group,
        "reference": reference,
        "arms": arms,
        "train_seconds": train_seconds(rows),
    }


def write_timing(root: Path, record: dict) -> None:
    tmp = Path(root) / (TIMING_FILE + ".tmp")
    tmp.write_text(json.dumps(record, indent=1))
    tmp.replace(Path(root) / TIMING_FILE)
