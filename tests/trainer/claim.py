"""The claim behind the trainer, on a problem small enough to enumerate: a policy over V = 8 tokens,
completions of exactly 3 tokens (512 of them), a fixed reward table A(y). The exact strict policy gradient

    g* = sum_y pi(y) A(y) grad log pi(y)

is computed by enumeration; N speculative rollouts estimate it with the recorded behaviour log-probs:

    sequence weights   ĝ = mean_i  W_i A(y_i) grad log pi(y_i),   W_i = prod_t pi(y_it) / b(y_it)
    token weights      ĝ = mean_i  A(y_i) sum_t w_it grad log pi(y_it | y_i<t)   (w clipped as in TRL)
    uncorrected        the same with w = 1.

Gradients are projected on D random parameter directions (central differences in float64), so each
estimate is a D-vector with a per-coordinate Monte Carlo standard error. Used by
tests/trainer/test_claim.py."""

from __future__ import annotations

import copy
import itertools
import math

import torch

from marsrl.algo import importance_weights
from marsrl.drafter import Eagle3Drafter
from marsrl.engine import EngineConfig, SamplingParams, SpeculativeEngine
from marsrl.testing import tiny_causal_lm
from marsrl.trajectory import collate

VOCAB, LENGTH, PROMPT = 8, 3, [1, 5, 2]


def problem(seed: int = 0, directions: int = 4):
    """(policy, head, all completions [512, 3], pi [512], A [512], J [512, 3, D]: per-token JVPs)."""
    policy = tiny_causal_lm(
        vocab=VOCAB, hidden=32, layers=3, heads=4, kv_heads=2, seed=seed, lm_head_scale=4.0
    )
    torch.manual_seed(seed + 1)
    head = Eagle3Drafter.from_target(policy)
    ys = torch.tensor(list(itertools.product(range(VOCAB), repeat=LENGTH)))  # [512, 3]
    ids = torch.cat([torch.tensor(PROMPT).expand(len(ys), -1), ys], dim=1)
    # directional derivatives of every token's log-prob by central differences on a float64 copy (no
    # forward-mode AD: other code in a test session may patch the forward with custom autograd functions)
    shadow = copy.deepcopy(policy).double()
    params = dict(shadow.named_parameters())
    gen = torch.Generator().manual_seed(seed + 2)
    tangents = [
        {k: torch.randn(v.shape, generator=gen).double() for k, v in params.items()}
        for _ in range(directions)
    ]

    @torch.no_grad()
    def token_logp(shift=None, eps=0.0):
        if shift is not None:
            for k, p in params.items():
                p.add_(eps * shift[k])
        logits = shadow(ids).logits[:, len(PROMPT) - 1 : -1]
        out = torch.log_softmax(logits, -1).gather(-1, ys.unsqueeze(-1)).squeeze(-1)  # [512, 3]
        if shift is not None:
            for k, p in params.items():
                p.sub_(eps * shift[k])
        return out

    eps = 1e-5
    lp = token_logp()
    jac = [(token_logp(tan, eps) - token_logp(tan, -eps)) / (2 * eps) for tan in tangents]
    pi = lp.sum(-1).exp().double()  # [512]
    reward = torch.randn(len(ys), generator=gen, dtype=torch.float64)
    return policy, head, ys, pi / pi.sum(), reward, torch.stack(jac, -1), lp


def rollouts(policy, head, n: int, seed: int, head_scale: float = 1.0, **engine):
    """n completions of the prompt from the speculative engine (T = 1, exactly 3 tokens). ``head_scale``
    sharpens a sampled draft's q (a peaked q over-proposes its tokens: relaxation becomes frequent)."""
    if head_scale != 1.0:
        head = copy.deepcopy(head)
        with torch.no_grad():
            head.lm_head.weight.mul_(head_scale)
    cfg = EngineConfig(max_batch_size=n, **engine)
    eng = SpeculativeEngine(policy, head, cfg)
    trajs = eng.generate(
        [PROMPT], SamplingParams(temperature=1.0, max_new_tokens=LENGTH, ignore_eos=True, n=n, seed=seed)
    )
    return trajs, eng.stats


def estimates(trajs, ys, pi, reward, jac, token_lp, clip_max: float = 3.0) -> dict:
    """Per estimator: (mean [D], se [D]) plus g* and the support figures."""
    batch = collate(trajs)
    comp = batch["completion_ids"]  # [N, 3]
    index = (comp * torch.tensor([VOCAB**2, VOCAB, 1])).sum(-1)  # row of each completion in ys
    policy_lp = token_lp[index]  # [N, 3]
    behavior = batch["behavior_logprobs"].double()
    mask = batch["mask"]
    a = reward[index]  # [N]
    j = jac[index]  # [N, 3, D]
    g_star = ((pi * reward)[:, None] * jac.sum(1)).sum(0)
    out = {"g_star": g_star}

    def summarise(name, per_sample):  # per_sample [N, D]
        out[name] = (per_sample.mean(0), per_sample.std(0) / math.sqrt(len(per_sample)))

    seq_w, _ = importance_weights(policy_lp, behavior, mask, mode="sequence")
    summarise("sequence", (seq_w[:, 0, None] * a[:, None]) * j.sum(1))
    summarise("uncorrected", a[:, None] * j.sum(1))
    for mode in ("token_truncate", "token_mask"):
        w, _ = importance_weights(policy_lp, behavior, mask, mode=mode, clip_max=clip_max)
        summarise(mode, a[:, None] * (w.double()[:, :, None] * j).sum(1))
    seen = torch.zeros(len(ys), dtype=torch.bool)
    seen[index] = True
    out["pi_unseen"] = float(pi[~seen].sum())
    out["g_star_seen"] = (((pi * reward) * seen)[:, None] * jac.sum(1)).sum(0)
    out["unsupported_mass"] = float(batch["unsupported_mass"][mask].double().mean())
    out["relaxed_frac"] = float((batch["provenance"] == 2).sum() / mask.sum())
    return out


def z_scores(est: dict, name: str, against: str = "g_star") -> torch.Tensor:
    mean, se = est[name]
    return (mean - est[against]) / se
