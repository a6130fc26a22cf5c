"""The side-by-side figures equal hand computations from the rows written, and table.md / table.json /
the printed table carry the same cells."""

import json
import math
from pathlib import Path

import pytest

from marsrl.report.table import final_mean, format_markdown, mean_with_se

from .helpers import ARMS, MARS_REWARDS, STRICT_REWARDS, metric_rows, wilson


def test_final_mean_is_the_last_fifth():
    rows = [{"step": s, "r": v} for s, v in enumerate([1.0, 2.0, float("nan"), 4.0, None, 5.0, 6.0, 7.0])]
    assert final_mean(rows, "r") == (6.5, {"window": 2, "from_step": 6})  # 6 finite values: ceil(1.2) = 2
    assert final_mean(rows[:-2], "r") == (5.0, {"window": 1, "from_step": 5})  # 4 values: ceil(0.8) = 1
    assert final_mean(rows, "r", frac=1.0)[0] == pytest.approx(25 / 6)
    assert final_mean(rows, "missing") == (None, {"window": 0, "from_step": None})


def test_se_combined_over_the_same_steps():
    rows = [{"v": 0.1, "se": 0.3}, {"v": float("nan"), "se": 9.0}, {"v": 0.3, "se": 0.4}]
    m, se = mean_with_se(rows, "v", "se")
    assert m == pytest.approx(0.2) and se == pytest.approx(0.25)  # sqrt(.09 + .16) / 2
    assert mean_with_se([{"v": 0.1, "se": 0.3}, {"v": 0.2}], "v", "se") == (pytest.approx(0.15), None)


def test_figures_equal_the_rows(built):
    _, report = built
    assert list(report.summaries) == ["strict", "mars", "mars_code"]
    mars, rows = report.summaries["mars"], metric_rows("mars")
    assert mars["final_reward"] == pytest.approx((MARS_REWARDS[8] + MARS_REWARDS[9]) / 2)
    assert mars["mean_reward"] == pytest.approx(sum(MARS_REWARDS) / 10)
    assert report.summaries["strict"]["final_reward"] == pytest.approx(
        (STRICT_REWARDS[8] + STRICT_REWARDS[9]) / 2
    )
    assert mars["wall_s"] == 60.0
    taus = [r["train/rollout/tau"] for r in rows if r["train/rollout/tau"] is not None]
    assert mars["tau"] == pytest.approx(sum(taus) / 9)
    ex = [(r["train/bias/top2_excess"], r["train/bias/top2_excess_se"]) for r in rows if r["step"] != 3]
    assert mars["top2_excess"] == pytest.approx(sum(v for v, _ in ex) / 9)
    assert mars["top2_excess_se"] == pytest.approx(math.sqrt(sum(se**2 for _, se in ex)) / 9)
    assert mars["is_ratio_min"] == pytest.approx(min(r["train/bias/is_ratio_min"] for r in rows))
    assert mars["is_ratio_max"] == pytest.approx(max(r["train/bias/is_ratio_max"] for r in rows))
    assert mars["draft_loss"] == pytest.approx((3.0 - 0.8 + 3.0 - 0.9) / 2)  # step 7 absent: 8 and 9
    assert mars["kl"] is None and report.summaries["strict"]["is_ratio_mean_relaxed"] is None
    k, n = ARMS["mars"][7]
    assert (mars["acc_after"], mars["acc_after_ci_low"], mars["acc_after_ci_high"]) == pytest.approx(
        (k / n, *wilson(k, n))
    )


def test_table_files_agree(built):
    out, report = built
    data = json.loads((out / "report" / "table.json").read_text())
    assert data["arms"] == ["strict", "mars", "mars_code"]
    assert data["figures"]["mars"]["final_reward"] == pytest.approx(report.summaries["mars"]["final_reward"])
    assert data["figures"]["mars"]["kl"] is None
    by_key = {r["key"]: r for r in data["rows"]}
    assert "kl" not in by_key  # no arm logged train/kl: the row is left out
    assert by_key["is_ratio_mean_relaxed"]["cells"]["strict"] == "n/a"
    k, n = ARMS["mars"][7]
    lo, hi = wilson(k, n)
    assert by_key["acc_after"]["cells"]["mars"] == f"{k / n:.3f} [{lo:.3f}, {hi:.3f}] n={n}"
    s = report.summaries["mars"]
    assert by_key["top2_excess"]["cells"]["mars"] == (
        f"{100 * s['top2_excess']:+.2f} ± {100 * s['top2_excess_se']:.2f} pt"
    )
    md = (out / "report" / "table.md").read_text()
    assert md.strip().endswith(report.table)
    line = next(x for x in md.splitlines() if x.startswith("| top-2 excess"))
    assert [c.strip() for c in line.strip("|").split("|")][1:] == [
        by_key["top2_excess"]["cells"][a] for a in data["arms"]
    ]


def test_markdown_escapes_pipes():
    md = format_markdown([{"label": "a|b", "cells": {"x|y": "1"}}], ["x|y"])
    assert md.splitlines()[0].count("|") - md.splitlines()[0].count("\\|") == 3


def test_held_out_rows_per_evaluation_setting():
    """eval.json as the experiment writes it (one result per temperature): a row each for T = 1 and
    greedy, before and after, each with its interval and n; no single-result row."""
    from marsrl.report.load import Arm
    from marsrl.report.table import summarize_arm, table_cells

    def res(acc, lo, hi):
        return {"accuracy": acc, "ci_low": lo, "ci_high": hi, "n": 500, "correct": [1, 0]}

    evaluation = {
        "before": {"t1": res(0.302, 0.263, 0.344), "greedy": res(0.524, 0.480, 0.567)},
        "after": {"t1": res(0.424, 0.381, 0.468), "greedy": res(0.528, 0.484, 0.572)},
    }
    s = summarize_arm(Arm("strict", Path("strict"), eval=evaluation))
    assert (
        s["acc_t1_after"] == 0.424 and s["acc_t1_after_ci_low"] == 0.381 and s["acc_greedy_before_n"] == 500
    )
    cells = {r["key"]: r["cells"]["strict"] for r in table_cells({"strict": s})}
    assert cells["acc_t1_before"] == "0.302 [0.263, 0.344] n=500"
    assert cells["acc_greedy_after"] == "0.528 [0.484, 0.572] n=500"
    assert "acc_before" not in cells and "acc_after" not in cells
