"""The one resume rule (gluon_data/convert/done.py), the one identity derivation
(gluon_data/format/plan.py) and staging under the one cache (Cache.staging).

Each of the four resume records -- the checkpoint, a shard's metadata, a shard's upload
receipt, the upload journal -- resumes after an interruption, reads the previous release's
document (no ``done`` field), and refuses a tampered one with a ConversionError naming it.
Real conversions, real files, moto's S3 server (tests/s3_server.py) where uploads are
involved."""
import fcntl
import hashlib
import json
import errno
import os
import pickle
import stat
import subprocess
import sys

import pytest

from gluon_data.convert import convert, resume
from gluon_data.stores import lmdb_writer
from gluon_data.stores.lmdb_writer import LMDBWriter
from gluon_data.convert.done import Done, is_done, read_records, why_not_done
from gluon_data.convert.sample import make_imagefolder
from gluon_data.convert.sharded import convert_sharded
from gluon_data.convert.sources import open_source
from gluon_data.errors import ConversionError
from gluon_data.format.meta import dumps_meta, meta_path
from gluon_data.stores.recordio import RecordFile
from gluon_data.format.plan import conversion_id, part_digest, plan_digest
from gluon_data.storage.cache import Cache
from gluon_data.stores.base import open_store


@pytest.fixture
def src(tmp_path):
    return make_imagefolder(str(tmp_path / "folder"), per_class=3)


def _rec_bytes(path):
    with open(path, "rb") as f:
        return f.read()


# ------------------------------------------------------------------------- the record
def test_is_done_needs_the_unit_the_digest_the_recorded_sizes_and_digests():
    sha = "ab" * 32
    r = Done("shard 1 of 4", "d1", {"a.rec": {"bytes": 10, "sha256": sha}})

    def now(facts):
        return lambda name, want: facts.get(name)

    assert is_done(r, "shard 1 of 4", "d1")
    assert is_done(r, "shard 1 of 4", "d1", now({"a.rec": {"bytes": 10, "sha256": sha}}))
    assert not is_done(r, "shard 2 of 4", "d1")
    assert not is_done(r, "shard 1 of 4", "d2")
    assert not is_done(r, "shard 1 of 4", "d1", now({"a.rec": {"bytes": 9, "sha256": sha}}))
    assert not is_done(r, "shard 1 of 4", "d1", now({}))  # gone
    # same size, other bytes: not done
    assert "other bytes" in why_not_done(r, "shard 1 of 4", "d1",
                                         now({"a.rec": {"bytes": 10, "sha256": "cd" * 32}}))
    # an ETag recorded at upload is a digest of the object's bytes too
    e = Done("u", "d", {"o": {"bytes": 3, "etag": "x1"}})
    assert is_done(e, "u", "d", now({"o": {"bytes": 3, "etag": "x1"}}))
    assert not is_done(e, "u", "d", now({"o": {"bytes": 3, "etag": "x2"}}))
    # a record without a digest (the previous release's) is not provably done
    old = Done("u", "d", {"o": {"bytes": 3}})
    assert "without a digest" in why_not_done(old, "u", "d", now({"o": {"bytes": 3}}))
    assert not is_done(None, "shard 1 of 4", "d1")


@pytest.mark.parametrize("done", [{"unit": "u", "digest": 5, "outputs": {}},
                                  {"unit": "u", "digest": "d"},
                                  {"unit": "u", "digest": "d", "outputs": {"x": {"bytes": -1}}}])
def test_an_invalid_record_is_a_conversion_error_naming_the_file(tmp_path, done):
    path = str(tmp_path / "r.json")
    with open(path, "w") as f:
        json.dump({"format": "gluon_data-done", "format_version": 1, "records": {"u": done}}, f)
    with pytest.raises(ConversionError, match="without resume") as e:
        read_records(path, lambda d: {}, "journal")
    assert e.value.path == path


# ------------------------------------------------------------------------- checkpoints
def test_a_ctrl_c_right_after_a_checkpoint_is_renamed_in_keeps_it(src, tmp_path, monkeypatch):
    """An interrupt can land after the checkpoint's rename and before the run notes that it
    saved one: the checkpoint on disk is kept with the partial files (the run says so), not
    removed as if none were taken, and ``--resume`` finishes the same bytes."""
    ref = str(tmp_path / "ref.rec")
    convert(src, ref, "imagefolder", workers=1)
    real, calls = resume.write_record, []

    def renamed_then_interrupted(*a, **k):
        real(*a, **k)
        calls.append(a[0])
        raise KeyboardInterrupt  # at the first checkpoint: the run has noted none saved
    monkeypatch.setattr(resume, "write_record", renamed_then_interrupted)
    out = str(tmp_path / "o.rec")
    with pytest.raises(KeyboardInterrupt):
        convert(src, out, "imagefolder", checkpoint_every=2, workers=1)
    assert calls == [out + ".resume.json"]
    assert os.path.exists(out + ".resume.json") and os.path.exists(out + ".partial")
    monkeypatch.setattr(resume, "write_record", real)
    convert(src, out, "imagefolder", resume=True, workers=1)
    assert _rec_bytes(out) == _rec_bytes(ref)


_REFUSED = """from gluon_data.convert import convert
from gluon_data.errors import OutputError
try:
    convert(%r, %r, "imagefolder", checkpoint_every=2, workers=1)
except OutputError as e:
    print("refused:", e)
"""


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes")
def test_a_fifo_where_the_checkpoint_goes_is_refused_without_waiting_on_it(src, tmp_path):
    """A FIFO of the user's at ``OUTPUT.resume.json`` is not ours to replace: the first
    checkpoint is refused naming it, and nothing opens it (opening a FIFO to read waits for
    a writer: the conversion would hang)."""
    out = str(tmp_path / "o.rec")
    os.mkfifo(out + ".resume.json")
    r = subprocess.run([sys.executable, "-c", _REFUSED % (src, out)], capture_output=True,
                       text=True, timeout=120)  # (a hang would end here, as a failure)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("refused:") and "o.rec.resume.json" in r.stdout, r.stdout
    assert stat.S_ISFIFO(os.lstat(out + ".resume.json").st_mode)  # left as it was


def test_a_ctrl_c_right_after_an_lmdb_checkpoint_commits_keeps_it(src, tmp_path, monkeypatch):
    """The same window in an LMDB, whose checkpoint commits with its records: an interrupt
    landing once the commit did keeps the partial environment (the commit says so), and
    ``resume`` finishes the same records; one landing before the commit keeps nothing."""
    ref = str(tmp_path / "ref.lmdb")
    convert(src, ref, "imagefolder", workers=1)
    real, calls = lmdb_writer._SplitWriter.checkpoint, []

    def committed_then_interrupted(self, progress):
        real(self, progress)
        calls.append(progress)
        raise KeyboardInterrupt  # at the first checkpoint: the run has noted none saved
    monkeypatch.setattr(lmdb_writer._SplitWriter, "checkpoint", committed_then_interrupted)
    out = str(tmp_path / "o.lmdb")
    with pytest.raises(KeyboardInterrupt):
        convert(src, out, "imagefolder", checkpoint_every=2, workers=1)
    assert len(calls) == 1 and LMDBWriter.read_progress(out) == calls[0]
    monkeypatch.setattr(lmdb_writer._SplitWriter, "checkpoint", real)
    convert(src, out, "imagefolder", resume=True, workers=1)
    assert _lmdb_records(out) == _lmdb_records(ref) and len(_lmdb_records(ref)) > 2

    def interrupted_before(self, progress):
        raise KeyboardInterrupt
    monkeypatch.setattr(lmdb_writer._SplitWriter, "checkpoint", interrupted_before)
    again = str(tmp_path / "again.lmdb")
    with pytest.raises(KeyboardInterrupt):
        convert(src, again, "imagefolder", checkpoint_every=2, workers=1)
    assert LMDBWriter.read_progress(again) is None
    assert not os.path.exists(again + LMDBWriter.PARTIAL)


def test_every_lmdb_checkpoint_is_flushed_to_disk_once_committed(src, tmp_path, monkeypatch):
    """The environment is written without a sync per commit: each checkpoint's commit is
    followed by a flush to disk, before the run counts on it."""
    events = []
    commit, flush = LMDBWriter._commit, LMDBWriter.flush_to_disk

    def committing(self, db, batch, progress=None):
        commit(self, db, batch, progress)
        events.append("checkpoint" if progress is not None else "records")

    def flushing(self):
        flush(self)
        events.append("flush")
    monkeypatch.setattr(LMDBWriter, "_commit", committing)
    monkeypatch.setattr(LMDBWriter, "flush_to_disk", flushing)
    convert(src, str(tmp_path / "o.lmdb"), "imagefolder", checkpoint_every=2, workers=1)
    taken = [k for k, e in enumerate(events) if e == "checkpoint"]
    assert len(taken) >= 2, events
    assert all(events[k + 1] == "flush" for k in taken), events


def test_an_lmdb_checkpoint_whose_flush_fails_is_not_counted(src, tmp_path, monkeypatch):
    """A checkpoint committed but not flushed to disk (the sync failed: EIO, a full disk) is
    no checkpoint to resume from: the first one failing keeps nothing, as a RecordIO one whose
    fsync fails."""
    def failing(self):
        raise OSError(errno.EIO, "Input/output error")
    monkeypatch.setattr(LMDBWriter, "flush_to_disk", failing)
    out = str(tmp_path / "o.lmdb")
    with pytest.raises(ConversionError, match="writing failed: Input/output error"):
        convert(src, out, "imagefolder", checkpoint_every=2, workers=1)
    assert not os.path.exists(out + LMDBWriter.PARTIAL) and not os.path.exists(out)


def _lmdb_records(path):
    store = open_store(path)
    return [bytes(store.read(i)) for i in range(len(store))]


def _interrupted(src, out):
    """A conversion that failed on a corrupt image after its first checkpoints; returns
    the image's good bytes and path (to fix it)."""
    bad = os.path.join(src, "fish", sorted(os.listdir(os.path.join(src, "fish")))[1])
    with open(bad, "rb") as f:
        good = f.read()
    with open(bad, "wb") as f:
        f.write(good[:len(good) // 2])
    with pytest.raises(ConversionError):
        convert(src, out, "imagefolder", checkpoint_every=2, workers=1)
    assert os.path.exists(out + ".resume.json")
    return bad, good


@pytest.mark.parametrize("previous_release", [False, True])
def test_a_checkpoint_resumes_and_one_of_the_previous_release_too(src, tmp_path,
                                                                   previous_release):
    ref = str(tmp_path / "ref.rec")
    convert(src, ref, "imagefolder", workers=1)
    out = str(tmp_path / "o.rec")
    bad, good = _interrupted(src, out)
    with open(out + ".resume.json") as f:
        doc = json.load(f)
    assert doc["done"]["unit"] == "conversion to o.rec" and doc["done"]["digest"] == doc["digest"]
    assert doc["splits"]["train"]["done"] > 0
    if previous_release:  # what the previous release wrote: no done record
        del doc["done"]
        with open(out + ".resume.json", "w") as f:
            json.dump(doc, f)
    with open(bad, "wb") as f:
        f.write(good)
    kept = doc["splits"]["train"]["writer"][2]  # the records the checkpoint covers
    report = convert(src, out, "imagefolder", resume=True, workers=1)
    assert _rec_bytes(out) == _rec_bytes(ref) and not os.path.exists(out + ".resume.json")
    # the summary tells the records of the interrupted run from this one's (its rate too)
    assert kept > 0 and report.resumed == {"train": kept}
    assert report.written["train"] == len(RecordFile(ref))
    assert "(%d of them before the interruption, kept by --resume)" % kept in str(report)
    assert "%d written (%d in this run), 0 skipped" % (
        report.written["train"], report.written["train"] - kept) in str(report)
    assert " MB in all in " in str(report)  # the output's bytes; the rate is this run's
    again = convert(src, out, "imagefolder", resume=True, workers=1)  # complete: kept whole
    assert again.written == again.resumed == report.written
    assert "(complete already, kept by --resume)" in str(again)
    assert str(again).splitlines()[-1] == ("nothing left to convert: %d records complete "
                                           "already, 0 skipped" % report.written["train"])


def test_a_tampered_checkpoint_is_refused_naming_it(src, tmp_path):
    out = str(tmp_path / "o.rec")
    bad, good = _interrupted(src, out)
    with open(out + ".resume.json") as f:
        doc = json.load(f)
    doc["done"]["outputs"] = {"o.rec.partial": {"bytes": "many"}}
    with open(out + ".resume.json", "w") as f:
        json.dump(doc, f)
    with open(bad, "wb") as f:
        f.write(good)
    with pytest.raises(ConversionError, match="resume checkpoint is unreadable") as e:
        convert(src, out, "imagefolder", resume=True, workers=1)
    assert e.value.path == out + ".resume.json" and "outputs" in str(e.value)
    assert os.path.exists(out + ".resume.json")  # left as it was
    doc["done"]["outputs"] = {}  # valid, but of another plan: never resumed
    doc["done"]["digest"] = doc["digest"] = "another plan"
    doc.pop("names")
    with open(out + ".resume.json", "w") as f:
        json.dump(doc, f)
    with pytest.raises(ConversionError, match="other inputs or options"):
        convert(src, out, "imagefolder", resume=True, workers=1)


# ------------------------------------------------------------------------- shards
def _shard_meta(out, k, n=3):
    return meta_path(out[:-4] + "-%05d-of-%05d.rec" % (k, n))


def test_a_shard_rerun_keeps_finished_shards_by_their_record(src, tmp_path):
    out = str(tmp_path / "s.rec")
    first = convert_sharded(src, out, "imagefolder", shards=3)
    assert not any(e["reused"] for e in first.shards)
    with open(_shard_meta(out, 1)) as f:
        meta = json.load(f)
    rec = out[:-4] + "-00001-of-00003.rec"
    idx = rec[:-4] + ".idx"
    assert meta["shard"]["done"] == {
        "unit": "shard 1 of 3", "digest": meta["shard"]["plan_digest"],
        "outputs": {p[-4:]: {"bytes": os.path.getsize(p), "sha256": _sha256(p)}
                    for p in (rec, idx)}}
    # an interrupted shard: its files gone; the rerun writes it alone
    os.remove(out[:-4] + "-00002-of-00003.rec")
    again = convert_sharded(src, out, "imagefolder", shards=3)
    assert [e["reused"] for e in again.shards] == [True, True, False]
    assert [s.read(i) for s in [open_store(again.outputs["train"])] for i in range(9)] == \
        [s.read(i) for s in [open_store(first.outputs["train"])] for i in range(9)]
    # the previous release's metadata (no done record, no digests): not provably
    # complete, so it is redone
    del meta["shard"]["done"]
    with open(_shard_meta(out, 1), "wb") as f:
        f.write(dumps_meta(meta))
    third = convert_sharded(src, out, "imagefolder", shards=3)
    assert [e["reused"] for e in third.shards] == [True, False, True]


def _sha256(path):
    import hashlib
    return hashlib.sha256(_rec_bytes(path)).hexdigest()


def test_a_shard_of_another_size_than_recorded_is_rewritten(src, tmp_path):
    out = str(tmp_path / "s.rec")
    convert_sharded(src, out, "imagefolder", shards=3)
    rec = out[:-4] + "-00000-of-00003.rec"
    good = _rec_bytes(rec)
    with open(rec, "ab") as f:
        f.write(b"\0" * 8)  # not what the record says was written
    again = convert_sharded(src, out, "imagefolder", shards=3)
    assert [e["reused"] for e in again.shards] == [False, True, True]
    assert _rec_bytes(rec) == good


def test_a_tampered_shard_record_is_refused_naming_the_shard(src, tmp_path):
    out = str(tmp_path / "s.rec")
    convert_sharded(src, out, "imagefolder", shards=3)
    with open(_shard_meta(out, 0)) as f:
        meta = json.load(f)
    meta["shard"]["done"]["unit"] = 7
    with open(_shard_meta(out, 0), "wb") as f:
        f.write(dumps_meta(meta))
    with pytest.raises(ConversionError, match="shard metadata's done record is unreadable") \
            as e:
        convert_sharded(src, out, "imagefolder", shards=3, task_retries=0)
    assert e.value.path == out[:-4] + "-00000-of-00003.rec" and "unit" in str(e.value)


# ------------------------------------------------------------------------- identity
def test_local_and_sharded_paths_derive_identity_the_same_way(src, tmp_path):
    """Each shard's record carries the part digest the plan derives; each conversion id,
    local or per shard, is conversion_id over the names-only digest of its plan or part."""
    out = str(tmp_path / "s.rec")
    rep = convert_sharded(src, out, "imagefolder", shards=3)
    manifest = json.load(open(rep.outputs["train"]))
    for k in range(3):
        meta = json.load(open(_shard_meta(out, k)))
        part = part_digest({"plan": manifest["plan"]["names"]}, k)
        rec = out[:-4] + "-%05d-of-00003.rec" % k
        st = meta["shard"]["stats"]
        assert meta["conversion_id"] == conversion_id(part, "train", meta["num_records"],
                                                      os.path.getsize(rec), st)
    assert part_digest({"plan": "p"}, 2) == plan_digest({"plan": "p", "shard": 2})
    one = str(tmp_path / "one.rec")
    r1 = convert(src, one, "imagefolder", workers=1)
    again = str(tmp_path / "two.rec")
    r2 = convert(os.path.relpath(src), again, "imagefolder", workers=1)
    ids = [open_store(r.outputs["train"]).meta["conversion_id"] for r in (r1, r2)]
    assert ids[0] == ids[1]  # the same plan, spelled relative: the same identity


# ------------------------------------------------------------------------- staging
def test_staging_counts_toward_the_limit_and_is_not_evicted_while_in_use(tmp_path):
    cache_dir = str(tmp_path / "cache")
    cache = Cache(cache_dir, cache_limit=1000)
    other = cache.entry("objects", "a" * 24)  # a download not in use: evictable
    with open(os.path.join(other, "x"), "wb") as f:
        f.write(b"o" * 400)
    with cache.staging("out1", fresh=True) as area:
        os.makedirs(os.path.join(area.path, "o.lmdb.partial"))
        with open(os.path.join(area.path, "o.lmdb.partial", "data.mdb"), "wb") as f:
            f.write(b"s" * 900)
        assert cache.usage() == 1300 and area.usage() == 900  # counted, nested files too
        area.claim()  # over the limit: the entry not in use goes, the staging stays
        assert not os.path.exists(other) and os.path.isdir(area.path)
        # another process making room cannot evict it while it is pinned
        with cache.room_lock():
            Cache(cache_dir, cache_limit=10).make_room(0, keep="", what="test")
        assert area.usage() == 900
        assert oct(os.stat(area.path).st_mode & 0o777) == "0o700"
    # released (kept for a resume): an entry like any other, evicted when room is needed
    assert os.path.isdir(area.path)
    with cache.room_lock():
        Cache(cache_dir, cache_limit=10).make_room(0, keep="", what="test")
    assert not os.path.exists(area.path)
    with cache.lock("staging-out1", "pin", fcntl.LOCK_EX, blocking=False):
        pass  # the pin was released


def test_staging_refuses_a_folder_others_can_write(tmp_path):
    from gluon_data.errors import CacheError
    cache = Cache(str(tmp_path / "cache"))
    cache.ready()
    os.makedirs(os.path.join(cache.cache_dir, "staging", "k"))
    os.chmod(os.path.join(cache.cache_dir, "staging", "k"), 0o777)
    with pytest.raises(CacheError, match="writable by group or others"):
        cache.staging("k")
    with pytest.raises(ValueError):
        cache.staging("../x")


@pytest.fixture(scope="module")
def s3():
    pytest.importorskip("moto.server")
    from s3_server import s3_session  # framework-free (test_remote is Gluon's)
    with s3_session("done") as session:
        yield session


def _staging(cache):
    top = os.path.join(cache, "staging")
    return sorted(os.listdir(top)) if os.path.isdir(top) else []


@pytest.mark.parametrize("previous_release", [False, True])
def test_upload_journal_kept_in_staging_resumes(s3, src, tmp_path, previous_release):
    from gluon_data.convert.to_uri import convert_to_uri
    server, opts, fs, base = s3
    uri = base + "/j%d/c.rec" % previous_release
    cache = str(tmp_path / "cache")
    server.kill_on_put = "j%d/c.idx" % previous_release  # dies as the .idx goes up
    with pytest.raises(Exception):
        convert_to_uri(src, uri, "imagefolder", storage_options=opts, cache_dir=cache,
                       remote_retries=0, workers=1)
    server.start()
    (key,) = _staging(cache)  # kept for resume: the staged dataset and the journal
    journal = os.path.join(cache, "staging", key, "upload.json")
    doc = json.load(open(journal))
    assert doc["format"] == "gluon_data-done"
    (rec,) = doc["records"].values()
    assert rec["unit"].endswith("c.rec") and rec["outputs"][rec["unit"]]["sha256"] == \
        rec["digest"]
    if previous_release:  # the previous release's journal: {uri: SHA-256}
        with open(journal, "w") as f:
            json.dump({r["unit"]: r["digest"] for r in doc["records"].values()}, f)
    server.log.clear()
    report = convert_to_uri(src, uri, "imagefolder", storage_options=opts, cache_dir=cache,
                            resume=True, workers=1)
    puts = [e[1] for e in server.log if e[0] == "PUT"]
    assert not [p for p in puts if p.endswith("/c.rec")]  # the journal knew it was up
    assert [p for p in puts if p.endswith("/c.idx")]
    assert _staging(cache) == []  # cleaned once uploaded
    store = open_store(report.outputs["train"], storage_options=opts,
                       cache_dir=str(tmp_path / "read"))
    assert len(store) == 9
    store.close()


def test_receipts_of_the_previous_release_resume(s3, src, tmp_path):
    from gluon_data.convert.to_uri import convert_to_uri
    server, opts, fs, base = s3
    out = base + "/rcp/c.rec"
    kw = dict(storage_options=opts, cache_dir=str(tmp_path / "cache"), shards=3)
    convert_to_uri(src, out, "imagefolder", **kw)
    for k in range(3):
        receipt = base + "/rcp/c-%05d-of-00003.upload.json" % k
        doc = json.loads(fs.cat(receipt))
        assert doc["done"]["unit"] == "shard %d of 3" % k
        assert doc["done"]["digest"] == doc["shard"]["plan_digest"]
        assert {n: {k: f[k] for k in ("bytes", "sha256")}
                for n, f in doc["done"]["outputs"].items()} == doc["files"]
        assert all("etag" in f for f in doc["done"]["outputs"].values())
        if k == 0:
            del doc["done"]  # what the previous release wrote
            fs.pipe(receipt, dumps_meta(doc))
    fs.rm(base + "/rcp/c-00002-of-00003.rec")  # as if shard 2 had not gone up whole
    server.log.clear()
    convert_to_uri(src, out, "imagefolder", resume=True, **kw)
    puts = sorted({e[1].rsplit("/", 1)[-1] for e in server.log if e[0] == "PUT"})
    assert "c-00000-of-00003.rec" not in puts and "c-00001-of-00003.rec" not in puts
    assert "c-00002-of-00003.rec" in puts and "c.shards.json" in puts
    assert _staging(kw["cache_dir"]) == ["shards"]
    assert not any(files for _, _, files in os.walk(os.path.join(kw["cache_dir"], "staging")))


def test_a_tampered_receipt_record_is_refused_naming_it(s3, src, tmp_path):
    from gluon_data.convert.to_uri import convert_to_uri
    server, opts, fs, base = s3
    out = base + "/rct/c.rec"
    kw = dict(storage_options=opts, cache_dir=str(tmp_path / "cache"), shards=3)
    convert_to_uri(src, out, "imagefolder", **kw)
    receipt = base + "/rct/c-00001-of-00003.upload.json"
    doc = json.loads(fs.cat(receipt))
    doc["done"]["digest"] = None
    fs.pipe(receipt, dumps_meta(doc))
    with pytest.raises(ConversionError, match="upload receipt is unreadable") as e:
        convert_to_uri(src, out, "imagefolder", resume=True, task_retries=0, **kw)
    assert e.value.path == receipt and "digest" in str(e.value)


def test_a_plans_prefix_digest_grows_with_its_checkpoints_and_equals_the_whole_hash(tmp_path):
    """A checkpoint binds the digest of the items written so far: hashed as the conversion
    goes, it equals the hash of the whole prefix document, whatever order it is asked in, and
    after the digest is pickled."""
    src = make_imagefolder(str(tmp_path / "src"), classes=("a", "b"), per_class=6)
    s = open_source(src, "imagefolder")
    d = plan_digest({"source": "x"}, s.splits, s.root)

    def whole(n):
        items = [[e, [st for _, st in pairs]] for e, pairs in d.stamped["train"][:n]]
        return hashlib.sha256(json.dumps({"names": d.names, "items": items}, sort_keys=True,
                                         default=str).encode()).hexdigest()

    seen = {d.prefix("train", n) for n in range(13)}
    assert len(seen) == 13  # each item moves it
    for n in (0, 3, 12, 5, 40, 12, 1, -2):
        assert d.prefix("train", n) == whole(n), n
    again = pickle.loads(pickle.dumps(d))
    assert again == d and again.prefix("train", 7) == whole(7)
    assert d.prefix("test", 2) == hashlib.sha256(json.dumps(
        {"names": d.names, "items": []}, sort_keys=True).encode()).hexdigest()
