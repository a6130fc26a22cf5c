"""The verdict claims only what an interval resolves: resolved figures lead, the rest read "not resolved
at this size", an A/A pair (strict against a copy of itself, or against another draw of the same
process) resolves nothing, and the projection is labelled as arithmetic with its source."""

import json
import random
import shutil
from pathlib import Path

import pytest
import yaml

from marsrl.report import build_report
from marsrl.report.compare import compare_arms
from marsrl.report.load import Arm
from marsrl.report.table import summarize_arm
from marsrl.report.verdict import NOT_RESOLVED, ONE_RUN, verdict

from .helpers import MARS_REWARDS, STRICT_REWARDS, metric_rows, write_arm


def _rows(rewards, dt):
    return [{"step": s, "wall_s": (s + 1) * dt, "train/reward": r} for s, r in enumerate(rewards)]


def test_verdict_leads_with_what_is_resolved(built):
    out, report = built
    text = (out / "report" / "verdict.txt").read_text().strip()
    assert text == report.verdict
    first = text.split("\n\n")[0]
    assert first.startswith(
        "mars vs strict: resolved (95% interval excludes no difference): rollout tokens/s"
    )
    cmp = report.comparisons["mars"]
    ratio = cmp["tokens_per_s_ratio"]
    tps = lambda arm: [r["train/rollout/tokens_per_s"] for r in metric_rows(arm)]  # noqa: E731
    assert ratio.value == pytest.approx(sum(tps("mars")) / sum(tps("strict")))
    assert ratio.resolved and ratio.low <= ratio.value <= ratio.high
    # held-out 0.630 vs 0.600 of 200 (no per-problem outcomes in these eval.json files): Newcombe, unpaired
    acc = cmp["heldout_greedy_diff"]
    assert acc.value == pytest.approx(0.03) and not acc.resolved and "unpaired" in acc.interval
    resolved_part, rest = first.split(f"{NOT_RESOLVED[0].upper()}{NOT_RESOLVED[1:]}: ")
    assert "rollout tokens/s" in resolved_part and "held-out accuracy" not in resolved_part
    assert "held-out accuracy after training (greedy) +3.00 pt" in rest and "unpaired" in rest
    # no reward level was fixed before the run: the figure is not compared, and the text says how to fix it
    assert "time_to_target_ratio" not in cmp and "report.target_reward" in first
    assert "final reward" not in text  # no target taken from strict's own last steps
    # held-out accuracy was compared: the last paragraph says its interval leaves out run-to-run variation
    assert text.split("\n\n")[-1] == ONE_RUN and "seeds" in ONE_RUN


def test_projection_is_labelled_and_cited(built):
    _, report = built
    text = report.verdict
    para = next(p for p in text.split("\n\n") if p.startswith("Projection for mars "))
    assert "(arithmetic, not a measurement)" in para and "arXiv 2509.21792" in para and "91%–98%" in para
    p = report.verdict_metrics["projection"]["mars"]
    share = sum(r["train/rollout/share_of_step"] for r in metric_rows("strict")) / 10
    assert p["share"] == pytest.approx(share)
    r = p["speedup"]
    assert p["measured"]["value"] == pytest.approx(1 / (1 - share + share / r))
    assert p["published"]["0.91"]["value"] == pytest.approx(1 / (1 - 0.91 + 0.91 / r))
    assert f"{100 * share:.1f}% of its step" in para
    paras = text.split("\n\n")  # how the intervals were computed, then what the held-out ones leave out
    assert paras[-2].startswith("Intervals are 95% percentile bootstraps") and paras[-1] == ONE_RUN


def _copy_arm(src: Path, name: str) -> Path:
    dst = src.parent / name
    shutil.copytree(src, dst)
    cfg = yaml.safe_load((dst / "config.yaml").read_text())
    cfg["arm"]["name"] = name
    (dst / "config.yaml").write_text(yaml.safe_dump(cfg))
    return dst


def _with_outcomes(folder: Path, correct: list[int]) -> None:
    """eval.json as marsrl.experiment.evaluate writes it: results per temperature with 0/1 per problem."""
    k, n = sum(correct), len(correct)
    res = {"temperature": 1.0, "accuracy": k / n, "ci_low": 0.0, "ci_high": 1.0, "n": n, "k": k}
    evals = {"before": {"t1": {**res, "correct": correct}}, "after": {"t1": {**res, "correct": correct}}}
    (folder / "eval.json").write_text(json.dumps(evals))


def test_aa_copies_resolve_nothing(tmp_path):
    """strict against a copy of its own files: every figure reads no difference, none is resolved."""
    strict = write_arm(tmp_path / "aa", "strict")
    _with_outcomes(strict, [random.Random(0).randint(0, 1) for _ in range(300)])
    _copy_arm(strict, "strict_copy")
    report = build_report(tmp_path / "aa", target_reward=0.3, n_boot=400)
    figs = report.comparisons["strict_copy"]
    assert {"tokens_per_s_ratio", "step_time_ratio", "time_to_target_ratio", "heldout_t1_diff"} <= set(figs)
    assert not any(f.resolved for f in figs.values())
    assert figs["tokens_per_s_ratio"].value == 1.0 and figs["heldout_t1_diff"].extra["p_value"] == 1.0
    first = report.verdict.split("\n\n")[0]
    assert first.startswith("strict_copy vs strict: no difference resolved. Not resolved at this size: ")
    data = json.loads((tmp_path / "aa" / "report" / "table.json").read_text())
    assert not any(f["resolved"] for f in data["comparisons"]["strict_copy"].values())


def _noisy_arm(name: str, rng: random.Random, steps: int = 30, problems: int = 200) -> Arm:
    rows = []
    for s in range(steps):
        rows.append(
            {
                "step": s,
                "train/reward": 0.3 + 0.01 * s + rng.gauss(0, 0.05),
                "train/step_seconds": 10 * rng.lognormvariate(0, 0.1),
                "train/rollout/tokens_per_s": 100 * rng.lognormvariate(0, 0.1),
                "train/rollout/share_of_step": 0.7 + rng.gauss(0, 0.02),
                "train/bias/top1_excess": rng.gauss(0, 0.01),
                "train/bias/top2_excess": rng.gauss(0, 0.01),
                "train/bias/unsupported_mass": 0.0,
                "train/bias/is_ratio_ess_frac": 1 - abs(rng.gauss(0, 0.005)),
            }
        )
    correct = [int(rng.random() < 0.6) for _ in range(problems)]
    evaluation = {"after": {"t1": {"accuracy": sum(correct) / problems, "n": problems, "correct": correct}}}
    return Arm(name, Path(name), {"arm": {"name": name, "rule": "strict"}}, rows, evaluation)


def test_aa_draws_resolve_at_the_nominal_rate():
    """Seed 0, 150 A/A pairs (two independent draws of the same strict process, 30 steps, 200 problems,
    500 resamples): each figure's interval resolves a difference in at most 15% of the pairs (nominal 5%;
    binomial SD 1.8 points, plus the bootstrap's undercoverage at 30 steps), where a +-1 SE interval would
    in about 32%."""
    rng = random.Random(0)
    counts: dict[str, int] = {}
    reps = 150
    for i in range(reps):
        a, b = _noisy_arm("strict", rng), _noisy_arm("strict_b", rng)
        for key, f in compare_arms(b, a, target=0.45, n_boot=500, seed=i).items():
            counts[key] = counts.get(key, 0) + f.resolved
    assert set(counts) >= {"tokens_per_s_ratio", "step_time_ratio", "time_to_target_ratio", "heldout_t1_diff"}
    assert counts["unsupported_mass_diff"] == 0  # both exactly 0 every step
    rates = {k: v / reps for k, v in counts.items()}
    assert all(r <= 0.15 for r in rates.values()), rates


def test_too_few_steps_resolve_nothing():
    """Three steps of a 2x faster arm: the bootstrap's interval excludes 1, but three values are too few
    for a percentile interval to mean 95%, so nothing is claimed."""
    a = Arm("a", Path("a"), {"arm": {"rule": "strict"}}, _rows([0.1, 0.2, 0.3], 2.0))
    b = Arm("b", Path("b"), {"arm": {"rule": "mars"}}, _rows([0.1, 0.2, 0.3], 1.0))
    f = compare_arms(b, a, n_boot=200)["step_time_ratio"]
    assert f.value == 0.5 and f.high < 1 and f.n == 3 and not f.resolved


def test_no_strict_arm_and_single_arm():
    a = Arm("a", Path("a"), {"arm": {"rule": "mars"}}, _rows(MARS_REWARDS, 6.0))
    b = Arm("b", Path("b"), {"arm": {"rule": "mars_code"}}, _rows(STRICT_REWARDS, 1.0))
    figs = {"b": compare_arms(b, a, n_boot=200)}
    text, m = verdict([a, b], {x.name: summarize_arm(x) for x in (a, b)}, figs)
    assert text.startswith("No strict arm; comparing with a. b vs a: resolved (95% interval excludes no ")
    assert "step time (sequential wall-clock: machine load included) 0.17x" in text
    assert "held-out accuracy (no eval.json 'after' results" in text
    assert ONE_RUN not in text  # no held-out comparison: nothing to caution about
    assert m["b"]["step_time_ratio"]["resolved"] is True
    assert verdict([a], {"a": summarize_arm(a)}) == (
        "Only one arm (a, mean reward 0.432); nothing to compare.",
        {},
    )


def test_projection_takes_the_interleaved_timing_when_there_is_one():
    """With timing.json, r and s come from the interleaved A/B (by hand here), not the per-step rows
    that the arms logged one after the other; the sentence names the basis."""
    from marsrl.report.compare import projection
    from marsrl.report.verdict import projection_sentence

    strict = Arm("strict", Path("strict"), rows=metric_rows("strict"))
    mars = Arm("mars", Path("mars"), rows=metric_rows("mars"))
    timing = {
        "train_seconds": 8.0,
        "arms": {
            "strict": {"seconds": [4.0, 5.0, 4.5, 4.5], "tokens": [600] * 4},
            "mars": {"seconds": [3.0, 3.5, 3.0, 3.5], "tokens": [610] * 4},
        },
    }
    p = projection(mars, strict, n_boot=200, seed=0, timing=timing)
    r = (610 * 4 / 13.0) / (600 * 4 / 18.0)
    share = 4.5 / (8.0 + 4.5)
    assert p["basis"] == "interleaved timing" and p["n"] == 4
    assert p["speedup"] == pytest.approx(r) and p["share"] == pytest.approx(share)
    assert p["measured"]["value"] == pytest.approx(1 / (1 - share + share / r))
    assert p["published"]["0.98"]["value"] == pytest.approx(1 / (1 - 0.98 + 0.98 / r))
    assert p["speedup_low"] <= r <= p["speedup_high"]
    rows = projection(mars, strict, n_boot=200, seed=0)  # no timing: the per-step rows
    assert rows["basis"] == "per-step rows" and rows["speedup"] != pytest.approx(r)
    assert "(interleaved timing)" in projection_sentence("mars", "strict", p, None)


def _learned_arm(name: str, before: list[int], after: list[int], rule: str) -> Arm:
    from marsrl.experiment.evaluate import compare_evals

    res = lambda c: {"accuracy": sum(c) / len(c), "ci_low": 0.0, "ci_high": 1.0, "n": len(c), "correct": c}  # noqa: E731
    b, a = {"t1": res(before[0]), "greedy": res(before[1])}, {"t1": res(after[0]), "greedy": res(after[1])}
    ev = {"before": b, "after": a, "comparison": compare_evals(b, a, n_boot=2000)}
    rows = [{"step": s, "wall_s": s + 1.0, "train/reward": 0.3} for s in range(5)]
    return Arm(name=name, path=Path(name), config={"arm": {"rule": rule}}, rows=rows, eval=ev)


def test_verdict_opens_with_whether_each_arm_learned():
    # 400 problems: strict gains 60 and loses 10 at T = 1 (a resolved rise), greedy is unchanged
    # (20 gains, 20 losses); mars loses 60 and gains 10 at T = 1 (a resolved fall)
    n = 400
    before = [0] * 70 + [1] * 10 + [0] * 320
    after = [1] * 60 + [0] * 10 + [0] * 10 + [0] * 320
    flat_b, flat_a = [1] * 20 + [0] * 20 + [1] * 100 + [0] * 260, [0] * 20 + [1] * 20 + [1] * 100 + [0] * 260
    assert len(before) == len(after) == len(flat_b) == len(flat_a) == n
    strict = _learned_arm("strict", (before, flat_b), (after, flat_a), "strict")
    mars = _learned_arm("mars", (after, flat_b), (before, flat_a), "mars")
    arms = [strict, mars]
    summaries = {a.name: summarize_arm(a) for a in arms}
    text, metrics = verdict(arms, summaries, {"mars": {}})
    first = text.split("\n\n")[0]
    assert first.startswith("Learning (held-out accuracy after training minus before")
    s_part, m_part = first.split("strict (400 problems): ")[1].split(" mars (400 problems): ")
    assert s_part.startswith("T = 1 0.025 → 0.150, +12.5 pt [") and ": rose;" in s_part
    assert "greedy 0.300 → 0.300, +0.0 pt" in s_part and s_part.endswith(f": {NOT_RESOLVED}.")
    assert m_part.startswith("T = 1 0.150 → 0.025, -12.5 pt [") and ": fell;" in m_part
    c = metrics["learning"]["strict"]["t1"]
    assert c["ci_low"] > 0 and c["p_two_sided"] < 1e-6  # 60 of 70 discordant problems
    # the table carries the same figures
    assert summaries["strict"]["gain_t1"] == pytest.approx(0.125)
    assert summaries["mars"]["gain_t1_p_two_sided"] == pytest.approx(c["p_two_sided"])
    # no before/after comparison (older eval.json files): no learning paragraph
    plain = [Arm(name=a.name, path=a.path, config=a.config, rows=a.rows, eval=None) for a in arms]
    text2, metrics2 = verdict(plain, {a.name: summarize_arm(a) for a in plain}, {"mars": {}})
    assert not text2.startswith("Learning") and metrics2["learning"] == {}


def test_a_relaxed_arms_time_to_a_reward_level_carries_the_own_rollouts_caveat(tmp_path):
    """The training reward is scored on each arm's own rollouts: with a time to a level compared for a
    relaxed arm, the verdict says so; an A/A pair of strict arms (the same behaviour) does not need it."""
    from marsrl.report.verdict import OWN_ROLLOUTS

    from .helpers import write_experiment

    root = write_experiment(tmp_path / "e", arms=("mars", "strict"))
    report = build_report(root, target_reward=0.3, n_boot=200)
    assert "time_to_target_ratio" in report.comparisons["mars"]
    assert OWN_ROLLOUTS in report.verdict.split("\n\n")
    strict = write_arm(tmp_path / "aa", "strict")
    _copy_arm(strict, "strict_copy")
    aa = build_report(tmp_path / "aa", target_reward=0.3, n_boot=200)
    assert "time_to_target_ratio" in aa.comparisons["strict_copy"] and OWN_ROLLOUTS not in aa.verdict
    no_target = build_report(root, n_boot=200)
    assert OWN_ROLLOUTS not in no_target.verdict
