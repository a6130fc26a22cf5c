"""Verification of a batch of draft chains: strict (lossless), mars (the paper's margin rule) and
mars_code (the released code's sampling branch), with the exact per-token record.

One round, for each row independently (column j < K verifies draft x_j; column K is the bonus):

    u_j ~ U[0,1)                              p = target sampling dist. (T, top-k, top-p)
    strict ok   :  u_j * q(x_j) < p(x_j)      q = draft dist. (one-hot for a greedy draft)
    R (mars)    :  z1 > 0 and z2/z1 > theta   on the RAW logits at position j
    T           :  {t1, t2}, the raw top-2, within the support of p: a token top-k / top-p removed is
                   never relaxed to (mars and mars_code), so no emitted token has p = 0 at T > 0
    mars        :  ok, or (R and x_j in T and lucky)         -> RELAXED when only R saved it
    lucky       :  u_j q(x_j) < p(x_j) + lam (q(x_j) - p(x_j)), i.e. u_j < a + lam (1 - a), a = min(1, p/q):
                   the same uniform, so the relaxation is taken with probability lam = relax_prob once the
                   strict test failed; lam = 1 (the paper) always, lam = 0 never (strict, bit for bit)
    mars_code   :  r > theta ? x_j in T  :  u_j * q(x_j) < p(x_j)
    first failure j*: close with y ~ residual (strict/mars: max(0, p - q); mars_code: full p if r > theta,
                      else p with only p(x) lowered to max(0, p(x) - q(x)));  all accepted: y ~ p at K
                      (at the row's ``num_drafts`` when a shorter chain is given).

At T = 0 the sampling distribution is the point mass on t1 = argmax z: the same formulas with u = 0
give greedy strict (accept x == t1) and greedy mars (also x == t2 under R); the closing token is t1.
mars_code at T = 0 is strict (the released code does not relax in greedy mode).  relax_prob at T = 0:
1 is the paper's greedy rule, 0 strict greedy; a value in between is refused (it needs a random draw,
and greedy verification makes none).  mars_code refuses relax_prob != 1 (it reproduces released code).

Behaviour under mars with relax_prob lam (closed form, chain): b(y) = p(y) + lam delta(y) - lam D res(y)
(``docs/concepts.md``), so b >= (1 - lam) p and pi / b <= 1 / (1 - lam) at every position.

Behaviour probabilities b (the chance the procedure emits y at a position, marginal over x ~ q) are the
closed forms of ``docs/concepts.md``; the enumerated versions live in ``reference.py`` (tests compare).

Departures of ``mars_code`` from the paper (kept on purpose, to reproduce the released numbers):
no z1 > 0 guard (for z1 < 0, z2/z1 >= 1 and it relaxes even at theta >= 1); a top-1/top-2 draft at a
near-tie is accepted with no random draw; a non-top-2 draft at a near-tie ends the round with a draw
from the full p (the draft token itself may be drawn again); below the threshold the rejection residual
subtracts only the drafted entry, which is lossless for a greedy draft but NOT for a full draft q.
Under mars_code every token accepted through the margin branch is labelled RELAXED.

Randomness: exactly one ``torch.rand((B, K+1), dtype=float64, generator=generator)`` per call at T > 0
(column K draws the closing token by inverse CDF); none at T = 0.

Host syncs: one for the input data checks; with a full draft q, mars / mars_code add one to gather the
few positions whose behaviour probability needs a full-vocabulary sum, and (mars at relax_prob 1,
mars_code) one for the positions whose unsupported mass does.

Unsupported mass (per emitted draft position; 0 at the bonus and padding): the sum of p(y) over the
tokens y with b(y) = 0, from the closed forms.  strict and mars at relax_prob < 1: 0.  mars at 1: a
one-hot draft x in T under R gives 1 - p(x); a full q gives the mass q never proposes, where R holds
and q over-proposes no token outside T (else 0).  mars_code: above the threshold, the mass off the
T-tokens q proposes, when q proposes nothing else; 0 below it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, NamedTuple

import torch

from .dist import (
    TargetDist,
    block_rows,
    check_relax_prob,
    check_scalars,
    dist_logp,
    dist_probs,
    logit_flags,
    margin_ratio,
    raise_on_flags,
    relaxable,
    sample_from_weights,
    target_dist,
    token_range_flag,
)
from .types import DEFAULT_THETA, Provenance, VerifyResult

Rule = Literal["strict", "mars", "mars_code"]


class _Pos(NamedTuple):
    """Per-position facts every rule reads. All [B, K] over the draft positions unless noted."""

    u: torch.Tensor  # float64 acceptance uniforms (zeros at T = 0)
    x: torch.Tensor  # int64 drafted tokens
    p_x: torch.Tensor  # float64 p(x)
    q_x: torch.Tensor  # float64 q(x)
    in_top2: torch.Tensor  # bool x in T = {t1, t2} within the support of p (any p(x) at T = 0)
    relax: torch.Tensor  # bool margin condition of the rule (R for mars, r > theta for mars_code)
    lam: float  # relax_prob: the probability of relaxing once the strict test failed (mars)


def _accept_strict(s: _Pos) -> tuple[torch.Tensor, torch.Tensor]:
    ok = s.u * s.q_x < s.p_x
    return ok, torch.zeros_like(ok)


def _accept_mars(s: _Pos) -> tuple[torch.Tensor, torch.Tensor]:
    ok = s.u * s.q_x < s.p_x
    relaxed = ~ok & s.relax & s.in_top2
    if s.lam < 1:  # lam = 1 relaxes wherever allowed (u < 1), with no rounding in the way
        # the next lam (1 - a) of the uniform's range: u < a + lam (1 - a)  <=>  u q < p + lam (q - p)
        # (q > p wherever the strict test failed); lam = 0 gives back the strict test exactly
        relaxed &= s.u * s.q_x < s.p_x + s.lam * (s.q_x - s.p_x)
    return ok | relaxed, relaxed


def _accept_mars_code(s: _Pos) -> tuple[torch.Tensor, torch.Tensor]:
    relaxed = s.relax & s.in_top2
    return torch.where(s.relax, s.in_top2, s.u * s.q_x < s.p_x), relaxed


_ACCEPT: dict[str, Callable[[_Pos], tuple[torch.Tensor, torch.Tensor]]] = {
    "strict": _accept_strict,
    "mars": _accept_mars,
    "mars_code": _accept_mars_code,
}


class _Probs(NamedTuple):
    """Probabilities at the emitted token y and at t1/t2, per position; all [B, K] float64."""

    p_y: torch.Tensor
    q_y: torch.Tensor
    p_t1: torch.Tensor
    p_t2: torch.Tensor
    q_t1: torch.Tensor
    q_t2: torch.Tensor
    y_is_t1: torch.Tensor  # bool
    y_is_t2: torch.Tensor  # bool
    t1_in: torch.Tensor  # bool t1 is in T: p(t1) > 0 (always, short of exact ties at a filter's edge)
    t2_in: torch.Tensor  # bool t2 is in T: p(t2) > 0, i.e. top-k / top-p kept it (always at T = 0)
    relax: torch.Tensor  # bool, the rule's margin condition
    lam: float  # relax_prob


def _behavior_strict(pr: _Probs, full_sum: Callable) -> torch.Tensor:
    return pr.p_y


def _behavior_mars(pr: _Probs, full_sum: Callable) -> torch.Tensor:
    # b(y) = p(y) + lam delta(y) - lam D res(y),  delta(v) = R [v in T] max(0, q(v) - p(v)),
    # D = delta(t1) + delta(t2),
    # res(y) = max(0, p(y) - q(y)) / Z,  Z = sum_v max(0, p(v) - q(v))  (the strict residual mass)
    # (d1, d2 and big_d below carry the factor lam)
    d1 = pr.lam * ((pr.relax & pr.t1_in) * (pr.q_t1 - pr.p_t1).clamp_min(0))
    d2 = pr.lam * ((pr.relax & pr.t2_in) * (pr.q_t2 - pr.p_t2).clamp_min(0))
    big_d = d1 + d2
    # Z only matters where D > 0 and y has residual mass (p(y) > q(y)); relaxed tokens have none
    z_mass = full_sum("residual_mass", (big_d > 0) & (pr.p_y > pr.q_y))
    res_y = (pr.p_y - pr.q_y).clamp_min(0) / z_mass.clamp_min(1e-300)
    return pr.p_y + pr.y_is_t1 * d1 + pr.y_is_t2 * d2 - torch.where(big_d > 0, big_d * res_y, 0.0)


def _behavior_mars_code(pr: _Probs, full_sum: Callable) -> torch.Tensor:
    # r > theta: x' ~ q; x' in T is emitted, anything else closes with y ~ p:
    #   b(y) = q(y) [y in T] + (1 - q(t1) - q(t2)) p(y)
    # otherwise (accept w.p. min(1, p/q), reject -> p with only p(x) lowered by q(x)):
    #   b(y) = min(p(y), q(y)) + p(y) (S - a(y) / (1 - p(y))),  a(v) = max(0, q(v) - p(v)),
    #   S = sum_v a(v) / (1 - p(v))
    in_t = (pr.y_is_t1 & pr.t1_in) | (pr.y_is_t2 & pr.t2_in)
    b_relax = pr.q_y * in_t + (1.0 - pr.q_t1 * pr.t1_in - pr.q_t2 * pr.t2_in) * pr.p_y
    s_sum = full_sum("code_rejection_sum", ~pr.relax)
    a_y = (pr.q_y - pr.p_y).clamp_min(0)
    own = torch.where(a_y > 0, a_y / (1.0 - pr.p_y).clamp_min(1e-300), 0.0)
    b_test = torch.minimum(pr.p_y, pr.q_y) + pr.p_y * (s_sum - own)
    return torch.where(pr.relax, b_relax, b_test)


_BEHAVIOR: dict[str, Callable[[_Probs, Callable], torch.Tensor]] = {
    "strict": _behavior_strict,
    "mars": _behavior_mars,
    "mars_code": _behavior_mars_code,
}


# Unsupported mass: sum of p(y) over the tokens y with b(y) = 0 at a position, [B, K] float64.  Each takes
# the position facts, the probabilities and ``vocab_mass(kind, need)`` (None for a one-hot draft), which
# returns the full-vocabulary masses of ``_vocab_sums`` at the positions ``need`` marks (0 elsewhere).
def _unsupported_strict(s: _Pos, pr: _Probs, vocab_mass: Callable | None) -> torch.Tensor:
    return torch.zeros_like(pr.p_y)  # b = p


def _unsupported_mars(s: _Pos, pr: _Probs, vocab_mass: Callable | None) -> torch.Tensor:
    # lam < 1: b >= (1 - lam) p, nothing is out of reach.  lam = 1: b(y) = min(p, q)(y) + (Z - D) res(y)
    # is 0 exactly where q(y) = 0 and Z = D: R holds and no token outside T is over-proposed, so every
    # draft that fails the strict test is relaxed and the position never rejects; the tokens the draft
    # never proposes are then out of reach.  One-hot q on x: that is R and x in T, with mass 1 - p(x).
    if pr.lam < 1:
        return torch.zeros_like(pr.p_y)
    if vocab_mass is None:
        return torch.where(s.relax & s.in_top2, 1.0 - s.p_x, 0.0)
    over_proposed_top = (pr.t1_in & (pr.q_t1 > pr.p_t1)) | (pr.t2_in & (pr.q_t2 > pr.p_t2))  # D > 0 under R
    return vocab_mass("mars_unsupported", pr.relax & over_proposed_top)


def _unsupported_mars_code(s: _Pos, pr: _Probs, vocab_mass: Callable | None) -> torch.Tensor:
    # r > theta: a drafted x in T is emitted and any other x closes from the full p, so when q proposes
    # nothing outside T only the T-tokens it proposes are reachable (one-hot: x in T, mass 1 - p(x)).
    # Below the threshold nothing is out of reach: q(y) > 0 accepts y with a positive chance, and
    # q(y) = 0 < p(y) forces some x with q(x) > p(x), whose rejection can draw y.
    if vocab_mass is None:
        return torch.where(s.relax & s.in_top2, 1.0 - s.p_x, 0.0)
    return vocab_mass("code_unsupported", pr.relax)


_UNSUPPORTED: dict[str, Callable[[_Pos, _Probs, Callable | None], torch.Tensor]] = {
    "strict": _unsupported_strict,
    "mars": _unsupported_mars,
    "mars_code": _unsupported_mars_code,
}


def verify_chain(
    target_logits: torch.Tensor,
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None = None,
    *,
    rule: Rule = "strict",
    temperature: float = 1.0,
    theta: float = DEFAULT_THETA,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
    num_drafts: torch.Tensor | None = None,
    relax_prob: float = 1.0,
) -> VerifyResult:
    """Verify one round of K drafted tokens per row.

    Args:
        target_logits: [B, K+1, V] raw target logits at the K draft positions and the bonus position.
        draft_tokens: [B, K] int drafted ids in the target vocabulary.
        draft_probs: [B, K, V] the draft's sampling distribution at each position (target vocabulary,
            zero outside the draft vocabulary), or None for a greedy (one-hot) draft.
        rule: "strict" (lossless), "mars" (margin-aware, the paper) or "mars_code" (the released code).
        temperature: T > 0 samples from softmax(z / T) after top_k / top_p; T == 0 is greedy.
        theta: margin threshold; theta >= 1 turns mars into strict.
        top_k, top_p: the target's sampling filters (None = off). The margin uses raw logits.
        generator: source of all randomness (None = torch's global generator).
        num_drafts: [B] int, 0 <= n <= K: row b's chain is only its first n drafts; all accepted, its
            closing token is the bonus draw from p at column n.  Columns >= n are never verified (their
            ids must still be valid and their draft_probs rows distributions, but their values do not
            change the result).  None: every row has K.  Lets a drafter stop early per row.
        relax_prob: lam in [0, 1], mars only: where the rule would relax, relax with probability lam
            (the same uniform as the strict test), so a drafted x is accepted with a + lam (1 - a).
            1 is the paper's rule, 0 is strict (both bit for bit).  mars_code needs 1; at T = 0 only 0
            and 1 are allowed (see the module docstring).

    Returns:
        VerifyResult, each field [B, K+1] (``num_emitted`` [B]); see ``types.VerifyResult``.
    """
    check_scalars(rule, _ACCEPT, temperature, theta, top_k, top_p)
    check_relax_prob(relax_prob, rule, temperature)
    _check_chain_shapes(target_logits, draft_tokens, draft_probs)
    z = target_logits
    bsz, k1, vocab = z.shape
    k = k1 - 1
    dev = z.device
    greedy = temperature == 0
    rule_eff = "strict" if (greedy and rule == "mars_code") else rule
    draft_tokens = draft_tokens.long()

    d = target_dist(z, temperature, top_k, top_p)  # top-2 and normaliser at every position [B, K+1]
    t1, t2 = d.t1, d.t2
    ratio = margin_ratio(d.z1, d.z2)
    relax = ratio > theta if rule_eff == "mars_code" else relaxable(d.z1, ratio, theta)  # [B, K+1]

    flags = logit_flags("target_logits", d.z1) | token_range_flag("draft_tokens", draft_tokens, vocab)
    if draft_probs is not None:
        sums = draft_probs.sum(dim=-1).double()  # [B, K]  (fp32 pairwise sums: error ~1e-6)
        tol = 1e-3 if draft_probs.dtype in (torch.float32, torch.float64) else 2e-2
        flags[f"draft_probs rows must sum to 1 (got a row off by more than {tol:g})"] = ~(
            (sums - 1).abs() <= tol
        ).all()
        flags["draft_probs has negative entries"] = draft_probs.amin() < 0
    if num_drafts is not None:
        if num_drafts.shape != (bsz,) or num_drafts.is_floating_point():
            raise ValueError(f"num_drafts must be a [B] = [{bsz}] integer tensor, got {_shape(num_drafts)}")
        num_drafts = num_drafts.to(device=dev, dtype=torch.long)
        flags[f"num_drafts has values outside [0, {k}] (K = {k})"] = (
            (num_drafts < 0) | (num_drafts > k)
        ).any()
    raise_on_flags(flags)

    # Column K has no draft; give it a placeholder (t1) so every per-position tensor is [B, K+1].
    drafted = torch.cat([draft_tokens, t1[:, k:]], dim=1)  # [B, K+1]

    def q_at(tokens: torch.Tensor) -> torch.Tensor:
        """q(tokens) at the K draft positions; tokens [B, K] -> [B, K] float64."""
        if draft_probs is None:
            return (tokens == draft_tokens).double()
        return draft_probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1).double()

    u = (
        torch.zeros(bsz, k1, dtype=torch.float64, device=dev)
        if greedy
        else torch.rand((bsz, k1), dtype=torch.float64, device=dev, generator=generator)
    )
    top_t1, top_t2 = t1[:, :k], t2[:, :k]
    p_x = dist_logp(d, drafted)[:, :k].exp()

    # T = {t1, t2} within the filtered support: a token top-k / top-p removed (p = 0) is never relaxed to
    # (at T = 0 p is the point mass on t1 and T is the raw top-2: greedy mars relaxes t2 by design)
    def supported(p_v: torch.Tensor) -> torch.Tensor:
        return torch.ones_like(p_v, dtype=torch.bool) if greedy else p_v > 0

    pos = _Pos(
        u=u[:, :k],
        x=draft_tokens,
        p_x=p_x,
        q_x=q_at(draft_tokens),
        in_top2=((draft_tokens == top_t1) | (draft_tokens == top_t2)) & supported(p_x),
        relax=relax[:, :k],
        lam=float(relax_prob),
    )
    accept, relaxed = _ACCEPT[rule_eff](pos)  # [B, K] each
    col_idx = torch.arange(k1, device=dev).unsqueeze(0)  # [1, K+1]
    if num_drafts is None:
        n_drafted = torch.full((bsz,), k, dtype=torch.long, device=dev)
    else:
        n_drafted = num_drafts
        accept = accept & (col_idx[:, :k] < n_drafted.unsqueeze(1))
    n_acc = accept.long().cumprod(dim=1).sum(dim=1)  # [B] accepted drafts
    rows = torch.arange(bsz, device=dev)

    # --- the closing token at column n_acc: residual after a rejection, or the bonus draw ---
    closed_early = n_acc < n_drafted  # [B]
    if greedy:
        y_close = t1[rows, n_acc]
    else:
        p_c = dist_probs(d, (rows, n_acc))  # [B, V]
        col = n_acc.clamp(max=k - 1)
        x_tok = draft_tokens[rows, col]  # [B] the rejected draft (ignored for bonus rows)
        q_c = None if draft_probs is None else draft_probs[rows, col].float()
        w = _closing_weights(rule_eff, p_c, q_c, x_tok, closed_early, relax[rows, n_acc])
        y_close = sample_from_weights(w, u[:, k])

    # --- the per-token record ---
    emitted = col_idx <= n_acc.unsqueeze(1)  # [B, K+1]
    is_close = col_idx == n_acc.unsqueeze(1)
    y = torch.where(is_close, y_close.unsqueeze(1), drafted)  # [B, K+1], valid where emitted

    logp_y = dist_logp(d, y)  # [B, K+1]
    behavior = torch.empty_like(logp_y)
    behavior[:, k] = logp_y[:, k]  # bonus position: b = p
    y_d = y[:, :k]

    def full_sum(kind: str, need: torch.Tensor) -> torch.Tensor:
        """Full-vocabulary sums needed by the closed forms, only at emitted positions that use them."""
        if draft_probs is None:  # one-hot q on x: both sums are closed form
            p_x = pos.p_x
            if kind == "residual_mass":  # sum max(0, p - q) = 1 - min(p(x), 1)
                return 1.0 - p_x
            return (p_x < 1).double()  # sum a(v)/(1 - p(v)) = (1 - p(x)) / (1 - p(x))
        if greedy:  # p is the point mass on t1 (only mars gets here: mars_code at T = 0 is strict)
            return 1.0 - q_at(top_t1)
        out = torch.ones(bsz, k, dtype=torch.float64, device=dev)
        idx = (need & emitted[:, :k]).nonzero(as_tuple=True)
        out[idx] = _vocab_sums(kind, d, draft_probs, idx)
        return out

    p_t1, p_t2 = dist_logp(d, t1)[:, :k].exp(), dist_logp(d, t2)[:, :k].exp()
    probs = _Probs(
        p_y=logp_y[:, :k].exp(),
        q_y=q_at(y_d),
        p_t1=p_t1,
        p_t2=p_t2,
        q_t1=q_at(top_t1),
        q_t2=q_at(top_t2),
        y_is_t1=y_d == top_t1,
        y_is_t2=y_d == top_t2,
        t1_in=supported(p_t1),
        t2_in=supported(p_t2),
        relax=pos.relax,
        lam=float(relax_prob),
    )
    behavior[:, :k] = _BEHAVIOR[rule_eff](probs, full_sum).clamp_min(0).log()
    if num_drafts is not None:  # a bonus before column K (the row's chain was shorter): b = p there too
        behavior[:, :k] = torch.where(col_idx[:, :k] < n_drafted.unsqueeze(1), behavior[:, :k], logp_y[:, :k])

    verified = emitted[:, :k] & (col_idx[:, :k] < n_drafted.unsqueeze(1))  # [B, K] emitted at a draft

    def vocab_mass(kind: str, need: torch.Tensor) -> torch.Tensor:
        out = torch.zeros(bsz, k, dtype=torch.float64, device=dev)
        idx = (need & verified).nonzero(as_tuple=True)
        out[idx] = _vocab_sums(kind, d, draft_probs, idx)
        return out

    unsupported = torch.zeros(bsz, k1, device=dev)  # [B, K+1] float32; the bonus column has b = p
    dense = None if draft_probs is None else vocab_mass
    unsupported[:, :k] = torch.where(verified, _UNSUPPORTED[rule_eff](pos, probs, dense), 0.0).float()

    prov = torch.full((bsz, k1), int(Provenance.PAD), dtype=torch.int8, device=dev)
    acc_cols = col_idx[:, :k] < n_acc.unsqueeze(1)
    prov[:, :k] = torch.where(
        acc_cols,
        torch.where(relaxed, int(Provenance.RELAXED), int(Provenance.ACCEPTED)),
        int(Provenance.PAD),
    ).to(torch.int8)
    close_code = torch.where(closed_early, int(Provenance.RESAMPLED), int(Provenance.BONUS)).to(torch.int8)
    prov = torch.where(is_close, close_code.unsqueeze(1), prov)

    zero = torch.zeros((), device=dev)
    return VerifyResult(
        tokens=torch.where(emitted, y, -1),
        num_emitted=n_acc + 1,
        provenance=prov,
        target_logprob=torch.where(emitted, logp_y.float(), zero),
        behavior_logprob=torch.where(emitted, behavior.float(), zero),
        logit_ratio=torch.where(emitted, ratio, zero),
        is_top2=emitted & (y == t2),
        unsupported_mass=unsupported,
    )


def _closing_weights(
    rule: str,
    p: torch.Tensor,
    q: torch.Tensor | None,
    x: torch.Tensor,
    closed_early: torch.Tensor,
    relax_here: torch.Tensor,
) -> torch.Tensor:
    """Unnormalised weights of the closing draw, [B, V].

    p [B, V] target probs at the closing column; q [B, V] the draft's distribution there (None: one-hot on
    x); x [B] the rejected draft; closed_early [B] False for bonus rows (whose weights are p);
    relax_here [B] the rule's margin condition at the closing column.
    """
    x1 = x.unsqueeze(-1)
    if q is None:  # one-hot q: max(0, p - q) is p with p(x) zeroed, and so is mars_code's single-entry rule
        lowered = torch.zeros_like(p[:, :1])
        keep_p = ~closed_early | (relax_here if rule == "mars_code" else torch.zeros_like(closed_early))
        return torch.where(keep_p.unsqueeze(-1), p, p.scatter(-1, x1, lowered))
    q = q * closed_early.unsqueeze(-1)  # bonus rows: q = 0, so every weight below is p
    if rule == "mars_code":
        # below the threshold only the drafted entry is lowered; above it the full p is used
        lowered = (p.gather(-1, x1) - q.gather(-1, x1)).clamp_min(0)
        return torch.where((relax_here & closed_early).unsqueeze(-1), p, p.scatter(-1, x1, lowered))
    residual = (p - q).clamp_min_(0)
    # p == q exactly leaves no residual mass; rejection then has probability 0, so any choice is exact
    empty = residual.sum(dim=-1, keepdim=True) <= 0
    return torch.where(empty, p, residual)


def _vocab_sums(kind: str, d: TargetDist, draft_probs: torch.Tensor, idx: tuple) -> torch.Tensor:
    """Per-position sums over the vocabulary at the positions ``idx`` -> [M] float64.

    residual_mass: Z = sum_v max(0, p(v) - q(v)); code_rejection_sum: S = sum_v max(0, q - p) / (1 - p);
    mars_unsupported: sum of p over q == 0 where no token outside T ({t1, t2} within p's support) has
    q > p, else 0;
    code_unsupported: sum of p off {v in T: q(v) > 0} where q has no mass outside T, else 0.
    Rows are processed in blocks so the [M, V] temporaries stay small.  At T = 0 p is the point mass on t1.
    """
    n_rows = idx[0].numel()
    step = block_rows(n_rows, draft_probs.shape[-1], draft_probs.device)
    out = []
    for start in range(0, n_rows, step):
        sub = tuple(i[start : start + step] for i in idx)
        q = draft_probs[sub].float()
        if d.temperature > 0:
            p = dist_probs(d, sub)
        else:
            p = torch.zeros_like(q).scatter_(-1, d.t1[sub].unsqueeze(-1), 1.0)
        if kind == "residual_mass":
            out.append((p - q).clamp_min_(0).sum(-1).double())
        elif kind == "code_rejection_sum":
            a = (q - p).clamp_min_(0)
            out.append((a / (1 - p).clamp_min_(1e-30)).sum(-1).double())
        else:
            in_t = torch.zeros_like(q, dtype=torch.bool)  # [M, V] membership of T (within p's support)
            in_t.scatter_(-1, d.t1[sub].unsqueeze(-1), True).scatter_(-1, d.t2[sub].unsqueeze(-1), True)
            if d.temperature > 0:
                in_t &= p > 0
            if kind == "mars_unsupported":
                spill = ((q > p) & ~in_t).any(-1)
                mass = torch.where(q == 0, p, 0.0).sum(-1)
            else:
                spill = ((q > 0) & ~in_t).any(-1)
                mass = torch.where(in_t & (q > 0), 0.0, p).sum(-1)
            out.append(torch.where(spill, 0.0, mass).double())
    return torch.cat(out) if out else torch.zeros(0, dtype=torch.float64, device=draft_probs.device)


def _check_chain_shapes(target_logits, draft_tokens, draft_probs) -> None:
    if not isinstance(target_logits, torch.Tensor) or target_logits.dim() != 3:
        raise ValueError(f"target_logits must be a [B, K+1, V] tensor, got shape {_shape(target_logits)}")
    if not target_logits.is_floating_point():
        raise ValueError(f"target_logits must be floating point, got {target_logits.dtype}")
    if not isinstance(draft_tokens, torch.Tensor) or draft_tokens.dim() != 2:
        raise ValueError(f"draft_tokens must be a [B, K] tensor, got shape {_shape(draft_tokens)}")
    if draft_tokens.is_floating_point():
        raise ValueError(f"draft_tokens must be an integer tensor, got {draft_tokens.dtype}")
    bsz, k = draft_tokens.shape
    if k == 0:
        raise ValueError("draft_tokens has K = 0 draft positions; verification needs K >= 1")
    if tuple(target_logits.shape[:2]) != (bsz, k + 1):
        raise ValueError(
            f"target_logits must be [B, K+1, V] = [{bsz}, {k + 1}, V] for draft_tokens [{bsz}, {k}], "
            f"got {list(target_logits.shape)}"
        )
    if target_logits.shape[2] < 2:
        raise ValueError("target_logits needs a vocabulary of at least 2 tokens (top-2 margin)")
    if draft_probs is not None:
        want = (bsz, k, target_logits.shape[2])
        if not isinstance(draft_probs, torch.Tensor) or tuple(draft_probs.shape) != want:
            raise ValueError(f"draft_probs must be [B, K, V] = {list(want)}, got {_shape(draft_probs)}")
        if not draft_probs.is_floating_point():
            raise ValueError(f"draft_probs must be floating point, got {draft_probs.dtype}")


def _shape(t) -> str:
    return str(list(t.shape)) if isinstance(t, torch.Tensor) else type(t).__name__
