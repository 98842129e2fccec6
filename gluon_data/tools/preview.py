"""Previews: an image beside its mask overlaid in the dataset's palette, with a legend
(:func:`render_preview`), saved as ``gluon-data show`` saves them (:func:`save_preview`)."""
from __future__ import annotations

import io
import os
from typing import Any, Dict, List, Optional, Sequence

import numpy as np
from PIL import Image, ImageDraw, ImageFont, PngImagePlugin

from ..format.ownership import PREVIEW_MARK, check_replaceable
from ..storage.fsutil import atomic_write

__all__ = ["render_preview", "save_preview"]

#: The file formats a preview is saved in, by the output's extension (PNG otherwise).
FORMATS = {".jpg": "JPEG", ".jpeg": "JPEG", ".bmp": "BMP", ".tif": "TIFF", ".tiff": "TIFF",
           ".webp": "WEBP"}


def render_preview(image: np.ndarray, mask: np.ndarray, palette: Sequence[Sequence[int]],
                   classes: Optional[List[str]] = None, ignore_label: int = 255,
                   alpha: float = 0.55, min_side: int = 256) -> Image.Image:
    """Return a PIL image: the RGB image, the overlay, and a legend of the classes present.

    ``mask`` holds stored class ids (ignore label included). Small images are enlarged
    (nearest neighbour) so that the short side is at least ``min_side`` pixels. ``alpha``:
    the overlay's opacity, 0 (the image alone) to 1 (the classes' colours alone).
    """
    if not 0.0 <= alpha <= 1.0:  # (NaN fails too) outside it the blend wraps around in uint8
        raise ValueError("alpha (--alpha) must lie in [0, 1], the overlay's opacity; got %r"
                         % alpha)
    img = np.asarray(image, dtype=np.uint8)
    m = np.asarray(mask).astype(np.int64)
    lut = np.zeros((max(256, int(m.max()) + 1 if m.size else 256), 3), np.uint8)
    pal = np.asarray(palette, dtype=np.uint8).reshape(-1, 3)[:len(lut)]
    lut[:len(pal)] = pal
    if ignore_label < len(lut) and (ignore_label >= len(pal) or not pal[ignore_label].any()):
        lut[ignore_label] = (255, 255, 255)
    colour = lut[np.clip(m, 0, len(lut) - 1)]
    overlay = (img.astype(np.float32) * (1 - alpha) + colour * alpha).astype(np.uint8)
    h, w = m.shape
    scale = max(1, int(np.ceil(min_side / max(1, min(h, w)))))
    # Image.NEAREST: set at import by Pillow >= 10 (undeclared to mypy); Image.Resampling
    # is not in Pillow 9.0, which pyproject.toml allows
    nearest = Image.NEAREST  # type: ignore[attr-defined]
    left = Image.fromarray(img).resize((w * scale, h * scale), nearest)
    right = Image.fromarray(overlay).resize((w * scale, h * scale), nearest)

    present = [int(c) for c in np.unique(m)]
    font = ImageFont.load_default()
    row = 18
    legend_h = row * (len(present) + 1) + 8
    gap = 8
    out = Image.new("RGB", (2 * w * scale + gap, h * scale + legend_h), (255, 255, 255))
    out.paste(left, (0, 0))
    out.paste(right, (w * scale + gap, 0))
    draw = ImageDraw.Draw(out)
    y = h * scale + 6
    draw.text((4, y), "classes present (pixels):", fill=(0, 0, 0), font=font)
    total = m.size
    for c in present:
        y += row
        draw.rectangle([6, y + 2, 20, y + 14], fill=tuple(int(v) for v in lut[c]),
                       outline=(0, 0, 0))
        name = ("ignore" if c == ignore_label else
                classes[c] if classes and c < len(classes) else "class %d" % c)
        share = 100.0 * int((m == c).sum()) / total
        draw.text((26, y + 2), "%3d  %s  (%.1f%%)" % (c, name, share), fill=(0, 0, 0),
                  font=font)
    return out


def save_preview(pic: Image.Image, out: str, overwrite: bool = False) -> None:
    """Save preview ``pic`` at ``out`` atomically, in the format its extension names (PNG
    otherwise), its folder made if missing. A PNG or JPEG carries
    :data:`~gluon_data.format.ownership.PREVIEW_MARK` (a ``Software`` text, a comment): an
    existing file is replaced only with ``overwrite`` and only when it carries that mark, so
    a photo, a mask or any other file at ``out`` is never touched (a BMP, TIFF or WebP
    preview carries no mark, and is not replaced either).

    Raises
    ------
    FileExistsError
        ``out`` exists and ``overwrite`` is false.
    OutputError
        ``out`` is a link, or a file that is not a preview of ours.
    """
    check_replaceable(out, "preview", overwrite)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)  # as the writers do
    fmt = FORMATS.get(os.path.splitext(out)[1].lower(), "PNG")
    mark: Dict[str, Any] = {}
    if fmt == "PNG":
        info = PngImagePlugin.PngInfo()
        info.add_text("Software", PREVIEW_MARK.decode("ascii"))
        mark = {"pnginfo": info}
    elif fmt == "JPEG":
        mark = {"comment": PREVIEW_MARK}
    buf = io.BytesIO()
    pic.save(buf, format=fmt, **mark)
    atomic_write(out, buf.getvalue())
