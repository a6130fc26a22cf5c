"""Small pure helpers shared by the chain and tree verifiers: the target's sampling distribution,
the raw-logit margin, inverse-CDF sampling and argument checks.

Nothing here owns randomness: samplers take uniforms drawn by the caller from its generator.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

_NEG_INF = float("-inf")


def sampling_logits(
    logits: torch.Tensor, temperature: float, top_k: int | None = None, top_p: float | None = None
) -> torch.Tensor:
    """Scaled, filtered float32 logits whose softmax is the target's sampling distribution.

    logits [..., V] raw; returns [..., V] = logits / T with -inf outside top-k then top-p (HF order).
    Requires T > 0. Without filtering and with float32 input at T == 1 this returns ``logits``
    itself (no copy). top-p keeps a token iff the mass ranked strictly above it is < top_p.
    """
    x = logits.float()
    if temperature != 1.0:
        x = x / temperature
    vocab = x.shape[-1]
    if top_k is not None and top_k < vocab:
        kth = x.topk(top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, _NEG_INF)
    if top_p is not None and top_p < 1.0:
        sorted_x, order = x.sort(dim=-1, descending=True)
        probs = sorted_x.softmax(dim=-1)
        mass_above = probs.cumsum(dim=-1) - probs
        drop = torch.zeros_like(mass_above, dtype=torch.bool).scatter(-1, order, mass_above >= top_p)
        x = x.masked_fill(drop, _NEG_INF)
    return x


class TargetDist(NamedTuple):
    """The target's sampling distribution at a batch of positions, without materialising it.

    Leading dims ``[...]`` are the positions (e.g. [B, K+1]); V is the vocabulary.
    """

    logits: torch.Tensor  # [..., V] raw logits (any float dtype)
    scaled: torch.Tensor | None  # [..., V] float32 filtered sampling logits; None when unfiltered
    lse: torch.Tensor | None  # [...] float32 log-normaliser of the sampling logits; None at T = 0
    t1: torch.Tensor  # [...] int64 top-1 token by raw logits
    t2: torch.Tensor  # [...] int64 top-2 token
    z1: torch.Tensor  # [...] float32 raw top-1 logit
    z2: torch.Tensor  # [...] float32 raw top-2 logit
    temperature: float


# Elements per block on a CPU: a block of ~4M fp32 logits (e.g. 32 rows of a 152k vocabulary) stays in
# cache between the top-2 and the normaliser passes: the pair then costs ~1.2 softmax instead of ~2.
_CPU_BLOCK_ELEMENTS = 1 << 22


def block_rows(n_rows: int, vocab: int, device: torch.device) -> int:
    """Rows per cache block for row-wise passes over [n_rows, vocab] (all rows at once off-CPU)."""
    if device.type != "cpu":
        return max(n_rows, 1)
    return max(1, _CPU_BLOCK_ELEMENTS // max(vocab, 1))


def target_dist(
    logits: torch.Tensor, temperature: float, top_k: int | None = None, top_p: float | None = None
) -> TargetDist:
    """Top-2 of the raw logits and the log-normaliser of softmax(z / T) after top-k / top-p.

    One blocked pass over the logits when no filter is on; the filtered path materialises the filtered
    logits (sorting for top-p costs far more than the rest anyway)."""
    vocab = logits.shape[-1]
    lead = logits.shape[:-1]
    filtered = (top_k is not None and top_k < vocab) or (top_p is not None and top_p < 1.0)
    flat = logits.reshape(-1, vocab)
    block = block_rows(flat.shape[0], vocab, logits.device)
    t1s, t2s, z1s, z2s, sums = [], [], [], [], []
    for start in range(0, flat.shape[0], block):  # cache blocking over rows, not a loop over tokens
        rows = flat[start : start + block]
        top = rows.topk(2, dim=-1)
        vals = top.values.float()
        t1s.append(top.indices[:, 0])
        t2s.append(top.indices[:, 1])
        z1s.append(vals[:, 0])
        z2s.append(vals[:, 1])
        if temperature > 0 and not filtered:
            shifted = rows.float() - vals[:, :1]
            if temperature != 1.0:
                shifted.div_(temperature)
            sums.append(shifted.exp_().sum(dim=-1))
    cat = lambda parts: (parts[0] if len(parts) == 1 else torch.cat(parts)).view(lead)  # noqa: E731
    t1, t2, z1, z2 = cat(t1s), cat(t2s), cat(z1s), cat(z2s)
    scaled = lse = None
    if temperature > 0:
        if filtered:
            scaled = sampling_logits(logits, temperature, top_k, top_p)
            lse = torch.logsumexp(scaled, dim=-1)
        else:
            lse = z1 / temperature + cat(sums).log()
    return TargetDist(logits, scaled, lse, t1, t2, z1, z2, temperature)


def dist_logp(d: TargetDist, tokens: torch.Tensor) -> torch.Tensor:
    """log p(tokens) per position: tokens [...] (valid ids) -> [...] float64 (-inf outside the support)."""
    if d.temperature == 0:
        return torch.where(tokens == d.t1, 0.0, float("-inf")).double()
    src = d.scaled if d.scaled is not None else d.logits
    return _logp(d, src.gather(-1, tokens.unsqueeze(-1)).squeeze(-1), d.lse)


def dist_logp_at(d: TargetDist, index: tuple, tokens: torch.Tensor) -> torch.Tensor:
    """log p(tokens) at the positions ``index`` picks (advanced indexing into the leading dims; tokens has
    the picked shape, e.g. [B, N+1, C] candidate tokens at every tree node) -> float64 of that shape."""
    if d.temperature == 0:
        return torch.where(tokens == d.t1[index], 0.0, float("-inf")).double()
    src = d.scaled if d.scaled is not None else d.logits
    return _logp(d, src[(*index, tokens)], d.lse[index])


def _logp(d: TargetDist, picked: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
    """Picked raw (or already scaled) logits and their rows' log-normaliser -> log p, float64."""
    val = picked.float()
    if d.scaled is None and d.temperature != 1.0:
        val = val / d.temperature
    return (val - lse).double()


def dist_probs(d: TargetDist, index: tuple) -> torch.Tensor:
    """Full probability rows p[index] -> [M, V] float32 (T > 0); ``index`` selects positions."""
    if d.scaled is not None:
        return (d.scaled[index] - d.lse[index].unsqueeze(-1)).exp()
    rows = d.logits[index].float()
    if d.temperature != 1.0:
        rows = rows / d.temperature
    return rows.sub_(d.lse[index].unsqueeze(-1)).exp_()


def top2(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Top-1/top-2 tokens and their raw logits: (t1, t2, z1, z2), each [...] (float32 values)."""
    top = logits.topk(2, dim=-1)
    t1, t2 = top.indices.unbind(-1)
    z1, z2 = top.values.float().unbind(-1)
    return t1, t2, z1, z2


def margin_ratio(z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
    """r = z2 / z1 on raw logits; NaN where z1 == 0 (the ratio is undefined there)."""
    return torch.where(z1 != 0, z2 / z1, torch.full_like(z1, float("nan")))


def relaxable(z1: torch.Tensor, ratio: torch.Tensor, theta: float) -> torch.Tensor:
    """The paper's near-tie condition R: z1 > 0 and z2/z1 > theta (bool, same shape)."""
    return (z1 > 0) & (ratio > theta)


# rows x vocab up to which ``sample_from_weights`` takes one float64 cumulative sum over the whole row
# (8 MB of float64): a third of the kernels of the two-level draw, which matter at batch 1, where a
# token's sampling is a few dozen small kernels beside the forward
ONE_LEVEL_MAX = 1 << 20


def _sample_one_level(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """``sample_from_weights`` in one level: the count of cumulative weights <= u * total is the first
    index whose cumulative weight exceeds it.  The target is kept strictly below the total (u < 1, but
    the product can round up to it), so the index found always has a positive weight."""
    cdf = weights.double().cumsum(dim=1)
    total = cdf[:, -1]
    target = torch.minimum(u * total, torch.nextafter(total, torch.zeros_like(total)))
    return (cdf <= target.unsqueeze(1)).sum(dim=1)


def sample_from_weights(weights: torch.Tensor, u: torch.Tensor, block: int | None = None) -> torch.Tensor:
    """Inverse-CDF draw from unnormalised non-negative weights.

    weights [B, V], u [B] float64 in [0, 1) -> [B] int64: the first index whose cumulative weight
    exceeds u * total.  Zero-weight tokens are never drawn.  Two levels (block sums, then one block) so
    the cost is a single read of ``weights``; cumulative sums run in float64 over about sqrt(V) terms
    (the default block), keeping the error near 1e-7 of the total even at V = 152k.  Draws of at most
    ``ONE_LEVEL_MAX`` weights (and no explicit ``block``) take one level instead (same rule, one float64
    cumulative sum, fewer kernels).
    """
    bsz, vocab = weights.shape
    if block is None and bsz * vocab <= ONE_LEVEL_MAX:
        return _sample_one_level(weights, u)
    if block is None:
        block = max(32, math.isqrt(vocab))
    block = min(block, vocab)
    n_full = vocab // block
    parts = []
    if n_full:
        parts.append(weights[:, : n_full * block].reshape(bsz, n_full, block).sum(-1))
    if vocab % block:
        parts.append(weights[:, n_full * block :].sum(-1, keepdim=True))
    block_cdf = torch.cat(parts, dim=1).double().cumsum(dim=1)  # [B, nb]
    target = u * block_cdf[:, -1]
    blk = torch.searchsorted(block_cdf, target.unsqueeze(1), right=True).squeeze(1)
    blk = blk.clamp_(max=block_cdf.shape[1] - 1)
    before = torch.where(blk > 0, block_cdf.gather(1, (blk - 1).clamp(min=0).unsqueeze(1)).squeeze(1), 0.0)
    offs = torch.arange(block, device=weights.device)
    idx = blk.unsqueeze(1) * block + offs  # [B, block] token ids of the chosen block
    inside = idx < vocab
    vals = torch.where(inside, weights.gather(1, idx.clamp(max=vocab - 1)), 0).double()
    inner = vals.cumsum(dim=1)
    j = torch.searchsorted(inner, (target - before).unsqueeze(1), right=True).squeeze(1)
    # rounding between the two levels may overshoot the block: fall back to its last non-zero entry
    last_nonzero = torch.where(vals > 0, offs, 0).amax(dim=1)
    return blk * block + torch.minimum(j, last_nonzero)


def check_scalars(rule: str, rules, temperature: float, theta: float, top_k, top_p) -> None:
    """Raise ValueError naming the argument for bad scalar settings (no tensor work)."""
    if rule not in rules:
        raise ValueError(f"rule must be one of {sorted(rules)}, got {rule!r}")
    if not isinstance(temperature, (int, float)) or temperature != temperature or temperature < 0:
        raise ValueError(f"temperature must be a finite number >= 0, got {temperature!r}")
    if temperature == float("inf"):
        raise ValueError("temperature must be finite, got inf")
    if not isinstance(theta, (int, float)) or theta != theta or theta < 0:
        raise ValueError(f"theta must be a number >= 0 (use theta >= 1 to disable relaxation), got {theta!r}")
    if top_k is not None and (not isinstance(top_k, int) or top_k < 1):
        raise ValueError(f"top_k must be None or an int >= 1, got {top_k!r}")
    if top_p is not None and (not isinstance(top_p, (int, float)) or not 0.0 < top_p <= 1.0):
        raise ValueError(f"top_p must be None or in (0, 1], got {top_p!r}")


def check_relax_prob(relax_prob: float, rule: str, temperature: float) -> None:
    """Raise ValueError naming relax_prob when it is outside [0, 1] (or NaN), when it is not 1 under
    mars_code, or strictly between 0 and 1 at T = 0 under mars (no tensor work)."""
    if isinstance(relax_prob, bool) or not isinstance(relax_prob, (int, float)) or not 0 <= relax_prob <= 1:
        raise ValueError(f"relax_prob must be a number in [0, 1], got {relax_prob!r}")
    if rule == "mars_code" and relax_prob != 1:
        raise ValueError(
            f"relax_prob = {relax_prob} with rule 'mars_code': that rule reproduces the released code, which "
            "relaxes deterministically; use rule 'mars' for a relaxation probability, or relax_prob = 1"
        )
    if rule == "mars" and temperature == 0 and 0 < relax_prob < 1:
        raise ValueError(
            f"relax_prob = {relax_prob} needs a random draw, and greedy verification (temperature 0) makes "
            "none: use relax_prob 0 (strict greedy) or 1 (the paper's greedy rule), or temperature > 0"
        )


def raise_on_flags(flags: dict[str, torch.Tensor], *values: torch.Tensor) -> list[int]:
    """One host sync for all data checks: each flag is a 0-d bool tensor, True meaning 'bad'.

    ``values`` (0-d integer tensors the caller needs on the host, e.g. a tree's depth) ride along in the
    same transfer; returns them as ints once no flag is set."""
    if not flags and not values:
        return []
    parts = [torch.stack(list(flags.values())).long()] if flags else []
    if values:
        parts.append(torch.stack(list(values)).long())
    host = torch.cat(parts).tolist()
    for message, is_bad in zip(flags, host, strict=False):
        if is_bad:
            raise ValueError(message)
    return host[len(flags) :]


def logit_flags(name: str, z1: torch.Tensor) -> dict[str, torch.Tensor]:
    """Data checks on logits via their row maxima (topk propagates NaN, so no extra pass)."""
    return {
        f"{name} contains NaN": z1.isnan().any(),
        f"{name} contains +inf": (z1 == float("inf")).any(),
        f"{name} has a row that is entirely -inf": (z1 == _NEG_INF).any(),
    }


def token_range_flag(name: str, tokens: torch.Tensor, vocab: int, allow_pad: bool = False) -> dict:
    low = -1 if allow_pad else 0
    bad = ((tokens < low) | (tokens >= vocab)).any()
    return {f"{name} has ids outside [{low}, {vocab}) (the target vocabulary)": bad}
