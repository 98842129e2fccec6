"""Index loading at scale: the binary index (v3) mapped, not copied; a big stock ``.idx``
parsed once into the user cache; pickles that carry no index; version-2 copies still read."""
import multiprocessing
import os
import pickle
import struct
import time
import zlib

import numpy as np
import pytest

from gluon_data import ClassificationDataset
from gluon_data.errors import FormatError
from gluon_data.format.recindex import _read_binary_index
from gluon_data.stores.recordio import (BINARY_INDEX_SUFFIX, RecordFile, index_cache_path,
                                        read_index, write_binary_index)
from gluon_data.stores.base import open_store

pytestmark = pytest.mark.reliability


def tiny_rec(path, n, keys=None, gdx=True):
    """``n`` 4-byte records (12 bytes framed), written with numpy as the bench does; keys
    ``0..n-1`` unless given; ``.idx.gdx`` beside it only with ``gdx``."""
    frame = np.array([0xCED7230A, 4, 0], "<u4")
    recs = np.broadcast_to(frame, (n, 3)).copy()
    recs[:, 2] = np.arange(n, dtype="<u4")  # payload: the record's position
    recs.tofile(path)
    keys = np.arange(n) if keys is None else np.asarray(keys)
    with open(path[:-4] + ".idx", "w") as f:
        f.write("".join("%d\t%d\n" % (k, 12 * i) for i, k in enumerate(keys.tolist())))
    if gdx:
        write_binary_index(path[:-4] + ".idx")
    return path


def payload(i):
    return int(i).to_bytes(4, "little")


def age(path, seconds=10):
    """Set ``path``'s mtime ``seconds`` in the past (as any file not written just now)."""
    t = time.time_ns() - int(seconds * 1e9)
    os.utime(path, ns=(t, t))


def test_binary_index_is_mapped_and_open_is_o1(tmp_path):
    path = tiny_rec(str(tmp_path / "a.rec"), 3000)
    f = RecordFile(path)
    assert f._keys is None and f._ends is None  # nothing per record derived
    assert not f._offsets.flags.writeable and not f._offsets.flags.owndata  # the mapping
    assert [f.read(i) for i in (0, 1234, 2999, -1)] == [payload(i) for i in (0, 1234, 2999, 2999)]
    assert f.extent(2999) == (12 * 2999, 12 * 3000) and f.extent(-3000) == (0, 12)
    with pytest.raises(IndexError):
        f.extent(3000)
    assert f.extent_sizes().tolist() == [12] * 3000
    assert [bytes(v) for v in f.scan(chunk_bytes=100)] == [payload(i) for i in range(3000)]
    fds = len(os.listdir("/proc/self/fd"))
    many = [RecordFile(path) for _ in range(50)]  # a mapping holds no descriptor
    assert len(os.listdir("/proc/self/fd")) <= fds and not many[-1]._offsets.flags.writeable


def test_header_facts_are_checked_against_the_data_file(tmp_path):
    """A clean index is checked in O(1): its largest offset against the .rec's size, so a
    truncated .rec is still refused at open."""
    path = tiny_rec(str(tmp_path / "a.rec"), 100)
    os.truncate(path, 12 * 50)
    with pytest.raises(FormatError, match="past the end") as e:
        RecordFile(path)
    assert e.value.key == 50


def test_a_stale_index_is_never_trusted_whatever_its_mtime_says(tmp_path):
    path = tiny_rec(str(tmp_path / "a.rec"), 100, gdx=False)
    idx = path[:-4] + ".idx"
    age(idx)
    write_binary_index(idx)  # an idx untouched for 10 s: its mtime is recorded
    head = open(idx + BINARY_INDEX_SUFFIX, "rb").read(72)
    assert struct.unpack_from("<q", head, 16)[0] == os.stat(idx).st_mtime_ns
    text = open(idx, "rb").read()
    with open(idx, "wb") as f:  # same size, other keys: the mtime changes, the CRC differs
        f.write(text.replace(b"0\t0\n", b"7\t0\n", 1).replace(b"7\t84\n", b"0\t84\n", 1))
    f = RecordFile(path)
    assert f.key(0) == 7 and f._offsets.flags.writeable  # parsed from the text
    # an idx written just now: a same-size rewrite could keep its mtime, so none is recorded
    write_binary_index(idx)
    assert struct.unpack_from("<q", open(idx + BINARY_INDEX_SUFFIX, "rb").read(72), 16)[0] == -1
    assert RecordFile(path).key(0) == 7


def test_version_2_binary_index_is_still_read(tmp_path):
    path = tiny_rec(str(tmp_path / "a.rec"), 50, keys=np.arange(50) * 3, gdx=False)
    idx = path[:-4] + ".idx"
    text = open(idx, "rb").read()
    keys, offs = read_index(idx, binary=False)
    body = keys.astype("<i8").tobytes() + offs.astype("<i8").tobytes()
    v2 = struct.pack("<8sQQQQQ", b"GDIDX\x00\x02\x00", len(text), zlib.crc32(text), 50, 0,
                     zlib.crc32(body)) + body
    with open(idx + BINARY_INDEX_SUFFIX, "wb") as f:
        f.write(v2)
    got = _read_binary_index(idx)
    assert got is not None and got[0].tolist() == keys.tolist()
    assert RecordFile(path).read_key(147) == payload(49)
    with open(idx + BINARY_INDEX_SUFFIX, "wb") as f:  # damaged: ignored, the text is read
        f.write(v2[:-3] + b"\xff\xff\xff")
    assert _read_binary_index(idx) is None and RecordFile(path).read_key(6) == payload(2)


def test_read_key_without_a_dict(tmp_path):
    keys = np.random.default_rng(1).permutation(4000) * 7 + 5  # shuffled, as im2rec's
    f = RecordFile(tiny_rec(str(tmp_path / "a.rec"), 4000, keys=keys))
    assert f.read_key(int(keys[1234])) == payload(1234)
    for missing in (0, 6, int(keys.max()) + 7, -5):
        with pytest.raises(KeyError):
            f.read_key(missing)
    g = RecordFile(tiny_rec(str(tmp_path / "b.rec"), 4000, keys=np.arange(4000) * 2))
    assert g._keys_sorted and g.read_key(7998) == payload(3999)
    with pytest.raises(KeyError):
        g.read_key(7)


def test_pickles_carry_no_index(tmp_path):
    """A reader, and a dataset over it, pickled to a DataLoader worker carry the location
    and stamps, not the index (80 MB per 10 M records otherwise): the copy maps it again."""
    path = tiny_rec(str(tmp_path / "a.rec"), 20000)
    f = RecordFile(path)
    blob = pickle.dumps(f)
    assert len(blob) < 2000
    g = pickle.loads(blob)
    assert g.read(19999) == payload(19999) and len(g) == 20000
    ds = ClassificationDataset(open_store(path))
    ds._sample(5, None)  # plain-int access counts requests per record, in this process
    assert len(pickle.dumps(ds)) < 4000


def test_pickled_reader_refuses_a_rewritten_index(tmp_path):
    path = tiny_rec(str(tmp_path / "a.rec"), 100)
    blob = pickle.dumps(RecordFile(path))
    idx = path[:-4] + ".idx"
    text = open(idx, "rb").read()
    os.remove(idx + BINARY_INDEX_SUFFIX)
    with open(idx, "wb") as f:
        f.write(text.replace(b"0\t0\n", b"0\t0\n\n", 1))
    g = pickle.loads(blob)
    with pytest.raises(FormatError, match="replaced") as e:
        g.read(0)
    assert e.value.path == idx


@pytest.fixture
def cache(tmp_path, monkeypatch):
    d = tmp_path / "cache"
    monkeypatch.setenv("GLUON_DATA_CACHE_DIR", str(d))
    return d


def _open_and_read(path, q):  # pragma: no cover - forked child
    try:
        f = RecordFile(path)
        q.put((f._offsets.flags.writeable, f.read(12345), f.key(5)))
    except Exception as e:
        q.put(repr(e))


def test_big_stock_index_is_parsed_once_into_the_user_cache(tmp_path, cache):
    path = tiny_rec(str(tmp_path / "stock.rec"), 20000, gdx=False)  # ~230 KB of text
    idx = path[:-4] + ".idx"
    age(idx)
    cached = index_cache_path(idx)
    assert cached.startswith(str(cache))
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    procs = [ctx.Process(target=_open_and_read, args=(path, q)) for _ in range(4)]
    for p in procs:  # four workers at once: one parses, the others map its copy
        p.start()
    got = [q.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    assert got == [(False, payload(12345), 5)] * 4
    assert os.listdir(os.path.dirname(cached)) == [os.path.basename(cached)]  # its entry
    assert not os.path.exists(idx + BINARY_INDEX_SUFFIX)  # nothing written beside it
    f = RecordFile(path)
    assert not f._offsets.flags.writeable and f.read(19999) == payload(19999)
    # the .idx changes (same size): the cached copy is stale, parsed and replaced
    text = open(idx, "rb").read()
    with open(idx, "wb") as out:
        out.write(text.replace(b"5\t60\n", b"9\t60\n", 1).replace(b"9\t108\n", b"5\t108\n", 1))
    f = RecordFile(path)
    assert f.key(5) == 9 and f.key(9) == 5 and f.read(5) == payload(5)
    # damaged copies are ignored
    with open(cached, "r+b") as out:
        out.seek(1000)
        out.write(b"\x01")
    assert RecordFile(path).key(5) == 9


def test_index_cache_can_be_off_or_unusable(tmp_path, cache, monkeypatch):
    path = tiny_rec(str(tmp_path / "stock.rec"), 20000, gdx=False)
    monkeypatch.setenv("GLUON_DATA_INDEX_CACHE", "0")
    assert RecordFile(path)._offsets.flags.writeable and not cache.exists()
    monkeypatch.delenv("GLUON_DATA_INDEX_CACHE")
    cache.write_text("a file where the cache folder would be")  # makedirs fails
    f = RecordFile(path)
    assert f._offsets.flags.writeable and f.read(7) == payload(7)
    small = tiny_rec(str(tmp_path / "small.rec"), 100, gdx=False)  # parsed in microseconds
    monkeypatch.setenv("GLUON_DATA_CACHE_DIR", str(tmp_path / "c2"))
    assert RecordFile(small).read(99) == payload(99) and not (tmp_path / "c2").exists()



def test_extents_of_many_records_match_one_at_a_time(tmp_path):
    """``will_need`` hints a batch by these (start, end) ranges: in file order (ends derived
    from the next offset) and out of it (a stock index's private array of ends)."""
    from gluon_data.stores.recordio import RecordWriter
    sizes = [4, 40, 401, 4000, 8, 16]
    path = str(tmp_path / "a.rec")
    with RecordWriter(path) as w:
        for i, n in enumerate(sizes):
            w.write(i, b"x" * n)
        w.finish()
        w.publish()
    framed = [8 + n + (-n) % 4 for n in sizes]
    pos = np.array([5, 0, 3, 3, 1])
    f = RecordFile(path)
    starts, ends = f.extents(pos)
    assert (ends - starts).tolist() == [framed[i] for i in pos]
    assert list(zip(starts.tolist(), ends.tolist())) == [f.extent(int(i)) for i in pos]
    idx = path[:-4] + ".idx"
    lines = open(idx).read().splitlines(True)
    os.remove(idx + BINARY_INDEX_SUFFIX)
    with open(idx, "w") as out:  # listed backwards: position i is record 5 - i
        out.write("".join(lines[::-1]))
    g = RecordFile(path)
    starts, ends = g.extents(pos)
    assert g._ends is not None and (ends - starts).tolist() == [framed[5 - i] for i in pos]
    assert list(zip(starts.tolist(), ends.tolist())) == [g.extent(int(i)) for i in pos]
