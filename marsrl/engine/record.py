"""The host side of a round: each row's bookkeeping (``Row``), the round's record copied from the device
in one go (``fetch`` / ``fetch_plain``), and the per-token record it appends to every row until the row
finishes (``record``).  What the fields mean: docs/concepts.md ("the per-token record").
"""

from __future__ import annotations

import numpy as np
import torch

from ..trajectory import PER_TOKEN_FIELDS, Trajectory
from ..verify import Provenance
from .config import EngineConfig, SamplingParams

# the verify result's per-token fields that cross to the host (besides its tokens)
RESULT_FIELDS = (
    "provenance",
    "target_logprob",
    "behavior_logprob",
    "logit_ratio",
    "is_top2",
    "unsupported_mass",
)


class Row:
    """Host-side bookkeeping of one sequence."""

    def __init__(self, index: int, prompt: list[int], serial: int = 0):
        self.index = index
        self.prompt = prompt
        self.serial = serial  # the row's place in its call: the planner's name for it (``RowAcceptance``)
        self.tokens: list[int] = []
        self.record: dict[str, list] = {k: [] for k in PER_TOKEN_FIELDS}
        self.rounds = self.drafted = self.accepted = self.relaxed = 0
        self.finish: str | None = None


def fetch(res, totals: dict, n_drafts: torch.Tensor | None = None) -> dict[str, list]:
    """The round's record in one device -> host copy (counted in ``totals["host_syncs"]``): every
    per-token field of ``res`` and num_emitted (and per-row draft counts ``n_drafts`` [B]) packed into
    one float64 tensor (ids, codes and float32 values are all exact in float64)."""
    fields = ("tokens", *RESULT_FIELDS)
    cols = [getattr(res, f).to(torch.float64) for f in fields]
    w = cols[0].shape[1]
    extra = [res.num_emitted.to(torch.float64).unsqueeze(1)]
    if n_drafts is not None:
        extra.append(n_drafts.to(torch.float64).unsqueeze(1))
    # the copy is the one sync; what follows runs on a host array
    packed = torch.cat([*cols, *extra], 1).cpu().numpy()
    totals["host_syncs"] += 1
    out = {f: packed[:, i * w : (i + 1) * w] for i, f in enumerate(fields)}
    for f in ("tokens", "provenance"):
        out[f] = out[f].astype(np.int64).tolist()
    out["is_top2"] = out["is_top2"].astype(bool).tolist()
    for f in ("target_logprob", "behavior_logprob", "logit_ratio", "unsupported_mass"):
        out[f] = out[f].tolist()
    out["num_emitted"] = packed[:, len(fields) * w].astype(np.int64).tolist()
    if n_drafts is not None:
        out["num_drafts"] = packed[:, len(fields) * w + 1].astype(np.int64).tolist()
    return out


def fetch_plain(res, totals: dict) -> dict[str, list]:
    """``fetch`` of a plain sample (``sample_plain``: one BONUS token a row, b = p, nothing
    unsupported): only its four varying fields cross, the constants are filled in on the host."""
    cols = (res.tokens, res.target_logprob, res.logit_ratio, res.is_top2)
    packed = torch.cat([c.to(torch.float64) for c in cols], 1).cpu().numpy()
    totals["host_syncs"] += 1
    bsz = packed.shape[0]
    logp = packed[:, 1:2].tolist()
    return {
        "tokens": packed[:, 0:1].astype(np.int64).tolist(),
        "provenance": [[int(Provenance.BONUS)]] * bsz,
        "target_logprob": logp,
        "behavior_logprob": logp,
        "logit_ratio": packed[:, 2:3].tolist(),
        "is_top2": packed[:, 3:4].astype(bool).tolist(),
        "unsupported_mass": [[0.0]] * bsz,
        "num_emitted": [1] * bsz,
    }


def record(
    rows: list[Row],
    host: dict,
    sampling: SamplingParams,
    eos: set[int],
    totals: dict,
    drafted: int | list[int] | None,
    max_seq_len: int | None,
) -> list[tuple[int, Row]]:
    """Append each row's emitted tokens until it finishes; returns the rows still active, with their
    places in ``rows``.

    host: the round's record on the host (``fetch``).  drafted: None for the prefill's token, else the
    drafts verified this round (an int for every row, or a list with one count per row).  A row
    finishes at an EOS, a stop id, ``max_new_tokens`` or the context's end ``max_seq_len`` (the engine
    never emits past it); the round's tokens after that are dropped."""
    stop = set(sampling.stop_token_ids)
    active = []
    for b, row in enumerate(rows):
        n = host["num_emitted"][b]
        if drafted is not None:
            n_drafted = drafted if isinstance(drafted, int) else drafted[b]
            row.rounds += 1
            row.drafted += n_drafted
            totals["rounds"] += 1
            totals["drafted"] += n_drafted
        for j in range(n):
            tok = host["tokens"][b][j]
            prov = host["provenance"][b][j]
            row.tokens.append(tok)
            row.record["provenance"].append(prov)
            row.record["target_logprobs"].append(host["target_logprob"][b][j])
            row.record["behavior_logprobs"].append(host["behavior_logprob"][b][j])
            row.record["logit_ratio"].append(host["logit_ratio"][b][j])
            row.record["is_top2"].append(host["is_top2"][b][j])
            row.record["draft_position"].append(j)
            row.record["unsupported_mass"].append(host["unsupported_mass"][b][j])
            if drafted is not None and prov in (Provenance.ACCEPTED, Provenance.RELAXED):
                row.accepted += 1
                totals["accepted"] += 1
                if prov == Provenance.RELAXED:
                    row.relaxed += 1
                    totals["relaxed"] += 1
            totals["tokens"] += 1
            if drafted is not None:  # only kept tokens: those after an EOS / the length cap are dropped
                totals["tokens_in_rounds"] += 1
            if tok in eos and not sampling.ignore_eos:
                row.finish = "eos"
            elif tok in stop:
                row.finish = "stop"
            elif len(row.tokens) >= sampling.max_new_tokens:
                row.finish = "length"
            elif max_seq_len is not None and len(row.prompt) + len(row.tokens) >= max_seq_len:
                row.finish = "length"  # the context is full
            if row.finish:
                break
        if row.finish is None:
            active.append((b, row))
    return active


def trajectory(row: Row, config: EngineConfig, speculative: bool) -> Trajectory:
    """The finished row as a ``Trajectory``; a plain engine's rows are recorded as strict."""
    return Trajectory(
        prompt_ids=list(row.prompt),
        completion_ids=row.tokens,
        finish_reason=row.finish or "length",
        rule=config.rule if speculative else "strict",
        theta=config.theta,
        relax_prob=config.relax_prob,
        stats=dict(rounds=row.rounds, drafted=row.drafted, accepted=row.accepted, relaxed=row.relaxed),
        **row.record,
    )
