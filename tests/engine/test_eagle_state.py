"""The drafter's per-call state (``eagle_state.py``): pending pairs, plain steps' pairs kept aside, the
deferred prompt pass and the window, each against absorbing every round."""

import pytest
import torch

from marsrl.drafter import Eagle3Drafter
from marsrl.engine import EngineConfig, SamplingParams, SpeculativeEngine
from tests.engine.helpers import PROMPTS


def test_nothing_of_a_batch_stays_with_the_drafter(qwen):
    eng = SpeculativeEngine(qwen, Eagle3Drafter.from_target(qwen), EngineConfig(num_draft_tokens=3))
    eng.generate(PROMPTS, SamplingParams(max_new_tokens=8))
    assert eng._eagle.cache is None and eng._eagle.feats is None


def test_pairs_appended_over_plain_steps_absorb_like_pairs_absorbed_each_round(qwen):
    """A plain step (auto's k = 0) leaves its pair pending; absorbing two rounds of pairs at once must
    give the drafter the state it gets absorbing them one round at a time."""
    from marsrl.engine.eagle_state import EagleState

    head = Eagle3Drafter.from_target(qwen)
    torch.manual_seed(1)
    feats = torch.randn(2, 6, 3 * qwen.config.hidden_size)
    tokens = torch.randint(0, 64, (2, 6))
    counts = [[2, 1], [1, 2], [1, 1]]  # per round, per row: pairs added (of the 2 passed)
    outs = []
    for together in (False, True):
        st = EagleState(head)
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
    """A run of plain steps keeps its pairs aside (``EagleState.pend_plain``) and writes them after each
    row's ragged pending pairs only when the drafter absorbs; rows that finish during the run are dropped
    from both (twice here: the tail keeps its rows and composes the index to the live ones).  Reference:
    the kept rows given the same pairs, composed by hand, in one pend."""
    from marsrl.engine.eagle_state import EagleState

    head = Eagle3Drafter.from_target(qwen)
    torch.manual_seed(3)
    width, dev = 3 * qwen.config.hidden_size, torch.device("cpu")
    pre_f, pre_t = torch.randn(4, 2, width), torch.randint(0, 64, (4, 2))
    round_f, round_t, round_n = torch.randn(4, 3, width), torch.randint(0, 64, (4, 3)), [3, 1, 2, 1]
    plain_f, plain_t = torch.randn(4, 6, width), torch.randint(0, 64, (4, 6))
    st = EagleState(head)
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

    ref = EagleState(head)
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
    from marsrl.engine.eagle_state import EagleState

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
        st = EagleState(head, window)
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
    from marsrl.engine.adaptive import CycleK
    from marsrl.engine.eagle_state import EagleState

    torch.manual_seed(3)  # the head's random init: one that drafts accepted tokens, greedy and sampled
    head = Eagle3Drafter.from_target(qwen)
    eng = SpeculativeEngine(qwen, head, EngineConfig(num_draft_tokens="auto", max_draft_tokens=3))
    start = EagleState.start
    deferred = []

    def run(temperature: float, force: bool):
        def spy(self, *a, defer=False):
            start(self, *a, defer=defer)
            if force and defer:  # the pass at once, before the group copy, as the prefill ran it
                self.prompt_pass()

        monkeypatch.setattr(EagleState, "start", spy)
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
    from marsrl.engine.eagle_state import EagleState

    head = Eagle3Drafter.from_target(qwen)
    torch.manual_seed(2)
    n, window = 12, 4
    feats = torch.randn(2, 3 + n, 3 * qwen.config.hidden_size)
    tokens = torch.randint(0, 64, (2, 3 + n))
    dev = torch.device("cpu")
    full = EagleState(head)  # every pair absorbed
    windowed = EagleState(head, window)
    for st in (full, windowed):
        st.start(2, dev, feats[:, :3], tokens[:, :3], torch.tensor([3, 2]), [3, 2], 64)
        st.absorb()
        for j in range(n):  # plain steps: one pair each, kept aside (flushed at 2 * window when windowed)
            st.pend_plain(feats[:, 3 + j : 4 + j], tokens[:, 3 + j : 4 + j])
    outs = {name: st.absorb() for name, st in (("full", full), ("windowed", windowed))}
    # the buffer, grown past its room several times, against absorbing each pair as it comes
    stepwise = EagleState(head)
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

    ref = EagleState(head)
    ref.start(2, dev, feats[:, :3], tokens[:, :3], torch.tensor([3, 2]), [3, 2], 64)
    ref.absorb()
    ref.skipped = torch.full((2,), n - window)  # each row's first n - window plain-step pairs
    kept = slice(3 + n - window, 3 + n)
    ref.pend(feats[:, kept], tokens[:, kept], torch.tensor([window, window]), [window, window])
    h, lg = ref.absorb()
    torch.testing.assert_close(outs["windowed"][0], h, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(outs["windowed"][1], lg, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(outs["full"][1], lg, atol=1e-4)  # the skipped context did matter
