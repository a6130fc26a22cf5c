"""Engine and sampling settings: the one place their defaults live. Invariants fail at construction,
naming the field to change."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ..verify import DEFAULT_THETA, RULES, Rule


@dataclass(frozen=True)
class TreeConfig:
    """An EAGLE-2/3 dynamic draft tree (``top_k = 1`` would be a chain of ``depth`` tokens)."""

    top_k: int = 10  # children expanded per frontier node, and frontier width
    depth: int = 6  # expansion steps: paths hold up to depth + 1 draft tokens
    total_tokens: int = 60  # tree size including the root (the last committed token)

    def __post_init__(self):
        if self.top_k < 1:
            raise ValueError(f"tree.top_k must be >= 1, got {self.top_k}")
        if self.depth < 0:
            raise ValueError(f"tree.depth must be >= 0, got {self.depth}")
        if self.total_tokens < 2:
            raise ValueError(f"tree.total_tokens must be >= 2 (root + one node), got {self.total_tokens}")


@dataclass(frozen=True)
class EngineConfig:
    """How the speculative engine drafts and verifies."""

    rule: Rule = "strict"  # "strict" (lossless) | "mars" | "mars_code"; lossy rules must be asked for
    theta: float = DEFAULT_THETA  # MARS margin threshold on z2/z1
    # lambda in [0, 1] (rule "mars"): where the rule would relax, relax with this probability (the strict
    # test's uniform decides), so pi / b <= 1 / (1 - lambda) per chain token (1 / (1 - lambda)^2 at a tree
    # node) and the run stays correctable; 1 = the paper (a greedy draft's b can hit 0), 0 = strict.  At
    # temperature 0 only 0 and 1 are allowed; "mars_code" needs 1
    relax_prob: float = 1.0
    # K for chain drafting (the most drafts a round can verify), or "auto": each round drafts the k in
    # 0..max_draft_tokens with the best expected tokens per second for the live batch, from a cost model
    # measured on the engine's models and running acceptance estimates (marsrl.engine.adaptive)
    num_draft_tokens: int | Literal["auto"] = 7
    max_draft_tokens: int | None = None  # the largest k "auto" may choose (default 7); only with "auto"
    # "auto": fold each call's measured round times into the cost model's per-batch-size levels, and
    # start each call's acceptance estimates and exploration count from the last call's (False: all
    # fixed, so every call with the same inputs and seed repeats the same K sequence)
    adapt_costs: bool = True
    # "auto" with adapt_costs: measure each round's seconds against the model's prediction, per kind
    # (plain step or speculative round), and correct the model's speculative-against-plain ratio from
    # them where the two kinds are near a tie (``marsrl.engine.adaptive.SpeedCheck``); False: the
    # calibrated ratio alone decides
    speed_check: bool = True
    # "auto": after a run of plain steps the drafter absorbs only each row's last ``drafter_window``
    # committed pairs and skips the older ones (their positions still count), so the next speculative
    # round does not pay a draft step for every plain step before it, at the price of drafts made
    # without that context; 0 (default) absorbs every pair, else at least max_draft_tokens + 1 (the most
    # one round commits).  Drafts only: verification, and strict's exactness, never depend on it
    drafter_window: int = 0
    # chain drafting stops early for a row once the draft's own probability of its chain so far (the
    # product of its per-token probabilities) falls below this; the row still verifies the token drafted
    # last.  0 = always K drafts.  Only for an EAGLE-3 chain; the draft's confidence never touches the
    # acceptance test, so strict stays lossless at any value.
    draft_confidence: float = 0.0
    tree: TreeConfig | None = None  # None: chain drafting; else a dynamic tree
    draft_sampling: Literal["greedy", "sample"] = "greedy"  # EAGLE proposes its argmax; "sample": x ~ q
    max_batch_size: int = 64  # sequences decoded together; larger requests run in successive batches
    # prompt + completion cap, reached exactly at any K (rows near it verify fewer drafts); None: the
    # target's max_position_embeddings
    max_seq_len: int | None = None
    # bf16 / fp16 targets: compute the verify positions' logits with float32 output (a bf16 GEMM output
    # rounds z2/z1 by up to ~1e-2 and makes exact ties, right where the margin rule decides)
    fp32_logits: bool = True
    # run the prefill once per distinct prompt of a batch and copy its KV entries, logits and features
    # to the rows that share it (a GRPO group); False prefills every row (the reference path)
    share_prefix: bool = True
    # time each phase of a round (device-synchronised: slower on a GPU) into engine.stats["time"],
    # stats["forward_by_width"] and a per-round stats["trace"]
    profile: bool = False

    def __post_init__(self):
        if self.rule not in RULES:
            raise ValueError(f"rule must be one of {list(RULES)}, got {self.rule!r}")
        if not self.theta >= 0:
            raise ValueError(f"theta must be >= 0, got {self.theta}")
        lam = self.relax_prob
        if isinstance(lam, bool) or not isinstance(lam, (int, float)) or not 0 <= lam <= 1:
            raise ValueError(f"relax_prob must be a number in [0, 1], got {lam!r}")
        if self.rule == "mars_code" and lam != 1:
            raise ValueError(
                f"relax_prob = {lam} with rule 'mars_code', which reproduces the released code's "
                "deterministic relaxation: set relax_prob = 1, or rule = 'mars' for a relaxation probability"
            )
        k = self.num_draft_tokens
        if k == "auto":
            if self.max_draft_tokens is None:
                object.__setattr__(self, "max_draft_tokens", 7)
            if isinstance(self.max_draft_tokens, bool) or not isinstance(self.max_draft_tokens, int):
                raise ValueError(f"max_draft_tokens must be an int >= 1, got {self.max_draft_tokens!r}")
            if self.max_draft_tokens < 1:
                raise ValueError(f"max_draft_tokens must be >= 1, got {self.max_draft_tokens}")
            if self.tree is not None:
                raise ValueError('num_draft_tokens="auto" sizes chains; a tree sizes itself (set tree=None)')
            if self.draft_confidence > 0:
                raise ValueError(
                    'num_draft_tokens="auto" and draft_confidence both size the chain: set draft_confidence=0'
                )
            w = self.drafter_window
            if isinstance(w, bool) or not isinstance(w, int) or (w != 0 and w < self.max_draft_tokens + 1):
                raise ValueError(
                    f"drafter_window must be 0 (no window) or an int >= max_draft_tokens + 1 = "
                    f"{self.max_draft_tokens + 1} (one round's pairs), got {w!r}"
                )
        elif isinstance(k, bool) or not isinstance(k, int):
            raise ValueError(f'num_draft_tokens must be an int >= 1 or "auto", got {k!r}')
        elif k < 1:
            raise ValueError(f"num_draft_tokens must be >= 1, got {k}")
        elif self.max_draft_tokens is not None:
            raise ValueError('max_draft_tokens is only for num_draft_tokens="auto"; set it to None')
        elif self.drafter_window:
            raise ValueError('drafter_window is only for num_draft_tokens="auto"; set it to 0')
        if not isinstance(self.speed_check, bool):
            raise ValueError(f"speed_check must be True or False, got {self.speed_check!r}")
        if not 0.0 <= self.draft_confidence < 1.0:
            raise ValueError(f"draft_confidence must be in [0, 1), got {self.draft_confidence}")
        if self.tree is not None and self.draft_confidence > 0:
            raise ValueError("draft_confidence stops chain drafting early; a tree sizes itself (set it to 0)")
        if self.draft_sampling not in ("greedy", "sample"):
            raise ValueError(f"draft_sampling must be 'greedy' or 'sample', got {self.draft_sampling!r}")
        if self.tree is not None and self.draft_sampling != "greedy":
            raise ValueError(
                "tree drafting proposes deterministic top-k children: set draft_sampling='greedy'"
            )
        if self.max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {self.max_batch_size}")
        if self.max_seq_len is not None and self.max_seq_len < 2:
            raise ValueError(f"max_seq_len must be >= 2, got {self.max_seq_len}")


@dataclass(frozen=True)
class SamplingParams:
    """What to generate for each prompt."""

    temperature: float = 1.0  # 0 = greedy
    top_k: int | None = None
    top_p: float | None = None
    max_new_tokens: int = 256
    eos_token_id: int | tuple[int, ...] | None = None  # None: the target's generation config / config
    stop_token_ids: tuple[int, ...] = ()  # extra ids that end a completion (kept in it)
    ignore_eos: bool = False
    seed: int = 0
    n: int = 1  # completions per prompt (a GRPO group), returned consecutively per prompt

    def __post_init__(self):
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"top_k must be None or >= 1, got {self.top_k}")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be None or in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")
