"""BatchRing, the collate_fn that hands batches over in shared memory each worker reuses.

The layout of a batch (what a slot holds, what goes the default way) is checked here without
PyTorch; the batches themselves in a PyTorch client subprocess (skipped without PyTorch) with
two real workers: equal to ``default_collate``'s, type for type, in a ring that the training
process mapped once per worker, its slots reused once freed and never while a batch, or a view
of one, is kept.
"""
import json
import subprocess
import sys

import numpy as np
import pytest

from gluon_data.arrays import BatchRing
from gluon_data.arrays.batchring import layout
from gluon_data.storage.perprocess import ProcessMark
from conftest import torch_client_env


def test_layout_of_a_segmentation_batch_puts_each_field_on_its_own_cache_line():
    samples = [(np.zeros((3, 5, 7), np.uint8), np.ones((5, 7), np.int32)) for _ in range(4)]
    one, columns, fields = layout(samples)
    assert not one and len(columns) == 2
    assert fields == [("|u1", (4, 3, 5, 7), 0, 420), ("<i4", (4, 5, 7), 448, 560)]


def test_layout_of_scalars_follows_default_collate_dtypes():
    samples = [(np.zeros(2, np.float32), 1, 2.5, True, np.float32(3)) for _ in range(3)]
    _, _, fields = layout(samples)
    assert [f[0] for f in fields] == ["<f4", "<i8", "<f8", "|b1", "<f4"]
    assert all(f[1][0] == 3 for f in fields)
    one, _, fields = layout([np.arange(6, dtype=np.int16).reshape(2, 3)] * 5)
    assert one and fields == [("<i2", (5, 2, 3), 0, 60)]


@pytest.mark.parametrize("samples", [
    [],
    [(np.zeros(3), np.zeros(2)), (np.zeros(4), np.zeros(2))],           # shapes differ
    [(np.zeros(3, np.uint16),)] * 2,                                       # torch takes no uint16
    [(np.zeros(3, ">f4"),)] * 2,                                           # not native order
    [(np.zeros(3), "name")] * 2,                                           # a string
    [{"image": np.zeros(3)}] * 2,                                          # a dict
    [(1, 2.0), (1.0, 2.0)],                                                # int, then float
    [(2 ** 63,)] * 2,                                                      # beyond int64
    [(np.zeros(3),), [np.zeros(3)]],                                       # tuple, then list
    [np.array(["a", "b"])] * 2,                                            # a string array
    [np.arange(4)[::-1]] * 2,                                              # torch refuses it
])
def test_layout_leaves_what_a_slot_cannot_hold_to_default_collate(samples):
    assert layout(samples) is None


@pytest.mark.parametrize("slots", [0, 256, 2.0, True, "4"])
def test_slots_out_of_range_are_refused(slots):
    with pytest.raises(ValueError, match="slots must be an integer from 1 to 255"):
        BatchRing(slots)


def test_a_process_mark_tells_a_reaped_process_from_a_live_one():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    assert ProcessMark().alive()
    child.wait(timeout=60)
    assert not ProcessMark(child.pid).alive()


#: The client: every scenario's batches through BatchRing with two workers, compared in the
#: client with default_collate's (num_workers=0, same order), and what the ring did.
CLIENT = r"""
import json, sys, weakref
import numpy as np
import torch
from torch.utils.data import DataLoader
from gluon_data.arrays import BatchRing, ClassificationDataset, SegmentationDataset
from gluon_data.arrays import batchring

seg_path, cls_path = sys.argv[1], sys.argv[2]


class Mixed:
    # samples of numbers beside arrays, and of a size that grows with the index
    def __init__(self, grow=False):
        self.grow = grow

    def __len__(self):
        return 24

    def __getitem__(self, i):
        n = 1000 * (1 + i // 4) if self.grow else 1  # (a batch of 4 grows 48 KB a time)
        return (np.full((n, 3), i, np.float32), i, i / 4, i % 2 == 0, np.int16(-i),
                np.arange(n * 2, dtype=np.uint8).reshape(n, 2))


class Named(Mixed):
    def __getitem__(self, i):
        return (np.full(3, i, np.float32), "item%d" % i)


def corner(img, label):
    return np.ascontiguousarray(img[:16, :16]), label


def mapped():
    return batchring._MAPPED.get(dict)


RING = {}  # id of a tensor made from a slot -> its ring, while the tensor lives
received = batchring._received  # (what unpickles a batch sent in a slot)


def record(token, *args):
    out = received(token, *args)
    for t in ([out] if isinstance(out, torch.Tensor) else out):
        RING[id(t)] = token
        weakref.finalize(t, RING.pop, id(t), None)
    return out


batchring._received = record


def where(t):
    # the ring of the slot the tensor was made from, or None (collated the default way)
    return RING.get(id(t))


def same(a, b):
    if isinstance(a, torch.Tensor):
        return (isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape
                and torch.equal(a, b))
    return type(a) is type(b) and (
        all(same(x, y) for x, y in zip(a, b)) and len(a) == len(b)
        if isinstance(a, (list, tuple)) else a == b)


def tensors(batch):
    return [batch] if isinstance(batch, torch.Tensor) else [
        t for t in batch if isinstance(t, torch.Tensor)]


def loader(ds, batch_size, collate_fn, persistent, workers):
    # the same seed for both loaders: their workers draw the same augmentations
    return DataLoader(ds, batch_size=batch_size, num_workers=workers, collate_fn=collate_fn,
                      persistent_workers=persistent and workers > 0,
                      multiprocessing_context="fork" if workers else None,
                      generator=torch.Generator().manual_seed(5))


def run(ds, batch_size=4, keep=False, slots=8, persistent=True, epochs=1, workers=2):
    default = loader(ds, batch_size, None, persistent, workers)
    want = [list(default) for _ in range(epochs)]
    ring = loader(ds, batch_size, BatchRing(slots), persistent, workers)
    out = {"equal": True, "in ring": 0, "batches": 0, "rings seen": set(), "ptrs": set()}
    for epoch in range(epochs):
        kept = []
        for got, ref in zip(ring, want[epoch]):
            out["equal"] &= same(got, ref)
            places = {where(t) for t in tensors(got)}
            assert len(places) == 1, places  # a batch lies in one slot, or in none
            place = places.pop()
            out["batches"] += 1
            if place is not None:
                out["in ring"] += 1
                out["rings seen"].add(place)
                out["ptrs"].add(tensors(got)[0].data_ptr())
            if keep:
                kept.append((got, ref))
        out["kept still equal"] = all(same(g, r) for g, r in kept)
    out["rings mapped"] = len(mapped())
    out["rings seen"], out["ptrs"] = len(out["rings seen"]), len(out["ptrs"])
    return out


seg = dict(mode="train", base_size=40, crop_size=32, seed=3)
res = {
    "seg": run(SegmentationDataset(seg_path, **seg)),
    "seg uint8": run(SegmentationDataset(seg_path, mask_dtype="uint8", ignore_value=255,
                                         **seg)),
    "cls": run(ClassificationDataset(cls_path, transform=corner)),
    "mixed": run(Mixed()),
    "kept": run(Mixed(), keep=True, slots=2),
    "reused": run(Mixed(), batch_size=1, slots=4),
    "new workers each epoch": run(Mixed(), persistent=False, epochs=3),
    "growing": run(Mixed(grow=True), batch_size=4, slots=4),
    "strings": run(Named()),
    "in process": run(Mixed(), workers=0),
}
# a view of a batch outlives the batch: its slot is not reused under it
loader = DataLoader(Mixed(), batch_size=2, num_workers=1, collate_fn=BatchRing(1),
                    persistent_workers=True, multiprocessing_context="fork")
view, first, in_ring = None, None, None
for i, batch in enumerate(loader):
    if view is None:
        view, first, in_ring = batch[0][1:], batch[0][1:].clone(), where(batch[0]) is not None
    del batch
res["view kept"] = {"equal": bool(torch.equal(view, first)), "in ring": in_ring}
print(json.dumps(res, default=str))
"""


@pytest.fixture(scope="module")
def client(voc_rec, cls_rec):
    env = torch_client_env()
    run = subprocess.run([sys.executable, "-c", CLIENT, voc_rec, cls_rec], env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.splitlines()[-1])


@pytest.mark.parametrize("case", ["seg", "seg uint8", "cls", "mixed"])
def test_batches_equal_default_collate_and_come_through_the_ring(client, case):
    got = client[case]
    assert got["equal"], got
    assert got["in ring"] == got["batches"] > 0, got
    assert got["rings seen"] == 2, got  # one per worker, each mapped once


def test_kept_batches_stay_intact_and_the_rest_go_the_default_way(client):
    got = client["kept"]
    assert got["equal"] and got["kept still equal"], got
    assert 0 < got["in ring"] <= 2 * 2 < got["batches"], got  # two slots a worker, all kept


def test_freed_slots_are_reused(client):
    got = client["reused"]
    assert got["equal"] and got["in ring"] == got["batches"] == 24, got
    assert got["ptrs"] <= 2 * 4, got  # four slots a worker, over 24 batches


def test_rings_of_ended_workers_are_let_go(client):
    got = client["new workers each epoch"]
    assert got["equal"] and got["in ring"] == got["batches"] == 18, got
    assert got["rings seen"] == 6 and got["rings mapped"] <= 2, got


def test_a_batch_larger_than_the_slots_gets_a_larger_ring(client):
    got = client["growing"]
    assert got["equal"] and got["in ring"] == got["batches"], got
    assert got["rings seen"] > 2 and got["rings mapped"] <= 2, got  # the smaller ones let go


def test_what_the_ring_cannot_hold_and_the_main_process_collate_as_default(client):
    for case in ("strings", "in process"):
        got = client[case]
        assert got["equal"] and got["batches"] == 6 and got["in ring"] == 0, (case, got)


def test_a_view_of_a_freed_batch_keeps_its_slot(client):
    assert client["view kept"] == {"equal": True, "in ring": True}
