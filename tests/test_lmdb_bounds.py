"""LMDB reads bounded by the file, and an environment rewritten in place caught on reopen."""
import os
import pickle
import struct
import subprocess
import sys

import pytest

from gluon_data.convert import convert
from gluon_data.errors import CorruptRecordError, FormatError
from gluon_data.stores.lmdbio import LMDBFile, record_key
from gluon_data.convert.sample import make_voc

_P_LEAF, _F_BIGDATA = 0x02, 0x01


@pytest.fixture(scope="module")
def big_lmdb(tmp_path_factory):
    """A VOC sample as LMDB with values big enough for overflow pages (read by pread)."""
    root = tmp_path_factory.mktemp("bounds")
    src = make_voc(str(root / "VOC"), num_images=6, size_range=(90, 120), seed=5)
    out = str(root / "v.lmdb")
    convert(src, out, "voc", split="trainval")
    return out


def _leaf_node(data: bytes, psize: int, key: bytes) -> int:
    """Offset in ``data`` of the leaf node of ``key`` whose value lies in overflow pages."""
    for start in range(2 * psize, len(data), psize):  # pages 0 and 1 are the meta pages
        flags, lower = struct.unpack_from("<HH", data, start + 10)
        if not flags & _P_LEAF or lower < 16:
            continue
        for k in range((lower - 16) // 2):
            ptr, = struct.unpack_from("<H", data, start + 16 + 2 * k)
            node = start + ptr
            nflags, ksize = struct.unpack_from("<HH", data, node + 4)
            if nflags == _F_BIGDATA and data[node + 8:node + 8 + ksize] == key:
                return node
    raise AssertionError("no overflow value for key %r" % key)


def _claim_4gb(path: str, record: int) -> str:
    """A copy of ``path`` whose leaf node for ``record`` claims a ~4 GB value."""
    copy = path + ".claims4gb"
    os.makedirs(copy, exist_ok=True)
    with open(os.path.join(path, "data.mdb"), "rb") as f:
        data = bytearray(f.read())
    psize, = struct.unpack_from("<I", data, 40)  # the meta page's md_pad: the page size
    node = _leaf_node(bytes(data), psize, record_key(record))
    struct.pack_into("<HH", data, node, 0xFFF0, 0xFFFF)  # mn_lo, mn_hi: the value's size
    with open(os.path.join(copy, "data.mdb"), "wb") as f:
        f.write(data)
    return copy


def test_a_leaf_claiming_4gb_is_a_typed_error_under_a_3gb_limit(big_lmdb):
    bad = _claim_4gb(big_lmdb, 2)
    code = ("import resource, sys\n"
            "from gluon_data.stores.lmdbio import LMDBFile\n"
            "f = LMDBFile(%r, 'trainval')\n"
            "f.read(0)\n"  # a value on another leaf or the same: must read fine
            "resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))\n"
            "try:\n    f.read(2)\n"
            "except BaseException as e:\n"
            "    print(type(e).__name__, e)\n    sys.exit(0)\n"
            "print('read')\n" % bad)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120, env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    out = p.stdout.strip()
    assert p.returncode == 0, p.stderr[-2000:]
    assert out.startswith("CorruptRecordError"), out
    assert "0000000002" in out and "%d-byte value" % (0xFFFF << 16 | 0xFFF0) in out, out
    assert bad in out
    with pytest.raises(CorruptRecordError) as e:  # and in this process, with no limit
        LMDBFile(bad, "trainval").read(2)
    assert e.value.path == bad and e.value.key == 2


def _rewrite_in_place(path: str, split: str, key: int, payload: bytes) -> None:
    """Another record under ``key`` in the same data.mdb (same inode, metadata untouched),
    written by another process (LMDB opens an environment once per process)."""
    code = ("import lmdb, sys\n"
            "env = lmdb.open(%r, max_dbs=8, subdir=True, map_size=64 << 20)\n"
            "db = env.open_db(%r, create=False)\n"
            "with env.begin(write=True, db=db) as txn:\n"
            "    txn.put(%r, sys.stdin.buffer.read())\n"
            "env.close()\n" % (path, split.encode(), record_key(key)))
    subprocess.run([sys.executable, "-c", code], input=payload, check=True, timeout=60)


def test_lmdb_rewritten_in_place_is_refused_on_reopen(big_lmdb, tmp_path):
    import shutil
    path = str(tmp_path / "v.lmdb")
    shutil.copytree(big_lmdb, path)
    f = LMDBFile(path, "trainval")
    first, other = f.read(0), f.read(1)
    st = os.stat(os.path.join(path, "data.mdb"))
    _rewrite_in_place(path, "trainval", 0, other)
    assert os.stat(os.path.join(path, "data.mdb")).st_ino == st.st_ino
    blob = pickle.dumps(f)
    with pytest.raises(FormatError, match="replaced"):  # an unpickled copy (a worker)
        pickle.loads(blob).read(0)
    code = ("import pickle, sys\n"
            "f = pickle.loads(sys.stdin.buffer.read())\n"
            "try:\n    f.read(0)\n    print('read')\n"
            "except Exception as e:\n    print(type(e).__name__, e)\n")
    p = subprocess.run([sys.executable, "-c", code], input=blob, capture_output=True,
                       timeout=120, env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert p.stdout.decode().startswith("FormatError"), p.stdout + p.stderr[-2000:]
    assert first != other
    fresh = LMDBFile(path, "trainval")  # opened again: the new records, consistently
    assert fresh.read(0) == other
