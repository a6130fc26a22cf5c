import itertools

import torch

from marsrl.batching import bucket_by_length


def test_every_index_once_and_batches_sorted_within_windows():
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(1, 200, (103,), generator=g).tolist()
    order = torch.randperm(103, generator=g).tolist()
    batches = bucket_by_length(order, lengths, 4, torch.Generator().manual_seed(1), group=5)
    flat = [i for b in batches for i in b]
    assert sorted(flat) == list(range(103))
    assert all(len(b) == 4 for b in batches[:-1])
    # within each window of 20 the batches partition a length-sorted run: no two batches overlap in length
    for w in range(0, len(batches), 5):
        window = batches[w : w + 5]
        spans = sorted((min(lengths[i] for i in b), max(lengths[i] for i in b)) for b in window)
        assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans))


def test_bucketing_cuts_padding_on_spread_lengths():
    g = torch.Generator().manual_seed(2)
    lengths = torch.randint(60, 200, (512,), generator=g).tolist()
    order = torch.randperm(512, generator=g).tolist()

    def padded(batches):
        return sum(max(lengths[i] for i in b) * len(b) for b in batches)

    plain = bucket_by_length(order, lengths, 16, g, group=1)
    assert plain == [order[i : i + 16] for i in range(0, 512, 16)]
    bucketed = bucket_by_length(order, lengths, 16, g)
    assert padded(bucketed) < 0.8 * padded(plain)


def test_same_generator_seed_same_batches():
    lengths = list(range(50))
    order = list(reversed(range(50)))
    a = bucket_by_length(order, lengths, 8, torch.Generator().manual_seed(3))
    b = bucket_by_length(order, lengths, 8, torch.Generator().manual_seed(3))
    assert a == b
