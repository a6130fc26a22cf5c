"""Planning a batch into requests, per-request seeds and the prompt checks (pure functions, no model)."""

import pytest

from marsrl.engine import SamplingParams
from marsrl.rollout import check_prompts, plan_requests, request_seed

PROMPTS = [[i, i + 1] for i in range(7)]


def test_near_equal_split_keeps_order_and_offsets():
    reqs = plan_requests(PROMPTS, SamplingParams(n=3, seed=5), num_requests=3)
    assert [len(r.prompt_ids) for r in reqs] == [3, 2, 2]
    assert [r.first_prompt for r in reqs] == [0, 3, 5]
    assert [list(p) for r in reqs for p in r.prompt_ids] == PROMPTS
    assert [r.num_trajectories for r in reqs] == [9, 6, 6]
    assert all(r.sampling.n == 3 for r in reqs)


def test_fixed_size_split_and_more_requests_than_prompts():
    reqs = plan_requests(PROMPTS, SamplingParams(), prompts_per_request=3)
    assert [len(r.prompt_ids) for r in reqs] == [3, 3, 1]
    assert len(plan_requests(PROMPTS[:2], SamplingParams(), num_requests=5)) == 2


def test_seeds_request_zero_keeps_seed_others_distinct_and_reproducible():
    reqs = plan_requests(PROMPTS, SamplingParams(seed=11), num_requests=4)
    seeds = [r.sampling.seed for r in reqs]
    assert seeds[0] == 11
    assert len(set(seeds)) == 4
    assert seeds == [r.sampling.seed for r in plan_requests(PROMPTS, SamplingParams(seed=11), num_requests=4)]
    pairs = {request_seed(s, r) for s in range(50) for r in range(50)}
    assert len(pairs) == 2500  # no two (seed, request) pairs share a stream in this range
    assert all(0 <= s < 2**63 for s in pairs)


def test_plan_needs_exactly_one_size():
    with pytest.raises(ValueError, match="exactly one"):
        plan_requests(PROMPTS, SamplingParams())
    with pytest.raises(ValueError, match="exactly one"):
        plan_requests(PROMPTS, SamplingParams(), num_requests=1, prompts_per_request=1)


@pytest.mark.parametrize(
    ("prompts", "message"),
    [
        ([], "non-empty list"),
        ([[1, 2], []], r"prompt_ids\[1\] is empty"),
        (["hello"], "is a string; tokenize it first"),
        ([[1, 2.5]], "non-integer"),
        ([[1, True]], "non-integer"),
        ([[1, 64]], r"outside the vocabulary \[0, 64\): \[64\]"),
        ([[3], [-1]], r"prompt_ids\[1\] has token ids outside"),
        ([list(range(10)) * 2], "20 tokens; the model's context is 16"),
        ([5], r"is not a list of token ids \(got int\)"),
    ],
)
def test_check_prompts_names_the_problem(prompts, message):
    with pytest.raises(ValueError, match=message):
        check_prompts(prompts, vocab_size=64, max_seq_len=16)


def test_check_prompts_accepts_tuples_and_numpy_ints():
    import numpy as np

    assert check_prompts([(1, 2), np.array([3, 4]).tolist(), [np.int64(5)]], 64, 16) == [[1, 2], [3, 4], [5]]


def test_n_below_one_fails_at_construction():
    with pytest.raises(ValueError, match="n must be >= 1"):
        SamplingParams(n=0)
