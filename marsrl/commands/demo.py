"""The CPU demonstration: strict vs mars vs mars_code on synthetic LLM-like logits.

Builds target logits in which a configurable share of positions has a near tie between the top two
tokens (what MARS exploits), a draft that is a noisy copy of the target (what a trained EAGLE head
approximates), and verifies many independent K-token chains with each rule on the same inputs and
seed.  It measures the verification core only (``marsrl rollouts`` runs the engine on the tiny world).

Deliberately left out: models, KV caches, real text. Positions are independent (the logits of
position j do not depend on the token emitted at j - 1), which is exact for the quantities reported.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..algo import bias_metrics
from ..verify import DEFAULT_THETA, RULES, Provenance, verify_chain
from .table import BIAS_ROWS, side_by_side


@dataclass(frozen=True)
class DemoConfig:
    """Settings of ``marsrl demo``. Every field can be set in YAML or with ``--set key=value``."""

    rules: tuple[str, ...] = RULES  # which verification rules to compare (same inputs, same seed)
    temperature: float = 1.0  # target sampling temperature; 0 = greedy verification
    theta: float = DEFAULT_THETA  # MARS margin threshold on z2/z1
    draft_len: int = 7  # K, drafted tokens per round
    vocab: int = 4096  # V of the synthetic target
    rounds: int = 4000  # independent verification rounds (rows) per rule
    near_tie_frac: float = 0.3  # share of positions whose top-2 logits nearly tie (ratio in [0.92, 0.99])
    draft_noise: float = 1.0  # std of the noise that turns target logits into draft logits
    greedy_draft: bool = True  # True: the draft proposes its argmax (EAGLE); False: samples from q
    seed: int = 0

    def __post_init__(self):
        bad = sorted(set(self.rules) - set(RULES))
        if not self.rules or bad:
            raise ValueError(f"rules must be a non-empty subset of {list(RULES)}, got {list(self.rules)}")
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not self.theta >= 0:
            raise ValueError(f"theta must be >= 0, got {self.theta}")
        for name in ("draft_len", "rounds"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.vocab < 4:
            raise ValueError(f"vocab must be >= 4, got {self.vocab}")
        if not 0.0 <= self.near_tie_frac <= 1.0:
            raise ValueError(f"near_tie_frac must be in [0, 1], got {self.near_tie_frac}")
        if not self.draft_noise >= 0:
            raise ValueError(f"draft_noise must be >= 0, got {self.draft_noise}")


def synthetic_logits(cfg: DemoConfig, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Target logits [R, K+1, V] with a confident head and controlled near ties; draft logits [R, K, V]."""
    r, k, v = cfg.rounds, cfg.draft_len, cfg.vocab
    z = torch.randn(r, k + 1, v, generator=gen)
    lead = torch.randint(0, v, (r, k + 1, 1), generator=gen)
    second = (lead + torch.randint(1, v, (r, k + 1, 1), generator=gen)) % v
    z1 = 10.0 + 2.0 * torch.rand(r, k + 1, 1, generator=gen)
    tie = torch.rand(r, k + 1, 1, generator=gen) < cfg.near_tie_frac
    ratio = torch.where(
        tie,
        0.92 + 0.07 * torch.rand(r, k + 1, 1, generator=gen),
        0.55 + 0.3 * torch.rand(r, k + 1, 1, generator=gen),
    )
    z.scatter_(-1, lead, z1)
    z.scatter_(-1, second, z1 * ratio)
    draft = z[:, :k] + cfg.draft_noise * torch.randn(r, k, v, generator=gen)
    return z, draft


def summarize(res, target_logits: torch.Tensor, temperature: float) -> dict:
    """Per-rule figures from one batch of verification results (pure; no logging): tau, acceptance by
    draft position and ``marsrl.algo.bias_metrics``'s figures over the emitted tokens (without the
    importance-ratio and KL figures when greedy, where no sampling distribution exists)."""
    k = res.tokens.shape[1] - 1
    emitted = res.provenance != Provenance.PAD
    drafted = res.provenance[:, :k]
    reached = torch.ones_like(drafted, dtype=torch.bool)
    reached[:, 1:] = (drafted[:, :-1] == Provenance.ACCEPTED) | (drafted[:, :-1] == Provenance.RELAXED)
    accepted = (drafted == Provenance.ACCEPTED) | (drafted == Provenance.RELAXED)
    per_pos = (accepted.sum(0) / reached.sum(0).clamp(min=1)).tolist()
    top = target_logits.topk(2, -1).indices  # [R, K+1, 2]
    if temperature > 0:
        p_top = torch.softmax(target_logits.float() / temperature, -1).gather(-1, top)  # [R, K+1, 2]
    else:
        p_top = torch.zeros(top.shape)
        p_top[..., 0] = 1.0
    _, figures = bias_metrics(
        res.target_logprob,
        res.behavior_logprob,
        res.tokens == top[..., 0],
        res.is_top2,
        p_top[..., 0],
        p_top[..., 1],
        res.provenance,
        emitted,
    )
    if temperature == 0:
        figures = {key: v for key, v in figures.items() if not key.startswith(("is_ratio", "kl_"))}
    del figures["unsupported_mass"]  # not recorded by verify_chain
    return {
        "tau": res.num_emitted.double().mean().item(),
        "accept_rate_by_position": [round(a, 4) for a in per_pos],
        **figures,
    }


def run_demo(cfg: DemoConfig) -> dict:
    """Verify the same synthetic rounds under every rule in ``cfg.rules``; returns figures per rule."""
    gen = torch.Generator().manual_seed(cfg.seed)
    target, draft = synthetic_logits(cfg, gen)
    t = max(cfg.temperature, 1e-6)
    if cfg.greedy_draft:
        tokens, draft_probs = draft.argmax(-1), None
    else:
        draft_probs = torch.softmax(draft / t, -1)
        flat = draft_probs.view(-1, cfg.vocab)
        tokens = torch.multinomial(flat, 1, generator=gen).view(cfg.rounds, cfg.draft_len)
    results = {}
    for rule in cfg.rules:
        res = verify_chain(
            target,
            tokens,
            draft_probs,
            rule=rule,
            temperature=cfg.temperature,
            theta=cfg.theta,
            generator=torch.Generator().manual_seed(cfg.seed + 1),
        )
        results[rule] = summarize(res, target, cfg.temperature)
    return {"config": {f: getattr(cfg, f) for f in cfg.__dataclass_fields__}, "rules": results}


def format_table(report: dict) -> str:
    """A side-by-side text table of ``run_demo``'s figures."""
    rows = [
        ("tau (tokens / round)", "tau", "{:.3f}"),
        *BIAS_ROWS,
        ("IS ratio p/b min", "is_ratio_min", "{:.4f}"),
        ("ESS / n", "is_ratio_ess_frac", "{:.4f}"),
        ("IS ratio p/b mean, relaxed tokens", "is_ratio_mean_relaxed", "{:.4f}"),
        ("KL(b || p) per token (est.)", "kl_behavior", "{:.5f}"),
    ]
    columns = {}
    for rule, figs in report["rules"].items():
        columns[rule] = dict(figs)
        for j, rate in enumerate(figs["accept_rate_by_position"]):
            columns[rule][f"accept_{j}"] = rate
    k = len(next(iter(report["rules"].values()))["accept_rate_by_position"])
    rows += [(f"accept rate, draft {j}", f"accept_{j}", "{:.3f}") for j in range(k)]
    return side_by_side(columns, rows)
