"""The digest of a conversion's ``.rec`` taken as it is written: the bytes below every place
still to be filled are handed to the pool's starter, which hashes them beside the workers
(``GrowingDigest``), so the end of a conversion reads only its last megabytes. The facts
must be exactly :func:`file_facts` of the published file, and a file that cannot be read,
or a starter that is gone, is an error, never a digest of something else."""
import hashlib
import json
import os
import signal
import threading
from multiprocessing import Pipe

import pytest

from gluon_data import convert
from gluon_data.convert import loop, workerprocs
from gluon_data.convert.engines import start_encoder_pool, stop_pool
from gluon_data.convert.workers import EncoderPool
from gluon_data.convert.sample import make_voc
from gluon_data.errors import ConversionError, FormatError
from gluon_data.storage.fsutil import GrowingDigest, file_facts, start_writeback

pytestmark = pytest.mark.timeout(180)  # a digest never answered fails, never hangs the run


def _written(path, parts):
    """``parts`` appended to the file at ``path`` one by one, yielding its size after each."""
    with open(path, "wb") as f:
        for part in parts:
            f.write(part)
            f.flush()
            yield f.tell()


def test_a_growing_digest_is_the_files_facts(tmp_path):
    path = str(tmp_path / "out.rec.partial")
    parts = [os.urandom(n) for n in (0, 1, 4097, (4 << 20) + 3, 5)]
    digest = None
    for size in _written(path, parts):
        if digest is None:
            digest = GrowingDigest(path)
        digest.advance(size - 2 if size > 2 else size)  # never all of it: facts take the rest
    assert digest.facts(sum(map(len, parts))) == file_facts(path)
    digest.close()


def test_a_growing_digest_refuses_a_file_shorter_or_longer_than_its_writer_wrote(tmp_path):
    path = tmp_path / "out.rec.partial"
    path.write_bytes(b"x" * 100)
    digest = GrowingDigest(str(path))
    with pytest.raises(FormatError, match="ends at byte 100, before the 150"):
        digest.advance(150)
    digest.close()
    digest = GrowingDigest(str(path))
    with pytest.raises(FormatError, match="has 100 bytes, its writer wrote 60"):
        digest.facts(60)
    digest.close()


def test_a_growing_digest_refuses_what_is_not_a_regular_file(tmp_path):
    fifo = tmp_path / "out.rec.partial"
    os.mkfifo(fifo)
    with pytest.raises(FormatError):  # refused at once, never waited on
        GrowingDigest(str(fifo))


def test_starting_writeback_is_a_hint_that_never_fails(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"y" * 8192)
    fd = os.open(path, os.O_RDONLY)
    try:
        assert start_writeback(fd, 0, 8192) in (True, False)  # (a sandbox may refuse it)
    finally:
        os.close(fd)
    assert start_writeback(fd, 0, 8192) is False  # a closed descriptor: refused, no error


def test_the_starters_digest_thread_answers_each_file_or_why_not(tmp_path):
    """``_serve_digests`` as the starter runs it, on a socket pair: followed bytes, then the
    facts; a file that is gone answers its reason, and so does every later request for it."""
    path = str(tmp_path / "a.rec.partial")
    sizes = list(_written(path, [os.urandom(3000), os.urandom(70000), os.urandom(10)]))
    here, there = Pipe(duplex=True)
    server = threading.Thread(target=workerprocs._serve_digests, args=(there,), daemon=True)
    server.start()
    try:
        for message in (("follow", path, sizes[0]), ("follow", path, sizes[1]),
                        ("facts", path, sizes[2]),
                        ("follow", str(tmp_path / "gone"), 10),
                        ("facts", str(tmp_path / "gone"), 10)):
            workerprocs.send_pickled(here, message)
        assert here.poll(60)
        assert here.recv() == ("facts", path, file_facts(path))
        assert here.poll(60)
        kind, gone, why = here.recv()
        assert (kind, gone) == ("facts", str(tmp_path / "gone")) and isinstance(why, str), why
        assert "not found" in why or "No such file" in why, why
    finally:
        here.close()
        server.join(30)
    assert not server.is_alive()  # it ends with its socket


def test_a_starter_gone_before_it_gave_the_digest_is_an_error(tmp_path):
    """Asked for the facts, the starter is killed before it answers (stopped first, so it
    cannot): the wait ends in a ConversionError naming it, never a digest."""
    path = tmp_path / "out.rec.partial"
    path.write_bytes(b"z" * 1000)
    pool = start_encoder_pool(1)
    try:
        assert pool.submit(abs, -3).get() == 3  # started
        starter = pool._starter
        os.kill(starter.pid, signal.SIGSTOP)
        ticket = pool.file_facts(str(path), 1000)
        os.kill(starter.pid, signal.SIGKILL)
        with pytest.raises(ConversionError, match="ended with exit code -9 before it gave"):
            ticket.get()
        with pytest.raises(ConversionError, match="ended .exit code -9., and its workers"):
            pool.follow_file(str(path), 500)
    finally:
        stop_pool(pool)


def _no_threads(preload):  # a starter's set-up after which no thread can start
    def refuse(self):
        raise RuntimeError("can't start new thread")  # (a limit on threads or processes)
    threading.Thread.start = refuse


def test_where_the_starter_cannot_start_its_thread_the_parent_takes_the_digest(tmp_path):
    path = tmp_path / "out.rec.partial"
    path.write_bytes(os.urandom(50000))
    pool = EncoderPool(1, _no_threads)
    try:
        assert pool.submit(abs, -3).get() == 3  # the workers run as ever
        pool.follow_file(str(path), 20000)
        assert pool.file_facts(str(path), 50000).get() == file_facts(str(path))
        assert "can't start new thread" in pool._starter._no_digests
    finally:
        stop_pool(pool)


def test_a_conversion_hands_its_output_on_to_be_hashed_as_it_is_written(tmp_path,
                                                                        monkeypatch):
    """With the threshold at 1 byte, the bytes handed on to be hashed grow chunk by chunk,
    each offset within the output, and the digest recorded is the published file's."""
    voc = make_voc(str(tmp_path / "VOC2012"), num_images=40, size_range=(30, 60), seed=9)
    monkeypatch.setattr(loop, "FOLLOW_BYTES", 1)
    followed = []
    real = workerprocs.Starter.follow

    def follow(self, path, upto):
        followed.append((os.path.basename(path), upto))
        return real(self, path, upto)

    monkeypatch.setattr(workerprocs.Starter, "follow", follow)
    out = str(tmp_path / "out" / "train.rec")
    convert(voc, out, "voc", split="train", workers=2)
    size = os.path.getsize(out)
    assert len(followed) >= 3, followed
    assert {p for p, _ in followed} == {"train.rec.partial"}
    offsets = [u for _, u in followed]
    assert offsets == sorted(set(offsets)) and 0 < offsets[-1] <= size, offsets
    meta = json.load(open(os.path.join(str(tmp_path / "out"), "train.meta.json")))
    with open(out, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    assert digest in json.dumps(meta["done"]), meta["done"]


def test_the_same_bytes_and_digests_with_the_digest_followed_or_not(tmp_path, monkeypatch):
    """Followed in pieces of one byte or never (a threshold larger than the output), the
    outputs and their metadata are byte for byte the same."""
    voc = make_voc(str(tmp_path / "VOC2012"), num_images=30, size_range=(30, 60), seed=5)
    got = {}
    for name, threshold in (("every", 1), ("never", 1 << 40)):
        monkeypatch.setattr(loop, "FOLLOW_BYTES", threshold)
        out = str(tmp_path / name / "train.rec")
        convert(voc, out, "voc", split="train", workers=2)
        got[name] = [open(p, "rb").read() for p in (out, out[:-4] + ".idx")]
        with open(out[:-4] + ".meta.json") as f:
            got[name].append(json.load(f)["done"])
    assert got["every"] == got["never"]


def test_followed_through_skips_checkpoints_two_splits_and_a_resume(tmp_path, monkeypatch):
    """The hard cases of "final bytes" at once: items skipped (records renumbered by the
    parent), a checkpoint every 5 items (records copied by the parent inside a chunk), a
    train and a val split, and a run interrupted after a few hand-overs, then resumed (its
    partial files cut back to the checkpoint). Followed byte by byte, every output is the
    same, byte for byte, as a conversion that never followed, digests included."""
    voc = make_voc(str(tmp_path / "VOC2012"), num_images=90, size_range=(30, 80), seed=3)
    jpgs = sorted(os.listdir(os.path.join(voc, "JPEGImages")))
    for name in jpgs[3::11]:
        with open(os.path.join(voc, "JPEGImages", name), "wb") as f:
            f.write(b"not a jpeg")
    kw = dict(layout="voc", workers=2, val_ratio=0.3, on_error="skip", checkpoint_every=5)
    monkeypatch.setattr(loop, "FOLLOW_BYTES", 1)
    handed = []
    real = loop._Copies.follow

    def follow(self, w):
        before = dict(self.followed)
        real(self, w)
        if self.followed != before:
            handed.append(w.partial_path)
        if os.environ.get("GD_TEST_STOP") and len(handed) == 6:
            raise KeyboardInterrupt("stopped after 6 hand-overs")

    monkeypatch.setattr(loop._Copies, "follow", follow)
    out = str(tmp_path / "out" / "d.rec")
    monkeypatch.setenv("GD_TEST_STOP", "1")
    with pytest.raises(KeyboardInterrupt):
        convert(voc, out, **kw)
    monkeypatch.delenv("GD_TEST_STOP")
    report = convert(voc, out, resume=True, **kw)
    assert report.resumed and report.skipped, (report.resumed, report.skipped)
    assert len(handed) > 6 and len(set(handed)) == 2, handed  # both splits followed
    monkeypatch.setattr(loop, "FOLLOW_BYTES", 1 << 40)  # never
    convert(voc, str(tmp_path / "ref" / "d.rec"), **kw)
    names = sorted(f for f in os.listdir(str(tmp_path / "ref")) if not f.endswith(".gdx"))
    assert names == sorted(f for f in os.listdir(str(tmp_path / "out"))
                           if not f.endswith(".gdx"))
    for name in names:  # (a .gdx records its .idx's time: it differs)
        with open(os.path.join(str(tmp_path / "ref"), name), "rb") as a, \
                open(os.path.join(str(tmp_path / "out"), name), "rb") as b:
            assert a.read() == b.read(), name
