"""Verifiable rewards for GSM8K-format answers, usable directly as TRL reward functions.

TRL calls ``reward_func(prompts=..., completions=..., completion_ids=..., **dataset_columns)`` and logs
the function's ``__name__``; a completion is a string or a list of chat messages whose last one holds
the model's text.  ``gsm8k_reward`` is the exact numeric match of ``extract_answer`` against the gold
answer (column ``answer``, the full GSM8K answer text or a bare number; else column ``gold``);
``format_reward`` checks only that the text ends with a well-formed ``#### <number>`` line.

Left out on purpose: partial credit, a fallback to the last number when ``####`` is missing (a model
that skips the marker scores 0; ``extract_last_number`` is there for analysis), and tolerance for
rounding -- canonical strings compare exactly, so "12.0" equals "12" but "12.01" does not.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from .gsm8k import canonical_number, extract_answer

# The last non-blank line: "#### " then one number (optional sign, thousands commas, decimals).
_FORMAT_LINE = re.compile(r"####[ \t]*-?(\d{1,3}(,\d{3})+|\d+)(\.\d+)?")


def completion_text(completion: Any) -> str:
    """The text of one completion: the string itself, or the content of the last chat message."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, Sequence) and completion and isinstance(completion[-1], dict):
        content = completion[-1].get("content")
        if isinstance(content, str):
            return content
    raise ValueError(
        "completions: each entry must be a string or a list of chat messages ending in "
        f"{{'role': ..., 'content': str}}, got {type(completion).__name__}: {completion!r:.80}"
    )


def gold_value(gold: str | int | float) -> str:
    """Canonical gold answer from the full GSM8K answer text ("... #### 18") or a bare number."""
    text = str(gold)
    value = extract_answer(text) if "####" in text else canonical_number(text)
    if value is None:
        raise ValueError(f"answer: {text!r:.80} is neither a number nor text ending in '#### <number>'")
    return value


def score(completion: str, gold: str) -> float:
    """1.0 when the number after the completion's last ``####`` equals ``gold``, else 0.0."""
    return 1.0 if extract_answer(completion) == gold_value(gold) else 0.0


def _per_sample(name: str, values: Any, n: int) -> list:
    if isinstance(values, (str, int, float)):
        return [values] * n
    values = list(values)
    if len(values) != n:
        raise ValueError(f"{name}: {len(values)} entries for {n} completions")
    return values


def gsm8k_reward(
    prompts: list | None = None, completions: list | None = None, answer: list | None = None, **kwargs
) -> list[float]:
    """Exact-match reward per completion: 1.0 when its ``#### <number>`` equals the gold number.

    ``answer`` (one per completion, or one for all) is GSM8K answer text or a bare number; without it
    the ``gold`` column (passed by TRL as a keyword) is used.  ``prompts`` and the rest are ignored.
    """
    if completions is None:
        raise ValueError("completions: required")
    golds = answer if answer is not None else kwargs.get("gold")
    if golds is None:
        raise ValueError("answer: required (or a 'gold' column) to score GSM8K completions")
    golds = _per_sample("answer", golds, len(completions))
    return [score(completion_text(c), g) for c, g in zip(completions, golds, strict=True)]


def format_reward(completions: list | None = None, **kwargs) -> list[float]:
    """1.0 per completion whose last non-blank line is exactly ``#### <number>``, else 0.0."""
    if completions is None:
        raise ValueError("completions: required")
    out = []
    for c in completions:
        lines = completion_text(c).rstrip().rsplit("\n", 1)
        out.append(1.0 if _FORMAT_LINE.fullmatch(lines[-1].strip()) else 0.0)
    return out
