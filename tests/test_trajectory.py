"""marsrl.trajectory: the Trajectory record (old dicts still load) and ``collate`` against a plain loop."""

import dataclasses
import json
import math
import random

import pytest
import torch

from marsrl.trajectory import PAD_PROVENANCE, PER_TOKEN_FIELDS, Trajectory, collate, pad_per_token
from marsrl.verify import Provenance


def _traj(rng: random.Random, n: int) -> Trajectory:
    return Trajectory(
        prompt_ids=[rng.randrange(50) for _ in range(rng.randint(1, 4))],
        completion_ids=[rng.randrange(1, 50) for _ in range(n)],
        provenance=[rng.choice([1, 2, 3, 4]) for _ in range(n)],
        target_logprobs=[-rng.random() * 5 for _ in range(n)],
        behavior_logprobs=[-rng.random() * 5 for _ in range(n)],
        logit_ratio=[rng.choice([rng.random(), math.nan]) for _ in range(n)],
        unsupported_mass=[rng.choice([0.0, rng.random()]) for _ in range(n)],
        is_top2=[rng.random() < 0.3 for _ in range(n)],
        draft_position=[rng.randrange(8) for _ in range(n)],
        finish_reason="length",
        rule="mars",
        theta=0.9,
        relax_prob=0.5,
    )


def _loop_collate(trajs):
    """The slow reference: one Python loop per row and column."""
    width = max(len(t.completion_ids) for t in trajs)
    pads = dict(completion_ids=0, provenance=0, is_top2=False, draft_position=-1)
    out = {}
    for name in ("completion_ids", *PER_TOKEN_FIELDS):
        rows = []
        for t in trajs:
            vals = list(getattr(t, name))
            rows.append(vals + [pads.get(name, 0.0)] * (width - len(vals)))
        out[name] = rows
    out["mask"] = [[j < len(t.completion_ids) for j in range(width)] for t in trajs]
    return out


def test_collate_matches_a_loop():
    rng = random.Random(0)
    trajs = [_traj(rng, n) for n in (3, 0, 7, 1, 7, 5)]
    got = collate(trajs)
    want = _loop_collate(trajs)
    assert list(got) == [
        "completion_ids", "mask", "provenance", "target_logprobs", "behavior_logprobs", "logit_ratio",
        "unsupported_mass", "is_top2", "draft_position",
    ]  # fmt: skip
    dtypes = dict(
        completion_ids=torch.int64, mask=torch.bool, provenance=torch.int8, is_top2=torch.bool,
        draft_position=torch.int64,
    )  # fmt: skip
    for name, tensor in got.items():
        assert tensor.shape == (6, 7), name
        assert tensor.dtype == dtypes.get(name, torch.float32), name
        ref = torch.tensor(want[name], dtype=tensor.dtype)
        torch.testing.assert_close(tensor, ref, rtol=0, atol=0, equal_nan=True, msg=name)
    assert (got["provenance"][~got["mask"]] == Provenance.PAD).all() and PAD_PROVENANCE == Provenance.PAD


def test_collate_device_and_empty_completions():
    rng = random.Random(1)
    got = collate([_traj(rng, 0), _traj(rng, 0)], device="cpu")
    assert all(t.shape == (2, 0) and t.device.type == "cpu" for t in got.values())


def test_pad_per_token_is_collates_padding_at_any_width():
    """The trainer pads its rows from TRL with ``pad_per_token`` to TRL's width: the same dtype and pad
    as ``collate``, further out; a list longer than the width is refused."""
    rng = random.Random(2)
    trajs = [_traj(rng, n) for n in (4, 0, 2)]
    got = collate(trajs)
    for name in ("completion_ids", *PER_TOKEN_FIELDS):
        lists = [getattr(t, name) for t in trajs]
        torch.testing.assert_close(pad_per_token(name, lists), got[name], rtol=0, atol=0, equal_nan=True)
        wide = pad_per_token(name, lists, width=6)
        assert wide.shape == (3, 6) and wide.dtype == got[name].dtype
        torch.testing.assert_close(wide[:, :4], got[name], rtol=0, atol=0, equal_nan=True)
        assert (wide[:, 4:] == got[name][1, 0]).all()  # row 1 is empty: all padding
    with pytest.raises(ValueError, match="provenance of row 0 has 4 entries, more than the width 3"):
        pad_per_token("provenance", [t.provenance for t in trajs], width=3)


@pytest.mark.parametrize("name", PER_TOKEN_FIELDS)
def test_collate_names_a_field_of_the_wrong_length(name):
    rng = random.Random(2)
    trajs = [_traj(rng, 4) for _ in range(5)]
    getattr(trajs[3], name).append(getattr(trajs[3], name)[0])
    with pytest.raises(ValueError, match=f"^{name} of trajectory 3 has 5 entries but completion_ids has 4$"):
        collate(trajs)


def test_collate_refuses_nan_behaviour_logprobs():
    rng = random.Random(3)
    trajs = [_traj(rng, 4) for _ in range(5)]
    trajs[3].behavior_logprobs[2] = math.nan
    with pytest.raises(ValueError, match=r"^behavior_logprobs of trajectory 3 has NaN$"):
        collate(trajs)


def test_old_records_load_and_new_ones_round_trip_through_json():
    rng = random.Random(4)
    t = _traj(rng, 5)
    t.logit_ratio = [0.5] * 5  # JSON has no NaN literal by default in every reader
    back = Trajectory(**json.loads(json.dumps(dataclasses.asdict(t))))
    assert back == t
    old = dataclasses.asdict(t)
    del old["unsupported_mass"], old["relax_prob"]  # a record written before the two fields existed
    loaded = Trajectory(**old)
    assert loaded.unsupported_mass == [0.0] * 5 and loaded.relax_prob == 1.0
    assert collate([loaded])["unsupported_mass"].tolist() == [[0.0] * 5]


def test_engine_reexports_the_same_class():
    from marsrl.engine import Trajectory as FromEngine

    assert FromEngine is Trajectory
