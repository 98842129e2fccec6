"""Small synthetic datasets in real layouts (VOC, image folders), for demos and tests."""
from __future__ import annotations

import os
from typing import Sequence, Tuple

import cv2
import numpy as np
from PIL import Image

from .sources import voc_palette

__all__ = ["make_voc", "make_imagefolder", "make_ade20k", "make_cityscapes", "synthetic_pair",
           "synthetic_photo"]


def synthetic_pair(rng: np.random.Generator, h: int, w: int, num_classes: int = 21,
                   ignore_label: int = 255, boundary: bool = True) -> Tuple[np.ndarray, np.ndarray]:
    """An RGB image with a few filled shapes, and its mask of class ids.

    Like VOC, shape outlines in the mask are marked ``ignore_label`` when ``boundary``.
    """
    yy, xx = np.mgrid[0:h, 0:w]
    base = rng.integers(0, 256, size=3)
    img = np.empty((h, w, 3), np.uint8)
    for c in range(3):
        img[..., c] = (base[c] + 60 * np.sin(xx / (3 + c) + yy / 7.0)).clip(0, 255)
    mask = np.zeros((h, w), np.uint8)
    for _ in range(int(rng.integers(1, 4))):
        cls = int(rng.integers(1, num_classes))
        colour = tuple(int(v) for v in rng.integers(0, 256, size=3))
        cy, cx = int(rng.integers(0, h)), int(rng.integers(0, w))
        r = int(rng.integers(max(2, min(h, w) // 8), max(3, min(h, w) // 3)))
        if rng.random() < 0.5:
            cv2.circle(img, (cx, cy), r, colour, -1)
            cv2.circle(mask, (cx, cy), r, cls, -1)
        else:
            cv2.rectangle(img, (cx - r, cy - r), (cx + r, cy + r), colour, -1)
            cv2.rectangle(mask, (cx - r, cy - r), (cx + r, cy + r), cls, -1)
    if boundary:
        edge = cv2.morphologyEx(mask, cv2.MORPH_GRADIENT, np.ones((3, 3), np.uint8)) > 0
        mask[edge] = ignore_label
    return img, mask


def synthetic_photo(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    """A smooth random RGB 'photo' that compresses like one (tens of KB at quality 90)."""
    small = rng.integers(0, 255, (max(2, h // 16), max(2, w // 16), 3), dtype=np.uint8)
    img = cv2.resize(small, (w, h), interpolation=cv2.INTER_CUBIC)
    noise = rng.normal(0, 12, (h, w, 3))
    return np.clip(img + noise, 0, 255).astype(np.uint8)


def _save_palette_png(mask: np.ndarray, path: str) -> None:
    im = Image.fromarray(mask, mode="P")
    im.putpalette([v for rgb in voc_palette(256) for v in rgb])
    im.save(path)


def make_voc(root: str, num_images: int = 24, size_range: Sequence[int] = (40, 96),
             val_fraction: float = 0.25, seed: int = 0, quality: int = 90,
             photo: bool = False, prefix: str = "2007") -> str:
    """Write a tiny Pascal-VOC-style dataset under ``root``; return ``root``.

    ``JPEGImages/*.jpg``, ``SegmentationClass/*.png`` (palette PNGs with 255 boundaries as
    in VOC) and ``ImageSets/Segmentation/{train,val,trainval}.txt``. ``photo=True`` stores
    :func:`synthetic_photo` images (JPEG sizes like real photos: the benchmark's data)
    instead of the flat shapes drawn on the mask; ``prefix`` starts every image id.
    """
    rng = np.random.default_rng(seed)
    for d in ("JPEGImages", "SegmentationClass", os.path.join("ImageSets", "Segmentation")):
        os.makedirs(os.path.join(root, d), exist_ok=True)
    ids = []
    for i in range(num_images):
        h, w = (int(v) for v in rng.integers(size_range[0], size_range[1] + 1, size=2))
        img, mask = synthetic_pair(rng, h, w)
        if photo:
            img = synthetic_photo(rng, h, w)
        name = "%s_%06d" % (prefix, i)
        Image.fromarray(img).save(os.path.join(root, "JPEGImages", name + ".jpg"),
                                  quality=quality)
        _save_palette_png(mask, os.path.join(root, "SegmentationClass", name + ".png"))
        ids.append(name)
    nval = max(1, int(round(num_images * val_fraction)))
    sets = {"train": ids[:-nval], "val": ids[-nval:], "trainval": ids}
    for split, names in sets.items():
        with open(os.path.join(root, "ImageSets", "Segmentation", split + ".txt"), "w") as f:
            f.write("".join(n + "\n" for n in names))
    return root


def make_imagefolder(root: str, classes: Sequence[str] = ("cat", "dog", "fish"),
                     per_class: int = 4, size_range: Sequence[int] = (20, 48), seed: int = 0,
                     ext: str = ".jpg") -> str:
    """Write ``root/<class>/<n>.jpg`` with small synthetic images; return ``root``."""
    rng = np.random.default_rng(seed)
    for c in classes:
        os.makedirs(os.path.join(root, c), exist_ok=True)
        for i in range(per_class):
            h, w = (int(v) for v in rng.integers(size_range[0], size_range[1] + 1, size=2))
            img, _ = synthetic_pair(rng, h, w, boundary=False)
            Image.fromarray(img).save(os.path.join(root, c, "%03d%s" % (i, ext)))
    return root


def make_ade20k(root: str, num_train: int = 6, num_val: int = 3, seed: int = 0) -> str:
    """``ADEChallengeData2016/{images,annotations}/{training,validation}``; masks hold
    0 (unlabelled) and classes 1..150 as in ADE20K. Returns the ADEChallengeData2016 folder."""
    rng = np.random.default_rng(seed)
    base = os.path.join(root, "ADEChallengeData2016")
    for folder, n in (("training", num_train), ("validation", num_val)):
        os.makedirs(os.path.join(base, "images", folder), exist_ok=True)
        os.makedirs(os.path.join(base, "annotations", folder), exist_ok=True)
        for i in range(n):
            h, w = (int(v) for v in rng.integers(24, 64, size=2))
            img, mask = synthetic_pair(rng, h, w, num_classes=151, ignore_label=0)
            name = "ADE_%s_%08d" % ("train" if folder == "training" else "val", i + 1)
            Image.fromarray(img).save(os.path.join(base, "images", folder, name + ".jpg"))
            Image.fromarray(mask, mode="L").save(os.path.join(base, "annotations", folder,
                                                              name + ".png"))
    return base


def make_cityscapes(root: str, per_city: int = 2, cities: Sequence[str] = ("aachen", "bonn"),
                    seed: int = 0) -> str:
    """``leftImg8bit/{train,val}/<city>/*_leftImg8bit.png`` and ``gtFine`` ``*_labelIds.png``
    with Cityscapes label ids 0..33 (only 19 of them are evaluated). Returns ``root``."""
    rng = np.random.default_rng(seed)
    for split in ("train", "val"):
        for city in cities:
            idir = os.path.join(root, "leftImg8bit", split, city)
            mdir = os.path.join(root, "gtFine", split, city)
            os.makedirs(idir, exist_ok=True)
            os.makedirs(mdir, exist_ok=True)
            for i in range(per_city):
                h, w = (int(v) for v in rng.integers(24, 48, size=2))
                img, mask = synthetic_pair(rng, h, w, num_classes=34, boundary=False)
                stem = "%s_%06d_%06d" % (city, i, 19)
                Image.fromarray(img).save(os.path.join(idir, stem + "_leftImg8bit.png"))
                Image.fromarray(mask, mode="L").save(os.path.join(mdir,
                                                                  stem + "_gtFine_labelIds.png"))
    return root
