"""An open LMDB dataset stays bound to the data.mdb it was opened on (the RecordIO rule).

Republishing the path (``convert --overwrite``, another LMDBWriter) or rewriting the file in
place between opening a dataset and reading it must never hand the reader the new records
under the old length, metadata and identity, nor a mix of old and new: the first read in a
process (this one, a forked or spawned worker) checks the environment and the page reader's
descriptor against the stamp taken when the dataset was opened and raises FormatError
("replaced"); once opened, both keep reading the file they were opened on, as a RecordFile's
descriptor does, and every later read checks that file is still as it was (size, mtime,
ctime): rewritten in place after reads began, even at the same size with its mtime set back,
it is refused too.
"""
import multiprocessing as mp
import os
import pickle
import shutil
import subprocess
import sys

import lmdb
import pytest

from gluon_data import SegmentationLMDBDataset
from gluon_data import convert
from gluon_data.stores import lmdb_pages
from gluon_data.errors import FormatError
from gluon_data.stores.lmdbio import LMDBFile, LMDBWriter, _read_all_meta, shared_env
from gluon_data.stores.recordio import RecordFile
from gluon_data.convert.sample import make_voc

SPLIT = "trainval"


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """Two tiny VOC sources of the same size whose records differ, each with values stored
    inline in LMDB's leaf pages and values in overflow pages (the page reader's case)."""
    base = tmp_path_factory.mktemp("identity")
    return [make_voc(str(base / name / "VOC2012"), num_images=6, size_range=(20, 160),
                     val_fraction=0.0, seed=seed, quality=95)
            for name, seed in (("A", 1), ("B", 2))]


@pytest.fixture(params=["pages", "no-pages"])
def pages(request, monkeypatch):
    """With the page reader (direct reads of overflow values) and with it switched off."""
    if request.param == "no-pages":
        monkeypatch.setenv(lmdb_pages.PAGES_ENV, "0")
    return request.param == "pages"


def _publish(src, out, overwrite=False):
    convert(src, out, "voc", split=SPLIT, overwrite=overwrite)


def _payloads(path):
    """Every payload of ``path`` as a fresh reader sees it."""
    f = LMDBFile(path, SPLIT)
    return [f.read(i) for i in range(len(f))]


def _outcomes(f, old, new):
    """What each read of ``f`` gives: 'old', 'new', 'other' or the exception's type name."""
    out = []
    for i in range(len(f)):
        try:
            v = f.read(i)
        except FormatError as e:
            assert "replaced" in str(e) and e.path == f.path, e
            out.append("FormatError")
            continue
        out.append("old" if v == old[i] else "new" if v == new[i] else "other")
    return out


def _small_and_big(f):
    """A record stored inline in its leaf page and one in overflow pages (by the page
    reader, without binding ``f``'s handles: a throwaway reader of the same path)."""
    probe = LMDBFile(f.path, SPLIT, pages=True)
    assert probe.pages_refused is None
    inline = [i for i in range(len(probe)) if probe._pages.view(i) is None]
    overflow = [i for i in range(len(probe)) if i not in inline]
    assert inline and overflow, "the fixture needs both kinds of values"
    return inline[0], overflow[0]


@pytest.fixture
def swap(sources, tmp_path):
    """``(path, old payloads, republish)``: a published dataset of source A and a function
    publishing source B under the same path (``convert(..., overwrite=True)``) that returns
    B's payloads."""
    out = str(tmp_path / "d.lmdb")
    _publish(sources[0], out)
    old = _payloads(out)

    def republish():
        _publish(sources[1], out, overwrite=True)
        new = _payloads(out)
        assert len(new) == len(old) and all(a != b for a, b in zip(old, new))
        return new
    return out, old, republish


# ------------------------------------------------------------------ (1) open, republish, read
def test_republished_path_is_refused_not_read(swap, pages):
    path, old, republish = swap
    f = LMDBFile(path, SPLIT)
    assert (f.pages_refused is None) == pages
    meta, ident = dict(f.meta), f.identity()
    new = republish()
    assert _outcomes(f, old, new) == ["FormatError"] * len(old)
    with pytest.raises(FormatError, match="replaced"):
        list(f.scan())
    if pages:  # (without the page reader there is nothing to hint)
        with pytest.raises(FormatError, match="replaced"):
            f.will_need([0, 1])
    assert f.meta == meta and f.identity() == ident and len(f) == len(old)
    assert _payloads(path) == new  # opened again: the new dataset


def test_republished_path_refused_by_the_dataset(swap, pages):
    path, old, republish = swap
    ds = SegmentationLMDBDataset(path, SPLIT)
    republish()
    with pytest.raises(FormatError, match="replaced") as e:
        ds[0]
    assert e.value.path == path
    assert len(SegmentationLMDBDataset(path, SPLIT)) == len(old)


def test_after_close_the_reader_is_checked_again(swap, pages):
    path, old, republish = swap
    f = LMDBFile(path, SPLIT)
    assert f.read(0) == old[0]
    f.close()
    new = republish()
    assert _outcomes(f, old, new) == ["FormatError"] * len(old)


# --------------------------------------------- (2) one small record read before the swap
def test_a_record_read_before_the_swap_never_mixes_in_new_ones(swap, pages):
    """The RecordIO rule: the handles opened by the first read (environment and page reader
    descriptor, together) stay on the file they were opened on, so every later read is the
    old record (or refused), never the new dataset's, as a RecordFile's are."""
    path, old, republish = swap
    f = LMDBFile(path, SPLIT)
    small, big = _small_and_big(f)
    assert f.read(small) == old[small]  # an inline value: no overflow page read yet
    new = republish()
    got = _outcomes(f, old, new)
    assert "new" not in got and "other" not in got, got
    assert set(got) <= {"old", "FormatError"}
    assert got[big] == got[small] == "old"  # bound to the old file: one dataset throughout
    assert [bytes(v) for v in f.scan()] == old


def test_recordio_and_lmdb_agree_on_both_sequences(sources, tmp_path):
    """One rule for both containers: open-republish-read is refused; open-read-republish-read
    reads the file opened, every record of it."""
    for ext in (".rec", ".lmdb"):
        out = str(tmp_path / ("d" + ext))

        def opened():
            return RecordFile(out) if ext == ".rec" else LMDBFile(out, SPLIT)

        def payloads():
            f = opened()
            return [f.read(i) for i in range(len(f))]
        for read_first, want in ((False, "FormatError"), (True, "old")):
            _publish(sources[0], out, overwrite=True)
            old = payloads()
            f = opened()
            if read_first:
                f.read(len(f) - 1)
            _publish(sources[1], out, overwrite=True)
            assert _outcomes(f, old, payloads()) == [want] * len(old), (ext, read_first)


# ------------------------------------------------------------------ (3) rewrites in place
def test_another_writer_publishing_the_path_is_refused(swap, sources, tmp_path, pages):
    """LMDBWriter itself (not convert) publishing another dataset under the same path."""
    path, old, _ = swap
    other = str(tmp_path / "other.lmdb")
    _publish(sources[1], other)
    new = _payloads(other)
    meta = dict(LMDBFile(other, SPLIT).meta)
    f = LMDBFile(path, SPLIT)
    w = LMDBWriter(path, overwrite=True)
    s = w.split(SPLIT)
    for i, p in enumerate(new):
        s.write(i, p)
    s.finish(meta)
    s.publish()
    assert _outcomes(f, old, new) == ["FormatError"] * len(old)


def _rewrite_in_place(path, payloads):
    """Every record of the split replaced in the same data.mdb (same inode), by another
    process (LMDB opens an environment once per process)."""
    code = ("import lmdb, pickle, sys\n"
            "values = pickle.loads(sys.stdin.buffer.read())\n"
            "env = lmdb.open(%r, max_dbs=64, subdir=True, map_size=64 << 20)\n"
            "db = env.open_db(%r, create=False)\n"
            "with env.begin(write=True, db=db) as txn:\n"
            "    for i, v in enumerate(values):\n"
            "        txn.put(b'%%010d' %% i, v)\n"
            "env.close()\n" % (path, SPLIT.encode()))
    subprocess.run([sys.executable, "-c", code], input=pickle.dumps(payloads), check=True,
                   timeout=60)


def test_rewritten_in_place_is_refused(swap, sources, tmp_path, pages):
    path, old, _ = swap
    other = str(tmp_path / "other.lmdb")
    _publish(sources[1], other)
    new = _payloads(other)
    f = LMDBFile(path, SPLIT)
    ino = os.stat(os.path.join(path, "data.mdb")).st_ino
    _rewrite_in_place(path, new)
    assert os.stat(os.path.join(path, "data.mdb")).st_ino == ino
    assert _outcomes(f, old, new) == ["FormatError"] * len(old)
    assert _payloads(path) == new  # opened again: the records written in place


@pytest.mark.parametrize("mtime_set_back", [False, True])
def test_a_same_size_rewrite_in_place_after_reads_began_is_refused(swap, pages,
                                                                   mtime_set_back):
    """A reader that has read already (its handles bound) checks the file at every read:
    the same data.mdb (inode, size) rewritten in place, its mtime even set back (the ctime
    cannot be), is refused, never read as the new records under the old metadata."""
    path, old, _ = swap
    f = LMDBFile(path, SPLIT)
    small, big = _small_and_big(f)
    assert f.read(small) == old[small] and f.read(big) == old[big]
    data = os.path.join(path, "data.mdb")
    before = os.stat(data)
    with open(data, "rb") as fh:
        raw = bytearray(fh.read())
    for p in old:  # every value's bytes reversed where they lie: same size, same pages
        at = raw.find(p)
        assert at >= 0
        raw[at:at + len(p)] = p[::-1]
    new = [p[::-1] for p in old]
    with open(data, "r+b") as fh:  # in place: the same inode
        fh.write(raw)
    if mtime_set_back:
        os.utime(data, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = os.stat(data)
    assert (after.st_ino, after.st_size) == (before.st_ino, before.st_size)
    assert (after.st_mtime_ns == before.st_mtime_ns) == mtime_set_back
    assert _outcomes(f, old, new) == ["FormatError"] * len(old)
    with pytest.raises(FormatError, match="replaced"):
        list(f.scan())


def test_a_commit_to_the_split_after_reads_began_is_refused(swap, sources, tmp_path, pages):
    """Another process rewriting the split's records through LMDB (same inode) after the
    reader has read: refused at the next read, never the new records under the old metadata
    (a commit to another sub-database is not: tests/test_lmdb.py's map grown by another
    process)."""
    path, old, _ = swap
    other = str(tmp_path / "other.lmdb")
    _publish(sources[1], other)
    new = _payloads(other)
    f = LMDBFile(path, SPLIT)
    small, big = _small_and_big(f)
    assert f.read(small) == old[small] and f.read(big) == old[big]
    _rewrite_in_place(path, new)
    assert _outcomes(f, old, new) == ["FormatError"] * len(old)


def test_a_file_renamed_away_after_reads_began_is_still_read(swap, pages):
    """Renaming or unlinking data.mdb changes its ctime, not its records: a reader that has
    read keeps reading the file it opened."""
    path, old, _ = swap
    f = LMDBFile(path, SPLIT)
    assert f.read(0) == old[0]
    moved = path + ".old"
    os.rename(path, moved)
    assert [f.read(i) for i in range(len(f))] == old
    shutil.rmtree(moved)
    assert [f.read(i) for i in range(len(f))] == old


# ------------------------------------------------------------------ workers
def _read_in_child(f, queue):
    try:
        queue.put(("read", [f.read(i) for i in range(len(f))]))
    except Exception as e:  # noqa: BLE001  (reported to the parent)
        queue.put((type(e).__name__, str(e)))


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_worker_given_the_dataset_refuses_a_republished_path(swap, method):
    """A DataLoader-style worker: forked with the parent's reader (already reading the old
    file in the parent) or spawned with it pickled; either opens its own handles, checks
    them and refuses, while the parent keeps reading the file it opened."""
    if method not in mp.get_all_start_methods():
        pytest.skip("no %s here" % method)
    path, old, republish = swap
    f = LMDBFile(path, SPLIT)
    assert f.read(0) == old[0]
    republish()
    ctx = mp.get_context(method)
    queue = ctx.Queue()
    p = ctx.Process(target=_read_in_child, args=(f, queue))
    p.start()
    try:
        kind, what = queue.get(timeout=120)
    finally:
        p.join(60)
    assert kind == "FormatError" and "replaced" in what, (kind, what)
    assert [f.read(i) for i in range(len(f))] == old


# ------------------------------------------------------------------ the environment cache
def test_env_cache_never_hands_out_another_files_env(swap, sources, tmp_path, monkeypatch):
    """A republish while an environment is being opened: the cache keys it by the file it
    maps, so the path naming the first file again gets that file's environment."""
    path, old, _ = swap
    other = str(tmp_path / "other.lmdb")
    _publish(sources[1], other)
    shutil.copytree(other, other + ".copy")  # B read from a copy: B itself is not open here
    cid = {name: LMDBFile(p, SPLIT).meta["conversion_id"] for name, p in (("A", path),
                                                                           ("B", other + ".copy"))}
    fresh = str(tmp_path / "fresh.lmdb")  # a file this process has no environment of yet
    shutil.copytree(path, fresh)
    aside = fresh + ".aside"
    real_open, swapped = lmdb.open, []

    def open_during_a_republish(*args, **kwargs):
        if not swapped:  # the path is made to name the other dataset just before LMDB maps
            swapped.append(1)
            os.rename(fresh, aside)
            os.rename(other, fresh)
        return real_open(*args, **kwargs)
    monkeypatch.setattr(lmdb, "open", open_during_a_republish)
    env = shared_env(fresh)
    monkeypatch.setattr(lmdb, "open", real_open)
    assert swapped
    assert _read_all_meta(env, fresh)[SPLIT]["conversion_id"] == cid["B"]  # what it names
    os.rename(fresh, other)  # and back: the path names the first dataset again
    os.rename(aside, fresh)
    env = shared_env(fresh)
    assert _read_all_meta(env, fresh)[SPLIT]["conversion_id"] == cid["A"]
    assert _payloads(fresh) == old


def test_a_legacy_store_is_bound_as_an_lmdb_file_is(tmp_path):
    """The recipe layout's reader: a rewrite of its records in place after it has read is
    refused at the next read, as for our own LMDBs (one binding, ProcessEnv's)."""
    from legacy_lmdbs import make_recipe_lmdb
    from gluon_data.stores.legacy import RecipeLMDBStore
    src = str(tmp_path / "recipe")
    make_recipe_lmdb(src)
    store = RecipeLMDBStore(src, "train", image_shape=(24, 32, 3))
    first = store.read(0)
    assert pickle.loads(pickle.dumps(store)).read(0) == first
    code = ("import lmdb\n"
            "env = lmdb.open(%r, max_dbs=64, map_size=64 << 20)\n"
            "db = env.open_db(b'train_data', create=False)\n"
            "with env.begin(write=True, db=db) as txn:\n"
            "    txn.put(b'0', bytes(len(txn.get(b'0'))))\n"
            "env.close()\n" % src)
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    with pytest.raises(FormatError, match="replaced") as e:
        store.read(0)
    assert e.value.path == src
    assert RecipeLMDBStore(src, "train", image_shape=(24, 32, 3)).read(0) != first


def test_a_legacy_layouts_samples_are_never_copied_to_bind_it(tmp_path):
    """A Caffe LMDB keeps its samples in the main database: binding a reader to the file
    snapshots the main database's records only where they are sub-databases (a few), so
    opening one copies none of the dataset (here 200 x 64 KiB) into every process."""
    import tracemalloc
    import lmdb
    from gluon_data.stores.lmdb_env import ProcessEnv, env_stamp, shared_env
    path = str(tmp_path / "caffe")
    env = lmdb.open(path, map_size=64 << 20)
    with env.begin(write=True) as txn:
        for i in range(200):
            txn.put(b"%08d_x.jpg" % i, bytes([i % 251]) * (64 << 10))
    env.close()
    handle = ProcessEnv(path, env_stamp(shared_env(path)))
    tracemalloc.start()
    try:
        got, _ = handle.get()
        with got.begin() as txn:
            assert txn.get(b"00000007_x.jpg")[:1] == bytes([7])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < (2 << 20), peak  # the samples are 12.5 MiB
