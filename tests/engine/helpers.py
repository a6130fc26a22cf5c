"""Shared pieces of the engine tests: prompts, HF greedy reference, the V = 8 exact-joint setup."""

import itertools

import torch

from marsrl.engine import SamplingParams

PROMPTS = [[1, 2, 3, 4, 5], [6, 7, 8], [9, 10, 11, 12, 13, 14, 15], [16]]
V, NEW, N = (
    8,
    3,
    60_000,
)  # small-vocabulary case: vocabulary, completion length, sampled completions (seed 21)
PROMPT = [3, 1, 4]


def hf_greedy(target, prompts, n):
    """HF generate's greedy continuation of each prompt (one at a time, so no padding is involved)."""
    out = []
    for p in prompts:
        ids = torch.tensor([p])
        g = target.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=n,
            min_new_tokens=n,
            pad_token_id=0,
        )
        out.append(g[0, len(p) :].tolist())
    return out


def exact_joint(target) -> torch.Tensor:
    """P(y1 y2 y3 | PROMPT) for all V**3 completions, by teacher forcing, index = y1*V*V + y2*V + y3."""
    seqs = torch.tensor([PROMPT + list(c) for c in itertools.product(range(V), repeat=NEW)])
    with torch.no_grad():
        logp = torch.log_softmax(target(seqs).logits[:, len(PROMPT) - 1 : -1].double(), -1)
    return logp.gather(2, seqs[:, len(PROMPT) :, None])[..., 0].sum(1).exp()


def sample_index(engine, max_new_tokens: int = NEW) -> torch.Tensor:
    """N sampled completions of PROMPT (T = 1, seed 21), each encoded as its index in ``exact_joint``
    (``max_new_tokens`` past NEW: the engine's ``max_seq_len`` must end them at NEW)."""
    sp = SamplingParams(temperature=1.0, max_new_tokens=max_new_tokens, n=N, seed=21)
    out = engine.generate([PROMPT], sp)
    comp = torch.tensor([t.completion_ids for t in out])
    assert comp.shape == (N, NEW)
    return comp[:, 0] * V * V + comp[:, 1] * V + comp[:, 2]
