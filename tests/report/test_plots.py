"""Each plot's CSV is exactly the metric rows (gaps where a value is missing), and each PNG decodes."""

import math

import pytest
from matplotlib.image import imread

from marsrl.report.load import load_experiment
from marsrl.report.plots import PLOTS, read_series_csv, write_plots
from marsrl.report.stats import ema

from .helpers import metric_rows, write_experiment

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _value(row, key):
    v = row.get(key)
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else v


DENSE = sorted(n for n, s in PLOTS.items() if not s.sparse)
SPARSE = sorted(n for n, s in PLOTS.items() if s.sparse)


def test_every_plot_written(built):
    """The synthetic arms log every training metric and no held-out evaluation."""
    _, report = built
    assert set(report.plots) == set(DENSE) and sorted(report.skipped_plots) == SPARSE
    assert SPARSE == ["heldout_greedy", "heldout_t1"]


@pytest.mark.parametrize("name", DENSE)
def test_csv_is_the_rows_and_png_decodes(built, name):
    out, _ = built
    spec = PLOTS[name]
    series = read_series_csv(out / "report" / f"{name}.csv")
    assert [p["arm"] for p in series] == [a for a in ("strict", "mars", "mars_code") for _ in range(10)]
    for arm in ("strict", "mars", "mars_code"):
        got = [p for p in series if p["arm"] == arm]
        rows = metric_rows(arm)
        assert [p["x"] for p in got] == [r[spec.x] for r in rows]
        assert [p["y"] for p in got] == [_value(r, spec.y) for r in rows]
        if spec.se:
            for p, r in zip(got, rows, strict=True):
                if p["y"] is None:
                    assert p["y_low"] is None and p["y_high"] is None
                else:
                    assert p["y_low"] == pytest.approx(r[spec.y] - r[spec.se])
                    assert p["y_high"] == pytest.approx(r[spec.y] + r[spec.se])
        if spec.smooth:  # the smoothed curve beside the raw one, from the same steps
            assert [p["y_smooth"] for p in got] == pytest.approx(ema([_value(r, spec.y) for r in rows]))
    png = out / "report" / f"{name}.png"
    assert png.read_bytes()[:8] == PNG_MAGIC
    img = imread(png)
    assert img.shape[0] == 400 and img.shape[1] == 640 and img.std() > 0  # 6.4 x 4 in at 100 dpi, not blank


def test_reward_plots_show_raw_and_smoothed(built):
    assert {n for n, s in PLOTS.items() if s.smooth} == {"reward_step", "reward_wall"}
    assert "EMA, alpha 0.1" in PLOTS["reward_step"].title and "raw" in PLOTS["reward_step"].title
    out, _ = built
    mars = [p for p in read_series_csv(out / "report" / "reward_step.csv") if p["arm"] == "mars"]
    assert mars[0]["y_smooth"] == pytest.approx(mars[0]["y"])  # debiased: starts at the first reward
    assert mars[-1]["y_smooth"] < mars[-1]["y"]  # a rising curve's average lags it


def test_gaps_are_kept_in_the_csv(built):
    out, _ = built
    tau = [p for p in read_series_csv(out / "report" / "tau.csv") if p["arm"] == "mars"]
    assert tau[5]["y"] is None and tau[4]["y"] == pytest.approx(3.04)
    loss = [p for p in read_series_csv(out / "report" / "draft_loss.csv") if p["arm"] == "strict"]
    assert loss[7]["y"] is None and loss[8]["y"] == pytest.approx(2.2)


def test_arm_or_plot_without_the_metric(tmp_path):
    out = write_experiment(tmp_path, arms=("strict", "mars"))
    (out / "report").mkdir()
    exp = load_experiment(out)
    for row in exp.arms[0].rows:  # strict never logged relaxed_frac; nobody logged the draft loss
        row.pop("train/rollout/relaxed_frac")
    for arm in exp.arms:
        for row in arm.rows:
            row.pop("train/draft/loss", None)
    plots = {k: PLOTS[k] for k in ("relaxed_frac", "draft_loss")}
    written, skipped = write_plots(exp.arms, out / "report", plots)
    assert skipped == ["draft_loss"] and not (out / "report" / "draft_loss.png").exists()
    assert {p["arm"] for p in read_series_csv(written["relaxed_frac"]["csv"])} == {"mars"}


def test_heldout_plots_are_the_evaluations_with_before_at_step_zero(tmp_path):
    """Only the steps that evaluated, joined, each with its interval as the band; the result before
    training (eval.json) at step 0; an arm that never evaluated is not drawn."""
    out = write_experiment(tmp_path, arms=("strict", "mars"))
    (out / "report").mkdir()
    exp = load_experiment(out)
    strict, mars = exp.arms
    strict.eval = {"before": {"t1": {"accuracy": 0.30, "ci_low": 0.26, "ci_high": 0.34}}}
    for step, acc in ((3, 0.33), (6, 0.35), (9, 0.36)):
        strict.rows[step].update(
            {"eval/t1_accuracy": acc, "eval/t1_ci_low": acc - 0.04, "eval/t1_ci_high": acc + 0.05}
        )
    written, skipped = write_plots(exp.arms, out / "report", {k: PLOTS[k] for k in SPARSE})
    assert skipped == ["heldout_greedy"]
    series = read_series_csv(written["heldout_t1"]["csv"])
    assert mars.eval  # mars has an eval.json, but logged no evaluation during training: not drawn
    assert {p["arm"] for p in series} == {"strict"}
    assert [p["x"] for p in series] == [0, 3, 6, 9]
    assert [p["y"] for p in series] == pytest.approx([0.30, 0.33, 0.35, 0.36])
    assert [p["y_low"] for p in series] == pytest.approx([0.26, 0.29, 0.31, 0.32])
    assert [p["y_high"] for p in series] == pytest.approx([0.34, 0.38, 0.40, 0.41])
    img = imread(written["heldout_t1"]["png"])
    assert img.shape[:2] == (400, 640) and img.std() > 0
