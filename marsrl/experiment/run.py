"""``marsrl train``: run every arm of an experiment, one after the other, with the same seed, prompts and
everything else; each arm is one MarsGRPOTrainer run that writes its own folder

    outputs/<experiment>/<arm>/
        config.yaml      the resolved config and the arm
        metrics.jsonl    every logged step, keys as they reach wandb (train/...), plus step and wall_s
        samples.jsonl    sample trajectories with their per-token record, per step
        eval.json        held-out accuracy before / after (95% Wilson interval) and tau at the end
        checkpoints/     trainer checkpoints (a marker listing every file's size and SHA-256 is written
                         last; resume loads only a checkpoint that matches its marker)
        wandb_run        the path of the arm's wandb run folder (when wandb ran)

and logs to wandb (``group`` = the experiment, ``job_type`` = the arm, ``name`` = <experiment>-<arm>).

Everything a run can reject (config values, the data file, the sources' names) is checked before the
output folder is made or any model is loaded. ``--resume`` continues each arm from its newest whole
checkpoint; an arm whose checkpoint is at ``max_steps`` is not trained again (only its evaluation runs),
and an arm with its final evaluation written is kept as it is.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ..trainer.checkpoint import CHECKPOINT_COMPLETE as COMPLETE
from ..trainer.checkpoint import check_manifest, checkpoint_step
from .config import TINYWORLD, ArmConfig, ExperimentConfig, dump_experiment
from .timing import AA_SUFFIX, TIMING_FILE, measure, timing_record, whole_rotations, write_timing


class ExperimentError(RuntimeError):
    """A run that cannot go on (names the folder or setting at fault)."""


class Interrupted(Exception):
    """Ctrl-C during an arm: the message says where training stood and how to go on."""

    def __init__(self, arm: str | None, step: int | None):
        where = f"arm {arm}, step {step}" if arm is not None and step is not None else "before training"
        super().__init__(f"interrupted at {where}; continue with --resume")
        self.arm, self.step = arm, step


@dataclass
class Sources:
    model: str  # folder or hub id of the policy
    drafter: str | None
    world: str | None  # tiny-world preset when the sources are the embedded world


# ---------------------------------------------------------------------------------------- sources and data


def resolve_sources(cfg: ExperimentConfig, progress: bool = True, build: bool = True) -> Sources:
    """Folders or hub ids of the model and drafter; ``tinyworld:<preset>`` builds (or reuses) the world,
    or with ``build=False`` only names the folders a build would fill (the dry run)."""
    world = None
    out = {}
    for key in ("model", "drafter"):
        value = getattr(cfg, key)
        if value is not None and value.startswith(TINYWORLD):
            from ..tinyworld import PRESETS, build_tinyworld, world_dir

            preset = value[len(TINYWORLD) :]
            if preset not in PRESETS:
                raise ExperimentError(
                    f"{key}: unknown tiny-world preset {preset!r} (one of {sorted(PRESETS)})"
                )
            if world not in (None, preset):
                raise ExperimentError("model and drafter name different tiny worlds")
            world = preset
            if build:  # the build has the machine to itself: it trains with the trainer's threads
                import torch

                threads = trainer_threads(cfg, torch.get_num_threads())
                folder = build_tinyworld(preset, progress=progress, threads=threads)
            else:
                folder = world_dir(PRESETS[preset])
            value = str(folder / ("target" if key == "model" else "draft"))
        out[key] = value
    return Sources(model=out["model"], drafter=out["drafter"], world=world)


def load_data(cfg: ExperimentConfig, world: str | None):
    """(train Dataset with ``prompt`` (chat messages) and ``answer``; held-out [{question, gold, prompt}])."""
    from datasets import Dataset

    from ..data import generate_problems, load_gsm8k, prompt_messages

    d = cfg.data
    if d.source == "tinyworld":
        from ..tinyworld import PRESETS
        from ..tinyworld.build import heldout_problems

        wcfg = PRESETS[world or "default"]
        n_train = d.n_train or 512
        train = generate_problems(n_train, wcfg.seed * 1000 + 500, wcfg.eval_difficulty)  # unseen by SFT
        heldout = heldout_problems(wcfg, d.n_eval)
        messages = lambda q: [{"role": "user", "content": q}]  # noqa: E731  the world's chat format
    else:
        try:
            rows = load_gsm8k(d.source, d.train_split, d.hub_config)
            local = Path(d.source).suffix.lower() in (".jsonl", ".json", ".parquet")
            held = rows if local else load_gsm8k(d.source, d.eval_split, d.hub_config)
        except ValueError as err:
            raise ExperimentError(f"data.source: {err}") from err
        heldout = [
            dict(question=r["question"], gold=r["gold"]) for r in held.select(range(min(d.n_eval, len(held))))
        ]
        start = len(heldout) if local else 0
        stop = len(rows) if d.n_train is None else min(len(rows), start + d.n_train)
        if stop <= start:
            raise ExperimentError(
                f"data.source {d.source!r}: no rows left for training after {start} held out"
            )
        train = [dict(question=r["question"], gold=r["gold"]) for r in rows.select(range(start, stop))]
        messages = prompt_messages
    ds = Dataset.from_dict(
        {"prompt": [messages(p["question"]) for p in train], "answer": [p["gold"] for p in train]}
    )
    return ds, [dict(question=p["question"], gold=p["gold"], prompt=messages(p["question"])) for p in heldout]


def reward_functions(names) -> list:
    from ..data import format_reward, gsm8k_reward

    table = {"gsm8k": gsm8k_reward, "format": format_reward}
    return [table[n] for n in names]


# ---------------------------------------------------------------------------------------- evaluation


def evaluate(model, tokenizer, problems: list[dict], cfg: ExperimentConfig, args, seed: int) -> dict:
    """Held-out accuracy of ``model`` by plain decoding (no drafter: the policy itself, any arm alike),
    prompts rendered with the trainer's chat-template arguments; completions up to ``eval.max_new_tokens``
    (default: the trainer's max_completion_length).

    Runs where the model is: fine for the tiny world and for a whole model on one GPU; a ZeRO-3-partitioned
    model after training is not gathered here (not yet supported)."""
    import torch

    from ..algo import wilson_interval
    from ..data import score
    from ..engine import EngineConfig, SamplingParams, SpeculativeEngine

    was_training = model.training
    engine = SpeculativeEngine(model, None, EngineConfig(max_batch_size=cfg.eval.batch_size))
    kwargs = dict(getattr(args, "chat_template_kwargs", None) or {})
    prompts = [_render(tokenizer, p["prompt"], kwargs) for p in problems]
    sampling = SamplingParams(
        temperature=cfg.eval.temperature,
        max_new_tokens=cfg.eval.max_new_tokens or args.max_completion_length,
        eos_token_id=tokenizer.eos_token_id,
        seed=seed,
    )
    with torch.no_grad():
        trajs = engine.generate(prompts, sampling)
    model.train(was_training)
    correct = sum(
        score(tokenizer.decode(t.completion_ids, skip_special_tokens=True), p["gold"])
        for t, p in zip(trajs, problems, strict=True)
    )
    lo, hi = wilson_interval(int(correct), len(problems))
    return {"accuracy": correct / len(problems), "ci_low": lo, "ci_high": hi, "n": len(problems)}


def _render(tokenizer, messages, kwargs: dict) -> list[int]:
    out = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, **kwargs)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


# ---------------------------------------------------------------------------------------- wandb


def _logged_in() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        import netrc

        return netrc.netrc().authenticators("api.wandb.ai") is not None
    except (OSError, netrc.NetrcParseError):
        return False


def start_wandb(cfg: ExperimentConfig, arm: ArmConfig, out: Path, resolved: dict, resume_id: str | None):
    """The arm's wandb run, or None (disabled, or wandb failed to start: the run's own files go on)."""
    mode = cfg.wandb.mode
    if mode == "disabled":
        return None
    if mode == "auto":
        mode = "online" if _logged_in() else "offline"
    try:
        import wandb

        run = wandb.init(
            project=cfg.wandb.project,
            entity=cfg.wandb.entity,
            group=cfg.experiment,
            job_type=arm.name,
            name=run_name(cfg, arm),
            tags=[*arm.tags, f"seed:{cfg.seed}"],
            config=resolved,
            dir=str(out),
            mode=mode,
            # offline: no version line and no history table at the end; the run's folder is named once
            # the arm has finished
            settings=wandb.Settings(quiet=True) if mode == "offline" else None,
            id=resume_id,
            resume="allow" if resume_id else None,
        )
    except Exception as err:  # wandb must never cost the run: say so and go on without it
        print(f"marsrl train: wandb did not start ({type(err).__name__}: {err}); continuing without it")
        return None
    (out / "wandb_run").write_text(str(Path(run.dir).parent) + "\n")
    (out / "wandb_id").write_text(run.id + "\n")
    return run


# ---------------------------------------------------------------------------------------- one arm


def seed_root(cfg: ExperimentConfig) -> Path:
    """The folder of one seed's arms: <output_dir>/<experiment>, or .../seed-<seed> with several seeds."""
    root = Path(cfg.output_dir) / cfg.experiment
    return root / f"seed-{cfg.seed}" if cfg.seeds is not None else root


def arm_dir(cfg: ExperimentConfig, arm: ArmConfig) -> Path:
    return seed_root(cfg) / arm.name


def run_name(cfg: ExperimentConfig, arm: ArmConfig) -> str:
    """The arm's wandb run name: <experiment>-<arm>, with -seed<s> when the experiment has several seeds."""
    return f"{cfg.experiment}-{arm.name}" + (f"-seed{cfg.seed}" if cfg.seeds is not None else "")


def latest_checkpoint(folder: Path, say=None) -> Path | None:
    """The newest WHOLE checkpoint: its marker present and every file it lists there with the recorded
    size and SHA-256. A save killed half way (no marker) is skipped quietly; a damaged checkpoint is
    skipped with one line through ``say``. None when no save ever finished; ExperimentError naming the
    folder when checkpoints finished but none is whole any more."""
    say = say or (lambda line: print(line, file=sys.stderr))
    found = [p for p in folder.glob("checkpoint-*") if p.is_dir() and p.name.split("-")[-1].isdigit()]
    marked = sorted((p for p in found if (p / COMPLETE).is_file()), key=checkpoint_step, reverse=True)
    for path in marked:
        fault = check_manifest(path)
        if fault is None:
            return path
        say(f"marsrl train: not resuming from {path.name}: {fault}; trying the one before")
    if marked:
        raise ExperimentError(
            f"{folder}: no whole checkpoint to resume from (pass --overwrite to start over)"
        )
    return None


def _trained_to_the_end(ckpt: Path, args) -> bool:
    """The checkpoint is at the run's last step (``args.max_steps``, else the step count it was saved
    with): training it again would run one step past the end."""
    state = json.loads((ckpt / "trainer_state.json").read_text())
    end = args.max_steps if args.max_steps > 0 else state.get("max_steps", 0)
    return end > 0 and checkpoint_step(ckpt) >= end


def trainer_args(cfg: ExperimentConfig, arm: ArmConfig, out: Path, use_wandb: bool):
    """MarsGRPOConfig of one arm: the YAML's trainer fields over MarsGRPOConfig's defaults, the arm's
    correction, and what the experiment owns (folders, logging every step, checkpoints, seed)."""
    from ..trainer import MarsGRPOConfig

    fields = {"use_cpu": _no_gpu(), "bf16": not _no_gpu(), "save_steps": 10, "save_total_limit": 2}
    fields.update(cfg.trainer)
    fields.update(
        output_dir=str(out / "checkpoints"),
        run_name=run_name(cfg, arm),
        report_to=["wandb"] if use_wandb else "none",
        is_correction=arm.is_correction,
        seed=cfg.seed,
        logging_steps=1,
        save_strategy="steps",
        disable_tqdm=False,
    )
    try:
        return MarsGRPOConfig(**fields)
    except TypeError as err:  # an unknown field
        raise ExperimentError(f"trainer: {err}") from err
    except ValueError as err:
        raise ExperimentError(f"trainer: {err}") from err


def _no_gpu() -> bool:
    import torch

    return not torch.cuda.is_available()


def pool_config(cfg: ExperimentConfig, arm: ArmConfig, sources: Sources):
    """The PoolConfig of one arm: ``cfg.pool`` over the defaults, the sources, the arm's rule."""
    from ..config import ConfigError
    from ..rollout import PoolConfig

    pool_values = json.loads(json.dumps(cfg.pool))
    worker = pool_values.setdefault("worker", {})
    worker.setdefault("target", sources.model)
    worker.setdefault("drafter", sources.drafter)
    worker.setdefault("engine", {}).update(rule=arm.rule, theta=arm.theta, relax_prob=arm.relax_prob)
    try:
        return PoolConfig.from_dict(pool_values, "pool")
    except (ConfigError, ValueError) as err:
        raise ExperimentError(str(err)) from err


def is_main_process() -> bool:
    """Rank 0 of a launcher (torchrun / accelerate / deepspeed set RANK), or a lone process."""
    return int(os.environ.get("RANK", "0")) == 0


def build_pool(cfg: ExperimentConfig, arm: ArmConfig, sources: Sources):
    """The arm's rollout pool on the main process only (other trainer ranks get None: the trainer calls
    the pool from rank 0 and scatters the trajectories)."""
    from ..rollout import LocalPool, RolloutPool

    if not is_main_process():
        return None
    pool_cfg = pool_config(cfg, arm, sources)
    if cfg.pool_backend == "local":
        return LocalPool(pool_cfg.worker)
    return RolloutPool(pool_cfg)


def run_arm(
    cfg: ExperimentConfig, arm: ArmConfig, sources: Sources, data, resume: bool, progress: bool
) -> dict:
    """Train one arm end to end; returns its eval.json content."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.trainer_callback import ProgressCallback

    from ..drafter import Eagle3Drafter
    from ..trainer import MarsGRPOTrainer
    from .evaluate import HeldoutEvalCallback, compare_evals, eval_settings, evaluate_policy
    from .recorder import CompactProgress, RunRecorder

    out = arm_dir(cfg, arm)
    out.mkdir(parents=True, exist_ok=True)
    resolved = dict(cfg.to_dict(), arm=dataclasses.asdict(arm), sources=dataclasses.asdict(sources))
    _atomic_write(
        out / "config.yaml",
        dump_experiment(cfg)
        + "arm:\n"
        + "".join(f"  {k}: {json.dumps(v)}\n" for k, v in dataclasses.asdict(arm).items()),
    )
    ckpt = latest_checkpoint(out / "checkpoints") if resume else None
    resume_id = (out / "wandb_id").read_text().strip() if resume and (out / "wandb_id").is_file() else None
    run = start_wandb(cfg, arm, out, resolved, resume_id)
    train_ds, heldout = data
    torch.manual_seed(cfg.seed)
    args = trainer_args(cfg, arm, out, run is not None)  # first: a ZeRO-3 config makes the load partitioned
    with _loading("model", sources.model):
        tokenizer = AutoTokenizer.from_pretrained(sources.model)
        dtype = torch.bfloat16 if args.bf16 else None
        model = AutoModelForCausalLM.from_pretrained(sources.model, dtype=dtype)
    drafter = None
    if args.draft_refresh_every and sources.drafter:
        with _loading("drafter", sources.drafter):
            drafter = Eagle3Drafter.from_pretrained(sources.drafter, target=model)
    eval_path = out / "eval.json"
    evals = json.loads(eval_path.read_text()) if resume and eval_path.is_file() else {}
    settings = eval_settings(cfg, args)
    if "before" not in evals:
        evals["before"] = _before_training(
            cfg, settings, lambda: evaluate_policy(model, tokenizer, heldout, **settings)
        )
        _atomic_write(eval_path, json.dumps(evals, indent=2))
    threads = torch.get_num_threads()
    pool = build_pool(cfg, arm, sources)
    torch.set_num_threads(trainer_threads(cfg, threads))  # after the pool: a local worker sets its own
    trainer = None
    try:
        trainer = MarsGRPOTrainer(
            model, reward_functions(cfg.rewards), args, train_ds, tokenizer, pool=pool, drafter=drafter
        )
        recorder = RunRecorder(trainer, out, tokenizer, cfg.samples_per_step, resume_from=ckpt)
        trainer.add_callback(recorder)
        heldout_cb = HeldoutEvalCallback(
            tokenizer,
            heldout,
            out,
            every=cfg.eval.every,
            before=evals["before"],
            resume_step=checkpoint_step(ckpt) if ckpt else 0,
            **settings,
        ).attach(trainer)  # first: its eval/... metrics ride on the step's log
        trainer.add_callback(_fault_callback())
        trainer.remove_callback(ProgressCallback)
        if progress:
            trainer.add_callback(CompactProgress())
        if ckpt is not None and _trained_to_the_end(ckpt, args):
            # transformers would run one more step before it looks at max_steps: load the weights only
            trainer._load_from_checkpoint(str(ckpt))
            trainer.state.global_step = checkpoint_step(ckpt)
            if progress:
                print(f"{arm.name}: trained to step {trainer.state.global_step} before; evaluating")
        else:
            trainer.train(resume_from_checkpoint=str(ckpt) if ckpt else None)
        fault_point("eval_after")
        if is_main_process():  # the evaluations ran on the main process (HeldoutEvalCallback)
            step = trainer.state.global_step
            if step not in heldout_cb.results:
                heldout_cb.record(step, heldout_cb.evaluate(trainer.model))
            evals["after"] = heldout_cb.results[step]
            evals["after_step"] = step
            evals["comparison"] = compare_evals(evals["before"], evals["after"])
            evals["tau"] = recorder.final_tau()
            _atomic_write(eval_path, json.dumps(evals, indent=2))
    except KeyboardInterrupt:
        raise Interrupted(arm.name, None if trainer is None else trainer.state.global_step) from None
    finally:
        if pool is not None:
            pool.shutdown()
        if run is not None:
            run.finish()
    return evals


def _before_training(cfg: ExperimentConfig, settings: dict, compute) -> dict:
    """The initial policy's held-out result, computed once per experiment: every arm starts from the same
    policy and evaluates the same problems with the same seed (kept in <experiment>/eval_before.json with
    the settings it was made with)."""
    path = seed_root(cfg) / "eval_before.json"
    key = json.loads(json.dumps({**settings, "n": cfg.data.n_eval, "model": cfg.model}))
    if path.is_file():
        kept = json.loads(path.read_text())
        if kept.get("settings") == key:
            return kept["result"]
    result = compute()
    if is_main_process():
        _atomic_write(path, json.dumps({"settings": key, "result": result}))
    return result


def trainer_threads(cfg: ExperimentConfig, current: int) -> int:
    """``cfg.torch_threads``, else ``current`` (torch's thread count, which honours OMP_NUM_THREADS).

    The rollout workers and the trainer take turns: a step generates, then trains, and the trainer waits
    while the pool generates. So the trainer keeps every core torch would use, with either backend (with
    the local backend the in-process worker sets the count when its ``torch_threads`` is set). On a
    machine that other jobs share, fewer threads than cores (``OMP_NUM_THREADS`` or ``torch_threads``)
    avoid OpenMP threads that spin waiting for a core."""
    if cfg.torch_threads is not None:
        return cfg.torch_threads
    return current


def fault_point(name: str) -> None:
    """Fault injection for the resume tests: ``MARSRL_KILL_AT=<name>`` dies here like a SIGKILL."""
    if os.environ.get("MARSRL_KILL_AT") == name:
        os.kill(os.getpid(), signal.SIGKILL)


def _fault_callback():
    from transformers import TrainerCallback

    class FaultInjection(TrainerCallback):
        """``MARSRL_KILL_AT=log:<step>``: die once the step's metrics row is written, before its save."""

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "loss" in logs:
                fault_point(f"log:{state.global_step}")

    return FaultInjection()


@contextlib.contextmanager
def _loading(what: str, source: str):
    """A model that cannot be loaded (a hub id offline, a wrong folder) is one ExperimentError line."""
    try:
        yield
    except OSError as err:
        hint = "" if Path(source).exists() else " (a hub id needs network access; offline, pass a folder)"
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ExperimentError(f"{what} {source!r} could not be loaded{hint}: {first}") from err


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


# ---------------------------------------------------------------------------------------- the experiment


def run_experiment(
    cfg: ExperimentConfig, *, resume: bool = False, overwrite: bool = False, progress: bool = True
) -> Path:
    """Every arm in order; returns outputs/<experiment>."""
    root = Path(cfg.output_dir) / cfg.experiment
    if resume and overwrite:
        raise ExperimentError("--resume and --overwrite exclude each other")
    if root.exists() and any(root.iterdir()) and not (resume or overwrite):
        raise ExperimentError(
            f"{root} already exists: pass --resume to continue it or --overwrite to replace it"
        )
    data = check_inputs(cfg)  # every bad input fails here: no folder made, no model loaded
    if overwrite and root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True, exist_ok=True)
    _atomic_write(root / "config.yaml", dump_experiment(cfg))
    sources = resolve_sources(cfg, progress)
    say = print if progress else (lambda *a, **k: None)
    seeds = cfg.seed_list
    for seed in seeds:
        scfg = cfg.for_seed(seed)
        at = f" (seed {seed})" if cfg.seeds is not None else ""
        for i, arm in enumerate(cfg.arms):
            if resume and _arm_finished(scfg, arm):
                say(f"[{i + 1}/{len(cfg.arms)}] {arm.name}{at}: finished before, kept")
                continue
            say(
                f"[{i + 1}/{len(cfg.arms)}] training arm {arm.name}{at} (rule {arm.rule}, theta {arm.theta}, "
                f"lambda {arm.relax_prob}, correction {arm.is_correction})"
            )
            started = time.perf_counter()
            run_arm(scfg, arm, sources, data, resume, progress)
            say(f"[{i + 1}/{len(cfg.arms)}] {arm.name}{at} done in {time.perf_counter() - started:.0f} s")
    if cfg.timing_repeats and is_main_process() and not (resume and (root / TIMING_FILE).is_file()):
        repeats = whole_rotations(cfg.timing_repeats, len(cfg.arms) + 1)  # the arms and the A/A copy
        say(f"timing every arm's rollout, interleaved ({repeats} repeats)")
        try:
            run_timing(cfg.for_seed(seeds[0]), sources, data, root, progress)
        except KeyboardInterrupt:
            raise Interrupted(None, None) from None
    return root


def run_timing(cfg: ExperimentConfig, sources: Sources, data, root: Path, progress: bool = True) -> dict:
    """Every arm's rollout of one training step, interleaved (``timing.measure``) on the initial policy
    and drafter, with an A/A copy of the reference (first) arm; writes <root>/timing.json."""
    import torch
    from transformers import AutoTokenizer

    from ..integrations.trl import resolve_sampling
    from ..rollout import LocalPool
    from .evaluate import render_prompts
    from .recorder import _rows

    reference = cfg.arms[0]
    args = trainer_args(cfg, reference, arm_dir(cfg, reference), use_wandb=False)
    tokenizer = AutoTokenizer.from_pretrained(sources.model)
    group = int(args.num_generations)
    n_prompts = max(1, int(args.per_device_train_batch_size) // group)
    train_ds, _ = data
    problems = [{"prompt": train_ds[i]["prompt"]} for i in range(n_prompts)]
    prompt_ids = render_prompts(tokenizer, problems, getattr(args, "chat_template_kwargs", None))
    base = resolve_sampling(args, eos_token_ids=[tokenizer.eos_token_id])
    sampling = dataclasses.replace(base, n=group, seed=cfg.seed)
    threads = torch.get_num_threads()
    pools = {arm.name: LocalPool(pool_config(cfg, arm, sources).worker) for arm in cfg.arms}
    pools[reference.name + AA_SUFFIX] = LocalPool(pool_config(cfg, reference, sources).worker)
    torch.set_num_threads(trainer_threads(cfg, threads))
    for pool in pools.values():  # warm-up: first-call allocations stay out of the figures
        pool.generate(prompt_ids[:1], dataclasses.replace(sampling, n=1))
    repeats = whole_rotations(cfg.timing_repeats, len(pools))  # every arm in every position equally often
    arms = measure(pools, prompt_ids, sampling, repeats, say=print if progress else None)
    rows = _rows(arm_dir(cfg, reference) / "metrics.jsonl")
    record = timing_record(arms, reference.name, repeats, n_prompts, group, rows)
    write_timing(root, record)
    return record


def check_inputs(cfg: ExperimentConfig):
    """What a run can reject before it makes a folder or loads a model: the sources' names, the data
    (read whole: an empty file, a bad row by its line number), and every arm's trainer config as TRL
    builds it. Returns the data (``load_data``'s pair)."""
    sources = resolve_sources(cfg, progress=False, build=False)
    data = load_data(cfg, sources.world)
    with contextlib.redirect_stdout(sys.stderr):  # TRL's config may print notices: keep stdout clean
        for arm in cfg.arms:
            trainer_args(cfg, arm, arm_dir(cfg, arm), use_wandb=False)
    return data


def _arm_finished(cfg: ExperimentConfig, arm: ArmConfig) -> bool:
    path = arm_dir(cfg, arm) / "eval.json"
    return path.is_file() and "after" in json.loads(path.read_text())
