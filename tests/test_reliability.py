"""Fault and bad-input suite: each case states the behaviour it expects and checks it."""
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time

import mxnet as mx
import numpy as np
import pytest

from gluon_data import DataLoader, RecordFile, RecordWriter, SegmentationLMDBDataset, SegmentationRecordDataset
from gluon_data.format import codec
from gluon_data import convert
from gluon_data.tools import salvage, verify
from gluon_data.errors import ConversionError, FormatError, GluonDataError
from gluon_data.gluon.batchify import StackBatchify
from gluon_data.gluon.loader import WorkerDiedError
from gluon_data.convert.sample import make_voc

pytestmark = pytest.mark.reliability
STRESS = os.environ.get("GLUON_DATA_STRESS") == "1"


def files(path):
    return {ext: open(path[:-4] + ext, "rb").read() for ext in (".rec", ".idx", ".meta.json")}


def copy_rec(src, dst):
    for ext in (".rec", ".idx", ".meta.json"):
        shutil.copy(src[:-4] + ext, dst[:-4] + ext)
    return dst


# ---------------------------------------------------------------- resumable conversion
@pytest.fixture(scope="module")
def big_voc(tmp_path_factory):
    return make_voc(str(tmp_path_factory.mktemp("bigvoc") / "VOC2012"), num_images=160,
                    size_range=(60, 120), seed=9)


@pytest.mark.stress
def test_sigkill_at_random_moments_then_resume_is_byte_identical(big_voc, tmp_path):
    """Expected: every resumed run continues from its last checkpoint; 0 records lost; every
    completed conversion equals an uninterrupted one byte for byte (.rec, .idx, metadata).
    20 kills with GLUON_DATA_STRESS=1, 8 in the default run."""
    wanted = 20 if STRESS else 8
    ref = str(tmp_path / "ref" / "out.rec")
    convert(big_voc, ref, "voc", split="train,val", shuffle=True, seed=1, encoding="png")
    out = str(tmp_path / "out.rec")
    cmd = [sys.executable, "-m", "gluon_data", "convert", big_voc, out, "--layout", "voc",
           "--split", "train,val", "--shuffle", "--seed", "1", "--encoding", "png",
           "--workers", "1", "--quiet", "--resume"]
    env = dict(os.environ, GLUON_DATA_CHECKPOINT_EVERY="4")
    t0 = time.monotonic()
    subprocess.run(cmd[:5] + [str(tmp_path / "calib.rec")] + cmd[6:], check=True, env=env,
                   stdout=subprocess.DEVNULL)
    full = time.monotonic() - t0
    rng = random.Random(0)
    kills = completed = 0
    while kills < wanted:
        p = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        time.sleep(rng.uniform(0.0, full))
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)
            p.wait()
            kills += 1
            continue
        assert p.returncode == 0, p.stderr.read().decode()[-2000:]
        completed += 1
        for split in ("train", "val"):
            a = files(ref[:-4] + "_%s.rec" % split)
            b = files(out[:-4] + "_%s.rec" % split)
            assert a[".rec"] == b[".rec"] and a[".idx"] == b[".idx"], (kills, split)
            ma, mb = json.loads(a[".meta.json"]), json.loads(b[".meta.json"])
            assert ma == mb
            for ext in (".rec", ".idx", ".meta.json"):  # start a new conversion
                os.remove(out[:-4] + "_%s%s" % (split, ext))
        assert not [f for f in os.listdir(tmp_path) if "partial" in f or "resume" in f]
    assert kills == wanted


@pytest.mark.stress
def test_lmdb_conversion_resumes_after_sigkill_with_nothing_lost(big_voc, tmp_path):
    """Expected: same keys and values as an uninterrupted conversion, per split. Killed until
    it completes (at most 40 times) with GLUON_DATA_STRESS=1; in the default run at most 3
    times, then resumed to the end."""
    from gluon_data.stores.lmdbio import LMDBFile, read_lmdb_meta
    ref = str(tmp_path / "ref.lmdb")
    convert(big_voc, ref, "voc", split="train,val", encoding="png")
    out = str(tmp_path / "out.lmdb")
    cmd = [sys.executable, "-m", "gluon_data", "convert", big_voc, out, "--layout", "voc",
           "--split", "train,val", "--encoding", "png", "--workers", "1", "--quiet",
           "--resume"]
    env = dict(os.environ, GLUON_DATA_CHECKPOINT_EVERY="4")
    t0 = time.monotonic()
    subprocess.run(cmd[:5] + [str(tmp_path / "calib.lmdb")] + cmd[6:], check=True, env=env,
                   stdout=subprocess.DEVNULL)
    full = time.monotonic() - t0
    rng = random.Random(1)
    kills = 0
    for _ in range(40 if STRESS else 3):
        p = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        time.sleep(rng.uniform(0.35 * full, 0.6 * full))
        if p.poll() is not None:
            assert p.returncode == 0, p.stderr.read().decode()[-2000:]
            break
        p.send_signal(signal.SIGKILL)
        p.wait()
        kills += 1
    else:
        subprocess.run(cmd, check=True, env=env)
    assert kills >= 2, "too few kills landed mid-conversion (%d)" % kills
    assert sorted(os.listdir(out)) == ["data.mdb"] and not os.path.exists(out + ".partial")
    for split in ("train", "val"):
        a, b = LMDBFile(ref, split), LMDBFile(out, split)
        assert len(a) == len(b) > 0
        assert all(a.read(i) == b.read(i) for i in range(len(a)))
    assert read_lmdb_meta(ref) == read_lmdb_meta(out)


def test_resume_refuses_a_checkpoint_of_other_options(big_voc, tmp_path):
    out = str(tmp_path / "o.rec")
    code = ("import importlib, os, signal\nfrom gluon_data import convert\n"
            "c = importlib.import_module('gluon_data.convert')\n"
            "real = c.resume.Checkpoint.save\n"
            "def save(self, *a):\n    real(self, *a)\n    os.kill(os.getpid(), signal.SIGKILL)\n"
            "c.resume.Checkpoint.save = save\n"
            "convert(%r, %r, 'voc', split='train', checkpoint_every=8)\n" % (big_voc, out))
    p = subprocess.run([sys.executable, "-c", code])
    assert p.returncode == -signal.SIGKILL and os.path.exists(out + ".resume.json")
    with pytest.raises(ConversionError, match="other inputs or options"):
        convert(big_voc, out, "voc", split="train", quality=50, encoding="jpg", resume=True)
    rep = convert(big_voc, out, "voc", split="train", resume=True, checkpoint_every=8)
    assert rep.written == {"train": 120} and len(SegmentationRecordDataset(out)) == 120


# ---------------------------------------------------------------- verify
def test_verify_names_every_bad_record_and_exits_non_zero(voc_rec, tmp_path):
    assert verify(voc_rec, deep=True).ok
    bad = copy_rec(voc_rec, str(tmp_path / "bad.rec"))
    f = RecordFile(bad)
    data = bytearray(open(bad, "rb").read())
    for i in (2, 9):
        data[f.offset(i) + 40] ^= 0x04
    open(bad, "wb").write(bytes(data))
    rep = verify(bad)
    assert [p["key"] for p in rep.problems] == [2, 9] and rep.checked == 16
    assert all("checksum" in p["reason"] for p in rep.problems)
    p = subprocess.run([sys.executable, "-m", "gluon_data", "verify", bad], capture_output=True,
                       text=True)
    assert p.returncode == 1 and "record 2" in p.stderr and "record 9" in p.stderr  # problems: stderr


def test_verify_deep_decodes_and_checks_mask_ids(tmp_path, voc_rec):
    """A record whose checksum is right but whose mask ids exceed the classes."""
    bad = str(tmp_path / "ids.rec")
    src = RecordFile(voc_rec)
    with RecordWriter(bad) as w:
        for i in range(len(src)):
            rec = codec.unpack(src.read(i))
            mask = codec.decode_mask(rec.mask)
            if i == 4:
                mask = mask.copy()
                mask[0, 0] = 77
            w.write(i, codec.pack_segmentation(rec.image, codec.encode_mask(mask), id=i))
        w.finish(json.load(open(voc_rec[:-4] + ".meta.json")))
        w.publish()
    assert verify(bad).ok  # structure and checksums are fine
    rep = verify(bad, deep=True)
    assert [p["key"] for p in rep.problems] == [4] and "[77]" in rep.problems[0]["reason"]


def test_verify_lmdb_survives_bit_flips_in_data_mdb(voc_rec, tmp_path):
    """Expected: a flipped value is a checksum error naming its record; a flipped B-tree page
    is reported, never a crash of the verifying process (the scan runs in a child)."""
    lm = str(tmp_path / "v.lmdb")
    convert(voc_rec, lm)
    assert verify(lm, deep=True).ok
    data_file = os.path.join(lm, "data.mdb")
    pristine = open(data_file, "rb").read()
    src = RecordFile(voc_rec)
    payload = src.read(6)
    others = [src.read(i) for i in range(len(src)) if i != 6]
    snippet = next(payload[k:k + 32] for k in range(24, len(payload) - 32, 8)
                   if all(payload[k:k + 32] not in o for o in others))  # only in record 6
    flipped = bytearray(pristine)
    at = pristine.find(snippet)
    assert at > 0
    while at >= 0:  # LMDB may keep stale copies of a page: flip them all
        flipped[at + 5] ^= 0x20
        at = pristine.find(snippet, at + 1)
    open(data_file, "wb").write(bytes(flipped))
    rep = verify(lm)
    assert [p["key"] for p in rep.problems] == [6]
    rng = random.Random(3)
    for _ in range(12):  # anywhere, including page headers and branch pages
        flipped = bytearray(pristine)
        pos = rng.randrange(len(pristine))
        flipped[pos] ^= 1 << rng.randrange(8)
        open(data_file, "wb").write(bytes(flipped))
        rep = verify(lm)  # must return, whatever LMDB does in the child
        assert rep.ok or rep.problems
    open(data_file, "wb").write(pristine)


# ---------------------------------------------------------------- salvage
MAGIC = codec.struct.pack("<I", codec.RECORDIO_MAGIC)


@pytest.fixture
def tricky_rec(tmp_path):
    """Classification records whose bytes contain the magic word at aligned offsets."""
    path = str(tmp_path / "t.rec")
    payloads = []
    with RecordWriter(path) as w:
        for i in range(12):
            img = (MAGIC if i % 3 == 0 else b"") + os.urandom(8 * i) + MAGIC * (i % 2) + b"end!"
            p = codec.pack_classification(i % 4, img, id=i)
            payloads.append(p)
            w.write(i, p)
        w.finish({"format": "gluon_data", "format_version": 1, "task": "classification",
                  "num_records": 12, "checksum": "crc32-id2"})
        w.publish()
    return path, payloads


def test_salvage_rebuilds_a_lost_index_exactly(tricky_rec):
    path, payloads = tricky_rec
    original = open(path[:-4] + ".idx", "rb").read()
    os.remove(path[:-4] + ".idx")
    rep = salvage(path)
    assert rep.records == 12 and rep.damaged == []
    assert open(path[:-4] + ".idx", "rb").read() == original


def test_salvage_recovers_an_index_cut_short_by_a_killed_writer(tricky_rec):
    path, payloads = tricky_rec
    lines = open(path[:-4] + ".idx").read().splitlines(True)
    open(path[:-4] + ".idx", "w").write("".join(lines[:7]))
    with pytest.raises(GluonDataError, match="shorter|promises"):
        RecordFile(path, expected_count=12)
    with pytest.raises(FileExistsError):
        salvage(path)
    salvage(path, overwrite=True)
    f = RecordFile(path, expected_count=12)
    assert [f.read(i) for i in range(12)] == payloads
    assert os.path.exists(path[:-4] + ".idx.bak")


def test_salvage_skips_damaged_records_and_lists_their_bytes(tricky_rec):
    path, payloads = tricky_rec
    f = RecordFile(path)
    data = bytearray(open(path, "rb").read())
    data[f.offset(5) + 30] ^= 0xFF           # the checksum tag itself: must not pass as stock
    cut = f.offset(11) + 10                   # the last record is truncated
    open(path, "wb").write(bytes(data[:cut]))
    os.remove(path[:-4] + ".idx")
    rep = salvage(path)
    assert rep.records == 10
    assert rep.damaged == [(f.offset(5), f.offset(6)), (f.offset(11), cut)]
    g = RecordFile(path, expected_count=10)
    assert [g.read(i) for i in range(10)] == payloads[:5] + payloads[6:11]
    meta = json.load(open(path[:-4] + ".meta.json"))
    assert meta["salvaged"]["records_before"] == 12 and meta["num_records"] == 10
    assert open(path + ".damaged-tail", "rb").read() == bytes(data[f.offset(11):cut])


# ---------------------------------------------------------------- loaders
PARENT = os.getpid()


class _Bomb(mx.gluon.data.Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        if i == 21 and os.getpid() != PARENT:
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(0.005)
        return np.float32(i)


def test_killed_worker_is_an_error_within_seconds_not_a_120s_hang():
    t0 = time.monotonic()
    with pytest.raises(WorkerDiedError, match="SIGKILL"):
        for _ in DataLoader(_Bomb(), batch_size=4, num_workers=2):
            pass
    # a ceiling far from the few seconds expected (workers spawn and import MXNet on a
    # loaded machine), still half of the 120 s hang it guards against
    assert time.monotonic() - t0 < 60


class _SlowItems(mx.gluon.data.Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        time.sleep(0.3)  # a batch of 2 takes longer than the loader's 0.2 s poll
        return np.float32(i)


def test_a_worker_replaced_before_an_epoch_begins_is_an_error_not_a_lost_batch():
    """A worker killed and replaced by its pool before the next epoch's iterator looks: the
    iterator still tells that a worker died (the training recipe once waited forever when its
    epoch began in the moment the pool listed no worker, and the replacement then died with
    the batch it held)."""
    loader = DataLoader(_SlowItems(), batch_size=2, num_workers=1)
    (first,) = loader._worker_pool._pool
    os.kill(first.pid, signal.SIGKILL)
    for _ in range(1000):  # the pool's handler replaces it within about 0.1 s
        listed = list(loader._worker_pool._pool)
        if listed and first not in listed:
            break
        time.sleep(0.02)
    else:
        pytest.fail("the pool did not replace its killed worker")
    with pytest.raises(WorkerDiedError, match=r"\(pid %d\) died, killed by signal SIGKILL" % first.pid):
        for _ in loader:
            pass


def test_a_worker_killed_after_the_last_batch_ends_the_epoch_then_the_next_raises():
    """All of an epoch's batches arrived: the epoch ends as usual, whatever happened to a
    worker meanwhile; the next epoch, which its pool cannot serve, raises."""
    loader = DataLoader(_SlowItems(), batch_size=2, num_workers=2)
    victim = loader._worker_pool._pool[0]
    got = []
    for i, batch in enumerate(loader):
        got += batch.asnumpy().tolist()
        if i == 3:  # the last batch: every task was handed out and done
            os.kill(victim.pid, signal.SIGKILL)
            for _ in range(1000):  # (dead before the loop asks for the next batch)
                if victim.exitcode is not None:
                    break
                time.sleep(0.02)
    assert sorted(got) == list(range(8))
    with pytest.raises(WorkerDiedError, match=r"\(pid %d\) died" % victim.pid):
        for _ in loader:
            pass


class _DiesInBatch12(mx.gluon.data.Dataset):
    """Samples of 48 KB (batches travel in the worker's reused shared segments); the worker
    that reads sample 24 is killed."""

    def __len__(self):
        return 40

    def __getitem__(self, i):
        if i == 24 and os.getpid() != PARENT:
            os.kill(os.getpid(), signal.SIGKILL)
        return np.full((64, 64, 3), i, np.float32)


def test_a_finished_batch_of_a_worker_killed_since_is_worker_died_error():
    """Batch 11 is done and sent when its worker dies reading batch 12; the pool's start of a
    replacement lets the dead worker's shared memory go before batch 11 is received. Reading
    it is WorkerDiedError (it was an error about unmapped shared memory, and the program
    then hung at exit)."""
    loader = DataLoader(_DiesInBatch12(), batch_size=2, num_workers=1,
                        batchify_fn=StackBatchify())
    (first,) = loader._worker_pool._pool
    seen = []
    with pytest.raises(WorkerDiedError, match=r"\(pid %d\) died" % first.pid) as e:
        for i, batch in enumerate(loader):
            seen.append(int(batch.asnumpy()[0, 0, 0, 0]))
            del batch
            if i == 10:  # batches 11 and 12 are on their way: wait for the replacement
                for _ in range(1000):
                    listed = list(loader._worker_pool._pool)
                    if listed and first not in listed:
                        break
                    time.sleep(0.02)
    assert seen == list(range(0, 22, 2))
    # what failed first: batch 11's shared memory, let go (or, in a new segment, the
    # descriptor that its dead worker could no longer hand over)
    assert isinstance(e.value.__context__, (GluonDataError, OSError, EOFError))


def test_auto_reload_with_worker_processes():
    loader = DataLoader(np.arange(8, dtype=np.float32), batch_size=2, num_workers=1,
                        auto_reload=True)
    for _ in range(2):
        assert sorted(x for b in loader for x in b.asnumpy().tolist()) == list(range(8))


IDLE_KILL = """
import gc, os, signal, sys, threading, time
import numpy as np
import mxnet as mx
from gluon_data import DataLoader
from gluon_data.gluon.loader import WorkerDiedError

class Slow(mx.gluon.data.Dataset):
    def __len__(self):
        return 64
    def __getitem__(self, i):
        time.sleep(0.01)
        return np.float32(i)

if __name__ == "__main__":
    loader = DataLoader(Slow(), batch_size=2, num_workers=2)
    it = iter(loader)
    next(it)
    time.sleep(1.0)  # the workers have read ahead and wait for tasks (one holds the queue's lock)
    for p in loader._worker_pool._pool:
        os.kill(p.pid, signal.SIGKILL)
    if sys.argv[1:] == ["exit"]:  # the program ends without reading on
        import multiprocessing.util
        multiprocessing.util.get_logger()  # (re-registers multiprocessing's exit handler last)
        print("exiting")
        sys.exit(0)
    try:
        for _ in it:
            pass
    except WorkerDiedError as e:
        print("raised:", e)
    del it, loader
    gc.collect()
    print("threads left:", sorted(t.name for t in threading.enumerate()
                                  if t is not threading.main_thread()))
"""


def test_workers_killed_while_idle_are_an_error_not_a_deadlock(tmp_path):
    """Workers killed while they wait for their next task (one of them holding the task
    queue's lock): WorkerDiedError, where stopping the pool with Pool.terminate() waited for
    that lock forever (the training recipe hung so after an out-of-memory kill). The pool
    is stopped whole: no thread of it is left waiting on the dead worker's lock (each such
    error left two behind)."""
    script = tmp_path / "idle_kill.py"
    script.write_text(IDLE_KILL)
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                       timeout=120)  # (deadlocked, it never ends: the timeout fails it)
    assert p.returncode == 0 and "raised: DataLoader worker" in p.stdout, p.stderr[-3000:]
    assert "threads left: []" in p.stdout, p.stdout


def test_a_program_whose_workers_were_killed_while_idle_still_exits(tmp_path):
    """The same kill, and the program ends without reading on: it exits (its loader's pool
    stopped within seconds), where multiprocessing's exit handler waited forever for the
    queue lock that a killed worker held; also when that handler was registered again after
    the loader was made (as ``multiprocessing.util.get_logger()`` does)."""
    script = tmp_path / "idle_kill.py"
    script.write_text(IDLE_KILL)
    p = subprocess.run([sys.executable, str(script), "exit"], capture_output=True, text=True,
                       timeout=120)  # (deadlocked, it never ends: the timeout fails it)
    assert p.returncode == 0 and p.stdout == "exiting\n", p.stderr[-3000:]


class _FailsWhileFlagged(mx.gluon.data.Dataset):
    """Raises a typed error at index 21 while ``flag`` exists (checked in the worker)."""

    def __init__(self, flag):
        self.flag = flag

    def __len__(self):
        return 64

    def __getitem__(self, i):
        if i == 21 and os.path.exists(self.flag):
            raise FormatError("record 21 is damaged (test)", self.flag, key=21)
        time.sleep(0.002)
        return np.float32(i)


def test_a_worker_error_reaches_the_loop_and_the_loader_stays_usable(tmp_path):
    """Expected: the typed error of one batch reaches the loop, without Pool.terminate()
    (which can deadlock on a worker killed while it holds the result queue's lock); the
    batches in flight are released; the same loader's next epoch reads everything."""
    flag = str(tmp_path / "fail")
    open(flag, "w").close()
    loader = DataLoader(_FailsWhileFlagged(flag), batch_size=4, num_workers=2)
    for _ in range(3):
        seen = []
        with pytest.raises(FormatError, match="record 21") as e:
            for batch in loader:
                seen += batch.asnumpy().tolist()
        assert e.value.key == 21 and len(seen) <= 20
    os.remove(flag)
    got = sorted(x for batch in loader for x in batch.asnumpy().tolist())
    assert got == list(range(64))


def test_our_dataloader_is_a_drop_in(voc_rec):
    ds = SegmentationRecordDataset(voc_rec, mode="val", crop_size=16)
    a = [b[1].asnumpy() for b in DataLoader(ds, batch_size=4, num_workers=2)]
    b = [b[1].asnumpy() for b in mx.gluon.data.DataLoader(ds, batch_size=4)]
    assert all(np.array_equal(x, y) for x, y in zip(a, b)) and len(a) == 4


@pytest.mark.stress
@pytest.mark.parametrize("kind", ["rec", "lmdb"])
def test_thread_pool_reads_zero_wrong_records(voc_rec, tmp_path, kind):
    """8 threads share one reader: 1e5 random reads with GLUON_DATA_STRESS=1 (2e4 by
    default), every one the record asked for."""
    from concurrent.futures import ThreadPoolExecutor
    from gluon_data.stores.lmdbio import LMDBFile
    if kind == "lmdb":
        convert(voc_rec, str(tmp_path / "t.lmdb"))
        f = LMDBFile(str(tmp_path / "t.lmdb"), "trainval")
    else:
        f = RecordFile(voc_rec)
    want = [f.read(i) for i in range(len(f))]
    order = np.random.default_rng(1).integers(0, len(f), 100_000 if STRESS else 20_000)
    with ThreadPoolExecutor(8) as ex:
        wrong = sum(g != want[i] for g, i in zip(ex.map(f.read, order, chunksize=256), order))
    assert wrong == 0


# ---------------------------------------------------------------- conversion sources
def test_symlinks_leaving_the_root_or_looping_are_named(tmp_path):
    from test_convert import make_pairs
    src = make_pairs(str(tmp_path / "src"), n=3)
    outside = tmp_path / "secret.png"
    shutil.copy(os.path.join(src, "images", "s00.png"), outside)
    os.symlink(outside, os.path.join(src, "images", "s09.png"))
    with pytest.raises(ConversionError, match="symlink leaves the source root"):
        convert(src, str(tmp_path / "o.rec"), "pairs")
    os.remove(os.path.join(src, "images", "s09.png"))
    loop = os.path.join(src, "images", "s08.png")
    os.symlink(loop, loop)
    shutil.copy(os.path.join(src, "masks", "s00.png"), os.path.join(src, "masks", "s08.png"))
    os.symlink(os.path.join(src, "images"), os.path.join(src, "images", "again"))
    with pytest.raises(ConversionError, match="s08.png.*a symbolic link that loops"):
        convert(src, str(tmp_path / "o.rec"), "pairs")


def test_full_disk_on_a_small_tmpfs_leaves_nothing(voc_root, tmp_path):
    if not shutil.which("unshare"):
        pytest.skip("unshare not available")
    mnt = tmp_path / "small"
    mnt.mkdir()
    code = ("import os\nfrom gluon_data import convert\nfrom gluon_data.errors import "
            "ConversionError\ntry:\n    convert(%r, %r, 'voc', split='trainval', "
            "encoding='raw')\nexcept ConversionError as e:\n    print('ERR', e)\n"
            "print('LEFT', sorted(os.listdir(%r)))\n" % (voc_root, str(mnt / "o.rec"), str(mnt)))
    script = "mount -t tmpfs -o size=64k tmpfs %s && %s -c \"$CODE\"" % (mnt, sys.executable)
    p = subprocess.run(["unshare", "-rm", "sh", "-c", script], capture_output=True, text=True,
                       env=dict(os.environ, CODE=code), timeout=120)
    if p.returncode != 0 and "mount" in p.stderr:
        pytest.skip("cannot mount a tmpfs here: %s" % p.stderr.strip()[-200:])
    assert "ERR" in p.stdout and "No space left" in p.stdout, p.stdout + p.stderr
    assert "LEFT []" in p.stdout


# ---------------------------------------------------------------- soak
def _file_fds() -> int:
    """Descriptors open on files (readers' handles). Sockets, pipes and shared-memory
    descriptors come and go with the batches in flight to the main process."""
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink("/proc/self/fd/" + fd)
        except OSError:
            continue
        n += target.startswith("/") and not target.startswith(("/dev/shm/", "/memfd:"))
    return n


def _probe():
    with open("/proc/self/statm") as f:
        rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    return rss, _file_fds()


class _Probe(mx.gluon.data.Dataset):
    def __init__(self, base, n):
        self.base, self.n = base, n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        img, mask = self.base[i % len(self.base)]
        rss, fds = _probe()
        return np.int64(os.getpid()), np.int64(rss), np.int64(fds), np.int64(mask.shape[0])


@pytest.mark.stress
@pytest.mark.parametrize("kind", ["rec", "lmdb"])
def test_soak_rss_fds_and_reader_slots_stay_flat(voc_rec, tmp_path, kind):
    """2 workers x 3 epochs of random reads (1e5 per epoch with GLUON_DATA_STRESS=1)."""
    if kind == "lmdb":
        lm = str(tmp_path / "s.lmdb")
        convert(voc_rec, lm)
        base = SegmentationLMDBDataset(lm, "trainval")
    else:
        base = SegmentationRecordDataset(voc_rec)
    n = 100_000 if STRESS else 3_000
    loader = DataLoader(_Probe(base, n), batch_size=64, shuffle=True, num_workers=2)
    per_epoch = []
    for _ in range(3):
        last = {}
        for pid, rss, fds, _ in loader:
            for p, r, f in zip(pid.asnumpy(), rss.asnumpy(), fds.asnumpy()):
                last[int(p)] = (int(r), int(f))
        per_epoch.append(last)
    assert set(per_epoch[0]) == set(per_epoch[2]) and len(per_epoch[0]) == 2  # same workers
    for pid in per_epoch[0]:
        (r1, f1), (r3, f3) = per_epoch[0][pid], per_epoch[2][pid]
        assert f1 == f3, "open file descriptors grew in worker %d: %d -> %d" % (pid, f1, f3)
        assert abs(r3 - r1) <= 0.05 * r1 + (2 << 20), "RSS drifted: %d -> %d" % (r1, r3)
    if kind == "lmdb":
        assert not os.path.exists(os.path.join(lm, "lock.mdb"))  # no reader table to fill
