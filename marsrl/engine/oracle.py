"""A test and benchmark drafter that replays the target's own greedy continuation at no cost.

It shows the engine's ceiling: under strict greedy verification every draft is accepted, so tau is
exactly K + 1. It is not a real drafter (it needs the target's answer in advance) and is never used in
training. Any object with ``propose(sequences, k) -> LongTensor [B, k]`` can drive the engine the
same way.
"""

from __future__ import annotations

import torch


class OracleDrafter:
    def __init__(self, continuations: dict[tuple[int, ...], list[int]], pad_token: int = 0):
        self.continuations = continuations  # prompt -> the target's greedy completion
        self.pad_token = pad_token

    @classmethod
    def from_target(cls, target, prompts: list[list[int]], max_new_tokens: int) -> OracleDrafter:
        """Precompute greedy continuations (prompt by prompt, so no padding enters the answer)."""
        device = next(target.parameters()).device
        table = {}
        with torch.inference_mode():
            for p in prompts:
                ids = torch.tensor([p], device=device)
                out = target.generate(
                    ids,
                    attention_mask=torch.ones_like(ids),
                    do_sample=False,
                    max_new_tokens=max_new_tokens,
                    min_new_tokens=max_new_tokens,
                    pad_token_id=0,
                )
                table[tuple(p)] = out[0, len(p) :].tolist()
        return cls(table)

    def propose(self, sequences: list[list[int]], k: int) -> torch.Tensor:
        """For each full sequence (prompt + completion so far), the next k tokens of the stored answer."""
        out = []
        for seq in sequences:
            drafts = []
            for prompt, answer in self.continuations.items():
                if tuple(seq[: len(prompt)]) == prompt:
                    done = len(seq) - len(prompt)
                    drafts = answer[done : done + k]
                    break
            out.append(drafts + [self.pad_token] * (k - len(drafts)))
        return torch.tensor(out, dtype=torch.long)
