"""Bad input fails with a ValueError that names the argument at fault."""

import re

import pytest
import torch

from marsrl.verify import verify_chain, verify_tree

B, K, V = 2, 3, 10


def _ok():
    g = torch.Generator().manual_seed(0)
    return torch.randn(B, K + 1, V, generator=g), torch.randint(0, V, (B, K), generator=g)


def _with(**changes):
    logits, tokens = _ok()
    args = dict(target_logits=logits, draft_tokens=tokens, draft_probs=None)
    args.update(changes)
    return args


def _nan_logits():
    z, _ = _ok()
    z[1, 2, 3] = float("nan")
    return z


def _inf_logits():
    z, _ = _ok()
    z[0, 0, 0] = float("inf")
    return z


CHAIN_CASES = [
    ("mismatched K", _with(draft_tokens=torch.zeros(B, K + 1, dtype=torch.long)), {}, "target_logits"),
    ("mismatched B", _with(draft_tokens=torch.zeros(B + 1, K, dtype=torch.long)), {}, "target_logits"),
    (
        "K = 0",
        _with(target_logits=torch.randn(B, 1, V), draft_tokens=torch.zeros(B, 0, dtype=torch.long)),
        {},
        "K = 0",
    ),
    ("2-D logits", _with(target_logits=torch.randn(B, V)), {}, "target_logits"),
    ("float tokens", _with(draft_tokens=torch.zeros(B, K)), {}, "draft_tokens"),
    ("token out of range", _with(draft_tokens=torch.full((B, K), V)), {}, "draft_tokens"),
    ("negative token", _with(draft_tokens=torch.full((B, K), -1)), {}, "draft_tokens"),
    ("negative temperature", _with(), {"temperature": -0.5}, "temperature"),
    ("NaN temperature", _with(), {"temperature": float("nan")}, "temperature"),
    ("negative theta", _with(), {"theta": -0.1}, "theta"),
    ("NaN theta", _with(), {"theta": float("nan")}, "theta"),
    ("unknown rule", _with(), {"rule": "lenient"}, "rule"),
    ("bad top_k", _with(), {"top_k": 0}, "top_k"),
    ("bad top_p", _with(), {"top_p": 1.5}, "top_p"),
    ("NaN logits", _with(target_logits=_nan_logits()), {}, "NaN"),
    ("+inf logits", _with(target_logits=_inf_logits()), {}, "+inf"),
    ("draft_probs shape", _with(draft_probs=torch.full((B, K, V - 1), 1.0 / (V - 1))), {}, "draft_probs"),
    ("draft_probs not summing to 1", _with(draft_probs=torch.full((B, K, V), 0.2)), {}, "sum to 1"),
    (
        "draft_probs negative",
        _with(
            draft_probs=torch.cat([torch.full((B, K, 1), -0.1), torch.full((B, K, V - 1), 1.1 / (V - 1))], -1)
        ),
        {},
        "negative",
    ),
    ("draft_probs NaN", _with(draft_probs=torch.full((B, K, V), float("nan"))), {}, "draft_probs"),
]


@pytest.mark.parametrize(("name", "args", "kwargs", "needle"), CHAIN_CASES, ids=[c[0] for c in CHAIN_CASES])
def test_chain_rejects_bad_input(name, args, kwargs, needle):
    with pytest.raises(ValueError, match=re.escape(needle)):
        verify_chain(args["target_logits"], args["draft_tokens"], args["draft_probs"], **kwargs)


def _tree(tokens=None, parents=None, logits=None, draft_probs=None, **kw):
    tokens = torch.tensor([[1, 2, 3]]) if tokens is None else tokens
    parents = torch.tensor([[-1, -1, 0]]) if parents is None else parents
    logits = torch.randn(1, 4, V) if logits is None else logits
    return verify_tree(logits, tokens, parents, draft_probs, **kw)


TREE_CASES = [
    ("parent after child", dict(parents=torch.tensor([[-1, 2, 0]])), "parents"),
    (
        "parent is padding",
        dict(tokens=torch.tensor([[-1, 2, 3]]), parents=torch.tensor([[-1, -1, 0]])),
        "parents",
    ),
    ("repeated sibling token", dict(tokens=torch.tensor([[1, 1, 3]])), "repeated"),
    ("token out of range", dict(tokens=torch.tensor([[1, 2, V]])), "tree_tokens"),
    ("logits rows", dict(logits=torch.randn(1, 3, V)), "target_logits"),
    ("parents shape", dict(parents=torch.tensor([[-1, -1]])), "parents"),
    ("draft_probs zero", dict(draft_probs=torch.tensor([[0.5, 0.0, 0.5]])), "draft_probs"),
    ("NaN logits", dict(logits=torch.full((1, 4, V), float("nan"))), "NaN"),
    ("unknown rule", dict(rule="greedy"), "rule"),
]


@pytest.mark.parametrize(("name", "kw", "needle"), TREE_CASES, ids=[c[0] for c in TREE_CASES])
def test_tree_rejects_bad_input(name, kw, needle):
    with pytest.raises(ValueError, match=re.escape(needle)):
        _tree(**kw)
