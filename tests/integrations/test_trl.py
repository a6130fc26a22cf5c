"""MarsGRPOTrainer (TRL's GRPOTrainer with marsrl's rollouts) trained for 2 steps on CPU with 2 Ray actors,
and the rollout function's contract checked in detail against a recording fake pool (no Ray)."""

import dataclasses
import types

import pytest
import torch
from datasets import Dataset

from marsrl.engine import SamplingParams, Trajectory
from marsrl.integrations.trl import group_runs, make_rollout_func
from tests.rollout.helpers import tiny_tokenizer


class FakePool:
    """Records generate calls and answers with trajectories whose completion encodes (prompt, k)."""

    def __init__(self):
        self.calls = []
        self.updates = []
        self.last_batch = {"tokens": 0}

    def generate(self, prompt_ids, sampling):
        self.calls.append(([list(p) for p in prompt_ids], sampling))
        out = []
        for i, p in enumerate(prompt_ids):
            for k in range(sampling.n):
                n = 2 + k
                out.append(
                    Trajectory(
                        prompt_ids=list(p),
                        completion_ids=[i, k] + [0] * (n - 2),
                        provenance=[1] * n,
                        target_logprobs=[-1.0] * n,
                        behavior_logprobs=[-0.5] * n,
                        logit_ratio=[0.1] * n,
                        is_top2=[False] * n,
                        draft_position=list(range(n)),
                        finish_reason="length",
                        rule="mars",
                        theta=0.9,
                        policy_version=3,
                    )
                )
        return out

    def update_weights(self, policy, draft=None, version=None):
        self.updates.append(version)


def test_group_runs_cut_at_group_size_and_at_changes():
    assert group_runs(["a", "a", "b", "b"], 2) == [(0, 2), (2, 2)]
    assert group_runs(["a", "a", "a", "a"], 2) == [(0, 2), (2, 2)]  # equal neighbouring prompts
    assert group_runs(["a", "b", "b", "c"], 2) == [(0, 1), (1, 2), (3, 1)]  # a slice cut mid-group
    assert group_runs(["a", "a", "a"], None) == [(0, 3)]


def test_rollout_func_contract_with_strings_and_messages():
    tok = tiny_tokenizer()
    pool = FakePool()
    sampling = SamplingParams(max_new_tokens=5, seed=4)
    fn = make_rollout_func(pool, tok, sampling)
    prompts = ["the cat", "the cat", "a dog sat", "a dog sat"]
    out = fn(prompts, None)
    # one pool call, one group of 2 per distinct prompt, eos from the tokenizer, a fresh seed per call
    ((ids, sp),) = pool.calls
    assert ids == tok(text=["the cat", "a dog sat"])["input_ids"]
    assert sp.n == 2 and sp.eos_token_id == tok.eos_token_id and sp.max_new_tokens == 5
    assert out["prompt_ids"] == [ids[0], ids[0], ids[1], ids[1]]
    assert out["completion_ids"] == [[0, 0], [0, 1, 0], [1, 0], [1, 1, 0]]
    assert out["logprobs"][1] == [-0.5] * 3  # the behaviour log-probs
    assert out["target_logprobs"][1] == [-1.0] * 3
    for key in ("provenance", "logit_ratio", "is_top2"):
        assert [len(v) for v in out[key]] == [2, 3, 2, 3]
    assert out["policy_version"] == [3] * 4 and out["rollout_stats"] == {"tokens": 0}
    fn(prompts, None)
    assert pool.calls[1][1].seed != pool.calls[0][1].seed

    messages = [[{"role": "user", "content": "red mat"}]] * 2 + [[{"role": "user", "content": "big dog"}]]
    pool.calls.clear()
    out = fn(messages, None)
    rendered = tok.apply_chat_template(
        messages[0], add_generation_prompt=True, tokenize=True, return_dict=True
    )
    # a run of 2 and a run of 1 (a slice edge): one call per group size, entries back in input order
    assert [(len(c[0]), c[1].n) for c in pool.calls] == [(1, 2), (1, 1)]
    assert out["prompt_ids"][0] == out["prompt_ids"][1] == list(rendered["input_ids"])
    assert tok.decode(out["prompt_ids"][2]).endswith("<|assistant|>")
    assert out["completion_ids"] == [[0, 0], [0, 1, 0], [0, 0]]


def test_sampling_defaults_come_from_the_trainer():
    tok = tiny_tokenizer()
    pool = FakePool()

    class Args:
        temperature, top_k, top_p, max_completion_length, seed = 0.7, 0, 1.0, 6, 9
        min_p, repetition_penalty, generation_kwargs = None, 1.0, {"top_k": 5}

    class Trainer:
        args = Args()
        num_generations = 2
        model = torch.nn.Linear(1, 1)
        state = types.SimpleNamespace(global_step=3)  # the fake pool's trajectories say version 3

    fn = make_rollout_func(pool, tok, sync_weights=False)
    fn(["the cat", "the cat"], Trainer())
    sp = pool.calls[0][1]
    # generation_kwargs override the fields, as in TRL's transformers path
    assert (sp.temperature, sp.top_k, sp.top_p, sp.max_new_tokens, sp.n) == (0.7, 5, None, 6, 2)
    assert sp.eos_token_id == (tok.eos_token_id,)
    Args.repetition_penalty = 1.1
    with pytest.raises(ValueError, match="repetition_penalty"):
        make_rollout_func(pool, tok, sync_weights=False)(["x"], Trainer())
    Args.repetition_penalty = 1.0
    Trainer.state = types.SimpleNamespace(global_step=4)  # the pool (version 3) lags the trainer
    with pytest.raises(ValueError, match="lags the trainer"):
        make_rollout_func(pool, tok, sync_weights=False)(["x"], Trainer())


@pytest.mark.usefixtures("ray_cluster")
def test_grpo_trainer_trains_two_steps_with_the_pool(tmp_path):
    from transformers import AutoTokenizer

    from marsrl.data import generate_problems
    from marsrl.engine import EngineConfig
    from marsrl.rollout import PoolConfig, RolloutPool, WorkerConfig
    from marsrl.tinyworld import build_tinyworld
    from marsrl.trainer import MarsGRPOConfig, MarsGRPOTrainer

    world = build_tinyworld("micro", progress=False)  # the tiny world's target, tokenizer and EAGLE-3 head
    folder = str(world / "target")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    worker = WorkerConfig(
        target=folder,
        drafter=str(world / "draft"),
        engine=EngineConfig(rule="mars", num_draft_tokens=4),
        torch_threads=1,
    )
    pool = RolloutPool(PoolConfig(worker=worker, num_actors=2, num_cpus_per_actor=0.5))
    seen = []

    def reward(completions, **kwargs):
        seen.append(
            {k: kwargs[k] for k in ("policy_version", "provenance", "target_logprobs", "rollout_stats")}
        )
        return [float(len(c[0]["content"].split())) for c in completions]  # varies: gradients are non-zero

    args = MarsGRPOConfig(
        output_dir=str(tmp_path / "out"),
        use_cpu=True,
        bf16=False,
        report_to="none",
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=8,
        max_steps=2,
        learning_rate=1e-2,
        logging_steps=1,
        save_strategy="no",
        seed=0,
    )
    questions = [p["question"] for p in generate_problems(16, seed=1, difficulty="easy")]
    dataset = Dataset.from_dict({"prompt": [[{"role": "user", "content": q}] for q in questions]})
    trainer = MarsGRPOTrainer(
        model=folder,
        reward_funcs=[reward],
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        pool=pool,
    )
    start = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    try:
        trainer.train()
        assert trainer.state.global_step == 2
        assert [s["policy_version"] for s in seen] == [[0] * 4, [1] * 4]  # synced before each step
        assert pool.version == 1
        assert all(
            len(p) == len(t) for s in seen for p, t in zip(s["provenance"], s["target_logprobs"], strict=True)
        )
        assert seen[0]["rollout_stats"][0]["trajectories"] == 4
        changed = [k for k, v in trainer.model.state_dict().items() if not torch.equal(v, start[k])]
        assert changed, "two GRPO steps changed no weight"
        losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
        assert len(losses) == 2 and all(torch.isfinite(torch.tensor(losses)))
        # the pool now generates from the synced (step-1) policy, as TRL's own model would
        pool.update_weights(trainer.model, version=2)
        prompt = tokenizer.apply_chat_template(
            dataset[0]["prompt"], add_generation_prompt=True, tokenize=True
        )
        prompt = list(prompt["input_ids"] if hasattr(prompt, "keys") else prompt)
        trajs = pool.generate([prompt], dataclasses.replace(SamplingParams(max_new_tokens=4), n=2))
        assert {t.policy_version for t in trajs} == {2}
    finally:
        pool.shutdown()


def test_plain_grpo_trainer_keeps_the_pool_in_step(tmp_path):
    """TRL's contract test for rollout weight sync, on the pool: with a plain ``trl.GRPOTrainer`` the
    rollout function sends the policy exactly when ``global_step`` moved (steps 2, 2, 3: two sends), the
    worker's weights equal the trainer's after each send, and the trajectories carry the step as their
    version. Then two real training steps: rollouts of step k say version k."""
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from tests.trainer.helpers import length_reward, local_pool, prompt_dataset, save_tiny_world

    folder = save_tiny_world(tmp_path / "policy")
    tok = AutoTokenizer.from_pretrained(folder)
    pool = local_pool(folder, rule="strict")
    sent, send = [], pool.update_weights

    def recording(policy=None, draft=None, version=None):
        sent.append(version)
        return send(policy, draft, version)

    pool.update_weights = recording
    seen = []

    def reward(completions, **kwargs):
        seen.append(list(kwargs["policy_version"]))
        return length_reward(completions)

    args = GRPOConfig(
        output_dir=str(tmp_path / "out"),
        use_cpu=True,
        bf16=False,
        report_to="none",
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=4,
        max_steps=2,
        learning_rate=0.1,
        save_strategy="no",
        seed=0,
    )
    dataset = prompt_dataset(8)
    trainer = GRPOTrainer(
        folder,
        [reward],
        args=args,
        train_dataset=dataset,
        processing_class=tok,
        rollout_func=make_rollout_func(pool, tok),
    )
    prompts = [dataset[0]["prompt"]] * 2 + [dataset[1]["prompt"]] * 2
    gen = torch.Generator().manual_seed(0)
    for step, expected in ((2, [2]), (2, [2]), (3, [2, 3])):
        if step != trainer.state.global_step:  # the policy moves only when the step does
            with torch.no_grad():
                for p in trainer.model.parameters():
                    p.add_(0.05 * torch.randn(p.shape, generator=gen))
        trainer.state.global_step = step
        *_, extra, _, _ = trainer._generate(prompts)
        assert sent == expected
        assert extra["policy_version"] == [step] * 4
        theirs = pool.worker.target.state_dict()
        for name, value in trainer.model.state_dict().items():
            assert torch.equal(theirs[name], value), f"{name}: the worker's weights are not the trainer's"

    sent.clear()
    trainer.state.global_step = 0
    trainer.train()
    assert sent == [0, 1] and seen == [[0] * 4, [1] * 4]
    theirs = pool.worker.target.state_dict()
    assert any(not torch.equal(theirs[k], v) for k, v in trainer.model.state_dict().items()), (
        "the final step's update is sent with the next generation, not before"
    )
