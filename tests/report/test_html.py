"""completions.html: every shown token is one span whose hover text carries its provenance and both
log-probs; relaxed tokens are the highlighted ones; sample text is escaped."""

from html.parser import HTMLParser

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
