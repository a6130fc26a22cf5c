"""``marsrl train --dry-run``: what a run would build, short of weights, Ray and the tiny world, as a report.

It resolves the config; builds each arm's ``MarsGRPOConfig`` through ``run.trainer_args`` (so TRL and marsrl
check every trainer field exactly as a run would) and its ``PoolConfig`` through ``pool_config`` (what
``run.build_pool`` hands to the pool); plans the resources (trainer ranks, ZeRO stage, rollout actors and
what they ask of Ray, model-state bytes); reads the model's and the drafter's configs and checks they fit
each other; and renders the first prompts with the model's chat template.

From the Hugging Face hub it needs only small files (config.json, the tokenizer). Offline (HF_HUB_OFFLINE=1)
it reads the local cache only, and a source that is not there stops it with one line naming the hub id (an
``ExperimentError``: exit code 2). GSM8K from the hub, offline and not cached, is shown from the shared copy
of its test split (``SHARED_GSM8K``) when that exists, labelled as such.

It works in two passes: ``plan`` gathers everything once, in the order a run would fail on it (each
piece from the function of ``run.py`` a run calls), into a ``Plan``; ``render`` turns that plan into the
text and calls nothing of ``run.py``.

Leaves out: loading weights, starting Ray, building a tiny world that is not built yet (it says where it
would go and renders prompts in a plain chat layout), and what only exists at launch (the process group, the
GPUs themselves, DeepSpeed's own batch checks).
"""

from __future__ import annotations

import contextlib
import enum
import json
import os
import textwrap
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from ..config import load_yaml
from .config import ArmConfig, ExperimentConfig, dump_experiment
from .run import ExperimentError, Sources, arm_dir, load_data, pool_config, resolve_sources, trainer_args

if TYPE_CHECKING:
    from ..rollout.config import PoolConfig

REPO = Path(__file__).resolve().parents[2]
SHARED_GSM8K = REPO.parent / "shared" / "data" / "gsm8k" / "test.jsonl"  # GSM8K's test split, when present
GSM8K_HUB_IDS = ("openai/gsm8k", "gsm8k")
SHOW_ROWS = 2
ACCELERATE_DIR = Path("configs") / "accelerate"  # relative to the launch folder, like trainer.deepspeed
# model states per parameter with bf16 mixed precision and Adam (ZeRO paper: 2 weights + 2 grads + 12 fp32
# master, m, v), as (bytes every rank keeps whole, bytes split over the ranks), by ZeRO stage
STATE_BYTES = {0: (16, 0), 1: (4, 12), 2: (2, 14), 3: (0, 16)}
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
# MarsGRPOConfig fields the report shows besides the ones the trainer section sets
TRAINER_FIELDS = (
    "learning_rate", "lr_scheduler_type", "num_generations", "max_completion_length", "temperature",
    "loss_type", "beta", "activation_checkpointing", "bf16", "use_cpu", "save_steps", "save_total_limit",
    "output_dir", "report_to",
)  # fmt: skip


class _Offline(Exception):
    """A hub file that is not in the local cache while the hub is offline (collected, then one line)."""


@dataclass
class _Model:
    config: Any  # the target's transformers config (None: tiny world not built yet)
    tokenizer: Any
    parameters: int | None
    head: Any = None  # the drafter's Eagle3Config


@dataclass
class _Batch:
    """The batch a run would use at the planned rank count."""

    per_generation: int  # completions per pool call (generation_batch_size)
    per_step: int  # completions per optimizer step


@dataclass
class _Data:
    """The data section's facts: counts of what ``run.load_data`` loaded and the first rows, or (the hub
    offline, GSM8K not cached) the first rows of ``SHARED_GSM8K``."""

    shown: list[tuple[Any, Any]]  # (prompt messages, gold answer) of the first SHOW_ROWS rows
    n_train: int | None = None  # training prompts loaded; None: not loaded, rows from SHARED_GSM8K
    n_heldout: int | None = None  # held-out problems loaded
    shared_rows: int = 0  # rows of SHARED_GSM8K, when the rows come from it


@dataclass
class Plan:
    """What ``marsrl train --dry-run`` reports, gathered once by ``plan``; ``render`` only formats it."""

    cfg: ExperimentConfig
    arms: list[tuple[ArmConfig, Any]]  # each arm with its MarsGRPOConfig (run.trainer_args)
    notes: list[str]  # warnings building the first arm's MarsGRPOConfig raised
    ranks: int | None  # trainer processes (None: unknown until launch)
    ranks_from: str  # where that number comes from
    sources: Sources  # run.resolve_sources, without building a tiny world
    world_notes: list[str]
    pools: list[PoolConfig]  # each arm's (run.pool_config)
    batch: _Batch | None  # None when ranks is unknown
    model: _Model
    data: _Data
    zero: int | None  # the DeepSpeed ZeRO stage (None: no DeepSpeed)


def dry_run(cfg: ExperimentConfig) -> str:
    """The report (multi-line text). Raises ExperimentError (one line) for what a run would fail on: the
    config's own checks first, then the sources (the hub), then the data."""
    return render(plan(cfg))


def plan(cfg: ExperimentConfig) -> Plan:
    """Everything the report shows, in the order a run would fail on it (ExperimentError, one line)."""
    built = [(arm, _trainer(cfg, arm)) for arm in cfg.arms]
    arms = [(arm, args) for arm, (args, _) in built]
    args, notes = built[0][1]
    ranks, ranks_from = trainer_ranks(args.deepspeed)
    sources, world_notes = plan_sources(cfg)
    pools = [pool_config(cfg, arm, sources) for arm in cfg.arms]
    batch = _batch(cfg, args, ranks)
    model = _inspect_sources(sources)
    data = _load_data(cfg, sources)
    return Plan(
        cfg=cfg,
        arms=arms,
        notes=notes,
        ranks=ranks,
        ranks_from=ranks_from,
        sources=sources,
        world_notes=world_notes,
        pools=pools,
        batch=batch,
        model=model,
        data=data,
        zero=zero_stage(args.deepspeed),
    )


def render(plan: Plan) -> str:
    """The report's text from a plan."""
    cfg, args = plan.cfg, plan.arms[0][1]
    sections = [
        f"marsrl train --dry-run: experiment {cfg.experiment!r} "
        "(no weights loaded, Ray not started, nothing written)",
        "",
        "== config (resolved) ==",
        dump_experiment(cfg).rstrip(),
        "",
        "== sources ==",
        *_sources_lines(plan.sources, plan.model, plan.world_notes),
        "",
        "== resources ==",
        *_resource_lines(plan),
        "",
        "== trainer (MarsGRPOConfig via run.trainer_args, every arm) ==",
        *_trainer_lines(plan),
        "",
        "== pool (PoolConfig; arms differ only in worker.engine rule / theta / relax_prob) ==",
        yaml.safe_dump(plan.pools[0].to_dict(), sort_keys=False).rstrip(),
        "",
        "== data ==",
        *_data_lines(cfg, plan.data, plan.model.tokenizer, args.chat_template_kwargs or {}),
    ]
    return "\n".join(sections) + "\n"


# ---------------------------------------------------------------------------------------- what run.py builds


def plan_sources(cfg: ExperimentConfig) -> tuple[Sources, list[str]]:
    """``run.resolve_sources`` without building a tiny world: the folders it would return, and notes."""
    from ..tinyworld import PRESETS, world_dir

    sources = resolve_sources(cfg, build=False)
    world, notes = sources.world, []
    if world is not None:
        folder = world_dir(PRESETS[world])
        state = "built, reused" if _world_built(world) else "NOT built yet: `marsrl train` builds it first"
        notes.append(f"tiny world {world!r}: {folder} ({state})")
    return sources, notes


def _trainer(cfg: ExperimentConfig, arm: ArmConfig):
    """(MarsGRPOConfig, the warnings it raised): the warnings go into the report, not onto stderr."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        args = trainer_args(cfg, arm, arm_dir(cfg, arm), use_wandb=cfg.wandb.mode != "disabled")
    return args, sorted({f"{w.category.__name__}: {w.message}" for w in caught})


def _world_built(preset: str) -> bool:
    from ..tinyworld import PRESETS, world_dir

    meta = world_dir(PRESETS[preset]) / "metadata.json"
    return meta.is_file() and json.loads(meta.read_text()).get("fingerprint") == PRESETS[preset].fingerprint()


# ---------------------------------------------------------------------------------------- model and drafter


def _offline() -> bool:
    from huggingface_hub import is_offline_mode

    return is_offline_mode()


def _hub_failure(what: str, name: str, err: Exception) -> ExperimentError | _Offline:
    """Why ``name`` (not a local folder) could not be read: no such folder, offline, or the hub's error."""
    if name.startswith(("/", ".", "~")) or name.count("/") > 1:  # a path, not "owner/name"
        return ExperimentError(f"{what} {name!r}: no such folder")
    if _offline():
        return _Offline(f"{what} {name!r}")
    return ExperimentError(
        f"{what} {name!r}: could not be fetched from the Hugging Face hub "
        f"({type(err).__name__}: {_first_line(err)}); pass a local folder"
    )


def _inspect_sources(sources: Sources) -> _Model:
    """The target's config, tokenizer and parameter count, the drafter's config checked against them.
    Hub files missing offline are collected and reported together in one line."""
    if sources.world is not None and not _world_built(sources.world):
        return _Model(config=None, tokenizer=None, parameters=None)
    missing: list[str] = []
    config = tokenizer = head = None
    try:
        config = _target_config(sources.model)
        tokenizer = _tokenizer(sources.model)
    except _Offline as err:
        missing.append(str(err))
    if sources.drafter is not None:
        try:
            head = _head_config(sources.drafter)
        except _Offline as err:
            missing.append(str(err))
    if missing:
        need, fix = (
            ("needs a download", "a local folder")
            if len(missing) == 1
            else ("need downloads", "local folders")
        )
        raise ExperimentError(
            f"{' and '.join(missing)}: {need} from the Hugging Face hub, which is offline here "
            f"(HF_HUB_OFFLINE=1 / no network); pass {fix}"
        )
    if head is not None:
        from ..rollout.worker import check_drafter_matches

        try:
            check_drafter_matches(config, head, sources.model, sources.drafter)
        except ValueError as err:
            raise ExperimentError(str(err)) from err
    vocab = config.get_text_config().vocab_size
    if len(tokenizer) > vocab:
        raise ExperimentError(
            f"model {sources.model!r}: its tokenizer has {len(tokenizer)} tokens, more than the "
            f"model's vocabulary of {vocab}"
        )
    return _Model(config=config, tokenizer=tokenizer, parameters=_count_parameters(config), head=head)


def _target_config(name: str):
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(name, local_files_only=_offline())
    except (OSError, ValueError) as err:
        if Path(name).expanduser().is_dir():
            raise ExperimentError(f"model folder {name}: no usable config.json ({_first_line(err)})") from err
        raise _hub_failure("model", name, err) from err


def _tokenizer(name: str):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(name, local_files_only=_offline())
    except (OSError, ValueError) as err:
        if Path(name).expanduser().is_dir():
            raise ExperimentError(
                f"model folder {name}: no tokenizer, which `marsrl train` loads from it ({_first_line(err)})"
            ) from err
        raise _hub_failure("tokenizer of model", name, err) from err


def _head_config(name: str):
    from ..drafter.checkpoint import CONFIG_FILE, read_config

    folder = Path(name).expanduser()
    if not folder.is_dir():
        from huggingface_hub import hf_hub_download

        try:
            folder = Path(hf_hub_download(name, CONFIG_FILE, local_files_only=_offline())).parent
        except Exception as err:  # the hub raises many types (offline, missing, gated); all mean "not here"
            raise _hub_failure("drafter", name, err) from err
    try:
        return read_config(folder)
    except (OSError, ValueError) as err:
        raise ExperimentError(f"drafter {name!r}: {_first_line(err)}") from err


def _count_parameters(config) -> int | None:
    """The target's parameter count from a model built on the meta device without initialisation (no
    memory, no weights, ~0.05 s at 8B). The class is called directly: ``from_config`` would enter
    DeepSpeed's ``zero.Init`` once a ZeRO-3 MarsGRPOConfig exists in the process, as the arms' do here."""
    import torch
    from transformers.initialization import no_init_weights
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    cls = MODEL_FOR_CAUSAL_LM_MAPPING.get(type(config), None)
    if cls is None:  # a config class AutoModelForCausalLM does not know: the count is left out
        return None
    with torch.device("meta"), no_init_weights():
        model = cls(config)
    return sum(p.numel() for p in model.parameters())


def _first_line(err: Exception) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0]


def _sources_lines(sources: Sources, model: _Model, notes: list[str]) -> list[str]:
    out = list(notes)
    if model.config is None:
        return [
            *out,
            f"model       {sources.model} (read once the world is built)",
            f"drafter     {sources.drafter}",
        ]
    c = model.config.get_text_config()
    size = "" if model.parameters is None else f", {model.parameters / 1e9:.2f} B parameters"
    arch = (getattr(model.config, "architectures", None) or [type(model.config).__name__])[0]
    dtype = getattr(model.config, "dtype", None)
    dtype = "" if dtype is None else f", dtype {str(dtype).removeprefix('torch.')}"
    out.append(
        f"model       {sources.model}: {arch}, {c.num_hidden_layers} layers, hidden {c.hidden_size}, "
        f"vocab {c.vocab_size}{dtype}{size}"
    )
    tok = model.tokenizer
    out.append(
        f"tokenizer   {len(tok)} tokens, eos {tok.eos_token!r}, pad {tok.pad_token!r}, "
        f"chat template {'yes' if tok.chat_template else 'none'}"
    )
    if model.head is None:
        out.append("drafter     none: plain sampling (every arm's rule is moot)")
    else:
        h = model.head
        layers = "the default three" if h.aux_layer_ids is None else list(h.aux_layer_ids)
        out.append(
            f"drafter     {sources.drafter}: EAGLE-3 head, hidden {h.hidden_size}, draft vocab "
            f"{h.draft_vocab_size}, feature layers {layers}; fits the target (vocab, width, layers)"
        )
    return out


# ---------------------------------------------------------------------------------------- resources


def trainer_ranks(deepspeed) -> tuple[int | None, str]:
    """(trainer processes, where the number comes from): WORLD_SIZE when a launcher set it, else the
    ``num_processes`` of the one accelerate config under ``configs/accelerate/`` naming the same DeepSpeed
    file, else one process without DeepSpeed, else unknown (None)."""
    if os.environ.get("WORLD_SIZE"):
        return int(os.environ["WORLD_SIZE"]), "WORLD_SIZE, set by the launcher"
    if deepspeed is None:
        return 1, "no launcher and no DeepSpeed: one process"
    matches = []
    if isinstance(deepspeed, str):
        for path in sorted(ACCELERATE_DIR.glob("*.yaml")):
            acc = load_yaml(path.read_text()) or {}
            named = (acc.get("deepspeed_config") or {}).get("deepspeed_config_file")
            if named and Path(named).resolve() == Path(deepspeed).resolve():
                matches.append((path, acc.get("num_processes")))
    if len(matches) == 1 and isinstance(matches[0][1], int):
        path, n = matches[0]
        return (
            n,
            f"num_processes of {path}, the accelerate config naming {deepspeed}; "
            "--num_processes overrides it",
        )
    named = ", ".join(str(p) for p, _ in matches) or f"none under {ACCELERATE_DIR}/ names it"
    return None, f"unknown until launch (accelerate configs for this DeepSpeed file: {named})"


def zero_stage(deepspeed) -> int | None:
    """``zero_optimization.stage`` of the DeepSpeed config (a path or a mapping); None without one."""
    if deepspeed is None:
        return None
    ds = deepspeed if isinstance(deepspeed, dict) else json.loads(Path(deepspeed).read_text())
    return int((ds.get("zero_optimization") or {}).get("stage", 0))


def _gb(n_bytes: float) -> str:
    return f"{n_bytes / 1e9:.1f} GB"


def _resource_lines(plan: Plan) -> list[str]:
    cfg, args, pool, model, ranks = plan.cfg, plan.arms[0][1], plan.pools[0], plan.model, plan.ranks
    stage = plan.zero
    ds = (
        "no DeepSpeed"
        if stage is None
        else f"DeepSpeed ZeRO-{stage} ({args.deepspeed if isinstance(args.deepspeed, str) else 'inline'})"
    )
    n_ranks = "?" if ranks is None else str(ranks)
    if args.use_cpu:
        precision = "CPU (this machine has no CUDA: use_cpu, fp32; on GPUs trainer_args picks bf16)"
    else:
        precision = "bf16" if args.bf16 else ("fp16" if args.fp16 else "fp32")
    out = [f"trainer     {n_ranks} rank(s) ({plan.ranks_from})", f"            {ds}, {precision}"]
    params = model.parameters
    if params is not None:
        whole, split = STATE_BYTES.get(stage or 0, STATE_BYTES[0])
        per_rank = whole * params + (split * params / ranks if ranks else 0)
        state = (
            _gb(per_rank) if ranks or not split else f"{_gb(whole * params)} + {_gb(split * params)} / ranks"
        )
        out.append(
            f"            model states ~{state} per rank for {params / 1e9:.2f} B parameters "
            "(weights, grads, Adam at 16 B/param; activations and logits extra)"
        )
    w = pool.worker
    if cfg.pool_backend == "local":
        out.append(
            f"rollout     one in-process worker on rank 0 (pool_backend local, no Ray): device {w.device}, "
            f"dtype {w.dtype}"
        )
        ray_gpus = 0.0
    else:
        ray_gpus = pool.num_actors * pool.num_gpus_per_actor
        out.append(
            f"rollout     Ray: {pool.num_actors} actor(s) x ({pool.num_gpus_per_actor:g} GPU, "
            f"{pool.num_cpus_per_actor:g} CPU), placement {pool.placement_strategy}, "
            f"cluster {pool.address or 'started locally'}"
        )
        out.append(
            f"            worker device {w.device}, dtype {w.dtype}; Ray is asked for {ray_gpus:g} GPU(s) "
            f"and {pool.num_actors * pool.num_cpus_per_actor:g} CPU(s)"
        )
    if params is not None:
        dtype = (
            w.dtype
            if w.dtype != "auto"
            else str(getattr(model.config, "dtype", None) or "float32").removeprefix("torch.")
        )
        if dtype in DTYPE_BYTES:
            out.append(
                f"            ~{_gb(params * DTYPE_BYTES[dtype])} of {dtype} target weights per worker "
                "(plus the head, KV cache and logits)"
            )
    if ray_gpus > 0 or not args.use_cpu:
        total = "?" if ranks is None else f"{ranks + ray_gpus:g}"
        out.append(
            f"total       {total} GPU(s) on one node: {n_ranks} trainer rank(s), one GPU each, + "
            f"{ray_gpus:g} for rollouts"
        )
    for warning in _pool_warnings(cfg, pool):
        out.append(f"warning     {warning}")
    return out


def _pool_warnings(cfg, pool) -> list[str]:
    device = pool.worker.device
    if cfg.pool_backend == "ray" and pool.num_gpus_per_actor == 0 and device in ("cuda", "auto"):
        return [
            f"pool.num_gpus_per_actor is 0 with worker.device {device!r}: on a GPU machine every actor loads "
            "onto cuda:0 beside the trainer, outside Ray's accounting (set pool.num_gpus_per_actor: 1)"
        ]
    if pool.num_gpus_per_actor > 0 and device == "cpu":
        return ["pool.num_gpus_per_actor > 0 with worker.device 'cpu': the GPUs are reserved and left idle"]
    return []


# ---------------------------------------------------------------------------------------- trainer


def _batch(cfg: ExperimentConfig, args, ranks: int | None) -> _Batch | None:
    """The batch at ``ranks`` trainer processes; raises ExperimentError where TRL would refuse it at
    launch (a generation_batch_size that is not a multiple of the ranks' batch)."""
    if ranks is None:
        return None
    pd, ga = args.per_device_train_batch_size, args.gradient_accumulation_steps
    if "generation_batch_size" in cfg.trainer:
        gbs = args.generation_batch_size
        if gbs % (pd * ranks):  # TRL checks this at launch, against the real world size
            raise ExperimentError(
                f"trainer: generation_batch_size {gbs} is not a multiple of "
                f"per_device_train_batch_size x {ranks} ranks = {pd * ranks}"
            )
    else:  # a multiple of num_generations at any rank count, since TRL checked it at one rank
        gbs = pd * ranks * args.steps_per_generation
    return _Batch(per_generation=gbs, per_step=pd * ga * ranks)


def _trainer_lines(plan: Plan) -> list[str]:
    cfg, arms, pool, ranks = plan.cfg, plan.arms, plan.pools[0], plan.ranks
    args = arms[0][1]
    pd, ga, g = args.per_device_train_batch_size, args.gradient_accumulation_steps, args.num_generations
    out = []
    if plan.batch is not None:
        gbs, step = plan.batch.per_generation, plan.batch.per_step
        out.append(
            f"batch       {pd} per device x {ga} accumulation x {ranks} rank(s) = {step} completions per "
            f"optimizer step ({step / g:g} prompts x G {g})"
        )
        actors = 1 if cfg.pool_backend == "local" else pool.num_actors
        out.append(
            f"rollout     one pool call per {gbs} completions ({gbs // g} prompts), ~{-(-gbs // actors)} "
            f"per worker; {args.max_steps} steps ~ {args.max_steps * step // g} prompts"
        )
    shown = dict.fromkeys([*cfg.trainer, *TRAINER_FIELDS])  # the YAML's first, each once
    fields = ", ".join(f"{k}={_short(getattr(args, k))}" for k in shown if hasattr(args, k))
    out += textwrap.wrap(fields, 112, initial_indent="fields      ", subsequent_indent=" " * 12)
    out.append(f"{'arm':<12}{'rule':<10}{'theta':>6}{'lambda':>8}  {'is_correction':<18}{'clip':<12}run_name")
    for arm, a in arms:
        out.append(
            f"{arm.name:<12}{arm.rule:<10}{arm.theta:>6g}{arm.relax_prob:>8g}  {a.is_correction:<18}"
            f"{f'[{a.is_clip_min}, {a.is_clip_max}]':<12}{a.run_name}"
        )
    out += [f"note        {w}" for w in plan.notes]
    return out


def _short(value) -> str:
    text = repr(value.value if isinstance(value, enum.Enum) else value)
    return text if len(text) <= 60 else text[:57] + "..."


# ---------------------------------------------------------------------------------------- data


def _load_data(cfg: ExperimentConfig, sources: Sources) -> _Data:
    """``run.load_data``'s counts and first rows; GSM8K's shared test split when the hub is offline and
    GSM8K is not cached; ExperimentError otherwise."""
    from ..data import extract_answer, prompt_messages

    d = cfg.data
    local = Path(d.source).suffix.lower() in (".jsonl", ".json", ".parquet")
    hub = d.source != "tinyworld" and not local
    try:
        with _quiet_datasets():
            train, heldout = load_data(cfg, sources.world)
    except ExperimentError:
        if not (hub and _offline()):
            raise
        if d.source.lower() not in GSM8K_HUB_IDS or not SHARED_GSM8K.is_file():
            raise ExperimentError(
                f"data.source {d.source!r}: needs a download from the Hugging Face hub, which is offline "
                "here (HF_HUB_OFFLINE=1 / no network); pass a local .jsonl / .json / .parquet file"
            ) from None
        lines = SHARED_GSM8K.read_text().splitlines()
        rows = [json.loads(line) for line in lines[:SHOW_ROWS]]
        shown = [(prompt_messages(r["question"]), extract_answer(r["answer"])) for r in rows]
        return _Data(shown=shown, shared_rows=len(lines))
    shown = [(train[i]["prompt"], train[i]["answer"]) for i in range(min(SHOW_ROWS, len(train)))]
    return _Data(shown=shown, n_train=len(train), n_heldout=len(heldout))


def _data_lines(cfg: ExperimentConfig, data: _Data, tokenizer, template_kwargs) -> list[str]:
    d = cfg.data
    if data.n_train is None:
        out = [
            f"source      {d.source!r} ({d.hub_config}, {d.train_split} / {d.eval_split}) is not cached "
            "and the hub is offline: not loaded",
            f"shown       the first {len(data.shown)} of {data.shared_rows} rows of {SHARED_GSM8K} (GSM8K's "
            f"test split, the run's first held-out problems; n_eval {d.n_eval}, "
            f"n_train {d.n_train or 'all'})",
        ]
    else:
        loaded = f"{data.n_train} training prompts, {data.n_heldout} held-out problems"
        out = [f"source      {d.source!r}: {loaded}"]
    layout = (
        "the model's chat template" if tokenizer is not None else "a plain chat layout (no tokenizer yet)"
    )
    if template_kwargs:
        layout += f" with chat_template_kwargs {template_kwargs}"
    out.append(f"rendered    with {layout}")
    for i, (messages, gold) in enumerate(data.shown):
        text = _render(tokenizer, messages, template_kwargs)
        size = (
            ""
            if tokenizer is None
            else f", {len(tokenizer(text, add_special_tokens=False)['input_ids'])} tokens"
        )
        out.append(f"--- row {i} (gold answer {gold}{size}) ---")
        out += ["    " + line for line in text.splitlines()]
    return out


def _render(tokenizer, messages, template_kwargs) -> str:
    if tokenizer is None:
        return "".join(f"<{m['role']}>\n{m['content']}\n" for m in messages) + "<assistant>\n"
    return tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=False, **template_kwargs
    )


@contextlib.contextmanager
def _quiet_datasets():
    """No ``datasets`` progress bars on stderr while the data loads (the report says what loaded)."""
    import datasets

    was_enabled = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        if was_enabled:
            datasets.enable_progress_bars()
