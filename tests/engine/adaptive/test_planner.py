"""The planners (``adaptive/planner.py``): the choice against a reference, exploration, probes, a
switch's price, and the turn to plain steps where speculative rounds run slow."""

import math
import statistics

import pytest

from marsrl.engine.adaptive import CostModel, KPlanner


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


def _reference_rate(costs, est, rows: int, k: int) -> float:
    """The planner's objective for one k, term by term: rows x E[tokens | k] / t(rows, k)."""
    from marsrl.engine.adaptive.costs import _interp, _line

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
    """A short call runs fewer rounds than explore_every = 16: a planner counting from 0 every call
    would never explore, and only a call that ran long would, near its end (so a pessimistic early
    estimate of the deepest position would stay).  20 calls of 12 rounds
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
    """A near tie between plain steps and drafting: at acceptance 0.7 the model puts k = 2 (2.0 s a
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
