"""A rerun over a source whose files changed (same names, other content) never keeps or
resumes records of the old state: the plan digest binds each file's size and mtime (ns)."""
import os
import signal
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from gluon_data.convert import convert
from gluon_data.errors import ConversionError
from gluon_data.stores.lmdbio import LMDBFile
from gluon_data.stores.recordio import RecordFile
from gluon_data.convert.sample import make_voc
from gluon_data.convert.sharded import convert_sharded
from test_remote import BUCKET, s3, so  # noqa: F401 - moto's S3 server fixtures

from conftest import same_output_bytes

NAME = "2007_000002"  # the third item of trainval: shard 1 of 4 (8 items, 2 a shard)
SECOND = 1_800_000_000  # the mtime's whole seconds, kept across the rewrite


def _voc(root):
    return make_voc(str(root), num_images=8, size_range=(20, 32), seed=4)


def _jpeg(root):
    return os.path.join(root, "JPEGImages", NAME + ".jpg")


def _with_comment(path, text: bytes, ns: int) -> bytes:
    """Rewrite the JPEG at ``path`` with a comment segment ``text`` (content changes, size
    does not for another text of the same length) and mtime ``SECOND`` s + ``ns`` ns."""
    with open(path, "rb") as f:
        data = f.read()
    if data[2:4] == b"\xff\xfe":  # drop the comment put there before
        data = data[:2] + data[4 + int.from_bytes(data[4:6], "big"):]
    new = data[:2] + b"\xff\xfe" + (len(text) + 2).to_bytes(2, "big") + text + data[2:]
    with open(path, "wb") as f:
        f.write(new)
    os.utime(path, ns=(SECOND * 10**9 + ns, SECOND * 10**9 + ns))
    return new


def _change(root, how):
    """Give the image of ``NAME`` other content under the same name."""
    path = _jpeg(root)
    if how == "same size, same second":
        before = os.stat(path)
        _with_comment(path, b"state-B!", 200)
        after = os.stat(path)
        assert after.st_size == before.st_size
        assert after.st_mtime_ns // 10**9 == before.st_mtime_ns // 10**9
        assert after.st_mtime_ns != before.st_mtime_ns
    else:  # other pixels (same width and height as its mask), another file size
        with Image.open(path) as im:
            w, h = im.size
        pixels = np.random.default_rng(7).integers(0, 256, (h, w, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(path, quality=80)


def _prepare(root):
    src = _voc(root)
    _with_comment(_jpeg(src), b"state-A!", 100)
    return src


def _files(folder):
    return sorted(f for f in os.listdir(folder) if not f.endswith(".gdx"))


def _same_output(a, b):
    assert _files(a) == _files(b)
    for f in _files(a):
        assert same_output_bytes(os.path.join(a, f), os.path.join(b, f)), f


@pytest.mark.parametrize("how", ["same size, same second", "other pixels"])
def test_sharded_rerun_redoes_only_the_shard_of_the_changed_image(tmp_path, how):
    src = _prepare(tmp_path / "VOC")
    out = tmp_path / "out"
    kw = dict(split="trainval", shards=4)
    first = convert_sharded(src, str(out / "v.rec"), "voc", **kw)
    assert [e["reused"] for e in first.shards] == [False] * 4
    old = {e["name"]: RecordFile(str(out / e["name"])).read(1) for e in first.shards}
    _change(src, how)
    again = convert_sharded(src, str(out / "v.rec"), "voc", **kw)
    assert [e["reused"] for e in again.shards] == [True, False, True, True]
    fresh = convert_sharded(src, str(tmp_path / "fresh" / "v.rec"), "voc", **kw)
    _same_output(str(out), str(tmp_path / "fresh"))  # as a conversion of the new source
    with open(_jpeg(src), "rb") as f:
        now = f.read()
    redone = again.shards[1]["name"]
    assert RecordFile(str(out / redone)).read(0) != old[redone]  # item 2: the new image
    assert now in RecordFile(str(out / redone)).read(0)
    assert [e["reused"] for e in fresh.shards] == [False] * 4


def _killed_after_first_checkpoint(src, out):
    code = ("import importlib, os, signal\n"
            "c = importlib.import_module('gluon_data.convert')\n"
            "real = c.resume.Checkpoint.save\n"
            "def save(self, *a):\n    real(self, *a)\n    os.kill(os.getpid(), signal.SIGKILL)\n"
            "c.resume.Checkpoint.save = save\n"
            "c.convert(%r, %r, 'voc', split='trainval', checkpoint_every=4)\n" % (src, out))
    p = subprocess.run([sys.executable, "-c", code], timeout=120,
                       env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert p.returncode == -signal.SIGKILL and not os.path.exists(out)


def _records(path):
    f = LMDBFile(path, "trainval") if path.endswith(".lmdb") else RecordFile(path)
    return [f.read(i) for i in range(len(f))]


@pytest.mark.parametrize("name", ["v.rec", "v.lmdb"])
def test_unsharded_resume_after_a_source_change_is_refused_naming_the_file(tmp_path, name):
    src = _prepare(tmp_path / "VOC")
    out = str(tmp_path / name)
    _killed_after_first_checkpoint(src, out)  # items 0..3 written, NAME (item 2) among them
    _change(src, "same size, same second")
    with pytest.raises(ConversionError, match="source changed") as e:
        convert(src, out, "voc", split="trainval", checkpoint_every=4, resume=True)
    assert NAME + ".jpg" in str(e.value) and "now %d bytes" % os.path.getsize(_jpeg(src)) \
        in str(e.value)
    assert not os.path.exists(out)  # nothing published from the mixed state
    convert(src, out, "voc", split="trainval", checkpoint_every=4)  # as the message says
    ref = str(tmp_path / ("ref_" + name))
    convert(src, ref, "voc", split="trainval")
    assert _records(out) == _records(ref)


def test_upload_rerun_redoes_the_changed_shard(s3, so, tmp_path):  # noqa: F811
    from gluon_data.convert.to_uri import convert_to_uri
    from gluon_data.storage.remotefs import filesystem
    src = _prepare(tmp_path / "VOC")
    uri = "s3://%s/binding/v.rec" % BUCKET
    kw = dict(layout="voc", split="trainval", shards=4, storage_options=so,
              cache_dir=str(tmp_path / "cache"))
    first = convert_to_uri(src, uri, **kw)
    assert [e["reused"] for e in first.shards] == [False] * 4
    _change(src, "same size, same second")
    again = convert_to_uri(src, uri, resume=True, **kw)
    assert [e["reused"] for e in again.shards] == [True, False, True, True]
    fresh = convert_sharded(src, str(tmp_path / "fresh" / "v.rec"), "voc", split="trainval",
                            shards=4)
    fs, _ = filesystem(uri, so)
    for e in fresh.shards:  # every object in S3 is the fresh conversion's
        local = tmp_path / "fresh" / e["name"]
        remote = "%s/binding/%s" % (BUCKET, e["name"])
        assert fs.cat_file(remote) == local.read_bytes(), e["name"]


@pytest.mark.parametrize("name", ["v.rec", "v.lmdb"])
def test_resume_of_a_finished_output_after_a_source_change_is_refused(tmp_path, name):
    src = _voc(tmp_path / "VOC")
    out = str(tmp_path / name)
    convert(src, out, "voc", split="trainval")
    assert convert(src, out, "voc", split="trainval", resume=True).written == {"trainval": 8}
    before = _records(out)
    _change(src, "other pixels")
    with pytest.raises(ConversionError, match="source changed after this output") as e:
        convert(src, out, "voc", split="trainval", resume=True)
    assert NAME + ".jpg" in str(e.value)
    assert _records(out) == before  # left as it was
    convert(src, out, "voc", split="trainval", overwrite=True)
    ref = str(tmp_path / ("ref_" + name))
    convert(src, ref, "voc", split="trainval")
    assert _records(out) == _records(ref)


def _rewrite_in_place_mtime_restored(path):
    """Other bytes in the same file (same inode, same size), its mtime then set back to the
    very nanosecond it had: only the ctime (which no user can set) shows the change."""
    before = os.stat(path)
    with open(path, "r+b") as f:
        data = f.read()
        at = data.index(b"state-A!")
        f.seek(at)
        f.write(b"state-C!")
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = os.stat(path)
    assert (after.st_size, after.st_mtime_ns, after.st_ino) == (
        before.st_size, before.st_mtime_ns, before.st_ino)
    assert after.st_ctime_ns != before.st_ctime_ns


def test_resume_after_an_in_place_rewrite_with_the_mtime_restored_is_refused(tmp_path):
    """Size and mtime alone would resume this silently and publish records of two states;
    the ctime in the plan's stamps refuses it, naming the file."""
    src = _prepare(tmp_path / "VOC")
    out = str(tmp_path / "v.rec")
    _killed_after_first_checkpoint(src, out)  # items 0..3 written, NAME (item 2) among them
    _rewrite_in_place_mtime_restored(_jpeg(src))
    with pytest.raises(ConversionError, match="source changed") as e:
        convert(src, out, "voc", split="trainval", checkpoint_every=4, resume=True)
    assert NAME + ".jpg" in str(e.value) and "(ctime)" in str(e.value)
    assert not os.path.exists(out)
    convert(src, out, "voc", split="trainval", checkpoint_every=4)
    ref = str(tmp_path / "ref.rec")
    convert(src, ref, "voc", split="trainval")
    assert _records(out) == _records(ref)


def test_sharded_rerun_after_an_in_place_rewrite_with_the_mtime_restored_redoes_its_shard(
        tmp_path):
    src = _prepare(tmp_path / "VOC")
    out = tmp_path / "out"
    kw = dict(split="trainval", shards=4)
    convert_sharded(src, str(out / "v.rec"), "voc", **kw)
    _rewrite_in_place_mtime_restored(_jpeg(src))
    again = convert_sharded(src, str(out / "v.rec"), "voc", **kw)
    assert [e["reused"] for e in again.shards] == [True, False, True, True]
    convert_sharded(src, str(tmp_path / "fresh" / "v.rec"), "voc", **kw)
    _same_output(str(out), str(tmp_path / "fresh"))


def test_a_copied_source_tree_is_another_source_for_a_sharded_rerun(tmp_path):
    """Another inode for every file (a copy, e.g. to another filesystem): nothing is reused."""
    import shutil
    src = _prepare(tmp_path / "VOC")
    out = tmp_path / "out"
    kw = dict(split="trainval", shards=4)
    convert_sharded(src, str(out / "v.rec"), "voc", **kw)
    moved = str(tmp_path / "VOC-old")
    os.rename(src, moved)
    shutil.copytree(moved, src, copy_function=shutil.copy2)  # same sizes and mtimes
    again = convert_sharded(src, str(out / "v.rec"), "voc", **kw)
    assert [e["reused"] for e in again.shards] == [False] * 4
