"""The correction without vLLM equals TRL's own vLLM-path correction: for every TRL mode and every clipped
loss type, the per-token weighting of the advantages and the parameter gradients of one step match a
plain GRPOTrainer whose vLLM path is switched on around the same rollouts (TRL's code is the reference).

The rollouts come from a LocalPool drafting with a random EAGLE-3 head, sampled drafts and mars at
theta = 0, so the behaviour log-probs differ from the policy's (max |log b - log pi| ~ 0.1 at V = 23)
and a dropped or misapplied weight changes the gradient."""

from __future__ import annotations

import types

import pytest
import torch
from transformers import AutoTokenizer
from trl import GRPOTrainer

from marsrl.integrations.trl import make_rollout_func
from marsrl.trainer import MarsGRPOConfig, MarsGRPOTrainer
from tests.trainer.helpers import (
    grads_of_one_step,
    length_reward,
    local_pool,
    prompt_dataset,
    save_tiny_world,
)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return save_tiny_world(tmp_path_factory.mktemp("policy"))


def _args(tmp, mode, loss_type, **extra):
    return MarsGRPOConfig(
        output_dir=str(tmp),
        use_cpu=True,
        bf16=False,
        report_to="none",
        per_device_train_batch_size=8,
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
        vllm_importance_sampling_mode=mode,
        vllm_importance_sampling_clip_min=0.5 if mode.endswith("mask") else None,
        vllm_importance_sampling_clip_max=1.05,
        is_clip_min=0.5 if mode.endswith("mask") else None,
        is_clip_max=1.05,
        **extra,
    )


def _recording(trainer):
    """Keep the inputs _compute_loss used (read after the call: with one policy per generation
    MarsGRPOTrainer folds the weights into them from the training forward itself)."""
    seen = []
    inner = trainer._compute_loss

    def wrapper(model, inputs):
        loss = inner(model, inputs)
        seen.append({k: (v.detach().clone() if torch.is_tensor(v) else v) for k, v in inputs.items()})
        return loss

    trainer._compute_loss = wrapper
    return seen


def _trl_vllm_path(folder, args):
    """A plain GRPOTrainer with TRL's vLLM-gated correction switched on (no vLLM is contacted)."""
    tok = AutoTokenizer.from_pretrained(folder)
    pool = local_pool(folder)
    trainer = GRPOTrainer(
        folder,
        [length_reward],
        args=args,
        train_dataset=prompt_dataset(),
        processing_class=tok,
        rollout_func=make_rollout_func(pool, tok),
    )
    trainer.use_vllm = True
    trainer._last_loaded_step = 0
    trainer.vllm_generation = types.SimpleNamespace(sync_weights=lambda: None)
    return trainer


CASES = [(m, "dapo") for m in ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")]
CASES += [("token_truncate", lt) for lt in ("grpo", "dr_grpo", "bnpo", "vespo")]


@pytest.mark.parametrize(("mode", "loss_type"), CASES)
def test_weights_and_gradients_equal_trls_vllm_path(folder, tmp_path, mode, loss_type):
    tok = AutoTokenizer.from_pretrained(folder)
    ours = MarsGRPOTrainer(
        folder,
        [length_reward],
        _args(tmp_path / "a", mode, loss_type),
        prompt_dataset(),
        tok,
        pool=local_pool(folder),
    )
    ref = _trl_vllm_path(folder, _args(tmp_path / "b", mode, loss_type))
    seen_ours, seen_ref = _recording(ours), _recording(ref)
    g_ours, g_ref = grads_of_one_step(ours), grads_of_one_step(ref)

    (a,), (b,) = seen_ours, seen_ref
    b = _aligned(b, a)  # the same rollouts (TRL shuffles a batch before splitting it)
    mask = a["completion_mask"].bool()
    ratio = b["importance_sampling_ratio"].expand_as(mask)
    assert (ratio[mask] - 1).abs().max() > 1e-3, "weights are ~1: the test would not see a dropped weight"
    if loss_type == "vespo":
        assert torch.allclose(a["importance_sampling_ratio"][mask], ratio[mask], atol=1e-6)
    else:
        weighted_ref = b["advantages"].unsqueeze(1) * ratio
        assert torch.allclose(a["advantages"][mask], weighted_ref[mask], atol=1e-6)
    scale = max(g.abs().max() for g in g_ref.values())
    assert scale > 0
    for name, g in g_ref.items():
        err = (g_ours[name] - g).abs().max()
        assert err <= 1e-6 * max(1.0, scale), f"{name}: max |diff| {err:.3g} (gradient scale {scale:.3g})"


def test_uncorrected_gradient_differs(folder, tmp_path):
    """Control: with is_correction='none' (allowed explicitly) the gradient is not TRL's corrected one."""
    tok = AutoTokenizer.from_pretrained(folder)
    ours = MarsGRPOTrainer(
        folder, [length_reward], _none_args(tmp_path / "a"), prompt_dataset(), tok, pool=local_pool(folder)
    )
    ref = _trl_vllm_path(folder, _args(tmp_path / "b", "token_truncate", "dapo"))
    g_ours, g_ref = grads_of_one_step(ours), grads_of_one_step(ref)
    diff = max((g_ours[k] - g_ref[k]).abs().max() for k in g_ref)
    assert diff > 1e-4


def _aligned(b: dict, a: dict) -> dict:
    """b's rows reordered to a's (rows matched by prompt and completion ids)."""

    def keys(x):
        return [
            (*p, -1, *c) for p, c in zip(x["prompt_ids"].tolist(), x["completion_ids"].tolist(), strict=True)
        ]

    where = {k: i for i, k in enumerate(keys(b))}
    order = torch.tensor([where[k] for k in keys(a)])
    assert sorted(order.tolist()) == list(range(len(order))), "the two trainers saw different rollouts"
    return {
        k: (v[order] if torch.is_tensor(v) and v.dim() > 0 and len(v) == len(order) else v)
        for k, v in b.items()
    }


def _none_args(tmp):
    args = _args(tmp, "token_truncate", "dapo")
    args.is_correction = "none"
    args.allow_uncorrected_lossy = True
    return args
