"""Engine throughput side by side in one run: HF ``generate``, HF assisted generation (batch 1, its
limit), marsrl plain, marsrl strict / mars with an EAGLE-3 head (chain and tree), and a test-only oracle
drafter that replays the target's greedy continuation (the engine's ceiling).

    python -m bench.engine                       # Qwen3-architecture target of ~20M params, random weights
    python -m bench.engine --new-tokens 32 --batch-sizes 1

The EAGLE-3 head here is random (no world is built), so its acceptance is near
zero: those rows measure overhead, not speedup.  Prints one JSON object; read the ratios.

Built for a noisy shared machine: one torch thread by default (--threads), each measurement repeats its
call until at least --min-seconds have passed, the systems run --repeats times in an order rotated each
repeat, and every figure is the median over repeats with its spread (min / max / IQR of tokens/s in
``tokens_per_s_spread``); each ratio divides two medians of the same run, and
``paired_ratio_to_hf_generate`` is the spread of the per-repeat ratios (repeat i of both systems ran in
one sweep).  ``--only hf_generate marsrl_plain`` times the plain path alone.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import torch
from transformers import AutoModelForCausalLM, Qwen3Config

from bench._common import interleaved, spread, timed
from marsrl.drafter import Eagle3Drafter
from marsrl.engine import EngineConfig, OracleDrafter, SamplingParams, SpeculativeEngine, TreeConfig
from marsrl.verify import Provenance

SYSTEMS = (
    "hf_generate",
    "hf_assisted",  # batch 1 only
    "marsrl_plain",
    *(
        f"marsrl_{rule}_{kind}"
        for rule in ("strict", "mars")
        for kind in ("chain_eagle_random", "tree_eagle_random", "chain_oracle")
    ),
    "marsrl_strict_chain_oracle_greedy",
)


def build_target(seed: int, layers: int = 8, hidden: int = 384, vocab: int = 8192):
    torch.manual_seed(seed)
    cfg = Qwen3Config(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=1024,
        num_hidden_layers=layers,
        num_attention_heads=6,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=4096,
        eos_token_id=None,
        bos_token_id=None,
        pad_token_id=None,
    )
    model = AutoModelForCausalLM.from_config(cfg).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(4.0)  # a peakier random model, closer to a trained one's entropy
    return model


def per_position_acceptance(trajs, k: int) -> list[float]:
    """P(draft j accepted | drafts < j accepted), over the rounds (the prefill's token is skipped)."""
    reached = [0] * k
    accepted = [0] * k
    for t in trajs:
        for j, prov in zip(t.draft_position[1:], t.provenance[1:], strict=True):
            if j < k:
                reached[j] += 1
                accepted[j] += prov in (Provenance.ACCEPTED, Provenance.RELAXED)
    return [round(a / r, 4) if r else None for a, r in zip(accepted, reached, strict=True)]


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--k", type=int, default=7, help="chain draft length")
    ap.add_argument("--tree", type=int, nargs=3, default=[4, 5, 24], metavar=("TOP_K", "DEPTH", "TOTAL"))
    ap.add_argument("--theta", type=float, default=0.9)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=5, help="interleaved repeats; medians are kept")
    ap.add_argument(
        "--min-seconds", type=float, default=1.0, help="each measurement repeats its call for at least this"
    )
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    ap.add_argument(
        "--only",
        nargs="+",
        metavar="SYSTEM",
        help="run just these systems (e.g. hf_generate marsrl_plain: the plain-path bar, in less time "
        "for more repeats); hf_generate is always run, every ratio is to it",
    )
    args = ap.parse_args(argv)
    unknown = sorted(set(args.only or ()) - set(SYSTEMS))
    if unknown:
        ap.error(f"--only: unknown system(s) {unknown}; known: {list(SYSTEMS)}")
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)

    target = build_target(args.seed)
    assistant = build_target(args.seed + 1, layers=2, hidden=128)
    head = Eagle3Drafter.from_target(target)
    prompt = torch.randint(0, target.config.vocab_size, (args.prompt_len,)).tolist()
    n_new = args.new_tokens
    oracle = OracleDrafter.from_target(target, [prompt], n_new + args.k + 2)
    tree = TreeConfig(*args.tree)
    out: dict = {
        "bench": "engine",
        "target_params_M": round(sum(p.numel() for p in target.parameters()) / 1e6, 1),
        "new_tokens": n_new,
        "prompt_len": args.prompt_len,
        "threads": torch.get_num_threads(),
        "repeats": args.repeats,
        "min_seconds": args.min_seconds,
        "k": args.k,
        "tree": dict(top_k=tree.top_k, depth=tree.depth, total_tokens=tree.total_tokens),
        "results": {},
    }

    def hf(batch: int, assisted: bool) -> dict:
        ids = torch.tensor([prompt] * batch)
        kw = dict(
            do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=n_new, min_new_tokens=n_new
        )
        if assisted:
            kw["assistant_model"] = assistant

        def call() -> int:
            with torch.inference_mode():
                target.generate(ids, attention_mask=torch.ones_like(ids), pad_token_id=0, **kw)
            return batch * n_new

        wall, tokens, calls = timed(call, args.min_seconds)
        return {"tokens_per_s": tokens / wall, "wall_s": wall / calls}

    def ours(batch: int, drafter, cfg: EngineConfig, temperature: float = 1.0) -> dict:
        eng = SpeculativeEngine(target, drafter, cfg)
        sp = SamplingParams(temperature=temperature, max_new_tokens=n_new, n=batch, seed=args.seed)
        last = {}

        def call() -> int:
            last["trajs"] = trajs = eng.generate([prompt], sp)
            return sum(len(t.completion_ids) for t in trajs)

        wall, tokens, calls = timed(call, args.min_seconds)
        res = {"tokens_per_s": tokens / wall, "wall_s": wall / calls, "tau": eng.stats["tau"]}
        if drafter is not None:
            k = cfg.tree.depth + 1 if cfg.tree else cfg.num_draft_tokens
            res["acceptance_by_position"] = per_position_acceptance(last["trajs"], k)
            res["relaxed_frac"] = eng.stats["relaxed"] / max(eng.stats["tokens"], 1)
        return res

    for batch in args.batch_sizes:
        one_batch = dict(max_batch_size=max(batch, EngineConfig().max_batch_size))  # one engine batch
        cases = {"hf_generate": lambda b=batch: hf(b, assisted=False)}
        if batch == 1:
            cases["hf_assisted"] = lambda b=batch: hf(b, assisted=True)
        plain_cfg = EngineConfig(**one_batch)
        cases["marsrl_plain"] = lambda b=batch, c=plain_cfg: ours(b, None, c)
        for rule in ("strict", "mars"):
            chain = EngineConfig(rule=rule, theta=args.theta, num_draft_tokens=args.k, **one_batch)
            tree_cfg = EngineConfig(rule=rule, theta=args.theta, tree=tree, **one_batch)
            cases[f"marsrl_{rule}_chain_eagle_random"] = lambda b=batch, c=chain: ours(b, head, c)
            cases[f"marsrl_{rule}_tree_eagle_random"] = lambda b=batch, c=tree_cfg: ours(b, head, c)
            cases[f"marsrl_{rule}_chain_oracle"] = lambda b=batch, c=chain: ours(b, oracle, c)
        greedy = EngineConfig(num_draft_tokens=args.k, **one_batch)
        cases["marsrl_strict_chain_oracle_greedy"] = lambda b=batch, c=greedy: ours(
            b, oracle, c, temperature=0.0
        )
        assert set(cases) <= set(SYSTEMS), sorted(set(cases) - set(SYSTEMS))
        if args.only:
            cases = {n: c for n, c in cases.items() if n in {"hf_generate", "marsrl_plain", *args.only}}
        cases["marsrl_plain"]()  # warm-up (allocator, kernels)
        runs = interleaved(list(cases), args.repeats, lambda name, _rep, c=cases: c[name]())
        res = {}
        for name, rs in runs.items():
            rates = [r["tokens_per_s"] for r in rs]
            row = dict(sorted(rs, key=lambda r: r["tokens_per_s"])[len(rs) // 2])  # the median run's extras
            row["tokens_per_s"] = statistics.median(rates)
            row["wall_s"] = statistics.median(r["wall_s"] for r in rs)
            row["tokens_per_s_spread"] = spread(rates, 1)
            res[name] = row
        base = res["hf_generate"]["tokens_per_s"]
        plain = res["marsrl_plain"]["tokens_per_s"]
        for name, r in res.items():
            # repeat i of every system ran in one sweep: the per-repeat ratio cancels a slow spell
            # that lasted the sweep, where the ratio of two medians does not
            hf_runs = runs["hf_generate"]
            pairs = [a["tokens_per_s"] / h["tokens_per_s"] for a, h in zip(runs[name], hf_runs, strict=True)]
            r["paired_ratio_to_hf_generate"] = spread(pairs, 3)
            r["ratio_to_hf_generate"] = round(r["tokens_per_s"] / base, 3)
            r["ratio_to_marsrl_plain"] = round(r["tokens_per_s"] / plain, 3)
            r["tokens_per_s"] = round(r["tokens_per_s"], 1)
            r["wall_s"] = round(r["wall_s"], 3)
        out["results"][f"batch_{batch}"] = res
    json.dump(out, sys.stdout, indent=2)
    print()
    return out


if __name__ == "__main__":
    main()
