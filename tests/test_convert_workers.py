"""Conversion across workers: the workers write their records into segments that the writer
appends (a kernel copy for a ``.rec``, one writer's puts for LMDB), the parent only orders
and indexes, and the output is the same bytes for any worker count."""
import os
import shutil

import pytest

from gluon_data import convert
from gluon_data.convert.sample import make_voc
from gluon_data.errors import OutputError
from gluon_data.format import codec
from gluon_data.stores.recordio import RecordFile
from gluon_data.stores.recwriter import RecordWriter
from gluon_data.stores import recwriter

from conftest import same_output_bytes


@pytest.fixture(scope="module")
def voc40(tmp_path_factory):
    return make_voc(str(tmp_path_factory.mktemp("voc40") / "VOC2012"), num_images=40,
                    size_range=(16, 32), seed=5)


def _rec_files(out, meta=True):
    stem = out[:-4]
    return [out, stem + ".idx", stem + ".idx.gdx"] + ([stem + ".meta.json"] if meta else [])


def _segment_dirs(folder):
    return [f for f in os.listdir(folder) if ".segments" in f]


def test_rec_output_is_the_same_bytes_for_any_worker_count(voc40, tmp_path):
    """1 (this process writes each payload), 2 and 3 workers (segments appended): the same
    .rec, .idx and metadata; no segment is left."""
    outs = {}
    for w in (1, 2, 3):
        out = outs[w] = str(tmp_path / ("w%d" % w) / "voc.rec")
        convert(voc40, out, "voc", split="trainval", workers=w)
        assert _segment_dirs(os.path.dirname(out)) == []
    for w in (2, 3):
        for a, b in zip(_rec_files(outs[1]), _rec_files(outs[w])):
            assert same_output_bytes(a, b), (w, a)


def test_lmdb_output_is_the_same_for_any_worker_count(voc40, tmp_path):
    """An LMDB's records reach its one writer from the workers' segments: the same file for
    1 and 3 workers."""
    datas = []
    for w in (1, 3):
        out = str(tmp_path / ("w%d" % w) / "voc.lmdb")
        convert(voc40, out, "voc", split="trainval", workers=w)
        assert _segment_dirs(os.path.dirname(out)) == []
        with open(os.path.join(out, "data.mdb"), "rb") as f:
            datas.append(f.read())
    assert datas[0] == datas[1]


def test_records_after_a_skipped_item_get_their_key_as_id(voc40, tmp_path):
    """An item skipped early shifts every later record's key: each one read back from its
    segment gets its header id rewritten, as the single-process writer does."""
    bad = str(tmp_path / "voc")
    shutil.copytree(voc40, bad)
    first = sorted(os.listdir(os.path.join(bad, "JPEGImages")))[1]
    with open(os.path.join(bad, "JPEGImages", first), "wb") as f:
        f.write(b"\xff\xd8 not a jpeg")
    outs = []
    for w in (1, 2):
        out = str(tmp_path / ("w%d" % w) / "voc.rec")
        rep = convert(bad, out, "voc", split="trainval", workers=w, on_error="skip")
        assert len(rep.skipped) == 1
        outs.append(out)
    for a, b in zip(_rec_files(outs[0]), _rec_files(outs[1])):
        assert same_output_bytes(a, b), a
    rf = RecordFile(outs[1])
    assert [codec.unpack(rf.read(i)).id for i in range(len(rf))] == list(range(len(rf)))


def _payloads(n):
    # the 5th holds RecordIO's magic word at an aligned offset: it is framed in parts
    magic = (0xCED7230A).to_bytes(4, "little")
    return [codec.pack_classification(float(i), b"x" * (i * 7) + (magic * 3 if i == 4 else b""),
                                      id=i) for i in range(n)]


@pytest.mark.parametrize("kernel", [True, False, "copies nothing"])
def test_append_segment_writes_what_write_does(tmp_path, monkeypatch, kernel):
    """Framed records appended from a segment (by copy_file_range, or read and written where
    it is missing, or where it copies nothing, as some filesystems' does) give the bytes and
    index of one write() each, also after a resume."""
    if not kernel:
        monkeypatch.delattr(os, "copy_file_range", raising=False)
    elif kernel == "copies nothing":
        monkeypatch.setattr(os, "copy_file_range", lambda *a: 0)
    payloads = _payloads(9)
    ref = str(tmp_path / "ref.rec")
    with RecordWriter(ref) as w:
        for i, p in enumerate(payloads):
            w.write(i * 3, p)
        w.finish()
        w.publish()
    seg = str(tmp_path / "seg")
    with open(seg, "wb") as f:
        sizes = []
        for p in payloads:
            data = b"".join(codec.frame(p))
            sizes.append(len(data))
            f.write(data)
    out = str(tmp_path / "out.rec")
    w = RecordWriter(out)
    fd = os.open(seg, os.O_RDONLY)
    try:
        w.write(0, payloads[0])
        w.append_segment(fd, sizes[0], [(3 * i, sizes[i]) for i in (1, 2, 3)])
        state = w.sync()
        w.write(99, b"dropped by the resume")
        w.suspend()
        w = RecordWriter(out, resume=state)
        w.append_segment(fd, sum(sizes[:4]), [(3 * i, sizes[i]) for i in range(4, 9)])
        w.finish()
        w.publish()
    finally:
        os.close(fd)
    for a, b in zip(_rec_files(ref, False), _rec_files(out, False)):
        assert same_output_bytes(a, b), a


def test_a_short_segment_or_a_reused_key_is_refused(tmp_path):
    payloads = _payloads(2)
    seg = str(tmp_path / "seg")
    with open(seg, "wb") as f:
        f.write(b"".join(codec.frame(payloads[0])))
    n = os.path.getsize(seg)
    fd = os.open(seg, os.O_RDONLY)
    try:
        with RecordWriter(str(tmp_path / "a.rec")) as w:
            with pytest.raises(Exception, match="segment ended 8 bytes before"):
                w.append_segment(fd, 0, [(0, n + 8)])
        with RecordWriter(str(tmp_path / "b.rec")) as w:
            w.append_segment(fd, 0, [(0, n)])
            with pytest.raises(Exception, match="key 0 is used twice"):
                w.append_segment(fd, 0, [(0, n)])
    finally:
        os.close(fd)


def test_a_foreign_folder_in_the_segments_place_is_left_alone(voc40, tmp_path):
    """The segment folder's name holds something else (a file of the user's): the
    conversion refuses before writing, and touches nothing there."""
    out = str(tmp_path / "voc.rec")
    theirs = out + RecordWriter.PARTIAL + ".segments"
    os.makedirs(theirs)
    with open(os.path.join(theirs, "notes.txt"), "w") as f:
        f.write("mine")
    with pytest.raises(OutputError, match="segment folder"):
        convert(voc40, out, "voc", split="trainval", workers=2)
    assert os.listdir(theirs) == ["notes.txt"]
    assert not os.path.exists(out)


def test_a_crashed_runs_segments_are_cleared(voc40, tmp_path):
    """Segment files a killed run left (its own, by name) are removed by the next run."""
    out = str(tmp_path / "voc.rec")
    stale = out + RecordWriter.PARTIAL + ".segments"
    os.makedirs(stale)
    open(os.path.join(stale, "00000003" + recwriter.SEGMENT_SUFFIX), "wb").close()
    convert(voc40, out, "voc", split="trainval", workers=2)
    assert not os.path.exists(stale)
    assert len(RecordFile(out)) == 40
