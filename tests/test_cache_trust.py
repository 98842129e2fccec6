"""The cache's trust rule: a private folder, regular files only, every entry bound to what it
came from by a seal only this cache can write; nothing written through a link, nothing of
anyone else's deleted; both caches (downloaded objects, parsed indexes) under one limit.

Real parts only: RecordIO files from our writer, moto's S3 server on 127.0.0.1 (the fixtures
of ``tests/test_remote.py``)."""
import os
import stat
import struct
import zlib

import pytest

from gluon_data.errors import CacheError
from gluon_data.stores.recordio import BINARY_INDEX_SUFFIX, RecordFile, RecordWriter, index_cache_path
from gluon_data.storage.objects import ShardCache
from gluon_data.convert.to_uri import convert_to_uri
from gluon_data.convert.sample import make_imagefolder
from gluon_data.stores.base import open_store

from test_remote import BUCKET, FAST, s3, so  # noqa: F401 - the S3 server fixtures

pytestmark = pytest.mark.reliability


# --------------------------------------------------------------------------- helpers
def stock_rec(path, n=12000):
    """``n`` small records by our writer, the binary index beside removed: a stock pair whose
    ``.idx`` (>= 128 KB) goes to the user index cache."""
    with RecordWriter(path) as w:
        for i in range(n):
            w.write(i, b"record-%06d" % i)
        w.finish()
        w.publish()
    if os.path.exists(path[:-4] + ".idx" + BINARY_INDEX_SUFFIX):
        os.remove(path[:-4] + ".idx" + BINARY_INDEX_SUFFIX)
    idx = path[:-4] + ".idx"
    t = os.stat(idx).st_mtime_ns - 10 ** 10  # not written just now: its mtime is recorded
    os.utime(idx, ns=(t, t))
    return path


def payload(i):
    return b"record-%06d" % i


def tree(folder):
    """Every file under ``folder`` with its bytes (links and FIFOs by what they are)."""
    out = {}
    for root, dirs, files in os.walk(folder):
        for n in dirs + files:
            p = os.path.join(root, n)
            st = os.lstat(p)
            out[os.path.relpath(p, folder)] = (
                open(p, "rb").read() if stat.S_ISREG(st.st_mode) else stat.S_IFMT(st.st_mode))
    return out


@pytest.fixture
def cache(tmp_path, monkeypatch):
    d = tmp_path / "cache"
    monkeypatch.setenv("GLUON_DATA_CACHE_DIR", str(d))
    monkeypatch.delenv("GLUON_DATA_CACHE_LIMIT", raising=False)
    return d


@pytest.fixture(scope="module")
def dataset(s3, tmp_path_factory):  # noqa: F811
    """A small classification dataset converted into S3, and the same converted locally."""
    from gluon_data import convert
    from test_remote import _options
    src = make_imagefolder(str(tmp_path_factory.mktemp("trust") / "data"), per_class=3)
    uri = "s3://%s/trust/cls.rec" % BUCKET
    convert_to_uri(src, uri, storage_options=_options(s3), layout="imagefolder",
                   cache_dir=str(tmp_path_factory.mktemp("stage")))
    local = str(tmp_path_factory.mktemp("trust-local") / "cls.rec")
    convert(src, local, "imagefolder")
    return uri, local


def _open(uri, so, cache_dir):  # noqa: F811
    return open_store(uri, storage_options=so, cache_dir=str(cache_dir), **FAST)


def _entries(cache_dir, uri, so):  # noqa: F811
    """``{object name: entry folder}`` of the dataset's downloads in a scratch cache."""
    store = _open(uri, so, cache_dir)
    store.read(0)
    store.close()
    objects = os.path.join(str(cache_dir), "objects")
    return {os.listdir(os.path.join(objects, k))[0]: k for k in os.listdir(objects)}


# --------------------------------------------------------------------------- objects
@pytest.mark.parametrize("plant", ["link-entry", "fifo-file", "link-file"])
def test_a_link_or_fifo_at_an_object_entry_is_refused_and_nothing_foreign_touched(
        dataset, so, tmp_path, plant):  # noqa: F811
    uri, local = dataset
    keys = _entries(tmp_path / "scratch", uri, so)
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "x.partial-1").write_bytes(b"someone else's")
    victim = tmp_path / "victim.rec"
    victim.write_bytes(b"not a copy")
    before = tree(foreign)
    cache = tmp_path / "cache"
    os.makedirs(cache / "objects", mode=0o700)
    entry = cache / "objects" / keys["cls.rec"]
    if plant == "link-entry":  # objects/<key> -> a foreign folder
        os.symlink(foreign, entry)
        planted = entry
    else:
        entry.mkdir(mode=0o700)
        planted = entry / "cls.rec"
        if plant == "fifo-file":
            os.mkfifo(planted)
        else:
            os.symlink(victim, planted)
    store = _open(uri, so, cache)
    with pytest.raises(CacheError) as e:
        store.read(0)
    assert e.value.path == str(planted) and "left untouched" in str(e.value)
    assert tree(foreign) == before  # nothing deleted, nothing written through the link
    assert victim.read_bytes() == b"not a copy"
    assert os.path.lexists(planted) and stat.S_IFMT(os.lstat(planted).st_mode) == (
        stat.S_IFIFO if plant == "fifo-file" else stat.S_IFLNK)
    # the .idx was downloaded; what the link or FIFO shows is neither counted nor evicted
    assert ShardCache(str(cache)).usage() == os.path.getsize(local[:-4] + ".idx")
    os.remove(planted)  # removed, the entry is made and read as usual
    assert _open(uri, so, cache).read(0) == RecordFile(local).read(0)


def test_files_named_like_temporaries_are_not_deleted_by_pattern(dataset, so, tmp_path):  # noqa: F811
    uri, local = dataset
    keys = _entries(tmp_path / "scratch", uri, so)
    entry = tmp_path / "cache" / "objects" / keys["cls.rec"]
    os.makedirs(entry / ".partial-1-1-1", mode=0o700)  # what older downloads were called
    (entry / ".partial-1-1-1" / "notes").write_bytes(b"mine")
    (entry / "y.partial-2").write_bytes(b"mine too")
    before = tree(entry)
    assert _open(uri, so, tmp_path / "cache").read(0) == RecordFile(local).read(0)
    after = tree(entry)
    assert {k: after[k] for k in before} == before and set(after) == set(before) | {"cls.rec"}


@pytest.mark.parametrize("how", ["new-file", "in-place"])
def test_a_planted_copy_of_the_right_size_is_not_served(dataset, s3, so, tmp_path, how):  # noqa: F811
    uri, local = dataset
    ref = RecordFile(local)
    cache = tmp_path / "cache"
    keys = _entries(cache, uri, so)
    copy = cache / "objects" / keys["cls.rec"] / "cls.rec"
    good = copy.read_bytes()
    other = bytes(reversed(good))  # same size, other bytes
    if how == "new-file":  # another file put in its place
        (copy.parent / "tmp").write_bytes(other)
        os.replace(copy.parent / "tmp", copy)
        store = _open(uri, so, cache)
        with pytest.raises(CacheError, match="other bytes") as e:
            store.read(0)
        assert e.value.path == str(copy) and copy.read_bytes() == other  # left untouched
    else:  # the cache's own copy overwritten in place (same file, mtime kept): repaired
        st = os.stat(copy)
        with open(copy, "r+b") as f:
            f.write(other)
        os.utime(copy, ns=(st.st_atime_ns, st.st_mtime_ns))
        s3.log.clear()
        store = _open(uri, so, cache)
        assert [store.read(i) for i in range(len(store))] == [ref.read(i) for i in range(len(ref))]
        assert s3.served("trust/cls.rec") == len(good) and copy.read_bytes() == good


# --------------------------------------------------------------------------- indexes
def _forge(gdx: bytes) -> bytes:
    """The same binary index with two offsets swapped, its CRCs made to match: what someone
    who knows the format can plant (same .idx size, mtime and CRC in the header)."""
    head, body = bytearray(gdx[:72]), bytearray(gdx[72:])
    a, b = struct.unpack_from("<q", body, 8 * 5)[0], struct.unpack_from("<q", body, 8 * 9)[0]
    struct.pack_into("<q", body, 8 * 5, b)
    struct.pack_into("<q", body, 8 * 9, a)
    struct.pack_into("<Q", head, 56, zlib.crc32(bytes(body)))
    struct.pack_into("<Q", head, 64, zlib.crc32(bytes(head[:64])))
    return bytes(head + body)


def test_a_planted_index_with_other_offsets_is_not_trusted(tmp_path, cache):
    path = stock_rec(str(tmp_path / "stock.rec"))
    assert RecordFile(path).read(5) == payload(5)  # parsed once into the cache
    cached = index_cache_path(path[:-4] + ".idx")
    planted = _forge(open(cached, "rb").read())
    with open(cached + ".new", "wb") as f:
        f.write(planted)
    os.replace(cached + ".new", cached)
    with pytest.warns(RuntimeWarning, match="other bytes"):
        f = RecordFile(path)
    assert f._offsets.flags.writeable  # the text parsed here, not the planted copy mapped
    assert [f.read(i) for i in (5, 9, 11999)] == [payload(5), payload(9), payload(11999)]
    assert open(cached, "rb").read() == planted  # left untouched


def test_a_link_or_fifo_at_an_index_entry_is_ignored(tmp_path, cache):
    path = stock_rec(str(tmp_path / "stock.rec"))
    cached = index_cache_path(path[:-4] + ".idx")
    elsewhere = stock_rec(str(tmp_path / "other.rec"))  # a valid copy of another .idx...
    from gluon_data.stores.recordio import write_binary_index
    os.makedirs(os.path.dirname(cached), mode=0o700)
    os.symlink(write_binary_index(elsewhere[:-4] + ".idx"), cached)  # ...linked in its place
    with pytest.warns(RuntimeWarning, match="symbolic link"):
        f = RecordFile(path)
    assert f._offsets.flags.writeable and f.read(7) == payload(7)
    assert os.path.islink(cached)
    os.remove(cached)
    os.mkfifo(cached)
    with pytest.warns(RuntimeWarning, match="FIFO"):
        f = RecordFile(path)  # never waits on it
    assert f._offsets.flags.writeable and f.read(8) == payload(8)
    assert stat.S_ISFIFO(os.lstat(cached).st_mode)


# --------------------------------------------------------------------------- the folder
def test_a_cache_folder_others_can_write_is_refused_or_ignored(dataset, so, tmp_path,
                                                                monkeypatch):  # noqa: F811
    uri, local = dataset
    cache = tmp_path / "shared"
    cache.mkdir()
    os.chmod(cache, 0o777)
    with pytest.raises(CacheError, match="writable by group or others") as e:
        _open(uri, so, cache).read(0)  # the object cache refuses
    assert e.value.path == str(cache) and os.listdir(cache) == []
    monkeypatch.setenv("GLUON_DATA_CACHE_DIR", str(cache))
    path = stock_rec(str(tmp_path / "stock.rec"))
    with pytest.warns(RuntimeWarning, match="writable by group or others"):
        f = RecordFile(path)  # the index cache is ignored: the text parsed here
    assert f.read(3) == payload(3) and os.listdir(cache) == []
    if os.geteuid() == 0:  # someone else's folder, private or not
        os.chmod(cache, 0o700)
        os.chown(cache, 4321, 4321)
        with pytest.raises(CacheError, match="owned by uid 4321"):
            _open(uri, so, cache).read(0)
        with pytest.warns(RuntimeWarning, match="owned by uid 4321"):
            assert RecordFile(path).read(4) == payload(4)
        assert os.listdir(cache) == []


def test_cache_folders_are_made_private(tmp_path, cache, monkeypatch):
    deep = tmp_path / "a" / "b" / "gd"
    monkeypatch.setenv("GLUON_DATA_CACHE_DIR", str(deep))
    path = stock_rec(str(tmp_path / "stock.rec"))
    assert RecordFile(path).read(1) == payload(1)
    made = [tmp_path / "a", tmp_path / "a" / "b", deep, deep / "index", deep / "locks",
            os.path.dirname(index_cache_path(path[:-4] + ".idx"))]
    assert [oct(os.lstat(d).st_mode & 0o777) for d in made] == [oct(0o700)] * len(made)
    assert os.lstat(deep / "key").st_mode & 0o077 == 0


# --------------------------------------------------------------------------- one limit
def test_parsed_indexes_and_downloads_share_one_limit(dataset, so, tmp_path, cache,
                                                      monkeypatch):  # noqa: F811
    uri, local = dataset
    a, b = stock_rec(str(tmp_path / "a.rec")), stock_rec(str(tmp_path / "b.rec"))
    RecordFile(a)
    one = ShardCache(str(cache)).usage()
    gdx = os.path.getsize(index_cache_path(a[:-4] + ".idx"))
    assert one == gdx  # the parsed index counts
    monkeypatch.setenv("GLUON_DATA_CACHE_LIMIT", str(gdx + 100))  # room for one index
    assert RecordFile(b).read(2) == payload(2)
    assert not os.path.exists(index_cache_path(a[:-4] + ".idx"))  # the older one evicted
    assert ShardCache(str(cache)).usage() <= gdx + 100
    limit = os.path.getsize(local) + os.path.getsize(local[:-4] + ".idx")
    assert gdx > os.path.getsize(local)  # the index must go for the download to fit
    store = open_store(uri, storage_options=so, cache_dir=str(cache), cache_limit=limit, **FAST)
    assert store.read(0) == RecordFile(local).read(0)  # a download evicts the parsed index
    assert not os.path.exists(index_cache_path(b[:-4] + ".idx"))
    assert ShardCache(str(cache)).usage() == limit


def test_a_downloaded_stock_index_is_parsed_into_the_same_cache(s3, so, tmp_path, cache):  # noqa: F811
    from gluon_data.storage.remotefs import filesystem
    local = stock_rec(str(tmp_path / "stock.rec"))
    uri = "s3://%s/trust/stock.rec" % BUCKET
    fs, _ = filesystem(uri, so)
    for ext in (".rec", ".idx"):  # a stock pair, no metadata
        fs.put_file(local[:-4] + ext, uri[:-4].split("://", 1)[1] + ext)
    store_cache = tmp_path / "store-cache"
    store = _open(uri, so, store_cache)
    assert [store.read(i) for i in (0, 5, 11999)] == [payload(0), payload(5), payload(11999)]
    assert not cache.exists()  # nothing in the default cache: one folder, one limit
    (entry,) = os.listdir(store_cache / "index")
    assert os.listdir(store_cache / "index" / entry) == ["index.gdx"]
    gdx = os.path.getsize(store_cache / "index" / entry / "index.gdx")
    assert ShardCache(str(store_cache)).usage() == gdx + sum(
        os.path.getsize(local[:-4] + ext) for ext in (".rec", ".idx"))


class _Bytes:
    """A remote holding one object (the cache's side of a fetch is what is tested here)."""
    data = b"object-bytes" * 10

    def download(self, uri, tmp, size, sha256):
        import hashlib
        with open(tmp, "wb") as f:
            f.write(self.data)
        return hashlib.sha256(self.data).hexdigest()


@pytest.mark.parametrize("name", ["key", "locks/{k}.pin", "locks/{k}.get", "locks/{k}.seal",
                                  "locks/{k}.seal.partial", "cache.lock"])
@pytest.mark.parametrize("what", ["folder", "link", "dangling-link"])
def test_a_link_or_folder_at_a_file_of_the_cache_is_a_typed_error_naming_it(tmp_path, name,
                                                                             what):
    """The cache's own files (its key, locks, seals) planted as a folder or a link: the fetch
    raises CacheError naming the path and what it is, never a raw OSError, and leaves it."""
    cache = ShardCache(str(tmp_path / "cache"))
    uri = "s3://bucket/a.rec"
    key = cache.entry_key(uri, "")
    cache.ready()
    planted = os.path.join(cache.cache_dir, name.format(k=key))
    target = tmp_path / "target"
    target.write_bytes(b"someone else's")
    if what == "folder":
        os.mkdir(planted)
    else:
        os.symlink(str(target) if what == "link" else str(tmp_path / "nowhere"), planted)
    with pytest.raises(CacheError) as e:
        cache.fetch(_Bytes(), uri, len(_Bytes.data))
    assert e.value.path == planted
    kind = "a directory" if what == "folder" else "a symbolic link"
    assert kind in str(e.value) and "left untouched" in str(e.value)
    assert os.path.lexists(planted) and target.read_bytes() == b"someone else's"
    if what == "folder":
        os.rmdir(planted)
    else:
        os.remove(planted)
    path, _ = cache.fetch(_Bytes(), uri, len(_Bytes.data))  # removed: fetched as usual
    assert open(path, "rb").read() == _Bytes.data
