"""The EAGLE-3 draft head as an ``nn.Module``: feature fusion, one draft step with a KV cache, the
draft -> target vocabulary maps, building a fresh head for a target, and loading / saving the
published checkpoint layouts (EAGLE official, SpecForge/SGLang, vLLM key names).

One draft step (EAGLE-3 midlayer, arXiv 2503.01840):
    x = cat([input_layernorm(embed(tok)), hidden_norm(h)])       [B, T, 2H]  (embedding first)
    g = h + o_proj(attn(RoPE(q(x)), RoPE(k(x)), v(x)))            residual is the INPUT hidden
    g = g + mlp(post_attention_layernorm(g))
    returns lm_head(norm(g)) [B, T, Vd] (float32) and g [B, T, H] (pre-norm; the next step's h).
The first step of a round uses h = fuse(features) = fc(cat[low, mid, high]).

The token embedding is the target's (shared storage, frozen) unless a checkpoint ships its own.
Leaves out: the draft tree / chain loop (the speculative engine) and training (TTT).
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Sequence

import torch
from torch import nn

from .checkpoint import normalize_keys, read_config, read_weights, resolve_folder, write_checkpoint
from .config import Eagle3Config, check_aux_layer_ids
from .layers import Eagle3MidLayer, RMSNorm, rope_cos_sin
from .taps import default_aux_layer_ids
from .target import input_embedding, num_layers, text_config

EMBED_KEY = "embed_tokens.weight"
_LIST_LIMIT = 20  # keys listed in a missing/unexpected error before eliding


def build_vocab_maps(token_ids: torch.Tensor, vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``d2t`` int64 [Vd] and ``t2d`` bool [V] for a draft vocabulary of sorted target ids [Vd].

    ``d2t[i] = token_ids[i] - i`` (an offset: target_id = draft_id + d2t[draft_id]);
    ``t2d[j] = j in token_ids``."""
    if token_ids.dim() != 1 or token_ids.dtype.is_floating_point or token_ids.dtype == torch.bool:
        raise ValueError(
            f"token_ids must be a 1-D integer tensor, got {token_ids.dtype} {list(token_ids.shape)}"
        )
    ids = token_ids.long()
    if ids.numel() == 0:
        raise ValueError("token_ids must not be empty")
    if not bool((ids[1:] > ids[:-1]).all()):
        raise ValueError("token_ids must be strictly increasing (sorted, unique target ids)")
    if int(ids[0]) < 0 or int(ids[-1]) >= vocab_size:
        raise ValueError(f"token_ids must lie in [0, {vocab_size}) (the target vocabulary)")
    d2t = ids - torch.arange(ids.numel(), device=ids.device)
    t2d = torch.zeros(vocab_size, dtype=torch.bool, device=ids.device)
    t2d[ids] = True
    return d2t, t2d


class Eagle3Drafter(nn.Module):
    """EAGLE-3 draft head.  Parameter names match the published checkpoints.

    Args:
        config: sizes (see Eagle3Config).
        embed_tokens: an embedding to use as is (shared); None allocates an owned [V, H] embedding.
            Either way its weight is frozen (requires_grad False), so pass a view such as
            ``share_embedding`` makes, not the target's own module, to keep the target trainable.
        device, dtype: where and in what dtype to create every other parameter.
    """

    def __init__(
        self,
        config: Eagle3Config,
        embed_tokens: nn.Embedding | None = None,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.config = config
        hid = config.hidden_size
        self.embedding_shared = embed_tokens is not None
        if embed_tokens is not None and (
            embed_tokens.embedding_dim != hid or embed_tokens.num_embeddings < config.vocab_size
        ):
            raise ValueError(
                f"embed_tokens is [{embed_tokens.num_embeddings}, {embed_tokens.embedding_dim}]; the head "
                f"needs at least [{config.vocab_size}, {hid}] (vocab_size, hidden_size)"
            )
        with torch.device(device) if device is not None else contextlib.nullcontext():
            self.fc = nn.Linear(config.fc_in_features, hid, bias=False)
            self.midlayer = Eagle3MidLayer(config)
            self.norm = RMSNorm(hid, config.rms_norm_eps)
            self.lm_head = nn.Linear(hid, config.draft_vocab_size, bias=False)
            if embed_tokens is None:
                embed_tokens = nn.Embedding(config.vocab_size, hid, dtype=dtype)
        if dtype is not None:
            self.to(dtype)  # before the (possibly shared) embedding is attached: never casts the target's
        d2t, t2d = build_vocab_maps(torch.arange(config.draft_vocab_size), config.vocab_size)
        device = self.fc.weight.device
        self.register_buffer("d2t", d2t.to(device))  # [Vd] int64 offsets (identity prefix until set)
        self.register_buffer("t2d", t2d.to(device))  # [V] bool
        embed_tokens.weight.requires_grad_(False)
        self.embed_tokens = embed_tokens

    # ------------------------------------------------------------------ compute

    def fuse(self, features: torch.Tensor) -> torch.Tensor:
        """fc over the captured target features: [B, T, 3*Ht] -> [B, T, H]."""
        if features.shape[-1] != self.config.fc_in_features:
            raise ValueError(
                f"features must be [B, T, 3*Ht] = [..., {self.config.fc_in_features}] (target_hidden_size "
                f"{self.config.target_hidden_size}), got last dim {features.shape[-1]}"
            )
        return self.fc(features.to(self.fc.weight.dtype))

    def forward(
        self,
        input_ids: torch.Tensor,
        hidden: torch.Tensor,
        position_ids: torch.Tensor,
        cache=None,
        attention_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One draft step over T new positions.

        Args:
            input_ids: [B, T] target-vocabulary ids (the token at each position).
            hidden: [B, T, H] fuse(features) on a round's first step, else the previous step's output.
            position_ids: [B, T] (or [1, T]) int64 absolute positions; RoPE is never clamped.
            cache: any object whose ``update(keys, values, 0)`` appends [B, Hkv, T, hd] and returns the
                layer's full keys and values [B, Hkv, S, hd] (a ``transformers.DynamicCache``, or views of a
                preallocated buffer, read in place whatever their strides), or None.  New keys and values
                are APPENDED, so the caller crops / reorders it like a target cache.
            attention_mask: [B, 1, T, S] additive float mask over S = cached + T keys (0 visible, large
                negative hidden), or None for causal over cache + new tokens.

        Returns:
            logits [B, T, Vd] float32 over the draft vocabulary, hidden_out [B, T, H] (pre-norm).
        """
        g = self.step_hidden(input_ids, hidden, position_ids, cache, attention_mask)
        return self.head(g), g

    def step_hidden(
        self,
        input_ids: torch.Tensor,
        hidden: torch.Tensor,
        position_ids: torch.Tensor,
        cache=None,
        attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``forward`` without the head: hidden_out [B, T, H] (pre-norm), the cache appended as there.
        For callers that need the logits at a few positions only (``head`` on those): the engine's
        absorb of a prompt or a plain run reads one position a row of T, and [B, T, Vd] float32 logits
        are T times the work and, at a real model's 32k draft vocabulary, gigabytes."""
        self._check_step_inputs(input_ids, hidden, position_ids)
        dtype = self.fc.weight.dtype
        emb = self.embed_tokens(input_ids).to(dtype)  # [B, T, H]
        cos, sin = rope_cos_sin(position_ids, self.config.head_dim, self.config.rope_theta)
        return self.midlayer(emb, hidden.to(dtype), cos, sin, cache, attention_mask)  # [B, T, H]

    def head(self, g: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits (float32) of hidden_out g [..., H]."""
        return self.lm_head(self.norm(g)).float()

    def _check_step_inputs(self, input_ids: torch.Tensor, hidden: torch.Tensor, position_ids: torch.Tensor):
        if input_ids.dim() != 2 or input_ids.dtype.is_floating_point:
            raise ValueError(
                f"input_ids must be [B, T] integer ids, got {input_ids.dtype} {list(input_ids.shape)}"
            )
        bsz, q_len = input_ids.shape
        hid = self.config.hidden_size
        if tuple(hidden.shape) != (bsz, q_len, hid):
            hint = " (call fuse(features) first)" if hidden.shape[-1] == self.config.fc_in_features else ""
            raise ValueError(
                f"hidden must be [B, T, H] = [{bsz}, {q_len}, {hid}], got {list(hidden.shape)}{hint}"
            )
        if (
            position_ids.dim() != 2
            or position_ids.shape[0] not in (1, bsz)
            or position_ids.shape[1] != q_len
            or position_ids.dtype.is_floating_point
        ):
            raise ValueError(
                f"position_ids must be [B, T] = [{bsz}, {q_len}] integer positions, got "
                f"{position_ids.dtype} {list(position_ids.shape)}"
            )

    # ------------------------------------------------------------------ vocabulary

    @property
    def target_token_ids(self) -> torch.Tensor:
        """[Vd] int64: the target id of each draft id (arange(Vd) + d2t)."""
        return torch.arange(self.config.draft_vocab_size, device=self.d2t.device) + self.d2t

    def to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary ids (any shape) -> target-vocabulary ids (same shape)."""
        return draft_ids + self.d2t[draft_ids]

    def draft_logits_to_target_probs(self, logits: torch.Tensor, temperature: float) -> torch.Tensor:
        """[..., Vd] draft logits -> [..., V] float32 probabilities in the target vocabulary.

        softmax(logits / T) placed at each draft token's target id, zero elsewhere; T == 0 gives the
        one-hot of the argmax."""
        if not (isinstance(temperature, (int, float)) and temperature >= 0 and math.isfinite(temperature)):
            raise ValueError(f"temperature must be a finite number >= 0, got {temperature!r}")
        vd = self.config.draft_vocab_size
        if logits.shape[-1] != vd:
            raise ValueError(f"logits must be [..., Vd] = [..., {vd}], got {list(logits.shape)}")
        if temperature == 0:
            probs = torch.nn.functional.one_hot(logits.argmax(dim=-1), vd).float()
        else:
            probs = torch.softmax(logits.float() / temperature, dim=-1)
        out = probs.new_zeros(*probs.shape[:-1], self.config.vocab_size)  # [..., V]
        return out.index_copy_(-1, self.target_token_ids, probs)

    # ------------------------------------------------------------------ construction

    def share_embedding(self, target: nn.Module) -> None:
        """Use the target's input embedding (same storage, frozen view of its first V rows).

        Call again after anything that replaces the target's embedding Parameter object."""
        self.embed_tokens = _shared_view(input_embedding(target), self.config)
        self.embedding_shared = True

    @classmethod
    def from_target(
        cls,
        target: nn.Module,
        *,
        aux_layer_ids: Sequence[int] | None = None,
        draft_vocab_size: int | None = None,
        token_ids: torch.Tensor | None = None,
        intermediate_size: int | None = None,
        rope_theta: float = 10000.0,
        dtype: torch.dtype | None = None,
    ) -> Eagle3Drafter:
        """A freshly initialised head sized for an HF causal-LM target, on the target's device.

        H, heads, kv heads, head_dim, rms_norm_eps (and intermediate_size unless given) come from the
        target's config.  The draft vocabulary is ``token_ids`` (sorted target ids) when given, else the
        first ``draft_vocab_size`` ids (a placeholder until one is chosen from data), else every target
        token.  The embedding is the target's (shared storage, frozen; the target's own Parameter and
        its requires_grad are untouched).  dtype defaults to the target embedding's.
        """
        tcfg = text_config(target)
        n_layers = num_layers(target)
        aux = (
            default_aux_layer_ids(n_layers)
            if aux_layer_ids is None
            else check_aux_layer_ids(aux_layer_ids, "aux_layer_ids", n_layers)
        )
        vocab = tcfg.vocab_size
        if token_ids is not None:
            d2t, t2d = build_vocab_maps(torch.as_tensor(token_ids), vocab)
            if draft_vocab_size is not None and draft_vocab_size != d2t.numel():
                raise ValueError(
                    f"draft_vocab_size ({draft_vocab_size}) != len(token_ids) ({d2t.numel()}); "
                    "pass one of them"
                )
            draft_vocab_size = d2t.numel()
        heads = tcfg.num_attention_heads
        cfg = Eagle3Config(
            hidden_size=tcfg.hidden_size,
            intermediate_size=intermediate_size or tcfg.intermediate_size,
            num_attention_heads=heads,
            num_key_value_heads=getattr(tcfg, "num_key_value_heads", None) or heads,
            vocab_size=vocab,
            draft_vocab_size=draft_vocab_size,
            head_dim=getattr(tcfg, "head_dim", None),
            rms_norm_eps=tcfg.rms_norm_eps,
            rope_theta=rope_theta,
            target_hidden_size=tcfg.hidden_size,
            aux_layer_ids=aux,
            max_position_embeddings=getattr(tcfg, "max_position_embeddings", None),
        )
        emb = input_embedding(target)
        dtype = _float_dtype(dtype or emb.weight.dtype)
        drafter = cls(cfg, _shared_view(emb, cfg), device=emb.weight.device, dtype=dtype)
        if token_ids is not None:
            drafter.d2t.copy_(d2t)
            drafter.t2d.copy_(t2d)
        return drafter

    @classmethod
    def from_pretrained(
        cls,
        path_or_hub_id: str | os.PathLike,
        target: nn.Module | None = None,
        *,
        aux_layer_ids: Sequence[int] | None = None,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ) -> Eagle3Drafter:
        """Load a published head (EAGLE official, SpecForge/SGLang or vLLM naming) from a folder or hub id.

        With a target: its sizes are checked against the head (errors name both sizes), a missing
        ``embed_tokens.weight`` is taken from it (shared), and device / dtype default to its embedding's.
        aux_layer_ids: the argument > the checkpoint's eagle_config (converted +1) > the default for the
        target's depth > None (no target).  Keys are matched strictly; missing and unexpected keys are
        listed in the error.  dtype defaults to the checkpoint's when there is no target.
        """
        folder = resolve_folder(path_or_hub_id)
        cfg = read_config(folder)
        raw, source = read_weights(folder)
        tensors = normalize_keys(raw, source)
        n_layers = None
        if target is not None:
            _check_target(cfg, target, source)
            n_layers = num_layers(target)
        cfg = cfg.replace(aux_layer_ids=_choose_aux(cfg, aux_layer_ids, n_layers, source))

        shared = None
        if EMBED_KEY not in tensors:
            if target is None:
                raise ValueError(
                    f"{source} has no {EMBED_KEY}; pass target= so the head can share its input embedding"
                )
            shared = _shared_view(input_embedding(target), cfg)
        device, dtype = _placement(device, dtype, shared, target, tensors)
        _fill_vocab_maps(tensors, cfg, source)
        drafter = cls(cfg, shared, device="meta")
        state = _match_state(drafter, tensors, shared is not None, source)
        state = {k: _place(k, t, device, dtype) for k, t in state.items()}
        if shared is not None:
            state[EMBED_KEY] = shared.weight
        drafter.load_state_dict(state, strict=True, assign=True)
        drafter.embed_tokens.weight.requires_grad_(False)
        return drafter

    def save_pretrained(self, path: str | os.PathLike, *, include_embeddings: bool = False) -> None:
        """Write ``config.json`` (LlamaForCausalLMEagle3) and ``model.safetensors`` (vLLM / SGLang layout).

        Keys: fc.weight, midlayer.*, norm.weight, lm_head.weight, d2t, t2d, and embed_tokens.weight when
        the head owns its embedding or ``include_embeddings`` is set (then the first V rows of the
        shared one)."""
        tensors = {}
        for key, tensor in self.state_dict().items():
            if key == EMBED_KEY:
                if self.embedding_shared and not include_embeddings:
                    continue
                tensor = tensor[: self.config.vocab_size].clone()
            tensors[key] = tensor.detach().to("cpu").contiguous()
        config = self.config.to_hf_dict()
        config["torch_dtype"] = str(self.fc.weight.dtype).removeprefix("torch.")
        write_checkpoint(path, config, tensors)


def _placement(
    device: torch.device | str | None,
    dtype: torch.dtype | None,
    shared: nn.Embedding | None,
    target: nn.Module | None,
    tensors: dict[str, torch.Tensor],
) -> tuple[torch.device, torch.dtype]:
    """Where a loaded head lives: beside the shared embedding (or the target), else the CPU; its dtype:
    the argument, else the target embedding's, else the checkpoint's."""
    if device is None:
        device = shared.weight.device if shared is not None else _target_device(target)
    device = torch.device(device)
    if shared is not None:
        actual = shared.weight.device
        # an unindexed "cuda" means whichever GPU the target is on
        if device.type != actual.type or device.index not in (None, actual.index):
            raise ValueError(
                f"device {device} differs from the target embedding's ({actual}); the head shares that "
                "embedding and must live beside it"
            )
        device = actual
    if dtype is None and target is not None:
        dtype = _target_dtype(target)
    elif dtype is None:
        dtype = tensors["fc.weight"].dtype if "fc.weight" in tensors else torch.float32
    return device, _float_dtype(dtype)


def _float_dtype(dtype: torch.dtype) -> torch.dtype:
    if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise ValueError(f"dtype must be a floating torch.dtype, got {dtype!r}")
    return dtype


def _target_device(target: nn.Module | None) -> torch.device:
    return torch.device("cpu") if target is None else input_embedding(target).weight.device


def _target_dtype(target: nn.Module) -> torch.dtype:
    return input_embedding(target).weight.dtype


def _shared_view(emb: nn.Embedding, cfg: Eagle3Config) -> nn.Embedding:
    """A frozen embedding over the first V rows of ``emb``'s weight (same storage, new Parameter)."""
    rows, width = emb.weight.shape
    if width != cfg.hidden_size:
        raise ValueError(
            f"the target's input embedding is {width} wide but the head's hidden_size is {cfg.hidden_size}; "
            f"such a head must ship its own {EMBED_KEY}"
        )
    if rows < cfg.vocab_size:
        raise ValueError(
            f"the target's input embedding has {rows} rows, fewer than the head's vocab_size {cfg.vocab_size}"
        )
    return nn.Embedding.from_pretrained(emb.weight.detach()[: cfg.vocab_size], freeze=True)


def _check_target(cfg: Eagle3Config, target: nn.Module, source: str) -> None:
    """Hidden size and vocabulary of the head against the target; errors name both sizes."""
    tcfg = text_config(target)
    if tcfg.hidden_size != cfg.target_hidden_size:
        raise ValueError(
            f"{source}: hidden size mismatch: the head expects target hidden size {cfg.target_hidden_size} "
            f"(fc in-features 3*{cfg.target_hidden_size} = {cfg.fc_in_features}) but the target's "
            f"hidden_size is {tcfg.hidden_size} (3*{tcfg.hidden_size} = {3 * tcfg.hidden_size} features)"
        )
    if tcfg.vocab_size != cfg.vocab_size:
        raise ValueError(
            f"{source}: vocab size mismatch: the head's vocab_size is {cfg.vocab_size} but the target's "
            f"config.vocab_size is {tcfg.vocab_size}"
        )
    rows = input_embedding(target).num_embeddings
    if rows < cfg.vocab_size:
        raise ValueError(
            f"{source}: vocab size mismatch: the head's vocab_size is {cfg.vocab_size} but the target's "
            f"input embedding has only {rows} rows"
        )


def _choose_aux(
    cfg: Eagle3Config, explicit: Sequence[int] | None, n_layers: int | None, source: str
) -> tuple[int, int, int] | None:
    """The argument > the checkpoint's (already +1) > the target's default > None; range-checked."""
    if explicit is not None:
        return check_aux_layer_ids(explicit, "aux_layer_ids", n_layers)
    if cfg.aux_layer_ids is not None:
        name = f"{source}: aux layers from eagle_config.eagle_aux_hidden_state_layer_ids (+1)"
        return check_aux_layer_ids(cfg.aux_layer_ids, name, n_layers)
    return None if n_layers is None else default_aux_layer_ids(n_layers)


def _fill_vocab_maps(tensors: dict[str, torch.Tensor], cfg: Eagle3Config, source: str) -> None:
    """Derive a missing d2t / t2d from the other, or the identity when Vd == V; check they agree."""
    vd, vocab = cfg.draft_vocab_size, cfg.vocab_size
    has_d2t, has_t2d = "d2t" in tensors, "t2d" in tensors
    if not has_d2t and not has_t2d:
        if vd != vocab:
            raise ValueError(
                f"{source} has no d2t / t2d but draft_vocab_size ({vd}) != vocab_size ({vocab}); the "
                "draft -> target map is needed"
            )
        tensors["d2t"], tensors["t2d"] = build_vocab_maps(torch.arange(vd), vocab)
        return
    for key, size, field in (("t2d", vocab, "vocab_size"), ("d2t", vd, "draft_vocab_size")):
        if key in tensors and tuple(tensors[key].shape) != (size,):
            shape = list(tensors[key].shape)
            raise ValueError(f"{source}: {key} has shape {shape}, expected [{size}] ({field})")
    # [Vd] target ids of the draft vocabulary, from whichever map the file has
    used = torch.arange(vd) + tensors["d2t"].long() if has_d2t else tensors["t2d"].bool().nonzero().flatten()
    if used.numel() != vd or used.numel() != used.unique().numel() or used.min() < 0 or used.max() >= vocab:
        raise ValueError(
            f"{source}: the draft vocabulary map must name {vd} distinct target ids in [0, {vocab})"
        )
    if has_t2d and (int(tensors["t2d"].bool().sum()) != vd or not bool(tensors["t2d"].bool()[used].all())):
        raise ValueError(f"{source}: t2d does not mark exactly the target ids that d2t maps to")
    if not has_d2t:
        tensors["d2t"] = used - torch.arange(vd)
    if not has_t2d:
        tensors["t2d"] = torch.zeros(vocab, dtype=torch.bool)
        tensors["t2d"][used] = True


def _match_state(
    drafter: Eagle3Drafter, tensors: dict[str, torch.Tensor], embed_shared: bool, source: str
) -> dict[str, torch.Tensor]:
    """Strict key and shape match of the checkpoint against the module (the shared embedding excepted)."""
    expected = {k: tuple(v.shape) for k, v in drafter.state_dict().items()}
    if embed_shared:
        del expected[EMBED_KEY]
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    if missing or unexpected:
        raise ValueError(
            f"{source} does not match an EAGLE-3 head: missing keys {_short(missing)}; "
            f"unexpected keys {_short(unexpected)}"
        )
    wrong = [
        f"{k}: file {list(tensors[k].shape)} vs config {list(shape)}"
        for k, shape in expected.items()
        if tuple(tensors[k].shape) != shape
    ]
    if wrong:
        raise ValueError(f"{source}: tensor shapes disagree with config.json: " + "; ".join(wrong))
    return {k: tensors[k] for k in expected}


def _place(key: str, tensor: torch.Tensor, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    if key == "d2t":
        return tensor.to(device=device, dtype=torch.int64)
    if key == "t2d":
        return tensor.to(device=device, dtype=torch.bool)
    return tensor.to(device=device, dtype=dtype)


def _short(keys: list[str]) -> str:
    if len(keys) <= _LIST_LIMIT:
        return str(keys)
    return f"{keys[:_LIST_LIMIT]} and {len(keys) - _LIST_LIMIT} more"
