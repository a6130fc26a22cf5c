"""Capturing EAGLE-3's target features: the residual stream entering three decoder layers, taken with
forward pre-hooks during an ordinary target forward (no ``output_hidden_states``, which would keep all
L+1 layers alive).

Index convention: i in [0, L] is HF ``output_hidden_states[i]`` for i < L, i.e. the residual stream
entering decoder layer i (0 = the embedding output).  i == L is the input of the final norm; note that
HF's ``output_hidden_states[L]`` is the final-NORMED state, so at L the two differ by the norm.

Leaves out: choosing layers for architectures other than the ``target.model.layers`` family.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any

import torch
from torch import nn

from .config import check_aux_layer_ids
from .target import decoder_layers, final_norm


def default_aux_layer_ids(num_layers: int) -> tuple[int, int, int]:
    """EAGLE-3's feature layers for a target with ``num_layers`` (L) decoder layers.

    L >= 7: the paper's (2, L//2, L-3), e.g. 2, 16, 29 for L = 32 and 2, 18, 33 for L = 36.
    4 <= L <= 6 (the paper's rule collides): (1, L//2, L-1), spread over layers 1..L-1.
    L == 3: (1, 2, 3), the high tap being the input of the final norm.
    L < 3: ValueError (three distinct non-embedding layers do not exist).
    """
    if isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers < 3:
        raise ValueError(f"num_layers must be an int >= 3 to pick three feature layers, got {num_layers!r}")
    L = num_layers
    if 2 < L // 2 < L - 3:
        return (2, L // 2, L - 3)
    if L >= 4:
        return (1, L // 2, L - 1)
    return (1, 2, 3)


class FeatureTap:
    """Pre-hooks on three target layers; ``features()`` returns their inputs from the last forward.

    Use as a context manager (hooks removed on exit) or call ``remove()``.  Hooks are registered
    with ``with_kwargs=True`` so hidden_states may arrive positionally or as a keyword.

    Args:
        target: HF causal LM with ``target.model.layers`` (and ``target.model.norm`` for index L).
        layer_ids: (low, mid, high) ``output_hidden_states`` indices; None -> default_aux_layer_ids(L).
        detach: store detached tensors (default), so draft training never backpropagates into the target.
    """

    def __init__(
        self, target: nn.Module, layer_ids: Sequence[int] | None = None, *, detach: bool = True
    ) -> None:
        layers = decoder_layers(target)
        self.num_layers = len(layers)
        if layer_ids is None:
            layer_ids = default_aux_layer_ids(self.num_layers)
        self.layer_ids = check_aux_layer_ids(layer_ids, "layer_ids", self.num_layers)
        self.detach = detach
        self._captured: list[torch.Tensor | None] = [None, None, None]
        self._handles = []
        for slot, i in enumerate(self.layer_ids):
            module = layers[i] if i < self.num_layers else final_norm(target)
            hook = partial(self._capture, slot)
            self._handles.append(module.register_forward_pre_hook(hook, with_kwargs=True))

    def _capture(self, slot: int, module: nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
        if args:
            h = args[0]
        elif "hidden_states" in kwargs:
            h = kwargs["hidden_states"]
        else:
            raise ValueError(
                f"{type(module).__name__} was called without hidden_states (positional or keyword); "
                "cannot tap its input"
            )
        self._captured[slot] = h.detach() if self.detach else h

    def features(self) -> torch.Tensor:
        """cat([low, mid, high], -1) of the last target forward: [B, T, 3*Ht]; clears the capture."""
        if any(h is None for h in self._captured):
            raise RuntimeError(
                "FeatureTap.features(): no complete target forward since the last call "
                f"(layers {self.layer_ids})"
            )
        out = torch.cat(self._captured, dim=-1)  # [B, T, 3*Ht]
        self.clear()
        return out

    def clear(self) -> None:
        """Forget captured tensors (e.g. after a forward whose features are not needed)."""
        self._captured = [None, None, None]

    def remove(self) -> None:
        """Unregister the hooks and drop captured tensors."""
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self.clear()

    def __enter__(self) -> FeatureTap:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()
