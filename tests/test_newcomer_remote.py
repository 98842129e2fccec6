"""``verify`` of a dataset in object storage checks what the store serves now: a good copy
in the cache never hides a damaged object (real loopback S3 and HTTP servers)."""
import os

import pytest

pytest.importorskip("s3fs", reason="object storage needs s3fs (the [remote] extra)")
pytest.importorskip("moto", reason="the loopback S3 server needs moto")

from gluon_data import ConvertOptions, convert, verify  # noqa: E402
from gluon_data.cli import main  # noqa: E402
from gluon_data.convert.sample import make_imagefolder  # noqa: E402
from gluon_data.storage.remotefs import filesystem  # noqa: E402
from gluon_data.stores.base import open_store  # noqa: E402

from http_range_server import RangeServer  # noqa: E402
from s3_server import BUCKET, FAST, _options, moto_s3  # noqa: E402


@pytest.fixture(scope="module")
def s3():
    with moto_s3() as server:
        yield server


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    return make_imagefolder(str(tmp_path_factory.mktemp("nsrc") / "data"), per_class=3)


def _read_all(uri, remote):
    """What a training job does first: every record read, the objects cached."""
    store = open_store(uri, reads="cache", **remote)
    if getattr(store, "splits", None) is not None:
        store.fetch()
    else:
        for i in range(len(store)):
            store.read(i)
    store.close()


def _flip(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 0xFF]) + data[at + 1:]


@pytest.mark.parametrize("kind, damage", [("rec", "flip"), ("rec", "idx"), ("shards", "flip"),
                                          ("shards", "idx"), ("lmdb", "flip")])
def test_verify_reads_the_remote_not_the_good_cached_copy(s3, src, tmp_path, kind, damage):
    so = _options(s3)
    remote = dict(storage_options=so, cache_dir=str(tmp_path / "cache"), **FAST)
    fs, _ = filesystem("s3://%s" % BUCKET, so)
    prefix = "s3://%s/%s-%s/c" % (BUCKET, kind, damage)
    out = prefix + (".lmdb" if kind == "lmdb" else ".rec")
    convert(src, out, "imagefolder", ConvertOptions(
        shards=2 if kind == "shards" else None, storage_options=so,
        cache_dir=str(tmp_path / "stage")))
    uri = prefix + ".shards.json" if kind == "shards" else out
    _read_all(uri, remote)
    assert verify(uri, remote=remote).ok and verify(uri, deep=True, remote=remote).ok
    target = {"rec": prefix + ".rec", "shards": prefix + "-00001-of-00002.rec",
              "lmdb": prefix + ".lmdb/data.mdb"}[kind]
    if damage == "idx":
        target = target[:-4] + ".idx"
    good = fs.cat_file(target)
    fs.pipe_file(target, b"\n".join(good.split(b"\n")[1:]) if damage == "idx" else
                 _flip(good, len(good) // 2 if kind != "lmdb" else 11204 + 300))
    if kind == "lmdb":  # (a byte that a local verify of that copy finds)
        local = str(tmp_path / "local.lmdb")
        os.makedirs(local)
        open(os.path.join(local, "data.mdb"), "wb").write(fs.cat_file(target))
        assert not verify(local).ok
    for deep in (False, True):
        report = verify(uri, deep=deep, remote=remote)
        assert not report.ok, (deep, str(report))
    ep = ["--storage-option", "endpoint_url=" + s3.url]
    os.environ["GLUON_DATA_CACHE_DIR"], was = remote["cache_dir"], os.environ.get(
        "GLUON_DATA_CACHE_DIR")
    try:
        assert main(["verify", uri, "--deep"] + ep) == 1
    finally:
        os.environ["GLUON_DATA_CACHE_DIR"] = was
    fs.pipe_file(target, good)  # put back: the cached copy was left as it was
    assert verify(uri, remote=remote).ok and verify(uri, deep=True, remote=remote).ok


def test_verify_deep_finds_an_object_changed_in_place_under_the_same_version(src, tmp_path):
    """An HTTP server whose ETag (inode, size, mtime) is unchanged by an in-place rewrite:
    the cache key is the same, the bytes are not, and ``--deep`` reads the bytes."""
    serve = str(tmp_path / "serve")
    os.makedirs(serve)
    convert(src, os.path.join(serve, "c.rec"), "imagefolder")
    remote = dict(cache_dir=str(tmp_path / "cache"), **FAST)
    with RangeServer(serve) as server:
        uri = server.url + "/c.rec"
        _read_all(uri, remote)
        assert verify(uri, deep=True, remote=remote).ok
        path = os.path.join(serve, "c.rec")
        st = os.stat(path)
        with open(path, "r+b") as f:  # same inode, same size
            f.seek(st.st_size // 2)
            b = f.read(1)
            f.seek(st.st_size // 2)
            f.write(bytes([b[0] ^ 0xFF]))
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # same mtime: the same ETag
        report = verify(uri, deep=True, remote=remote)
        assert not report.ok and "changed in place" in str(report), str(report)
        assert not verify(uri, remote=remote).ok


def test_a_dataset_replaced_by_one_of_the_same_size_on_a_server_without_etags(src, tmp_path):
    """Python's ``http.server`` sends Last-Modified and no ETag: a dataset replaced there by
    another whose ``.rec`` has the same size (the same images shuffled) is a new version, read
    anew, never its ``.idx`` paired with the copy of the old ``.rec`` cached under the same
    key (every read then failed with "bad magic")."""
    serve, other = str(tmp_path / "serve"), str(tmp_path / "other")
    convert(src, os.path.join(serve, "c.rec"), "imagefolder")
    convert(src, os.path.join(other, "c.rec"), "imagefolder", shuffle=True, seed=5)
    a, b = (open(os.path.join(d, "c.rec"), "rb").read() for d in (serve, other))
    assert len(a) == len(b) and a != b
    remote = dict(cache_dir=str(tmp_path / "cache"), **FAST)
    with RangeServer(serve, etag=False) as server:
        uri = server.url + "/c.rec"
        _read_all(uri, remote)
        for name in ("c.meta.json", "c.idx", "c.rec"):  # replaced, a second later
            path = os.path.join(other, name)
            st = os.stat(path)
            os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 2_000_000_000))
            os.replace(path, os.path.join(serve, name))
        store = open_store(uri, reads="cache", **remote)
        ref = open_store(os.path.join(serve, "c.rec"))
        assert [store.read(i) for i in range(len(store))] == \
            [ref.read(i) for i in range(len(ref))]
        store.close()
        assert verify(uri, deep=True, remote=remote).ok
