"""The maths of EAGLE-3's single decoder layer ("midlayer"): RMSNorm, RoPE, cached GQA attention with an
additive mask, SwiGLU.  Module and parameter names match the published checkpoints.

Attention runs through torch's fused ``scaled_dot_product_attention`` (``grouped_attention``: GQA by
folding query heads into the query axis, never repeating K/V; query blocks bound prefill memory).
Training-time-test unrolls use ``TTTBlocks``: the same fused kernel for their block-sparse rule, so no
[T, T] scores are kept for backward.  The slow references (explicit scores and softmax) live in the tests.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from .config import Eagle3Config

# ``grouped_attention`` on a CPU: False = one SDPA call with enable_gqa (the CPU kernel's own GQA) except
# for short query blocks (``FOLD_CPU_QUERIES``), True = the folded path every other device takes at every
# length (the tests set it to check that path here)
FOLD_ON_CPU = False
# Query lengths the CPU folds anyway: for a block of 2-8 queries (the absorb of a round's pairs) the folded
# call is faster than torch's own GQA with a mask at batches of 32 rows and more, and about even at a few
# rows; one query, and 16 or more, run as fast or faster unfolded (``python -m bench.round_kernels``
# measures both ways; its figures are in docs/benchmarks.md).  A rule on the query length alone: one on
# the batch size would give a group's shared prompt (one row) and its unshared copies (G rows) different
# kernels, and their trajectories must stay bit-identical.
FOLD_CPU_QUERIES = range(2, 9)
# Query block size of ``grouped_attention``: B * Hq * C * S <= this many elements (a float32 score block of
# at most 512 MB, were a backend to build one; the folded mask is G/Hq of that).
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


def grouped_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
) -> torch.Tensor:
    """softmax(q k^T / sqrt(hd) + mask) v with GQA, never repeating K/V.

    q [B, Hq, T, hd], k/v [B, Hkv, S, hd] (any strides: views of a preallocated cache are read in place;
    query head h reads kv head h // G, G = Hq / Hkv), mask [B or 1, 1, T, S] additive float or None (every
    query sees every key) -> [B, Hq, T, hd].  A query whose keys are all at -inf yields NaN; use a large
    negative finite value (as ``causal_mask``) if that can happen.

    Each kv head's G query heads are folded into the query axis (q [B, Hkv, G*T, hd], the mask copied over
    G in q's dtype), so SDPA sees plain multi-head attention with a mask and may pick a fused kernel.  With
    ``enable_gqa`` and a mask CUDA can only run the math kernel (mem-efficient has no GQA, flash takes no
    mask): float32 upcast, K/V repeated G times, [B, Hq, T, S] float32 scores.
    Queries go in blocks of C rows with B * Hq * C * S <= ``_SCORE_BUDGET``, which bounds the folded mask
    and, should a backend still fall back to math, its scores (the first absorb after a prefill has
    T = the prompt width).
    """
    bsz, n_q, q_len, hd = q.shape
    n_kv, kv_len = k.shape[1], k.shape[2]
    group = n_q // n_kv
    if q.device.type == "cpu" and not FOLD_ON_CPU and q_len not in FOLD_CPU_QUERIES:
        # torch's CPU flash kernel takes GQA with a mask as it is; folding only adds copies there
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=group > 1)
    qg = q.reshape(bsz, n_kv, group, q_len, hd)  # a view: heads kv*G .. kv*G + G-1 share kv head kv
    chunk = max(1, _SCORE_BUDGET // max(1, bsz * n_q * kv_len))
    if chunk >= q_len:
        return _folded_sdpa(qg, k, v, mask).reshape(bsz, n_q, q_len, hd)
    out = q.new_empty(bsz, n_kv, group, q_len, hd)  # blocks written in place: no second copy to concatenate
    for start in range(0, q_len, chunk):
        stop = min(start + chunk, q_len)
        block_mask = None if mask is None else mask[:, :, start:stop]
        out[:, :, :, start:stop] = _folded_sdpa(qg[:, :, :, start:stop], k, v, block_mask)
    return out.view(bsz, n_q, q_len, hd)


def _folded_sdpa(
    qg: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
) -> torch.Tensor:
    """qg [B, Hkv, G, C, hd] (query head g of kv head h), k/v [B, Hkv, S, hd], mask [B|1, 1, C, S] or None
    -> [B, Hkv, G, C, hd] through one SDPA call over the folded query [B, Hkv, G*C, hd]."""
    bsz, n_kv, group, rows, hd = qg.shape
    folded_q = qg.reshape(bsz, n_kv, group * rows, hd)  # row g*C + c: head g of the group, query c
    folded_mask = None if mask is None else _fold_mask(mask, group, qg.dtype)
    out = F.scaled_dot_product_attention(folded_q, k, v, attn_mask=folded_mask)  # [B, Hkv, G*C, hd]
    return out.reshape(bsz, n_kv, group, rows, hd)


def _fold_mask(mask: torch.Tensor, group: int, dtype: torch.dtype) -> torch.Tensor:
    """[B|1, 1, C, S] -> [B|1, 1, G*C, S] in ``dtype`` (row g*C + c is row c): the layout of a folded query.

    One query row (C == 1) or one group needs no copy beyond the dtype's: a broadcasting view."""
    bm, _, rows, kv_len = mask.shape
    if group == 1:
        return mask.to(dtype)
    if rows == 1:
        return mask.to(dtype).expand(bm, 1, group, kv_len)
    folded = torch.empty(bm, 1, group, rows, kv_len, dtype=dtype, device=mask.device)
    folded.copy_(mask.unsqueeze(2))  # broadcast over G and cast in one copy
    return folded.view(bm, 1, group * rows, kv_len)


# extra head channels of the sink attention in ``TTTBlocks``: 2 carry the sink's score, 1 its weight;
# padded to 8 so the widened head dim keeps fused kernels' alignment
_SINK_CHANNELS = 8


class TTTBlocks:
    """Keys and values of a training-time-test unroll: one block of T per step, and its attention rule.

    Step j's query row t sees block 0's keys s <= t that are real (``key_valid``; always its own) and
    row t of blocks 1..j: causal over the first block plus the diagonal of every later one.  The result
    equals dense masked attention over all (j+1)*T keys with ``marsrl.drafter.ttt.ttt_attention_mask``
    (tested), at O(T^2 + jT) cost per step, and no [T, T] score matrix is kept for backward:

    - Block 0 runs through fused SDPA with the [T, T] mask (folded over the G query heads of each kv head
      as ``grouped_attention`` does; built once per unroll, shared by every step).
    - The j later keys of row t give j scores s_i(t), computed directly.  Their softmax is merged with
      block 0's by one more key, a "sink", appended to block 0: its score for row t is
      L_t = logsumexp_i s_i(t), so SDPA gives block 0's keys exactly their weights in the softmax over all
      keys and the sink the later keys' total weight w_t; row t then adds w_t * softmax(s(t))_i * v_i(t).
      SDPA scores a key alike for every query row, so L_t enters through two extra query channels
      (L_t / scale split into a high and a low part, exact in bfloat16) against sink-key channels of 1
      (block 0's keys: 0), and w_t leaves through an extra value channel (sink 1, block 0: 0).

    key_valid: [B, T] bool real tokens.
    """

    def __init__(self, key_valid: torch.Tensor) -> None:
        t = key_valid.shape[1]
        lower = torch.ones(t, t, dtype=torch.bool, device=key_valid.device).tril()
        eye = torch.eye(t, dtype=torch.bool, device=key_valid.device)
        self.allowed = (lower & key_valid.unsqueeze(1)) | eye  # [B, T, T] block 0's rule
        self.keys: list[torch.Tensor] = []  # per step [B, Hkv, T, hd]
        self.values: list[torch.Tensor] = []
        self._mask: torch.Tensor | None = None  # [B, 1, G*T, T+1] block 0 + sink, built at the first step
        self._sink_kv: tuple[torch.Tensor, torch.Tensor] | None = None  # block 0 + sink [B, Hkv, T+1, hd+8]

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Append this step's k, v [B, Hkv, T, hd] and attend q [B, Hq, T, hd] -> [B, Hq, T, hd]."""
        self.keys.append(k)
        self.values.append(v)
        bsz, n_q, q_len, hd = q.shape
        n_kv = k.shape[1]
        group = n_q // n_kv
        mask = self._folded_mask(group, q.dtype)  # [B, 1, G*T, T+1]
        qg = q.reshape(bsz, n_kv, group, q_len, hd)  # a view
        if len(self.keys) == 1:  # step 0: block 0 only
            folded_q = qg.reshape(bsz, n_kv, group * q_len, hd)
            out = F.scaled_dot_product_attention(folded_q, k, v, attn_mask=mask[..., :q_len])
            return out.reshape(bsz, n_q, q_len, hd)
        scale = hd**-0.5
        later = range(1, len(self.keys))
        # [B, Hkv, G, T, j]: row t against its own key of each later step
        own = [(qg * self.keys[i].unsqueeze(2)).sum(-1, dtype=torch.float32) for i in later]
        scores = torch.stack(own, dim=-1) * scale
        sink_score = torch.logsumexp(scores, dim=-1, keepdim=True) / scale  # [B, Hkv, G, T, 1] float32
        high = sink_score.to(q.dtype)
        low = (sink_score - high.float()).to(q.dtype)
        pad = q.new_zeros(bsz, n_kv, group, q_len, _SINK_CHANNELS - 2)
        wide_q = torch.cat([qg, high, low, pad], dim=-1).view(bsz, n_kv, group * q_len, hd + _SINK_CHANNELS)
        wide_k, wide_v = self._block0_with_sink()
        out = F.scaled_dot_product_attention(wide_q, wide_k, wide_v, attn_mask=mask, scale=scale)
        out = out.reshape(bsz, n_kv, group, q_len, hd + _SINK_CHANNELS)
        later_weights = out[..., hd : hd + 1] * torch.softmax(scores, dim=-1).to(q.dtype)  # [B, Hkv, G, T, j]
        result = out[..., :hd]  # block 0's share
        for n, i in enumerate(later):
            result = result + later_weights[..., n : n + 1] * self.values[i].unsqueeze(2)
        return result.reshape(bsz, n_q, q_len, hd)

    def _folded_mask(self, group: int, dtype: torch.dtype) -> torch.Tensor:
        """Block 0's rule as an additive mask [B, 1, G*T, T+1] in ``dtype`` (row g*T + t is query row t of
        head g; the last column, the sink, always visible).  Rows are padded to a multiple of 16 elements
        (fused kernels' bias alignment) and the view cut back."""
        if self._mask is None:  # one head layout and dtype per unroll
            bsz, t, _ = self.allowed.shape
            width = -(-(t + 1) // 16) * 16
            buf = torch.zeros(bsz, 1, group, t, width, dtype=dtype, device=self.allowed.device)
            buf[..., :t].masked_fill_(~self.allowed[:, None, None], torch.finfo(dtype).min)
            self._mask = buf.view(bsz, 1, group * t, width)[..., : t + 1]
        return self._mask

    def _block0_with_sink(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Block 0's keys and values widened by ``_SINK_CHANNELS`` zeros, with the sink appended: key
        channels hd, hd+1 = 1 (they meet the query's two score channels), value channel hd = 1."""
        if self._sink_kv is None:
            k, v = self.keys[0], self.values[0]
            bsz, n_kv, t, hd = k.shape
            zeros = k.new_zeros(bsz, n_kv, t, _SINK_CHANNELS)
            sink_k = k.new_zeros(bsz, n_kv, 1, hd + _SINK_CHANNELS)
            sink_k[..., hd : hd + 2] = 1
            sink_v = v.new_zeros(bsz, n_kv, 1, hd + _SINK_CHANNELS)
            sink_v[..., hd] = 1
            wide_k = torch.cat([torch.cat([k, zeros], dim=-1), sink_k], dim=2)
            wide_v = torch.cat([torch.cat([v, zeros.to(v.dtype)], dim=-1), sink_v], dim=2)
            self._sink_kv = (wide_k, wide_v)
        return self._sink_kv


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
        out = grouped_attention(q, k, v, attention_mask)  # [B, Hq, T, hd]
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
