"""The one rule of "done" and the one "is this ours / of this plan", end to end.

A finished output counts as done only if its files are what its done record says: sizes and
SHA-256 (an object in storage: its ETag, or its bytes read once). ``--resume`` on a damaged
finished ``.rec`` redoes it; a sharded rerun redoes a damaged shard; a resumed upload sends
again an object rewritten in place with the same size. ``--overwrite`` replaces only what is
ours, for every output a conversion writes (the manifest included). Real conversions, real
files, moto's S3 server (tests/s3_server.py) for object storage."""
import json
import os

import pytest

from gluon_data.convert import ConvertOptions, convert
from gluon_data.convert.sample import make_imagefolder
from gluon_data.errors import GluonDataError, OutputError
from gluon_data.format import codec
from gluon_data.format.meta import dumps_meta, meta_path
from gluon_data.stores.base import open_store
from gluon_data.tools.verify import verify


@pytest.fixture
def src(tmp_path):
    return make_imagefolder(str(tmp_path / "folder"), per_class=3)


def _read(path):
    with open(path, "rb") as f:
        return f.read()


def _idx_loses_a_line(rec):
    idx = rec[:-4] + ".idx"
    with open(idx) as f:
        lines = f.readlines()
    with open(idx, "w") as f:
        f.writelines(lines[:-1])


def _rec_cut(rec):
    os.truncate(rec, os.path.getsize(rec) - 50)


def _idx_deleted(rec):
    os.remove(rec[:-4] + ".idx")


def _as_previous_release(out):
    """Metadata as the previous release wrote it: no done record."""
    meta = json.loads(_read(meta_path(out)))
    del meta["done"]
    with open(meta_path(out), "wb") as f:
        f.write(dumps_meta(meta))


def _last_record_flipped(rec):
    with open(rec, "r+b") as f:
        f.seek(os.path.getsize(rec) - 10)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 1]))


DAMAGES = [_idx_loses_a_line, _rec_cut, _idx_deleted, _last_record_flipped]


# ------------------------------------------------------------------------- local --resume
@pytest.mark.parametrize("damage", DAMAGES, ids=lambda f: f.__name__.strip("_"))
def test_resume_redoes_a_finished_but_damaged_rec(src, tmp_path, damage):
    out = str(tmp_path / "c.rec")
    convert(src, out, "imagefolder")
    good = [_read(out), _read(out[:-4] + ".idx"), _read(meta_path(out))]
    damage(out)
    assert not verify(out).ok
    report = convert(src, out, "imagefolder", resume=True)
    assert report.written == {"train": 9}
    assert verify(out).ok
    assert [_read(out), _read(out[:-4] + ".idx"), _read(meta_path(out))] == good


def test_resume_keeps_a_finished_output_that_is_what_its_record_says(src, tmp_path):
    out = str(tmp_path / "c.rec")
    convert(src, out, "imagefolder")
    meta = json.loads(_read(meta_path(out)))
    assert meta["done"]["unit"] == "split train of the conversion"
    assert sorted(meta["done"]["outputs"]) == [".idx", ".rec"]
    assert all(len(f["sha256"]) == 64 for f in meta["done"]["outputs"].values())
    stamp = os.stat(out).st_mtime_ns
    convert(src, out, "imagefolder", resume=True)
    assert os.stat(out).st_mtime_ns == stamp  # recognised, not rewritten


def test_resume_redoes_an_output_of_the_previous_release(src, tmp_path):
    """Metadata without a done record (the previous release's) is not provably complete:
    the output is redone (never taken as done on its sizes alone)."""
    out = str(tmp_path / "c.rec")
    convert(src, out, "imagefolder")
    _as_previous_release(out)
    _last_record_flipped(out)
    convert(src, out, "imagefolder", resume=True)
    assert verify(out).ok and "done" in json.loads(_read(meta_path(out)))


def test_resume_never_replaces_a_previous_release_output_of_another_source(tmp_path):
    """The previous release's metadata records no done record: --resume redoes it only
    when it says it was made from this source with these options; one made from another
    source is refused as any existing output is, and stays as it was."""
    a = make_imagefolder(str(tmp_path / "a"), per_class=3)
    b = make_imagefolder(str(tmp_path / "b"), per_class=2)
    out = str(tmp_path / "c.rec")
    convert(a, out, "imagefolder")
    _as_previous_release(out)
    before = [_read(out), _read(out[:-4] + ".idx"), _read(meta_path(out))]
    with pytest.raises((FileExistsError, GluonDataError), match="already exists|other inputs"):
        convert(b, out, "imagefolder", resume=True)
    assert [_read(out), _read(out[:-4] + ".idx"), _read(meta_path(out))] == before


def test_resume_recognises_a_finished_output_not_named_rec(src, tmp_path):
    """The done record names the files by kind: an output called o.data (index o.idx) is
    recognised on --resume, not converted again."""
    out = str(tmp_path / "o.data")
    convert(src, out, "imagefolder")
    stamp = os.stat(out).st_mtime_ns
    convert(src, out, "imagefolder", resume=True)
    assert os.stat(out).st_mtime_ns == stamp
    assert verify(out).ok


def _idx_emptied(rec):
    open(rec[:-4] + ".idx", "w").close()  # a shard of one record that lost its only line


# ------------------------------------------------------------------------- sharded
@pytest.mark.parametrize("damage", [_idx_loses_a_line, _idx_emptied])
def test_a_sharded_rerun_redoes_a_shard_whose_idx_lost_a_line(src, tmp_path, damage):
    out = str(tmp_path / "s.rec")
    first = convert(src, out, "imagefolder", shards=3)
    shard = out[:-4] + "-00001-of-00003.rec"
    good = _read(shard[:-4] + ".idx")
    damage(shard)
    again = convert(src, out, "imagefolder", shards=3, resume=True)  # --resume: accepted
    assert [e["reused"] for e in again.shards] == [True, False, True]
    assert _read(shard[:-4] + ".idx") == good
    assert verify(again.outputs["train"]).ok
    assert [open_store(again.outputs["train"]).read(i) for i in range(9)] == \
        [open_store(first.outputs["train"]).read(i) for i in range(9)]


@pytest.mark.parametrize("shards", [None, 3])
def test_a_rerun_with_other_classes_never_keeps_the_outputs_labelled_before(src, tmp_path,
                                                                             shards):
    """``--classes`` chooses each folder's label: a rerun with another order must not keep
    what was labelled by the first (without ``--overwrite`` it is refused, as any change of
    plan), and ``--overwrite`` labels every record anew."""
    out = str(tmp_path / "o.rec")
    kw = dict(shards=shards) if shards else {}
    first = convert(src, out, "imagefolder", classes=["cat", "dog", "fish"], **kw)
    again = dict(kw, resume=True) if not shards else kw
    with pytest.raises((GluonDataError, FileExistsError), match="other inputs or options|"
                                                                 "not written by this plan"):
        convert(src, out, "imagefolder", classes=["fish", "dog", "cat"], **again)
    redone = convert(src, out, "imagefolder", classes=["fish", "dog", "cat"], overwrite=True,
                     **kw)
    store = open_store(redone.outputs["train"])
    labels = sorted(int(codec.unpack(store.read(i)).label) for i in range(len(store)))
    assert labels == [0, 0, 0, 1, 1, 1, 2, 2, 2] and store.meta["classes"][0] == "fish"
    assert first.outputs["train"] == redone.outputs["train"]


def _meta_edited_unsealed(meta_file, edit):
    """A hand edit of a metadata file: ``edit(meta)``, written back without its checksum."""
    meta = json.loads(_read(meta_file))
    edit(meta)
    meta.pop("meta_crc32", None)
    with open(meta_file, "w") as f:
        json.dump(meta, f)


def _no_outputs(meta):
    meta["done"]["outputs"] = {}


def _shard_no_outputs(meta):
    meta["shard"]["done"]["outputs"] = {}


def _shard_other_classes(meta):
    meta["classes"] = ["x%d" % i for i in range(len(meta["classes"]))]


def _flip_first_record(rec):
    with open(rec, "r+b") as f:
        f.seek(40)
        b = f.read(1)
        f.seek(40)
        f.write(bytes([b[0] ^ 1]))


@pytest.mark.parametrize("edit,flip", [(_shard_no_outputs, True), (_shard_other_classes, False)],
                         ids=["no outputs, rec damaged", "classes edited"])
def test_a_sharded_rerun_redoes_a_shard_whose_metadata_was_edited(src, tmp_path, edit, flip):
    """Metadata edited by hand (its checksum dropped): a done record naming no outputs
    proves nothing of the damaged ``.rec`` beside it, and edited fields are not kept even
    where the files are intact; the rerun rewrites the shard, and the output is a fresh
    run's."""
    out, ref = str(tmp_path / "s.rec"), str(tmp_path / "ref" / "s.rec")
    convert(src, ref, "imagefolder", shards=3)
    convert(src, out, "imagefolder", shards=3)
    shard = out[:-4] + "-00001-of-00003.rec"
    _meta_edited_unsealed(meta_path(shard), edit)
    if flip:
        _flip_first_record(shard)
    again = convert(src, out, "imagefolder", shards=3)
    assert [e["reused"] for e in again.shards] == [True, False, True]
    assert verify(again.outputs["train"]).ok
    for name in sorted(os.listdir(str(tmp_path / "ref"))):
        if not name.endswith(".gdx"):  # (it records its .idx's mtime)
            assert _read(str(tmp_path / name)) == _read(str(tmp_path / "ref" / name)), name


def test_resume_redoes_an_output_whose_done_record_names_no_files(src, tmp_path):
    out = str(tmp_path / "o.rec")
    convert(src, out, "imagefolder")
    good = _read(out)
    _meta_edited_unsealed(meta_path(out), _no_outputs)
    _flip_first_record(out)
    convert(src, out, "imagefolder", resume=True)
    assert _read(out) == good and verify(out).ok


def test_a_failed_sharded_rerun_leaves_no_manifest_naming_rewritten_shards(src, tmp_path):
    """The shards are rewritten in place: the old manifest goes before the first of them, so
    a rerun that fails (or is interrupted) leaves none that would mix old metadata with new
    records; the next rerun writes it again."""
    out = str(tmp_path / "s.rec")
    manifest = str(tmp_path / "s.shards.json")
    convert(src, out, "imagefolder", shards=3)
    bad = os.path.join(src, "fish", "002.jpg")
    good = _read(bad)
    with open(bad, "wb") as f:
        f.write(b"not a jpeg")
    with pytest.raises(GluonDataError, match="002.jpg"):
        convert(src, out, "imagefolder", shards=3)
    assert not os.path.exists(manifest)
    with pytest.raises((GluonDataError, OSError)):
        open_store(manifest)
    with open(bad, "wb") as f:
        f.write(good)
    again = convert(src, out, "imagefolder", shards=3)
    assert again.outputs["train"] == manifest and verify(manifest).ok


def test_a_foreign_gdx_among_the_shards_is_refused_before_any_shard_is_written(src, tmp_path):
    os.makedirs(str(tmp_path / "out"))
    out = str(tmp_path / "out" / "s.rec")
    foreign = out[:-4] + "-00001-of-00003.idx.gdx"
    with open(foreign, "w") as f:
        f.write("my notes\n")
    for overwrite in (False, True):
        with pytest.raises((OutputError, FileExistsError), match="00001-of-00003.idx.gdx"):
            convert(src, out, "imagefolder", shards=3, overwrite=overwrite)
        assert os.listdir(str(tmp_path / "out")) == [os.path.basename(foreign)]
    assert _read(foreign) == b"my notes\n"


def _manifest_cases(manifest):
    good = _read(manifest)
    doc = json.loads(good)
    edited = dict(doc, num_records=doc["num_records"] + 1)  # its checksum no longer holds
    return {"plain text": b"my notes\n", "foreign json": b'{"hello": "world"}',
            "cut manifest": good[:len(good) // 2],
            "edited manifest": json.dumps(edited).encode()}


@pytest.mark.parametrize("case", ["plain text", "foreign json", "cut manifest",
                                  "edited manifest"])
def test_overwrite_refuses_a_manifest_that_is_not_ours(src, tmp_path, case):
    out = str(tmp_path / "s.rec")
    manifest = str(tmp_path / "s.shards.json")
    convert(src, out, "imagefolder", shards=3)
    content = _manifest_cases(manifest)[case]
    with open(manifest, "wb") as f:
        f.write(content)
    with pytest.raises(OutputError, match="not a shard manifest") as e:
        convert(src, out, "imagefolder", shards=3, overwrite=True)
    assert e.value.path == manifest
    assert _read(manifest) == content  # left untouched


def test_overwrite_refuses_a_shard_file_that_is_not_ours(src, tmp_path):
    out = str(tmp_path / "s.rec")
    idx = str(tmp_path / "s-00002-of-00003.idx")
    with open(idx, "w") as f:
        f.write("not an index: my notes\n")
    with pytest.raises(OutputError, match="RecordIO index") as e:
        convert(src, out, "imagefolder", shards=3, overwrite=True)
    assert e.value.path == idx and not os.path.exists(str(tmp_path / "s.shards.json"))


def test_overwrite_replaces_a_manifest_of_ours_of_another_plan(src, tmp_path):
    out = str(tmp_path / "s.rec")
    convert(src, out, "imagefolder", shards=3)
    with pytest.raises(FileExistsError, match="not written by this plan"):
        convert(src, out, "imagefolder", shards=2)
    report = convert(src, out, "imagefolder", shards=2, overwrite=True)
    assert len(report.shards) == 2 and verify(report.outputs["train"]).ok


# ------------------------------------------------------------------------- options
def test_an_unknown_option_lists_the_valid_ones():
    with pytest.raises(TypeError, match="unknown conversion option.*bogus.*valid: split"):
        ConvertOptions(bogus=1)


@pytest.mark.parametrize("option", [dict(masks_dir="m"), dict(images_dir="i"),
                                    dict(lst_root="."), dict(mask_encoding="png"),
                                    dict(ignore_label=0)])
@pytest.mark.parametrize("shards", [None, 2])
def test_an_option_the_layout_ignores_is_refused(src, tmp_path, option, shards):
    (name,) = option
    with pytest.raises(ValueError, match="imagefolder layout.*takes no %s" % name):
        convert(src, str(tmp_path / "c.rec"), "imagefolder", shards=shards, **option)
    assert os.listdir(str(tmp_path)) == ["folder"]


def test_the_environment_checkpoint_default_never_fails_a_sharded_conversion(
        src, tmp_path, monkeypatch):
    monkeypatch.setenv("GLUON_DATA_CHECKPOINT_EVERY", "2")
    report = convert(src, str(tmp_path / "s.rec"), "imagefolder", shards=2)
    assert len(report.shards) == 2
    assert convert(src, str(tmp_path / "c.rec"), "imagefolder").written == {"train": 9}



def test_the_environment_checkpoint_default_never_fails_a_sharded_command(src, tmp_path,
                                                                            monkeypatch):
    """The command too: the variable applies where checkpoints are taken, and is blamed on
    no option the user did not pass."""
    from gluon_data.cli import main
    monkeypatch.setenv("GLUON_DATA_CHECKPOINT_EVERY", "2")
    out = str(tmp_path / "s.rec")
    assert main(["convert", src, out, "--layout", "imagefolder", "--shards", "2",
                 "--quiet", "--workers", "1"]) == 0
    assert verify(str(tmp_path / "s.shards.json")).ok


def test_a_storage_option_for_local_paths_is_refused(src, tmp_path, capsys):
    """--storage-option configures a SOURCE or OUTPUT at a URI: with both local it would be
    dropped silently, so the command refuses it and writes nothing."""
    from gluon_data.cli import main
    before = sorted(os.listdir(str(tmp_path)))
    rc = main(["convert", src, str(tmp_path / "o.rec"), "--layout", "imagefolder",
               "--storage-option", "anon=true", "--quiet"])
    assert rc != 0
    assert "--storage-option applies to a SOURCE or OUTPUT at a URI" in capsys.readouterr().err
    assert sorted(os.listdir(str(tmp_path))) == before


# ------------------------------------------------------------------------- object storage
@pytest.fixture(scope="module")
def s3():
    pytest.importorskip("moto.server")
    from s3_server import s3_session  # framework-free (test_remote is Gluon's)
    with s3_session("rule") as session:
        yield session


def _same_size_rewrite(fs, uri):
    data = bytearray(fs.cat(uri))
    data[-2] = ord("9") if data[-2] != ord("9") else ord("8")
    fs.pipe(uri, bytes(data))


@pytest.mark.parametrize("shards", [None, 3])
def test_a_same_size_idx_rewritten_in_storage_is_sent_again_on_resume(s3, src, tmp_path,
                                                                      shards):
    from gluon_data.convert.to_uri import convert_to_uri
    server, opts, fs, base = s3
    out = base + "/s%s/c.rec" % shards
    idx = out[:-4] + ("-00001-of-00003.idx" if shards else ".idx")
    kw = dict(storage_options=opts, cache_dir=str(tmp_path / "cache"), shards=shards)
    convert_to_uri(src, out, "imagefolder", **kw)
    good = fs.cat(idx)
    _same_size_rewrite(fs, idx)
    assert fs.cat(idx) != good and len(fs.cat(idx)) == len(good)
    server.log.clear()
    convert_to_uri(src, out, "imagefolder", resume=True, **kw)
    puts = {e[1].rsplit("/", 1)[-1] for e in server.log if e[0] == "PUT"}
    assert idx.rsplit("/", 1)[-1] in puts
    assert fs.cat(idx) == good
    if shards:  # the other shards are proved done by their ETags: not sent again
        assert "c-00000-of-00003.rec" not in puts and "c-00002-of-00003.idx" not in puts


def test_a_copy_of_a_dataset_refuses_an_encoding_option(src, tmp_path):
    rec = str(tmp_path / "c.rec")
    convert(src, rec, "imagefolder")
    with pytest.raises(ValueError, match="copy of a converted dataset.*takes no encoding"):
        convert(rec, str(tmp_path / "c.lmdb"), encoding="jpg")
    assert not os.path.exists(str(tmp_path / "c.lmdb"))
    assert len(open_store(convert(rec, str(tmp_path / "c.lmdb"), workers=2).outputs[
        "train"])) == 9


def test_the_command_resumes_a_sharded_conversion(src, tmp_path):
    """--resume means the same for every conversion kind: a sharded conversion accepts it
    (what the interrupted command's message tells the user to run)."""
    import subprocess
    import sys
    out = str(tmp_path / "s.rec")
    cmd = [sys.executable, "-m", "gluon_data", "convert", src, out, "--layout", "imagefolder",
           "--shards", "3", "--quiet", "--workers", "1"]
    import gluon_data  # the subprocess runs the package under test
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(gluon_data.__file__)))
    env.pop("GLUON_DATA_CHECKPOINT_EVERY", None)
    subprocess.run(cmd, check=True, env=env, capture_output=True, timeout=120,
                   cwd=str(tmp_path))
    _idx_loses_a_line(out[:-4] + "-00002-of-00003.rec")
    p = subprocess.run(cmd + ["--resume"], env=env, capture_output=True, text=True,
                       timeout=120, cwd=str(tmp_path))
    assert p.returncode == 0, p.stderr
    assert p.stdout.count("kept (already done)") == 2 and "written" in p.stdout
    assert verify(str(tmp_path / "s.shards.json")).ok


@pytest.mark.parametrize("name,home", [("convert_sharded", "sharded"),
                                       ("convert_to_uri", "to_uri"), ("copy_dataset", "copy"),
                                       ("import_lmdb", "copy"), ("convert_local", "local")])
def test_the_internal_conversion_functions_warn_and_still_work(name, home):
    """convert() is the one public entry; the functions it dispatches to still import from
    gluon_data.convert, with a DeprecationWarning naming where the name lives."""
    import importlib
    import warnings
    package = importlib.import_module("gluon_data.convert")
    assert name not in package.__all__
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value = getattr(package, name)
    (w,) = [c for c in caught if issubclass(c.category, DeprecationWarning)]
    assert "gluon_data.convert." + home in str(w.message)
    assert value is getattr(importlib.import_module("gluon_data.convert." + home), name)
