"""Class statistics of a converted segmentation dataset, and loss weights derived from them.

Counts are gathered once, at conversion (:class:`RunningStats`), and stored in the metadata (``class_pixels``,
``class_images``, ``class_image_pixels``, ``image_stats``); nothing is decoded here.
"""
from __future__ import annotations

import math
from typing import Dict, List, Optional

import numpy as np

from ..errors import FormatError

__all__ = ["class_statistics", "format_statistics", "RunningStats", "counted_records"]


def counted_records(meta: dict, path: Optional[str] = None) -> int:
    """How many records the statistics of ``meta`` were counted over: its ``num_records``,
    or, once :func:`~gluon_data.tools.salvage.salvage` has dropped damaged records, the
    conversion's count (its ``salvaged.counted_records``), the records lost included: the
    statistics are gathered at conversion and no record is decoded again to correct them."""
    salvaged = meta.get("salvaged")
    if salvaged is None:
        return int(meta["num_records"])
    counted = salvaged.get("counted_records", salvaged.get("records_before")) \
        if isinstance(salvaged, dict) else None
    if not isinstance(counted, int) or isinstance(counted, bool) or counted < 0:
        raise FormatError("the metadata's salvaged.counted_records is %r, not a count of "
                          "records" % (counted,), path)
    return counted


def class_statistics(meta: dict, path: Optional[str] = None) -> Dict:
    """Per-class pixels, image counts, frequencies and two kinds of class weights.

    * ``median_freq`` (Eigen & Fergus): ``median(f) / f_c`` with ``f_c`` = pixels of class
      ``c`` / pixels of the images in which ``c`` appears;
    * ``enet`` (Paszke et al.): ``1 / ln(1.02 + p_c)`` with ``p_c`` the share of labelled pixels.

    Classes that never occur get weight 0. The ignore label is left out of both.
    ``counted_records``: the records the counts cover (:func:`counted_records`; more than
    ``records`` after a salvage dropped some).
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
            "counted_records": counted_records(meta, path),
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
    counted = stats.get("counted_records", stats["records"])
    if counted != stats["records"]:
        lines.append("note: these figures were counted at conversion over %d records; %d "
                     "remain after gluon-data salvage, so they include the %d lost (convert "
                     "the source again for exact ones)"
                     % (counted, stats["records"], counted - stats["records"]))
    im = stats.get("image_stats")
    if im:
        lines.append("image mean (RGB, 0..1) %s  std %s" % (im["mean"], im["std"]))
    lines.append("weights for a loss: the median_freq or enet column, one per class id "
                 "(--json prints them as lists)")
    return "\n".join(lines)


class RunningStats:
    """Accumulates what a conversion's metadata reports: sizes, class statistics, pixel
    mean/std, from each item's ``info`` (see :func:`gluon_data.convert.encode_item`).

    Only aggregates are kept, so the state is small and goes into resume checkpoints
    (:meth:`state` / :meth:`from_state` round-trip exactly through JSON).

    >>> st = RunningStats()
    >>> st.add({"hw": (4, 6), "class_pixels": {0: 20, 1: 4}})
    >>> st.image_size()["max_hw"], st.class_images
    ([4, 6], {0: 1, 1: 1})
    >>> RunningStats.from_state(st.state()).class_pixels == st.class_pixels
    True
    """

    def __init__(self) -> None:
        self.count = 0
        self.hw_min = [1 << 62, 1 << 62]
        self.hw_max = [0, 0]
        self.hw_sum = [0, 0]
        self.class_pixels: Dict[int, int] = {}
        self.class_images: Dict[int, int] = {}
        self.class_image_pixels: Dict[int, int] = {}  # pixels of the images holding the class
        self.palette: Optional[list] = None
        self.names: List[str] = []  # segmentation: each written item's image file name
        self.n = 0
        self.sum = [0.0, 0.0, 0.0]
        self.sq = [0.0, 0.0, 0.0]

    def add(self, info: dict) -> None:
        h, w = info["hw"]
        self.count += 1
        self.hw_min = [min(self.hw_min[0], h), min(self.hw_min[1], w)]
        self.hw_max = [max(self.hw_max[0], h), max(self.hw_max[1], w)]
        self.hw_sum = [self.hw_sum[0] + h, self.hw_sum[1] + w]
        cp = info.get("class_pixels", {})
        total = sum(cp.values())
        for k, v in cp.items():
            self.class_pixels[k] = self.class_pixels.get(k, 0) + v
            self.class_images[k] = self.class_images.get(k, 0) + 1
            self.class_image_pixels[k] = self.class_image_pixels.get(k, 0) + total
        if self.palette is None and info.get("palette"):
            self.palette = list(info["palette"])
        if "pix" in info:
            n, s, q = info["pix"]
            self.n += n
            self.sum = [a + b for a, b in zip(self.sum, s)]
            self.sq = [a + b for a, b in zip(self.sq, q)]

    def image_size(self) -> dict:
        return {"min_hw": self.hw_min, "max_hw": self.hw_max,
                "mean_hw": [round(x / max(self.count, 1), 1) for x in self.hw_sum]}

    def mean_std(self):
        if not self.n:
            return None
        mean = np.array(self.sum) / self.n
        std = np.sqrt(np.maximum(np.array(self.sq) / self.n - mean ** 2, 0))
        return {"mean": [round(float(x) / 255, 6) for x in mean],
                "std": [round(float(x) / 255, 6) for x in std], "pixels": int(self.n)}

    def merge(self, other: "RunningStats") -> None:
        """Add ``other``'s aggregates (the statistics of a later part, e.g. a shard)."""
        if not other.count:
            return
        self.count += other.count
        self.hw_min = [min(a, b) for a, b in zip(self.hw_min, other.hw_min)]
        self.hw_max = [max(a, b) for a, b in zip(self.hw_max, other.hw_max)]
        self.hw_sum = [a + b for a, b in zip(self.hw_sum, other.hw_sum)]
        for k in self._DICTS:
            mine = getattr(self, k)
            for c, v in getattr(other, k).items():
                mine[c] = mine.get(c, 0) + v
        if self.palette is None and other.palette:
            self.palette = list(other.palette)
        self.names.extend(other.names)
        self.n += other.n
        self.sum = [a + b for a, b in zip(self.sum, other.sum)]
        self.sq = [a + b for a, b in zip(self.sq, other.sq)]

    _DICTS = ("class_pixels", "class_images", "class_image_pixels")

    def state(self) -> dict:
        d = {k: getattr(self, k) for k in ("count", "hw_min", "hw_max", "hw_sum", "palette",
                                           "n", "sum", "sq", "names")}
        d.update({k: {str(c): v for c, v in getattr(self, k).items()} for k in self._DICTS})
        return d

    @classmethod
    def from_state(cls, d: dict) -> "RunningStats":
        st = cls()
        for k, v in d.items():
            setattr(st, k, {int(c): n for c, n in v.items()} if k in cls._DICTS else v)
        return st
