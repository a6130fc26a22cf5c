"""bench/verify.py runs and prints the JSON it documents (tiny sizes; timings are not asserted)."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_verify_bench_prints_json():
    cmd = [
        sys.executable,
        str(ROOT / "bench" / "verify.py"),
        "--batch",
        "4",
        "--vocab",
        "512",
        "--repeats",
        "1",
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, check=True)
    out = json.loads(res.stdout)
    assert set(out["ratio_to_softmax"]) == {
        f"{r}/{d}" for r in ("strict", "mars", "mars_code") for d in ("greedy_draft", "full_draft")
    }
    assert all(v > 0 for v in out["ratio_to_softmax"].values())


def _load_bench(name):
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"bench_{name}", ROOT / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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
        sys.executable,
        str(ROOT / "bench" / "tinyworld.py"),
        "--preset",
        "micro",
        "--n-accuracy",
        "8",
        "--n-tau",
        "4",
        "--speed-prompts",
        "8",
        "--speed-reps",
        "1",
        "--accuracy-seeds",
        "1",
        "2",
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, check=True)
    out = json.loads(res.stdout)
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
        out = bench.main(["--preset", "micro", "--prompts", "2", "--batch", "2", *extra])
        parts = out["ms_per_round"]
        assert out["rounds"] > 0 and out["tau"] >= 1
        full = 2 if extra[:1] == ["--tree"] else 6  # drafter steps after the absorb: depth, or K - 1
        assert 0 <= out["draft_steps_per_round"] <= full
        assert (out["draft_steps_per_round"] < full) == (extra[:1] == ["--draft-confidence"])
        assert out["ceiling_free_draft_over_hf_step"] > 0
        assert 0 < parts["draft_absorb"] < parts["draft"]
        assert parts["target_forward"] > 0 and parts["verify"] > 0
        assert parts["target_forward"] + parts["draft"] + parts["verify"] <= parts["round"]
        assert out["hf_single_token_step_ms"] > 0
    assert '"ms_per_round"' in capsys.readouterr().out
