"""Published checkpoint layouts load back to identical outputs; mismatches and unsafe files fail clearly."""

import json
import os
import shlex
import time

import pytest
import torch
from safetensors.torch import load_file, save_file

from marsrl.drafter import Eagle3Drafter
from tests.drafter.helpers import V, make_head, run_head, tiny_llama

EMBED = "embed_tokens.weight"


def _assert_same(a: Eagle3Drafter, b: Eagle3Drafter):
    for got, want in zip(run_head(a), run_head(b), strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def _weights(d: Eagle3Drafter, embed: bool) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in d.state_dict().items() if embed or k != EMBED}


def _official_config(d: Eagle3Drafter) -> dict:
    """What yuhuili/EAGLE3-* ships: no head_dim, no rope_theta, no target_hidden_size, no aux ids."""
    c = d.config
    return {
        "architectures": ["LlamaForCausalLM"],
        "bos_token_id": 1,
        "hidden_act": "silu",
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "max_position_embeddings": 2048,
        "model_type": "llama",
        "num_attention_heads": c.num_attention_heads,
        "num_key_value_heads": c.num_key_value_heads,
        "num_hidden_layers": 1,
        "rms_norm_eps": c.rms_norm_eps,
        "tie_word_embeddings": False,
        "torch_dtype": "float16",
        "vocab_size": c.vocab_size,
        "draft_vocab_size": c.draft_vocab_size,
    }


def _write(folder, config: dict, tensors: dict | None = None, bin_tensors: dict | None = None):
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f)
    if tensors is not None:
        save_file(tensors, os.path.join(folder, "model.safetensors"))
    if bin_tensors is not None:
        torch.save(bin_tensors, os.path.join(folder, "pytorch_model.bin"))
    return folder


def _specforge_config(d: Eagle3Drafter, aux_output_ids=None) -> dict:
    cfg = d.config.to_hf_dict()
    cfg.pop("eagle_config", None)
    if aux_output_ids is not None:
        cfg["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": aux_output_ids}
    return cfg


def test_eagle_official_layout(target, tmp_path):
    head = make_head(target)  # rope_theta 10000, the value a config without rope_theta means
    folder = _write(tmp_path / "official", _official_config(head), bin_tensors=_weights(head, embed=False))
    loaded = Eagle3Drafter.from_pretrained(folder, target)
    _assert_same(loaded, head)
    assert loaded.embedding_shared
    assert loaded.config.aux_layer_ids == (1, 3, 5)  # the default for a 6-layer target
    assert loaded.config.rope_theta == 10000.0 and loaded.config.target_hidden_size == 32


def test_specforge_layout_with_embeddings_loads_without_target(target, tmp_path):
    head = make_head(target, rope_theta=1e6)
    folder = _write(tmp_path / "sf", _specforge_config(head), tensors=_weights(head, embed=True))
    loaded = Eagle3Drafter.from_pretrained(folder)
    _assert_same(loaded, head)
    assert not loaded.embedding_shared and not loaded.embed_tokens.weight.requires_grad
    assert loaded.config.aux_layer_ids is None and loaded.config.rope_theta == 1e6
    # an owned embedding is written back by save_pretrained
    loaded.save_pretrained(tmp_path / "resaved")
    assert EMBED in load_file(tmp_path / "resaved" / "model.safetensors")


def test_specforge_layout_without_embeddings_with_aux_ids(target, tmp_path):
    head = make_head(target, rope_theta=1e6)
    config = _specforge_config(head, aux_output_ids=[1, 2, 3])  # decoder-layer outputs = ours - 1
    folder = _write(tmp_path / "sf", config, tensors=_weights(head, embed=False))
    loaded = Eagle3Drafter.from_pretrained(folder, target)
    _assert_same(loaded, head)
    assert loaded.config.aux_layer_ids == (2, 3, 4)
    assert Eagle3Drafter.from_pretrained(folder, target, aux_layer_ids=(0, 1, 6)).config.aux_layer_ids == (
        0,
        1,
        6,
    )


def test_vllm_key_names(target, tmp_path):
    head = make_head(target)
    renamed = {
        "model." + k.replace("midlayer.", "layers.0."): v for k, v in _weights(head, embed=False).items()
    }
    assert "model.layers.0.self_attn.q_proj.weight" in renamed
    folder = _write(tmp_path / "vllm", _specforge_config(head), tensors=renamed)
    _assert_same(Eagle3Drafter.from_pretrained(folder, target), head)


def test_sharded_safetensors(target, tmp_path):
    head = make_head(target)
    tensors = _weights(head, embed=False)
    keys = sorted(tensors)
    folder = _write(tmp_path / "sharded", _specforge_config(head))
    shards = {"a.safetensors": keys[: len(keys) // 2], "b.safetensors": keys[len(keys) // 2 :]}
    weight_map = {}
    for name, part in shards.items():
        save_file({k: tensors[k] for k in part}, os.path.join(folder, name))
        weight_map.update(dict.fromkeys(part, name))
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)
    _assert_same(Eagle3Drafter.from_pretrained(folder, target), head)


def test_save_pretrained_round_trip(target, tmp_path):
    head = make_head(target, aux_layer_ids=(0, 2, 5), rope_theta=5e5)
    head.save_pretrained(tmp_path / "out")
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["num_hidden_layers"] == 1
    assert cfg["eagle_config"] == {"eagle_aux_hidden_state_layer_ids": [-1, 1, 4]}
    assert cfg["draft_vocab_size"] == 40 and cfg["target_hidden_size"] == 32 and cfg["rope_theta"] == 5e5
    tensors = load_file(tmp_path / "out" / "model.safetensors")
    assert EMBED not in tensors
    assert tensors["d2t"].dtype == torch.int64 and tensors["t2d"].dtype == torch.bool
    assert {"fc.weight", "norm.weight", "lm_head.weight", "midlayer.hidden_norm.weight"} <= set(tensors)
    loaded = Eagle3Drafter.from_pretrained(tmp_path / "out", target)
    assert loaded.config == head.config
    _assert_same(loaded, head)

    head.save_pretrained(tmp_path / "with_embed", include_embeddings=True)
    alone = Eagle3Drafter.from_pretrained(tmp_path / "with_embed")
    _assert_same(alone, head)


def test_dtype_and_vocab_maps_on_load(target, tmp_path):
    head = make_head(target)
    tensors = _weights(head, embed=False)
    del tensors["t2d"]  # derived from d2t
    folder = _write(tmp_path / "h", _specforge_config(head), tensors=tensors)
    loaded = Eagle3Drafter.from_pretrained(folder, target, dtype=torch.bfloat16)
    assert loaded.fc.weight.dtype == torch.bfloat16 and loaded.d2t.dtype == torch.int64
    assert torch.equal(loaded.t2d, head.t2d)


def test_identity_vocab_may_omit_maps(target, tmp_path):
    head = make_head(target)
    full = Eagle3Drafter.from_target(target)
    tensors = {k: v for k, v in _weights(full, embed=False).items() if k not in ("d2t", "t2d")}
    folder = _write(tmp_path / "id", full.config.to_hf_dict(), tensors=tensors)
    loaded = Eagle3Drafter.from_pretrained(folder, target)
    assert (loaded.d2t == 0).all() and loaded.t2d.all()

    partial = {k: v for k, v in _weights(head, embed=False).items() if k not in ("d2t", "t2d")}
    folder = _write(tmp_path / "bad", _specforge_config(head), tensors=partial)
    with pytest.raises(ValueError, match=r"no d2t / t2d but draft_vocab_size \(40\) != vocab_size \(64\)"):
        Eagle3Drafter.from_pretrained(folder, target)


# ---------------------------------------------------------------------------------------- errors


def test_hidden_size_mismatch_names_both(target, tmp_path):
    head = make_head(target)
    head.save_pretrained(tmp_path / "h")
    wide = tiny_llama(hidden=48)
    with pytest.raises(ValueError, match=r"hidden size mismatch.* 32 .*3\*32 = 96.*hidden_size is 48"):
        Eagle3Drafter.from_pretrained(tmp_path / "h", wide)


def test_vocab_mismatch_names_both(target, tmp_path):
    make_head(target).save_pretrained(tmp_path / "h")
    with pytest.raises(ValueError, match=r"vocab size mismatch: the head's vocab_size is 64 .* is 80"):
        Eagle3Drafter.from_pretrained(tmp_path / "h", tiny_llama(vocab=80))


def test_padded_target_embedding_is_accepted(target, tmp_path):
    head = make_head(target)
    head.save_pretrained(tmp_path / "h")
    padded = tiny_llama()
    padded.resize_token_embeddings(72)  # embedding rows 72 and config.vocab_size 72
    with pytest.raises(ValueError, match="vocab size mismatch"):
        Eagle3Drafter.from_pretrained(tmp_path / "h", padded)
    padded.config.vocab_size = V  # tokenizer-sized config, embedding padded beyond it: allowed
    loaded = Eagle3Drafter.from_pretrained(tmp_path / "h", padded)
    assert loaded.embed_tokens.weight.shape == (V, 32)
    assert loaded.embed_tokens.weight.data_ptr() == padded.get_input_embeddings().weight.data_ptr()


def test_aux_layers_out_of_range(target, tmp_path):
    head = make_head(target)
    folder = _write(tmp_path / "h", _specforge_config(head, [1, 4, 9]), tensors=_weights(head, embed=False))
    with pytest.raises(ValueError, match=r"\(2, 5, 10\) is out of range for a target with 6 decoder layers"):
        Eagle3Drafter.from_pretrained(folder, target)
    with pytest.raises(ValueError, match=r"aux_layer_ids = \(0, 1, 7\) is out of range .* 6 decoder layers"):
        Eagle3Drafter.from_pretrained(folder, target, aux_layer_ids=(0, 1, 7))
    with pytest.raises(ValueError, match="6 decoder layers"):
        Eagle3Drafter.from_target(target, aux_layer_ids=(0, 1, 7))


def test_missing_and_unexpected_keys_listed(target, tmp_path):
    head = make_head(target)
    tensors = _weights(head, embed=False)
    del tensors["norm.weight"]
    tensors["midlayer.extra.weight"] = torch.zeros(2)
    tensors["layers.1.mlp.up_proj.weight"] = torch.zeros(2)  # a second layer: not an EAGLE-3 head
    folder = _write(tmp_path / "h", _specforge_config(head), tensors=tensors)
    with pytest.raises(ValueError, match=r"missing keys \['norm.weight'\]") as err:
        Eagle3Drafter.from_pretrained(folder, target)
    assert "unexpected keys ['layers.1.mlp.up_proj.weight', 'midlayer.extra.weight']" in str(err.value)


def test_shape_mismatch_names_key(target, tmp_path):
    head = make_head(target)
    tensors = _weights(head, embed=False)
    tensors["fc.weight"] = torch.zeros(32, 64)
    folder = _write(tmp_path / "h", _specforge_config(head), tensors=tensors)
    with pytest.raises(ValueError, match=r"fc.weight: file \[32, 64\] vs config \[32, 96\]"):
        Eagle3Drafter.from_pretrained(folder, target)


def test_missing_embedding_needs_a_target(target, tmp_path):
    make_head(target).save_pretrained(tmp_path / "h")
    with pytest.raises(ValueError, match=r"no embed_tokens\.weight; pass target="):
        Eagle3Drafter.from_pretrained(tmp_path / "h")


class _Payload:
    """Pickles to a call of os.system: loading it with plain pickle would run a shell command."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {shlex.quote(str(self.marker))}",))


def test_malicious_pickle_is_refused(target, tmp_path):
    head = make_head(target)
    marker = tmp_path / "pwned"
    bad = _weights(head, embed=False)
    bad["evil"] = _Payload(marker)
    folder = _write(tmp_path / "h", _official_config(head), bin_tensors=bad)
    with pytest.raises(ValueError, match=r"refusing to load .*pytorch_model\.bin"):
        Eagle3Drafter.from_pretrained(folder, target)
    assert not marker.exists()
    # the file really carries code: an unsafe load runs it
    torch.load(os.path.join(folder, "pytorch_model.bin"), weights_only=False)
    assert marker.exists()


def test_hub_id_fails_fast_offline(monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    start = time.monotonic()
    with pytest.raises(FileNotFoundError, match=r"'nobody/no-such-eagle3-head'.*or pass a local folder"):
        Eagle3Drafter.from_pretrained("nobody/no-such-eagle3-head")
    assert time.monotonic() - start < 10


def test_local_path_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="folder not found"):
        Eagle3Drafter.from_pretrained(str(tmp_path / "nope" / "deeper"))
    with pytest.raises(FileNotFoundError, match=r"no config\.json"):
        Eagle3Drafter.from_pretrained(tmp_path)
    _write(tmp_path / "x", {"architectures": ["Qwen3ForCausalLM"], "hidden_size": 8})
    with pytest.raises(ValueError, match=r"config.json: architectures = \['Qwen3ForCausalLM'\]"):
        Eagle3Drafter.from_pretrained(tmp_path / "x")


def test_shared_head_must_live_beside_the_target(target, tmp_path):
    make_head(target).save_pretrained(tmp_path / "h")
    with pytest.raises(ValueError, match=r"device meta differs from the target embedding's \(cpu\)"):
        Eagle3Drafter.from_pretrained(tmp_path / "h", target, device="meta")


def test_share_embedding_again_after_the_target_replaces_it(tmp_path):
    target = tiny_llama()
    head = make_head(target)
    before = run_head(head)[0]
    with torch.no_grad():
        target.get_input_embeddings().weight = torch.nn.Parameter(torch.randn(V, 32))
    head.share_embedding(target)
    assert head.embed_tokens.weight.data_ptr() == target.get_input_embeddings().weight.data_ptr()
    assert not torch.equal(run_head(head)[0], before)
