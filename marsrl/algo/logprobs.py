"""The teacher-forced statistics of emitted tokens under the policy: log pi(y) at the sampling
temperature, and whether y is the policy's rank-1 / rank-2 token with those two tokens' probabilities
(what the top-2 bias figures compare against; ``docs/concepts.md``, "Bias measures").

From logits already at the predicting positions, or from final hidden states and the lm_head weight, in
chunks of positions so the [chunk, V] temporaries stay small: the cost of one lm_head matmul over the
completion.  Only unmasked positions are computed.  Left out: top-k / top-p truncation (the policy's
log-probs here are of the full softmax(z / T), as TRL's are) and model-specific logit transforms
(softcapping, logit scaling): pass logits when the model has them.
"""

from __future__ import annotations

import torch

from .masked import masked_count, masked_mean, to_floats

STAT_KEYS: tuple[str, ...] = ("logp", "is_t1", "is_t2", "p_t1", "p_t2")


def token_stats(
    ids: torch.Tensor,
    temperature: float = 1.0,
    *,
    logits: torch.Tensor | None = None,
    hidden: torch.Tensor | None = None,
    weight: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
    chunk_size: int = 4096,
) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    """Per-token policy statistics of the tokens ``ids`` [N, T].

    Give EITHER ``logits`` [N, T, V] (the logits that predict ``ids``, i.e. already shifted) OR
    ``hidden`` [N, T, H] with the lm_head ``weight`` [V, H]: logits z = hidden @ weight.T in float32.
    ``mask`` [N, T] (default all True) marks the completion tokens; ``temperature`` T = 0 is taken as
    1e-6 (log-probs of a near one-hot softmax).

    Returns ``(stats, metrics)``: stats holds [N, T] tensors ``logp`` (float32 log softmax(z / T) at
    ids; differentiable in logits / hidden / weight), ``is_t1`` / ``is_t2`` (bool: ids is the rank-1 /
    rank-2 token by z, ties broken as ``topk`` breaks them), ``p_t1`` / ``p_t2`` (float32, no gradient:
    softmax(z / T) of those two tokens); masked positions hold 0 / False.  metrics: ``tokens`` and
    ``logp_mean`` over unmasked positions.  One host sync to find the unmasked positions, one for the
    metrics.
    """
    if (logits is None) == (hidden is None):
        raise ValueError("token_stats: pass exactly one of logits [N, T, V] or hidden [N, T, H] + weight")
    if hidden is not None and weight is None:
        raise ValueError("token_stats: hidden [N, T, H] needs the lm_head weight [V, H]")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    source = logits if logits is not None else hidden
    if source.shape[:2] != ids.shape:
        raise ValueError(f"token_stats: ids {tuple(ids.shape)} and inputs {tuple(source.shape)} disagree")
    n, t = ids.shape
    mask = torch.ones_like(ids, dtype=torch.bool) if mask is None else mask.bool()
    where = mask.flatten().nonzero().squeeze(1)  # [M] flat indices of completion tokens (host sync)
    rows, y = source.flatten(0, 1), ids.flatten()
    head = weight.float() if weight is not None else None
    temp = max(temperature, 1e-6)
    parts = []
    for start in range(0, where.numel(), chunk_size):
        at = where[start : start + chunk_size]
        z = rows[at].float() if head is None else rows[at].float() @ head.T  # [c, V]
        top = z.detach().topk(2, dim=-1).indices  # [c, 2]
        lse = torch.logsumexp(z / temp, dim=-1)  # [c]
        zy = z.gather(1, y[at, None]).squeeze(1)
        z12 = z.detach().gather(1, top)
        parts.append((zy / temp - lse, top, (z12 / temp - lse.detach()[:, None]).exp()))
    logp = torch.zeros(n * t, dtype=torch.float32, device=ids.device)
    top = torch.zeros(n * t, 2, dtype=ids.dtype, device=ids.device)
    p12 = torch.zeros(n * t, 2, dtype=torch.float32, device=ids.device)
    if parts:
        logp = logp.index_copy(0, where, torch.cat([p[0] for p in parts]))
        top = top.index_copy(0, where, torch.cat([p[1] for p in parts]))
        p12 = p12.index_copy(0, where, torch.cat([p[2] for p in parts]))
    flat_mask = mask.flatten()
    stats = {
        "logp": logp.view(n, t),
        "is_t1": ((y == top[:, 0]) & flat_mask).view(n, t),
        "is_t2": ((y == top[:, 1]) & flat_mask).view(n, t),
        "p_t1": p12[:, 0].view(n, t),
        "p_t2": p12[:, 1].view(n, t),
    }
    figures = {"tokens": masked_count(mask), "logp_mean": masked_mean(stats["logp"].detach(), mask)}
    return stats, to_floats(figures)
