"""The batched speculative engine: a Hugging Face causal LM as the target, an EAGLE-3 head (or any object
with a ``propose`` method) as the drafter, the verification core deciding every token, and a per-token
record of how each completion token was produced.

One round for every active sequence (all advance together, each by its own accepted length):

    drafts  = drafter(committed prefix)                     K tokens (chain) or a tree of nodes
    logits  = target([last, drafts], cached prefix)          one forward, [B, K+1, V] (tree: [B, N+1, V])
    result  = verify_chain / verify_tree(logits, drafts)     accepted drafts + one closing token
    commit    the accepted entries of both KV caches (RaggedCache); the closing token becomes ``last``

``drafter=None`` is plain autoregressive sampling through the same code (one token per forward); it is
the reference path. Finished sequences (EOS, a stop id, max_new_tokens, the context's end ``max_seq_len``,
which a speculative row reaches exactly, as a plain one does) leave the batch at once.

GPU habits: both KV caches are preallocated ragged buffers written in place (cache.py); the target's
chain / tree forwards attend without repeating KV heads (attention.py); a round reads the device back
once (its record, packed in one tensor, plus the verify core's one batched data check), and every host
decision after it (widths, commits, which rows finished) uses that copy; verify logits of bf16 / fp16
targets come out of the lm_head in float32.  ``num_draft_tokens="auto"`` picks each round's chain
length from a measured cost model (adaptive.py).

Deliberately left out: paged caches, CUDA graphs, sliding-window attention (a model whose sliding window
is shorter than prompt + completion is refused), continuous batching of new requests.
"""

from __future__ import annotations

import contextlib
import math
import statistics
import time
from collections.abc import Sequence

import numpy as np
import torch

from ..trajectory import PER_TOKEN_FIELDS, Trajectory
from ..verify import Provenance, sample_plain, verify_chain, verify_tree
from ..verify.dist import sample_from_weights
from .adaptive import CostModel, CycleK, FixedK, KPlanner, Lengths, SpeedCheck, context_line
from .attention import check_attention, target_attention
from .cache import RaggedCache, fill_order, moved_places
from .config import EngineConfig, SamplingParams
from .tree import draft_tree


class _Row:
    """Host-side bookkeeping of one sequence."""

    def __init__(self, index: int, prompt: list[int], serial: int = 0):
        self.index = index
        self.prompt = prompt
        self.serial = serial  # the row's place in its call: the planner's name for it (``RowAcceptance``)
        self.tokens: list[int] = []
        self.record: dict[str, list] = {k: [] for k in _RECORD_FIELDS}
        self.rounds = self.drafted = self.accepted = self.relaxed = 0
        self.finish: str | None = None


_RECORD_FIELDS = PER_TOKEN_FIELDS
_RESULT_FIELDS = (
    "provenance",
    "target_logprob",
    "behavior_logprob",
    "logit_ratio",
    "is_top2",
    "unsupported_mass",
)


def fp32_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., H] times weight [V, H] transposed (plus bias [V]) -> float32 [..., V], for half-precision
    weights.  On CUDA one GEMM in the weight's dtype with float32 output (``torch.mm(out_dtype=)``, no
    float32 copy of the weight); elsewhere, or where that overload is missing, the operands are upcast
    in blocks of 8,192 vocabulary rows so the float32 weight is never whole in memory."""
    flat = x.reshape(-1, x.shape[-1])
    out = None
    if x.device.type == "cuda":
        try:
            out = torch.mm(flat, weight.t(), out_dtype=torch.float32)
        except (RuntimeError, TypeError):
            out = None
    if out is None:
        xf = flat.float()
        out = torch.cat([xf @ w.float().t() for w in weight.split(8192)], 1)
    if bias is not None:
        out = out + bias.float()
    return out.view(*x.shape[:-1], weight.shape[0])


_PHASES = ("prefill", "draft", "target_forward", "verify", "commit", "record")


class SpeculativeEngine:
    """Generate many sequences at once with speculative decoding and exact per-token records.

    ``cost_model``: for ``num_draft_tokens="auto"``, a measured ``CostModel`` to use instead of
    measuring one at the first call (pass ``engine.cost_model`` of another engine to reproduce its
    choices)."""

    # plain steps over rows of unequal ends write in place (``RaggedCache.at_ends``); False: append and
    # move, the reference path the tests compare against
    plain_at_ends = True
    # "auto": the planner's shrinkage of the live rows' acceptance toward the call's (``RowAcceptance``);
    # None plans every round on the call's pooled estimates (bench/live_rows.py sets it side by side)
    row_prior: float | None = 4.0

    def __init__(self, target, drafter=None, config: EngineConfig | None = None, cost_model=None):
        self.target = target.eval()
        self.drafter = drafter
        self.config = config or EngineConfig()
        self.device = next(target.parameters()).device
        self.vocab_size = target.get_output_embeddings().weight.shape[0]
        self.max_seq_len = self.config.max_seq_len or getattr(target.config, "max_position_embeddings", None)
        self.stats: dict = {}
        self.cost_model = cost_model
        self._acceptance = None  # auto: the last call's acceptance estimates, the next call's start
        self._speculative = 0  # auto: speculative rounds so far, which time the planner's exploration
        self._probe: tuple[int, int] | None = None  # auto: the planner's plain run and probe wait
        self._speed = None  # auto: the last call's SpeedCheck (measured against predicted round seconds)
        self._lengths: list[int] = []  # auto: the last call's completion lengths (the planner's horizon)
        self._eagle = None
        check_attention(target)
        if drafter is not None and not hasattr(drafter, "propose"):
            from ..drafter import Eagle3Drafter, FeatureTap

            if not isinstance(drafter, Eagle3Drafter):
                raise TypeError(
                    "drafter must be an Eagle3Drafter or an object with a propose(sequences, k) method"
                )
            if drafter.config.vocab_size != target.config.vocab_size:
                raise ValueError(
                    f"drafter vocabulary ({drafter.config.vocab_size}) does not match the target's "
                    f"({target.config.vocab_size})"
                )
            FeatureTap(target, drafter.config.aux_layer_ids).remove()  # fails now if the taps do not fit
            self._eagle = _EagleState(drafter, self.config.drafter_window or None)
        if self.config.draft_confidence > 0 and drafter is not None and self._eagle is None:
            raise ValueError("draft_confidence needs an Eagle3Drafter (a propose() drafter reports none)")
        if self.config.tree is not None and drafter is not None and self._eagle is None:
            raise ValueError("tree drafting needs an Eagle3Drafter (a propose() drafter only drafts chains)")
        window = getattr(target.config, "sliding_window", None)
        if window and getattr(target.config, "use_sliding_window", True) and self.max_seq_len:
            self.max_seq_len = min(self.max_seq_len, window)
        dtype = self._dtype
        # verify-position logits in fp32 for half-precision targets: a bf16 GEMM output rounds z2/z1
        # (and makes exact ties) right where MARS decides; the GEMM's inputs stay in the model's dtype
        self._fp32_head = dtype in (torch.float16, torch.bfloat16) and self.config.fp32_logits
        self._auto = self.config.num_draft_tokens == "auto"

    @property
    def _k_max(self) -> int:
        return self.config.max_draft_tokens if self._auto else self.config.num_draft_tokens

    # ------------------------------------------------------------------ public
    def generate(
        self, prompt_ids: Sequence[Sequence[int]], sampling: SamplingParams | None = None
    ) -> list[Trajectory]:
        """Complete every prompt ``sampling.n`` times; returns trajectories grouped by prompt, in order."""
        sampling = sampling or SamplingParams()
        lam = self.config.relax_prob
        greedy_mars = self.drafter is not None and self.config.rule == "mars" and sampling.temperature == 0
        if greedy_mars and 0 < lam < 1:
            raise ValueError(
                f"relax_prob = {lam} needs a random draw and greedy decoding (temperature 0) makes none: "
                "use relax_prob 0 or 1 in the EngineConfig, or temperature > 0"
            )
        prompts = self._check_prompts(prompt_ids)
        planner = None
        if self._auto and self.drafter is not None:
            if self.cost_model is None:  # measured once, on this call's prompts
                self.cost_model = self.calibrate(prompts=prompts)
            carry = self._acceptance is not None and self.config.adapt_costs
            speed = None  # the choice never reads the clock
            if self.config.adapt_costs and self.config.speed_check:
                speed = self._speed.carried() if self._speed is not None else SpeedCheck()
            planner = KPlanner(
                self.cost_model,
                self.config.max_draft_tokens,
                estimates=self._acceptance.carried() if carry else None,
                speculative=self._speculative if carry else 0,
                speed=speed,
                probe=self._probe if carry else None,
                lengths=Lengths(self._lengths, sampling.max_new_tokens) if carry and self._lengths else None,
                row_prior=self.row_prior,
            )
        out = self._generate(prompts, sampling, planner)
        if planner is not None and self.config.adapt_costs:
            self.cost_model.observe(self.stats["trace"])
            self._acceptance, self._speculative = planner.estimates, planner.speculative
            self._probe = (planner.plain_run, planner.wait)
            self._speed = planner.speed
            self._lengths = [len(t.completion_ids) for t in out]
            if planner.speed is not None:
                self.stats["speed_check"] = planner.speed.to_dict()
                # what a plain step's pair costs a catch-up round (None: not measured yet), and the
                # rounds held plain because switching to drafting would have cost more than it saves
                price = planner.speed.pair_seconds()
                self.stats["switch_debt"] = {"pair_seconds": price, "held": planner.held}
        return out

    def _generate(self, prompts: list[list[int]], sampling: SamplingParams, planner) -> list[Trajectory]:
        eos = self._eos_ids(sampling)
        gen = torch.Generator(device=self.device).manual_seed(sampling.seed)
        rows = [_Row(i, p, i * sampling.n + j) for i, p in enumerate(prompts) for j in range(sampling.n)]
        totals = dict(
            target_forwards=0,
            draft_forwards=0,
            drafter_pairs_skipped=0,  # committed pairs the drafter never absorbed (drafter_window)
            drafted=0,
            accepted=0,
            relaxed=0,
            rounds=0,
            tokens=0,
            tokens_in_rounds=0,
            host_syncs=0,
            cache_bytes_copied=0,
            k_per_round=[],
            trace=[],  # per round: [start (s since the call began), live rows, k, wall seconds, cache width]
            tokens_per_round=[],  # per round (as trace): the tokens it kept, over its rows
        )
        if self.config.profile:
            totals.update(time=dict.fromkeys(_PHASES, 0.0), forward_by_width={})
        self._totals = totals
        start = time.perf_counter()
        self._t0 = start
        with torch.inference_mode():
            for s in range(0, len(rows), self.config.max_batch_size):
                batch = rows[s : s + self.config.max_batch_size]
                self._run_batch(batch, sampling, eos, gen, totals, planner)
        totals["wall_seconds"] = time.perf_counter() - start
        # tau: kept tokens per target forward of the speculative rounds, per sequence (the prefill's token
        # is excluded from both counts; a round's tokens past an EOS / max_new_tokens are not counted), so
        # tau = (sum of completion lengths - sequences) / rounds exactly; None when no round ran
        totals["tau"] = totals["tokens_in_rounds"] / totals["rounds"] if totals["rounds"] else None
        self.stats = totals
        return [self._trajectory(r, sampling) for r in rows]

    # ------------------------------------------------------------------ one batch
    def _run_batch(self, rows: list[_Row], sampling: SamplingParams, eos: set[int], gen, totals, planner):
        dev = self.device
        bsz = len(rows)
        # the prefill runs once per distinct prompt (a GRPO group's G rows share one) and its KV entries,
        # last logits and features are copied to the group's rows: the same numbers, G times less compute
        uniq: dict[tuple[int, ...], int] = {}
        src_host = [
            uniq.setdefault(tuple(r.prompt), len(uniq)) if self.config.share_prefix else b
            for b, r in enumerate(rows)
        ]
        prompts = [list(p) for p in uniq] if self.config.share_prefix else [r.prompt for r in rows]
        n_pre = len(prompts)
        lens_host = [len(p) for p in prompts]
        width = max(lens_host)
        pad_host = [width - n for n in lens_host]
        ids_host = torch.zeros(n_pre, width, dtype=torch.long)
        for b, p in enumerate(prompts):
            ids_host[b, width - len(p) :] = torch.tensor(p)
        # one host -> device copy for the prompts, their lengths and padding
        ids, lens = self._to_device(torch.cat([ids_host, torch.tensor(lens_host).unsqueeze(1)], 1)).split(
            [width, 1], 1
        )
        lens = lens.squeeze(1)
        pad = width - lens  # prompts are left-padded: every row's last prompt token sits at slot width-1
        room = sampling.max_new_tokens + self._round_width() + 1
        tcache = RaggedCache(n_pre, dev, capacity=width + room)
        slots = torch.arange(width, device=dev)
        keys_ok = slots >= pad.unsqueeze(1)  # [B, L]
        causal = torch.ones(width, width, dtype=torch.bool, device=dev).tril()
        clock = self._clock("prefill")
        mask = tcache.attention_mask(causal.unsqueeze(0) & keys_ok.unsqueeze(1), self._dtype)
        pos = (slots - pad.unsqueeze(1)).clamp(min=0)
        hidden, feats = self._target_hidden(ids, pos, mask, tcache)
        totals["target_forwards"] += 1
        tcache.set_rows(pad, lens.clone(), pad_host, lens_host)
        logits = self._lm_head(hidden[:, -1])
        # the first round's k is chosen before the drafter's prompt pass (the same inputs as the loop's
        # first choice: every row, the prompt's width, nothing owed): a plain first round defers the
        # pass to the first speculative round, which may never come (strict at 128 rows on this CPU)
        k_next = planner.choose(bsz, width, 0, 0.0) if planner is not None else None
        if self._eagle is not None:
            # the drafter's input pairs (feature at t, token t+1) within the prompt, left-aligned per row
            # (pair i of row b comes from slot pad[b] + i), set aside one a distinct prompt and absorbed
            # by the prompt pass (below, or at the first speculative round when the first is plain, then
            # for the live prompts only); the last pair (the last prompt feature, the first sampled
            # token) waits for the first round
            at = (pad.unsqueeze(1) + slots).clamp(max=width - 1)  # [P, L]
            pair_feats = feats.gather(1, at.unsqueeze(-1).expand(-1, -1, feats.shape[-1]))
            pair_tokens = ids.gather(1, (at + 1).clamp(max=width - 1))
            inside = [n - 1 for n in lens_host]
            self._eagle.start(n_pre, dev, pair_feats, pair_tokens, lens - 1, inside, width + room, defer=True)
            last_feats = feats[:, -1:]  # [P, 1, 3Ht]
        if n_pre < bsz:  # copy each prompt's state to its rows
            src = self._to_device(torch.tensor(src_host))
            tcache.select(src, src_host)
            logits = logits.index_select(0, src)
            if self._eagle is not None:
                self._eagle.select(src, src_host)
                last_feats = last_feats.index_select(0, src)
        first = sample_plain(
            logits,
            temperature=sampling.temperature,
            top_k=sampling.top_k,
            top_p=sampling.top_p,
            generator=gen,
        )
        last = first.tokens[:, 0]
        if self._eagle is not None:
            ones = torch.ones(bsz, dtype=torch.long, device=dev)
            self._eagle.pend(last_feats, last.unsqueeze(1), ones, [1] * bsz)
            if k_next != 0:  # the first round drafts: the prompt pass now, not timed as part of it
                self._eagle.prompt_pass()
        host = self._fetch_plain(first)
        self._tick(clock)
        active = self._record(rows, host, sampling, eos, totals, drafted=None)

        while active:
            if len(active) < len(rows):
                # the rows that left give their places to rows from the end of the batch: one row's
                # copy a finish, where keeping the order moved every row after the first that left
                keep_host = fill_order([b for b, _ in active])
                moved = moved_places(keep_host)  # the places that take another row, for both caches
                sent = self._to_device(torch.tensor(keep_host + moved))  # one copy for both
                keep, at = sent.split([len(keep_host), len(moved)])
                tcache.select(keep, keep_host, at)
                last = last[keep]
                if self._eagle is not None:
                    self._eagle.select(keep, keep_host, at)
                rows = [rows[b] for b in keep_host]
            context = tcache.width  # slots every row's attention reads this round
            room = self._room(rows)
            k, k_next = k_next, None
            if planner is not None and k is None:
                debt = self._eagle.debt if self._eagle is not None else 0
                made = sum(len(r.tokens) for r in rows) / len(rows) if debt else 0.0
                # each live row by name and the tokens it may still make, for the live rows' acceptance
                keys = [r.serial for r in rows]
                left = [sampling.max_new_tokens - len(r.tokens) for r in rows]
                if room is not None:
                    left = [min(n, m) for n, m in zip(left, room, strict=True)]
                k = planner.choose(len(rows), context, debt, made, keys=keys, left=left)
            round_start = time.perf_counter()
            res, drafted, n_forwards, host = self._round(rows, last, tcache, sampling, gen, k, room)
            totals["target_forwards"] += 1
            totals["draft_forwards"] += n_forwards
            last = res.tokens.gather(1, (res.num_emitted - 1).unsqueeze(1)).squeeze(1)
            clock = self._clock("record")
            kept = totals["tokens"]
            active = self._record(rows, host, sampling, eos, totals, drafted=drafted)
            totals["tokens_per_round"].append(totals["tokens"] - kept)
            self._tick(clock)
            width = drafted if isinstance(drafted, int) else max(drafted)
            totals["k_per_round"].append(width)
            if planner is not None and width:  # a plain step drafted nothing: no acceptance to learn
                per_row = [drafted] * len(rows) if isinstance(drafted, int) else drafted
                planner.observe(per_row, [n - 1 for n in host["num_emitted"]], keys=[r.serial for r in rows])
            seconds = time.perf_counter() - round_start
            totals["trace"].append([round_start - self._t0, len(rows), width, seconds, context])
            if planner is not None:
                planner.timed(seconds)
            if planner is not None and planner.exhausted:  # a calibration run has what it needs
                break
        totals["cache_bytes_copied"] += tcache.bytes_copied
        if self._eagle is not None:
            totals["cache_bytes_copied"] += self._eagle.cache.bytes_copied
            totals["drafter_pairs_skipped"] += self._eagle.skipped_pairs
            self._eagle.clear()  # nothing of the batch stays on the device after it

    def _room(self, rows) -> list[int] | None:
        """The tokens each live row may still make within ``max_seq_len``, where some row has less room
        than a round may emit (else None: no row near the context's end, nothing to cap)."""
        if self.max_seq_len is None or self.drafter is None:
            return None
        room = [self.max_seq_len - len(r.prompt) - len(r.tokens) for r in rows]
        return room if min(room) < self._round_width() else None

    def _round(
        self, rows, last, tcache: RaggedCache, sampling: SamplingParams, gen, k: int | None, room=None
    ):
        """One draft + verify round: (VerifyResult-like, drafted per row, draft forwards, host record).

        k: the chain length the planner chose (auto mode; 0 = a plain step), else None.  room: the tokens
        each row may still make within ``max_seq_len`` (``_room``; None: every row has a round's room).
        A row near the context's end verifies only the drafts it can keep (``num_drafts``), so it stops
        at ``max_seq_len`` exactly, as plain decoding does, and no kept token sits past it; a tree that
        does not fit every row takes a plain step."""
        dev = self.device
        cfg = self.config
        bsz = len(rows)
        kw = dict(temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p, generator=gen)
        caps = None  # the most drafts each row may keep, where the context's end cuts some row's chain
        if room is not None and k != 0:  # (``_room`` is None without a drafter)
            if cfg.tree is not None:
                k = 0 if min(room) < cfg.tree.depth + 1 else k
            else:
                # a chain longer than any row can keep drafts columns nobody verifies: shorten it
                k = min(k if k is not None else cfg.num_draft_tokens, max(room) - 1)
                if min(room) - 1 < k:
                    caps = [n - 1 for n in room]
        if self.drafter is None or k == 0:  # a plain step: one token per target forward
            block = last.unsqueeze(1)
            # rows without padding or gaps (one prompt, or a group sharing it, decoded plainly) need no
            # mask: transformers then takes SDPA's unmasked path with packed GQA, as HF generate does
            mask = None
            # rows ending short of the shared axis (after speculative rounds) write their entry at their
            # own end (``RaggedCache.at_ends``): appended at the axis's end it needs a commit move, about
            # 1 ms of a 32 ms 64-row step on this CPU, of which the in-place write costs back a third to
            # a half; ``plain_at_ends`` False keeps the append (the tests' reference)
            in_place = self.plain_at_ends and not tcache.aligned()
            if in_place:
                mask = tcache.ends_mask(self._dtype)
            elif not tcache.dense:
                mask = tcache.attention_mask(torch.ones(1, 1, 1, dtype=torch.bool, device=dev), self._dtype)
            start = tcache.width
            clock = self._clock("target_forward")
            with tcache.at_ends() if in_place else contextlib.nullcontext():
                hidden, feats = self._target_hidden(block, tcache.lengths.unsqueeze(1), mask, tcache)
            self._tick(clock, width=1, rows=bsz)
            clock = self._clock("verify")
            res = sample_plain(self._lm_head(hidden[:, 0]), **kw)
            host = self._fetch_plain(res)
            self._tick(clock)
            clock = self._clock("commit")
            if in_place:
                tcache.commit_in_place(res.num_emitted, host["num_emitted"])
            else:
                order = torch.zeros(bsz, 1, dtype=torch.long, device=dev)
                tcache.commit(start, order, res.num_emitted, host["num_emitted"], in_order=True)
            if self._eagle is not None:  # the drafter absorbs this pair with the next round's
                self._eagle.pend_plain(feats, res.tokens)
            self._tick(clock)
            return res, 0, 0, host
        if cfg.tree is not None:
            return self._tree_round(last, tcache, sampling, kw)
        k = k if k is not None else cfg.num_draft_tokens
        n_drafts = None  # per-row chain lengths when drafting stopped early for some rows
        clock = self._clock("draft")
        if self._eagle is not None:
            drafts, probs, n_drafts = self._eagle.draft_chain(
                k, sampling, cfg.draft_sampling, gen, cfg.draft_confidence
            )
            k = drafts.shape[1]  # every row may have stopped before K
            n_forwards = k
        else:
            seqs = [r.prompt + r.tokens for r in rows]
            drafts, probs = self.drafter.propose(seqs, k).to(dev).long(), None
            n_forwards = 0
        self._tick(clock)
        block = torch.cat([last.unsqueeze(1), drafts], 1)  # [B, K+1]
        pos = tcache.lengths.unsqueeze(1) + torch.arange(k + 1, device=dev)
        if caps is not None:  # rows near the context's end verify only the drafts they can keep
            cap = self._to_device(torch.tensor(caps)).clamp(max=k)
            n_drafts = cap if n_drafts is None else torch.minimum(n_drafts, cap)
            # their columns past it are nobody's: held at the context's last position, so no position
            # past max_seq_len reaches the target (a dynamic RoPE would rescale the whole forward)
            pos = pos.clamp(max=self.max_seq_len - 1)
        causal = torch.ones(k + 1, k + 1, dtype=torch.bool, device=dev).tril().unsqueeze(0)
        mask = tcache.attention_mask(causal, self._dtype)
        start = tcache.width
        clock = self._clock("target_forward")
        hidden, feats = self._target_hidden(block, pos, mask, tcache)
        self._tick(clock, width=k + 1, rows=bsz)
        clock = self._clock("verify")
        res = verify_chain(
            self._lm_head(hidden),
            drafts,
            probs,
            rule=cfg.rule,
            theta=cfg.theta,
            relax_prob=cfg.relax_prob,
            num_drafts=n_drafts,
            **kw,
        )
        host = self._fetch(res, n_drafts)
        self._tick(clock)
        clock = self._clock("commit")
        order = torch.arange(k + 1, device=dev).expand(bsz, k + 1)
        tcache.commit(start, order, res.num_emitted, host["num_emitted"], in_order=True)
        if self._eagle is not None:
            self._eagle.pend(feats, res.tokens.clamp(min=0), res.num_emitted, host["num_emitted"])
        self._tick(clock)
        return res, (host["num_drafts"] if n_drafts is not None else k), n_forwards, host

    def _tree_round(self, last, tcache: RaggedCache, sampling: SamplingParams, kw):
        dev = self.device
        cfg = self.config
        clock = self._clock("draft")
        tree = draft_tree(self._eagle, cfg.tree, self._dtype)
        self._tick(clock)
        n = tree.tokens.shape[1]
        bsz = last.shape[0]
        block = torch.cat([last.unsqueeze(1), tree.tokens.clamp(min=0)], 1)  # [B, N+1]
        pos = tcache.lengths.unsqueeze(1) + torch.cat(
            [torch.zeros(bsz, 1, dtype=torch.long, device=dev), tree.depth], 1
        )
        mask = tcache.attention_mask(tree.ancestors, self._dtype)  # [B, N+1, N+1] incl. root
        start = tcache.width
        clock = self._clock("target_forward")
        hidden, feats = self._target_hidden(block, pos, mask, tcache)
        self._tick(clock, width=n + 1, rows=bsz)
        clock = self._clock("verify")
        # node probabilities matter only to mars_code (strict/mars treat top-k proposals as q = 1)
        res = verify_tree(
            self._lm_head(hidden),
            tree.tokens,
            tree.parents,
            tree.node_probs,
            rule=cfg.rule,
            theta=cfg.theta,
            relax_prob=cfg.relax_prob,
            **kw,
        )
        host = self._fetch(res)
        self._tick(clock)
        clock = self._clock("commit")
        # keep the root and the accepted nodes, in path order (block index = node + 1)
        path = torch.cat([torch.zeros(bsz, 1, dtype=torch.long, device=dev), res.path_nodes + 1], 1)
        path = path.clamp(min=0)[:, : res.tokens.shape[1]]
        tcache.commit(start, path, res.num_emitted, host["num_emitted"])
        feats_path = feats.gather(1, path.unsqueeze(-1).expand(-1, -1, feats.shape[-1]))
        self._eagle.pend(feats_path, res.tokens.clamp(min=0), res.num_emitted, host["num_emitted"])
        self._tick(clock)
        return res, n, tree.draft_forwards, host

    # ------------------------------------------------------------------ adaptive speculation
    def calibrate(
        self,
        rows: Sequence[int] | None = None,
        context: int = 64,
        repeats: int = 3,
        prompts: Sequence[Sequence[int]] | None = None,
        cycles: int = 3,
        span: int = 64,
        repeat: int = 2,
    ):
        """Measure a ``CostModel`` on this engine's models: whole rounds drafting k = 0 .. K tokens for
        about each live batch size in ``rows`` (default 1, 4, 16, ... up to max_batch_size), as groups of
        up to 8 rows sharing a prompt (a GRPO batch).  The prompts are ``prompts`` where given (the first
        ``generate`` call calibrates on its own, so context lengths and the drafter's acceptance, which
        sets how many pairs a round absorbs, are the workload's), else random ones of ``context`` tokens.

        A run is one call whose rounds cycle through k = 0 .. K ``cycles`` times, or more to decode at
        least ``span`` tokens a row, each k ``repeat`` rounds in a row of which only the last is timed
        (``CycleK``; every row live throughout, the first round left out): a round's drafter absorbs
        what the round before it kept, so the timed round costs what a run at its k costs.  Cycling one
        round a k made k = 1 absorb K's pairs (passing up) and K absorb k = 1's (passing down), which
        priced k = 1 above a run at k = 1 by up to 15% relative to the other k's in some readings on
        this CPU (``bench/calibration_bias.py``).  The context grows along a run,
        so the rounds give the seconds a slot of cache width adds (``CostModel.per_slot``): the plain
        step's own figure (``context_slope``: the median slope between two rounds of one run) and one
        line in k fitted to the pairs of rounds of every k >= 1 at once (``context_line``): a round
        drafting k reads the cache k + 1 times in the target's block and once per draft step in the
        drafter, so a slot costs more the longer the chain.  One figure pooled over every k >= 1 (the
        model before 2026-12-04) prices K's context low and k = 1's high, and at the wide caches late in
        a call leans the choice toward long chains; a line through each k's own median (2026-12-04)
        leaned on nine pairs a k, and a high k read as low as 0 in three calibrations of six.
        ``bench/context_slope.py --calibrations 8`` (2026-12-04, the same rounds read both ways): the
        joint line's median CV across calibrations 0.30 against 0.34 at 128 rows (strict), 0.37
        against 0.32 at 32 rows (mars), mean error against the line over all 8 calibrations' rounds
        0.30 against 0.36 and 0.34 against 0.33: a single calibration's line is uncertain by about a
        third either way on this CPU.  A run's figure
        for k is the median of its timed rounds at k with their context taken off, and each k's figure
        is the lower quartile of its runs' (``CostModel.add_run``; the least of up to four).  A
        round's time varies little within a run, but a shared machine slows whole seconds at a time:
        with every k measured within the same second, such a spell moves all k's alike, and as it
        only ever adds time the least run is the steady cost, the one that ranks the k's.  The runs
        sweep k up and down in turn.  On a GPU a round already ends in the engine's one device -> host
        copy, so wall time per round is device time."""
        if repeat < 1 or cycles < 1:
            raise ValueError(
                f"calibrate: repeat and cycles must be >= 1, got repeat={repeat}, cycles={cycles}"
            )
        top = self.config.max_batch_size
        rows = sorted(set(rows or [*(4**i for i in range(8) if 4**i < top), top]))
        costs = CostModel()
        gen = torch.Generator().manual_seed(0)
        given = [list(p) for p in prompts] if prompts else None
        saved = self.stats
        ks = list(range(self._k_max + 1))
        for want in rows:
            group = min(8, want)
            n = max(want // group, 1)
            if given:
                batch = [given[i % len(given)] for i in range(n)]
            else:
                batch = torch.randint(0, self.vocab_size, (n, context), generator=gen).tolist()
            r = n * group
            self._generate(batch, SamplingParams(max_new_tokens=2, n=group, ignore_eos=True), FixedK(0))
            runs = self.calibration_runs(batch, group, repeats, cycles, span, repeat)
            # the plain step's own slope and one line in k through every k >= 1's pairs (``context_line``)
            costs.per_slot[r] = context_line({k: [run[k] for run in runs if k in run] for k in ks})
            slopes = costs.slot_seconds_upto(r, ks[-1])  # as the model reads them
            for rounds in runs:
                for k, points in sorted(rounds.items()):
                    costs.add_run(r, k, statistics.median(t - slopes[k] * w for w, t in points))
        self.stats = saved
        return costs

    def calibration_runs(
        self,
        batch: Sequence[Sequence[int]],
        group: int,
        repeats: int = 3,
        cycles: int = 3,
        span: int = 64,
        repeat: int = 2,
        seed: int = 0,
    ) -> list[dict[int, list[tuple[int, float]]]]:
        """The timed rounds of ``calibrate``'s runs at one batch size (``batch`` prompts, ``group`` rows
        each), one dict a run: k -> [(cache width, seconds), ...] of the rounds timed with every row
        live.  Run i cycles k = 0 .. K (down for odd i) with sampling seed ``seed + i``; see
        ``calibrate`` for cycles, span and repeat.  Leaves ``stats`` as the last run's."""
        ks = list(range(self._k_max + 1))
        per_pass = repeat * sum(k + 1 for k in ks)  # tokens a row decodes at most in one pass over ks
        cycles = max(cycles, math.ceil(span / per_pass))
        new = cycles * per_pass + ks[-1] + 1  # no row can finish before the cycles end
        rows = len(batch) * group
        runs = []
        for rep in range(repeats):
            sp = SamplingParams(max_new_tokens=new, n=group, ignore_eos=True, seed=seed + rep)
            plan = CycleK(ks if rep % 2 == 0 else ks[::-1], cycles, repeat)
            self._generate(batch, sp, plan)
            rounds: dict[int, list[tuple[int, float]]] = {}
            # a call cut short (a row at the model's context limit) simply has fewer rounds
            for measured, (_, live, k, t, width) in zip(plan.measured, self._totals["trace"], strict=False):
                if measured and live == rows:
                    rounds.setdefault(k, []).append((width, t))
            runs.append(rounds)
        return runs

    # ------------------------------------------------------------------ pieces
    @property
    def _dtype(self) -> torch.dtype:
        return next(self.target.parameters()).dtype

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _clock(self, phase: str):
        """Start timing ``phase`` when profiling (device-synchronised), else None."""
        if not self.config.profile:
            return None
        self._sync()
        return phase, time.perf_counter()

    def _tick(self, clock, width: int | None = None, rows: int = 0) -> None:
        if clock is None:
            return
        self._sync()
        phase, t0 = clock
        dt = time.perf_counter() - t0
        self._totals["time"][phase] += dt
        if width is not None:
            by_width = self._totals["forward_by_width"]
            entry = by_width.setdefault(str(width), dict(calls=0, seconds=0.0, rows=0))
            entry["calls"] += 1
            entry["seconds"] += dt
            entry["rows"] += rows

    def _to_device(self, t: torch.Tensor) -> torch.Tensor:
        """Host -> device (a sync on a GPU unless pinned; counted)."""
        if self.device.type == "cpu":
            return t
        self._totals["host_syncs"] += 1
        return t.to(self.device)

    def _fetch(self, res, n_drafts=None) -> dict[str, list]:
        """The round's record in one device -> host copy: every per-token field of ``res`` and
        num_emitted (and per-row draft counts) packed into one float64 tensor (ids, codes and float32
        values are all exact in float64)."""
        fields = ("tokens", *_RESULT_FIELDS)
        cols = [getattr(res, f).to(torch.float64) for f in fields]
        w = cols[0].shape[1]
        extra = [res.num_emitted.to(torch.float64).unsqueeze(1)]
        if n_drafts is not None:
            extra.append(n_drafts.to(torch.float64).unsqueeze(1))
        # the copy is the one sync; what follows runs on a host array
        packed = torch.cat([*cols, *extra], 1).cpu().numpy()
        self._totals["host_syncs"] += 1
        out = {f: packed[:, i * w : (i + 1) * w] for i, f in enumerate(fields)}
        for f in ("tokens", "provenance"):
            out[f] = out[f].astype(np.int64).tolist()
        out["is_top2"] = out["is_top2"].astype(bool).tolist()
        for f in ("target_logprob", "behavior_logprob", "logit_ratio", "unsupported_mass"):
            out[f] = out[f].tolist()
        out["num_emitted"] = packed[:, len(fields) * w].astype(np.int64).tolist()
        if n_drafts is not None:
            out["num_drafts"] = packed[:, len(fields) * w + 1].astype(np.int64).tolist()
        return out

    def _fetch_plain(self, res) -> dict[str, list]:
        """``_fetch`` of a plain sample (``sample_plain``: one BONUS token a row, b = p, nothing
        unsupported): only its four varying fields cross, the constants are filled in on the host."""
        cols = (res.tokens, res.target_logprob, res.logit_ratio, res.is_top2)
        packed = torch.cat([c.to(torch.float64) for c in cols], 1).cpu().numpy()
        self._totals["host_syncs"] += 1
        bsz = packed.shape[0]
        logp = packed[:, 1:2].tolist()
        return {
            "tokens": packed[:, 0:1].astype(np.int64).tolist(),
            "provenance": [[int(Provenance.BONUS)]] * bsz,
            "target_logprob": logp,
            "behavior_logprob": logp,
            "logit_ratio": packed[:, 2:3].tolist(),
            "is_top2": packed[:, 3:4].astype(bool).tolist(),
            "unsupported_mass": [[0.0]] * bsz,
            "num_emitted": [1] * bsz,
        }

    def _target_hidden(self, ids, pos, mask, tcache: RaggedCache):
        """Final hidden states [B, T, H] of the target (and the drafter's features when tapped)."""
        from ..drafter import FeatureTap

        def forward():
            # one query a row (plain steps) is transformers' own packed-GQA path already
            with target_attention(self.target) if ids.shape[1] > 1 else contextlib.nullcontext():
                return self.target.model(
                    input_ids=ids, position_ids=pos, attention_mask=mask, cache=tcache.cache, use_cache=True
                ).last_hidden_state

        if self._eagle is None:
            return forward(), None
        # hooks live only for this forward, so the target carries none while a trainer uses it
        with FeatureTap(self.target, self.drafter.config.aux_layer_ids) as tap:
            hidden = forward()
            return hidden, tap.features()

    def _lm_head(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits [..., V] in float32 of the verify positions."""
        head = self.target.lm_head
        if not self._fp32_head:
            return head(hidden).float()
        return fp32_linear(hidden, head.weight, getattr(head, "bias", None))

    def _record(self, rows, host: dict, sampling, eos, totals, drafted) -> list[tuple[int, _Row]]:
        """Append each row's emitted tokens until it finishes; returns the rows still active.

        host: the round's record on the host (``_fetch``).  drafted: None for the prefill's token, else
        the drafts verified this round (an int for every row, or a list with one count per row)."""
        stop = set(sampling.stop_token_ids)
        active = []
        for b, row in enumerate(rows):
            n = host["num_emitted"][b]
            if drafted is not None:
                n_drafted = drafted if isinstance(drafted, int) else drafted[b]
                row.rounds += 1
                row.drafted += n_drafted
                totals["rounds"] += 1
                totals["drafted"] += n_drafted
            for j in range(n):
                tok = host["tokens"][b][j]
                prov = host["provenance"][b][j]
                row.tokens.append(tok)
                row.record["provenance"].append(prov)
                row.record["target_logprobs"].append(host["target_logprob"][b][j])
                row.record["behavior_logprobs"].append(host["behavior_logprob"][b][j])
                row.record["logit_ratio"].append(host["logit_ratio"][b][j])
                row.record["is_top2"].append(host["is_top2"][b][j])
                row.record["draft_position"].append(j)
                row.record["unsupported_mass"].append(host["unsupported_mass"][b][j])
                if drafted is not None and prov in (Provenance.ACCEPTED, Provenance.RELAXED):
                    row.accepted += 1
                    totals["accepted"] += 1
                    if prov == Provenance.RELAXED:
                        row.relaxed += 1
                        totals["relaxed"] += 1
                totals["tokens"] += 1
                if drafted is not None:  # only kept tokens: those after an EOS / the length cap are dropped
                    totals["tokens_in_rounds"] += 1
                if tok in eos and not sampling.ignore_eos:
                    row.finish = "eos"
                elif tok in stop:
                    row.finish = "stop"
                elif len(row.tokens) >= sampling.max_new_tokens:
                    row.finish = "length"
                elif self.max_seq_len is not None and len(row.prompt) + len(row.tokens) >= self.max_seq_len:
                    row.finish = "length"  # the context is full (``_round`` never emits past it)
                if row.finish:
                    break
            if row.finish is None:
                active.append((b, row))
        return active

    def _round_width(self) -> int:
        """Positions one more round may occupy beyond the committed sequence."""
        if self.drafter is None:
            return 1
        if self.config.tree is not None:
            return self.config.tree.depth + 2
        return self._k_max + 1

    def _trajectory(self, row: _Row, sampling: SamplingParams) -> Trajectory:
        return Trajectory(
            prompt_ids=list(row.prompt),
            completion_ids=row.tokens,
            finish_reason=row.finish or "length",
            rule=self.config.rule if self.drafter is not None else "strict",
            theta=self.config.theta,
            relax_prob=self.config.relax_prob,
            stats=dict(rounds=row.rounds, drafted=row.drafted, accepted=row.accepted, relaxed=row.relaxed),
            **row.record,
        )

    def _eos_ids(self, sampling: SamplingParams) -> set[int]:
        eos = sampling.eos_token_id
        if eos is None:
            gen_cfg = getattr(self.target, "generation_config", None)
            eos = getattr(gen_cfg, "eos_token_id", None) if gen_cfg is not None else None
            if eos is None:
                eos = getattr(self.target.config, "eos_token_id", None)
        if eos is None:
            return set()
        return {int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])}

    def _check_prompts(self, prompt_ids) -> list[list[int]]:
        if isinstance(prompt_ids, torch.Tensor) or not isinstance(prompt_ids, Sequence) or not prompt_ids:
            raise ValueError("prompt_ids must be a non-empty list of token-id lists")
        out = []
        for i, p in enumerate(prompt_ids):
            p = [int(t) for t in p]
            if not p:
                raise ValueError(f"prompt_ids[{i}] is empty")
            bad = [t for t in p if not 0 <= t < self.vocab_size]
            if bad:
                raise ValueError(f"prompt_ids[{i}] has ids outside [0, {self.vocab_size}): {bad[:5]}")
            if self.max_seq_len is not None and len(p) + 1 > self.max_seq_len:
                raise ValueError(
                    f"prompt_ids[{i}] has {len(p)} tokens; the model's context is {self.max_seq_len}"
                )
            out.append(p)
        return out


class _EagleState:
    """The EAGLE-3 drafter's side of the engine: its ragged KV cache and the committed input pairs
    (target feature at position t, token t+1) it has not processed yet."""

    def __init__(self, drafter, window: int | None = None):
        self.drafter = drafter
        self.window = window
        self.clear()

    def clear(self) -> None:
        """Drop the batch's cache and pending pairs (nothing stays on the device between batches)."""
        self.cache: RaggedCache | None = None
        self.feats = self.tokens = self.counts = self.skipped = None
        self._owned = False  # feats / tokens are a buffer of our own (appends may write into it)
        self.counts_host: list[int] = []
        # plain steps' pairs (feats [B, n, 3Ht], tokens [B, n]), one pair a row each, pending after
        # the ones in feats / tokens and not counted in counts; written there at once by ``_flush``
        self.tail: list[tuple[torch.Tensor, torch.Tensor]] = []
        # the live rows' places in the tail's rows (None: the same rows): rows that finish during a plain
        # run stay in the tail until it is written (``select`` only composes this index)
        self.tail_rows: torch.Tensor | None = None
        self.skipped_pairs = 0  # pairs left out by the window over the batch (host count)
        self.plain_steps = 0  # plain steps since the drafter last absorbed (each left a pair a row)
        # the prompt pass not run yet (``start(defer=True)``): the prompts' pairs (feats, tokens, counts,
        # counts_host, capacity), one row a prompt, and each live row's prompt among them
        self.deferred: tuple | None = None
        self.prompt_of: list[int] = []

    def start(self, bsz, dev, feats, tokens, counts, counts_host, capacity: int, defer: bool = False) -> None:
        """A batch of ``bsz`` prompts whose pairs (feats [B, P, 3Ht], tokens [B, P], the first counts[b]
        of each row) are pending.  ``defer`` (the engine's prefill): keep them aside instead, and start
        every row with an empty cache and nothing pending; ``prompt_pass``, or else the first ``absorb``,
        runs the pass for the prompts still live.  Rows may be copied (``select``) before that: the
        prompts stay one a prompt."""
        self.cache = RaggedCache(bsz, dev, capacity=capacity)
        self.skipped = torch.zeros(bsz, dtype=torch.long, device=dev)
        if not defer:
            self.pend(feats, tokens, counts, counts_host)
            return
        self.deferred = (feats, tokens, counts, list(counts_host), capacity)
        self.prompt_of = list(range(bsz))
        self.feats = self.tokens = None
        self.counts, self.counts_host = torch.zeros_like(counts), [0] * bsz

    def prompt_pass(self) -> None:
        """The prompt pass set aside by ``start(defer=True)``: the drafter absorbs the pairs of the
        prompts the live rows came from, each prompt once (a GRPO group's rows share one), and every row
        gets a copy of its prompt's cache, under what it has absorbed since (nothing: this runs before
        its first absorb).  The engine runs it at the prefill when the first round drafts, else the
        first ``absorb`` does, over fewer prompts when groups have finished by then."""
        if self.deferred is None:
            return
        feats, tokens, counts, counts_host, capacity = self.deferred
        self.deferred = None
        live = sorted(set(self.prompt_of))
        dev = counts.device
        if len(live) < len(counts_host):
            pick = torch.tensor(live, device=dev)
            feats, tokens, counts = feats[pick], tokens[pick], counts[pick]
            counts_host = [counts_host[p] for p in live]
        prompts = _EagleState(self.drafter, self.window)
        prompts.start(len(live), dev, feats, tokens, counts, counts_host, capacity)
        if max(counts_host) > 0:
            prompts.absorb()
        place = {p: i for i, p in enumerate(live)}
        src_host = [place[p] for p in self.prompt_of]
        skipped = prompts.skipped
        if src_host != list(range(len(live))):  # rows share a prompt, or some have finished
            src = torch.tensor(src_host, device=dev)
            prompts.cache.select(src, src_host)
            skipped = skipped[src]
        self.cache = prompts.cache
        self.skipped = self.skipped + skipped
        self.skipped_pairs += prompts.skipped_pairs
        self.prompt_of = []

    @property
    def positions(self) -> torch.Tensor:
        """[B] each row's next position: the pairs in its cache and the pairs the window skipped."""
        return self.cache.lengths + self.skipped

    def pend(self, feats, tokens, counts, counts_host, append: bool = False) -> None:
        """feats [B, P, 3Ht], tokens [B, P]: the first counts[b] pairs of each row are new and committed.
        ``append``: add them after the pairs still pending (a plain step drafts nothing, so the drafter
        absorbs its pair with the next round's; ``pend_plain`` is the engine's way for one pair a row).
        Appended pairs go into a buffer of the engine's own with room to spare."""
        if not (append and self.feats is not None and (self.tail or max(self.counts_host, default=0) > 0)):
            self.feats, self.tokens, self.counts, self.counts_host = feats, tokens, counts, list(counts_host)
            self._owned = False  # the round's own tensors: never written into
            self.tail, self.tail_rows = [], None
            return
        self._flush()
        self._append(feats, tokens, counts, counts_host)

    def pend_plain(self, feats, tokens) -> None:
        """A plain step's pairs, one a row (feats [B, 1, 3Ht], tokens [B, 1]), pending after the rest.
        Only kept (``tail``): the run's pairs are written into the pending block once, when the drafter
        needs them (``_flush``).  Writing each step's pair into the growing buffer (``pend(...,
        append=True)``) cost a 128-row plain step 1.3 ms of commit on this CPU, about 3% of the step
        (2026-12-05, a throwaway script); kept aside, auto's commit phase over 635 all-plain steps at 128
        rows took 0.065 s against the plain engine's 0.052 s (``bench/plain_steps.py``, 2026-12-05 late)."""
        if self.tail_rows is not None:  # rows have finished since the run began: into the tail's rows
            n = self.tail[0][1].shape[0]
            f, t = feats.new_zeros(n, *feats.shape[1:]), tokens.new_zeros(n, *tokens.shape[1:])
            f[self.tail_rows], t[self.tail_rows] = feats, tokens
            feats, tokens = f, t
        self.tail.append((feats, tokens))
        self.plain_steps += 1
        if self.window is not None and len(self.tail) >= 2 * self.window:
            self._flush()  # which trims to the window: a long plain run stays bounded in memory

    @property
    def debt(self) -> int:
        """The plain steps' pairs the next speculative round absorbs first, over all rows (a window
        bounds them): what switching to drafting owes."""
        steps = min(self.plain_steps, self.window) if self.window is not None else self.plain_steps
        owed = steps * len(self.counts_host)
        if self.deferred is not None:  # and the prompt pass, once a live prompt
            pairs, w = self.deferred[3], self.window
            owed += sum(min(pairs[p], w) if w is not None else pairs[p] for p in set(self.prompt_of))
        return owed

    def _flush(self) -> None:
        """Write the plain steps' pairs (``tail``) after each row's pending pairs, in one go."""
        if not self.tail:
            return
        feats, tokens = self._tail_block()
        self.tail, self.tail_rows = [], None
        bsz, n = tokens.shape
        # through pend: where nothing else is pending (all absorbed) the block replaces the old one
        counts = torch.full((bsz,), n, dtype=torch.long, device=tokens.device)
        self.pend(feats, tokens, counts, [n] * bsz, append=True)

    def _tail_block(self) -> tuple[torch.Tensor, torch.Tensor]:
        if len(self.tail) == 1:
            feats, tokens = self.tail[0]
        else:
            feats, tokens = torch.cat([f for f, _ in self.tail], 1), torch.cat([t for _, t in self.tail], 1)
        if self.tail_rows is not None:
            feats, tokens = feats[self.tail_rows], tokens[self.tail_rows]
        return feats, tokens

    def _append(self, feats, tokens, counts, counts_host) -> None:
        p = feats.shape[1]
        need = max(o + c for o, c in zip(self.counts_host, counts_host, strict=True))
        if need > self.feats.shape[1] and self.window is not None and max(self.counts_host) > self.window:
            self._trim()  # no room: drop what the window would drop anyway
            need = max(o + c for o, c in zip(self.counts_host, counts_host, strict=True))
        if not self._owned or need > self.feats.shape[1]:
            room = max(need, 2 * (self.window or need))
            held = max(self.counts_host)
            f = feats.new_zeros(feats.shape[0], room + p, feats.shape[2])
            t = tokens.new_zeros(tokens.shape[0], room + p)
            f[:, :held] = self.feats[:, :held]
            t[:, :held] = self.tokens[:, :held]
            self.feats, self.tokens, self._owned = f, t, True
        at = self.counts.unsqueeze(1) + torch.arange(p, device=counts.device)  # [B, P]
        self.feats.scatter_(1, at.unsqueeze(-1).expand(-1, -1, self.feats.shape[2]), feats)
        self.tokens.scatter_(1, at, tokens)
        self.counts = self.counts + counts
        self.counts_host = [o + c for o, c in zip(self.counts_host, counts_host, strict=True)]

    def _trim(self) -> None:
        """Keep each row's last ``window`` pending pairs (a run of plain steps in the adaptive mode
        left more): the older ones are never absorbed, and the row's positions count them (``skipped``).
        Without it a plain step would cost the drafter a step's worth of work later (absorbing 15 pairs
        at 128 rows took a round from 141 to 282 ms on this CPU, 2026-12-03)."""
        w = self.window
        keep = self.counts.clamp(max=w)
        drop = self.counts - keep
        at = (drop.unsqueeze(1) + torch.arange(w, device=drop.device)).clamp(max=self.feats.shape[1] - 1)
        self.feats = self.feats.gather(1, at.unsqueeze(-1).expand(-1, -1, self.feats.shape[2]))
        self.tokens = self.tokens.gather(1, at)
        self._owned = True
        self.counts, self.skipped = keep, self.skipped + drop
        self.skipped_pairs += sum(max(c - w, 0) for c in self.counts_host)
        self.counts_host = [min(c, w) for c in self.counts_host]

    def select(self, rows, rows_host, at=None) -> None:
        if self.tail:  # the run's pairs stay where they are; only the index to the kept rows moves
            self.tail_rows = rows if self.tail_rows is None else self.tail_rows[rows]
        self.cache.select(rows, rows_host, at)
        if self.deferred is not None:
            self.prompt_of = [self.prompt_of[i] for i in rows_host]
        self.counts_host = [self.counts_host[i] for i in rows_host]
        if max(self.counts_host, default=0) > 0:
            self.feats, self.tokens = self.feats[rows], self.tokens[rows]
            self._owned = True  # copies
        else:  # all absorbed (after the prompt pass): nothing to carry, the next pend replaces them
            self.feats = self.tokens = None
        self.counts, self.skipped = self.counts[rows], self.skipped[rows]

    @property
    def dtype(self):
        return self.drafter.fc.weight.dtype

    def absorb(self):
        """Run the drafter over the pending committed pairs; returns (hidden [B, H], logits [B, Vd])
        at each row's last pair, i.e. the state that predicts the first draft token."""
        self.prompt_pass()
        self._flush()
        if self.window is not None and max(self.counts_host) > self.window:
            self._trim()
        dev = self.counts.device
        bsz = self.counts.shape[0]
        width = max(self.counts_host)
        feats, tokens = self.feats[:, :width], self.tokens[:, :width]
        new_ok = torch.arange(width, device=dev) < self.counts.unsqueeze(1)  # [B, P]
        causal = torch.ones(width, width, dtype=torch.bool, device=dev).tril()
        mask = self.cache.attention_mask(causal.unsqueeze(0) & new_ok.unsqueeze(1), self.dtype)
        pos = self.positions.unsqueeze(1) + torch.arange(width, device=dev)
        start = self.cache.width
        hidden = self.drafter.step_hidden(
            tokens, self.drafter.fuse(feats.to(self.dtype)), pos, self.cache.cache, mask
        )
        order = torch.arange(width, device=dev).expand(bsz, width)
        self.cache.commit(start, order, self.counts, self.counts_host, in_order=True)
        rows = torch.arange(bsz, device=dev)
        h = hidden[rows, self.counts - 1]
        lg = self.drafter.head(h)  # the head at each row's last pair only
        self.counts_host = [0] * bsz  # absorbed
        self.plain_steps = 0
        return h, lg

    def step(self, tokens, hidden, depth_offset: int, mask):
        """One speculative draft step: tokens [B, M], hidden [B, M, H] at positions lengths + offset,
        under the additive ``mask`` [B, 1, M, S].  Appends M uncommitted entries (visible to later steps).
        Returns (logits [B, M, Vd], hidden)."""
        m = tokens.shape[1]
        pos = (self.positions + depth_offset).unsqueeze(1).expand(-1, m)
        return self.drafter(tokens, hidden, pos, self.cache.cache, mask)

    def draft_chain(self, k: int, sampling: SamplingParams, mode: str, gen, confidence: float = 0.0):
        """Up to K chain drafts per row: (tokens [B, K'] target ids, draft_probs [B, K', V] or None,
        counts [B] or None).

        With ``confidence`` > 0 a row stops once the draft's probability of its chain so far (greedy
        drafts: the product of the head's top-token probabilities, softmax at the sampling temperature,
        or at 1 when T = 0; sampled drafts: the product of q(x)) is below it: its count is the drafts up
        to and including that token.  Drafting ends when every row has stopped (K' <= K, the most any
        row kept); columns past a row's count are drafted in lockstep but are not part of its chain.
        counts is None when off."""
        h, lg = self.absorb()
        committed = self.cache.width
        mask = self.cache.lockstep_mask(k, self.dtype)  # [B, 1, 1, committed + k], sliced per step
        temperature = sampling.temperature
        greedy = mode == "greedy" or temperature == 0
        bsz = lg.shape[0]
        if confidence > 0:
            log_floor = math.log(confidence)
            log_chain = torch.zeros(bsz, device=lg.device)  # log-probability of each row's chain so far
            going = torch.ones(bsz, dtype=torch.bool, device=lg.device)
            counts = torch.zeros(bsz, dtype=torch.long, device=lg.device)
        toks, probs = [], []
        for j in range(k):
            if greedy:
                best = lg.argmax(-1)
                tok = self.drafter.target_token_ids[best]
                if confidence > 0:
                    scaled = lg / temperature if temperature not in (0, 1) else lg
                    top = scaled.gather(-1, best.unsqueeze(-1)).squeeze(-1)
                    tok_logp = top - scaled.logsumexp(-1)
            else:
                q = self.drafter.draft_logits_to_target_probs(lg, temperature).float()
                u = torch.rand(q.shape[0], dtype=torch.float64, device=q.device, generator=gen)
                tok = sample_from_weights(q, u)
                probs.append(q)
                if confidence > 0:
                    tok_logp = q.gather(-1, tok.unsqueeze(-1)).squeeze(-1).log()
            toks.append(tok)
            if confidence > 0:
                counts += going  # token j belongs to every row still drafting
                log_chain += tok_logp
                going &= log_chain >= log_floor
                if not bool(going.any()):  # one host sync per step
                    break
            if j + 1 < k:
                step_mask = mask[..., : committed + j + 1]
                lgs, hs = self.step(tok.unsqueeze(1), h.unsqueeze(1), j, step_mask)
                h, lg = hs[:, 0], lgs[:, 0]
        self.cache.crop(committed)  # drop the speculative entries
        return (
            torch.stack(toks, 1),
            (torch.stack(probs, 1) if probs else None),
            (counts if confidence > 0 else None),
        )
