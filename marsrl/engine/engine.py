"""The batched speculative engine: a Hugging Face causal LM as the target, an EAGLE-3 head (or any object
with a ``propose`` method) as the drafter, the verification core deciding every token, and a per-token
record of how each completion token was produced.

One round for every active sequence (all advance together, each by its own accepted length):

    k       = planner.choose(live rows, cache width, ...)    a fixed K, or "auto" (adaptive/)
    drafts  = drafter(committed prefix)                     k tokens (chain) or a tree of nodes
    logits  = target([last, drafts], cached prefix)          one forward, [B, K+1, V] (tree: [B, N+1, V])
    result  = verify_chain / verify_tree(logits, drafts)     accepted drafts + one closing token
    commit    the accepted entries of both KV caches (RaggedCache); the closing token becomes ``last``

``drafter=None`` is plain autoregressive sampling through the same code (one token per forward); it is
the reference path.  Finished sequences (EOS, a stop id, max_new_tokens, the context's end
``max_seq_len``, which a speculative row reaches exactly, as a plain one does) leave the batch at once.

Where the rest lives: the drafter's per-call state (``eagle_state.py``), trees (``tree.py``), the
caches (``cache.py``), the host record (``record.py``), adaptive K (``adaptive/``), phase profiling
(``profile.py``).  GPU habits: both KV caches are preallocated ragged buffers written in place; the
target's chain / tree forwards attend without repeating KV heads (``attention.py``); a round reads the
device back once (its record, packed in one tensor, plus the verify core's one batched data check), and
every host decision after it (widths, commits, which rows finished) uses that copy; verify logits of
bf16 / fp16 targets come out of the lm_head in float32 (``logits.py``).  docs/engine.md has the design.

Deliberately left out: paged caches, CUDA graphs, sliding-window attention (a model whose sliding window
is shorter than prompt + completion is refused), continuous batching of new requests.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence

import torch

from ..prompts import check_prompts
from ..trajectory import Trajectory
from ..verify import sample_plain, verify_chain, verify_tree
from .adaptive import Carried, CostModel, FixedK, KPlanner
from .adaptive import calibration as _calibration
from .attention import check_attention, target_attention
from .cache import RaggedCache, fill_order, moved_places
from .config import EngineConfig, SamplingParams
from .eagle_state import EagleState
from .logits import fp32_linear, lm_head_logits
from .profile import NO_PHASES, PhaseClock
from .record import Row, fetch, fetch_plain, record, trajectory
from .tree import draft_tree

# the drafter's state under its old name here (benches patch its methods through this module)
_EagleState = EagleState

__all__ = ["SpeculativeEngine", "fp32_linear"]


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
        self.cost_model: CostModel | None = cost_model
        self._carry = Carried()  # "auto": what each call's planner hands the next
        self._eagle: EagleState | None = None
        self._phase = NO_PHASES
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
            self._eagle = EagleState(drafter, self.config.drafter_window or None)
        if self.config.draft_confidence > 0 and drafter is not None and self._eagle is None:
            raise ValueError("draft_confidence needs an Eagle3Drafter (a propose() drafter reports none)")
        if self.config.tree is not None and drafter is not None and self._eagle is None:
            raise ValueError("tree drafting needs an Eagle3Drafter (a propose() drafter only drafts chains)")
        window = getattr(target.config, "sliding_window", None)
        if window and getattr(target.config, "use_sliding_window", True) and self.max_seq_len:
            self.max_seq_len = min(self.max_seq_len, window)
        # verify-position logits in fp32 for half-precision targets (``logits.fp32_linear``)
        self._fp32_head = self._dtype in (torch.float16, torch.bfloat16) and self.config.fp32_logits
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
        adaptive = self._auto and self.drafter is not None
        if not adaptive:  # a fixed K (k = 0 without a drafter: every round a plain step)
            return self._generate(prompts, sampling, FixedK(self._k_max if self.drafter is not None else 0))
        if self.cost_model is None:  # measured once, on this call's prompts
            self.cost_model = self.calibrate(prompts=prompts)
        cfg = self.config
        planner = self._carry.planner(
            self.cost_model,
            cfg.max_draft_tokens,
            sampling.max_new_tokens,
            adapt=cfg.adapt_costs,
            speed_check=cfg.speed_check,
            row_prior=self.row_prior,
            factory=KPlanner,  # looked up here, so a bench can put a recording subclass in its place
        )
        out = self._generate(prompts, sampling, planner)
        if cfg.adapt_costs:
            self.cost_model.observe(self.stats["trace"])
            self.stats.update(self._carry.keep(planner, [len(t.completion_ids) for t in out]))
        return out

    def calibrate(
        self,
        rows: Sequence[int] | None = None,
        context: int = 64,
        repeats: int = 3,
        prompts: Sequence[Sequence[int]] | None = None,
        cycles: int = 3,
        span: int = 64,
        repeat: int = 2,
    ) -> CostModel:
        """Measure a ``CostModel`` on this engine's models (``adaptive.calibration.calibrate``)."""
        return _calibration.calibrate(self, rows, context, repeats, prompts, cycles, span, repeat)

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
        """The timed rounds of a calibration's runs at one batch size
        (``adaptive.calibration.calibration_runs``)."""
        return _calibration.calibration_runs(self, batch, group, repeats, cycles, span, repeat, seed)

    # ------------------------------------------------------------------ one call
    def _generate(self, prompts: list[list[int]], sampling: SamplingParams, planner) -> list[Trajectory]:
        """Decode checked ``prompts`` in batches of max_batch_size, each round's k from ``planner``."""
        eos = self._eos_ids(sampling)
        gen = torch.Generator(device=self.device).manual_seed(sampling.seed)
        rows = [Row(i, p, i * sampling.n + j) for i, p in enumerate(prompts) for j in range(sampling.n)]
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
        self._phase = PhaseClock(totals, self.device) if self.config.profile else NO_PHASES
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
        return [trajectory(r, self.config, self.drafter is not None) for r in rows]

    # ------------------------------------------------------------------ one batch
    def _run_batch(self, rows: list[Row], sampling: SamplingParams, eos: set[int], gen, totals, planner):
        tcache, last, k_next, host = self._prefill(rows, sampling, gen, planner)
        active = record(rows, host, sampling, eos, totals, None, self.max_seq_len)
        while active:
            if len(active) < len(rows):
                rows, last = self._drop_finished(rows, active, tcache, last)
            context = tcache.width  # slots every row's attention reads this round
            room = self._room(rows)
            k, k_next = k_next, None
            if k is None:
                k = self._choose(planner, rows, context, room, sampling)
            round_start = time.perf_counter()
            res, drafted, n_forwards, host = self._round(rows, last, tcache, sampling, gen, k, room)
            totals["target_forwards"] += 1
            totals["draft_forwards"] += n_forwards
            last = res.tokens.gather(1, (res.num_emitted - 1).unsqueeze(1)).squeeze(1)
            with self._phase("record"):
                kept = totals["tokens"]
                active = record(rows, host, sampling, eos, totals, drafted, self.max_seq_len)
                totals["tokens_per_round"].append(totals["tokens"] - kept)
            width = drafted if isinstance(drafted, int) else max(drafted)
            totals["k_per_round"].append(width)
            if width:  # a plain step drafted nothing: no acceptance to learn
                per_row = [drafted] * len(rows) if isinstance(drafted, int) else drafted
                planner.observe(per_row, [n - 1 for n in host["num_emitted"]], keys=[r.serial for r in rows])
            seconds = time.perf_counter() - round_start
            totals["trace"].append([round_start - self._t0, len(rows), width, seconds, context])
            planner.timed(seconds)
            if planner.exhausted:  # a calibration run has what it needs
                break
        totals["cache_bytes_copied"] += tcache.bytes_copied
        if self._eagle is not None:
            totals["cache_bytes_copied"] += self._eagle.cache.bytes_copied
            totals["drafter_pairs_skipped"] += self._eagle.skipped_pairs
            self._eagle.clear()  # nothing of the batch stays on the device after it

    def _prefill(self, rows: list[Row], sampling: SamplingParams, gen, planner):
        """The prompts' forward and each row's first token: (target cache, last token [B], the first
        round's k, the token's host record).

        The prefill runs once per distinct prompt (a GRPO group's G rows share one) and its KV entries,
        last logits and features are copied to the group's rows: the same numbers, G times less compute.
        The first round's k is chosen here (every row, the prompt's width, nothing owed): a plain first
        round defers the drafter's prompt pass to the first speculative round, which may never come."""
        dev = self.device
        bsz = len(rows)
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
        with self._phase("prefill"):
            mask = tcache.attention_mask(causal.unsqueeze(0) & keys_ok.unsqueeze(1), self._dtype)
            pos = (slots - pad.unsqueeze(1)).clamp(min=0)
            hidden, feats = self._target_hidden(ids, pos, mask, tcache)
            self._totals["target_forwards"] += 1
            tcache.set_rows(pad, lens.clone(), pad_host, lens_host)
            logits = self._lm_head(hidden[:, -1])
            k_next = planner.choose(bsz, width, 0, 0.0)
            if self._eagle is not None:
                # the drafter's input pairs (feature at t, token t+1) within the prompt, left-aligned per
                # row (pair i of row b comes from slot pad[b] + i), set aside one a distinct prompt and
                # absorbed by the prompt pass (below, or at the first speculative round when the first is
                # plain, then for the live prompts only); the last pair (the last prompt feature, the
                # first sampled token) waits for the first round
                at = (pad.unsqueeze(1) + slots).clamp(max=width - 1)  # [P, L]
                pair_feats = feats.gather(1, at.unsqueeze(-1).expand(-1, -1, feats.shape[-1]))
                pair_tokens = ids.gather(1, (at + 1).clamp(max=width - 1))
                inside = [n - 1 for n in lens_host]
                self._eagle.start(
                    n_pre, dev, pair_feats, pair_tokens, lens - 1, inside, width + room, defer=True
                )
                last_feats = feats[:, -1:]  # [P, 1, 3Ht]
            if n_pre < bsz:  # copy each prompt's state to its rows
                src = self._to_device(torch.tensor(src_host))
                tcache.select(src, src_host)
                logits = logits.index_select(0, src)
                if self._eagle is not None:
                    self._eagle.select(src, src_host)
                    last_feats = last_feats.index_select(0, src)
            kw = dict(temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p)
            first = sample_plain(logits, **kw, generator=gen)
            last = first.tokens[:, 0]
            if self._eagle is not None:
                ones = torch.ones(bsz, dtype=torch.long, device=dev)
                self._eagle.pend(last_feats, last.unsqueeze(1), ones, [1] * bsz)
                if k_next != 0:  # the first round drafts: the prompt pass now, not timed as part of it
                    self._eagle.prompt_pass()
            host = fetch_plain(first, self._totals)
        return tcache, last, k_next, host

    def _drop_finished(self, rows: list[Row], active, tcache: RaggedCache, last: torch.Tensor):
        """The live rows and their last tokens, after the finished rows left both caches: the rows that
        left give their places to rows from the end of the batch (one row's copy a finish, where keeping
        the order moved every row after the first that left)."""
        keep_host = fill_order([b for b, _ in active])
        moved = moved_places(keep_host)  # the places that take another row, for both caches
        sent = self._to_device(torch.tensor(keep_host + moved))  # one copy for both
        keep, at = sent.split([len(keep_host), len(moved)])
        tcache.select(keep, keep_host, at)
        last = last[keep]
        if self._eagle is not None:
            self._eagle.select(keep, keep_host, at)
        return [rows[b] for b in keep_host], last

    def _choose(self, planner, rows: list[Row], context: int, room, sampling: SamplingParams) -> int:
        """The planner's k for this round: the live rows, the cache width, the plain-step pairs the drafter
        owes (and the rows' mean tokens so far, with them), and each live row by name with the tokens it
        may still make (for the live rows' acceptance)."""
        debt = self._eagle.debt if self._eagle is not None else 0
        made = sum(len(r.tokens) for r in rows) / len(rows) if debt else 0.0
        keys = [r.serial for r in rows]
        left = [sampling.max_new_tokens - len(r.tokens) for r in rows]
        if room is not None:
            left = [min(n, m) for n, m in zip(left, room, strict=True)]
        return planner.choose(len(rows), context, debt, made, keys=keys, left=left)

    def _room(self, rows) -> list[int] | None:
        """The tokens each live row may still make within ``max_seq_len``, where some row has less room
        than a round may emit (else None: no row near the context's end, nothing to cap)."""
        if self.max_seq_len is None or self.drafter is None:
            return None
        room = [self.max_seq_len - len(r.prompt) - len(r.tokens) for r in rows]
        return room if min(room) < self._round_width() else None

    # ------------------------------------------------------------------ one round
    def _round(self, rows, last, tcache: RaggedCache, sampling: SamplingParams, gen, k: int, room=None):
        """One round: (VerifyResult-like, drafted per row, draft forwards, host record).

        k: the planner's chain length (0 = a plain step).  room: the tokens each row may still make
        within ``max_seq_len`` (``_room``; None: every row has a round's room).  A row near the
        context's end verifies only the drafts it can keep, so it stops at ``max_seq_len`` exactly, as
        plain decoding does, and no kept token sits past it; a tree that does not fit every row takes a
        plain step."""
        kw = dict(temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p, generator=gen)
        caps = None  # the most drafts each row may keep, where the context's end cuts some row's chain
        if room is not None and k != 0:  # (``_room`` is None without a drafter)
            if self.config.tree is not None:
                k = 0 if min(room) < self.config.tree.depth + 1 else k
            else:
                # a chain longer than any row can keep drafts columns nobody verifies: shorten it
                k = min(k, max(room) - 1)
                if min(room) - 1 < k:
                    caps = [n - 1 for n in room]
        if self.drafter is None or k == 0:
            return self._plain_step(last, tcache, kw)
        if self.config.tree is not None:
            return self._tree_round(last, tcache, kw)
        return self._chain_round(rows, last, tcache, sampling, gen, k, caps, kw)

    def _chain_round(self, rows, last, tcache: RaggedCache, sampling, gen, k: int, caps, kw):
        """Draft up to k tokens a row, score [last, drafts] in one target forward, verify, commit."""
        cfg, dev, bsz = self.config, self.device, len(rows)
        with self._phase("draft"):
            drafts, probs, n_drafts, n_forwards = self._draft_chain(rows, k, sampling, gen)
        k = drafts.shape[1]  # every row may have stopped before K
        block = torch.cat([last.unsqueeze(1), drafts], 1)  # [B, K+1]
        pos = tcache.lengths.unsqueeze(1) + torch.arange(k + 1, device=dev)  # [B, K+1]
        if caps is not None:  # rows near the context's end verify only the drafts they can keep
            cap = self._to_device(torch.tensor(caps)).clamp(max=k)
            n_drafts = cap if n_drafts is None else torch.minimum(n_drafts, cap)
            # their columns past it are nobody's: held at the context's last position, so no position
            # past max_seq_len reaches the target (a dynamic RoPE would rescale the whole forward)
            pos = pos.clamp(max=self.max_seq_len - 1)
        causal = torch.ones(k + 1, k + 1, dtype=torch.bool, device=dev).tril().unsqueeze(0)
        mask = tcache.attention_mask(causal, self._dtype)  # [B, 1, K+1, S]
        start = tcache.width
        with self._phase("target_forward", width=k + 1, rows=bsz):
            hidden, feats = self._target_hidden(block, pos, mask, tcache)
        with self._phase("verify"):
            rule = dict(rule=cfg.rule, theta=cfg.theta, relax_prob=cfg.relax_prob)
            res = verify_chain(self._lm_head(hidden), drafts, probs, **rule, num_drafts=n_drafts, **kw)
            host = fetch(res, self._totals, n_drafts)
        with self._phase("commit"):
            order = torch.arange(k + 1, device=dev).expand(bsz, k + 1)
            tcache.commit(start, order, res.num_emitted, host["num_emitted"], in_order=True)
            if self._eagle is not None:
                self._eagle.pend(feats, res.tokens.clamp(min=0), res.num_emitted, host["num_emitted"])
        return res, (host["num_drafts"] if n_drafts is not None else k), n_forwards, host

    def _draft_chain(self, rows, k: int, sampling: SamplingParams, gen):
        """(drafts [B, K'] target ids, draft probs [B, K', V] or None, per-row counts [B] or None,
        drafter forwards): the EAGLE state's chain (rows may stop early under ``draft_confidence``),
        else the ``propose()`` drafter's k tokens a row."""
        if self._eagle is not None:
            cfg = self.config
            drafts, probs, counts = self._eagle.draft_chain(
                k, sampling, cfg.draft_sampling, gen, cfg.draft_confidence
            )
            return drafts, probs, counts, drafts.shape[1]
        seqs = [r.prompt + r.tokens for r in rows]
        return self.drafter.propose(seqs, k).to(self.device).long(), None, None, 0

    def _plain_step(self, last, tcache: RaggedCache, kw):
        """One token a row from one target forward (``sample_plain``); the drafter, if any, absorbs the
        step's pair with the next speculative round."""
        bsz = last.shape[0]
        block = last.unsqueeze(1)
        # rows without padding or gaps (one prompt, or a group sharing it, decoded plainly) need no mask:
        # transformers then takes SDPA's unmasked path with packed GQA, as HF generate does
        mask = None
        # rows ending short of the shared axis (after speculative rounds) write their entry at their own
        # end (``RaggedCache.at_ends``), which spares the commit a move of every row's new entry;
        # ``plain_at_ends`` False keeps the append (the tests' reference)
        in_place = self.plain_at_ends and not tcache.aligned()
        if in_place:
            mask = tcache.ends_mask(self._dtype)
        elif not tcache.dense:
            mask = tcache.attention_mask(
                torch.ones(1, 1, 1, dtype=torch.bool, device=self.device), self._dtype
            )
        start = tcache.width
        at_ends = tcache.at_ends() if in_place else contextlib.nullcontext()
        with self._phase("target_forward", width=1, rows=bsz), at_ends:
            hidden, feats = self._target_hidden(block, tcache.lengths.unsqueeze(1), mask, tcache)
        with self._phase("verify"):
            res = sample_plain(self._lm_head(hidden[:, 0]), **kw)
            host = fetch_plain(res, self._totals)
        with self._phase("commit"):
            if in_place:
                tcache.commit_in_place(res.num_emitted, host["num_emitted"])
            else:
                order = torch.zeros(bsz, 1, dtype=torch.long, device=self.device)
                tcache.commit(start, order, res.num_emitted, host["num_emitted"], in_order=True)
            if self._eagle is not None:
                self._eagle.pend_plain(feats, res.tokens)
        return res, 0, 0, host

    def _tree_round(self, last, tcache: RaggedCache, kw):
        """Draft a tree a row (``draft_tree``), score its N nodes under their ancestors' mask in one
        target forward, verify, and commit the root and the accepted path."""
        dev, cfg = self.device, self.config
        with self._phase("draft"):
            tree = draft_tree(self._eagle, cfg.tree, self._dtype)
        n = tree.tokens.shape[1]
        bsz = last.shape[0]
        block = torch.cat([last.unsqueeze(1), tree.tokens.clamp(min=0)], 1)  # [B, N+1]
        root = torch.zeros(bsz, 1, dtype=torch.long, device=dev)
        pos = tcache.lengths.unsqueeze(1) + torch.cat([root, tree.depth], 1)  # [B, N+1]
        mask = tcache.attention_mask(tree.ancestors, self._dtype)  # [B, N+1, N+1] incl. root
        start = tcache.width
        with self._phase("target_forward", width=n + 1, rows=bsz):
            hidden, feats = self._target_hidden(block, pos, mask, tcache)
        with self._phase("verify"):
            # node probabilities matter only to mars_code (strict/mars treat top-k proposals as q = 1)
            rule = dict(rule=cfg.rule, theta=cfg.theta, relax_prob=cfg.relax_prob)
            res = verify_tree(self._lm_head(hidden), tree.tokens, tree.parents, tree.node_probs, **rule, **kw)
            host = fetch(res, self._totals)
        with self._phase("commit"):
            # keep the root and the accepted nodes, in path order (block index = node + 1)
            path = torch.cat([root, res.path_nodes + 1], 1)
            path = path.clamp(min=0)[:, : res.tokens.shape[1]]
            tcache.commit(start, path, res.num_emitted, host["num_emitted"])
            feats_path = feats.gather(1, path.unsqueeze(-1).expand(-1, -1, feats.shape[-1]))
            self._eagle.pend(feats_path, res.tokens.clamp(min=0), res.num_emitted, host["num_emitted"])
        return res, n, tree.draft_forwards, host

    # ------------------------------------------------------------------ pieces
    @property
    def _dtype(self) -> torch.dtype:
        return next(self.target.parameters()).dtype

    def _to_device(self, t: torch.Tensor) -> torch.Tensor:
        """Host -> device (a sync on a GPU unless pinned; counted)."""
        if self.device.type == "cpu":
            return t
        self._totals["host_syncs"] += 1
        return t.to(self.device)

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
        return lm_head_logits(self.target.lm_head, hidden, self._fp32_head)

    def _round_width(self) -> int:
        """Positions one more round may occupy beyond the committed sequence."""
        if self.drafter is None:
            return 1
        if self.config.tree is not None:
            return self.config.tree.depth + 2
        return self._k_max + 1

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
        """The prompts as lists of ints, checked against this engine's model (``marsrl.prompts``)."""
        return check_prompts(prompt_ids, self.vocab_size, self.max_seq_len)
