#!/usr/bin/env python
"""Route tried for issue #15 item 2: a lossless MCU-aligned crop (TurboJPEG ``tjTransform``
with ``TJXOPT_CROP``) then a decode of the crop, against a full decode, on the source region
the segmentation ``train`` crop keeps (``base_size=400``, ``crop_size=320``).

    apt-get install libturbojpeg0        # TurboJPEG's C library; not a gluon_data dependency
    python scripts/route_lossless_crop.py bench-data/VOC2012/JPEGImages 150

Prints the largest pixel difference between the cropped decode and the full decode's crop,
the mean fraction of the area kept, and three rounds of decode rates. docs/performance.md's
appendix records the result (dropped).
"""
import ctypes as C, glob, os, sys, time
import numpy as np, cv2
cv2.setNumThreads(1)
try:
    tj = C.CDLL("libturbojpeg.so.0")
except OSError:
    sys.exit("libturbojpeg.so.0 not found: apt-get install libturbojpeg0")
class Region(C.Structure):
    _fields_ = [("x", C.c_int), ("y", C.c_int), ("w", C.c_int), ("h", C.c_int)]
class Transform(C.Structure):
    _fields_ = [("r", Region), ("op", C.c_int), ("options", C.c_int), ("data", C.c_void_p), ("customFilter", C.c_void_p)]
tj.tjInitDecompress.restype = C.c_void_p; tj.tjInitTransform.restype = C.c_void_p
tj.tjDecompressHeader3.argtypes = [C.c_void_p, C.c_char_p, C.c_ulong] + [C.POINTER(C.c_int)] * 4
tj.tjDecompress2.argtypes = [C.c_void_p, C.c_void_p, C.c_ulong, C.c_void_p, C.c_int, C.c_int, C.c_int, C.c_int, C.c_int]
tj.tjTransform.argtypes = [C.c_void_p, C.c_char_p, C.c_ulong, C.c_int, C.POINTER(C.c_void_p), C.POINTER(C.c_ulong), C.POINTER(Transform), C.c_int]
tj.tjFree.argtypes = [C.c_void_p]
dh, th = tj.tjInitDecompress(), tj.tjInitTransform()
MCU = {0: (8, 8), 1: (16, 8), 2: (16, 16), 3: (8, 8), 4: (8, 16), 5: (32, 8)}
def header(buf):
    w, h, ss, cs = C.c_int(), C.c_int(), C.c_int(), C.c_int()
    assert tj.tjDecompressHeader3(dh, buf, len(buf), C.byref(w), C.byref(h), C.byref(ss), C.byref(cs)) == 0
    return w.value, h.value, ss.value
def decode(buf, w, h, cbuf=None):
    out = np.empty((h, w, 3), np.uint8)
    src = cbuf if cbuf is not None else buf
    assert tj.tjDecompress2(dh, src, len(buf) if cbuf is None else cbuf_len[0], out.ctypes.data, w, 0, h, 1, 0) == 0
    return out
files = sorted(glob.glob(sys.argv[1] + "/*.jpg"))[:int(sys.argv[2]) if len(sys.argv) > 2 else 300]
data = [open(f, "rb").read() for f in files]
rng = np.random.default_rng(0)
plans = []
for b in data:
    w, h, ss = header(b)
    long = rng.integers(200, 801)  # RandomScaleCrop: base 400 x [0.5, 2.0]
    f = long / max(w, h)
    cw, ch = min(w, int(np.ceil(320 / f))), min(h, int(np.ceil(320 / f)))
    x, y = int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1))
    mw, mh = MCU[ss]
    x0, y0 = x - x % mw, y - y % mh
    plans.append((w, h, x0, y0, min(w - x0, cw + (x - x0)), min(h - y0, ch + (y - y0))))
def full():
    for b, (w, h, *_ ) in zip(data, plans):
        decode(b, w, h)
def cv():
    for b in data:
        cv2.imdecode(np.frombuffer(b, np.uint8), cv2.IMREAD_COLOR)
cbuf_len = [0]
def crop(check=None):
    for b, (w, h, x, y, cw, ch) in zip(data, plans):
        t = Transform(Region(x, y, cw, ch), 0, 4, None, None)
        dst, size = C.c_void_p(), C.c_ulong()
        assert tj.tjTransform(th, b, len(b), 1, C.byref(dst), C.byref(size), C.byref(t), 0) == 0
        cbuf_len[0] = size.value
        out = decode(b, cw, ch, cbuf=dst)
        if check is not None:
            ref = decode(b, w, h)[y:y + ch, x:x + cw]
            diff = np.abs(out.astype(int) - ref).max()
            check.append(diff)
        tj.tjFree(dst)
diffs = []
crop(diffs)
print("max |crop-decode - full-decode crop| over %d images: %d" % (len(data), max(diffs)))
area = np.mean([cw * ch / (w * h) for w, h, x, y, cw, ch in plans])
print("mean fraction of the area kept (MCU-aligned): %.2f" % area)
for _ in range(3):
    r = {}
    for name, fn in (("TurboJPEG full decode", full), ("OpenCV full decode", cv), ("lossless crop + decode crop", crop)):
        t0 = time.perf_counter(); fn(); r[name] = len(data) / (time.perf_counter() - t0)
    print("  ".join("%s %.0f/s" % kv for kv in r.items()), " crop/full %.2f" % (r["lossless crop + decode crop"] / r["TurboJPEG full decode"]))
