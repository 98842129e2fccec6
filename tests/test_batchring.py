"""BatchRing, the collate_fn that hands batches over in shared memory each worker reuses.

The layout of a batch (what a slot holds, what travels by value, what goes the default way)
is checked here without PyTorch; the batches themselves in a PyTorch client subprocess
(skipped without PyTorch) with two real workers: equal to ``default_collate``'s, type for
type, in a ring that the training process mapped once per worker, its slots reused once
freed and never while a batch, a view of one or a numpy array taken from one is kept, and
its rings let go once their workers or their loader are gone.
"""
import json
import subprocess
import sys

import numpy as np
import pytest

from gluon_data.arrays import BatchRing
from gluon_data.arrays.batchring import BY_VALUE_BYTES, layout
from gluon_data.storage.perprocess import ProcessMark
from conftest import torch_client_env


def test_layout_of_a_segmentation_batch_puts_each_field_on_its_own_cache_line():
    samples = [(np.zeros((3, 100, 100), np.uint8), np.ones((100, 100), np.int32), 7)
               for _ in range(4)]
    one, columns, fields = layout(samples)
    assert not one and len(columns) == 3
    assert fields == [("|u1", (4, 3, 100, 100), 0, 120000),
                      ("<i4", (4, 100, 100), 120000, 160000),
                      ("<i8", (4,), -1, 32)]  # (a label travels by value: keeping it keeps no slot)


def test_layout_of_scalars_follows_default_collate_dtypes():
    big = np.zeros(BY_VALUE_BYTES // 4, np.float32)  # a field of 4 samples needs a slot
    samples = [(big, 1, 2.5, True, np.float32(3)) for _ in range(4)]
    _, _, fields = layout(samples)
    assert [f[0] for f in fields] == ["<f4", "<i8", "<f8", "|b1", "<f4"]
    assert [f[2] for f in fields] == [0, -1, -1, -1, -1]
    assert all(f[1][0] == 4 for f in fields)
    one, _, fields = layout([np.zeros((100, 100), np.int16)] * 5)
    assert one and fields == [("<i2", (5, 100, 100), 0, 100000)]


@pytest.mark.parametrize("samples", [
    [],
    [(np.zeros((3, 10, 10)), np.zeros(2))] * 2,                            # every field small
    [(np.zeros(9000), np.zeros(2)), (np.zeros(9001), np.zeros(2))],        # shapes differ
    [(np.zeros(9000, np.uint16),)] * 8,                                    # torch takes no uint16
    [(np.zeros(9000, ">f4"),)] * 8,                                        # not native order
    [(np.zeros(9000), "name")] * 8,                                        # a string
    [{"image": np.zeros(9000)}] * 8,                                       # a dict
    [(np.zeros(9000), 1), (np.zeros(9000), 1.0)],                          # int, then float
    [(np.zeros(9000), 2 ** 63)] * 8,                                       # beyond int64
    [(np.zeros(9000),), [np.zeros(9000)]],                                 # tuple, then list
    [np.array(["a", "b"] * 9000)] * 8,                                     # a string array
    [np.arange(9000)[::-1]] * 8,                                           # torch refuses it
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
#: client with the same loader's batches collated by default_collate, and what the ring did.
CLIENT = r"""
import gc, json, sys, weakref
import numpy as np
import torch
from torch.utils.data import DataLoader
from gluon_data.arrays import BatchRing, ClassificationDataset, SegmentationDataset
from gluon_data.arrays import batchring
from gluon_data.storage import sharedmem

seg_path, cls_path = sys.argv[1], sys.argv[2]


class Mixed:
    # samples of numbers beside arrays (102 KB a batch of 4), of a size that grows with the
    # index where asked (by 102 KB a batch of 4)
    def __init__(self, grow=False, n=24):
        self.grow, self.n = grow, n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        n = 1 + (i // 4 if self.grow else 0)
        return (np.full((n, 80, 80), i, np.float32), i, i / 4, i % 2 == 0, np.int16(-i),
                np.arange(n * 2, dtype=np.uint8).reshape(n, 2))


class Named(Mixed):
    def __getitem__(self, i):
        return (np.full(9000, i, np.float32), "item%d" % i)


def corner(img, label):  # a fixed-size image (49 KB), so that a batch of them stacks
    return np.ascontiguousarray(np.tile(img[:16, :16], (8, 8, 1))), label


def rings():
    return sharedmem.mapped_count()


RING = {}  # id of a tensor made from a slot -> its ring, while the tensor lives
received = batchring._received  # (what unpickles a batch sent in a slot)


def record(place, *args):
    out = received(place, *args)
    for t in ([out] if isinstance(out, torch.Tensor) else out):
        if t.numel() * t.element_size() > batchring.BY_VALUE_BYTES:  # (not sent by value)
            RING[id(t)] = place[1]
            weakref.finalize(t, RING.pop, id(t), None)
    return out


batchring._received = record


def where(batch):
    # the ring of the slot the batch was made from, or None (collated the default way)
    places = {RING.get(id(t)) for t in tensors(batch)} - {None}
    assert len(places) <= 1, places  # a batch lies in one slot, or in none
    return places.pop() if places else None


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


def loader(ds, batch_size, collate_fn, persistent, workers, ctx="fork"):
    # the same seed for both loaders: their workers draw the same augmentations
    return DataLoader(ds, batch_size=batch_size, num_workers=workers, collate_fn=collate_fn,
                      persistent_workers=persistent and workers > 0,
                      multiprocessing_context=ctx if workers else None,
                      generator=torch.Generator().manual_seed(5))


def run(ds, batch_size=4, keep=None, slots=8, persistent=True, epochs=1, workers=2,
        ctx="fork", share=False):
    default = loader(ds, batch_size, None, persistent, workers, ctx)
    want = [list(default) for _ in range(epochs)]
    del default
    ring = loader(ds, batch_size, BatchRing(slots), persistent, workers, ctx)
    out = {"equal": True, "in ring": 0, "batches": 0, "rings seen": set(), "ptrs": set(),
           "counts": True, "kept still equal": True, "most rings": 0}
    for epoch in range(epochs):
        kept, n = [], 0
        for got, ref in zip(ring, want[epoch]):
            n += 1
            out["equal"] &= same(got, ref)
            place = where(got)
            out["batches"] += 1
            out["most rings"] = max(out["most rings"], rings())
            if place is not None:
                out["in ring"] += 1
                out["rings seen"].add(place)
                out["ptrs"].add(tensors(got)[0].data_ptr())
            if keep == "batch":
                kept.append((got, ref))
            elif keep == "labels":  # a metric's targets, kept to the end of the epoch
                kept.append((got[1], ref[1]))
            elif keep == "numpy":  # a numpy array of the batch
                kept.append((got[0].numpy(), ref[0]))
        out["counts"] &= n == len(want[epoch])
        out["kept still equal"] &= all(
            np.array_equal(g, r.numpy()) if isinstance(g, np.ndarray) else same(g, r)
            for g, r in kept)
        del kept
    out["rings seen"], out["ptrs"] = len(out["rings seen"]), len(out["ptrs"])
    del ring, got
    gc.collect()
    out["rings after"] = rings()  # the loader gone: its rings let go
    return out


seg = dict(mode="train", base_size=200, crop_size=160, seed=3)  # (307 KB a batch of 4)
res = {
    "seg": run(SegmentationDataset(seg_path, **seg)),
    "seg uint8": run(SegmentationDataset(seg_path, mask_dtype="uint8", ignore_value=255,
                                         **seg)),
    "cls": run(ClassificationDataset(cls_path, transform=corner)),
    "mixed": run(Mixed()),
    "kept": run(Mixed(), keep="batch", slots=2),
    "labels kept": run(Mixed(n=96), keep="labels", slots=4),
    "numpy kept": run(Mixed(), keep="numpy", slots=2),
    "reused": run(Mixed(n=96), slots=4),
    "new workers each epoch": run(Mixed(), persistent=False, epochs=3),
    "growing": run(Mixed(grow=True), slots=4),
    "strings": run(Named()),
    "in process": run(Mixed(), workers=0),
    "spawn": run(SegmentationDataset(seg_path, **seg), ctx="spawn"),
}

# a view of a batch outlives the batch: its slot is not reused under it
one = DataLoader(Mixed(), batch_size=4, num_workers=1, collate_fn=BatchRing(1),
                 persistent_workers=True, multiprocessing_context="fork")
view, first, in_ring = None, None, None
for batch in one:
    if view is None:
        view, first, in_ring = batch[0][1:], batch[0][1:].clone(), where(batch) is not None
    del batch
res["view kept"] = {"equal": bool(torch.equal(view, first)), "in ring": in_ring}

# an epoch left early, then a whole one, on the same persistent workers
for _ in one:
    break
res["after a break"] = {"equal": all(same(a, b) for a, b in zip(one, DataLoader(
    Mixed(), batch_size=4))), "batches": len(list(one))}

# a collate_fn that wraps BatchRing is told what to do instead
wrapped = BatchRing()
try:
    next(iter(DataLoader(Mixed(), batch_size=4, num_workers=1,
                         collate_fn=lambda s: wrapped(s)[0], multiprocessing_context="fork")))
except TypeError as e:
    res["wrapped"] = str(e)
print(json.dumps(res, default=str))
"""


@pytest.fixture(scope="module")
def client(voc_rec, cls_rec):
    env = torch_client_env()
    run = subprocess.run([sys.executable, "-c", CLIENT, voc_rec, cls_rec], env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.splitlines()[-1])


@pytest.mark.parametrize("case", ["seg", "seg uint8", "cls", "mixed", "spawn"])
def test_batches_equal_default_collate_and_come_through_the_ring(client, case):
    got = client[case]
    assert got["equal"] and got["counts"], got
    assert got["in ring"] == got["batches"] > 0, got
    assert got["rings seen"] == 2 and got["rings after"] == 0, got  # a ring a worker


def test_kept_batches_stay_intact_and_the_rest_go_the_default_way(client):
    got = client["kept"]
    assert got["equal"] and got["counts"] and got["kept still equal"], got
    assert 0 < got["in ring"] <= 2 * 2 < got["batches"], got  # two slots a worker, all kept


def test_kept_labels_keep_no_slot(client):
    got = client["labels kept"]
    assert got["equal"] and got["kept still equal"], got
    assert got["in ring"] == got["batches"] == 24, got  # (kept slots: at most 2 * 4)


def test_a_numpy_array_of_a_batch_keeps_its_slot(client):
    got = client["numpy kept"]
    assert got["equal"] and got["kept still equal"], got
    assert 0 < got["in ring"] < got["batches"], got  # kept slots: the rest go the default way


def test_freed_slots_are_reused(client):
    got = client["reused"]
    assert got["equal"] and got["in ring"] == got["batches"] == 24, got
    assert got["ptrs"] <= 2 * 4, got  # four slots a worker, over 24 batches


def test_rings_of_ended_workers_are_let_go(client):
    got = client["new workers each epoch"]
    assert got["equal"] and got["counts"] and got["in ring"] == got["batches"] == 18, got
    assert got["rings seen"] == 6 and got["most rings"] <= 2 and got["rings after"] == 0, got


def test_a_batch_larger_than_the_slots_gets_a_larger_ring(client):
    got = client["growing"]
    assert got["equal"] and got["counts"] and got["in ring"] == got["batches"], got
    assert got["rings seen"] > 2 and got["most rings"] <= 2, got  # the smaller ones let go


def test_what_the_ring_cannot_hold_and_the_main_process_collate_as_default(client):
    for case in ("strings", "in process"):
        got = client[case]
        assert got["equal"] and got["batches"] == 6 and got["in ring"] == 0, (case, got)


def test_a_view_of_a_freed_batch_keeps_its_slot(client):
    assert client["view kept"] == {"equal": True, "in ring": True}


def test_an_epoch_left_early_leaves_the_next_one_whole(client):
    assert client["after a break"] == {"equal": True, "batches": 6}


def test_a_collate_fn_wrapping_the_ring_is_told_to_use_it_directly(client):
    assert "give BatchRing itself to the DataLoader as its collate_fn" in client["wrapped"]
