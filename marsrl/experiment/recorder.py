"""The run's own files, written as training goes (nothing is lost if wandb fails or the run is killed):
``metrics.jsonl`` (every logged step, keys exactly as they reach wandb) and ``samples.jsonl`` (sample
trajectories of each step with their per-token record). A resumed run first cuts both back to the
checkpoint it resumes from, so the steps after it are written once.

A sample's ``tokens`` are the decoded text of each completion token (``token_texts``): joined they are
the completion exactly; ``gold`` and ``answer`` (the number parsed from the completion) sit beside its
reward."""

from __future__ import annotations

import json
import math
import os
import signal
import time
from pathlib import Path

from transformers import TrainerCallback
from transformers.integrations.integration_utils import rewrite_logs
from transformers.trainer_callback import ProgressCallback

from ..data import extract_answer, gold_value


def _rows(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _write_rows(path: Path, rows: list[dict]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    os.replace(tmp, path)


def token_texts(tokenizer, ids: list[int], skip_special_tokens: bool = True) -> list[str]:
    """The text each token adds to ``tokenizer.decode(ids)``: ``"".join(token_texts(...))`` equals it.

    Found by decoding every prefix of ``ids``: token i gets what ``decode(ids[:i + 1])`` adds to the text
    so far.  When a longer prefix rewrites text already given out (the bytes of one character split over
    several byte-level BPE tokens decode to U+FFFD until the last of them; a tokenizer's clean-up may
    change spacing), that text is taken back from the tokens before, so the whole character goes to the
    token that completes it and the earlier ones get "".  A special token skipped in decoding gets "".
    Quadratic in len(ids) (a few hundred decodes of a completion: cheap beside the step).
    """
    texts: list[str] = []
    shown = ""
    for i in range(len(ids)):
        full = tokenizer.decode(ids[: i + 1], skip_special_tokens=skip_special_tokens)
        keep = 0
        for a, b in zip(shown, full, strict=False):
            if a != b:
                break
            keep += 1
        extra = len(shown) - keep  # characters given out before that this prefix rewrites
        j = len(texts) - 1
        while extra > 0:
            cut = min(extra, len(texts[j]))
            texts[j] = texts[j][: len(texts[j]) - cut]
            extra -= cut
            j -= 1
        texts.append(full[keep:])
        shown = full
    return texts


def _clean(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class RunRecorder(TrainerCallback):
    """Appends one metrics row per optimizer step (and its samples) on the main process.

    Args:
        trainer: the MarsGRPOTrainer (its ``last_batch`` gives the step's trajectories).
        out: the arm folder.
        tokenizer: decodes the samples.
        samples_per_step: trajectories written per step.
        resume_from: the checkpoint the run resumes from (rows after its step are dropped first).
    """

    def __init__(self, trainer, out: Path, tokenizer, samples_per_step: int, resume_from: Path | None = None):
        self.trainer = trainer
        self.metrics_path = Path(out) / "metrics.jsonl"
        self.samples_path = Path(out) / "samples.jsonl"
        self.tokenizer = tokenizer
        self.samples_per_step = samples_per_step
        keep = int(Path(resume_from).name.split("-")[-1]) if resume_from else 0
        rows = [r for r in _rows(self.metrics_path) if r["step"] <= keep]
        _write_rows(self.metrics_path, rows)
        _write_rows(self.samples_path, [r for r in _rows(self.samples_path) if r["step"] <= keep])
        self.offset = rows[-1]["wall_s"] if rows else 0.0  # wall-clock of the steps before a resume
        self.rows = rows
        self.t0 = time.perf_counter()

    def on_train_begin(self, args, state, control, **kwargs):
        self.t0 = time.perf_counter()

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs or "loss" not in logs:
            return
        row = {"step": state.global_step, "wall_s": self.offset + time.perf_counter() - self.t0}
        row.update({k: _clean(v) for k, v in rewrite_logs(dict(logs)).items()})
        row["train/global_step"] = state.global_step
        self.rows.append(row)
        with self.metrics_path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        samples = self._samples(state.global_step)
        if samples:
            with self.samples_path.open("a") as f:
                f.write("".join(json.dumps(s) + "\n" for s in samples))

    def on_save(self, args, state, control, **kwargs):
        # fault injection for the resume tests: die like a SIGKILL right after the checkpoint of step k
        kill_after = os.environ.get("MARSRL_KILL_AFTER_STEP")
        if kill_after and state.global_step == int(kill_after):
            os.kill(os.getpid(), signal.SIGKILL)

    def _samples(self, step: int) -> list[dict]:
        batch = getattr(self.trainer, "last_batch", None)
        if not batch or not self.samples_per_step:
            return []
        out = []
        for i, row in enumerate(batch["rows"][: self.samples_per_step]):
            n = int(batch["mask"][i].sum())
            ids = batch["completion_ids"][i, :n].tolist()
            tokens = token_texts(self.tokenizer, ids)
            text = "".join(tokens)
            out.append(
                {
                    "step": step,
                    "prompt": _prompt_text(row.get("prompt")),
                    "completion": text,
                    "tokens": tokens,
                    "token_ids": ids,
                    "provenance": list(row["provenance"][:n]),
                    "target_logprobs": list(row["target_logprobs"][:n]),
                    "behavior_logprobs": list(row["behavior_logprobs"][:n]),
                    "reward": self._reward(row, text, ids),
                    "gold": _gold(row),
                    "answer": extract_answer(text),
                }
            )
        return out

    def _reward(self, row: dict, text: str, ids: list[int]) -> float | None:
        """The sample's reward, recomputed with the trainer's reward functions and weights."""
        total = 0.0
        completion = [{"role": "assistant", "content": text}] if isinstance(row.get("prompt"), list) else text
        extra = {k: [v] for k, v in row.items() if k not in ("prompt", "rollout_stats")}
        for func, weight in zip(self.trainer.reward_funcs, self.trainer.reward_weights.tolist(), strict=True):
            if not callable(func):
                return None
            value = func(
                prompts=[row.get("prompt")], completions=[completion], completion_ids=[ids], **extra
            )[0]
            total += weight * (value or 0.0)
        return total

    def final_tau(self, frac: float = 0.2) -> float | None:
        taus = [r.get("train/rollout/tau") for r in self.rows]
        taus = [t for t in taus if isinstance(t, (int, float))]
        if not taus:
            return None
        tail = taus[-max(1, int(len(taus) * frac)) :]
        return sum(tail) / len(tail)


def _gold(row: dict) -> str | None:
    """The sample's gold answer as the reward compares it (the ``answer`` or ``gold`` column)."""
    gold = row.get("answer", row.get("gold"))
    if gold is None:
        return None
    try:
        return gold_value(gold)
    except ValueError:  # not a GSM8K answer: shown as given
        return str(gold)


def _prompt_text(prompt) -> str:
    if isinstance(prompt, list):
        return "\n".join(f"{m.get('role')}: {m.get('content')}" for m in prompt)
    return str(prompt)


class CompactProgress(ProgressCallback):
    """TRL's progress bar, with one short line per step instead of the whole metrics dict."""

    KEYS = (
        ("reward", "reward", "{:.3f}"),
        ("tau", "rollout/tau", "{:.2f}"),
        ("relaxed", "rollout/relaxed_frac", "{:.2%}"),
        ("top2 excess", "bias/top2_excess", "{:+.2%}"),
        ("IS mean", "bias/is_ratio_mean", "{:.3f}"),
        ("s/step", "step_seconds", "{:.1f}"),
    )

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or self.training_bar is None or not logs or "loss" not in logs:
            return
        parts = [f"step {state.global_step}"]
        for label, key, fmt in self.KEYS:
            value = logs.get(key)
            if isinstance(value, (int, float)) and math.isfinite(value):
                parts.append(f"{label} {fmt.format(value)}")
        self.training_bar.write("  ".join(parts))
