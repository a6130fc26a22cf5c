"""Every published head config parses to the right sizes; invalid configs fail naming the field."""

import json
from pathlib import Path

import pytest
import torch

from marsrl.drafter import Eagle3Config, Eagle3Drafter

CONFIG_DIR = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "eagle3-configs"
CONFIG_FILES = sorted(CONFIG_DIR.glob("*.json")) if CONFIG_DIR.is_dir() else []


def _published():
    if not CONFIG_FILES:
        pytest.skip(f"published head configs not available ({CONFIG_DIR})")
    return CONFIG_FILES


def test_every_published_config_parses():
    for path in _published():
        raw = json.loads(path.read_text())
        cfg = Eagle3Config.from_hf_dict(raw, source=str(path))
        assert cfg.hidden_size == raw["hidden_size"], path.name
        assert cfg.intermediate_size == raw["intermediate_size"], path.name
        assert cfg.num_attention_heads == raw["num_attention_heads"], path.name
        assert cfg.num_key_value_heads == raw["num_key_value_heads"], path.name
        assert cfg.vocab_size == raw["vocab_size"], path.name
        assert cfg.draft_vocab_size == raw["draft_vocab_size"], path.name
        assert cfg.head_dim == raw.get("head_dim", raw["hidden_size"] // raw["num_attention_heads"]), (
            path.name
        )
        assert cfg.rms_norm_eps == raw["rms_norm_eps"], path.name
        assert cfg.rope_theta == float(raw.get("rope_theta", 10000.0)), path.name
        assert cfg.target_hidden_size == raw["hidden_size"], path.name
        assert cfg.aux_layer_ids is None, path.name
        assert Eagle3Config.from_hf_dict(cfg.to_hf_dict(), source="round trip") == cfg, path.name


def test_known_published_sizes():
    by_name = {p.name: Eagle3Config.from_hf_dict(json.loads(p.read_text()), str(p)) for p in _published()}
    llama = by_name["eagle-official-llama3.1-8b.json"]
    assert (llama.hidden_size, llama.vocab_size, llama.draft_vocab_size) == (4096, 128256, 32000)
    assert llama.rope_theta == 10000.0 and llama.head_dim == 128 and llama.max_position_embeddings == 2048
    qwen = by_name["specforge-qwen3-8b-eagle3.json"]
    assert (qwen.hidden_size, qwen.intermediate_size, qwen.vocab_size, qwen.draft_vocab_size) == (
        4096,
        12288,
        151936,
        32000,
    )
    assert qwen.rope_theta == 1e6
    small = by_name["specforge-qwen2.5-0.5b-eagle3.json"]
    assert (small.hidden_size, small.num_attention_heads, small.head_dim, small.draft_vocab_size) == (
        896,
        14,
        64,
        16000,
    )


def test_meta_module_has_checkpoint_shapes():
    path = next((p for p in _published() if p.name == "specforge-qwen3-32b-eagle3.json"), None)
    if path is None:
        pytest.skip("specforge-qwen3-32b-eagle3.json not present")
    cfg = Eagle3Config.from_hf_dict(json.loads(path.read_text()), str(path))
    d = Eagle3Drafter(cfg, device="meta", dtype=torch.bfloat16)
    shapes = {k: tuple(v.shape) for k, v in d.state_dict().items()}
    assert shapes == {
        "fc.weight": (5120, 15360),
        "midlayer.self_attn.q_proj.weight": (8192, 10240),
        "midlayer.self_attn.k_proj.weight": (1024, 10240),
        "midlayer.self_attn.v_proj.weight": (1024, 10240),
        "midlayer.self_attn.o_proj.weight": (5120, 8192),
        "midlayer.mlp.gate_proj.weight": (25600, 5120),
        "midlayer.mlp.up_proj.weight": (25600, 5120),
        "midlayer.mlp.down_proj.weight": (5120, 25600),
        "midlayer.hidden_norm.weight": (5120,),
        "midlayer.input_layernorm.weight": (5120,),
        "midlayer.post_attention_layernorm.weight": (5120,),
        "norm.weight": (5120,),
        "lm_head.weight": (32000, 5120),
        "d2t": (32000,),
        "t2d": (151936,),
        "embed_tokens.weight": (151936, 5120),
    }
    assert all(t.is_meta for t in d.state_dict().values())
    assert d.fc.weight.dtype == torch.bfloat16 and d.d2t.dtype == torch.int64 and d.t2d.dtype == torch.bool


def test_aux_ids_convert_from_specforge_and_back():
    raw = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 100,
        "draft_vocab_size": 10,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 17, 32]},
    }
    cfg = Eagle3Config.from_hf_dict(raw, "x.json")
    assert cfg.aux_layer_ids == (2, 18, 33)
    assert cfg.to_hf_dict()["eagle_config"] == {"eagle_aux_hidden_state_layer_ids": [1, 17, 32]}


def test_rope_parameters_block_is_read():
    raw = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "vocab_size": 100,
        "rope_parameters": {"rope_type": "default", "rope_theta": 123456.0},
    }
    cfg = Eagle3Config.from_hf_dict(raw, "x.json")
    assert cfg.rope_theta == 123456.0 and cfg.num_key_value_heads == 4 and cfg.draft_vocab_size == 100


BASE = dict(
    hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, vocab_size=100
)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"hidden_size": 0}, "hidden_size"),
        ({"intermediate_size": -1}, "intermediate_size"),
        ({"num_key_value_heads": 3}, "num_key_value_heads"),
        ({"hidden_size": 66}, "num_attention_heads"),
        ({"head_dim": 7}, "head_dim"),
        ({"draft_vocab_size": 101}, "draft_vocab_size"),
        ({"aux_layer_ids": (1, 1, 2)}, "aux_layer_ids"),
        ({"aux_layer_ids": (1, 2)}, "aux_layer_ids"),
        ({"aux_layer_ids": (-1, 2, 3)}, "aux_layer_ids"),
        ({"rms_norm_eps": 0.0}, "rms_norm_eps"),
        ({"rope_theta": -1.0}, "rope_theta"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"target_hidden_size": 0}, "target_hidden_size"),
    ],
)
def test_invalid_config_names_field(change, field):
    with pytest.raises(ValueError, match=field):
        Eagle3Config(**{**BASE, **change})


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"architectures": ["Qwen3ForCausalLM"]}, r"head.json: architectures = \['Qwen3ForCausalLM'\]"),
        ({"architectures": None}, r"head.json: architectures = None"),
        ({"num_hidden_layers": 2}, "head.json: num_hidden_layers = 2"),
        ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "head.json: rope_scaling"),
        ({"attention_bias": True}, "head.json: attention_bias"),
        ({"hidden_size": None}, "head.json: hidden_size must be a positive int"),
        ({"draft_vocab_size": 1000}, r"head.json: draft_vocab_size \(1000\) must be <= vocab_size \(100\)"),
    ],
)
def test_invalid_hf_dict_names_file(change, match):
    raw = {"architectures": ["LlamaForCausalLM"], **BASE, **change}
    with pytest.raises(ValueError, match=match):
        Eagle3Config.from_hf_dict(raw, "head.json")
