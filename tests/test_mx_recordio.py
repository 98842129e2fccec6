"""gluon_data.mx_recordio: ``mxnet.recordio`` without MXNet.

The core tests need no MXNet (they run on Python 3.13 with numpy 2 too); the cross-checks
against the real ``mxnet.recordio`` (``mx`` fixture) skip where MXNet is not installed.
"""
import numbers
import os
import pickle
import struct
import subprocess
import sys
import threading

import cv2
import numpy as np
import pytest

from gluon_data import mx_recordio as recordio
from gluon_data.errors import CorruptRecordError, DecodeError, FormatError
from gluon_data.format import codec

MAGIC = struct.pack("<I", 0xCED7230A)


@pytest.fixture
def mx():
    return pytest.importorskip("mxnet")


def _payloads(seed=0):
    """Payloads of every shape the framing cares about: empty, unaligned lengths, the magic
    word at aligned offsets (split records: first/middle/last parts, empty parts) and not."""
    rng = np.random.default_rng(seed)
    rand = lambda n: rng.integers(0, 256, n, dtype=np.uint8).tobytes()  # noqa: E731
    return [
        b"", b"a", b"ab", b"abc", b"abcd", rand(1001),
        MAGIC, MAGIC + MAGIC, b"ab" + MAGIC, b"abcd" + MAGIC + b"xy",
        rand(8) + MAGIC + rand(12) + MAGIC + rand(5),
        MAGIC + rand(40) + MAGIC, rand(3) + MAGIC + rand(4),
        rand(150_000),
        rand(80_000) + MAGIC + rand(70_001),
    ]


def _write(path_prefix, payloads, key_type=int):
    w = recordio.MXIndexedRecordIO(path_prefix + ".idx", path_prefix + ".rec", "w",
                                   key_type=key_type)
    tells = [w.tell()]
    for i, p in enumerate(payloads):
        w.write_idx(key_type(i), p)
        tells.append(w.tell())
    w.close()
    return tells


def _reader(prefix, **kw):
    return recordio.MXIndexedRecordIO(prefix + ".idx", prefix + ".rec", "r", **kw)


def _headers(path):
    """``(offset, cflag, length)`` of every part header of a .rec, walked by hand."""
    data = open(path, "rb").read()
    out, pos = [], 0
    while pos < len(data):
        magic, lrec = struct.unpack_from("<II", data, pos)
        assert magic == 0xCED7230A, pos
        length = lrec & ((1 << 29) - 1)
        out.append((pos, lrec >> 29, length))
        pos += 8 + length + (-length) % 4
    return out


# --------------------------------------------------------------------------- import
def test_module_imports_neither_mxnet_nor_the_gluon_layer():
    code = ("import sys, gluon_data.mx_recordio\n"
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('mxnet', 'gluoncv')\n"
            "             or m.startswith(('gluon_data.gluon', 'gluon_data.cli')))\n"
            "assert not bad, bad\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.dirname(os.path.dirname(recordio.__file__))]
        + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr


# --------------------------------------------------------------------------- pack / unpack
@pytest.mark.parametrize("label", [3, 2.5, np.float32(1.5), np.int64(7), True])
def test_pack_unpack_scalar_label(label):
    s = recordio.pack(recordio.IRHeader(5, label, 123456789012, 42), b"payload")
    assert struct.unpack("<IfQQ", s[:24]) == (0, float(label), 123456789012, 42)  # flag -> 0
    assert s[24:] == b"payload"
    header, rest = recordio.unpack(s)
    assert header == (0, float(label), 123456789012, 42) and type(header.label) is float
    assert rest == b"payload"


@pytest.mark.parametrize("label", [[1, 2], (0.5,), np.arange(6, dtype=np.float64).reshape(2, 3),
                                   np.array([3.25], np.float32), np.array(4.0)])
def test_pack_unpack_array_label(label):
    vec = np.asarray(label, np.float32).ravel()
    s = recordio.pack(recordio.IRHeader(0, label, 9, 0), b"\x00img")
    assert struct.unpack("<IfQQ", s[:24]) == (vec.size, 0.0, 9, 0)
    assert s[24:24 + 4 * vec.size] == vec.astype("<f4").tobytes()
    header, rest = recordio.unpack(s)
    assert header.flag == vec.size and header.id == 9 and rest == b"\x00img"
    assert header.label.dtype == np.float32 and np.array_equal(header.label, vec)


def test_empty_label_vector_is_packed_as_stock_does():
    s = recordio.pack(recordio.IRHeader(0, [], 1, 0), b"x")
    assert recordio.unpack(s) == ((0, 0.0, 1, 0), b"x")


def test_labels_beyond_float32_are_stored_as_stock_stores_them():
    # the bytes stock mxnet 1.9.1 writes (its native struct 'f' rounds 1e39 to inf)
    assert recordio.pack(recordio.IRHeader(0, 1e39, 0, 0), b"x").hex() == \
        "000000000000807f" + "00" * 16 + "78"
    assert recordio.pack(recordio.IRHeader(0, -1e39, 0, 0), b"x")[4:8].hex() == "000080ff"
    assert recordio.pack(recordio.IRHeader(0, 3.4028235e38, 0, 0), b"x")[4:8].hex() == "ffff7f7f"
    nan = recordio.pack(recordio.IRHeader(0, np.nan, 0, 0), b"")
    assert np.isnan(recordio.unpack(nan)[0].label)
    header, _ = recordio.unpack(recordio.pack(recordio.IRHeader(0, [1e39, 1], 0, 0), b""))
    assert header.label.tolist() == [np.inf, 1.0]


def test_keys_beyond_int64_are_kept_exactly(tmp_path):
    """Stock writes ``str(key)`` and reads ``int(text)``: any integer key, never clamped (the
    C parser saturates at 2**63 - 1, which handed out another key's record)."""
    keys = [2**63 + 5, 2**70, 2**71, -5, -2**63, 2**63 - 1, -2**64 - 3, 0]
    prefix = str(tmp_path / "k")
    w = recordio.MXIndexedRecordIO(prefix + ".idx", prefix + ".rec", "w")
    for i, k in enumerate(keys):
        w.write_idx(k, b"record_%d" % i)
    w.close()
    assert open(prefix + ".idx").read().split("\n")[0] == "%d\t0" % (2**63 + 5)
    r = _reader(prefix)
    assert r.keys == keys
    assert [r.read_idx(k) for k in keys] == [b"record_%d" % i for i in range(len(keys))]
    with pytest.raises(recordio.MissingKeyError):
        r.read_idx(2**63 + 6)
    # the int64 readers refuse such an index, naming the line, instead of clamping it
    from gluon_data.format.recindex import read_index, write_binary_index
    with pytest.raises(FormatError, match=r"line 1 .*does not fit a 64-bit"):
        read_index(prefix + ".idx", binary=False)
    with pytest.raises(FormatError, match=r"line 1 "):
        write_binary_index(prefix + ".idx")
    # an int64 index at the limits still parses exactly, on the fast path's arrays
    with open(prefix + ".idx", "w") as f:
        f.write("%d\t0\n%d\t16\n" % (2**63 - 1, -2**63))
    keys64, offsets = read_index(prefix + ".idx", binary=False)
    assert keys64.dtype == np.int64 and keys64.tolist() == [2**63 - 1, -2**63]
    with open(prefix + ".idx", "w") as f:
        f.write("0\t%d\n" % 2**64)
    with pytest.raises(FormatError, match="line 1 .*offset"):
        _reader(prefix)


def test_pack_refuses_text_and_non_buffers():
    with pytest.raises(TypeError, match="str"):
        recordio.pack(recordio.IRHeader(0, 1, 0, 0), "text")
    with pytest.raises(TypeError):
        recordio.pack(recordio.IRHeader(0, 1, 0, 0), 5)  # bytes(5) would be 5 zero bytes


def test_unpack_rejects_short_records():
    with pytest.raises(CorruptRecordError, match="shorter than the 24-byte IRHeader"):
        recordio.unpack(b"\x00" * 10)
    s = recordio.pack(recordio.IRHeader(0, [1, 2, 3], 0, 0), b"")
    with pytest.raises(CorruptRecordError, match="label vector of 3 floats"):
        recordio.unpack(s[:30])


def test_unpack_checks_the_crc_of_gluon_data_records():
    s = codec.pack_classification(4, b"imagebytes", id=3, checksum=True)
    header, rest = recordio.unpack(s)
    assert (header.flag, header.label, header.id, rest) == (0, 4.0, 3, b"imagebytes")
    bad = s[:-1] + bytes([s[-1] ^ 1])
    with pytest.raises(CorruptRecordError, match="checksum mismatch"):
        recordio.unpack(bad)


def _image(h=24, w=32, seed=0):
    """A smooth BGR picture (JPEG keeps it within a few levels), different for each seed."""
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float64)
    img = np.stack([xx * 255 / (w - 1), yy * 255 / (h - 1),
                    127.5 + 120 * np.sin((xx + 3 * yy) / 9 + seed)], axis=2)
    return np.ascontiguousarray(np.round(img).astype(np.uint8))


def test_pack_img_unpack_img():
    img = _image()
    header, out = recordio.unpack_img(recordio.pack_img(recordio.IRHeader(0, 2, 1, 0), img,
                                                        quality=3, img_fmt=".png"))
    assert header == (0, 2.0, 1, 0) and np.array_equal(out, img)
    s = recordio.pack_img(recordio.IRHeader(0, [1, 2], 1, 0), img, quality=95)
    assert recordio.unpack(s)[1][:2] == b"\xff\xd8"
    header, out = recordio.unpack_img(s)
    assert list(header.label) == [1, 2] and out.shape == img.shape
    assert np.abs(out.astype(int) - img).mean() < 5
    assert recordio.unpack_img(s, 0)[1].shape == img.shape[:2]
    assert np.array_equal(recordio.unpack_img(s, 1)[1], out)


def test_unpack_img_raises_instead_of_none_or_grey():
    h = recordio.IRHeader(0, 0, 0, 0)
    jpg = recordio.pack_img(h, _image(64, 64))
    png = recordio.pack_img(h, _image(), img_fmt=".png")
    for bad, match in [(recordio.pack(h, b""), "empty"),
                       (recordio.pack(h, b"not an image at all"), "not an image"),
                       (jpg[:len(jpg) // 2], "truncated JPEG"),
                       (png[:-20], "truncated PNG")]:
        with pytest.raises(DecodeError, match=match):
            recordio.unpack_img(bad)


# --------------------------------------------------------------------------- files
def test_file_bytes_are_dmlc_recordio(tmp_path):
    """The bytes stock mxnet 1.9.1 writes for these seven records (split records: cflag
    1/2/3; unaligned magic not split; zero padding to 4 bytes)."""
    path = str(tmp_path / "b.rec")
    w = recordio.MXRecordIO(path, "w")
    for p in [b"", MAGIC, b"ab" + MAGIC, b"abcd" + MAGIC + b"xy", MAGIC + MAGIC,
              b"abcd" + MAGIC, b"x" * 3]:
        w.write(p)
    w.close()
    assert open(path, "rb").read().hex() == (
        "0a23d7ce000000000a23d7ce000000200a23d7ce000000600a23d7ce0600000061620a23d7ce00000a23"
        "d7ce04000020616263640a23d7ce02000060787900000a23d7ce000000200a23d7ce000000400a23d7ce"
        "000000600a23d7ce04000020616263640a23d7ce000000600a23d7ce0300000078787800")


def test_indexed_write_then_read(tmp_path):
    prefix = str(tmp_path / "data")
    payloads = _payloads()
    tells = _write(prefix, payloads)
    assert tells[0] == 0 and all(b > a for a, b in zip(tells, tells[1:]))
    assert tells[-1] == os.path.getsize(prefix + ".rec")
    assert open(prefix + ".idx").read() == "".join(
        "%d\t%d\n" % (i, t) for i, t in enumerate(tells[:-1]))

    r = _reader(prefix)
    assert r.keys == list(range(len(payloads)))
    assert r.idx == dict(enumerate(tells[:-1]))
    for i in np.random.default_rng(1).permutation(len(payloads)):
        assert r.read_idx(int(i)) == payloads[i], i
    r.reset()
    assert r.tell() == 0
    got = []
    while True:
        rec = r.read()
        if rec is None:
            break
        got.append(rec)
        assert r.tell() == tells[len(got)]
    assert got == payloads and r.read() is None
    # unlike stock, read_idx still works after read() reached the end
    assert r.read_idx(3) == payloads[3]
    assert r.read() == payloads[4]            # read() continues after read_idx's record
    r.seek(10)
    assert r.tell() == tells[10] and r.read() == payloads[10]
    r.close()
    assert not r.is_open


def test_split_records_are_written_in_parts_and_read_whole(tmp_path):
    prefix = str(tmp_path / "split")
    payloads = [b"abcd" + MAGIC + b"xy", MAGIC + b"1234" + MAGIC + b"56789", b"ab" + MAGIC]
    _write(prefix, payloads)
    assert [(c, n) for _, c, n in _headers(prefix + ".rec")] == [
        (1, 4), (3, 2),                 # first part, last part
        (1, 0), (2, 4), (3, 5),         # empty first part, a middle part
        (0, 6)]                         # the magic at offset 2 is not aligned: one part
    r = _reader(prefix)
    assert [r.read_idx(i) for i in (2, 0, 1)] == [payloads[2], payloads[0], payloads[1]]
    r.reset()
    assert [r.read(), r.read(), r.read(), r.read()] == payloads + [None]


def test_plain_reader_reads_large_and_small_records_in_sequence(tmp_path):
    path = str(tmp_path / "plain.rec")
    rng = np.random.default_rng(7)
    big = [rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in (500_000, 1_500_001)]
    payloads = [b"%d" % i * (i % 7) for i in range(3000)] + _payloads(2) + [
        b"z" * 3_000_000, big[0] + MAGIC + big[1], MAGIC + big[1] + MAGIC + big[0]]
    with recordio.MXRecordIO(path, "w") as w:
        for p in payloads:
            w.write(p)
        assert w.tell() == os.path.getsize(path) + len(w._wbuf)
    r = recordio.MXRecordIO(path, "r")
    assert list(iter(r.read, None)) == payloads and r.read() is None
    assert r.tell() == os.path.getsize(path)


def test_an_index_of_some_records_only(tmp_path):
    """An index listing every third record (a subset of the .rec): each is read whole, split
    records whose later parts lie far beyond the first read too."""
    prefix = str(tmp_path / "sub")
    rng = np.random.default_rng(8)
    payloads = [rng.integers(0, 256, 90_000, dtype=np.uint8).tobytes() for _ in range(30)]
    payloads[3] = payloads[3] + MAGIC + payloads[4] * 30     # 2.8 MB, two parts
    tells = _write(prefix, payloads)
    with open(prefix + ".idx", "w") as f:
        f.writelines("%d\t%d\n" % (k, tells[k]) for k in range(0, 30, 3))
    r = _reader(prefix)
    assert r.keys == list(range(0, 30, 3))
    for k in [27, 3, 0, 12, 3, 6, 9]:
        assert r.read_idx(k) == payloads[k]
    r.seek(24)
    assert [r.read(), r.read(), r.read()] == payloads[24:27]   # read() walks every record


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_replaced_file_is_not_read_through_the_old_index(tmp_path):
    prefix = str(tmp_path / "rep")
    _write(prefix, [b"old %d" % i for i in range(4)])
    r = _reader(prefix)
    assert r.read_idx(2) == b"old 2"
    _write(str(tmp_path / "new"), [b"a much longer new record %d" % i for i in range(4)])
    os.replace(str(tmp_path / "new.rec"), prefix + ".rec")
    status, msg = _in_child(lambda: r.read_idx(2))       # the child opens the path again
    assert status == "error" and "replaced" in msg and "FormatError" in msg
    assert r.read_idx(3) == b"old 3"                     # the parent's descriptor: old file


def test_str_keys(tmp_path):
    prefix = str(tmp_path / "s")
    w = recordio.MXIndexedRecordIO(prefix + ".idx", prefix + ".rec", "w", key_type=str)
    for name in ["cat/1.jpg", "dog 2.jpg", "ünï.png"]:
        w.write_idx(name, name.encode() * 3)
    w.close()
    r = _reader(prefix, key_type=str)
    assert r.keys == ["cat/1.jpg", "dog 2.jpg", "ünï.png"]
    assert r.read_idx("dog 2.jpg") == b"dog 2.jpg" * 3


def test_read_idx_from_many_threads(tmp_path):
    prefix = str(tmp_path / "mt")
    rng = np.random.default_rng(3)
    payloads = [rng.integers(0, 256, int(n), dtype=np.uint8).tobytes()
                for n in rng.integers(0, 20_000, 200)]
    payloads[5] = payloads[5][:8] + MAGIC + payloads[5][12:]          # some split records
    payloads[77] = MAGIC + payloads[77] + MAGIC
    _write(prefix, payloads)
    r = _reader(prefix)
    barrier = threading.Barrier(8)
    errors = []

    def work(seed):
        order = np.random.default_rng(seed).integers(0, len(payloads), 400)
        barrier.wait()
        try:
            for i in order:
                if r.read_idx(int(i)) != payloads[i]:
                    errors.append((seed, int(i)))
        except Exception as e:  # pragma: no cover - reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=work, args=(s,)) for s in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_sequential_read_from_many_threads_hands_out_each_record_once(tmp_path):
    prefix = str(tmp_path / "seq")
    payloads = [b"record %d " % i * (1 + i % 50) for i in range(2000)]
    _write(prefix, payloads)
    r = _reader(prefix)
    seen = [[] for _ in range(8)]

    def work(out):
        for rec in iter(r.read, None):
            out.append(rec)

    threads = [threading.Thread(target=work, args=(out,)) for out in seen]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(sum(seen, [])) == sorted(payloads)


def _in_child(fn):
    """Run ``fn()`` in a forked child; its return value (or error) comes back through a pipe."""
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(rfd)
        try:
            try:
                out = ("ok", fn())
            except BaseException as e:
                out = ("error", repr(e))
            with os.fdopen(wfd, "wb") as f:
                pickle.dump(out, f)
        finally:
            os._exit(0)
    os.close(wfd)
    with os.fdopen(rfd, "rb") as f:
        data = f.read()
    os.waitpid(pid, 0)
    assert data, "the child died without an answer"
    return pickle.loads(data)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_forked_child_reads_without_moving_the_parent(tmp_path):
    prefix = str(tmp_path / "fork")
    payloads = _payloads(4)
    _write(prefix, payloads)
    r = _reader(prefix)
    assert r.read() == payloads[0] and r.read() == payloads[1]

    def child():
        rest = list(iter(r.read, None))  # continues where the parent stood at the fork
        ok = all(r.read_idx(i) == p for i, p in enumerate(payloads))
        return ok, rest == payloads[2:], r._fd.fd()

    status, (ok, rest_ok, child_fd) = _in_child(child)
    assert status == "ok" and ok and rest_ok
    assert child_fd != r._fd.fd()          # a descriptor of its own
    assert r.read() == payloads[2]         # the parent's position did not move
    assert r.read_idx(len(payloads) - 1) == payloads[-1]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_forked_writer_refuses_to_write_and_never_flushes_the_parents_data(tmp_path):
    prefix = str(tmp_path / "fw")
    w = recordio.MXIndexedRecordIO(prefix + ".idx", prefix + ".rec", "w")
    for i in range(10):
        w.write_idx(i, b"rec%d" % i)

    def child():
        try:
            w.write(b"from the child")
            return "wrote"
        except RuntimeError as e:
            w.close()  # the child's copy of the buffers must not reach the file
            return str(e)

    status, msg = _in_child(child)
    assert status == "ok" and "multiple processes" in msg
    w.write_idx(10, b"rec10")
    w.close()
    r = _reader(prefix)
    assert r.keys == list(range(11))
    assert list(iter(r.read, None)) == [b"rec%d" % i for i in range(11)]


def test_pickling(tmp_path):
    prefix = str(tmp_path / "p")
    payloads = _payloads(5)
    _write(prefix, payloads)
    r = _reader(prefix)
    r.read()
    copy = pickle.loads(pickle.dumps(r))
    assert copy.is_open and copy.keys == r.keys and copy.idx_path == r.idx_path
    assert copy.read() == payloads[0]      # the copy reopens, from the start (as stock)
    assert copy.read_idx(7) == payloads[7]
    assert r.read() == payloads[1]         # the original stays open (stock closes it)
    r.close()
    closed = pickle.loads(pickle.dumps(r))
    assert not closed.is_open
    plain = recordio.MXRecordIO(prefix + ".rec", "r")
    assert pickle.loads(pickle.dumps(plain)).read() == payloads[0]

    w = recordio.MXIndexedRecordIO(str(tmp_path / "w.idx"), str(tmp_path / "w.rec"), "w")
    w.write_idx(0, b"x")
    with pytest.raises(TypeError, match="truncate"):
        pickle.dumps(w)
    w.close()
    assert not pickle.loads(pickle.dumps(w)).is_open
    assert _reader(str(tmp_path / "w")).read_idx(0) == b"x"


# --------------------------------------------------------------------------- bad input
def _damaged(tmp_path, payloads=None):
    prefix = str(tmp_path / "bad")
    payloads = payloads or [b"r%03d" % i * 25 for i in range(6)]
    tells = _write(prefix, payloads)
    return prefix, payloads, tells


def test_truncated_file_names_the_path_key_and_offset(tmp_path):
    prefix, payloads, tells = _damaged(tmp_path)
    with open(prefix + ".rec", "r+b") as f:
        f.truncate(tells[5] + 20)                      # the last record cut short
    r = _reader(prefix)
    assert r.read_idx(4) == payloads[4]
    with pytest.raises(CorruptRecordError) as e:
        r.read_idx(5)
    assert prefix + ".rec" in str(e.value) and "record 5" in str(e.value)
    assert e.value.offset == tells[5] and "truncated" in str(e.value)
    r.seek(4)
    assert r.read() == payloads[4]
    with pytest.raises(CorruptRecordError, match="truncated") as e:
        r.read()
    assert e.value.key == 5 and e.value.path == prefix + ".rec"
    with open(prefix + ".rec", "r+b") as f:
        f.truncate(tells[5] + 3)                       # inside the header
    with pytest.raises(CorruptRecordError, match="truncated record header"):
        _reader(prefix).read_idx(5)
    with open(prefix + ".rec", "r+b") as f:
        f.truncate(tells[4])                           # before the last two records
    with pytest.raises(CorruptRecordError, match="past the data") as e:
        _reader(prefix).read_idx(5)
    assert e.value.offset == tells[5]


def test_corrupt_bytes_are_errors_not_garbage(tmp_path):
    prefix, payloads, tells = _damaged(tmp_path)
    data = bytearray(open(prefix + ".rec", "rb").read())
    data[tells[1]:tells[1] + 8] = b"\xff" * 8          # header of record 1: garbage
    data[tells[2]] ^= 0xFF                             # magic of record 2
    struct.pack_into("<I", data, tells[4] + 4, 500)    # length of record 4 runs into 5
    open(prefix + ".rec", "wb").write(bytes(data))
    r = _reader(prefix)
    assert r.read_idx(0) == payloads[0] and r.read_idx(3) == payloads[3]
    for key in (1, 2):
        with pytest.raises(CorruptRecordError, match="bad magic") as e:
            r.read_idx(key)
        assert (e.value.key, e.value.offset) == (key, tells[key])
    with pytest.raises(CorruptRecordError, match="next indexed record") as e:
        r.read_idx(4)
    assert (e.value.key, e.value.offset) == (4, tells[4])
    plain = recordio.MXRecordIO(prefix + ".rec", "r")
    assert plain.read() == payloads[0]
    with pytest.raises(CorruptRecordError, match="bad magic") as e:
        plain.read()
    assert e.value.offset == tells[1] and e.value.path == prefix + ".rec"
    assert "damaged here" in str(e.value) and "the index points" not in str(e.value)
    other = tmp_path / "not.rec"  # not RecordIO at all: said so, not blamed on an index
    other.write_bytes(b"\0" * 64)
    with pytest.raises(CorruptRecordError, match="this is not RecordIO"):
        recordio.MXRecordIO(str(other), "r").read()
    with open(prefix + ".idx", "w") as f:              # an index entry inside a record
        f.write("0\t%d\n1\t%d\n" % (tells[0], tells[0] + 8))
    with pytest.raises(CorruptRecordError):
        _reader(prefix).read_idx(1)


def test_index_and_key_errors(tmp_path):
    prefix, payloads, tells = _damaged(tmp_path)
    r = _reader(prefix)
    with pytest.raises(KeyError) as e:
        r.read_idx(99)
    assert isinstance(e.value, recordio.MissingKeyError) and e.value.args == (99,)
    assert prefix + ".idx" in str(e.value) and "99" in str(e.value)
    with pytest.raises(KeyError):
        r.seek(-1)
    assert r.read_idx(np.int64(2)) == payloads[2]      # numpy keys, as MXFaceDataset passes
    with open(prefix + ".idx", "a") as f:
        f.write("6\t12x\n")
    with pytest.raises(FormatError) as e:
        _reader(prefix)
    assert prefix + ".idx" in str(e.value) and "line 7" in str(e.value)
    with open(prefix + ".idx", "w") as f:
        f.write("a\t0\nb\n")
    with pytest.raises(FormatError, match="line 2"):
        _reader(prefix, key_type=str)
    os.remove(prefix + ".idx")
    with pytest.raises(FileNotFoundError, match="bad.idx"):
        _reader(prefix)
    with pytest.raises(FileNotFoundError, match="missing.rec"):
        recordio.MXRecordIO(str(tmp_path / "missing.rec"), "r")
    open(prefix + ".idx", "w").close()                 # an empty index: no records
    assert _reader(prefix).keys == []


def test_misuse_raises_as_stock_with_a_message(tmp_path):
    prefix, payloads, tells = _damaged(tmp_path)
    with pytest.raises(ValueError, match="Invalid flag"):
        recordio.MXRecordIO(prefix + ".rec", "a")
    r = _reader(prefix)
    with pytest.raises(AssertionError, match="opened for reading"):
        r.write(b"x")
    r.close()
    with pytest.raises(RuntimeError, match="closed"):
        r.read()
    assert r.read_idx(1) == payloads[1]                # as stock: read_idx reopens
    w = recordio.MXRecordIO(str(tmp_path / "w.rec"), "w")
    with pytest.raises(AssertionError, match="opened for writing"):
        w.read()
    with pytest.raises(TypeError, match="str"):
        w.write("text")
    w.close()
    with pytest.raises(RuntimeError, match="closed"):
        w.write(b"x")


def test_reset_of_a_writer_truncates(tmp_path):
    prefix = str(tmp_path / "t")
    w = recordio.MXIndexedRecordIO(prefix + ".idx", prefix + ".rec", "w")
    w.write_idx(0, b"old")
    w.reset()
    assert w.keys == [] and w.tell() == 0
    w.write_idx(7, b"new")
    w.close()
    r = _reader(prefix)
    assert r.keys == [7] and r.read() == b"new" and r.read() is None


# --------------------------------------------------------------------------- InsightFace
class FaceDataset:
    """InsightFace arcface_torch's ``MXFaceDataset`` (torch left out), over any ``recordio``
    module: the only change a user makes is the import."""

    def __init__(self, root_dir, recordio_module, imdecode):
        self.recordio, self.imdecode = recordio_module, imdecode
        path_imgrec = os.path.join(root_dir, "train.rec")
        path_imgidx = os.path.join(root_dir, "train.idx")
        self.imgrec = recordio_module.MXIndexedRecordIO(path_imgidx, path_imgrec, "r")
        s = self.imgrec.read_idx(0)
        header, _ = recordio_module.unpack(s)
        if header.flag > 0:
            self.header0 = (int(header.label[0]), int(header.label[1]))
            self.imgidx = np.array(range(1, int(header.label[0])))
        else:
            self.imgidx = np.array(list(self.imgrec.keys))

    def __getitem__(self, index):
        idx = self.imgidx[index]
        s = self.imgrec.read_idx(idx)
        header, img = self.recordio.unpack(s)
        label = header.label
        if not isinstance(label, numbers.Number):
            label = label[0]
        return self.imdecode(img), int(label)

    def __len__(self):
        return len(self.imgidx)


def _cv2_imdecode_rgb(buf):
    return cv2.cvtColor(cv2.imdecode(np.frombuffer(buf, np.uint8), cv2.IMREAD_COLOR),
                        cv2.COLOR_BGR2RGB)


def _write_face_rec(root, module, n_ids=4, per_id=3):
    """A face .rec laid out as InsightFace's (face2rec / ms1m): record 0's label is the range
    of identity records, records 1..N images (label: identity, a scalar or a vector), then
    one record per identity whose label is its image range."""
    os.makedirs(root, exist_ok=True)
    w = module.MXIndexedRecordIO(os.path.join(root, "train.idx"),
                                 os.path.join(root, "train.rec"), "w")
    n_img = n_ids * per_id
    w.write_idx(0, module.pack(module.IRHeader(2, [n_img + 1, n_img + 1 + n_ids], 0, 0), b""))
    images, labels = {}, {}
    for k in range(1, n_img + 1):
        ident = (k - 1) // per_id
        img = _image(112, 112, seed=k)
        label = float(ident) if k % 2 else [float(ident), 0.5 * k]
        w.write_idx(k, module.pack_img(module.IRHeader(0, label, k, 0), img, quality=95))
        images[k], labels[k] = img, ident
    for ident in range(n_ids):
        first = 1 + ident * per_id
        w.write_idx(n_img + 1 + ident,
                    module.pack(module.IRHeader(2, [first, first + per_id], 0, 0), b""))
    w.close()
    return images, labels


def test_insightface_dataset_reads_our_file(tmp_path):
    root = str(tmp_path / "faces")
    images, labels = _write_face_rec(root, recordio)
    ds = FaceDataset(root, recordio, _cv2_imdecode_rgb)
    assert ds.header0 == (13, 17) and len(ds) == 12
    for i in range(len(ds)):
        img, label = ds[i]
        k = i + 1
        jpeg = cv2.imencode(".jpg", images[k], [cv2.IMWRITE_JPEG_QUALITY, 95])[1].tobytes()
        assert label == labels[k] and np.array_equal(img, _cv2_imdecode_rgb(jpeg))
        assert np.abs(img.astype(int) - images[k][:, :, ::-1]).mean() < 5  # RGB of the BGR
    header, _ = recordio.unpack(ds.imgrec.read_idx(13 + 2))          # identity 2's range
    assert list(header.label) == [7, 10]


# --------------------------------------------------------------------------- vs mxnet
def _same_calls(module, prefix, payloads, keys=None, key_type=int):
    w = module.MXIndexedRecordIO(prefix + ".idx", prefix + ".rec", "w", key_type=key_type)
    tells = []
    for key, p in zip(keys or range(len(payloads)), payloads):
        w.write_idx(key, p)
        tells.append(w.tell())
    w.close()
    return tells


def _records(module):
    h = module.IRHeader
    img = _image(40, 56, seed=9)
    return _payloads(6) + [
        module.pack(h(0, 3, 17, 0), b"jpegbytes"),
        module.pack(h(0, [1.5, 2, 3], 18, 5), MAGIC + b"abcd" + MAGIC),
        module.pack(h(0, np.arange(4, dtype=np.float32), 2**40, 0), b"x"),
        module.pack(h(1, struct.unpack("<f", MAGIC)[0], 19, 0), b""),  # magic in the label
        module.pack_img(h(0, 7, 20, 0), img, quality=80),
        module.pack_img(h(0, [1, 2], 21, 0), img, quality=9, img_fmt=".png"),
    ]


def test_files_are_byte_identical_to_stock(mx, tmp_path):
    ours, stock = str(tmp_path / "ours"), str(tmp_path / "stock")
    payloads = _records(recordio)
    assert payloads == _records(mx.recordio)           # pack/pack_img: the same bytes
    assert _same_calls(recordio, ours, payloads) == _same_calls(mx.recordio, stock, payloads)
    for ext in (".rec", ".idx"):
        assert open(ours + ext, "rb").read() == open(stock + ext, "rb").read(), ext
    assert any(c in (1, 2, 3) for _, c, _ in _headers(ours + ".rec"))  # split records in it
    names = ["a b", "cat/1.jpg", "x-7"]
    _same_calls(recordio, ours + "s", payloads[:3], names, key_type=str)
    _same_calls(mx.recordio, stock + "s", payloads[:3], names, key_type=str)
    for ext in (".rec", ".idx"):
        assert open(ours + "s" + ext, "rb").read() == open(stock + "s" + ext, "rb").read()
    assert _reader(ours + "s", key_type=str).keys == names
    w1 = recordio.MXRecordIO(ours + ".plain", "w")
    w2 = mx.recordio.MXRecordIO(stock + ".plain", "w")
    for p in payloads:
        w1.write(p)
        w2.write(p)
    w1.close()
    w2.close()
    assert open(ours + ".plain", "rb").read() == open(stock + ".plain", "rb").read()


def _assert_same_unpack(a, b):
    (ha, sa), (hb, sb) = a, b
    assert (ha.flag, ha.id, ha.id2) == (hb.flag, hb.id, hb.id2) and sa == sb
    if ha.flag > 0:
        assert ha.label.dtype == hb.label.dtype and np.array_equal(ha.label, hb.label)
    else:
        assert ha.label == hb.label and type(ha.label) is type(hb.label)


def test_stock_reads_our_files_identically(mx, tmp_path):
    prefix = str(tmp_path / "ours")
    payloads = _records(recordio)
    _same_calls(recordio, prefix, payloads)
    r = mx.recordio.MXIndexedRecordIO(prefix + ".idx", prefix + ".rec", "r")
    assert r.keys == list(range(len(payloads)))
    for i in reversed(range(len(payloads))):
        assert r.read_idx(i) == payloads[i]
    r.reset()
    assert [r.read() for _ in payloads] == payloads and r.read() is None
    for p in payloads[-6:]:
        _assert_same_unpack(mx.recordio.unpack(p), recordio.unpack(p))
    for p in payloads[-2:]:
        for flag in (-1, 0, 1):
            assert np.array_equal(mx.recordio.unpack_img(p, flag)[1],
                                  recordio.unpack_img(p, flag)[1])


def test_we_read_stock_files_identically(mx, tmp_path):
    prefix = str(tmp_path / "stock")
    payloads = _records(mx.recordio)
    _same_calls(mx.recordio, prefix, payloads)
    stock = mx.recordio.MXIndexedRecordIO(prefix + ".idx", prefix + ".rec", "r")
    r = _reader(prefix)
    assert r.keys == stock.keys and r.idx == stock.idx
    for i in stock.keys:
        assert r.read_idx(i) == stock.read_idx(i) == payloads[i]
    r.reset()
    stock.reset()
    while True:
        a, b = r.read(), stock.read()
        assert a == b
        if a is None:
            break
    plain = recordio.MXRecordIO(prefix + ".rec", "r")
    assert list(iter(plain.read, None)) == payloads


@pytest.mark.parametrize("header", [(0, 3, 1, 0), (9, 2.5, 2**63, 2**64 - 1), (0, [1, 2], 3, 4),
                                    (0, np.float64(0.1), 5, 0), (0, [], 6, 0),
                                    (0, np.ones((2, 2)), 7, 0), (0, 1e39, 8, 0),
                                    (0, -1e39, 8, 0), (0, 3.4028236e38, 8, 0),
                                    (0, 3.4028235e38, 8, 0), (0, 2**70, 8, 0),
                                    (0, [1e39, 1], 8, 0)])
def test_pack_and_unpack_match_stock(mx, header):
    s = recordio.pack(recordio.IRHeader(*header), b"body" + MAGIC)
    assert s == mx.recordio.pack(mx.recordio.IRHeader(*header), b"body" + MAGIC)
    _assert_same_unpack(recordio.unpack(s), mx.recordio.unpack(s))


def test_keys_beyond_int64_are_the_same_with_either_module(mx, tmp_path):
    keys = [2**63 + 5, 2**70, 2**71, -5, -2**63, 2**63 - 1, -2**64 - 3]
    ours, stock = str(tmp_path / "ours"), str(tmp_path / "stock")
    _same_calls(recordio, ours, [b"r%d" % i for i in range(len(keys))], keys)
    _same_calls(mx.recordio, stock, [b"r%d" % i for i in range(len(keys))], keys)
    assert open(ours + ".idx", "rb").read() == open(stock + ".idx", "rb").read()
    a = _reader(stock)
    b = mx.recordio.MXIndexedRecordIO(ours + ".idx", ours + ".rec", "r")
    assert a.keys == b.keys == keys
    assert [a.read_idx(k) for k in keys] == [b.read_idx(k) for k in keys]


def test_insightface_dataset_is_the_same_with_either_module(mx, tmp_path):
    ours, stock = str(tmp_path / "ours"), str(tmp_path / "stock")
    _write_face_rec(ours, recordio)
    _write_face_rec(stock, mx.recordio)
    for ext in ("train.rec", "train.idx"):
        assert open(os.path.join(ours, ext), "rb").read() == \
            open(os.path.join(stock, ext), "rb").read()
    mx_imdecode = lambda b: mx.image.imdecode(b).asnumpy()  # noqa: E731  (arcface_torch's)
    a = FaceDataset(ours, recordio, _cv2_imdecode_rgb)
    b = FaceDataset(ours, mx.recordio, mx_imdecode)
    assert a.header0 == b.header0 and np.array_equal(a.imgidx, b.imgidx)
    for i in range(len(a)):
        (ia, la), (ib, lb) = a[i], b[i]
        assert la == lb and np.array_equal(ia, ib)
