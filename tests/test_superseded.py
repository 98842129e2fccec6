"""A sharded dataset written again with other shards: the old manifest's shards that the new
run does not write are removed once the new manifest is written, and nothing else is: not
before (a failed run keeps them), not a file of the source, not another prefix's shards, not
a file that is not ours. Real conversions on real files."""
import os
import shutil

import pytest

from gluon_data.convert import convert
from gluon_data.convert.outputs import ConversionReport
from gluon_data.convert.sample import make_imagefolder
from gluon_data.convert.shard_plan import SplitPlan
from gluon_data.convert.superseded import remove_superseded, replace_datasets
from gluon_data.errors import GluonDataError, OutputError
from gluon_data.stores.base import open_store
from gluon_data.stores.shards import dataset_files


@pytest.fixture
def src(tmp_path):
    return make_imagefolder(str(tmp_path / "folder"), per_class=3)


def _names(folder, part=""):
    return sorted(n for n in os.listdir(folder) if part in n)


def _bytes(folder, part):
    return {n: open(os.path.join(folder, n), "rb").read()
            for n in _names(folder, part) if os.path.isfile(os.path.join(folder, n))}


def test_resharding_removes_the_old_shards_once_the_new_dataset_is_written(src, tmp_path):
    """4 shards, then 2 (``--overwrite``: another plan): the 4 old shards' files are gone,
    the report says so, the folder holds the new dataset alone; a file no manifest named,
    shaped like a shard name, is left."""
    folder, out = tmp_path / "o", str(tmp_path / "o" / "c.rec")
    convert(src, out, "imagefolder", shards=4)
    assert len(_names(folder, "-of-00004")) == 4 * 4  # .rec, .idx, .idx.gdx, .meta.json
    user = folder / "c-00007-of-00008.rec"
    user.write_bytes(b"a user's file")
    with pytest.raises(FileExistsError, match="not written by this plan"):
        convert(src, out, "imagefolder", shards=2)
    assert len(_names(folder, "-of-00004")) == 16  # refused: nothing removed
    report = convert(src, out, "imagefolder", shards=2, overwrite=True)
    assert _names(folder, "-of-00004") == []
    assert sorted(os.path.basename(p) for p in report.removed) == [
        "c-%05d-of-00004.rec" % k for k in range(4)]
    assert "removed 4 shards of the dataset this one replaces" in str(report)
    assert _names(folder, ".rec") == ["c-00000-of-00002.rec", "c-00001-of-00002.rec",
                                      "c-00007-of-00008.rec"]
    assert user.read_bytes() == b"a user's file"
    assert len(open_store(str(folder / "c.shards.json"))) == 9


def test_another_container_and_lmdb_shards_are_superseded_too(src, tmp_path):
    folder = tmp_path / "o"
    convert(src, str(folder / "c.lmdb"), "imagefolder", shards=3)
    convert(src, str(folder / "c.lmdb"), "imagefolder", shards=2, overwrite=True)
    assert _names(folder, ".lmdb") == ["c-00000-of-00002.lmdb", "c-00001-of-00002.lmdb"]
    report = convert(src, str(folder / "c.rec"), "imagefolder", shards=2, overwrite=True)
    assert _names(folder, ".lmdb") == [] and len(report.removed) == 2
    assert len(open_store(str(folder / "c.shards.json"))) == 9


def test_a_failed_reshard_removes_no_old_shard(src, tmp_path):
    folder, out = tmp_path / "o", str(tmp_path / "o" / "c.rec")
    convert(src, out, "imagefolder", shards=3)
    before = _bytes(folder, "-of-00003")
    bad = os.path.join(src, sorted(os.listdir(src))[-1])
    bad = os.path.join(bad, sorted(os.listdir(bad))[-1])
    good = open(bad, "rb").read()
    with open(bad, "r+b") as f:  # the last item's JPEG cut short: its shard fails
        f.truncate(200)
    with pytest.raises(GluonDataError):
        convert(src, out, "imagefolder", shards=2, overwrite=True)
    assert _bytes(folder, "-of-00003") == before  # every old shard file, byte for byte
    # the old manifest names no shard the run rewrote: kept, the old dataset whole
    assert len(open_store(str(folder / "c.shards.json"))) == 9
    with open(bad, "wb") as f:
        f.write(good)
    report = convert(src, out, "imagefolder", shards=2, overwrite=True)  # the rerun
    assert len(report.removed) == 3 and _names(folder, "-of-00003") == []


def test_a_reshard_of_an_old_shard_keeps_that_shard(src, tmp_path):
    """The source is shard 1 of the dataset the output replaces: shards 0 and 2 are
    removed, shard 1 (read by the run) is kept as it was."""
    folder, out = tmp_path / "o", str(tmp_path / "o" / "c.rec")
    convert(src, out, "imagefolder", shards=3)
    one = _bytes(folder, "c-00001-of-00003")
    report = convert(str(folder / "c-00001-of-00003.rec"), out, shards=2, overwrite=True)
    assert _bytes(folder, "c-00001-of-00003") == one
    assert _names(folder, "c-00000-of-00003") == _names(folder, "c-00002-of-00003") == []
    assert len(report.removed) == 2
    assert len(open_store(str(folder / "c.shards.json"))) == 3


def test_shards_of_another_prefix_named_by_the_old_manifest_are_left(src, tmp_path):
    """``b.shards.json`` replaced, which names ``a``'s shards (a copy of ``a``'s manifest):
    nothing of ``a`` is removed."""
    folder = tmp_path / "o"
    convert(src, str(folder / "a.rec"), "imagefolder", shards=2)
    shutil.copy(folder / "a.shards.json", folder / "b.shards.json")
    before = _bytes(folder, "a-")
    report = convert(src, str(folder / "b.rec"), "imagefolder", shards=3, overwrite=True)
    assert report.removed == [] and _bytes(folder, "a-") == before
    assert len(open_store(str(folder / "a.shards.json"))) == 9


def test_an_old_shard_that_is_not_ours_stops_the_run_before_anything_changes(src, tmp_path):
    folder, out = tmp_path / "o", str(tmp_path / "o" / "c.rec")
    convert(src, out, "imagefolder", shards=3)
    foreign = folder / "c-00002-of-00003.rec"
    foreign.write_bytes(b"not a RecordIO file")
    before = _bytes(folder, "")
    with pytest.raises(OutputError, match="c-00002-of-00003.rec") as e:
        convert(src, out, "imagefolder", shards=2, overwrite=True)
    assert "written by gluon-data" in str(e.value)
    assert _bytes(folder, "") == before  # the manifest and every old file kept


def _old(folder, prefix):
    """The old dataset's shards as :func:`replace_datasets` lists them (a plan writing
    none of them: the old manifest stays)."""
    plan = SplitPlan("train", str(folder / prefix), str(folder / prefix) + ".shards.json",
                     jobs=[], digest="", names="", doc={})
    source = str(folder / "elsewhere.rec")
    return replace_datasets([plan], source, dataset_files(source)).shards


def test_a_shard_no_longer_ours_at_removal_is_left_and_reported(src, tmp_path):
    folder = tmp_path / "o"
    convert(src, str(folder / "a.rec"), "imagefolder", shards=2)
    old = _old(folder, "a")
    assert [os.path.basename(s[0]) for s in old] == ["a-00000-of-00002.rec",
                                                     "a-00001-of-00002.rec"]
    foreign = folder / "a-00001-of-00002.idx"
    foreign.write_text("a user's notes\n")
    report = ConversionReport()
    remove_superseded(old, report)
    assert [os.path.basename(p) for p in report.removed] == ["a-00000-of-00002.rec"]
    assert report.left[0]["file"].endswith("a-00001-of-00002.rec")
    assert foreign.read_text() == "a user's notes\n"
    assert (folder / "a-00001-of-00002.rec").exists()
    assert "left " in str(report)


def test_a_shard_replaced_by_another_recordio_file_is_left(src, tmp_path):
    """A RecordIO pair of someone else's at an old shard's name (ours by its first bytes
    alone): not what the old manifest recorded, so left."""
    folder = tmp_path / "o"
    convert(src, str(folder / "a.rec"), "imagefolder", shards=2)
    old = _old(folder, "a")
    convert(src, str(folder / "other.rec"), "imagefolder")
    for ext in (".rec", ".idx", ".meta.json"):
        shutil.copy(folder / ("other" + ext), folder / ("a-00001-of-00002" + ext))
    os.remove(folder / "a-00001-of-00002.idx.gdx")
    report = ConversionReport()
    remove_superseded(old, report)
    assert [os.path.basename(p) for p in report.removed] == ["a-00000-of-00002.rec"]
    assert "changed since the manifest it replaced recorded them" in report.left[0]["reason"]
    assert _bytes(folder, "a-00001-of-00002.rec") == {
        "a-00001-of-00002.rec": open(folder / "other.rec", "rb").read()}


def test_a_removal_the_system_refuses_is_left_and_the_run_succeeds(src, tmp_path,
                                                                   monkeypatch):
    folder, out = tmp_path / "o", str(tmp_path / "o" / "c.rec")
    convert(src, out, "imagefolder", shards=4)
    remove = os.remove

    def refused(path, *a, **k):  # the system refuses one file (as a read-only mount would)
        if os.path.basename(path) == "c-00001-of-00004.rec":
            raise PermissionError(13, "Permission denied", path)
        return remove(path, *a, **k)

    monkeypatch.setattr(os, "remove", refused)
    report = convert(src, out, "imagefolder", shards=2, overwrite=True)
    assert len(report.removed) == 3 and "Permission denied" in report.left[0]["reason"]
    assert len(open_store(str(folder / "c.shards.json"))) == 9


def test_a_source_given_as_a_uri_removes_no_old_shard(src, tmp_path):
    """``file://`` names an old shard: which local files a URI reads cannot be told, so
    none is removed."""
    folder, out = tmp_path / "o", str(tmp_path / "o" / "c.rec")
    convert(src, out, "imagefolder", shards=3)
    before = _bytes(folder, "-of-00003")
    report = convert("file://" + str(folder / "c-00001-of-00003.rec"), out, shards=2,
                     overwrite=True)
    assert report.removed == [] and _bytes(folder, "-of-00003") == before


def test_the_old_manifest_as_a_file_uri_source_is_refused_and_kept(src, tmp_path):
    """``file://`` naming the manifest the output replaces: refused as the output's own
    source before anything is written or removed (it was dropped, then failed to read)."""
    folder, out = tmp_path / "o", str(tmp_path / "o" / "c.rec")
    convert(src, out, "imagefolder", shards=3)
    before = _bytes(folder, "")
    with pytest.raises(OutputError, match="c.shards.json"):
        convert("file://" + str(folder / "c.shards.json"), out, shards=2, overwrite=True)
    assert _bytes(folder, "") == before
    assert len(open_store(str(folder / "c.shards.json"))) == 9
