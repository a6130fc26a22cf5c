"""Engine throughput side by side in one run: HF ``generate``, HF assisted generation (batch 1, its
limit), marsrl plain, marsrl strict / mars with an EAGLE-3 head (chain and tree), and a test-only oracle
drafter that replays the target's greedy continuation (the engine's ceiling).

    python bench/engine.py                       # Qwen3-architecture target of ~20M params, random weights
    python bench/engine.py --new-tokens 32 --batch-sizes 1

Until a trained head exists (the tiny-world issue) the EAGLE-3 head is random, so its acceptance is near
zero: those rows measure overhead, not speedup.  Prints one JSON object; read the ratios.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch
from transformers import AutoModelForCausalLM, Qwen3Config

from marsrl.drafter import Eagle3Drafter
from marsrl.engine import EngineConfig, OracleDrafter, SamplingParams, SpeculativeEngine, TreeConfig
from marsrl.verify import Provenance


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
    ap.add_argument(
        "--repeats", type=int, default=3, help="interleaved repeats; the median wall time is kept"
    )
    args = ap.parse_args(argv)
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
        start = time.perf_counter()
        with torch.inference_mode():
            target.generate(ids, attention_mask=torch.ones_like(ids), pad_token_id=0, **kw)
        wall = time.perf_counter() - start
        return {"tokens_per_s": batch * n_new / wall, "wall_s": wall}

    def ours(batch: int, drafter, cfg: EngineConfig, temperature: float = 1.0) -> dict:
        eng = SpeculativeEngine(target, drafter, cfg)
        sp = SamplingParams(temperature=temperature, max_new_tokens=n_new, n=batch, seed=args.seed)
        start = time.perf_counter()
        trajs = eng.generate([prompt], sp)
        wall = time.perf_counter() - start
        toks = sum(len(t.completion_ids) for t in trajs)
        res = {"tokens_per_s": toks / wall, "wall_s": wall, "tau": eng.stats["tau"]}
        if drafter is not None:
            k = cfg.tree.depth + 1 if cfg.tree else cfg.num_draft_tokens
            res["acceptance_by_position"] = per_position_acceptance(trajs, k)
            res["relaxed_frac"] = eng.stats["relaxed"] / max(eng.stats["tokens"], 1)
        return res

    for batch in args.batch_sizes:
        cases = {"hf_generate": lambda b=batch: hf(b, assisted=False)}
        if batch == 1:
            cases["hf_assisted"] = lambda b=batch: hf(b, assisted=True)
        cases["marsrl_plain"] = lambda b=batch: ours(b, None, EngineConfig())
        for rule in ("strict", "mars"):
            chain = EngineConfig(rule=rule, theta=args.theta, num_draft_tokens=args.k)
            tree_cfg = EngineConfig(rule=rule, theta=args.theta, tree=tree)
            cases[f"marsrl_{rule}_chain_eagle_random"] = lambda b=batch, c=chain: ours(b, head, c)
            cases[f"marsrl_{rule}_tree_eagle_random"] = lambda b=batch, c=tree_cfg: ours(b, head, c)
            cases[f"marsrl_{rule}_chain_oracle"] = lambda b=batch, c=chain: ours(b, oracle, c)
        greedy = EngineConfig(num_draft_tokens=args.k)
        cases["marsrl_strict_chain_oracle_greedy"] = lambda b=batch, c=greedy: ours(
            b, oracle, c, temperature=0.0
        )
        cases["marsrl_plain"]()  # warm-up (allocator, kernels)
        runs: dict[str, list[dict]] = {name: [] for name in cases}
        for _ in range(args.repeats):
            for name, fn in cases.items():
                runs[name].append(fn())
        res = {}
        for name, rs in runs.items():
            rs = sorted(rs, key=lambda r: r["wall_s"])
            res[name] = rs[len(rs) // 2]
        base = res["hf_generate"]["tokens_per_s"]
        plain = res["marsrl_plain"]["tokens_per_s"]
        for r in res.values():
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
