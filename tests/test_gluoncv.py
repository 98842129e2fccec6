"""gluoncv-exact where a user swaps us in: val values, test-mode names, mask-less splits,
class names, NUM_CLASS, transform_first chains, exported names."""
import os
import shutil
import subprocess
import sys

import mxnet as mx
import numpy as np
import pytest
from mxnet.gluon.data.vision import transforms as VT

import gluon_data
from gluon_data import ImageRecordDataset, SegmentationRecordDataset
from gluon_data import convert
from gluon_data.tools import verify
from gluon_data.convert.sample import make_voc
from gluon_data.arrays.transforms import ImageCropNormalize


@pytest.fixture(scope="module")
def voc_mid(tmp_path_factory):
    """Images of 60-200 px: val crops both shrink and enlarge."""
    root = make_voc(str(tmp_path_factory.mktemp("gvoc") / "VOC2012"), num_images=8,
                    size_range=(60, 200), seed=3)
    out = convert(root, str(tmp_path_factory.mktemp("grec") / "v.rec"), "voc",
                  split="train,val").outputs
    return root, out


@pytest.mark.parametrize("crop", [32, 128])
def test_val_mode_values_identical_to_gluoncv(voc_mid, crop):
    """Expected: the same float32 image values (not within a tolerance) and masks as gluoncv's
    VOCSegmentation(mode='val'), with its ToTensor + Normalize input transform."""
    from gluoncv.data import VOCSegmentation
    root, out = voc_mid
    tf = VT.Compose([VT.ToTensor(), VT.Normalize((.485, .456, .406), (.229, .224, .225))])
    ref = VOCSegmentation(root=os.path.dirname(root), split="val", mode="val", crop_size=crop,
                          transform=tf)
    ours = SegmentationRecordDataset(out["val"], mode="val", crop_size=crop, transform=tf)
    assert len(ref) == len(ours) == 2
    for i in range(len(ref)):
        (gi, gm), (oi, om) = ref[i], ours[i]
        np.testing.assert_array_equal(om.asnumpy(), gm.asnumpy().astype(np.int32))
        np.testing.assert_allclose(oi.asnumpy(), gi.asnumpy(), rtol=0, atol=1e-6)


@pytest.mark.parametrize("tf", [lambda x: x - 200, lambda x: x / 2,
                                VT.Compose([VT.Resize(24), VT.ToTensor()])],
                         ids=["subtract", "halve", "resize-totensor"])
def test_any_other_image_transform_is_given_what_gluoncv_gives_it(voc_mid, tf):
    """gluoncv hands a mode's image transform a float32 NDArray: ``x - 200`` wrapped around
    as uint8 here (69 in place of -187), ``x / 2`` was an integer division and ``Resize``
    rounded. The same values now, exactly."""
    from gluoncv.data import VOCSegmentation
    root, out = voc_mid
    ref = VOCSegmentation(root=os.path.dirname(root), split="val", mode="val", crop_size=40,
                          base_size=64, transform=tf)
    ours = SegmentationRecordDataset(out["val"], mode="val", crop_size=40, base_size=64,
                                     transform=tf)
    for i in range(len(ref)):
        (gi, _), (oi, _) = ref[i], ours[i]
        assert oi.dtype == gi.dtype == np.float32
        np.testing.assert_array_equal(oi.asnumpy(), gi.asnumpy())


def test_an_image_transform_without_a_mode_says_the_transform_is_joint(voc_mid):
    """gluoncv's ``mode`` defaults to its split; here no mode means stored samples and a
    joint ``transform(image, mask)``: an image transform there was Gluon's own arity error."""
    _, out = voc_mid
    tf = VT.Compose([VT.ToTensor(), VT.Normalize((.485, .456, .406), (.229, .224, .225))])
    with pytest.raises(TypeError, match=r"is an image transform, but without mode the "
                                        r"transform is joint.*give mode="):
        SegmentationRecordDataset(out["val"], transform=tf)
    img, mask = SegmentationRecordDataset(out["val"], transform=lambda i, m: (i, m))[0]
    assert img.dtype == np.uint8 and mask.dtype == np.int32


def test_test_mode_returns_gluoncvs_names(voc_mid):
    from gluoncv.data import VOCSegmentation
    root, out = voc_mid
    ref = VOCSegmentation(root=os.path.dirname(root), split="val", mode="test")
    ours = SegmentationRecordDataset(out["val"], mode="test")
    for i in range(len(ref)):
        (gi, gname), (oi, oname) = ref[i], ours[i]
        assert oname == gname and oname.endswith(".jpg")
        np.testing.assert_array_equal(oi.asnumpy(), gi.asnumpy().astype(np.uint8))
    assert ours.name(-1) == ref[len(ref) - 1][1]


def test_split_without_masks_packs_images_and_reads_in_test_mode(voc_mid, tmp_path):
    """Expected: `convert --layout voc --split test` (VOC's test set has no masks) works from
    the command line; the split reads in mode='test' with the image names; other modes and
    verify --deep say what is going on instead of failing on a missing mask."""
    root, _ = voc_mid
    tree = str(tmp_path / "VOC2012")
    shutil.copytree(root, tree)
    ids = ["t%d" % i for i in range(3)]
    for i, name in enumerate(ids):
        shutil.copy(os.path.join(tree, "JPEGImages", sorted(os.listdir(
            os.path.join(tree, "JPEGImages")))[i]), os.path.join(tree, "JPEGImages", name + ".jpg"))
    with open(os.path.join(tree, "ImageSets", "Segmentation", "test.txt"), "w") as f:
        f.write("".join(n + "\n" for n in ids))
    out = str(tmp_path / "voc.rec")
    r = subprocess.run([sys.executable, "-m", "gluon_data", "convert", tree, out, "--layout",
                        "voc", "--split", "test", "--workers", "1", "--quiet"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    ds = SegmentationRecordDataset(out, mode="test")
    assert [ds[i][1] for i in range(3)] == [n + ".jpg" for n in ids]
    assert ds[0][0].dtype == np.uint8 and ds.meta["masks"] is False
    with pytest.raises(ValueError, match="mode='test'"):
        SegmentationRecordDataset(out, mode="val")
    assert verify(out, deep=True).ok


def test_class_names_and_num_class_as_gluoncv(voc_mid):
    from gluoncv.data import VOCSegmentation
    _, out = voc_mid
    ds = SegmentationRecordDataset(out["train"])
    assert tuple(ds.classes) == tuple(VOCSegmentation.CLASSES)
    assert ds.NUM_CLASS == ds.num_class == VOCSegmentation.NUM_CLASS == 21
    assert isinstance(ds.NUM_CLASS, int)


def test_chained_transform_first_composes_as_gluons(cls_rec):
    """Expected: a second transform_first applies after the first, exactly as Gluon's."""
    norm = VT.Normalize((.5, .4, .3), (.2, .25, .3))
    stock = mx.gluon.data.vision.ImageRecordDataset(cls_rec).transform_first(
        VT.ToTensor()).transform_first(norm)
    ours = ImageRecordDataset(cls_rec).transform_first(VT.ToTensor()).transform_first(norm)
    for i in range(3):
        np.testing.assert_allclose(ours[i][0].asnumpy(), stock[i][0].asnumpy(), atol=2e-6)
        assert ours[i][1] == stock[i][1]


def test_fast_paths_are_visible_objects(cls_rec):
    recipe = VT.Compose([VT.CenterCrop(16), VT.ToTensor()])
    ds = ImageRecordDataset(cls_rec, seed=0).transform_first(recipe)
    assert isinstance(ds.fast_path, ImageCropNormalize) and ds.fast_path.crop[0] == "center"
    hand = ImageCropNormalize(("center", (16, 16), 1))   # the same path, built by hand
    img = ImageRecordDataset(cls_rec)[0][0].asnumpy()
    np.testing.assert_array_equal(ds[0][0].asnumpy(), hand(img))
    assert ImageRecordDataset(cls_rec).transform_first(VT.RandomBrightness(0.1)).__class__ \
        is not ImageRecordDataset  # not recognised: Gluon's lazy dataset runs it unchanged


def test_worker_died_error_is_exported():
    from gluon_data.gluon.loader import WorkerDiedError
    assert gluon_data.WorkerDiedError is WorkerDiedError
    assert "WorkerDiedError" in dir(gluon_data)
