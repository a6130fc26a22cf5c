"""TRL: a ``rollout_func`` for ``trl.GRPOTrainer`` (TRL 1.16, experimental API) that generates with a
RolloutPool.

    from trl import GRPOConfig, GRPOTrainer
    from marsrl.integrations.trl import make_rollout_func

    pool = RolloutPool(PoolConfig(worker=WorkerConfig(target=model_path, drafter=head_path), num_actors=2))
    trainer = GRPOTrainer(model=model_path, reward_funcs=[reward], args=GRPOConfig(...),
                          train_dataset=ds, processing_class=tokenizer,
                          rollout_func=make_rollout_func(pool, tokenizer))
    trainer.train()

How TRL calls it (``GRPOTrainer._generate``): ``rollout_func(prompts, trainer)`` once per generation
batch with this process's prompts, each ALREADY repeated ``num_generations`` times consecutively
(``RepeatSampler``), as raw strings or chat messages. It must return one completion per entry under
``prompt_ids``, ``completion_ids`` and ``logprobs``; every other key is handed to the reward functions
as a keyword argument (a list: one item per sample; anything else: the same value for every sample).

What this function does:
- renders prompts the way TRL would (``tokenizer(text=...)`` for strings; ``apply_chat_template`` with
  the trainer's chat template, tools and ``chat_template_kwargs`` for messages);
- folds each run of identical consecutive prompts (at most G long) back into ONE engine group (n = G)
  run on one actor, so a group shares an actor and a random stream the way it would in the engine;
- returns ``logprobs`` = the BEHAVIOUR log-probs (what the rollout really emitted with), plus per-token
  ``provenance``, ``target_logprobs``, ``behavior_logprobs`` (again, for reward functions),
  ``logit_ratio``, ``is_top2``, ``draft_position``,
  ``unsupported_mass``, per-sample ``policy_version``, ``finish_reason``, ``rule``, ``theta``,
  ``relax_prob``, and ``rollout_stats`` (the pool's metrics of this batch: tokens/s, tau, ...).

It does not send weights: keeping the pool on the policy being trained is the trainer's job
(``marsrl.trainer.MarsGRPOTrainer`` syncs policy and draft every step, gathers ZeRO-3 shards and calls
the pool from rank 0 only). With a plain ``GRPOTrainer``, call ``pool.update_weights(model,
version=step)`` yourself (e.g. from a ``TrainerCallback.on_step_end``).

Caveat (TRL 1.16): a plain ``GRPOTrainer`` applies its importance-sampling correction
(``vllm_importance_sampling_*``) only with ``use_vllm=True``. With a custom rollout and ``use_vllm=False``
the returned ``logprobs`` are used only by ``off_policy_mask_threshold``; a lossy rule (``mars``) then
trains WITHOUT correction. ``MarsGRPOTrainer`` applies it.

Leaves out: PEFT adapters (merge them before syncing), multimodal prompts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from ..engine import SamplingParams
from ..rollout.requests import request_seed
from ..trajectory import PER_TOKEN_FIELDS, Trajectory

PER_SAMPLE_FIELDS = ("policy_version", "finish_reason", "rule", "theta", "relax_prob")


def make_rollout_func(
    pool,
    tokenizer,
    sampling: SamplingParams | None = None,
    *,
    chat_template_kwargs: dict | None = None,
) -> Callable[[list, Any], dict]:
    """A TRL ``rollout_func(prompts, trainer) -> dict`` generating with ``pool``.

    Args:
        pool: a RolloutPool (anything with ``generate`` and ``last_batch``).
        tokenizer: the trainer's tokenizer (renders prompts; its eos id ends completions unless
            ``sampling.eos_token_id`` is set).
        sampling: temperature, top-k/p, max_new_tokens, seed; ``n`` is ignored (the group size comes from
            the prompts). None: taken from the trainer's args (temperature, top_k, top_p,
            max_completion_length, seed) at the first call.
        chat_template_kwargs: extra arguments for ``apply_chat_template`` (default: the trainer's).
    """
    state = {"calls": 0, "sampling": sampling}

    def rollout_func(prompts: list, trainer=None) -> dict:
        if not prompts:
            raise ValueError("rollout_func got no prompts")
        if state["sampling"] is None:
            state["sampling"] = sampling_from_trainer(trainer, tokenizer)
        base = state["sampling"]
        if base.eos_token_id is None and tokenizer.eos_token_id is not None:
            base = dataclasses.replace(base, eos_token_id=tokenizer.eos_token_id)
        runs = group_runs(prompts, _group_size(trainer))
        run_ids = render_prompts(
            [prompts[start] for start, _ in runs], tokenizer, trainer, chat_template_kwargs
        )
        seed = request_seed(base.seed, state["calls"])  # a fresh random stream per call
        state["calls"] += 1
        trajs = generate_grouped(pool, runs, run_ids, base, seed)
        return to_trl_output(trajs, pool.last_batch)

    rollout_func.state = state  # calls so far (each call's seed derives from it): saved with checkpoints
    return rollout_func


def sampling_from_trainer(trainer, tokenizer) -> SamplingParams:
    """SamplingParams matching GRPOConfig's generation settings (min_p / repetition_penalty unsupported)."""
    if trainer is None:
        raise ValueError(
            "pass sampling= to make_rollout_func when calling the rollout function without a trainer"
        )
    args = trainer.args
    if getattr(args, "min_p", None) or getattr(args, "repetition_penalty", 1.0) != 1.0:
        raise ValueError("min_p and repetition_penalty are not supported by the marsrl engine; unset them")
    return SamplingParams(
        temperature=args.temperature,
        top_k=args.top_k or None,
        top_p=None if args.top_p is None or args.top_p >= 1.0 else args.top_p,
        max_new_tokens=args.max_completion_length,
        eos_token_id=tokenizer.eos_token_id,
        seed=args.seed,
    )


def render_prompts(prompts: Sequence, tokenizer, trainer=None, chat_template_kwargs=None) -> list[list[int]]:
    """Token ids of each prompt as TRL renders them: strings through the tokenizer, message lists
    through the chat template with a generation prompt."""
    if isinstance(prompts[0], str):
        if not all(isinstance(p, str) for p in prompts):
            raise ValueError("prompts mix strings and chat messages")
        return [list(ids) for ids in tokenizer(text=list(prompts))["input_ids"]]
    kwargs = dict(
        chat_template_kwargs if chat_template_kwargs is not None else _trainer_template_kwargs(trainer)
    )
    tools = getattr(trainer, "tools", None) or None
    template = getattr(trainer, "chat_template", None)
    out = tokenizer.apply_chat_template(
        conversation=list(prompts),
        tools=tools,
        chat_template=template,
        add_generation_prompt=True,
        tokenize=True,
        return_dict=True,
        **kwargs,
    )
    return [list(ids) for ids in out["input_ids"]]


def group_runs(prompts: Sequence, group_size: int | None) -> list[tuple[int, int]]:
    """(start, length) of each run of equal consecutive prompts, runs cut at ``group_size`` entries
    (a slice may begin or end inside a group: those runs are shorter)."""
    runs: list[tuple[int, int]] = []
    start = 0
    for i in range(1, len(prompts) + 1):
        length = i - start
        if i == len(prompts) or prompts[i] != prompts[start] or (group_size and length == group_size):
            runs.append((start, length))
            start = i
    return runs


def generate_grouped(pool, runs, run_ids, sampling: SamplingParams, seed: int) -> list[Trajectory]:
    """One trajectory per entry covered by ``runs`` (from ``group_runs``; ``run_ids`` holds each run's
    prompt ids), each run generated as one group (n = its length). Runs of one length go in one pool
    call: normally all of them; the shorter runs at a slice's edges get one call per length."""
    by_length: dict[int, list[int]] = {}
    for r, (_, length) in enumerate(runs):
        by_length.setdefault(length, []).append(r)
    out: list[Trajectory | None] = [None] * sum(length for _, length in runs)
    for k, (length, members) in enumerate(by_length.items()):
        sp = dataclasses.replace(sampling, n=length, seed=request_seed(seed, k))
        trajs = pool.generate([run_ids[r] for r in members], sp)
        for g, r in enumerate(members):
            start = runs[r][0]
            out[start : start + length] = trajs[g * length : (g + 1) * length]
    return out


def to_trl_output(trajectories: list[Trajectory], stats: dict) -> dict:
    """The dict TRL's rollout_func contract asks for, with the per-token record as extra fields."""
    out = {
        "prompt_ids": [list(t.prompt_ids) for t in trajectories],
        "completion_ids": [list(t.completion_ids) for t in trajectories],
        "logprobs": [list(t.behavior_logprobs) for t in trajectories],
        "rollout_stats": dict(stats),
    }
    for name in PER_SAMPLE_FIELDS:
        out[name] = [getattr(t, name) for t in trajectories]
    for name in PER_TOKEN_FIELDS:
        out[name] = [list(getattr(t, name)) for t in trajectories]
    return out


def _group_size(trainer) -> int | None:
    if trainer is None:
        return None
    training = getattr(trainer.model, "training", True)
    return trainer.num_generations if training else trainer.num_generations_eval


def _trainer_template_kwargs(trainer) -> dict:
    return dict(getattr(trainer, "chat_template_kwargs", None) or {})
