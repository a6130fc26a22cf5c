"""The EAGLE-3 drafter's per-call state inside the engine (``EagleState``): its ragged KV cache, the
committed (target feature, next token) pairs it has not absorbed yet, and the drafting of a chain.

The engine pends each round's committed pairs; the next speculative round absorbs them in one drafter
forward (``absorb``) and drafts from the state that forward leaves (``draft_chain``, or ``tree.py``'s
``draft_tree``).  Plain steps only pend (``pend_plain``), so a run of them costs the drafter nothing
until drafting resumes (``debt`` counts what it will owe), and ``EngineConfig.drafter_window`` bounds
that catch-up.  The prompt's pairs can be set aside at the prefill (``start(defer=True)``) and absorbed
at the first speculative round, once a prompt.  See docs/engine.md.
"""

from __future__ import annotations

import math

import torch

from ..verify.dist import sample_from_weights
from .cache import RaggedCache
from .config import SamplingParams


class EagleState:
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
        prompts = EagleState(self.drafter, self.window)
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
        needs them (``_flush``).  Why: writing each step's pair into the growing buffer (``pend(...,
        append=True)``) copies the whole buffer every plain step, a few percent of a plain step at many
        rows; kept aside, a run of plain steps commits about as cheaply as the plain engine's."""
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
        Without it a plain step would cost the drafter a step's worth of work later: absorbing a long
        run's pairs at many rows can double the round that follows it."""
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
