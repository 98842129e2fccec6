"""The one "is this ours" rule at a URI (``format.ownership.location_ownership``, a local
output's rule too): the commit document is read through the document check with its schema,
so a damaged, altered or foreign one is refused naming the URI, with nothing written; our own
dataset is replaced with overwrite. Against moto's S3 server on 127.0.0.1, whose request log
is read. Framework-free: runs in the core lane."""
import pytest

pytest.importorskip("moto.server")
from s3_server import BUCKET, _options, moto_s3  # noqa: E402

from gluon_data.convert.sample import make_imagefolder  # noqa: E402
from gluon_data.convert.to_uri import convert_to_uri  # noqa: E402
from gluon_data.errors import OutputError  # noqa: E402
from gluon_data.storage.remotefs import Remote, filesystem  # noqa: E402
from gluon_data.stores.base import open_store  # noqa: E402
from gluon_data.stores.remote.commit import Commit  # noqa: E402

WRITES = ("PUT", "POST", "DELETE")


@pytest.fixture(scope="module")
def s3():
    with moto_s3() as server:
        yield server


@pytest.fixture
def so(s3, tmp_path, monkeypatch):
    monkeypatch.setenv("GLUON_DATA_CACHE_DIR", str(tmp_path / "default-cache"))
    s3.kill_after = s3.kill_on_put = s3.drop_put = None
    return _options(s3)


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    return make_imagefolder(str(tmp_path_factory.mktemp("own") / "folder"), per_class=2)


def _convert(src, uri, so, tmp_path, **kw):
    return convert_to_uri(src, uri, "imagefolder", storage_options=so, remote_retries=1,
                          cache_dir=str(tmp_path / "stage"), **kw)


def _objects(fs, prefix):
    """Every object under ``prefix`` with its bytes (what must stay untouched)."""
    return {p: fs.cat_file(p) for p in fs.find(prefix)}


def _commit_document(uri):
    return uri + "/meta.json" if uri.endswith(".lmdb") else uri[:-4] + ".meta.json"


@pytest.mark.parametrize("ext", ["rec", "lmdb"])
def test_our_dataset_is_replaced_with_overwrite_only(s3, so, src, tmp_path, ext):
    uri = "s3://%s/ours-%s/c.%s" % (BUCKET, ext, ext)
    _convert(src, uri, so, tmp_path)
    with pytest.raises(FileExistsError, match="overwrite"):
        _convert(src, uri, so, tmp_path)
    s3.log.clear()
    _convert(src, uri, so, tmp_path, overwrite=True)
    assert any(e[0] == "PUT" and e[1].endswith(_commit_document(uri).split("/", 3)[3])
               for e in s3.log)
    store = open_store(uri, storage_options=so, cache_dir=str(tmp_path / "cache"))
    assert len(store) == 6


DAMAGES = {
    # a field changed by hand: the checksum no longer matches (a split's, for an LMDB)
    "altered": (lambda raw: raw.replace(b'"num_records": 6', b'"num_records": 5', 1),
                "checksum mismatch"),
    "truncated": (lambda raw: raw[:len(raw) // 2], "not valid JSON"),
    "not utf-8": (lambda raw: b"\xff\xfe" + raw, "not valid JSON"),
    "foreign": (lambda raw: b'{"format": "someone-else", "format_version": 1}',
                'missing "format"'),
    "newer": (lambda raw: raw.replace(b'"format_version": 1', b'"format_version": 99', 1),
              "version 99 is not supported"),
}


@pytest.mark.parametrize("ext", ["rec", "lmdb"])
@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_a_damaged_or_foreign_commit_document_is_refused_naming_the_uri(s3, so, src, tmp_path,
                                                                       ext, damage):
    uri = "s3://%s/damaged-%s-%s/c.%s" % (BUCKET, ext, damage.replace(" ", ""), ext)
    _convert(src, uri, so, tmp_path)
    fs, _ = filesystem(uri, so)
    commit = _commit_document(uri)
    change, reason = DAMAGES[damage]
    raw = fs.cat_file(commit)
    assert change(raw) != raw
    fs.pipe_file(commit, change(raw))
    before = _objects(fs, uri.rsplit("/", 1)[0])
    s3.log.clear()
    with pytest.raises(OutputError) as e:
        _convert(src, uri, so, tmp_path, overwrite=True)
    assert e.value.path == uri
    assert "not a dataset written by gluon-data" in str(e.value)
    assert commit in str(e.value) and reason in str(e.value), str(e.value)
    assert not [x for x in s3.log if x[0] in WRITES], s3.log
    assert _objects(fs, uri.rsplit("/", 1)[0]) == before


def test_a_foreign_object_without_any_document_is_refused(s3, so, src, tmp_path):
    uri = "s3://%s/foreign/data.rec" % BUCKET
    fs, path = filesystem(uri, so)
    fs.pipe_file(path, b"not a dataset of ours")
    s3.log.clear()
    with pytest.raises(OutputError) as e:
        _convert(src, uri, so, tmp_path, overwrite=True)
    assert e.value.path == uri
    assert "no gluon_data metadata document at %s" % _commit_document(uri) in str(e.value)
    assert not [x for x in s3.log if x[0] in WRITES]
    assert fs.cat_file(path) == b"not a dataset of ours"


@pytest.mark.parametrize("marker,ours,reason", [
    (b'{"writer": "gluon_data", "started": 1700000000.5}', True, None),
    (b'{"writer": "gluon_data", "started": "yesterday"}', False, "field 'started'"),
    (b'{"writer": "someone-else"}', False, 'missing "writer"'),
    (b"[]", False, 'missing "writer"'),
])
def test_an_interrupted_upload_is_ours_by_its_marker_checked_as_a_document(s3, so, marker,
                                                                          ours, reason):
    """No commit document yet: the upload marker decides, through the same document check."""
    remote = Remote(so, retries=1)
    uri = "s3://%s/marker-%d/c.rec" % (BUCKET, len(marker))
    remote.pipe(uri, b"half an upload")
    remote.pipe(uri[:-4] + ".uploading.json", marker)
    c = Commit(remote, uri)
    assert c.ours() is ours
    if ours:
        c.refuse([uri], overwrite=True)
        return
    with pytest.raises(OutputError, match=reason) as e:
        c.refuse([uri], overwrite=True)
    assert e.value.path == uri and uri[:-4] + ".uploading.json" in str(e.value)


def test_a_commit_document_decides_over_a_marker(s3, so):
    """Both exist (an upload stopped between its steps): the commit document is checked,
    and a damaged one is not excused by a marker of ours."""
    remote = Remote(so, retries=1)
    uri = "s3://%s/both/c.rec" % BUCKET
    remote.pipe(uri, b"data")
    remote.pipe(uri[:-4] + ".uploading.json", b'{"writer": "gluon_data", "started": 0}')
    remote.pipe(uri[:-4] + ".meta.json", b'{"format": "gluon_data", "format_version": 1}')
    verdict = Commit(remote, uri).ownership()
    assert not verdict.ours and verdict.where == uri[:-4] + ".meta.json"
    assert "lacks the required field" in verdict.reason
