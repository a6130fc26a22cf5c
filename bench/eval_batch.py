"""The held-out evaluation's cost against its batch size, and whether the batch size changes any result.

The main job evaluates every arm on ``data.n_eval`` problems at T = 1 and greedy several times a run
(``marsrl.experiment.evaluate.evaluate_policy``: plain decoding with the policy, ``eval.batch_size``
sequences at a time). This bench runs that evaluation on the world's SFT policy at each ``--batch-sizes``
value, ``--repeats`` times interleaved (the order rotated each repeat), and prints one JSON: per batch
size the median seconds and their spread, the ratio of each median to the first batch size's, the
accuracies, and whether greedy decoding scored exactly the same problems right at every batch size and
repeat. T = 1 draws come from one generator per call, consumed batch by batch, so another batch size
draws other samples: its accuracy is another estimate of the same quantity, not the same numbers (a
repeat at the same batch size repeats them exactly: ``t1_repeatable``).

    python -m bench.eval_batch                                   # 500 problems, batch 128 vs 512, 3 repeats
    python -m bench.eval_batch --preset micro --n 32 --batch-sizes 8 32 --repeats 2   # a quick look
"""

from __future__ import annotations

import argparse
import os
import statistics

os.environ.setdefault("OMP_NUM_THREADS", "1")

from bench._common import clock, emit, interleaved, spread


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="default", help="tiny-world preset (default: default; micro)")
    parser.add_argument("--n", type=int, default=500, help="held-out problems (the main job's data.n_eval)")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[128, 512])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    args = parser.parse_args(argv)

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from marsrl.experiment.config import DataConfig, ExperimentConfig
    from marsrl.experiment.evaluate import evaluate_policy, render_prompts
    from marsrl.experiment.run import load_data
    from marsrl.tinyworld import build_tinyworld

    world = build_tinyworld(args.preset, progress=False)
    model = AutoModelForCausalLM.from_pretrained(world / "target").eval()
    tokenizer = AutoTokenizer.from_pretrained(world / "target")
    _, problems = load_data(ExperimentConfig(data=DataConfig(n_eval=args.n)), args.preset)  # the main job's
    prompts = render_prompts(tokenizer, problems)
    temperatures = {"t1": 1.0, "greedy": 0.0}

    def measure(batch_size, _rep):
        seconds, out = clock(
            lambda: evaluate_policy(
                model,
                tokenizer,
                problems,
                temperatures=temperatures,
                max_new_tokens=args.max_new_tokens,
                batch_size=batch_size,
                seed=0,
                prompts=prompts,
            )
        )
        return seconds, {name: out[name]["correct"] for name in temperatures}

    runs = interleaved(args.batch_sizes, args.repeats, measure)
    first = runs[args.batch_sizes[0]][0][1]
    base = statistics.median(s for s, _ in runs[args.batch_sizes[0]])
    result = {
        "world": args.preset,
        "n": args.n,
        "threads": torch.get_num_threads(),
        "repeats": args.repeats,
        "batch_sizes": {
            str(b): {
                "seconds": spread([s for s, _ in runs[b]]),
                "vs_first": round(statistics.median(s for s, _ in runs[b]) / base, 4),
                "accuracy": {k: sum(v) / len(v) for k, v in runs[b][0][1].items()},
            }
            for b in args.batch_sizes
        },
        "greedy_identical": all(r["greedy"] == first["greedy"] for b in args.batch_sizes for _, r in runs[b]),
        "t1_repeatable": all(r["t1"] == runs[b][0][1]["t1"] for b in args.batch_sizes for _, r in runs[b]),
    }
    return emit(result)


if __name__ == "__main__":
    main()
