"""The side-by-side text table of the ``marsrl`` commands: one column per run or rule, one line per figure."""

from __future__ import annotations

BIAS_ROWS = [
    ("relaxed fraction", "relaxed_frac", "{:.3%}"),
    ("top-1 rate", "top1_rate", "{:.3%}"),
    ("top-1 rate, exact sampling", "top1_rate_expected", "{:.3%}"),
    ("top-2 rate", "top2_rate", "{:.3%}"),
    ("top-2 rate, exact sampling", "top2_rate_expected", "{:.3%}"),
    ("top-2 excess (bias)", "top2_excess", "{:+.3%}"),
    ("IS ratio p/b mean", "is_ratio_mean", "{:.4f}"),
]
"""The rows of the bias family (``marsrl.algo.bias_metrics``) that every command's table shows."""


def side_by_side(columns: dict[str, dict], rows: list[tuple[str, str, str]]) -> str:
    """A text table: one column per name of ``columns`` (each a dict of figures), one line per
    (label, key, format) row; a missing figure prints as n/a, a row missing everywhere is left out."""
    names = list(columns)
    width = max(len(label) for label, _, _ in rows) + 2
    lines = ["".ljust(width) + "".join(n.rjust(12) for n in names)]
    for label, key, fmt in rows:
        vals = [columns[n].get(key) for n in names]
        if all(v is None for v in vals):
            continue
        cells = "".join((fmt.format(v) if v is not None else "n/a").rjust(12) for v in vals)
        lines.append(label.ljust(width) + cells)
    return "\n".join(lines)
