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

Keeping the pool on the policy: TRL hands the trainer to the rollout function, so by default it sends
the policy to the pool whenever ``trainer.state.global_step`` moved since its last send (versioned by
that step; gathered from ZeRO-3 shards on every rank when partitioned, each rank sending to the pool it
was given), and a trajectory older than the trainer's step (beyond ``args.max_policy_lag`` where the
config has one) is an error, never a silent stale rollout. A caller that owns the sync passes
``sync_weights=False`` (``marsrl.trainer.MarsGRPOTrainer`` does: it syncs policy and draft itself, from
rank 0, and checks the lag).

Generation settings: ``resolve_sampling`` turns the GRPOConfig's fields and ``generation_kwargs`` into
the pool's SamplingParams, or refuses (ValueError, naming the field) what the pool cannot honour with
exact behaviour log-probs; docs/trainer-options.md has the table.

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
    sync_weights: bool = True,
) -> Callable[[list, Any], dict]:
    """A TRL ``rollout_func(prompts, trainer) -> dict`` generating with ``pool``.

    Args:
        pool: a RolloutPool (anything with ``generate``, ``update_weights`` and ``last_batch``).
        tokenizer: the trainer's tokenizer (renders prompts; its eos id ends completions unless
            ``sampling.eos_token_id`` is set).
        sampling: seed and any of temperature, top-k/p, max_new_tokens, eos; ``n`` is ignored (the group
            size comes from the prompts). With a trainer, fields left at their defaults come from its args
            and a value contradicting them is refused (``resolve_sampling``). None: all from the args.
        chat_template_kwargs: extra arguments for ``apply_chat_template`` (default: the trainer's).
        sync_weights: send the trainer's policy to the pool whenever ``trainer.state.global_step`` moved
            (version = that step) and refuse trajectories older than it; False when the caller owns the
            sync (``MarsGRPOTrainer``).
    """
    state = {"calls": 0, "sampling": sampling, "resolved": None, "synced_step": None, "syncs": 0}

    def rollout_func(prompts: list, trainer=None) -> dict:
        if not prompts:
            raise ValueError("rollout_func got no prompts")
        if state["resolved"] is None:
            state["resolved"] = _first_sampling(trainer, tokenizer, state["sampling"])
        base = state["resolved"]
        step = None if trainer is None else int(trainer.state.global_step)
        if sync_weights and trainer is not None and state["synced_step"] != step:
            pool.update_weights(policy_weights(trainer), version=step)
            state["synced_step"] = step
            state["syncs"] += 1
        runs = group_runs(prompts, _group_size(trainer))
        run_ids = render_prompts(
            [prompts[start] for start, _ in runs], tokenizer, trainer, chat_template_kwargs
        )
        seed = request_seed(base.seed, state["calls"])  # a fresh random stream per call
        state["calls"] += 1
        trajs = generate_grouped(pool, runs, run_ids, base, seed)
        if step is not None:
            check_lag(trajs, step, int(getattr(trainer.args, "max_policy_lag", 0) or 0))
        return to_trl_output(trajs, pool.last_batch)

    # calls so far (each call's seed derives from it: saved with checkpoints), the resolved sampling, the
    # step last synced and the number of syncs
    rollout_func.state = state
    return rollout_func


def policy_weights(trainer):
    """What ``pool.update_weights`` gets from a TRL trainer: under ZeRO-3 the full CPU state dict,
    gathered parameter by parameter (a collective: every rank calls the rollout function, so every rank
    gathers); otherwise the unwrapped module itself."""
    from ..rollout.weights import gather_zero3_state_dict, is_zero3

    if is_zero3(trainer.model):
        return gather_zero3_state_dict(trainer.model)
    return trainer.accelerator.unwrap_model(trainer.model)


def check_lag(trajectories: list[Trajectory], step: int, max_lag: int = 0) -> None:
    """A trajectory generated by a policy more than ``max_lag`` versions behind the trainer's ``step`` is
    an error: the pool lags the trainer."""
    for i, t in enumerate(trajectories):
        if t.policy_version is not None and step - int(t.policy_version) > max_lag:
            raise ValueError(
                f"the pool lags the trainer: completion {i} came from policy version {t.policy_version} at "
                f"trainer step {step} (max_policy_lag={max_lag}); sync the pool (sync_weights=True) or "
                "raise max_policy_lag"
            )


def _first_sampling(trainer, tokenizer, sampling: SamplingParams | None) -> SamplingParams:
    if trainer is None:
        if sampling is None:
            raise ValueError(
                "pass sampling= to make_rollout_func when calling the rollout function without a trainer"
            )
        if sampling.eos_token_id is None and tokenizer.eos_token_id is not None:
            sampling = dataclasses.replace(sampling, eos_token_id=tokenizer.eos_token_id)
        return sampling
    eos = getattr(trainer, "eos_token_ids", None) or [tokenizer.eos_token_id]
    return resolve_sampling(trainer.args, sampling, eos_token_ids=eos)


def sampling_from_trainer(trainer, tokenizer) -> SamplingParams:
    """SamplingParams matching a TRL trainer's generation settings (``resolve_sampling`` on its args, its
    eos ids)."""
    if trainer is None:
        raise ValueError(
            "pass sampling= to make_rollout_func when calling the rollout function without a trainer"
        )
    return _first_sampling(trainer, tokenizer, None)


# generation_kwargs keys the pool understands: each overrides the GRPOConfig field named beside it, as
# TRL's transformers path merges generation_kwargs over the fields (GRPOTrainer.__init__)
_KWARG_FIELDS = {
    "temperature": "temperature",
    "top_k": "top_k",
    "top_p": "top_p",
    "min_p": "min_p",
    "repetition_penalty": "repetition_penalty",
    "max_new_tokens": "max_completion_length",
    "do_sample": None,
    "num_beams": None,
}


def generation_options(args) -> dict:
    """The generation settings a GRPOConfig asks for: its fields, with ``generation_kwargs`` merged over
    them. A ``generation_kwargs`` key the pool has no meaning for is a ValueError naming it."""
    opts = {
        "temperature": args.temperature,
        "top_k": getattr(args, "top_k", None),
        "top_p": getattr(args, "top_p", None),
        "min_p": getattr(args, "min_p", None),
        "repetition_penalty": getattr(args, "repetition_penalty", 1.0),
        "max_new_tokens": args.max_completion_length,
        "do_sample": True,
        "num_beams": 1,
    }
    for key, value in (getattr(args, "generation_kwargs", None) or {}).items():
        if key not in _KWARG_FIELDS:
            raise ValueError(
                f"generation_kwargs[{key!r}]: the rollout pool has no such option and would ignore it; "
                f"it understands {sorted(_KWARG_FIELDS)} (see docs/trainer-options.md)"
            )
        opts[key] = value
    return opts


def check_generation_args(args) -> dict:
    """Refuse (ValueError naming the field and why) every generation setting of a GRPOConfig the pool
    cannot honour with exact behaviour log-probs; return the honoured options (``generation_options``)."""
    opts = generation_options(args)
    where = lambda key: (  # noqa: E731
        f"generation_kwargs[{key!r}]"
        if key in (getattr(args, "generation_kwargs", None) or {})
        else (_KWARG_FIELDS.get(key) or key)
    )
    if getattr(args, "use_vllm", False):
        raise ValueError("use_vllm: the rollouts come from a marsrl RolloutPool; set use_vllm=False")
    for name in ("use_transformers_paged", "use_transformers_continuous_batching"):  # paged sets both
        if getattr(args, name, False):
            raise ValueError(
                f"{name}: the rollouts come from a marsrl RolloutPool, not transformers' generate; unset it"
            )
    for name in ("transformers_continuous_batching_config", "cache_implementation"):
        if getattr(args, name, None) is not None:
            raise ValueError(
                f"{name}: configures transformers' generate, which the rollout pool replaces (it keeps "
                "its own KV cache); unset it"
            )
    if not opts["do_sample"]:
        raise ValueError(
            f"{where('do_sample')}=False: greedy decoding has no behaviour distribution to correct "
            "against the trainer's temperature-scaled log-probs; sample (do_sample=True)"
        )
    if opts["num_beams"] != 1:
        raise ValueError(
            f"{where('num_beams')}={opts['num_beams']}: beam search is not sampling, its completions have "
            "no per-token behaviour log-probs; the pool samples (num_beams=1)"
        )
    if not (isinstance(opts["temperature"], (int, float)) and opts["temperature"] > 0):
        raise ValueError(
            f"{where('temperature')}={opts['temperature']!r}: must be > 0 (the correction needs the sampling "
            "distribution's log-probs)"
        )
    if opts["min_p"]:
        raise ValueError(
            f"{where('min_p')}={opts['min_p']}: the marsrl engine has no min-p filter (SamplingParams: "
            "temperature, top_k, top_p); unset it"
        )
    if opts["repetition_penalty"] != 1.0:
        raise ValueError(
            f"{where('repetition_penalty')}={opts['repetition_penalty']}: the marsrl engine does not "
            "penalise repeats, and the trainer's log-probs would not see the penalty; set 1.0"
        )
    if opts["max_new_tokens"] != args.max_completion_length:
        raise ValueError(
            f"generation_kwargs['max_new_tokens']={opts['max_new_tokens']} contradicts max_completion_length="
            f"{args.max_completion_length}; set max_completion_length instead"
        )
    return opts


def resolve_sampling(args, sampling: SamplingParams | None = None, *, eos_token_ids=None) -> SamplingParams:
    """The pool's SamplingParams for a GRPOConfig (``check_generation_args``), with ``sampling``'s seed.

    A field of ``sampling`` left at SamplingParams' default is derived from ``args`` (temperature,
    top_k / top_p, max_new_tokens = max_completion_length) or from ``eos_token_ids`` (the trainer's eos
    set); a value that contradicts them is a ValueError naming both, since the trainer computes its
    log-probs, truncation and masks from ``args``. ``ignore_eos`` and ``stop_token_ids`` are refused: TRL
    treats a completion not ending in eos as truncated."""
    opts = check_generation_args(args)
    derived = SamplingParams(
        temperature=float(opts["temperature"]),
        top_k=int(opts["top_k"]) if opts["top_k"] else None,
        top_p=None if opts["top_p"] is None or opts["top_p"] >= 1.0 else float(opts["top_p"]),
        max_new_tokens=int(opts["max_new_tokens"]),
        eos_token_id=None if not eos_token_ids else tuple(int(e) for e in eos_token_ids),
        seed=int(args.seed),
    )
    if sampling is None:
        return derived
    default = SamplingParams()
    names = {"temperature": "temperature", "top_k": "top_k", "top_p": "top_p"}
    names["max_new_tokens"] = "max_completion_length"
    for name, arg in names.items():
        given, want = getattr(sampling, name), getattr(derived, name)
        if given != getattr(default, name) and given != want:
            raise ValueError(
                f"sampling.{name}={given!r} contradicts {arg}={want!r} from args: the trainer computes its "
                f"log-probs and masks from args; set {arg} in the config and leave sampling.{name} unset"
            )
    if sampling.ignore_eos:
        raise ValueError("sampling.ignore_eos=True: TRL ends completions at eos; leave ignore_eos False")
    if sampling.stop_token_ids:
        raise ValueError(
            f"sampling.stop_token_ids={sampling.stop_token_ids}: TRL counts a completion that does not end "
            "in eos as truncated; use the tokenizer's / generation config's eos instead"
        )
    eos = derived.eos_token_id
    if sampling.eos_token_id is not None:
        given = sampling.eos_token_id
        given = {given} if isinstance(given, int) else set(given)
        if eos is not None and given != set(eos):
            raise ValueError(
                f"sampling.eos_token_id={sampling.eos_token_id} contradicts the trainer's eos ids "
                f"{list(eos)} (tokenizer + generation config), which end and mask its completions; leave "
                "it unset"
            )
        eos = eos or sampling.eos_token_id
    seed = sampling.seed if sampling.seed != default.seed else derived.seed
    return dataclasses.replace(derived, eos_token_id=eos, seed=seed)


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
