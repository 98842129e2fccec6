"""DistributedSampler: equal, seeded, world-size-independent, resumable shards."""
import importlib.util
import json

import mxnet as mx
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from gluon_data import DistributedSampler
from gluon_data.sampling.sampler import SampleKey, epoch_order

lengths = st.integers(0, 70)
worlds = st.integers(1, 4)
batches = st.integers(1, 5)


def ranks(length, world, **kw):
    return [DistributedSampler(length, world, r, **kw) for r in range(world)]


def real(keys):
    return [int(k) for k in keys if not k.pad]


@settings(max_examples=150, deadline=None)
@given(length=lengths, world=worlds, batch=batches, seed=st.integers(0, 2**64 - 1),
       epoch=st.integers(0, 5), shuffle=st.booleans())
def test_every_sample_once_equal_counts(length, world, batch, seed, epoch, shuffle):
    samplers = ranks(length, world, batch_size=batch, seed=seed, shuffle=shuffle)
    for s in samplers:
        s.set_epoch(epoch)
    keys = [list(s) for s in samplers]
    # equal samples and batches on every rank, and len() tells the truth
    assert len({len(k) for k in keys}) == 1
    assert all(len(k) == len(s) for k, s in zip(keys, samplers))
    per_rank = [[len(b) for b in s.batch_sampler()] for s in samplers]
    assert all(p == per_rank[0] for p in per_rank)
    assert all(len(s.batch_sampler()) == len(per_rank[0]) for s in samplers)
    # every real sample exactly once across ranks; pads repeat real samples
    seen = sorted(i for k in keys for i in real(k))
    assert seen == list(range(length))
    assert all(k.epoch == epoch for ks in keys for k in ks)
    assert all(0 <= int(k) < length for ks in keys for k in ks)
    pads = sum(k.pad for ks in keys for k in ks)
    assert pads < world
    for s in samplers:  # pads only in the last batch
        assert not any(k.pad for b in list(s.batch_sampler())[:-1] for k in b)
    # global step t is exactly P[t*G:(t+1)*G], rank r taking the r-th slice of B
    order, step = epoch_order(length, seed, epoch, shuffle).tolist(), world * batch
    for t in range(length // step):
        got = [int(k) for s in samplers for k in list(s.batch_sampler())[t]]
        assert got == order[t * step:(t + 1) * step]


@settings(max_examples=80, deadline=None)
@given(length=lengths, world=worlds, batch=batches, seed=st.integers(0, 1000))
def test_drop_last_full_batches_distinct(length, world, batch, seed):
    samplers = ranks(length, world, batch_size=batch, seed=seed, drop_last=True)
    step = world * batch
    for s in samplers:
        assert s.num_batches == length // step
        assert all(len(b) == batch for b in s.batch_sampler())
    seen = [i for s in samplers for i in real(s)]
    assert len(seen) == len(set(seen)) == (length // step) * step
    assert not any(k.pad for s in samplers for k in s)


@settings(max_examples=40, deadline=None)
@given(length=st.integers(2, 200), seed=st.integers(0, 2**32))
def test_order_independent_of_world_and_deterministic(length, seed):
    order = epoch_order(length, seed, 3)
    assert sorted(order.tolist()) == list(range(length))
    for world in (1, 2, 3, 5):
        got = np.empty(0, np.int64)
        samplers = ranks(length, world, batch_size=1, seed=seed)
        for s in samplers:
            s.set_epoch(3)
        for t in range(length // world):
            got = np.append(got, [int(list(s)[t]) for s in samplers])
        assert got.tolist() == order[:len(got)].tolist()
    a, b = DistributedSampler(length, 2, 1, seed=seed), DistributedSampler(length, 2, 1, seed=seed)
    a.set_epoch(3), b.set_epoch(3)
    assert list(a) == list(b)


def test_orders_differ_by_seed_and_epoch():
    base = epoch_order(100, 0, 0).tolist()
    assert epoch_order(100, 1, 0).tolist() != base
    assert epoch_order(100, 0, 1).tolist() != base
    assert epoch_order(100, 0, 0, shuffle=False).tolist() == list(range(100))
    assert epoch_order(100, 0, 0).tolist() == base


def run_pass(samplers, batches=None):
    """Real indexes the ranks see in their first ``batches`` batches of this pass."""
    seen = []
    for s in samplers:
        for b in list(s.batch_sampler())[:batches]:
            seen += real(b)
    return seen


@settings(max_examples=150, deadline=None)
@given(length=st.integers(0, 60), plan=st.lists(st.tuples(worlds, batches, st.floats(0, 1)),
                                                min_size=1, max_size=4),
       seed=st.integers(0, 99), epoch=st.integers(0, 3))
def test_resume_across_world_sizes(length, plan, seed, epoch):
    """Stop after k batches, resume with another world size and batch, ... finish: every
    sample exactly once over the whole epoch."""
    state, seen = None, []
    for world, batch, frac in plan:
        samplers = ranks(length, world, batch_size=batch, seed=seed)
        for s in samplers:
            if state is not None:
                s.load_state_dict(json.loads(json.dumps(state)))
            s.set_epoch(epoch)
        k = int(frac * samplers[0].num_batches)
        seen += run_pass(samplers, k)
        states = [s.state_dict(batches_done=k) for s in samplers]
        assert all(x == states[0] for x in states)
        state = states[0]
    samplers = ranks(length, 3, batch_size=2, seed=seed)
    for s in samplers:
        s.load_state_dict(state)
        s.set_epoch(epoch)
    seen += run_pass(samplers)
    assert sorted(seen) == list(range(length))


def test_resume_1_2_3_concrete():
    """23 samples: 2 batches of 4 on one rank, then 1 global batch on 2 ranks of 3, then the
    rest on 3 ranks of 2: exactly the unseen samples, and the order continues P."""
    order = epoch_order(23, 5, 1).tolist()
    one = DistributedSampler(23, 1, 0, batch_size=4, seed=5)
    one.set_epoch(1)
    first = [int(k) for k in list(one)[:8]]
    state = one.state_dict(batches_done=2)
    assert state["consumed"] == 8 and state["epoch"] == 1
    two = ranks(23, 2, batch_size=3, seed=5)
    for s in two:
        s.load_state_dict(state)
    second = [int(k) for s in two for k in list(s.batch_sampler())[0]]
    state = two[1].state_dict(batches_done=1)
    assert state["consumed"] == 14
    three = ranks(23, 3, batch_size=2, seed=5)
    for s in three:
        s.load_state_dict(state)
        s.set_epoch(1)                       # the loaded epoch keeps its position
    rest = run_pass(three)
    assert first + second == order[:14]
    assert sorted(first + second + rest) == list(range(23))
    assert [int(k) for s in three for k in list(s.batch_sampler())[0]] == order[14:20]
    for s in three:
        s.set_epoch(2)                       # a new epoch starts from its first sample
        assert s.consumed == 0
    assert sorted(run_pass(three)) == list(range(23))


def test_finished_pass_state_and_bad_states():
    s = DistributedSampler(10, 2, 0, batch_size=3, drop_last=True)
    assert s.num_batches == 1
    assert s.state_dict(batches_done=1)["consumed"] == 10   # the dropped tail is skipped
    with pytest.raises(ValueError, match="only 1 batches"):
        s.state_dict(batches_done=2)
    good = s.state_dict()
    for change, match in (({"seed": 1}, "seed=1"), ({"length": 11}, "length=11"),
                          ({"shuffle": False}, "shuffle=False"), ({"consumed": 11}, "consumed 11"),
                          ({"version": 9}, "version 9")):
        with pytest.raises(ValueError, match=match):
            s.load_state_dict(dict(good, **change))
    with pytest.raises(ValueError, match="lacks consumed"):
        s.load_state_dict({k: v for k, v in good.items() if k != "consumed"})
    with pytest.raises(TypeError):
        s.load_state_dict([1, 2])


@pytest.mark.parametrize("args, error, match", [
    ((5, 2, 2), ValueError, "rank must be in"), ((5, 0, 0), ValueError, "num_replicas"),
    ((-1, 1, 0), ValueError, "length"), ((5.5, 1, 0), TypeError, "length"),
])
def test_bad_arguments(args, error, match):
    with pytest.raises(error, match=match):
        DistributedSampler(*args)
    with pytest.raises(ValueError, match="batch_size"):
        DistributedSampler(5, batch_size=0)


def expected_batches(sampler):
    return [[int(k) for k in b] for b in sampler.batch_sampler()]


@pytest.mark.parametrize("workers", [0, 2])
def test_gluon_dataloader_sampler_and_batch_sampler(workers):
    """A stock Gluon DataLoader with batch_size=B and sampler=ours gives this rank's batches
    (last one short, the same size on every rank); batch_sampler= gives the same."""
    data = mx.gluon.data.SimpleDataset(list(range(100, 111)))
    for rank in range(2):
        s = DistributedSampler(11, 2, rank, batch_size=2, seed=7)
        s.set_epoch(1)
        want = [[100 + i for i in b] for b in expected_batches(s)]
        assert [len(b) for b in want] == [2, 2, 2]
        for kw in ({"batch_size": 2, "sampler": s}, {"batch_sampler": s.batch_sampler()}):
            loader = mx.gluon.data.DataLoader(data, num_workers=workers, **kw)
            assert len(loader) == 3
            assert [b.asnumpy().tolist() for b in loader] == want


@pytest.mark.parametrize("keys", [True, False])
def test_array_datasets_index_with_keys(keys):
    """An NDArray/numpy-backed ArrayDataset indexes with the sampler's keys exactly as with
    plain ints (a tuple-like key would be read as a multi-dimensional index)."""
    data = mx.gluon.data.ArrayDataset(np.arange(100, 120).reshape(10, 2), np.arange(10))
    s = DistributedSampler(10, 2, 1, batch_size=3, seed=2, keys=keys)
    assert all(isinstance(i, int) for i in s)
    assert all(type(i) is (SampleKey if keys else int) for i in s)
    loader = mx.gluon.data.DataLoader(data, batch_size=3, sampler=s)
    got = [(x.asnumpy().tolist(), lbl.asnumpy().tolist()) for x, lbl in loader]
    want = expected_batches(s)
    assert [lbl for _, lbl in got] == want
    assert [x for x, _ in got] == [[[100 + 2 * i, 101 + 2 * i] for i in b] for b in want]


def test_sample_key_is_its_index_and_pickles():
    import pickle
    k = SampleKey(5, epoch=3, pad=True)
    assert k == 5 and hash(k) == hash(5) and k.index == 5 and [0, 1, 2, 3, 4, 5][k] == 5
    assert k != SampleKey(5, 3, False) and k != SampleKey(5, 2, True)
    back = pickle.loads(pickle.dumps(k))
    assert type(back) is SampleKey and (back.index, back.epoch, back.pad) == (5, 3, True)
    assert type(k + 1) is int


def test_sample_keys_carry_epoch_and_pad():
    s = DistributedSampler(3, 2, 1, batch_size=2, shuffle=False)
    s.set_epoch(4)
    assert list(s) == [SampleKey(2, 4, False), SampleKey(0, 4, True)]


def test_from_kvstore_local():
    kv = mx.kv.create("local")
    s = DistributedSampler.from_kvstore(kv, 9, batch_size=4, seed=3)
    assert (s.num_replicas, s.rank, len(s)) == (1, 0, 9)
    with pytest.raises(TypeError, match="launcher"):
        DistributedSampler.from_kvstore(kv, 9, rank=1)


@pytest.mark.skipif(importlib.util.find_spec("horovod") is not None,
                    reason="Horovod is installed; tests/test_horovod.py covers it")
def test_from_horovod_without_horovod_names_the_install():
    with pytest.raises(ImportError, match="HOROVOD_WITH_MXNET=1"):
        DistributedSampler.from_horovod(10)
