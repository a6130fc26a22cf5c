"""Bad input meets a ValueError naming the field: config invariants at construction, and at the first
step a rollout whose record is missing, NaN or the wrong length, a lossy batch without correction, a
stale policy version, a pool of another vocabulary."""

from __future__ import annotations

import dataclasses

import pytest
from transformers import AutoTokenizer

from marsrl.trainer import MarsGRPOConfig, MarsGRPOTrainer
from tests.trainer.helpers import length_reward, local_pool, prompt_dataset, save_tiny_world


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return save_tiny_world(tmp_path_factory.mktemp("policy"))


def _args(tmp, **extra):
    fields = dict(
        output_dir=str(tmp),
        use_cpu=True,
        bf16=False,
        report_to="none",
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=4,
        max_steps=1,
        save_strategy="no",
        seed=0,
    )
    fields.update(extra)
    return MarsGRPOConfig(**fields)


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        (dict(is_correction="sequence_clip"), "is_correction"),
        (dict(is_clip_min=2.0, is_clip_max=1.0), "is_clip_max"),
        (dict(min_p=0.1), "min_p"),
        (dict(generation_kwargs={"num_beams": 2}), "num_beams"),
        (dict(draft_refresh_every=-1), "draft_refresh_every"),
        (dict(draft_refresh_lr_scheduler_type="sawtooth"), "draft_refresh_lr_scheduler_type"),
        (dict(draft_refresh_grad_clip=0.0), "draft_refresh_grad_clip"),
        (dict(draft_refresh_warmup_steps=-1), "draft_refresh_warmup_steps"),
        (dict(draft_refresh_ttt_steps=0), "draft_refresh_ttt_steps"),
        (dict(max_policy_lag=-1), "max_policy_lag"),
        (dict(is_correction="token_truncate", is_clip_min=None, is_clip_max=None), "needs is_clip_min"),
        (dict(loss_type="vespo", is_correction="sequence"), "vespo"),
    ],
)
def test_config_invariants_name_the_field(tmp_path, extra, field):
    with pytest.raises(ValueError, match=field):
        _args(tmp_path, **extra)


class Tampered:
    """A LocalPool whose trajectories are changed by ``edit`` before the trainer sees them."""

    def __init__(self, pool, edit):
        self.pool, self.edit = pool, edit
        self.info = pool.info

    def generate(self, prompts, sampling):
        return [self.edit(t) for t in self.pool.generate(prompts, sampling)]

    def update_weights(self, *a, **k):
        return self.pool.update_weights(*a, **k)

    @property
    def last_batch(self):
        return self.pool.last_batch


def _train(folder, tmp_path, pool, **extra):
    tok = AutoTokenizer.from_pretrained(folder)
    trainer = MarsGRPOTrainer(
        folder, [length_reward], _args(tmp_path, **extra), prompt_dataset(8), tok, pool=pool
    )
    trainer.train()


EDITS = {
    "behavior_logprobs": lambda t: dataclasses.replace(
        t, behavior_logprobs=[float("nan")] * len(t.completion_ids)
    ),
    "provenance": lambda t: dataclasses.replace(t, provenance=t.provenance[:-1]),
}


@pytest.mark.parametrize("field", list(EDITS))
def test_bad_records_name_the_field(folder, tmp_path, field):
    pool = Tampered(local_pool(folder, rule="strict"), EDITS[field])
    with pytest.raises(ValueError, match=field):
        _train(folder, tmp_path, pool)


def test_lossy_rollouts_without_correction_fail_closed(folder, tmp_path):
    with pytest.raises(ValueError, match="allow_uncorrected_lossy"):
        _train(folder, tmp_path, local_pool(folder, rule="mars"), is_correction="none")
    _train(
        folder, tmp_path, local_pool(folder, rule="mars"), is_correction="none", allow_uncorrected_lossy=True
    )


def test_stale_policy_version_is_an_error(folder, tmp_path):
    pool = Tampered(local_pool(folder, rule="strict"), lambda t: dataclasses.replace(t, policy_version=-3))
    with pytest.raises(ValueError, match="max_policy_lag"):
        _train(folder, tmp_path, pool)


def test_pool_of_another_vocabulary_is_refused(folder, tmp_path):
    pool = local_pool(folder, rule="strict")
    pool.info = dict(pool.info, vocab_size=pool.info["vocab_size"] + 7)
    with pytest.raises(ValueError, match="vocab_size"):
        _train(folder, tmp_path, pool)


def test_unreachable_mass_warns_once_and_is_logged(folder, tmp_path):
    """Greedy drafts at lambda = 1: the unreachable mass is named in one warning and logged every step."""
    tok = AutoTokenizer.from_pretrained(folder)
    pool = local_pool(folder, rule="mars", draft_sampling="greedy")
    trainer = MarsGRPOTrainer(
        folder,
        [length_reward],
        _args(tmp_path, max_steps=2, logging_steps=1),
        prompt_dataset(8),
        tok,
        pool=pool,
    )
    with pytest.warns(UserWarning, match="relax_prob=1.0") as caught:
        trainer.train()
    assert sum("cannot emit" in str(w.message) for w in caught) == 1
    rows = [h for h in trainer.state.log_history if "loss" in h]
    assert len(rows) == 2 and all("bias/unsupported_mass" in h for h in rows)
    assert max(h["bias/unsupported_mass"] for h in rows) > 0
