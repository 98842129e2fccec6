"""output="uint8" datasets and the consumer's InputNormalize: uint8 batches that normalise to
exactly the float32 path's batches."""
import mxnet as mx
import numpy as np
import pytest
from mxnet.gluon import nn
from mxnet.gluon.data.vision import transforms as VT

import gluon_data
from gluon_data import (DataLoader, ImageRecordDataset, InputNormalize, SampleKey,
                        SegmentationBatchify, SegmentationDataset, SegmentationLMDBDataset,
                        SegmentationRecordDataset, StackBatchify)
from gluon_data.convert import convert
from gluon_data.gluon.datasets import open_segmentation
from gluon_data.stores.base import open_store

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def _tf(normalize=True, *head):
    return VT.Compose(list(head) + [VT.ToTensor()]
                      + ([VT.Normalize(MEAN, STD)] if normalize else []))


@pytest.fixture(scope="module")
def voc_lmdb(voc_root, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("voc_lmdb") / "voc.lmdb")
    convert(voc_root, out, "voc", split="trainval")
    return out


def test_train_uint8_batches_through_workers_normalise_to_the_float32_batches(voc_rec):
    kw = dict(mode="train", base_size=40, crop_size=32, seed=7)
    fds = SegmentationRecordDataset(voc_rec, transform=_tf(), **kw)
    uds = SegmentationRecordDataset(voc_rec, output="uint8", **kw)
    assert uds.output == "uint8"
    batchify = SegmentationBatchify(channels_first=True)
    norm = InputNormalize(MEAN, STD)
    norm.hybridize()
    fl, ul = (DataLoader(d, batch_size=4, num_workers=2, batchify_fn=batchify)
              for d in (fds, uds))
    seen = 0
    for (fi, fm), (ui, um) in zip(fl, ul):
        assert ui.dtype == np.uint8 and ui.shape == (4, 3, 32, 32)
        assert fi.dtype == np.float32 and fi.shape == ui.shape
        out = norm(ui.as_in_context(mx.cpu()))
        assert out.dtype == np.float32
        np.testing.assert_allclose(out.asnumpy(), fi.asnumpy(), rtol=0, atol=1e-6)
        assert um.dtype == np.int32 == fm.dtype
        np.testing.assert_array_equal(um.asnumpy(), fm.asnumpy())
        seen += ui.shape[0]
    assert seen == len(uds)
    # another epoch: the same seeded draws in both paths, other than epoch 0's
    key = SampleKey(3, epoch=5)
    a, b = fds[key], uds[key]
    np.testing.assert_allclose(norm(b[0].expand_dims(0))[0].asnumpy(), a[0].asnumpy(),
                               rtol=0, atol=1e-6)
    assert not np.array_equal(uds[SampleKey(3, epoch=0)][0].asnumpy(), b[0].asnumpy())


@pytest.mark.parametrize("mode", ["val", "testval", "test"])
def test_other_modes_and_views_give_chw_uint8_of_the_float32_samples(voc_rec, voc_lmdb, mode):
    fds = SegmentationRecordDataset(voc_rec, transform=_tf(), mode=mode, crop_size=24)
    views = [SegmentationRecordDataset(voc_rec, mode=mode, crop_size=24, output="uint8"),
             SegmentationLMDBDataset(voc_lmdb, split="trainval", mode=mode, crop_size=24,
                                     output="uint8"),
             open_segmentation(voc_rec, mode=mode, crop_size=24, output="uint8"),
             SegmentationDataset(open_store(voc_rec), mode=mode, crop_size=24,
                                 transform=_tf(normalize=False), output="uint8")]
    norm = InputNormalize(MEAN, STD)
    for i in range(3):
        fi, fm = fds[i]
        for ds in views:
            ui, um = ds[i]
            assert ui.dtype == np.uint8 and ui.shape == fi.shape
            np.testing.assert_allclose(norm(ui.expand_dims(0))[0].asnumpy(), fi.asnumpy(),
                                       rtol=0, atol=1e-6)
            if mode == "test":
                assert um == fm
            else:
                np.testing.assert_array_equal(um.asnumpy(), fm.asnumpy())


def test_a_uint8_user_transform_runs_before_the_layout(voc_rec):
    flip = SegmentationRecordDataset(voc_rec, mode="val", crop_size=24, output="uint8",
                                     transform=lambda img: mx.nd.flip(img, axis=1))
    plain = SegmentationRecordDataset(voc_rec, mode="val", crop_size=24)
    got, want = flip[2][0].asnumpy(), plain[2][0].asnumpy()
    assert got.shape == (3, 24, 24)
    np.testing.assert_array_equal(got, want[:, ::-1].transpose(2, 0, 1))


def test_misuse_is_a_clear_error(voc_rec):
    with pytest.raises(ValueError, match="normalises"):
        SegmentationRecordDataset(voc_rec, mode="train", base_size=40, crop_size=32,
                                  transform=_tf(), output="uint8")
    with pytest.raises(ValueError, match="unknown output"):
        SegmentationRecordDataset(voc_rec, mode="val", output="float16")
    with pytest.raises(ValueError, match="in a mode"):
        SegmentationRecordDataset(voc_rec, output="uint8")
    tofloat = SegmentationRecordDataset(voc_rec, mode="val", crop_size=24, output="uint8",
                                        transform=lambda img: img.astype("float32") / 255)
    with pytest.raises(ValueError, match="must return an HxWxC uint8 image"):
        tofloat[0]


@pytest.mark.filterwarnings("ignore:Cannot decide type")  # the imported block's uint8 input
def test_input_normalize_is_gluons_to_tensor_normalize_hybridized_and_in_a_model(tmp_path):
    rng = np.random.RandomState(0)
    x = rng.randint(0, 256, (3, 3, 9, 11)).astype(np.uint8)
    gluon = _tf()
    want = np.stack([gluon(mx.nd.array(im.transpose(1, 2, 0), dtype="uint8")).asnumpy()
                     for im in x])
    norm = InputNormalize(MEAN, STD)
    lookup = norm(mx.nd.array(x, dtype="uint8")).asnumpy()  # a CPU NDArray: the tables
    norm.hybridize()  # the operators, as on a GPU
    ops = norm(mx.nd.array(x, dtype="uint8")).asnumpy()
    assert lookup.dtype == ops.dtype == np.float32
    np.testing.assert_array_equal(lookup, want)
    np.testing.assert_array_equal(ops, want)
    norm.export(str(tmp_path / "norm"))
    loaded = nn.SymbolBlock.imports(str(tmp_path / "norm-symbol.json"), ["data"],
                                    str(tmp_path / "norm-0000.params"))
    np.testing.assert_array_equal(loaded(mx.nd.array(x, dtype="uint8")).asnumpy(), want)
    net = nn.HybridSequential()
    net.add(InputNormalize(MEAN, STD), nn.Conv2D(2, 1, in_channels=3))
    net.initialize(mx.init.One())  # nothing of InputNormalize's to initialise
    net.hybridize()
    out = net(mx.nd.array(x, dtype="uint8")).asnumpy()
    np.testing.assert_allclose(out[:, 0], want.sum(axis=1), rtol=1e-5, atol=1e-5)
    grey = InputNormalize(0.5, 0.25)(mx.nd.full((1, 1, 2, 2), 255, dtype="uint8"))
    assert grey.asnumpy().ravel().tolist() == [2.0] * 4


@pytest.mark.parametrize("channels", [1, 2, 3, 4])
@pytest.mark.parametrize("per_channel", [False, True])
def test_input_normalize_takes_the_same_channel_counts_eagerly_and_hybridized(channels,
                                                                              per_channel):
    """Every channel count the eager path takes, the hybridized one (Gluon's Normalize: 1 or
    3 channels only) takes too, to the same bits; a mismatched one both refuse alike."""
    x = mx.nd.array(np.random.RandomState(channels).randint(0, 256, (2, channels, 5, 7)),
                    dtype="uint8")
    mean = tuple(0.1 * (c + 1) for c in range(channels)) if per_channel else 0.45
    std = tuple(0.2 + 0.05 * c for c in range(channels)) if per_channel else 0.225
    eager = InputNormalize(mean, std)(x).asnumpy()
    hybrid = InputNormalize(mean, std)
    hybrid.hybridize()
    np.testing.assert_array_equal(hybrid(x).asnumpy(), eager)
    m = np.broadcast_to(np.float32(mean), (channels,)).reshape(1, -1, 1, 1)
    s = np.broadcast_to(np.float32(std), (channels,)).reshape(1, -1, 1, 1)
    want = (x.asnumpy().astype(np.float32) / np.float32(255) - m) / s
    np.testing.assert_allclose(eager, want, rtol=1e-6, atol=1e-6)
    if per_channel and channels > 1:  # another count: the same ValueError on both paths
        other = mx.nd.zeros((1, channels + 1, 2, 2), dtype="uint8")
        for block in (InputNormalize(mean, std), hybrid):
            with pytest.raises(ValueError, match="channels"):
                block(other)


def test_input_normalize_refuses_a_converted_batch_and_bad_settings():
    norm = InputNormalize(MEAN, STD)
    with pytest.raises(TypeError, match="uint8"):
        norm(mx.nd.zeros((1, 3, 2, 2)))
    with pytest.raises(ValueError, match="channels"):
        norm(mx.nd.zeros((1, 4, 2, 2), dtype="uint8"))
    with pytest.raises(ValueError, match="NxCxHxW"):
        norm(mx.nd.zeros((3, 2, 2), dtype="uint8"))
    with pytest.raises(ValueError, match="std positive"):
        InputNormalize(MEAN, (0.2, 0.0, 0.2))
    with pytest.raises(ValueError, match="one per channel"):
        InputNormalize(MEAN, (0.2, 0.2))
    assert "InputNormalize" in gluon_data.__all__


def test_classification_uint8_fast_path_through_workers(cls_rec):
    crop = (VT.RandomResizedCrop(20), VT.RandomFlipLeftRight())
    fds = ImageRecordDataset(cls_rec, seed=4).transform_first(_tf(True, *crop))
    uds = ImageRecordDataset(cls_rec, seed=4, output="uint8").transform_first(
        _tf(False, *crop))
    norm = InputNormalize(MEAN, STD)
    fl, ul = (DataLoader(d, batch_size=4, num_workers=2, batchify_fn=StackBatchify())
              for d in (fds, uds))
    for (fi, fy), (ui, uy) in zip(fl, ul):
        assert ui.dtype == np.uint8 and ui.shape[1:] == (3, 20, 20)
        np.testing.assert_allclose(norm(ui).asnumpy(), fi.asnumpy(), rtol=0, atol=1e-6)
        np.testing.assert_array_equal(uy.asnumpy(), fy.asnumpy())
    whole = ImageRecordDataset(cls_rec, output="uint8")[1][0]
    assert whole.dtype == np.uint8 and whole.shape[0] == 3
    np.testing.assert_array_equal(whole.asnumpy().transpose(1, 2, 0),
                                  ImageRecordDataset(cls_rec)[1][0].asnumpy())
    with pytest.raises(ValueError, match="Normalize"):
        ImageRecordDataset(cls_rec, output="uint8").transform_first(_tf(True, *crop))
    with pytest.raises(ValueError, match="not one"):
        ImageRecordDataset(cls_rec, output="uint8").transform_first(VT.Resize(8))
    with pytest.raises(ValueError, match="transform_first"):
        ImageRecordDataset(cls_rec, output="uint8", transform=lambda x, y: (x, y))
