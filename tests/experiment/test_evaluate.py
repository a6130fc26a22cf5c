"""marsrl.experiment.evaluate: the statistics against slow references, the evaluation on a tiny random
policy, and the held-out callback's schedule, curve file and log keys."""

from __future__ import annotations

import itertools
import json
import math
import random
from types import SimpleNamespace

import numpy as np
import pytest
from transformers import TrainerState

from marsrl.experiment import evaluate as ev

# ---------------------------------------------------------------------------------------- statistics


def _paired(n: int, p_before: float, p_after: float, seed: int) -> tuple[list[int], list[int]]:
    rng = random.Random(seed)
    before = [int(rng.random() < p_before) for _ in range(n)]
    after = [int(rng.random() < p_after) for _ in range(n)]
    return before, after


def test_binomial_tail_equals_enumeration():
    # slow reference: count the outcomes of n fair coins with at least k heads, for every k and n <= 12
    for n in range(13):
        for k in range(-1, n + 2):
            heads = sum(1 for bits in itertools.product((0, 1), repeat=n) if sum(bits) >= k)
            assert ev.binomial_tail(k, n) == heads / 2**n


def test_mcnemar_matches_sign_flip_enumeration():
    # slow reference: under H0 each discordant pair's direction is a fair coin; enumerate every assignment
    # and count those at least as extreme (two-sided: |gains - losses| at least as large)
    for gains, losses in [(0, 0), (3, 0), (5, 2), (2, 7), (6, 6), (9, 1), (1, 10)]:
        before = [0] * gains + [1] * losses + [1] * 4 + [0] * 3
        after = [1] * gains + [0] * losses + [1] * 4 + [0] * 3
        m = gains + losses
        got = ev.mcnemar_exact(before, after)
        assert (got["gains"], got["losses"]) == (gains, losses)
        if m == 0:
            assert got["p_two_sided"] == 1.0 and got["p_greater"] == 1.0
            continue
        obs = abs(gains - losses)
        extreme = greater = 0
        for bits in itertools.product((0, 1), repeat=m):
            g = sum(bits)
            extreme += abs(g - (m - g)) >= obs
            greater += g >= gains
        assert got["p_two_sided"] == pytest.approx(min(1.0, extreme / 2**m), abs=1e-15)
        assert got["p_greater"] == pytest.approx(greater / 2**m, abs=1e-15)


def test_mcnemar_matches_scipy_binomtest():
    from scipy.stats import binomtest

    for seed in range(5):
        before, after = _paired(600, 0.3, 0.38, seed)
        got = ev.mcnemar_exact(before, after)
        m = got["gains"] + got["losses"]
        ref = binomtest(got["gains"], m, 0.5)
        assert got["p_two_sided"] == pytest.approx(ref.pvalue, rel=1e-9)
        greater = binomtest(got["gains"], m, 0.5, alternative="greater").pvalue
        assert got["p_greater"] == pytest.approx(greater, rel=1e-9)


def test_mcnemar_is_the_reports_one_implementation():
    # one exact McNemar in marsrl: this module's reads the report's (after as a, before as b)
    from marsrl.report import stats

    assert ev.binomial_tail is stats.binomial_tail
    for seed in range(3):
        before, after = _paired(80, 0.4, 0.5, seed)
        got = ev.mcnemar_exact(before, after)
        p, counts = stats.mcnemar_exact(after, before)
        assert (got["p_two_sided"], got["gains"], got["losses"]) == (p, counts["a_only"], counts["b_only"])


def test_mcnemar_rejects_unpaired_and_non_binary():
    with pytest.raises(ValueError, match="paired"):
        ev.mcnemar_exact([0, 1], [0])
    with pytest.raises(ValueError, match="0 and 1"):
        ev.mcnemar_exact([0, 2], [0, 1])


def test_wilson_is_the_inverted_score_test():
    # slow reference: the Wilson interval is {p : |k/n - p| <= z sqrt(p (1 - p) / n)}; find its ends by
    # bisection on that inequality
    z = 1.959963984540054

    def inside(p, k, n):
        return abs(k / n - p) <= z * math.sqrt(p * (1 - p) / n)

    def edge(k, n, lo, hi, inside_at_lo):
        for _ in range(200):
            mid = (lo + hi) / 2
            if inside(mid, k, n) == inside_at_lo:
                lo = mid
            else:
                hi = mid
        return (lo + hi) / 2

    for k, n in [(0, 10), (3, 10), (10, 10), (57, 200), (283, 500), (1, 1000)]:
        lo, hi = ev.wilson(k, n)
        p = k / n
        ref_lo = 0.0 if k == 0 else edge(k, n, 0.0, p, False)
        ref_hi = 1.0 if k == n else edge(k, n, p, 1.0, True)
        assert lo == pytest.approx(ref_lo, abs=1e-9)
        assert hi == pytest.approx(ref_hi, abs=1e-9)
    assert all(math.isnan(x) for x in ev.wilson(0, 0))


def test_paired_bootstrap_matches_resampling_problems():
    # slow reference: resample the n problems with replacement, one index draw per problem, and take the
    # percentile interval of mean(after - before). Two Monte-Carlo estimates of the same quantiles:
    # n = 300 problems, 4,000 resamples each, seeds 0 (fast) and 1 (slow); they agree within 0.012 (the
    # Monte-Carlo sd of a 2.5% quantile here is ~0.003)
    before, after = _paired(300, 0.3, 0.4, seed=3)
    lo, hi = ev.paired_bootstrap_interval(before, after, n_boot=4000, seed=0)
    rng = np.random.default_rng(1)
    d = np.array(after) - np.array(before)
    means = [d[rng.integers(0, len(d), len(d))].mean() for _ in range(4000)]
    ref_lo, ref_hi = np.quantile(means, [0.025, 0.975])
    assert lo == pytest.approx(ref_lo, abs=0.012)
    assert hi == pytest.approx(ref_hi, abs=0.012)
    # and it is reproducible from its seed, and brackets the observed difference
    assert (lo, hi) == ev.paired_bootstrap_interval(before, after, n_boot=4000, seed=0)
    assert lo < d.mean() < hi


def test_paired_comparison_and_compare_evals():
    before, after = _paired(500, 0.3, 0.45, seed=7)
    cmp = ev.paired_comparison(before, after, n_boot=2000)
    assert cmp["diff"] == pytest.approx(np.mean(after) - np.mean(before))
    assert cmp["ci_low"] < cmp["diff"] < cmp["ci_high"]
    assert cmp["p_two_sided"] < 0.01 and cmp["p_greater"] < cmp["p_two_sided"]
    assert "McNemar" in cmp["test"]
    b = {"t1": ev.accuracy_summary(before) | {"correct": before}, "seconds": 1.0}
    a = {"t1": ev.accuracy_summary(after) | {"correct": after}, "seconds": 1.0}
    b["greedy"] = ev.accuracy_summary([1] * 60 + [0] * 40) | {"correct": [1] * 60 + [0] * 40}
    a["greedy"] = ev.accuracy_summary([1] * 55 + [0] * 45) | {"correct": [1] * 55 + [0] * 45}
    both = ev.compare_evals(b, a, n_boot=500)
    assert set(both) == {"t1", "greedy", "greedy_not_below"}
    assert both["greedy_not_below"] is True  # 0.55 is inside [0.502, 0.691]
    a["greedy"] = ev.accuracy_summary([1] * 45 + [0] * 55) | {"correct": [1] * 45 + [0] * 55}
    assert ev.compare_evals(b, a, n_boot=500)["greedy_not_below"] is False


def test_accuracy_summary():
    s = ev.accuracy_summary([1, 0, 1, 1])
    assert (s["accuracy"], s["n"], s["k"]) == (0.75, 4, 3)
    assert (s["ci_low"], s["ci_high"]) == ev.wilson(3, 4)


def test_eval_steps():
    assert ev.eval_steps(20, None) == [5, 10, 15, 20]
    assert ev.eval_steps(25, None) == [7, 14, 21, 25]  # three inside the run, one at its end
    assert ev.eval_steps(10, 3) == [3, 6, 9, 10]
    assert ev.eval_steps(3, None) == [1, 2, 3]
    assert ev.eval_steps(7, 0) == [7]
    assert ev.eval_steps(0, None) == []
    assert ev.default_temperatures([1, 0, 0.7]) == {"t1": 1.0, "greedy": 0.0, "t0.7": 0.7}


# ---------------------------------------------------------------------------------------- the evaluation


@pytest.fixture(scope="module")
def policy():
    from marsrl.testing import tiny_causal_lm
    from marsrl.tinyworld.tokenizer import train_tokenizer

    corpus = [f"Tom has {i} apples and buys {j} more.\n#### {i + j}" for i in range(20) for j in range(9)]
    tok = train_tokenizer(corpus, vocab_size=300)
    model = tiny_causal_lm(
        vocab=len(tok),
        hidden=32,
        layers=2,
        heads=2,
        kv_heads=1,
        seed=0,
        lm_head_scale=4.0,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    problems = [
        {"prompt": [{"role": "user", "content": f"Tom has {i} apples."}], "gold": str(i)} for i in range(12)
    ]
    return model, tok, problems


def test_evaluate_policy_is_seeded_and_restores_mode(policy, monkeypatch):
    model, tok, problems = policy
    seen = []

    def fake_score(text, gold):  # count what reaches the scorer: "right" = an even number of characters
        seen.append((text, gold))
        return float(len(text) % 2 == 0)

    monkeypatch.setattr("marsrl.data.score", fake_score)
    model.train()
    kw = dict(temperatures={"t1": 1.0, "greedy": 0.0}, max_new_tokens=12, batch_size=5, seed=3)
    first = ev.evaluate_policy(model, tok, problems, **kw)
    assert model.training  # put back as found
    again = ev.evaluate_policy(model, tok, problems, **kw)
    other = ev.evaluate_policy(model, tok, problems, **{**kw, "seed": 4})
    for name in ("t1", "greedy"):
        r = first[name]
        assert r["n"] == len(problems) and len(r["correct"]) == len(problems)
        assert set(r["correct"]) <= {0, 1} and r["k"] == sum(r["correct"])
        assert r["accuracy"] == r["k"] / r["n"] and r["ci_low"] <= r["accuracy"] <= r["ci_high"]
        assert r["correct"] == again[name]["correct"]  # the same seed: the same draws
    texts = [t for t, _ in seen]
    n = len(problems)
    assert [g for _, g in seen[:n]] == [p["gold"] for p in problems]  # scored in problem order
    assert texts[:n] != texts[4 * n : 5 * n]  # another seed, other T = 1 completions
    assert texts[n : 2 * n] == texts[5 * n : 6 * n]  # greedy does not depend on the seed
    assert other["greedy"]["correct"] == first["greedy"]["correct"]


def test_callback_schedule_curve_logs_and_resume(policy, tmp_path):
    model, tok, problems = policy
    kw = dict(temperatures={"t1": 1.0, "greedy": 0.0}, max_new_tokens=8, batch_size=16, seed=0)
    cb = ev.HeldoutEvalCallback(tok, problems, tmp_path, every=3, **kw)
    args = SimpleNamespace(report_to="none")
    state = TrainerState(max_steps=7)
    cb.on_train_begin(args, state, None, model=model)
    logged = {}
    for step in range(1, 8):
        state.global_step = step
        logs = {"loss": 0.1}
        cb.on_log(args, state, None, logs=logs, model=model)
        logged[step] = logs
        cb.on_log(args, state, None, logs={"train_runtime": 1.0}, model=model)  # not a step's log
    cb.on_train_end(args, state, None, model=model)
    rows = ev.read_curve(tmp_path / ev.CURVE_FILE)
    assert [r["step"] for r in rows] == [0, 3, 6, 7]
    assert [s for s, logs in logged.items() if "eval_t1_accuracy" in logs] == [3, 6, 7]
    assert set(logged[3]) >= {"eval_t1_accuracy", "eval_greedy_accuracy", "eval_t1_ci_low", "eval_seconds"}
    assert rows[-1]["results"]["t1"]["correct"] == cb.final["t1"]["correct"]
    assert all(isinstance(r["t1_accuracy"], float) and isinstance(r["greedy_accuracy"], float) for r in rows)
    # the policy did not change: the same draws, the same results at every evaluation
    assert len({json.dumps(r["results"]["t1"]["correct"]) for r in rows}) == 1

    # a run resumed from step 3 keeps the curve up to it, evaluates what follows, and reuses `before`
    cb2 = ev.HeldoutEvalCallback(tok, problems, tmp_path, every=3, resume_step=3, **kw)
    assert sorted(cb2.results) == [0, 3]
    state = TrainerState(max_steps=7, global_step=3)
    cb2.on_train_begin(args, state, None, model=model)
    for step in range(4, 8):
        state.global_step = step
        cb2.on_log(args, state, None, logs={"loss": 0.1}, model=model)
    assert [r["step"] for r in ev.read_curve(tmp_path / ev.CURVE_FILE)] == [0, 3, 6, 7]
    # `at` gives a recorded step without evaluating again, and evaluates (and records) a new one
    cb2.problems = []  # an evaluation would now fail
    assert cb2.at(7, model) is cb2.results[7]
    cb3 = ev.HeldoutEvalCallback(tok, problems, tmp_path, every=3, resume_step=7, **kw)
    assert cb3.at(8, model)["t1"]["n"] == len(problems)
    assert [r["step"] for r in ev.read_curve(tmp_path / ev.CURVE_FILE)] == [0, 3, 6, 7, 8]


def test_callback_reuses_before_and_goes_first(policy, tmp_path):
    model, tok, problems = policy
    before = {"t1": ev.accuracy_summary([0] * 12) | {"correct": [0] * 12}, "seconds": 0.0}
    cb = ev.HeldoutEvalCallback(tok, problems, tmp_path, before=before, temperatures={"t1": 1.0})
    cb.on_train_begin(SimpleNamespace(report_to=[]), TrainerState(max_steps=4), None, model=model)
    assert ev.read_curve(tmp_path / ev.CURVE_FILE)[0]["results"]["t1"]["correct"] == [0] * 12
    trainer = SimpleNamespace(callback_handler=SimpleNamespace(callbacks=["wandb", "recorder"]))
    cb.attach(trainer)
    assert trainer.callback_handler.callbacks[0] is cb


def test_eval_settings_from_the_experiment_config():
    from marsrl.experiment.config import load_experiment

    args = SimpleNamespace(max_completion_length=77, chat_template_kwargs=None)
    cfg = load_experiment(None, ["seed=5", "eval.batch_size=32"])
    kw = ev.eval_settings(cfg, args)
    assert kw == dict(
        temperatures={"t1": 1.0, "greedy": 0.0},
        max_new_tokens=77,
        batch_size=32,
        seed=5,
        chat_template_kwargs={},
    )
    cfg = load_experiment(None, ["eval.seed=9", "eval.max_new_tokens=40", "eval.temperatures=[1.0]"])
    kw = ev.eval_settings(cfg, args)
    assert (kw["seed"], kw["max_new_tokens"], kw["temperatures"]) == (9, 40, {"t1": 1.0})
