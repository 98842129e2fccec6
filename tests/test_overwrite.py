"""What commands may replace: only their own outputs, never through a link; one writer per
output at a time. Every case runs the real CLI or API on real files."""
import os
import subprocess
import sys

import pytest
from PIL import Image

from gluon_data import SegmentationLMDBDataset, SegmentationRecordDataset
from gluon_data import convert
from gluon_data.tools import salvage, verify
from gluon_data.errors import ConversionError, OutputError
from gluon_data.storage.fsutil import OutputLock, atomic_write
from gluon_data.format.meta import dumps_meta
from gluon_data.format.ownership import check_replaceable, classify_location, is_ours
from gluon_data.stores.recordio import write_binary_index
from gluon_data.convert.sample import make_voc

pytestmark = pytest.mark.reliability


def cli(*args, **kw):
    return subprocess.run([sys.executable, "-m", "gluon_data", *map(str, args)],
                          capture_output=True, text=True, timeout=300, **kw)


def tree(path):
    """Every file under ``path`` with its bytes (what must stay untouched)."""
    out = {}
    for d, _, fs in os.walk(path):
        for f in fs:
            p = os.path.join(d, f)
            out[os.path.relpath(p, path)] = open(p, "rb").read()
    return out


@pytest.fixture
def user_dir(tmp_path):
    d = tmp_path / "precious"
    (d / "sub").mkdir(parents=True)
    (d / "notes.txt").write_text("my thesis")
    (d / "sub" / "data.mdb").write_bytes(b"not an lmdb")
    return str(d)


def test_overwrite_refuses_a_directory_that_is_not_our_lmdb(voc_root, user_dir):
    before = tree(user_dir)
    r = cli("convert", voc_root, user_dir, "--layout", "voc", "--format", "lmdb",
            "--overwrite", "--workers", "1", "--quiet")
    assert r.returncode == 1, r.stderr
    assert "not a gluon_data LMDB dataset" in r.stderr and user_dir in r.stderr
    assert "Traceback" not in r.stderr
    assert tree(user_dir) == before
    assert not os.path.exists(user_dir + ".partial") and not os.path.exists(user_dir + ".lock")


def test_overwrite_refuses_an_lmdb_folder_holding_other_files(voc_root, tmp_path):
    out = str(tmp_path / "d.lmdb")
    convert(voc_root, out, "voc", split="train")
    with open(os.path.join(out, "keep.txt"), "w") as f:
        f.write("mine")
    with pytest.raises(OutputError, match="not a gluon_data LMDB"):
        convert(voc_root, out, "voc", split="train", overwrite=True)
    assert open(os.path.join(out, "keep.txt")).read() == "mine"


def test_overwrite_replaces_our_own_lmdb_atomically_without_old_folder(voc_root, tmp_path):
    out = str(tmp_path / "d.lmdb")
    convert(voc_root, out, "voc", split="train")
    convert(voc_root, out, "voc", split="train,val", overwrite=True)
    assert sorted(os.listdir(tmp_path)) == ["d.lmdb"]  # no .old, .partial or .lock left
    assert len(SegmentationLMDBDataset(out, "val")) > 0
    # a user's folder named like our old sibling is never touched
    os.makedirs(out + ".old")
    with open(os.path.join(out + ".old", "x"), "w") as f:
        f.write("x")
    convert(voc_root, out, "voc", split="train", overwrite=True)
    assert open(os.path.join(out + ".old", "x")).read() == "x"


@pytest.mark.parametrize("victim", [".rec", ".idx", ".meta.json", ".idx.gdx"])
def test_overwrite_refuses_a_rec_output_whose_files_are_not_ours(voc_root, tmp_path, victim):
    out = str(tmp_path / "o.rec")
    convert(voc_root, out, "voc", split="train")
    path = out[:-4] + victim
    with open(path, "wb") as f:
        f.write(b"user data, not a dataset file\n")
    with pytest.raises(OutputError, match="not a"):
        convert(voc_root, out, "voc", split="train", overwrite=True)
    assert open(path, "rb").read() == b"user data, not a dataset file\n"


def test_overwrite_replaces_our_rec_and_stale_sidecars(voc_root, tmp_path):
    out = str(tmp_path / "o.rec")
    convert(voc_root, out, "voc", split="train")
    convert(voc_root, out, "voc", split="val", overwrite=True)
    ds = SegmentationRecordDataset(out)
    assert ds.meta["split"] == "val" and verify(out, deep=True).ok


@pytest.mark.parametrize("victim", [".rec", ".idx", ".meta.json", ".idx.gdx"])
def test_outputs_never_replace_or_write_through_a_symlink(voc_root, tmp_path, victim):
    target = tmp_path / "elsewhere.bin"
    target.write_bytes(b"precious")
    out = str(tmp_path / "o.rec")
    os.symlink(str(target), out[:-4] + victim)
    r = cli("convert", voc_root, out, "--layout", "voc", "--overwrite", "--workers", "1",
            "--quiet")
    assert r.returncode == 1 and "symbolic link" in r.stderr, r.stderr
    assert target.read_bytes() == b"precious" and os.path.islink(out[:-4] + victim)


@pytest.mark.parametrize("sibling", [".rec.partial", ".idx.partial", ".meta.json.partial",
                                     ".rec.resume.json.partial"])
def test_temporary_siblings_are_never_written_through_a_link(voc_root, tmp_path, sibling):
    target = tmp_path / "elsewhere.bin"
    target.write_bytes(b"precious")
    out = str(tmp_path / "o.rec")
    link = out[:-4] + sibling
    os.symlink(str(target), link)
    if sibling == ".rec.resume.json.partial":  # a stale temporary name: the link is dropped
        convert(voc_root, out, "voc", split="train", checkpoint_every=2)
        assert verify(out).ok and not os.path.lexists(link)
    else:
        with pytest.raises(OutputError, match="symbolic link"):
            convert(voc_root, out, "voc", split="train", checkpoint_every=2)
        assert not os.path.exists(out)
    assert target.read_bytes() == b"precious"


def test_lmdb_partial_that_is_not_ours_is_left_alone(voc_root, user_dir, tmp_path):
    out = str(tmp_path / "d.lmdb")
    os.rename(user_dir, out + ".partial")
    before = tree(out + ".partial")
    with pytest.raises(OutputError, match="partial LMDB"):
        convert(voc_root, out, "voc", split="train")
    assert tree(out + ".partial") == before


@pytest.mark.parametrize("sibling", [".rec.partial", ".idx.partial", ".meta.json.partial"])
def test_a_file_named_as_a_partial_file_but_not_one_is_left_alone(voc_root, tmp_path, sibling):
    """A user's regular file at a partial file's name is refused, untouched; a partial file a
    killed run left (the start of a .rec, an index, a metadata document, or empty) is still
    replaced."""
    out = str(tmp_path / "o.rec")
    other = out[:-4] + sibling
    with open(other, "wb") as f:
        f.write(b"precious notes\n")
    with pytest.raises(OutputError, match="in the way of a partial file gluon-data writes"):
        convert(voc_root, out, "voc", split="train")
    with open(other, "rb") as f:
        assert f.read() == b"precious notes\n"
    assert not os.path.exists(out)
    convert(voc_root, str(tmp_path / "ref.rec"), "voc", split="train")
    with open(str(tmp_path / "ref") + sibling[:-len(".partial")], "rb") as f:
        leftover = f.read()[:100]  # how a killed run's partial file begins
    with open(other, "wb") as f:
        f.write(leftover)
    convert(voc_root, out, "voc", split="train")
    assert verify(out).ok and not os.path.exists(other)
    if sibling == ".rec.partial":  # a hole at its start: a place a worker had not filled
        with open(other, "wb") as f:
            f.write(bytes(64) + leftover)
        convert(voc_root, out, "voc", split="train", overwrite=True)
        assert verify(out).ok and not os.path.exists(other)


def test_show_out_replaces_only_its_own_preview_and_only_with_overwrite(voc_rec, tmp_path):
    """``show --out`` over an existing file is refused without ``--overwrite``; with it, only a
    preview ``show`` wrote (PNG or JPEG, recognised by its mark) is replaced: a photo (a
    source JPEG of the dataset), a plain PNG, a text file or a link is left untouched."""
    png = tmp_path / "p.png"
    r = cli("show", voc_rec, "--out", png)
    assert r.returncode == 0, r.stderr
    first = png.read_bytes()
    r = cli("show", voc_rec, "--index", 1, "--out", png)
    assert r.returncode == 1 and "already exists" in r.stderr and "--overwrite" in r.stderr
    assert png.read_bytes() == first
    r = cli("show", voc_rec, "--index", 1, "--out", png, "--overwrite")  # its own preview
    assert r.returncode == 0 and png.read_bytes() != first, r.stderr
    jpg = tmp_path / "p.jpg"
    assert cli("show", voc_rec, "--out", jpg).returncode == 0
    r = cli("show", voc_rec, "--index", 1, "--out", jpg, "--overwrite")
    assert r.returncode == 0 and Image.open(jpg).format == "JPEG", r.stderr
    photo = tmp_path / "photo.jpg"  # a photo and a plain PNG: images, but not ours
    Image.new("RGB", (40, 30), (200, 10, 10)).save(photo, quality=90)
    plain = tmp_path / "plain.png"
    Image.new("L", (8, 8)).save(plain)
    notes = tmp_path / "notes.png"
    notes.write_text("not a picture")
    for other in (photo, plain, notes):
        before = other.read_bytes()
        r = cli("show", voc_rec, "--out", other, "--overwrite")
        assert r.returncode == 1 and ("not a preview written by gluon-data (it carries no mark "
                                      "of gluon-data show" in r.stderr), r.stderr
        assert other.read_bytes() == before
    target = tmp_path / "target.png"
    target.write_bytes(first)
    os.symlink(str(target), str(tmp_path / "link.png"))
    r = cli("show", voc_rec, "--index", 1, "--out", tmp_path / "link.png", "--overwrite")
    assert r.returncode == 1 and "symbolic link" in r.stderr
    assert target.read_bytes() == first


def test_salvage_never_writes_through_links(voc_root, tmp_path):
    out = str(tmp_path / "s.rec")
    convert(voc_root, out, "voc", split="train")
    idx = out[:-4] + ".idx"
    target = tmp_path / "t"
    target.write_bytes(b"precious")
    os.symlink(str(target), idx + ".bak")
    with pytest.raises(OutputError, match="symbolic link"):
        salvage(out, overwrite=True)
    assert target.read_bytes() == b"precious"
    os.remove(idx + ".bak")
    # a damaged tail goes to a fresh file, never over an existing one
    with open(out, "ab") as f:
        f.write(b"\x0a\x23\xd7\xce" + b"\x01" * 20)
    (tmp_path / "s.rec.damaged-tail").write_bytes(b"an earlier tail")
    rep = salvage(out, overwrite=True)
    assert rep.tail_moved_to == out + ".damaged-tail.1"
    assert (tmp_path / "s.rec.damaged-tail").read_bytes() == b"an earlier tail"
    assert verify(out).ok


def test_binary_index_is_never_written_through_a_link(voc_rec, tmp_path):
    rec = str(tmp_path / "c.rec")
    for ext in (".rec", ".idx", ".meta.json"):
        with open(voc_rec[:-4] + ext, "rb") as f, open(rec[:-4] + ext, "wb") as g:
            g.write(f.read())
    target = tmp_path / "t"
    target.write_bytes(b"precious")
    os.symlink(str(target), rec[:-4] + ".idx.gdx")
    with pytest.raises(OutputError):
        write_binary_index(rec[:-4] + ".idx")
    assert target.read_bytes() == b"precious"


_META = {"format": "gluon_data", "format_version": 1, "task": "classification",
         "num_records": 0}


def test_fsutil_helpers(tmp_path):
    p = str(tmp_path / "f.meta.json")
    atomic_write(p, dumps_meta(_META))
    check_replaceable(p, "meta", True)
    with pytest.raises(FileExistsError):
        check_replaceable(p, "meta", False)
    with pytest.raises(OutputError):
        check_replaceable(p, "rec", True)
    assert os.listdir(tmp_path) == ["f.meta.json"]


@pytest.mark.parametrize("damage,reason,looks", [
    (lambda raw: raw.replace(b'"num_records": 0', b'"num_records": 7'), "checksum mismatch",
     "meta"),
    (lambda raw: b'{"format": "gluon_data"}', "version None is not supported", "meta"),
    (lambda raw: raw[:-5], "not valid JSON", "file"),
    (lambda raw: b'{"format": "theirs", "format_version": 1}', 'missing "format"', "file"),
])
def test_a_document_is_ours_only_if_it_passes_its_schema_check(tmp_path, damage, reason,
                                                               looks):
    """The one rule (format.ownership.location_ownership, which URIs follow too): metadata
    that claims gluon_data but was altered or damaged, or is not ours, is refused by
    overwrite with the reason, and left as it was; classify_location still names it."""
    p = str(tmp_path / "f.meta.json")
    raw = damage(dumps_meta(_META))
    atomic_write(p, raw)
    assert not is_ours(p, "meta")
    with pytest.raises(OutputError, match=reason) as e:
        check_replaceable(p, "meta", True)
    assert e.value.path == p and "left untouched" in str(e.value)
    assert open(p, "rb").read() == raw
    assert classify_location(p) == looks


# ----------------------------------------------------------------- concurrent writers
@pytest.fixture(scope="module")
def slow_voc(tmp_path_factory):
    return make_voc(str(tmp_path_factory.mktemp("slowvoc") / "VOC2012"), num_images=240,
                    size_range=(120, 200), seed=3)


def test_a_held_lock_refuses_a_second_conversion_naming_the_holder(voc_root, tmp_path):
    out = str(tmp_path / "x.rec")
    with OutputLock([out]):
        r = cli("convert", voc_root, out, "--layout", "voc", "--workers", "1", "--quiet")
        with pytest.raises(ConversionError, match="pid %d" % os.getpid()):
            convert(voc_root, out, "voc", split="train")
    assert r.returncode == 1 and "pid %d" % os.getpid() in r.stderr and out in r.stderr
    assert not os.path.exists(out) and not os.path.exists(out + ".lock")
    convert(voc_root, out, "voc", split="train")  # released: the next run goes ahead
    assert sorted(os.listdir(tmp_path)) == ["x.idx", "x.idx.gdx", "x.meta.json", "x.rec"]


@pytest.mark.parametrize("fmt", ["rec", "lmdb"])
def test_two_concurrent_cli_conversions_leave_a_complete_dataset(slow_voc, tmp_path, fmt):
    """Two runs to one output started together: the one that locks first converts, the
    other fails at once naming the output and the winner's pid; whatever exited 0 left a
    complete, readable dataset and nothing else behind."""
    out = str(tmp_path / ("c." + fmt))
    cmd = [sys.executable, "-m", "gluon_data", "convert", slow_voc, out, "--layout", "voc",
           "--split", "trainval", "--encoding", "png", "--workers", "1", "--quiet",
           "--overwrite"]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    results = [p.communicate(timeout=300) + (p.returncode, p.pid) for p in procs]
    ok = [r for r in results if r[2] == 0]
    failed = [r for r in results if r[2] != 0]
    assert len(ok) == 1 and len(failed) == 1, [r[1][-500:] for r in results]
    err = failed[0][1]
    assert failed[0][2] == 1 and "pid %d" % ok[0][3] in err and out in err, err
    assert "Traceback" not in err
    ds = (SegmentationLMDBDataset(out, "trainval") if fmt == "lmdb"
          else SegmentationRecordDataset(out))
    assert len(ds) == 240
    for i in range(len(ds)):
        img, mask = ds[i]
        assert img.shape[:2] == mask.shape
    assert verify(out, deep=True).ok
    left = sorted(os.listdir(tmp_path))
    assert not [f for f in left if f.endswith((".partial", ".lock", ".resume.json"))
                or ".old" in f], left


@pytest.mark.parametrize("kind", ["rec", "lmdb", "sharded", "copy"])
def test_an_existing_output_is_refused_before_any_progress_bar_for_both_audiences(
        voc_root, tmp_path, capsys, kind):
    """The refusal comes before a bar is drawn, and names the fix the command line and
    Python both read (the overwrite option, --overwrite), not a Python keyword argument."""
    out = str(tmp_path / ("o.lmdb" if kind == "lmdb" else "o.rec"))
    src, layout, kw, again = voc_root, "voc", {"split": "train,val"}, {}
    if kind == "sharded":  # a rerun of the same plan keeps its shards: another plan
        kw, again = {"split": "train", "shards": 2}, {"split": "train", "shards": 3}
    if kind == "copy":
        src, layout, kw = str(tmp_path / "src.rec"), None, {}
        convert(voc_root, src, "voc", split="train", progress=False)
    convert(src, out, layout, progress=False, **kw)
    before = tree(str(tmp_path))
    capsys.readouterr()
    with pytest.raises(FileExistsError) as e:
        convert(src, out, layout, progress=True, **(again or kw))
    msg = str(e.value)
    assert "already exists" in msg and "--overwrite" in msg and "nothing was written" in msg
    assert "overwrite=True" not in msg and "pass " not in msg, msg
    assert capsys.readouterr().err == ""  # no progress bar drawn, not even at 0%
    assert tree(str(tmp_path)) == before


def test_the_cli_refusal_of_an_existing_output_is_one_line_without_python_words(voc_root,
                                                                                tmp_path):
    out = tmp_path / "o.rec"
    convert(voc_root, str(out), "voc", split="train", progress=False)
    p = cli("convert", voc_root, out, "--layout", "voc", "--split", "train")
    assert p.returncode == 1
    assert p.stderr.count("\n") == 1 and p.stderr.startswith("gluon-data: error: "), p.stderr
    assert "--overwrite" in p.stderr and "overwrite=True" not in p.stderr, p.stderr
    assert "convert:" not in p.stderr and "%|" not in p.stderr  # no progress bar
