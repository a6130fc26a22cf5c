"""The benches run at tiny sizes and print the JSON they document (timings are not asserted); the
harness they share (``bench._common``) and the commands docs/benchmarks.md gives for them."""

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run_module(*args: str) -> subprocess.CompletedProcess:
    """``python -m bench.<name> ...`` from the repository root, as docs/benchmarks.md runs a bench."""
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, cwd=ROOT)


def test_verify_bench_prints_json():
    cmd = [
        "bench.verify",
        "--batch",
        "4",
        "--vocab",
        "512",
        "--repeats",
        "1",
    ]
    res = _run_module(*cmd)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert set(out["ratio_intervals"]) == set(out["ratio_to_softmax"])
    assert set(out["ratio_to_softmax"]) == {
        f"{r}/{d}" for r in ("strict", "mars", "mars_code") for d in ("greedy_draft", "full_draft")
    }
    assert all(v > 0 for v in out["ratio_to_softmax"].values())


def _load_bench(name):
    return importlib.import_module(f"bench.{name}")


def test_tinyworld_bench_counts_hf_tokens_up_to_eos():
    import torch

    hf_generated = _load_bench("tinyworld").hf_generated
    eos = 9
    out = torch.tensor(
        [
            [5, 5, 1, 2, 9, 0, 0],  # prompt of 2, then 3 tokens (EOS included), then HF's padding
            [5, 5, 1, 2, 3, 4, 6],  # never finished: every generated token counts
            [5, 5, 9, 0, 0, 0, 0],  # EOS at once
        ]
    )
    assert hf_generated(out, 2, eos) == 3 + 5 + 1


def test_tinyworld_bench_prints_json_on_micro():
    cmd = [
        "bench.tinyworld",
        "--preset",
        "micro",
        "--n-accuracy",
        "8",
        "--n-tau",
        "4",
        "--speed-prompts",
        "2",  # batch 8 then runs one group of 2: the table's shape, not its figures, is checked
        "--speed-reps",
        "1",
        "--accuracy-seeds",
        "1",
        "2",
        "--max-new-tokens",
        "12",  # the untrained micro target rarely stops: every run would write the preset's 96
    ]
    res = _run_module(*cmd)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["max_new_tokens"] == 12
    acc = out["accuracy_T1_chain_k7"]
    assert acc["strict"]["n"] == 8 and 0 <= acc["strict"]["accuracy"] <= 1
    assert acc["mars_minus_strict"]["n"] == 8
    assert acc["mars_minus_strict_pooled"]["seeds"] == 2 and acc["mars_minus_strict_pooled"]["n"] == 8
    assert [row["seed"] for row in acc["per_seed"]] == [1, 2]
    assert acc["mars_inside_strict_ci95"] == acc["per_seed"][0]["mars_inside_strict_ci95"]
    assert {"chain_k7_T1_strict", "tree_T0_mars", "chain_k7_T1_mars_over_strict"} <= set(out["tau"])
    for batch in ("batch_1", "batch_8"):
        row = out["speed"][batch]
        assert row["hf_tokens_per_s"] > 0 and row["strict_k7_ratio_to_hf"] > 0
        assert row["mars_over_strict_k3"] > 0 and row["mars_tree_ratio_to_hf"] > 0
        assert row["strict_k7c_ratio_to_hf"] > 0


def test_tinyworld_bench_paired_difference_by_hand():
    import torch

    diff = _load_bench("tinyworld").paired_difference(
        torch.tensor([1.0, 1.0, 0.0, 0.0]), torch.tensor([0.0, 1.0, 0.0, 0.0])
    )
    # d = (1, 0, 0, 0): mean 0.25, sample std 0.5, half width 1.96 * 0.5 / 2
    assert diff["mean"] == 0.25 and diff["n"] == 4
    assert abs(diff["ci95"][0] - (0.25 - 0.49)) < 1e-12 and abs(diff["ci95"][1] - (0.25 + 0.49)) < 1e-12


def test_round_bench_on_micro_accounts_for_the_round(capsys):
    bench = _load_bench("round")
    for extra in ([], ["--tree", "2", "2", "5"], ["--draft-confidence", "0.5"]):
        res = bench.main(["--preset", "micro", "--prompts", "2", "--batch", "2", *extra])
        assert res["hf_single_token_step_ms"] > 0
        out = res["systems"]["strict"]  # the default rule
        parts = out["ms_per_round"]
        assert out["rounds"] > 0 and out["tau"] >= 1
        full = 2 if extra[:1] == ["--tree"] else 6  # drafter steps after the absorb: depth, or K - 1
        assert 0 <= out["draft_steps_per_round"] <= full
        assert (out["draft_steps_per_round"] < full) == (extra[:1] == ["--draft-confidence"])
        assert out["ceiling_free_draft_over_hf_step"] > 0
        assert 0 < parts["draft_absorb"] < parts["draft"]
        assert parts["target_forward"] > 0 and parts["verify"] > 0
        assert parts["target_forward"] + parts["draft"] + parts["verify"] <= parts["round"]
    assert '"ms_per_round"' in capsys.readouterr().out


@pytest.fixture(scope="module")
def micro_world():
    """The micro world of this test run (built once into $MARSRL_CACHE and shared with the other tests)."""
    from marsrl.tinyworld import build_tinyworld

    return build_tinyworld("micro", progress=False)


def test_scale_bench_quick_on_micro(micro_world, capsys):
    bench = _load_bench("scale")
    args = ["--world", str(micro_world), "--preset", "micro", "--quick", "--batches", "1", "8"]
    out = bench.main([*args, "--ks", "1", "3", "--new-tokens", "6", "--tree", "2", "2", "5"])
    systems = {
        "hf_generate",
        "plain",
        "plain_control",
        "strict_k1",
        "strict_k3",
        "mars_k1",
        "mars_k3",
        "strict_tree",
        "mars_tree",
    }
    if out["auto_supported"]:
        systems |= {"strict_auto", "mars_auto"}
    for batch, prompts, group in (("batch_1", 1, 1), ("batch_8", 1, 8)):
        res = out["results"][batch]
        assert (res["prompts"], res["group"]) == (prompts, group)
        assert set(res["systems"]) == systems
        assert res["systems"]["plain"]["ratio_to_marsrl_plain"] == 1.0
        for name, row in res["systems"].items():
            assert row["tokens_per_s"]["median"] > 0 and row["tokens_per_s"]["n"] == 1
            if name != "hf_generate":
                assert row["tau"] >= 1
                if row["k_per_round"] is not None:  # an engine that reports k_per_round
                    assert row["k_per_round"]["rounds"] == row["rounds"] > 0
    bars = out["bars"]
    for rule in ("strict", "mars"):
        bar = bars["batch_8"][f"{rule}_auto_vs_best_fixed"]
        assert bar["bar"] == 0.97 and (bar["value"] is None) == (not out["auto_supported"])
        if out["auto_supported"]:  # --quick: one call a system, so one pair
            assert bar["paired"]["n"] == 1 and bar["paired"]["median"] > 0
    assert set(out["tail"]) >= {"batch", "plain", "strict_k1"} and out["tail"]["batch"] == 8
    if out["auto_supported"]:  # the shared cost model, as calibrated and after the auto calls' rounds
        calibrated, final = out["cost_model"]["calibrated"], out["cost_model"]["final"]
        assert set(calibrated["rounds"]) == {"1", "4", "8"} == set(final["rounds"])
        # the auto calls' rounds set the levels of the sizes they ran at; the calibration's runs stay
        assert final["runs"] == calibrated["runs"] and not calibrated.get("levels")
        assert final["levels"] and set(final["levels"]) <= set(final["rounds"])
        assert set(out["speed_check"]) == {"strict_auto", "mars_auto"}  # each engine's own, by size
        assert all(set(v) <= set(final["rounds"]) for v in out["speed_check"].values() if v)
    floor = out["noise_floor"]["batch_8"]  # the A/A control: two identical plain engines, one pair
    assert floor["plain_control_vs_plain"] > 0 and floor["paired"]["n"] == 1
    if out["auto_supported"]:  # --quick: one head-to-head call of each system after the sweep
        confirm = out["results"]["batch_8"]["confirm"]
        assert confirm["calls"] == 1 and {"plain", "plain_control", "strict_auto", "mars_auto"} <= set(
            confirm["tokens_per_s"]
        )
        assert confirm["k_per_round"]["strict_auto"]["rounds"] > 0
        for shape in confirm["close_calls"]:  # a close pair ran there and its bar was judged there
            assert {f"strict_{shape}", f"mars_{shape}"} <= set(confirm["tokens_per_s"])
            assert bars["batch_8"][f"mars_vs_strict_{shape}"]["judged_on"] == "confirm"
        assert bars["batch_8"]["strict_auto_vs_plain"]["confirm"]["n"] == 1
        assert bars["batch_8"]["strict_auto_vs_plain"]["judged_on"] == "confirm"
        assert floor["confirm"]["n"] == 1
        # the head-to-head's calls are kept, and pooling this one run gives back each of its bars
        pairs = confirm["pairs"]
        assert set(pairs) == set(confirm["tokens_per_s"]) and all(len(v) == 1 for v in pairs.values())
        pooled = _load_bench("pool_scale").pool([out])["bars"]["batch_8"]
        judged = {n for n, b in bars["batch_8"].items() if b.get("confirm")}
        assert set(pooled) == judged and all(pooled[n]["method"] == "pairs" for n in judged)
        assert all(pooled[n]["value"] == bars["batch_8"][n]["confirm"]["value"] for n in judged)
    assert '"bars"' in capsys.readouterr().out


def test_scale_bars_by_hand():
    bars = _load_bench("scale").compute_bars
    rates = {
        "plain": 100.0,
        "strict_k1": 120.0,
        "strict_k3": 150.0,
        "strict_tree": 90.0,
        "strict_auto": 146.0,
    }
    rates |= {"mars_k1": 130.0, "mars_k3": 140.0, "mars_tree": 95.0, "mars_auto": 160.0}
    out = bars({"batch_128": rates}, [1, 3], auto_ok=True)
    row = out["batch_128"]
    assert row["strict_auto_vs_best_fixed"] == {
        "value": 0.9733,
        "bar": 0.97,
        "pass": True,
        "best": "strict_k3",
        "judged_on": "sweep",
    }
    assert row["mars_auto_vs_best_fixed"]["best"] == "mars_k3" and row["mars_auto_vs_plain"]["pass"]
    assert row["strict_auto_speedup"] == {"value": 1.46, "bar": 1.3, "pass": True, "judged_on": "sweep"}
    assert row["mars_auto_speedup"] == {"value": 1.6, "bar": 1.5, "pass": True, "judged_on": "sweep"}
    assert row["mars_vs_strict_k3"]["pass"] is False and row["mars_vs_strict_tree"]["pass"] is True
    assert out["failed"] == ["batch_128.mars_vs_strict_k3"] and out["all_pass"] is False
    # an engine without the adaptive mode: those bars are None, never a pass or a fail
    slow = {k: v for k, v in rates.items() if not k.endswith("auto")} | {"plain": 200.0}
    out = bars({"batch_8": slow}, [1, 3], auto_ok=False)
    assert out["batch_8"]["strict_auto_vs_best_fixed"]["best"] == "plain"
    assert out["batch_8"]["strict_auto_vs_plain"]["pass"] is None and out["all_pass"] is None
    assert "judged_on" not in out["batch_8"]["strict_auto_vs_plain"]
    assert "strict_auto_speedup" not in out["batch_8"] and "mars_vs_strict_auto" not in out["batch_8"]
    assert "paired" not in out["batch_8"]["mars_vs_strict_k1"]  # no per-call rates given


def test_scale_bars_pair_the_calls():
    """Per-call ratios: call i of auto over call i of the best fixed system (by median), then their median
    and IQR; a pair whose slow spell hit both systems cancels where the two medians do not."""
    bars = _load_bench("scale").compute_bars
    rates = {"plain": 100.0, "strict_k1": 150.0, "strict_tree": 90.0, "strict_auto": 140.0}
    rates |= {"mars_k1": 150.0, "mars_tree": 95.0, "mars_auto": 150.0}
    calls = {name: [2 * r, r, 4 * r] for name, r in rates.items()}  # each call's speed scales all systems
    calls["strict_auto"] = [300.0, 150.0, 560.0]  # ratios 1.0, 1.0, 0.9333 to strict_k1's 300, 150, 600
    row = bars({"batch_8": rates}, [1], auto_ok=True, calls={"batch_8": calls})["batch_8"]
    auto = row["strict_auto_vs_best_fixed"]
    assert auto["best"] == "strict_k1" and auto["value"] == round(140 / 150, 4)
    assert auto["paired"]["median"] == 1.0 and auto["paired"]["n"] == 3
    assert auto["paired"]["min"] == round(560 / 600, 4)
    assert row["mars_vs_strict_tree"]["paired"]["median"] == round(95 / 90, 4)


def test_scale_bars_judge_the_head_to_head():
    """Where both systems of a bar ran in the head-to-head, its pass judges the ratio of tokens/s over
    those calls: here the sweep's medians put strict auto at 0.93 of strict_k1, the head-to-head at 1.0."""
    bench = _load_bench("scale")
    rates = {
        "plain": 100.0,
        "plain_control": 101.0,
        "strict_k1": 150.0,
        "strict_k3": 140.0,
        "strict_tree": 90.0,
    }
    rates |= {"strict_auto": 140.0, "mars_k1": 130.0, "mars_k3": 90.0, "mars_tree": 95.0, "mars_auto": 150.0}
    names = bench.confirm_systems(rates, [1, 3], auto_ok=True)
    assert names == ["plain", "plain_control", "strict_k1", "strict_auto", "mars_k1", "mars_auto"]
    # the best fixed system of a rule is plain when no K beats it: then plain alone stands for it
    assert bench.confirm_systems(rates | {"mars_k1": 99.0}, [1, 3], True)[-1:] == ["mars_auto"]
    assert bench.confirm_systems(rates, [1, 3], auto_ok=False) == []
    calls = [(100, 1.0), (300, 2.0)]  # (tokens, seconds) of each call
    confirm = {"batch_8": {"strict_k1": calls, "strict_auto": calls, "plain": [(100, 1.0), (100, 1.0)]}}
    row = bench.compute_bars({"batch_8": rates}, [1, 3], auto_ok=True, confirm=confirm)["batch_8"]
    auto = row["strict_auto_vs_best_fixed"]
    assert auto["value"] == round(140 / 150, 4) and auto["confirm"]["value"] == 1.0
    assert auto["pass"] is True and auto["judged_on"] == "confirm"
    assert row["strict_auto_vs_plain"]["confirm"]["value"] == round(400 / 3 / 100, 4)  # 400 tokens in 3 s
    assert row["mars_auto_vs_best_fixed"]["judged_on"] == "sweep"  # mars ran no head-to-head here
    assert "confirm" not in row["mars_vs_strict_k1"] and "resolved" not in row["mars_auto_vs_best_fixed"]
    # identical calls give an interval of [1, 1], but two calls are too few to call anything resolved
    assert auto["confirm"]["ci"] == [1.0, 1.0] and auto["resolved"] is None


def test_scale_lists_the_failures_a_run_resolves():
    """A failed bar is resolved where its head-to-head interval lies wholly under the bar: strict auto
    at 0.90 of strict_k1 in every call (interval [0.90, 0.90]) is; mars auto at 0.95 of mars_k1 over
    calls reading 0.85 and 1.05 (interval across 0.97) is not; a sweep failure never is."""
    bench = _load_bench("scale")
    rates = {"plain": 100.0, "strict_k1": 150.0, "strict_auto": 135.0, "mars_k1": 150.0, "mars_auto": 142.0}
    rates |= {"strict_tree": 100.0, "mars_tree": 90.0}  # mars < strict for the tree, in the sweep alone
    base = [(100, 1.0)] * 8
    confirm = {
        "batch_8": {
            "strict_k1": base,
            "strict_auto": [(90, 1.0)] * 8,
            "mars_k1": base,
            "mars_auto": [(85, 1.0), (105, 1.0)] * 4,
        }
    }
    bars = bench.compute_bars({"batch_8": rates}, [1], auto_ok=True, confirm=confirm)
    row = bars["batch_8"]
    assert row["strict_auto_vs_best_fixed"]["pass"] is False and row["strict_auto_vs_best_fixed"]["resolved"]
    lo, hi = row["mars_auto_vs_best_fixed"]["confirm"]["ci"]
    assert lo < 0.97 <= hi and row["mars_auto_vs_best_fixed"]["resolved"] is False
    assert {"batch_8.mars_auto_vs_best_fixed", "batch_8.mars_vs_strict_tree"} <= set(bars["failed"])
    assert bars["failed_resolved"] == ["batch_8.strict_auto_vs_best_fixed"]
    # one call a system (--quick): its "interval" is a point, and nothing is resolved
    one = {"batch_8": {name: calls[:1] for name, calls in confirm["batch_8"].items()}}
    bars = bench.compute_bars({"batch_8": rates}, [1], auto_ok=True, confirm=one)
    assert bars["batch_8"]["strict_auto_vs_best_fixed"]["resolved"] is None and bars["failed_resolved"] == []


def test_scale_close_calls_join_the_head_to_head_and_it_judges_them():
    """A mars >= strict pair the sweep does not pass by more than the margin (k1: 0.98, tree: 1.05, k3:
    a sweep failure at 0.6) runs in the head-to-head and its bar judges that; a clear pass (k5: 1.2)
    keeps the sweep's verdict."""
    bench = _load_bench("scale")
    rates = {"plain": 100.0, "strict_k1": 150.0, "strict_k3": 150.0, "strict_tree": 100.0}
    rates |= {"mars_k1": 147.0, "mars_k3": 90.0, "mars_tree": 105.0, "strict_k5": 100.0, "mars_k5": 120.0}
    shapes = ["k1", "k3", "k5", "tree"]
    assert bench.close_calls(rates, shapes, 0.06) == ["k1", "k3", "tree"]
    assert bench.close_calls(rates, shapes, 0.03) == ["k1", "k3"]  # tree's 1.05 passes by more than 0.03
    assert bench.close_calls(rates, shapes, 0.0) == ["k1", "k3"]  # every sweep failure
    assert bench.close_calls(rates, shapes, -1.0) == [] == bench.close_calls({"plain": 1.0}, shapes, 0.1)
    confirm = {"batch_8": {"strict_k1": [(100, 1.0), (100, 1.0)], "mars_k1": [(110, 1.0), (100, 1.0)]}}
    row = bench.compute_bars({"batch_8": rates}, [1, 3], auto_ok=False, confirm=confirm)["batch_8"]
    k1 = row["mars_vs_strict_k1"]
    assert k1["value"] == 0.98 and k1["confirm"]["value"] == 1.05 and k1["pass"] is True
    assert k1["judged_on"] == "confirm"
    assert row["mars_vs_strict_k3"]["judged_on"] == "sweep" and row["mars_vs_strict_k3"]["pass"] is False
    # its own head-to-head, where it ran, judges a sweep failure too
    confirm["batch_8"] |= {"strict_k3": [(100, 1.0)] * 2, "mars_k3": [(103, 1.0)] * 2}
    row = bench.compute_bars({"batch_8": rates}, [1, 3], auto_ok=False, confirm=confirm)["batch_8"]
    assert row["mars_vs_strict_k3"]["judged_on"] == "confirm" and row["mars_vs_strict_k3"]["pass"] is True


def test_ratio_of_sums_and_its_interval_by_hand():
    ratio = _load_bench("_common").ratio_of_sums
    # A: 10 tokens in 1 s, then 30 in 1 s; B: 10 in 2 s twice. Over all calls 40 / 2 over 20 / 4 tok/s
    out = ratio([(10, 1.0), (30, 1.0)], [(10, 2.0), (10, 2.0)], resamples=400, seed=0)
    assert out["value"] == 4.0 and out["n"] == 2 and out["level"] == 0.9
    lo, hi = out["ci"]
    # a resample of two pairs holds the first twice (A 20 tokens / 2 s over B's 5 tok/s: 2.0; p = 1/4),
    # one of each (40 / 2 over 5: 4.0; p = 1/2) or the second twice (60 / 2 over 5: 6.0; p = 1/4), so
    # the 5th and 95th percentiles of 400 resamples are the two ends
    assert lo == 2.0 and hi == 6.0
    same = ratio([(5, 1.0)] * 20, [(5, 1.0)] * 20)
    assert same["value"] == 1.0 and same["ci"] == [1.0, 1.0]
    assert ratio([], []) is None and ratio([(5, 0.0)], [(5, 1.0)]) is None  # no timed pair
    # the interval comes from the seed alone
    noisy = [(100, 1.0 + 0.1 * (i % 7)) for i in range(30)]
    assert ratio(noisy, noisy[::-1], seed=3) == ratio(noisy, noisy[::-1], seed=3)


def test_bench_common_tail_spread_and_rounds():
    common = _load_bench("_common")
    trace = [[0.0, 10, 3, 0.1], [0.5, 4, 3, 0.1], [0.9, 1, 3, 0.1], [1.2, 1, 3, 0.1]]
    # 90% of 10 finished = at most 1 live: from 0.9 s to the end at 1.5 s
    assert common.tail(trace, 10, 1.5) == {
        "t_at_finished_s": 0.9, "tail_s": 0.6, "tail_share": 0.4, "rounds_in_tail": 2
    }  # fmt: skip
    assert common.tail(None, 10, 1.5) is None
    s = common.spread([3.0, 1.0, 2.0, 10.0])
    assert (s["median"], s["min"], s["max"], s["n"]) == (2.5, 1.0, 10.0, 4)
    assert s["iqr"] == 3.0  # inclusive quartiles 1.75 and 4.75
    assert common.batched_rounds({"k_per_round": [0, 3, 3]}) == 3
    assert common.batched_rounds({"target_forwards": 5}) == 4  # one prefill, then a forward per round
    assert common.k_summary([0, 3, 3])["counts"] == {"0": 1, "3": 2}


def test_gpu_bench_cpu_smoke_without_ray(tmp_path, monkeypatch, capsys):
    # the device machine has no Ray: marsrl.rollout does not import there, so the weight update falls
    # back to torch copies; None in sys.modules makes the import fail the same way here
    monkeypatch.setitem(sys.modules, "marsrl.rollout", None)
    bench = _load_bench("gpu")
    path = tmp_path / "gpu.json"
    systems = ["hf_generate", "plain", "strict_k3", "mars_tree"]
    assert bench.main(["--cpu-smoke", "--systems", *systems, "--out", str(path)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert json.loads(path.read_text()) == out
    assert out["mode"] == "cpu-smoke" and out["skipped"] == []
    weights = out["weight_update"]
    assert weights["worker_path"]["usable"] is False and weights["pageable_copy_s"] >= 0
    assert weights["bytes"] > 0 and weights["pinned_copy_s"] is None
    for batch in ("batch_1", "batch_8"):
        rows = out["results"][batch]["systems"]
        assert list(rows) == systems and all(r["tokens_per_s"] > 0 for r in rows.values())
        for name in systems[1:]:
            assert rows[name]["syncs"]["rounds"] > 0 and rows[name]["syncs"]["debug_mode_warnings"] is None
            if out["profile_supported"]:
                assert rows[name]["breakdown"]["ms_per_round"]["target_forward"] > 0
    assert out["results"]["batch_8"]["group"] == 8


def test_gpu_bench_without_cuda_says_so_and_exits_0(monkeypatch, capsys):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert _load_bench("gpu").main([]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and "no CUDA" in lines[0]


def test_engine_bench_only_the_plain_path_with_paired_ratios(capsys):
    bench = _load_bench("engine")
    args = ["--new-tokens", "4", "--batch-sizes", "1", "--repeats", "3", "--min-seconds", "0"]
    out = bench.main([*args, "--only", "marsrl_plain"])
    res = out["results"]["batch_1"]
    assert set(res) == {"hf_generate", "marsrl_plain"}
    paired = res["marsrl_plain"]["paired_ratio_to_hf_generate"]
    assert paired["n"] == 3 and paired["min"] <= paired["median"] <= paired["max"]
    assert res["hf_generate"]["paired_ratio_to_hf_generate"]["median"] == 1.0
    with pytest.raises(SystemExit):
        bench.main([*args, "--only", "marsrl_nope"])
    assert "unknown system" in capsys.readouterr().err


def test_calibration_bench_judges_each_choice_by_the_mean_model():
    from marsrl.engine.adaptive import CostModel

    summarise = _load_bench("calibration").summarise
    # at a = 0.5 the expected tokens are 1, 1.5, 1.75: model 1 makes k = 2 cheap, model 2 makes it dear
    one = CostModel(rounds={1: {0: 1.0, 1: 1.2, 2: 1.3}})
    two = CostModel(rounds={1: {0: 1.0, 1: 1.2, 2: 1.9}})
    out = summarise([one, two], batches=[1], k_max=2, acceptance=[0.5])
    pick = out["choices"]["0.5"]["1"]
    assert pick["chosen"] == [2, 1] and pick["counts"] == {"1": 1, "2": 1}
    # the mean model (1, 1.2, 1.6) rates k = 1 at 1.5 / 1.2 = 1.25 and k = 2 at 1.75 / 1.6 = 1.09375
    assert pick["best_by_mean_model"] == 1
    assert pick["regret"]["max"] == pytest.approx(1 - 1.09375 / 1.25, abs=1e-4)
    assert pick["regret"]["mean"] == pytest.approx((1 - 1.09375 / 1.25) / 2, abs=1e-4)
    fig = out["figures_ms"]["1"]["2"]
    assert fig["ms"] == [1300.0, 1900.0] and fig["cv"] == pytest.approx(0.3 / 1.6, abs=1e-4)
    assert out["per_slot_us"] == {"1": {}} and out["width"] == 0
    # judged at 100 slots, 1 ms a slot for k = 2 alone makes it dearer: (1, 1.2, 1.3 + 0.1) at a = 0.9
    # rates k = 2 at 2.71 / 1.4 = 1.936 and k = 1 at 1.9 / 1.2 = 1.583, but (1, 1.2, 1.3 + 1.0) at 1000
    three = CostModel(rounds=one.rounds, per_slot={1: {0: 0.0, 1: 0.0, 2: 0.001}})
    near = summarise([three, three], batches=[1], k_max=2, acceptance=[0.9], width=100)
    far = summarise([three, three], batches=[1], k_max=2, acceptance=[0.9], width=1000)
    assert near["choices"]["0.9"]["1"]["chosen"] == [2, 2] and far["choices"]["0.9"]["1"]["chosen"] == [1, 1]
    assert near["figures_ms"]["1"]["2"]["ms"] == [1400.0, 1400.0]
    assert near["per_slot_us"]["1"]["2"] == {"values": [1000.0, 1000.0], "cv": 0.0}
    assert "cv" not in near["per_slot_us"]["1"]["0"]
    assert out["mean_regret"] == pytest.approx((1 - 1.09375 / 1.25) / 2, abs=1e-4)
    # judged by a given truth instead of their own mean: model two's dear k = 2 is the truth, so model
    # one's pick of k = 2 costs 1 - (1.75 / 1.9) / 1.25 and model two's pick of k = 1 nothing
    judged = summarise([one, two], batches=[1], k_max=2, acceptance=[0.5], truth=two)
    assert judged["choices"]["0.5"]["1"]["best_by_mean_model"] == 1
    assert judged["mean_regret"] == pytest.approx((1 - (1.75 / 1.9) / 1.25) / 2, abs=1e-4)


def test_calibration_bench_judges_every_setting_by_the_pooled_mean():
    from marsrl.engine.adaptive import CostModel

    compare = _load_bench("calibration").compare_settings
    # as above: at a = 0.5 model one picks k = 2, model two k = 1; the pooled mean (1, 1.2, 1.6) picks 1
    one = CostModel(rounds={1: {0: 1.0, 1: 1.2, 2: 1.3}})
    two = CostModel(rounds={1: {0: 1.0, 1: 1.2, 2: 1.9}})
    out = compare({3: [one, one], 6: [two, two]}, batches=[1], k_max=2, acceptance=[0.5])
    assert set(out) == {"3", "6"}
    # judged by its own mean, setting 3 would read no regret; by the pooled mean its k = 2 costs 12.5%
    assert _load_bench("calibration").summarise([one, one], [1], 2, [0.5])["mean_regret"] == 0
    three, six = out["3"]["choices"]["0.5"]["1"], out["6"]["choices"]["0.5"]["1"]
    assert three["best_by_mean_model"] == six["best_by_mean_model"] == 1
    assert three["chosen"] == [2, 2] and six["chosen"] == [1, 1]
    assert out["3"]["mean_regret"] == pytest.approx(1 - 1.09375 / 1.25, abs=1e-4)
    assert out["6"]["mean_regret"] == 0


def test_calibration_bench_on_micro(micro_world, capsys):
    bench = _load_bench("calibration")
    args = ["--world", str(micro_world), "--preset", "micro", "--max-batch", "8", "--calibrations", "2"]
    out = bench.main([*args, "--max-draft-tokens", "2", "--batches", "1", "8", "--acceptance", "0.6"])
    assert len(out["seconds"]) == 2 and set(out["figures_ms"]) == {"1", "4", "8"}
    assert set(out["per_slot_us"]) == {"1", "4", "8"} and out["width"] == 160
    assert all(v >= 0 for ks in out["per_slot_us"].values() for f in ks.values() for v in f["values"])
    assert all(len(f["ms"]) == 2 and f["cv"] >= 0 for ks in out["figures_ms"].values() for f in ks.values())
    for rows in ("1", "8"):
        pick = out["choices"]["0.6"][rows]
        assert len(pick["chosen"]) == 2 and 0 <= pick["regret"]["mean"] <= pick["regret"]["max"] < 1
    assert '"choices"' in capsys.readouterr().out
    assert out["repeats"] == 3 and 0 <= out["mean_regret"] < 1
    with pytest.raises(SystemExit):
        bench.main([*args[:-1], "1"])  # one calibration compares nothing
    with pytest.raises(SystemExit):
        bench.main([*args, "--repeats", "2", "2"])  # the same setting twice compares nothing
    # two settings of calibrate's runs, each judged by the pooled mean of both settings' models
    two = bench.main(
        [*args, "--max-draft-tokens", "1", "--batches", "8", "--acceptance", "0.6", "--repeats", "1", "2"]
    )
    assert set(two["by_repeats"]) == {"1", "2"} and "choices" not in two
    for setting in two["by_repeats"].values():
        assert len(setting["seconds"]) == 2 and len(setting["choices"]["0.6"]["8"]["chosen"]) == 2
        assert 0 <= setting["mean_regret"] < 1


def test_calibration_bias_bench_on_micro(micro_world, capsys):
    bench = _load_bench("calibration_bias")
    args = ["--world", str(micro_world), "--preset", "micro", "--rows", "8", "--repeats", "1"]
    out = bench.main([*args, "--max-draft-tokens", "2", "--ks", "0", "2", "--rounds", "4"])
    assert out["rows"] == 8 and set(out["per_k"]) == {"0", "2"}
    for row in out["per_k"].values():
        assert row["fixed_ms"] > 0 and row["width"] > 0
        for kind in ("one_round", "two_rounds"):
            fig = row[kind]
            assert fig["ms"] > 0 and fig["over_fixed"] == pytest.approx(fig["ms"] / row["fixed_ms"], abs=2e-3)
    assert '"over_fixed"' in capsys.readouterr().out
    with pytest.raises(SystemExit):
        bench.main([*args, "--max-draft-tokens", "2", "--ks", "3"])  # k past max_draft_tokens


def test_speed_check_bench_on_micro(micro_world, capsys):
    bench = _load_bench("speed_check")
    args = ["--world", str(micro_world), "--preset", "micro", "--batch", "8", "--calls", "2", "--warmup", "1"]
    out = bench.main([*args, "--new-tokens", "6", "--max-draft-tokens", "3", "--fixed", "2", "--skew", "1.2"])
    names = {"plain", "strict_k2", "mars_k2", "strict_auto", "strict_auto_off", "mars_auto", "mars_auto_off"}
    assert set(out["tokens_per_s"]) == names and all(v > 0 for v in out["tokens_per_s"].values())
    assert (
        out["skew"] == 1.2
        and out["ratios"]["plain_vs_plain"]["value"] == 1.0
        and out["ratios"]["strict_auto_vs_off"]["n"] == 2
    )
    assert out["ratios"]["mars_auto_vs_best_fixed"]["best"] in {"plain", "mars_k2"}
    assert out["k_per_round"]["strict_auto"]["rounds"] > 0
    # the checked engines report their SpeedCheck; the unchecked ones have none
    assert out["speed_check"]["strict_auto"] and out["speed_check"]["strict_auto_off"] is None
    assert '"speed_check"' in capsys.readouterr().out
    assert out["drafter_pairs_skipped"] == {name: 0 for name in out["speed_check"]}  # no window


def test_speed_check_bench_window_twins_on_micro(micro_world):
    """--window W runs each rule's auto with EngineConfig(drafter_window=W) beside the plain one,
    --no-off leaves out the check-off twins; a window under max_draft_tokens + 1 is refused."""
    bench = _load_bench("speed_check")
    args = ["--world", str(micro_world), "--preset", "micro", "--batch", "8", "--calls", "1", "--warmup", "0"]
    args += ["--new-tokens", "24", "--max-draft-tokens", "3", "--fixed", "2"]
    with pytest.raises(SystemExit):
        bench.main([*args, "--window", "3"])
    out = bench.main([*args, "--window", "4", "--no-off"])
    names = {"plain", "strict_k2", "mars_k2", "strict_auto", "strict_auto_w4", "mars_auto", "mars_auto_w4"}
    assert set(out["tokens_per_s"]) == names and out["window"] == 4
    assert out["ratios"]["strict_auto_w4_vs_auto"]["n"] == 1 and "strict_auto_vs_off" not in out["ratios"]
    assert set(out["drafter_pairs_skipped"]) == {"strict_auto", "strict_auto_w4", "mars_auto", "mars_auto_w4"}
    assert out["drafter_pairs_skipped"]["strict_auto"] == 0


def test_round_kernels_bench_small_and_its_two_ways_agree(capsys):
    """bench/round_kernels.py on tiny sizes prints both tables; the two commit moves it times leave the same
    buffers, and the two attentions the same output (the bench times equals, not a shortcut)."""
    import torch

    bench = _load_bench("round_kernels")
    out = bench.main(
        [
            "--rows",
            "2",
            "--blocks",
            "1",
            "3",
            "--layers",
            "1",
            "--width",
            "12",
            "--keys",
            "6",
            "--queries",
            "1",
            "3",
            "--repeats",
            "1",
            "--calls",
            "2",
        ]
    )
    assert [(r["rows"], r["block"]) for r in out["commit"]] == [(2, 1), (2, 3)]
    assert [r["queries"] for r in out["drafter_attention"]] == [1, 3]
    assert [r["cpu_folds"] for r in out["drafter_attention"]] == [False, True]
    for r in out["commit"] + out["drafter_attention"]:
        assert r["ratio"] > 0
    assert '"drafter_attention"' in capsys.readouterr().out
    g = torch.Generator().manual_seed(0)
    a = [torch.randn(3, 2, 10, 4, generator=g) for _ in range(2)]
    b = [t.clone() for t in a]
    src = 6 + torch.tensor([[0, 1], [1, 0], [0, 1]])
    dst = torch.tensor([[4, 5], [5, 6], [6, 7]])
    bench._gather_scatter(a, src, dst)
    bench._flat(b, src, dst)
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    q, k, v = torch.randn(2, 4, 3, 8), torch.randn(2, 2, 9, 8), torch.randn(2, 2, 9, 8)
    mask = torch.zeros(2, 1, 3, 9)
    mask[0, :, :, :2] = torch.finfo(torch.float32).min
    gqa = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    from marsrl.drafter import layers

    assert 3 in layers.FOLD_CPU_QUERIES
    assert torch.allclose(layers.grouped_attention(q, k, v, mask), gqa, atol=1e-6)


def test_context_slope_bench_on_micro(micro_world, capsys):
    """bench/context_slope.py on the micro world: a per-k figure and a model line for every k, the line
    never falling in k >= 1 and never below the plain step's own figure."""
    bench = _load_bench("context_slope")
    out = bench.main(
        [
            "--world",
            str(micro_world),
            "--preset",
            "micro",
            "--rows",
            "8",
            "--calibrations",
            "1",
            "--repeats",
            "2",
            "--max-draft-tokens",
            "2",
        ]
    )
    (cal,) = out["calibrations"]
    assert out["repeats"] == 2
    assert out["rows"] == 8 and len(cal["per_k_us"]) == len(cal["line_us"]) == len(cal["per_k_line_us"]) == 3
    assert cal["line_us"][0] == cal["per_k_line_us"][0] == cal["per_k_us"][0] and cal["pooled_us"] >= 0
    for line in (cal["line_us"], cal["per_k_line_us"]):
        assert line[0] <= line[1] <= line[2]
    # one calibration: its per-k line is the all-rounds line, no scatter across calibrations
    assert out["all_rounds_us"] == cal["per_k_line_us"]
    steady = out["steadiness"]["per_k_line"]
    assert steady["cv"] == 0.0 and steady["error"] in (0.0, None)
    assert cal["widths"][0] < cal["widths"][1]
    assert '"pooled_us"' in capsys.readouterr().out
    with pytest.raises(SystemExit):
        bench.main(["--world", str(micro_world), "--preset", "micro", "--calibrations", "0"])


def test_train_bench_step_costs_by_hand(monkeypatch):
    """bench/train.py's step costs without training: ``run`` replaced by fixed per-step rows. The first
    step of every run is dropped, each configuration gets its overrides (auto ones the engine's "auto"),
    and the ratios are the medians' ratios."""
    import argparse

    bench = _load_bench("train")
    speed = {"plain": 100.0, "strict": 90.0, "mars": 120.0, "strict_auto": 99.0, "mars_auto": 132.0}
    calls = []

    def fake_run(preset, arm, steps, out, drafter, overrides):
        calls.append((arm.name, drafter, list(overrides)))
        s = speed[arm.name]
        warm = dict.fromkeys(("train/step_seconds", "train/rollout/tokens_per_s"), 1e6)
        rows = [
            {
                "train/step_seconds": 2.0 if arm.name != "mars" else 1.8,
                "train/rollout/share_of_step": 0.25,
                "train/rollout/tokens_per_s": s,
                "train/rollout/tau": 1.0,
                "train/completions/mean_length": 70.0,
                "train/timing/policy_forward_seconds": 0.3,
                "train/timing/correction_seconds": 0.01,
                **({"train/timing/draft_refresh_seconds": 0.2} if drafter else {}),
            }
            for _ in range(steps - 1)
        ]
        return [warm, *rows]  # the warm-up step would swing every median if it were kept

    monkeypatch.setattr(bench, "run", fake_run)
    args = argparse.Namespace(preset="micro", steps=2, rounds=2, set=["trainer.max_steps=2"], no_auto=False)
    out = bench.step_costs(args)
    assert [c[0] for c in calls] == [*speed] * 2  # interleaved rounds
    auto = "pool.worker.engine.num_draft_tokens=auto"
    assert all((auto in c[2]) == c[0].endswith("_auto") and "trainer.max_steps=2" in c[2] for c in calls)
    assert [c[1] for c in calls[:5]] == [False, True, True, True, True]
    assert out["strict_auto_rollout_vs_strict"] == pytest.approx(1.1)
    assert out["mars_auto_rollout_vs_mars"] == pytest.approx(1.1)
    assert out["mars_step_vs_strict"] == pytest.approx(0.9)
    assert out["strict"]["steps_measured"] == 2 and out["strict"]["refresh_share_of_its_step"] == 0.1
    assert out["plain"]["refresh_share_of_its_step"] is None
    args.no_auto = True
    calls.clear()
    out = bench.step_costs(args)
    assert [c[0] for c in calls] == ["plain", "strict", "mars"] * 2
    assert not any(k.endswith("_auto") or "_auto_" in k for k in out)


def test_plain_steps_bench_on_micro(micro_world):
    """bench/plain_steps.py on the micro world: auto held at k = 0 runs only plain steps at all B rows
    (as many as the plain engine, ignore_eos), both profiled; the mix buckets every round of each call."""
    bench = _load_bench("plain_steps")
    args = ["--world", str(micro_world), "--preset", "micro", "--batch", "8", "--calls", "2", "--warmup", "1"]
    out = bench.main([*args, "--new-tokens", "6", "--max-draft-tokens", "3"])
    ap = out["all_plain"]
    # 6 new tokens: the prefill samples the first, then 5 plain steps at 8 rows a call, 2 timed calls
    assert ap["plain"]["steps"] == ap["auto_k0"]["steps"] == 10
    assert ap["step_ratio"] > 0 and ap["plain"]["phase_s"] and ap["auto_k0"]["phase_s"]
    mix = out["mix"]
    assert set(mix) == {"plain", "strict_auto", "auto_vs_plain"} and mix["auto_vs_plain"]["n"] == 2
    assert all(key.endswith(":plain") for key in mix["plain"]["rounds"])  # the plain engine never drafts
    kinds = {key.split(":")[1] for key in mix["strict_auto"]["rounds"]}
    assert kinds and kinds <= {"plain", "steady", "catchup"}
    rounds = mix["strict_auto"]["rounds"].values()
    # 6 new tokens a row at most, 8 rows, 2 calls: the prefill samples one a row, the rounds the rest
    assert sum(v["tokens"] for v in rounds) <= 2 * 8 * 5
    assert all(v["tokens"] >= v["rounds"] for v in rounds)
    with pytest.raises(SystemExit):
        bench.main([*args, "--batch", "12"])  # not a multiple of --group 8
    # part fixed: every round of each fixed-k engine but a call's first, against the calibration
    out = bench.main(
        [*args, "--new-tokens", "6", "--max-draft-tokens", "3", "--part", "fixed", "--ks", "0", "2"]
    )
    assert "mix" not in out and "all_plain" not in out and out["calibration_s"] > 0
    by_k = [b["k"] for b in out["fixed"].values()]
    assert {k for rows in by_k for k in rows} == {"0", "2"}
    for b in out["fixed"].values():
        assert b["best_measured"] in b["k"] and b["best_model"] in b["k"]
        for k, row in b["k"].items():
            assert row["measured_over_predicted"] > 0 and row["tokens_per_row"] >= 1
            if k == "0":
                assert row["tokens_per_row"] == 1  # a plain step keeps one token a row
    with pytest.raises(SystemExit):  # the calibration prices k up to --max-draft-tokens only
        bench.main([*args, "--max-draft-tokens", "3", "--part", "fixed", "--ks", "0", "4"])


def test_live_rows_bench_on_micro(micro_world):
    """bench/live_rows.py on the micro world: both auto engines (the live rows' acceptance and the
    call's pooled estimates) and the fixed ones run every timed call; each drafting round of an auto
    engine is paired with what the planner expected of it; the engine's planner class and the default
    ``row_prior`` are as they were after it."""
    import marsrl.engine.engine as engine_module
    from marsrl.engine import SpeculativeEngine
    from marsrl.engine.adaptive import KPlanner

    bench = _load_bench("live_rows")
    args = ["--world", str(micro_world), "--preset", "micro", "--batch", "8", "--calls", "2", "--warmup", "1"]
    out = bench.main([*args, "--new-tokens", "6", "--ks", "0", "2"])
    assert set(out["tokens_per_s"]) == {"live", "pooled", "k0", "k2"}
    assert out["live_vs_pooled"]["n"] == 2 and set(out["vs_fixed"]) == {
        "live/k0",
        "live/k2",
        "pooled/k0",
        "pooled/k2",
    }
    for name in ("live", "pooled"):
        drafting = sum(n for k, n in out["k_per_round"][name].items() if k != "0")
        planned = [v for key, v in out["kept_over_expected"].items() if key.startswith(f"{name}:")]
        # every drafting round, each paired with its choice (a call's first is planned at the prefill)
        assert planned and sum(v["rounds"] for v in planned) <= drafting
        assert all(v["expected"] >= 1 and v["kept"] >= 1 for v in planned)
    assert engine_module.KPlanner is KPlanner and SpeculativeEngine.row_prior == 4.0
    with pytest.raises(SystemExit):
        bench.main([*args, "--batch", "12"])  # not a multiple of --group 8


def test_every_bench_script_runs_main_after_all_its_definitions():
    """Run as a script, a bench executes its ``if __name__ == "__main__"`` block where it stands: a
    function defined below it does not exist yet when main() calls it (which the imported-module tests
    above cannot see).  So the block comes last."""
    import ast

    for path in sorted((ROOT / "bench").glob("*.py")):
        body = ast.parse(path.read_text()).body
        guards = [
            i
            for i, node in enumerate(body)
            if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test)
        ]
        if guards:
            assert guards == [len(body) - 1], f"{path.name}: the __main__ block is not the last statement"


def _pairs(rng, n, speed, pace=1.0):
    """n paired calls ((tokens, seconds), (tokens, seconds)): the first system ``speed`` times the second's
    tokens/s, each call's length and the machine's ``pace`` shared by the pair, a few percent of noise."""
    out = []
    for _ in range(n):
        tokens = rng.randint(500, 2000)
        base = tokens / 1000 * pace * rng.uniform(0.8, 1.25)
        out.append(
            ((tokens, base / speed * rng.uniform(0.97, 1.03)), (tokens, base * rng.uniform(0.97, 1.03)))
        )
    return out


def test_pooled_ratio_of_sums_resamples_within_each_run_and_narrows_over_several():
    """Two runs whose pairs are each all alike (ratio 1.0 in one, 0.5 in the other, 10 pairs each, the
    same tokens and seconds per call): resampled within each run every bootstrap draw keeps the 10 + 10
    mix, so the interval is the point 2/3; pooled across runs it would move with the draw.  Seed 3:
    three runs of 48 pairs each at a true ratio of 0.96 and paces 1, 1.2 and 0.8 give the ratio of the
    pooled sums (by hand), an interval that holds 0.96 and is under 0.75x the width of the widest
    single run's."""
    import random

    common = _load_bench("_common")
    pooled_ratio_of_sums, ratio_of_sums = common.pooled_ratio_of_sums, common.ratio_of_sums
    same = [((100, 1.0), (100, 1.0))] * 10
    half = [((100, 2.0), (100, 1.0))] * 10
    mixed = pooled_ratio_of_sums([same, half])  # 2000 tokens in 30 s against 2000 in 20 s
    assert mixed["value"] == round(2 / 3, 4) and mixed["ci"] == [round(2 / 3, 4)] * 2 and mixed["n"] == 20
    rng = random.Random(3)
    runs = [_pairs(rng, 48, 0.96, pace) for pace in (1.0, 1.2, 0.8)]
    pooled = pooled_ratio_of_sums(runs)
    flat = [p for run in runs for p in run]
    rate = (sum(a[0] for a, _ in flat) / sum(a[1] for a, _ in flat)) / (
        sum(b[0] for _, b in flat) / sum(b[1] for _, b in flat)
    )
    assert pooled["value"] == round(rate, 4) and pooled["n"] == 144
    lo, hi = pooled["ci"]
    assert lo < 0.96 < hi
    widths = [
        (lambda r: r["ci"][1] - r["ci"][0])(ratio_of_sums([a for a, _ in r_], [b for _, b in r_]))
        for r_ in runs
    ]
    assert hi - lo < 0.75 * max(widths)
    assert pooled_ratio_of_sums([[], []]) is None


def test_inverse_variance_pools_log_intervals():
    """Two readings of 0.95 with the same interval pool to 0.95 with a log-width 1/sqrt(2) of theirs;
    0.9 and 1.0 with equal widths pool to their geometric mean; a reading of one call (zero width)
    is left out."""
    import math

    iv = _load_bench("pool_scale").inverse_variance
    r = {"value": 0.95, "ci": [0.92, 0.98]}
    two = iv([r, r])
    assert two["value"] == 0.95 and two["n"] == 2
    width = math.log(two["ci"][1] / two["ci"][0])
    assert width == pytest.approx(math.log(0.98 / 0.92) / math.sqrt(2), rel=5e-3)  # bounds kept to 4 digits
    mixed = iv([{"value": 0.9, "ci": [0.9 / 1.05, 0.9 * 1.05]}, {"value": 1.0, "ci": [1 / 1.05, 1.05]}])
    assert mixed["value"] == round(math.sqrt(0.9), 4)
    assert iv([r, {"value": 0.5, "ci": [0.5, 0.5]}])["value"] == 0.95
    assert iv([{"value": 0.5, "ci": [0.5, 0.5]}])["value"] is None


def _scale_run(bench, rng, auto_speed, best, pairs=True):
    """A bench/scale.py output at B = 8 as ``compute_bars`` writes it: strict auto against ``best``
    (strict_k3 or strict_k5, the sweep's pick) at ``auto_speed``, 48 head-to-head calls a system."""
    rates = {"plain": 100.0, "strict_k3": 120.0, "strict_k5": 119.0, "strict_auto": 118.0}
    rates |= {"mars_k3": 130.0, "mars_k5": 128.0, "mars_auto": 131.0}
    rates[best] = 125.0
    calls = _pairs(rng, 48, auto_speed)
    rec = {"strict_auto": [a for a, _ in calls], best: [b for _, b in calls]}
    rec["plain"] = [(t, s * 1.2) for t, s in rec[best]]
    bars = bench.compute_bars({"batch_8": rates}, [3, 5], auto_ok=True, confirm={"batch_8": rec})
    confirm = {"calls": 48} | ({"pairs": {n: [list(c) for c in r] for n, r in rec.items()}} if pairs else {})
    return {"bench": "scale", "bars": bars, "results": {"batch_8": {"confirm": confirm}}}


def test_pool_scale_pools_each_bar_over_runs():
    """Seed 5, three runs at B = 8 whose sweeps picked strict_k3, strict_k5 and strict_k3 as the best fixed
    system, strict auto at 0.975 of it: pooled over the kept calls the bar's figure is that of all 144
    pairs, each run's own best in ``per_run``, and its interval narrower than any run's; runs without
    kept calls pool by their intervals; bars judged on a sweep (mars here) are left out; one bar
    pooled wrongly (against the other k) would not match its runs."""
    import random

    bench, tool = _load_bench("scale"), _load_bench("pool_scale")
    rng = random.Random(5)
    runs = [_scale_run(bench, rng, 0.975, best) for best in ("strict_k3", "strict_k5", "strict_k3")]
    out = tool.pool(runs)
    bar = out["bars"]["batch_8"]["strict_auto_vs_best_fixed"]
    assert bar["method"] == "pairs" and bar["pairs"] == 144 and bar["runs"] == 3
    assert [r["best"] for r in bar["per_run"]] == ["strict_k3", "strict_k5", "strict_k3"]
    pooled_ratio_of_sums = _load_bench("_common").pooled_ratio_of_sums
    strata = []
    for run in runs:
        kept, best = (
            run["results"]["batch_8"]["confirm"]["pairs"],
            run["bars"]["batch_8"]["strict_auto_vs_best_fixed"]["best"],
        )
        strata.append(list(zip(map(tuple, kept["strict_auto"]), map(tuple, kept[best]), strict=True)))
    assert bar["value"] == pooled_ratio_of_sums(strata)["value"]
    lo, hi = bar["ci"]
    assert lo < 0.975 < hi and all(hi - lo < r["ci"][1] - r["ci"][0] for r in bar["per_run"])
    assert bar["pass"] is (bar["value"] >= 0.97) and bar["resolved"] is (lo >= 0.97 or hi < 0.97)
    assert (
        "strict_auto_vs_plain" in out["bars"]["batch_8"]
        and "mars_auto_vs_best_fixed" not in out["bars"]["batch_8"]
    )
    # the same runs without their calls (runs from before): pooled by intervals, near the same figure
    bare = [_scale_run(bench, random.Random(5 + i), 0.975, "strict_k3", pairs=False) for i in range(3)]
    by_ci = tool.pool(bare)["bars"]["batch_8"]["strict_auto_vs_best_fixed"]
    assert by_ci["method"] == "intervals" and by_ci["pairs"] == 144 and abs(by_ci["value"] - 0.975) < 0.02


def test_pool_scale_cli_names_a_bad_file(tmp_path):
    """A missing file, a file that is not JSON and JSON that is not a scale output each stop the tool
    with one line naming the file, exit 2, no traceback."""
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"bench": "engine"}))
    for path, words in (
        (tmp_path / "nope.json", "No such file"),
        (bad, "not JSON"),
        (other, "not a bench/scale.py"),
    ):
        res = _run_module("bench.pool_scale", str(path))
        assert res.returncode == 2 and res.stdout == ""
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"pool_scale: {path}:") and words in lines[0], (
            res.stderr
        )


# ------------------------------------------------------------------------------------------ the harness


def _fake_clock(monkeypatch, common):
    """A clock that moves only when a variant says so: each variant's cost is exact."""
    now = [0.0]
    monkeypatch.setattr(common.time, "perf_counter", lambda: now[0])

    def cost(seconds: float, result=None):
        now[0] += seconds
        return result

    return cost


def test_compare_rotates_the_order_warms_up_and_takes_the_median_of_calls(monkeypatch):
    common = _load_bench("_common")
    cost = _fake_clock(monkeypatch, common)
    order: list[str] = []
    spent = {
        "a": iter([9.0, 1.0, 1.0, 2.0, 3.0, 5.0, 1.0]),
        "b": iter([9.0, *[2.0] * 6]),
        "c": iter([9.0] * 7),
    }

    def variant(name):
        def fn():
            order.append(name)
            return cost(next(spent[name]), result=len(order))

        return fn

    t = common.compare({n: variant(n) for n in "abc"}, repeats=3, warmup=1, calls=2)
    # the warm-up once each in order, then each repeat's order rotated by one, two calls a turn
    assert "".join(order) == "abc" + "aabbcc" + "bbccaa" + "ccaabb"
    assert t.seconds["a"] == [1.0, 2.5, 3.0]  # medians of (1, 1), (2, 3), (5, 1); the 9 s warm-up left out
    assert t.median("a") == 2.5 and t.median("b") == 2.0
    assert t.results["a"] == [5, 15, 19]  # what each repeat's last call returned
    assert t.spread("c") == {"median": 9.0, "min": 9.0, "max": 9.0, "iqr": 0.0, "n": 3}


def test_timings_ratio_keeps_a_shared_slow_spell_paired():
    """Five repeats, seed 0, 2000 resamples: a slow spell that hits both variants of a repeat alike
    leaves the ratio and its whole interval at 0.5; noise in one variant widens the interval around the
    median ratio without moving it."""
    common = _load_bench("_common")
    paired = common.Timings(seconds={"a": [1, 1, 4, 1, 1], "b": [2, 2, 8, 2, 2]}, results={})
    assert paired.ratio("a", "b") == {"value": 0.5, "ci": [0.5, 0.5], "level": 0.9, "n": 5}
    noisy = common.Timings(seconds={"a": [1.0, 1.2, 0.9, 1.1, 1.0], "b": [2.0] * 5}, results={})
    r = noisy.ratio("a", "b")
    assert r["value"] == 0.5 and r["ci"][0] < 0.5 < r["ci"][1] and r["ci"][0] >= 0.45 and r["ci"][1] <= 0.6


def test_emit_prints_one_json_object(capsys):
    out = _load_bench("_common").emit({"bench": "x", "figure": 1.5})
    assert json.loads(capsys.readouterr().out) == out == {"bench": "x", "figure": 1.5}


# ------------------------------------------------------------------------------------------ the commands


def _benches() -> list[str]:
    return sorted(p.stem for p in (ROOT / "bench").glob("*.py") if not p.stem.startswith("_"))


def test_every_bench_has_a_section_and_a_command_in_the_docs():
    """docs/benchmarks.md gives each bench a section and a ``python -m bench.<name>`` command; every
    such command in the README and docs names a bench that exists, and none uses the script form
    ``python bench/<name>.py`` (a bench imports ``bench._common``, which needs the repository root on the
    path that ``-m`` gives)."""
    import re

    text = (ROOT / "docs" / "benchmarks.md").read_text()
    for name in _benches():
        assert f"### bench/{name}.py" in text, f"docs/benchmarks.md has no section for bench/{name}.py"
        assert f"-m bench.{name}" in text, f"docs/benchmarks.md has no command for bench/{name}.py"
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    for path in docs:
        doc = path.read_text()
        for name in re.findall(r"-m bench\.(\w+)", doc):
            assert (ROOT / "bench" / f"{name}.py").exists(), f"{path.name}: no bench/{name}.py"
        assert not re.search(r"python3? bench/", doc), f"{path.name}: a bench run as a script"


def test_no_bench_edits_sys_path():
    """The benches import each other and the harness as the ``bench`` package."""
    for name in _benches():
        assert "sys.path" not in (ROOT / "bench" / f"{name}.py").read_text(), name


def test_eval_batch_bench_on_micro(micro_world):
    """Greedy decoding scores the same problems at any batch size; a repeat repeats T = 1's draws."""
    args = [
        "--preset",
        "micro",
        "--n",
        "4",
        "--batch-sizes",
        "2",
        "4",
        "--repeats",
        "2",
        "--max-new-tokens",
        "6",
    ]
    out = _load_bench("eval_batch").main(args)
    assert set(out["batch_sizes"]) == {"2", "4"} and out["batch_sizes"]["2"]["vs_first"] == 1.0
    assert out["batch_sizes"]["4"]["seconds"]["n"] == 2 and out["batch_sizes"]["4"]["seconds"]["median"] > 0
    assert out["greedy_identical"] is True and out["t1_repeatable"] is True
