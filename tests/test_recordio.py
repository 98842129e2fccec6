"""RecordIO container: byte compatibility with MXIndexedRecordIO and index validation."""
import os
import pickle

import mxnet as mx
import numpy as np
import pytest

from gluon_data.format import codec
from gluon_data.errors import CorruptRecordError, FormatError
from gluon_data.stores.recordio import RecordFile, RecordWriter, read_index

pytestmark = pytest.mark.reliability

MAGIC = codec.struct.pack("<I", codec.RECORDIO_MAGIC)
PAYLOADS = [b"first", MAGIC + b"with magic" + MAGIC, b"", b"x" * 1001, b"last!"]


def write_ours(path, payloads, keys=None):
    with RecordWriter(path) as w:
        for i, p in enumerate(payloads):
            w.write(keys[i] if keys else i, p)
        w.finish()
        w.publish()
    return path


def write_native(path, payloads, keys=None):
    w = mx.recordio.MXIndexedRecordIO(path[:-4] + ".idx", path, "w")
    for i, p in enumerate(payloads):
        w.write_idx(keys[i] if keys else i, p)
    w.close()
    return path


def read(path):
    with open(path, "rb") as f:
        return f.read()


def test_writer_output_is_byte_identical_to_mxindexedrecordio(tmp_path):
    ours = write_ours(str(tmp_path / "ours.rec"), PAYLOADS)
    native = write_native(str(tmp_path / "native.rec"), PAYLOADS)
    assert read(ours) == read(native)
    assert read(ours[:-4] + ".idx") == read(native[:-4] + ".idx")


def test_reader_reads_native_files_including_sparse_keys(tmp_path):
    keys = [10, 3, 7, 100, 5]
    path = write_native(str(tmp_path / "n.rec"), PAYLOADS, keys)
    f = RecordFile(path)
    assert len(f) == len(PAYLOADS)
    assert [f.read(i) for i in range(len(f))] == PAYLOADS
    assert f.read_key(100) == b"x" * 1001
    native = mx.recordio.MXIndexedRecordIO(path[:-4] + ".idx", path, "r")
    assert all(native.read_idx(k) == f.read_key(k) for k in keys)


def test_native_reader_reads_our_files(tmp_path):
    path = write_ours(str(tmp_path / "o.rec"), PAYLOADS)
    native = mx.recordio.MXIndexedRecordIO(path[:-4] + ".idx", path, "r")
    assert [native.read_idx(k) for k in native.keys] == PAYLOADS


def test_index_is_compact_and_survives_pickle(tmp_path):
    path = write_ours(str(tmp_path / "o.rec"), PAYLOADS)
    f = RecordFile(path)
    assert f._keys is None and f._offsets.dtype == np.int64  # dense keys are not stored
    f.read(0)
    g = pickle.loads(pickle.dumps(f))
    assert g._file._cur.owner is None and [g.read(i) for i in range(len(g))] == PAYLOADS


def test_writer_leaves_nothing_under_final_names_until_published(tmp_path):
    path = str(tmp_path / "a.rec")
    w = RecordWriter(path)
    w.write(0, b"abc")
    w.finish()
    assert not os.path.exists(path) and not os.path.exists(path[:-4] + ".idx")
    w.abort()
    assert os.listdir(tmp_path) == []
    with pytest.raises(ValueError):
        with RecordWriter(path) as w:
            w.write(0, b"abc")
            raise ValueError("boom")
    assert os.listdir(tmp_path) == []


def test_writer_refuses_to_overwrite(tmp_path):
    path = write_ours(str(tmp_path / "a.rec"), [b"a"])
    with pytest.raises(FileExistsError, match="overwrite"):
        RecordWriter(path)
    write_ours_over = RecordWriter(path, overwrite=True)
    write_ours_over.abort()


@pytest.mark.parametrize("content,match", [
    (b"", "no records"),
    (b"\n\n", "no records"),
    (b"0\t0\n1\n", "line 2"),
    (b"0\t0\nx\t16\n", "line 2.*not an integer"),
    (b"0\t0\n1\t16\t9\n", "3 fields"),
])
def test_garbled_index_names_file_and_line(tmp_path, content, match):
    path = write_ours(str(tmp_path / "a.rec"), [b"abcd", b"efgh"])
    with open(path[:-4] + ".idx", "wb") as f:
        f.write(content)
    with pytest.raises(FormatError, match=match) as e:
        RecordFile(path)
    assert e.value.path.endswith("a.idx")


def test_index_with_blank_lines_and_crlf_is_accepted(tmp_path):
    path = write_ours(str(tmp_path / "a.rec"), [b"abcd", b"efgh"])
    with open(path[:-4] + ".idx", "wb") as f:
        f.write(b"0\t0\r\n\r\n1\t12\r\n")
    assert [RecordFile(path).read(i) for i in range(2)] == [b"abcd", b"efgh"]


@pytest.mark.parametrize("lines,match", [
    (b"0\t0\n1\t-12\n", "negative"),
    (b"0\t0\n1\t13\n", "multiple of 4"),
    (b"0\t0\n1\t4096\n", "past the end"),
    (b"0\t0\n0\t12\n", "duplicate key"),
    (b"0\t0\n1\t4\n", "bad magic"),
])
def test_bad_offsets_are_rejected_on_open_or_read(tmp_path, lines, match):
    path = write_ours(str(tmp_path / "a.rec"), [b"abcd", b"efgh"])
    with open(path[:-4] + ".idx", "wb") as f:
        f.write(lines)
    with pytest.raises(FormatError, match=match):
        f = RecordFile(path)
        [f.read(i) for i in range(len(f))]


def test_missing_index_is_a_clear_error(tmp_path):
    path = write_ours(str(tmp_path / "a.rec"), [b"abcd"])
    os.remove(path[:-4] + ".idx")
    with pytest.raises(FileNotFoundError, match="a.idx"):
        RecordFile(path)
    with pytest.raises(FileNotFoundError, match="nope.rec"):
        RecordFile(str(tmp_path / "nope.rec"))


def test_index_shorter_than_data_is_detected(tmp_path):
    path = write_ours(str(tmp_path / "a.rec"), [b"abcd", b"efgh", b"ijkl"])
    with open(path[:-4] + ".idx", "wb") as f:
        f.write(b"0\t0\n1\t12\n")  # a killed writer: the last line never made it
    with pytest.raises(FormatError, match="shorter than the .rec"):
        RecordFile(path)
    with open(path[:-4] + ".idx", "wb") as f:
        f.write(b"0\t0\n1\t12\n2\t24\n")
    with pytest.raises(FormatError, match="promises 4"):
        RecordFile(path, expected_count=4)


@pytest.mark.parametrize("cut", [0, 3, 10])  # at a record boundary, mid-header, mid-payload
def test_truncated_rec_is_detected(tmp_path, cut):
    path = write_ours(str(tmp_path / "a.rec"), [b"abcd", b"efgh"])
    data = read(path)
    with open(path, "wb") as f:
        f.write(data[:len(data) - 12 + cut])
    with pytest.raises(FormatError):
        f = RecordFile(path)
        [f.read(i) for i in range(len(f))]


def test_corrupted_length_field_is_detected(tmp_path):
    path = write_ours(str(tmp_path / "a.rec"), [b"abcdabcd", b"efgh"])
    data = bytearray(read(path))
    data[4] = 4  # first record now claims 4 bytes instead of 8
    with open(path, "wb") as f:
        f.write(bytes(data))
    with pytest.raises(CorruptRecordError):
        f = RecordFile(path)
        payload = f.read(0)
        codec.unpack(payload + b"\0" * 20)  # a short payload can only pass unchecked
        f.read(1)


def test_read_index_parses_large_files_into_int64(tmp_path):
    p = tmp_path / "big.idx"
    n = 20000
    p.write_bytes(b"".join(b"%d\t%d\n" % (i, 16 * i) for i in range(n)))
    keys, offs = read_index(str(p))
    assert keys.dtype == offs.dtype == np.int64
    np.testing.assert_array_equal(offs, np.arange(n) * 16)


def _reference_index(content: bytes):
    """What the format allows, in plain Python: blank lines skipped, otherwise exactly two
    integers per line."""
    rows = []
    for line in content.split(b"\n"):
        fields = line.split()
        if not fields:
            continue
        if len(fields) != 2:
            return None
        try:
            rows.append([int(fields[0]), int(fields[1])])
        except ValueError:
            return None
    return np.array(rows, np.int64).reshape(-1, 2) if rows else None


@pytest.mark.parametrize("content", [
    b"0\t0\n1\t16\n", b"-3\t0\n7\t16\n", b"0\t0\n1\t16", b"0\t0\n\n1\t16\n",
    b"\t1 2 3\n5\t\n", b"1 2\t3\n4\t5\n", b"0\t0\n1\t1x\n", b"0\t \n1\t16\n",
    b"0\t0\t\n1\t16\n", b"0\t0\r\n1\t16\r\n", b" 0\t0\n1\t16\n", b"0\t+5\n",
])
def test_fast_and_general_index_parsers_agree_with_the_format(tmp_path, content):
    p = tmp_path / "x.idx"
    p.write_bytes(content)
    want = _reference_index(content)
    if want is None:
        with pytest.raises(FormatError):
            read_index(str(p))
    else:
        keys, offs = read_index(str(p))
        np.testing.assert_array_equal(np.stack([keys, offs], 1), want)


def test_scan_and_view_give_every_payload_in_index_order(tmp_path):
    payloads = PAYLOADS * 40 + [b"y" * 300_000]
    path = write_ours(str(tmp_path / "a.rec"), payloads)
    f = RecordFile(path)
    assert [bytes(v) for v in f.scan(chunk_bytes=4096)] == payloads  # chunks < records
    assert [bytes(v) for v in f.scan()] == payloads
    assert [bytes(f.view(i)) for i in range(len(f))] == payloads == list(f)
    # an index listing records out of file order still reads each one correctly
    keys, offs = read_index(path[:-4] + ".idx")
    with open(path[:-4] + ".idx", "w") as out:
        out.write("".join("%d\t%d\n" % (k, o) for k, o in zip(keys[::-1], offs[::-1])))
    assert [bytes(v) for v in RecordFile(path).scan(chunk_bytes=8192)] == payloads[::-1]


def test_scan_of_a_damaged_file_names_the_record(tmp_path):
    path = write_ours(str(tmp_path / "a.rec"), [b"a" * 100] * 50)
    f = RecordFile(path)
    with open(path, "r+b") as fh:  # overwrite record 30's magic word
        fh.seek(f.offset(30))
        fh.write(b"\0\0\0\0")
    with pytest.raises(CorruptRecordError, match="bad magic") as e:
        list(RecordFile(path).scan())
    assert e.value.key == 30 and e.value.offset == f.offset(30)


def test_binary_index_is_written_used_and_ignored_when_stale_or_damaged(tmp_path):
    from gluon_data.format.recindex import _read_binary_index
    from gluon_data.stores.recordio import BINARY_INDEX_SUFFIX, write_binary_index
    path = write_ours(str(tmp_path / "a.rec"), PAYLOADS, keys=[3, 9, 12, 40, 41])
    idx = path[:-4] + ".idx"
    gdx = idx + BINARY_INDEX_SUFFIX
    assert os.path.exists(gdx)  # the writer leaves one beside every index
    keys, offs = _read_binary_index(idx)
    np.testing.assert_array_equal(keys, [3, 9, 12, 40, 41])
    np.testing.assert_array_equal(offs, read_index(idx, binary=False)[1])
    # a rewritten .idx (same size, different content) makes the copy stale: ignored
    text = read(idx).replace(b"3\t", b"4\t", 1)
    with open(idx, "wb") as f:
        f.write(text)
    assert _read_binary_index(idx) is None and RecordFile(path).key(0) == 4
    # damaged or truncated copies are ignored too; the .idx is the truth
    write_binary_index(idx)
    assert RecordFile(path).key(0) == 4
    for damage in (lambda b: b[:-5], lambda b: b"XXXX" + b[4:], lambda b: b[:10]):
        good = read(gdx)
        with open(gdx, "wb") as f:
            f.write(damage(good))
        assert _read_binary_index(idx) is None
        assert [RecordFile(path).read(i) for i in range(5)] == PAYLOADS
        with open(gdx, "wb") as f:
            f.write(good)
    # stock im2rec indexes get one on request, with implicit 0..n-1 keys stored compactly
    native = write_native(str(tmp_path / "n.rec"), PAYLOADS)
    out = write_binary_index(native[:-4] + ".idx")
    assert os.path.getsize(out) < 8 * 2 * len(PAYLOADS) + 64
    assert [RecordFile(native).read(i) for i in range(5)] == PAYLOADS
