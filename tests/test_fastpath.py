"""The fast train path: fused augmentation, numpy ToTensor/Normalize, pooled buffers and
shared batches. Each piece must give what the plain path gives."""
import gc
import time

import cv2
import mxnet as mx
import numpy as np
import pytest
from mxnet.gluon.data.vision import transforms as VT

from gluon_data import SegmentationBatchify, SegmentationRecordDataset
from gluon_data.gluon import buffers
from gluon_data.gluon import loader as gd_loader
from gluon_data.arrays import transforms as T
from gluon_data.gluon.datasets import numpy_image_transform

from test_transforms import IGNORE, assert_aligned, painted_pair

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def smooth_pair(h=90, w=120):
    """A smooth image (interpolation differences stay small) and a blocky mask."""
    yy, xx = np.mgrid[0:h, 0:w]
    img = np.stack([xx * 255 // w, yy * 255 // h, (xx + yy) * 255 // (h + w)], -1)
    mask = (yy // 15 * 8 + xx // 15).astype(np.int32) % 21
    return img.astype(np.uint8), mask


def reference_scale_crop(img, mask, params, crop, fill=IGNORE):
    """gluoncv's order: flip the whole image, resize it all, pad, then crop."""
    flip, oh, ow, y1, x1 = params[:5]
    if flip:
        img, mask = img[:, ::-1], mask[:, ::-1]
    img = cv2.resize(np.ascontiguousarray(img), (ow, oh), interpolation=cv2.INTER_LINEAR)
    mask = cv2.resize(np.ascontiguousarray(mask), (ow, oh),
                      interpolation=cv2.INTER_NEAREST_EXACT)
    img, mask = T._pad_to(img, mask, crop, crop, 0, fill)
    return img[y1:y1 + crop, x1:x1 + crop], mask[y1:y1 + crop, x1:x1 + crop], mask


@pytest.mark.parametrize("base,crop", [(100, 64), (40, 64), (160, 48)])
def test_fused_scale_crop_matches_scale_then_crop(base, crop):
    img, mask = smooth_pair()
    h, w = mask.shape
    flips = 0
    for seed in range(40):
        t = T.RandomScaleCrop(base, crop, blur=0.0, seed=seed)
        params = t._draw(np.random.default_rng(seed), h, w)  # what t will draw
        out_i, out_m = t(img, mask)
        ref_i, ref_m, whole = reference_scale_crop(img, mask, params, crop)
        assert out_i.shape == ref_i.shape == (crop, crop, 3) and out_m.shape == (crop, crop)
        assert out_m.dtype == mask.dtype
        # Same geometry up to where a resampled pixel falls (< 1 source pixel apart): a
        # label differs from the reference only next to a class boundary.
        assert (out_m == ref_m).mean() > 0.85, seed
        assert ((out_m == IGNORE) == (ref_m == IGNORE)).all()  # padding exactly where due
        r, (y1, x1) = 2, params[3:5]
        padded = np.pad(whole, r, constant_values=-99)
        for y, x in zip(*np.nonzero(out_m != ref_m)):
            near = padded[y1 + y:y1 + y + 2 * r + 1, x1 + x:x1 + x + 2 * r + 1]
            assert out_m[y, x] in near, (seed, y, x)
        valid = ref_m != IGNORE
        assert np.abs(out_i.astype(int) - ref_i.astype(int))[valid].mean() < 3, seed
        flips += params[0]
    assert 5 < flips < 35  # both branches exercised


def test_fused_scale_crop_keeps_alignment_range_and_fill():
    for seed in range(20):
        img, mask = painted_pair(seed, h=60, w=80)
        t = T.RandomScaleCrop(70, 64, seed=seed, blur=0.0)
        out_i, out_m = t(img, mask)
        assert out_i.shape == (64, 64, 3) and out_m.shape == (64, 64)
        assert set(np.unique(out_m)) <= set(np.unique(mask)) | {IGNORE}
        assert_aligned(out_i, out_m)
    # uint8 masks keep their dtype; a fill that does not fit widens them
    img, mask = smooth_pair()
    out = T.RandomScaleCrop(40, 64, mask_fill=255, seed=0)(img, mask.astype(np.uint8))[1]
    assert out.dtype == np.uint8 and (out == 255).any()
    out = T.RandomScaleCrop(40, 64, mask_fill=-1, seed=0)(img, mask.astype(np.uint8))[1]
    assert out.dtype == np.int32 and (out == -1).any()


def test_fused_scale_crop_draws_cover_the_scale_range():
    img, mask = smooth_pair(100, 100)
    t = T.RandomScaleCrop(100, 32, seed=3)
    g = np.random.default_rng(3)
    sizes = [t._draw(g, 100, 100)[1] for _ in range(400)]
    assert min(sizes) < 60 and max(sizes) > 190 and all(50 <= s <= 200 for s in sizes)


# ------------------------------------------------------------ numpy ToTensor/Normalize
def test_numpy_image_transform_recognises_only_plain_to_tensor_normalize():
    tn = numpy_image_transform(VT.Compose([VT.ToTensor(), VT.Normalize(MEAN, STD)]))
    assert isinstance(tn, T.ToTensorNormalize) and np.allclose(tn.mean, MEAN)
    assert numpy_image_transform(VT.ToTensor()).channels == 1
    for other in (VT.Compose([VT.ToTensor(), VT.RandomFlipLeftRight()]),
                  VT.Compose([VT.Resize(8), VT.ToTensor()]), VT.Normalize(MEAN, STD),
                  lambda x: x, None):
        assert numpy_image_transform(other) is None
    hooked = VT.Compose([VT.ToTensor(), VT.Normalize(MEAN, STD)])
    hooked.register_forward_hook(lambda *a: None)
    assert numpy_image_transform(hooked) is None


@pytest.mark.parametrize("shape", [(37, 53, 3), (320, 320, 3), (5, 7, 1)])
def test_to_tensor_normalize_equals_gluon(shape):
    img = np.random.default_rng(0).integers(0, 256, shape, dtype=np.uint8)
    flat = img.reshape(-1)
    flat[:256] = np.arange(min(256, flat.size))  # every level where it fits
    mean, std = (MEAN, STD) if shape[2] == 3 else (0.5, 0.25)
    ref = VT.Compose([VT.ToTensor(), VT.Normalize(mean, std)])(mx.nd.array(img, dtype="uint8"))
    ours = T.ToTensorNormalize(mean, std).image(img)
    assert ours.dtype == np.float32 and ours.shape == ref.shape
    np.testing.assert_array_equal(ours, ref.asnumpy())  # uint8: bit-identical (lookup tables)
    out = np.full((shape[2],) + shape[:2], np.nan, np.float32)
    assert T.ToTensorNormalize(mean, std).image(img, out=out) is out
    np.testing.assert_array_equal(out, ref.asnumpy())  # written in place, all of it
    np.testing.assert_allclose(T.ToTensorNormalize(mean, std).image(img.astype(np.float32)),
                               ref.asnumpy(), rtol=0, atol=1e-6)


def test_dataset_fast_transform_gives_what_the_gluon_transform_gives(voc_rec):
    tf = VT.Compose([VT.ToTensor(), VT.Normalize(MEAN, STD)])
    for mode in ("val", "testval", "test"):
        fast = SegmentationRecordDataset(voc_rec, mode=mode, crop_size=24, transform=tf)
        plain = SegmentationRecordDataset(voc_rec, mode=mode, crop_size=24)
        assert fast._tensorize is not None
        for i in range(3):
            (fi, fm), (pi, pm) = fast[i], plain[i]
            assert isinstance(fi, mx.nd.NDArray) and fi.dtype == np.float32
            np.testing.assert_allclose(fi.asnumpy(), tf(pi).asnumpy(), rtol=0, atol=1e-6)
            if mode != "test":
                assert fm.dtype == np.int32
                np.testing.assert_array_equal(fm.asnumpy(), pm.asnumpy())


# ------------------------------------------------------------ pooled memory
def test_sample_pool_reuses_a_buffer_once_mxnet_frees_the_ndarray():
    pool = buffers.SamplePool()
    buf = pool.take((4, 5), np.float32)
    buf[...] = 7
    nd = pool.wrap(buf)
    assert pool.take((4, 5), np.float32) is not buf  # still in use
    assert (nd.asnumpy() == 7).all()
    del nd
    mx.nd.waitall()
    gc.collect()
    assert pool.take((4, 5), np.float32) is buf
    assert pool.take((4, 6), np.float32) is not buf


def test_host_view_reads_ndarrays_in_place():
    a = mx.nd.array(np.arange(12).reshape(3, 4), dtype="int32")
    v = buffers.host_view(a)
    np.testing.assert_array_equal(v, a.asnumpy())
    b = a + 1  # pending engine work is waited for
    np.testing.assert_array_equal(buffers.host_view(b), np.arange(12).reshape(3, 4) + 1)


class _Numbered(mx.gluon.data.Dataset):
    """Sample i is filled with i: any reuse of memory still in use shows up."""

    def __len__(self):
        return 96

    def __getitem__(self, i):
        return np.full((3, 8, 8), i, np.float32), np.full((8, 8), i, np.int32)


class _WithPoolSize:
    def __init__(self):
        self.inner = SegmentationBatchify(channels_first=True)

    def __call__(self, samples):
        imgs, masks = self.inner(samples)
        pool = buffers._get_pool()
        return imgs, masks, mx.nd.array([len(pool.segments), pool.fallbacks])


def _check(batch):
    imgs, masks = batch[0].asnumpy(), batch[1].asnumpy()
    ids = imgs[:, 0, 0, 0]
    assert (imgs == ids[:, None, None, None]).all() and (masks == ids[:, None, None]).all()
    return ids.astype(int).tolist()


@pytest.mark.slow
def test_worker_batches_reuse_shared_segments_and_never_overwrite_held_ones():
    loader = mx.gluon.data.DataLoader(_Numbered(), batch_size=8, shuffle=True, num_workers=2,
                                      batchify_fn=_WithPoolSize())
    # batches released as they are consumed: segments are reused. A release reaches the
    # worker asynchronously, so on a loaded machine a worker may find every segment still
    # out once and fall back (a fresh cpu_shared batch: slower, never wrong); without
    # reuse, each worker would fall back on every batch after its first six (~12 of 18).
    most_fallbacks = 0
    for _ in range(3):
        seen = []
        for batch in loader:
            seen += _check(batch)
            segments, fallbacks = batch[2].asnumpy().astype(int)
            assert segments <= 2 * buffers.SEGMENTS_PER_SIZE
            most_fallbacks = max(most_fallbacks, fallbacks)
        assert sorted(seen) == list(range(96))
    assert most_fallbacks <= 2
    held = []
    for _ in range(3):  # every batch kept alive: the pools run dry and fall back
        held += list(loader)
    gc.collect()
    assert max(int(b[2].asnumpy()[1]) for b in held) > 0
    ids = sum((_check(b) for b in held), [])
    assert sorted(ids) == sorted(list(range(96)) * 3)


# ------------------------------------------------------------ classification
def _recipe(*head, normalize=True):
    tail = [VT.ToTensor()] + ([VT.Normalize(MEAN, STD)] if normalize else [])
    return VT.Compose(list(head) + tail)


def test_numpy_classification_transform_recognises_the_usual_recipes():
    from gluon_data.gluon.datasets import numpy_classification_transform as rec
    t = rec(_recipe(VT.RandomResizedCrop(24), VT.RandomFlipLeftRight()))
    assert t.crop[0] == "random" and t.crop[1] == (24, 24) and t.flip
    assert rec(_recipe(VT.CenterCrop((20, 10)))).crop == ("center", (20, 10), 1)
    assert rec(_recipe(normalize=False)).crop is None
    for other in (_recipe(VT.Resize(32)), _recipe(VT.RandomResizedCrop(24, interpolation=10)),
                  _recipe(VT.CenterCrop(64, interpolation=2)),  # bicubic: 1/255 off MXNet's
                  _recipe(VT.RandomResizedCrop(24, interpolation=9)),
                  _recipe(VT.RandomFlipLeftRight(), VT.CenterCrop(8)),
                  VT.Compose([VT.CenterCrop(8), VT.RandomColorJitter(0.1), VT.ToTensor()])):
        assert rec(other) is None


@pytest.mark.parametrize("crop", [("center", (32, 32)), ("center", 32, 1), ["center", (8, 8), 1],
                                  ("random", (24, 24), (0.08, 1.0), (0.75, 1.33)),
                                  ("center", (8, 0), 1), ("center", (8, 8), 7)])
def test_a_malformed_crop_is_refused_when_the_transform_is_built(crop):
    """An interpolation left out was accepted and failed in OpenCV at the first image that
    needed a resize, naming no record."""
    with pytest.raises(ValueError, match=r"crop must be \('random', \(w, h\)"):
        T.ImageCropNormalize(crop)


def test_center_crop_fast_path_equals_gluon(cls_rec):
    from gluon_data import ImageRecordDataset
    for size in (16, (40, 30), 400):  # the last is larger than the images: scaled down
        tf = _recipe(VT.CenterCrop(size))
        ds = ImageRecordDataset(cls_rec)
        fast = ds.transform_first(tf)
        slow = mx.gluon.data.Dataset.transform_first(ds, tf)  # Gluon's own path
        assert fast._fast_first is not None
        for i in range(len(ds)):
            (a, la), (b, lb) = fast[i], slow[i]
            assert a.shape == b.shape and a.dtype == np.float32 and la == lb
            # OpenCV inside libmxnet and the cv2 wheel may round a resized pixel differently
            diff = np.abs(a.asnumpy() - b.asnumpy())
            assert diff.max() <= 1.01 / 255 / min(STD) and diff.mean() < 1e-3


def test_random_resized_crop_is_a_resized_region_and_repeats_with_a_seed():
    img = np.random.default_rng(0).integers(0, 256, (60, 80, 3), dtype=np.uint8)
    crop = ("random", (32, 24), (0.08, 1.0), (3 / 4, 4 / 3), 1)
    a = T.ImageCropNormalize(crop, flip=False, seed=5)
    b = T.ImageCropNormalize(crop, flip=False, seed=5)
    g = np.random.default_rng(5)  # the draws `a` will make
    outs = []
    for _ in range(6):
        x0, y0, w, h = a._draw_crop(g, 60, 80)
        want = cv2.resize(img[y0:y0 + h, x0:x0 + w], (32, 24), interpolation=cv2.INTER_LINEAR)
        got = a(img)
        assert got.shape == (3, 24, 32)
        np.testing.assert_allclose(got, want.transpose(2, 0, 1) / 255.0, atol=1e-6)
        np.testing.assert_array_equal(got, b(img))
        outs.append(got.tobytes())
    assert len(set(outs)) == 6
    flips = T.ImageCropNormalize(None, flip=True, seed=1)
    seen = {flips(img).tobytes() for _ in range(20)}
    assert len(seen) == 2  # mirrored or not, nothing else


def _random_size_crop_draws(g, h, w, area, ratio):
    """``mx.image.random_size_crop``'s arithmetic on a numpy generator, as the fast path
    wrote it before its draws were made cheaper: the boxes it must keep drawing."""
    area = (area, 1.0) if np.isscalar(area) else area
    for _ in range(10):
        target_area = g.uniform(area[0], area[1]) * h * w
        new_ratio = np.exp(g.uniform(np.log(ratio[0]), np.log(ratio[1])))
        new_w = int(round(np.sqrt(target_area * new_ratio)))
        new_h = int(round(np.sqrt(target_area / new_ratio)))
        if new_w <= w and new_h <= h:
            return (int(g.integers(0, w - new_w + 1)), int(g.integers(0, h - new_h + 1)),
                    new_w, new_h)
    return None


@pytest.mark.parametrize("area,ratio", [((0.08, 1.0), (3 / 4, 4 / 3)), (0.5, (0.5, 2.0)),
                                        ((0.01, 1), (1 / 3, 3))])
def test_random_resized_crop_draws_the_boxes_of_mxnets_arithmetic(area, ratio):
    """The same boxes (and the same generator state after them) as ``g.uniform`` /
    ``np.log`` / ``np.sqrt`` give, over many image sizes and seeds, the fallback included."""
    crop = T.ImageCropNormalize(("random", (224, 224), area, ratio, 1))
    sizes = np.random.default_rng(3).integers(1, 1200, (3000, 2))
    fallbacks = 0
    for seed, (h, w) in enumerate(sizes.tolist()):
        g1, g2 = np.random.default_rng(seed), np.random.default_rng(seed)
        want = _random_size_crop_draws(g1, h, w, area, ratio)
        assert crop._draw_crop(g2, h, w) == want, (seed, h, w)
        assert g1.random() == g2.random(), (seed, h, w)  # as many draws taken
        fallbacks += want is None
    assert 0 < fallbacks < len(sizes)  # thin images reach the centre-crop fallback


def test_unrecognised_transform_first_is_gluons(cls_rec):
    from gluon_data import ImageRecordDataset
    ds = ImageRecordDataset(cls_rec)
    tf = VT.Compose([VT.Resize(16), VT.ToTensor()])
    lazy = ds.transform_first(tf)
    assert not isinstance(lazy, ImageRecordDataset)
    np.testing.assert_array_equal(lazy[0][0].asnumpy(), tf(ds[0][0]).asnumpy())


@pytest.mark.slow
def test_classification_fast_path_through_workers_keeps_labels(cls_rec):
    from gluon_data import ImageRecordDataset, StackBatchify
    ds = ImageRecordDataset(cls_rec)
    train = ds.transform_first(_recipe(VT.RandomResizedCrop(20), VT.RandomFlipLeftRight()))
    loader = mx.gluon.data.DataLoader(train, batch_size=4, num_workers=2,
                                      batchify_fn=StackBatchify())
    labels = []
    for imgs, lab in loader:
        assert imgs.shape[1:] == (3, 20, 20) and imgs.dtype == np.float32
        labels += lab.asnumpy().tolist()
    assert labels == [ds[i][1] for i in range(len(ds))]


def test_sample_pool_is_bounded_by_bytes_not_by_shape():
    pool = buffers.SamplePool(max_bytes=10_000)
    for k in range(12):  # ever-new shapes, as full-size testval images are
        nd = pool.wrap(pool.take((10, 40 + 10 * k), np.float32))
        del nd
        mx.nd.waitall()
        gc.collect()
        assert pool.held <= 10_000
    assert sum(len(v) for v in pool._free.values()) < 12


def test_segment_pool_shares_segments_across_sizes_and_stays_in_budget():
    pool = buffers._Pool()
    big = pool.acquire(1000)
    big.local = False  # released
    small = pool.acquire(600)  # fits the free 1000-byte segment (at most 2x): reused
    assert small is big
    small.local = False
    tiny = pool.acquire(100)  # too small to waste a 1000-byte segment on: a new one
    assert tiny is not big and tiny.capacity == 100
    tiny.local = False
    held = [pool.acquire(1000) for _ in range(buffers.SEGMENTS_PER_SIZE)]
    assert held[0] is big and all(s is not None and s.capacity == 1000 for s in held)
    # the budget is SEGMENTS_PER_SIZE x the largest batch: the free 100-byte one made room
    assert tiny not in pool.segments and tiny.counts is None
    assert sum(s.capacity for s in pool.segments) == buffers.SEGMENTS_PER_SIZE * 1000
    assert pool.acquire(1000) is None and pool.fallbacks == 1  # all busy, no room: fall back
    for s in pool.segments:
        s.local = False
    huge = pool.acquire(4000)  # a new largest size: old free segments make room
    assert huge is not None
    assert sum(s.capacity for s in pool.segments) <= buffers.SEGMENTS_PER_SIZE * 4000


@pytest.mark.slow
def test_variable_size_batches_through_workers_equal_the_in_process_ones(voc_rec):
    tf = VT.Compose([VT.ToTensor(), VT.Normalize(MEAN, STD)])
    ds = SegmentationRecordDataset(voc_rec, mode="testval", transform=tf)
    batchify = SegmentationBatchify(channels_first=True)
    want = [(b[0].asnumpy(), b[1].asnumpy())
            for b in mx.gluon.data.DataLoader(ds, batch_size=3, batchify_fn=batchify)]
    loader = mx.gluon.data.DataLoader(ds, batch_size=3, num_workers=2, batchify_fn=batchify)
    for _ in range(3):  # padded shapes differ per batch: segments are shared across sizes
        got = [(b[0].asnumpy(), b[1].asnumpy()) for b in loader]
        assert len(got) == len(want)
        for (gi, gm), (wi, wm) in zip(got, want):
            np.testing.assert_array_equal(gm, wm)
            np.testing.assert_allclose(gi, wi, atol=1e-6)


@pytest.mark.slow
def test_loops_that_break_early_never_corrupt_and_ours_releases_the_rest():
    from gluon_data import DataLoader
    for loader_cls in (mx.gluon.data.DataLoader, DataLoader):
        loader = loader_cls(_Numbered(), batch_size=8, shuffle=True, num_workers=2,
                            batchify_fn=_WithPoolSize())
        for _ in range(4):  # each break leaves prefetched batches unread
            for k, batch in enumerate(loader):
                _check(batch)
                if k == 1:
                    break
            del batch
            gc.collect()
        if loader_cls is DataLoader:
            # wait (bounded) until every abandoned batch has finished and been released: on
            # a loaded machine a fixed sleep was sometimes too short, and a batch still in
            # flight holds its segment through the passes below
            deadline = time.monotonic() + 60
            while gd_loader._abandoned and time.monotonic() < deadline:
                gd_loader._drain_abandoned()
                time.sleep(0.05)
            assert not gd_loader._abandoned, "abandoned batches never finished"
            mx.nd.waitall()
            gc.collect()
        else:
            time.sleep(0.5)  # let the abandoned batches finish
        fallbacks = []
        for _ in range(2):
            seen = []
            for batch in loader:
                seen += _check(batch)
                fallbacks.append(int(batch[2].asnumpy()[1]))
            assert sorted(seen) == list(range(96))
        if loader_cls is DataLoader:
            # drained: every segment came back. As in the test above, a release reaches the
            # worker asynchronously, so on a loaded machine a worker may fall back once or
            # twice; with the abandoned batches never released they fall back ~26 times
            assert max(fallbacks) <= 2


class _PooledNumbered(_Numbered):
    """Like _Numbered, but its samples live in the sample pool, as the datasets' fast paths'
    do: in a worker, once a batch was seen, each one is a slot of a staged batch segment."""

    def __getitem__(self, i):
        img = buffers.samples.take((3, 8, 8), np.float32)
        img[...] = i
        mask = buffers.samples.take((8, 8), np.int32)
        mask[...] = i
        return buffers.samples.wrap(img), buffers.samples.wrap(mask)


class _WithAdopted:
    """The batchify (ours, or the plain stack), then the worker's adopted/fallback counts."""

    def __init__(self, stack=False):
        from gluon_data import StackBatchify
        self.inner = StackBatchify() if stack else SegmentationBatchify(channels_first=True)

    def __call__(self, samples):
        imgs, masks = self.inner(samples)
        pool = buffers._get_pool()
        return imgs, masks, mx.nd.array([pool.adopted, pool.fallbacks])


@pytest.mark.slow
@pytest.mark.parametrize("batchify", ["segmentation", "stack"])
def test_staged_samples_become_the_batch_without_a_copy_and_are_never_overwritten(batchify):
    fn = _WithAdopted(stack=batchify == "stack")
    loader = mx.gluon.data.DataLoader(_PooledNumbered(), batch_size=8, shuffle=True,
                                      num_workers=2, batchify_fn=fn)
    adopted = 0
    for _ in range(3):  # released as consumed: batches after each worker's first are staged
        seen = []
        for batch in loader:
            seen += _check(batch)
            adopted = max(adopted, int(batch[2].asnumpy()[0]))
        assert sorted(seen) == list(range(96))
    assert adopted >= 8  # two fields per batch; most of each worker's 18 batches
    held = []
    for _ in range(3):  # every batch kept alive: staging runs out of segments, still right
        held += list(loader)
    gc.collect()
    ids = sum((_check(b) for b in held), [])
    assert sorted(ids) == sorted(list(range(96)) * 3)
    # in the main process nothing is staged: samples are plain pooled buffers
    img, mask = _PooledNumbered()[5]
    assert (img.asnumpy() == 5).all() and buffers._get_pool().adopted == 0
