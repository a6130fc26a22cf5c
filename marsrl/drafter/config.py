"""The EAGLE-3 draft head's configuration, and its translation to and from the ``config.json`` that
published heads ship (EAGLE official ``LlamaForCausalLM`` and vLLM/SGLang/SpecForge
``LlamaForCausalLMEagle3`` layouts).

Leaves out: multi-layer heads, RoPE scaling, biases and activations other than SiLU. A config asking
for any of them is an error naming the file, never silently approximated.

Aux-layer convention (marsrl): ``aux_layer_ids`` index HF ``output_hidden_states``, i.e. the residual
stream ENTERING decoder layer i (0 = the embedding output, L = the input of the final norm).
SpecForge/vLLM's ``eagle_config.eagle_aux_hidden_state_layer_ids`` are decoder-layer OUTPUT indices,
one less than ours; ``from_hf_dict`` / ``to_hf_dict`` convert.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

ARCH_OFFICIAL = "LlamaForCausalLM"  # EAGLE official release (yuhuili/EAGLE3-*)
ARCH_EAGLE3 = "LlamaForCausalLMEagle3"  # SpecForge / SGLang / vLLM-ready copies
KNOWN_ARCHITECTURES = (ARCH_OFFICIAL, ARCH_EAGLE3)


@dataclass(frozen=True)
class Eagle3Config:
    """Sizes of one EAGLE-3 draft head. ``None`` fields are resolved in ``__post_init__`` (always set after).

    Attributes:
        hidden_size: H, the head's width (= the target's hidden size for every published head).
        intermediate_size: SwiGLU width of the midlayer MLP.
        num_attention_heads: query heads; q_proj maps 2H -> heads * head_dim.
        num_key_value_heads: key/value heads (GQA); must divide num_attention_heads.
        vocab_size: V, the TARGET vocabulary (rows of the shared embedding, length of ``t2d``).
        draft_vocab_size: Vd <= V, rows of ``lm_head``; None -> V.
        head_dim: per-head width; None -> hidden_size // num_attention_heads.
        rms_norm_eps: epsilon of every RMSNorm (use the checkpoint's).
        rope_theta: RoPE base of the head itself (10000 when a checkpoint omits it; the official
            Llama-3.1 head uses 10000, not the target's 500000).
        target_hidden_size: Ht, width of each captured target feature (fc takes 3*Ht); None -> H.
        aux_layer_ids: three ``output_hidden_states`` indices (low, mid, high) of the target, or None
            when unknown (chosen from the target at load time).
        max_position_embeddings: copied to saved configs only; NEVER clamps RoPE (a head trained at
            2048 must keep working on longer rollouts).
        hidden_act: MLP activation; only "silu" is implemented.
    """

    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    draft_vocab_size: int | None = None
    head_dim: int | None = None
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    target_hidden_size: int | None = None
    aux_layer_ids: tuple[int, int, int] | None = None
    max_position_embeddings: int | None = None
    hidden_act: str = "silu"

    def __post_init__(self) -> None:
        for name in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads"):
            _check_positive_int(name, getattr(self, name))
        _check_positive_int("vocab_size", self.vocab_size)
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )
        if self.head_dim is None:
            if self.hidden_size % self.num_attention_heads:
                raise ValueError(
                    f"hidden_size ({self.hidden_size}) is not divisible by num_attention_heads "
                    f"({self.num_attention_heads}); set head_dim explicitly"
                )
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)
        _check_positive_int("head_dim", self.head_dim)
        if self.head_dim % 2:
            raise ValueError(f"head_dim ({self.head_dim}) must be even for RoPE")
        if self.draft_vocab_size is None:
            object.__setattr__(self, "draft_vocab_size", self.vocab_size)
        _check_positive_int("draft_vocab_size", self.draft_vocab_size)
        if self.draft_vocab_size > self.vocab_size:
            raise ValueError(
                f"draft_vocab_size ({self.draft_vocab_size}) must be <= vocab_size ({self.vocab_size})"
            )
        if self.target_hidden_size is None:
            object.__setattr__(self, "target_hidden_size", self.hidden_size)
        _check_positive_int("target_hidden_size", self.target_hidden_size)
        if self.max_position_embeddings is not None:
            _check_positive_int("max_position_embeddings", self.max_position_embeddings)
        if not (self.rms_norm_eps > 0):
            raise ValueError(f"rms_norm_eps must be > 0 (got {self.rms_norm_eps})")
        if not (self.rope_theta > 0):
            raise ValueError(f"rope_theta must be > 0 (got {self.rope_theta})")
        object.__setattr__(self, "rms_norm_eps", float(self.rms_norm_eps))
        object.__setattr__(self, "rope_theta", float(self.rope_theta))
        if self.hidden_act != "silu":
            raise ValueError(f"hidden_act must be 'silu' (the only MLP implemented), got {self.hidden_act!r}")
        if self.aux_layer_ids is not None:
            aux = check_aux_layer_ids(self.aux_layer_ids, "aux_layer_ids")
            object.__setattr__(self, "aux_layer_ids", aux)

    @property
    def fc_in_features(self) -> int:
        """Width of the fused target features: 3 * target_hidden_size."""
        return 3 * self.target_hidden_size

    def replace(self, **changes: Any) -> Eagle3Config:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any], source: str) -> Eagle3Config:
        """Parse a head's ``config.json`` (either published layout); ``source`` names the file in errors.

        Keys that do not change the head's maths (token ids, dtype, versions...) are ignored; keys
        that would (more than one layer, RoPE scaling, biases, a non-SiLU activation) are errors.
        """
        if not isinstance(d, dict):
            raise ValueError(f"{source}: expected a JSON object at the top level")
        archs = d.get("architectures")
        if not isinstance(archs, list) or len(archs) != 1 or archs[0] not in KNOWN_ARCHITECTURES:
            raise ValueError(
                f"{source}: architectures = {archs!r} is not an EAGLE-3 head; expected one of "
                f"{[[a] for a in KNOWN_ARCHITECTURES]}"
            )
        _reject_unsupported(d, source)
        missing = [
            k for k in ("hidden_size", "intermediate_size", "num_attention_heads", "vocab_size") if k not in d
        ]
        if missing:
            raise ValueError(f"{source}: missing required key(s) {missing}")
        aux = None
        eagle_cfg = d.get("eagle_config") or {}
        if not isinstance(eagle_cfg, dict):
            raise ValueError(f"{source}: eagle_config must be an object, got {eagle_cfg!r}")
        spec_ids = eagle_cfg.get("eagle_aux_hidden_state_layer_ids")
        if spec_ids is not None:
            if not isinstance(spec_ids, list) or not all(_is_int(i) for i in spec_ids):
                raise ValueError(
                    f"{source}: eagle_config.eagle_aux_hidden_state_layer_ids must be a list of ints, "
                    f"got {spec_ids!r}"
                )
            aux = tuple(i + 1 for i in spec_ids)  # decoder-layer outputs -> inputs (ours)
        try:
            return cls(
                hidden_size=d["hidden_size"],
                intermediate_size=d["intermediate_size"],
                num_attention_heads=d["num_attention_heads"],
                num_key_value_heads=d.get("num_key_value_heads") or d["num_attention_heads"],
                vocab_size=d["vocab_size"],
                draft_vocab_size=d.get("draft_vocab_size"),
                head_dim=d.get("head_dim"),
                rms_norm_eps=d.get("rms_norm_eps", 1e-6),
                rope_theta=_rope_theta(d, source),
                target_hidden_size=d.get("target_hidden_size"),
                aux_layer_ids=aux,
                max_position_embeddings=d.get("max_position_embeddings"),
                hidden_act=d.get("hidden_act", "silu"),
            )
        except (ValueError, TypeError) as err:
            raise ValueError(f"{source}: {err}") from err

    def to_hf_dict(self) -> dict[str, Any]:
        """The vLLM/SGLang/SpecForge ``config.json`` for this head (``LlamaForCausalLMEagle3``)."""
        d: dict[str, Any] = {
            "architectures": [ARCH_EAGLE3],
            "model_type": "llama",
            "num_hidden_layers": 1,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "hidden_act": self.hidden_act,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": None,
            "attention_bias": False,
            "mlp_bias": False,
            "tie_word_embeddings": False,
            "vocab_size": self.vocab_size,
            "draft_vocab_size": self.draft_vocab_size,
            "target_hidden_size": self.target_hidden_size,
        }
        if self.max_position_embeddings is not None:
            d["max_position_embeddings"] = self.max_position_embeddings
        if self.aux_layer_ids is not None:
            d["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": [i - 1 for i in self.aux_layer_ids]}
        return d


def check_aux_layer_ids(ids: Any, name: str, num_layers: int | None = None) -> tuple[int, int, int]:
    """Three distinct ints in [0, num_layers] (upper bound only when given) as a tuple.

    Raises ValueError naming ``name`` otherwise."""
    ids = tuple(ids)
    if len(ids) != 3 or not all(_is_int(i) for i in ids):
        raise ValueError(f"{name} must be three ints (low, mid, high), got {ids!r}")
    if len(set(ids)) != 3:
        raise ValueError(f"{name} must be three distinct layers, got {ids!r}")
    if min(ids) < 0:
        raise ValueError(f"{name} must be >= 0 (output_hidden_states indices), got {ids!r}")
    if num_layers is not None and max(ids) > num_layers:
        raise ValueError(
            f"{name} = {ids!r} is out of range for a target with {num_layers} decoder layers "
            f"(valid output_hidden_states indices are 0..{num_layers})"
        )
    return tuple(int(i) for i in ids)


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _check_positive_int(name: str, value: Any) -> None:
    if not _is_int(value) or value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


def _rope_theta(d: dict[str, Any], source: str) -> float:
    """rope_theta from the legacy key or a transformers-5 ``rope_parameters`` block; 10000 when absent."""
    params = d.get("rope_parameters")
    if isinstance(params, dict):
        rope_type = params.get("rope_type", "default")
        if rope_type != "default":
            raise ValueError(f"{source}: rope_parameters.rope_type = {rope_type!r} is not supported")
        if "rope_theta" in params:
            return params["rope_theta"]
    theta = d.get("rope_theta")
    return 10000.0 if theta is None else theta


def _reject_unsupported(d: dict[str, Any], source: str) -> None:
    """Errors for config values that would change the maths in ways this head does not implement."""
    layers = d.get("num_hidden_layers", 1)
    if layers != 1:
        raise ValueError(
            f"{source}: num_hidden_layers = {layers}; only single-layer EAGLE-3 heads exist here"
        )
    if d.get("rope_scaling") not in (None, {}):
        raise ValueError(f"{source}: rope_scaling = {d['rope_scaling']!r} is not supported (plain RoPE only)")
    for key in ("attention_bias", "mlp_bias"):
        if d.get(key):
            raise ValueError(f"{source}: {key} = true is not supported (EAGLE-3 heads have no biases)")


DEFAULT_DRAFT_VOCAB = 32000  # the published 8B heads' draft vocabulary


@dataclass(frozen=True)
class OfflineDefaults:
    """``train_offline``'s training defaults (and so ``marsrl draft train``'s), here where the CLI can read
    them without importing torch."""

    epochs: int = 1
    batch_size: int = 8
    max_len: int = 2048
    lr: float = 1e-4
    seed: int = 0
    save_every: int = 500


OFFLINE = OfflineDefaults()
