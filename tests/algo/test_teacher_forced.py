"""marsrl.metrics.teacher_forced (now token_stats over one forward) against the code it replaced, on
tiny random models: the hidden-state path (Qwen3, Llama) and the logits path."""

from types import SimpleNamespace

import pytest
import torch

from marsrl import metrics
from marsrl.testing import tiny_causal_lm
from tests.algo import legacy


def _trajectories(seed, vocab, n=5):
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        p, k = (int(x) for x in torch.randint(1, 9, (2,), generator=gen))
        ids = torch.randint(0, vocab, (p + k,), generator=gen).tolist()
        out.append(SimpleNamespace(prompt_ids=ids[:p], completion_ids=ids[p:]))
    return out


@pytest.mark.parametrize("family", ["qwen3", "llama"])
@pytest.mark.parametrize("logits_path", [False, True])
def test_teacher_forced_equals_the_code_it_replaced(family, logits_path, monkeypatch):
    if logits_path:
        monkeypatch.setattr(metrics, "_PLAIN_HEAD", frozenset())
    model = tiny_causal_lm(family, vocab=48, hidden=16, layers=2, heads=2, kv_heads=1, seed=1)
    trajs = _trajectories(0, 48)
    for temperature in (1.0, 0.7):
        new = metrics.teacher_forced(model, trajs, temperature, batch_size=3)
        old = legacy.teacher_forced(model, trajs, temperature, batch_size=3)
        assert len(new) == len(old)
        for a, b, t in zip(new, old, trajs, strict=True):
            assert set(a) == set(b)
            for k in b:
                assert a[k].shape == (len(t.completion_ids),) and a[k].dtype == b[k].dtype, k
                torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-6, msg=k)


def test_teacher_forcing_carries_gradients_and_rejects_empty_prompts():
    model = tiny_causal_lm(vocab=32, hidden=16, layers=1, heads=2, kv_heads=1)
    trajs = _trajectories(1, 32, n=3)
    stats, mask = metrics.teacher_forcing(model, trajs)
    assert mask.sum() == sum(len(t.completion_ids) for t in trajs)
    stats["logp"].sum().backward()
    assert model.lm_head.weight.grad is not None and model.lm_head.weight.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="non-empty prompt"):
        metrics.teacher_forcing(model, [SimpleNamespace(prompt_ids=[], completion_ids=[1])])
