"""The top-1 / top-2 bias figures of a batch (``docs/concepts.md``, "Bias measures"): what was emitted,
against what exact sampling from the policy would emit, and the importance ratio w = pi / b that
corrects for the difference.

Per batch, over completion tokens (mask True):
    tokens, relaxed_frac          count; relaxed tokens (provenance RELAXED = 2) / tokens
    top{1,2}_rate                 share of emitted tokens that are the policy's rank-1 / rank-2 token
    top{1,2}_rate_expected        mean of pi(t1) / pi(t2): the rate exact sampling gives
    top{1,2}_excess, _excess_se   rate - expected (the bias) and its standard error, std(hit - p) / sqrt(n)
    is_ratio_{mean,min,max,ess_frac}   of w; the same with suffix ``_relaxed`` on relaxed tokens only
    kl_behavior                   mean of log b - log pi: a Monte Carlo estimate of KL(b || pi)
    unsupported_mass              mean per-token pi-mass b cannot emit (0.0 when not given)
In a strict run the excesses are ~0 and w ~ 1 up to numerics.  Figures are computed in float64 and
are NaN where they have no tokens (``relaxed_frac`` is then 0, and the ``_relaxed`` ratios are NaN when
no token was relaxed).
"""

from __future__ import annotations

import torch

from .masked import masked_count, masked_mean, masked_std, ratio_summary, to_floats

RELAXED = 2  # marsrl.verify.Provenance.RELAXED (algo imports torch only)


def bias_metrics(
    policy_logp: torch.Tensor,
    behavior_logp: torch.Tensor,
    is_t1: torch.Tensor,
    is_t2: torch.Tensor,
    p_t1: torch.Tensor,
    p_t2: torch.Tensor,
    provenance: torch.Tensor,
    mask: torch.Tensor,
    unsupported_mass: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The bias figures (module docstring) of a batch; every input is [N, T].

    ``policy_logp``, ``is_t*``, ``p_t*`` come from ``token_stats`` (teacher forcing at the sampling
    temperature); ``behavior_logp`` and ``provenance`` from the rollout.  Returns ``(w, metrics)``:
    w [N, T] = exp(policy_logp - behavior_logp) in the dtype of policy_logp, 0 at masked positions.
    """
    m = mask.bool()
    log_w = (policy_logp.double() - behavior_logp.double()).where(m, 0.0)
    n = masked_count(m)
    relaxed = m & (provenance == RELAXED)
    figures: dict[str, torch.Tensor | float] = {
        "tokens": n,
        "relaxed_frac": masked_count(relaxed) / n.clamp(min=1),
    }
    for rank, hit, p in ((1, is_t1, p_t1), (2, is_t2, p_t2)):
        hit, p = hit.double(), p.double()
        diff = hit - p  # per token: emitted-is-rank-r minus its exact probability
        figures[f"top{rank}_rate"] = masked_mean(hit, m)
        figures[f"top{rank}_rate_expected"] = masked_mean(p, m)
        figures[f"top{rank}_excess"] = masked_mean(diff, m)
        figures[f"top{rank}_excess_se"] = masked_std(diff, m) / n.sqrt()
    w = log_w.exp()
    figures.update(ratio_summary(w, m))
    figures.update({f"{k}_relaxed": v for k, v in ratio_summary(w, relaxed).items()})
    figures["kl_behavior"] = masked_mean(-log_w, m)
    unsupported = 0.0 if unsupported_mass is None else masked_mean(unsupported_mass.double(), m)
    figures["unsupported_mass"] = unsupported
    weights = w.to(policy_logp.dtype).where(m, 0.0)
    return weights, to_floats(figures)
