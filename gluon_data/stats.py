"""Class statistics of a converted segmentation dataset, and loss weights derived from them.

Counts are gathered once, at conversion, and stored in the metadata (``class_pixels``,
``class_images``, ``class_image_pixels``, ``image_stats``); nothing is decoded here.
"""
from __future__ import annotations

import math
from typing import Dict, List

import numpy as np

from .errors import FormatError

__all__ = ["class_statistics", "format_statistics"]


def class_statistics(meta: dict, path: str = None) -> Dict:
    """Per-class pixels, image counts, frequencies and two kinds of class weights.

    * ``median_freq`` (Eigen & Fergus): ``median(f) / f_c`` with ``f_c`` = pixels of class
      ``c`` / pixels of the images in which ``c`` appears;
    * ``enet`` (Paszke et al.): ``1 / ln(1.02 + p_c)`` with ``p_c`` the share of labelled pixels.

    Classes that never occur get weight 0. The ignore label is left out of both.
    """
    if meta.get("task") != "segmentation" or "class_pixels" not in meta:
        raise FormatError("no class statistics: only segmentation datasets written by "
                          "gluon-data convert carry them", path)
    n = int(meta["num_classes"])
    ignore = meta.get("ignore_label", 255)
    pix = {int(k): v for k, v in meta["class_pixels"].items()}
    imgs = {int(k): v for k, v in meta.get("class_images", {}).items()}
    img_pix = {int(k): v for k, v in meta.get("class_image_pixels", {}).items()}
    labelled = sum(v for k, v in pix.items() if k != ignore and k < n)
    freq = np.array([pix.get(c, 0) / img_pix[c] if img_pix.get(c) else 0.0 for c in range(n)])
    med = float(np.median(freq[freq > 0])) if (freq > 0).any() else 0.0
    rows: List[dict] = []
    names = meta.get("classes") or ["class_%d" % i for i in range(n)]
    for c in range(n):
        p = pix.get(c, 0)
        share = p / labelled if labelled else 0.0
        rows.append({"id": c, "name": names[c] if c < len(names) else str(c), "pixels": p,
                     "share": share, "images": imgs.get(c, 0),
                     "median_freq": med / freq[c] if freq[c] > 0 else 0.0,
                     "enet": 1.0 / math.log(1.02 + share) if p else 0.0})
    return {"classes": rows, "labelled_pixels": labelled,
            "ignored_pixels": pix.get(ignore, 0), "records": meta["num_records"],
            "image_stats": meta.get("image_stats")}


def format_statistics(stats: Dict) -> str:
    lines = ["%4s  %-22s %12s %8s %7s %11s %7s" % ("id", "class", "pixels", "share", "images",
                                                     "median_freq", "enet")]
    for r in stats["classes"]:
        lines.append("%4d  %-22s %12d %7.2f%% %7d %11.3f %7.3f"
                     % (r["id"], r["name"][:22], r["pixels"], 100 * r["share"], r["images"],
                        r["median_freq"], r["enet"]))
    lines.append("%d records, %d labelled pixels, %d ignored"
                 % (stats["records"], stats["labelled_pixels"], stats["ignored_pixels"]))
    im = stats.get("image_stats")
    if im:
        lines.append("image mean (RGB, 0..1) %s  std %s" % (im["mean"], im["std"]))
    lines.append("weights for a loss: e.g. mx.nd.array([...median_freq...]) "
                 "(--json prints them as lists)")
    return "\n".join(lines)
