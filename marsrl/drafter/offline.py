"""Offline training of a draft head on sequences the target generated itself: the draft vocabulary
(the most frequent target tokens), right-padded batches, and a resumable loop (one target forward and
one ``DraftTrainer`` step per batch) that checkpoints through a staging folder.

Leaves out: data / tensor parallel training, sequence packing, mixed-precision master weights (train the
head in float32), learning-rate schedules, activation checkpointing.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import torch
from torch import nn
from tqdm.auto import tqdm

from ..batching import bucket_by_length
from .checkpoint import CONFIG_FILE, SAFETENSORS_FILE
from .config import OFFLINE
from .eagle3 import EMBED_KEY, Eagle3Drafter
from .refresh import DraftTrainer
from .ttt import capture_batch

STATE_FILE = "trainer_state.pt"
_PARTIAL = ".partial"  # a save in progress under out_dir; complete once it holds STATE_FILE


class ResumeError(ValueError):
    """A checkpoint under out_dir cannot continue this run (different head or data schedule)."""


# ---------------------------------------------------------------------------------------- vocabulary


def select_draft_vocab(
    sequences: Iterable[Sequence[int]] | Mapping[int, int] | torch.Tensor,
    draft_vocab_size: int,
    vocab_size: int,
) -> torch.Tensor:
    """The draft vocabulary: sorted int64 ids [Vd] of the ``draft_vocab_size`` most frequent target tokens.

    Args:
        sequences: the training RESPONSES as token-id sequences, or token counts already made: a mapping
            id -> count (e.g. ``collections.Counter``) or a 1-D tensor of counts [V].
        draft_vocab_size: Vd, 1 <= Vd <= V.
        vocab_size: V, the target vocabulary; every id must lie in [0, V).

    Ties are broken by the lower id.  When fewer than Vd distinct tokens occur, the lowest unused ids
    fill the rest (they are never predicted by the data, but keep the head's size as asked).
    """
    if not 1 <= draft_vocab_size <= vocab_size:
        raise ValueError(
            f"draft_vocab_size must be in [1, vocab_size = {vocab_size}], got {draft_vocab_size}"
        )
    counts = _token_counts(sequences, vocab_size)  # [V] int64
    # stable sort on -count keeps ids ascending among equal counts
    order = torch.sort(-counts, stable=True).indices
    seen = int((counts > 0).sum())
    chosen = order[: min(seen, draft_vocab_size)]
    if chosen.numel() < draft_vocab_size:
        unused = torch.ones(vocab_size, dtype=torch.bool)
        unused[chosen] = False
        fill = unused.nonzero().flatten()[: draft_vocab_size - chosen.numel()]
        chosen = torch.cat([chosen, fill])
    return chosen.sort().values


def _token_counts(source, vocab_size: int) -> torch.Tensor:
    if isinstance(source, torch.Tensor):
        if source.dim() != 1 or source.numel() != vocab_size:
            raise ValueError(
                f"token counts must be a 1-D tensor [V] = [{vocab_size}], got {list(source.shape)}"
            )
        counts = source.long()
    elif isinstance(source, Mapping):
        counts = torch.zeros(vocab_size, dtype=torch.long)
        for tok, n in source.items():
            _check_id(tok, vocab_size, "token counts")
            counts[tok] += int(n)
    else:
        counts = torch.zeros(vocab_size, dtype=torch.long)
        for i, seq in enumerate(source):
            ids = torch.as_tensor(list(seq), dtype=torch.long)
            if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
                raise ValueError(f"sequences[{i}] has ids outside [0, {vocab_size})")
            counts += torch.bincount(ids, minlength=vocab_size)
    if bool((counts < 0).any()):
        raise ValueError("token counts must be >= 0")
    return counts


def _check_id(tok, vocab_size: int, what: str) -> None:
    if isinstance(tok, bool) or not isinstance(tok, int) or not 0 <= tok < vocab_size:
        raise ValueError(f"{what}: {tok!r} is not a token id in [0, {vocab_size})")


# ---------------------------------------------------------------------------------------- offline


def make_batch(
    sequences: Sequence[Sequence[int]],
    max_len: int,
    prompt_lens: Sequence[int] | None = None,
    device: torch.device | str | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-pad sequences (cut to ``max_len``): input_ids [B, T], attention_mask [B, T], loss_mask [B, T].

    loss_mask[b, t]: tokens t and t+1 are real and t+1 is a response token (t + 1 >= prompt_lens[b]).
    """
    lens = [min(len(s), max_len) for s in sequences]
    width = max(lens)
    ids = torch.zeros(len(sequences), width, dtype=torch.long)
    for b, (seq, n) in enumerate(zip(sequences, lens, strict=True)):
        ids[b, :n] = torch.as_tensor(list(seq[:n]), dtype=torch.long)
    slots = torch.arange(width)
    attn = slots < torch.tensor(lens).unsqueeze(1)  # [B, T]
    start = (
        torch.zeros(len(sequences), dtype=torch.long) if prompt_lens is None else torch.tensor(prompt_lens)
    )
    loss = (slots + 1 < torch.tensor(lens).unsqueeze(1)) & (slots + 1 >= start.unsqueeze(1))
    return ids.to(device), attn.to(device), loss.to(device)


def train_offline(
    target: nn.Module,
    drafter: Eagle3Drafter,
    sequences: Sequence[Sequence[int]],
    *,
    epochs: int = OFFLINE.epochs,
    batch_size: int = OFFLINE.batch_size,
    max_len: int = OFFLINE.max_len,
    lr: float = OFFLINE.lr,
    out_dir: str | os.PathLike | None = None,
    resume: bool = True,
    progress: bool = True,
    seed: int = OFFLINE.seed,
    save_every: int = OFFLINE.save_every,
    prompt_lens: Sequence[int] | None = None,
    max_steps: int | None = None,
) -> dict:
    """Train ``drafter`` on sequences the target generated itself (prompt + response token ids).

    Each step: a batch of sequences (shuffled per epoch from ``seed`` and bucketed by length; right-padded;
    cut to ``max_len``),
    one target forward through ``capture_batch``, one ``DraftTrainer`` step.  ``prompt_lens`` (one per
    sequence) limits the loss to predictions of response tokens; None trains on every position.

    With ``out_dir``: the head (``save_pretrained``) and ``trainer_state.pt`` (optimizer, step, loss
    history, RNG state) are written every ``save_every`` steps and at the end, through a staging folder so
    a run killed mid-save keeps the previous checkpoint.  With ``resume`` and a checkpoint there, the head
    weights and trainer state are loaded and training continues at the saved step on the same schedule;
    the seed, data size, batch size and max_len must match (``ResumeError`` otherwise).  Without
    ``resume`` an old trainer_state.pt there is deleted at once.  ``max_steps`` stops early (after saving).

    Returns: ``steps`` (global steps done), ``start_step``, ``first_loss`` / ``last_loss`` / ``min_loss``
    over the whole run's loss history, ``last_metrics``, ``out_dir``.
    """
    for name, value in (("epochs", epochs), ("batch_size", batch_size), ("max_len", max_len)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    if max_len < 2:
        raise ValueError(f"max_len must be >= 2 (a token and its successor), got {max_len}")
    if save_every < 1:
        raise ValueError(f"save_every must be >= 1, got {save_every}")
    sequences = [list(s) for s in sequences]
    if not sequences:
        raise ValueError("sequences is empty")
    for i, seq in enumerate(sequences):
        if len(seq) < 2:
            raise ValueError(f"sequences[{i}] has {len(seq)} token(s); at least 2 are needed")
    if prompt_lens is not None and len(prompt_lens) != len(sequences):
        raise ValueError(f"prompt_lens has {len(prompt_lens)} entries for {len(sequences)} sequences")

    schedule = _schedule([min(len(q), max_len) for q in sequences], batch_size, epochs, seed)
    total = len(schedule) if max_steps is None else min(len(schedule), max_steps)
    trainer = DraftTrainer(drafter, lr=lr)
    data_key = {"seed": seed, "num_sequences": len(sequences), "batch_size": batch_size, "max_len": max_len}
    losses: list[float] = []
    out = None if out_dir is None else Path(out_dir)
    if out is not None and not resume:  # starting over: a stale state must never be resumed later
        shutil.rmtree(out / _PARTIAL, ignore_errors=True)
        (out / STATE_FILE).unlink(missing_ok=True)
    if out is not None and resume:
        state = _load_checkpoint(out, drafter, data_key)
        if state is not None:
            trainer.load_state_dict(state["trainer"])
            losses = list(state["losses"])
            torch.set_rng_state(state["rng"])
    start = trainer.step_count
    saved_at = start if out is not None and (out / STATE_FILE).is_file() else None  # step on disk
    device = next(target.parameters()).device
    layer_ids = drafter.config.aux_layer_ids
    metrics: dict[str, float] = {}
    bar = tqdm(total=total, initial=min(start, total), disable=not progress, desc="draft train", unit="step")
    try:
        for step in range(start, total):
            idx = schedule[step]
            lens = None if prompt_lens is None else [prompt_lens[i] for i in idx]
            ids, attn, loss_mask = make_batch([sequences[i] for i in idx], max_len, lens, device)
            batch = capture_batch(target, ids, attn, layer_ids, loss_mask=loss_mask, drafter=drafter)
            metrics = trainer.step(batch)
            losses.append(metrics["loss"])
            bar.update(1)
            bar.set_postfix(loss=f"{metrics['loss']:.3f}", acc0=f"{metrics['acc_0']:.2f}")
            if out is not None and trainer.step_count % save_every == 0:
                _save_checkpoint(out, drafter, trainer, losses, data_key)
                saved_at = trainer.step_count
    finally:
        bar.close()
    if out is not None and saved_at != trainer.step_count:
        _save_checkpoint(out, drafter, trainer, losses, data_key)
    return {
        "steps": trainer.step_count,
        "start_step": start,
        "first_loss": losses[0] if losses else None,
        "last_loss": losses[-1] if losses else None,
        "min_loss": min(losses) if losses else None,
        "last_metrics": metrics,
        "out_dir": None if out is None else str(out),
    }


def _schedule(lengths: Sequence[int], batch_size: int, epochs: int, seed: int) -> list[list[int]]:
    """Every step's sequence indices: a fresh permutation per epoch from one seeded generator, bucketed
    by length (``marsrl.batching``) so a batch pads little."""
    gen = torch.Generator().manual_seed(seed)
    steps = []
    for _ in range(epochs):
        perm = torch.randperm(len(lengths), generator=gen).tolist()
        steps += bucket_by_length(perm, lengths, batch_size, gen)
    return steps


def _save_checkpoint(out: Path, drafter: Eagle3Drafter, trainer: DraftTrainer, losses, data_key) -> None:
    """Write head + state into out/.partial, then move them into out (the state file last)."""
    partial = out / _PARTIAL
    shutil.rmtree(partial, ignore_errors=True)
    drafter.save_pretrained(partial)
    state = {
        "trainer": trainer.state_dict(),
        "losses": list(losses),
        "rng": torch.get_rng_state(),
        **data_key,
    }
    torch.save(state, partial / (STATE_FILE + ".tmp"))
    os.replace(partial / (STATE_FILE + ".tmp"), partial / STATE_FILE)  # the staged save is now complete
    _finish_partial(out)


def _finish_partial(out: Path) -> None:
    """Move a complete staged save into ``out``; discard an incomplete one."""
    partial = out / _PARTIAL
    if not partial.is_dir():
        return
    if (partial / STATE_FILE).is_file():
        for name in (CONFIG_FILE, SAFETENSORS_FILE, STATE_FILE):
            if (partial / name).exists():
                os.replace(partial / name, out / name)
    shutil.rmtree(partial, ignore_errors=True)


def _load_checkpoint(out: Path, drafter: Eagle3Drafter, data_key: dict) -> dict | None:
    """Load out's head weights into ``drafter`` and return its trainer state, or None when there is none."""
    _finish_partial(out)
    if not (out / STATE_FILE).is_file():
        return None
    state = torch.load(out / STATE_FILE, map_location="cpu", weights_only=True)
    for key, want in data_key.items():
        if state.get(key) != want:
            raise ResumeError(
                f"{out / STATE_FILE} was written with {key}={state.get(key)!r} but this run has "
                f"{key}={want!r}; use the same value to resume, or start over (resume=False / --no-resume)"
            )
    from safetensors.torch import load_file

    saved = load_file(str(out / SAFETENSORS_FILE))
    own = {k: v for k, v in drafter.state_dict().items() if not (k == EMBED_KEY and drafter.embedding_shared)}
    if set(saved) != set(own) or any(saved[k].shape != v.shape for k, v in own.items()):
        raise ResumeError(
            f"{out / SAFETENSORS_FILE} holds a head of another shape than the one being trained"
        )
    if not torch.equal(saved["d2t"], own["d2t"].cpu()):
        raise ResumeError(
            f"{out / SAFETENSORS_FILE} has another draft vocabulary than the head being trained"
        )
    with torch.no_grad():
        for key, tensor in own.items():
            tensor.copy_(saved[key])
    return state
