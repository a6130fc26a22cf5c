"""Engine throughput against batch size on the tiny world, side by side in one run.

    python -m bench.scale                          # default world, B in 1 8 32 128, 3 repeats (~15-21 min)
    python -m bench.scale --quick                  # one repeat and one call of each system
    python -m bench.scale --batches 1 8 --ks 3 7 --repeats 5 --threads 1

Each engine call decodes B sequences at T = 1 (B = prompts x G, G = --group where B >= G, else B
prompts once): HF ``generate``, marsrl plain, strict and mars chains at each K in --ks, strict and mars
trees (--tree), and the adaptive mode (``num_draft_tokens="auto"``, ``max_draft_tokens`` = the largest
K) for strict and mars.  A measurement is several engine calls on disjoint prompts (--min-tokens, or
--calls), and the systems are interleaved call by call: call c of every system, in an order rotated each
call, before call c + 1 of any.  On a shared machine the same call's speed can drift by half again over
a few seconds; interleaving that finely spreads each slow spell over every system.  A system's
tokens/s in a repeat is its tokens over its seconds summed over the calls; a figure is the median over
repeats, and each ratio divides two medians of the same run.  Engines are built once per system and
reused over batches and repeats (an adaptive engine carries its cost model and acceptance estimates
from call to call, as in an RL run); its cost model is first measured (``calibrate``, on the run's
prompts) before any timing and the time reported apart.  "speed_check" is each auto engine's
``SpeedCheck`` after its last call: per measured batch size, its rounds' measured over predicted
seconds for plain steps and for speculative rounds, and their ratio, the factor on every k >= 1.

Engine calls run with ``profile=True`` where the engine has it: on the CPU its device synchronisation is
a no-op, so profiling costs a few timer calls per round and the timed calls give the per-phase breakdown
(``stats["time"]``, ``forward_by_width``) and the per-round trace that measures the tail: at the
largest B, the wall time after 90% of the sequences have finished.  Stats an engine does not report
are null.

After the sweep at each B comes a head-to-head (``--confirm-calls``; "confirm" in the B's results): plain,
the A/A control, and each rule's auto and its best fixed system by the sweep's medians, interleaved call
by call on prompts and seeds the sweep did not use, many more calls than a sweep's measurement.  On a small
shared machine one call of identical work moves by 10-25% against its neighbour, so the sweep's 6
calls a system cannot resolve a 3% bar, and the best fixed system is the largest of five noisy figures;
the head-to-head measures the auto bars on fresh data, as the ratio of tokens/s over all its calls with
a 90% bootstrap interval over the pairs (``ratio_of_sums``).  The mars >= strict pairs the sweep
does not pass clearly (a fixed K or the tree whose sweep ratio is under 1 + ``--confirm-margin``:
every sweep failure and every near pass, ``close_calls``; "close_calls" in the B's "confirm") run in
the head-to-head too, and it judges their bar: at a short chain mars has few positions to relax, so
its edge can be as small as the sweep's error, and a sweep failure rests on 6 calls a system.  A
pair clear of 1 by more than the margin keeps the sweep's pass.

"bars" holds the acceptance bars (docs/benchmarks.md lists them), each as {value, bar, pass, judged_on}:
``value`` the ratio of the sweep's medians, ``paired`` the median and IQR of its per-call ratios,
``confirm`` the head-to-head's ratio where both systems ran there, and ``pass`` judges that one where
present, else the sweep's (``compute_bars``); a head-to-head bar's ``resolved`` says whether its 90%
interval lies wholly on one side of the bar (None under ``RESOLVE_PAIRS`` calls), and "failed_resolved"
lists the failures whose interval lies wholly under it (the others in "failed" miss by less than this run
can tell from a pass).  "noise_floor" is the A/A control: a second, identical plain engine
(``plain_control``) against plain, whose true ratio is 1, in the sweep and in the head-to-head
(``noise_floor``).  "cost_model" is the adaptive mode's model as calibrated and after every auto call's
rounds were folded in.  Each head-to-head's calls are kept ("pairs" in the B's "confirm": {system:
[[tokens, seconds], ...]}), so that ``bench/pool_scale.py`` can read several runs as one: on a small
shared CPU a single run resolves an auto bar to a few percent, and pooled runs narrow that by the square
root of their number.

A default run takes a quarter of an hour or more on a 2-core CPU (docs/benchmarks.md has the times).

Prints one JSON object on stdout; progress goes to stderr.  Reuses the world cached under
``$MARSRL_CACHE`` (``~/.cache/marsrl``) and builds it only when it is missing.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch

from bench._common import (
    breakdown,
    k_summary,
    option_supported,
    per_round,
    ratio_of_sums,
    spread,
    tail,
    timed,
)
from bench.tinyworld import hf_sample
from marsrl.engine import EngineConfig, SamplingParams, SpeculativeEngine, TreeConfig
from marsrl.tinyworld import PRESETS, build_tinyworld, load_tinyworld
from marsrl.tinyworld.build import heldout_problems
from marsrl.tinyworld.tokenizer import chat_prompt_ids

RULES = ("strict", "mars")
RESOLVE_PAIRS = 4  # the fewest head-to-head calls whose interval can call a bar resolved
AUTO_VS_BEST = 0.97  # adaptive tok/s against the best of plain and every fixed K, at every B
SPEEDUP_BARS = {"strict": 1.3, "mars": 1.5}  # adaptive tok/s over plain at B = 128


def engine_configs(args, max_batch: int, profile: bool) -> tuple[dict[str, EngineConfig | None], bool]:
    """{system: EngineConfig} for every marsrl system (None config = plain), and whether the engine
    accepts the adaptive mode (when it does not, the auto systems are left out)."""
    common = dict(theta=args.theta, max_batch_size=max_batch)
    if profile:
        common["profile"] = True
    kmax = max(args.ks)
    auto_ok = option_supported(EngineConfig, num_draft_tokens="auto", max_draft_tokens=kmax, **common)
    # plain_control: a second plain engine, the A/A control (see ``noise_floor``)
    cfgs: dict[str, EngineConfig | None] = {
        "plain": EngineConfig(**common),
        "plain_control": EngineConfig(**common),
    }
    for rule in RULES:
        for k in args.ks:
            cfgs[f"{rule}_k{k}"] = EngineConfig(rule=rule, num_draft_tokens=k, **common)
        cfgs[f"{rule}_tree"] = EngineConfig(rule=rule, tree=TreeConfig(*args.tree), **common)
        if auto_ok:
            cfgs[f"{rule}_auto"] = EngineConfig(
                rule=rule, num_draft_tokens="auto", max_draft_tokens=kmax, **common
            )
    return cfgs, auto_ok


def compute_bars(
    results: dict[str, dict],
    ks: list[int],
    auto_ok: bool,
    speedup_batch: int = 128,
    calls: dict[str, dict[str, list[float]]] | None = None,
    confirm: dict[str, dict[str, list[tuple[float, float]]]] | None = None,
) -> dict:
    """The acceptance bars from median tokens/s: ``results`` maps "batch_B" to {system: tokens/s}.

    At every B and for each rule: auto >= 0.97 x the best of plain and every fixed K of that rule, and
    auto >= plain; mars >= strict for each chain K, the tree (and auto).  At B = ``speedup_batch``:
    strict auto >= 1.3 x plain, mars auto >= 1.5 x plain.  Each bar is {value, bar, pass} (value and
    pass None where a system is missing, e.g. an engine without the adaptive mode); ``pass`` judges the
    ratio of medians.

    ``calls`` (same keys, {system: tokens/s of each call, in the run's order: call c of repeat r of
    every system at one index}) adds ``paired`` to each bar: the median and IQR over the calls of the
    per-call ratio.  Both systems of a pair ran the same prompts and seed within one sweep of the
    systems, so a slow spell of the machine or a prompt's long completions move both: a tighter
    estimate of the same ratio than two medians taken apart.

    ``confirm`` (same keys, {system: [(tokens, seconds) of each head-to-head call]}) adds ``confirm`` to
    each bar whose two systems both ran there (``ratio_of_sums``: the ratio over every call, with its
    90% bootstrap interval), and such a bar's ``pass`` judges that ratio; ``judged_on`` says which
    ("confirm" or "sweep").  The head-to-head is fresh data on other prompts and seeds, so the best
    fixed system, picked by the sweep's medians as the largest of several noisy figures, is not also
    measured by the figure that picked it."""

    def bar(num, den, level, series=None, confirmed=None, **extra):
        value = num / den if num is not None and den else None
        out = {
            "value": round(value, 4) if value is not None else None,
            "bar": level,
            "pass": value >= level if value is not None else None,
            **extra,
        }
        if series is not None:
            a, b = series
            ratios = [x / y for x, y in zip(a, b, strict=True) if y] if a and b else []
            out["paired"] = spread(ratios) if ratios else None
        if confirmed is not None:
            out["confirm"] = confirmed
            out["pass"] = confirmed["value"] >= level
            lo, hi = confirmed["ci"]
            # a bootstrap over fewer pairs (--quick: one) is no interval at all
            out["resolved"] = (hi < level or lo >= level) if confirmed["n"] >= RESOLVE_PAIRS else None
        if out["pass"] is not None:
            out["judged_on"] = "confirm" if confirmed is not None else "sweep"
        return out

    out: dict = {}
    for batch, rates in results.items():
        row = {}
        plain = rates.get("plain")
        per = (calls or {}).get(batch)

        def pair(num: str, den: str | None, per=per):
            return None if per is None else (per.get(num), per.get(den) if den else None)

        rec = (confirm or {}).get(batch, {})

        def head_to_head(num: str, den: str | None, rec=rec):
            return ratio_of_sums(rec[num], rec[den]) if num in rec and den in rec else None

        for rule in RULES:
            auto = rates.get(f"{rule}_auto") if auto_ok else None
            fixed = {"plain": plain} | {f"{rule}_k{k}": rates.get(f"{rule}_k{k}") for k in ks}
            fixed = {n: v for n, v in fixed.items() if v is not None}
            best = max(fixed, key=fixed.get) if fixed else None
            name = f"{rule}_auto"
            row[f"{rule}_auto_vs_best_fixed"] = bar(
                auto, fixed.get(best), AUTO_VS_BEST, pair(name, best), head_to_head(name, best), best=best
            )
            vs_plain = pair(name, "plain"), head_to_head(name, "plain")
            row[f"{rule}_auto_vs_plain"] = bar(auto, plain, 1.0, *vs_plain)
            if batch == f"batch_{speedup_batch}":
                row[f"{rule}_auto_speedup"] = bar(auto, plain, SPEEDUP_BARS[rule], *vs_plain)
        shapes = [f"k{k}" for k in ks] + ["tree"] + (["auto"] if auto_ok else [])
        for shape in shapes:
            row[f"mars_vs_strict_{shape}"] = bar(
                rates.get(f"mars_{shape}"),
                rates.get(f"strict_{shape}"),
                1.0,
                pair(f"mars_{shape}", f"strict_{shape}"),
                head_to_head(f"mars_{shape}", f"strict_{shape}"),
            )
        out[batch] = row
    verdicts = {f"{batch}.{name}": b["pass"] for batch, row in out.items() for name, b in row.items()}
    out["failed"] = [name for name, ok in verdicts.items() if ok is False]
    # failures whose head-to-head interval lies wholly under the bar: this run resolves them
    out["failed_resolved"] = [
        f"{batch}.{name}"
        for batch, row in out.items()
        if batch.startswith("batch_")
        for name, b in row.items()
        if b["pass"] is False and b.get("resolved")
    ]
    out["all_pass"] = None if None in verdicts.values() else not out["failed"]
    return out


def noise_floor(
    results: dict[str, dict],
    calls: dict[str, dict[str, list[float]]],
    confirm: dict[str, dict[str, list[tuple[float, float]]]] | None = None,
) -> dict:
    """The A/A control at each B: two identical plain engines, ``plain_control`` / ``plain``, as the
    ratio of medians and paired per call (as a bar's), and in the head-to-head as a bar's ``confirm``.
    Both run the same code on the same prompts and seeds, so the true ratio is 1: how far it lands from
    1 is how far this run's timing alone moves a bar, and a bar that misses by less cannot be told from
    a pass by this run."""
    out = {}
    for batch, rates in results.items():
        a, b = rates.get("plain_control"), rates.get("plain")
        per = calls.get(batch, {})
        x, y = per.get("plain_control"), per.get("plain")
        ratios = [u / v for u, v in zip(x, y, strict=True) if v] if x and y else []
        rec = (confirm or {}).get(batch, {})
        out[batch] = {
            "plain_control_vs_plain": round(a / b, 4) if a and b else None,
            "paired": spread(ratios) if ratios else None,
            "confirm": ratio_of_sums(rec["plain_control"], rec["plain"]) if "plain_control" in rec else None,
        }
    return out


def confirm_systems(rates: dict[str, float], ks: list[int], auto_ok: bool) -> list[str]:
    """The head-to-head's systems at one B, from the sweep's median tokens/s: plain and its A/A control,
    and for each rule its adaptive mode and the best of plain and its fixed K (the systems of the
    auto bars and of mars >= strict for auto).  Empty without the adaptive mode."""
    if not auto_ok:
        return []
    names = ["plain", "plain_control"]
    for rule in RULES:
        fixed = [n for n in (f"{rule}_k{k}" for k in ks) if rates.get(n) is not None]
        best = max(fixed, key=rates.get, default=None)
        if best is not None and rates[best] > rates["plain"]:
            names.append(best)
        names.append(f"{rule}_auto")
    return names


def close_calls(rates: dict[str, float], shapes: list[str], margin: float) -> list[str]:
    """The mars >= strict pairs the sweep does not pass clearly: the shapes ("k1", ..., "tree"), in
    order, whose sweep ratio mars / strict of median tokens/s is under ``1 + margin`` (a sweep failure
    or a near pass).  Both systems of such a pair join the head-to-head, so its bar is judged on the
    head-to-head's many calls instead of the sweep's few (at B = 8 the sweep's A/A control has read a
    paired IQR of 0.155 over its 6 calls, and a mars / strict K=1 of 0.86 at near-equal tau); a pair
    above ``1 + margin`` keeps the sweep's pass (margin -1: none)."""
    out = []
    for shape in shapes:
        m, s = rates.get(f"mars_{shape}"), rates.get(f"strict_{shape}")
        if m is not None and s and m / s < 1 + margin:
            out.append(shape)
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="default", choices=sorted(PRESETS))
    ap.add_argument("--world", type=Path, default=None, help="a built world's folder (default: the preset's)")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 128], help="sequences per call")
    ap.add_argument("--group", type=int, default=8, help="completions per prompt where B >= group")
    ap.add_argument(
        "--calls",
        type=int,
        default=None,
        help="engine calls per measurement, each on other prompts (default: enough for --min-tokens)",
    )
    ap.add_argument(
        "--min-tokens",
        type=int,
        default=2048,
        help="where --calls is not given, a measurement makes enough calls for B x new tokens x calls to "
        "reach this, 2 to 16 (--quick: 1): 16 calls of one prompt at B = 1, two at B = 128 "
        "(one prompt's 128 tokens at B = 1 is a handful of rounds: its sampling noise would decide the "
        "comparison)",
    )
    ap.add_argument(
        "--confirm-calls",
        type=int,
        default=None,
        help="head-to-head calls at each B after the sweep (0: none; default: enough for "
        "--confirm-tokens, 8 to 48; --quick: 1): plain, its A/A control, each rule's auto and its best "
        "fixed system by the sweep, interleaved call by call on fresh prompts; the auto bars judge it",
    )
    ap.add_argument(
        "--confirm-tokens",
        type=int,
        default=262144,
        help="where --confirm-calls is not given, B x new tokens x calls reaches this (the default gives 48 "
        "calls at B = 1, 8 and 32 and 16 at B = 128 with 128 new tokens; fewer calls leave the auto bars' "
        "intervals wider than the margins they judge: docs/benchmarks.md#benchscalepy)",
    )
    ap.add_argument(
        "--confirm-margin",
        type=float,
        default=0.06,
        help="a mars >= strict pair (a fixed K or the tree) whose sweep ratio is under 1 + this (every "
        "sweep failure and near pass) joins the head-to-head, which then judges its bar (-1: none; the "
        "margin is about the spread of the sweep's own A/A control: docs/benchmarks.md#benchscalepy)",
    )
    ap.add_argument("--ks", type=int, nargs="+", default=[1, 3, 5, 7], help="fixed chain lengths")
    ap.add_argument("--tree", type=int, nargs=3, default=[4, 5, 24], metavar=("TOP_K", "DEPTH", "TOTAL"))
    ap.add_argument("--theta", type=float, default=0.9)
    ap.add_argument("--new-tokens", type=int, default=None, help="default: the world's max_new_tokens")
    ap.add_argument("--repeats", type=int, default=None, help="interleaved repeats (default 3, --quick 1)")
    ap.add_argument("--min-seconds", type=float, default=0.0, help="least timed span of one measurement")
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    ap.add_argument("--quick", action="store_true", help="one repeat and one call of each system")
    ap.add_argument(
        "--calibration-context",
        type=int,
        default=None,
        help="measure the adaptive cost model on random prompts of this many tokens (default: on the "
        "run's own prompts; tests: short)",
    )
    args = ap.parse_args(argv)
    repeats = args.repeats or (1 if args.quick else 3)
    for b in args.batches:
        if b >= args.group and b % args.group:
            ap.error(f"--batches: {b} is not a multiple of --group {args.group}")
    torch.set_num_threads(args.threads)

    def log(msg: str) -> None:
        print(f"[scale] {msg}", file=sys.stderr, flush=True)

    with contextlib.redirect_stdout(sys.stderr):  # stdout carries only the JSON
        path = args.world or build_tinyworld(args.preset, progress=False)
        target, tok, head, _ = load_tinyworld(path)
    cfg = PRESETS[args.preset]
    n_new = args.new_tokens or cfg.max_new_tokens
    eos, pad = tok.eos_token_id, tok.pad_token_id
    max_batch = max(args.batches)

    def n_calls(batch: int) -> int:
        if args.calls:
            return args.calls
        return 1 if args.quick else min(16, max(2, math.ceil(args.min_tokens / (batch * n_new))))

    def n_confirm(batch: int) -> int:
        if args.confirm_calls is not None:
            return args.confirm_calls
        return 1 if args.quick else min(48, max(8, math.ceil(args.confirm_tokens / (batch * n_new))))

    n_prompts = max(
        max(n_calls(b), n_confirm(b)) * (b // args.group if b >= args.group else b) for b in args.batches
    )
    prompts = [chat_prompt_ids(tok, p["question"]) for p in heldout_problems(cfg, n_prompts)]
    profile = option_supported(EngineConfig, profile=True)
    cfgs, auto_ok = engine_configs(args, max_batch, profile)
    engines = {
        name: SpeculativeEngine(target, None if name.startswith("plain") else head, c)
        for name, c in cfgs.items()
    }
    calibration = calibrated = None
    autos = [eng for name, eng in engines.items() if name.endswith("_auto")]
    if autos and hasattr(autos[0], "calibrate"):
        # the cost model depends on the models only, not the rule: measured once, shared
        start = time.perf_counter()
        # on the run's own prompts (as an engine's first call does), or random ones of a given length
        if args.calibration_context is not None:
            kw = {"context": args.calibration_context}
        else:  # an older engine's calibrate takes no prompts
            kw = {"prompts": prompts} if "prompts" in inspect.signature(autos[0].calibrate).parameters else {}
        model = autos[0].calibrate(**kw)
        calibration = round(time.perf_counter() - start, 3)
        calibrated = model.to_dict() if hasattr(model, "to_dict") else None
        for eng in autos:
            eng.cost_model = model
        log(f"auto: cost model measured in {calibration} s (shared by {len(autos)} engines)")
    systems = ["hf_generate", *engines]

    def shape(batch: int, call: int = 0) -> tuple[list[list[int]], int]:
        """The prompts of one measured call: ``--calls`` calls per measurement take disjoint slices."""
        g = args.group if batch >= args.group else 1
        n = batch // g
        return prompts[call * n : (call + 1) * n], g

    def one_call(batch: int, name: str, rep: int, c: int) -> tuple[int, dict]:
        """Call c of a measurement: (tokens generated, the engine's stats of the call)."""
        group_prompts, g = shape(batch, c)
        if name == "hf_generate":
            rows = [p for p in group_prompts for _ in range(g)]
            return hf_sample(target, rows, pad, eos, n_new, rep), {}
        eng = engines[name]
        sp = SamplingParams(temperature=1.0, max_new_tokens=n_new, eos_token_id=eos, n=g, seed=rep)
        trajs = eng.generate(group_prompts, sp)
        return sum(len(t.completion_ids) for t in trajs), dict(eng.stats)

    def measure(batch: int, rep: int) -> dict[str, dict]:
        """One repeat of every system at this B, interleaved call by call: call c of every system runs
        before call c + 1 of any (the order rotated each call), so a slow spell of a shared machine,
        which lasts seconds, falls on all systems alike instead of on the one that happened to run.  A
        system's figure is its tokens over its seconds summed over the calls; its breakdown and K
        figures are its last call's."""
        acc = {name: {"wall": 0.0, "tokens": 0, "timed": 0, "stats": {}, "per_call": []} for name in systems}
        for c in range(n_calls(batch)):
            shift = (rep * n_calls(batch) + c) % len(systems)
            for name in systems[shift:] + systems[:shift]:
                last: dict = {}

                def call(name=name, last=last, c=c) -> int:
                    made, stats = one_call(batch, name, rep, c)
                    last.update(stats)
                    return made

                wall, tokens, calls = timed(call, args.min_seconds)
                a = acc[name]
                a["wall"] += wall
                a["tokens"] += tokens
                a["timed"] += calls
                a["stats"] = last
                a["per_call"].append(tokens / wall)
        runs = {}
        for name, a in acc.items():
            rate = a["tokens"] / a["wall"]
            log(f"B={batch} rep={rep} {name}: {rate:.0f} tok/s ({a['timed']} call(s), {a['wall']:.2f} s)")
            runs[name] = {
                "wall_s": a["wall"] / a["timed"],
                "tokens_per_s": rate,
                "stats": a["stats"],
                "per_call": a["per_call"],
            }
        return runs

    def head_to_head(batch: int, names: list[str]) -> tuple[dict[str, list], dict[str, list[int]]]:
        """After the sweep at this B: ``n_confirm`` calls of each of ``names``, interleaved call by call
        (the order rotated each call) on prompts and seeds the sweep did not use (seed = repeats + call):
        {system: [(tokens, seconds) of each call]}, and the K the auto systems drafted, pooled."""
        rec: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
        drafted: dict[str, list[int]] = {name: [] for name in names if name.endswith("_auto")}
        for c in range(n_confirm(batch)):
            shift = c % len(names)
            for name in names[shift:] + names[:shift]:
                start = time.perf_counter()
                made, stats = one_call(batch, name, repeats + c, c)
                rec[name].append((made, time.perf_counter() - start))
                if name in drafted:
                    drafted[name] += stats.get("k_per_round") or []
            log(f"B={batch} confirm call {c + 1}/{n_confirm(batch)}")
        return rec, drafted

    out: dict = {
        "bench": "scale",
        "preset": args.preset,
        "path": str(path),
        "threads": torch.get_num_threads(),
        "new_tokens": n_new,
        "temperature": 1.0,
        "group": args.group,
        "ks": args.ks,
        "tree": dict(zip(("top_k", "depth", "total_tokens"), args.tree, strict=True)),
        "theta": args.theta,
        "repeats": repeats,
        "min_seconds": args.min_seconds,
        "profile": profile,
        "auto_supported": auto_ok,
        "auto_max_draft_tokens": max(args.ks) if auto_ok else None,
        "calibration_s": calibration,
        # the shared cost model as calibrated and after every call's rounds were folded in (seconds)
        "cost_model": {
            "calibrated": calibrated,
            "final": None,  # filled in after the last call
        },
        "results": {},
    }
    medians: dict[str, dict[str, float]] = {}
    per_call: dict[str, dict[str, list[float]]] = {}
    confirm: dict[str, dict[str, list[tuple[float, float]]]] = {}
    for batch in args.batches:
        engines["plain"].generate(shape(batch)[0][:1], SamplingParams(max_new_tokens=4, eos_token_id=eos))
        runs: dict[str, list] = {name: [] for name in systems}
        for rep in range(repeats):
            for name, r in measure(batch, rep).items():
                runs[name].append(r)
        group_prompts, g = shape(batch)
        rows: dict[str, dict] = {}
        for name, rs in runs.items():
            rates = [r["tokens_per_s"] for r in rs]
            mid = sorted(rs, key=lambda r: r["wall_s"])[len(rs) // 2]  # the median run's stats
            row = {"tokens_per_s": spread(rates, 1), "wall_s": spread([r["wall_s"] for r in rs])}
            if name != "hf_generate":
                stats = mid["stats"]
                taus = [r["stats"].get("tau") for r in rs if r["stats"].get("tau") is not None]
                row["tau"] = round(statistics.median(taus), 3) if taus else None
                row.update(per_round(stats))
                row["breakdown"] = breakdown(stats)
                row["tail"] = tail(stats.get("trace"), batch, stats.get("wall_seconds", mid["wall_s"]))
            rows[name] = row
        med = {name: row["tokens_per_s"]["median"] for name, row in rows.items()}
        for name, row in rows.items():
            row["ratio_to_marsrl_plain"] = round(med[name] / med["plain"], 3)
            row["ratio_to_hf_generate"] = round(med[name] / med["hf_generate"], 3)
        medians[f"batch_{batch}"] = med
        # every system's calls in one order (repeat, then call): index i is one sweep's call for all
        per_call[f"batch_{batch}"] = {n: [x for r in rs for x in r["per_call"]] for n, rs in runs.items()}
        out["results"][f"batch_{batch}"] = {
            "prompts": len(group_prompts),
            "calls": n_calls(batch),
            "group": g,
            "systems": rows,
            "confirm": None,
        }
        names = confirm_systems(med, args.ks, auto_ok) if n_confirm(batch) else []
        shapes = [f"k{k}" for k in args.ks] + ["tree"]
        close = close_calls(med, shapes, args.confirm_margin) if n_confirm(batch) else []
        names += [n for shape in close for n in (f"strict_{shape}", f"mars_{shape}") if n not in names]
        if names:
            rec, drafted = head_to_head(batch, names)
            confirm[f"batch_{batch}"] = rec
            out["results"][f"batch_{batch}"]["confirm"] = {
                "calls": n_confirm(batch),
                "tokens_per_s": {
                    n: round(sum(t for t, _ in r) / sum(x for _, x in r), 1) for n, r in rec.items()
                },
                "k_per_round": {n: k_summary(ks) for n, ks in drafted.items()},
                "close_calls": close,
                # every call as (tokens, seconds), in call order: what bench/pool_scale.py pools over runs
                "pairs": {n: [[t, x] for t, x in r] for n, r in rec.items()},
            }

    top = f"batch_{max_batch}"
    out["tail"] = {
        "batch": max_batch,
        "finished": 0.9,
        **{name: row.get("tail") for name, row in out["results"][top]["systems"].items() if name in engines},
    }
    out["summary"] = {
        batch: {
            name: {
                "tokens_per_s": row["tokens_per_s"]["median"],
                "vs_plain": row["ratio_to_marsrl_plain"],
                "vs_hf": row["ratio_to_hf_generate"],
                "tau": row.get("tau"),
            }
            for name, row in res["systems"].items()
        }
        for batch, res in out["results"].items()
    }
    if calibrated:
        out["cost_model"]["final"] = autos[0].cost_model.to_dict()
    # each auto engine's SpeedCheck after its last call (measured over predicted seconds by kind)
    out["speed_check"] = {n: e.stats.get("speed_check") for n, e in engines.items() if n.endswith("_auto")}
    out["bars"] = compute_bars(medians, args.ks, auto_ok, calls=per_call, confirm=confirm)
    out["noise_floor"] = noise_floor(medians, per_call, confirm)
    json.dump(out, sys.stdout, indent=2)
    print()
    return out


if __name__ == "__main__":
    main()
