"""Teacher forcing of rollouts under a model, and the top-1 / top-2 bias figures of a batch of
trajectories: the model- and trajectory-facing side of ``marsrl.algo``, which holds the arithmetic
(``token_stats``, ``bias_metrics``; the figures are listed there).  Pure: returns figures, logs nothing.

``teacher_forcing`` runs one forward of prompt + completion per batch and reads the policy's statistics
at the completion positions.  For model families whose logits are exactly the final hidden state times
the lm_head weight it takes the backbone's hidden states and the weight (one lm_head matmul over the
completion positions only, in float32); for any other model it takes the model's own logits.
"""

from __future__ import annotations

import torch

from . import algo
from .trajectory import collate

# model_type -> logits are last_hidden_state @ lm_head.weight.T (no softcap, logit scale or bias)
_PLAIN_HEAD = frozenset({"llama", "mistral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe"})


def pad_right(rows: list, dtype: torch.dtype, value=0) -> torch.Tensor:
    """Sequences of numbers (lists or 1-d tensors) -> [N, T] right-padded with ``value``, T the longest."""
    out = torch.full((len(rows), max((len(r) for r in rows), default=0)), value, dtype=dtype)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.as_tensor(r, dtype=dtype)
    return out


def _completion_mask(lengths: list[int]) -> torch.Tensor:
    """[N, T] bool: True on the first lengths[i] positions of row i."""
    t = max(lengths, default=0)
    return torch.arange(t)[None, :] < torch.tensor(lengths, dtype=torch.long)[:, None]


def teacher_forcing(model, trajectories, temperature: float = 1.0, chunk_size: int = 4096):
    """One forward of the right-padded prompt + completion sequences; the policy's ``algo.token_stats``
    at every completion position: ``(stats, mask)``, [N, T] tensors on the model's device (T the longest
    completion).  ``stats["logp"]`` carries gradients unless called under ``torch.no_grad()``."""
    if any(not t.prompt_ids for t in trajectories):
        raise ValueError("teacher_forcing: every trajectory needs a non-empty prompt (it predicts token 0)")
    device = next(model.parameters()).device
    prompt_lens = torch.tensor([len(t.prompt_ids) for t in trajectories])
    lengths = [len(t.completion_ids) for t in trajectories]
    ids = pad_right([t.prompt_ids + t.completion_ids for t in trajectories], torch.long).to(device)
    attn = _completion_mask([len(t.prompt_ids) + n for t, n in zip(trajectories, lengths, strict=True)])
    mask = _completion_mask(lengths).to(device)
    completion = pad_right([t.completion_ids for t in trajectories], torch.long).to(device)  # [N, T]
    # the position whose output predicts completion token j: prompt_len - 1 + j (clamped in the padding)
    pos = (prompt_lens[:, None] - 1 + torch.arange(mask.shape[1])).clamp(max=ids.shape[1] - 1).to(device)
    head = model.get_output_embeddings()
    inputs = {"input_ids": ids, "attention_mask": attn.long().to(device)}
    if model.config.model_type in _PLAIN_HEAD and isinstance(head, torch.nn.Linear) and head.bias is None:
        hidden = model.base_model(**inputs).last_hidden_state  # [N, L, H]
        hidden = hidden.gather(1, pos[..., None].expand(-1, -1, hidden.shape[-1]))  # [N, T, H]
        stats, _ = algo.token_stats(
            completion, temperature, hidden=hidden, weight=head.weight, mask=mask, chunk_size=chunk_size
        )
    else:
        logits = model(**inputs).logits
        logits = logits.gather(1, pos[..., None].expand(-1, -1, logits.shape[-1]))  # [N, T, V]
        stats, _ = algo.token_stats(completion, temperature, logits=logits, mask=mask, chunk_size=chunk_size)
    return stats, mask


@torch.no_grad()
def teacher_forced(target, trajectories, temperature: float = 1.0, batch_size: int = 32) -> list[dict]:
    """Per trajectory, on the CPU: the policy's log-prob of each completion token (``logp``) and whether
    it is the policy's top-1 / top-2 there (``is_t1`` / ``is_t2``, with ``p_t1`` / ``p_t2``), each of
    length len(completion_ids); ``teacher_forcing`` in batches of ``batch_size``."""
    out = []
    for s in range(0, len(trajectories), batch_size):
        chunk = trajectories[s : s + batch_size]
        stats, _ = teacher_forcing(target, chunk, temperature)
        stats = {k: v.cpu() for k, v in stats.items()}
        out += [{k: v[i, : len(t.completion_ids)] for k, v in stats.items()} for i, t in enumerate(chunk)]
    return out


def bias_metrics(trajectories, forced: list[dict]) -> dict[str, float]:
    """The bias figures of a batch (``marsrl.algo.bias_metrics``), from trajectories (``collate``d) and
    their ``teacher_forced`` recomputation."""
    batch = collate(trajectories)
    pad = {k: pad_right([f[k] for f in forced], torch.float64) for k in algo.STAT_KEYS}
    _, figures = algo.bias_metrics(
        pad["logp"],
        batch["behavior_logprobs"],
        pad["is_t1"].bool(),
        pad["is_t2"].bool(),
        pad["p_t1"],
        pad["p_t2"],
        batch["provenance"],
        batch["mask"],
        batch["unsupported_mass"],
    )
    return figures
