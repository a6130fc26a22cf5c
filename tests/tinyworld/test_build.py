"""The micro tiny world builds in tests, loads through the public loaders, and is cached."""

import json
import time
from dataclasses import replace

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from marsrl.drafter import Eagle3Drafter
from marsrl.engine import EngineConfig, SamplingParams, SpeculativeEngine
from marsrl.tinyworld import PRESETS, build_tinyworld, load_tinyworld, world_dir
from marsrl.tinyworld.sft import SFTConfig
from marsrl.tinyworld.tokenizer import chat_prompt_ids


@pytest.fixture(scope="module")
def micro():
    return build_tinyworld("micro", progress=False)  # into $MARSRL_CACHE (a temp folder, tests/conftest.py)


def test_micro_builds_and_loads(micro):
    path = micro
    assert path == world_dir(PRESETS["micro"])
    meta = json.loads((path / "metadata.json").read_text())
    assert meta["fingerprint"] == PRESETS["micro"].fingerprint()
    assert set(meta["measured_at_build"]) == {"strict", "mars"}
    assert meta["sft"]["loss_last10pct"] < meta["sft"]["loss_first"]
    # the public loaders read it back
    target = AutoModelForCausalLM.from_pretrained(path / "target")
    tok = AutoTokenizer.from_pretrained(path / "target")
    head = Eagle3Drafter.from_pretrained(path / "draft", target=target)
    assert head.config.vocab_size == target.config.vocab_size == len(tok)
    assert len(set(head.config.aux_layer_ids)) == 3
    assert tok.eos_token == "<|im_end|>" and "<|im_start|>assistant" in tok.decode(chat_prompt_ids(tok, "hi"))
    t2, tok2, h2, meta2 = load_tinyworld(path)
    assert meta2 == meta
    eng = SpeculativeEngine(t2, h2, EngineConfig(rule="mars", num_draft_tokens=4))
    out = eng.generate(
        [chat_prompt_ids(tok2, "Tom has 3 apples. How many apples?")], SamplingParams(max_new_tokens=8)
    )
    assert len(out[0].completion_ids) >= 1


def test_cached_build_is_reused(micro):
    path = micro
    start = time.perf_counter()
    assert build_tinyworld("micro", progress=False) == path
    assert time.perf_counter() - start < 5


def test_rebuild_is_deterministic(tmp_path):
    """Same config and seed -> the same target and head weights: a shortened micro world (every build
    stage, a tenth of the steps and data) built twice into two folders."""
    cfg = replace(
        PRESETS["micro"],
        name="micro-short",
        n_train=100,
        sft=SFTConfig(steps=8, batch_size=8, lr=3e-3, warmup=2),
        n_draft_prompts=8,
        draft_epochs=1,
        max_new_tokens=24,
    )
    path = build_tinyworld(cfg, tmp_path / "first", progress=False)
    again = build_tinyworld(cfg, tmp_path / "again", progress=False)
    ta = AutoModelForCausalLM.from_pretrained(path / "target")
    tb = AutoModelForCausalLM.from_pretrained(again / "target")
    a, b = ta.state_dict(), tb.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    ha = Eagle3Drafter.from_pretrained(path / "draft", target=ta).state_dict()
    hb = Eagle3Drafter.from_pretrained(again / "draft", target=tb).state_dict()
    assert all(torch.equal(ha[k], hb[k]) for k in ha)
    meta_a, meta_b = (json.loads((p / "metadata.json").read_text()) for p in (path, again))
    assert meta_a["fingerprint"] == meta_b["fingerprint"] == cfg.fingerprint()
    assert meta_a["sft"] == meta_b["sft"]  # the same loss curve figures


def test_concurrent_builders_build_once(tmp_path, monkeypatch):
    """Two builders of one folder at once (two test workers, two ranks): the second waits on the
    folder's lock and reuses the first's world instead of building into the same ``.partial``."""
    import threading

    from marsrl.tinyworld import build as build_mod

    cfg = PRESETS["micro"]
    calls, inside = [], []

    def fake_build(cfg, final, progress):  # the real one takes ~40 s; this records overlap
        inside.append(1)
        calls.append(len(inside))  # how many builders were inside at once
        time.sleep(0.5)
        final.mkdir(parents=True)
        (final / "metadata.json").write_text(json.dumps({"fingerprint": cfg.fingerprint()}))
        inside.pop()
        return final

    monkeypatch.setattr(build_mod, "_build", fake_build)
    out = tmp_path / "world"
    got = []
    build = lambda: got.append(build_tinyworld(cfg, out, progress=False))  # noqa: E731
    threads = [threading.Thread(target=build) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert calls == [1] and got == [out, out]


def test_cli_builds_with_torchs_threads_unless_told(monkeypatch, tmp_path, capsys):
    """``marsrl tinyworld build`` has the machine to itself: torch's thread count by default, ``--threads``
    when given, and a bad count is one line, not a build."""
    import marsrl.tinyworld.build as build_mod
    from marsrl.cli import main

    calls = []

    def fake_build(preset, out=None, **kw):
        calls.append(kw["threads"])
        (tmp_path / "metadata.json").write_text(
            json.dumps(dict(target_params=1, measured_at_build={}, timings_s={}))
        )
        return tmp_path

    monkeypatch.setattr(build_mod, "build_tinyworld", fake_build)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    assert main(["tinyworld", "build", "--preset", "micro", "--no-progress"]) == 0
    assert main(["tinyworld", "build", "--preset", "micro", "--no-progress", "--threads", "1"]) == 0
    assert calls == [2, 1]
    assert main(["tinyworld", "build", "--threads", "0"]) == 2 and calls == [2, 1]
    assert "--threads must be >= 1" in capsys.readouterr().out
