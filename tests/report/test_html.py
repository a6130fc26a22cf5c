"""completions.html: every shown token is one span whose hover text carries its provenance and both
log-probs; relaxed tokens are the highlighted ones; sample text is escaped."""

import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from marsrl.report.html import select_samples

from .helpers import samples


class Spans(HTMLParser):
    """Collects (class, title, text) of every token span, and every start tag seen."""

    def __init__(self):
        super().__init__()
        self.spans, self.tags, self._open = [], [], None

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        attrs = dict(attrs)
        if tag == "span" and "tok" in (attrs.get("class") or "").split():
            self._open = [attrs["class"], attrs.get("title"), ""]

    def handle_data(self, data):
        if self._open is not None:
            self._open[2] += data

    def handle_endtag(self, tag):
        if tag == "span" and self._open is not None:
            self.spans.append(tuple(self._open))
            self._open = None


def _arm_section(page: str, arm: str) -> str:
    start = page.index(f'<h2 id="arm-{arm}">')
    end = page.find("<h2", start + 1)
    return page[start : end if end > 0 else None]


def test_tokens_provenance_and_logprobs_read_back(built):
    out, _ = built
    page = (out / "report" / "completions.html").read_text()
    for arm in ("strict", "mars", "mars_code"):
        parser = Spans()
        parser.feed(_arm_section(page, arm))
        want = []
        for s in samples(arm):
            for tok, p, t, b in zip(
                s["tokens"], s["provenance"], s["target_logprobs"], s["behavior_logprobs"], strict=True
            ):
                if p == 0:
                    continue  # PAD is not shown
                name = {1: "accepted", 2: "relaxed", 3: "resampled", 4: "bonus"}[p]
                want.append(
                    (f"tok p-{name}", f"{name} · target log p {t:.4f} · behaviour log p {b:.4f}", tok)
                )
        assert parser.spans == want
        assert "script" not in parser.tags  # the prompt's <script> is text, not a tag
        relaxed = sum(c == "tok p-relaxed" for c, _, _ in parser.spans)
        assert relaxed == (0 if arm == "strict" else 3)
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page and ".p-relaxed { background" in page


def test_select_samples_spreads_over_the_file():
    xs = [{"i": i} for i in range(10)]
    assert [s["i"] for s in select_samples(xs, 4)] == [0, 3, 6, 9]
    assert select_samples(xs, 20) == xs and select_samples(xs, 0) == []


# a completion as the recorder stores it: 😀's four byte tokens show "" "" "" "😀", EOS shows ""
SPLIT = {
    "step": 1,
    "prompt": "Q",
    "completion": "I have 😀\n#### 4",
    "tokens": ["I", " have", " ", "", "", "", "😀", "\n", "####", " ", "4", ""],
    "provenance": [1, 2, 1, 1, 1, 1, 3, 1, 1, 4, 1, 1],
    "target_logprobs": [-0.5] * 12,
    "behavior_logprobs": [-0.25] * 12,
    "reward": 1.0,
    "gold": "4",
    "answer": "4",
}


def test_split_character_shown_whole_and_answers_beside_the_reward():
    from marsrl.report.html import completions_html
    from marsrl.report.load import Arm

    arm = Arm("mars", Path("mars"), {"arm": {"rule": "mars"}}, [], samples=[SPLIT, {**SPLIT, "answer": None}])
    page = completions_html("exp", [arm])
    parser = Spans()
    parser.feed(page)
    spans = parser.spans[: len(parser.spans) // 2]
    texts = [t for _, _, t in spans]
    assert texts == ["I", " have", " ", "😀", "\n", "####", " ", "4", "∎"]
    assert "".join(texts[:-1]) == SPLIT["completion"]  # the completion as decoded, nothing added
    cls, title, _ = spans[3]  # the emoji: four tokens, one span, each token on its own hover line
    assert cls == "tok p-resampled" and title.count("\n") == 3 and title.startswith("token 3: accepted")
    assert spans[1][0] == "tok p-relaxed" and spans[-1][0] == "tok p-accepted special"
    assert 'reward 1 · gold 4 · parsed <span class="ok">4</span>' in page
    assert 'gold 4 · parsed <span class="wrong">none</span>' in page
    assert page.count('<div class="sample has-relaxed">') == 2 and 'id="only-relaxed"' in page


CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
_MEASURE = (
    "<script>document.body.setAttribute('data-scroll', document.documentElement.scrollWidth + ' ' + "
    "document.documentElement.clientWidth + ' ' + window.innerWidth)</script></body>"
)


def _chromium(*args, cwd):
    return subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--window-size=800,600",
            *args,
        ],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )


@pytest.mark.skipif(not Path(CHROMIUM).is_file(), reason="no chromium (Debian: apt-get install chromium)")
def test_page_renders_in_chromium_without_sideways_scroll(built, tmp_path):
    """The report's page plus a sample with a 3,000-character token and 400-character lines, in an
    800 px wide headless Chromium: the page is no wider than the window, and its screenshot is not blank."""
    from marsrl.report.html import completions_html
    from marsrl.report.load import load_experiment

    out, _ = built
    exp = load_experiment(out)
    long = {**SPLIT, "tokens": ["x" * 3000, " " + "word " * 80, "\n", "y" * 400], "provenance": [1, 2, 1, 1]}
    exp.arms[0].samples = [*exp.arms[0].samples, long]
    page = completions_html(exp.name, exp.arms)
    (tmp_path / "page.html").write_text(page)
    (tmp_path / "measure.html").write_text(page.replace("</body>", _MEASURE))
    dom = _chromium("--dump-dom", (tmp_path / "measure.html").as_uri(), cwd=tmp_path).stdout
    scroll, client, inner = map(int, re.search(r'data-scroll="(\d+) (\d+) (\d+)"', dom).groups())
    assert inner == 800 and scroll == client == 800
    _chromium(f"--screenshot={tmp_path / 'shot.png'}", (tmp_path / "page.html").as_uri(), cwd=tmp_path)
    import numpy as np
    from PIL import Image

    img = np.asarray(Image.open(tmp_path / "shot.png").convert("L"))
    assert img.shape == (600, 800)
    assert (img < 128).mean() > 0.01  # text drawn, not a blank page
