"""The one upload protocol of every output in object storage (a ``.rec``, an LMDB environment,
a sharded dataset): the upload marker, the objects, the commit document last; resumes of
interrupted uploads; and the converter importing the uploader (never the other way round).
Against moto's S3 server on 127.0.0.1 (tests/test_remote.py), whose request log is read."""
import contextlib
import os
import subprocess
import sys

import pytest

pytest.importorskip("moto.server")
from test_remote import BUCKET, moto_s3, so  # noqa: E402,F401  (so: the fixture)

from gluon_data import convert  # noqa: E402
from gluon_data.errors import FormatError, RemoteError  # noqa: E402
from gluon_data.format.meta import dumps_meta  # noqa: E402
from gluon_data.storage.remotefs import Remote  # noqa: E402
from gluon_data.stores.remote.commit import Commit  # noqa: E402
from gluon_data.convert.to_uri import convert_to_uri
from gluon_data.convert.upload import ShardUploader  # noqa: E402
from gluon_data.storage.remotefs import filesystem  # noqa: E402
from gluon_data.convert.sample import make_imagefolder  # noqa: E402
from gluon_data.stores.base import open_store  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def s3():
    with moto_s3() as server:
        yield server


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    return make_imagefolder(str(tmp_path_factory.mktemp("upload") / "folder"), per_class=2)


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("GLUON_DATA_CACHE_DIR", str(tmp_path / "default-cache"))


def _writes(log, folder):
    """``[(method, name under folder)]`` of every PUT and DELETE under ``BUCKET/folder/``, in
    the order the server received them (the writability probe left out)."""
    base = "/%s/%s/" % (BUCKET, folder)
    return [(m, p[len(base):]) for m, p, _ in log if m in ("PUT", "DELETE")
            and p.startswith(base) and "gluon-data-probe" not in p]


def _check_protocol(writes, marker, commit, objects):
    """The marker first, the old commit document removed, every object of ``objects``, then
    the commit document and the marker removed, last; no commit document in between."""
    assert writes and writes[0] == ("PUT", marker), writes
    assert writes[1] == ("DELETE", commit), writes
    assert writes[-2:] == [("PUT", commit), ("DELETE", marker)], writes
    between = writes[2:-2]
    assert sorted({n for m, n in between if m == "PUT"}) == sorted(objects), writes
    assert ("PUT", commit) not in between and ("PUT", marker) not in between


def _reads_back(uri, so, tmp_path, src, split=None):
    local = str(tmp_path / "ref" / "c.rec")
    if not os.path.exists(local):
        convert(src, local, "imagefolder")
    ref = open_store(local)
    store = open_store(uri, split, storage_options=so, cache_dir=str(tmp_path / "rcache"),
                       retries=1, backoff=0.05)
    try:
        assert [store.read(i) for i in range(len(store))] == \
            [ref.read(i) for i in range(len(ref))]
    finally:
        store.close()
        ref.close()


# kind: (output name, convert options, marker, commit, objects, the object lost later)
SHARDS = ["c-%05d-of-00002%s" % (k, ext) for k in range(2)
          for ext in (".rec", ".idx", ".meta.json", ".upload.json")]
OUTPUTS = {
    "rec": ("c.rec", {}, "c.uploading.json", "c.meta.json", ["c.rec", "c.idx"], "c.idx"),
    "lmdb": ("c.lmdb", {}, "c.lmdb/uploading.json", "c.lmdb/meta.json", ["c.lmdb/data.mdb"],
             "c.lmdb/data.mdb"),
    "sharded": ("c.rec", {"shards": 2}, "c.uploading.json", "c.shards.json", SHARDS,
                "c-00001-of-00002.idx"),
}


def test_every_output_is_uploaded_marker_objects_commit_and_a_lost_object_the_same_way(
        s3, so, src, tmp_path):
    """Expected: a fresh upload of a .rec, an LMDB and a sharded output writes the marker, its
    objects, then the commit document, in that order; after an object is lost, a resumed upload
    goes through the same order (the commit document removed first, written again only once the
    object is back), instead of leaving a commit document that names a missing object (.rec) or
    re-sending a shard while the manifest still names it (sharded)."""
    for kind, (name, opts, marker, commit, objects, lost) in sorted(OUTPUTS.items()):
        folder, here = "order-" + kind, tmp_path / kind
        uri = "s3://%s/%s/%s" % (BUCKET, folder, name)
        kw = dict(storage_options=so, cache_dir=str(here / "stage"), **opts)
        s3.log.clear()
        report = convert_to_uri(src, uri, "imagefolder", **kw)
        _check_protocol(_writes(s3.log, folder), marker, commit, objects)
        fs, _ = filesystem(uri, so)
        fs.rm_file("%s/%s/%s" % (BUCKET, folder, lost))
        s3.log.clear()
        convert_to_uri(src, uri, "imagefolder", resume=True, overwrite=True, **kw)
        writes = _writes(s3.log, folder)
        resent = {n for m, n in writes if m == "PUT"} - {marker, commit}
        assert lost in resent, (kind, writes)
        _check_protocol(writes, marker, commit, sorted(resent))
        _reads_back(report.outputs["train"], so, here, src, "train" if kind == "lmdb" else None)


def test_an_upload_stopped_after_its_first_commit_document_resumes(s3, so, src, tmp_path):
    """Expected: two splits (two .rec datasets) whose upload stopped when the second commit
    document was sent resume from the journal: nothing uploaded is sent again, the first
    dataset is left alone and the second is committed (the journal recorded the first commit
    in a form its own schema refused, so the resume failed)."""
    uri = "s3://%s/two/c.rec" % BUCKET
    kw = dict(storage_options=so, cache_dir=str(tmp_path / "stage"), val_ratio=0.34)
    s3.kill_on_put = "two/c_val.meta.json"  # the server dies when the val metadata arrives
    with pytest.raises(RemoteError):
        convert_to_uri(src, uri, "imagefolder", retries=0, **kw)
    s3.start()
    with pytest.raises(FormatError, match="upload of this dataset is in progress"):
        open_store("s3://%s/two/c_val.rec" % BUCKET, storage_options=so,
                   cache_dir=str(tmp_path / "c"), retries=1, backoff=0.05)
    s3.log.clear()
    report = convert_to_uri(src, uri, "imagefolder", resume=True, **kw)
    assert _writes(s3.log, "two") == [("PUT", "c_val.uploading.json"),
                                      ("DELETE", "c_val.meta.json"),
                                      ("PUT", "c_val.meta.json"),
                                      ("DELETE", "c_val.uploading.json")]
    local = str(tmp_path / "ref" / "c.rec")
    ref = convert(src, local, "imagefolder", val_ratio=0.34)
    for split in ("train", "val"):
        a = open_store(report.outputs[split], storage_options=so,
                       cache_dir=str(tmp_path / "rcache"), retries=1, backoff=0.05)
        b = open_store(ref.outputs[split])
        assert len(a) == len(b) > 0
        assert [a.read(i) for i in range(len(a))] == [b.read(i) for i in range(len(b))]
        a.close()
        b.close()


@contextlib.contextmanager
def _unanswered(server, method, suffix, n):
    """The next ``n`` requests ``method`` of a path ending in ``suffix`` are taken and never
    answered (the connection is dropped), as a server going away mid-request."""
    inner = server._server._server.app
    left = [n]

    def app(environ, start_response):
        if (left[0] and environ["REQUEST_METHOD"] == method
                and environ.get("PATH_INFO", "").endswith(suffix)):
            left[0] -= 1
            environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
            raise ConnectionAbortedError("%s dropped (test)" % method)
        return inner(environ, start_response)

    server._server._server.app = app
    try:
        yield left
    finally:
        server._server._server.app = inner


def test_an_interrupted_lmdb_upload_resumes(s3, so, src, tmp_path):
    """Expected: an LMDB upload stopped after its commit document (its marker never removed)
    resumes: data.mdb and meta.json are not sent again, the marker is removed and the
    environment reads back whole."""
    uri = "s3://%s/lmdbresume/c.lmdb" % BUCKET
    kw = dict(storage_options=so, cache_dir=str(tmp_path / "stage"))
    with _unanswered(s3, "DELETE", "lmdbresume/c.lmdb/uploading.json", 100) as left:
        with pytest.raises(RemoteError) as e:
            convert_to_uri(src, uri, "imagefolder", retries=0, **kw)
        assert left[0] < 100, e.value  # it was the marker's removal that failed
    fs, _ = filesystem(uri, so)
    assert fs.exists("%s/lmdbresume/c.lmdb/uploading.json" % BUCKET)
    s3.log.clear()
    convert_to_uri(src, uri, "imagefolder", resume=True, **kw)
    assert [w for w in _writes(s3.log, "lmdbresume") if w[0] == "PUT"] == []
    assert not fs.exists("%s/lmdbresume/c.lmdb/uploading.json" % BUCKET)
    _reads_back(uri, so, tmp_path, src, "train")


def test_a_commit_document_is_never_written_before_every_object_exists(s3, so, tmp_path):
    """Expected: the protocol object refuses to commit while an object it needs is missing or
    of another size (a RemoteError naming it, the dataset left uncommitted and invisible), and
    commits once both are there."""
    remote = Remote(so, retries=1)
    uri = "s3://%s/commitcheck/d.rec" % BUCKET
    c = Commit(remote, uri)
    rec, idx = tmp_path / "d.rec", tmp_path / "d.idx"
    rec.write_bytes(b"0123456789")
    idx.write_bytes(b"0\t0\n")
    c.begin()
    remote.put_file(str(rec), uri)
    doc = {"format": "gluon_data", "files": {}}
    sizes = {uri: 10, uri[:-4] + ".idx": 4}
    with pytest.raises(RemoteError, match="missing before committing") as e:
        c.end(doc, sizes)
    assert e.value.path == uri[:-4] + ".idx"
    remote.pipe(uri[:-4] + ".idx", b"0\t")  # another size: still not committed
    with pytest.raises(RemoteError, match="2 bytes, not 4"):
        c.end(doc, sizes)
    fs, _ = filesystem(uri, so)
    assert not fs.exists("%s/commitcheck/d.meta.json" % BUCKET)
    assert fs.exists("%s/commitcheck/d.uploading.json" % BUCKET)
    remote.put_file(str(idx), uri[:-4] + ".idx")
    c.end(doc, sizes)
    assert fs.cat_file("%s/commitcheck/d.meta.json" % BUCKET) == dumps_meta(doc)
    assert not fs.exists("%s/commitcheck/d.uploading.json" % BUCKET)


def test_the_converter_imports_the_uploader_not_the_other_way_round():
    """Expected: the uploader lives with the converters; loading the stores (every URI read
    does, the remote store included) loads no converter module, and ``convert_to_uri`` is
    still reachable from its old home ``gluon_data.remote``."""
    code = ("import sys, gluon_data.stores, gluon_data.stores.remote.stores; "
            "assert not [m for m in sys.modules if m.startswith('gluon_data.convert')], "
            "sorted(m for m in sys.modules if m.startswith('gluon_data.convert')); "
            "from gluon_data.remote import convert_to_uri; "
            "import gluon_data.convert.to_uri as t; assert convert_to_uri is t.convert_to_uri")
    env = dict(os.environ, PYTHONPATH=ROOT)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr


def test_a_staging_folder_is_a_cache_whose_staging_area_holds_the_shards(tmp_path):
    """``ShardUploader(staging=X)`` (deprecated) stages through the one cache, rooted at X:
    the shards go to X's staging area ``shards``, pinned and counted like every entry."""
    with pytest.warns(DeprecationWarning, match="cache_dir"):
        sink = ShardUploader("s3://bucket/voc.rec", Remote(), staging=str(tmp_path / "mine"))
    assert sink.cache_dir == str(tmp_path / "mine")
    root, area = sink._stage_area()
    try:
        assert root.startswith(os.path.join(str(tmp_path / "mine"), "staging", "shards") + os.sep)
        assert area.path == os.path.dirname(root)
    finally:
        area.release()
    with pytest.raises(ValueError, match="not both"):
        ShardUploader("s3://bucket/voc.rec", Remote(), staging=str(tmp_path),
                      cache_dir=str(tmp_path))
