"""Held-out accuracy of a policy, at the rollout temperature and greedy, before, during and after training.

GRPO optimises the policy's expected reward at its rollout temperature (T = 1 by default), so that is the
accuracy that has to move; greedy accuracy is measured beside it (training must not cost it).

    result = evaluate_policy(model, tokenizer, problems, temperatures={"t1": 1.0, "greedy": 0.0},
                             max_new_tokens=128, batch_size=256, seed=0)
    result["t1"]      # {"temperature", "accuracy", "ci_low", "ci_high", "n", "k", "correct": [0/1 per
                      #  problem, in order], "mean_completion_tokens", "truncated_frac"}
    compare_evals(before, after)   # per temperature: paired difference, its interval, exact McNemar p

Every arm evaluates the same problems with the same sampling seed, one completion per problem and
temperature; the before / after comparison is paired over problems:

- **accuracy interval**: Wilson score interval, 95%;
- **paired test**: exact McNemar test, i.e. the two-sided exact binomial (sign) test on the discordant
  problems (right after, wrong before: ``gains``; the reverse: ``losses``) under H0 gains ~ Bin(gains +
  losses, 1/2); the one-sided p (after better) is given beside it;
- **difference interval**: paired bootstrap over problems (percentile, 95%, ``n_boot`` resamples, seeded).

``HeldoutEvalCallback`` runs the evaluation at step 0 (``on_train_begin``), every ``eval_every`` steps
and at the last step, appends one line per evaluation to ``eval_curve.jsonl`` in the arm folder and
hands the accuracies to the step's log as ``eval_<name>_accuracy`` (wandb shows ``eval/<name>_accuracy``).

Leaves out: a ZeRO-3-partitioned model (evaluation runs where the model is, unsharded), several samples
per problem (more problems cost the same and keep the pairing simple).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from transformers import TrainerCallback

from ..algo.intervals import wilson_interval
from ..report.stats import binomial_tail
from ..report.stats import mcnemar_exact as _mcnemar_exact

LEVEL = 0.95
N_BOOT = 10_000
CURVE_FILE = "eval_curve.jsonl"
PAIRED_TEST = "exact McNemar (two-sided exact binomial test on the discordant problems)"
DIFF_INTERVAL = "paired bootstrap over problems, percentile"


def temperature_name(t: float) -> str:
    """``greedy`` for 0, ``t1`` for 1, else ``t<t>`` (``t0.7``): the key of an evaluation's results."""
    if t == 0:
        return "greedy"
    return f"t{t:g}"


def default_temperatures(temperatures: Sequence[float]) -> dict[str, float]:
    """{name: temperature} for a list of temperatures (names from ``temperature_name``)."""
    out = {temperature_name(float(t)): float(t) for t in temperatures}
    if len(out) != len(temperatures):
        raise ValueError(f"temperatures must be distinct, got {list(temperatures)}")
    return out


# ---------------------------------------------------------------------------------------- statistics


def wilson(k: int, n: int, level: float = LEVEL) -> tuple[float, float]:
    """Wilson score interval of the proportion k / n at ``level`` (``algo.intervals.wilson_interval``, the
    one implementation); (nan, nan) when n == 0."""
    return wilson_interval(k, n, z=_z(level))


def _z(level: float) -> float:
    from statistics import NormalDist

    return NormalDist().inv_cdf(0.5 + level / 2)


def accuracy_summary(correct: Sequence[int], level: float = LEVEL) -> dict:
    """Accuracy of a 0/1 list with its Wilson interval: {accuracy, ci_low, ci_high, n, k}."""
    values = _binary(correct, "correct")
    n, k = len(values), sum(values)
    lo, hi = wilson(k, n, level)
    return {"accuracy": k / n if n else float("nan"), "ci_low": lo, "ci_high": hi, "n": n, "k": k}


def mcnemar_exact(before: Sequence[int], after: Sequence[int]) -> dict:
    """Exact McNemar test of paired 0/1 outcomes (the same problems before and after): the report's
    test (``marsrl.report.stats.mcnemar_exact``, the one implementation) in this module's terms.

    ``gains``: problems wrong before and right after; ``losses``: the reverse. Under H0 (no change)
    gains ~ Bin(gains + losses, 1/2). ``p_two_sided`` = min(1, 2 P(X <= min(gains, losses)));
    ``p_greater`` = P(X >= gains), the one-sided p that after is better."""
    b, a = _binary(before, "before"), _binary(after, "after")
    if len(b) != len(a):
        raise ValueError(f"before and after must be paired (same length), got {len(b)} and {len(a)}")
    p_two, counts = _mcnemar_exact(a, b)  # a right and b wrong: a gain
    gains, losses = counts["a_only"], counts["b_only"]
    return {
        "gains": gains,
        "losses": losses,
        "p_two_sided": p_two,
        "p_greater": binomial_tail(gains, gains + losses),
    }


def paired_bootstrap_interval(
    before: Sequence[int],
    after: Sequence[int],
    n_boot: int = N_BOOT,
    seed: int = 0,
    level: float = LEVEL,
) -> tuple[float, float]:
    """Percentile interval of mean(after - before) over problems resampled with replacement.

    A resample of n paired 0/1 outcomes is fully described by how many of its pairs are gains (+1),
    losses (-1) and ties (0), so each of the ``n_boot`` resamples is one multinomial draw of those counts
    (the same distribution as resampling the n problems one by one)."""
    import numpy as np

    b, a = _binary(before, "before"), _binary(after, "after")
    if len(b) != len(a) or not b:
        raise ValueError(f"before and after must be paired and non-empty, got {len(b)} and {len(a)}")
    n = len(b)
    gains = sum(1 for x, y in zip(b, a, strict=True) if y > x)
    losses = sum(1 for x, y in zip(b, a, strict=True) if y < x)
    rng = np.random.default_rng(seed)
    counts = rng.multinomial(n, [gains / n, losses / n, (n - gains - losses) / n], size=n_boot)
    diffs = (counts[:, 0] - counts[:, 1]) / n
    lo, hi = np.quantile(diffs, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


def paired_comparison(
    before: Sequence[int], after: Sequence[int], n_boot: int = N_BOOT, seed: int = 0, level: float = LEVEL
) -> dict:
    """after - before on the same problems: the difference, its paired-bootstrap interval and the exact
    McNemar test (see the module docstring)."""
    b, a = _binary(before, "before"), _binary(after, "after")
    test = mcnemar_exact(b, a)
    lo, hi = paired_bootstrap_interval(b, a, n_boot, seed, level)
    return {
        "before": sum(b) / len(b),
        "after": sum(a) / len(a),
        "diff": (sum(a) - sum(b)) / len(b),
        "ci_low": lo,
        "ci_high": hi,
        **test,
        "n": len(b),
        "test": PAIRED_TEST,
        "interval": f"{DIFF_INTERVAL}, {level:.0%}, {n_boot} resamples, seed {seed}",
    }


def compare_evals(before: Mapping, after: Mapping, n_boot: int = N_BOOT, seed: int = 0) -> dict:
    """``paired_comparison`` of every temperature two ``evaluate_policy`` results share, plus
    ``greedy_not_below``: whether greedy accuracy after is at or above the lower end of before's interval
    (absent when there is no greedy evaluation)."""
    out = {}
    for name, b in before.items():
        if not isinstance(b, Mapping) or "correct" not in b or name not in after:
            continue
        out[name] = paired_comparison(b["correct"], after[name]["correct"], n_boot, seed)
    if "greedy" in out:
        out["greedy_not_below"] = after["greedy"]["accuracy"] >= before["greedy"]["ci_low"]
    return out


def _binary(values: Sequence, name: str) -> list[int]:
    out = [int(v) for v in values]
    if any(v not in (0, 1) for v in out):
        raise ValueError(f"{name} must hold only 0 and 1")
    return out


# ---------------------------------------------------------------------------------------- evaluation


def eval_settings(cfg, args) -> dict:
    """``evaluate_policy`` / ``HeldoutEvalCallback`` keyword arguments of an experiment: ``cfg.eval``'s
    temperatures, batch size and seed (None: the experiment's), completions up to
    ``cfg.eval.max_new_tokens`` (None: the trainer's ``max_completion_length``), prompts rendered with
    the trainer's chat-template arguments."""
    e = cfg.eval
    return dict(
        temperatures=default_temperatures(e.temperatures),
        max_new_tokens=e.max_new_tokens or args.max_completion_length,
        batch_size=e.batch_size,
        seed=cfg.seed if e.seed is None else e.seed,
        chat_template_kwargs=dict(getattr(args, "chat_template_kwargs", None) or {}),
    )


def render_prompts(tokenizer, problems: Sequence[Mapping], chat_template_kwargs: Mapping | None = None):
    """Token ids of each problem's ``prompt`` (chat messages) with the generation prompt."""
    kwargs = dict(chat_template_kwargs or {})
    out = []
    for p in problems:
        ids = tokenizer.apply_chat_template(p["prompt"], add_generation_prompt=True, tokenize=True, **kwargs)
        out.append(list(ids["input_ids"] if hasattr(ids, "keys") else ids))
    return out


def evaluate_policy(
    model,
    tokenizer,
    problems: Sequence[Mapping],
    *,
    temperatures: Mapping[str, float] | None = None,
    max_new_tokens: int = 128,
    batch_size: int = 256,
    seed: int = 0,
    chat_template_kwargs: Mapping | None = None,
    prompts: Sequence[Sequence[int]] | None = None,
) -> dict:
    """Accuracy of ``model`` on ``problems`` ({prompt: chat messages, gold}) at each temperature.

    Plain decoding with the policy itself (no drafter: every arm alike), ``batch_size`` sequences at a
    time, one completion per problem and temperature, sampling seed ``seed`` (the same draws for every
    arm that passes the same seed and problems). ``prompts``: the rendered prompt ids, when the caller
    keeps them between evaluations. Returns {name: summary (see the module docstring), "seconds": wall
    seconds, "cpu_seconds": this process's CPU seconds}."""
    import torch

    from ..data import score
    from ..engine import EngineConfig, SamplingParams, SpeculativeEngine

    temperatures = dict(temperatures if temperatures is not None else {"t1": 1.0, "greedy": 0.0})
    if not problems:
        raise ValueError("problems is empty")
    started, cpu = time.perf_counter(), time.process_time()
    model = getattr(model, "module", model)  # a DDP-wrapped model evaluates its module
    was_training = model.training
    model.eval()
    if prompts is None:
        prompts = render_prompts(tokenizer, problems, chat_template_kwargs)
    engine = SpeculativeEngine(model, None, EngineConfig(max_batch_size=batch_size))
    out: dict = {}
    try:
        for name, t in temperatures.items():
            sampling = SamplingParams(
                temperature=t, max_new_tokens=max_new_tokens, eos_token_id=tokenizer.eos_token_id, seed=seed
            )
            with torch.no_grad():
                trajs = engine.generate(prompts, sampling)
            correct = [
                int(score(tokenizer.decode(tr.completion_ids, skip_special_tokens=True), p["gold"]))
                for tr, p in zip(trajs, problems, strict=True)
            ]
            lengths = [len(tr.completion_ids) for tr in trajs]
            out[name] = {
                "temperature": t,
                **accuracy_summary(correct),
                "correct": correct,
                "mean_completion_tokens": sum(lengths) / len(lengths),
                "truncated_frac": sum(n >= max_new_tokens for n in lengths) / len(lengths),
            }
    finally:
        model.train(was_training)
    out["seconds"] = time.perf_counter() - started
    out["cpu_seconds"] = (
        time.process_time() - cpu
    )  # this process's CPU time: what a busy machine inflates less
    return out


# ---------------------------------------------------------------------------------------- during training


def eval_steps(max_steps: int, every: int | None) -> list[int]:
    """The steps evaluated during training: every ``every`` steps (None: ceil(max_steps / 4), so three
    evaluations fall inside the run and one at its end; 0: none) and always the last; step 0 (before
    training) is evaluated apart."""
    if max_steps < 1:
        return []
    if every is None:
        every = -(-max_steps // 4)
    steps = set(range(every, max_steps + 1, every)) if every > 0 else set()
    return sorted(steps | {max_steps})


def log_keys(result: Mapping) -> dict:
    """What one evaluation hands the trainer's log: ``eval_<name>_accuracy`` and its interval per
    temperature (wandb's integration renames ``eval_x`` to ``eval/x``), and the seconds it took."""
    out = {}
    for name, r in result.items():
        if isinstance(r, Mapping) and "accuracy" in r:
            out[f"eval_{name}_accuracy"] = r["accuracy"]
            out[f"eval_{name}_ci_low"] = r["ci_low"]
            out[f"eval_{name}_ci_high"] = r["ci_high"]
    if "seconds" in result:
        out["eval_seconds"] = result["seconds"]
    return out


def curve_row(step: int, result: Mapping) -> dict:
    """One line of eval_curve.jsonl: step, ``<name>_accuracy`` (flat, for plots) and the full result."""
    row: dict = {"step": step}
    for name, r in result.items():
        if isinstance(r, Mapping) and "accuracy" in r:
            row[f"{name}_accuracy"] = r["accuracy"]
    row["seconds"] = result.get("seconds")
    row["results"] = dict(result)
    return row


def read_curve(path: str | Path) -> list[dict]:
    path = Path(path)
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class HeldoutEvalCallback(TrainerCallback):
    """Held-out accuracy at step 0, during training and at the last step (see the module docstring).

    Args:
        tokenizer, problems: as ``evaluate_policy``.
        out: the arm folder; ``eval_curve.jsonl`` is written there.
        temperatures, max_new_tokens, batch_size, seed, chat_template_kwargs: as ``evaluate_policy``.
        every: evaluate every this many steps (None: ceil(max_steps / 4); 0: only before and at the end).
        before: an ``evaluate_policy`` result of the initial policy to reuse as step 0 (arms that start
            from the same policy with the same problems and seed share one).
        resume_step: the step a resumed run continues from: curve lines after it are dropped.

    Must run before the wandb and recorder callbacks to hand them the metrics: ``attach(trainer)``
    puts it first. ``results`` holds {step: result} of this run; ``final`` the last one."""

    def __init__(
        self,
        tokenizer,
        problems: Sequence[Mapping],
        out: str | Path,
        *,
        temperatures: Mapping[str, float] | None = None,
        max_new_tokens: int = 128,
        batch_size: int = 256,
        seed: int = 0,
        chat_template_kwargs: Mapping | None = None,
        every: int | None = None,
        before: Mapping | None = None,
        resume_step: int = 0,
    ):
        self.tokenizer = tokenizer
        self.problems = list(problems)
        self.path = Path(out) / CURVE_FILE
        self.kwargs = dict(
            temperatures=temperatures,
            max_new_tokens=max_new_tokens,
            batch_size=batch_size,
            seed=seed,
        )
        self.prompts = render_prompts(tokenizer, self.problems, chat_template_kwargs)
        self.every = every
        self.before = before
        self.results: dict[int, dict] = {}
        kept = [r for r in read_curve(self.path) if r["step"] <= resume_step]
        self._write(kept)
        for r in kept:
            self.results[int(r["step"])] = r["results"]
        self._pending: dict = {}
        self._schedule: set[int] = set()

    def attach(self, trainer) -> HeldoutEvalCallback:
        """Add this callback to ``trainer`` ahead of every other one (so its metrics reach their logs)."""
        trainer.callback_handler.callbacks.insert(0, self)
        return self

    @property
    def final(self) -> dict | None:
        return self.results[max(self.results)] if self.results else None

    def at(self, step: int, model) -> dict:
        """The evaluation at ``step``: the one recorded (this run or the curve a resume kept), else made
        now with ``model`` and recorded (an arm resumed from its last checkpoint trains no further)."""
        if step not in self.results:
            self.record(step, self.evaluate(model))
        return self.results[step]

    def evaluate(self, model) -> dict:
        return evaluate_policy(model, self.tokenizer, self.problems, prompts=self.prompts, **self.kwargs)

    def record(self, step: int, result: Mapping) -> None:
        """Keep one evaluation of ``step`` and append it to eval_curve.jsonl."""
        self.results[step] = dict(result)
        with self.path.open("a") as f:
            f.write(json.dumps(curve_row(step, result)) + "\n")

    def _write(self, rows: list[dict]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
        os.replace(tmp, self.path)

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self._schedule = set(eval_steps(state.max_steps, self.every))
        if not state.is_world_process_zero or 0 in self.results or state.global_step > 0:
            return
        result = self.before if self.before is not None else self.evaluate(model)
        self.record(0, result)
        _wandb_log(args, 0, result)  # no step's log to ride on: straight to the run, at global step 0

    def on_log(self, args, state, control, logs=None, model=None, **kwargs):
        if not state.is_world_process_zero or logs is None or "loss" not in logs:
            return
        step = state.global_step
        if step in self._schedule and step not in self.results:
            result = self.evaluate(model)
            self.record(step, result)
            self._pending.update(log_keys(result))
        if self._pending:
            logs.update(self._pending)
            self._pending = {}

    def on_train_end(self, args, state, control, model=None, **kwargs):
        # a run that stopped before its last scheduled step still ends with an evaluation
        if state.is_world_process_zero and state.global_step not in self.results:
            result = self.evaluate(model)
            self.record(state.global_step, result)
            _wandb_log(args, state.global_step, result)


def _wandb_log(args, step: int, result: Mapping) -> None:
    """Log an evaluation that no training step's log carries (step 0, a run cut short) to the active
    wandb run, keyed as the wandb integration keys the rest (``eval/...``, ``train/global_step``)."""
    report_to = args.report_to if isinstance(args.report_to, (list, tuple)) else [args.report_to]
    if "wandb" not in report_to:
        return
    import wandb

    if wandb.run is not None:
        from transformers.integrations.integration_utils import rewrite_logs

        wandb.log({**rewrite_logs(log_keys(result)), "train/global_step": step})
