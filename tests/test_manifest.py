"""Manifests are commit documents, and every JSON document we read is schema-checked: a
damaged or mistyped manifest, metadata, checkpoint, upload journal or upload receipt is a typed
error naming the file and the field (through the API and the CLI), never a raw TypeError,
KeyError, a reordered or mixed dataset."""
import json
import os
import shutil

import pytest

from gluon_data import convert
from gluon_data.cli import main
from gluon_data.errors import ConversionError, FormatError
from gluon_data.format.meta import dumps_meta, meta_path, read_meta
from gluon_data.stores.recordio import RecordFile
from gluon_data.convert.sample import make_imagefolder
from gluon_data.stores.shardstore import ShardedStore
from gluon_data.convert.sharded import convert_sharded
from gluon_data.stores.shards import read_manifest, write_combined_index
from gluon_data.tools.verify import verify_sharded
from gluon_data.stores.base import open_store

pytestmark = pytest.mark.reliability

NAME = "c-%05d-of-00004.rec"


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    return make_imagefolder(str(tmp_path_factory.mktemp("msrc") / "src"), classes=("a", "b"),
                            per_class=4, size_range=(16, 24), seed=1)


@pytest.fixture(scope="module")
def sharded(src, tmp_path_factory):
    """8 records in 4 shards of 2, and every record's bytes."""
    out = tmp_path_factory.mktemp("msh") / "c.rec"
    man = convert_sharded(src, str(out), "imagefolder", shards=4).outputs["train"]
    store = ShardedStore(man)
    return man, [store.read(i) for i in range(len(store))]


def _copy(man, tmp_path):
    d = tmp_path / "copy"
    shutil.copytree(os.path.dirname(man), str(d))
    return str(d / os.path.basename(man))


def _doc(man):
    with open(man, "rb") as f:
        return json.loads(f.read())


def _write(path, doc, crc=True):
    """``crc``: with a recomputed ``meta_crc32`` (only the schema and invariants can tell);
    else the stored one is kept, as after an edit by hand."""
    with open(path, "wb") as f:
        f.write(dumps_meta(doc) if crc else json.dumps(doc, indent=1, sort_keys=True).encode())


def _cli(capsys, *args):
    rc = main(list(args))
    out = capsys.readouterr()
    return rc, out.out + out.err


def _refused_everywhere(man, field, capsys):
    """The API and the CLI (info, stats, verify) refuse ``man``, naming it and ``field``."""
    for fn in (read_manifest, open_store, ShardedStore,
               lambda p: write_combined_index(p, p + ".idx")):
        with pytest.raises(FormatError) as e:
            fn(man)
        assert e.value.path == man and field in str(e.value), str(e.value)
    rep = verify_sharded(man)
    assert not rep.ok and field in rep.problems[0]["reason"], rep.problems
    for cmd in ("info", "stats", "verify"):
        rc, text = _cli(capsys, cmd, man)
        assert rc == 1 and man in text and field in text and "Traceback" not in text, text


def _swap(d):
    d["shards"][1], d["shards"][2] = d["shards"][2], d["shards"][1]


def _dup(d):
    d["shards"][2] = dict(d["shards"][1])


def _another(d):  # one character: entry 1 names shard 2
    d["shards"][1]["name"] = NAME % 2


def _zero(d):
    d["shards"], d["num_records"] = [], 0


def _total(d):
    d["meta"]["num_records"] = 9


def _prefix(d):
    d["shards"][3]["name"] = "d-00003-of-00004.rec"


def _count(d):
    d["shards"][0]["name"] = "c-00000-of-00005.rec"


MUTATIONS = [(_another, "shards[1].name"), (_dup, "shards[2].name"), (_swap, "shards[1].name"),
             (_zero, "'shards' is empty"), (_total, "meta.num_records"),
             (_prefix, "shards[3].name"), (_count, "shards[0].name")]


@pytest.mark.parametrize("mutate,field", MUTATIONS, ids=[m.__name__ for m, _ in MUTATIONS])
def test_manifest_invariants_are_checked_on_open(sharded, tmp_path, capsys, mutate, field):
    man = _copy(sharded[0], tmp_path)
    doc = _doc(man)
    mutate(doc)
    _write(man, doc)
    _refused_everywhere(man, field, capsys)


def test_a_manifest_edited_without_its_checksum_is_refused(sharded, tmp_path, capsys):
    man = _copy(sharded[0], tmp_path)
    doc = _doc(man)
    doc["meta"]["classes"] = ["b", "a"]  # consistent, but not what was written
    _write(man, doc, crc=False)
    _refused_everywhere(man, "checksum mismatch", capsys)


BAD_FIELDS = [(lambda d: d["shards"][0].update(records="2"), "shards[0].records"),
              (lambda d: d["shards"][1].update(bytes=-5), "shards[1].bytes"),
              (lambda d: d["shards"][2].pop("bytes"), "shards[2].bytes"),
              (lambda d: d["shards"][0].update(name=7), "shards[0].name"),
              (lambda d: d.update(shards={"a": 1}), "'shards'"),
              (lambda d: d.update(num_records="8"), "'num_records'"),
              (lambda d: d["shards"][1].pop("records"), "shards[1].records"),
              (lambda d: d["meta"].update(num_records=None), "num_records"),
              (lambda d: d["shards"][3].update(idx_sha256=12), "shards[3].idx_sha256"),
              (lambda d: d.update(plan="x"), "'plan'")]


@pytest.mark.parametrize("mutate,field", BAD_FIELDS, ids=[f for _, f in BAD_FIELDS])
def test_mistyped_manifest_fields_are_format_errors_naming_the_field(sharded, tmp_path, capsys,
                                                                     mutate, field):
    man = _copy(sharded[0], tmp_path)
    doc = _doc(man)
    mutate(doc)
    _write(man, doc)
    _refused_everywhere(man, field, capsys)


def _reconvert_shard_1(src, tmp_path, **options):
    """Shard 1 of another conversion of 8 items into 4 shards."""
    out = tmp_path / "other" / "c.rec"
    convert_sharded(src, str(out), "imagefolder", shards=4, **options)
    return str(out.parent / (NAME % 1))


def _replace_shard_1(man, other):
    for ext in (".rec", ".idx", ".meta.json"):
        shutil.copy(other[:-4] + ext, os.path.join(os.path.dirname(man), NAME % 1)[:-4] + ext)
    gdx = os.path.join(os.path.dirname(man), NAME % 1)[:-4] + ".idx.gdx"
    if os.path.exists(gdx):
        os.remove(gdx)


def test_a_shard_of_another_conversion_with_the_same_count_is_refused(src, sharded, tmp_path,
                                                                       capsys):
    """Same records, same count and size: only its metadata's plan digest tells."""
    man = _copy(sharded[0], tmp_path)
    other = _reconvert_shard_1(src, tmp_path, max_file_bytes=10 ** 8)
    assert os.path.getsize(other) == os.path.getsize(os.path.join(os.path.dirname(man),
                                                                  NAME % 1))
    _replace_shard_1(man, other)
    store = ShardedStore(man)
    assert store.read(0) == sharded[1][0]
    with pytest.raises(FormatError, match=r"shard 1 of 4 .*another conversion") as e:
        store.read(2)
    assert e.value.path.endswith(NAME % 1)
    rep = verify_sharded(man)
    assert any("another conversion" in p["reason"] for p in rep.problems), rep.problems
    rc, text = _cli(capsys, "verify", man)
    assert rc == 1 and "another conversion" in text


def test_a_shard_of_other_content_with_the_same_count_is_refused(sharded, tmp_path):
    other_src = make_imagefolder(str(tmp_path / "src2"), classes=("a", "b"), per_class=4,
                                 size_range=(30, 40), seed=9)
    man = _copy(sharded[0], tmp_path)
    other = _reconvert_shard_1(other_src, tmp_path)
    assert len(RecordFile(other)) == 2
    _replace_shard_1(man, other)
    with pytest.raises(FormatError, match="shard 1 of 4"):
        ShardedStore(man).read(2)
    assert not verify_sharded(man).ok


def test_a_shard_whose_metadata_says_another_index_is_refused(sharded, tmp_path):
    man = _copy(sharded[0], tmp_path)
    mp = meta_path(os.path.join(os.path.dirname(man), NAME % 2))
    meta = read_meta(mp[:-len(".meta.json")] + ".rec")
    meta["shard"]["index"] = 1
    with open(mp, "wb") as f:
        f.write(dumps_meta(meta))
    with pytest.raises(FormatError, match="is shard 1 of 4 by its metadata, not 2 of 4"):
        ShardedStore(man).read(4)


# ------------------------------------------------------------------- the other documents
META_BAD = [({"item_names": [1, 2]}, "item_names[0]"), ({"conversion_id": 5}, "conversion_id"),
            ({"masks": "no"}, "masks"), ({"shard": {"index": "1", "count": 4,
                                                    "plan_digest": "x"}}, "shard.index"),
            ({"files": {"p.rec": {"bytes": "5", "sha256": "0" * 64}}}, "files['p.rec'].bytes"),
            ({"files": {"p.rec": {"bytes": 5}}}, "files['p.rec'].sha256")]


@pytest.mark.parametrize("change,field", META_BAD, ids=[f for _, f in META_BAD])
def test_mistyped_metadata_fields_are_format_errors_naming_the_field(src, tmp_path, capsys,
                                                                     change, field):
    rec = str(tmp_path / "p.rec")
    convert(src, rec, "imagefolder")
    meta = dict(read_meta(rec), **change)
    with open(meta_path(rec), "wb") as f:
        f.write(dumps_meta(meta))
    for fn in (read_meta, open_store):
        with pytest.raises(FormatError) as e:
            fn(rec)
        assert e.value.path == meta_path(rec) and field in str(e.value), str(e.value)
    for cmd in ("info", "stats", "verify"):
        rc, text = _cli(capsys, cmd, rec)
        assert rc == 1 and field in text and "Traceback" not in text, text


@pytest.mark.parametrize("doc,field", [([1], "must be a JSON object"),
                                       ({"digest": "x", "splits": {"train": {"done": "3"}},
                                         "skipped": []}, "splits['train'].done"),
                                       ({"digest": "x", "skipped": []}, "'splits'")])
def test_a_damaged_resume_checkpoint_is_a_conversion_error_naming_it(src, tmp_path, doc, field):
    out = str(tmp_path / "r.rec")
    with open(out + ".resume.json", "w") as f:
        json.dump(doc, f)
    with pytest.raises(ConversionError, match="resume checkpoint is unreadable") as e:
        convert(src, out, "imagefolder", resume=True)
    assert e.value.path == out + ".resume.json" and field in str(e.value)


def test_a_damaged_upload_journal_is_a_conversion_error_naming_it(src, tmp_path):
    from gluon_data.convert.upload import upload_dataset
    rec = str(tmp_path / "u.rec")
    convert(src, rec, "imagefolder")
    journal = str(tmp_path / "upload.json")
    for content, field in (("[]", "must be a JSON object"), ('{"s3://b/u.rec": 5}', "u.rec")):
        with open(journal, "w") as f:
            f.write(content)
        with pytest.raises(ConversionError, match="upload journal is unreadable.*without "
                           "resume") as e:  # before any request: no server is needed
            upload_dataset([rec], "s3://nowhere/x", resume=True, journal=journal, retries=0,
                           storage_options={"endpoint_url": "http://127.0.0.1:9"})
        assert e.value.path == journal and field in str(e.value)


# ------------------------------------------------------------------- in object storage
@pytest.fixture(scope="module")
def s3():
    pytest.importorskip("moto.server")
    from s3_server import s3_session  # framework-free (test_remote is Gluon's)
    with s3_session("manifest") as session:
        yield session


def test_a_remote_manifest_gets_the_same_checks(s3, sharded, tmp_path):
    from gluon_data.convert.upload import upload_dataset
    server, opts, fs, base = s3
    uri = upload_dataset([sharded[0]], base + "/up/", storage_options=opts)[sharded[0]]
    remote = dict(storage_options=opts, cache_dir=str(tmp_path / "cache"), retries=1,
                  backoff=0.05)
    store = open_store(uri, **remote)
    assert [store.read(i) for i in range(len(store))] == sharded[1]
    store.close()
    good = fs.cat(uri)
    for mutate, field in ((_dup, "shards[2].name"), (_swap, "shards[1].name"),
                          (lambda d: d["shards"][0].update(records="2"), "shards[0].records")):
        doc = json.loads(good)
        mutate(doc)
        fs.pipe(uri, dumps_meta(doc))
        with pytest.raises(FormatError) as e:
            open_store(uri, **remote)
        assert e.value.path == uri and field in str(e.value)
    fs.pipe(uri, good)


def test_a_damaged_upload_receipt_is_refused_naming_it(s3, src, sharded, tmp_path):
    """The one resume rule: a receipt that cannot be read is never taken as done nor
    silently redone; without resume (and with overwrite) the shard is uploaded again."""
    from gluon_data.convert.to_uri import convert_to_uri
    server, opts, fs, base = s3
    out = base + "/rc/c.rec"
    kw = dict(storage_options=opts, cache_dir=str(tmp_path / "cache"), shards=4)
    convert_to_uri(src, out, "imagefolder", **kw)
    receipt = out[:-len("c.rec")] + "c-00001-of-00004.upload.json"
    doc = json.loads(fs.cat(receipt))
    del doc["entry"]
    fs.pipe(receipt, dumps_meta(doc))
    with pytest.raises(ConversionError, match="upload receipt is unreadable") as e:
        convert_to_uri(src, out, "imagefolder", resume=True, task_retries=0, **kw)
    assert e.value.path == receipt and "'entry'" in str(e.value)
    server.log.clear()
    report = convert_to_uri(src, out, "imagefolder", overwrite=True, **kw)
    puts = sorted({e[1].rsplit("/", 1)[-1] for e in server.log if e[0] == "PUT"})
    assert "c-00001-of-00004.rec" in puts
    store = open_store(report.outputs["train"], storage_options=opts,
                       cache_dir=str(tmp_path / "rcache"))
    assert [store.read(i) for i in range(len(store))] == sharded[1]
    store.close()
    assert "entry" in json.loads(fs.cat(receipt))



# ---------------------------------------------------------------- nesting beyond the parser
DEEP = b"[" * 100000 + b"]" * 100000  # a RecursionError in json, never one out of a reader


@pytest.fixture(scope="module")
def deep_sources(tmp_path_factory):
    base = tmp_path_factory.mktemp("deep")
    src = make_imagefolder(str(base / "data"), per_class=1)
    return src, base


@pytest.mark.parametrize("kind", ["meta", "manifest"])
def test_a_document_nested_too_deeply_is_a_format_error_naming_the_file(deep_sources, kind,
                                                                        tmp_path):
    import gluon_data
    src, _ = deep_sources
    if kind == "meta":
        path = str(tmp_path / "c.rec")
        convert(src, path, "imagefolder")
        doc = meta_path(path)
    else:
        convert_sharded(src, str(tmp_path / "s" / "c.rec"), "imagefolder", shards=2)
        path = doc = str(tmp_path / "s" / "c.shards.json")
    with open(doc, "wb") as f:
        f.write(DEEP)
    result = gluon_data.verify(path)  # a report naming the file, not a traceback
    assert any(p["where"] == doc and "nested too deeply" in p["reason"]
               for p in result.problems), result.problems
    with pytest.raises(FormatError, match="nested too deeply") as e:
        gluon_data.stores.open_store(path)
    assert e.value.path == doc
