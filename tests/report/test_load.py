"""Reading experiment folders: rows come back as written, arms in a predictable order, bad input is one
line naming the file (and line)."""

import json
import math

import pytest

from marsrl.report.load import ReportError, load_experiment

from .helpers import metric_rows, same, write_arm, write_experiment


def test_rows_config_eval_samples_read_back(tmp_path):
    exp = load_experiment(write_experiment(tmp_path, arms=("mars", "strict")))
    assert exp.name == "exp"
    assert [a.name for a in exp.arms] == ["strict", "mars"]  # strict first without a declared order
    mars = exp.arms[1]
    assert mars.rule == "mars" and mars.config["arm"]["theta"] == 0.9
    want = metric_rows("mars")
    assert len(mars.rows) == len(want)
    for got, row in zip(mars.rows, want, strict=True):
        assert got.keys() == row.keys() and all(same(got[k], row[k]) for k in row)
    assert math.isnan(mars.rows[3]["train/bias/top2_excess"]) and mars.rows[5]["train/rollout/tau"] is None
    assert mars.eval["after"]["n"] == 200 and len(mars.samples) == 3


def test_declared_arm_order_wins(tmp_path):
    out = write_experiment(tmp_path, arms=("strict", "mars", "mars_code"))
    (out / "config.yaml").write_text("experiment: exp\narms:\n  - {name: mars_code}\n  - {name: strict}\n")
    assert [a.name for a in load_experiment(out).arms] == ["mars_code", "strict", "mars"]


def test_rows_sorted_by_step_and_report_folder_ignored(tmp_path):
    rows = metric_rows("strict")[::-1]
    write_arm(tmp_path / "exp", "strict", rows=rows)
    (tmp_path / "exp" / "report").mkdir()
    (tmp_path / "exp" / "report" / "metrics.jsonl").write_text("not json\n")
    exp = load_experiment(tmp_path / "exp")
    assert [a.name for a in exp.arms] == ["strict"]
    assert [r["step"] for r in exp.arms[0].rows] == list(range(10))


def test_missing_folder(tmp_path):
    with pytest.raises(ReportError, match="no such folder") as err:
        load_experiment(tmp_path / "nope")
    assert str(tmp_path / "nope") in str(err.value)


def test_folder_without_arms(tmp_path):
    (tmp_path / "empty" / "notes").mkdir(parents=True)
    with pytest.raises(ReportError, match="no arms"):
        load_experiment(tmp_path / "empty")


def test_malformed_metrics_line_names_file_and_line(tmp_path):
    out = write_experiment(tmp_path, arms=("strict", "mars"))
    path = out / "mars" / "metrics.jsonl"
    lines = path.read_text().splitlines()
    lines[4] = '{"step": 4, "train/reward": '
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ReportError) as err:
        load_experiment(out)
    assert str(err.value).startswith(f"{path}:5: malformed JSON")
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("line", "expect"),
    [('{"wall_s": 1.0}', "'step' must be an integer"), ("[1, 2]", "expected a JSON object")],
)
def test_rows_without_a_step_or_not_objects(tmp_path, line, expect):
    out = write_experiment(tmp_path, arms=("strict",))
    path = out / "strict" / "metrics.jsonl"
    path.write_text(path.read_text() + "\n" + line + "\n")  # a blank line is skipped, this is line 12
    with pytest.raises(ReportError, match=f"metrics.jsonl:12: {expect}"):
        load_experiment(out)


def test_malformed_yaml_and_eval(tmp_path):
    out = write_experiment(tmp_path, arms=("strict",))
    (out / "strict" / "config.yaml").write_text("arm: {name: strict\nexperiment: exp\n")
    with pytest.raises(ReportError, match=r"config.yaml:\d+: malformed YAML"):
        load_experiment(out)
    (out / "strict" / "config.yaml").write_text("arm: {name: strict}\n")
    (out / "strict" / "eval.json").write_text(json.dumps({"before": 0.5}))
    with pytest.raises(ReportError, match=r"eval\.json: 'before' must be an object"):
        load_experiment(out)


def test_arm_without_metrics(tmp_path):
    out = write_experiment(tmp_path, arms=("strict",))
    (out / "strict" / "metrics.jsonl").unlink()
    with pytest.raises(ReportError, match=r"strict/metrics\.jsonl: no such file"):
        load_experiment(out)
