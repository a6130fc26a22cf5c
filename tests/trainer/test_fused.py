"""One policy forward instead of two: with one policy per generation (num_iterations == 1, no generation
reused across optimizer steps) MarsGRPOTrainer takes the importance weights' policy log-probs and the
top-1 / top-2 statistics from the training forward (``fuse_policy_forward``, the default). Checked against
the separate no-grad forward (``fuse_policy_forward=False``) on the same rollouts: the weights the loss
sees, the loss, one step's gradients, and the correction and bias metrics, all to 1e-6, for every loss
type (at token_truncate) and every is_correction mode (at dapo); with gradient accumulation over two
micro-batches, so the fused path's metrics are joined over them. Reused generations keep the separate
forward.

Rollouts: mars at theta = 0 with sampled drafts from a random head (weights far from 1), 8 completions of
up to 8 tokens a step, tiny world (V = 23)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoTokenizer

from marsrl.trainer import IS_CORRECTIONS, MarsGRPOConfig, MarsGRPOTrainer
from tests.trainer.helpers import (
    grads_of_one_step,
    length_reward,
    local_pool,
    prompt_dataset,
    save_tiny_world,
)
from tests.trainer.test_correction import _aligned, _recording


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return save_tiny_world(tmp_path_factory.mktemp("policy"))


def _trainer(folder, tmp, mode, loss_type, fuse, **extra):
    fields = dict(
        output_dir=str(tmp),
        use_cpu=True,
        bf16=False,
        report_to="none",
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        num_generations=4,
        max_completion_length=8,
        max_steps=1,
        learning_rate=1.0,
        optim="sgd",
        max_grad_norm=0.0,
        lr_scheduler_type="constant",
        logging_steps=1,
        save_strategy="no",
        seed=0,
        loss_type=loss_type,
        is_correction=mode,
        is_clip_min=0.5 if mode.endswith("mask") else None,
        is_clip_max=None if mode in ("none", "sequence") else 1.05,
        allow_uncorrected_lossy=mode == "none",
        fuse_policy_forward=fuse,
    )
    fields.update(extra)
    tok = AutoTokenizer.from_pretrained(folder)
    return MarsGRPOTrainer(
        folder, [length_reward], MarsGRPOConfig(**fields), prompt_dataset(), tok, pool=local_pool(folder)
    )


def _forwards(trainer) -> list[int]:
    """Count the policy forwards run outside autograd (the separate no-grad forward)."""
    calls = []
    inner = trainer._get_per_token_logps_and_entropies

    def counting(*args, **kwargs):
        calls.append(torch.is_grad_enabled())
        return inner(*args, **kwargs)

    trainer._get_per_token_logps_and_entropies = counting
    return calls


def _run(folder, tmp, mode, loss_type, fuse):
    trainer = _trainer(folder, tmp, mode, loss_type, fuse)
    seen, calls = _recording(trainer), _forwards(trainer)
    return trainer, seen, calls, grads_of_one_step(trainer)


CASES = [
    ("token_truncate", lt) for lt in ("grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo")
]
CASES += [(m, "dapo") for m in IS_CORRECTIONS if m != "token_truncate"]


@pytest.mark.parametrize(("mode", "loss_type"), CASES)
def test_fused_forward_equals_the_two_forward_path(folder, tmp_path, mode, loss_type):
    # each trainer built right before it trains: building seeds the global RNG, which shuffles the batch
    # into micro-batches (bnpo normalises per micro-batch)
    fused, seen_f, calls_f, g_f = _run(folder, tmp_path / "a", mode, loss_type, True)
    two, seen_t, calls_t, g_t = _run(folder, tmp_path / "b", mode, loss_type, False)

    assert calls_f == [True, True], "fused: one forward per micro-batch, all with autograd"
    assert calls_t == [False, True, True], "two-forward path: the no-grad forward, then the training ones"
    a = {k: torch.cat([s[k] for s in seen_f]) for k in ("prompt_ids", "completion_ids", "completion_mask")}
    b = {k: torch.cat([s[k] for s in seen_t]) for k in ("prompt_ids", "completion_ids", "completion_mask")}
    key = "importance_sampling_ratio" if loss_type == "vespo" else "advantages"
    a[key] = torch.cat([s[key] for s in seen_f])
    b[key] = torch.cat([s[key] for s in seen_t])
    b = _aligned(b, a)  # the same rollouts, rows matched
    mask = a["completion_mask"].bool()
    assert torch.allclose(a[key][mask], b[key][mask], atol=1e-6)
    if mode != "none":
        assert a[key][mask].std() > 1e-3, "weights/advantages constant: the test would not see a difference"

    scale = max(g.abs().max() for g in g_t.values())
    assert scale > 0
    for name, g in g_t.items():
        err = (g_f[name] - g).abs().max()
        assert err <= 1e-6 * max(1.0, scale), f"{name}: max |diff| {err:.3g} (gradient scale {scale:.3g})"

    (log_f,) = [h for h in fused.state.log_history if "loss" in h]
    (log_t,) = [h for h in two.state.log_history if "loss" in h]
    assert log_f["loss"] == pytest.approx(log_t["loss"], abs=1e-6)
    figures = [k for k in log_t if k.startswith(("bias/", "correction/", "rollout/acceptance_pos"))]
    assert len(figures) > 10 and set(figures) <= set(log_f)
    for k in figures:
        assert log_f[k] == pytest.approx(log_t[k], abs=1e-6, nan_ok=True), k
    assert log_f["timing/policy_forward_seconds"] == 0.0 < log_t["timing/policy_forward_seconds"]


def test_reused_generations_keep_the_separate_forward(folder, tmp_path):
    """num_iterations = 2: the policy moves between the uses of a generation, so pi_old is its own
    forward."""
    trainer = _trainer(folder, tmp_path, "token_truncate", "dapo", True, num_iterations=2, max_steps=2)
    seen = _recording(trainer)
    trainer.train()
    assert len(seen) == 4 and not any("marsrl_provenance" in s for s in seen)
    first = next(h for h in trainer.state.log_history if "timing/policy_forward_seconds" in h)
    assert first["timing/policy_forward_seconds"] > 0
