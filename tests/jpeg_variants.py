"""Tiny JPEG encoders for the variants stock encoders do not write: any chroma sampling
factors (3x1, 2x4, 1x3, mixed, ...) in a baseline stream, and lossless (SOF3) streams.

Pure Python and numpy, so the tests need no tool a clean CI machine lacks. The streams are
small, valid and deliberately plain: one quantisation table, one fixed-length Huffman table
per class (every code of a table is as long as the others, which JPEG allows as long as the
all-ones code stays unused), no restart markers. They are meant for images of a few dozen
pixels a side.
"""
from __future__ import annotations

import struct
from typing import Iterable, List, Optional, Sequence, Tuple

import numpy as np

__all__ = ["baseline_jpeg", "lossless_jpeg", "ODD_SAMPLINGS"]

#: Sampling factors ``((h, v) per component)`` that libjpeg's core reads but that are none of
#: the standard 4:4:4, 4:2:2, 4:2:0, 4:4:0, 4:1:1 or grey layouts.
ODD_SAMPLINGS = {
    "3x1": ((3, 1), (1, 1), (1, 1)),
    "2x4": ((2, 4), (1, 1), (1, 1)),
    "1x3": ((1, 3), (1, 1), (1, 1)),
    "mixed": ((2, 2), (2, 1), (1, 2)),
}

_ZIGZAG = np.array([
    0, 1, 8, 16, 9, 2, 3, 10, 17, 24, 32, 25, 18, 11, 4, 5, 12, 19, 26, 33, 40, 48, 41, 34,
    27, 20, 13, 6, 7, 14, 21, 28, 35, 42, 49, 56, 57, 50, 43, 36, 29, 22, 15, 23, 30, 37, 44,
    51, 58, 59, 52, 45, 38, 31, 39, 46, 53, 60, 61, 54, 47, 55, 62, 63])
_DCT = np.array([[(np.sqrt(1 / 8) if u == 0 else np.sqrt(2 / 8))
                  * np.cos((2 * x + 1) * u * np.pi / 16) for x in range(8)] for u in range(8)])
_QUANT = 4  # one flat table: coefficients stay within the baseline's 11 (DC) / 10 (AC) bits
_DC_SYMBOLS = list(range(12))
_AC_SYMBOLS = [0x00, 0xF0] + [(r << 4) | s for r in range(16) for s in range(1, 11)]
_LOSSLESS_SYMBOLS = list(range(17))


# --------------------------------------------------------------------------- stream pieces
def _segment(marker: int, body: bytes) -> bytes:
    return struct.pack(">BBH", 0xFF, marker, len(body) + 2) + body


def _huffman_table(table_class: int, table_id: int, symbols: Sequence[int]) -> Tuple[bytes, dict]:
    """A DHT segment giving every symbol a code of one length, and the symbol -> (code,
    length) map."""
    length = max(1, int(np.ceil(np.log2(len(symbols) + 1))))  # +1: the all-ones code is unused
    counts = [0] * 16
    counts[length - 1] = len(symbols)
    body = bytes([(table_class << 4) | table_id]) + bytes(counts) + bytes(symbols)
    return _segment(0xC4, body), {s: (i, length) for i, s in enumerate(symbols)}


class _Bits:
    """An entropy-coded segment: bits packed MSB first, 0xFF stuffed, padded with ones."""

    def __init__(self) -> None:
        self._bits: List[str] = []

    def put(self, code: int, length: int) -> None:
        if length:
            self._bits.append(format(code, "0%db" % length))

    def put_value(self, table: dict, value: int) -> None:
        """``value``'s category through ``table``, then its extra bits (JPEG's sign rule)."""
        size = int(abs(value)).bit_length()
        self.put(*table[size])
        if size and size < 16:
            self.put(value if value >= 0 else value + (1 << size) - 1, size)

    def data(self) -> bytes:
        bits = "".join(self._bits)
        bits += "1" * (-len(bits) % 8)
        raw = int(bits, 2).to_bytes(len(bits) // 8, "big") if bits else b""
        return raw.replace(b"\xff", b"\xff\x00")


def _ycbcr(img: np.ndarray) -> np.ndarray:
    """JFIF's RGB -> YCbCr, as float planes (H x W x 3)."""
    rgb = img.astype(np.float64)
    r, g, b = rgb[..., 0], rgb[..., 1], rgb[..., 2]
    return np.stack([0.299 * r + 0.587 * g + 0.114 * b,
                     -0.168736 * r - 0.331264 * g + 0.5 * b + 128,
                     0.5 * r - 0.418688 * g - 0.081312 * b + 128], axis=-1)


def _blocks(plane: np.ndarray) -> np.ndarray:
    """Quantised zigzag coefficients of a plane whose sides are multiples of 8:
    ``(rows, cols, 64)`` ints."""
    h, w = plane.shape
    tiles = (plane - 128.0).reshape(h // 8, 8, w // 8, 8).transpose(0, 2, 1, 3)
    coef = np.einsum("ux,abxy,vy->abuv", _DCT, tiles, _DCT)
    q = np.round(coef / _QUANT).astype(np.int64).reshape(h // 8, w // 8, 64)
    return q[:, :, _ZIGZAG]


def _encode_block(bits: _Bits, zz: np.ndarray, prev_dc: int, dc: dict, ac: dict) -> int:
    bits.put_value(dc, int(zz[0]) - prev_dc)
    run = 0
    for k in range(1, 64):
        v = int(zz[k])
        if v == 0:
            run += 1
            continue
        while run > 15:
            bits.put(*ac[0xF0])
            run -= 16
        size = abs(v).bit_length()
        bits.put(*ac[(run << 4) | size])
        bits.put(v if v >= 0 else v + (1 << size) - 1, size)
        run = 0
    if run:
        bits.put(*ac[0x00])
    return int(zz[0])


# --------------------------------------------------------------------------- encoders
def baseline_jpeg(img: np.ndarray, sampling: Optional[Iterable[Tuple[int, int]]] = None) -> bytes:
    """A baseline (SOF0) JFIF JPEG of ``img`` (H x W x 3 RGB or H x W grey uint8) with the
    given sampling factors ``(h, v)`` per component (default 4:4:4, or 1x1 for grey).

    Chroma is box-averaged to its sampling grid; every ratio to the largest factor must be a
    whole number (libjpeg refuses fractional sampling).
    """
    img = np.asarray(img, dtype=np.uint8)
    grey = img.ndim == 2
    planes = img[:, :, None].astype(np.float64) if grey else _ycbcr(img)
    ncomp = planes.shape[2]
    samp = [tuple(s) for s in (sampling or [(1, 1)] * ncomp)]
    if len(samp) != ncomp:
        raise ValueError("%d sampling factors for %d components" % (len(samp), ncomp))
    hmax, vmax = max(s[0] for s in samp), max(s[1] for s in samp)
    if any(hmax % h or vmax % v for h, v in samp):
        raise ValueError("sampling %s has fractional ratios" % (samp,))
    h, w = img.shape[:2]
    if ncomp == 1:  # a non-interleaved scan: one block per MCU, whatever the factors say
        mcu_w = mcu_h = 8
        grid = [(1, 1)]
    else:
        mcu_w, mcu_h = 8 * hmax, 8 * vmax
        grid = samp
    mx, my = -(-w // mcu_w), -(-h // mcu_h)
    padded = np.pad(planes, ((0, my * mcu_h - h), (0, mx * mcu_w - w), (0, 0)), mode="edge")
    coefs = []
    for c, (ch, cv) in enumerate(grid):
        fy, fx = (vmax // cv, hmax // ch) if ncomp > 1 else (1, 1)
        p = padded[:, :, c]
        p = p.reshape(p.shape[0] // fy, fy, p.shape[1] // fx, fx).mean(axis=(1, 3))
        coefs.append(_blocks(p))
    dqt = _segment(0xDB, bytes([0]) + bytes([_QUANT] * 64))
    dht_dc, dc = _huffman_table(0, 0, _DC_SYMBOLS)
    dht_ac, ac = _huffman_table(1, 0, _AC_SYMBOLS)
    sof = _segment(0xC0, struct.pack(">BHHB", 8, h, w, ncomp) + b"".join(
        bytes([c + 1, (sh << 4) | sv, 0]) for c, (sh, sv) in enumerate(samp)))
    sos = _segment(0xDA, bytes([ncomp]) + b"".join(bytes([c + 1, 0x00]) for c in range(ncomp))
                   + bytes([0, 63, 0]))
    bits, prev = _Bits(), [0] * ncomp
    for by in range(my):
        for bx in range(mx):
            for c, (ch, cv) in enumerate(grid):
                for yy in range(cv):
                    for xx in range(ch):
                        prev[c] = _encode_block(bits, coefs[c][by * cv + yy, bx * ch + xx],
                                                prev[c], dc, ac)
    jfif = _segment(0xE0, b"JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00")
    return (b"\xff\xd8" + jfif + dqt + sof + dht_dc + dht_ac + sos + bits.data()
            + b"\xff\xd9")


def lossless_jpeg(img: np.ndarray, predictor: int = 1) -> bytes:
    """A lossless (SOF3, Huffman) JPEG of ``img`` (H x W x 3 RGB or H x W grey uint8), 8 bits
    per sample, predictor ``predictor`` (1..7), no point transform. Colour is stored as RGB
    (an Adobe marker with transform 0), so a decoder gives back ``img`` exactly."""
    img = np.asarray(img, dtype=np.uint8)
    if not 1 <= predictor <= 7:
        raise ValueError("predictor must be 1..7, got %r" % (predictor,))
    px = (img[:, :, None] if img.ndim == 2 else img).astype(np.int64)
    h, w, ncomp = px.shape
    dht, table = _huffman_table(0, 0, _LOSSLESS_SYMBOLS)
    sof = _segment(0xC3, struct.pack(">BHHB", 8, h, w, ncomp) + b"".join(
        bytes([c + 1, 0x11, 0]) for c in range(ncomp)))
    sos = _segment(0xDA, bytes([ncomp]) + b"".join(bytes([c + 1, 0x00]) for c in range(ncomp))
                   + bytes([predictor, 0, 0]))
    bits = _Bits()
    for y in range(h):
        for x in range(w):
            for c in range(ncomp):
                if x == 0 and y == 0:
                    pred = 128
                elif y == 0:
                    pred = px[y, x - 1, c]
                elif x == 0:
                    pred = px[y - 1, x, c]
                else:
                    a, b, d = px[y, x - 1, c], px[y - 1, x, c], px[y - 1, x - 1, c]
                    pred = (a, b, d, a + b - d, a + ((b - d) >> 1), b + ((a - d) >> 1),
                            (a + b) >> 1)[predictor - 1]
                bits.put_value(table, int(px[y, x, c] - pred))
    adobe = b"" if ncomp == 1 else _segment(0xEE, b"Adobe\x00\x64\x00\x00\x00\x00\x00")
    return b"\xff\xd8" + adobe + sof + dht + sos + bits.data() + b"\xff\xd9"
