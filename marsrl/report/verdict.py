"""The verdict: one paragraph in plain words, computed from the figures, comparing every arm with the
reference arm (the strict one; the first arm when none is strict).

"Reached the reference's final reward" means: the arm's trailing mean reward over the same number of
steps as the reference's final window (the last 20% of its steps) first reached the reference's final
reward.  A trailing mean, not a single step, so that one lucky batch does not count; the same window,
so that the reference itself reaches its own final reward exactly at its last step (100% of its
wall-clock).
"""

from __future__ import annotations

from .load import Arm, finite


def reference_arm(arms: list[Arm]) -> Arm | None:
    """The strict arm (by rule, else by name); else the first."""
    for arm in arms:
        if arm.rule == "strict":
            return arm
    for arm in arms:
        if arm.name == "strict":
            return arm
    return arms[0] if arms else None


def time_to_reach(rows: list[dict], target: float, window: int, key: str = "train/reward") -> tuple:
    """(wall_s at which the trailing ``window``-step mean of ``key`` first reaches ``target``, or None;
    metrics: ``reached``, ``step``, ``best`` trailing mean)."""
    pts = [r for r in rows if finite(r.get(key))]
    best, eps = None, 1e-12 * max(1.0, abs(target))
    for i in range(window - 1, len(pts)):
        m = sum(float(r[key]) for r in pts[i - window + 1 : i + 1]) / window
        best = m if best is None else max(best, m)
        if m >= target - eps:
            wall = pts[i].get("wall_s")
            return (float(wall) if finite(wall) else None), {
                "reached": True,
                "step": pts[i]["step"],
                "best": best,
            }
    return None, {"reached": False, "step": None, "best": best}


def intervals_overlap(a: tuple, b: tuple) -> bool | None:
    """Whether two closed intervals (low, high) overlap; None when either is unknown."""
    if None in a or None in b:
        return None
    return a[0] <= b[1] and b[0] <= a[1]


def _pt(s: dict, key: str) -> str:
    if s.get(key) is None:
        return "n/a"
    se = s.get(f"{key}_se")
    return f"{100 * s[key]:+.2f} ± {100 * se:.2f} pt" if se is not None else f"{100 * s[key]:+.2f} pt"


def _acc(s: dict) -> str:
    text = f"{s['acc_after']:.3f}"
    if s.get("acc_after_ci_low") is not None and s.get("acc_after_ci_high") is not None:
        text += f" [{s['acc_after_ci_low']:.3f}, {s['acc_after_ci_high']:.3f}]"
    return text


def compare(arm: Arm, s: dict, ref: Arm, r: dict) -> tuple[str, dict]:
    """One arm against the reference: (a sentence, its numbers)."""
    parts, out = [], {}
    target, wall_ref = r.get("final_reward"), r.get("wall_s")
    if target is None:
        parts.append(f"{ref.name} logged no reward, so time to reward is not compared")
    else:
        t, m = time_to_reach(arm.rows, target, r["final_window"])
        out.update(target=target, time_to_target_s=t, **m)
        goal = f"{ref.name}'s final reward ({target:.3f})"
        if m["reached"] and t is not None and wall_ref:
            out["time_frac"] = t / wall_ref
            parts.append(
                f"{arm.name} reached {goal} at step {m['step']} after {t:.0f} s, "
                f"{100 * t / wall_ref:.0f}% of {ref.name}'s wall-clock ({wall_ref:.0f} s)"
            )
        elif m["reached"]:
            parts.append(f"{arm.name} reached {goal} at step {m['step']} (no wall-clock to compare)")
        else:
            best = (
                f"best {r['final_window']}-step mean {m['best']:.3f}"
                if m["best"] is not None
                else "no reward"
            )
            run = f" over {s['wall_s']:.0f} s" if s.get("wall_s") is not None else ""
            parts.append(f"{arm.name} did not reach {goal} within its run ({best}{run})")
    if s.get("tokens_per_s") is not None and r.get("tokens_per_s"):
        out["tokens_per_s_ratio"] = s["tokens_per_s"] / r["tokens_per_s"]
        tau = (
            f", tau {s['tau']:.2f} vs {r['tau']:.2f}"
            if s.get("tau") is not None and r.get("tau") is not None
            else ""
        )
        parts.append(f"rollouts at {out['tokens_per_s_ratio']:.2f}x {ref.name}'s tokens/s{tau}")
    if s.get("top2_excess") is not None:
        relaxed = (
            f", {100 * s['relaxed_frac']:.2f}% of tokens relaxed" if s.get("relaxed_frac") is not None else ""
        )
        parts.append(f"top-2 excess {_pt(s, 'top2_excess')} ({ref.name} {_pt(r, 'top2_excess')}){relaxed}")
    if s.get("acc_after") is not None and r.get("acc_after") is not None:
        overlap = intervals_overlap(
            (s.get("acc_after_ci_low"), s.get("acc_after_ci_high")),
            (r.get("acc_after_ci_low"), r.get("acc_after_ci_high")),
        )
        out["acc_overlap"] = overlap
        note = {True: " (intervals overlap)", False: " (intervals do not overlap)", None: ""}[overlap]
        parts.append(f"held-out accuracy after training {_acc(s)} vs {ref.name} {_acc(r)}{note}")
    else:
        parts.append("no held-out accuracy to compare")
    return "; ".join(parts) + ".", out


def verdict(arms: list[Arm], summaries: dict[str, dict]) -> tuple[str, dict]:
    """(the paragraph, {arm: the numbers behind its sentence})."""
    ref = reference_arm(arms)
    if ref is None:
        return "No arms.", {}
    r = summaries[ref.name]
    others = [a for a in arms if a is not ref]
    if not others:
        reward = f"final reward {r['final_reward']:.3f}" if r.get("final_reward") is not None else "no reward"
        return f"Only one arm ({ref.name}, {reward}); nothing to compare.", {}
    lead = (
        "" if ref.rule == "strict" or ref.name == "strict" else f"No strict arm; comparing with {ref.name}. "
    )
    sentences, metrics = [], {}
    for arm in others:
        text, metrics[arm.name] = compare(arm, summaries[arm.name], ref, r)
        sentences.append(text)
    return lead + " ".join(sentences), metrics
