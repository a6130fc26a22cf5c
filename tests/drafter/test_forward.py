"""One draft step: a slow float64 reference, incremental decoding through the cache, 4D masks, GQA,
the vocabulary maps and a head built from a target."""

import math

import pytest
import torch
from transformers import DynamicCache
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

from marsrl.drafter import Eagle3Config, Eagle3Drafter, build_vocab_maps
from marsrl.drafter import layers as layers_mod
from marsrl.drafter.layers import apply_rope, rope_cos_sin
from tests.drafter.helpers import H, V, make_head, randomize_
from tests.drafter.reference import explicit_attention

TOL = dict(rtol=1e-5, atol=1e-5)


def _reference_step(d: Eagle3Drafter, ids, hidden, pos):
    """Causal draft step without a cache, in float64 with explicit loops and complex-number RoPE."""
    cfg = d.config
    w = {k: v.double() for k, v in d.state_dict().items() if v.is_floating_point()}

    def rms(x, weight):
        return weight * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + cfg.rms_norm_eps)

    def rope(x, p):  # x [hd]: pairs (i, i + hd/2) are a complex number rotated by p * theta^(-2i/hd)
        half = cfg.head_dim // 2
        z = torch.complex(x[:half], x[half:])
        freq = cfg.rope_theta ** (-torch.arange(half, dtype=torch.float64) * 2 / cfg.head_dim)
        z = z * torch.exp(1j * p * freq)
        return torch.cat([z.real, z.imag])

    emb = w["embed_tokens.weight"][ids]  # [B, T, H]
    hidden = hidden.double()
    x = torch.cat(
        [rms(emb, w["midlayer.input_layernorm.weight"]), rms(hidden, w["midlayer.hidden_norm.weight"])], -1
    )
    a = "midlayer.self_attn."
    q = (x @ w[a + "q_proj.weight"].T).unflatten(-1, (cfg.num_attention_heads, cfg.head_dim))
    k = (x @ w[a + "k_proj.weight"].T).unflatten(-1, (cfg.num_key_value_heads, cfg.head_dim))
    v = (x @ w[a + "v_proj.weight"].T).unflatten(-1, (cfg.num_key_value_heads, cfg.head_dim))
    bsz, steps = ids.shape
    group = cfg.num_attention_heads // cfg.num_key_value_heads
    out = torch.zeros(bsz, steps, cfg.num_attention_heads, cfg.head_dim, dtype=torch.float64)
    for b in range(bsz):
        for h in range(cfg.num_attention_heads):
            kv = h // group
            keys = [rope(k[b, s, kv], float(pos[b, s])) for s in range(steps)]
            for t in range(steps):
                qt = rope(q[b, t, h], float(pos[b, t]))
                scores = torch.stack([qt @ keys[s] for s in range(t + 1)]) / math.sqrt(cfg.head_dim)
                probs = torch.softmax(scores, 0)
                out[b, t, h] = sum(probs[s] * v[b, s, kv] for s in range(t + 1))
    g = hidden + out.flatten(-2) @ w[a + "o_proj.weight"].T
    m = "midlayer.mlp."
    n = rms(g, w["midlayer.post_attention_layernorm.weight"])
    g = (
        g
        + (torch.nn.functional.silu(n @ w[m + "gate_proj.weight"].T) * (n @ w[m + "up_proj.weight"].T))
        @ w[m + "down_proj.weight"].T
    )
    logits = rms(g, w["norm.weight"]) @ w["lm_head.weight"].T
    return logits, g


def _inputs(d, batch=2, steps=5, seed=0, start=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, d.config.vocab_size, (batch, steps), generator=g)
    hidden = torch.randn(batch, steps, d.config.hidden_size, generator=g)
    pos = start + torch.arange(steps).expand(batch, steps).clone()
    return ids, hidden, pos


@pytest.mark.parametrize("start", [0, 3000])  # 3000 > max_position_embeddings (2048): RoPE is never clamped
def test_matches_float64_reference(target, start):
    d = make_head(target)
    assert d.config.max_position_embeddings == 2048
    ids, hidden, pos = _inputs(d, start=start)
    pos[1] += 7  # rows at different offsets
    with torch.no_grad():
        logits, out = d(ids, hidden, pos)
    ref_logits, ref_out = _reference_step(d, ids, hidden, pos)
    torch.testing.assert_close(logits.double(), ref_logits, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(out.double(), ref_out, rtol=1e-4, atol=1e-4)


def test_rope_is_llamas(target):
    pos = torch.tensor([[0, 1, 5, 2047, 9000]])
    x = torch.randn(1, 3, 5, 8)
    cos, sin = rope_cos_sin(pos, 8, 10000.0)
    hf_rope = LlamaRotaryEmbedding(target.config)  # rope_theta 10000 (transformers' default)
    hf_cos, hf_sin = hf_rope(x, pos)
    torch.testing.assert_close(cos, hf_cos)
    torch.testing.assert_close(sin, hf_sin)
    hf_q, _ = apply_rotary_pos_emb(x, x, hf_cos, hf_sin)
    torch.testing.assert_close(apply_rope(x, cos, sin), hf_q)


def test_all_at_once_equals_one_at_a_time(target):
    d = make_head(target)
    ids, hidden, pos = _inputs(d, steps=6)
    with torch.no_grad():
        full_cache = DynamicCache()
        logits, out = d(ids, hidden, pos, full_cache)
        step_cache = DynamicCache()
        steps = [d(ids[:, t : t + 1], hidden[:, t : t + 1], pos[:, t : t + 1], step_cache) for t in range(6)]
    torch.testing.assert_close(torch.cat([s[0] for s in steps], 1), logits, **TOL)
    torch.testing.assert_close(torch.cat([s[1] for s in steps], 1), out, **TOL)
    assert step_cache.get_seq_length() == full_cache.get_seq_length() == 6
    torch.testing.assert_close(step_cache.layers[0].keys, full_cache.layers[0].keys, **TOL)


def test_chunked_prefill_then_steps(target):
    d = make_head(target)
    ids, hidden, pos = _inputs(d, steps=7)
    with torch.no_grad():
        logits, _ = d(ids, hidden, pos)
        cache = DynamicCache()
        parts = [d(ids[:, a:b], hidden[:, a:b], pos[:, a:b], cache)[0] for a, b in [(0, 4), (4, 6), (6, 7)]]
    torch.testing.assert_close(torch.cat(parts, 1), logits, **TOL)


def test_mask_hiding_cached_keys_equals_recompute_without_them(target):
    d = make_head(target)
    ids, hidden, pos = _inputs(d, batch=1, steps=8)
    keep = [0, 2, 4, 5]  # cached positions 1 and 3 hidden
    with torch.no_grad():
        cache = DynamicCache()
        d(ids[:, :6], hidden[:, :6], pos[:, :6], cache)
        mask = torch.zeros(1, 1, 2, 8)
        mask[..., [1, 3]] = torch.finfo(torch.float32).min
        mask[0, 0, 0, 7] = torch.finfo(torch.float32).min  # new token 0 must not see new token 1
        masked = d(ids[:, 6:], hidden[:, 6:], pos[:, 6:], cache, attention_mask=mask)
        # Each key depends only on its own token, hidden state and position: drop them and recompute.
        cache2 = DynamicCache()
        d(ids[:, keep], hidden[:, keep], pos[:, keep], cache2)
        recomputed = d(ids[:, 6:], hidden[:, 6:], pos[:, 6:], cache2)
    torch.testing.assert_close(masked[0], recomputed[0], **TOL)
    torch.testing.assert_close(masked[1], recomputed[1], **TOL)


def test_explicit_causal_mask_equals_default(target):
    d = make_head(target)
    ids, hidden, pos = _inputs(d, steps=6)
    allowed = torch.ones(6, 6).tril().bool()
    mask = torch.zeros(2, 1, 6, 6).masked_fill(~allowed, torch.finfo(torch.float32).min)
    with torch.no_grad():
        default = d(ids, hidden, pos)
        explicit = d(ids, hidden, pos, attention_mask=mask)
    torch.testing.assert_close(explicit[0], default[0], **TOL)


def test_fused_attention_equals_explicit_scores_with_query_blocks(target, monkeypatch):
    """The layer's ``grouped_attention`` (one query row per block) against explicit float64 scores
    (tests/drafter/reference.py) substituted for it: a prefill over a cache with a ragged mask, then a
    single-query step."""
    d = make_head(target)
    ids, hidden, pos = _inputs(d, steps=6)
    allowed = torch.ones(2, 6, 6).tril().bool()
    allowed[1, :, :2] = False  # row 1: its first two keys are padding
    allowed[1].fill_diagonal_(True)
    mask = torch.zeros(2, 1, 6, 6).masked_fill(~allowed.unsqueeze(1), torch.finfo(torch.float32).min)

    def run():
        cache = DynamicCache()
        with torch.no_grad():
            first = d(ids[:, :5], hidden[:, :5], pos[:, :5], cache, mask[:, :, :5, :5])
            last = d(ids[:, 5:], hidden[:, 5:], pos[:, 5:], cache, mask[:, :, 5:, :])
        return first[0], last[0]

    monkeypatch.setattr(layers_mod, "FOLD_ON_CPU", True)  # the GPU's path, on the CPU
    monkeypatch.setattr(layers_mod, "_SCORE_BUDGET", 2 * 4 * 6)  # one query row per block
    fused = run()
    monkeypatch.setattr(layers_mod, "grouped_attention", explicit_attention)
    written = run()
    for a, b in zip(fused, written, strict=True):
        torch.testing.assert_close(a, b, **TOL)


def test_gqa_shapes_and_dtypes():
    cfg = Eagle3Config(
        hidden_size=48,
        intermediate_size=64,
        num_attention_heads=6,
        num_key_value_heads=2,
        vocab_size=50,
        draft_vocab_size=20,
        head_dim=4,
    )
    d = randomize_(Eagle3Drafter(cfg), 0)
    assert d.midlayer.self_attn.q_proj.weight.shape == (24, 96)
    assert d.midlayer.self_attn.k_proj.weight.shape == (8, 96)
    assert d.midlayer.self_attn.o_proj.weight.shape == (48, 24)
    cache = DynamicCache()
    ids, hidden, pos = _inputs(d, batch=3, steps=4)
    logits, out = d(ids, hidden, pos, cache)
    assert logits.shape == (3, 4, 20) and logits.dtype == torch.float32
    assert out.shape == (3, 4, 48)
    assert cache.layers[0].keys.shape == (3, 2, 4, 4)
    ref_logits, _ = _reference_step(d, ids, hidden, pos)
    torch.testing.assert_close(logits.double(), ref_logits, rtol=1e-4, atol=1e-4)


def test_bfloat16_head_returns_float32_logits(target):
    d32 = make_head(target)
    d16 = make_head(target, dtype=torch.bfloat16)
    assert d16.fc.weight.dtype == torch.bfloat16
    assert d16.embed_tokens.weight.dtype == torch.float32  # still the target's, shared
    ids, hidden, pos = _inputs(d32)
    with torch.no_grad():
        logits16, out16 = d16(ids, hidden, pos, DynamicCache())
        logits32, _ = d32(ids, hidden, pos)
    assert logits16.dtype == torch.float32 and out16.dtype == torch.bfloat16
    torch.testing.assert_close(logits16, logits32, rtol=0.1, atol=0.1)


def test_input_errors(target):
    d = make_head(target)
    ids, hidden, pos = _inputs(d)
    with pytest.raises(ValueError, match=r"fuse\(features\)"):
        d(ids, torch.randn(2, 5, 3 * H), pos)
    with pytest.raises(ValueError, match="position_ids"):
        d(ids, hidden, pos.float())
    with pytest.raises(ValueError, match="input_ids"):
        d(ids.float(), hidden, pos)
    with pytest.raises(ValueError, match="additive float mask"):
        d(ids, hidden, pos, attention_mask=torch.ones(2, 1, 5, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"attention_mask must be \[B, 1, T, S\] = \[2, 1, 5, 5\]"):
        d(ids, hidden, pos, attention_mask=torch.zeros(2, 1, 5, 4))
    with pytest.raises(ValueError, match=r"features must be \[B, T, 3\*Ht\] = \[\.\.\., 96\]"):
        d.fuse(torch.randn(1, 2, 64))


def test_vocab_maps_and_target_probs(target):
    token_ids = torch.tensor([1, 4, 5, 9, 30, 63])
    d = Eagle3Drafter.from_target(target, token_ids=token_ids)
    assert d.d2t.tolist() == [1, 3, 3, 6, 26, 58]
    assert d.t2d.nonzero().flatten().tolist() == token_ids.tolist()
    assert d.target_token_ids.tolist() == token_ids.tolist()
    assert d.to_target(torch.tensor([[0, 5], [3, 3]])).tolist() == [[1, 63], [9, 9]]
    logits = torch.randn(2, 3, 6, generator=torch.Generator().manual_seed(0))
    probs = d.draft_logits_to_target_probs(logits, 0.7)  # [2, 3, V]
    assert probs.shape == (2, 3, V) and probs.dtype == torch.float32
    torch.testing.assert_close(probs[..., token_ids], torch.softmax(logits / 0.7, -1))
    assert probs.sum(-1).sub(1).abs().max() < 1e-6
    outside = torch.ones(V, dtype=torch.bool)
    outside[token_ids] = False
    assert (probs[..., outside] == 0).all()
    greedy = d.draft_logits_to_target_probs(logits, 0)
    assert (greedy.argmax(-1) == d.to_target(logits.argmax(-1))).all()
    assert (greedy.sum(-1) == 1).all() and (greedy.max(-1).values == 1).all()
    with pytest.raises(ValueError, match="temperature"):
        d.draft_logits_to_target_probs(logits, -1.0)
    with pytest.raises(ValueError, match=r"\[\.\.\., 6\]"):
        d.draft_logits_to_target_probs(torch.randn(2, 7), 1.0)


@pytest.mark.parametrize(
    ("token_ids", "match"),
    [
        ([3, 2, 5], "strictly increasing"),
        ([1, 1, 2], "strictly increasing"),
        ([0, 64], r"\[0, 64\)"),
        ([[1, 2]], "1-D"),
    ],
)
def test_build_vocab_maps_errors(token_ids, match):
    with pytest.raises(ValueError, match=match):
        build_vocab_maps(torch.tensor(token_ids), 64)


def test_from_target_shares_frozen_embedding_and_copies_sizes(target):
    d = Eagle3Drafter.from_target(target)
    tcfg = target.config
    assert (d.config.hidden_size, d.config.num_attention_heads, d.config.num_key_value_heads) == (32, 4, 2)
    assert d.config.head_dim == 8 and d.config.rms_norm_eps == tcfg.rms_norm_eps
    assert d.config.vocab_size == d.config.draft_vocab_size == V
    assert d.config.intermediate_size == tcfg.intermediate_size and d.config.rope_theta == 10000.0
    assert d.config.aux_layer_ids == (1, 3, 5)
    assert (d.d2t == 0).all() and d.t2d.all()
    emb = target.get_input_embeddings().weight
    assert d.embedding_shared and d.embed_tokens.weight.data_ptr() == emb.data_ptr()
    assert not d.embed_tokens.weight.requires_grad and emb.requires_grad  # the target is left trainable
    assert Eagle3Drafter.from_target(target, draft_vocab_size=10).lm_head.weight.shape == (10, H)
    with pytest.raises(ValueError, match="draft_vocab_size"):
        Eagle3Drafter.from_target(target, draft_vocab_size=3, token_ids=torch.tensor([1, 2]))


def test_gradients_reach_the_head_not_the_embedding(target):
    d = make_head(target)
    ids, _, pos = _inputs(d)
    feats = torch.randn(2, 5, 3 * H)
    logits, _ = d(ids, d.fuse(feats), pos)
    logits.logsumexp(-1).sum().backward()
    assert d.fc.weight.grad is not None and d.midlayer.self_attn.q_proj.weight.grad is not None
    assert d.embed_tokens.weight.grad is None and target.get_input_embeddings().weight.grad is None
