"""Shared pieces of the rollout and integration tests: the one Ray cluster of the test session, tiny
models built from configs (no hub), and trajectory comparison."""

from __future__ import annotations

import os
import shutil
import tempfile
import time

import torch

from marsrl.drafter import Eagle3Drafter
from marsrl.testing import tiny_causal_lm

_STARTED_HERE = False
_OWN_TMP: list[str] = []


def start_ray() -> None:
    """One local cluster for the whole pytest session (2 CPUs, no dashboard, temp dir under /tmp).
    Idempotent: every conftest that needs Ray calls it through its session fixture."""
    global _STARTED_HERE
    import ray

    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if "RAY_TMPDIR" not in os.environ:
        _OWN_TMP.append(tempfile.mkdtemp(prefix="ray-", dir="/tmp"))  # short: socket paths are limited
        os.environ["RAY_TMPDIR"] = _OWN_TMP[-1]
    ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1", logging_level="WARNING")
    _STARTED_HERE = True


def stop_ray() -> None:
    global _STARTED_HERE
    import ray

    if _STARTED_HERE and ray.is_initialized():
        ray.shutdown()
    _STARTED_HERE = False
    while _OWN_TMP:
        shutil.rmtree(_OWN_TMP.pop(), ignore_errors=True)


def tiny_qwen3(vocab: int = 64, layers: int = 4, seed: int = 0, max_positions: int = 128, **extra):
    """A 4-layer Qwen3 with H = 32, sharpened lm_head (sampling has structure), no special tokens."""
    return tiny_causal_lm(vocab=vocab, layers=layers, seed=seed, max_positions=max_positions, **extra)


def tiny_head(target, seed: int = 1) -> Eagle3Drafter:
    """A random EAGLE-3 head for ``target`` (shares its embedding)."""
    torch.manual_seed(seed)
    return Eagle3Drafter.from_target(target)


class StallOnce:
    """A ``propose`` drafter that drafts as ``inner`` does, except that the first call to find the file
    ``armed`` (in any process) renames it away and then sleeps ``seconds``: a rollout actor that hangs
    mid-request while its process stays alive. The rename is atomic, so exactly one call stalls and a
    replacement actor built from the same pickled drafter does not stall again."""

    def __init__(self, inner, armed: str, seconds: float = 600.0):
        self.inner, self.armed, self.seconds = inner, str(armed), seconds

    def propose(self, sequences, k):
        try:
            os.rename(self.armed, self.armed + ".fired")
        except FileNotFoundError:
            pass
        else:
            time.sleep(self.seconds)
        return self.inner.propose(sequences, k)


def record(t) -> tuple:
    """Everything a trajectory says, for exact comparison."""
    return (
        tuple(t.prompt_ids),
        tuple(t.completion_ids),
        tuple(t.provenance),
        tuple(t.target_logprobs),
        tuple(t.behavior_logprobs),
        tuple(t.logit_ratio),
        tuple(t.is_top2),
        tuple(t.draft_position),
        t.finish_reason,
        t.rule,
        t.theta,
        tuple(sorted(t.stats.items())),
        t.policy_version,
    )


WORDS = ["the", "cat", "dog", "sat", "ran", "on", "a", "mat", "big", "small"]
WORDS += ["red", "blue", "yes", "no", "one", "two", "three", "four"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def sentences(count: int, seed: int = 0) -> list[str]:
    """Random sentences over WORDS (3 to 9 words)."""
    import random

    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 9))) for _ in range(count)]


def tiny_tokenizer():
    """A word-level tokenizer trained on 300 generated sentences, with pad / unk / eos and a chat
    template (built with the ``tokenizers`` library: nothing is downloaded)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    specials = ["<pad>", "<unk>", "<eos>", "<|user|>", "<|assistant|>"]
    tok.train_from_iterator(sentences(300), trainers.WordLevelTrainer(special_tokens=specials))
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>", eos_token="<eos>"
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def save_tiny_world(folder) -> str:
    """A tiny Qwen3 policy sized for tiny_tokenizer, saved with that tokenizer in ``folder``."""
    tokenizer = tiny_tokenizer()
    model = tiny_qwen3(
        vocab=len(tokenizer), eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)
