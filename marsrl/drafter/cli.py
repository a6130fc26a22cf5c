"""``marsrl draft train``: train an EAGLE-3 head offline on sequences the target generated itself.

    marsrl draft train --target DIR --data FILE.jsonl --out DIR [--draft-vocab N] [--epochs N]
        [--batch-size N] [--max-len N] [--lr X] [--seed N] [--save-every N] [--no-resume]

Data: JSONL, one object per line, either ``{"input_ids": [...]}`` (a full sequence, every position
trained) or ``{"prompt_ids": [...], "completion_ids": [...]}`` (only predictions of completion tokens
trained); other keys are ignored, blank lines skipped.  The draft vocabulary is the most frequent tokens
of the completions (of the whole sequence for ``input_ids`` records).  With a head and trainer state
already in --out, training resumes from them unless --no-resume.

Training defaults live in ``marsrl.drafter.config.OFFLINE`` (``train_offline``'s own defaults, there
so the parser reads them without importing torch); flags left out use them.  Leaves out: tokenising
text (give token ids made with the target's tokenizer and chat template) and generating the data.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

_PROG = "marsrl draft train"


class DataError(ValueError):
    """A bad data file or record; the message names the file and line."""


@dataclass
class DraftData:
    """Training sequences read from JSONL (parallel lists, one entry per record)."""

    sequences: list[list[int]] = field(default_factory=list)  # prompt + completion token ids
    prompt_lens: list[int] = field(default_factory=list)  # 0 for input_ids records
    responses: list[list[int]] = field(default_factory=list)  # what the draft vocabulary is counted on


def read_jsonl(path: str | Path, vocab_size: int | None = None) -> DraftData:
    """Read and check a JSONL data file; ``DataError`` names ``path:line`` for the first bad record."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such data file")
    data = DraftData()
    with path.open() as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise DataError(f"{where}: not valid JSON ({err.msg})") from err
            prompt, completion = _parse_record(record, where, vocab_size)
            data.sequences.append(prompt + completion)
            data.prompt_lens.append(len(prompt))
            data.responses.append(completion)
    if not data.sequences:
        raise DataError(f"{path}: no records")
    return data


def _parse_record(record, where: str, vocab_size: int | None) -> tuple[list[int], list[int]]:
    """(prompt ids, completion ids); an ``input_ids`` record is all completion."""
    if not isinstance(record, dict):
        raise DataError(f"{where}: expected a JSON object, got {type(record).__name__}")
    has_full = "input_ids" in record
    has_split = "prompt_ids" in record or "completion_ids" in record
    if has_full and has_split:
        raise DataError(f"{where}: give either input_ids or prompt_ids + completion_ids, not both")
    if has_full:
        ids = _ids(record["input_ids"], "input_ids", where, vocab_size)
        if len(ids) < 2:
            raise DataError(f"{where}: input_ids has {len(ids)} token(s); at least 2 are needed")
        return [], ids
    missing = [k for k in ("prompt_ids", "completion_ids") if k not in record]
    if missing == ["prompt_ids", "completion_ids"]:
        raise DataError(f"{where}: no input_ids and no prompt_ids + completion_ids")
    if missing:
        raise DataError(f"{where}: {missing[0]} is missing (prompt_ids and completion_ids go together)")
    prompt = _ids(record["prompt_ids"], "prompt_ids", where, vocab_size)
    completion = _ids(record["completion_ids"], "completion_ids", where, vocab_size)
    if not completion:
        raise DataError(f"{where}: completion_ids is empty")
    if len(prompt) + len(completion) < 2:
        raise DataError(f"{where}: prompt + completion has 1 token; at least 2 are needed")
    return prompt, completion


def _ids(value, key: str, where: str, vocab_size: int | None) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        raise DataError(f"{where}: {key} must be a list of integer token ids")
    if vocab_size is not None:
        bad = [t for t in value if not 0 <= t < vocab_size]
        if bad:
            raise DataError(
                f"{where}: {key} has ids outside the target vocabulary [0, {vocab_size}): {bad[:5]}"
            )
    return value


def add_draft_parser(subparsers) -> argparse.ArgumentParser:
    """Register ``draft`` (with its ``train`` command) on an argparse subparsers object."""
    from .config import DEFAULT_DRAFT_VOCAB, OFFLINE

    draft = subparsers.add_parser(
        "draft",
        help="train EAGLE-3 draft heads",
        description="EAGLE-3 draft heads: offline training on target-generated data.",
    )
    sub = draft.add_subparsers(dest="draft_command", required=True, metavar="DRAFT_COMMAND")
    train = sub.add_parser(
        "train",
        help="train a head offline on sequences the target generated (JSONL token ids)",
        description="Train an EAGLE-3 head with the training-time test on JSONL records "
        '{"input_ids": [...]} or {"prompt_ids": [...], "completion_ids": [...]}, saving the head '
        "(vLLM/SGLang layout) and trainer_state.pt to --out; resumes from --out unless --no-resume.",
    )
    train.add_argument("--target", required=True, help="folder of the Hugging Face target model")
    train.add_argument("--data", required=True, help="JSONL file of token-id records")
    train.add_argument("--out", required=True, help="folder for the head and its trainer state")
    train.add_argument(
        "--draft-vocab",
        type=int,
        help=f"draft vocabulary size (default: min({DEFAULT_DRAFT_VOCAB}, the target's vocabulary))",
    )
    for flag, kind, key, what in (
        ("--epochs", int, "epochs", "passes over the data"),
        ("--batch-size", int, "batch_size", "sequences per step"),
        ("--max-len", int, "max_len", "tokens kept per sequence"),
        ("--lr", float, "lr", "AdamW learning rate"),
        ("--seed", int, "seed", "head init and data order"),
        ("--save-every", int, "save_every", "steps between checkpoints"),
    ):
        train.add_argument(flag, type=kind, dest=key, help=f"{what} (default {getattr(OFFLINE, key)})")
    train.add_argument("--device", help="where to train (default: cuda when available, else cpu)")
    train.add_argument(
        "--dtype",
        choices=["auto", "float32", "bfloat16", "float16"],
        default="auto",
        help="dtype of the target (default: the checkpoint's); the head always trains in float32",
    )
    train.add_argument("--no-resume", dest="resume", action="store_false", help="start over in --out")
    train.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    train.set_defaults(func=run_train)
    return draft


def run_train(args: argparse.Namespace) -> int:
    """Handler of ``draft train``: 0 on success, 2 (message on stderr) for bad data or a bad resume."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from .checkpoint import CONFIG_FILE
    from .config import DEFAULT_DRAFT_VOCAB, OFFLINE
    from .eagle3 import Eagle3Drafter
    from .train import ResumeError, select_draft_vocab, train_offline

    try:
        vocab = AutoConfig.from_pretrained(args.target).get_text_config().vocab_size
        data = read_jsonl(args.data, vocab)
        device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
        dtype = args.dtype if args.dtype == "auto" else getattr(torch, args.dtype)
        target = AutoModelForCausalLM.from_pretrained(args.target, dtype=dtype).to(device).eval()
        target.requires_grad_(False)
        out = Path(args.out)
        torch.manual_seed(OFFLINE.seed if args.seed is None else args.seed)  # the head's init
        if args.resume and (out / CONFIG_FILE).is_file():
            head = Eagle3Drafter.from_pretrained(out, target=target, dtype=torch.float32)
            if args.draft_vocab is not None and args.draft_vocab != head.config.draft_vocab_size:
                raise ResumeError(
                    f"{out} holds a head with draft_vocab_size {head.config.draft_vocab_size}, not "
                    f"--draft-vocab {args.draft_vocab}; drop the flag to resume, or pass --no-resume"
                )
        else:
            size = args.draft_vocab or min(DEFAULT_DRAFT_VOCAB, vocab)
            token_ids = select_draft_vocab(data.responses, size, vocab)
            head = Eagle3Drafter.from_target(target, token_ids=token_ids, dtype=torch.float32)
        overrides = {
            k: getattr(args, k)
            for k in ("epochs", "batch_size", "max_len", "lr", "seed", "save_every")
            if getattr(args, k) is not None
        }
        summary = train_offline(
            target,
            head,
            data.sequences,
            prompt_lens=data.prompt_lens,
            out_dir=out,
            resume=args.resume,
            progress=args.progress,
            **overrides,
        )
    except (DataError, ResumeError, FileNotFoundError, OSError) as err:
        print(f"{_PROG}: error: {err}", file=sys.stderr)
        return 2
    if summary["last_loss"] is None:
        print(f"{_PROG}: nothing to train; head in {out}")
    else:
        print(
            f"{_PROG}: {summary['steps']} steps (from {summary['start_step']}), loss "
            f"{summary['first_loss']:.4f} -> {summary['last_loss']:.4f} (min {summary['min_loss']:.4f}); "
            f"head in {out}"
        )
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m marsrl.drafter.cli draft train ...`` (the same command ``marsrl`` registers)."""
    parser = argparse.ArgumentParser(prog="marsrl")
    add_draft_parser(parser.add_subparsers(dest="command", required=True, metavar="COMMAND"))
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
