"""Which GRPO settings make the tiny world's policy learn: a measured sweep of the strict arm.

Each configuration is ``configs/grpo_tiny.yaml`` (or ``--config``) plus its overrides, trained as the
strict arm of ``marsrl train`` (``run.run_arm``: the main job's own code path, checkpoints and samples
included; the rollout worker in-process, whose trajectories equal a Ray actor's; wandb off) with its
held-out evaluation: accuracy at T = 1 (the rollout temperature GRPO optimises) and greedy on ``data.n_eval``
problems, the same problems and sampling seed for every configuration, before training, every
``eval.every`` steps and after. The after-vs-before comparison is paired over problems (exact McNemar
p, paired-bootstrap 95% interval of the difference; see evaluate.py). The policy before training is
the same for every configuration of a world, so its evaluation (``eval_before.json``) is offered to the
next run, which takes it only where it was made with the same model, problems and settings.

    python -m bench.sweep --probe                       # the SFT policy's T = 1 pass rate per problem
    python -m bench.sweep --runs base lr1e-3            # named configurations (RUNS below)
    python -m bench.sweep --runs base --set trainer.max_steps=10   # extra overrides on every run
    python -m bench.sweep --list                        # the named configurations
    python -m bench.sweep --baseline                    # the SFT pass rate on each training step's prompts

``--probe`` samples G completions of ``--probe-prompts`` training prompts at T = 1 and reports how many
groups have mixed rewards (GRPO learns only from those: a group that is all right or all wrong has zero
advantage). Results are merged into ``--out`` (default bench/results/sweep.json) under ``runs.<name>``
and ``probe`` as each finishes, and the whole file is printed as JSON at the end. Per run: the
overrides, before / after / curve accuracies with intervals, the paired tests, the training reward
(first and last quarter of the steps), seconds of training and of evaluation, the machine's load.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("WANDB_MODE", "disabled")

# name -> overrides over the config file (``--set`` syntax); the first ones are the learning-rate and
# batch axes, then KL, loss type, completion length, steps
RUNS: dict[str, list[str]] = {
    "base": [],
    "lr5e-5": ["trainer.learning_rate=5.0e-5"],
    "lr1e-4": ["trainer.learning_rate=1.0e-4"],
    "lr1e-3": ["trainer.learning_rate=1.0e-3"],
    "lr3e-3": ["trainer.learning_rate=3.0e-3"],
    "lr1e-3_cos": [
        "trainer.learning_rate=1.0e-3",
        "trainer.lr_scheduler_type=cosine",
        "trainer.warmup_steps=2",
    ],
    "lr1e-3_p8g8": ["trainer.learning_rate=1.0e-3", "trainer.per_device_train_batch_size=64"],
    "lr1e-3_p4g16": [
        "trainer.learning_rate=1.0e-3",
        "trainer.per_device_train_batch_size=64",
        "trainer.num_generations=16",
    ],
    "beta0.04": ["trainer.beta=0.04"],
    "p6": ["trainer.per_device_train_batch_size=48"],
    "p12": ["trainer.per_device_train_batch_size=96"],
    "p12_beta0.04": ["trainer.per_device_train_batch_size=96", "trainer.beta=0.04"],
    "lr1e-4_beta0.04_s40": ["trainer.learning_rate=1.0e-4", "trainer.beta=0.04", "trainer.max_steps=40"],
    "lr1e-3_beta0.04": ["trainer.learning_rate=1.0e-3", "trainer.beta=0.04"],
    "lr1e-3_grpo": ["trainer.learning_rate=1.0e-3", "trainer.loss_type=grpo"],
    "lr1e-3_bnpo": ["trainer.learning_rate=1.0e-3", "trainer.loss_type=bnpo"],
    "lr1e-3_len96": ["trainer.learning_rate=1.0e-3", "trainer.max_completion_length=96"],
    "lr1e-3_s40": ["trainer.learning_rate=1.0e-3", "trainer.max_steps=40"],
}

# every run: one strict arm of ``marsrl train`` (``run.run_arm``, the main job's own code path), its
# rollout worker in-process (a Ray actor yields the same trajectories, bit for bit), no wandb
FIXED = [
    "pool_backend=local",
    "wandb.mode=disabled",
]


def _load(config: str, overrides: list[str], out: Path, name: str = "sweep"):
    from marsrl.experiment.config import ArmConfig, load_experiment

    cfg = load_experiment(config, [*FIXED, f"output_dir={out}", f"experiment={name}", *overrides])
    return dataclasses.replace(cfg, arms=(ArmConfig("strict", rule="strict"),))


def _brief(result: dict) -> dict:
    """An evaluate_policy result without the per-problem lists (those stay in the curve files)."""
    return {
        name: ({k: v for k, v in r.items() if k != "correct"} if isinstance(r, dict) else r)
        for name, r in result.items()
    }


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def run_one(name: str, overrides: list[str], config: str, work: Path, befores: list[Path]) -> dict:
    """Train the strict arm of one configuration exactly as ``marsrl train`` does; its figures (see the
    module docstring). ``befores``: the eval_before.json files of earlier runs, offered to this one
    (``run_arm`` takes one only if it was made with the same model, problems and settings)."""
    import shutil

    import torch

    from marsrl.experiment.evaluate import CURVE_FILE
    from marsrl.experiment.run import arm_dir, load_data, resolve_sources, run_arm, seed_root, trainer_args

    cfg = _load(config, overrides, work, name)
    arm = cfg.arms[0]
    t_setup = time.perf_counter()
    sources = resolve_sources(cfg, progress=True)
    data = load_data(cfg, sources.world)
    root = seed_root(cfg)
    root.mkdir(parents=True, exist_ok=True)
    for kept in befores:  # the last one offered wins if several match; run_arm checks the settings
        shutil.copyfile(kept, root / "eval_before.json")
        break
    setup_s = time.perf_counter() - t_setup
    load0 = os.getloadavg()[0]
    started, cpu0 = time.perf_counter(), time.process_time()
    evals = run_arm(cfg, arm, sources, data, resume=False, progress=False)
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu0
    load1 = os.getloadavg()[0]
    if (root / "eval_before.json").is_file():
        befores.insert(0, root / "eval_before.json")
    folder = arm_dir(cfg, arm)
    args = trainer_args(cfg, arm, folder, use_wandb=False)
    steps = [r for r in _jsonl(folder / "metrics.jsonl") if "train/reward" in r]
    rewards = [r["train/reward"] for r in steps]
    q = max(1, len(rewards) // 4)
    curve_rows = _jsonl(folder / CURVE_FILE)
    during = [c for c in curve_rows if c["step"] > 0]
    eval_s = sum(c.get("seconds") or 0.0 for c in during)
    eval_cpu = sum((c.get("results") or {}).get("cpu_seconds") or 0.0 for c in during)
    names = [k for k in evals["before"] if isinstance(evals["before"][k], dict)]
    return {
        "overrides": overrides,
        "steps": len(steps),
        "prompts_per_step": args.per_device_train_batch_size // args.num_generations,
        "G": args.num_generations,
        "before": _brief(evals["before"]),
        "after": _brief(evals["after"]),
        "paired": evals["comparison"],
        "curve": [{"step": c["step"], **{n: c.get(f"{n}_accuracy") for n in names}} for c in curve_rows],
        "reward_per_step": rewards,
        "reward_first_quarter": statistics.fmean(rewards[:q]) if rewards else None,
        "reward_last_quarter": statistics.fmean(rewards[-q:]) if rewards else None,
        "reward_std_mean": _mean(steps, "train/reward_std"),
        "zero_std_frac_mean": _mean(steps, "train/frac_reward_zero_std"),
        "completion_length_mean": _mean(steps, "train/completions/mean_length"),
        "train_and_eval_s": round(wall, 1),
        "eval_during_s": round(eval_s, 1),
        "train_s": round(wall - eval_s, 1),
        "setup_s": round(setup_s, 1),
        # CPU seconds of this process (the trainer and its in-process rollout worker)
        "train_cpu_s": round(cpu - eval_cpu, 1),
        "eval_during_cpu_s": round(eval_cpu, 1),
        "torch_threads": torch.get_num_threads(),
        "step_seconds_median": _median(steps, "train/step_seconds"),
        "loadavg_start_end": [round(load0, 2), round(load1, 2)],
    }


def _mean(rows: list[dict], key: str) -> float | None:
    values = [r[key] for r in rows if isinstance(r.get(key), (int, float))]
    return statistics.fmean(values) if values else None


def _median(rows: list[dict], key: str) -> float | None:
    values = [r[key] for r in rows if isinstance(r.get(key), (int, float))]
    return statistics.median(values) if values else None


def probe(config: str, overrides: list[str], n_prompts: int, work: Path) -> dict:
    """The SFT policy's T = 1 pass rate per training prompt, G completions each (the GRPO signal)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from marsrl.data import score
    from marsrl.engine import EngineConfig, SamplingParams, SpeculativeEngine
    from marsrl.experiment.evaluate import render_prompts
    from marsrl.experiment.run import load_data, resolve_sources, trainer_args

    torch.set_num_threads(1)
    cfg = _load(config, overrides, work)
    sources = resolve_sources(cfg, progress=True)
    ds, _ = load_data(cfg, sources.world)
    args = trainer_args(cfg, cfg.arms[0], work / "probe", use_wandb=False)
    tok = AutoTokenizer.from_pretrained(sources.model)
    model = AutoModelForCausalLM.from_pretrained(sources.model).eval()
    rows = [{"prompt": ds[i]["prompt"], "gold": ds[i]["answer"]} for i in range(min(n_prompts, len(ds)))]
    g = args.num_generations
    started = time.perf_counter()
    engine = SpeculativeEngine(model, None, EngineConfig(max_batch_size=256))
    sp = SamplingParams(
        temperature=args.temperature,
        max_new_tokens=args.max_completion_length,
        eos_token_id=tok.eos_token_id,
        seed=cfg.seed,
        n=g,
    )
    trajs = engine.generate(render_prompts(tok, rows), sp)
    rates = []
    lengths = [len(t.completion_ids) for t in trajs]
    for i, r in enumerate(rows):
        group = trajs[i * g : (i + 1) * g]
        rates.append(
            sum(score(tok.decode(t.completion_ids, skip_special_tokens=True), r["gold"]) for t in group) / g
        )
    hist = {f"{k}/{g}": sum(1 for x in rates if round(x * g) == k) for k in range(g + 1)}
    return {
        "overrides": overrides,
        "prompts": len(rows),
        "G": g,
        "temperature": args.temperature,
        "pass_rate_mean": statistics.fmean(rates),
        "mixed_group_frac": sum(1 for x in rates if 0 < x < 1) / len(rates),
        "pass_count_histogram": hist,
        "completion_length_mean": statistics.fmean(lengths),
        "truncated_frac": sum(n >= args.max_completion_length for n in lengths) / len(lengths),
        "seconds": round(time.perf_counter() - started, 1),
    }


def _line(key: str, r: dict) -> str:
    b, a, p = r["before"], r["after"], r["paired"]
    return (
        f"{key}: t1 {b['t1']['accuracy']:.3f} -> {a['t1']['accuracy']:.3f} (McNemar p "
        f"{p['t1']['p_two_sided']:.2g}), greedy {b['greedy']['accuracy']:.3f} -> "
        f"{a['greedy']['accuracy']:.3f}, {r['train_and_eval_s']:.0f} s"
    )


def baseline(config: str, overrides: list[str], work: Path) -> dict:
    """The SFT policy's T = 1 pass rate on the prompts each training step draws (TRL's RepeatSampler with
    the run's seed, G completions a prompt): how hard each step's prompts are before any training, so a
    run's per-step reward can be read against it (``reward_per_step`` minus this)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl.trainer.grpo_trainer import RepeatSampler

    from marsrl.data import score
    from marsrl.engine import EngineConfig, SamplingParams, SpeculativeEngine
    from marsrl.experiment.evaluate import render_prompts
    from marsrl.experiment.run import load_data, resolve_sources, trainer_args

    torch.set_num_threads(1)
    cfg = _load(config, overrides, work)
    sources = resolve_sources(cfg, progress=True)
    ds, _ = load_data(cfg, sources.world)
    args = trainer_args(cfg, cfg.arms[0], work / "baseline", use_wandb=False)
    g, steps = args.num_generations, args.max_steps
    per = args.per_device_train_batch_size // g
    sampler = RepeatSampler(
        ds, mini_repeat_count=g, batch_size=per, repeat_count=1, shuffle=True, seed=args.seed
    )
    order = list(sampler)[: steps * per * g : g]
    rows = [{"prompt": ds[i]["prompt"], "gold": ds[i]["answer"]} for i in order]
    tok = AutoTokenizer.from_pretrained(sources.model)
    model = AutoModelForCausalLM.from_pretrained(sources.model).eval()
    engine = SpeculativeEngine(model, None, EngineConfig(max_batch_size=256))
    sp = SamplingParams(
        temperature=args.temperature,
        max_new_tokens=args.max_completion_length,
        eos_token_id=tok.eos_token_id,
        seed=cfg.seed + 5,
        n=g,
    )
    trajs = engine.generate(render_prompts(tok, rows), sp)
    golds = [r["gold"] for r in rows for _ in range(g)]
    ok = [
        score(tok.decode(t.completion_ids, skip_special_tokens=True), a)
        for t, a in zip(trajs, golds, strict=True)
    ]
    width = per * g
    return {
        "overrides": overrides,
        "sft_pass_rate_per_step": [statistics.fmean(ok[s * width : (s + 1) * width]) for s in range(steps)],
    }


def _merge(path: Path, update) -> dict:
    data = json.loads(path.read_text()) if path.is_file() else {}
    update(data)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)
    return data


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="configs/grpo_tiny.yaml")
    ap.add_argument("--runs", nargs="*", default=[], help=f"named configurations: {', '.join(RUNS)}")
    ap.add_argument("--set", dest="sets", action="append", default=[], help="an override on every run")
    ap.add_argument("--tag", default="", help="suffix of the result names (e.g. a world variant)")
    ap.add_argument("--probe", action="store_true", help="the SFT policy's per-prompt pass rate at T = 1")
    ap.add_argument("--probe-prompts", type=int, default=128)
    ap.add_argument("--baseline", action="store_true", help="the SFT pass rate on each step's prompts")
    ap.add_argument("--out", default="bench/results/sweep.json")
    ap.add_argument("--list", action="store_true")
    a = ap.parse_args(argv)
    if a.list:
        print(json.dumps(RUNS, indent=2))
        return 0
    unknown = [r for r in a.runs if r not in RUNS]
    if unknown:
        ap.error(f"unknown run(s) {unknown}; one of {list(RUNS)}")
    out = Path(a.out)
    befores: list[Path] = []
    with tempfile.TemporaryDirectory(prefix="marsrl-sweep-") as tmp:
        work = Path(tmp)
        if a.probe:
            result = probe(a.config, a.sets, a.probe_prompts, work)
            _merge(out, lambda d: d.setdefault("probe", {}).__setitem__(a.tag or "base", result))
            print(json.dumps(result), file=sys.stderr)
        if a.baseline:
            result = baseline(a.config, a.sets, work)
            _merge(out, lambda d: d.setdefault("baseline", {}).__setitem__(a.tag or "base", result))
        for name in a.runs:
            result = run_one(name, [*RUNS[name], *a.sets], a.config, work, befores)
            result["config"] = a.config
            key = name + a.tag
            _merge(out, lambda d, key=key, result=result: d.setdefault("runs", {}).__setitem__(key, result))
            print(_line(key, result), file=sys.stderr)
    print(json.dumps(json.loads(out.read_text()) if out.is_file() else {}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
