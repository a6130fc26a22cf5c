"""``MarsGRPOTrainer``: TRL's GRPOTrainer trained honestly on marsrl rollouts.

What it adds to ``trl.GRPOTrainer`` (TRL 1.16, ``use_vllm=False``), all in one override of
``_generate_and_score_completions`` plus the rollout function it owns:

- **Rollouts from a RolloutPool**, called by rank 0 only: every rank's prompts are gathered to it, the
  trajectories scattered back in order, each rank keeps its slice. Before each generation the policy
  (gathered from ZeRO-3 shards on every rank when partitioned) and, after a refresh, the EAGLE-3 head are
  sent to the pool with version = ``global_step``.
- **Importance correction without vLLM.** TRL corrects only on its vLLM path. Here the policy's log-probs
  of the rollout tokens come, when a generation serves one optimizer step (``num_iterations == 1``, no
  reuse: TRL's own condition for pi_old = pi; ``fuse_policy_forward``), from the training forward of each
  micro-batch itself (detached, folded in before TRL reads the advantages), and otherwise from a separate
  no-grad forward (TRL's own ``_get_per_token_logps_and_entropies``). The weights come from
  ``marsrl.algo.importance_weights`` against the recorded BEHAVIOUR log-probs and are folded into the
  per-token advantages: for every clipped surrogate, ``-min(c1·A·w, c2·A·w) = w·(-min(c1·A, c2·A))`` for
  w >= 0, which is exactly where TRL's vLLM path multiplies its ratio (before the KL term, which stays
  unweighted). VESPO gets the ratio the way TRL hands it over (``importance_sampling_ratio``).
- **Fail closed.** A lossy batch with ``is_correction="none"`` raises unless ``allow_uncorrected_lossy``;
  mass the behaviour cannot emit (``unsupported_mass``) warns once and is logged every step; a trajectory
  older than ``max_policy_lag`` versions is an error.
- **Bias measured in the same forward.** A forward hook on the final norm keeps the (detached) hidden
  states of that forward; one lm_head matmul over the completion positions gives the policy's
  top-1/top-2 there (``marsrl.algo.token_stats``) and ``marsrl.algo.bias_metrics`` the ``bias/*``
  family, gathered over ranks.
- **The draft kept in step** (``marsrl.trainer.draft``): when a refresh is due, feature pre-hooks on the
  head's three layers (``FeatureTap``) ride the same policy forward (the training forward when fused), and
  the head learns the policy's own detached distribution on those states with its own optimizer, clip and
  schedule; its seconds are logged with their share of the step (``draft/seconds``,
  ``draft/share_of_step``).

Departures from TRL: the rollout's behaviour log-prob, not a vLLM top-1 log-prob, is the IS denominator;
the draft head is trained online on rank 0's slice of the batch only (its features are local).
Leaves out: tools / environments, multimodal prompts, PEFT (merge adapters before syncing).
"""

from __future__ import annotations

import contextlib
import math
import time
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from trl import GRPOTrainer

from ..algo import bias_metrics, importance_weights, token_stats
from ..drafter.target import final_norm
from ..engine import SamplingParams
from ..integrations.trl import make_rollout_func, resolve_sampling
from ..rollout.weights import gather_zero3_state_dict, is_zero3
from ..trajectory import pad_per_token
from ..verify.dist import sampling_logits
from .checkpoint import CHECKPOINT_COMPLETE as CHECKPOINT_COMPLETE  # re-exported
from .checkpoint import write_manifest
from .config import MarsGRPOConfig
from .stats import acceptance_by_position, is_lossy

_FUSED_PREFIX = "marsrl_"  # record tensors a fused generation batch carries to _compute_loss
CHECKPOINT_STATE = "marsrl_state.pt"  # the head, its optimizer, refresh and rollout counters


class _StepClock(TrainerCallback):
    """Marks the start of every optimizer step so ``log`` can state the step's time and rollout share."""

    def __init__(self, trainer):
        self.trainer = trainer

    def on_step_begin(self, args, state, control, **kwargs):
        self.trainer._step_start = time.perf_counter()


class MarsGRPOTrainer(GRPOTrainer):
    """GRPO on TRL with MARS-aware rollouts from a marsrl RolloutPool.

    Args:
        model, reward_funcs, args, train_dataset, processing_class: as ``trl.GRPOTrainer``; ``args`` must be
            a ``MarsGRPOConfig``.
        pool: a live ``RolloutPool`` (or anything with ``generate``, ``update_weights``, ``last_batch``,
            ``info``, e.g. a ``LocalPool``); used by rank 0 only, so other ranks may pass None.
        pool_config: build the pool from this ``PoolConfig`` on rank 0 instead (shut down with the trainer
            via ``close()``).
        drafter: the ``Eagle3Drafter`` module the pool drafts with, trained online when
            ``args.draft_refresh_every > 0`` and sent to the pool with the policy.
        sampling: SamplingParams for the rollouts; fields left at their defaults come from ``args``
            (temperature, top_k, top_p, max_completion_length, seed) and the trainer's eos ids, a value that
            contradicts them is refused here (``marsrl.integrations.trl.resolve_sampling``). Every
            generation setting of ``args`` is honoured or refused at construction
            (docs/trainer-options.md).
        Other keyword arguments go to ``GRPOTrainer`` (``rollout_func`` is this trainer's own).
    """

    def __init__(
        self,
        model,
        reward_funcs,
        args: MarsGRPOConfig,
        train_dataset=None,
        processing_class=None,
        *,
        pool=None,
        pool_config=None,
        drafter=None,
        sampling: SamplingParams | None = None,
        **kwargs,
    ):
        if not isinstance(args, MarsGRPOConfig):
            raise ValueError(f"args must be a MarsGRPOConfig, got {type(args).__name__}")
        if "rollout_func" in kwargs:
            raise ValueError("rollout_func: MarsGRPOTrainer generates with its pool; pass pool= instead")
        if pool is not None and pool_config is not None:
            raise ValueError("pass one of pool= (a RolloutPool) and pool_config= (a PoolConfig), not both")
        if args.draft_refresh_every and drafter is None:
            raise ValueError(
                "draft_refresh_every > 0 needs drafter= (the Eagle3Drafter the pool drafts with)"
            )
        resolve_sampling(args, sampling)  # refuse before loading anything; eos is checked below
        super().__init__(
            model=model,
            reward_funcs=reward_funcs,
            args=args,
            train_dataset=train_dataset,
            processing_class=processing_class,
            rollout_func=self._rollout,
            **kwargs,
        )
        self.drafter = drafter
        self.pool = None
        self._owns_pool = False
        if self.accelerator.is_main_process:
            if pool is None and pool_config is None:
                raise ValueError(
                    "no rollouts: pass pool= (a RolloutPool, on rank 0) or pool_config= (a PoolConfig)"
                )
            if pool is None:
                from ..rollout import RolloutPool

                pool = RolloutPool(pool_config)
                self._owns_pool = True
            self.pool = pool
            self._check_pool(pool)
        tokenizer = getattr(self.processing_class, "tokenizer", self.processing_class)
        self.sampling = resolve_sampling(args, sampling, eos_token_ids=self.eos_token_ids)
        self._pool_rollout = (
            make_rollout_func(self.pool, tokenizer, self.sampling, sync_weights=False)
            if self.pool is not None
            else None
        )
        self._synced_version: int | None = None
        self._draft_dirty = drafter is not None  # send the head once with the first policy
        self._refresher = None  # a DraftRefresher, made at the first refresh (its schedule needs max_steps)
        self.draft_refreshes = 0
        self._draft_seconds: float | None = None  # refresh seconds since the last log
        self._warned_unsupported = False
        self._rollout_seconds = 0.0
        self._step_start: float | None = None
        self._batch_info: dict = {}
        self._fused: dict | None = None  # the generation batch whose metrics wait for its micro-batches
        self.last_batch: dict | None = None  # rank 0: the last generation batch (rows, completion ids, mask)
        self.add_callback(_StepClock(self))

    # ------------------------------------------------------------------ pool, weights, rollouts
    def _check_pool(self, pool) -> None:
        info = getattr(pool, "info", None) or {}
        want = self.model.get_output_embeddings().weight.shape[0]
        if is_zero3(self.model):
            want = self.model.config.vocab_size
        got = info.get("vocab_size")
        if got is not None and got != want:
            raise ValueError(f"pool vocab_size {got} does not match the trainer model's vocabulary ({want})")
        tokenizer = getattr(self.processing_class, "tokenizer", self.processing_class)
        if tokenizer is not None and got is not None and len(tokenizer) > got:
            raise ValueError(
                f"processing_class has {len(tokenizer)} tokens but the pool's vocabulary is {got}: "
                "the tokenizer does not belong to the pool's model"
            )

    def _sync_weights(self) -> None:
        """Send the policy (and a refreshed head) to the pool when the step moved. Every rank calls it:
        gathering ZeRO-3 shards is a collective."""
        step = int(self.state.global_step)
        if self._synced_version == step:
            return
        if is_zero3(self.model):
            state = gather_zero3_state_dict(self.model, rank0_only=True)
        else:  # the module itself: the pool casts it to the workers' dtype where it lives (a GPU)
            state = self.accelerator.unwrap_model(self.model) if self.pool is not None else None
        if self.pool is not None:
            draft = self.drafter if self._draft_dirty else None
            self.pool.update_weights(state, draft=draft, version=step)
            self._draft_dirty = False
        self._synced_version = step

    def _rollout(self, prompts: list, trainer=None) -> dict:
        """TRL's rollout_func: rank 0 generates for every rank's prompts, each rank gets its slice back."""
        from accelerate.utils import broadcast_object_list, gather_object

        start = time.perf_counter()
        self._sync_weights()
        acc = self.accelerator
        everyone = gather_object(list(prompts)) if acc.num_processes > 1 else list(prompts)
        payload = self._pool_rollout(everyone, self) if self.pool is not None else None
        if acc.num_processes > 1:
            box = [payload]
            broadcast_object_list(box, from_process=0)
            payload = _slice_output(box[0], acc.process_index * len(prompts), len(prompts))
        self._rollout_seconds += time.perf_counter() - start
        return payload

    # ------------------------------------------------------------------ the override
    def _generate_and_score_completions(self, inputs):
        mode = "train" if self.model.training else "eval"
        refresh = (
            mode == "train"
            and self.args.draft_refresh_every > 0
            and self.state.global_step % self.args.draft_refresh_every == 0
        )
        out = super()._generate_and_score_completions(inputs)
        started = time.perf_counter()
        rows = inputs  # TRL merged the rollout's extra fields into them
        self._check_rows(rows)
        completion_ids, completion_mask = out["completion_ids"], out["completion_mask"]
        mask = completion_mask if out.get("tool_mask") is None else completion_mask * out["tool_mask"]
        mask_b = mask.bool()
        width = completion_ids.shape[1]
        behavior = out.get("sampling_per_token_logps")
        if behavior is None:
            raise ValueError("behavior_logprobs: the rollout returned no per-token log-probs (logprobs)")
        bad = torch.isnan(behavior) & mask_b
        if bad.any():
            row = int(bad.any(dim=1).nonzero()[0])
            raise ValueError(f"behavior_logprobs of completion {row} has NaN at a completion token")

        lengths = _record_lengths(rows, completion_mask, width)
        record = {
            key: _pad_rows(rows, key, lengths, width)
            for key in ("provenance", "draft_position", "unsupported_mass")
        }
        if self.accelerator.is_main_process:
            self.last_batch = {"rows": rows, "completion_ids": completion_ids, "mask": mask_b}
        if mode == "train" and self._one_policy_per_generation():
            # the training forward of each micro-batch supplies the policy's side (_compute_loss) and,
            # when a refresh is due, the head's features; the record travels with the batch (shuffled
            # and split with it)
            for key, value in record.items():
                out[_FUSED_PREFIX + key] = value.to(completion_ids.device)
            self._fused = {
                "rows": rows,
                "parts": [],
                "seconds": time.perf_counter() - started,
                "refresh": refresh,
            }
            return out

        # the no-grad policy forward (TRL skips it with use_vllm=False), hidden states and taps on the side
        ids = torch.cat([out["prompt_ids"], completion_ids], dim=1)
        attn = torch.cat([out["prompt_mask"], completion_mask], dim=1)
        bs = (
            self.args.per_device_train_batch_size if mode == "train" else self.args.per_device_eval_batch_size
        )
        forward_start = time.perf_counter()
        with torch.no_grad(), self._capture(keep_full=refresh) as cap:
            old, _, _ = self._get_per_token_logps_and_entropies(self.model, ids, attn, width, batch_size=bs)
        forward_s = time.perf_counter() - forward_start
        if out.get("old_per_token_logps") is None:
            out["old_per_token_logps"] = old
        weights, stats, record = self._policy_side(old, behavior, mask_b, cap, completion_ids, record)
        self._fold(out, weights, mask_b)
        metrics = self._generation_metrics(mode, old, behavior, stats, record, mask_b, rows)
        # the no-grad forward TRL skips without vLLM, and the rest (weights, top-2 pass, statistics, taps)
        metrics["timing/policy_forward_seconds"] = forward_s
        metrics["timing/correction_seconds"] = time.perf_counter() - started - forward_s
        if refresh:
            self._keep_draft_rows(cap, ids, attn, completion_mask, share=1.0)
            metrics.update(self._refresh_draft())
        metrics["draft/refreshes"] = float(self.draft_refreshes)
        for key, value in metrics.items():
            self._metrics[mode][key].append(value)
        return out

    # ------------------------------------------------------------------ one forward instead of two
    def _one_policy_per_generation(self) -> bool:
        """True when the policy that made a generation batch is the one every training forward on it
        runs: TRL's own condition for skipping its old-log-prob forward (num_iterations == 1 and
        steps_per_generation dividing gradient_accumulation_steps), and ``fuse_policy_forward``."""
        args = self.args
        return args.fuse_policy_forward and (
            args.gradient_accumulation_steps % (args.steps_per_generation * args.num_iterations) == 0
        )

    def _compute_loss(self, model, inputs):
        """TRL's loss; on a fused batch its policy forward also yields, detached, the log-probs for the
        importance weights (folded into ``inputs`` before TRL reads the advantages) and the final-norm
        hidden states for the top-1 / top-2 statistics."""
        if _FUSED_PREFIX + "provenance" not in inputs:
            return super()._compute_loss(model, inputs)
        name = "_get_per_token_logps_and_entropies"
        forward = getattr(self, name)
        shadowed = self.__dict__.get(name)  # an instance-level wrapper, if any, put back afterwards

        def restore():
            if shadowed is None:
                self.__dict__.pop(name, None)
            else:
                self.__dict__[name] = shadowed

        def first_forward(*args, **kwargs):
            restore()  # only the policy's forward of this call
            with self._capture(keep_full=self._fused["refresh"]) as cap:
                logps, entropies, aux = forward(*args, **kwargs)
            self._fused_micro_batch(inputs, logps.detach(), cap)
            return logps, entropies, aux

        self.__dict__[name] = first_forward
        try:
            return super()._compute_loss(model, inputs)
        finally:
            restore()

    def _fused_micro_batch(self, inputs: dict, old: torch.Tensor, cap: dict) -> None:
        """Weights of one micro-batch from its training forward; the generation batch's metrics once its
        last micro-batch went through (they equal the two-forward path's: every figure is over rows)."""
        started = time.perf_counter()
        completion_ids, completion_mask = inputs["completion_ids"], inputs["completion_mask"]
        mask = completion_mask if inputs.get("tool_mask") is None else completion_mask * inputs["tool_mask"]
        mask_b = mask.bool()
        behavior = inputs["sampling_per_token_logps"]
        record = {k: inputs[_FUSED_PREFIX + k] for k in ("provenance", "draft_position", "unsupported_mass")}
        weights, stats, record = self._policy_side(old, behavior, mask_b, cap, completion_ids, record)
        self._fold(inputs, weights, mask_b)
        state = self._fused
        state["parts"].append((old, behavior, stats, record, mask_b))
        state["seconds"] += time.perf_counter() - started
        if state["refresh"]:
            ids = torch.cat([inputs["prompt_ids"], completion_ids], dim=1)
            attn = torch.cat([inputs["prompt_mask"], completion_mask], dim=1)
            share = 1.0 / self.args.steps_per_generation
            self._keep_draft_rows(cap, ids, attn, completion_mask, share)
        if len(state["parts"]) < self.args.steps_per_generation:
            return
        parts = state["parts"]
        cat = lambda i: torch.cat([p[i] for p in parts])  # noqa: E731
        joined = lambda i: {k: torch.cat([p[i][k] for p in parts]) for k in parts[0][i]}  # noqa: E731
        metrics = self._generation_metrics(
            "train", cat(0), cat(1), joined(2), joined(3), cat(4), state["rows"]
        )
        metrics["timing/policy_forward_seconds"] = 0.0
        metrics["timing/correction_seconds"] = state["seconds"] + time.perf_counter() - started
        if state["refresh"]:
            metrics.update(self._refresh_draft())
        metrics["draft/refreshes"] = float(self.draft_refreshes)
        for key, value in metrics.items():
            self._metrics["train"][key].append(value)
        self._fused = None

    def _policy_side(self, old, behavior, mask_b, cap, completion_ids, record):
        """The importance weights [N, C], the policy's top-1 / top-2 statistics from the captured hidden
        states, and the record with the filter's mass counted as unsupported."""
        stats = self._token_stats(torch.cat(cap["h"]), completion_ids, mask_b)
        weights, _ = importance_weights(
            old,
            behavior,
            mask_b,
            mode=self.args.is_correction,
            clip_min=self.args.is_clip_min,
            clip_max=self.args.is_clip_max,
        )
        if "filtered_mass" in stats:  # pi's mass off the top-k / top-p filter, and then off b's support
            cut = stats["filtered_mass"].to(record["unsupported_mass"].device)
            record = dict(record, unsupported_mass=cut + (1 - cut) * record["unsupported_mass"])
        return weights, stats, record

    def _fold(self, batch: dict, weights: torch.Tensor, mask_b: torch.Tensor) -> None:
        """Put the weights where TRL's vLLM path applies its ratio (see the module docstring)."""
        if self.loss_type == "vespo":  # VESPO reads the ratio itself; TRL leaves 1 at masked positions
            batch["importance_sampling_ratio"] = torch.where(mask_b, weights, torch.ones_like(weights))
        else:
            advantages = batch["advantages"]
            batch["advantages"] = (advantages.unsqueeze(1) if advantages.dim() == 1 else advantages) * weights

    def _generation_metrics(self, mode, old, behavior, stats, record, mask_b, rows) -> dict:
        metrics = self._batch_metrics(mode, old, behavior, stats, record, mask_b, rows)
        _, is_metrics = importance_weights(
            old,
            behavior,
            mask_b,
            mode=self.args.is_correction,
            clip_min=self.args.is_clip_min,
            clip_max=self.args.is_clip_max,
        )
        for key, value in is_metrics.items():
            metrics[f"correction/{key}"] = value
        return metrics

    # ------------------------------------------------------------------ pieces of the override
    def _check_rows(self, rows: list[dict]) -> None:
        args = self.args
        step = int(self.state.global_step)
        for i, row in enumerate(rows):
            version = row.get("policy_version")
            if version is not None and step - int(version) > args.max_policy_lag:
                raise ValueError(
                    f"completion {i} came from policy version {version} at trainer step {step}: lag "
                    f"{step - int(version)} > max_policy_lag={args.max_policy_lag}"
                )
        first = rows[0]
        info = {k: first.get(k) for k in ("rule", "theta", "relax_prob")}
        lossy = any(is_lossy(r["rule"], r["theta"], r["relax_prob"]) for r in rows)
        if lossy and args.is_correction == "none" and not args.allow_uncorrected_lossy:
            raise ValueError(
                f"the rollouts came from the lossy rule {info['rule']!r} (theta={info['theta']}, "
                f"relax_prob={info['relax_prob']}) and is_correction='none': the gradient would be biased; "
                "set is_correction or allow_uncorrected_lossy=True"
            )
        self._batch_info = dict(info, lossy=lossy)

    @contextlib.contextmanager
    def _capture(self, keep_full: bool):
        """During the no-grad forward: the final norm's output of each chunk and, with ``keep_full`` (a
        draft refresh is due), the head's three feature layers."""
        model = self.accelerator.unwrap_model(self.model)
        cap: dict[str, list] = {"h": [], "features": []}
        tap = None
        if keep_full and self.accelerator.is_main_process:
            from ..drafter import FeatureTap

            tap = FeatureTap(model, self.drafter.config.aux_layer_ids)

        def on_norm(module, args, output):
            h = output[0] if isinstance(output, tuple) else output
            cap["h"].append(h.detach())
            if tap is not None:
                cap["features"].append(tap.features())

        handle = final_norm(model).register_forward_hook(on_norm)
        try:
            yield cap
        finally:
            handle.remove()
            if tap is not None:
                tap.remove()

    @torch.no_grad()
    def _token_stats(self, hidden: torch.Tensor, completion_ids: torch.Tensor, mask: torch.Tensor) -> dict:
        """The policy's log-prob, top-1 and top-2 at each completion position, from the captured hidden
        states: one lm_head matmul over the completion positions (fp32)."""
        width = completion_ids.shape[1]
        h = hidden[:, -width - 1 : -1]  # [N, C, H]: position t predicts completion token t
        head = self.accelerator.unwrap_model(self.model).get_output_embeddings()
        ctx = contextlib.nullcontext()
        if is_zero3(self.model):
            import deepspeed

            ctx = deepspeed.zero.GatheredParameters(list(head.parameters()), modifier_rank=None)
        with ctx:
            if head.bias is None:
                stats, _ = token_stats(
                    completion_ids, self.temperature, hidden=h, weight=head.weight, mask=mask
                )
            else:
                logits = F.linear(h.float(), head.weight.float(), head.bias.float())
                stats, _ = token_stats(completion_ids, self.temperature, logits=logits, mask=mask)
            if self.sampling.top_k is not None or self.sampling.top_p is not None:
                stats["filtered_mass"] = self._filtered_mass(h, head, mask)
        return stats

    @torch.no_grad()
    def _filtered_mass(self, h: torch.Tensor, head, mask: torch.Tensor, chunk: int = 1024) -> torch.Tensor:
        """[N, C] float32: the policy's mass (softmax(z / T), what the trainer's log-probs are taken
        under) that the rollout's top-k / top-p filter removes at each completion position; 0 where
        masked. The behaviour cannot emit it, so no importance weight reaches it."""
        sp = self.sampling
        out = torch.zeros(mask.shape, dtype=torch.float32, device=h.device)
        where = mask.flatten().nonzero().squeeze(1)
        rows = h.flatten(0, 1)
        bias = None if head.bias is None else head.bias.float()
        for start in range(0, where.numel(), chunk):
            at = where[start : start + chunk]
            z = F.linear(rows[at].float(), head.weight.float(), bias)  # [c, V]
            kept = sampling_logits(z, sp.temperature, sp.top_k, sp.top_p).isfinite()
            probs = (z / sp.temperature).softmax(dim=-1)
            out.view(-1)[at] = (probs * ~kept).sum(dim=-1)
        return out

    def _batch_metrics(self, mode, old, behavior, stats, record, mask, rows) -> dict:
        """The logged figures of one generation batch, gathered over ranks (every rank computes them)."""
        acc = self.accelerator
        tensors = {
            "policy_logp": old.float(),
            "behavior_logp": torch.nan_to_num(behavior.float(), nan=0.0),
            "is_t1": stats["is_t1"],
            "is_t2": stats["is_t2"],
            "p_t1": stats["p_t1"].float(),
            "p_t2": stats["p_t2"].float(),
            "provenance": record["provenance"].to(old.device),
            "unsupported_mass": record["unsupported_mass"].to(old.device),
            "mask": mask,
            "draft_position": record["draft_position"].to(old.device),
        }
        if "filtered_mass" in stats:
            tensors["filtered_mass"] = stats["filtered_mass"]
        if acc.num_processes > 1:
            tensors = {k: acc.gather(acc.pad_across_processes(v, dim=1)) for k, v in tensors.items()}
        t = {k: v.cpu() for k, v in tensors.items()}
        _, bias = bias_metrics(
            t["policy_logp"],
            t["behavior_logp"],
            t["is_t1"],
            t["is_t2"],
            t["p_t1"],
            t["p_t2"],
            t["provenance"],
            t["mask"],
            unsupported_mass=t["unsupported_mass"],
        )
        out = {f"bias/{k}": float(v) for k, v in bias.items() if k != "tokens"}
        if "filtered_mass" in t:
            m = t["mask"]
            out["bias/filtered_mass"] = float(t["filtered_mass"][m].double().mean()) if m.any() else 0.0
        unsupported = out.get("bias/unsupported_mass", 0.0)
        if unsupported > 0 and self.args.is_correction != "none" and not self._warned_unsupported:
            self._warned_unsupported = True
            sp = self.sampling
            warnings.warn(
                f"the rollouts put {unsupported:.3g} of the policy's mass per token where the behaviour "
                f"cannot emit (relax_prob={self._batch_info.get('relax_prob')}, top_k={sp.top_k}, "
                f"top_p={sp.top_p}): importance correction cannot restore it; use relax_prob < 1 or "
                "sampled drafts, and no top-k / top-p filter, for an exactly correctable run",
                stacklevel=2,
            )
        stats_row = rows[0].get("rollout_stats") or {}
        for key in ("tau", "tokens_per_s", "seconds", "relaxed_frac", "acceptance_rate"):
            value = stats_row.get(key)
            out[f"rollout/{key}"] = float("nan") if value is None else float(value)
        k = int(t["draft_position"].max().clamp_min(0)) + 1
        _, acc_pos = acceptance_by_position(t["provenance"], t["draft_position"], t["mask"], k)
        out.update({f"rollout/{key}": v for key, v in acc_pos.items() if not math.isnan(v)})
        versions = [r.get("policy_version") for r in rows if r.get("policy_version") is not None]
        out["policy/version"] = float(max(versions)) if versions else float("nan")
        out["rollout/relax_prob"] = float(self._batch_info.get("relax_prob") or 0.0)
        out["rollout/theta"] = float(self._batch_info.get("theta") or 0.0)
        return out

    # ------------------------------------------------------------------ the draft kept in step
    def _draft_refresher(self):
        if self._refresher is None:
            from .draft import DraftRefresher

            every = self.args.draft_refresh_every
            steps = self.args.max_steps if self.args.max_steps > 0 else self.state.max_steps
            total = math.ceil(max(int(steps), 1) / every)
            self._refresher = DraftRefresher(self.drafter, self.args, total)
        return self._refresher

    def _keep_draft_rows(self, cap: dict, ids, attn, completion_mask, share: float) -> None:
        """Rank 0 keeps its share of this forward's rows (features, hidden states) for the refresh."""
        if not self.accelerator.is_main_process:
            return
        self._draft_refresher().add(
            torch.cat(cap["features"]), torch.cat(cap["h"]), ids, attn, completion_mask, share
        )

    def _refresh_draft(self) -> dict:
        """Train the head on the kept rows (rank 0); it is sent with the policy at the next sync. Every
        rank calls it: a ZeRO-3 lm_head is gathered collectively."""
        head = self.accelerator.unwrap_model(self.model).get_output_embeddings()
        ctx = contextlib.nullcontext()
        if is_zero3(self.model):
            import deepspeed

            ctx = deepspeed.zero.GatheredParameters(list(head.parameters()), modifier_rank=None)
        if not self.accelerator.is_main_process:
            with ctx:
                return {}
        with ctx, torch.autocast(head.weight.device.type, enabled=False):
            metrics = self._draft_refresher().refresh(head)
        self.draft_refreshes = self._refresher.refreshes
        # the pool gets the head it drafts with: a refresh the gate did not serve sends nothing
        self._draft_dirty = self._draft_dirty or metrics["draft/published"] > 0
        self._draft_seconds = (self._draft_seconds or 0.0) + metrics["draft/seconds"]
        metrics["timing/draft_refresh_seconds"] = metrics["draft/seconds"]
        return metrics

    # ------------------------------------------------------------------ checkpoints
    def create_model_card(self, *args, **kwargs):
        """TRL's model card, written at every checkpoint. TRL links the wandb run's URL, which an offline
        run does not have (wandb then warns on every save): for an offline run the card is written
        without it."""
        import sys

        wandb = sys.modules.get("wandb")
        run = getattr(wandb, "run", None)
        if run is None or not run.offline:
            return super().create_model_card(*args, **kwargs)
        wandb.run = None  # what TRL reads for the link; put back at once
        try:
            return super().create_model_card(*args, **kwargs)
        finally:
            wandb.run = run

    def _save_checkpoint(self, model, trial):
        """TRL's checkpoint, then the marsrl state (head, head optimizer, counters) and, last, a marker
        listing every file's size and SHA-256 (``checkpoint.write_manifest``): a save killed half way
        leaves no marker, a file damaged later fails the check, and resume loads neither."""
        super()._save_checkpoint(model, trial)
        self.accelerator.wait_for_everyone()  # every rank's shard is on disk before the manifest lists it
        if not self.args.should_save:
            return
        folder = Path(self.args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        state = {
            "draft": None if self.drafter is None else self.drafter.state_dict(),
            "draft_refresher": None if self._refresher is None else self._refresher.state_dict(),
            "draft_refreshes": self.draft_refreshes,
            "rollout_calls": None if self._pool_rollout is None else self._pool_rollout.state["calls"],
        }
        torch.save(state, folder / CHECKPOINT_STATE)
        write_manifest(folder, self.state.global_step)

    def _load_from_checkpoint(self, resume_from_checkpoint, model=None):
        super()._load_from_checkpoint(resume_from_checkpoint, model)
        path = Path(resume_from_checkpoint) / CHECKPOINT_STATE
        if not path.is_file():
            raise ValueError(
                f"{resume_from_checkpoint}: no {CHECKPOINT_STATE} (not a MarsGRPOTrainer checkpoint)"
            )
        state = torch.load(path, weights_only=False)
        if self.drafter is not None and state["draft"] is not None:
            self.drafter.load_state_dict(state["draft"])
            self._draft_dirty = True
        if state.get("draft_refresher") is not None and self.drafter is not None:
            self._draft_refresher().load_state_dict(state["draft_refresher"])
        self.draft_refreshes = state["draft_refreshes"]
        if self._pool_rollout is not None and state["rollout_calls"] is not None:
            self._pool_rollout.state["calls"] = state["rollout_calls"]

    # ------------------------------------------------------------------ logging and lifetime
    def log(self, logs: dict, start_time: float | None = None) -> None:
        mode = "train" if self.model.training else "eval"
        if mode == "train" and self._step_start is not None and "loss" in logs:
            step_s = time.perf_counter() - self._step_start
            self._metrics[mode]["step_seconds"].append(step_s)
            self._metrics[mode]["rollout/share_of_step"].append(min(self._rollout_seconds / step_s, 1.0))
            self._metrics[mode]["rollout/wall_seconds"].append(self._rollout_seconds)
            self._rollout_seconds = 0.0
            if self._draft_seconds is not None:  # a refresh ran in this step: its cost, counted in it
                self._metrics[mode]["draft/share_of_step"].append(min(self._draft_seconds / step_s, 1.0))
                self._draft_seconds = None
        info = self._batch_info
        if info and "loss" in logs:
            logs["rollout/rule"] = info.get("rule")
            logs["correction/mode"] = self.args.is_correction
        super().log(logs, start_time)

    def close(self) -> None:
        """Shut down a pool this trainer built (``pool_config=``)."""
        if self._owns_pool and self.pool is not None:
            self.pool.shutdown()
            self.pool = None


def _pad_rows(rows: list[dict], key: str, lengths: list[int], width: int) -> torch.Tensor:
    """[N, width] tensor of a per-token extra field, padded as ``trajectory.collate`` pads it; each row's
    list must have one entry per completion token."""
    for i, row in enumerate(rows):
        values = row.get(key)
        if values is None:
            raise ValueError(f"{key}: the rollout of completion {i} carries no per-token {key}")
        if len(values) != int(lengths[i]):
            raise ValueError(
                f"{key} of completion {i} has {len(values)} entries but the completion has "
                f"{int(lengths[i])} tokens"
            )
    return pad_per_token(key, [row[key] for row in rows], width)


def _record_lengths(rows: list[dict], completion_mask: torch.Tensor, width: int) -> list[int]:
    """Each completion's token count: its mask's where the mask is on, else (a row TRL masked out with
    ``mask_truncated_completions``) the length of its own per-token record, which must fit ``width``."""
    lengths = completion_mask.sum(1).tolist()
    for i, row in enumerate(rows):
        if lengths[i] == 0 and row.get("provenance") is not None:
            lengths[i] = len(row["provenance"])
            if lengths[i] > width:
                raise ValueError(
                    f"provenance of completion {i} has {lengths[i]} entries, more than the completions' "
                    f"width {width}"
                )
    return [int(n) for n in lengths]


def _slice_output(payload: dict, start: int, length: int) -> dict:
    """This rank's entries of a rollout_func output computed for every rank's prompts."""
    return {k: (v[start : start + length] if isinstance(v, list) else v) for k, v in payload.items()}
