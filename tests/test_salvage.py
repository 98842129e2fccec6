"""``gluon-data salvage`` keys each recovered record by its own header id: after a record in
the middle is lost, every other record is still read under the key it was written under, so
the readers' id == key check holds, ``verify`` passes and the item names follow their records;
a stock im2rec file (shuffled keys) gets back the index it had."""
import os
import shutil

import numpy as np
import pytest

from gluon_data import RecordFile
from gluon_data.arrays import SegmentationDataset
from gluon_data.cli import main
from gluon_data.stores.recordio import idx_path_for
from gluon_data.tools import salvage, verify


def _copy(rec: str, folder) -> str:
    """The ``.rec`` and every file beside it that shares its stem, copied into ``folder``."""
    stem = os.path.basename(rec)[:-4]
    src = os.path.dirname(rec)
    for name in os.listdir(src):
        if name.startswith(stem + "."):
            shutil.copy(os.path.join(src, name), str(folder))
    return os.path.join(str(folder), stem + ".rec")


def _damage(rec: str, position: int) -> None:
    """Flip 16 bytes inside the record at ``position``: its CRC-32 no longer matches."""
    f = RecordFile(rec)
    at = f.offset(position) + 40
    f.close()
    with open(rec, "r+b") as fh:
        fh.seek(at)
        data = fh.read(16)
        fh.seek(at)
        fh.write(bytes(b ^ 0xFF for b in data))


def _index(rec: str):
    with open(idx_path_for(rec)) as fh:
        return [tuple(int(x) for x in line.split("\t")) for line in fh]


def test_a_record_lost_in_the_middle_leaves_every_other_under_its_own_key(voc_rec, tmp_path):
    before = SegmentationDataset(voc_rec)
    n, names = len(before), list(before._names)
    rec = _copy(voc_rec, tmp_path)
    lost = n // 2
    _damage(rec, lost)
    assert not verify(rec).ok
    report = salvage(rec, overwrite=True)
    assert report.records == n - 1 and len(report.damaged) == 1
    kept = [k for k in range(n) if k != lost]
    assert [k for k, _ in _index(rec)] == kept
    assert verify(rec).ok and verify(rec, deep=True).ok
    after = SegmentationDataset(rec)
    assert len(after) == n - 1 and after._names == [names[k] for k in kept]
    for i, k in enumerate(kept):  # each position reads the record its key names
        img, mask = after[i]
        want_img, want_mask = before[k]
        assert np.array_equal(img, want_img) and np.array_equal(mask, want_mask)
    assert main(["verify", rec]) == 0


def test_a_stock_im2rec_file_gets_back_the_index_it_had(im2rec_rec, tmp_path):
    rec = _copy(im2rec_rec, tmp_path)
    original = _index(rec)
    assert [k for k, _ in original] != sorted(k for k, _ in original)  # shuffled keys
    os.remove(idx_path_for(rec))
    report = salvage(rec)
    assert report.records == len(original) and report.damaged == []
    assert _index(rec) == original


def test_records_whose_ids_repeat_are_keyed_by_position(tmp_path):
    """A stock writer that left every header id 0: the keys are the positions."""
    from gluon_data import RecordWriter
    from gluon_data.format import codec
    rec = str(tmp_path / "zeros.rec")
    with RecordWriter(rec) as w:
        for i in range(5):
            w.write(i, codec.pack_classification(float(i), b"image-%d" % i, id=0,
                                                 checksum=False))
        w.finish()
        w.publish()
    offsets = [off for _, off in _index(rec)]
    os.remove(idx_path_for(rec))
    assert salvage(rec).records == 5
    assert _index(rec) == list(enumerate(offsets))


def test_a_file_with_no_intact_record_is_refused_and_nothing_written(voc_rec, tmp_path):
    """Bytes that hold no record: an empty index (and metadata promising 0 records) would
    read as an empty dataset, so nothing is written and the error says why."""
    from gluon_data.errors import FormatError
    rec = _copy(voc_rec, tmp_path)
    idx, meta = idx_path_for(rec), rec[:-4] + ".meta.json"
    before = {p: open(p, "rb").read() for p in (idx, meta)}
    with open(rec, "wb") as fh:
        fh.write(os.urandom(4096).replace(b"\x0a\x23\xd7\xce", b"\0\0\0\0"))
    with pytest.raises(FormatError, match="no intact record") as e:
        salvage(rec, overwrite=True)
    assert e.value.path == rec
    assert {p: open(p, "rb").read() for p in (idx, meta)} == before
    assert not os.path.exists(idx + ".bak") and not os.path.exists(meta + ".bak")


def test_an_empty_rec_is_refused_and_no_index_made(tmp_path):
    from gluon_data.errors import FormatError
    rec = str(tmp_path / "e.rec")
    open(rec, "wb").close()
    with pytest.raises(FormatError, match="an empty file"):
        salvage(rec)
    assert not os.path.exists(idx_path_for(rec))
    assert main(["salvage", rec]) == 1 and not os.path.exists(idx_path_for(rec))


def test_a_shard_keeps_its_keys_and_the_names_of_its_records(voc_root, tmp_path):
    """A shard's keys continue its split's (shard 1 of 3 starts past shard 0's items): a lost
    index is rebuilt as it was, and after a lost record each other keeps its name."""
    from gluon_data import convert
    convert(voc_root, str(tmp_path / "s.rec"), "voc", split="trainval", shards=3)
    rec = str(tmp_path / "s-00001-of-00003.rec")
    original = _index(rec)
    assert original[0][0] > 0
    names = list(SegmentationDataset(rec)._names)
    os.remove(idx_path_for(rec))
    salvage(rec)
    assert _index(rec) == original and SegmentationDataset(rec)._names == names
    _damage(rec, 1)
    report = salvage(rec, overwrite=True)
    assert [k for k, _ in _index(rec)] == [k for k, _ in original[:1] + original[2:]]
    assert SegmentationDataset(rec)._names == names[:1] + names[2:]
    assert report.shard == (1, 3) and "--resume to redo the shard" in str(report)


def test_a_second_salvage_keeps_the_names_with_their_records(voc_rec, tmp_path):
    """The first salvage lists the names in its index's order (keys with a gap); the second
    pairs them with the records through that index, not by key."""
    names = list(SegmentationDataset(voc_rec)._names)
    rec = _copy(voc_rec, tmp_path)
    _damage(rec, 2)
    salvage(rec, overwrite=True)
    _damage(rec, 4)  # position 4 of the salvaged index: the record keyed 5
    salvage(rec, overwrite=True)
    kept = [k for k in range(len(names)) if k not in (2, 5)]
    assert [k for k, _ in _index(rec)] == kept
    assert SegmentationDataset(rec)._names == [names[k] for k in kept]
    assert verify(rec).ok


def test_a_second_copy_of_a_record_is_left_out(voc_rec, tmp_path):
    """A checksummed dataset keys its records by their ids: a record found twice (its bytes
    appended again) is indexed once and the copy reported."""
    rec = _copy(voc_rec, tmp_path)
    f = RecordFile(rec)
    n, start, end = len(f), f.offset(3), f.offset(4)
    f.close()
    with open(rec, "r+b") as fh:
        copy = fh.read()[start:end]
        fh.seek(0, 2)
        at = fh.tell()
        fh.write(copy)
    os.remove(idx_path_for(rec))
    report = salvage(rec)
    assert report.records == n and report.duplicates == [at]
    assert "repeating an id" in str(report)
    assert [k for k, _ in _index(rec)] == list(range(n)) and verify(rec).ok


def _stock(path: str, ids, keys=None) -> str:
    """A stock file (no metadata): records with header ``ids``, written under ``keys``."""
    from gluon_data import RecordWriter
    from gluon_data.format import codec
    with RecordWriter(path) as w:
        for k, i in zip(keys if keys is not None else range(len(ids)), ids):
            w.write(k, codec.pack_classification(1.0, b"image %d" % i, id=i, checksum=False))
        w.finish()
        w.publish()
    return path


def test_a_stock_index_cut_short_keeps_its_keys_where_ids_are_not_keys(tmp_path):
    """Records written under keys 0..7 whose ids are something else (a COCO id): the lines
    of the index that survived keep their keys, the records after them continue them."""
    rec = _stock(str(tmp_path / "coco.rec"), [1000 + 7 * i for i in range(8)])
    original = _index(rec)
    with open(idx_path_for(rec), "w") as fh:
        fh.write("".join("%d\t%d\n" % kv for kv in original[:3]) + "3\t")
    salvage(rec, overwrite=True)
    assert _index(rec) == original


def test_ids_too_large_for_an_index_are_not_used_as_keys(tmp_path):
    rec = _stock(str(tmp_path / "hash.rec"), [(1 << 63) + i for i in range(4)])
    offsets = [off for _, off in _index(rec)]
    os.remove(idx_path_for(rec))
    salvage(rec)
    assert _index(rec) == list(enumerate(offsets)) and RecordFile(rec).keys().tolist() == [
        0, 1, 2, 3]


def test_stats_after_salvage_say_they_count_the_records_lost(voc_rec, tmp_path, capsys):
    """The class statistics are the conversion's, counted over every record it wrote: after a
    salvage drops one, ``stats`` says so (a note, ``counted_records`` in ``--json``) rather
    than passing them off as the remaining records' own; a second salvage keeps the count."""
    import json
    n = len(SegmentationDataset(voc_rec))
    rec = _copy(voc_rec, tmp_path)
    assert main(["stats", rec, "--json"]) == 0
    before = json.loads(capsys.readouterr().out)
    assert before["records"] == before["counted_records"] == n
    assert main(["stats", rec]) == 0 and "note:" not in capsys.readouterr().out
    _damage(rec, n // 2)
    salvage(rec, overwrite=True)
    assert main(["stats", rec, "--json"]) == 0
    after = json.loads(capsys.readouterr().out)
    assert (after["records"], after["counted_records"]) == (n - 1, n)
    assert after["classes"] == before["classes"]  # the same counts, now labelled as such
    assert main(["stats", rec]) == 0
    text = capsys.readouterr().out
    assert "counted at conversion over %d records; %d remain" % (n, n - 1) in text, text
    _damage(rec, 0)
    salvage(rec, overwrite=True)
    assert main(["stats", rec, "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert (again["records"], again["counted_records"]) == (n - 2, n)


def test_verify_of_a_cut_rec_says_nothing_was_checked_and_salvage_recovers(voc_rec, tmp_path):
    """A ``.rec`` cut short (its index points past its end) cannot be read as a dataset:
    ``verify`` says so ("could not be read, no record checked"), not "0 records, 0 checked"
    as if it were empty, and names salvage, which then keeps the records before the cut."""
    n = len(SegmentationDataset(voc_rec))
    rec = _copy(voc_rec, tmp_path)
    f = RecordFile(rec)
    cut = f.offset(n // 2) + 20  # inside the record at n // 2
    f.close()
    os.truncate(rec, cut)
    report = verify(rec)
    assert not report.ok and not report.opened and report.checked == 0
    text = str(report)
    assert "could not be read, no record checked: 1 problem(s)" in text.splitlines()[0], text
    assert "0 records" not in text and "salvage" in text
    assert salvage(rec, overwrite=True).records == n // 2
    again = verify(rec)
    assert again.ok and again.opened and again.records == n // 2
