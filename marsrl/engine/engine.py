"""The batched speculative engine: a Hugging Face causal LM as the target, an EAGLE-3 head (or any object
with a ``propose`` method) as the drafter, the verification core deciding every token, and a per-token
record of how each completion token was produced.

One round for every active sequence (all advance together, each by its own accepted length):

    drafts  = drafter(committed prefix)                     K tokens (chain) or a tree of nodes
    logits  = target([last, drafts], cached prefix)          one forward, [B, K+1, V] (tree: [B, N+1, V])
    result  = verify_chain / verify_tree(logits, drafts)     accepted drafts + one closing token
    commit    the accepted entries of both KV caches (RaggedCache); the closing token becomes ``last``

``drafter=None`` is plain autoregressive sampling through the same code (one token per forward); it is
the reference path. Finished sequences (EOS, a stop id, max_new_tokens) leave the batch at once.

Deliberately left out: paged / static caches, CUDA graphs, sliding-window attention (a model whose
sliding window is shorter than prompt + completion is refused), continuous batching of new requests.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

import torch

from ..trajectory import PER_TOKEN_FIELDS, Trajectory
from ..verify import Provenance, VerifyResult, sample_plain, verify_chain, verify_tree
from ..verify.dist import sample_from_weights
from .cache import RaggedCache
from .config import EngineConfig, SamplingParams
from .tree import draft_tree


class _Row:
    """Host-side bookkeeping of one sequence."""

    def __init__(self, index: int, prompt: list[int]):
        self.index = index
        self.prompt = prompt
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


class SpeculativeEngine:
    """Generate many sequences at once with speculative decoding and exact per-token records."""

    def __init__(self, target, drafter=None, config: EngineConfig | None = None):
        self.target = target.eval()
        self.drafter = drafter
        self.config = config or EngineConfig()
        self.device = next(target.parameters()).device
        self.vocab_size = target.get_output_embeddings().weight.shape[0]
        self.max_seq_len = self.config.max_seq_len or getattr(target.config, "max_position_embeddings", None)
        self.stats: dict = {}
        self._eagle = None
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
            self._eagle = _EagleState(drafter)
        if self.config.draft_confidence > 0 and drafter is not None and self._eagle is None:
            raise ValueError("draft_confidence needs an Eagle3Drafter (a propose() drafter reports none)")
        if self.config.tree is not None and drafter is not None and self._eagle is None:
            raise ValueError("tree drafting needs an Eagle3Drafter (a propose() drafter only drafts chains)")
        window = getattr(target.config, "sliding_window", None)
        if window and getattr(target.config, "use_sliding_window", True) and self.max_seq_len:
            self.max_seq_len = min(self.max_seq_len, window)

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
        eos = self._eos_ids(sampling)
        gen = torch.Generator(device=self.device).manual_seed(sampling.seed)
        rows = [_Row(i, p) for i, p in enumerate(prompts) for _ in range(sampling.n)]
        totals = dict(
            target_forwards=0,
            draft_forwards=0,
            drafted=0,
            accepted=0,
            relaxed=0,
            rounds=0,
            tokens=0,
            tokens_in_rounds=0,
        )
        start = time.perf_counter()
        with torch.inference_mode():
            for s in range(0, len(rows), self.config.max_batch_size):
                self._run_batch(rows[s : s + self.config.max_batch_size], sampling, eos, gen, totals)
        totals["wall_seconds"] = time.perf_counter() - start
        # tau: kept tokens per target forward of the speculative rounds, per sequence (the prefill's token
        # is excluded from both counts; a round's tokens past an EOS / max_new_tokens are not counted), so
        # tau = (sum of completion lengths - sequences) / rounds exactly; None when no round ran
        totals["tau"] = totals["tokens_in_rounds"] / totals["rounds"] if totals["rounds"] else None
        self.stats = totals
        return [self._trajectory(r, sampling) for r in rows]

    # ------------------------------------------------------------------ one batch
    def _run_batch(
        self, rows: list[_Row], sampling: SamplingParams, eos: set[int], gen, totals: dict
    ) -> None:
        dev = self.device
        bsz = len(rows)
        lens = torch.tensor([len(r.prompt) for r in rows], device=dev)
        width = int(lens.max())
        pad = width - lens  # prompts are left-padded: every row's last prompt token sits at slot width-1
        ids = torch.zeros(bsz, width, dtype=torch.long, device=dev)
        for b, r in enumerate(rows):
            ids[b, width - len(r.prompt) :] = torch.tensor(r.prompt, device=dev)
        tcache = RaggedCache(bsz, dev)
        slots = torch.arange(width, device=dev)
        keys_ok = slots >= pad.unsqueeze(1)  # [B, L]
        causal = torch.ones(width, width, dtype=torch.bool, device=dev).tril()
        mask = tcache.attention_mask(causal.unsqueeze(0) & keys_ok.unsqueeze(1), self._dtype)
        pos = (slots - pad.unsqueeze(1)).clamp(min=0)
        hidden, feats = self._target_hidden(ids, pos, mask, tcache)
        totals["target_forwards"] += 1
        tcache.starts, tcache.lengths = pad, lens.clone()
        first = sample_plain(
            self._lm_head(hidden[:, -1]),
            temperature=sampling.temperature,
            top_k=sampling.top_k,
            top_p=sampling.top_p,
            generator=gen,
        )
        last = first.tokens[:, 0]
        if self._eagle is not None:
            # drafter input pairs (feature at t, token t+1): the prompt shifted by one, then the first
            # token; left-aligned per row (pair i of row b comes from slot pad[b] + i)
            src = (pad.unsqueeze(1) + slots).clamp(max=width - 1)  # [B, L]
            pair_feats = feats.gather(1, src.unsqueeze(-1).expand(-1, -1, feats.shape[-1]))
            pair_tokens = torch.cat([ids, last.unsqueeze(1)], 1).gather(1, (src + 1).clamp(max=width))
            self._eagle.start(bsz, dev, pair_feats, pair_tokens, lens)
        active = self._record(rows, first, sampling, eos, totals, drafted=None)

        while active:
            keep = torch.tensor([b for b, _ in active], device=dev)
            if len(active) < len(rows):
                tcache.select(keep)
                last = last[keep]
                if self._eagle is not None:
                    self._eagle.select(keep)
            rows = [r for _, r in active]
            res, drafted, n_forwards = self._round(rows, last, tcache, sampling, gen)
            totals["target_forwards"] += 1
            totals["draft_forwards"] += n_forwards
            last = res.tokens.gather(1, (res.num_emitted - 1).unsqueeze(1)).squeeze(1)
            active = self._record(rows, res, sampling, eos, totals, drafted=drafted)

    def _round(self, rows, last, tcache: RaggedCache, sampling: SamplingParams, gen):
        """One draft + verify round. Returns (VerifyResult-like, drafted per row, draft forwards)."""
        dev = self.device
        cfg = self.config
        bsz = len(rows)
        kw = dict(temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p, generator=gen)
        if self.drafter is None:  # plain sampling: one token per target forward
            block = last.unsqueeze(1)
            mask = tcache.attention_mask(torch.ones(1, 1, 1, dtype=torch.bool, device=dev), self._dtype)
            start = tcache.width
            hidden, _ = self._target_hidden(block, tcache.lengths.unsqueeze(1), mask, tcache)
            res = sample_plain(self._lm_head(hidden[:, 0]), **kw)
            tcache.commit(start, torch.zeros(bsz, 1, dtype=torch.long, device=dev), res.num_emitted)
            return res, 0, 0
        if cfg.tree is not None:
            return self._tree_round(last, tcache, sampling, kw)
        k = cfg.num_draft_tokens
        n_drafts = None  # per-row chain lengths when drafting stopped early for some rows
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
        block = torch.cat([last.unsqueeze(1), drafts], 1)  # [B, K+1]
        pos = tcache.lengths.unsqueeze(1) + torch.arange(k + 1, device=dev)
        causal = torch.ones(k + 1, k + 1, dtype=torch.bool, device=dev).tril().unsqueeze(0)
        mask = tcache.attention_mask(causal, self._dtype)
        start = tcache.width
        hidden, feats = self._target_hidden(block, pos, mask, tcache)
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
        order = torch.arange(k + 1, device=dev).expand(bsz, k + 1)
        tcache.commit(start, order, res.num_emitted)
        if self._eagle is not None:
            self._eagle.pend(feats, res.tokens.clamp(min=0), res.num_emitted)
        return res, (n_drafts.tolist() if n_drafts is not None else k), n_forwards

    def _tree_round(self, last, tcache: RaggedCache, sampling: SamplingParams, kw):
        dev = self.device
        cfg = self.config
        tree = draft_tree(self._eagle, cfg.tree, self._dtype)
        n = tree.tokens.shape[1]
        bsz = last.shape[0]
        block = torch.cat([last.unsqueeze(1), tree.tokens.clamp(min=0)], 1)  # [B, N+1]
        pos = tcache.lengths.unsqueeze(1) + torch.cat(
            [torch.zeros(bsz, 1, dtype=torch.long, device=dev), tree.depth], 1
        )
        mask = tcache.attention_mask(tree.ancestors, self._dtype)  # [B, N+1, N+1] incl. root
        start = tcache.width
        hidden, feats = self._target_hidden(block, pos, mask, tcache)
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
        # keep the root and the accepted nodes, in path order (block index = node + 1)
        path = torch.cat([torch.zeros(bsz, 1, dtype=torch.long, device=dev), res.path_nodes + 1], 1)
        path = path.clamp(min=0)[:, : res.tokens.shape[1]]
        tcache.commit(start, path, res.num_emitted)
        feats_path = feats.gather(1, path.unsqueeze(-1).expand(-1, -1, feats.shape[-1]))
        self._eagle.pend(feats_path, res.tokens.clamp(min=0), res.num_emitted)
        return res, n, tree.draft_forwards

    # ------------------------------------------------------------------ pieces
    @property
    def _dtype(self) -> torch.dtype:
        return next(self.target.parameters()).dtype

    def _target_hidden(self, ids, pos, mask, tcache: RaggedCache):
        """Final hidden states [B, T, H] of the target (and the drafter's features when tapped)."""
        from ..drafter import FeatureTap

        def forward():
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
        return self.target.lm_head(hidden).float()

    def _record(self, rows, res: VerifyResult, sampling, eos, totals, drafted) -> list[tuple[int, _Row]]:
        """Append each row's emitted tokens until it finishes; returns the rows still active.

        drafted: None for the prefill's token, else the drafts verified this round (an int for every
        row, or a list with one count per row)."""
        host = {f: getattr(res, f).cpu().tolist() for f in ("tokens", "num_emitted", *_RESULT_FIELDS)}
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
                row.record["is_top2"].append(bool(host["is_top2"][b][j]))
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
                if row.finish:
                    break
            if row.finish is None and self.max_seq_len is not None:
                room = self._round_width()
                if len(row.prompt) + len(row.tokens) + room > self.max_seq_len:
                    row.finish = "length"
            if row.finish is None:
                active.append((b, row))
        return active

    def _round_width(self) -> int:
        """Positions one more round may occupy beyond the committed sequence."""
        if self.drafter is None:
            return 1
        if self.config.tree is not None:
            return self.config.tree.depth + 2
        return self.config.num_draft_tokens + 1

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

    def __init__(self, drafter):
        self.drafter = drafter
        self.cache: RaggedCache | None = None
        self.feats = self.tokens = self.counts = None

    def start(self, bsz, dev, feats, tokens, counts) -> None:
        self.cache = RaggedCache(bsz, dev)
        self.pend(feats, tokens, counts)

    def pend(self, feats, tokens, counts) -> None:
        """feats [B, P, 3Ht], tokens [B, P]: the first counts[b] pairs of each row are new and committed."""
        self.feats, self.tokens, self.counts = feats, tokens, counts

    def select(self, rows) -> None:
        self.cache.select(rows)
        self.feats, self.tokens, self.counts = self.feats[rows], self.tokens[rows], self.counts[rows]

    @property
    def dtype(self):
        return self.drafter.fc.weight.dtype

    def absorb(self):
        """Run the drafter over the pending committed pairs; returns (hidden [B, H], logits [B, Vd])
        at each row's last pair, i.e. the state that predicts the first draft token."""
        dev = self.counts.device
        bsz = self.counts.shape[0]
        width = int(self.counts.max())
        feats, tokens = self.feats[:, :width], self.tokens[:, :width]
        new_ok = torch.arange(width, device=dev) < self.counts.unsqueeze(1)  # [B, P]
        causal = torch.ones(width, width, dtype=torch.bool, device=dev).tril()
        mask = self.cache.attention_mask(causal.unsqueeze(0) & new_ok.unsqueeze(1), self.dtype)
        pos = self.cache.lengths.unsqueeze(1) + torch.arange(width, device=dev)
        start = self.cache.width
        logits, hidden = self.drafter(
            tokens, self.drafter.fuse(feats.to(self.dtype)), pos, self.cache.cache, mask
        )
        self.cache.commit(start, torch.arange(width, device=dev).expand(bsz, width), self.counts)
        rows = torch.arange(bsz, device=dev)
        return hidden[rows, self.counts - 1], logits[rows, self.counts - 1]

    def step(self, tokens, hidden, depth_offset: int, mask):
        """One speculative draft step: tokens [B, M], hidden [B, M, H] at positions lengths + offset,
        under the additive ``mask`` [B, 1, M, S].  Appends M uncommitted entries (visible to later steps).
        Returns (logits [B, M, Vd], hidden)."""
        m = tokens.shape[1]
        pos = (self.cache.lengths + depth_offset).unsqueeze(1).expand(-1, m)
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
