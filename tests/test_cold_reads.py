"""Cold reads: an LMDB value is fetched with one read of its pages, not a page fault per 4 KB;
``will_need`` fetches a batch's records ahead of their reads, one request per record, and
``gluon_data.DataLoader`` hands it every batch before the batch is read.

The device-read count runs on a loop device made for the test (root, ``losetup`` and
``mount`` needed; skipped elsewhere): its ``/sys/block/loopN/stat`` counts only this test's
requests. The device is set to the kernel's default 128 KB readahead and direct I/O on its
backing file, so every request it counts reaches the disk.
"""
import os
import shutil
import subprocess

import lmdb
import numpy as np
import pytest

from gluon_data import convert
from gluon_data.errors import CorruptRecordError, FormatError
from gluon_data.stores.lmdb_env import close_envs
from gluon_data.stores.lmdbio import LMDBFile
from gluon_data.stores.recordio import RecordFile
from gluon_data.convert.sample import make_voc


def _values(path, split="train"):
    env = lmdb.open(path, readonly=True, lock=False, max_dbs=64, subdir=True)
    try:
        db = env.open_db(split.encode(), create=False)
        with env.begin(db=db) as txn:
            return [bytes(v) for _, v in txn.cursor()]
    finally:
        env.close()


@pytest.fixture(scope="module")
def big_voc(tmp_path_factory):
    """Records of tens of KB (values in LMDB overflow pages, as real photos are)."""
    return make_voc(str(tmp_path_factory.mktemp("bigvoc") / "VOC2012"), num_images=12,
                    size_range=(200, 260), val_fraction=0.0, seed=3, quality=95)


def test_direct_reads_equal_lmdb_values(big_voc, tmp_path):
    out = str(tmp_path / "v.lmdb")
    convert(big_voc, out, "voc", split="train")
    f = LMDBFile(out, "train")
    order = np.random.default_rng(0).permutation(len(f))
    got = {int(i): f.read(int(i)) for i in order}
    ref = _values(_copy(out, tmp_path))
    assert [got[i] for i in range(len(f))] == ref
    assert min(len(v) for v in ref) > 8192  # overflow values: the direct path ran
    assert int(f._pages.locations.table.astype(bool).sum()) == len(f)
    with pytest.raises(IndexError):
        f.read(len(f))


def _copy(path, tmp_path):
    """A second copy (py-lmdb refuses to open one environment twice in a process)."""
    dst = str(tmp_path / "copy.lmdb")
    shutil.copytree(path, dst)
    return dst


def test_small_inline_values_use_lmdb(voc_root, tmp_path):
    """Values stored inside the leaf pages (tiny records) keep py-lmdb's path."""
    out = str(tmp_path / "small.lmdb")
    convert(voc_root, out, "voc", split="train")
    f = LMDBFile(out, "train")
    assert [f.read(i) for i in range(len(f))] == _values(_copy(out, tmp_path))


def test_truncated_value_is_a_typed_error(big_voc, tmp_path):
    out = str(tmp_path / "t.lmdb")
    convert(big_voc, out, "voc", split="train")
    f = LMDBFile(out, "train")
    f.read(0)  # locations learnt, environment open
    last = max(range(len(f)), key=lambda i: int(f._pages.locations.table[i]) >> 32)
    start = (int(f._pages.locations.table[last]) >> 32) * f._psize
    data = os.path.join(out, "data.mdb")
    with open(data, "r+b") as fh:  # cut into the last value's pages only
        fh.truncate(start + 100)
    with pytest.raises(FormatError, match="data.mdb shrank"):  # a short read, no SIGBUS
        f.read(last)


def test_wrong_location_is_a_typed_error(big_voc, tmp_path):
    out = str(tmp_path / "w.lmdb")
    convert(big_voc, out, "voc", split="train")
    f = LMDBFile(out, "train")
    f.read(0)
    f.read(1)
    table = f._pages.locations.table
    table[0] = table[1] + np.uint64(1 << 32)  # one page into another value: no page header
    with pytest.raises(CorruptRecordError, match="overflow page"):
        f.read(0)


def _can_loop_mount():
    return (hasattr(os, "geteuid") and os.geteuid() == 0 and shutil.which("losetup")
            and shutil.which("mkfs.ext4") and os.path.isdir("/sys/block"))


@pytest.fixture()
def loop_mount(tmp_path):
    if not _can_loop_mount():
        pytest.skip("needs root, losetup and mkfs.ext4 to count device reads")
    img, mnt = str(tmp_path / "disk.img"), str(tmp_path / "mnt")
    os.makedirs(mnt)
    with open(img, "wb") as fh:
        fh.truncate(64 << 20)
    subprocess.run(["mkfs.ext4", "-q", "-F", img], check=True, capture_output=True)
    res = subprocess.run(["losetup", "--find", "--show", img], capture_output=True, text=True)
    if res.returncode != 0:
        pytest.skip("no loop device: %s" % res.stderr.strip())
    dev = res.stdout.strip()
    try:
        if subprocess.run(["mount", dev, mnt], capture_output=True).returncode != 0:
            pytest.skip("cannot mount a loop device here")
        name = os.path.basename(dev)
        with open("/sys/block/%s/queue/read_ahead_kb" % name, "w") as fh:
            fh.write("128")
        subprocess.run(["losetup", "--direct-io=on", dev], capture_output=True)
        yield mnt, name
    finally:
        _unmap(mnt)  # an open map or descriptor keeps the mount busy
        if subprocess.run(["umount", mnt], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", mnt], capture_output=True)
        subprocess.run(["losetup", "-d", dev], capture_output=True)


def _unmap(mnt):
    """Close this process's LMDB environments under ``mnt``: pages they map (LMDB's own
    lookups, and the kernel's fault-around next to them) cannot be evicted."""
    close_envs(os.path.realpath(mnt))


def _device_reads(name):
    with open("/sys/block/%s/stat" % name) as fh:
        return int(fh.read().split()[0])  # read requests completed


def _evict(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


@pytest.fixture(scope="module")
def photo_voc(tmp_path_factory):
    """~60 KB records, the size of the benchmark's photos."""
    return make_voc(str(tmp_path_factory.mktemp("photovoc") / "VOC2012"), num_images=12,
                    size_range=(380, 420), val_fraction=0.0, seed=4, quality=98)


def test_cold_random_reads_take_one_device_read_per_record(photo_voc, loop_mount):
    mnt, name = loop_mount
    rec, lm = os.path.join(mnt, "v.rec"), os.path.join(mnt, "v.lmdb")
    convert(photo_voc, rec, "voc", split="train")
    convert(rec, lm)
    os.sync()
    for reader, data in ((RecordFile(rec), rec), (LMDBFile(lm, "train"),
                                                  os.path.join(lm, "data.mdb"))):
        order = [int(i) for i in np.random.default_rng(1).permutation(len(reader))]
        _evict(data)
        before = _device_reads(name)
        sizes = [len(reader.read(i)) for i in order]
        per_record = (_device_reads(name) - before) / len(order)
        assert min(sizes) > 32768
        assert 0.5 <= per_record <= 1.2, (type(reader).__name__, per_record)
    reader.close()
    # the counter sees the difference: py-lmdb's own get faults a page at a time
    _evict(data)
    before = _device_reads(name)
    for i in order:
        reader._env.get_value(b"%010d" % i, "train")
    assert (_device_reads(name) - before) / len(order) > 3


def _settle(name, timeout=10.0):
    """Wait (bounded) until the device has no read in flight: a hint returns before its
    reads complete."""
    import time
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with open("/sys/block/%s/inflight" % name) as fh:
            if int(fh.read().split()[0]) == 0:
                return
        time.sleep(0.01)
    raise AssertionError("device reads still in flight after %.0f s" % timeout)


def _sectors(name):
    with open("/sys/block/%s/stat" % name) as fh:
        return int(fh.read().split()[2])


def test_will_need_fetches_each_record_ahead_in_one_device_read(photo_voc, loop_mount):
    """The hint alone brings every record in (~1 request per record, about the records'
    bytes and no more); the reads that follow touch the device no more and return the same
    bytes as reads without a hint."""
    mnt, name = loop_mount
    rec, lm = os.path.join(mnt, "h.rec"), os.path.join(mnt, "h.lmdb")
    convert(photo_voc, rec, "voc", split="train")
    convert(rec, lm)
    os.sync()
    for reader, data in ((RecordFile(rec), rec), (LMDBFile(lm, "train"),
                                                  os.path.join(lm, "data.mdb"))):
        order = [int(i) for i in np.random.default_rng(1).permutation(len(reader))]
        plain = {i: reader.read(i) for i in order}  # (LMDB: every location learnt)
        reader.close()
        _unmap(mnt)
        _evict(data)
        reads, sectors = _device_reads(name), _sectors(name)
        for k in range(0, len(order), 4):  # batches of 4, as a loader hands them
            reader.will_need(order[k:k + 4])
        _settle(name)
        hinted = (_device_reads(name) - reads) / len(order)
        fetched = (_sectors(name) - sectors) * 512
        before = _device_reads(name)
        got = {i: reader.read(i) for i in order}
        assert got == plain
        size = sum(len(v) for v in plain.values())
        assert 0 < hinted <= 1.2, (type(reader).__name__, hinted)
        assert size <= fetched <= 1.5 * size + (64 << 10), (type(reader).__name__, fetched, size)
        assert _device_reads(name) - before <= 1, type(reader).__name__  # all cached by the hint
        reader.close()


_EVENTS = []  # ("hint", indices) and ("read", batch size), in the order they happened


def _mask_sums(samples):
    """Batchify (module level: process workers unpickle it) noting when a batch is read."""
    _EVENTS.append(("read", len(samples)))
    return [int(m.asnumpy().astype(np.int64).sum()) for _, m in samples]


def test_dataloader_hints_every_batch_before_reading_it(voc_rec):
    """gluon_data.DataLoader hands each batch's indices to the dataset's will_need in the
    main process before the batch is read: two batches ahead with num_workers=0, as it is
    handed to a thread (or process) otherwise; the samples are those of Gluon's loader."""
    mx = pytest.importorskip("mxnet", reason="gluon_data.DataLoader, compared with Gluon's "
                                             "own, is the Gluon layer: it needs MXNet")
    from gluon_data import DataLoader, SegmentationRecordDataset

    ds = SegmentationRecordDataset(voc_rec)
    real = ds.will_need
    ds.will_need = lambda indices: (_EVENTS.append(("hint", [int(i) for i in indices])),
                                    real(indices))
    batches = [[5, 1, 3], [0, 7], [2, 6, 4], [8]]
    ref = [x for b in mx.gluon.data.DataLoader(ds, batch_sampler=batches,
                                               batchify_fn=_mask_sums) for x in b]
    assert not [e for e in _EVENTS if e[0] == "hint"]  # Gluon's own loader does not hint
    for loader in ({}, {"num_workers": 2, "thread_pool": True}, {"num_workers": 2}):
        del _EVENTS[:]
        got = [x for b in DataLoader(ds, batch_sampler=batches, batchify_fn=_mask_sums,
                                     **loader) for x in b]
        assert got == ref, loader
        hinted = [k for k, (kind, _) in enumerate(_EVENTS) if kind == "hint"]
        assert [_EVENTS[k][1] for k in hinted] == batches, loader
        if loader:
            continue  # batches are read in a thread or worker: only the hints are ordered
        reads = [k for k, (kind, _) in enumerate(_EVENTS) if kind == "read"]
        for j, at in enumerate(reads):  # batch j + 2 was hinted before batch j was read
            assert hinted[min(j + 2, len(batches) - 1)] < at, (j, _EVENTS)
