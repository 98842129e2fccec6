"""Source layouts: turn a folder (or an im2rec ``.lst``) into a list of items to convert.

A layout only lists files; it opens none of them. Reading and validating happens in
:mod:`gluon_data.convert`, in worker processes.

=============  ====================================================================
``pairs``      ``images/`` and ``masks/`` folders matched by file stem (segmentation)
``voc``        Pascal VOC: ``JPEGImages``, ``SegmentationClass``, ``ImageSets/Segmentation``
``imagefolder`` one sub-folder per class, classes sorted by name (classification)
``lst``        an im2rec ``.lst`` file: ``index<TAB>label[<TAB>label...]<TAB>relative/path``
``ade20k``     ``ADEChallengeData2016``: ``images/`` + ``annotations/`` x ``training``/``validation``
``cityscapes`` ``leftImg8bit/<split>/<city>/*_leftImg8bit.png`` + ``gtFine`` ``*_labelIds.png``
=============  ====================================================================
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, replace
from typing import Callable, Dict, List, Optional, Sequence, Tuple, cast

from .source_files import (DEFAULT_MAX_FILE_BYTES, confine,  # noqa: F401
                           read_regular, read_source_text)
from ..errors import SourceError

__all__ = ["Item", "Source", "LAYOUTS", "open_source", "detect_layout",
           "VOC_CLASSES", "voc_palette", "IMAGE_EXTENSIONS", "confine", "read_regular",
           "DEFAULT_MAX_FILE_BYTES"]

#: Source files larger than this are refused before reading (an image or mask of 256 MB is
#: not a training sample; a device or a sparse file would otherwise be read until memory
#: runs out). Override with ``max_file_bytes`` (CLI: ``--max-file-bytes``).

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff", ".ppm", ".pgm")
MASK_EXTENSIONS = (".png", ".bmp", ".tif", ".tiff", ".pgm", ".jpg", ".jpeg")  # jpeg refused later

#: VOC's classes exactly as gluoncv's ``VOCSegmentation.CLASSES`` names them.
VOC_CLASSES = ("background", "airplane", "bicycle", "bird", "boat", "bottle", "bus", "car",
               "cat", "chair", "cow", "diningtable", "dog", "horse", "motorcycle", "person",
               "potted-plant", "sheep", "sofa", "train", "tv")


def voc_palette(num_classes: int = 256) -> List[List[int]]:
    """The Pascal VOC colour map (the bit-interleaving scheme gluoncv and VOC use)."""
    out = []
    for j in range(num_classes):
        lab, r, g, b, i = j, 0, 0, 0, 0
        while lab:
            r |= ((lab >> 0) & 1) << (7 - i)
            g |= ((lab >> 1) & 1) << (7 - i)
            b |= ((lab >> 2) & 1) << (7 - i)
            i += 1
            lab >>= 3
        out.append([r, g, b])
    return out


@dataclass(frozen=True)
class Item:
    """One sample to convert: file paths plus, for classification, its label."""

    name: str                     # shown in reports: path relative to the source root
    image: str
    mask: Optional[str] = None
    label: object = None          # float or tuple of floats (classification)
    key: Optional[int] = None     # record key to use (lst layout); else the position


@dataclass
class Source:
    """What a layout found: the task, the items (per split when the layout has splits).

    ``mask_lut`` (256 entries) maps stored mask values to class ids at conversion time
    (ADE20K's shift, Cityscapes' label ids to train ids); ``pred_offset`` is recorded in the
    metadata so predictions can be mapped back to the dataset's original ids.
    """

    layout: str
    root: str
    task: str
    splits: Dict[str, List[Item]]
    classes: Optional[List[str]] = None
    problems: List[Tuple[str, str]] = field(default_factory=list)  # (file, reason)
    mask_lut: Optional[Tuple[int, ...]] = None
    pred_offset: int = 0
    palette: Optional[List[List[int]]] = None

    def name_classes(self, names: Sequence[str]) -> List[str]:
        """Take ``names`` (``--classes``) as the class names, and return them.

        Where the layout finds its classes by folder (``imagefolder``), the names are
        matched to the folders *by name*: each folder's label becomes its position in
        ``names``, so ``dog,fish,cat`` labels ``dog/`` 0 and ``cat/`` 2. A list that does
        not name exactly the folders (a name matching no folder, a folder not named, a name
        twice) is a :class:`SourceError` naming them; names are never paired with folders by
        position. Elsewhere the names rename the layout's labels in order."""
        names = list(names)
        if self.layout != "imagefolder" or self.classes is None:
            return names
        twice = sorted({n for n in names if names.count(n) > 1})
        unknown = [n for n in names if n not in self.classes]
        unnamed = [c for c in self.classes if c not in names]
        if twice or unknown or unnamed:
            why = ["names %s more than once" % ", ".join(twice)] if twice else []
            if unknown:
                why.append("no folder is named %s" % ", ".join(unknown))
            if unnamed:
                why.append("folder(s) %s not named" % ", ".join(c + "/" for c in unnamed))
            raise SourceError("--classes must name each class folder exactly once (a "
                              "folder's label is its position in the list): %s; the "
                              "folders are %s" % ("; ".join(why), ", ".join(self.classes)),
                              self.root)
        relabel = {float(i): float(names.index(c)) for i, c in enumerate(self.classes)}
        for split, items in self.splits.items():
            self.splits[split] = [replace(item, label=relabel[cast(float, item.label)])
                                  for item in items]
        self.classes = names
        return names


def _list_files(folder: str, exts: Sequence[str], root: str,
                problems: Optional[List[Tuple[str, str]]] = None) -> Dict[str, str]:
    """stem -> path for files with ``exts`` under ``folder`` (recursively).

    Directory symlinks are not followed (no loops); where a listed file may be read from is
    decided for every layout alike by :func:`confine` (in :func:`open_source`). Files sharing
    a stem (``a.jpg`` and ``a.png``) are never dropped silently: the first (by name) is kept
    and every other one is added to ``problems`` naming both; with ``problems=None`` the key
    is the relative path *with* its extension, so every file is listed.
    """
    out: Dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=False):
        dirnames.sort()
        for fn in sorted(filenames):
            if os.path.splitext(fn)[1].lower() not in exts:
                continue
            path = os.path.join(dirpath, fn)
            rel = os.path.relpath(path, folder)
            stem = os.path.splitext(rel)[0] if problems is not None else rel
            if stem in out:  # only with problems: without, every key is a distinct path
                if problems is not None:
                    problems.append((path, "shares the stem %r with %s, so which file pairs "
                                     "with it is ambiguous; rename or remove one of them (%s "
                                     "is the one kept)" % (stem, out[stem], out[stem])))
                continue
            out[stem] = path
    return out


def _pairs(root: str, split=None, images_dir="images", masks_dir="masks", **_) -> Source:
    img_dir, mask_dir = os.path.join(root, images_dir), os.path.join(root, masks_dir)
    for d in (img_dir, mask_dir):
        if not os.path.isdir(d):
            raise SourceError("layout 'pairs' needs folder %s (set --images-dir / --masks-dir)"
                              % d, root)
    problems: List[Tuple[str, str]] = []
    images = _list_files(img_dir, IMAGE_EXTENSIONS, root, problems)
    masks = _list_files(mask_dir, MASK_EXTENSIONS, root, problems)
    items = []
    for stem in sorted(images):
        rel = os.path.relpath(images[stem], root)
        if stem not in masks:
            items.append(Item(rel, images[stem], os.path.join(mask_dir, stem + ".png")))
        else:
            items.append(Item(rel, images[stem], masks[stem]))
    for stem in sorted(set(masks) - set(images)):
        problems.append((masks[stem], "mask has no matching image in %s" % img_dir))
    return Source("pairs", root, "segmentation", {split or "train": items}, None, problems)


def _voc_base(root: str) -> str:
    for cand in (root, os.path.join(root, "VOC2012"), os.path.join(root, "VOCdevkit", "VOC2012")):
        if os.path.isdir(os.path.join(cand, "JPEGImages")):
            return cand
    raise SourceError("not a VOC folder: no JPEGImages/ in it, in VOC2012/ or in "
                      "VOCdevkit/VOC2012/", root)


#: The one VOC split packed as images only when none of its masks exists (VOC's own ``test``);
#: in any other split a missing mask is a missing file, whatever the others do.
VOC_IMAGES_ONLY_SPLIT = "test"


def _voc(root: str, split=None, **_) -> Source:
    base = _voc_base(root)
    sets = os.path.join(base, "ImageSets", "Segmentation")
    available = sorted(os.path.splitext(f)[0] for f in os.listdir(sets)
                       if f.endswith(".txt")) if os.path.isdir(sets) else []
    wanted = split.split(",") if split else ["train"]
    splits = {}
    for s in wanted:
        if s not in available:
            raise SourceError("VOC split %r not found in %s; available: %s"
                              % (s, sets, ", ".join(available) or "none"), root)
        listing = os.path.join(sets, s + ".txt")
        ids: List[str] = []
        first: Dict[str, int] = {}  # id -> the line that listed it
        for lineno, line in enumerate(read_source_text(listing, "split file"), 1):
            i = line.strip()
            if not i:
                continue
            if i in first:  # packed twice, it would be two records of one image
                raise SourceError("split file lists %r twice (lines %d and %d)"
                                  % (i, first[i], lineno), listing)
            first[i] = lineno
            ids.append(i)
        found = [os.path.join(base, "SegmentationClass", i + ".png") for i in ids]
        masks: Sequence[Optional[str]] = found
        if s == VOC_IMAGES_ONLY_SPLIT and ids and not any(os.path.exists(m) for m in found):
            masks = [None] * len(ids)  # VOC's test split has no masks: images only
        splits[s] = [Item(os.path.join("JPEGImages", i + ".jpg"),
                          os.path.join(base, "JPEGImages", i + ".jpg"), m)
                     for i, m in zip(ids, masks)]
    return Source("voc", root, "segmentation", splits, list(VOC_CLASSES))


def _imagefolder(root: str, split=None, **_) -> Source:
    fits = _segmentation_tree(root)
    if fits is not None:  # its folders are not classes: refused, never packed as such
        layout, looks = fits
        raise SourceError("layout 'imagefolder' does not fit this source: it looks like %s, "
                          "whose folders are not classes (imagefolder would pack each as one, "
                          "masks and split lists included); use layout %r (--layout %s)"
                          % (looks, layout, layout), root)
    classes = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)))
    if not classes:
        raise SourceError("layout 'imagefolder' needs one sub-folder per class; none found", root)
    items = []
    for label, cls in enumerate(classes):
        for _stem, path in sorted(_list_files(os.path.join(root, cls), IMAGE_EXTENSIONS,
                                              root).items()):  # every file, a.jpg and a.png alike
            items.append(Item(os.path.relpath(path, root), path, None, float(label)))
    return Source("imagefolder", root, "classification", {split or "train": items}, classes)


#: Largest record key: the ``.idx`` stores keys as signed 64-bit integers.
_MAX_KEY = (1 << 63) - 1
_F32_MAX = 3.4028234663852886e38  # labels are stored as float32


def _lst(path: str, split=None, lst_root=None, **_) -> Source:
    root = lst_root or os.path.dirname(os.path.abspath(path))
    items, problems = [], []
    seen: Dict[int, Tuple[int, str]] = {}  # index -> (line, path) of its first use
    for lineno, line in enumerate(read_source_text(path, ".lst file"), 1):
        if not line.strip():
            continue
        fields = line.rstrip("\r\n").split("\t")
        where = "%s line %d" % (path, lineno)
        if len(fields) < 3:
            raise SourceError("expected 'index<TAB>label...<TAB>path', found %d fields"
                              % len(fields), where)
        try:
            key = int(fields[0])
            labels = [float(x) for x in fields[1:-1]]
        except ValueError as e:
            raise SourceError("bad index or label (%s)" % e, where) from None
        if not 0 <= key <= _MAX_KEY:
            raise SourceError("index %s out of range: record keys are integers 0..%d"
                              % (fields[0], _MAX_KEY), where)
        bad = [x for x in labels if not (math.isfinite(x) and abs(x) <= _F32_MAX)]
        if bad:
            raise SourceError("label %r is not a finite float32 number" % bad[0], where)
        rel = fields[-1]
        full = rel if os.path.isabs(rel) else os.path.join(root, rel)
        if key in seen:  # the index would hold two records under one key: unreadable
            problems.append((where, "index %d of %r is already used by line %d (%r); every "
                             "line needs its own index" % (key, rel, seen[key][0],
                                                           seen[key][1])))
            continue
        seen[key] = (lineno, rel)
        label = labels[0] if len(labels) == 1 else tuple(labels)
        items.append(Item(rel, full, None, label, key))
    return Source("lst", root, "classification", {split or "train": items}, None, problems)


def _split_dirs(root: str, split: Optional[str], names: Dict[str, str], where: str,
                 default: str = "train") -> Dict[str, str]:
    """Map requested splits (``train``, ``val``, ...) to their folder names under ``where``."""
    wanted = split.split(",") if split else [default]
    out = {}
    for s in wanted:
        folder = names.get(s, s)
        if not os.path.isdir(os.path.join(where, folder)):
            have = sorted(k for k, v in names.items() if os.path.isdir(os.path.join(where, v)))
            raise SourceError("split %r not found (no %s); available: %s"
                              % (s, os.path.join(where, folder), ", ".join(have) or "none"),
                              root)
        out[s] = folder
    return out


def _ade20k_base(root: str) -> str:
    for cand in (root, os.path.join(root, "ADEChallengeData2016")):
        if os.path.isdir(os.path.join(cand, "images")) and \
                os.path.isdir(os.path.join(cand, "annotations")):
            return cand
    raise SourceError("not an ADE20K folder: no images/ and annotations/ in it or in "
                      "ADEChallengeData2016/", root)


def _ade20k(root: str, split=None, **_) -> Source:
    base = _ade20k_base(root)
    splits: Dict[str, List[Item]] = {}
    problems: List[Tuple[str, str]] = []
    for s, folder in _split_dirs(root, split, {"train": "training", "val": "validation"},
                                 os.path.join(base, "images")).items():
        images = _list_files(os.path.join(base, "images", folder), IMAGE_EXTENSIONS, root,
                             problems)
        masks = os.path.join(base, "annotations", folder)
        splits[s] = [Item(os.path.relpath(images[stem], base), images[stem],
                          os.path.join(masks, stem + ".png")) for stem in sorted(images)]
    # ADE20K stores 0 = "other" and classes 1..150; gluoncv subtracts 1 when reading. The shift
    # happens here, once: stored ids are 0..149 and 0 becomes the ignore label 255.
    lut = (255,) + tuple(range(0, 255))
    return Source("ade20k", root, "segmentation", splits, list(ade20k_classes()),
                  problems=problems, mask_lut=lut, pred_offset=1)


#: ADE20K's 150 classes exactly as gluoncv's ``ADE20KSegmentation.CLASSES`` names them.
ADE20K_CLASSES = (
    'wall', 'building, edifice', 'sky', 'floor, flooring', 'tree', 'ceiling', 'road, route',
    'bed', 'windowpane, window', 'grass', 'cabinet', 'sidewalk, pavement',
    'person, individual, someone, somebody, mortal, soul', 'earth, ground',
    'door, double door', 'table', 'mountain, mount', 'plant, flora, plant life',
    'curtain, drape, drapery, mantle, pall', 'chair',
    'car, auto, automobile, machine, motorcar', 'water', 'painting, picture',
    'sofa, couch, lounge', 'shelf', 'house', 'sea', 'mirror', 'rug, carpet, carpeting',
    'field', 'armchair', 'seat', 'fence, fencing', 'desk', 'rock, stone',
    'wardrobe, closet, press', 'lamp', 'bathtub, bathing tub, bath, tub', 'railing, rail',
    'cushion', 'base, pedestal, stand', 'box', 'column, pillar', 'signboard, sign',
    'chest of drawers, chest, bureau, dresser', 'counter', 'sand', 'sink', 'skyscraper',
    'fireplace, hearth, open fireplace', 'refrigerator, icebox', 'grandstand, covered stand',
    'path', 'stairs, steps', 'runway', 'case, display case, showcase, vitrine',
    'pool table, billiard table, snooker table', 'pillow', 'screen door, screen',
    'stairway, staircase', 'river', 'bridge, span', 'bookcase', 'blind, screen',
    'coffee table, cocktail table', 'toilet, can, commode, crapper, pot, potty, stool, throne',
    'flower', 'book', 'hill', 'bench', 'countertop',
    'stove, kitchen stove, range, kitchen range, cooking stove', 'palm, palm tree',
    'kitchen island',
    'computer, computing machine, computing device, data processor, electronic computer, information processing system',
    'swivel chair', 'boat', 'bar', 'arcade machine', 'hovel, hut, hutch, shack, shanty',
    'bus, autobus, coach, charabanc, double-decker, jitney, motorbus, motorcoach, omnibus, passenger vehicle',
    'towel', 'light, light source', 'truck, motortruck', 'tower',
    'chandelier, pendant, pendent', 'awning, sunshade, sunblind', 'streetlight, street lamp',
    'booth, cubicle, stall, kiosk',
    'television receiver, television, television set, tv, tv set, idiot box, boob tube, telly, goggle box',
    'airplane, aeroplane, plane', 'dirt track', 'apparel, wearing apparel, dress, clothes',
    'pole', 'land, ground, soil', 'bannister, banister, balustrade, balusters, handrail',
    'escalator, moving staircase, moving stairway', 'ottoman, pouf, pouffe, puff, hassock',
    'bottle', 'buffet, counter, sideboard', 'poster, posting, placard, notice, bill, card',
    'stage', 'van', 'ship', 'fountain',
    'conveyer belt, conveyor belt, conveyer, conveyor, transporter', 'canopy',
    'washer, automatic washer, washing machine', 'plaything, toy',
    'swimming pool, swimming bath, natatorium', 'stool', 'barrel, cask', 'basket, handbasket',
    'waterfall, falls', 'tent, collapsible shelter', 'bag', 'minibike, motorbike', 'cradle',
    'oven', 'ball', 'food, solid food', 'step, stair', 'tank, storage tank',
    'trade name, brand name, brand, marque', 'microwave, microwave oven', 'pot, flowerpot',
    'animal, animate being, beast, brute, creature, fauna', 'bicycle, bike, wheel, cycle',
    'lake', 'dishwasher, dish washer, dishwashing machine',
    'screen, silver screen, projection screen', 'blanket, cover', 'sculpture',
    'hood, exhaust hood', 'sconce', 'vase', 'traffic light, traffic signal, stoplight', 'tray',
    'ashcan, trash can, garbage can, wastebin, ash bin, ash-bin, ashbin, dustbin, trash barrel, trash bin',
    'fan', 'pier, wharf, wharfage, dock', 'crt screen', 'plate', 'monitor, monitoring device',
    'bulletin board, notice board', 'shower', 'radiator', 'glass, drinking glass', 'clock',
    'flag',
)


def ade20k_classes() -> Tuple[str, ...]:
    """ADE20K's class names (:data:`ADE20K_CLASSES`)."""
    return ADE20K_CLASSES


CITYSCAPES_CLASSES = ("road", "sidewalk", "building", "wall", "fence", "pole", "traffic light",
                      "traffic sign", "vegetation", "terrain", "sky", "person", "rider", "car",
                      "truck", "bus", "train", "motorcycle", "bicycle")
#: Cityscapes label ids of the 19 evaluated classes, in train-id order.
CITYSCAPES_LABEL_IDS = (7, 8, 11, 12, 13, 17, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 31, 32, 33)
CITYSCAPES_PALETTE = [[128, 64, 128], [244, 35, 232], [70, 70, 70], [102, 102, 156],
                      [190, 153, 153], [153, 153, 153], [250, 170, 30], [220, 220, 0],
                      [107, 142, 35], [152, 251, 152], [70, 130, 180], [220, 20, 60],
                      [255, 0, 0], [0, 0, 142], [0, 0, 70], [0, 60, 100], [0, 80, 100],
                      [0, 0, 230], [119, 11, 32]]


def _cityscapes(root: str, split=None, **_) -> Source:
    splits = {}
    for s, folder in _split_dirs(root, split, {"train": "train", "val": "val", "test": "test"},
                                 os.path.join(root, "leftImg8bit")).items():
        img_dir = os.path.join(root, "leftImg8bit", folder)
        items = []
        for city in sorted(os.listdir(img_dir)):
            cdir = os.path.join(img_dir, city)
            if not os.path.isdir(cdir):
                continue
            for fn in sorted(os.listdir(cdir)):
                if not fn.endswith("_leftImg8bit.png"):
                    continue
                mask = os.path.join(root, "gtFine", folder, city,
                                    fn.replace("_leftImg8bit.png", "_gtFine_labelIds.png"))
                items.append(Item(os.path.join("leftImg8bit", folder, city, fn),
                                  os.path.join(cdir, fn), mask))
        splits[s] = items
    lut = [255] * 256
    for train_id, label_id in enumerate(CITYSCAPES_LABEL_IDS):
        lut[label_id] = train_id
    palette = CITYSCAPES_PALETTE + [[0, 0, 0]] * (255 - len(CITYSCAPES_PALETTE)) + [[0, 0, 0]]
    return Source("cityscapes", root, "segmentation", splits, list(CITYSCAPES_CLASSES),
                  mask_lut=tuple(lut), palette=palette)


LAYOUTS: Dict[str, Callable[..., Source]] = {
    "pairs": _pairs, "voc": _voc, "imagefolder": _imagefolder, "lst": _lst,
    "ade20k": _ade20k, "cityscapes": _cityscapes}


#: Every layout ``convert`` accepts: the folder layouts above and the LMDB imports.
ALL_LAYOUTS = tuple(sorted(list(LAYOUTS) + ["raw-lmdb", "caffe-lmdb"]))


def _segmentation_tree(path: str) -> Optional[Tuple[str, str]]:
    """The segmentation layout whose tree ``path`` has, and what the tree looks like in
    words, else ``None``: the one test :func:`detect_layout` picks a layout by and the
    ``imagefolder`` layout refuses a tree by (its folders would be taken for classes)."""
    def found(base, names):
        rel = os.path.relpath(base, path)
        return "%s%s" % (", ".join(n + "/" for n in names if os.path.isdir(
            os.path.join(base, n))), "" if rel == "." else " in %s/" % rel)
    try:
        base = _voc_base(path)
        return "voc", "a Pascal VOC tree (%s)" % found(
            base, ("JPEGImages", "SegmentationClass", "SegmentationObject", "ImageSets",
                   "Annotations"))
    except SourceError:
        pass
    try:
        base = _ade20k_base(path)
        return "ade20k", "an ADE20K tree (%s)" % found(base, ("images", "annotations"))
    except SourceError:
        pass
    if os.path.isdir(os.path.join(path, "leftImg8bit")) and \
            os.path.isdir(os.path.join(path, "gtFine")):
        return "cityscapes", "a Cityscapes tree (leftImg8bit/, gtFine/)"
    if os.path.isdir(os.path.join(path, "images")) and os.path.isdir(os.path.join(path,
                                                                                 "masks")):
        return "pairs", "image + mask pairs (images/, masks/)"
    return None


def detect_layout(path: str) -> str:
    """Guess the layout of ``path``; raise :class:`SourceError` listing the valid ones."""
    if os.path.isfile(path) and path.endswith(".lst"):
        return "lst"
    if os.path.isdir(path):
        fits = _segmentation_tree(path)
        if fits is not None:
            return fits[0]
        if any(os.path.isdir(os.path.join(path, d)) for d in os.listdir(path)):
            return "imagefolder"
    raise SourceError("cannot tell the layout of this source; pass --layout, one of: %s"
                      % ", ".join(ALL_LAYOUTS), path)


def open_source(path: str, layout: Optional[str] = None, *, follow_symlinks: bool = False,
                **options) -> Source:
    """List the items of a source folder or file in the given (or detected) layout.

    Every listed image and mask, whatever the layout, must lie under the source root
    (:func:`confine`): entries spelled outside it (``..``, absolute paths) and, unless
    ``follow_symlinks``, symlinks resolving outside it are moved to ``problems`` (a failed
    or a skipped item for the converter), never read.
    """
    path = os.fspath(path)
    if not os.path.exists(path):
        raise SourceError("source not found", path)
    if layout is None:
        layout = detect_layout(path)
    if layout not in LAYOUTS:
        raise SourceError("unknown layout %r; valid layouts: %s"
                          % (layout, ", ".join(ALL_LAYOUTS)), path)
    src = LAYOUTS[layout](path, **options)
    dirs: dict = {}
    for name, items in src.splits.items():
        kept = []
        for item in items:
            for f in (item.image, item.mask):
                why = None if f is None else confine(src.root, f, follow_symlinks, dirs)
                if why is not None:
                    src.problems.append((cast(str, f), why))  # why: only of a file
                    break
            else:
                kept.append(item)
        src.splits[name] = kept
    return src
