"""What a writing command was given, and what it must not write over: salvage refuses
anything but a single .rec, a conversion refuses an output that is (or links to) a file of
its input, and verify reports a binary index readers cannot use. Every refusal leaves every
byte of every file as it was."""
import hashlib
import os
import shutil

import pytest

from gluon_data import convert
from gluon_data.cli import main
from gluon_data.convert import copy_dataset
from gluon_data.errors import FormatError, OutputError
from gluon_data.stores.recordio import binary_index_problem, write_binary_index
from gluon_data.tools.salvage import salvage
from gluon_data.stores.shardstore import ShardedStore
from gluon_data.convert.sharded import convert_sharded
from gluon_data.stores.base import open_store
from gluon_data.tools.verify import verify


def tree_hashes(*roots):
    """``{path: sha256}`` of every file below ``roots`` (and of the files themselves)."""
    out = {}
    for root in roots:
        if os.path.isfile(root):
            with open(root, "rb") as f:
                out[root] = hashlib.sha256(f.read()).hexdigest()
            continue
        for d, _, names in os.walk(root):
            for n in names:
                p = os.path.join(d, n)
                with open(p, "rb") as f:
                    out[p] = hashlib.sha256(f.read()).hexdigest()
    return out


def payloads(location):
    store = open_store(location)
    return [store.read(i) for i in range(len(store))]


@pytest.fixture
def rec(voc_rec, tmp_path):
    """A private copy of a converted .rec (with its .idx, .idx.gdx, .meta.json)."""
    d = tmp_path / "d"
    d.mkdir()
    for ext in (".rec", ".idx", ".idx.gdx", ".meta.json"):
        shutil.copy(voc_rec[:-4] + ext, str(d / ("train" + ext)))
    return str(d / "train.rec")


@pytest.fixture
def manifest(voc_root, tmp_path):
    out = str(tmp_path / "s" / "train.rec")
    convert_sharded(voc_root, out, "voc", split="trainval", shards=3)
    return out[:-4] + ".shards.json"


@pytest.fixture
def lmdb_dir(rec, tmp_path):
    out = str(tmp_path / "l" / "train.lmdb")
    copy_dataset(rec, out)
    return out


# ---------------------------------------------------------------- salvage: what it was given
def test_salvage_of_a_manifest_is_refused_and_no_byte_changes(manifest, capsys):
    folder = os.path.dirname(manifest)
    before, records = tree_hashes(folder), payloads(manifest)
    assert main(["salvage", manifest]) == 1
    err = capsys.readouterr().err
    assert manifest in err and "shard manifest" in err and "salvage each shard's .rec" in err
    assert main(["salvage", manifest, "--overwrite"]) == 1
    assert tree_hashes(folder) == before  # no .damaged-tail, no .shards.idx, nothing cut
    assert payloads(manifest) == records


@pytest.mark.parametrize("kind", ["lmdb", "folder", "idx", "meta", "uri"])
def test_salvage_refuses_an_lmdb_a_folder_an_index_a_uri(kind, lmdb_dir, rec, voc_root):
    where = {"lmdb": lmdb_dir, "folder": voc_root, "idx": rec[:-4] + ".idx",
             "meta": rec[:-4] + ".meta.json", "uri": "s3://bucket/train.rec"}[kind]
    roots = [os.path.dirname(lmdb_dir), os.path.dirname(rec), voc_root]
    before = tree_hashes(*roots)
    with pytest.raises(FormatError) as e:
        salvage(where, overwrite=True)
    assert e.value.path == where and "salvage repairs a single .rec file" in str(e.value)
    assert tree_hashes(*roots) == before


def test_salvage_rewrites_the_binary_index_with_the_index(rec):
    n = len(open_store(rec))
    os.truncate(rec, os.path.getsize(rec) - 7)  # a writer killed in the last record
    os.remove(rec[:-4] + ".idx")  # and its index lost: the old .gdx describes no .idx
    assert "describes another .idx" in binary_index_problem(rec[:-4] + ".idx")
    assert salvage(rec).records == n - 1
    assert binary_index_problem(rec[:-4] + ".idx") is None  # rewritten with the new index
    assert verify(rec, deep=True).ok


# ---------------------------------------------------------------- output shares the input
@pytest.mark.parametrize("shards", ["3", "2"])
def test_resharding_onto_its_own_prefix_is_refused_source_intact(manifest, shards, capsys):
    folder = os.path.dirname(manifest)
    before, records = tree_hashes(folder), payloads(manifest)
    out = manifest[:-len(".shards.json")] + ".rec"
    assert main(["convert", manifest, out, "--shards", shards, "--overwrite", "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "file of the input" in err and "nothing was written" in err
    assert tree_hashes(folder) == before
    assert payloads(manifest) == records  # record for record
    assert verify(manifest, deep=True).ok


def test_copying_a_rec_onto_itself_is_refused(rec, capsys):
    before = tree_hashes(os.path.dirname(rec))
    assert main(["convert", rec, rec, "--overwrite", "--quiet"]) == 1
    assert "file of the input" in capsys.readouterr().err
    with pytest.raises(OutputError):
        copy_dataset(rec, rec, overwrite=True)
    assert tree_hashes(os.path.dirname(rec)) == before


def test_copying_an_lmdb_onto_itself_is_refused(lmdb_dir):
    before, records = tree_hashes(lmdb_dir), payloads(lmdb_dir)
    with pytest.raises(OutputError) as e:
        convert(lmdb_dir, lmdb_dir, overwrite=True)
    assert "file of the input" in str(e.value)
    assert tree_hashes(lmdb_dir) == before and payloads(lmdb_dir) == records


def test_an_output_through_a_symlinked_folder_onto_the_input_is_refused(rec, tmp_path):
    link = tmp_path / "link"
    link.symlink_to(os.path.dirname(rec), target_is_directory=True)
    before = tree_hashes(os.path.dirname(rec))
    with pytest.raises(OutputError) as e:
        copy_dataset(rec, str(link / "train.rec"), overwrite=True)
    assert "(a link: the same file)" in str(e.value) and rec in str(e.value)
    with pytest.raises(OutputError):  # the source read through the link
        copy_dataset(str(link / "train.rec"), rec, overwrite=True)
    assert tree_hashes(os.path.dirname(rec)) == before


def test_an_output_hard_linked_to_an_input_file_is_refused(rec, tmp_path):
    out = tmp_path / "o"
    out.mkdir()
    os.link(rec[:-4] + ".idx", str(out / "copy.idx"))  # shares the input's index
    before = tree_hashes(os.path.dirname(rec), str(out))
    with pytest.raises(OutputError) as e:
        copy_dataset(rec, str(out / "copy.rec"), overwrite=True)
    assert e.value.path == str(out / "copy.idx") and rec[:-4] + ".idx" in str(e.value)
    os.link(rec, str(out / "copy-00000-of-00001.rec"))
    with pytest.raises(OutputError):
        convert_sharded(rec, str(out / "copy.rec"), shards=1, overwrite=True)
    os.remove(str(out / "copy-00000-of-00001.rec"))
    assert tree_hashes(os.path.dirname(rec), str(out)) == before


# ---------------------------------------------------------------- verify: the binary index
def test_verify_deep_reports_a_damaged_binary_index_with_the_rebuild(rec, capsys):
    gdx = rec[:-4] + ".idx.gdx"
    data = bytearray(open(gdx, "rb").read())
    data[-5] ^= 0x40  # the body: readers ignore the copy and parse the text
    with open(gdx, "wb") as f:
        f.write(data)
    records = payloads(rec)
    assert main(["verify", rec, "--deep"]) == 1
    cap = capsys.readouterr()  # the verdict on stdout, each problem on stderr
    assert "1 problem(s)" in cap.out, cap.out
    assert gdx in cap.err and "damaged body" in cap.err and "write_binary_index" in cap.err
    # the hint is true: remove it, rebuild it from the .idx, and all is well again
    os.remove(gdx)
    assert verify(rec, deep=True).ok and payloads(rec) == records
    write_binary_index(rec[:-4] + ".idx")
    assert binary_index_problem(rec[:-4] + ".idx") is None
    assert main(["verify", rec, "--deep"]) == 0 and payloads(rec) == records


def test_verify_reports_a_binary_index_of_another_idx(rec):
    idx = rec[:-4] + ".idx"
    with open(idx, "ab") as f:
        f.write(b"\n")  # the same records (a blank line), another file: the copy is stale
    report = verify(rec)
    assert not report.ok and [p["where"] for p in report.problems] == [idx + ".gdx"]
    assert "describes another .idx" in report.problems[0]["reason"]


def test_an_output_named_like_a_manifest_needs_sharding(rec, voc_root, tmp_path, capsys):
    out = str(tmp_path / "o" / "train.shards.json")
    for args in ([rec, out], [voc_root, out, "--layout", "voc", "--split", "trainval"]):
        assert main(["convert", *args, "--quiet"]) == 1  # (was: a .rec under that name)
        assert "names a shard manifest" in capsys.readouterr().err
        assert not os.path.exists(os.path.dirname(out)) or os.listdir(os.path.dirname(out)) == []
    assert main(["convert", rec, out, "--shards", "2", "--quiet"]) == 0
    assert payloads(out) == payloads(rec)
