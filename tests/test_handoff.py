"""How samples and batches travel from a DataLoader worker to the main process
(gluon_data/gluon/buffers.py): staged samples as rows of one NDArray over their segment, small
batches by value, host views without copies; values, dtypes, shapes and contexts as before."""
import gc
import pickle
from multiprocessing import reduction

import numpy as np
import pytest

mx = pytest.importorskip("mxnet")

from gluon_data.gluon import buffers  # noqa: E402
from gluon_data.gluon.batchify import StackBatchify  # noqa: E402

N = 64


class _Samples(mx.gluon.data.Dataset):
    """Sample i: a pooled (3, 8, 8) float32 image filled with i, and the float label i / 2,
    as the classification fast path makes them."""

    def __len__(self):
        return N

    def __getitem__(self, i):
        img = buffers.samples.take((3, 8, 8), np.float32)
        img[...] = i
        return buffers.samples.wrap(img), i / 2


#: samples of earlier batches a worker keeps alive (checked before every batch)
_kept: list = []


class _Checking:
    """StackBatchify, keeping the samples of the last batches alive in the worker: a sample
    whose memory was reused would change. Adds [bad samples, adopted, labels by value]."""

    def __call__(self, samples):
        bad = sum(int(not (s.asnumpy() == want).all()) for s, want in _kept)
        imgs, labels = StackBatchify()(samples)
        _kept.extend((s[0], s[0].asnumpy()) for s in samples)
        del _kept[:-3 * len(samples)]
        pool = buffers._get_pool()
        return imgs, labels, mx.nd.array([bad, pool.adopted,
                                          isinstance(labels, buffers._ValueArray)])


def _want(batch_ids):
    return [np.float64(i / 2) for i in batch_ids]


@pytest.mark.slow
def test_worker_batches_equal_in_process_ones_and_held_samples_keep_their_values():
    loader = mx.gluon.data.DataLoader(_Samples(), batch_size=8, shuffle=True, num_workers=2,
                                      batchify_fn=_Checking())
    plain = next(iter(mx.gluon.data.DataLoader(_Samples(), batch_size=8,
                                               batchify_fn=StackBatchify())))
    adopted = 0
    for _ in range(3):
        seen = []
        for imgs, labels, info in loader:
            bad, n_adopted, by_value = info.asnumpy().astype(int)
            assert bad == 0 and by_value == 1
            adopted = max(adopted, n_adopted)
            ids = imgs.asnumpy()[:, 0, 0, 0].astype(int)
            assert (imgs.asnumpy() == ids[:, None, None, None]).all()
            np.testing.assert_array_equal(labels.asnumpy(), ids / 2)
            for got, ref in ((imgs, plain[0]), (labels, plain[1])):
                assert (got.dtype, got.shape[1:], got.context) == \
                    (ref.dtype, ref.shape[1:], ref.context)
            seen += ids.tolist()
        assert sorted(seen) == list(range(N))
    assert adopted >= 4  # staged samples became batches without a copy
    held = [b for _ in range(2) for b in loader]  # every batch kept alive: still right
    gc.collect()
    for imgs, labels, info in held:
        ids = imgs.asnumpy()[:, 0, 0, 0].astype(int)
        assert (imgs.asnumpy() == ids[:, None, None, None]).all()
        np.testing.assert_array_equal(labels.asnumpy(), ids / 2)
        assert int(info.asnumpy()[0]) == 0


def test_staged_slots_are_rows_of_one_ndarray_and_hold_their_segment():
    pool = buffers._Pool()
    key = ((2, 3), np.dtype(np.float32).str)
    pool.plans[key] = 4
    slots = [pool.stage(key) for _ in range(4)]
    for k, s in enumerate(slots):
        s[...] = k
    rows = [pool.slot_array(s) for s in slots]
    seg = pool.staging[key][0]
    assert all(type(r) is mx.nd.NDArray for r in rows)
    for k, r in enumerate(rows):
        assert r.shape == (2, 3) and r.dtype == np.float32 and r.context == mx.cpu()
        assert (r.asnumpy() == k).all()
        assert buffers.host_view(r).ctypes.data == slots[0].ctypes.data + k * 24
    assert pool.slot_array(np.zeros((2, 3), np.float32)) is None  # not a slot
    batch = pool.adopt([buffers.host_view(r) for r in rows])
    assert batch is not None and (batch.asnumpy()[:, 0, 0] == [0, 1, 2, 3]).all()
    del slots, batch
    gc.collect()
    assert not seg.free()  # a row still refers to the segment
    del rows, r, s
    mx.nd.waitall()
    gc.collect()
    assert seg.free()


def test_small_batches_pickle_by_value_and_rebuild_as_plain_cpu_ndarrays():
    host = np.arange(16, dtype=np.float64)
    nd = mx.nd.from_numpy(host.view(), zero_copy=True, array_cls=buffers._ValueArray)
    nd._gd_host = host
    nd += 1  # pending engine work is finished before pickling
    out = pickle.loads(reduction.ForkingPickler.dumps(nd))
    assert type(out) is mx.nd.NDArray and out.context == mx.cpu()
    assert out.dtype == np.float64 and out.shape == (16,)
    np.testing.assert_array_equal(out.asnumpy(), np.arange(16) + 1)


def test_host_view_is_a_writable_view_in_place():
    a = mx.nd.zeros((4, 3), dtype="int32")
    v = buffers.host_view(a[2])
    assert v.flags.writeable and v.shape == (3,) and v.dtype == np.int32
    v[...] = 7
    np.testing.assert_array_equal(a.asnumpy()[2], [7, 7, 7])
    np.testing.assert_array_equal(a.asnumpy()[[0, 1, 3]], 0)
    assert buffers.host_view(mx.nd.array(np.zeros((0, 3)))).shape == (0, 3)
    csr = mx.nd.sparse.zeros("csr", (2, 2))
    np.testing.assert_array_equal(buffers.host_view(csr), np.zeros((2, 2)))


def test_the_main_process_maps_each_worker_segment_once_and_lets_it_go():
    """A segment's descriptor crosses with its first batch only; later batches from it name
    it, and the main process finds its mapping again. Once the workers are gone, so are the
    mappings."""
    from gluon_data.storage import sharedmem
    places = []
    rebuild = buffers._rebuild  # (what unpickles a segment's batch: looked up by name)

    def record(place, *args):
        places.append((place[1], place[4] is not None))
        return rebuild(place, *args)

    loader = mx.gluon.data.DataLoader(_Samples(), batch_size=8, shuffle=True, num_workers=2,
                                      batchify_fn=StackBatchify())
    plain = {int(i): v for i, v in enumerate(mx.nd.stack(*[_Samples()[i][0]
                                                           for i in range(N)]).asnumpy())}
    buffers._rebuild = record
    try:
        for _ in range(3):
            for imgs, labels in loader:
                ids = (labels.asnumpy() * 2).astype(int)
                for k, i in enumerate(ids):
                    np.testing.assert_array_equal(imgs[k].asnumpy(), plain[int(i)])
    finally:
        buffers._rebuild = rebuild
    segments = {token for token, _ in places}
    assert len(places) == 3 * N // 8 > len(segments)  # segments reused batch after batch
    assert sum(handed for _, handed in places) == len(segments)  # a descriptor once each
    assert 0 < sharedmem.mapped_count("gluon") <= len(segments)
    del loader
    gc.collect()
    sharedmem.let_go()  # (as before any fork): the workers have ended
    assert sharedmem.mapped_count("gluon") == 0
