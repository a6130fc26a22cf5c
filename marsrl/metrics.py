"""The top-1 / top-2 bias of a batch of rollouts, measured the way a trainer can: recompute the policy's
log-probs and its top-2 tokens by teacher forcing the final sequences, then compare what was emitted
with what exact (strict) sampling would emit.  Pure: returns metrics, logs nothing.

Per batch (``../shared/spec/mars.md``, "Top-2 bias"):
    relaxed_frac          relaxed tokens / completion tokens
    top{1,2}_rate         share of emitted tokens that are the policy's rank-1 / rank-2 token
    top{1,2}_rate_expected   mean over positions of pi(t1) / pi(t2): the rate exact sampling gives
    top{1,2}_excess (+ _se)  the bias, with a standard error
    is_ratio_*            w = exp(log pi - log b): mean / min / max / effective sample size share
    kl_behavior           mean of log b - log pi over emitted tokens: a Monte Carlo estimate of KL(b || pi)
In a strict run the excesses are ~0 and w ~ 1 up to numerics.
"""

from __future__ import annotations

import math

import torch

from .verify import Provenance


@torch.no_grad()
def teacher_forced(target, trajectories, temperature: float = 1.0, batch_size: int = 32) -> list[dict]:
    """Per trajectory: policy log-prob of each completion token and the policy's top-1/top-2 there."""
    device = next(target.parameters()).device
    out = []
    for s in range(0, len(trajectories), batch_size):
        chunk = trajectories[s : s + batch_size]
        seqs = [t.prompt_ids + t.completion_ids for t in chunk]
        width = max(len(q) for q in seqs)
        ids = torch.zeros(len(seqs), width, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, q in enumerate(seqs):
            ids[i, : len(q)] = torch.tensor(q)
            mask[i, : len(q)] = 1
        logits = target(input_ids=ids.to(device), attention_mask=mask.to(device)).logits.float()
        for i, t in enumerate(chunk):
            p0, n = len(t.prompt_ids), len(t.completion_ids)
            z = logits[i, p0 - 1 : p0 - 1 + n]  # [n, V] predicts completion token j
            logp = torch.log_softmax(z / max(temperature, 1e-6), -1)
            top = z.topk(2, -1).indices
            y = torch.tensor(t.completion_ids, device=z.device)
            out.append(
                {
                    "logp": logp.gather(1, y[:, None])[:, 0].cpu(),
                    "is_t1": (y == top[:, 0]).cpu(),
                    "is_t2": (y == top[:, 1]).cpu(),
                    "p_t1": logp.gather(1, top[:, :1])[:, 0].exp().cpu(),
                    "p_t2": logp.gather(1, top[:, 1:])[:, 0].exp().cpu(),
                }
            )
    return out


def bias_metrics(trajectories, forced: list[dict]) -> dict:
    """The bias figures of a batch, from trajectories and their ``teacher_forced`` recomputation."""
    cat = lambda key: torch.cat([f[key] for f in forced]).double()  # noqa: E731
    prov = torch.tensor([p for t in trajectories for p in t.provenance])
    behavior = torch.tensor([b for t in trajectories for b in t.behavior_logprobs], dtype=torch.float64)
    n = max(prov.numel(), 1)
    out = {"tokens": prov.numel(), "relaxed_frac": (prov == Provenance.RELAXED).sum().item() / n}
    for rank in (1, 2):
        hit, p = cat(f"is_t{rank}"), cat(f"p_t{rank}")
        diff = hit - p  # per position: emitted-is-rank-r minus its exact probability
        out[f"top{rank}_rate"] = hit.mean().item()
        out[f"top{rank}_rate_expected"] = p.mean().item()
        out[f"top{rank}_excess"] = diff.mean().item()
        out[f"top{rank}_excess_se"] = (diff.std().item() / math.sqrt(n)) if n > 1 else float("nan")
    log_w = cat("logp") - behavior
    w = log_w.exp()
    out["is_ratio_mean"] = w.mean().item()
    out["is_ratio_min"] = w.min().item()
    out["is_ratio_max"] = w.max().item()
    out["is_ratio_ess_frac"] = (w.sum() ** 2 / (w**2).sum() / w.numel()).item()
    out["kl_behavior"] = (-log_w).mean().item()
    return out


def side_by_side(columns: dict[str, dict], rows: list[tuple[str, str, str]]) -> str:
    """A text table: one column per name of ``columns`` (each a dict of figures), one line per
    (label, key, format) row; a missing figure prints as n/a, a row missing everywhere is left out."""
    names = list(columns)
    width = max(len(label) for label, _, _ in rows) + 2
    lines = ["".ljust(width) + "".join(n.rjust(12) for n in names)]
    for label, key, fmt in rows:
        vals = [columns[n].get(key) for n in names]
        if all(v is None for v in vals):
            continue
        cells = "".join((fmt.format(v) if v is not None else "n/a").rjust(12) for v in vals)
        lines.append(label.ljust(width) + cells)
    return "\n".join(lines)
