"""wandb offline runs: history read back equals what was logged; a folder of runs reports the same
figures as the arm folders; the report's images and completions table land in each arm's run."""

import json
from pathlib import Path

import pytest

from marsrl.report import build_report, log_report_to_wandb, read_wandb_history, read_wandb_run
from marsrl.report.load import load_experiment
from marsrl.report.wandb_read import history_to_metrics, named_for_run, read_wandb_runs

from .helpers import logged_to_wandb, metric_rows, same, samples, write_experiment

wandb = pytest.importorskip("wandb")
ARMS = ("strict", "mars")


@pytest.fixture(scope="module")
def logged(tmp_path_factory):
    """An experiment whose arms were also logged to wandb offline (``wandb_run`` files point at them)."""
    root = tmp_path_factory.mktemp("wb")
    out = write_experiment(root, arms=ARMS)
    for arm in ARMS:
        cfg = {"experiment": "exp", "arm": {"name": arm, "rule": arm}, "lr": 1e-5}
        run = wandb.init(
            dir=str(root),
            mode="offline",
            project="marsrl-test",
            group="exp",
            job_type=arm,
            tags=[arm, "tiny"],
            name=f"exp-{arm}",
            config=cfg,
            reinit="create_new",
        )
        for row in metric_rows(arm):
            run.log(logged_to_wandb(row), step=row["step"])
        run_dir = Path(run.dir).parent
        (out / arm / "wandb_run").write_text(str(run_dir))
        run.finish()
        assert read_wandb_run(run_dir, wait_s=10).finished  # the service flushes the log asynchronously
    return root, out


def test_history_reads_back_as_logged(logged):
    _, out = logged
    run_dir = (out / "mars" / "wandb_run").read_text()
    history = read_wandb_history(run_dir, wait_s=10)
    want = [logged_to_wandb(r) for r in metric_rows("mars")]
    assert len(history) == len(want)
    for step, (got, row) in enumerate(zip(history, want, strict=True)):
        assert got["_step"] == step and got["_runtime"] >= 0
        assert {k for k in got if not k.startswith("_")} == row.keys()
        assert all(same(got[k], row[k]) for k in row), step
    run = read_wandb_run(run_dir)
    assert run.finished
    assert (run.group, run.job_type, run.tags, run.name, run.project) == (
        "exp",
        "mars",
        ["mars", "tiny"],
        "exp-mars",
        "marsrl-test",
    )
    assert run.config == {"experiment": "exp", "arm": {"name": "mars", "rule": "mars"}, "lr": 1e-5}


def test_folder_of_runs_reports_like_the_arm_folders(logged, tmp_path):
    root, out = logged
    single = load_experiment((out / "mars" / "wandb_run").read_text())
    assert [a.name for a in single.arms] == ["mars"] and single.arms[0].run["group"] == "exp"
    from_runs = load_experiment(root / "wandb")
    assert [a.name for a in from_runs.arms] == ["strict", "mars"] and from_runs.name == "exp"
    for arm in from_runs.arms:
        for got, row in zip(arm.rows, metric_rows(arm.name), strict=True):
            assert {k: v for k, v in got.items() if k != "wall_s"}.keys() == {
                k for k, v in row.items() if k != "wall_s" and v is not None
            }
            assert all(same(got[k], row[k]) for k in got if k != "wall_s")
    a = build_report(root / "wandb", out_dir=tmp_path / "a").summaries
    b = build_report(out, out_dir=tmp_path / "b").summaries
    for arm in ARMS:
        for key in b[arm]:
            if key.startswith("acc_") or key == "eval_tau":
                assert a[arm][key] is None  # no eval.json in a wandb run
            elif key != "wall_s":
                assert a[arm][key] == pytest.approx(b[arm][key]), (arm, key)


def test_arm_folder_without_metrics_reads_its_run(logged, tmp_path):
    import shutil

    _, out = logged
    arm = tmp_path / "exp" / "mars"
    shutil.copytree(out / "mars", arm)
    (arm / "metrics.jsonl").unlink()
    run_dir = Path((out / "mars" / "wandb_run").read_text())
    (arm / "wandb_run").write_text(str(run_dir / "files"))  # run.dir, as a trainer may write it
    (loaded,) = load_experiment(tmp_path / "exp").arms
    assert loaded.wandb_run == run_dir.resolve() and loaded.run["group"] == "exp"
    want = history_to_metrics(read_wandb_history(run_dir))
    assert [r.keys() for r in loaded.rows] == [r.keys() for r in want]
    assert all(same(a[k], b[k]) for a, b in zip(loaded.rows, want, strict=True) for k in a)
    assert [r["step"] for r in loaded.rows] == list(range(10)) and loaded.eval["after"]["n"] == 200


def test_run_folder_names_by_id_with_wandbs_suffix():
    assert named_for_run("offline-run-20261204_203454-n8jtj1jw", "n8jtj1jw")
    assert named_for_run("offline-run-20261204_203454-n8jtj1jw-1", "n8jtj1jw")  # same second: -1
    assert named_for_run("run-20261204_203454-n8jtj1jw-12", "n8jtj1jw")  # online runs' folders
    assert not named_for_run("offline-run-20261204_203454-xn8jtj1jw", "n8jtj1jw")
    assert not named_for_run("offline-run-20261204_203454-n8jtj1jw-x", "n8jtj1jw")
    assert not named_for_run("offline-run-20261204_203454-abc-1", "abc-2")
    assert named_for_run("offline-run-20261204_203454-a.b", "a.b") and not named_for_run(
        "offline-run-20261204_203454-axb", "a.b"
    )  # the id is matched as text, not as a pattern


def test_merge_by_step_and_drop_media():
    history = [
        {"_step": 0, "_runtime": 1.0, "train/global_step": 5, "train/reward": 0.5},
        {"_step": 1, "_runtime": 2.0, "train/global_step": 5, "train/loss": 0.1},
        {"_step": 2, "_runtime": 3.0, "report/plot": {"_type": "image-file", "path": "x.png"}},
    ]
    assert history_to_metrics(history) == [
        {"step": 5, "train/global_step": 5, "train/reward": 0.5, "train/loss": 0.1, "wall_s": 2.0}
    ]


def test_log_report_resumes_each_offline_run(logged):
    root, out = logged
    report = build_report(out, to_wandb=True, samples_per_arm=2)
    assert set(report.wandb_runs) == set(ARMS)
    plots = {p.stem for p in (out / "report").glob("*.png")}
    for arm in ARMS:
        original = read_wandb_run((out / arm / "wandb_run").read_text())
        new_dir = report.wandb_runs[arm]
        # wandb appends -1 to the folder's name when the resume starts within the original's second
        assert new_dir != original.path and named_for_run(new_dir.name, original.id)
        media = new_dir / "files" / "media"
        images = {p.name.rsplit("_", 2)[0] for p in (media / "images" / "report").glob("*.png")}
        assert images == plots
        (table,) = (media / "table" / "report").glob("completions_*.table.json")
        data = json.loads(table.read_text())
        cols = data["columns"]
        rows = [dict(zip(cols, r, strict=True)) for r in data["data"]]
        want = [samples(arm)[0], samples(arm)[2]]  # 2 of 3 spread over the file: first and last
        assert [json.loads(r["provenance"]) for r in rows] == [s["provenance"] for s in want]
        assert [json.loads(r["tokens"]) for r in rows] == [s["tokens"] for s in want]
        assert [r["relaxed_tokens"] for r in rows] == [sum(p == 2 for p in s["provenance"]) for s in want]
        resumed = read_wandb_run(new_dir, wait_s=10)
        assert (resumed.id, resumed.group, resumed.job_type, resumed.tags) == (
            original.id,
            "exp",
            arm,
            [arm, "tiny"],
        )
        assert min(h["_step"] for h in resumed.history) == original.last_step + 1  # appends on sync
        assert resumed.summary["report/verdict"] == report.verdict
        assert resumed.summary["report/figure/final_reward"] == pytest.approx(
            report.summaries[arm]["final_reward"]
        )
    # reading the folder again merges the report folders into their runs; metric rows are unchanged
    merged = {r.job_type: r for r in read_wandb_runs(root / "wandb")}
    assert len(merged["mars"].folders) == 2
    assert len(history_to_metrics(merged["mars"].history)) == 10


def test_log_report_into_a_live_run(built, tmp_path):
    out, report = built
    mars = next(a for a in report.experiment.arms if a.name == "mars")
    run = wandb.init(dir=str(tmp_path), mode="offline", project="marsrl-test", reinit="create_new")
    try:
        written = log_report_to_wandb(
            out / "report", report.experiment.arms, runs={"mars": run}, max_samples=3
        )
        assert written == {"mars": Path(run.dir).parent}
    finally:
        run.finish()
    media = written["mars"] / "files" / "media"
    assert len(list((media / "images" / "report").glob("*.png"))) == len(report.plots)
    (table,) = (media / "table" / "report").glob("completions_*.table.json")
    assert len(json.loads(table.read_text())["data"]) == len(mars.samples)
    history = read_wandb_history(written["mars"], wait_s=10)
    assert any(h.get("report/completions", {}).get("_type") == "table-file" for h in history)
