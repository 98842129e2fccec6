"""Joint transforms, gluoncv modes and batchify: alignment, ranges, seeding, equivalence."""
import multiprocessing
import os

import mxnet as mx
import numpy as np
import pytest

from gluon_data import MultiSizeBatchify, SegmentationBatchify, SegmentationLMDBDataset, SegmentationRecordDataset
from gluon_data import convert
from gluon_data.arrays import transforms as T
from gluon_data.convert.sample import synthetic_pair

IGNORE = -1


def painted_pair(seed=0, h=37, w=53):
    """A mask, and an image whose colour encodes the mask id: alignment is checkable."""
    _, mask = synthetic_pair(np.random.default_rng(seed), h, w, num_classes=6, boundary=False)
    mask = mask.astype(np.int32)
    img = np.stack([mask * 40, 255 - mask * 40, np.full_like(mask, 7)], -1).astype(np.uint8)
    return img, mask


def assert_aligned(img, mask):
    """Where a pixel's 7x7 mask neighbourhood is one class, the image colour must match it
    (bilinear reads source pixels up to ~2 output pixels away when shrinking 2x)."""
    r = 3
    m = np.pad(mask, r, constant_values=-999)  # frame-edge pixels are never "interior"
    uniform = np.ones(mask.shape, bool)
    for dy in range(2 * r + 1):
        for dx in range(2 * r + 1):
            uniform &= m[dy:dy + mask.shape[0], dx:dx + mask.shape[1]] == mask
    inside = uniform & (mask != IGNORE)
    assert inside.sum() > 0
    want = np.clip(mask * 40, 0, 255)
    assert np.abs(img[..., 0].astype(int) - want)[inside].max() <= 1
    assert np.abs(img[..., 1].astype(int) - (255 - want))[inside].max() <= 1


GEOMETRIC = [T.RandomHorizontalFlip(p=1.0), T.RandomScale(base_size=48),
             T.RandomCrop(40), T.RandomCrop(80), T.RandomRotation(25, p=1.0),
             T.ResizeShort(30), T.CenterCrop(24), T.Resize((20, 70)),
             T.ColorJitter(), T.RandomGaussianBlur(p=0.0)]


def _transform_id(t):
    """A test id that is the same in every process (parallel workers compare their ids): the
    transform's repr, or its class name where the repr is the default (an address)."""
    return type(t).__name__ if type(t).__repr__ is object.__repr__ else repr(t)


@pytest.mark.parametrize("t", GEOMETRIC, ids=_transform_id)
def test_every_transform_keeps_image_and_mask_aligned(t):
    for seed in range(5):
        img, mask = painted_pair(seed)
        if hasattr(t, "reseed"):
            t.reseed(seed)
        out_i, out_m = t(img, mask)
        assert out_i.shape[:2] == out_m.shape and out_i.dtype == np.uint8
        assert set(np.unique(out_m)) <= set(np.unique(mask)) | {IGNORE}
        assert_aligned(out_i, out_m)


def test_photometric_transforms_touch_the_image_only():
    img, mask = painted_pair()
    for t in (T.ColorJitter(0.5, 0.5, 0.5, seed=1), T.RandomGaussianBlur(p=1.0, seed=1)):
        out_i, out_m = t(img, mask)
        assert out_m is mask or np.array_equal(out_m, mask)
        assert not np.array_equal(out_i, img)


def test_padding_uses_the_ignore_value_never_a_class():
    img, mask = painted_pair(h=10, w=12)
    out_i, out_m = T.RandomCrop(16, image_fill=0, mask_fill=IGNORE, seed=0)(img, mask)
    assert out_m.shape == (16, 16)
    assert (out_m[10:, :] == IGNORE).all() and (out_m[:, 12:] == IGNORE).all()
    assert (out_i[10:, :] == 0).all()
    rot_i, rot_m = T.RandomRotation(45, p=1.0, seed=0)(img, mask)
    assert (rot_m == IGNORE).any()


def pipeline(seed):
    return T.Compose([T.RandomHorizontalFlip(), T.RandomScale(48), T.RandomCrop(32),
                      T.RandomRotation(10, p=0.5), T.ColorJitter(0.2, 0.2, 0.2),
                      T.RandomGaussianBlur()], seed=seed)


def run_pipeline(t, n=8):
    img, mask = painted_pair()
    return [t(img, mask) for _ in range(n)]


def test_a_fixed_seed_repeats_exactly_and_draws_differ():
    a, b, c = run_pipeline(pipeline(5)), run_pipeline(pipeline(5)), run_pipeline(pipeline(6))
    assert all(np.array_equal(x[0], y[0]) and np.array_equal(x[1], y[1]) for x, y in zip(a, b))
    assert not all(np.array_equal(x[1], y[1]) for x, y in zip(a, c))
    assert len({x[1].tobytes() for x in a}) > 1  # successive draws (epochs) differ


def _child(t, q):
    img, mask = painted_pair()
    q.put([t(img, mask)[1].tobytes() for _ in range(4)])


def test_forked_workers_draw_different_crops():
    """Workers inherit identical RNG state through fork; ours must not repeat each other."""
    t = pipeline(11)
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    procs = [ctx.Process(target=_child, args=(t, q)) for _ in range(2)]
    for p in procs:
        p.start()
    out = [q.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    assert out[0] != out[1]


def test_transforms_pickle():
    import pickle
    t = pickle.loads(pickle.dumps(pipeline(3)))
    a, b = run_pipeline(t, 3), run_pipeline(pipeline(3), 3)
    assert all(np.array_equal(x[1], y[1]) for x, y in zip(a, b))


def test_to_tensor_normalize_matches_gluon():
    from mxnet.gluon.data.vision import transforms as VT
    img, mask = painted_pair()
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    ours, m = T.ToTensorNormalize(mean, std)(img, mask)
    ref = VT.Compose([VT.ToTensor(), VT.Normalize(mean, std)])(mx.nd.array(img, dtype=np.uint8))
    np.testing.assert_allclose(ours, ref.asnumpy(), rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- gluoncv modes
@pytest.fixture(scope="module")
def voc_val_rec(voc_root, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("modes") / "v.rec")
    return convert(voc_root, out, "voc", split="val,train").outputs


def test_testval_equals_gluoncv_and_val_has_same_shapes_and_crops(voc_root, voc_val_rec):
    from gluoncv.data import VOCSegmentation
    parent = os.path.dirname(voc_root)  # gluoncv wants the folder holding VOC2012/
    for mode in ("testval", "val"):
        ref = VOCSegmentation(root=parent, split="val", mode=mode, crop_size=24)
        ours = SegmentationRecordDataset(voc_val_rec["val"], mode=mode, crop_size=24)
        assert len(ref) == len(ours) == 4
        for i in range(len(ref)):
            (gi, gm), (oi, om) = ref[i], ours[i]
            assert gi.shape == oi.shape and gm.shape == om.shape and om.dtype == np.int32
            np.testing.assert_array_equal(om.asnumpy(), gm.asnumpy())  # same pixels, crops
            diff = np.abs(gi.asnumpy().astype(int) - oi.asnumpy().astype(int))
            if mode == "testval":
                assert diff.max() <= 2  # JPEG decoders (PIL vs OpenCV) may round differently
            else:
                assert diff.mean() < 8  # PIL's bilinear antialiases when shrinking


def test_train_mode_gives_fixed_crops_and_repeats_with_a_seed(voc_val_rec):
    from mxnet.gluon.data.vision import transforms as VT
    tf = VT.Compose([VT.ToTensor(), VT.Normalize((.485, .456, .406), (.229, .224, .225))])
    a = SegmentationRecordDataset(voc_val_rec["train"], mode="train", base_size=40,
                                  crop_size=32, transform=tf, seed=1)
    b = SegmentationRecordDataset(voc_val_rec["train"], mode="train", base_size=40,
                                  crop_size=32, transform=tf, seed=1)
    for i in range(len(a)):
        (ia, ma), (ib, mb) = a[i], b[i]
        assert ia.shape == (3, 32, 32) and ia.dtype == np.float32 and ma.shape == (32, 32)
        np.testing.assert_array_equal(ma.asnumpy(), mb.asnumpy())
        assert set(np.unique(ma.asnumpy())) <= set(range(21)) | {-1}
    assert a.num_class == a.NUM_CLASS == 21 and a.pred_offset == 0
    img, name = SegmentationRecordDataset(voc_val_rec["train"], mode="test")[3]
    assert img.shape[2] == 3 and name.endswith(".jpg")  # the source image's name (gluoncv)


def test_train_mode_same_for_lmdb_and_rec(voc_root, voc_val_rec, tmp_path):
    out = str(tmp_path / "m.lmdb")
    convert(voc_root, out, "voc", split="train")
    a = SegmentationLMDBDataset(out, "train", mode="train", base_size=40, crop_size=32, seed=4)
    b = SegmentationRecordDataset(voc_val_rec["train"], mode="train", base_size=40,
                                  crop_size=32, seed=4)
    for i in range(len(a)):
        np.testing.assert_array_equal(a[i][1].asnumpy(), b[i][1].asnumpy())


def test_bad_mode_and_crop_size_are_clear_errors(voc_val_rec):
    with pytest.raises(ValueError, match="valid modes: train, val, testval, test"):
        SegmentationRecordDataset(voc_val_rec["val"], mode="training")
    with pytest.raises(ValueError, match="every crop would be mostly padding"):
        SegmentationRecordDataset(voc_val_rec["val"], mode="train", base_size=100,
                                  crop_size=480)
    with pytest.raises(ValueError, match="positive"):
        SegmentationRecordDataset(voc_val_rec["val"], mode="val", crop_size=0)


# ---------------------------------------------------------------- batchify
def test_batchify_stacks_pads_and_keeps_lists(voc_val_rec):
    ds = SegmentationRecordDataset(voc_val_rec["val"], mode="testval")
    samples = [ds[i] for i in range(3)]
    imgs, masks = SegmentationBatchify()(samples)
    h = max(s[1].shape[0] for s in samples)
    w = max(s[1].shape[1] for s in samples)
    assert imgs.shape == (3, h, w, 3) and masks.shape == (3, h, w)
    for k, (img, mask) in enumerate(samples):
        mh, mw = mask.shape
        np.testing.assert_array_equal(masks[k, :mh, :mw].asnumpy(), mask.asnumpy())
        assert (masks[k].asnumpy()[mh:, :] == -1).all() and (imgs[k].asnumpy()[mh:] == 0).all()
    lists = MultiSizeBatchify()(samples)
    assert [x.shape for x in lists[0]] == [s[0].shape for s in samples]
    test_ds = SegmentationRecordDataset(voc_val_rec["val"], mode="test")
    tests = [test_ds[i] for i in range(2)]
    assert MultiSizeBatchify()(tests)[1] == [test_ds.name(0), test_ds.name(1)]
    assert all(n.endswith(".jpg") for n in MultiSizeBatchify()(tests)[1])
    with pytest.raises(TypeError, match=r"these samples are \(image, name\), as mode='test' "
                                        r"gives them: batch them with MultiSizeBatchify"):
        SegmentationBatchify()(tests)  # (was an IndexError on the name's shape)


@pytest.mark.slow
def test_train_mode_through_dataloader_workers(voc_val_rec):
    ds = SegmentationRecordDataset(voc_val_rec["train"], mode="train", base_size=40,
                                   crop_size=32, seed=0)
    loader = mx.gluon.data.DataLoader(ds, batch_size=4, shuffle=True, num_workers=2,
                                      batchify_fn=SegmentationBatchify())
    crops = []
    for _ in range(2):
        for imgs, masks in loader:
            assert imgs.shape[1:] == (32, 32, 3) and masks.shape[1:] == (32, 32)
            crops.extend(m.tobytes() for m in masks.asnumpy())
    assert len(crops) == 2 * len(ds) and len(set(crops)) > len(ds)  # epochs differ
