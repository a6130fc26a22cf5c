"""marsrl.metrics as it was before marsrl.algo (commit 22deaf6), verbatim: the oracle that the thin
wrappers ``marsrl.metrics.teacher_forced`` / ``bias_metrics`` must still agree with."""

import math

import torch

from marsrl.verify import Provenance


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
