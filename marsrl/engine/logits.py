"""The target's logits at the verify positions, in float32 whatever the model's dtype."""

from __future__ import annotations

import torch


def fp32_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., H] times weight [V, H] transposed (plus bias [V]) -> float32 [..., V], for half-precision
    weights.  On CUDA one GEMM in the weight's dtype with float32 output (``torch.mm(out_dtype=)``, no
    float32 copy of the weight); elsewhere, or where that overload is missing, the operands are upcast
    in blocks of 8,192 vocabulary rows so the float32 weight is never whole in memory.

    Why float32 output: a bf16 GEMM output rounds z2/z1 by up to ~1e-2 and makes exact ties, right
    where the margin rule decides; the GEMM's inputs stay in the model's dtype."""
    flat = x.reshape(-1, x.shape[-1])
    out = None
    if x.device.type == "cuda":
        try:
            out = torch.mm(flat, weight.t(), out_dtype=torch.float32)
        except (RuntimeError, TypeError):
            out = None
    if out is None:
        xf = flat.float()
        out = torch.cat([xf @ w.float().t() for w in weight.split(8192)], 1)
    if bias is not None:
        out = out + bias.float()
    return out.view(*x.shape[:-1], weight.shape[0])


def lm_head_logits(head: torch.nn.Module, hidden: torch.Tensor, fp32: bool) -> torch.Tensor:
    """Logits [..., V] in float32 of ``hidden`` [..., H] through the target's ``lm_head``; ``fp32``:
    computed with float32 output (``fp32_linear``, for half-precision targets), else cast after."""
    if not fp32:
        return head(hidden).float()
    return fp32_linear(hidden, head.weight, getattr(head, "bias", None))
