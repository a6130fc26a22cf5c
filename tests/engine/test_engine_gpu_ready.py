"""What a GPU run depends on, checked on the CPU: syncs per round, cache bytes flat in the committed
length, fp32 verify logits for bf16 targets, refused attention implementations, nothing kept after a
batch, and adaptive speculation (exact, deterministic, K varying)."""

import itertools
import math
import statistics

import pytest
import torch

from marsrl.drafter import Eagle3Drafter
from marsrl.engine import EngineConfig, SamplingParams, SpeculativeEngine
from marsrl.engine.adaptive import CostModel, KPlanner
from marsrl.engine.engine import fp32_linear
from marsrl.testing import tiny_causal_lm
from marsrl.verify import DEFAULT_THETA
from tests.engine.helpers import PROMPTS, exact_joint, hf_greedy, sample_index
from tests.engine.syncs import SyncCounter
from tests.stats import assert_distribution


@pytest.fixture(scope="module")
def qwen():
    return tiny_causal_lm("qwen3", vocab=64, layers=4, max_positions=1200, seed=0)


def _syncs_per_round(engine, prompts, sp):
    engine.generate(prompts, sp)  # warm-up (lazy inits)
    with SyncCounter() as c:
        engine.generate(prompts, sp)
    rounds = engine.stats["rounds"] // len(prompts) + 1  # + the prefill, per row (all rows in lockstep)
    return c.count / rounds, c.where


@pytest.mark.parametrize("mode", ["plain", "chain", "mars", "auto"])
def test_at_most_two_syncs_per_round(qwen, mode):
    head = Eagle3Drafter.from_target(qwen)
    cfgs = {
        "plain": None,
        "chain": EngineConfig(num_draft_tokens=5),
        "mars": EngineConfig(num_draft_tokens=5, rule="mars"),
        "auto": EngineConfig(num_draft_tokens="auto", max_draft_tokens=4),
    }
    costs = CostModel(rounds={1: {k: 1.2 + 0.25 * k for k in range(5)}})
    eng = SpeculativeEngine(qwen, None if mode == "plain" else head, cfgs[mode], cost_model=costs)
    # one row: rows never leave the batch early, so every round is an ordinary round
    per_round, where = _syncs_per_round(eng, [[1, 2, 3]], SamplingParams(max_new_tokens=24, ignore_eos=True))
    assert per_round <= 2, (per_round, where)
    assert eng.stats["host_syncs"] == eng.stats["rounds"] + 1  # the engine's own: one record copy a round


def _bytes_per_extra_round(engine, prompt_len: int, mode: str) -> float:
    prompts = [[(7 * i + j) % 60 + 1 for j in range(prompt_len)] for i in range(2)]
    out = []
    for n in (8, 16):
        engine.generate(prompts, SamplingParams(temperature=0.0, max_new_tokens=n, ignore_eos=True))
        out.append((engine.stats["cache_bytes_copied"], engine.stats["rounds"]))
    return (out[1][0] - out[0][0]) / (out[1][1] - out[0][1])


@pytest.mark.parametrize("mode", ["plain", "chain"])
def test_cache_bytes_per_round_do_not_grow_with_the_committed_length(qwen, mode):
    # a head of its own seed: the bytes a round moves follow its acceptance, which an untrained head's
    # random init sets; drawn from the global generator it depended on the tests run before it (with
    # seed 4 of 0-7 a round moved 4608 bytes at 128 prompt tokens and 2432 at 1024)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        head = Eagle3Drafter.from_target(qwen)
    eng = SpeculativeEngine(qwen, None if mode == "plain" else head, EngineConfig(num_draft_tokens=3))
    short, long = (_bytes_per_extra_round(eng, t, mode) for t in (128, 1024))
    cfg = qwen.config
    # bytes of one row's K and V at one position, all layers, fp32 (rounds are counted per row)
    per_token = cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * cfg.head_dim * 4
    if mode == "plain":  # an append of one token a round, nothing moved
        assert short == long == per_token
    else:  # at most the K + 1 appended entries plus the kept ones moved (target), and the drafter's few
        assert short <= 3 * 4 * per_token and long <= 3 * 4 * per_token, (short, long)
        assert abs(long - short) <= 0.25 * short, (short, long)


def test_fp32_verify_logits_decide_near_ties_like_an_fp32_reference():
    """A bf16 head on bf16 hidden states: the margin decision z2/z1 > theta at positions whose reference
    ratio lies within 0.02 of theta (seed 0, 4,096 positions, V = 1,024) must equal float64's, and the
    plain bf16 GEMM (the control) must get some of them wrong."""
    torch.manual_seed(0)
    hidden = torch.randn(4096, 256).to(torch.bfloat16)
    weight = (torch.randn(1024, 256) / 4).to(torch.bfloat16)
    ref = hidden.double() @ weight.double().t()
    top = ref.topk(2, -1).values
    ratio = top[:, 1] / top[:, 0]
    near = (top[:, 0] > 0) & ((ratio - DEFAULT_THETA).abs() < 0.02)
    assert near.sum() > 300, int(near.sum())

    def decide(logits):
        v = logits.double().topk(2, -1).values
        return (v[:, 1] / v[:, 0] > DEFAULT_THETA)[near]

    want = decide(ref)
    assert torch.equal(decide(fp32_linear(hidden, weight)), want)
    bf16 = torch.nn.functional.linear(hidden, weight).float()
    assert not torch.equal(decide(bf16), want), "the control should flip some near-tie decisions"


def test_bf16_engine_verifies_with_fp32_logits():
    model = tiny_causal_lm("qwen3", vocab=64, layers=2, seed=3).to(torch.bfloat16)
    eng = SpeculativeEngine(model, None)
    h = torch.randn(3, model.config.hidden_size).to(torch.bfloat16)
    assert torch.equal(eng._lm_head(h), fp32_linear(h, model.lm_head.weight))
    off = SpeculativeEngine(model, None, EngineConfig(fp32_logits=False))
    assert torch.equal(off._lm_head(h), model.lm_head(h).float())


def test_flash_attention_targets_are_refused():
    model = tiny_causal_lm("qwen3", vocab=64, layers=2)
    model.config._attn_implementation_internal = "flash_attention_2"
    with pytest.raises(ValueError, match=r"attn_implementation='flash_attention_2'.*sdpa"):
        SpeculativeEngine(model, None)


def test_nothing_of_a_batch_stays_with_the_drafter(qwen):
    eng = SpeculativeEngine(qwen, Eagle3Drafter.from_target(qwen), EngineConfig(num_draft_tokens=3))
    eng.generate(PROMPTS, SamplingParams(max_new_tokens=8))
    assert eng._eagle.cache is None and eng._eagle.feats is None


def test_pairs_appended_over_plain_steps_absorb_like_pairs_absorbed_each_round(qwen):
    """A plain step (auto's k = 0) leaves its pair pending; absorbing two rounds of pairs at once must
    give the drafter the state it gets absorbing them one round at a time."""
    from marsrl.engine.engine import _EagleState

    head = Eagle3Drafter.from_target(qwen)
    torch.manual_seed(1)
    feats = torch.randn(2, 6, 3 * qwen.config.hidden_size)
    tokens = torch.randint(0, 64, (2, 6))
    counts = [[2, 1], [1, 2], [1, 1]]  # per round, per row: pairs added (of the 2 passed)
    outs = []
    for together in (False, True):
        st = _EagleState(head)
        st.start(2, torch.device("cpu"), feats[:, :4], tokens[:, :4], torch.tensor([4, 2]), [4, 2], 32)
        h, lg = st.absorb()
        at = [4, 2]
        for c in counts:
            cols = [min(a, 4) for a in at]  # the next two pairs of each row (the last two at the end)
            f = torch.stack([feats[b, cols[b] : cols[b] + 2] for b in range(2)])
            t = torch.stack([tokens[b, cols[b] : cols[b] + 2] for b in range(2)])
            st.pend(f, t, torch.tensor(c), c, append=together)
            at = [a + n for a, n in zip(at, c, strict=True)]
            if not together:
                h, lg = st.absorb()
        if together:
            h, lg = st.absorb()
        outs.append((h, lg, st.cache.lengths.clone()))
    assert torch.equal(outs[0][2], outs[1][2])
    torch.testing.assert_close(outs[0][0], outs[1][0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(outs[0][1], outs[1][1], rtol=1e-5, atol=1e-5)


def test_plain_steps_pairs_kept_aside_absorb_right_when_rows_finish_midway(qwen):
    """A run of plain steps keeps its pairs aside (``_EagleState.pend_plain``) and writes them after each
    row's ragged pending pairs only when the drafter absorbs; rows that finish during the run are dropped
    from both (twice here: the tail keeps its rows and composes the index to the live ones).  Reference:
    the kept rows given the same pairs, composed by hand, in one pend."""
    from marsrl.engine.engine import _EagleState

    head = Eagle3Drafter.from_target(qwen)
    torch.manual_seed(3)
    width, dev = 3 * qwen.config.hidden_size, torch.device("cpu")
    pre_f, pre_t = torch.randn(4, 2, width), torch.randint(0, 64, (4, 2))
    round_f, round_t, round_n = torch.randn(4, 3, width), torch.randint(0, 64, (4, 3)), [3, 1, 2, 1]
    plain_f, plain_t = torch.randn(4, 6, width), torch.randint(0, 64, (4, 6))
    st = _EagleState(head)
    st.start(4, dev, pre_f, pre_t, torch.tensor([2] * 4), [2] * 4, 32)
    st.absorb()
    st.pend(round_f, round_t, torch.tensor(round_n), round_n)  # a speculative round's pairs, ragged
    rows = [0, 1, 2, 3]
    # row 1 finishes two steps into the run, row 2 (then at place 1) two steps later
    finish = {2: [0, 2, 3], 4: [0, 3]}
    for j in range(6):
        if j in finish:
            at = [rows.index(b) for b in finish[j]]  # the kept rows' places among the live ones
            st.select(torch.tensor(at), at)
            rows = finish[j]
        st.pend_plain(plain_f[rows, j : j + 1], plain_t[rows, j : j + 1])
    keep = rows
    assert st.tail and st.counts_host == [3, 1]  # the run's pairs not yet written
    assert st.debt == 6 * 2  # six plain steps' pairs a row, at the two live rows
    h, lg = st.absorb()

    ref = _EagleState(head)
    ref.start(4, dev, pre_f, pre_t, torch.tensor([2] * 4), [2] * 4, 32)
    ref.absorb()
    ref.select(torch.tensor(keep), keep)
    n = [round_n[b] + 6 for b in keep]
    f, t = torch.zeros(2, max(n), width), torch.zeros(2, max(n), dtype=torch.long)
    for i, b in enumerate(keep):
        f[i, : n[i]] = torch.cat([round_f[b, : round_n[b]], plain_f[b]])
        t[i, : n[i]] = torch.cat([round_t[b, : round_n[b]], plain_t[b]])
    ref.pend(f, t, torch.tensor(n), n)
    h_ref, lg_ref = ref.absorb()
    assert torch.equal(st.cache.lengths, ref.cache.lengths) and torch.equal(st.positions, ref.positions)
    torch.testing.assert_close(h, h_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lg, lg_ref, rtol=1e-5, atol=1e-5)
    assert st.debt == 0 and st.tail_rows is None  # absorbed


@pytest.mark.parametrize("window", [None, 4])
def test_deferred_prompt_pass_leaves_the_drafter_where_the_prefill_pass_does(qwen, window):
    """auto's first round plain defers the drafter's prompt pass (``start(defer=True)``) to the first
    absorb, run then over the prompts whose rows are still live, each once.  Through a group copy, a
    round's pairs, plain steps and finishing rows (one prompt's whole group among them), the drafter
    must end where the pass at the prefill leaves it; the deferred pass skips the finished prompt, and
    ``debt`` owes its pairs until then."""
    from marsrl.engine.engine import _EagleState

    head = Eagle3Drafter.from_target(qwen)
    torch.manual_seed(4)
    width, dev = 3 * qwen.config.hidden_size, torch.device("cpu")
    n_prompts, group, steps = 3, 2, 5
    pre_f, pre_t, counts = torch.randn(n_prompts, 6, width), torch.randint(0, 64, (n_prompts, 6)), [6, 3, 4]
    src = [p for p in range(n_prompts) for _ in range(group)]  # rows 0..5: prompt 0, 0, 1, 1, 2, 2
    first_f, first_t = torch.randn(6, 1, width), torch.randint(0, 64, (6, 1))
    plain_f, plain_t = torch.randn(6, steps, width), torch.randint(0, 64, (6, steps))
    finish = {1: [0, 5, 4, 1], 3: [0, 4, 5]}  # prompt 1's rows (2, 3) go first, in the engine's fill order
    outs, batches = [], []
    for defer in (False, True):
        seen: list[int] = []
        st = _EagleState(head, window)
        st.start(n_prompts, dev, pre_f, pre_t, torch.tensor(counts), counts, 64, defer)
        if not defer:
            st.absorb()
        st.select(torch.tensor(src), src)
        st.pend(first_f, first_t, torch.ones(6, dtype=torch.long), [1] * 6)
        rows = list(range(6))
        for j in range(steps):
            if j in finish:
                at = [rows.index(b) for b in finish[j]]
                st.select(torch.tensor(at), at)
                rows = finish[j]
            st.pend_plain(plain_f[rows, j : j + 1], plain_t[rows, j : j + 1])
        if defer:  # the plain pairs a row, and the live prompts' pairs (0 and 2), once each
            w = window or 99
            assert st.debt == min(steps, w) * 3 + min(counts[0], w) + min(counts[2], w)
        real = head.step_hidden

        def counted(ids, *a, real=real, seen=seen, **kw):
            seen.append(ids.shape[0])
            return real(ids, *a, **kw)

        head.step_hidden = counted
        try:
            h, lg = st.absorb()
        finally:
            del head.step_hidden
        batches.append(seen)
        outs.append((h, lg, st.positions.clone(), st.cache.lengths.clone(), st.skipped_pairs))
        assert st.debt == 0 and st.deferred is None
    assert batches == [[3], [2, 3]]  # the deferred pass: the two live prompts, then the three rows
    assert torch.equal(outs[0][2], outs[1][2]) and torch.equal(outs[0][3], outs[1][3])
    assert outs[0][4] == outs[1][4]  # the window's skipped pairs (prompt 1 has none to skip)
    torch.testing.assert_close(outs[0][0], outs[1][0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(outs[0][1], outs[1][1], rtol=1e-5, atol=1e-5)


def test_auto_deferred_prompt_pass_drafts_as_the_prefill_pass_does(qwen, monkeypatch):
    """A call whose first round is plain defers the drafter's prompt pass: the same k plan (plain runs
    and speculative ones, ``CycleK``) with the pass forced at the prefill must give the same tokens,
    behaviour log-probs and acceptance, greedy and sampled, over groups of 3 rows a prompt."""
    from marsrl.engine import engine as engine_module
    from marsrl.engine.adaptive import CycleK

    torch.manual_seed(3)  # the head's random init: one that drafts accepted tokens, greedy and sampled
    head = Eagle3Drafter.from_target(qwen)
    eng = SpeculativeEngine(qwen, head, EngineConfig(num_draft_tokens="auto", max_draft_tokens=3))
    start = engine_module._EagleState.start
    deferred = []

    def run(temperature: float, force: bool):
        def spy(self, *a, defer=False):
            start(self, *a, defer=defer)
            if force and defer:  # the pass at once, before the group copy, as the prefill ran it
                self.prompt_pass()

        monkeypatch.setattr(engine_module._EagleState, "start", spy)
        sp = SamplingParams(temperature=temperature, max_new_tokens=60, n=3, seed=3, ignore_eos=True)
        out = eng._generate(PROMPTS, sp, CycleK([0, 2, 3], cycles=4, repeat=3))
        deferred.append(eng._totals["k_per_round"][0] == 0)
        return [t.completion_ids for t in out], [t.behavior_logprobs for t in out], eng._totals["accepted"]

    for temperature in (0.0, 1.0):
        a, b = run(temperature, force=False), run(temperature, force=True)
        assert a[0] == b[0] and a[2] == b[2] > 0
        for xs, ys in zip(a[1], b[1], strict=True):
            assert xs == pytest.approx(ys, abs=1e-5)
    assert deferred == [True] * 4  # every call's first round was plain
    # a first round that drafts finds the pass done at the prefill, outside its timed seconds
    monkeypatch.undo()
    pending = []
    real_round = SpeculativeEngine._round

    def watched(self, *a, **kw):
        pending.append(self._eagle.deferred is not None)
        return real_round(self, *a, **kw)

    monkeypatch.setattr(SpeculativeEngine, "_round", watched)
    sp = SamplingParams(temperature=1.0, max_new_tokens=8, n=3, seed=3)
    eng._generate(PROMPTS, sp, CycleK([2, 0], cycles=2))
    assert pending and not any(pending)
    chain = SpeculativeEngine(qwen, head, EngineConfig(num_draft_tokens=2))
    pending.clear()
    chain.generate(PROMPTS, sp)
    assert pending and not any(pending)


def test_window_keeps_the_last_pairs_at_their_true_positions(qwen):
    """A run of plain steps leaves more pending pairs than ``drafter_window``: the drafter absorbs each
    row's last ``window`` of them, at the positions they have in the sequence.  Reference: a state
    without a window given only those pairs, its positions offset by the pairs left out by hand."""
    from marsrl.engine.engine import _EagleState

    head = Eagle3Drafter.from_target(qwen)
    torch.manual_seed(2)
    n, window = 12, 4
    feats = torch.randn(2, 3 + n, 3 * qwen.config.hidden_size)
    tokens = torch.randint(0, 64, (2, 3 + n))
    dev = torch.device("cpu")
    full = _EagleState(head)  # every pair absorbed
    windowed = _EagleState(head, window)
    for st in (full, windowed):
        st.start(2, dev, feats[:, :3], tokens[:, :3], torch.tensor([3, 2]), [3, 2], 64)
        st.absorb()
        for j in range(n):  # plain steps: one pair each, kept aside (flushed at 2 * window when windowed)
            st.pend_plain(feats[:, 3 + j : 4 + j], tokens[:, 3 + j : 4 + j])
    outs = {name: st.absorb() for name, st in (("full", full), ("windowed", windowed))}
    # the buffer, grown past its room several times, against absorbing each pair as it comes
    stepwise = _EagleState(head)
    stepwise.start(2, dev, feats[:, :3], tokens[:, :3], torch.tensor([3, 2]), [3, 2], 64)
    stepwise.absorb()
    for j in range(n):
        stepwise.pend(
            feats[:, 3 + j : 4 + j], tokens[:, 3 + j : 4 + j], torch.ones(2, dtype=torch.long), [1, 1]
        )
        h_step, lg_step = stepwise.absorb()
    torch.testing.assert_close(outs["full"][0], h_step, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(outs["full"][1], lg_step, rtol=1e-5, atol=1e-5)
    assert windowed.skipped_pairs == 2 * (n - window) and full.skipped_pairs == 0
    assert torch.equal(windowed.positions, full.positions)  # the next draft sits where it belongs
    assert torch.equal(full.cache.lengths - windowed.cache.lengths, torch.tensor([n - window] * 2))

    ref = _EagleState(head)
    ref.start(2, dev, feats[:, :3], tokens[:, :3], torch.tensor([3, 2]), [3, 2], 64)
    ref.absorb()
    ref.skipped = torch.full((2,), n - window)  # each row's first n - window plain-step pairs
    kept = slice(3 + n - window, 3 + n)
    ref.pend(feats[:, kept], tokens[:, kept], torch.tensor([window, window]), [window, window])
    h, lg = ref.absorb()
    torch.testing.assert_close(outs["windowed"][0], h, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(outs["windowed"][1], lg, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(outs["full"][1], lg, atol=1e-4)  # the skipped context did matter


def test_auto_strict_greedy_equals_hf_after_windowed_plain_runs(target):
    """Width-proportional costs: plain steps win after the first round, with a probe after every run of
    8 (then 16): runs longer than the window, so the drafter skips pairs before each probe; strict
    greedy still equals HF greedy token for token."""
    head = Eagle3Drafter.from_target(target)
    cfg = EngineConfig(num_draft_tokens="auto", max_draft_tokens=3, drafter_window=4)
    costs = CostModel(rounds={1: {k: float(k + 1) for k in range(4)}})
    eng = SpeculativeEngine(target, head, cfg, cost_model=costs)
    out = eng.generate(PROMPTS, SamplingParams(temperature=0.0, max_new_tokens=40, ignore_eos=True))
    assert [t.completion_ids for t in out] == hf_greedy(target, PROMPTS, 40)
    ks = eng.stats["k_per_round"]
    assert ks.count(0) > 20 and sum(1 for k in ks[1:] if k) >= 2, ks
    assert eng.stats["drafter_pairs_skipped"] > 0


# ---------------------------------------------------------------------------------- adaptive speculation
# a cost model where a round drafting k tokens costs 1.3 + 0.35 k: the best k moves with the acceptance
# estimates, so K varies between rounds
VARYING = CostModel(rounds={1: {k: 1.3 + 0.35 * k for k in range(6)}})


def test_auto_strict_greedy_equals_hf_with_k_varying(target):
    head = Eagle3Drafter.from_target(target)
    cfg = EngineConfig(num_draft_tokens="auto", max_draft_tokens=5)
    eng = SpeculativeEngine(target, head, cfg, cost_model=VARYING)
    out = eng.generate(PROMPTS, SamplingParams(temperature=0.0, max_new_tokens=24))
    assert [t.completion_ids for t in out] == hf_greedy(target, PROMPTS, 24)
    ks = eng.stats["k_per_round"]
    assert len(set(ks)) > 1 and 0 < max(ks) <= 5, ks


def test_auto_is_deterministic_for_a_seed(target):
    head = Eagle3Drafter.from_target(target)
    cfg = EngineConfig(num_draft_tokens="auto", max_draft_tokens=5, rule="mars", adapt_costs=False)
    sp = SamplingParams(temperature=1.0, max_new_tokens=20, n=3, seed=5)
    eng = SpeculativeEngine(target, head, cfg, cost_model=VARYING)
    runs = []
    for e in (eng, eng, SpeculativeEngine(target, head, cfg, cost_model=eng.cost_model)):
        out = e.generate(PROMPTS, sp)
        ids, logps = [t.completion_ids for t in out], [t.behavior_logprobs for t in out]
        runs.append((ids, logps, e.stats["k_per_round"]))
    assert runs[0] == runs[1] == runs[2]
    assert len(set(runs[0][2])) > 1


def test_auto_strict_sampling_matches_exact_joint(small):
    """N = 60k completions of 3 tokens (seed 21) with k chosen per round (K then zero-length chains)."""
    cfg = EngineConfig(num_draft_tokens="auto", max_draft_tokens=3, max_batch_size=60_000)
    # width-proportional cost: after the first (exploring) round plain steps win, so later rounds are k = 0
    costs = CostModel(rounds={1: {k: float(k + 1) for k in range(4)}})
    eng = SpeculativeEngine(small, Eagle3Drafter.from_target(small), cfg, cost_model=costs)
    assert_distribution(sample_index(eng), exact_joint(small), "auto")
    assert eng.stats["accepted"] > 1000
    assert set(eng.stats["k_per_round"]) == {3, 0}, set(eng.stats["k_per_round"])


def test_calibrate_measures_every_batch_and_width(qwen):
    eng = SpeculativeEngine(
        qwen, Eagle3Drafter.from_target(qwen), EngineConfig(num_draft_tokens="auto", max_draft_tokens=2)
    )
    costs = eng.calibrate(rows=[1, 4], context=8, repeats=1)
    assert sorted(costs.rounds) == [1, 4] and all(sorted(v) == [0, 1, 2] for v in costs.rounds.values())
    assert all(t > 0 for v in costs.rounds.values() for t in v.values())
    again = CostModel.from_dict(costs.to_dict())
    assert again.round_seconds(2, 2) == costs.round_seconds(2, 2)
    # a longer chain never costs less in the model, whatever the noise of the measurement, nor does a
    # longer context; per-slot figures for plain and for k >= 1, measured over at least ``span`` tokens a row
    for w in (0, 100):
        assert all(
            costs.round_seconds(r, k, w) <= costs.round_seconds(r, k + 1, w) for r in (1, 4) for k in (0, 1)
        )
    assert sorted(costs.per_slot) == [1, 4] and all(sorted(v) == [0, 1, 2] for v in costs.per_slot.values())
    assert all(c >= 0 for v in costs.per_slot.values() for c in v.values())
    # one figure a k, read as a line in k >= 1 that never falls
    assert all(costs.slot_seconds(r, 1) <= costs.slot_seconds(r, 2) for r in (1, 4))


def test_a_calibration_run_cycles_every_k_and_stops_when_the_plan_is_done(qwen):
    from marsrl.engine.adaptive import CycleK

    eng = SpeculativeEngine(
        qwen, Eagle3Drafter.from_target(qwen), EngineConfig(num_draft_tokens="auto", max_draft_tokens=2)
    )
    sp = SamplingParams(max_new_tokens=40, n=2, ignore_eos=True)
    plan = CycleK([2, 1, 0], cycles=2)
    widths = []
    choose = plan.choose
    plan.choose = lambda rows, width=0, *rest, **kw: widths.append(width) or choose(rows, width, *rest, **kw)
    out = eng._generate([[3, 4, 5]], sp, plan)
    # a lead-in round, then two passes; the call ends there, before any row reaches max_new_tokens
    assert eng.stats["k_per_round"] == [2, 2, 1, 0, 2, 1, 0]
    assert all(len(t.completion_ids) < 40 for t in out)
    assert [live for _, live, *_ in eng.stats["trace"]] == [2] * 7
    # each round is planned and traced at its cache width: the 3 prompt slots, then growing every round
    traced = [width for *_, width in eng.stats["trace"]]
    assert widths == traced and traced[0] == 3 and all(b > a for a, b in itertools.pairwise(traced))
    # the tokens each round kept, over its rows: a plain step one a row, every token past the prefill's
    kept = eng.stats["tokens_per_round"]
    assert len(kept) == 7 and kept[3] == kept[6] == 2 and all(n >= 2 for n in kept)
    assert sum(kept) == sum(len(t.completion_ids) for t in out) - 2


def test_a_calibration_plan_repeats_each_k_and_times_only_the_last_of_each_block():
    from marsrl.engine.adaptive import CycleK

    plan = CycleK([0, 1, 2], cycles=2, repeat=2)
    assert plan.plan == [0, 0, 0, 1, 1, 2, 2, 0, 0, 1, 1, 2, 2]
    assert plan.measured == [False] + [False, True] * 6
    assert CycleK([2, 1, 0], cycles=2).measured == [False] + [True] * 6  # repeat 1: all but the lead-in
    ks = [plan.choose(4) for _ in plan.plan]
    assert ks == plan.plan and plan.exhausted


def test_calibrate_times_only_rounds_that_follow_their_own_k(qwen):
    """A round's drafter absorbs what the round before it kept, so only a round after one at its own k
    costs what a run at that k costs.  On a simulated clock where every other round takes 100 s, the
    model must come out of the steady rounds alone (1 + k/10 s each, whatever the width)."""
    from marsrl.engine.adaptive import CycleK

    eng = SpeculativeEngine(
        qwen, Eagle3Drafter.from_target(qwen), EngineConfig(num_draft_tokens="auto", max_draft_tokens=3)
    )
    plans = []

    def fake_generate(prompts, sampling, planner):
        if not isinstance(planner, CycleK):  # the warm-up call
            eng._totals = {"trace": []}
            return []
        plans.append(planner)
        trace, last = [], None
        while not planner.exhausted:
            k = planner.choose(len(prompts) * sampling.n)
            width = 10 + 3 * len(trace)
            trace.append([0.0, len(prompts) * sampling.n, k, 1.0 + k / 10 if k == last else 100.0, width])
            last = k
        eng._totals = {"trace": trace}
        return []

    eng._generate = fake_generate
    costs = eng.calibrate(rows=[4], context=8, repeats=2)
    # every k twice in a row, at least 3 passes (64 tokens a row here: 4), the second of each pair timed
    assert len(plans) == 2 and all(p.measured.count(True) == (len(p.plan) - 1) // 2 >= 3 * 4 for p in plans)
    assert costs.per_slot[4] == {k: 0.0 for k in range(4)}
    assert costs.round_seconds_upto(4, 3) == pytest.approx([1.0, 1.1, 1.2, 1.3])


def test_calibrate_prices_a_slot_of_context_per_k(qwen):
    """A round drafting k reads the cache from k + 1 target queries and k draft steps, so a slot of
    width costs a longer chain more.  On a simulated clock where a steady round takes
    1 + k/10 s + (1 + k/2) ms a slot (the plain step 0.5 ms a slot), the model must price each k's slot
    as that line, and the round at an empty cache as 1 + k/10 s; one figure pooled over every k >= 1
    (the model before) would give every k the same slot."""
    from marsrl.engine.adaptive import CycleK

    eng = SpeculativeEngine(
        qwen, Eagle3Drafter.from_target(qwen), EngineConfig(num_draft_tokens="auto", max_draft_tokens=3)
    )

    def slot(k: int) -> float:
        return 5e-4 if k == 0 else 1e-3 * (1 + k / 2)

    def fake_generate(prompts, sampling, planner):
        trace, last = [], None
        while isinstance(planner, CycleK) and not planner.exhausted:
            k = planner.choose(len(prompts) * sampling.n)
            width = 10 + 3 * len(trace)
            steady = 1.0 + k / 10 + slot(k) * width
            trace.append([0.0, len(prompts) * sampling.n, k, steady if k == last else 100.0, width])
            last = k
        eng._totals = {"trace": trace}
        return []

    eng._generate = fake_generate
    costs = eng.calibrate(rows=[4], context=8, repeats=2)
    assert costs.slot_seconds_upto(4, 3) == pytest.approx([slot(k) for k in range(4)])
    assert costs.round_seconds_upto(4, 3) == pytest.approx([1.0, 1.1, 1.2, 1.3])
    assert costs.round_seconds(4, 3, 200) - costs.round_seconds(4, 1, 200) == pytest.approx(0.2 + 200 * 1e-3)
    with pytest.raises(ValueError, match="repeat and cycles must be >= 1, got repeat=0"):
        eng.calibrate(rows=[4], repeat=0)


def test_planner_picks_plain_when_speculation_cannot_pay_and_k_when_it_does():
    from marsrl.engine.adaptive import KPlanner

    flat = CostModel(rounds={1: {k: 1.0 for k in range(4)}, 8: {k: 1.0 for k in range(4)}})
    steep = CostModel(rounds={1: {k: 1.0 + k for k in range(4)}})
    for costs, accept, want in ((flat, 3, 3), (steep, 0, 0)):
        planner = KPlanner(costs, 3)
        assert planner.choose(1) == 3  # the first round explores every position
        for _ in range(20):
            planner.observe([3] * 8, [accept] * 8)
        assert planner.choose(1) == want


def test_interpolation_keeps_two_curves_in_order_in_floating_point():
    """Two curves through batch sizes 1 and 4 that meet at 4 (a flat line at 4 rows, a rising one at 1):
    at 4 rows they must read equal and between the sizes never cross.  These three figures made
    ``y0 + (y1 - y0) * t`` read the lower curve one ulp above the higher at 4 rows, the flake of
    ``test_calibrate_measures_every_batch_and_width`` (slot cost at k = 1 above k = 2's); 2000 random
    triples (seed 0) besides."""
    import random

    from marsrl.engine.adaptive import _interp

    cases = [(5.833820394550312e-05, 0.00014914949246503664, 5.046868558173903e-05)]
    rng = random.Random(0)
    for _ in range(2000):
        low = rng.random() * 1e-4
        cases.append((low, low + rng.random() * 1e-4, rng.random() * 1e-4))
    for low, high, meet in cases:
        assert _interp([1, 4], [low, meet], 4) == meet == _interp([1, 4], [high, meet], 4)
        for rows in (1, 2, 3, 3.5):
            assert _interp([1, 4], [low, meet], rows) <= _interp([1, 4], [high, meet], rows)


def _reference_rate(costs, est, rows: int, k: int) -> float:
    """The planner's objective for one k, term by term: rows x E[tokens | k] / t(rows, k)."""
    from marsrl.engine.adaptive import _interp, _line

    pooled = (sum(est.accepted) + 1) / (sum(est.reached) + 2)
    tokens, run = 1.0, 1.0
    for j in range(k):
        run *= (est.accepted[j] + est.pool * pooled) / (est.reached[j] + est.pool)
        tokens += run
    grid, at = sorted(costs.rounds), []
    for r in grid:
        figures = costs.rounds[r]
        plain, ks = figures.get(0), sorted(j for j in figures if j > 0)
        if (k == 0 and plain is not None) or not ks:
            at.append(plain)
            continue
        a, b = _line(ks, [figures[j] for j in ks])
        at.append(max(a + b * k, plain if plain is not None else 0.0))
    return rows * tokens / max(_interp(grid, at, rows), 1e-9)


def test_planner_choice_equals_the_argmax_of_per_k_reference_rates():
    """``choose`` scores every k in one pass (one line fit per batch size, one pass over the positions);
    the reference scores each k apart.  200 random cost models and acceptance histories (seed 0), live
    batches 1 .. 200: the same rates bit for bit, and the same k."""
    import random

    from marsrl.engine.adaptive import AcceptanceEstimates, KPlanner

    rng = random.Random(0)
    for _ in range(200):
        grid = sorted(rng.sample([1, 2, 4, 8, 16, 32, 64, 128], rng.randint(1, 4)))
        k_max = rng.randint(1, 8)
        rounds = {
            r: {k: rng.uniform(0.005, 0.2) for k in range(k_max + 1) if k == 0 or rng.random() < 0.8}
            for r in grid
        }
        est = AcceptanceEstimates(k_max)
        for _ in range(rng.randint(0, 30)):
            d = rng.randint(1, k_max)
            est.update(d, rng.randint(0, d))
        costs = CostModel(rounds=rounds)
        planner = KPlanner(costs, k_max, probe_every=10**9, estimates=est)
        planner.first = False
        rows = rng.randint(1, 200)
        ref = [_reference_rate(costs, est, rows, k) for k in range(k_max + 1)]
        assert [planner.rate(rows, k) for k in range(k_max + 1)] == ref
        assert planner.choose(rows) == max(range(k_max + 1), key=lambda k: (ref[k], -k))


def test_auto_config_errors():
    with pytest.raises(ValueError, match="max_draft_tokens is only"):
        EngineConfig(num_draft_tokens=3, max_draft_tokens=4)
    with pytest.raises(ValueError, match="max_draft_tokens must be >= 1"):
        EngineConfig(num_draft_tokens="auto", max_draft_tokens=0)
    with pytest.raises(ValueError, match='num_draft_tokens must be an int >= 1 or "auto"'):
        EngineConfig(num_draft_tokens="7")
    assert EngineConfig(num_draft_tokens="auto").max_draft_tokens == 7
    assert EngineConfig(num_draft_tokens="auto").drafter_window == 0  # every pair absorbed
    assert EngineConfig(num_draft_tokens="auto", max_draft_tokens=4, drafter_window=5).drafter_window == 5
    with pytest.raises(
        ValueError, match=r"drafter_window must be 0 \(no window\) or an int >= max_draft_tokens \+ 1 = 5"
    ):
        EngineConfig(num_draft_tokens="auto", max_draft_tokens=4, drafter_window=4)
    with pytest.raises(ValueError, match="drafter_window is only"):
        EngineConfig(num_draft_tokens=3, drafter_window=8)
    with pytest.raises(ValueError, match="speed_check must be True or False, got 'no'"):
        EngineConfig(num_draft_tokens="auto", speed_check="no")


@pytest.mark.parametrize("mode", ["plain", "chain", "tree"])
def test_shared_prefix_prefill_gives_the_unshared_trajectories_bit_for_bit(target, mode):
    from marsrl.engine import TreeConfig

    head = Eagle3Drafter.from_target(target)
    shapes = {"plain": {}, "chain": dict(num_draft_tokens=4), "tree": dict(tree=TreeConfig(3, 3, 10))}
    sp = SamplingParams(temperature=1.0, max_new_tokens=12, n=4, seed=7)
    runs = []
    for share in (True, False):
        cfg = EngineConfig(rule="mars", share_prefix=share, **shapes[mode])
        eng = SpeculativeEngine(target, None if mode == "plain" else head, cfg)
        out = eng.generate(PROMPTS, sp)
        runs.append([(t.completion_ids, t.behavior_logprobs, t.target_logprobs, t.provenance) for t in out])
    assert runs[0] == runs[1]


def test_measured_rounds_set_the_level_not_the_shape():
    costs = CostModel(rounds={1: {0: 1.0, 1: 1.0}, 4: {0: 2.0, 1: 2.0}})
    # one call: two k = 1 rounds near 4 rows, one plain round at 1 row; the 3-row round counts at 4 rows,
    # rescaled by model(4, 1) / model(3, 1) = 2 / (1 + 2 / 3); each round against its k's calibrated
    # figure, one ratio per size (the median)
    call = [[0.0, 4, 1, 4.0, 0], [0.1, 1, 0, 1.0, 0], [0.2, 3, 1, 3.0, 0]]  # no per_slot: width is moot
    scaled = 3.0 * 2.0 / (1 + 2 / 3)
    costs.observe(call)
    assert costs.levels == {4: [pytest.approx((4.0 / 2.0 + scaled / 2.0) / 2)], 1: [1.0]}
    assert costs.level(4) == 1.0 and costs.round_seconds(4, 1) == 2.0  # one slow call: seeds hold it
    assert 4 not in costs.runs  # the calibration's runs are the calibration's alone
    # calls that keep measuring it slower take over within a dozen: the level follows the rounds
    for _ in range(9):
        costs.observe([[0.0, 4, 1, 4.0, 0]])
    assert costs.level(4) == pytest.approx((2.0 + scaled / 2.0) / 2)
    for _ in range(40):
        costs.observe([[0.0, 4, 1, 4.0, 0]])
    assert costs.level(4) == 2.0 and len(costs.levels[4]) == costs.keep  # the seeds have aged out
    # every k at that size moves alike (the plain step was never observed there), and sizes between
    # measured ones interpolate the levelled figures
    assert costs.round_seconds(4, 1) == 4.0 and costs.round_seconds(4, 0) == 4.0
    assert costs.round_seconds(2, 1) == pytest.approx(1.0 + (4.0 - 1.0) / 3)
    # and a single fast outlier does not pull it down
    costs.observe([[0.0, 4, 1, 0.5, 0]])
    assert costs.level(4) == 2.0
    again = CostModel.from_dict(costs.to_dict())
    assert again.levels == costs.levels and again.round_seconds(2, 1) == costs.round_seconds(2, 1)
    assert CostModel.from_dict({"rounds": {"1": {"0": 1.0}}}).level(1) == 1.0  # an older dict


def test_rounds_of_the_chosen_k_do_not_steepen_the_line():
    """The planner drafts mostly one k, in the workload's conditions (longer prompts, a busier machine)
    rather than the calibration's.  Calibrated rounds cost 1 + k (k = 1..7); 40 calls whose k = 6 and
    k = 7 rounds run 50% slower: every k's figure scales by 1.5 and the ratios between k's stay the
    calibration's, so the longer chain is judged as the shorter ones are.  (Folded in per k, the two
    figures alone rose, the line through k = 1..7 steepened, and the planner drafted ever shorter.)"""
    calibrated = {k: 1.0 + k for k in range(8)}
    costs = CostModel(rounds={1: dict(calibrated)})
    for _ in range(40):
        costs.observe([[0.0, 1, 6, 1.5 * 7.0, 0], [0.1, 1, 7, 1.5 * 8.0, 0], [0.2, 1, 6, 1.5 * 7.0, 0]])
    seconds = costs.round_seconds_upto(1, 7)
    assert seconds == pytest.approx([1.5 * t for t in calibrated.values()])
    assert seconds[7] / seconds[5] == pytest.approx(8.0 / 6.0)


def test_calibration_figures_are_the_lower_quartile_of_their_runs():
    costs = CostModel()
    for t in (3.0, 1.0, 2.0):
        costs.add_run(8, 2, t)
    assert costs.rounds[8][2] == 1.0  # the least of three
    for t in (5.0, 6.0):
        costs.add_run(8, 2, t)
    assert costs.rounds[8][2] == 2.0  # the second of five


def test_context_slope_is_the_median_slope_within_each_group():
    from marsrl.engine.adaptive import context_slope

    # two runs at 2 ms a slot, the second 50 ms slower throughout (a slow spell): the level is no slope
    fast = [(w, 0.010 + 0.002 * w) for w in (10, 20, 30, 40)]
    slow = [(w, 0.060 + 0.002 * w) for w in (10, 20, 30)]
    assert context_slope([fast, slow]) == pytest.approx(0.002)
    # one slow round among them tilts a least-squares fit, not the median of the 9 pairwise slopes
    assert context_slope([[*fast[:3], (40, 0.5)], slow]) == pytest.approx(0.002)
    # pairs across groups are never taken: a run at 10 and 20 slots and a slower one at 30 and 40, pooled
    # as one group, read the slower run's level as 4.1 ms a slot
    early = [(w, 0.010 + 0.002 * w) for w in (10, 20)]
    late = [(w, 0.060 + 0.002 * w) for w in (30, 40)]
    assert context_slope([early, late]) == pytest.approx(0.002)
    assert context_slope([early + late]) == pytest.approx((0.11 / 30 + 0.09 / 20) / 2)
    # time falling with width (noise) reads as no slope; no two widths apart, no slope either
    assert context_slope([[(10, 0.05), (20, 0.04)]]) == 0.0
    assert context_slope([[(10, 0.05), (10, 0.04)], []]) == 0.0


def test_context_line_fits_every_k_at_once_and_survives_one_unlucky_k():
    """Seed 0, 3 runs of 3 rounds a k, k = 0 .. 7, each round timed with +-1% noise on a true slot
    cost of (1 + k / 2) us at k >= 1 and 0.8 us at k = 0; then k = 7's rounds read flat (a slow
    spell on its early rounds).  The joint line must stay within 10% of the truth at every k >= 1 and
    the plain step keep its own figure; the line through each k's own median (the model read that
    before) is pulled below the truth at k = 7 by more than 10%, so the test tells the two apart."""
    import random

    from marsrl.engine.adaptive import _line, context_line, context_slope

    rng = random.Random(0)

    def slot_us(k: int) -> float:
        return 0.8 if k == 0 else 1.0 + k / 2

    groups = {
        k: [
            [(w, (1000 + slot_us(k) * w) * 1e-6 * (1 + rng.uniform(-0.01, 0.01))) for w in (100, 180, 260)]
            for _ in range(3)
        ]
        for k in range(8)
    }
    groups[7] = [[(w, 2000e-6) for w in (100, 180, 260)] for _ in range(3)]
    joint = context_line(groups)
    assert joint[0] == pytest.approx(context_slope(groups[0]))
    for k in range(1, 8):
        assert joint[k] == pytest.approx(slot_us(k) * 1e-6, rel=0.10), k
    own = {k: context_slope(g) for k, g in groups.items()}
    a, b = _line(list(range(1, 8)), [own[k] for k in range(1, 8)])
    assert a + 7 * b < 0.9 * slot_us(7) * 1e-6
    # one k with pairs: its own figure; none: no figure but 0
    assert context_line({0: groups[0], 3: groups[3]})[3] == pytest.approx(context_slope(groups[3]))
    assert context_line({1: [[(10, 0.05)]]}) == {1: 0.0}


def test_cost_model_adds_each_slot_of_context_per_k():
    costs = CostModel(
        rounds={1: {0: 1.0, 1: 2.0, 2: 3.0}, 4: {0: 2.0, 1: 4.0, 2: 6.0}},
        per_slot={1: {0: 0.01, 1: 0.02, 2: 0.04}, 4: {0: 0.03, 1: 0.05, 2: 0.05}},
    )
    # k = 0 its own figure, k >= 1 on the line through theirs, interpolated between batch sizes
    assert costs.slot_seconds_upto(1, 2) == pytest.approx([0.01, 0.02, 0.04])
    assert costs.slot_seconds_upto(2, 3) == pytest.approx(
        [0.02 / 3 + 0.01, 0.03, 0.04 + 0.01 / 3, 0.06 - 0.01 / 3]
    )
    assert costs.round_seconds(1, 2, width=100) == pytest.approx(3.0 + 4.0)
    assert costs.round_seconds(4, 0, width=50) == pytest.approx(2.0 + 1.5)
    assert costs.round_seconds(4, 1) == 4.0  # at width 0, the empty-cache figures alone
    again = CostModel.from_dict(costs.to_dict())
    assert again.per_slot == costs.per_slot and again.round_seconds(3, 2, 70) == costs.round_seconds(3, 2, 70)
    # a model without per_slot (an older dict) is the same at every width
    old = CostModel.from_dict({"rounds": {"1": {"0": 1.0, "1": 2.0}}})
    assert old.round_seconds(1, 1, width=10**6) == 2.0


def test_planner_choice_from_its_kept_tables_is_the_models():
    """KPlanner keeps CostModel.tables per live batch size for its call (the line fits cost ~0.1 ms a
    round otherwise): its choice must be the argmax of the model's own round_seconds at every size and
    width, bit for bit, through exploration and probes, and observe must fold in what it did before."""
    import random

    rng = random.Random(11)
    rounds = {
        r: {k: 0.002 * r**0.5 * (1 + 0.3 * k) * rng.uniform(0.8, 1.2) for k in range(6)} for r in (1, 4, 16)
    }
    per_slot = {r: {0: 1e-5 * r, 1: 2e-5 * r} for r in (1, 4, 16)}
    costs = CostModel(rounds=rounds, per_slot=per_slot)
    kept, fresh = KPlanner(costs, 5), KPlanner(costs, 5)
    for _ in range(400):
        rows, width = rng.choice([1, 2, 3, 4, 9, 16, 40]), rng.randint(0, 3000)
        k = kept.choose(rows, width)
        fresh._tables.clear()  # a planner that refits the model and recomputes its tables every round
        fresh._fitted = None
        assert k == fresh.choose(rows, width)
        seconds = costs.round_seconds_upto(rows, 5, width)
        assert [max(b + s * width, 1e-9) for b, s in zip(*costs.tables(rows, 5), strict=True)] == seconds
        drafted = [k] * rows
        accepted = [rng.randint(0, k) if k else 0 for _ in range(rows)]
        kept.observe(drafted, accepted)
        fresh.observe(drafted, accepted)
    # observe: a round's context and size rescaling read from the same tables as round_seconds
    trace = [
        [0.0, rng.choice([1, 3, 16, 30]), rng.randint(0, 5), rng.uniform(0.002, 0.05), 200] for _ in range(50)
    ]
    by_hand = {}
    for _, live, k, sec, width in trace:
        r = min(sorted(rounds), key=lambda g: abs(math.log(g / live)))
        scaled = sec * costs.round_seconds(r, k, width) / costs.round_seconds(live, k, width)
        by_hand.setdefault(r, []).append(scaled / costs.round_seconds(r, k, width))  # level 1 until now
    costs.observe(trace)
    assert costs.levels == {r: [pytest.approx(statistics.median(v))] for r, v in by_hand.items()}


def test_planner_drafts_longer_as_the_context_grows():
    """A round drafting k costs 1 + k s at an empty cache, each slot of context adding 2 ms to any k; the
    acceptance down the chain is 3/4, 2/3 and 1 (E[tokens | 3] = 2.75): at 0 slots plain (1 token/s)
    beats k = 3 (2.75 / 4), at 5000 slots (10 s more for every k) k = 3 wins."""
    from marsrl.engine.adaptive import AcceptanceEstimates, KPlanner

    costs = CostModel(
        rounds={1: {k: 1.0 + k for k in range(4)}}, per_slot={1: dict.fromkeys(range(4), 0.002)}
    )
    est = AcceptanceEstimates(3, pool=0.0)
    for _ in range(100):
        est.update(3, 0)
        est.update(3, 1)
        est.update(3, 3)
        est.update(3, 3)
    planner = KPlanner(costs, 3, probe_every=10**9, estimates=est)
    assert [round(est.rate(j), 3) for j in range(3)] == [0.75, 0.667, 1.0]
    assert est.expected_tokens_upto(3) == pytest.approx([1.0, 1.75, 2.25, 2.75])
    assert planner.choose(1, width=0) == 0
    assert planner.choose(1, width=5000) == 3
    assert planner.rate(1, 3, 5000) == pytest.approx(2.75 / 14)


def test_planner_re_measures_the_position_past_its_k():
    """Rounds cost 1 + 0.1 k; every draft is accepted in truth, but the carried estimates say position 3
    was reached 12 times and never accepted, so k = 2 looks best.  Without exploration position 3 is
    never reached again and k = 2 stays; with it every 16th speculative round drafts 3, and once those
    rounds outweigh the bad start the planner drafts 3."""
    from marsrl.engine.adaptive import AcceptanceEstimates, KPlanner

    costs = CostModel(rounds={1: {k: 1.0 + 0.1 * k for k in range(4)}})
    runs = {}
    for explore in (16, 10**9):
        est = AcceptanceEstimates(3)
        for _ in range(12):
            est.update(3, 2)  # positions 1 and 2 accepted, 3 reached and rejected
        planner = KPlanner(costs, 3, estimates=est, explore_every=explore)
        ks = []
        for _ in range(200):
            k = planner.choose(1)
            planner.observe([k], [k])  # the truth: every draft accepted
            ks.append(k)
        runs[explore] = ks
    assert runs[10**9] == [2] * 200
    explored = runs[16]
    assert explored[:15] == [2] * 15 and explored[15] == 3  # the 16th speculative round explores
    switch = explored.index(3, 16) if 3 in explored[16:] else None
    assert switch is not None and explored[switch:] == [3] * (200 - switch), explored
    assert switch < 200 - 50  # within a few explorations


def test_planner_explores_as_deep_as_a_near_best_k():
    """K = 7, one row, rounds cost 1 + c k.  Acceptance 0.8 everywhere and c = 0.15 (a flat optimum): k = 5
    is best and k = 7 within 10% of it, so an exploration round drafts 7, not best + 1.  Acceptance 0.5
    and c = 0.3 (a steep one): k = 1 is best and only k = 2 within 10%, so it explores next to the best.
    Rates by hand from the model."""
    from marsrl.engine.adaptive import AcceptanceEstimates, KPlanner

    def explored(a: float, c: float) -> tuple[int, int]:
        est = AcceptanceEstimates(7)
        est.accepted, est.reached = [a * 10**6] * 7, [10.0**6] * 7  # the pooled prior drowned: rates a
        costs = CostModel(rounds={1: {k: 1.0 + c * k for k in range(8)}})
        planner = KPlanner(costs, 7, estimates=est, explore_every=4)
        ks = [planner.choose(1) for _ in range(4)]
        assert len(set(ks[:3])) == 1
        return ks[0], ks[3]

    def by_hand(a: float, c: float) -> list[float]:
        return [sum(a**j for j in range(k + 1)) / (1 + c * k) for k in range(8)]

    flat = by_hand(0.8, 0.15)
    assert max(range(8), key=flat.__getitem__) == 5 and flat[7] >= 0.9 * flat[5]
    assert explored(0.8, 0.15) == (5, 7)
    steep = by_hand(0.5, 0.3)
    assert max(range(8), key=steep.__getitem__) == 1 and steep[2] >= 0.9 * steep[1] > steep[3]
    assert explored(0.5, 0.3) == (1, 2)


def test_short_calls_explore_when_the_count_is_carried():
    """A call at B = 1 runs ~13 rounds, fewer than explore_every = 16: a planner counting from 0 every
    call would never explore, and only a call that ran long would, near its end (the deepest position's
    estimate read 0.65-0.70 where K = 7 rounds measured 0.74-0.83, 2026-12-02).  20 calls of 12 rounds
    (acceptance 0.8, rounds 1 + 0.15 k: k = 5 best, exploration to 7): with the count carried, rounds
    16, 32, ... of the engine's life explore (15 of 240); restarted every call, none does."""
    from marsrl.engine.adaptive import AcceptanceEstimates, KPlanner

    est = AcceptanceEstimates(7)
    est.accepted, est.reached = [0.8 * 10**6] * 7, [10.0**6] * 7
    costs = CostModel(rounds={1: {k: 1.0 + 0.15 * k for k in range(8)}})

    def ks(carry: bool) -> list[int]:
        count, out = 0, []
        for _ in range(20):
            planner = KPlanner(costs, 7, estimates=est, speculative=count if carry else 0)
            out += [planner.choose(1) for _ in range(12)]
            count = planner.speculative
        return out

    assert ks(False) == [5] * 240
    carried = ks(True)
    assert [i for i, k in enumerate(carried) if k != 5] == list(range(15, 240, 16))
    assert {carried[i] for i in range(15, 240, 16)} == {7}


def test_engine_carries_the_exploration_count_unless_adapt_costs_is_off(qwen):
    """Rounds cost the same at every k, so every round drafts K = 3 and counts as speculative, except
    the first call's first round (the exploring first round) and the last few, where the rows' tokens
    left cap what a chain can keep and the least k that keeps as many ties and wins (0 once every live
    row has one token left): after two calls the engine's count is every speculative round but the
    first; with adapt_costs=False nothing is carried and the count stays 0.  The
    SpeedCheck is off: a random head's drafts are rarely accepted, so a plain step and K = 3 tie within
    10% and every 8th tie would run plain (which random head, and so whether it ties, depended on the
    tests run before this one in the process)."""
    torch.manual_seed(0)
    head = Eagle3Drafter.from_target(qwen)
    sp = SamplingParams(temperature=1.0, max_new_tokens=12, n=2, ignore_eos=True, seed=3)
    for adapt in (True, False):
        costs = CostModel(rounds={1: dict.fromkeys(range(4), 1.0), 4: dict.fromkeys(range(4), 1.0)})
        cfg = EngineConfig(num_draft_tokens="auto", max_draft_tokens=3, adapt_costs=adapt, speed_check=False)
        eng = SpeculativeEngine(qwen, head, cfg, cost_model=costs)
        rounds = []
        for _ in range(2):
            eng.generate([[1, 2, 3]], sp)
            rounds.append(eng.stats["k_per_round"])
        assert all(k == 3 for ks in rounds for k in ks[:-3])  # a row keeps >= 1 token a round: 3 rounds
        speculative = [sum(k > 0 for k in ks) for ks in rounds]
        assert eng._speculative == (speculative[0] - 1 + speculative[1] if adapt else 0)


def test_observed_rounds_are_judged_at_their_context():
    def observed(trace, rounds=None, per_slot=None) -> list[float]:
        costs = CostModel(
            rounds=rounds or {4: {0: 2.0, 1: 3.0}}, per_slot=per_slot or {4: {0: 0.01, 1: 0.02}}
        )
        costs.observe(trace)
        return costs.levels[4]

    # k = 1 rounds at 100 and at 300 slots against 3 + 2 and 3 + 6 s: 6 / 5 and 10 / 9, the median of two
    assert observed([[0.0, 4, 1, 6.0, 100], [0.1, 4, 1, 10.0, 300]]) == [pytest.approx((1.2 + 10 / 9) / 2)]
    assert observed([[0.2, 4, 0, 2.0 + 0.5, 50]]) == [pytest.approx(1.0)]  # the plain step's own 10 ms a slot
    # a figure near 0 at an empty cache, where the context is nearly the whole round (the plain step at
    # 128 rows on this CPU): 10% slower rounds read as 1.1, not as the 1.5 / 0.1 = 15 of the empty part
    near_zero = dict(rounds={4: {0: 0.001, 1: 3.0}}, per_slot={4: {0: 0.01, 1: 0.02}})
    assert observed([[0.0, 4, 0, 1.1 * (0.001 + 0.01 * 150), 150]], **near_zero) == [pytest.approx(1.1)]
    # and the level scales the whole round, its context included
    costs = CostModel(**near_zero, levels={4: [1.1] * 32})
    assert costs.round_seconds(4, 0, width=150) == pytest.approx(1.1 * (0.001 + 1.5))


def test_plain_steps_without_padding_skip_the_mask_and_match_the_masked_path(qwen, monkeypatch):
    """One prompt (or a group sharing it) decoded plainly has no padding and no gaps: its steps pass no
    mask (SDPA's unmasked path, as HF generate takes) and give what the masked path gives."""
    from marsrl.engine.cache import RaggedCache

    masks = []
    real = RaggedCache.attention_mask

    def spy(self, *a, **kw):
        masks.append(1)
        return real(self, *a, **kw)

    monkeypatch.setattr(RaggedCache, "attention_mask", spy)
    sp = SamplingParams(temperature=1.0, max_new_tokens=16, n=3, ignore_eos=True, seed=4)
    eng = SpeculativeEngine(qwen, None, EngineConfig())
    runs = []
    for dense in (None, False):  # the engine's own decision, then the mask forced on every step
        if dense is not None:
            monkeypatch.setattr(RaggedCache, "dense", property(lambda self, d=dense: d))
        masks.clear()
        out = eng.generate([[5, 6, 7, 8]], sp)
        runs.append((out, len(masks)))
    (unmasked, n_unmasked), (masked, n_masked) = runs
    assert n_unmasked == 1 and n_masked == 1 + 15  # the prefill's mask only, then one every step
    assert [t.completion_ids for t in unmasked] == [t.completion_ids for t in masked]
    for a, b in zip(unmasked, masked, strict=True):
        assert torch.allclose(torch.tensor(a.target_logprobs), torch.tensor(b.target_logprobs), atol=1e-5)
    # two prompts of different lengths are padded: every step is masked again
    masks.clear()
    monkeypatch.undo()
    monkeypatch.setattr(RaggedCache, "attention_mask", spy)
    eng.generate([[5, 6, 7, 8], [9, 10]], sp)
    assert len(masks) == 1 + 15


def test_auto_carries_acceptance_across_calls_unless_adapt_costs_is_off(qwen):
    """A random head is almost never accepted and rounds cost 1 + k: the first call explores k = K once,
    learns that plain steps win, and the next call starts from what it learnt (plain from its first
    round); with adapt_costs=False every call starts from the prior and explores again."""
    head = Eagle3Drafter.from_target(qwen)
    sp = SamplingParams(temperature=1.0, max_new_tokens=12, n=2, ignore_eos=True, seed=3)
    firsts = {}
    for adapt in (True, False):
        costs = CostModel(rounds={1: {k: 1.0 + k for k in range(4)}, 4: {k: 1.0 + k for k in range(4)}})
        cfg = EngineConfig(num_draft_tokens="auto", max_draft_tokens=3, adapt_costs=adapt)
        eng = SpeculativeEngine(qwen, head, cfg, cost_model=costs)
        firsts[adapt] = []
        for _ in range(2):
            eng.generate([[1, 2, 3]], sp)
            firsts[adapt].append(eng.stats["k_per_round"][0])
    assert firsts[True] == [3, 0], firsts
    assert firsts[False] == [3, 3], firsts


@pytest.mark.parametrize("shift", [False, True])
def test_cache_select_compacts_leaving_rows_in_place(shift):
    """Rows leaving (an increasing subset) compact into the same buffers, the rows before the first
    that leaves untouched; a group copy (repeated rows) gets new buffers; every kept row reads back its
    own entries."""
    from marsrl.engine.cache import RaggedCache

    bsz, heads, hd, width = 6, 2, 4, 7
    cache = RaggedCache(bsz, torch.device("cpu"), capacity=12)
    k = torch.randn(bsz, heads, width, hd, generator=torch.Generator().manual_seed(0))
    cache.cache.update(k, -k, 0)
    starts = [2, 1, 0, 3, 1, 2] if shift else [0, 1, 0, 3, 1, 2]
    cache.set_rows(
        torch.tensor(starts), torch.tensor([width - s for s in starts]), starts, [width - s for s in starts]
    )
    keep = [1, 3, 4] if shift else [0, 1, 3, 5]  # shift: row 2 (start 0) leaves, the earliest start is 1
    buf = cache.cache.layers[0].keys.data_ptr()
    before = cache.bytes_copied
    cache.select(torch.tensor(keep), keep)
    layer = cache.cache.layers[0]
    moved = min(starts[i] for i in keep)
    assert layer.keys.data_ptr() == buf and layer.width == width - moved
    assert torch.equal(layer.keys[:, :, : width - moved], k[keep][:, :, moved:])
    assert torch.equal(layer.values[:, :, : width - moved], -k[keep][:, :, moved:])
    assert cache.ends == [width - moved] * len(keep)
    row_bytes = heads * (width - moved) * hd * k.element_size()
    copied_rows = len(keep) if shift else 2  # without a shift rows 0 and 1 stay: only 3 and 5 move
    assert cache.bytes_copied - before == 2 * 2 * copied_rows * row_bytes  # K and V, gathered + written
    cache.select(torch.tensor([0, 0, 1]), [0, 0, 1])  # a group copy: new buffers
    assert cache.cache.layers[0].keys.data_ptr() != buf
    copied = cache.cache.layers[0].keys[:, :, : cache.width]
    assert torch.equal(copied[1], copied[0]) and torch.equal(copied[0], k[keep[0]][:, moved:])


def test_fill_order_keeps_rows_in_their_places_and_fills_the_holes_from_the_end():
    from marsrl.engine.cache import fill_order

    assert fill_order([0, 1, 3, 5]) == [0, 1, 5, 3]
    assert fill_order([1, 2, 3]) == [3, 1, 2]
    assert fill_order([0, 1, 2]) == [0, 1, 2]  # the first rows kept: nothing moves
    assert fill_order([5, 6]) == [5, 6] and fill_order([]) == []
    rng = torch.Generator().manual_seed(0)
    for _ in range(200):  # seed 0, 200 random subsets of up to 12 rows
        total = int(torch.randint(1, 13, (1,), generator=rng))
        size = int(torch.randint(0, total + 1, (1,), generator=rng))
        kept = sorted(torch.randperm(total, generator=rng)[:size].tolist())
        order = fill_order(kept)
        n = len(kept)
        assert sorted(order) == kept
        assert all(order[i] == i for i in range(n) if i in kept)  # a kept row among the first n stays
        assert sum(order[i] != i for i in range(n)) == sum(r >= n for r in kept)  # one move a hole


@pytest.mark.parametrize("case", ["fill", "any_order", "wide_shift"])
def test_cache_select_in_any_order_moves_only_the_rows_that_change_place(case, monkeypatch):
    """``select`` with distinct rows in any order, against a row-by-row reference: every kept row reads
    back its own valid slots at its new place, the same buffers are reused, and only the places whose
    row changed are copied; padding before the earliest kept start is dropped only when it is at least
    an eighth of the width (then every row moves).  The moved places given (``at``, as the engine
    sends them) are used as given: no index tensor is made (on a GPU, a host -> device copy)."""
    from marsrl.engine import cache as cache_module
    from marsrl.engine.cache import RaggedCache, fill_order, moved_places

    bsz, heads, hd, width = 10, 2, 4, 16
    gen = torch.Generator().manual_seed(1)
    k = torch.randn(bsz, heads, width, hd, generator=gen)
    starts = [1, 0, 3, 2, 1, 0, 4, 2, 1, 3]
    if case == "wide_shift":
        starts = [2 + s for s in starts]
        starts[1] = starts[5] = 1  # both leave: the earliest kept start becomes 3 (3 * 8 >= 16)
    ends = [width - (b % 3) for b in range(bsz)]  # ragged ends too
    keep_sorted = [0, 2, 3, 4, 6, 7, 9] if case != "wide_shift" else [0, 2, 3, 4, 6, 7, 8, 9]
    keep = fill_order(keep_sorted) if case != "any_order" else [9, 0, 4, 2, 7, 3, 6]
    cache = RaggedCache(bsz, torch.device("cpu"), capacity=24)
    cache.cache.update(k, -k, 0)
    lengths = [e - s for s, e in zip(starts, ends, strict=True)]
    cache.set_rows(torch.tensor(starts), torch.tensor(lengths), starts, lengths)
    buf = cache.cache.layers[0].keys.data_ptr()
    before = cache.bytes_copied
    # the engine sends the moved places with the rows (one copy); the cache's own are the same
    at = torch.tensor(moved_places(keep)) if case == "fill" else None
    rows = torch.tensor(keep)
    made = []
    real_tensor = torch.tensor

    def spy(*a, **kw):
        made.append(a[0])
        return real_tensor(*a, **kw)

    monkeypatch.setattr(cache_module.torch, "tensor", spy)
    cache.select(rows, keep, at)
    monkeypatch.undo()
    # the places are made here only when the caller sent none and some rows, not all, move
    assert made == ([moved_places(keep)] if case == "any_order" else [])
    shift = min(starts[b] for b in keep) if case == "wide_shift" else 0
    layer = cache.cache.layers[0]
    assert layer.keys.data_ptr() == buf and layer.width == width - shift
    for i, b in enumerate(keep):  # each place holds its row's valid slots, at the row's shifted start
        s, e = starts[b] - shift, ends[b] - shift
        assert cache._starts[i] == s and cache.ends[i] == e
        assert torch.equal(layer.keys[i, :, s:e], k[b, :, starts[b] : ends[b]])
        assert torch.equal(layer.values[i, :, s:e], -k[b, :, starts[b] : ends[b]])
    assert cache.starts.tolist() == cache._starts and (cache.starts + cache.lengths).tolist() == cache.ends
    moved = len(keep) if shift else sum(b != i for i, b in enumerate(keep))
    if case == "fill":
        assert moved == 2  # rows 7 and 9 into the places of 1 and 5, where the increasing order moves 6
    row_bytes = heads * (width - shift) * hd * k.element_size()
    assert cache.bytes_copied - before == 2 * 2 * moved * row_bytes  # K and V, gathered + written


@pytest.mark.parametrize("in_order", [True, False])
def test_cache_commit_moves_what_the_row_by_row_reference_moves(in_order):
    """The fast commit (flat index_select / index_copy_ over every layer's K and V) against
    ``commit_reference``: ragged rows (left padding, rows ending before the shared axis), a chain's
    in-order keep and a tree's permuted one, counts from 0 to J; every kept slot equal, every slot
    before the block untouched, the rows' ends and the axis as the counts say.  Seeds 0-19."""
    from marsrl.engine.cache import RaggedCache, commit_reference

    for seed in range(20):
        g = torch.Generator().manual_seed(seed)
        bsz, heads, hd, width, j = 5, 2, 3, 9, 4
        starts = torch.randint(0, 3, (bsz,), generator=g)
        ends = torch.randint(5, width + 1, (bsz,), generator=g)
        ends[int(torch.randint(0, bsz, (1,), generator=g))] = width  # some row reaches the axis's end
        cache = RaggedCache(bsz, torch.device("cpu"), capacity=width + j + 2)
        layers = 3
        for layer in range(layers):
            k = torch.randn(bsz, heads, width, hd, generator=g)
            cache.cache.update(k, -k, layer)
        cache.set_rows(starts, ends - starts, starts.tolist(), (ends - starts).tolist())
        for layer in range(layers):
            k = torch.randn(bsz, heads, j, hd, generator=g)
            cache.cache.update(k, 2 * k, layer)  # the block at [width, width + j)
        if in_order:
            keep = torch.arange(j).expand(bsz, j)
        else:
            keep = torch.stack([torch.randperm(j, generator=g) for _ in range(bsz)])
        counts = torch.randint(0, j + 1, (bsz,), generator=g)
        before = [
            (layer.keys[:, :, : width + j].clone(), layer.values[:, :, : width + j].clone())
            for layer in cache.cache.layers
        ]
        cache.commit(width, keep, counts, counts.tolist(), in_order=in_order)
        for layer, (keys, values) in zip(cache.cache.layers, before, strict=True):
            for name, ref in (("keys", keys), ("values", values)):
                commit_reference(ref, ends.tolist(), width, keep.tolist(), counts.tolist())
                got = getattr(layer, name)
                for b in range(bsz):
                    kept = int(ends[b] + counts[b])
                    assert torch.equal(got[b, :, :kept], ref[b, :, :kept]), (seed, name, b)
        assert cache.ends == (ends + counts).tolist()
        assert cache.width == int((ends + counts).max())


def test_cache_step_written_at_each_rows_end_equals_the_appended_and_moved_step():
    """``at_ends`` + ``commit_in_place`` against the append + ``commit`` path: ragged rows (left
    padding, rows ending short of the axis, the axis wider than every end after a select), one entry a
    row; each row's valid slots equal, ends and axis equal, and ``ends_mask`` lets each row see exactly
    its valid slots and its new entry.  Seeds 0-19."""
    from marsrl.engine.cache import RaggedCache

    for seed in range(20):
        g = torch.Generator().manual_seed(seed)
        bsz, heads, hd, width, layers = 5, 2, 3, 9, 3
        starts = torch.randint(0, 3, (bsz,), generator=g)
        ends = torch.randint(5, width + 1, (bsz,), generator=g)
        if seed % 2 == 0:  # some row reaches the axis's end; odd seeds: none does (a select took it)
            ends[int(torch.randint(0, bsz, (1,), generator=g))] = width
        first = [torch.randn(bsz, heads, width, hd, generator=g) for _ in range(layers)]
        step = [torch.randn(bsz, heads, 1, hd, generator=g) for _ in range(layers)]
        caches = []
        for in_place in (False, True):
            cache = RaggedCache(bsz, torch.device("cpu"), capacity=width + 2)
            for layer, k in enumerate(first):
                cache.cache.update(k, -k, layer)
            cache.set_rows(starts, ends - starts, starts.tolist(), (ends - starts).tolist())
            assert not cache.aligned()
            ones = torch.ones(bsz, dtype=torch.long)
            if in_place:
                mask = cache.ends_mask(torch.float32)
                with cache.at_ends():
                    for layer, k in enumerate(step):
                        cache.cache.update(k, 2 * k, layer)
                cache.commit_in_place(ones, [1] * bsz)
            else:
                for layer, k in enumerate(step):
                    cache.cache.update(k, 2 * k, layer)
                cache.commit(width, torch.zeros(bsz, 1, dtype=torch.long), ones, [1] * bsz, in_order=True)
            caches.append(cache)
        moved, placed = caches
        assert placed.ends == moved.ends == (ends + 1).tolist() and placed.width == moved.width
        for a, b in zip(moved.cache.layers, placed.cache.layers, strict=True):
            for b_ in range(bsz):
                live = slice(int(starts[b_]), int(ends[b_]) + 1)
                assert torch.equal(a.keys[b_, :, live], b.keys[b_, :, live]), (seed, b_)
                assert torch.equal(a.values[b_, :, live], b.values[b_, :, live]), (seed, b_)
        seen = mask[:, 0, 0] == 0  # [B, width + 1]
        for b_ in range(bsz):
            want = [int(starts[b_]) <= s <= int(ends[b_]) for s in range(width + 1)]
            assert seen[b_].tolist() == want, (seed, b_)


def test_cache_steps_at_ends_read_only_finite_slots_through_new_buffers(monkeypatch):
    """A step written ``at_ends`` leaves the slot at the axis unwritten for rows ending short of it, and
    attention reads it (masked): every slot a forward reads must be finite.  With ``new_empty``
    poisoned with NaN, every slot in ``[0, width)`` stays finite over steps at ends, a select that
    copies rows into new buffers (repeated rows), and a buffer grown past its capacity."""
    from marsrl.engine.cache import RaggedCache

    real_new_empty = torch.Tensor.new_empty
    monkeypatch.setattr(
        torch.Tensor, "new_empty", lambda self, *a, **kw: real_new_empty(self, *a, **kw).fill_(float("nan"))
    )
    g = torch.Generator().manual_seed(0)
    bsz, heads, hd, width, layers = 4, 2, 3, 6, 2
    cache = RaggedCache(bsz, torch.device("cpu"), capacity=width + 3)
    for layer in range(layers):
        cache.cache.update(
            torch.randn(bsz, heads, width, hd, generator=g), torch.randn(bsz, heads, width, hd), layer
        )
    ends = torch.tensor([6, 4, 5, 3])
    cache.set_rows(torch.zeros(bsz, dtype=torch.long), ends, [0] * bsz, ends.tolist())

    def step():
        n = len(cache.ends)
        with cache.at_ends():
            for layer in range(layers):
                k = torch.randn(n, heads, 1, hd, generator=g)
                cache.cache.update(k, k, layer)
        cache.commit_in_place(torch.ones(n, dtype=torch.long), [1] * n)
        for layer in cache.cache.layers:
            assert torch.isfinite(layer.keys[:, :, : layer.width + 1]).all()
            assert torch.isfinite(layer.values[:, :, : layer.width + 1]).all()

    for _ in range(2):
        step()
    rows = [0, 0, 1, 2, 3, 3]  # repeated rows: new buffers
    cache.select(torch.tensor(rows), rows)
    for _ in range(6):  # the capacity (9) runs out: the buffers grow
        step()
    assert cache.cache.layers[0].keys.shape[2] > width + 3


def test_plain_steps_over_ragged_rows_written_at_their_ends_match_the_moved_path(qwen, monkeypatch):
    """Auto mode's plain steps after speculative rounds (rows' ends differ) write each row's entry at
    its end instead of appending and moving it: the same plan (``CycleK``: plain runs between chains)
    gives the same tokens and acceptance, and behaviour and target log-probs within 1e-5, greedy and
    sampled, rows finishing at different rounds.  ``new_empty`` is poisoned with NaN throughout: the
    in-place step reads masked slots no forward wrote, which must hold finite numbers (the buffers are
    allocated zeroed)."""
    from marsrl.engine.adaptive import CycleK
    from marsrl.engine.cache import RaggedCache

    real_new_empty = torch.Tensor.new_empty

    def poisoned(self, *a, **kw):
        out = real_new_empty(self, *a, **kw)
        return out.fill_(float("nan")) if out.is_floating_point() else out

    monkeypatch.setattr(torch.Tensor, "new_empty", poisoned)
    in_place = []
    real_mask = RaggedCache.ends_mask

    def spy(self, dtype):
        in_place.append(len(self.ends))
        return real_mask(self, dtype)

    monkeypatch.setattr(RaggedCache, "ends_mask", spy)

    class NoisyGreedy:
        """Drafts the target's greedy continuation with each token replaced by a random one with
        probability 0.3, seeded by the sequence (the two paths see the same drafts): rows accept
        different numbers of drafts, greedy and sampled, so their ends differ."""

        def propose(self, sequences, k):
            out = []
            for seq, greedy in zip(sequences, hf_greedy(qwen, sequences, k), strict=True):
                greedy = torch.tensor(greedy)
                g = torch.Generator().manual_seed(hash(tuple(seq)) % 2**31)
                noise = torch.randint(0, 64, (k,), generator=g)
                out.append(torch.where(torch.rand(k, generator=g) < 0.3, noise, greedy))
            return torch.stack(out)

    eng = SpeculativeEngine(qwen, NoisyGreedy(), EngineConfig(num_draft_tokens="auto", max_draft_tokens=3))

    def run(temperature: float, at_ends: bool):
        monkeypatch.setattr(SpeculativeEngine, "plain_at_ends", at_ends)
        sp = SamplingParams(temperature=temperature, max_new_tokens=40, n=3, seed=5, ignore_eos=True)
        out = eng._generate(PROMPTS, sp, CycleK([3, 0], cycles=30, repeat=2))
        return out, eng._totals["accepted"]

    ragged = {}
    for temperature in (0.0, 1.0):
        in_place.clear()
        moved, acc_moved = run(temperature, False)
        assert in_place == []
        placed, acc_placed = run(temperature, True)
        ragged[temperature] = list(in_place)
        assert acc_placed == acc_moved > 0
        for a, b in zip(placed, moved, strict=True):
            assert a.completion_ids == b.completion_ids
            assert a.behavior_logprobs == pytest.approx(b.behavior_logprobs, abs=1e-5)
            assert a.target_logprobs == pytest.approx(b.target_logprobs, abs=1e-5)
    print(ragged)
    for steps in ragged.values():
        assert len(steps) >= 10 and min(steps) < 12  # ragged plain steps ran, also after rows finished


def test_speed_check_is_measured_over_predicted_per_kind_and_size():
    from marsrl.engine.adaptive import SpeedCheck

    check = SpeedCheck(window=16, least=4, cap=3.0)
    for _ in range(3):
        check.add(128, False, 2.0, 2.0)
        check.add(128, True, 6.0, 5.0)
    assert check.factor(128) == 1.0  # under `least` rounds of each kind: no word yet
    check.add(128, False, 2.0, 2.0)
    check.add(128, True, 6.0, 5.0)
    assert check.factor(128) == pytest.approx(1.2)
    assert check.factor(64) == 1.0  # sizes are apart
    # a stall counts at most `cap` times its prediction: 4 plain rounds of 2 s predicted, one of them 100 s
    check.add(128, False, 100.0, 2.0)
    assert check.ratio(128, False) == pytest.approx((4 * 2.0 + 6.0) / (5 * 2.0))
    # sums, not medians: one slow round of five moves the ratio by its share
    for _ in range(16):  # the window keeps only the last 16 of a kind
        check.add(128, True, 5.0, 5.0)
    assert check.ratio(128, True) == pytest.approx(1.0)
    carried = check.carried()
    check.add(128, True, 50.0, 5.0)
    assert carried.ratio(128, True) == pytest.approx(1.0)  # a copy, not a view
    assert set(check.to_dict()) == {"128"} and check.to_dict()["128"]["rounds"] == [5, 16]


def test_speed_check_leaves_out_catch_up_rounds_and_a_near_tie_measures_a_second_round():
    """A speculative round right after plain steps first absorbs their pairs: no sample of a steady
    speculative round (what the calibration models), so the check leaves it out.  So that a near tie
    still measures speculative rounds where plain steps are chosen, its speculative round after plain
    steps runs twice in a row, the second one timed."""
    from marsrl.engine.adaptive import AcceptanceEstimates, KPlanner, SpeedCheck

    check = SpeedCheck(window=16, least=4, cap=3.0)
    for _ in range(4):
        check.add(128, False, 2.0, 2.0)
        check.add(128, True, 6.0, 5.0)
    check.add(128, True, 15.0, 5.0, after_plain=12)  # a catch-up round: not counted
    assert check.ratio(128, True) == pytest.approx(1.2) and len(check.rounds[128, True]) == 4
    assert check.ratio(128, False) == pytest.approx(1.0)
    check.add(128, False, 2.0, 2.0, after_plain=3)  # only speculative rounds catch up
    assert len(check.rounds[128, False]) == 5

    # the near tie of the planner test below, speculative rounds 1.12x their prediction (k = 2 at 0.98
    # tokens/s against the plain step's 1.0), and each plain step leaving 0.5 s for the next speculative
    # round to catch up on.  Seed 0, 400 rounds of one row at acceptance 0.7
    import random

    class ChargedToRound(SpeedCheck):  # the check before 2026-12-05: catch-up rounds counted
        def add(self, size, speculative, seconds, predicted, after_plain=0, pairs=0):
            super().add(size, speculative, seconds, predicted)

    costs = CostModel(rounds={1: {0: 1.0, 1: 1.6, 2: 2.0, 3: 2.4}})
    for speed in (SpeedCheck(), ChargedToRound()):
        rng = random.Random(0)
        est = AcceptanceEstimates(3)
        est.accepted, est.reached = [70.0, 70.0, 70.0], [100.0, 100.0, 100.0]
        planner = KPlanner(costs, 3, estimates=est, speed=speed)
        ks, pending = [], 0
        for _ in range(400):
            k = planner.choose(1, 0)
            accepted = 0
            while accepted < k and rng.random() < 0.7:
                accepted += 1
            planner.observe([k], [accepted])
            planner.timed(costs.round_seconds(1, k) * 1.12 + 0.5 * pending if k else 1.0)
            pending = 0 if k else pending + 1
            ks.append(k)
        if isinstance(speed, ChargedToRound):  # the catch-up read as speculative seconds
            assert speed.factor(1) > 1.25, speed.to_dict()  # against a true 1.12
            continue
        assert speed.factor(1) == pytest.approx(1.12), speed.to_dict()  # the true ratio, catch-up aside
        late = ks[200:]
        assert sum(k == 0 for k in late) > 0.7 * len(late)  # plain is chosen, near a tie
        starts = [i for i in range(1, len(late) - 1) if late[i] and not late[i - 1]]
        pairs = sum(1 for i in starts if late[i + 1])  # the tie's rounds: catch-up, then the sample
        # measured ever more rarely while plain stays ahead (SpeedCheck.tie_due): every 64th tie by now
        assert speed.ties[1][1] == 64 and 2 <= pairs <= 5, (speed.ties, late)
        assert len(starts) - pairs <= 3, late  # the rest are probes, after 64 and 128 plain rounds


def test_near_tie_measuring_rounds_thin_out_while_they_confirm_the_ranking():
    """A near tie measures the runner-up at its 8th round; once the factor acts (both kinds have
    ``least`` rounds) each measurement that finds the same winner doubles the gap to the next, up to 64,
    and one that finds the other winner sets it back to 8.  The count carries over calls with the
    check (``carried``), per batch size."""
    from marsrl.engine.adaptive import SpeedCheck

    def due_rounds(check, size, winners):
        return [i for i, w in enumerate(winners) if check.tie_due(size, w, every=8, most=64)]

    check = SpeedCheck(least=2)
    # not measured yet: every 8th tie, whatever the winner
    assert due_rounds(check, 128, [True] * 24) == [7, 15, 23]
    for _ in range(2):
        check.add(128, False, 1.0, 1.0)
        check.add(128, True, 1.0, 1.0)
    # measured: plain ahead at each measurement, so gaps of 16, 32, 64, 64 follow the 8 left
    assert due_rounds(check, 128, [True] * 200) == [7, 23, 55, 119, 183]
    assert check.to_dict()["128"]["tie_gap"] == 64
    carried = check.carried()  # a new call goes on counting: 48 ties left of the gap
    assert due_rounds(carried, 128, [True] * 50) == [47]
    # the winner changed at a measurement (62 ties on): back to 8, then doubling while it holds
    assert due_rounds(carried, 128, [False] * 64) == [61]
    assert due_rounds(carried, 128, [False] * 40) == [5, 21]
    assert check.ties[128] != carried.ties[128]  # a copy, not a view
    assert due_rounds(carried, 32, [True] * 16) == [7, 15]  # another batch size counts on its own


def test_probe_wait_carries_over_calls_and_resets_when_a_probe_turns_the_choice():
    """Where plain keeps winning, probes come after 8, 16, 32, ... plain rounds, counted over the
    engine's calls (a planner per call, started from the last one's run and wait): not from 8 again
    in each call, where every probe at many rows absorbs the drafter's pairs of the whole run before
    it.  A probe after which drafting wins resets the wait."""
    from marsrl.engine.adaptive import AcceptanceEstimates, KPlanner

    costs = CostModel(rounds={1: {0: 1.0, 1: 1.3, 2: 1.6, 3: 1.9}})

    def calls(lengths, accept):
        """Spec rounds' indices per call, one planner per call as the engine makes them."""
        est, probe, out = AcceptanceEstimates(3), None, []
        # about 0.17 a position, from two rounds' worth: plain wins (k = 1 at 0.9 tokens a second)
        est.accepted, est.reached = [0.2, 0.2, 0.2], [2.0, 2.0, 2.0]
        for n in lengths:
            planner = KPlanner(costs, 3, estimates=est, probe=probe)
            ks = []
            for _ in range(n):
                k = planner.choose(1, 0)
                planner.observe([k], [k if accept else 0])
                planner.timed(1.0)
                ks.append(k)
            out.append([i for i, k in enumerate(ks) if k])
            est, probe = planner.estimates, (planner.plain_run, planner.wait)
        return out, probe

    spec, probe = calls([40, 40, 100], accept=False)
    # one run of 180 rounds: the 8th, then the 16th, 32nd, 64th round after a probe is one (rounds 7, 23,
    # 55, 119 of the run), whatever the calls
    assert spec == [[7, 23], [55 - 40], [119 - 80]], spec
    assert probe == (180 - 120, 128)
    # the same rounds with a fresh wait each call probe 2 + 2 + 3 times
    fresh = [len(calls([n], accept=False)[0][0]) for n in (40, 40, 100)]
    assert fresh == [2, 2, 3], fresh
    # every draft accepted: the first probe turns the choice, and the wait is back to 8
    spec, probe = calls([40], accept=True)
    assert spec[0][:3] == [7, 8, 9] and probe[1] == 8, (spec, probe)


def _simulate(planner, costs, spec_slowdown: float, rounds: int, accept_rate: float, seed: int = 0):
    """Rounds of one live row over an empty cache: each takes the model's seconds for its k, times
    ``spec_slowdown`` where k >= 1 (what the calibration missed); each draft accepted with
    ``accept_rate`` (seeded), the first rejection ending the chain.  The chosen k's."""
    import random

    rng = random.Random(seed)
    ks = []
    for _ in range(rounds):
        k = planner.choose(1, 0)
        accepted = 0
        while accepted < k and rng.random() < accept_rate:
            accepted += 1
        planner.observe([k], [accepted])
        planner.timed(costs.round_seconds(1, k) * (spec_slowdown if k else 1.0))
        ks.append(k)
    return ks


def test_planner_turns_to_plain_where_speculative_rounds_run_slower_than_the_model_says():
    """The near tie of strict at B = 128 on this CPU: at acceptance 0.7 the model puts k = 2 (2.0 s a
    round, 2.19 tokens) at 1.095 tokens/s against the plain step's 1.0, within 10%: the planner drafts
    k = 2 and measures a plain step every 8th such round.  If speculative rounds really take 1.25x their
    prediction (k = 2 at 0.88 tokens/s: plain wins), the SpeedCheck sees it and the planner turns to
    plain; without it the model alone keeps drafting; with a truthful clock the choice stays k = 2 but
    for the tie's plain steps.  Seed 0, 600 rounds of one row; judged on the last 300."""
    from marsrl.engine.adaptive import AcceptanceEstimates, KPlanner, SpeedCheck

    costs = CostModel(rounds={1: {0: 1.0, 1: 1.6, 2: 2.0, 3: 2.4}})
    shares = {}
    for slowdown in (1.25, 1.0):
        for speed in (SpeedCheck(), None):
            est = AcceptanceEstimates(3)
            est.accepted, est.reached = [70.0, 70.0, 70.0], [100.0, 100.0, 100.0]
            planner = KPlanner(costs, 3, estimates=est, speed=speed)
            ks = _simulate(planner, costs, slowdown, 600, 0.7)[300:]
            shares[slowdown, speed is not None] = sum(k > 0 for k in ks) / len(ks)
    assert shares[1.25, True] < 0.1, shares  # measured: speculation loses, and plain is chosen
    assert shares[1.25, False] > 0.95, shares  # the model alone keeps drafting
    assert shares[1.0, False] > 0.95, shares
    # a right model's choice kept, a plain step measured now and then (ever more rarely, tie_due)
    assert 0.95 < shares[1.0, True] < 1.0, shares


def test_completion_lengths_give_the_tokens_a_live_row_still_makes():
    from marsrl.engine.adaptive import Lengths

    lengths = Lengths([10, 40, 200, 20, 30], cap=128)  # 200 is past the cap: read as 128
    assert lengths.remaining(0) == pytest.approx((10 + 20 + 30 + 40 + 128) / 5)
    assert lengths.remaining(25) == pytest.approx((30 + 40 + 128) / 3 - 25)  # only the rows past 25
    assert lengths.remaining(10) == pytest.approx((20 + 30 + 40 + 128) / 4 - 10)  # 10 itself has ended
    assert lengths.remaining(128) == 1.0  # past every length and the cap: at least one token
    assert Lengths([10, 20], cap=128).remaining(50) == 78  # past every length known: the cap bounds it


def test_speed_check_prices_a_plain_step_pair_from_catch_up_rounds():
    """A catch-up round's seconds past a steady round's (the prediction times the size's measured
    speculative ratio), per plain-step pair it absorbed; the median of the last ``window``, from
    ``least`` rounds on."""
    from marsrl.engine.adaptive import SpeedCheck

    check = SpeedCheck(window=16, least=4, cap=3.0)
    for _ in range(4):
        check.add(128, True, 6.0, 5.0)  # steady speculative rounds at 1.2x their prediction
    for pairs in (100, 200, 300):
        check.add(128, True, 6.0 + 0.01 * pairs, 5.0, after_plain=3, pairs=pairs)
    assert check.pair_seconds() is None  # 3 of least = 4
    check.add(128, True, 1000.0, 5.0, after_plain=3, pairs=100)  # a stall
    assert check.pair_seconds() == pytest.approx(0.01)  # the median: 0.01, 0.01, 0.01, ~10
    assert len(check.rounds[128, True]) == 4  # catch-up rounds stay out of the ratios
    check.add(128, True, 6.0, 5.0, after_plain=1, pairs=0)  # nothing absorbed: no price sample
    assert len(check.catchups) == 4
    carried = check.carried()
    for _ in range(8):  # 0.5 s under a steady round's 6 s: a negative price, read as 0
        check.add(128, True, 5.5, 5.0, after_plain=1, pairs=50)
    assert check.pair_seconds() == 0.0 and carried.pair_seconds() == pytest.approx(0.01)  # a copy


def test_planner_switches_to_drafting_only_where_the_catch_up_pays():
    """After plain steps a speculative round first absorbs their pairs (``debt``, over all rows).  At
    a measured price a pair, the planner switches to its best k only if the time that k saves on the
    tokens the live rows are still expected to make (the last call's lengths) covers the catch-up; else
    it stays plain (``held``).  An exploring switch (a probe: plain ranked first) waits while its
    catch-up costs more than its round.  Without a price or without lengths it switches as before."""
    from marsrl.engine.adaptive import AcceptanceEstimates, KPlanner, Lengths, SpeedCheck

    costs = CostModel(rounds={1: {0: 1.0, 1: 1.6, 2: 2.0, 3: 2.4}})

    def planner(accept: float, price: bool = True, lengths: bool = True) -> KPlanner:
        est = AcceptanceEstimates(3)
        est.accepted, est.reached = [100 * accept] * 3, [100.0] * 3
        speed = SpeedCheck()
        if price:
            speed.catchups = [0.01] * speed.least  # 0.01 s a pair
        known = Lengths([100] * 4, cap=128) if lengths else None
        return KPlanner(costs, 3, estimates=est, speed=speed, lengths=known)

    # acceptance 0.9: k = 3 gives 3.439 tokens in 2.4 s (1.433 a second) against plain's 1.0, and saves
    # 1 - 2.4 / 3.439 = 0.302 s a token; at 90 tokens made, 10 are ahead: 3.02 s saved
    saved = 10 * (1 - 2.4 / 3.439)
    p = planner(0.9)
    assert p.choose(1, 0, debt=295, made=90) == 3 and saved > 2.95
    assert p.choose(1, 0, debt=310, made=90) == 0 and p.held == 1 and saved < 3.10  # owes 3.10 s
    assert p.choose(1, 0, debt=310, made=50) == 3  # 50 tokens ahead
    assert p.choose(1, 0, debt=310, made=100) == 3  # past every known length: up to the cap, 28 ahead
    assert p.choose(1, 0, debt=10**6, made=90) == 0
    assert p.choose(1, 0, debt=0, made=90) == 3  # nothing owed
    assert planner(0.9, price=False).choose(1, 0, debt=10**6, made=90) == 3
    assert planner(0.9, lengths=False).choose(1, 0, debt=10**6, made=90) == 3
    assert p.held == 2

    # acceptance 0.2: plain wins; the probe after 8 plain rounds is k = 1 (1.6 s predicted)
    p = planner(0.2)
    assert [p.choose(1, 0, debt=i) for i in range(7)] == [0] * 7
    assert p.choose(1, 0, debt=161) == 0  # due, but its catch-up (1.61 s) costs more than the round
    assert p.choose(1, 0, debt=170) == 0 and p.plain_run == 9  # still waiting, the run counted on
    assert p.choose(1, 0, debt=160) == 1 and p.wait == 16  # 1.6 s: it fits
    p = planner(0.2)
    assert [p.choose(1, 0, debt=10**6) for i in range(20)] == [0] * 20
    assert p.choose(1, 0, debt=0) == 1  # a batch's start, nothing owed: the probe runs there
    assert p.held == 0  # probes that wait are not counted as held


def test_engine_tells_the_planner_what_a_switch_owes(qwen):
    """Each round the engine passes the plain steps' pairs the drafter has not absorbed, over the
    live rows (a ``drafter_window`` bounds each row's), and the rows' mean tokens so far; a speculative
    round absorbs them.  After an auto call it keeps the completion lengths for the next call's planner
    and reports the price and the held rounds (``stats["switch_debt"]``)."""
    from marsrl.engine.adaptive import Lengths

    class Scripted:
        exhausted = False

        def __init__(self, plan):
            self.plan, self.seen = list(plan), []

        def choose(self, rows, width=0, debt=0, made=0.0, keys=None, left=None):
            self.seen.append((rows, debt, made))
            k = self.plan.pop(0)
            self.exhausted = not self.plan
            return k

        def observe(self, drafted, accepted, keys=None):
            pass

        def timed(self, seconds):
            pass

    head = Eagle3Drafter.from_target(qwen)
    sp = SamplingParams(temperature=1.0, max_new_tokens=40, n=2, ignore_eos=True, seed=1)
    for window, want in ((0, [0, 0, 2, 4, 6, 8, 0, 2]), (3, [0, 0, 2, 4, 6, 6, 0, 2])):
        cfg = EngineConfig(num_draft_tokens="auto", max_draft_tokens=2, drafter_window=window)
        eng = SpeculativeEngine(qwen, head, cfg, cost_model=CostModel(rounds={1: {0: 1.0, 1: 1.5, 2: 2.0}}))
        plan = Scripted([2, 0, 0, 0, 0, 2, 0, 2])
        eng._generate([[3, 4, 5]], sp, plan)
        assert [d for _, d, _ in plan.seen] == want, plan.seen
        kept = eng.stats["tokens_per_round"]
        made = [1 + sum(kept[:i]) / 2 for i in range(len(kept))]  # both rows live: the prefill's token on
        assert [m for _, d, m in plan.seen if d] == [made[i] for i, d in enumerate(want) if d]
    out = eng.generate([[3, 4, 5], [6, 7]], sp)
    assert eng._lengths == [len(t.completion_ids) for t in out] == [40] * 4
    assert set(eng.stats["switch_debt"]) == {"pair_seconds", "held"}
    assert Lengths(eng._lengths, 40).remaining(10) == 30


def test_engine_carries_its_speed_check_unless_turned_off(qwen):
    """With the defaults an auto call times every round against the model but the exploring first one
    and the catch-up rounds (a speculative round right after a plain step, whose excess goes to the plain
    steps), and carries the SpeedCheck to the next call (its rounds add up over calls);
    speed_check=False or adapt_costs=False leave it out: no stats entry, nothing carried."""
    head = Eagle3Drafter.from_target(qwen)
    sp = SamplingParams(temperature=1.0, max_new_tokens=10, n=2, ignore_eos=True, seed=3)
    for opts in ({}, {"speed_check": False}, {"adapt_costs": False}):
        costs = CostModel(rounds={1: {k: 1.0 + k for k in range(4)}, 4: {k: 1.0 + k for k in range(4)}})
        cfg = EngineConfig(num_draft_tokens="auto", max_draft_tokens=3, **opts)
        eng = SpeculativeEngine(qwen, head, cfg, cost_model=costs)
        counted, rounds = [], []
        for _ in range(2):
            eng.generate([[1, 2, 3]], sp)
            ks = eng.stats["k_per_round"]
            catch_up = sum(1 for a, b in itertools.pairwise(ks) if a == 0 and b > 0)
            rounds.append(len(ks) - catch_up)
            if not opts:
                kept = eng.stats["speed_check"]["1"]["rounds"]  # rows 2: nearest measured size is 1
                counted.append(sum(kept))
            else:
                assert "speed_check" not in eng.stats and eng._speed is None
        if not opts:  # the first call's first round explores (no prediction); the second's is planned
            assert counted == [rounds[0] - 1, rounds[0] - 1 + rounds[1]], (counted, rounds)


def _live_tokens_reference(history, pooled, prior, keys, left, k_max):
    """``RowAcceptance.expected_tokens_upto`` by definition: the live rows' counts summed position by
    position and shrunk toward ``pooled``, the chain of those rates, and for each row the sum of
    P(first m drafts kept) over m = 0 .. min(k, left - 1), averaged over the rows."""
    acc, reached = [0.0] * k_max, [0.0] * k_max
    for key in keys:
        for drafted, accepted in history.get(key, []):
            for j in range(min(accepted + 1, drafted)):
                reached[j] += 1
                acc[j] += j < accepted
    rates = [(acc[j] + prior * pooled[j]) / (reached[j] + prior) for j in range(k_max)]
    out = []
    for k in range(k_max + 1):
        per_row = []
        for cap in left:
            tokens = 0.0
            for m in range(min(k, cap - 1) + 1):
                tokens += math.prod(rates[:m])
            per_row.append(tokens)
        out.append(sum(per_row) / len(per_row))
    return out


def test_live_rows_acceptance_equals_its_reference_and_follows_the_live_rows():
    """The planner's expected tokens from the live rows (``RowAcceptance``): 300 random histories,
    live subsets and caps (seed 0) equal the by-definition reference within 1e-12; rows that accept
    everything and rows that accept nothing, each group live alone, give K + 1 and 1 tokens (shrunk a
    little toward the pooled rates) where the call's pooled estimates give one figure for both, and the
    planner on a flat cost model drafts K for the first group and the least k for the second; a row
    with one token left keeps one whatever k."""
    import random

    from marsrl.engine.adaptive import AcceptanceEstimates, KPlanner, RowAcceptance

    rng = random.Random(0)
    for _ in range(300):
        k_max = rng.randint(1, 8)
        prior = rng.choice([1.0, 4.0, 16.0])
        rows = RowAcceptance(k_max, prior)
        history: dict[int, list] = {}
        for key in range(rng.randint(1, 12)):
            for _ in range(rng.randint(0, 10)):
                d = rng.randint(1, k_max)
                a = rng.randint(0, d)
                rows.update(key, d, a)
                history.setdefault(key, []).append((d, a))
        pooled = [rng.uniform(0.05, 0.95) for _ in range(k_max)]
        keys = rng.sample(range(14), rng.randint(1, 6))  # some never observed
        left = [rng.randint(1, k_max + 2) for _ in keys]
        got = rows.expected_tokens_upto(pooled, keys, left)
        want = _live_tokens_reference(history, pooled, prior, keys, left, k_max)
        assert got == pytest.approx(want, rel=0, abs=1e-12)

    k_max = 4  # a round costs 1 + k / 2: a draft pays where it is likely kept
    figures = {k: 1.0 + 0.5 * k for k in range(k_max + 1)}
    costs = CostModel(rounds={1: dict(figures), 64: dict(figures)})
    planner = KPlanner(
        costs, k_max, probe_every=10**9, explore_every=10**9, estimates=AcceptanceEstimates(k_max)
    )
    planner.first = False
    good, bad = list(range(8)), list(range(8, 16))
    for _ in range(10):  # every row drafts K each round: the good ones keep all, the bad ones none
        planner.observe([k_max] * 16, [k_max] * 8 + [0] * 8, keys=good + bad)
    pooled = planner.live_rows.expected_tokens_upto(planner.estimates.rates(), good + bad, [100] * 16)
    high = planner.live_rows.expected_tokens_upto(planner.estimates.rates(), good, [100] * 8)
    low = planner.live_rows.expected_tokens_upto(planner.estimates.rates(), bad, [100] * 8)
    assert high[k_max] > k_max + 0.9 and low[k_max] < 1.1
    assert low[1] < pooled[1] < high[1]
    assert planner.choose(8, keys=good, left=[100] * 8) == k_max
    assert planner.choose(8, keys=bad, left=[100] * 8) == 0
    assert planner.choose(16) == planner.choose(16, keys=good + bad, left=[100] * 16)  # every row live
    one_left = planner.live_rows.expected_tokens_upto(planner.estimates.rates(), good, [1] * 8)
    assert one_left == [1.0] * (k_max + 1)


def test_engine_names_its_live_rows_to_the_planner(qwen):
    """Each auto round the engine passes the live rows' names (their places in the call: distinct, a
    row keeps its name as others finish and rows move) and the tokens each may still make, and the
    round's outcome under the same names: a row's tokens left fall by exactly what it kept."""
    head = Eagle3Drafter.from_target(qwen)
    torch.manual_seed(0)
    events = []

    class Recording(KPlanner):
        def choose(self, rows, width=0, debt=0, made=0.0, keys=None, left=None):
            k = super().choose(rows, width, debt, made, keys=keys, left=left)
            events.append(("choose", rows, keys and list(keys), left and list(left), k))
            return k

        def observe(self, drafted, accepted, keys=None):
            events.append(("observe", list(keys), list(accepted)))
            super().observe(drafted, accepted, keys=keys)

    costs = CostModel(
        rounds={1: {k: 1.0 + 0.2 * k for k in range(4)}, 8: {k: 1.0 + 0.2 * k for k in range(4)}}
    )
    eng = SpeculativeEngine(
        qwen, head, EngineConfig(num_draft_tokens="auto", max_draft_tokens=3), cost_model=costs
    )
    sp = SamplingParams(temperature=1.0, max_new_tokens=24, n=3, seed=5, eos_token_id=7)
    eng._generate([[3, 4, 5], [6, 7, 8]], sp, Recording(costs, 3))
    assert events[0][0] == "choose" and events[0][2] is None and events[0][4] == 3  # the prefill's
    made = dict.fromkeys(range(6), 1)  # the prefill's token
    live = list(range(6))
    checked = 0
    for event in events[1:]:
        if event[0] == "observe":
            _, keys, accepted = event
            assert keys == live
            for key, a in zip(keys, accepted, strict=True):
                made[key] += a + 1
        else:
            _, rows, keys, left, k = event
            assert len(keys) == rows == len(set(keys)) and set(keys) <= set(live)
            assert left == [24 - made[key] for key in keys]
            checked += rows
            live = keys
            if k == 0:  # a plain step: one token a row, nothing to observe
                for key in keys:
                    made[key] += 1
    assert checked and len(live) < 6  # rows finished, the rest kept their names
