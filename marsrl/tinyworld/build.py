"""The embedded CPU world: a GSM-style task, a tokenizer, a tiny Qwen3 target trained on it by SFT, and
an EAGLE-3 head trained by TTT on the target's own responses — built deterministically for a seed and
cached, so the demo, the tests and the benchmarks share one artefact.

    build_tinyworld("micro")    # < 60 s, for tests
    build_tinyworld("default")  # < 10 min on 2 cores, for the demo and benchmarks

Layout of a built world (``metadata.json`` records how it was made and what it measured):
    target/    config.json, model.safetensors, tokenizer files, generation_config.json
    draft/     an EAGLE-3 head in the vLLM / SGLang layout
    metadata.json

Leaves out: multi-process training, mixed precision (fp32 on CPU), any download.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
from filelock import FileLock
from tqdm.auto import tqdm
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, Qwen3Config

from .. import __version__
from ..data import Difficulty, generate_problems, score
from .sft import SFTConfig, sft_train
from .tokenizer import chat_prompt_ids, train_tokenizer

WORLD_FORMAT = 2  # bump when the recipe changes, so caches rebuild


@dataclass(frozen=True)
class TinyWorldConfig:
    """Everything that decides a built world; hashed into its cache key."""

    name: str
    n_train: int  # SFT problems
    train_difficulty: Difficulty  # the SFT problems
    eval_difficulty: Difficulty  # the held-out problems: harder (more steps) than most training ones
    n_eval: int  # held-out problems measured at build time (bench/tinyworld.py measures more)
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    sft: SFTConfig
    n_draft_prompts: int  # training prompts whose target responses train the EAGLE-3 head
    draft_vocab_size: int
    draft_epochs: int
    draft_batch_size: int
    draft_lr: float
    max_new_tokens: int = 160
    seed: int = 0

    def fingerprint(self) -> str:
        blob = json.dumps(
            {"cfg": asdict(self), "format": WORLD_FORMAT, "version": __version__}, sort_keys=True
        )
        return hashlib.sha256(blob.encode()).hexdigest()[:12]


# Training covers 1-2 step problems with numbers up to 10 (values up to 40); the held-out set always has
# two steps. A 1.7M-parameter target learns the format and most of this arithmetic in
# ~900 SFT steps; with numbers up to 20 it stayed under 5% held-out accuracy after 400 steps.
EASY = replace(Difficulty.preset("easy"), max_number=10, max_factor=4, max_value=40)
TWO_STEP = replace(EASY, min_steps=2, max_steps=2)


PRESETS: dict[str, TinyWorldConfig] = {
    "micro": TinyWorldConfig(
        name="micro",
        n_train=400,
        train_difficulty=EASY,
        eval_difficulty=TWO_STEP,
        n_eval=16,
        vocab_size=320,
        hidden_size=48,
        num_layers=8,
        num_heads=4,
        num_kv_heads=2,
        intermediate_size=96,
        sft=SFTConfig(steps=60, batch_size=16, lr=3e-3, warmup=10),
        n_draft_prompts=48,
        draft_vocab_size=256,
        draft_epochs=2,
        draft_batch_size=16,
        draft_lr=2e-3,
        max_new_tokens=96,
    ),
    "default": TinyWorldConfig(
        name="default",
        n_train=6000,
        train_difficulty=EASY,
        eval_difficulty=TWO_STEP,
        n_eval=100,
        vocab_size=384,
        hidden_size=128,
        num_layers=8,
        num_heads=4,
        num_kv_heads=2,
        intermediate_size=384,
        sft=SFTConfig(steps=900, batch_size=16, lr=3e-3, warmup=30),
        # the head sets tau: 320 TTT steps on 1,024 of the target's own responses (bench/tinyworld.py
        # measures tau; a head trained on half the responses for a third of the steps drafts far worse,
        # and 3 epochs cost the main job part of its measured speed-up: docs/benchmarks.md, the main job)
        n_draft_prompts=1024,
        draft_vocab_size=320,
        draft_epochs=5,
        draft_batch_size=16,
        draft_lr=3e-3,
        max_new_tokens=128,
    ),
}


def cache_root() -> Path:
    """``$MARSRL_CACHE`` or ``~/.cache/marsrl`` (a user cache folder)."""
    return Path(os.environ.get("MARSRL_CACHE", Path.home() / ".cache" / "marsrl"))


def world_dir(cfg: TinyWorldConfig) -> Path:
    return cache_root() / "tinyworld" / f"{cfg.name}-s{cfg.seed}-{cfg.fingerprint()}"


def _problems(cfg: TinyWorldConfig):
    train = generate_problems(cfg.n_train, cfg.seed * 1000, cfg.train_difficulty)
    heldout = generate_problems(cfg.n_eval, cfg.seed * 1000 + 999, cfg.eval_difficulty)
    return train, heldout


def heldout_problems(cfg: TinyWorldConfig, n: int) -> list[dict]:
    """n held-out problems of the world's eval difficulty (never seen in training: another seed)."""
    return generate_problems(n, cfg.seed * 1000 + 999, cfg.eval_difficulty)


def _target_config(cfg: TinyWorldConfig, tokenizer) -> Qwen3Config:
    return Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        head_dim=cfg.hidden_size // cfg.num_heads,
        max_position_embeddings=1024,
        tie_word_embeddings=False,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )


def build_tinyworld(
    preset: str | TinyWorldConfig = "default",
    out: str | Path | None = None,
    *,
    seed: int | None = None,
    force: bool = False,
    progress: bool = True,
    threads: int | None = 1,
) -> Path:
    """Build (or reuse) a tiny world; returns its folder. Deterministic for a preset and seed.

    ``threads``: torch intra-op threads while building (None leaves torch's setting). One is the
    default: these models are too small to gain from two, and on a shared machine a second thread
    waiting for a busy core can make a training step many times slower.
    """
    cfg = PRESETS[preset] if isinstance(preset, str) else preset
    if isinstance(preset, str) and preset not in PRESETS:
        raise ValueError(f"preset must be one of {sorted(PRESETS)}, got {preset!r}")
    if seed is not None:
        cfg = replace(cfg, seed=seed)
    final = Path(out) if out is not None else world_dir(cfg)
    if not force and _is_built(final, cfg):
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    # One builder per folder: a second process (another test worker, another rank) waits for the
    # first and then reuses its world instead of building the same one into the same ".partial".
    with FileLock(str(final.with_name(final.name + ".lock"))):
        if not force and _is_built(final, cfg):
            return final
        previous_threads = torch.get_num_threads()
        if threads is not None:
            torch.set_num_threads(threads)
        try:
            return _build(cfg, final, progress)
        finally:
            torch.set_num_threads(previous_threads)


def _is_built(final: Path, cfg: TinyWorldConfig) -> bool:
    meta_file = final / "metadata.json"
    return meta_file.is_file() and json.loads(meta_file.read_text()).get("fingerprint") == cfg.fingerprint()


def _build(cfg: TinyWorldConfig, final: Path, progress: bool) -> Path:
    from ..drafter import Eagle3Drafter
    from ..drafter.train import select_draft_vocab, train_offline
    from ..engine import EngineConfig, SamplingParams, SpeculativeEngine

    work = final.with_name(final.name + ".partial")  # built aside, renamed when complete
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    timings: dict[str, float] = {}
    steps = tqdm(total=5, desc=f"tinyworld {cfg.name}", disable=not progress)
    torch.manual_seed(cfg.seed)

    t0 = time.perf_counter()
    train, heldout = _problems(cfg)
    corpus = [p["question"] for p in train] + [p["answer"] for p in train]
    tokenizer = train_tokenizer(corpus, cfg.vocab_size)
    timings["task_and_tokenizer_s"] = time.perf_counter() - t0
    steps.update()

    t0 = time.perf_counter()
    target = AutoModelForCausalLM.from_config(_target_config(cfg, tokenizer))
    eos = tokenizer.eos_token_id
    examples = [
        (chat_prompt_ids(tokenizer, p["question"]), [*tokenizer(p["answer"]).input_ids, eos]) for p in train
    ]
    sft_metrics = sft_train(target, examples, tokenizer.pad_token_id, cfg.sft, progress=progress)
    target.generation_config = GenerationConfig(eos_token_id=eos, pad_token_id=tokenizer.pad_token_id)
    target.save_pretrained(work / "target")
    tokenizer.save_pretrained(work / "target")
    timings["sft_s"] = time.perf_counter() - t0
    steps.update()

    # the head learns from the target's own responses (sampled at T = 1, as RL rollouts are)
    t0 = time.perf_counter()
    prompts = [chat_prompt_ids(tokenizer, p["question"]) for p in train[: cfg.n_draft_prompts]]
    plain = SpeculativeEngine(target, config=EngineConfig(max_batch_size=64))
    sp = SamplingParams(temperature=1.0, max_new_tokens=cfg.max_new_tokens, seed=cfg.seed, eos_token_id=eos)
    responses = plain.generate(prompts, sp)
    sequences = [t.prompt_ids + t.completion_ids for t in responses]
    vocab_ids = select_draft_vocab(
        [t.completion_ids for t in responses], cfg.draft_vocab_size, len(tokenizer)
    )
    head = Eagle3Drafter.from_target(target, token_ids=vocab_ids)
    draft_metrics = train_offline(
        target,
        head,
        sequences,
        epochs=cfg.draft_epochs,
        batch_size=cfg.draft_batch_size,
        max_len=max(len(s) for s in sequences),
        lr=cfg.draft_lr,
        out_dir=work / "draft",
        resume=False,
        progress=progress,
        seed=cfg.seed,
        prompt_lens=[len(t.prompt_ids) for t in responses],  # learn what it will draft: responses
    )
    timings["draft_s"] = time.perf_counter() - t0
    steps.update()

    # measure the held-out accuracy and the acceptance this world gives, strict and mars
    t0 = time.perf_counter()
    eval_prompts = [chat_prompt_ids(tokenizer, p["question"]) for p in heldout]
    measured = {}
    for rule in ("strict", "mars"):
        eng = SpeculativeEngine(target, head, EngineConfig(rule=rule, num_draft_tokens=7, max_batch_size=64))
        trajs = eng.generate(eval_prompts, sp)
        correct = [
            score(tokenizer.decode(t.completion_ids, skip_special_tokens=True), p["gold"])
            for t, p in zip(trajs, heldout, strict=True)
        ]
        measured[rule] = {"accuracy": sum(correct) / len(correct), "tau": eng.stats["tau"], "n": len(correct)}
    timings["eval_s"] = time.perf_counter() - t0
    steps.update()

    meta = {
        "fingerprint": cfg.fingerprint(),
        "marsrl_version": __version__,
        "format": WORLD_FORMAT,
        "config": asdict(cfg),
        "target_params": sum(p.numel() for p in target.parameters()),
        "tokenizer_size": len(tokenizer),
        "sft": sft_metrics,
        "draft_training": draft_metrics,
        "draft_vocab_size": int(vocab_ids.numel()),
        "measured_at_build": measured,
        "timings_s": timings,
        "torch": torch.__version__,
    }
    (work / "metadata.json").write_text(json.dumps(meta, indent=2, default=str))
    steps.update()
    steps.close()
    if final.exists():
        shutil.rmtree(final)
    work.rename(final)
    return final


def load_tinyworld(path: str | Path, device: str | torch.device = "cpu"):
    """(target, tokenizer, drafter, metadata) of a built world."""
    from ..drafter import Eagle3Drafter

    path = Path(path)
    meta_file = path / "metadata.json"
    if not meta_file.is_file():
        raise FileNotFoundError(
            f"{path} is not a built tiny world (no metadata.json); run `marsrl tinyworld build`"
        )
    target = AutoModelForCausalLM.from_pretrained(path / "target").to(device).eval()
    tokenizer = AutoTokenizer.from_pretrained(path / "target")
    drafter = Eagle3Drafter.from_pretrained(path / "draft", target=target)
    return target, tokenizer, drafter, json.loads(meta_file.read_text())
