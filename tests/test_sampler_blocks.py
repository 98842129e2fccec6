"""Block-local order of DistributedSampler (``part_sizes``): each rank reads its own run of
whole parts, every index once per epoch across ranks, seeded, resumable; and the deprecated
BlockShuffleSampler over it."""
import json

import numpy as np
import pytest

from gluon_data.stores.recordio import RecordFile
from gluon_data.sampling.sampler import BlockShuffleSampler, DistributedSampler, block_order
from gluon_data.stores.shardstore import ShardedStore
from gluon_data.convert.sharded import convert_sharded

SIZES = [5, 3, 0, 7, 4, 9, 1, 6, 2, 8]   # uneven, one empty part: 45 records
LENGTH = sum(SIZES)
STARTS = np.concatenate(([0], np.cumsum(SIZES)))


def part_of(i):
    return int(np.searchsorted(STARTS, int(i), side="right")) - 1


def ranks(world, epoch=0, **options):
    out = []
    for r in range(world):
        s = DistributedSampler(LENGTH, world, r, part_sizes=SIZES, **options)
        s.set_epoch(epoch)
        out.append(s)
    return out


def runs(parts):
    """The parts in the order a rank reads them, one entry per contiguous run."""
    return [p for j, p in enumerate(parts) if j == 0 or parts[j - 1] != p]


@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("batch", [1, 2, 4])
@pytest.mark.parametrize("drop_last", [False, True])
def test_every_index_once_per_epoch_across_ranks(world, batch, drop_last):
    for epoch in (0, 3):
        samplers = ranks(world, epoch, batch_size=batch, seed=11, drop_last=drop_last)
        keys = [list(s) for s in samplers]
        assert len({len(k) for k in keys}) == 1                 # equal shards
        real = [int(k) for ks in keys for k in ks if not k.pad]
        pads = [k for ks in keys for k in ks if k.pad]
        assert len(real) == len(set(real))
        assert {k.epoch for ks in keys for k in ks} == {epoch}
        if drop_last:
            assert not pads and len(real) == (LENGTH // (world * batch)) * world * batch
        else:
            assert sorted(real) == list(range(LENGTH)) and len(pads) < world
            for s in samplers:  # pads only in the last batch
                assert not any(k.pad for b in list(s.batch_sampler())[:-1] for k in b)


@pytest.mark.parametrize("world", [1, 2, 3])
def test_a_rank_reads_its_parts_one_after_another(world):
    nonempty = sum(1 for n in SIZES if n)
    for seed in range(5):
        total = 0
        for s in ranks(world, epoch=seed, seed=seed, batch_size=2):
            seq = runs([part_of(k) for k in s])     # pads included
            assert len(seq) == len(set(seq)), seq   # a part left is never visited again
            assert len(seq) - 1 <= -(-nonempty // world) + 2, (seed, world, seq)
            total += len(seq) - 1
        # every part boundary of the order is crossed by one rank at most
        assert total <= nonempty - 1


def test_the_global_order_is_the_ranks_runs_in_rank_order():
    """The world size changes who reads what, not the order: rank runs laid end to end are
    ``P`` on 1, 2 and 3 ranks, and ``P`` is seeded, differs by epoch and by seed."""
    p = ranks(1, epoch=2, seed=4)[0].order()
    for world in (1, 2, 3):
        got = [int(k) for s in ranks(world, epoch=2, seed=4) for k in s if not k.pad]
        assert got == p.tolist()
    assert ranks(1, epoch=2, seed=4)[0].order().tolist() == p.tolist()
    assert ranks(1, epoch=3, seed=4)[0].order().tolist() != p.tolist()
    assert ranks(1, epoch=2, seed=5)[0].order().tolist() != p.tolist()
    for world in (2, 3):  # and each rank's own pass differs between epochs
        for a, b in zip(ranks(world, epoch=0, seed=4), ranks(world, epoch=1, seed=4)):
            assert [int(k) for k in a] != [int(k) for k in b]
    order, bounds = block_order(SIZES, seed=4, epoch=2, parts_per_block=2)
    for lo, hi in zip(bounds[:-1], bounds[1:]):   # a block: its parts' records, shuffled
        assert len({part_of(i) for i in order[lo:hi]}) <= 2
    assert np.array_equal(block_order(SIZES, 4, 2, shuffle=False)[0], np.arange(LENGTH))


@pytest.mark.parametrize("plan", [[(2, 3, 2), (3, 2, 1)], [(3, 1, 4), (1, 4, 2), (2, 2, 1)],
                                  [(1, 1, 30), (3, 2, 2)]])
def test_resume_mid_epoch_with_other_world_sizes(plan):
    """Each step: ``(world, batch, batches done)``; the state goes through JSON, the last
    world finishes the epoch: every index exactly once, each rank still part-contiguous."""
    state, seen = None, []
    for i, (world, batch, done) in enumerate(plan + [(2, 3, None)]):
        samplers = []
        for r in range(world):
            s = DistributedSampler(LENGTH, world, r, batch_size=batch, seed=9,
                                   part_sizes=SIZES)
            s.set_epoch(1)
            if state is not None:
                s.load_state_dict(json.loads(json.dumps(state)))
            samplers.append(s)
        for s in samplers:
            batches = list(s.batch_sampler())[:done]
            keys = [k for b in batches for k in b]
            assert {k.epoch for k in keys} <= {1}
            seen += [int(k) for k in keys if not k.pad]
            seq = runs([part_of(k) for k in keys])
            assert len(seq) == len(set(seq)), seq
        if done is not None:
            state = samplers[0].state_dict(batches_done=done)
            assert state == samplers[-1].state_dict(batches_done=done)  # same on every rank
            assert state["consumed"] == min(LENGTH, len(set(seen)))
    assert sorted(seen) == list(range(LENGTH))


def test_block_states_are_checked():
    s = DistributedSampler(LENGTH, 2, 0, batch_size=2, part_sizes=SIZES)
    good = s.state_dict(batches_done=3)
    assert good["remaining"] and good["consumed"] == 12
    plain = DistributedSampler(LENGTH, 2, 0, batch_size=2)
    with pytest.raises(ValueError, match="part_sizes"):
        plain.load_state_dict(good)              # another order
    with pytest.raises(ValueError, match="part_sizes=None"):
        s.load_state_dict(plain.state_dict(batches_done=3))
    other = DistributedSampler(LENGTH, 1, 0, part_sizes=SIZES[::-1])
    with pytest.raises(ValueError, match="part_sizes"):
        other.load_state_dict(good)
    with pytest.raises(ValueError, match="parts_per_block"):
        DistributedSampler(LENGTH, part_sizes=SIZES, parts_per_block=2).load_state_dict(good)
    for bad in ([[0, 50]], [[5, 3]], [[0, 10], [5, 38]], [[0, 32]], "0-33", [[0]]):
        with pytest.raises(ValueError, match="remaining"):
            s.load_state_dict(dict(good, remaining=bad))
    with pytest.raises(ValueError, match="sum to 44 records, but length is 45"):
        DistributedSampler(LENGTH, part_sizes=SIZES[:-1] + [7])
    with pytest.raises(ValueError, match="part size"):
        DistributedSampler(3, part_sizes=[4, -1])
    s.load_state_dict(good)
    assert len(s) == (LENGTH - 12 + 1) // 2 and s.consumed == 12


def test_block_shuffle_sampler_warns_and_keeps_its_guarantees():
    sizes = [5, 3, 0, 7, 4]
    with pytest.warns(DeprecationWarning, match="DistributedSampler"):
        s = BlockShuffleSampler(sizes, seed=7, parts_per_block=2)
    starts = np.concatenate(([0], np.cumsum(sizes)))
    orders = []
    for epoch in (0, 1):
        s.set_epoch(epoch)
        keys = list(s)
        assert len(s) == 19 and sorted(int(k) for k in keys) == list(range(19))
        assert {k.epoch for k in keys} == {epoch} and not any(k.pad for k in keys)
        blocks = s.blocks()
        assert [int(k) for k in keys] == np.concatenate(blocks).tolist()
        for block in blocks:
            assert len(set(np.searchsorted(starts, block, side="right"))) <= 2
        orders.append([int(k) for k in keys])
    assert orders[0] != orders[1]
    with pytest.warns(DeprecationWarning):
        again = BlockShuffleSampler(sizes, seed=7, parts_per_block=2)
        flat = BlockShuffleSampler(sizes, shuffle=False)
    again.set_epoch(1)
    assert [int(k) for k in again] == orders[1]
    assert [int(k) for k in flat] == list(range(19))
    state = again.state_dict(batches_done=6)     # and it resumes, as its base class does
    with pytest.warns(DeprecationWarning):
        rest = BlockShuffleSampler(sizes, seed=7, parts_per_block=2)
    rest.load_state_dict(state)
    assert [int(k) for k in rest] == orders[1][6:]


def test_ranks_of_a_sharded_dataset_read_their_own_shards(cls_rec, tmp_path):
    """A real sharded conversion: two ranks in block-local order read every record once
    (payloads equal the single file's), each its own shards one after another."""
    manifest = convert_sharded(cls_rec, str(tmp_path / "c.rec"), shard_items=3).outputs["train"]
    store, one = ShardedStore(manifest), RecordFile(cls_rec)
    sizes = [int(s["records"]) for s in store.manifest["shards"]]
    assert len(sizes) >= 4 and sum(sizes) == len(store) == len(one)
    got, shards = {}, []
    for rank in range(2):
        s = DistributedSampler(len(store), 2, rank, batch_size=2, seed=1, part_sizes=sizes)
        s.set_epoch(1)
        keys = [int(k) for k in s if not k.pad]
        got.update((i, store.read(i)) for i in keys)
        seq = runs([store.locate(i)[0] for i in keys])
        assert len(seq) == len(set(seq)) <= -(-len(sizes) // 2) + 1, seq
        shards.append(set(seq))
    assert len(shards[0] & shards[1]) <= 1     # at most the one shard split between them
    assert got == {i: one.read(i) for i in range(len(one))}
    one.close()
