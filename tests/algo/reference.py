"""Slow loop references for marsrl.algo: one position, group or sequence at a time, in Python floats
(float64), written from the definitions rather than from the vectorised code."""

import math
import statistics

import torch

NAN = float("nan")


def _rank12(z: list[float]) -> tuple[int, int]:
    """Indices of the largest and second-largest entries (inputs have no ties)."""
    order = sorted(range(len(z)), key=lambda v: -z[v])
    return order[0], order[1]


def token_stats_loop(ids, temperature=1.0, *, logits=None, hidden=None, weight=None, mask=None):
    n, t = ids.shape
    mask = torch.ones(n, t, dtype=torch.bool) if mask is None else mask.bool()
    temp = max(temperature, 1e-6)
    out = {k: [[0.0] * t for _ in range(n)] for k in ("logp", "p_t1", "p_t2")}
    out.update({k: [[False] * t for _ in range(n)] for k in ("is_t1", "is_t2")})
    for i in range(n):
        for j in range(t):
            if not mask[i, j]:
                continue
            if logits is not None:
                z = logits[i, j].double().tolist()
            else:
                h = hidden[i, j].double().tolist()
                z = [sum(a * b for a, b in zip(h, row, strict=True)) for row in weight.double().tolist()]
            top = max(v / temp for v in z)
            lse = top + math.log(sum(math.exp(v / temp - top) for v in z))
            t1, t2 = _rank12(z)
            y = int(ids[i, j])
            out["logp"][i][j] = z[y] / temp - lse
            out["p_t1"][i][j] = math.exp(z[t1] / temp - lse)
            out["p_t2"][i][j] = math.exp(z[t2] / temp - lse)
            out["is_t1"][i][j] = y == t1
            out["is_t2"][i][j] = y == t2
    return {
        k: torch.tensor(v, dtype=torch.bool if k.startswith("is") else torch.float64) for k, v in out.items()
    }


def group_advantages_loop(rewards, group_size, scale="group", eps=1e-4):
    """TRL's definition per group: NaN rewards left out (and given advantage 0), unbiased std."""
    r = [float(x) for x in rewards]

    def std(xs):
        xs = [x for x in xs if not math.isnan(x)]
        return statistics.stdev(xs) if len(xs) > 1 else NAN

    batch_std = (std(r) if len(r) > 1 else 0.0) if scale == "batch" else None
    adv = []
    for g in range(0, len(r), group_size):
        group = r[g : g + group_size]
        known = [x for x in group if not math.isnan(x)]
        mean = sum(known) / len(known) if known else NAN
        s = std(group) if group_size > 1 else 0.0
        for x in group:
            a = x - mean
            if scale == "group":
                a /= s + eps
            elif scale == "batch":
                a /= batch_std + eps
            adv.append(0.0 if math.isnan(a) else a)
    return torch.tensor(adv, dtype=torch.float64)


def importance_weights_loop(policy_logp, behavior_logp, mask, mode, clip_min=None, clip_max=3.0):
    """Per sequence and token: the TRL recipe (a NaN log-ratio counts as 0) with weight 0 off the mask."""
    lo = -math.inf if clip_min is None else clip_min
    hi = math.inf if clip_max is None else clip_max
    n, t = mask.shape
    out = [[0.0] * t for _ in range(n)]
    for i in range(n):
        d = []
        for j in range(t):
            x = float(policy_logp[i, j]) - float(behavior_logp[i, j]) if mask[i, j] else 0.0
            d.append(0.0 if math.isnan(x) else x)
        seq_ratio = math.exp(sum(d))
        for j in range(t):
            if not mask[i, j]:
                continue
            r = seq_ratio if mode.startswith("sequence") else math.exp(d[j])
            if mode.endswith("truncate"):
                r = min(max(r, lo), hi)
            elif mode.endswith("mask") and not lo <= r <= hi:
                r = 0.0
            out[i][j] = 1.0 if mode == "none" else r
    return torch.tensor(out, dtype=torch.float64)


def _ratio_figures(ws: list[float]) -> dict:
    if not ws:
        return {"is_ratio_mean": NAN, "is_ratio_min": NAN, "is_ratio_max": NAN, "is_ratio_ess_frac": NAN}
    return {
        "is_ratio_mean": sum(ws) / len(ws),
        "is_ratio_min": min(ws),
        "is_ratio_max": max(ws),
        "is_ratio_ess_frac": sum(ws) ** 2 / sum(w * w for w in ws) / len(ws),
    }


def bias_metrics_loop(
    policy_logp, behavior_logp, is_t1, is_t2, p_t1, p_t2, provenance, mask, unsupported=None
):
    """The figures of marsrl.algo.bias (its module docstring), token by token."""
    tokens = [(i, j) for i in range(mask.shape[0]) for j in range(mask.shape[1]) if mask[i, j]]
    n = len(tokens)
    out = {"tokens": float(n), "relaxed_frac": sum(int(provenance[i, j]) == 2 for i, j in tokens) / max(n, 1)}
    for rank, hit, p in ((1, is_t1, p_t1), (2, is_t2, p_t2)):
        diffs = [float(hit[i, j]) - float(p[i, j]) for i, j in tokens]
        out[f"top{rank}_rate"] = sum(float(hit[i, j]) for i, j in tokens) / n if n else NAN
        out[f"top{rank}_rate_expected"] = sum(float(p[i, j]) for i, j in tokens) / n if n else NAN
        out[f"top{rank}_excess"] = sum(diffs) / n if n else NAN
        out[f"top{rank}_excess_se"] = statistics.stdev(diffs) / math.sqrt(n) if n > 1 else NAN
    log_w = {(i, j): float(policy_logp[i, j]) - float(behavior_logp[i, j]) for i, j in tokens}
    out.update(_ratio_figures([math.exp(log_w[k]) for k in tokens]))
    relaxed = [math.exp(log_w[(i, j)]) for i, j in tokens if int(provenance[i, j]) == 2]
    out.update({f"{k}_relaxed": v for k, v in _ratio_figures(relaxed).items()})
    out["kl_behavior"] = -sum(log_w.values()) / n if n else NAN
    if unsupported is None:
        out["unsupported_mass"] = 0.0
    else:
        out["unsupported_mass"] = sum(float(unsupported[i, j]) for i, j in tokens) / n if n else NAN
    return out
