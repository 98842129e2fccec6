"""Converters: pack a source layout into RecordIO, validating every image and mask.

Each item is read and checked in a worker process (``workers``): images are decoded strictly
with Pillow (a truncated file is an error, not a grey half), masks are turned into class
indices (palette PNGs through their indices, never their colours), sizes and class ids are
checked. One writer in the parent appends records in source order, so the output is
deterministic for the same inputs and seed whatever the number of workers. Nothing appears
under the output's final name unless the whole conversion succeeded.
"""
from __future__ import annotations

import io
import math
import multiprocessing
import os
import random
import signal
import threading
import time
import warnings
from dataclasses import dataclass, field
from functools import partial
from typing import Dict, List, Optional, Sequence, Tuple

import cv2
import numpy as np
from PIL import Image

from . import __version__, codec
from .errors import ConversionError, DecodeError, FormatError, GluonDataError, SourceError
from .fsutil import OutputLock, atomic_write
from .meta import FORMAT_NAME, FORMAT_VERSION
from .lmdbio import LMDBFile, LMDBWriter, is_lmdb, names_lmdb, read_lmdb_meta
from .meta import ids_are_keys, read_meta
from .recordio import RecordFile, RecordWriter
from .sources import (DEFAULT_MAX_FILE_BYTES, Item, Source, open_source, read_regular,
                      voc_palette)

__all__ = ["convert", "copy_dataset", "import_lmdb", "ConversionReport", "EncodeOptions", "encode_item",
           "ENCODINGS", "FORMATS", "output_paths", "output_format"]

ENCODINGS = ("passthrough", "jpg", "png", "raw")
_PASSTHROUGH_FORMATS = ("JPEG", "PNG")


@dataclass(frozen=True)
class EncodeOptions:
    """How one item is validated and encoded (picklable, sent to worker processes)."""

    task: str
    encoding: str = "passthrough"
    quality: int = 95
    resize: int = 0
    num_classes: Optional[int] = None
    ignore_label: int = 255
    max_pixels: int = codec.DEFAULT_MAX_PIXELS
    checksum: bool = True
    mask_lut: Optional[Tuple[int, ...]] = None  # stored value -> class id (256 entries)
    mask_encoding: str = "zraw"  # "zraw" (zlib-compressed array) or "png"; raw with encoding=raw
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES


@dataclass
class ConversionReport:
    """What a conversion wrote and skipped. ``str(report)`` is the CLI's summary."""

    outputs: Dict[str, str] = field(default_factory=dict)
    written: Dict[str, int] = field(default_factory=dict)
    skipped: List[Dict[str, str]] = field(default_factory=list)
    bytes_written: int = 0
    seconds: float = 0.0

    @property
    def total_written(self) -> int:
        return sum(self.written.values())

    def __str__(self) -> str:
        lines = []
        for split, path in self.outputs.items():
            lines.append("wrote %d records to %s" % (self.written.get(split, 0), path))
        rate = self.total_written / self.seconds if self.seconds > 0 else 0.0
        lines.append("%d written, %d skipped, %.1f MB in %.1f s (%.0f items/s)"
                     % (self.total_written, len(self.skipped), self.bytes_written / 1e6,
                        self.seconds, rate))
        for s in self.skipped:
            lines.append("  skipped %s: %s" % (s["file"], s["reason"]))
        return "\n".join(lines)


# --------------------------------------------------------------------------- per item
def _read_bytes(path: str, what: str, max_bytes: int = DEFAULT_MAX_FILE_BYTES) -> bytes:
    """A source file's bytes: regular files only, at most ``max_bytes`` (see
    :func:`~gluon_data.sources.read_regular`)."""
    return read_regular(path, what, max_bytes)


def _check_pixels(data: bytes, path: str, what: str, max_pixels: int) -> None:
    hw = codec.image_size(data)
    if hw is not None and max_pixels and hw[0] * hw[1] > max_pixels:
        raise SourceError("%s of %dx%d pixels exceeds max_pixels=%d" % (what, hw[1], hw[0],
                                                                       max_pixels), path)


def _open_strict(data: bytes, path: str, what: str, max_pixels: int) -> Image.Image:
    _check_pixels(data, path, what, max_pixels)
    try:
        with warnings.catch_warnings():  # our own cap applies (above); PIL's warning is noise
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            im = Image.open(io.BytesIO(data))
        if max_pixels and im.size[0] * im.size[1] > max_pixels:
            raise SourceError("%s of %dx%d pixels exceeds max_pixels=%d"
                              % (what, im.size[0], im.size[1], max_pixels), path)
        im.load()  # strict: truncated data raises instead of decoding grey
    except SourceError:
        raise
    except Exception as e:  # PIL raises many types (OSError, SyntaxError, ValueError...)
        raise SourceError("%s is corrupt or not an image (%s: %s)"
                          % (what, type(e).__name__, e), path) from None
    return im


def _decode_like_reader(data: bytes, path: str, max_pixels: int) -> Optional[np.ndarray]:
    """RGB pixels of a JPEG, decoded strictly by the decoder the datasets use (so what
    converts also reads), or ``None`` for other formats and for JPEGs that decoder does not
    support (CMYK, ...), which Pillow then decodes and the converter re-encodes."""
    if data[:2] != b"\xff\xd8" or codec._sj is None:
        return None
    _check_pixels(data, path, "image", max_pixels)
    try:
        return codec.decode_image(data, 1, max_pixels=max_pixels)
    except DecodeError as e:
        if "nsupported" in e.reason:
            return None
        raise SourceError("image is corrupt or not an image (%s)" % e.reason, path) from None


_WIDE_COLOUR = ("RGB", "RGBA", "RGBX", "RGBa", "LA", "La", "PA")


def _mask_reduced(data: bytes, im: Image.Image) -> bool:
    """Whether Pillow reduced a mask's samples to 8 bits on opening (16-bit colour or
    grey+alpha PNG and TIFF): its class ids would silently change."""
    if im.mode not in _WIDE_COLOUR:
        return False
    if data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) >= 26 and data[12:16] == b"IHDR":
        return data[24] > 8
    bits = getattr(im, "tag_v2", {}).get(258) if hasattr(im, "tag_v2") else None
    if isinstance(bits, (tuple, list)):
        return any(int(b) > 8 for b in bits)
    return isinstance(bits, int) and bits > 8


def _mask_indices(im: Image.Image, path: str,
                  data: bytes = b"") -> Tuple[np.ndarray, Optional[List[int]]]:
    """Class indices of a mask image and its palette (flat RGB list) if it has one.

    Every mode Pillow opens either keeps its stored values exactly (a 1-bit mask gives 0/1,
    16-bit masks stay 16-bit) or is refused with :class:`SourceError`: colour masks whose
    channels differ, float masks, and samples Pillow would narrow to 8 bits.
    """
    mode = im.mode
    if _mask_reduced(data, im):
        raise SourceError("mask is a 16-bit %s image, which would be read narrowed to 8 bits "
                          "(its class ids changed); save masks as single-channel (grey or "
                          "palette) PNG" % mode, path)
    if mode == "P":
        return np.asarray(im, dtype=np.uint8), im.getpalette()
    if mode == "PA":  # palette indices plus an alpha channel: the indices are the classes
        return np.ascontiguousarray(np.asarray(im)[..., 0], dtype=np.uint8), im.getpalette()
    if mode == "1":  # bilevel: 0/1 (Pillow's "L" view would turn 1 into 255, the ignore id)
        return np.asarray(im).astype(np.uint8), None
    if mode == "L":
        return np.asarray(im, dtype=np.uint8), None
    if mode == "I" or mode.startswith("I;16"):
        a = np.asarray(im)
        if a.dtype.kind not in "iu":
            raise SourceError("unsupported mask mode %s" % mode, path)
        if a.size and (int(a.min()) < 0 or int(a.max()) > 65535):
            raise SourceError("mask ids %d..%d are outside 0..65535" % (a.min(), a.max()), path)
        return a.astype(np.uint16), None
    if mode in _WIDE_COLOUR:
        a = np.asarray(im)
        chans = a[..., :1] if mode in ("LA", "La") else a[..., :3]
        if all(np.array_equal(chans[..., 0], chans[..., c]) for c in range(1, chans.shape[-1])):
            return np.ascontiguousarray(chans[..., 0]), None
        raise SourceError("mask is a colour (%s) image; masks must hold class indices "
                          "(single-channel or palette PNG)" % mode, path)
    raise SourceError("unsupported mask mode %s (float or colour-space data are not class "
                      "indices); use a single-channel or palette PNG" % mode, path)


def _reads_back(data: bytes, path: str, what: str, max_pixels: int,
                expect: Optional[np.ndarray], refuse: bool = True) -> Optional[np.ndarray]:
    """Decode stored bytes with the reader's own decoder (:mod:`gluon_data.codec`), so what
    converts also reads. A mask must give back exactly ``expect``. On refusal: raise
    :class:`SourceError` (``refuse``) or return ``None``."""
    try:
        if what == "mask":
            out = codec.decode_mask(data, max_pixels=max_pixels, what=what)
        else:
            out = codec.decode_image(data, 1, max_pixels=max_pixels, what=what)
    except DecodeError as e:
        if not refuse:
            return None
        raise SourceError("the dataset reader would refuse this %s: %s" % (what, e.reason),
                          path) from None
    if expect is not None and not (out.shape == expect.shape and np.array_equal(out, expect)):
        raise SourceError("the %s does not read back as written (shape %s, expected %s)"
                          % (what, out.shape, expect.shape), path)
    return out


def _resize_short(a: np.ndarray, size: int, interp: int, max_pixels: int = 0,
                  path: Optional[str] = None) -> np.ndarray:
    h, w = a.shape[:2]
    if h <= w:
        nh, nw = size, max(1, int(round(w * size / h)))
    else:
        nh, nw = max(1, int(round(h * size / w))), size
    if max_pixels and nh * nw > max_pixels:  # a 1x30000 strip resized to 500 is 7.5e9 pixels
        raise SourceError("resizing this %dx%d image to a short side of %d makes it %dx%d, "
                          "more than max_pixels=%d" % (w, h, size, nw, nh, max_pixels), path)
    return cv2.resize(a, (nw, nh), interpolation=interp)


def _encode_pixels(rgb: np.ndarray, fmt: str, quality: int) -> bytes:
    if fmt == "jpg":
        params = [cv2.IMWRITE_JPEG_QUALITY, int(quality)]
    else:
        params = [cv2.IMWRITE_PNG_COMPRESSION, 3]
    bgr = cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR) if rgb.ndim == 3 else rgb
    ok, buf = cv2.imencode("." + fmt, bgr, params)
    if not ok:
        raise ValueError("OpenCV could not encode an image as %s" % fmt)
    return buf.tobytes()


def encode_item(item: Item, record_id: int, opts: EncodeOptions):
    """Read, validate and encode one item into a record payload.

    Returns ``(payload, info)``; raises :class:`SourceError` naming the bad file.
    ``info`` holds the stored image size, the mask's palette and class pixel counts.
    """
    data = _read_bytes(item.image, "image", opts.max_file_bytes)
    info: dict = {}
    rgb = (_decode_like_reader(data, item.image, opts.max_pixels)
           if opts.encoding == "passthrough" and not opts.resize else None)
    if rgb is not None:  # a JPEG kept as is, validated by the decoder that will read it
        (h, w), fmt, reencode = rgb.shape[:2], "JPEG", False
    else:
        im = _open_strict(data, item.image, "image", opts.max_pixels)
        w, h = im.size
        fmt = im.format
        # (a pass-through JPEG gets here only when the reader's decoder cannot read it)
        reencode = (opts.encoding != "passthrough" or fmt not in _PASSTHROUGH_FORMATS
                    or opts.resize or fmt == "JPEG")
    if not reencode and fmt != "JPEG" and \
            _reads_back(data, item.image, "image", opts.max_pixels, None, refuse=False) is None:
        reencode = True  # e.g. bytes after a PNG's IEND: Pillow reads it, our reader refuses
    if reencode:
        rgb = np.asarray(im.convert("RGB"))
        if opts.resize:
            rgb = _resize_short(rgb, opts.resize, cv2.INTER_AREA
                                if min(h, w) > opts.resize else cv2.INTER_LINEAR,
                                opts.max_pixels, item.image)
        data = image_part(rgb, opts, "jpg" if fmt == "JPEG" else "png")
    oh, ow = (rgb.shape[:2] if reencode else (h, w))
    info["hw"] = (oh, ow)
    _pixel_stats(rgb if rgb is not None else np.asarray(im.convert("RGB")), info)

    if opts.task == "classification":
        return codec.pack_classification(item.label, data, id=record_id,
                                         checksum=opts.checksum), info
    if item.mask is None:  # a split without masks (VOC test): the image alone
        return codec.pack_segmentation(data, b"", id=record_id, checksum=opts.checksum), info

    mdata = _read_bytes(item.mask, "mask", opts.max_file_bytes)
    if mdata[:2] == b"\xff\xd8":
        raise SourceError("mask is a JPEG: lossy compression invents class ids at edges; "
                          "provide PNG masks", item.mask)
    mim = _open_strict(mdata, item.mask, "mask", opts.max_pixels)
    mask, palette = _mask_indices(mim, item.mask, mdata)
    if opts.mask_lut is not None:
        if mask.dtype != np.uint8:
            raise SourceError("this layout expects 8-bit masks, got %s" % mask.dtype, item.mask)
        mask = np.asarray(opts.mask_lut, dtype=np.uint8)[mask]
        palette = None  # the source's colours described the old ids
    if mask.shape != (h, w):
        raise SourceError("mask is %dx%d but its image %s is %dx%d"
                          % (mask.shape[1], mask.shape[0], item.image, w, h), item.mask)
    if (oh, ow) != (h, w):
        mask = cv2.resize(mask, (ow, oh), interpolation=cv2.INTER_NEAREST)
    mbytes = mask_part(mask, opts, item.mask, info)
    _reads_back(mbytes, item.mask, "mask", opts.max_pixels, mask)
    info["palette"] = palette
    return codec.pack_segmentation(data, mbytes, id=record_id, checksum=opts.checksum), info


_LEVELS = np.arange(256, dtype=np.float64)


def _pixel_stats(rgb: np.ndarray, info: dict) -> None:
    """Per-channel sum and sum of squares (for the dataset's mean and std), exact: from a
    histogram of each channel for uint8 images (OpenCV's float32 bins count exactly up to
    2**24 pixels), else in float64."""
    c = rgb.shape[-1] if rgb.ndim == 3 else 1
    n = rgb.size // c
    if rgb.dtype == np.uint8 and n < (1 << 24):
        img = np.ascontiguousarray(rgb)
        hists = [cv2.calcHist([img], [k], None, [256], [0, 256]).ravel().astype(np.float64)
                 for k in range(c)]
        info["pix"] = (n, [float(h @ _LEVELS) for h in hists],
                       [float(h @ (_LEVELS * _LEVELS)) for h in hists])
        return
    flat = rgb.reshape(-1, c).astype(np.float64)
    info["pix"] = (flat.shape[0], flat.sum(0).tolist(), np.einsum("ij,ij->j", flat, flat).tolist())


def mask_part(mask: np.ndarray, opts: EncodeOptions, where: str, info: dict) -> bytes:
    """Check a mask's class ids against the declared classes, count its pixels per class
    into ``info["class_pixels"]``, and encode it (PNG, or raw for ``encoding='raw'``)."""
    if mask.dtype == np.uint8 and mask.size < (1 << 24):  # float32 bins count exactly
        counts = cv2.calcHist([np.ascontiguousarray(mask)], [0], None, [256],
                              [0, 256]).ravel().astype(np.int64)
    else:
        counts = np.bincount(mask.ravel(), minlength=256) if mask.dtype == np.uint8 else None
    if counts is not None:
        ids = np.flatnonzero(counts)
        pix = counts[ids]
    else:
        ids, pix = np.unique(mask, return_counts=True)
    if opts.num_classes is not None:
        bad = [int(i) for i in ids if i >= opts.num_classes and i != opts.ignore_label]
        if bad:
            raise SourceError("mask holds class ids %s outside the %d declared classes "
                              "(0..%d, ignore %d)" % (bad, opts.num_classes, opts.num_classes - 1,
                                                      opts.ignore_label), where)
    info["class_pixels"] = {int(i): int(c) for i, c in zip(ids, pix)}
    if opts.encoding == "raw":
        return codec.encode_raw(mask)
    if opts.mask_encoding == "png":
        return codec.encode_mask(mask)
    return codec.encode_raw(mask, compress=1)


def image_part(rgb: np.ndarray, opts: EncodeOptions, fmt_if_passthrough: str) -> bytes:
    """Encode decoded RGB pixels for storage as ``opts.encoding`` asks."""
    target = opts.encoding if opts.encoding != "passthrough" else fmt_if_passthrough
    if target == "raw":
        return codec.encode_raw(rgb)
    return _encode_pixels(rgb, target, opts.quality)


def _work(job, opts: EncodeOptions):
    pos, item = job
    record_id = item.key if item.key is not None else pos
    try:
        payload, info = encode_item(item, record_id, opts)
        return pos, payload, info, None
    except GluonDataError as e:
        return pos, None, None, (e.path or item.name, e.reason)


def _worker_init():
    cv2.setNumThreads(1)  # one process per core already; safe in a fresh (spawned) process
    # Ctrl-C reaches the whole process group: only the parent acts on it (it stops the pool).
    # A worker killed by it mid-task could die holding the task queue's lock, and the
    # parent's Pool.terminate() would then wait for that lock forever.
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _start_pool(workers: int):
    """A spawn pool whose workers never see SIGINT, not even while they start: the signal is
    blocked while they are created (a blocked signal stays blocked across fork and exec), so
    an interrupt during start-up waits in the parent and is raised there right after."""
    ctx = multiprocessing.get_context("spawn")
    block = hasattr(signal, "pthread_sigmask") and \
        threading.current_thread() is threading.main_thread()
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT}) if block else None
    try:
        return ctx.Pool(workers, initializer=_worker_init)
    finally:
        if block:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _stop_pool(pool, timeout: float = 5.0) -> None:
    """Terminate a pool within ``timeout`` seconds whatever state it is in, reaping every
    worker: ``Pool.terminate`` runs in a helper thread; if it has not returned in time (a
    worker killed from outside while it held a queue lock), the workers are killed."""
    procs = list(getattr(pool, "_pool", []))
    t = threading.Thread(target=pool.terminate, name="gluon-data-pool-stop", daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        for p in procs + list(getattr(pool, "_pool", [])):
            try:
                p.kill()
            except (OSError, AttributeError, ValueError):
                pass
    for p in procs + list(getattr(pool, "_pool", [])):
        try:
            p.join(timeout)
        except (OSError, AssertionError, ValueError):
            pass


# --------------------------------------------------------------------------- driver
FORMATS = ("rec", "lmdb")


def output_format(output: str, fmt: Optional[str] = None) -> str:
    """``fmt`` if given, else ``lmdb`` for a ``.lmdb`` output and ``rec`` otherwise."""
    if fmt is None:
        fmt = "lmdb" if names_lmdb(output) else "rec"
    if fmt not in FORMATS:
        raise ValueError("unknown format %r; valid: %s" % (fmt, ", ".join(FORMATS)))
    return fmt


def output_paths(output: str, splits: Sequence[str], fmt: str = "rec") -> Dict[str, str]:
    """RecordIO: one split is ``output`` itself, several ``NAME_<split>.rec`` beside it.
    LMDB: every split lives in the one ``output`` environment."""
    if fmt == "lmdb" or len(splits) == 1:
        return {s: output for s in splits}
    stem, ext = os.path.splitext(output)
    return {s: "%s_%s%s" % (stem, s, ext or ".rec") for s in splits}


def open_writers(output: str, splits: Sequence[str], fmt: str, overwrite: bool):
    """One writer per split with the RecordWriter interface; nothing visible until publish."""
    paths = output_paths(os.fspath(output), list(splits), fmt)
    if fmt == "lmdb":
        env = LMDBWriter(os.fspath(output), overwrite=overwrite)
        return paths, {s: env.split(s) for s in splits}
    writers = {}
    try:
        for s, path in paths.items():  # refuse to overwrite before any work is done
            writers[s] = RecordWriter(path, overwrite=overwrite)
    except BaseException:
        for w in writers.values():
            w.abort()
        raise
    return paths, writers


def _free_space(path: str) -> str:
    try:
        st = os.statvfs(os.path.dirname(os.path.abspath(path)) or ".")
        return "%d bytes free" % (st.f_bavail * st.f_frsize)
    except OSError:
        return "free space unknown"


def _output_lock(output: str, splits: Sequence[str], fmt: str) -> OutputLock:
    """Hold the exclusive lock of every path a conversion to ``output`` writes (the output
    itself names the checkpoint); a second conversion to any of them fails at once."""
    paths = output_paths(os.fspath(output), list(splits), fmt)
    return OutputLock([os.fspath(output)] + list(paths.values())).acquire()


def _fail(exc: BaseException, writers, output: str, ckpt: "Optional[_Checkpoint]" = None) -> None:
    """Clean up after a failed or interrupted conversion, then re-raise (an I/O or LMDB
    error as one :class:`ConversionError` naming the output).

    Where a checkpoint was taken (``ckpt.saved``), the partial files and the checkpoint are
    kept, closed, for ``--resume`` to continue from; otherwise every partial output and any
    checkpoint file is removed, so nothing that ``--resume`` would refuse stays behind.
    """
    import lmdb
    keep = ckpt is not None and ckpt.saved
    for w in writers.values():
        if w._state in ("open", "finished"):
            if keep:
                w.suspend()
            else:
                w.abort()
    if ckpt is not None and not keep:
        ckpt.remove()
    hint = ("; the partial output and its checkpoint are kept: rerun the same command with "
            "--resume to continue" if keep else "")
    if isinstance(exc, OSError) and not isinstance(exc, FileExistsError):
        import errno
        reason = exc.strerror or str(exc)
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            reason += " (%s)" % _free_space(output)
        raise ConversionError("writing failed: %s%s" % (reason, hint),
                              getattr(exc, "filename", None) or output) from exc
    if isinstance(exc, lmdb.Error):  # LMDB reports a full disk as EIO or ENOSPC
        raise ConversionError("writing the LMDB environment failed: %s (the disk may be full: "
                              "%s)%s" % (exc, _free_space(output), hint), output) from exc
    if isinstance(exc, ConversionError) and hint:
        raise ConversionError(exc.reason + hint, exc.path, exc.key, exc.offset) from None
    raise exc


def _check_range(name: str, value, lo, hi=None, what: str = "") -> None:
    ok = isinstance(value, (int, float, np.integer, np.floating)) and \
        not isinstance(value, bool) and math.isfinite(value) and value >= lo and \
        (hi is None or value <= hi)
    if not ok:
        raise ValueError("%s (--%s) must be %s, got %r"
                         % (name, name.replace("_", "-"),
                            what or ("%s..%s" % (lo, hi) if hi is not None else ">= %s" % lo),
                            value))


def _check_options(*, quality=95, resize=0, workers=1, max_pixels=1, max_file_bytes=1,
                   checkpoint_every=1, ignore_label=255, num_classes=None) -> None:
    """Refuse option values that cannot work, before anything is read or written."""
    _check_range("quality", quality, 0, 100, "a JPEG quality 0..100")
    _check_range("resize", resize, 0, what="0 (keep the size) or a positive short side")
    _check_range("workers", workers, 1)
    _check_range("max_pixels", max_pixels, 1)
    _check_range("max_file_bytes", max_file_bytes, 1)
    _check_range("checkpoint_every", checkpoint_every, 1)
    _check_range("ignore_label", ignore_label, 0, 65535, "a mask value 0..65535")
    if num_classes is not None:
        _check_range("num_classes", num_classes, 1)


def _check_output(output, fmt: str) -> str:
    """Refuse an output that cannot be written (empty name, a directory where a ``.rec``
    goes, a file where an LMDB directory goes, a missing or read-only folder) with one
    clear error, before any work is done."""
    output = os.fspath(output)
    if not output or not output.strip() or not os.path.basename(output.rstrip("/")):
        raise ValueError("output name is empty: give a file name (e.g. data.rec or data.lmdb)")
    if fmt == "rec" and os.path.isdir(output):
        raise ConversionError("output is a directory; a .rec output is a file name (for an "
                              "LMDB directory use a .lmdb name or --format lmdb)", output)
    if fmt == "lmdb" and os.path.exists(output) and not os.path.isdir(output):
        raise ConversionError("output exists and is not a directory; an LMDB output is a "
                              "directory", output)
    parent = os.path.dirname(os.path.abspath(output.rstrip("/") or output))
    probe = parent
    while not os.path.exists(probe):  # the writers create missing folders
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe):
        raise ConversionError("cannot create the output folder: %s is not a directory"
                              % probe, output)
    if not os.access(probe, os.W_OK | os.X_OK):
        import errno
        try:
            os.statvfs(probe)
            ro = bool(os.statvfs(probe).f_flag & os.ST_RDONLY)
        except (OSError, AttributeError):
            ro = False
        raise ConversionError("cannot write to the output folder %s: %s"
                              % (probe, os.strerror(errno.EROFS) if ro else "permission denied"),
                              output)
    return output


def _plan(src: Source, val_ratio: float, shuffle: bool, seed: int) -> Dict[str, List[Item]]:
    splits = {k: list(v) for k, v in src.splits.items()}
    if shuffle:
        rng = random.Random(seed)
        for k in splits:
            rng.shuffle(splits[k])
    if val_ratio:
        if not 0 < val_ratio < 1:
            raise ValueError("val_ratio must lie in (0, 1), got %r" % val_ratio)
        if len(splits) != 1:
            raise ValueError("val_ratio splits a single list; this source already has splits %s"
                             % sorted(splits))
        (items,) = splits.values()
        nval = min(len(items) - 1, max(1, int(round(len(items) * val_ratio))))
        if nval < 1:
            raise ValueError("val_ratio needs at least 2 items, source has %d" % len(items))
        splits = {"train": items[:-nval], "val": items[-nval:]}
    return splits


def convert(source: str, output: str, layout: Optional[str] = None, *,
            split: Optional[str] = None, val_ratio: float = 0.0, shuffle: bool = False,
            seed: int = 0, encoding: str = "passthrough", quality: int = 95, resize: int = 0,
            workers: int = 1, overwrite: bool = False, on_error: str = "fail",
            classes: Optional[Sequence[str]] = None, num_classes: Optional[int] = None,
            ignore_label: int = 255, images_dir: str = "images", masks_dir: str = "masks",
            lst_root: Optional[str] = None, max_pixels: int = codec.DEFAULT_MAX_PIXELS,
            format: Optional[str] = None, image_shape: Optional[Sequence[int]] = None,
            mask_shape: Optional[Sequence[int]] = None, channels_first: bool = False,
            bgr: bool = False, resume: bool = False, checkpoint_every: int = 64,
            progress: bool = False, mask_encoding: str = "zraw",
            follow_symlinks: bool = False,
            max_file_bytes: int = DEFAULT_MAX_FILE_BYTES) -> ConversionReport:
    """Convert a source folder or ``.lst`` into RecordIO (``.rec`` + ``.idx`` + metadata).

    Parameters
    ----------
    source : str
        Folder (``pairs``, ``voc``, ``imagefolder``), ``.lst`` file (``lst``), or a dataset
        to copy into the other container: a ``.rec`` or a ``.lmdb`` directory.
    output : str
        The ``.rec`` to write (several splits: ``NAME_<split>.rec`` beside it), or a
        ``.lmdb`` directory holding every split.
    layout : str, optional
        One of ``pairs``, ``voc``, ``imagefolder``, ``lst``; detected when omitted.
    split : str, optional
        VOC split(s) to convert, comma separated (default ``train``).
    val_ratio : float
        Move this fraction of the (shuffled) items into a ``val`` split.
    shuffle, seed
        Shuffle the item order with ``random.Random(seed)``; output is deterministic.
    encoding : {'passthrough', 'jpg', 'png', 'raw'}
        ``passthrough`` stores JPEG/PNG bytes unchanged (other formats become PNG);
        ``raw`` stores decoded uint8 arrays with their shape (no decode cost, more disk).
    quality : int
        JPEG quality when re-encoding.
    resize : int
        Resize the shorter side to this many pixels (masks by nearest neighbour); 0 = keep.
    mask_encoding : {'zraw', 'png'}
        How masks are stored: ``zraw`` (default), the class ids as one zlib stream (as small
        as PNG, ~3x faster to decode and ~7x faster to encode), or a single-channel PNG.
    workers : int
        Processes that read, validate and encode; one ordered writer.
    overwrite : bool
        Replace existing outputs; otherwise an existing output is an error.
    on_error : {'fail', 'skip'}
        ``fail``: the first bad item aborts the conversion, nothing is written.
        ``skip``: bad items are skipped and listed in the report and the metadata.
    classes, num_classes
        Declared classes (names, or only their number). Mask ids outside them, other than
        ``ignore_label``, are errors. VOC declares its 21 classes.
    ignore_label : int
        Mask value meaning "not labelled" (VOC: 255).
    format : {'rec', 'lmdb'}, optional
        Output container; by default ``lmdb`` when ``output`` ends in ``.lmdb``.
    image_shape, mask_shape, channels_first, bgr
        Layout ``raw-lmdb`` only (see :mod:`gluon_data.legacy`): the stored array shapes,
        whether images are stored CxHxW, and whether their channels are BGR.
    resume : bool
        Continue an interrupted conversion from its last checkpoint, taken every
        ``checkpoint_every`` items (RecordIO: ``OUTPUT.resume.json`` after an fsync; LMDB:
        inside the partial environment, in the same transaction as the records). The result
        equals an uninterrupted run (RecordIO: byte for byte); a checkpoint made with other
        inputs or options is refused. A conversion that failed or was interrupted (Ctrl-C,
        SIGTERM, a full disk) after its first checkpoint keeps its partial files and the
        checkpoint for this; one that failed before leaves nothing behind.
    follow_symlinks : bool
        Read files through symlinks that resolve outside the source root (refused by
        default, as are listed paths with ``..`` or absolute paths, in every layout).
    max_file_bytes : int
        Refuse source files larger than this (only regular files are ever read).
    max_pixels : int
        Refuse images whose decoded size, or whose size after ``resize``, exceeds this.

    Returns
    -------
    ConversionReport

    Raises
    ------
    ConversionError
        On a bad item (``on_error='fail'``), an empty source or a write failure.

    Examples
    --------
    >>> report = convert("VOCdevkit", "voc_train.rec", layout="voc", split="train")  # doctest: +SKIP
    >>> print(report)                                                                 # doctest: +SKIP
    wrote 1464 records to voc_train.rec
    """
    _check_choices(encoding, on_error)
    if mask_encoding not in ("zraw", "png"):
        raise ValueError("unknown mask_encoding %r; valid: zraw, png" % (mask_encoding,))
    _check_options(quality=quality, resize=resize, workers=workers, max_pixels=max_pixels,
                   max_file_bytes=max_file_bytes, checkpoint_every=checkpoint_every,
                   ignore_label=ignore_label, num_classes=num_classes)
    fmt = output_format(output, format)
    _check_output(output, fmt)
    source = os.fspath(source)
    if layout in ("raw-lmdb", "caffe-lmdb"):
        return import_lmdb(source, output, layout, split=split, image_shape=image_shape,
                           mask_shape=mask_shape, channels_first=channels_first, bgr=bgr,
                           encoding=encoding, quality=quality, classes=classes,
                           num_classes=num_classes, ignore_label=ignore_label, format=fmt,
                           overwrite=overwrite, on_error=on_error, max_pixels=max_pixels,
                           progress=progress)
    if source.endswith(".rec") or is_lmdb(source):
        return copy_dataset(source, output, split=split, format=fmt, overwrite=overwrite,
                            progress=progress)
    t0 = time.perf_counter()
    try:
        src = open_source(source, layout, split=split, images_dir=images_dir,
                          masks_dir=masks_dir, lst_root=lst_root,
                          follow_symlinks=follow_symlinks)
    except SourceError as e:
        raise ConversionError("cannot read source: %s" % e.reason, e.path or source) from None
    if classes is None and src.classes is not None:
        classes = src.classes
    if classes is not None:
        classes = list(classes)
        if num_classes is not None and num_classes != len(classes):
            raise ValueError("num_classes=%d disagrees with %d class names"
                             % (num_classes, len(classes)))
        num_classes = len(classes)
    plan = _plan(src, val_ratio, shuffle, seed)
    report = ConversionReport(outputs=output_paths(os.fspath(output), list(plan), fmt))
    for f, reason in src.problems:
        if on_error == "fail":
            raise ConversionError(reason, f)
        report.skipped.append({"file": f, "reason": reason})
    if not any(plan.values()):
        raise ConversionError("source holds no items to convert (layout %r)" % src.layout,
                              source)
    opts = EncodeOptions(task=src.task, encoding=encoding, quality=quality, resize=resize,
                         num_classes=num_classes if src.task == "segmentation" else None,
                         ignore_label=ignore_label, max_pixels=max_pixels,
                         mask_lut=src.mask_lut, mask_encoding=mask_encoding,
                         max_file_bytes=max_file_bytes)
    writers: Dict[str, RecordWriter] = {}
    stats: Dict[str, _Stats] = {}
    pool = None
    total = sum(len(v) for v in plan.values())
    options = dict(encoding=encoding, quality=quality, resize=resize, shuffle=shuffle,
                   seed=seed, val_ratio=val_ratio, on_error=on_error)
    # one writer per output at a time, from the first look at the checkpoint to publish
    lock = _output_lock(output, list(plan), fmt)
    try:
        ckpt = _Checkpoint(output, _plan_digest(src, plan, opts, options), fmt)
        state = ckpt.load() if resume else None
        if not resume:
            ckpt.remove()
        if resume:
            done = _resume_finished(state, ckpt, report, src, options, fmt)
            if done is not None:
                done.seconds = time.perf_counter() - t0
                return done
        bar = None
        if progress:
            from tqdm import tqdm
            bar = tqdm(total=total, unit="img", desc="convert", dynamic_ncols=True)
        try:
            if state is None:
                _, writers = open_writers(output, list(plan), fmt, overwrite)
            elif fmt == "lmdb":
                report.skipped[:] = state["skipped"]
                env = LMDBWriter(os.fspath(output), overwrite=True, resume=True)
                writers = {s: env.split(s, tuple(state["splits"][s]["writer"])
                                        if s in state["splits"] else (0, 0)) for s in plan}
            else:
                report.skipped[:] = state["skipped"]
                writers = {s: RecordWriter(p, resume=tuple(state["splits"][s]["writer"])
                                           if s in state["splits"] else None, overwrite=True)
                           for s, p in report.outputs.items()}
            if workers > 1:
                # spawn, not fork: a forked child inherits OpenCV's thread pool in whatever state
                # the parent's threads left it and can deadlock in its first OpenCV call.
                pool = _start_pool(workers)
            fn = partial(_work, opts=opts)
            for s, items in plan.items():
                w = writers[s]
                done = state["splits"][s] if state is not None and s in state["splits"] else None
                st = _Stats.from_state(done["stats"]) if done else _Stats()
                start = done["done"] if done else 0
                stats[s] = st
                if bar is not None:
                    bar.update(start)
                jobs = list(enumerate(items))[start:]
                results = (pool.imap(fn, jobs, chunksize=4) if pool is not None else map(fn, jobs))
                for pos, payload, info, err in results:
                    if bar is not None:
                        bar.update(1)
                    item = items[pos]
                    if err is not None:
                        if on_error == "fail":
                            raise ConversionError(err[1], err[0])
                        report.skipped.append({"file": err[0], "reason": err[1]})
                    else:
                        key = item.key if item.key is not None else w.count
                        if item.key is None and pos != key:  # items were skipped before it:
                            payload = codec.with_id(payload, key)  # header id = the key
                        w.write(key, payload)
                        st.add(info)
                        if src.task == "segmentation":  # gluoncv's mode='test' returns it
                            st.names.append(os.path.basename(item.image))
                    if (pos + 1) % checkpoint_every == 0:
                        ckpt.save(s, pos + 1, w, st, report.skipped)
                ckpt.save(s, len(items), w, st, report.skipped)
                report.written[s] = w.count
            if report.total_written == 0:
                raise ConversionError("no item could be converted (%d skipped)" % len(report.skipped),
                                      source)
            for s, w in writers.items():
                if w.count == 0:
                    raise ConversionError("split %r would be empty" % s, source)
                meta = _metadata(src, s, w.count, stats[s], opts, classes, num_classes,
                                 report.skipped, options)
                meta.update(_split_fields(src, s, ckpt.digest, w, stats[s], plan[s]))
                w.finish(meta)
                report.bytes_written += w.bytes_written
            ckpt.mark_publishing()
            for w in writers.values():
                w.publish()
            ckpt.remove()
            if pool is not None:  # all results are in: let the workers exit on their own
                pool.close()
                pool.join()
                pool = None
        except BaseException as e:
            if pool is not None:  # stop the workers first: they may still read the source
                _stop_pool(pool)
                pool = None
            _fail(e, writers, output, ckpt)
        finally:
            if pool is not None:
                _stop_pool(pool)
            if bar is not None:
                bar.close()
        report.seconds = time.perf_counter() - t0
        return report
    finally:
        lock.release()


class _Stats:
    """Accumulates what the metadata reports: sizes, class statistics, pixel mean/std.

    Only aggregates are kept, so the state is small and goes into resume checkpoints
    (:meth:`state` / :meth:`from_state` round-trip exactly through JSON).
    """

    def __init__(self):
        self.count = 0
        self.hw_min = [1 << 62, 1 << 62]
        self.hw_max = [0, 0]
        self.hw_sum = [0, 0]
        self.class_pixels: Dict[int, int] = {}
        self.class_images: Dict[int, int] = {}
        self.class_image_pixels: Dict[int, int] = {}  # pixels of the images holding the class
        self.palette = None
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

    def merge(self, other: "_Stats") -> None:
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
    def from_state(cls, d: dict) -> "_Stats":
        st = cls()
        for k, v in d.items():
            setattr(st, k, {int(c): n for c, n in v.items()} if k in cls._DICTS else v)
        return st


def _metadata(src: Source, split: str, count: int, st: _Stats, opts: EncodeOptions,
              classes, num_classes, skipped, options) -> dict:
    meta = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "task": src.task,
        "split": split,
        "num_records": count,
        "checksum": "crc32-id2",
        "image_encoding": opts.encoding,
        "image_size": st.image_size(),
        "created_by": {"tool": "gluon_data %s" % __version__, "layout": src.layout,
                       "source": os.path.abspath(src.root), "options": options},
        "skipped": list(skipped),
        "image_stats": st.mean_std(),
    }
    if src.task == "segmentation":
        present = sorted(st.class_pixels)
        if num_classes is None:
            real = [i for i in present if i != opts.ignore_label]
            num_classes = (max(real) + 1) if real else 1
        if classes is None:
            classes = ["class_%d" % i for i in range(num_classes)]
        pal = st.palette
        palette = (src.palette if src.palette else
                   [pal[3 * i:3 * i + 3] for i in range(min(len(pal) // 3, 256))] if pal
                   else voc_palette(256))
        meta.update({
            "classes": list(classes), "num_classes": num_classes,
            "ignore_label": opts.ignore_label,
            "mask_encoding": "raw" if opts.encoding == "raw" else opts.mask_encoding,
            "palette": palette,
            "class_pixels": {str(k): v for k, v in sorted(st.class_pixels.items())},
            "class_images": {str(k): v for k, v in sorted(st.class_images.items())},
            "class_image_pixels": {str(k): v for k, v in
                                   sorted(st.class_image_pixels.items())},
            "pred_offset": src.pred_offset,
        })
    else:
        meta.update({"classes": list(classes) if classes is not None else None,
                     "num_classes": len(classes) if classes is not None else None})
    return meta


def _split_fields(src: Source, split: str, digest: str, writer, st: "_Stats",
                  items: Sequence[Item]) -> dict:
    """Metadata fields of a split as written: its ``conversion_id``, and for segmentation
    the ``item_names`` (gluoncv's mode='test' returns them) and ``masks: false`` when no
    item has a mask (e.g. VOC test)."""
    out = {"conversion_id": _conversion_id(digest, split, writer, st)}
    if src.task == "segmentation":
        out["item_names"] = list(st.names)
        if all(i.mask is None for i in items):
            out["masks"] = False  # images only: mode='test'
    return out


def _conversion_id(digest: str, split: str, writer, st: "_Stats") -> str:
    """The identity stamp readers compare on reopen (FORMAT.md): derived from the plan, the
    split and what was written, so equal inputs still give byte-identical outputs while a
    conversion that wrote anything else gets another id."""
    import hashlib
    import json
    doc = [digest, split, writer.count, writer.bytes_written, st.state()]
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()[:32]


def _plan_digest(src: Source, plan: Dict[str, List[Item]], opts: EncodeOptions,
                 options: dict) -> str:
    """Identity of a conversion: a checkpoint only resumes the same inputs and options."""
    import hashlib
    import json
    def rel(p):  # the same source spelled relative or absolute has the same digest
        return None if p is None else os.path.relpath(p, src.root)

    doc = {"source": os.path.abspath(src.root), "layout": src.layout, "options": options,
           "opts": repr(opts), "plan": {s: [(i.name, rel(i.image), rel(i.mask), i.label, i.key)
                                            for i in items] for s, items in plan.items()}}
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()


class _Checkpoint:
    """Resume state: per split, items done, writer position and statistics.

    RecordIO: ``OUTPUT.resume.json``, replaced atomically after the partial files were
    fsynced, so it never promises bytes that are not on disk. LMDB: the same document in the
    partial environment, committed in the same transaction as the records it describes.
    """

    def __init__(self, output: str, digest: str, fmt: str):
        self.output = os.fspath(output)
        self.path = self.output + ".resume.json"
        self.digest = digest
        self.fmt = fmt
        self.splits: Dict[str, dict] = {}
        self.saved = False  # a checkpoint describes partial files on disk

    def load(self) -> Optional[dict]:
        import json
        try:
            if self.fmt == "lmdb":
                raw = LMDBWriter.read_progress(self.output)
                if raw is None:
                    return None
                state = json.loads(raw.decode("utf-8"))
            else:
                with open(self.path, encoding="utf-8") as f:
                    state = json.load(f)
        except FileNotFoundError:
            return None
        except ValueError as e:
            raise ConversionError("resume checkpoint is unreadable (%s); rerun without "
                                  "--resume" % e, self.path) from None
        if state.get("digest") != self.digest:
            raise ConversionError("this checkpoint belongs to a conversion with other inputs or "
                                  "options; rerun with the same ones, or without --resume",
                                  self.path if self.fmt == "rec" else self.output)
        self.splits = state["splits"]
        self.saved = True
        return state

    def _doc(self, skipped, **extra) -> dict:
        return dict({"digest": self.digest, "splits": self.splits, "skipped": skipped}, **extra)

    def save(self, split: str, done: int, writer, stats: "_Stats", skipped) -> None:
        import json
        entry = {"done": done, "stats": stats.state()}
        if self.fmt == "lmdb":
            entry["writer"] = [writer.count, writer.bytes_written]  # buffered ones included
            self.splits[split] = entry
            writer.checkpoint(json.dumps(self._doc(skipped)).encode("utf-8"))
            self.saved = True
            return
        entry["writer"] = list(writer.sync())
        self.splits[split] = entry
        self._write(self._doc(skipped))

    def _write(self, doc: dict) -> None:
        import json
        from .fsutil import check_replaceable
        from .fsutil import fsync_dir
        check_replaceable(self.path, "checkpoint", True)  # never a link, never a user's file
        atomic_write(self.path, json.dumps(doc).encode("utf-8"), sync_dir=False)
        self.saved = True  # on disk from the rename on: an interrupt from here keeps it
        fsync_dir(os.path.dirname(os.path.abspath(self.path)))

    def mark_publishing(self) -> None:
        """RecordIO: everything is on disk under partial names; a resume only renames.
        (An LMDB is published by one directory rename, which needs no such record.)"""
        if self.fmt == "lmdb":
            return
        self._write({"digest": self.digest, "splits": self.splits, "publishing": True})

    def remove(self) -> None:
        """Delete the checkpoint (only if it is one of ours) and its temporary."""
        from .fsutil import is_ours
        self.saved = False
        if os.path.lexists(self.path) and not os.path.islink(self.path) \
                and not is_ours(self.path, "checkpoint"):
            return  # a file of the user's under that name: not ours to delete
        for p in (self.path, self.path + ".partial"):
            try:
                if not os.path.isdir(p) or os.path.islink(p):
                    os.remove(p)
            except FileNotFoundError:
                pass


def _resume_finished(state, ckpt: "_Checkpoint", report: ConversionReport, src: Source,
                     options: dict, fmt: str) -> Optional[ConversionReport]:
    """With ``resume``: finish a publish that a crash interrupted, or recognise outputs that
    are already complete (same source and options); else ``None`` (convert as usual)."""
    outputs = report.outputs
    if state is not None and state.get("publishing"):
        for path in outputs.values():
            RecordWriter.complete_publish(path)
        ckpt.remove()
    elif state is not None:
        return None
    metas = {}
    try:
        lmdb_metas = read_lmdb_meta(ckpt.output) if fmt == "lmdb" and is_lmdb(ckpt.output) \
            else None
    except GluonDataError:
        return None
    for split, path in outputs.items():
        try:
            meta = (lmdb_metas or {}).get(split) if fmt == "lmdb" else read_meta(path)
        except GluonDataError:
            return None
        if meta is None or not os.path.exists(path):
            return None
        made = meta.get("created_by", {})
        if made.get("options") != options or made.get("source") != os.path.abspath(src.root):
            return None
        metas[split] = meta
    for split, meta in metas.items():
        report.written[split] = meta["num_records"]
        if fmt == "rec":
            report.bytes_written += os.path.getsize(outputs[split])
    report.skipped[:] = next(iter(metas.values())).get("skipped", [])
    return report


def _check_choices(encoding: str, on_error: str) -> None:
    if encoding not in ENCODINGS:
        raise ValueError("unknown encoding %r; valid: %s" % (encoding, ", ".join(ENCODINGS)))
    if on_error not in ("fail", "skip"):
        raise ValueError("on_error must be 'fail' or 'skip', got %r" % (on_error,))


def import_lmdb(source: str, output: str, layout: str, *, split: Optional[str] = None,
                image_shape: Optional[Sequence[int]] = None,
                mask_shape: Optional[Sequence[int]] = None, channels_first: bool = False,
                bgr: bool = False, encoding: str = "passthrough", quality: int = 95,
                classes: Optional[Sequence[str]] = None, num_classes: Optional[int] = None,
                ignore_label: int = 255, format: Optional[str] = None,
                overwrite: bool = False, on_error: str = "fail",
                max_pixels: int = codec.DEFAULT_MAX_PIXELS,
                progress: bool = False) -> ConversionReport:
    """Import a ``raw-lmdb`` (the original recipe) or ``caffe-lmdb`` into our format.

    Raw arrays are kept raw by ``encoding='passthrough'`` for ``raw-lmdb`` (lossless, no
    decode cost) and stored as PNG for Caffe; encoded Caffe images keep their bytes.
    """
    from .legacy import LEGACY_LAYOUTS, caffe_lmdb_items, raw_lmdb_items  # imports MXNet
    _check_choices(encoding, on_error)
    _check_options(quality=quality, max_pixels=max_pixels, ignore_label=ignore_label,
                   num_classes=num_classes)
    fmt = output_format(output, format)
    _check_output(output, fmt)
    t0 = time.perf_counter()
    split = split or "train"
    try:
        if layout == "raw-lmdb":
            task, raw_as = "segmentation", "raw"
            n, items = raw_lmdb_items(source, split, image_shape, mask_shape, channels_first,
                                      bgr)
        elif layout == "caffe-lmdb":
            task, raw_as = "classification", "png"
            n, items = caffe_lmdb_items(source)
        else:
            raise SourceError("unknown LMDB layout %r; valid: %s"
                              % (layout, ", ".join(LEGACY_LAYOUTS)), source)
    except (SourceError, FormatError) as e:
        raise ConversionError("cannot read source: %s" % e.reason, e.path or source) from None
    if classes is not None:
        classes = list(classes)
        num_classes = len(classes)
    opts = EncodeOptions(task=task, encoding=encoding, quality=quality,
                         num_classes=num_classes if task == "segmentation" else None,
                         ignore_label=ignore_label, max_pixels=max_pixels)
    src = Source(layout, source, task, {split: []}, classes)
    report = ConversionReport(outputs=output_paths(os.fspath(output), [split], fmt))
    writers: Dict[str, object] = {}
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=n, unit="img", desc="import", dynamic_ncols=True)
    lock = None
    try:
        lock = _output_lock(output, [split], fmt)
        _, writers = open_writers(output, [split], fmt, overwrite)
        w, st = writers[split], _Stats()
        for pos, (where, image, extra) in enumerate(items):
            if bar is not None:
                bar.update(1)
            info: dict = {}
            try:
                if isinstance(image, SourceError):
                    raise image
                if isinstance(image, bytes):  # an encoded Caffe image: validate strictly
                    im = _open_strict(image, where, "image", max_pixels)
                    info["hw"] = (im.size[1], im.size[0])
                    _pixel_stats(np.asarray(im.convert("RGB")), info)
                    keep = (encoding == "passthrough" and im.format in _PASSTHROUGH_FORMATS
                            and _reads_back(image, where, "image", max_pixels, None,
                                            refuse=False) is not None)
                    data = image if keep else \
                        image_part(np.asarray(im.convert("RGB")), opts, "png")
                else:
                    info["hw"] = image.shape[:2]
                    _pixel_stats(image, info)
                    data = image_part(image, opts, raw_as)
                if task == "classification":
                    payload = codec.pack_classification(extra, data, id=pos)
                else:
                    payload = codec.pack_segmentation(data, mask_part(extra, opts, where, info),
                                                      id=pos)
            except SourceError as e:
                if on_error == "fail":
                    raise ConversionError(e.reason, e.path or where) from None
                report.skipped.append({"file": e.path or where, "reason": e.reason})
                continue
            w.write(w.count, payload)
            st.add(info)
        report.written[split] = w.count
        if w.count == 0:
            raise ConversionError("no item could be imported (%d skipped)"
                                  % len(report.skipped), source)
        w.finish(_metadata(src, split, w.count, st, opts, classes, num_classes,
                           report.skipped, dict(encoding=encoding, quality=quality,
                                                image_shape=image_shape,
                                                mask_shape=mask_shape,
                                                channels_first=channels_first, bgr=bgr)))
        report.bytes_written += w.bytes_written
        w.publish()
    except BaseException as e:
        _fail(e, writers, output)
    finally:
        if lock is not None:
            lock.release()
        if bar is not None:
            bar.close()
    report.seconds = time.perf_counter() - t0
    return report


def _stock_meta(path: str, count: int) -> dict:
    return {"format": FORMAT_NAME, "format_version": FORMAT_VERSION, "task": "classification",
            "split": "train", "num_records": count, "checksum": None,
            "image_encoding": "passthrough", "classes": None, "num_classes": None,
            "created_by": {"tool": "gluon_data %s" % __version__, "layout": "stock-rec",
                           "source": os.path.abspath(path), "options": {}},
            "skipped": []}


def copy_dataset(source: str, output: str, *, split: Optional[str] = None,
                 format: Optional[str] = None, overwrite: bool = False,
                 progress: bool = False) -> ConversionReport:
    """Copy a dataset between containers (``.rec`` <-> ``.lmdb``) without re-encoding.

    Record payloads are copied byte for byte after their checksum is verified; keys and
    metadata travel with them, so ``rec -> lmdb -> rec`` reproduces the ``.rec``, ``.idx``
    and ``.meta.json`` exactly. A stock ``.rec`` (no metadata) gets classification metadata.
    """
    fmt = output_format(output, format)
    _check_output(output, fmt)
    t0 = time.perf_counter()
    sources: Dict[str, Tuple[object, dict]] = {}
    if is_lmdb(source):
        metas = read_lmdb_meta(source)
        names = split.split(",") if split else sorted(metas)
        for s in names:
            f = LMDBFile(source, s)  # raises listing the available splits
            sources[s] = (f, f.meta)
    else:
        meta = read_meta(source)
        f = RecordFile(source, expected_count=meta["num_records"] if meta else None)
        meta = meta or _stock_meta(source, len(f))
        sources[meta.get("split") or "train"] = (f, meta)
    report = ConversionReport(outputs=output_paths(os.fspath(output), list(sources), fmt))
    writers: Dict[str, object] = {}
    lock = None
    try:
        lock = _output_lock(output, list(sources), fmt)
        _, writers = open_writers(output, list(sources), fmt, overwrite)
        for s, (f, meta) in sources.items():
            w = writers[s]
            keys = meta.get("record_keys")  # non-dense .idx keys kept by a rec -> lmdb copy
            meta = {k: v for k, v in meta.items() if k not in ("container", "record_keys")}
            task_seg = meta["task"] == "segmentation"
            # ours, but written before header ids were always the keys (an LMDB from a .lst
            # without record_keys, or items skipped): the header ids are the true keys
            id_keys = (keys is None and meta.get("checksum") == "crc32-id2"
                       and not ids_are_keys(meta, "lmdb" if isinstance(f, LMDBFile) else "rec"))
            for i in range(len(f)):
                payload = f.read(i)
                rec = codec.unpack(payload, segmentation=task_seg, verify=True, path=f.path,
                                   key=f.key(i), offset=f.offset(i))
                key = keys[i] if keys is not None else rec.id if id_keys else f.key(i)
                w.write(key, payload)
            if fmt == "lmdb":
                rk = [f.key(i) for i in range(len(f))] if keys is None else keys
                if rk != list(range(len(f))):
                    meta["record_keys"] = rk
            w.finish(meta)
            report.written[s] = w.count
            report.bytes_written += w.bytes_written
        for w in writers.values():
            w.publish()
    except BaseException as e:
        _fail(e, writers, output)
    finally:
        if lock is not None:
            lock.release()
    report.seconds = time.perf_counter() - t0
    return report
