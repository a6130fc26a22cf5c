"""Cost of ``verify_chain`` per rule, as a ratio to one ``torch.softmax`` over the same target logits.

Measured side by side in one process with the bench harness (one warm-up call each, then every case
once a repeat in rotated order), reporting the median time per case; ratios are what to read (a shared
machine is noisy), ``ratio_intervals`` gives each with a 90% bootstrap interval over the repeats.

    python -m bench.verify                  # B=64, K=8, V=151936, T=1, no top-k/top-p
    python -m bench.verify --vocab 32000 --repeats 3

Two draft kinds: a greedy draft (draft_probs=None) and full draft distributions [B, K, V] built to
resemble a trained drafter (a noisy copy of the target).  Prints one JSON object.
"""

from __future__ import annotations

import argparse

import torch

from bench._common import compare, emit
from marsrl.verify import RULES, verify_chain


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--draft-len", type=int, default=8, help="K")
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    gen = torch.Generator().manual_seed(args.seed)
    b, k, v = args.batch, args.draft_len, args.vocab
    # LLM-like logits: a heavy head over a flat tail, with frequent near-ties between the top two
    logits = torch.randn(b, k + 1, v, generator=gen) * 2.0
    logits[..., :64] += 12.0 + 3 * torch.randn(b, k + 1, 64, generator=gen)
    draft_logits = logits[:, :k] + torch.randn(b, k, v, generator=gen)
    draft_probs = torch.softmax(draft_logits / max(args.temperature, 1e-6), dim=-1)
    draft_tokens = torch.multinomial(draft_probs.view(-1, v), 1, generator=gen).view(b, k)
    greedy_tokens = draft_logits.argmax(-1)

    cases = {"softmax": lambda: torch.softmax(logits, dim=-1)}
    for rule in RULES:
        cases[f"{rule}/greedy_draft"] = lambda r=rule: verify_chain(
            logits, greedy_tokens, rule=r, temperature=args.temperature, generator=gen
        )
        cases[f"{rule}/full_draft"] = lambda r=rule: verify_chain(
            logits, draft_tokens, draft_probs, rule=r, temperature=args.temperature, generator=gen
        )
    timings = compare(cases, args.repeats, warmup=1)
    base = timings.median("softmax")
    rules = [n for n in cases if n != "softmax"]
    out = {
        "bench": "verify_chain",
        "shape": {"B": b, "K": k, "V": v},
        "temperature": args.temperature,
        "threads": torch.get_num_threads(),
        "repeats": args.repeats,
        "softmax_ms": round(base * 1e3, 2),
        "ratio_to_softmax": {n: round(timings.median(n) / base, 3) for n in rules},
        "ratio_intervals": {n: timings.ratio(n, "softmax", digits=3) for n in rules},
        "bar": 3.0,
    }
    out["all_within_bar"] = all(r <= out["bar"] for r in out["ratio_to_softmax"].values())
    return emit(out)


if __name__ == "__main__":
    main()
