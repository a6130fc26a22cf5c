"""Every generation setting of GRPOConfig / MarsGRPOConfig is honoured by the pool or refused when the
trainer is built (docs/trainer-options.md): each honoured one is set once and shows its effect in the
rollouts, each refused one raises a ValueError naming it before any step. Also ``mask_truncated_completions``
as in TRL: truncated rows keep their own per-token record and contribute nothing; an all-truncated batch
gives loss 0 and moves no parameter.

Rollouts: strict verification (lossless: the rollout distribution is the policy's filtered sampling
distribution) from a LocalPool on the tiny world (V = 23), 8 completions of up to 8 tokens per step."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoTokenizer

from marsrl.engine import SamplingParams
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


def _args(tmp, **extra):
    fields = dict(
        output_dir=str(tmp),
        use_cpu=True,
        bf16=False,
        report_to="none",
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=8,
        max_steps=1,
        save_strategy="no",
        logging_steps=1,
        seed=0,
    )
    fields.update(extra)
    return MarsGRPOConfig(**fields)


def _trainer(folder, tmp, pool=None, sampling=None, **extra):
    tok = AutoTokenizer.from_pretrained(folder)
    pool = pool if pool is not None else local_pool(folder, rule="strict")
    return MarsGRPOTrainer(
        folder, [length_reward], _args(tmp, **extra), prompt_dataset(8), tok, pool=pool, sampling=sampling
    )


class Recording:
    """A LocalPool that keeps the trajectories it returns."""

    def __init__(self, pool):
        self.pool, self.info, self.trajectories = pool, pool.info, []

    def generate(self, prompts, sampling):
        out = self.pool.generate(prompts, sampling)
        self.trajectories += out
        return out

    def update_weights(self, *a, **k):
        return self.pool.update_weights(*a, **k)

    @property
    def last_batch(self):
        return self.pool.last_batch


def _rollouts(folder, tmp, **extra):
    """One step; returns (trainer, pool, the step's trajectories)."""
    pool = Recording(local_pool(folder, rule="strict"))
    trainer = _trainer(folder, tmp, pool=pool, **extra)
    trainer.train()
    return trainer, pool.pool, pool.trajectories


def _ranks(pool, trajs) -> list[int]:
    """The rank of each completion token among the generating policy's logits at its position."""
    target = pool.worker.target
    out = []
    with torch.no_grad():
        for t in trajs:
            prompt, completion = list(t.prompt_ids), list(t.completion_ids)
            ids = torch.tensor([prompt + completion])
            z = target(ids).logits[0, len(prompt) - 1 : -1]  # [C, V]: position t predicts token t
            picked = z.gather(1, torch.tensor(completion)[:, None])
            out += (z > picked).sum(1).tolist()
    return out


def _nucleus_rank(pool, trajs, temperature: float) -> list[float]:
    """For each completion token: the policy mass (at ``temperature``) ranked strictly above it."""
    target = pool.worker.target
    out = []
    with torch.no_grad():
        for t in trajs:
            prompt, completion = list(t.prompt_ids), list(t.completion_ids)
            ids = torch.tensor([prompt + completion])
            p = (target(ids).logits[0, len(prompt) - 1 : -1] / temperature).softmax(-1)
            picked = p.gather(1, torch.tensor(completion)[:, None])
            out += (p * (p > picked)).sum(1).tolist()
    return out


# ------------------------------------------------------------------ honoured
@pytest.mark.parametrize(
    "extra", [dict(top_k=3), dict(generation_kwargs={"top_k": 3})], ids=["field", "generation_kwargs"]
)
def test_top_k_is_honoured(folder, tmp_path, extra):
    trainer, pool, trajs = _rollouts(folder, tmp_path, **extra)
    ranks = _ranks(pool, trajs)
    assert trainer.sampling.top_k == 3
    assert len(ranks) >= 40 and max(ranks) <= 2, "a token outside the policy's top 3 was sampled"
    _, pool0, trajs0 = _rollouts(folder, tmp_path / "control")
    assert max(_ranks(pool0, trajs0)) > 2, "control: without top_k the test would not see the filter"
    # the trainer logs the policy mass the filter removes (the correction cannot reach it)
    logged = [h for h in trainer.state.log_history if "bias/filtered_mass" in h]
    assert logged and 0 < logged[0]["bias/filtered_mass"] < 1
    assert logged[0]["bias/unsupported_mass"] >= logged[0]["bias/filtered_mass"] - 1e-6


def test_top_p_is_honoured(folder, tmp_path):
    trainer, pool, trajs = _rollouts(folder, tmp_path, top_p=0.5)
    above = _nucleus_rank(pool, trajs, 1.0)
    assert trainer.sampling.top_p == 0.5
    assert max(above) < 0.5 + 1e-5, "a token outside the policy's top-p nucleus was sampled"
    _, pool0, trajs0 = _rollouts(folder, tmp_path / "control")
    assert max(_nucleus_rank(pool0, trajs0, 1.0)) >= 0.5


def test_temperature_and_length_are_honoured(folder, tmp_path):
    """The behaviour log-probs of a strict rollout are the policy's at args.temperature, and no
    completion is longer than max_completion_length (some reach it)."""
    _, pool, trajs = _rollouts(folder, tmp_path, temperature=0.5, max_completion_length=5)
    target = pool.worker.target
    with torch.no_grad():
        for t in trajs:
            prompt, completion = list(t.prompt_ids), list(t.completion_ids)
            z = target(torch.tensor([prompt + completion])).logits[0, len(prompt) - 1 : -1]
            want = (z / 0.5).log_softmax(-1).gather(1, torch.tensor(completion)[:, None]).squeeze(1)
            assert torch.allclose(torch.tensor(t.behavior_logprobs), want.float(), atol=1e-4)
    lengths = [len(t.completion_ids) for t in trajs]
    assert max(lengths) == 5 and len(trajs) == 8


def test_sampling_fields_left_unset_come_from_args(folder, tmp_path):
    trainer = _trainer(folder, tmp_path, sampling=SamplingParams(seed=7), temperature=0.7, top_k=4)
    sp = trainer.sampling
    assert (sp.temperature, sp.top_k, sp.max_new_tokens, sp.seed) == (0.7, 4, 8, 7)
    assert set(sp.eos_token_id) == set(trainer.eos_token_ids)


# ------------------------------------------------------------------ refused at construction
REFUSED = [
    (dict(min_p=0.1), "min_p"),
    (dict(repetition_penalty=1.2), "repetition_penalty"),
    (dict(generation_kwargs={"num_beams": 2}), "num_beams"),
    (dict(generation_kwargs={"do_sample": False}), "do_sample"),
    (dict(generation_kwargs={"min_p": 0.05}), "min_p"),
    (dict(generation_kwargs={"repetition_penalty": 1.1}), "repetition_penalty"),
    (dict(generation_kwargs={"max_new_tokens": 4}), "max_new_tokens"),
    (dict(generation_kwargs={"no_repeat_ngram_size": 2}), "no_repeat_ngram_size"),
    (dict(use_transformers_continuous_batching=True), "use_transformers_continuous_batching"),
    (dict(use_transformers_paged=True), "use_transformers_paged"),
    (dict(cache_implementation="static"), "cache_implementation"),
    (dict(use_vllm=True), "use_vllm"),
]


@pytest.mark.parametrize(("extra", "field"), REFUSED, ids=[f for _, f in REFUSED])
def test_refused_fields_raise_at_construction(folder, tmp_path, extra, field):
    with pytest.raises(ValueError, match=field):
        _trainer(folder, tmp_path, **extra)


def test_refused_field_set_after_the_config_raises_in_init(folder, tmp_path):
    """The trainer checks again: a config changed after it was built is refused before any step."""
    args = _args(tmp_path)
    args.generation_kwargs = {"num_beams": 2}
    tok = AutoTokenizer.from_pretrained(folder)
    with pytest.raises(ValueError, match="num_beams"):
        MarsGRPOTrainer(
            folder, [length_reward], args, prompt_dataset(8), tok, pool=local_pool(folder, rule="strict")
        )


CONTRADICTIONS = [
    (SamplingParams(temperature=0.5), "sampling.temperature"),
    (SamplingParams(max_new_tokens=4), "sampling.max_new_tokens"),
    (SamplingParams(top_k=3), "sampling.top_k"),
    (SamplingParams(eos_token_id=5), "sampling.eos_token_id"),
    (SamplingParams(ignore_eos=True), "ignore_eos"),
    (SamplingParams(stop_token_ids=(3,)), "stop_token_ids"),
]


@pytest.mark.parametrize(("sampling", "field"), CONTRADICTIONS, ids=[f for _, f in CONTRADICTIONS])
def test_sampling_contradicting_args_is_refused(folder, tmp_path, sampling, field):
    with pytest.raises(ValueError, match=field):
        _trainer(folder, tmp_path, sampling=sampling)


# ------------------------------------------------------------------ mask_truncated_completions
def _scaled_run(folder, tmp, pick, factor):
    """One SGD step (lr 1) on rollouts with 1-3 of 8 truncated and masked; the advantages of the rows
    ``pick(inputs)`` selects are multiplied by ``factor`` before the loss. Returns (trainer, gradient)."""
    trainer = _trainer(
        folder,
        tmp,
        mask_truncated_completions=True,
        max_completion_length=4,
        learning_rate=1.0,
        optim="sgd",
        max_grad_norm=0.0,
        is_correction="none",
    )
    inner = trainer._compute_loss

    def scaled(model, inputs):
        rows = pick(inputs)
        inputs["advantages"] = inputs["advantages"].clone()
        inputs["advantages"][rows] *= factor
        return inner(model, inputs)

    trainer._compute_loss = scaled
    return trainer, grads_of_one_step(trainer)


def test_masked_truncated_rows_contribute_nothing(folder, tmp_path):
    """Some rows truncated: TRL zeroes their mask, their record keeps its own length, and the step's
    gradient does not change when their advantages are scaled by 1000 (it does for a kept row)."""
    masked = lambda x: x["completion_mask"].sum(1) == 0  # noqa: E731
    trainer, g = _scaled_run(folder, tmp_path / "a", masked, 1.0)
    rows, mask = trainer.last_batch["rows"], trainer.last_batch["mask"]
    truncated = [r["finish_reason"] == "length" for r in rows]
    assert 0 < sum(truncated) < len(rows), f"needs truncated and finished rows: {truncated}"
    for row, cut, m in zip(rows, truncated, mask, strict=True):
        assert int(m.sum()) == (0 if cut else len(row["provenance"]))
        assert len(row["provenance"]) == len(row["behavior_logprobs"]) >= 1
    _, g_scaled = _scaled_run(folder, tmp_path / "b", masked, 1000.0)
    kept = lambda x: torch.arange(len(x["advantages"])) == int((~masked(x)).nonzero()[0])  # noqa: E731
    _, g_kept = _scaled_run(folder, tmp_path / "c", kept, 1000.0)
    scale = max(v.abs().max() for v in g.values())
    assert scale > 0
    for name in g:
        assert (g[name] - g_scaled[name]).abs().max() <= 1e-6 * scale, f"{name}: a masked row moved it"
    assert max((g[n] - g_kept[n]).abs().max() for n in g) > 1e-3 * scale, "control: a kept row did nothing"


def test_all_truncated_batch_gives_loss_zero_and_no_update(folder, tmp_path):
    """max_completion_length = 1 cannot reach eos: every row is truncated and masked."""
    trainer = _trainer(
        folder, tmp_path, mask_truncated_completions=True, max_completion_length=1, learning_rate=0.1
    )
    before = {k: v.detach().clone() for k, v in trainer.model.named_parameters()}
    trainer.train()
    assert all(r["finish_reason"] == "length" for r in trainer.last_batch["rows"])
    assert not trainer.last_batch["mask"].any()
    (entry,) = [h for h in trainer.state.log_history if "loss" in h]
    assert entry["loss"] == 0.0
    for name, value in trainer.model.named_parameters():
        assert torch.equal(value, before[name]), f"{name} moved on an all-masked batch"
