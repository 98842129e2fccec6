"""Class statistics gathered at conversion, class weights, and previews."""
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from gluon_data import SegmentationRecordDataset
from gluon_data.errors import FormatError
from gluon_data.tools.stats import class_statistics


def source_masks(voc_root):
    ids = open(os.path.join(voc_root, "ImageSets/Segmentation/trainval.txt")).read().split()
    return ([np.asarray(Image.open(os.path.join(voc_root, "SegmentationClass", i + ".png")))
             for i in ids],
            [np.asarray(Image.open(os.path.join(voc_root, "JPEGImages", i + ".jpg")))
             for i in ids])


def test_statistics_equal_counts_made_from_the_source_files(voc_rec, voc_root):
    masks, images = source_masks(voc_root)
    stats = class_statistics(SegmentationRecordDataset(voc_rec).meta)
    allm = np.concatenate([m.ravel() for m in masks])
    labelled = int((allm != 255).sum())
    assert stats["labelled_pixels"] == labelled
    assert stats["ignored_pixels"] == int((allm == 255).sum())
    for row in stats["classes"]:
        c = row["id"]
        assert row["pixels"] == int((allm == c).sum())
        assert row["images"] == sum(int((m == c).any()) for m in masks)
        holding = sum(m.size for m in masks if (m == c).any())
        assert (row["median_freq"] > 0) == (row["pixels"] > 0)
        if row["pixels"]:
            assert row["enet"] == pytest.approx(1 / math.log(1.02 + row["pixels"] / labelled))
            freq = row["pixels"] / holding
            assert row["median_freq"] * freq == pytest.approx(
                float(np.median([r["pixels"] / sum(m.size for m in masks if (m == r["id"]).any())
                                 for r in stats["classes"] if r["pixels"]])))
    pix = np.concatenate([i.reshape(-1, 3) for i in images]).astype(np.float64)
    np.testing.assert_allclose(stats["image_stats"]["mean"], pix.mean(0) / 255, atol=1e-5)
    np.testing.assert_allclose(stats["image_stats"]["std"], pix.std(0) / 255, atol=1e-5)


def test_stats_refused_for_classification_and_stock_files(cls_rec):
    with pytest.raises(FormatError, match="only segmentation"):
        class_statistics(json.load(open(cls_rec[:-4] + ".meta.json")), cls_rec)


def cli(*args):
    return subprocess.run([sys.executable, "-m", "gluon_data", *args], capture_output=True,
                          text=True, timeout=300)


def test_stats_and_show_commands(voc_rec, tmp_path):
    p = cli("stats", voc_rec, "--json")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert len(out["weights"]["median_freq"]) == 21 and out["classes"][0]["name"] == "background"
    png = str(tmp_path / "s.png")
    p = cli("show", voc_rec, "--index", "2", "--out", png)
    assert p.returncode == 0, p.stderr
    pic = np.asarray(Image.open(png))
    img = SegmentationRecordDataset(voc_rec)[2][0].asnumpy()
    h, w = img.shape[:2]
    scale = math.ceil(256 / min(h, w))  # enlarged: image left, overlay right, legend below
    assert pic.shape[1] >= 2 * w * scale and pic.shape[0] > h * scale
    np.testing.assert_array_equal(pic[:h * scale:scale, :w * scale:scale, :3], img)
    p = cli("show", voc_rec, "--index", "99", "--out", png)
    assert p.returncode == 1 and "out of range" in p.stderr


def test_show_of_a_dataset_without_masks_saves_the_image_and_its_label(cls_rec, tmp_path):
    """``show`` on a classification dataset (or a split without masks) drew nothing and told
    a command-line user to open it from Python; it saves the image and names its label."""
    from gluon_data.arrays import ClassificationDataset
    ds = ClassificationDataset(cls_rec)
    img, label = ds[3]
    png = str(tmp_path / "c.png")
    p = cli("show", cls_rec, "--index", "3", "--out", png)
    name = json.load(open(cls_rec[:-4] + ".meta.json"))["classes"][int(label)]
    assert p.returncode == 0, p.stderr
    assert "label %g (%s); no mask" % (label, name) in p.stdout
    np.testing.assert_array_equal(np.asarray(Image.open(png)), img)
    p = cli("show", cls_rec, "--index", "-99", "--out", png, "--overwrite")
    assert p.returncode == 1 and "out of range" in p.stderr
