"""The verdict: plain words from the comparisons (``compare``), every arm against the reference arm (the
strict one; the first arm when none is strict).

It opens with whether each arm learned: held-out accuracy after training against before, paired over the
same problems (``eval.json``'s ``comparison``), "rose" or "fell" only where the 95% interval excludes 0.
It claims only what an interval resolves: for each arm it first names the figures whose 95% interval
excludes "no difference" (1 for a ratio, 0 for a difference), then lists the rest as "not resolved at this
size", then what could not be compared and why.  A projection of the step-time effect (Amdahl's law at
the measured rollout share and at published ones) follows, labelled as arithmetic, then how the
intervals were computed and, when held-out accuracy is compared, what its interval leaves out: the
variation between training runs.
"""

from __future__ import annotations

import math

from . import stats
from .base import finite, learning
from .compare import PUBLISHED_SHARES, PUBLISHED_SOURCE, Figure
from .load import Arm

SETTING_NAMES = {"t1": "T = 1", "greedy": "greedy"}

NOT_RESOLVED = "not resolved at this size"


def reference_arm(arms: list[Arm]) -> Arm | None:
    """The strict arm (by rule, else by name); else the first."""
    for arm in arms:
        if arm.rule == "strict":
            return arm
    for arm in arms:
        if arm.name == "strict":
            return arm
    return arms[0] if arms else None


def _end(x: float, fmt) -> str:
    if x is None:
        return "n/a"
    if math.isinf(x):
        return "∞" if x > 0 else "-∞"
    return fmt(x)


def format_figure(key: str, f: Figure) -> str:
    """A figure as text: its value and [low, high] in the figure's unit."""
    if key.endswith("_ratio"):
        fmt = lambda x: f"{x:.2f}x"  # noqa: E731
    elif key.startswith("heldout_") or "excess" in key:
        fmt = lambda x: f"{100 * x:+.2f} pt"  # noqa: E731
    elif key == "unsupported_mass_diff":
        fmt = lambda x: f"{x:+.2e}"  # noqa: E731
    else:
        fmt = lambda x: f"{x:+.4f}"  # noqa: E731
    value = "n/a" if f.value is None else fmt(f.value)
    return f"{value} [{_end(f.low, fmt)}, {_end(f.high, fmt)}]"


def _phrase(key: str, f: Figure, ref: str) -> str:
    text = f"{f.label} {format_figure(key, f)}"
    if f.void:
        return f"{text} ({f.void})"
    x = f.extra
    if key.startswith("heldout_"):
        n = f"{f.n} problems" + (
            f", exact McNemar p = {x['p_value']:.3g}" if "p_value" in x else ", unpaired"
        )
        text += f" ({100 * x['arm']:.1f}% vs {ref} {100 * x['ref']:.1f}%, {n})"
    elif key == "time_to_target_ratio":
        secs = lambda s: "not reached" if s is None else f"{s:.0f} s"  # noqa: E731
        text += f" ({secs(x['arm_s'])} vs {ref} {secs(x['ref_s'])})"
    elif key.endswith("_diff"):
        text += f" (vs {ref})"
    return text


def arm_paragraph(arm: str, ref: str, figures: dict[str, Figure], missing: list[str]) -> str:
    """One arm: resolved figures first, then those not resolved, then those not compared."""
    done = [_phrase(k, f, ref) for k, f in figures.items() if f.resolved]
    rest = [_phrase(k, f, ref) for k, f in figures.items() if not f.resolved]
    parts = [f"{arm} vs {ref}:"]
    if done:
        parts.append(f"resolved (95% interval excludes no difference): {'; '.join(done)}.")
    else:
        parts.append("no difference resolved.")
    if rest:
        parts.append(f"{NOT_RESOLVED[0].upper()}{NOT_RESOLVED[1:]}: {'; '.join(rest)}.")
    if missing:
        parts.append(f"Not compared: {'; '.join(missing)}.")
    return " ".join(parts)


def missing_figures(figures: dict[str, Figure], target: float | None) -> list[str]:
    """What could not be compared, and why."""
    out = []
    if "tokens_per_s_ratio" not in figures:
        out.append("rollout tokens/s (not logged by both arms)")
    if "time_to_target_ratio" not in figures:
        out.append(
            "time to a reward level (none fixed before the run: pass --target-reward or set "
            "report.target_reward in the experiment config)"
            if target is None
            else "time to a reward level (no reward or step times logged)"
        )
    if not any(k.startswith("heldout_") for k in figures):
        out.append("held-out accuracy (no eval.json 'after' results in both arms)")
    return out


def projection_sentence(arm: str, ref: str, p: dict | None, step_time: Figure | None) -> str | None:
    """Amdahl's projection for one arm, labelled as arithmetic."""
    if p is None:
        return None
    m = p["measured"]
    text = (
        f"Projection for {arm} (arithmetic, not a measurement): {ref}'s rollouts took "
        f"{100 * p['share']:.1f}% of its step; with rollouts {p['speedup']:.2f}x "
        f"[{p['speedup_low']:.2f}, {p['speedup_high']:.2f}] as fast ({p.get('basis', 'per-step rows')}), "
        f"Amdahl's law 1 / (1 - s + s / r) "
        f"gives a step-time speed-up of {m['value']:.2f}x "
        f"[{m['low']:.2f}, {m['high']:.2f}] at that share"
    )
    if step_time is not None and step_time.value:
        text += f" (measured: steps took {step_time.value:.2f}x {ref}'s time)"
    lo, hi = (p["published"][f"{s:g}"] for s in PUBLISHED_SHARES)
    shares = "–".join(f"{100 * s:g}%" for s in PUBLISHED_SHARES)
    text += f", and {lo['value']:.2f}x–{hi['value']:.2f}x at rollout shares of {shares} ({PUBLISHED_SOURCE})."
    if p.get("void"):
        text += f" Its speed-up is no finding: {p['void']}."
    return text


def timing_paragraph(timing: dict, ref: str, aa: Figure | None) -> str:
    """How the timings were measured, and the A/A control's reading."""
    text = (
        f"Timings: {timing.get('method', 'interleaved')} ({timing.get('repeats')} repeats); the step time "
        f"adds {ref}'s median non-rollout seconds per training step, so machine load while the arms "
        "trained one after the other does not enter the ratios."
    )
    if aa is not None:
        state = "resolved: the timing is not fair" if aa.resolved else "not resolved, as it should be"
        text += (
            f" A/A control: {ref}'s copy took {format_figure('aa_ratio', aa)} {ref}'s rollout time ({state})."
        )
    return text


METHOD = (
    "Intervals are 95% percentile bootstraps ({n_boot} resamples, seed {seed}): over steps paired by step "
    "number for the rates, ratios and bias figures; over held-out problems paired by problem for accuracy "
    "(exact McNemar test beside it); for the time to a reward level, a residual bootstrap of each arm's "
    "reward curve smoothed by a debiased exponential moving average (alpha {alpha}; a passage counts from "
    "step {warmup} on, once the average spans that many steps). Each interval stands "
    "on its own (no adjustment for the number of figures compared); steps are resampled as exchangeable."
)


ONE_RUN = (
    "Held-out differences between arms compare one training run of each: their intervals cover which "
    "problems were drawn and how they were sampled, not how another training run of the same arm would "
    "end (other rollout samples, another thread count). Two runs of one arm can end further apart than "
    "these intervals; only several seeds (seeds: [0, 1, 2], the across-seed interval) measure that."
)


OWN_ROLLOUTS = (
    "A time to a reward level reads the training reward, which each arm scores on its own rollouts: a "
    "relaxed rule's rollouts are not the policy's samples (they keep a near-tied top-2 draft more often), "
    "so an arm can reach a level sooner because its rollouts score higher, not because its policy learned "
    "faster; the held-out accuracy, sampled from the policy itself, is the measure of that."
)


def learning_paragraph(arms: list[Arm]) -> tuple[str | None, dict]:
    """(a sentence per arm on its held-out accuracy after training against before, {arm: {setting:
    comparison}}); None when no arm carries a before/after comparison."""
    parts, metrics = [], {}
    for arm in arms:
        got = learning(arm.eval)
        if not got:
            continue
        metrics[arm.name] = got
        phrases = []
        for name, c in got.items():
            lo, hi = c.get("ci_low"), c.get("ci_high")
            known = finite(lo) and finite(hi)
            word = (
                ("rose" if c["diff"] > 0 else "fell")
                if known and stats.resolved(lo, hi, 0.0)
                else NOT_RESOLVED
            )
            interval = f" [{100 * lo:+.1f}, {100 * hi:+.1f}]" if known else ""
            p = c.get("p_two_sided")
            test = f", exact McNemar p = {p:.2g}" if finite(p) else ""
            b, a = c.get("before"), c.get("after")
            levels = f" {b:.3f} → {a:.3f}," if finite(b) and finite(a) else ""
            phrases.append(
                f"{SETTING_NAMES.get(name, name)}{levels} {100 * c['diff']:+.1f} pt{interval}{test}: {word}"
            )
        n = next(iter(got.values())).get("n")
        parts.append(f"{arm.name} ({n} problems): {'; '.join(phrases)}.")
    if not parts:
        return None, {}
    head = (
        "Learning (held-out accuracy after training minus before, paired over the same problems; 95% "
        "paired-bootstrap interval): "
    )
    return head + " ".join(parts), metrics


def verdict(
    arms: list[Arm],
    summaries: dict[str, dict],
    comparisons: dict[str, dict[str, Figure]] | None = None,
    projections: dict[str, dict | None] | None = None,
    target: float | None = None,
    n_boot: int = stats.N_BOOT,
    seed: int = stats.SEED,
) -> tuple[str, dict]:
    """(the verdict's paragraphs, {arm: {figure: its numbers}, "projection": {arm: ...}})."""
    ref = reference_arm(arms)
    if ref is None:
        return "No arms.", {}
    r = summaries[ref.name]
    others = [a for a in arms if a is not ref]
    learned, learned_metrics = learning_paragraph([ref, *others])
    if not others:
        reward = f"mean reward {r['mean_reward']:.3f}" if r.get("mean_reward") is not None else "no reward"
        one = f"Only one arm ({ref.name}, {reward}); nothing to compare."
        return "\n\n".join(x for x in (learned, one) if x), ({"learning": learned_metrics} if learned else {})
    comparisons = comparisons or {}
    projections = projections or {}
    lead = (
        [] if ref.rule == "strict" or ref.name == "strict" else [f"No strict arm; comparing with {ref.name}."]
    )
    paragraphs, metrics = [], {}
    for arm in others:
        figs = comparisons.get(arm.name, {})
        metrics[arm.name] = {k: f.as_dict() for k, f in figs.items()}
        paragraphs.append(arm_paragraph(arm.name, ref.name, figs, missing_figures(figs, target)))
    projected = {}
    for arm in others:
        sentence = projection_sentence(
            arm.name,
            ref.name,
            projections.get(arm.name),
            comparisons.get(arm.name, {}).get("step_time_ratio"),
        )
        if sentence:
            paragraphs.append(sentence)
            projected[arm.name] = projections[arm.name]
    metrics["projection"] = projected
    metrics["learning"] = learned_metrics
    paragraphs.append(METHOD.format(n_boot=n_boot, seed=seed, alpha=stats.EMA_ALPHA, warmup=stats.EMA_WARMUP))
    if any(k.startswith("heldout_") for figs in comparisons.values() for k in figs):
        paragraphs.append(ONE_RUN)
    if any(
        "time_to_target_ratio" in comparisons.get(a.name, {}) and a.rule not in (None, "strict")
        for a in others
    ):
        paragraphs.append(OWN_ROLLOUTS)
    head = [learned] if learned else []
    return "\n\n".join([*head, " ".join([*lead, paragraphs[0]]), *paragraphs[1:]]), metrics
