"""``check_prompts``: the one check of a batch of prompts against a model, with one message per fault.

The pool checks a batch before any work starts, a worker checks each request it runs (naming the
request) and the engine checks what it is asked to decode; all three call this.  It is on the ground
floor: it imports nothing from marsrl and knows a model only by its vocabulary size and context length.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence


def check_prompts(
    prompt_ids, vocab_size: int, max_seq_len: int | None, where: str = "prompt_ids"
) -> list[list[int]]:
    """Token-id lists checked against the model and returned as lists of Python ints: a non-empty
    sequence of non-empty sequences of ints (Python or NumPy, not bools) in [0, vocab_size), each with
    room for at least one new token within max_seq_len (None: no limit).  Raises ValueError naming
    ``where`` and the prompt's index."""
    if isinstance(prompt_ids, (str, bytes)) or not isinstance(prompt_ids, Sequence) or not prompt_ids:
        raise ValueError(f"{where} must be a non-empty list of token-id lists")
    out = []
    for i, p in enumerate(prompt_ids):
        if isinstance(p, (str, bytes)):
            raise ValueError(f"{where}[{i}] is a string; tokenize it first (token-id lists expected)")
        if not isinstance(p, Sequence):
            raise ValueError(f"{where}[{i}] is not a list of token ids (got {type(p).__name__})")
        if not p:
            raise ValueError(f"{where}[{i}] is empty")
        if not all(isinstance(t, numbers.Integral) and not isinstance(t, bool) for t in p):
            raise ValueError(f"{where}[{i}] holds non-integer entries; token ids must be ints")
        ids = [int(t) for t in p]
        bad = [t for t in ids if not 0 <= t < vocab_size]
        if bad:
            raise ValueError(
                f"{where}[{i}] has token ids outside the vocabulary [0, {vocab_size}): {bad[:5]}"
            )
        if max_seq_len is not None and len(ids) + 1 > max_seq_len:
            raise ValueError(
                f"{where}[{i}] has {len(ids)} tokens; the model's context is {max_seq_len} "
                "(prompt + at least one new token must fit)"
            )
        out.append(ids)
    return out
