"""``completions.html``: sample completions of every arm as a person reads them.  Each token is a span
of its decoded text (the recorder's ``tokens``: joined they are the completion, spaces and newlines
included), relaxed tokens highlighted, each token's provenance, target log-prob and behaviour log-prob in
its hover text (``title``).  A token that shows no text of its own (the first bytes of a character split
over several tokens) shares the span of the token after it, whose hover text lists both; a trailing one
(a special token such as EOS) is a grey mark.  Lines wrap (long tokens too), so the page never scrolls
sideways.  Beside each sample's reward: its gold answer and the answer parsed from the completion.  A
checkbox (CSS only, no script) shows relaxed tokens only: samples without one are hidden, other tokens
greyed.

All text from the samples is HTML-escaped.  PAD positions (provenance 0) are not shown.  A sample without
a ``tokens`` list shows its completion text unhighlighted.
"""

from __future__ import annotations

import html

from ..verify.types import Provenance
from .base import finite
from .load import Arm

PROVENANCE_NAMES: dict[int, str] = {int(p): p.name.lower() for p in Provenance}

_CSS = """
* { box-sizing: border-box; }
body { font-family: system-ui, sans-serif; margin: 0 auto; padding: 1em 2em; max-width: 70em;
       overflow-wrap: anywhere; }
h2 { border-bottom: 1px solid #ccc; }
.sample { margin: 1em 0; padding: 0.6em 0.8em; border: 1px solid #ddd; border-radius: 4px; }
.meta { color: #555; font-size: 0.9em; }
.ok { color: #1a7f37; } .wrong { color: #b42318; }
.prompt { white-space: pre-wrap; overflow-wrap: anywhere; color: #333; background: #f6f6f6;
          padding: 0.3em; max-height: 8em; overflow-y: auto; }
.completion { white-space: pre-wrap; overflow-wrap: anywhere; font-family: ui-monospace, monospace;
              line-height: 1.6; }
.tok:hover { outline: 1px solid #888; }
.p-relaxed { background: #ffb347; }
.p-resampled { text-decoration: underline dotted #1f77b4; }
.p-bonus { background: #d6ecff; }
.p-unknown { background: #eee; }
.special { color: #999; font-size: 0.8em; }
#only-relaxed:checked ~ main .sample:not(.has-relaxed) { display: none; }
#only-relaxed:checked ~ main .tok:not(.p-relaxed) { color: #bbb; background: none; text-decoration: none; }
"""

_INLINE = {  # the same highlighting for a standalone fragment (a wandb.Html cell has no stylesheet)
    "relaxed": "background:#ffb347",
    "resampled": "text-decoration:underline dotted #1f77b4",
    "bonus": "background:#d6ecff",
}


def select_samples(samples: list[dict], n: int) -> list[dict]:
    """At most ``n`` samples, evenly spread over the file (first and last included), in file order."""
    if n <= 0:
        return []
    if len(samples) <= n:
        return list(samples)
    if n == 1:
        return [samples[-1]]
    return [samples[round(i * (len(samples) - 1) / (n - 1))] for i in range(n)]


def _lp(value) -> str:
    return f"{value:.4f}" if finite(value) else "n/a"


def _at(seq, i):
    return seq[i] if seq is not None and i < len(seq) else None


def _pieces(sample: dict) -> list[tuple[str, list[int]]]:
    """(text shown, positions of the tokens behind it): a token with no text joins the next one; PAD
    positions are left out; trailing tokens with no text form a last piece with text ""."""
    tokens, prov = sample.get("tokens") or [], sample.get("provenance") or []
    out, waiting = [], []
    for i, tok in enumerate(tokens):
        if _at(prov, i) == int(Provenance.PAD):
            continue
        waiting.append(i)
        if str(tok):
            out.append((str(tok), waiting))
            waiting = []
    if waiting:
        out.append(("", waiting))
    return out


_RANK = ("relaxed", "resampled", "bonus", "unknown", "accepted")  # the class a shared span takes


def sample_html(sample: dict, standalone: bool = False) -> str:
    """The completion of one sample as token spans (``standalone``: inline styles instead of classes)."""
    if not sample.get("tokens"):
        return f'<span class="tok">{html.escape(str(sample.get("completion", "")))}</span>'
    prov = sample.get("provenance") or []
    target, behavior = sample.get("target_logprobs"), sample.get("behavior_logprobs")
    spans = []
    for text, where in _pieces(sample):
        names, lines = [], []
        for i in where:
            code = _at(prov, i)
            name = PROVENANCE_NAMES.get(code, "unknown") if code is not None else "unknown"
            names.append(name)
            line = f"{name} · target log p {_lp(_at(target, i))} · behaviour log p {_lp(_at(behavior, i))}"
            if len(where) > 1 or not text:
                line = f"token {i}: {line}"
            lines.append(line)
        name = min(names, key=_RANK.index)
        title = "\n".join(lines) + ("" if text else "\n(no text: a special token)")
        shown = html.escape(text) if text else "∎"
        extra = "" if text else " special"
        if standalone:
            style = _INLINE.get(name)
            attr = f' style="{style}"' if style else ""
        else:
            attr = f' class="tok p-{name}{extra}"'
        spans.append(f'<span{attr} title="{html.escape(title)}">{shown}</span>')
    return "".join(spans)


def _answer_html(sample: dict) -> str:
    """ " · gold X · parsed Y" with the parsed answer marked right or wrong; "" without a gold answer."""
    gold, parsed = sample.get("gold"), sample.get("answer")
    if gold is None and parsed is None:
        return ""
    esc = html.escape
    mark = "ok" if parsed is not None and str(parsed) == str(gold) else "wrong"
    parsed_text = "none" if parsed is None else esc(str(parsed))
    return f' · gold {esc(str(gold))} · parsed <span class="{mark}">{parsed_text}</span>'


def _relaxed_share(samples: list[dict]) -> float | None:
    prov = [p for s in samples for p in (s.get("provenance") or []) if p != int(Provenance.PAD)]
    return sum(p == int(Provenance.RELAXED) for p in prov) / len(prov) if prov else None


def completions_html(experiment: str, arms: list[Arm], per_arm: int = 20) -> str:
    """The whole page: a legend, then per arm up to ``per_arm`` samples (``select_samples``)."""
    esc = html.escape
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{esc(experiment)}: sample completions</title><style>{_CSS}</style></head><body>",
        f"<h1>{esc(experiment)}: sample completions</h1>",
        '<p class="meta">Hover a token for its provenance and log-probs. '
        '<span class="p-relaxed">relaxed</span> (kept only by the margin rule) · '
        '<span class="p-resampled">resampled</span> · <span class="p-bonus">bonus</span> · '
        'accepted tokens are plain · <span class="special">∎</span> a token with no text (EOS).</p>',
        '<input type="checkbox" id="only-relaxed"> '
        '<label for="only-relaxed">show relaxed tokens only</label>',
        "<main>",
    ]
    for arm in arms:
        shown = select_samples(arm.samples, per_arm)
        share = _relaxed_share(arm.samples)
        rule = f" (rule {esc(str(arm.rule))})" if arm.rule else ""
        parts.append(f'<h2 id="arm-{esc(arm.name)}">{esc(arm.name)}{rule}</h2>')
        summary = f"{len(shown)} of {len(arm.samples)} samples"
        if share is not None:
            summary += f"; relaxed tokens {100 * share:.2f}% of all sample tokens"
        parts.append(f'<p class="meta">{summary}</p>')
        for s in shown:
            reward = s.get("reward")
            reward_text = f"{reward:.4g}" if finite(reward) else "n/a"
            prov = [p for p in (s.get("provenance") or []) if p != int(Provenance.PAD)]
            relaxed = sum(p == int(Provenance.RELAXED) for p in prov)
            has = " has-relaxed" if relaxed else ""
            parts.append(
                f'<div class="sample{has}">'
                f'<div class="meta">step {esc(str(s.get("step", "n/a")))} · reward {reward_text}'
                f"{_answer_html(s)} · {len(prov)} tokens, {relaxed} relaxed</div>"
                f'<div class="prompt">{esc(str(s.get("prompt", "")))}</div>'
                f'<div class="completion">{sample_html(s)}</div></div>'
            )
    parts.append("</main></body></html>")
    return "\n".join(parts)
