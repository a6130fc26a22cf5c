"""Slow, loop-based reference implementation of the verification rules (strict, mars, mars_code).

This is a test oracle: the vectorised verifiers (``chain.py``, ``tree.py``) are checked against it
token for token. It is never used on a hot path. Everything here loops in Python over batch rows,
positions and siblings, works on 1-D float64 vectors, and computes behaviour probabilities by
*enumerating* what the procedure can do (never by a closed form), so that it is a check on the
closed forms rather than a copy of them. The rules themselves are in ``docs/concepts.md``.

Conventions the fast code must share to match exactly:

* Sampling distribution p: ``logits.double() / T``; top-k keeps every token whose value is >= the
  k-th largest (ties at the boundary are all kept); top-p then sorts the post-top-k probabilities
  descending (stable: lower index first among equals) and keeps a token iff the mass ranked strictly
  before it is < top_p (the first token is always kept); p is the softmax over the kept tokens.
  ``top_k`` None or <= 0 and ``top_p`` None or >= 1 disable the filter. At T == 0, p is the one-hot
  on the first argmax of the raw logits (top-k/top-p cannot change the argmax).
* Top-2 by raw logits, the first index winning ties. r = z2 / z1 (NaN when z1 == 0).
  mars relaxes iff ``z1 > 0 and r > theta``; mars_code iff ``r > theta`` (no guard) and never at T == 0.
  Both relax only to T = {t1, t2} within p's support (a token top-k / top-p removed is never relaxed
  to); at T == 0, to the raw top-2.
* Uniforms (float64), chain ``[B, K+1]``: column j < K is draft j's acceptance uniform, column K
  draws the round's closing token (whether after a rejection or as the bonus). Tree ``[B, D*C+1]``:
  the k-th sibling at path level j uses column ``j*C + k``; the last column draws the closing token.
  At T == 0 no uniform is read (``uniforms`` may be None) and the closing token is t1.
* Strict test: ACCEPTED iff ``u * q(x) < p(x)`` (chain) / ``u * rem < p_adj(s)`` (tree, q = 1) /
  ``u * q * rem < p_adj(s)`` (tree, mars_code). A rejected uniform is never reused for the draw.
* relax_prob lam (mars): a relaxable draft that failed the strict test is RELAXED iff lam == 1 or
  ``u * q(x) < p(x) + lam * (q(x) - p(x))`` (tree: ``u * rem < p_adj(s) + lam * (rem - p_adj(s))``),
  i.e. u < a + lam (1 - a) on the same uniform. It must be 1 under mars_code, and 0 or 1 at T == 0.
* Drawing from unnormalised weights w with uniform u: the first index whose cumulative weight is
  strictly greater than ``u * sum(w)`` (``searchsorted(cumsum(w), u * total, right=True)``, clamped
  to V - 1); zero-weight tokens are never drawn.
* Outputs follow ``types.py``: int64 tokens (-1 padding), int8 provenance (PAD padding), float32
  log-probs and ratios (0.0 padding; ``-inf`` kept where the emitted token has p = 0), bool is_top2.
* Unsupported mass: the sum of p over the tokens the position can never emit, found by enumerating the
  branches with a positive chance (never from the closed forms); 0 at the bonus position.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch

from marsrl.verify.types import DEFAULT_THETA, Provenance, TreeVerifyResult, VerifyResult

Rule = Literal["strict", "mars", "mars_code"]
_RULES = ("strict", "mars", "mars_code")


# ----------------------------------------------------------------------------------------------------
# One position: the target's distribution and its margin
# ----------------------------------------------------------------------------------------------------


def _first_argmax(values: list[float]) -> int:
    """Index of the first maximum (a plain loop, so the tie rule is explicit)."""
    best = 0
    for i in range(1, len(values)):
        if values[i] > values[best]:
            best = i
    return best


def reference_sampling_probs(
    logits_row: torch.Tensor, temperature: float, top_k: int | None = None, top_p: float | None = None
) -> torch.Tensor:
    """The target's sampling distribution p for one position: logits_row [V] -> [V] float64."""
    z = logits_row.double()
    vocab = z.numel()
    if temperature == 0:
        p = torch.zeros(vocab, dtype=torch.float64)
        p[_first_argmax(z.tolist())] = 1.0
        return p

    x = (z / temperature).tolist()
    keep = [True] * vocab
    if top_k is not None and 0 < top_k < vocab:
        kth = sorted(x, reverse=True)[top_k - 1]
        keep = [v >= kth for v in x]  # a threshold: every token tied with the k-th value survives

    if top_p is not None and top_p < 1.0:
        probs = _softmax_over(x, keep).tolist()
        order = sorted(range(vocab), key=lambda i: -probs[i])  # Python's sort is stable: low index first
        mass_before = 0.0
        for rank, i in enumerate(order):
            if rank > 0 and not mass_before < top_p:
                keep[i] = False
            mass_before += probs[i]

    return _softmax_over(x, keep)


def _softmax_over(x: list[float], keep: list[bool]) -> torch.Tensor:
    """Softmax of x restricted to the kept entries (the others get probability 0), float64."""
    masked = torch.tensor([v if k else -math.inf for v, k in zip(x, keep, strict=True)], dtype=torch.float64)
    return torch.softmax(masked, dim=0)


def reference_top2(logits_row: torch.Tensor) -> tuple[int, int, float, float]:
    """(t1, t2, z1, z2): the top-1 and top-2 token by raw logits, first index winning ties."""
    values = logits_row.double().tolist()
    if len(values) < 2:
        raise ValueError("reference_top2 needs a vocabulary of at least 2 tokens")
    t1 = _first_argmax(values)
    t2 = -1
    for i, v in enumerate(values):
        if i != t1 and (t2 < 0 or v > values[t2]):
            t2 = i
    return t1, t2, values[t1], values[t2]


def reference_logit_ratio(z1: float, z2: float) -> float:
    """r = z2 / z1, NaN when z1 == 0 (the ratio is undefined there)."""
    return math.nan if z1 == 0 else z2 / z1


def reference_relax_flag(z1: float, z2: float, theta: float, rule: Rule, temperature: float) -> bool:
    """Whether the rule may relax at this position: R for mars, Rc for mars_code, False for strict."""
    r = reference_logit_ratio(z1, z2)
    if rule == "mars":
        return z1 > 0 and r > theta
    if rule == "mars_code":
        # The released code has no z1 guard (NaN compares False) and never relaxes when greedy.
        return temperature != 0 and r > theta
    return False


@dataclass(frozen=True)
class _Position:
    """Everything a rule needs about one verification position (chain position or tree node)."""

    p: torch.Tensor  # [V] float64 sampling distribution
    t1: int
    t2: int
    ratio: float  # z2 / z1 on raw logits
    relax: bool  # R (mars) or Rc (mars_code); False for strict
    rule: str
    temperature: float
    relax_prob: float = 1.0  # lam: the chance of relaxing once the strict test failed (mars)

    def in_top2(self, token: int) -> bool:
        """token in T: the raw top-2 within p's support (a token the filters removed is never relaxed
        to); at T == 0 the raw top-2 itself."""
        return token in (self.t1, self.t2) and (self.temperature == 0 or float(self.p[token]) > 0)


def _position(logits_row, rule, temperature, theta, top_k, top_p, relax_prob) -> _Position:
    t1, t2, z1, z2 = reference_top2(logits_row)
    return _Position(
        p=reference_sampling_probs(logits_row, temperature, top_k, top_p),
        t1=t1,
        t2=t2,
        ratio=reference_logit_ratio(z1, z2),
        relax=reference_relax_flag(z1, z2, theta, rule, temperature),
        rule=rule,
        temperature=temperature,
        relax_prob=relax_prob,
    )


def _relaxed_accept(a: float, lam: float) -> float:
    """The chance a relaxable draft is accepted: a + lam (1 - a) (exactly 1 at lam == 1)."""
    return 1.0 if lam >= 1 else a + lam * (1.0 - a)


def _lucky(u: float, scale: float, p: float, lam: float) -> bool:
    """Whether a relaxable draft that failed the strict test ``u * scale < p`` is relaxed."""
    return lam >= 1 or u * scale < p + lam * (scale - p)


def _bounded_ratio(num: float, den: float) -> float:
    """min(1, num / den) clipped to [0, 1]; den <= 0 accepts iff num > 0, as the test u * den < num does."""
    if den <= 0:
        return 1.0 if num > 0 else 0.0
    return min(1.0, max(0.0, num / den))


def _draw(pos: _Position, weights: torch.Tensor, u: float | None) -> int:
    """Inverse-CDF draw from unnormalised weights; at T == 0 the closing token is t1 (no uniform)."""
    if pos.temperature == 0:
        return pos.t1
    cdf = torch.cumsum(weights, 0)
    target = (u * cdf[-1]).reshape(1)
    index = int(torch.searchsorted(cdf, target, right=True)[0])
    return min(index, weights.numel() - 1)


def _log(prob: float) -> float:
    return math.log(prob) if prob > 0 else -math.inf


def _bare_position(p, t1, t2, relax_flag, rule, temperature, relax_prob) -> _Position:
    """A _Position from an explicit p and relax flag (the behaviour enumerations' entry point)."""
    _check_rule(rule)
    _check_relax_prob(relax_prob, rule, temperature)
    relax = bool(relax_flag) and rule != "strict" and not (rule == "mars_code" and temperature == 0)
    return _Position(
        p=p.double(), t1=t1, t2=t2, ratio=math.nan, relax=relax, rule=rule, temperature=temperature,
        relax_prob=float(relax_prob),
    )  # fmt: skip


# ----------------------------------------------------------------------------------------------------
# Chain rules: one candidate x at one position
# ----------------------------------------------------------------------------------------------------


def _chain_step(pos: _Position, q: torch.Tensor, x: int, u: float | None) -> tuple[float, Provenance | None]:
    """(a, verdict) for draft token x with draft distribution q.

    a is the probability that x is accepted (by either route); verdict is the outcome for the
    uniform u (ACCEPTED, RELAXED or None for a rejection). With u None only a is meaningful, except
    where the outcome needs no uniform (T == 0, mars_code relaxing).
    """
    if pos.temperature == 0:
        # p is the one-hot on t1: strict accepts exactly t1; mars also a t2 at a near tie (lam is 0 or 1).
        if x == pos.t1:
            return 1.0, Provenance.ACCEPTED
        if pos.rule == "mars" and pos.relax and x == pos.t2 and pos.relax_prob > 0:
            return 1.0, Provenance.RELAXED
        return 0.0, None

    if pos.rule == "mars_code" and pos.relax:
        # Released code: a top-1/top-2 draft is taken outright, anything else ends the round.
        return (1.0, Provenance.RELAXED) if pos.in_top2(x) else (0.0, None)

    p_x, q_x = float(pos.p[x]), float(q[x])
    relaxed_ok = pos.rule == "mars" and pos.relax and pos.in_top2(x)
    a = _bounded_ratio(p_x, q_x)
    if relaxed_ok:
        a = _relaxed_accept(a, pos.relax_prob)
    if u is None:
        return a, None
    if u * q_x < p_x:  # the strict test is always tried first, so ACCEPTED means "strict would accept"
        return a, Provenance.ACCEPTED
    if relaxed_ok and _lucky(u, q_x, p_x, pos.relax_prob):
        return a, Provenance.RELAXED
    return a, None


def _chain_close_weights(pos: _Position, q: torch.Tensor, x: int) -> torch.Tensor:
    """Unnormalised weights of the token emitted after x is rejected."""
    if pos.temperature == 0:
        return pos.p.clone()  # the point mass on t1
    if pos.rule == "mars_code":
        w = pos.p.clone()
        if not pos.relax:
            # The released code subtracts only the rejected entry, not the whole draft distribution.
            w[x] = max(0.0, float(pos.p[x]) - float(q[x]))
        # With relaxation on and x outside the top-2, the round closes from the full p.
    else:
        w = torch.clamp(pos.p - q, min=0.0)
    if float(w.sum()) <= 0:
        w = pos.p.clone()
    return w


def reference_behavior_distribution_chain(
    p: torch.Tensor,
    q: torch.Tensor,
    t1: int,
    t2: int,
    R: bool,
    rule: Rule,
    temperature: float,
    relax_prob: float = 1.0,
) -> torch.Tensor:
    """b [V] float64: the probability that one chain position emits each token, by enumeration.

    b(y) = sum over x with q(x) > 0 of q(x) * [a(x) * 1{y == x} + (1 - a(x)) * w_x(y) / sum(w_x)].
    R is the rule's relax flag (R for mars, Rc for mars_code; ignored by strict and at T == 0 by
    mars_code). q is used as given (not renormalised), so b sums to sum(q). relax_prob: lam (mars).
    """
    pos = _bare_position(p, t1, t2, R, rule, temperature, relax_prob)
    q = q.double()
    b = torch.zeros_like(pos.p)
    for x in range(pos.p.numel()):
        q_x = float(q[x])
        if q_x <= 0:
            continue
        a, _ = _chain_step(pos, q, x, None)
        b[x] += q_x * a
        if a < 1.0:
            w = _chain_close_weights(pos, q, x)
            b += q_x * (1.0 - a) * w / w.sum()
    return b


def reference_unsupported_mass_chain(
    p: torch.Tensor,
    q: torch.Tensor,
    t1: int,
    t2: int,
    R: bool,
    rule: Rule,
    temperature: float,
    relax_prob: float = 1.0,
) -> float:
    """Sum of p(y) over the tokens y one chain position can never emit, by enumerating its branches:
    every x with q(x) > 0 is emitted when its acceptance chance is positive, and when that chance is
    below 1 its rejection can emit every token with a positive closing weight."""
    pos = _bare_position(p, t1, t2, R, rule, temperature, relax_prob)
    q = q.double()
    reachable = torch.zeros(pos.p.numel(), dtype=torch.bool)
    for x in range(pos.p.numel()):
        if float(q[x]) <= 0:
            continue
        a, _ = _chain_step(pos, q, x, None)
        if a > 0:
            reachable[x] = True
        if a < 1.0:
            reachable |= _chain_close_weights(pos, q, x) > 0
    return float(pos.p[~reachable].sum())


# ----------------------------------------------------------------------------------------------------
# Tree rules: the siblings of one node, walked in order
# ----------------------------------------------------------------------------------------------------


def _tree_step(
    pos: _Position, p_adj: torch.Tensor, rem: float, s: int, q: float, u: float | None
) -> tuple[float, Provenance | None]:
    """(a, verdict) for sibling token s given the adjusted distribution so far (p_adj, mass rem).

    Same contract as ``_chain_step``: a is the acceptance probability of this sibling given that all
    earlier siblings were rejected; the verdict needs u except where the outcome is deterministic.
    """
    if pos.temperature == 0:
        if s == pos.t1:
            return 1.0, Provenance.ACCEPTED
        if pos.rule == "mars" and pos.relax and s == pos.t2 and pos.relax_prob > 0:
            return 1.0, Provenance.RELAXED
        return 0.0, None

    if pos.rule == "mars_code":
        if pos.relax:
            # The first top-1/top-2 sibling is taken; earlier ones are skipped without a draw.
            return (1.0, Provenance.RELAXED) if pos.in_top2(s) else (0.0, None)
        # Uses the draft's real probability q of this sibling.
        a = _bounded_ratio(float(p_adj[s]), rem * q)
        if u is None:
            return a, None
        return a, (Provenance.ACCEPTED if u * q * rem < float(p_adj[s]) else None)

    # strict / mars: EAGLE's recursive rejection with deterministic proposals (q = 1).
    relaxed_ok = pos.rule == "mars" and pos.relax and pos.in_top2(s)
    p_s = float(p_adj[s])
    a = _bounded_ratio(p_s, rem)
    if relaxed_ok:
        a = _relaxed_accept(a, pos.relax_prob)
    if u is None:
        return a, None
    if u * rem < p_s:
        return a, Provenance.ACCEPTED
    if relaxed_ok and _lucky(u, rem, p_s, pos.relax_prob):
        return a, Provenance.RELAXED
    return a, None


def _tree_reject(pos: _Position, p_adj: torch.Tensor, rem: float, s: int, q: float) -> float:
    """Update p_adj in place after sibling s is rejected; returns the new remaining mass."""
    if pos.temperature == 0 or (pos.rule == "mars_code" and pos.relax):
        return rem  # nothing is adjusted: the closing token is t1 / drawn from the full p
    p_s = float(p_adj[s])
    removed = min(p_s, q) if pos.rule == "mars_code" else p_s
    p_adj[s] = p_s - removed
    return rem - removed


def _tree_close_weights(pos: _Position, p_adj: torch.Tensor) -> torch.Tensor:
    """Unnormalised weights of the token emitted after every sibling was rejected."""
    if pos.temperature == 0 or (pos.rule == "mars_code" and pos.relax):
        return pos.p.clone()  # T == 0: the point mass on t1; mars_code relaxing: the full p
    w = p_adj.clone()
    if float(w.sum()) <= 0:  # only reachable through rounding when the siblings covered all of p
        w = pos.p.clone()
    return w


@dataclass(frozen=True)
class _NodeWalk:
    accept_probs: list[float]  # a_k for the siblings walked (all of them unless one was accepted)
    accepted: int | None  # sibling index accepted, or None when every sibling was rejected
    provenance: Provenance | None  # ACCEPTED / RELAXED for the accepted sibling
    close_weights: torch.Tensor | None  # [V] closing weights when every sibling was rejected


def _walk_siblings(
    pos: _Position, siblings: list[int], sibling_q: list[float], decide: bool, uniforms: list[float] | None
) -> _NodeWalk:
    """Walk one node's siblings in order. decide=False rejects every sibling (the path the behaviour
    enumeration needs); decide=True stops at the first accepted one, using uniforms[k] for sibling k."""
    p_adj = pos.p.clone()
    rem = 1.0
    accept_probs = []
    for k, (s, q) in enumerate(zip(siblings, sibling_q, strict=True)):
        u = uniforms[k] if (decide and uniforms is not None) else None
        a, verdict = _tree_step(pos, p_adj, rem, s, q, u)
        accept_probs.append(a)
        if decide and verdict is not None:
            return _NodeWalk(accept_probs, k, verdict, None)
        rem = _tree_reject(pos, p_adj, rem, s, q)
    return _NodeWalk(accept_probs, None, None, _tree_close_weights(pos, p_adj))


def reference_behavior_distribution_tree(
    p: torch.Tensor,
    t1: int,
    t2: int,
    relax_flag: bool,
    sibling_tokens: list[int],
    sibling_q: list[float],
    rule: Rule,
    temperature: float,
    relax_prob: float = 1.0,
) -> torch.Tensor:
    """b [V] float64: the probability that a tree node with these siblings emits each token.

    b(y) = sum_k 1{s_k == y} reach_k a_k + reach_{m+1} w(y) / sum(w), reach_1 = 1,
    reach_{k+1} = reach_k (1 - a_k), with a_k computed along the all-rejected path. A node without
    siblings emits from p. relax_flag is R for mars, Rc for mars_code; relax_prob: lam (mars).
    """
    pos = _bare_position(p, t1, t2, relax_flag, rule, temperature, relax_prob)
    p = pos.p
    if not sibling_tokens:
        return p / p.sum()
    walk = _walk_siblings(pos, list(sibling_tokens), [float(q) for q in sibling_q], False, None)
    b = torch.zeros_like(p)
    reach = 1.0
    for s, a in zip(sibling_tokens, walk.accept_probs, strict=True):
        b[s] += reach * a
        reach *= 1.0 - a
    w = walk.close_weights
    return b + reach * w / w.sum()


def reference_unsupported_mass_tree(
    p: torch.Tensor,
    t1: int,
    t2: int,
    relax_flag: bool,
    sibling_tokens: list[int],
    sibling_q: list[float],
    rule: Rule,
    temperature: float,
    relax_prob: float = 1.0,
) -> float:
    """Sum of p(y) over the tokens y a tree node with these siblings can never emit, by walking them:
    a sibling is emitted when its acceptance chance (once reached) is positive, the walk goes on only
    while that chance is below 1, and if it gets past them all, every token of positive closing weight."""
    pos = _bare_position(p, t1, t2, relax_flag, rule, temperature, relax_prob)
    if not sibling_tokens:
        return 0.0
    walk = _walk_siblings(pos, list(sibling_tokens), [float(q) for q in sibling_q], False, None)
    reachable = torch.zeros(pos.p.numel(), dtype=torch.bool)
    for s, a in zip(sibling_tokens, walk.accept_probs, strict=True):
        if a > 0:
            reachable[s] = True
        if a >= 1.0:
            break
    else:
        reachable |= walk.close_weights > 0
    return float(pos.p[~reachable].sum())


# ----------------------------------------------------------------------------------------------------
# Whole rounds
# ----------------------------------------------------------------------------------------------------


def _check_rule(rule: str) -> None:
    if rule not in _RULES:
        raise ValueError(f"rule must be one of {_RULES}, got {rule!r}")


def _check_relax_prob(relax_prob: float, rule: str, temperature: float) -> None:
    if not 0 <= relax_prob <= 1:
        raise ValueError(f"relax_prob must be in [0, 1], got {relax_prob!r}")
    if rule == "mars_code" and relax_prob != 1:
        raise ValueError("relax_prob must be 1 under mars_code")
    if rule == "mars" and temperature == 0 and 0 < relax_prob < 1:
        raise ValueError("relax_prob must be 0 or 1 at temperature 0")


def _check_scalars(rule: str, temperature: float, uniforms, expected_uniform_cols: int, batch: int) -> None:
    _check_rule(rule)
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if uniforms is None:
        if temperature > 0:
            raise ValueError("uniforms are required when temperature > 0")
        return
    if tuple(uniforms.shape) != (batch, expected_uniform_cols):
        raise ValueError(f"uniforms must be [{batch}, {expected_uniform_cols}], got {tuple(uniforms.shape)}")


class _Record:
    """Row-by-row writer of the per-token fields, pre-filled with the padding values."""

    def __init__(self, batch: int, cols: int):
        self.tokens = torch.full((batch, cols), -1, dtype=torch.int64)
        self.provenance = torch.full((batch, cols), int(Provenance.PAD), dtype=torch.int8)
        self.target_logprob = torch.zeros(batch, cols, dtype=torch.float32)
        self.behavior_logprob = torch.zeros(batch, cols, dtype=torch.float32)
        self.logit_ratio = torch.zeros(batch, cols, dtype=torch.float32)
        self.is_top2 = torch.zeros(batch, cols, dtype=torch.bool)
        self.unsupported_mass = torch.zeros(batch, cols, dtype=torch.float32)
        self.num_emitted = torch.zeros(batch, dtype=torch.int64)

    def emit(
        self,
        b: int,
        col: int,
        y: int,
        provenance: Provenance,
        pos: _Position,
        behavior: torch.Tensor,
        unsupported: float = 0.0,
    ):
        self.unsupported_mass[b, col] = unsupported
        self.tokens[b, col] = y
        self.provenance[b, col] = int(provenance)
        self.target_logprob[b, col] = _log(float(pos.p[y]))
        self.behavior_logprob[b, col] = _log(float(behavior[y]))
        self.logit_ratio[b, col] = pos.ratio
        self.is_top2[b, col] = y == pos.t2
        self.num_emitted[b] = col + 1


def reference_verify_chain(
    target_logits: torch.Tensor,
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None,
    *,
    rule: Rule,
    temperature: float,
    theta: float = DEFAULT_THETA,
    top_k: int | None = None,
    top_p: float | None = None,
    uniforms: torch.Tensor | None = None,
    num_drafts: torch.Tensor | None = None,
    relax_prob: float = 1.0,
) -> VerifyResult:
    """Verify a batch of draft chains one position at a time.

    target_logits [B, K+1, V]; draft_tokens [B, K]; draft_probs [B, K, V] (the draft's q, in the
    target vocabulary) or None for a greedy draft (q = one-hot on the drafted token);
    uniforms [B, K+1] float64 (None allowed at T == 0); num_drafts [B] (None: K each): row b verifies
    only its first num_drafts[b] drafts and, all accepted, draws its bonus at that column;
    relax_prob: lam, the chance a relaxable draft that failed the strict test is relaxed (mars).
    """
    batch, k_plus_1, vocab = target_logits.shape
    k = k_plus_1 - 1
    if tuple(draft_tokens.shape) != (batch, k):
        raise ValueError(f"draft_tokens must be [{batch}, {k}], got {tuple(draft_tokens.shape)}")
    if draft_probs is not None and tuple(draft_probs.shape) != (batch, k, vocab):
        raise ValueError(f"draft_probs must be [{batch}, {k}, {vocab}]")
    _check_scalars(rule, temperature, uniforms, k + 1, batch)
    _check_relax_prob(relax_prob, rule, temperature)
    u_rows = None if uniforms is None else uniforms.double().tolist()

    out = _Record(batch, k + 1)
    lengths = [k] * batch if num_drafts is None else [int(n) for n in num_drafts]
    for b in range(batch):
        closing_u = None if u_rows is None else u_rows[b][k]
        for j in range(lengths[b]):
            pos = _position(target_logits[b, j], rule, temperature, theta, top_k, top_p, relax_prob)
            x = int(draft_tokens[b, j])
            if draft_probs is None:
                q = torch.zeros(vocab, dtype=torch.float64)
                q[x] = 1.0
            else:
                q = draft_probs[b, j].double()
            behavior = reference_behavior_distribution_chain(
                pos.p, q, pos.t1, pos.t2, pos.relax, rule, temperature, relax_prob
            )
            unsupported = reference_unsupported_mass_chain(
                pos.p, q, pos.t1, pos.t2, pos.relax, rule, temperature, relax_prob
            )
            u = None if u_rows is None else u_rows[b][j]
            _, verdict = _chain_step(pos, q, x, u)
            if verdict is not None:
                out.emit(b, j, x, verdict, pos, behavior, unsupported)
                continue
            y = _draw(pos, _chain_close_weights(pos, q, x), closing_u)
            out.emit(b, j, y, Provenance.RESAMPLED, pos, behavior, unsupported)
            break
        else:
            # Every draft accepted: the bonus token comes from p after the last one (b = p there).
            pos = _position(target_logits[b, lengths[b]], rule, temperature, theta, top_k, top_p, relax_prob)
            y = _draw(pos, pos.p, closing_u)
            out.emit(b, lengths[b], y, Provenance.BONUS, pos, pos.p)

    return VerifyResult(
        tokens=out.tokens,
        num_emitted=out.num_emitted,
        provenance=out.provenance,
        target_logprob=out.target_logprob,
        behavior_logprob=out.behavior_logprob,
        logit_ratio=out.logit_ratio,
        is_top2=out.is_top2,
        unsupported_mass=out.unsupported_mass,
    )


def _tree_structure(tree_tokens: torch.Tensor, parents: torch.Tensor) -> tuple[list[dict], int, int]:
    """Per row, {node (-1 = root): valid children in index order}; then D (max depth) and C (max
    number of valid children of any node), both over the whole batch."""
    batch, num_nodes = tree_tokens.shape
    children_per_row = []
    max_depth = 0
    max_children = 0
    for b in range(batch):
        tokens = tree_tokens[b].tolist()
        parent = parents[b].tolist()
        depth = [0] * num_nodes
        children: dict[int, list[int]] = {}
        for i in range(num_nodes):
            if tokens[i] == -1:
                continue  # a padding node: not in the tree, whatever its parent entry says
            if parent[i] >= i or (parent[i] >= 0 and tokens[parent[i]] == -1):
                raise ValueError(f"parents[{b}, {i}] = {parent[i]} must be -1 or a valid node < {i}")
            depth[i] = 1 if parent[i] < 0 else depth[parent[i]] + 1
            children.setdefault(parent[i], []).append(i)
            max_depth = max(max_depth, depth[i])
        for kids in children.values():
            max_children = max(max_children, len(kids))
        children_per_row.append(children)
    return children_per_row, max_depth, max_children


def reference_verify_tree(
    target_logits: torch.Tensor,
    tree_tokens: torch.Tensor,
    parents: torch.Tensor,
    draft_probs: torch.Tensor | None,
    *,
    rule: Rule,
    temperature: float,
    theta: float = DEFAULT_THETA,
    top_k: int | None = None,
    top_p: float | None = None,
    uniforms: torch.Tensor | None = None,
    relax_prob: float = 1.0,
) -> TreeVerifyResult:
    """Verify a batch of draft trees by walking each from the root.

    target_logits [B, N+1, V] (row 0 the root, row i+1 node i); tree_tokens [B, N] (-1 = padding
    node); parents [B, N] (-1 = child of the root, else a smaller node index); draft_probs [B, N]
    (the draft's probability of each node's token, only used by mars_code; None = 1.0);
    uniforms [B, D*C+1] float64 (None allowed at T == 0); relax_prob: lam (mars).
    """
    batch, n_plus_1, _ = target_logits.shape
    num_nodes = n_plus_1 - 1
    for name, tensor in (("tree_tokens", tree_tokens), ("parents", parents), ("draft_probs", draft_probs)):
        if tensor is not None and tuple(tensor.shape) != (batch, num_nodes):
            raise ValueError(f"{name} must be [{batch}, {num_nodes}], got {tuple(tensor.shape)}")
    children_per_row, max_depth, max_children = _tree_structure(tree_tokens, parents)
    _check_scalars(rule, temperature, uniforms, max_depth * max_children + 1, batch)
    _check_relax_prob(relax_prob, rule, temperature)
    u_rows = None if uniforms is None else uniforms.double().tolist()
    q_rows = None if draft_probs is None else draft_probs.double().tolist()

    out = _Record(batch, max_depth + 1)
    path_nodes = torch.full((batch, max_depth + 1), -1, dtype=torch.int64)
    for b in range(batch):
        children = children_per_row[b]
        closing_u = None if u_rows is None else u_rows[b][-1]
        node, level = -1, 0
        while True:
            pos = _position(target_logits[b, node + 1], rule, temperature, theta, top_k, top_p, relax_prob)
            kids = children.get(node, [])
            if not kids:
                # The path reached a leaf: bonus token from p at that node.
                out.emit(b, level, _draw(pos, pos.p, closing_u), Provenance.BONUS, pos, pos.p)
                break
            sib_tokens = [int(tree_tokens[b, i]) for i in kids]
            sib_q = [1.0 if q_rows is None else q_rows[b][i] for i in kids]
            level_u = None
            if u_rows is not None:
                start = level * max_children
                level_u = u_rows[b][start : start + len(kids)]
            behavior = reference_behavior_distribution_tree(
                pos.p, pos.t1, pos.t2, pos.relax, sib_tokens, sib_q, rule, temperature, relax_prob
            )
            unsupported = reference_unsupported_mass_tree(
                pos.p, pos.t1, pos.t2, pos.relax, sib_tokens, sib_q, rule, temperature, relax_prob
            )
            walk = _walk_siblings(pos, sib_tokens, sib_q, True, level_u)
            if walk.accepted is None:
                y = _draw(pos, walk.close_weights, closing_u)
                out.emit(b, level, y, Provenance.RESAMPLED, pos, behavior, unsupported)
                break
            node = kids[walk.accepted]
            out.emit(b, level, sib_tokens[walk.accepted], walk.provenance, pos, behavior, unsupported)
            path_nodes[b, level] = node
            level += 1

    return TreeVerifyResult(
        tokens=out.tokens,
        num_emitted=out.num_emitted,
        path_nodes=path_nodes,
        provenance=out.provenance,
        target_logprob=out.target_logprob,
        behavior_logprob=out.behavior_logprob,
        logit_ratio=out.logit_ratio,
        is_top2=out.is_top2,
        unsupported_mass=out.unsupported_mass,
    )
