"""The maths of EAGLE-3's single decoder layer ("midlayer"): RMSNorm, RoPE, cached GQA attention with an
additive mask, SwiGLU.  Module and parameter names match the published checkpoints.

Attention runs through torch's fused ``scaled_dot_product_attention`` with the caller's additive mask;
``attend`` writes the same maths out (float32 softmax, query chunks that bound the [chunk, S] score
matrix) as the reference the tests hold it to.  Training-time-test unrolls use ``TTTBlocks`` instead.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from .config import Eagle3Config

# Largest float32 score block per chunk (elements): bounds prefill memory at ~512 MB.
_SCORE_BUDGET = 2**27


class RMSNorm(nn.Module):
    """y = weight * x / rms(x), the normalisation in float32 (as Llama)."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32 and self.weight.dtype == torch.float32:  # the same maths in one op
            return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)
        h = F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps)  # x / sqrt(mean(x^2) + eps), in float32
        return self.weight * h.to(x.dtype)


def rope_cos_sin(
    position_ids: torch.Tensor, head_dim: int, theta: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin tables [B, T, head_dim] float32 for integer positions [B, T] (Llama's layout:
    frequency i at columns i and i + head_dim/2).  No clamping to any maximum length."""
    inv_freq = _inv_freq(head_dim, float(theta), position_ids.device)  # [hd]: each frequency twice
    angles = position_ids.float().unsqueeze(-1) * inv_freq  # [B, T, hd]
    return angles.cos(), angles.sin()


@functools.lru_cache(maxsize=16)
def _inv_freq(head_dim: int, theta: float, device: torch.device) -> torch.Tensor:
    """theta ** (-2i / head_dim) for i < head_dim / 2, laid out twice ([f, f], Llama's columns i and
    i + hd/2), float32 (cached: one per head shape and device; made outside inference mode so a table
    first built while generating also serves training)."""
    with torch.inference_mode(False):
        exponent = torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim
        freqs = 1.0 / (theta**exponent)
        return torch.cat([freqs, freqs])


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [B, heads, T, hd] by the tables [B, T, hd] (rotate_half convention), in float32."""
    h = x.float()
    half = h.shape[-1] // 2
    rotated = torch.cat([-h[..., half:], h[..., :half]], dim=-1)
    return (h * cos.unsqueeze(1) + rotated * sin.unsqueeze(1)).to(x.dtype)


def causal_mask(q_len: int, kv_len: int, device: torch.device) -> torch.Tensor | None:
    """Additive float32 mask [1, 1, T, S]: new query t (at cache offset S - T) sees keys <= S - T + t.

    None when T == 1 (one new query sees every key)."""
    if q_len == 1:
        return None
    q_pos = torch.arange(q_len, device=device).unsqueeze(1) + (kv_len - q_len)  # [T, 1]
    k_pos = torch.arange(kv_len, device=device).unsqueeze(0)  # [1, S]
    mask = torch.zeros(q_len, kv_len, device=device)
    return mask.masked_fill(k_pos > q_pos, torch.finfo(torch.float32).min)[None, None]


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """softmax(q k^T / sqrt(hd) + mask) v with GQA, the softmax in float32.

    q [B, Hq, T, hd], k/v [B, Hkv, S, hd] (Hq a multiple of Hkv; query head h reads kv head h // (Hq/Hkv)),
    mask [B or 1, 1, T, S] additive float or None -> [B, Hq, T, hd].  A query whose keys are all at
    -inf yields NaN; use a large negative finite value (as ``causal_mask``) if that can happen.
    """
    bsz, n_q, q_len, hd = q.shape
    n_kv, kv_len = k.shape[1], k.shape[2]
    rep = n_q // n_kv
    qg = q.view(bsz, n_kv, rep, q_len, hd)  # group query heads by their kv head (no kv copy)
    kt = k.transpose(-1, -2).unsqueeze(2)  # [B, Hkv, 1, hd, S]
    vg = v.unsqueeze(2)  # [B, Hkv, 1, S, hd]
    chunk = max(1, _SCORE_BUDGET // max(1, bsz * n_q * kv_len))
    outs = []
    for start in range(0, q_len, chunk):
        stop = min(start + chunk, q_len)
        scores = torch.matmul(qg[..., start:stop, :], kt).float() * hd**-0.5  # [B, Hkv, rep, C, S]
        if mask is not None:
            scores = scores + mask[:, :, None, start:stop, :].float()  # [B|1, 1, 1, C, S]
        probs = torch.softmax(scores, dim=-1).to(v.dtype)
        outs.append(torch.matmul(probs, vg))  # [B, Hkv, rep, C, hd]
    return torch.cat(outs, dim=3).reshape(bsz, n_q, q_len, hd)


class TTTBlocks:
    """Keys and values of a training-time-test unroll: one block of T per step, and its attention rule.

    Step j's query row t sees block 0's keys s <= t that are real (``key_valid``; always its own) and
    row t of blocks 1..j: causal over the first block plus the diagonal of every later one.  Rather than
    a dense [T, (j+1)*T] score matrix that is mostly masked, block 0 gives a [T, T] matrix and every later
    block one score per row (a batched dot product), so a step costs O(T^2 + jT), not O(jT^2).  The
    result equals ``attend`` with the dense mask ``marsrl.drafter.train.ttt_attention_mask`` (tested).

    key_valid: [B, T] bool real tokens.
    """

    def __init__(self, key_valid: torch.Tensor) -> None:
        t = key_valid.shape[1]
        lower = torch.ones(t, t, dtype=torch.bool, device=key_valid.device).tril()
        allowed = (lower & key_valid.unsqueeze(1)) | torch.eye(t, dtype=torch.bool, device=key_valid.device)
        zero = torch.zeros((), device=key_valid.device)
        self.mask0 = torch.where(allowed, zero, torch.finfo(torch.float32).min)[:, None, None]  # [B,1,1,T,T]
        self.keys: list[torch.Tensor] = []  # per step [B, Hkv, T, hd]
        self.values: list[torch.Tensor] = []

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Append this step's k, v [B, Hkv, T, hd] and attend q [B, Hq, T, hd] -> [B, Hq, T, hd]."""
        self.keys.append(k)
        self.values.append(v)
        bsz, n_q, q_len, hd = q.shape
        n_kv = k.shape[1]
        qg = q.view(bsz, n_kv, n_q // n_kv, q_len, hd)  # [B, Hkv, rep, T, hd]
        scale = hd**-0.5
        first = torch.matmul(qg, self.keys[0].transpose(-1, -2).unsqueeze(2)).float() * scale + self.mask0
        scores = [first]  # [B, Hkv, rep, T, T]
        if len(self.keys) > 1:
            # one score per row and later block: batched small matmuls over t (no [.., T, j, hd] product)
            later_k = torch.stack(self.keys[1:], dim=3)  # [B, Hkv, T, j, hd]
            scores.append(
                torch.einsum("bhrtd,bhtjd->bhrtj", qg, later_k).float() * scale
            )  # [B, Hkv, rep, T, j]
        probs = torch.softmax(torch.cat(scores, dim=-1), dim=-1).to(v.dtype)
        out = torch.matmul(probs[..., :q_len], self.values[0].unsqueeze(2))  # [B, Hkv, rep, T, hd]
        if len(self.keys) > 1:
            later_v = torch.stack(self.values[1:], dim=3)  # [B, Hkv, T, j, hd]
            out = out + torch.einsum("bhrtj,bhtjd->bhrtd", probs[..., q_len:], later_v)
        return out.reshape(bsz, n_q, q_len, hd)


class Eagle3Attention(nn.Module):
    """q/k/v take the 2H-wide [embedding, hidden] input; o_proj returns to H.  No biases."""

    def __init__(self, cfg: Eagle3Config) -> None:
        super().__init__()
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = cfg.num_key_value_heads
        self.head_dim = cfg.head_dim
        width = 2 * cfg.hidden_size
        self.q_proj = nn.Linear(width, self.num_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(width, self.num_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(width, self.num_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, cfg.hidden_size, bias=False)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        cache,
        attention_mask: torch.Tensor | None,
    ) -> torch.Tensor:
        """x [B, T, 2H], cos/sin [B, T, hd], cache (layer 0 is ours) -> [B, T, H]."""
        bsz, q_len, _ = x.shape
        q = self.q_proj(x).view(bsz, q_len, -1, self.head_dim).transpose(1, 2)  # [B, Hq, T, hd]
        k = self.k_proj(x).view(bsz, q_len, -1, self.head_dim).transpose(1, 2)  # [B, Hkv, T, hd]
        v = self.v_proj(x).view(bsz, q_len, -1, self.head_dim).transpose(1, 2)  # [B, Hkv, T, hd]
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if isinstance(cache, TTTBlocks):  # training-time test: its own block-sparse rule, no mask
            if attention_mask is not None:
                raise ValueError("attention_mask must be None with TTTBlocks (the blocks define the mask)")
            out = cache.attend(q, k, v)
            return self.o_proj(out.transpose(1, 2).reshape(bsz, q_len, self.num_heads * self.head_dim))
        if cache is not None:
            k, v = cache.update(k, v, 0)  # appended: [B, Hkv, S, hd], S = cached + T
        kv_len = k.shape[2]
        if attention_mask is None:
            attention_mask = causal_mask(q_len, kv_len, x.device)  # None for one query: it sees every key
        else:
            _check_mask(attention_mask, bsz, q_len, kv_len)
        # fused attention (one op instead of ~15: this layer runs once per drafted token); ``attend`` is its
        # written-out reference (tests/drafter/test_forward.py)
        out = F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=None if attention_mask is None else attention_mask.to(q.dtype),
            enable_gqa=self.num_heads != self.num_kv_heads,
        )  # [B, Hq, T, hd]
        return self.o_proj(out.transpose(1, 2).reshape(bsz, q_len, self.num_heads * self.head_dim))


def _check_mask(mask: torch.Tensor, bsz: int, q_len: int, kv_len: int) -> None:
    if not torch.is_floating_point(mask):
        raise ValueError(
            f"attention_mask must be an additive float mask (0 = visible, large negative = hidden), "
            f"got dtype {mask.dtype}"
        )
    if (
        mask.dim() != 4
        or mask.shape[1] != 1
        or mask.shape[0] not in (1, bsz)
        or mask.shape[2:]
        != (
            q_len,
            kv_len,
        )
    ):
        raise ValueError(
            f"attention_mask must be [B, 1, T, S] = [{bsz}, 1, {q_len}, {kv_len}] (S = cached + new "
            f"tokens), got {list(mask.shape)}"
        )


class Eagle3MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)), no biases."""

    def __init__(self, cfg: Eagle3Config) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Eagle3MidLayer(nn.Module):
    """EAGLE-3's decoder layer: attention over [norm(emb), norm(hidden)], residual = the INPUT hidden."""

    def __init__(self, cfg: Eagle3Config) -> None:
        super().__init__()
        self.self_attn = Eagle3Attention(cfg)
        self.mlp = Eagle3MLP(cfg)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(
        self,
        emb: torch.Tensor,
        hidden: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        cache,
        attention_mask: torch.Tensor | None,
    ) -> torch.Tensor:
        """emb, hidden [B, T, H] -> g [B, T, H] (pre-norm output)."""
        x = torch.cat([self.input_layernorm(emb), self.hidden_norm(hidden)], dim=-1)  # [B, T, 2H]
        g = hidden + self.self_attn(x, cos, sin, cache, attention_mask)
        return g + self.mlp(self.post_attention_layernorm(g))
