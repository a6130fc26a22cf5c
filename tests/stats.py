"""Goodness-of-fit helpers for the Monte Carlo tests.

Every statistical assertion states its sample size and seed at the call site and uses
``assert_distribution``, which also checks the test's power: the same counts must be REJECTED against
a copy of the expected distribution with 1% of the mass moved between its two most likely tokens.
A test that passes therefore could have failed for a rule that is off by 1% of mass.
"""

from __future__ import annotations

import torch
from scipy.stats import chi2

ALPHA = 1e-4  # false-alarm rate per assertion


def chi2_pvalue(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson chi-square p-value of integer counts [V] against probabilities [V].

    Tokens with zero expected probability must have zero counts (else p = 0). Bins with expected count
    below 5 are pooled into one."""
    counts = counts.double()
    probs = probs.double() / probs.sum()
    n = counts.sum()
    if (counts[probs <= 0] > 0).any():
        return 0.0
    expected = probs * n
    big = expected >= 5
    obs = torch.cat([counts[big], counts[~big & (probs > 0)].sum().view(1)])
    exp = torch.cat([expected[big], expected[~big & (probs > 0)].sum().view(1)])
    keep = exp > 0
    obs, exp = obs[keep], exp[keep]
    stat = ((obs - exp) ** 2 / exp).sum().item()
    dof = max(int(keep.sum()) - 1, 1)
    return float(chi2.sf(stat, dof))


def shifted(probs: torch.Tensor, mass: float = 0.01) -> torch.Tensor:
    """probs with ``mass`` moved from the most likely token to the second most likely one."""
    out = probs.double().clone()
    top = out.topk(2).indices
    out[top[0]] -= mass
    out[top[1]] += mass
    return out


def assert_distribution(tokens: torch.Tensor, probs: torch.Tensor, what: str = "") -> None:
    """tokens: 1-D samples; probs [V] the distribution they must follow."""
    vocab = probs.numel()
    counts = torch.bincount(tokens.flatten(), minlength=vocab)
    assert counts.numel() == vocab, f"{what}: sampled ids outside the vocabulary"
    p = chi2_pvalue(counts, probs)
    assert p > ALPHA, f"{what}: counts {counts.tolist()} do not follow {probs.tolist()} (p = {p:.2e})"
    p_wrong = chi2_pvalue(counts, shifted(probs))
    assert p_wrong < ALPHA, (
        f"{what}: test too weak to see a 1% error (p = {p_wrong:.2e}); raise the sample size"
    )
