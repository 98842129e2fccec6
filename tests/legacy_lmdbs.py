"""LMDBs in the layouts that predate gluon_data, written here with py-lmdb: the original
recipe's (raw uint8 arrays) and Caffe's (``caffe.Datum``). Framework-free, so the core lane's
tests (the doctests' examples) use them as the Gluon tests do."""
import os

import lmdb
import numpy as np
from PIL import Image

from gluon_data.convert.sample import synthetic_pair

__all__ = ["make_recipe_lmdb", "make_caffe_lmdb", "datum_bytes"]


def make_recipe_lmdb(path, n=12, shape=(24, 32), channels_first=False, bgr=False):
    """Exactly the seed recipe's layout: <split>_data/<split>_label, str(idx) keys, raw uint8."""
    rng = np.random.default_rng(7)
    env = lmdb.open(path, max_dbs=4, map_size=1 << 26)
    dbs = {name: env.open_db(name.encode()) for name in
           ("train_data", "train_label", "val_data", "val_label")}
    pairs = []
    with env.begin(write=True) as txn:
        for idx in range(n):
            img, mask = synthetic_pair(rng, *shape)
            stored = img[:, :, ::-1] if bgr else img
            stored = stored.transpose(2, 0, 1) if channels_first else stored
            txn.put(str(idx).encode(), np.ascontiguousarray(stored).tobytes(),
                    db=dbs["train_data"])
            txn.put(str(idx).encode(), mask.tobytes(), db=dbs["train_label"])
            pairs.append((img, mask))
    env.close()
    return pairs


def _varint(n):
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def datum_bytes(label, data, encoded, c=0, h=0, w=0):
    """caffe.Datum wire format, encoded by hand (independent of the reader's protobuf class)."""
    out = b""
    if not encoded:
        out += b"\x08" + _varint(c) + b"\x10" + _varint(h) + b"\x18" + _varint(w)
    out += b"\x22" + _varint(len(data)) + data + b"\x28" + _varint(label)
    if encoded:
        out += b"\x38\x01"
    return out


def make_caffe_lmdb(path, folder_root):
    """Like convert_imageset: '%08d_<path>' keys; encoded files, then raw BGR CHW Datums."""
    files = sorted(os.path.join(c, f) for c in sorted(os.listdir(folder_root))
                   for f in sorted(os.listdir(os.path.join(folder_root, c))))
    env = lmdb.open(path, map_size=1 << 26)
    want = []
    with env.begin(write=True) as txn:
        for i, rel in enumerate(files):
            label = sorted(os.listdir(folder_root)).index(rel.split(os.sep)[0])
            full = os.path.join(folder_root, rel)
            if i % 2 == 0:
                data = open(full, "rb").read()
                txn.put(b"%08d_%s" % (i, rel.encode()), datum_bytes(label, data, True))
            else:
                rgb = np.asarray(Image.open(full).convert("RGB"))
                chw = np.ascontiguousarray(rgb[:, :, ::-1].transpose(2, 0, 1))
                txn.put(b"%08d_%s" % (i, rel.encode()),
                        datum_bytes(label, chw.tobytes(), False, *chw.shape))
            want.append((full, label, i % 2 == 0))
    env.close()
    return want
