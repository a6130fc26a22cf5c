"""Rollout requests: the unit a pool schedules, retries and seeds, and the pure functions that cut a
batch of prompts into them (``marsrl.prompts.check_prompts`` checks the prompts before any work starts).

A request is ONE engine call (one ``SpeculativeEngine.generate``, hence one random stream seeded by its
own ``sampling.seed``). Its trajectories are therefore the same whichever actor runs it, and however
often it is re-run after a failure: the split decides the samples, the schedule does not.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..engine import SamplingParams


@dataclass(frozen=True)
class RolloutRequest:
    """Prompts completed ``sampling.n`` times each in one engine call (completions grouped by prompt)."""

    request_id: int  # position in its batch's plan
    prompt_ids: tuple[tuple[int, ...], ...]  # P prompts
    sampling: SamplingParams  # seed already derived for this request
    first_prompt: int = 0  # index of prompt_ids[0] in the caller's batch (messages, ordering)

    @property
    def num_trajectories(self) -> int:
        return len(self.prompt_ids) * self.sampling.n

    def describe(self) -> str:
        last = self.first_prompt + len(self.prompt_ids) - 1
        return (
            f"request {self.request_id} (prompts {self.first_prompt}..{last} of the batch, "
            f"n={self.sampling.n}, seed={self.sampling.seed})"
        )


def request_seed(seed: int, request_id: int) -> int:
    """The seed of request ``request_id`` of a batch sampled with ``seed``.

    Request 0 keeps ``seed`` (a one-request batch equals ``engine.generate`` with the same params); the
    others get well-mixed 63-bit seeds, so no two requests of a batch share a random stream."""
    if request_id == 0:
        return int(seed)
    state = np.random.SeedSequence([int(seed) & (2**63 - 1), int(request_id)]).generate_state(2, np.uint32)
    return int((int(state[0]) << 31) ^ int(state[1]))


def plan_requests(
    prompt_ids: Sequence[Sequence[int]],
    sampling: SamplingParams,
    *,
    num_requests: int | None = None,
    prompts_per_request: int | None = None,
) -> list[RolloutRequest]:
    """Cut a batch into contiguous requests: ``num_requests`` near-equal parts (earlier parts one prompt
    larger), or parts of ``prompts_per_request`` prompts. A prompt's n completions never straddle two
    requests. Request r samples with ``request_seed(sampling.seed, r)``."""
    if (num_requests is None) == (prompts_per_request is None):
        raise ValueError("pass exactly one of num_requests and prompts_per_request")
    total = len(prompt_ids)
    if prompts_per_request is not None:
        if prompts_per_request < 1:
            raise ValueError(f"prompts_per_request must be >= 1, got {prompts_per_request}")
        sizes = [min(prompts_per_request, total - s) for s in range(0, total, prompts_per_request)]
    else:
        if num_requests < 1:
            raise ValueError(f"num_requests must be >= 1, got {num_requests}")
        parts = min(num_requests, total)
        sizes = [total // parts + (r < total % parts) for r in range(parts)]
    out, start = [], 0
    for r, size in enumerate(sizes):
        chunk = tuple(tuple(int(t) for t in p) for p in prompt_ids[start : start + size])
        sp = dataclasses.replace(sampling, seed=request_seed(sampling.seed, r))
        out.append(RolloutRequest(r, chunk, sp, first_prompt=start))
        start += size
    return out
