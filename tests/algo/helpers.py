"""Random [N, T] batches with right padding for the marsrl.algo tests, and TRL 1.16's own code for
the parts marsrl.algo mirrors, read out of the installed sources and executed as the reference."""

import importlib.util
import textwrap
from pathlib import Path

import torch


def padded_mask(n: int, t: int, gen: torch.Generator) -> torch.Tensor:
    """[n, t] bool, right-padded: random lengths in [0, t] (row 0 full, row 1 empty when n > 2)."""
    lengths = torch.randint(0, t + 1, (n,), generator=gen)
    lengths[0] = t
    if n > 2:
        lengths[1] = 0
    return torch.arange(t)[None, :] < lengths[:, None]


def trl_source(relpath: str, start: str, end: str) -> str:
    """The lines of ``trl/<relpath>`` from the one holding ``start`` up to (not including) the one
    holding ``end``, dedented: TRL's code, run as the reference by the tests."""
    import trl

    path = Path(importlib.util.find_spec("trl").origin).parent / relpath
    text = path.read_text()
    a = text.find(start)
    b = text.find(end, a + 1)
    assert a >= 0 and b > a, (
        f"trl {trl.__version__}: {start!r} .. {end!r} not found in {path}; TRL moved the code that "
        "marsrl.algo mirrors -- reread it and update these markers (and marsrl.algo if it changed)"
    )
    return textwrap.dedent(text[text.rindex("\n", 0, a) + 1 : text.rindex("\n", 0, b) + 1])


def trl_nanstd():
    """``trl.trainer.utils.nanstd``, executed from its source (importing trl.trainer costs seconds)."""
    namespace = {"torch": torch}
    exec(trl_source("trainer/utils.py", "def nanstd(", "\ndef "), namespace)
    return namespace["nanstd"]
