"""The large-image set of ``gluon-data bench``: Cityscapes-size street scenes, segmentation
``train`` at gluoncv's Cityscapes sizes.

Makes (or reuses, under the bench's data folder) ``n`` street scenes of 2048x1024 px: JPEGs at
quality 90, 4:2:0, ~0.5 MB each (sky, buildings with windows, trees, road, sidewalks, cars,
poles, people; per-class texture and sensor noise), with palette PNG masks of the 19
Cityscapes training ids and 255 (the ego vehicle), in a VOC folder tree, packed by our
converter into ``.rec`` (again each run, so the rows read the package's format of the day).
Then, in interleaved rounds of one run:

* the decode limit: image + mask bytes decoded whole from memory with the fastest decoders
  available (chosen on the files, as the VOC limit's) by N processes
  forked after the bytes are loaded, timed from a barrier (``bench_common``);
* segmentation ``train`` (``base_size=1024, crop_size=768``, ``ToTensor`` + ``Normalize``,
  ``DataLoader(batch_size=4, num_workers=N)``): gluoncv's ``VOCSegmentation`` over the folder
  tree (its ``SegmentationDataset._sync_transform``), ours from ``.rec`` with region decoding
  on (the default) and off (``GLUON_DATA_REGION_DECODE=0``), and ours with DCT-scaled
  decoding (``GLUON_DATA_DECODE_SCALED=1``: where the installed package lacks
  ``gluon_data.format.decode.scaled_decoding``, that row runs the region-on pipeline and a
  note says so);
* the CPU milliseconds per item of every process of each (main process and workers).

``rows()`` returns them for the main benchmark, ``ratios()`` the quotients it reports with
their targets. Alone: ``gluon-data bench --only large [--large-images 64]``.
"""
from __future__ import annotations

import os
import sys
import time
from typing import Dict, Optional, Sequence, Tuple

import cv2
import numpy as np
from PIL import Image

from bench_common import _environ, _forked_decode_rate, _loader_rates, _ratio_table

#: Cityscapes' frames: (width, height).
LARGE_SIZE = (2048, 1024)
BATCH_SIZE = 4
SCALED_ENV, REGION_ENV = "GLUON_DATA_DECODE_SCALED", "GLUON_DATA_REGION_DECODE"

OURS = "ours large train"
OFF = "ours large train, region decoding off"
SCALED = "ours large train, DCT-scaled decode"
GLUONCV = "gluoncv large train"
CPU = " CPU ms/item"
# the environment each of our loaders' workers start with
_ENVS = {OURS: {REGION_ENV: "1", SCALED_ENV: "0"}, OFF: {REGION_ENV: "0", SCALED_ENV: "0"},
         SCALED: {REGION_ENV: "1", SCALED_ENV: "1"}}

# Cityscapes training ids
(ROAD, SIDEWALK, BUILDING, WALL, FENCE, POLE, LIGHT, SIGN, VEGETATION, TERRAIN, SKY, PERSON,
 RIDER, CAR, TRUCK, BUS, TRAIN, MOTORCYCLE, BICYCLE) = range(19)
IGNORE = 255
# a photograph's colour of each class (RGB), and its texture (noise amplitude)
_COLOURS = np.array([
    (88, 88, 92), (150, 145, 140), (120, 105, 95), (140, 135, 125), (110, 110, 100),
    (80, 80, 80), (40, 40, 40), (200, 180, 60), (60, 95, 45), (115, 125, 75), (165, 190, 225),
    (90, 70, 60), (70, 60, 70), (60, 70, 110), (180, 180, 175), (200, 170, 60),
    (150, 150, 160), (40, 40, 50), (60, 50, 50)], np.float32)
_TEXTURE = np.array([6, 8, 12, 8, 10, 5, 4, 4, 22, 14, 2, 10, 10, 7, 7, 7, 7, 10, 10, 4],
                    np.float32)  # the last: the ignored ego vehicle


def _street_mask(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    """A street scene's label map: sky, a skyline of buildings, trees, the road towards a
    vanishing point between sidewalks, poles with signs and lights, vehicles and people
    larger nearer the camera, the ego vehicle's bonnet ignored."""
    mask = np.full((h, w), SKY, np.uint8)
    hor, vx = int(h * rng.uniform(0.38, 0.5)), int(w * rng.uniform(0.35, 0.65))
    x = 0
    while x < w:  # the skyline
        bw = max(1, int(rng.uniform(0.05, 0.2) * w))
        mask[int(h * rng.uniform(0.02, 0.3)):hor + h // 20, x:x + bw] = (
            BUILDING if rng.random() < 0.8 else WALL)
        x += bw
    for _ in range(int(rng.integers(2, 6))):
        cv2.ellipse(mask, (int(rng.uniform(0, w)), int(h * rng.uniform(0.15, 0.5))),
                    (int(w * rng.uniform(0.04, 0.12)), int(h * rng.uniform(0.08, 0.2))),
                    0, 0, 360, VEGETATION, -1)
    mask[hor:] = SIDEWALK
    road = [[vx - w // 40, hor], [vx + w // 40, hor], [int(rng.uniform(0.9, 1.6) * w), h],
            [int(rng.uniform(-0.6, 0.1) * w), h]]
    cv2.fillPoly(mask, [np.array(road, np.int32)], ROAD)
    if rng.random() < 0.5:
        verge = [[0, hor + h // 10], [int(w * 0.12), hor], [int(w * 0.15), hor], [0, h - h // 4]]
        cv2.fillPoly(mask, [np.array(verge, np.int32)], TERRAIN)
    if rng.random() < 0.5:
        mask[hor - h // 30:hor + h // 40, int(w * rng.uniform(0.6, 0.8)):] = FENCE
    for _ in range(int(rng.integers(2, 7))):
        px, top = int(rng.uniform(0, w)), int(h * rng.uniform(0.1, 0.3))
        mask[top:int(h * rng.uniform(0.5, 0.7)), px:px + max(2, int(w * 0.005))] = POLE
        s = max(3, int(w * rng.uniform(0.006, 0.02)))
        if rng.random() < 0.4:
            mask[top:top + s, max(0, px - s // 2):px + s] = SIGN
        elif rng.random() < 0.5:
            mask[top:top + 2 * s, px:px + s // 2 + 1] = LIGHT
    for _ in range(int(rng.integers(2, 8))):
        y = int(hor + (h - hor) * rng.uniform(0.05, 0.7))
        near = (y - hor) / max(1, h - hor) + 0.1
        cw, ch, cx = int(w * 0.18 * near), int(h * 0.18 * near), int(rng.uniform(0.1, 0.9) * w)
        cls = int(rng.choice([CAR, CAR, CAR, TRUCK, BUS, MOTORCYCLE, BICYCLE, TRAIN]))
        ch = int(ch * 1.8) if cls in (TRUCK, BUS, TRAIN) else ch
        cv2.rectangle(mask, (cx - cw // 2, y - ch), (cx + cw // 2, y), cls, -1)
        if cls == CAR:
            cv2.ellipse(mask, (cx, y - ch), (cw // 3, max(2, ch // 3)), 0, 180, 360, cls, -1)
    for _ in range(int(rng.integers(0, 8))):
        y = int(hor + (h - hor) * rng.uniform(0.0, 0.5))
        near = (y - hor) / max(1, h - hor) + 0.1
        pw, ph = max(2, int(w * 0.04 * near)), max(4, int(h * 0.24 * near))
        cv2.ellipse(mask, (int(rng.uniform(0, w)), y - ph // 2), (pw // 2, ph // 2), 0, 0, 360,
                    PERSON if rng.random() < 0.8 else RIDER, -1)
    bonnet = int(h * rng.uniform(0.06, 0.12))
    cv2.ellipse(mask, (w // 2, h + bonnet // 2), (int(w * 0.7), bonnet), 0, 180, 360, IGNORE,
                -1)
    return mask


def street_scene(rng: np.random.Generator, h: int, w: int) -> Tuple[np.ndarray, np.ndarray]:
    """``(RGB image, mask)``: :func:`_street_mask` painted like a photograph (each class its
    colour, jittered per image; window grids on buildings; smooth light and shade; per-class
    texture; sensor noise). At 2048x1024 a JPEG at quality 90, 4:2:0, is 0.4-0.6 MB."""
    mask = _street_mask(rng, h, w)
    cls = np.where(mask == IGNORE, 19, mask)
    colours = np.vstack([_COLOURS * rng.uniform(0.75, 1.15) + rng.normal(0, 8, (19, 3)),
                         [(20, 20, 25)]]).astype(np.float32)
    img = colours[cls]
    yy, xx = np.ogrid[0:h, 0:w]
    px, py = int(rng.integers(16, 40)), int(rng.integers(20, 48))
    img[((xx % px) < px * 0.55) & ((yy % py) < py * 0.6) & (mask == BUILDING)] *= 0.55
    coarse = cv2.resize(rng.normal(0, 1, (max(2, h // 32), max(2, w // 32), 3)).astype(
        np.float32), (w, h), interpolation=cv2.INTER_CUBIC)
    mid = cv2.resize(rng.normal(0, 1, (max(2, h // 6), max(2, w // 6))).astype(np.float32),
                     (w, h), interpolation=cv2.INTER_LINEAR)
    texture = _TEXTURE[cls][..., None]
    img += coarse * 4 + coarse[..., :1] * 8 + mid[..., None] * texture * 0.8
    img += rng.normal(0, 0.6, (h, w, 1)).astype(np.float32) * texture
    img *= np.linspace(1.1, 0.8, h, dtype=np.float32)[:, None, None]
    return np.clip(img, 0, 255).astype(np.uint8), mask


def _palette() -> list:
    """Cityscapes' colours for ids 0-18, black elsewhere (255 included)."""
    colours = [(128, 64, 128), (244, 35, 232), (70, 70, 70), (102, 102, 156), (190, 153, 153),
               (153, 153, 153), (250, 170, 30), (220, 220, 0), (107, 142, 35), (152, 251, 152),
               (70, 130, 180), (220, 20, 60), (255, 0, 0), (0, 0, 142), (0, 0, 70),
               (0, 60, 100), (0, 80, 100), (0, 0, 230), (119, 11, 32)]
    return [v for rgb in colours + [(0, 0, 0)] * (256 - len(colours)) for v in rgb]


def make_large(root: str, n: int, size: Sequence[int] = LARGE_SIZE, seed: int = 0) -> str:
    """``root/VOC2012``: ``n`` :func:`street_scene` JPEGs (``size`` = (width, height), quality
    90, 4:2:0) and palette PNG masks in VOC's tree, every split listing every image (gluoncv's
    ``train`` reads ``trainval.txt``). Reused when its split files exist."""
    voc = os.path.join(root, "VOC2012")
    sets = os.path.join(voc, "ImageSets", "Segmentation")
    if os.path.exists(os.path.join(sets, "train.txt")):
        return voc
    for d in ("JPEGImages", "SegmentationClass"):
        os.makedirs(os.path.join(voc, d), exist_ok=True)
    os.makedirs(sets, exist_ok=True)
    rng = np.random.default_rng(seed)
    names = ["street_%06d" % i for i in range(n)]
    for name in names:
        img, mask = street_scene(rng, int(size[1]), int(size[0]))
        Image.fromarray(img).save(os.path.join(voc, "JPEGImages", name + ".jpg"),
                                  quality=90, subsampling=2)
        png = Image.fromarray(mask, mode="P")
        png.putpalette(_palette())
        png.save(os.path.join(voc, "SegmentationClass", name + ".png"))
    for split in ("trainval", "val", "train"):  # train.txt last: the set is complete
        with open(os.path.join(sets, split + ".txt"), "w") as f:
            f.write("".join(x + "\n" for x in names))
    return voc


def large_root(workdir: str, n: int, size: Sequence[int] = LARGE_SIZE) -> str:
    """Where the set of ``n`` images of ``size`` is kept under the bench's data folder."""
    return os.path.join(workdir, "large-%d-%dx%d" % (n, size[0], size[1]))


def train_kw(size: Sequence[int] = LARGE_SIZE) -> dict:
    """gluoncv's Cityscapes ``train`` sizes, scaled with the image width (2048:
    ``base_size=1024, crop_size=768``), ``ToTensor`` + ``Normalize``."""
    from mxnet.gluon.data.vision import transforms
    tf = transforms.Compose([transforms.ToTensor(),
                             transforms.Normalize([.485, .456, .406], [.229, .224, .225])])
    return dict(mode="train", base_size=size[0] // 2, crop_size=size[0] * 3 // 8, transform=tf)


def scaled_supported() -> bool:
    """Whether the installed package has the DCT-scaled decode opt-in."""
    from gluon_data.format import decode
    return hasattr(decode, "scaled_decoding")


class _LoaderUnder:
    """Gluon's ``DataLoader``, its worker processes forked under the environment ``env``
    (they read the decoding switches at each call, so they keep this setting)."""

    def __init__(self, env: dict):
        self.env = env

    def __call__(self, *args, **kwargs):
        import mxnet as mx
        with _environ(**self.env):
            return mx.gluon.data.DataLoader(*args, **kwargs)


def decode_limit_key(workers: int) -> str:
    return "large: decode limit, %d processes" % workers


def ratios(workers: int) -> list:
    """``(name, numerator row, denominator row, target)`` over :func:`rows`' rows."""
    dl = decode_limit_key(workers)
    return [
        ("ours large train / decode limit N", OURS, dl, 1.2),
        ("ours large train / gluoncv large train", OURS, GLUONCV, 5.0),
        ("ours large train: region on / off", OURS, OFF, None),
        ("ours large train: CPU per item, region off / on", OFF + CPU, OURS + CPU, None),
        ("ours large train: DCT-scaled / region on", SCALED, OURS, None),
        ("ours large train: CPU per item, region on / DCT-scaled", OURS + CPU, SCALED + CPU,
         None),
        ("ours large / decode limit N: CPU per item, inverse", dl + CPU, OURS + CPU, None),
        ("ours large / gluoncv large: CPU per item, inverse", GLUONCV + CPU, OURS + CPU, None),
    ]


def rows(workdir: str, n: int = 64, workers: int = 2, rounds: int = 3,
         batch_size: int = BATCH_SIZE, size: Sequence[int] = LARGE_SIZE,
         notes: Optional[dict] = None, say=print) -> Dict[str, float]:
    """Every row of the large set (items/s, and ``... CPU ms/item``): the set made or reused,
    packed into ``.rec`` (overwritten), then ``rounds`` interleaved rounds (after a warm-up epoch of each
    loader) of the loaders, the decode limit between them; each row its best round.
    ``notes`` gets a note on the DCT-scaled row where the package lacks the opt-in."""
    from gluoncv.data import VOCSegmentation

    from gluon_data.convert import convert
    from gluon_data.gluon.batchify import SegmentationBatchify
    from gluon_data.gluon.datasets import SegmentationRecordDataset

    cv2.setNumThreads(1)  # one single-threaded process per core, as the decode limit's
    root = large_root(workdir, n, size)
    voc = make_large(root, n, size)
    rec = os.path.join(root, "large.rec")  # packed again each run: the package's format now
    t0 = time.perf_counter()
    convert(voc, rec, "voc", split="train", workers=workers, overwrite=True)
    out_convert = len(os.listdir(os.path.join(voc, "JPEGImages"))) / (time.perf_counter() - t0)
    jpg_dir, png_dir = os.path.join(voc, "JPEGImages"), os.path.join(voc, "SegmentationClass")
    pairs = []
    for f in sorted(os.listdir(jpg_dir)):
        with open(os.path.join(jpg_dir, f), "rb") as a, \
                open(os.path.join(png_dir, f[:-4] + ".png"), "rb") as b:
            pairs.append((a.read(), b.read()))
    out = {"large: images": float(len(pairs)),
           "large: ours convert pass-through, items/s": out_convert,
           "large: mean JPEG KB": float(np.mean([len(a) for a, _ in pairs]) / 1024),
           "large: mean mask PNG KB": float(np.mean([len(b) for _, b in pairs]) / 1024)}
    say("large set: %d street scenes %dx%d, mean JPEG %.0f KB, mask PNG %.0f KB, in %s"
        % (len(pairs), size[0], size[1], out["large: mean JPEG KB"],
           out["large: mean mask PNG KB"], root))
    if not scaled_supported() and notes is not None:
        notes["large, DCT-scaled decode"] = (
            "gluon_data.format.decode has no scaled_decoding: %s is not supported by the "
            "installed package, so that row runs the region-on pipeline (it equals '%s' up "
            "to noise)" % (SCALED_ENV, OURS))
    dl = decode_limit_key(workers)

    def decode_limit():
        cpu = []
        out[dl] = max(out.get(dl, 0.0), _forked_decode_rate(pairs, workers, cpu))
        out[dl + CPU] = min(out.get(dl + CPU, float("inf")), cpu[0] * 1e3)

    kw = train_kw(size)
    batchify = SegmentationBatchify(channels_first=True)
    pipelines = [(name, SegmentationRecordDataset(rec, seed=0, **kw), batchify,
                  _LoaderUnder(env)) for name, env in _ENVS.items()]
    pipelines.append((GLUONCV, VOCSegmentation(root=root, split="train", **kw), None))
    decode_limit()
    cpu: dict = {}
    out.update(_loader_rates(pipelines, workers, rounds, between=decode_limit, cpu=cpu,
                             batch_size=batch_size))
    out.update((k + CPU, v) for k, v in cpu.items())
    return out


def report(say, large: Dict[str, float], workers: int, table=None):
    """Print the rows, then the ratios against their targets (added to ``table``, the full
    run's, when given; else a table of their own, returned)."""
    say("")
    say("%-56s %12s" % ("large images (items/s; CPU ms per item, all processes)", "value"))
    for k, v in large.items():
        say("%-56s %12.3f" % (k, v))
    say("")
    return _ratio_table(ratios(workers), large, say, table)


def run_large(workdir: str, n: int = 64, workers: int = 2, rounds: int = 3,
              batch_size: int = BATCH_SIZE, size: Sequence[int] = LARGE_SIZE,
              out=sys.stdout) -> dict:
    """``gluon-data bench --only large``: :func:`rows`, their table, the ratios and the
    notes. Returns ``{"rows", "ratios", "notes"}``."""
    def say(*a):
        print(*a, file=out, flush=True)

    os.makedirs(workdir, exist_ok=True)
    notes: dict = {}
    t0 = time.perf_counter()
    large = rows(workdir, n, workers, rounds, batch_size, size, notes, say)
    table = report(say, large, workers)
    missed = table.missed()
    judged = [k for k, (t, _) in table.targets.items() if t is not None]
    say("targets: %d of %d met%s" % (len(judged) - len(missed), len(judged),
                                     "; missed: " + "; ".join(missed) if missed else ""))
    for k, v in notes.items():
        say("note (%s): %s" % (k, v))
    say("large images: %.0f s" % (time.perf_counter() - t0))
    return {"rows": large, "ratios": table, "notes": notes}
