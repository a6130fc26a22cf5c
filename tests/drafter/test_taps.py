"""FeatureTap captures exactly HF's output_hidden_states at the chosen indices; the default layer rule."""

import pytest
import torch
from torch import nn
from transformers import (
    AutoModelForCausalLM,
    DynamicCache,
    LlamaConfig,
    MistralConfig,
    Qwen2Config,
    Qwen3Config,
)

from marsrl.drafter import FeatureTap, default_aux_layer_ids

SIZES = dict(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=6,
    num_attention_heads=4,
    num_key_value_heads=2,
)
CONFIGS = {
    "llama": lambda: LlamaConfig(**SIZES),
    "qwen2": lambda: Qwen2Config(**SIZES),
    "qwen3": lambda: Qwen3Config(**SIZES, head_dim=8),
    "mistral": lambda: MistralConfig(**SIZES),
}


def _model(kind: str):
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(CONFIGS[kind]()).eval()


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def model(request):
    return _model(request.param)


@pytest.mark.parametrize("ids", [None, (0, 2, 4), (5, 1, 3)])
def test_tap_equals_output_hidden_states(model, ids):
    x = torch.randint(0, 64, (2, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad(), FeatureTap(model, ids) as tap:
        out = model(x, output_hidden_states=True)
        feats = tap.features()
    used = ids or default_aux_layer_ids(6)
    expected = torch.cat([out.hidden_states[i] for i in used], dim=-1)  # [B, T, 3H]
    assert feats.shape == (2, 7, 96)
    torch.testing.assert_close(feats, expected, rtol=0, atol=0)


def test_index_L_is_the_final_norm_input(model):
    # HF's hidden_states[L] is final-NORMED; our index L is the residual entering that norm.
    x = torch.randint(0, 64, (1, 5), generator=torch.Generator().manual_seed(2))
    with torch.no_grad(), FeatureTap(model, (0, 3, 6)) as tap:
        out = model(x, output_hidden_states=True)
        high = tap.features()[..., 64:]
        torch.testing.assert_close(model.model.norm(high), out.hidden_states[6])
    assert not torch.allclose(high, out.hidden_states[6])


def test_tap_with_cache_sees_only_new_tokens():
    model = _model("qwen3")
    x = torch.randint(0, 64, (2, 6), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        full = model(x, output_hidden_states=True)
        cache = DynamicCache()
        with FeatureTap(model) as tap:
            model(x[:, :4], cache=cache)
            first = tap.features()
            model(x[:, 4:], cache=cache, position_ids=torch.arange(4, 6).expand(2, 2))
            second = tap.features()
    expected = torch.cat([full.hidden_states[i] for i in default_aux_layer_ids(6)], dim=-1)
    torch.testing.assert_close(torch.cat([first, second], dim=1), expected, rtol=1e-5, atol=1e-5)


class _KwargLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, *, hidden_states):
        return hidden_states + self.lin(hidden_states)


class _KwargModel(nn.Module):
    """A decoder whose layers take hidden_states only as a keyword."""

    def __init__(self):
        super().__init__()
        self.model = nn.Module()
        self.model.layers = nn.ModuleList(_KwargLayer() for _ in range(4))
        self.model.norm = nn.LayerNorm(4)

    def forward(self, h):
        states = [h]
        for layer in self.model.layers:
            h = layer(hidden_states=h)
            states.append(h)
        self.model.norm(h)
        return states


def test_tap_reads_keyword_hidden_states():
    m = _KwargModel()
    h = torch.randn(2, 3, 4)
    with FeatureTap(m, (1, 2, 4)) as tap:
        states = m(h)
        feats = tap.features()
    torch.testing.assert_close(feats, torch.cat([states[1], states[2], states[4]], dim=-1))


def test_features_clear_and_hooks_removed(model):
    x = torch.zeros(1, 2, dtype=torch.long)
    tap = FeatureTap(model)
    with torch.no_grad():
        model(x)
    assert tap.features().shape == (1, 2, 96)
    with pytest.raises(RuntimeError, match="no complete target forward"):
        tap.features()
    tap.remove()
    assert all(len(layer._forward_pre_hooks) == 0 for layer in model.model.layers)
    assert len(model.model.norm._forward_pre_hooks) == 0


def test_features_detached_by_default(model):
    x = torch.zeros(1, 2, dtype=torch.long)
    with FeatureTap(model) as tap:
        model(x)
        assert not tap.features().requires_grad
    with FeatureTap(model, detach=False) as tap:
        model(x)
        assert tap.features().requires_grad


def test_tap_errors(model):
    with pytest.raises(ValueError, match=r"out of range for a target with 6 decoder layers"):
        FeatureTap(model, (1, 2, 7))
    with pytest.raises(ValueError, match="distinct"):
        FeatureTap(model, (1, 1, 2))
    with pytest.raises(ValueError, match=r"target\.model\.layers"):
        FeatureTap(nn.Linear(2, 2))


@pytest.mark.parametrize(
    ("num_layers", "expected"),
    [
        (32, (2, 16, 29)),
        (36, (2, 18, 33)),
        (64, (2, 32, 61)),
        (7, (2, 3, 4)),
        (6, (1, 3, 5)),
        (5, (1, 2, 4)),
        (4, (1, 2, 3)),
        (3, (1, 2, 3)),
    ],
)
def test_default_aux_layer_ids(num_layers, expected):
    assert default_aux_layer_ids(num_layers) == expected


def test_default_aux_layer_ids_valid_for_every_depth():
    for n in range(3, 130):
        ids = default_aux_layer_ids(n)
        assert 0 <= ids[0] < ids[1] < ids[2] <= n, (n, ids)


@pytest.mark.parametrize("bad", [2, 1, 0, -4, 3.0, True])
def test_default_aux_layer_ids_rejects_shallow_targets(bad):
    with pytest.raises(ValueError, match="num_layers"):
        default_aux_layer_ids(bad)
