"""GSM8K-format problems: loading them through ``datasets`` and reading the numeric answer out of text.

A GSM8K row has a ``question`` and an ``answer`` whose last line is ``#### <number>``; the steps above
it carry calculator annotations ``<<expr=value>>``.  ``load_gsm8k`` reads such rows from a local
JSONL / JSON / parquet file or from the Hugging Face hub and adds ``gold``, the canonical numeric
answer.  ``extract_answer`` is the strict reader (the number after the last ``####``);
``extract_last_number`` is a lenient one for text that never wrote ``####``.

Numbers are compared as canonical strings (``canonical_number``): commas, a ``$`` and a trailing ``.``
are dropped and the value is written without trailing zeros, so "1,000", "1000.0" and "$1000." all
read "1000".  Left out on purpose: fractions ("3/4"), number words ("twelve"), units and LaTeX
(``\\boxed{}``) -- GSM8K's gold answers use none of them.  ``datasets`` is imported only by
``load_gsm8k``, so the readers and rewards stay cheap to import.
"""

from __future__ import annotations

import json
import re
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import datasets

REQUIRED_COLUMNS: tuple[str, ...] = ("question", "answer")

_LOCAL_BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}

# A number as written in GSM8K text: a sign and "$" attached to it ("-3", "$5", "-$5"), digits with
# optional thousands commas ("1,450,000") and an optional decimal part.  "10 - 5" holds 10 and 5 (a
# detached minus is subtraction), "16-3" holds 16 and 3; a comma not followed by three digits ends it.
_NUMBER = re.compile(r"(?<![\w.])(-)?\$?(-)?(\d{1,3}(?:,\d{3})+|\d+)(\.\d+)?(?!\d)")


def canonical_number(text: str) -> str | None:
    """``text`` as a canonical number string ("1,000" / "1000.0" / "$1000." -> "1000"), or None.

    The whole of ``text`` (stripped) must be one number; see ``extract_last_number`` to find one
    inside a sentence.
    """
    s = text.strip().rstrip(".").replace(",", "").replace("$", "").replace(" ", "")
    if not re.fullmatch(r"-?(\d+(\.\d*)?|\.\d+)", s):
        return None
    return _canonical(s)


def _canonical(s: str) -> str | None:
    try:
        d = Decimal(s)
    except InvalidOperation:
        return None
    if d == 0:
        return "0"  # also "-0" and "0.00"
    if d == d.to_integral_value():
        return str(int(d))
    return format(d.normalize(), "f")


def _match_value(m: re.Match) -> str | None:
    negative = bool(m.group(1) or m.group(2))
    digits = m.group(3).replace(",", "") + (m.group(4) or "")
    return _canonical(("-" if negative else "") + digits)


def extract_answer(text: str) -> str | None:
    """The canonical number after the LAST ``####`` in ``text``; None without ``####`` or a number.

    The number must be the first thing after ``####`` on that line (spaces and a ``$`` may come first;
    words after it are ignored): "#### 1,234" -> "1234", "#### $12.50." -> "12.5", "#### -3" -> "-3",
    "#### none" -> None.
    """
    if not isinstance(text, str) or "####" not in text:
        return None
    tail = text.rsplit("####", 1)[1].lstrip(" \t")
    m = _NUMBER.match(tail.split("\n", 1)[0])
    return _match_value(m) if m else None


def extract_last_number(text: str) -> str | None:
    """The canonical form of the last number anywhere in ``text`` (lenient: no ``####`` needed)."""
    if not isinstance(text, str):
        return None
    last = None
    for m in _NUMBER.finditer(text):
        last = m
    return _match_value(last) if last else None


def _local_file(source: str) -> Path | None:
    """The path when ``source`` names a local data file; None for a hub name.

    A name ending in .jsonl / .json / .parquet is taken as a file even when it does not exist, so a
    mistyped path fails at once instead of after the hub's retries.
    """
    path = Path(source).expanduser()
    if path.suffix.lower() in _LOCAL_BUILDERS:
        if not path.is_file():
            raise ValueError(f"source {source!r}: no such file (a local GSM8K file must exist)")
        return path
    if path.exists():
        raise ValueError(f"source {source!r}: expected a .jsonl, .json or .parquet file")
    return None


def check_jsonl(path: Path) -> None:
    """ValueError naming ``path`` and the line number of the first row that is not a JSON object with a
    ``question`` and an ``answer`` holding ``#### <number>``; also for a file with no rows."""
    rows = 0
    with open(path, encoding="utf-8", errors="strict") as f:
        try:
            lines = list(enumerate(f, start=1))
        except UnicodeDecodeError as err:
            raise ValueError(f"file {str(path)!r} is not UTF-8 text ({err.reason})") from err
    for number, line in lines:
        if not line.strip():
            continue
        where = f"file {str(path)!r}, line {number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{where}: not valid JSON ({err.msg})") from err
        if not isinstance(row, dict):
            raise ValueError(f"{where}: expected a JSON object with 'question' and 'answer'")
        for column in REQUIRED_COLUMNS:
            if not isinstance(row.get(column), str):
                raise ValueError(f"{where}: missing the text field {column!r}")
        if extract_answer(row["answer"]) is None:
            raise ValueError(f"{where}: field 'answer' has no '#### <number>'")
        rows += 1
    if rows == 0:
        raise ValueError(f"file {str(path)!r} has no rows")


def _with_gold(ds: datasets.Dataset, where: str) -> datasets.Dataset:
    missing = [c for c in REQUIRED_COLUMNS if c not in ds.column_names]
    if missing:
        raise ValueError(f"{where}: missing column {missing[0]!r} (has {ds.column_names})")
    ds = ds.select_columns(list(REQUIRED_COLUMNS))
    golds = [extract_answer(a) for a in ds["answer"]]
    bad = [i for i, g in enumerate(golds) if g is None]
    if bad:
        raise ValueError(
            f"{where}: row {bad[0]} ({len(bad)} rows in all) has no '#### <number>' in column 'answer'"
        )
    return ds.add_column("gold", golds)


def load_gsm8k(source: str, split: str = "test", config: str | None = "main") -> datasets.Dataset:
    """GSM8K-format rows with columns ``question``, ``answer`` and ``gold`` (canonical answer string).

    ``source`` is a local ``.jsonl`` / ``.json`` / ``.parquet`` file (one row per problem; ``split`` and
    ``config`` are then ignored and every row is returned) or a hub name such as ``"openai/gsm8k"``
    (``config`` "main", ``split`` "train" / "test").  Other columns are dropped.  Raises ValueError
    naming the source when the file is missing, the hub cannot be reached (pass a local file instead),
    a column is missing or an answer has no ``#### <number>``.
    """
    import datasets  # lazily: ~1 s, and only loading needs it

    path = _local_file(source)
    if path is not None:
        builder = _LOCAL_BUILDERS[path.suffix.lower()]
        if path.suffix.lower() == ".jsonl":
            check_jsonl(path)  # a bad row is named by its line number before datasets reads the file
        elif path.stat().st_size == 0:
            raise ValueError(f"file {str(path)!r} is empty")
        try:
            ds = datasets.load_dataset(builder, data_files=str(path), split="train")
        except Exception as err:  # datasets' readers raise many types (StopIteration, ArrowInvalid, ...)
            first = (str(err).strip().splitlines() or [type(err).__name__])[0]
            raise ValueError(f"file {str(path)!r}: could not read it as {builder}: {first}") from err
        if len(ds) == 0:
            raise ValueError(f"file {str(path)!r} has no rows")
        return _with_gold(ds, f"file {str(path)!r}")
    try:
        ds = datasets.load_dataset(source, config, split=split)
    except OSError as err:  # ConnectionError offline; DatasetNotFoundError (a FileNotFoundError) online
        raise ValueError(
            f"source {source!r}: could not load it from the Hugging Face hub ({err}); "
            "without network access pass a local .jsonl / .json / .parquet file instead"
        ) from err
    return _with_gold(ds, f"hub dataset {source!r} (config {config!r}, split {split!r})")
