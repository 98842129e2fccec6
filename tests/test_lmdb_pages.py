"""The LMDB page reader (gluon_data.stores.lmdb_pages) is used only on an on-disk version it knows
and when not switched off; otherwise every read goes through py-lmdb, with the same bytes."""
import os
import shutil
import struct

import lmdb
import numpy as np
import pytest

from gluon_data import convert
from gluon_data.stores import lmdb_pages
from gluon_data.errors import FormatError
from gluon_data.stores.lmdbio import LMDBFile
from gluon_data.convert.sample import make_voc


@pytest.fixture(scope="module")
def overflow_lmdb(tmp_path_factory):
    """An LMDB whose values (tens of KB) live in overflow pages: the page reader's case."""
    base = tmp_path_factory.mktemp("pages")
    voc = make_voc(str(base / "VOC2012"), num_images=8, size_range=(200, 260),
                   val_fraction=0.0, seed=3, quality=95)
    out = str(base / "v.lmdb")
    convert(voc, out, "voc", split="train")
    return out


def _copy(path, tmp_path, name="copy.lmdb"):
    """Another environment (py-lmdb opens one environment once per process)."""
    dst = str(tmp_path / name)
    shutil.copytree(path, dst)
    return dst


def _values(path):
    env = lmdb.open(path, readonly=True, lock=False, max_dbs=64, subdir=True)
    try:
        with env.begin(db=env.open_db(b"train", create=False)) as txn:
            return [bytes(v) for _, v in txn.cursor()]
    finally:
        env.close()


def _descriptors_on(path):
    """How many of this process's descriptors are open on ``path``."""
    real = os.path.realpath(path)
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            n += os.readlink("/proc/self/fd/" + fd) == real
        except OSError:
            pass
    return n


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc")
@pytest.mark.parametrize("how", ["environment", "keyword"])
def test_switched_off_every_read_goes_through_py_lmdb(overflow_lmdb, tmp_path, monkeypatch,
                                                      how):
    ref = _values(_copy(overflow_lmdb, tmp_path, "ref.lmdb"))
    on = LMDBFile(_copy(overflow_lmdb, tmp_path, "on.lmdb"), "train")
    direct = [on.read(i) for i in range(len(on))]
    assert on.pages_refused is None
    with_direct = _descriptors_on(os.path.join(on.path, "data.mdb"))

    path = _copy(overflow_lmdb, tmp_path, "off.lmdb")
    if how == "environment":
        monkeypatch.setenv("GLUON_DATA_LMDB_PAGES", "0")
        f = LMDBFile(path, "train")
    else:
        f = LMDBFile(path, "train", pages=False)
    assert f.pages_refused == "switched off" and f._pages is None
    f.will_need(range(len(f)))  # a hint is a no-op then
    got = [f.read(i) for i in range(len(f))]
    assert got == ref == direct
    assert min(len(v) for v in ref) > 8192  # overflow values: direct reads would have run
    # py-lmdb's map only: the environment's descriptors, none for direct reads
    assert _descriptors_on(os.path.join(path, "data.mdb")) == with_direct - 1
    monkeypatch.delenv("GLUON_DATA_LMDB_PAGES", raising=False)
    assert LMDBFile(path, "train").pages_refused is None  # the switch is read at open


def _patch_meta_version(path, version):
    """Write ``version`` into the data-version field of both meta pages of ``data.mdb``."""
    data = os.path.join(path, "data.mdb")
    with open(data, "r+b") as fh:
        head = fh.read(64)
        psize, = struct.unpack_from("<I", head, 40)
        for base in (0, psize):
            fh.seek(base + 20)
            fh.write(struct.pack("<I", version))


def test_unknown_on_disk_version_is_not_parsed(overflow_lmdb, tmp_path):
    """A data.mdb whose meta pages carry another data version: the page reader declines
    it, and LMDBFile says so with a typed error (liblmdb 0.9 refuses that version too)
    rather than parsing pages of a layout nobody here knows."""
    path = _copy(overflow_lmdb, tmp_path)
    assert lmdb_pages.direct_reads_refused(path) is None
    _patch_meta_version(path, 2)
    assert lmdb_pages.direct_reads_refused(path) == "data version 2"
    with pytest.raises(FormatError, match="cannot open LMDB environment") as e:
        LMDBFile(path, "train")
    assert path in str(e.value)


def test_unknown_library_series_reads_through_py_lmdb(overflow_lmdb, tmp_path, monkeypatch):
    """Under a liblmdb series the page reader was not written for, every read goes through
    py-lmdb and returns the same bytes."""
    ref = _values(_copy(overflow_lmdb, tmp_path, "ref.lmdb"))
    monkeypatch.setattr(lmdb_pages, "KNOWN_LIBRARIES", ((0, 8),))
    f = LMDBFile(_copy(overflow_lmdb, tmp_path), "train")
    assert f.pages_refused == "liblmdb %s" % ".".join(map(str, lmdb.version()))
    assert f._pages is None
    f.will_need([0, 1])
    assert [f.read(i) for i in range(len(f))] == ref


def test_hints_cover_whole_overflow_runs(overflow_lmdb, tmp_path):
    """will_need asks for each value's whole overflow run, so the runs of values stored one
    after the other touch and one request fetches them together."""
    f = LMDBFile(_copy(overflow_lmdb, tmp_path), "train")
    f.will_need(range(len(f)))
    locs = f._pages.locations
    assert locs.table.all()
    starts, ends = locs.extents(locs.table)
    assert (starts % f._psize == 0).all() and (ends % f._psize == 0).all()
    sizes = np.array([len(f.read(i)) for i in range(len(f))])
    assert ((ends - starts) >= sizes + 16).all() and ((ends - starts) < sizes + 16 + f._psize).all()
    order = np.argsort(starts)
    touching = (starts[order][1:] == ends[order][:-1]).sum()
    assert touching >= len(f) // 2, (starts, ends)  # written in order: neighbours on disk


def test_page_reader_descriptor_is_bound_to_the_file_opened(overflow_lmdb, tmp_path):
    """The page reader's descriptor is checked against data.mdb as the dataset opened it
    whenever a process opens it (after close(), in a worker): a data.mdb replaced since (here
    by a copy: same bytes, another inode) is refused, never read at the old locations."""
    path = _copy(overflow_lmdb, tmp_path)
    data = os.path.join(path, "data.mdb")
    f = LMDBFile(path, "train")
    assert f.pages_refused is None
    first = f.read(0)
    assert f._pages.locations.table[0]  # read directly, at a learnt location
    shutil.copy(data, data + ".new")
    os.replace(data + ".new", data)
    assert f.read(0) == first  # still open on the file it was opened on
    f._pages.close()  # the next direct read opens (and checks) a descriptor again
    with pytest.raises(FormatError, match="replaced") as e:
        f._pages.view(0)
    assert e.value.path == path
