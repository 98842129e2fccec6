"""One input-kind check for every command: a FIFO, a device, or a link to one, given as a
dataset or found beside a ``.rec`` as its ``.idx``, is refused before it is opened -- promptly
(a FIFO never blocks an ``open``), with a typed error naming the file and saying what it is,
and with nothing written (salvage makes no ``.idx``).

The commands run as a user runs them (a subprocess, under a timeout: a hang fails the test
instead of hanging the suite); the library calls run in this process where they cannot
block, else in a subprocess under the same timeout."""
import fcntl
import os
import shutil
import stat
import subprocess
import sys
import textwrap

import pytest

from gluon_data.tools import verify
from gluon_data.errors import FormatError
from gluon_data.storage.fileio import open_or_explain, require_regular
from gluon_data.stores.recordio import RecordFile
from gluon_data.tools.salvage import salvage
from gluon_data.stores.base import open_store
from gluon_data.stores.lmdbio import is_lmdb
from gluon_data.format.ownership import classify_location

TIMEOUT = 60  # seconds: each of these returns in about one; a blocked open never does

#: kind -> (the file planted, what the refusal must call it)
KINDS = {
    "fifo-rec": ("x.rec", "a FIFO"),             # os.mkfifo("x.rec"): `salvage pipe.rec`
    "devzero-rec": ("x.rec", "a character device"),  # x.rec -> /dev/zero
    "fifo-idx": ("x.idx", "a FIFO"),             # a real .rec, a FIFO as its .idx
    "loop-rec": ("x.rec", "a symbolic link that loops"),  # x.rec -> x.rec: neither a file
}                                                          # nor missing

COMMANDS = ("salvage", "verify", "info", "show", "stats", "convert")


def plant(kind, folder, voc_rec):
    """``folder/x.rec`` with the non-regular file of ``kind``; returns (x.rec, the planted
    path)."""
    os.makedirs(folder, exist_ok=True)
    rec = os.path.join(folder, "x.rec")
    bad = os.path.join(folder, KINDS[kind][0])
    if kind == "fifo-rec":
        os.mkfifo(rec)
    elif kind == "devzero-rec":
        os.symlink("/dev/zero", rec)
    elif kind == "loop-rec":
        os.symlink("x.rec", rec)
    else:  # the real .rec and its metadata, a FIFO where its index belongs
        for ext in (".rec", ".meta.json"):
            shutil.copy(voc_rec[:-4] + ext, rec[:-4] + ext)
        os.mkfifo(bad)
    return rec, bad


def listing(folder):
    """Every name in ``folder`` with its file type (lstat): nothing added, nothing replaced."""
    return {n: stat.S_IFMT(os.lstat(os.path.join(folder, n)).st_mode)
            for n in sorted(os.listdir(folder))}


def run(args, what, cwd=None):
    try:
        return subprocess.run(args, capture_output=True, text=True, timeout=TIMEOUT,
                              stdin=subprocess.DEVNULL, cwd=cwd)
    except subprocess.TimeoutExpired:
        pytest.fail("%s blocked for %d s on a non-regular input" % (what, TIMEOUT))


def cli(*args):
    return run([sys.executable, "-m", "gluon_data", *args], "gluon-data " + " ".join(args))


def assert_refusal(text, bad, words):
    assert bad in text and words in text and "regular file" in text, text


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_refuses_a_non_regular_input_promptly_and_writes_nothing(
        tmp_path, voc_rec, command, kind):
    folder = str(tmp_path / "d")
    rec, bad = plant(kind, folder, voc_rec)
    out = str(tmp_path / "out")  # the outputs of show and convert go outside the folder
    os.makedirs(out)
    args = {"salvage": ["salvage", rec], "verify": ["verify", rec], "info": ["info", rec],
            "show": ["show", rec, "--out", os.path.join(out, "sample.png")],
            "stats": ["stats", rec],
            "convert": ["convert", rec, os.path.join(out, "x.lmdb"), "--quiet"]}[command]
    before = listing(folder)
    p = cli(*args)
    assert p.returncode == 1, (p.returncode, p.stdout, p.stderr)
    assert p.stderr.startswith("gluon-data: error: ") and "Traceback" not in p.stderr, p.stderr
    assert_refusal(p.stderr, bad, KINDS[kind][1])
    assert listing(folder) == before  # no .idx (nor anything) made, the FIFO left as it is
    assert os.listdir(out) == []


@pytest.mark.timeout(TIMEOUT)  # none of these can block (the FIFO .rec's salvage: below)
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_the_library_refuses_a_non_regular_input_with_a_typed_error(tmp_path, voc_rec, kind):
    folder = str(tmp_path / "d")
    rec, bad = plant(kind, folder, voc_rec)
    before = listing(folder)
    calls = [lambda: verify(rec), lambda: open_store(rec), lambda: RecordFile(rec)]
    if kind != "fifo-rec":  # today's salvage opens a FIFO .rec: in a subprocess, below
        calls.append(lambda: salvage(rec, overwrite=True))
    for call in calls:
        with pytest.raises(FormatError) as e:
            call()
        assert e.value.path == bad
        assert_refusal(str(e.value), bad, KINDS[kind][1])
    assert listing(folder) == before


def run_python(code, what):
    return run([sys.executable, "-c", textwrap.dedent(code)], what)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_salvage_of_a_non_regular_rec_never_blocks_nor_writes_an_index(tmp_path, voc_rec, kind):
    """The issue: ``salvage pipe.rec`` waited forever in ``open``; a ``.rec`` link to
    ``/dev/zero`` was "salvaged" into an empty ``.idx``."""
    folder = str(tmp_path / "d")
    rec, bad = plant(kind, folder, voc_rec)
    before = listing(folder)
    p = run_python("""
        from gluon_data.errors import FormatError
        from gluon_data.tools.salvage import salvage
        try:
            print("SALVAGED", salvage(%r, overwrite=True))
        except FormatError as e:
            print("REFUSED", e.path, e)
    """ % rec, "salvage(%s)" % kind)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.startswith("REFUSED %s " % bad), p.stdout
    assert_refusal(p.stdout, bad, KINDS[kind][1])
    assert listing(folder) == before


def test_reading_an_index_that_is_a_fifo_never_blocks(tmp_path, voc_rec):
    folder = str(tmp_path / "d")
    rec, bad = plant("fifo-idx", folder, voc_rec)
    p = run_python("""
        from gluon_data.errors import FormatError
        from gluon_data.storage.fileio import open_or_explain
        from gluon_data.stores.recordio import read_index
        for call in (lambda: read_index(%r), lambda: read_index(%r, binary=False),
                     lambda: open_or_explain(%r)):
            try:
                call()
                print("READ")
            except FormatError as e:
                print("REFUSED", e)
    """ % (bad, bad, bad), "read_index(FIFO)")
    lines = p.stdout.splitlines()
    assert p.returncode == 0 and len(lines) == 3, p.stdout + p.stderr[-2000:]
    for ln in lines:
        assert ln.startswith("REFUSED") and "a FIFO" in ln and bad in ln, p.stdout


def test_a_link_to_a_regular_file_is_followed_and_descriptors_stay_blocking(tmp_path, voc_rec):
    """The rule follows symbolic links, to regular files only: a linked dataset still opens,
    and the descriptor opened without blocking is handed back blocking, as any other."""
    folder = tmp_path / "links"
    folder.mkdir()
    for ext in (".rec", ".idx", ".meta.json"):
        os.symlink(voc_rec[:-4] + ext, str(folder / ("v" + ext)))
    rec = str(folder / "v.rec")
    assert require_regular(rec).st_size == os.path.getsize(voc_rec)
    assert require_regular(str(tmp_path), directory=True) is not None
    with pytest.raises(FormatError, match=r"not a regular file \(a directory\)"):
        require_regular(str(tmp_path))
    assert require_regular(str(tmp_path / "missing.rec")) is None  # the caller's message
    fd = open_or_explain(rec)
    try:
        assert not fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_NONBLOCK
    finally:
        os.close(fd)
    assert len(open_store(rec)) == 16 and verify(rec).ok
    p = cli("info", rec, "--json")
    assert p.returncode == 0 and '"records": 16' in p.stdout, p.stderr


@pytest.mark.parametrize("part,what", [(".idx", "the index"), (".meta.json", "the metadata"),
                                       (".idx.gdx", "the binary index")])
def test_a_part_of_a_dataset_is_named_as_such_not_as_corruption(voc_rec, tmp_path, part, what):
    """``info x.idx`` (or its metadata) is a mistake of names, not a damaged dataset: the
    message says what the file is and which path to give."""
    for ext in (".rec", ".idx", ".meta.json"):
        shutil.copy(voc_rec[:-4] + ext, str(tmp_path / ("v" + ext)))
    path = str(tmp_path / ("v" + part))
    if not os.path.exists(path):
        open(path, "wb").close()
    p = cli("info", path)
    assert p.returncode == 1 and p.stdout == ""
    assert "this is %s of a dataset, not a dataset: give the .rec (%s)" % (
        what, str(tmp_path / "v.rec")) in p.stderr, p.stderr
    with pytest.raises(FormatError, match="not a dataset"):
        open_store(path)


def test_verify_of_a_missing_rec_does_not_suggest_salvage(tmp_path):
    """salvage would refuse it too: only a .rec that exists gets that advice."""
    p = cli("verify", str(tmp_path / "missing.rec"))
    assert p.returncode == 1 and "salvage" not in p.stdout + p.stderr
    assert "not found" in p.stderr and "1 problem(s)" in p.stdout


# ------------------------------------------------------------------ parts read beside a dataset
#: what a command finds beside the dataset it is given, planted as a FIFO: (the file, the
#: command's arguments, the dataset kind the command reads)
PARTS = {
    "a shard's index (verify reads its digest)": (
        "sh-00000-of-00002.idx", ["verify", "sh.shards.json"], "sharded"),
    "a shard's .rec (verify)": (
        "sh-00000-of-00002.rec", ["verify", "sh.shards.json"], "sharded"),
    "the checkpoint a --resume reads": (
        "o.rec.resume.json", ["convert", "VOC2012", "o.rec", "--layout", "voc", "--split",
                              "train", "--resume", "--quiet"], "rec"),
    "an LMDB's data.mdb (info)": ("d.lmdb/data.mdb", ["info", "d.lmdb"], "lmdb"),
    "an LMDB's data.mdb (copied)": ("d.lmdb/data.mdb", ["convert", "d.lmdb", "c.rec"], "lmdb"),
    "the partial LMDB a --resume reads": (
        "o.lmdb.partial/data.mdb", ["convert", "VOC2012", "o.lmdb", "--layout", "voc",
                                    "--split", "train", "--format", "lmdb", "--resume",
                                    "--quiet"], "lmdb"),
}


@pytest.fixture(scope="module")
def datasets(voc_root, tmp_path_factory):
    """A folder holding the VOC source, a sharded dataset of it (2 shards) and an LMDB."""
    folder = tmp_path_factory.mktemp("parts")
    shutil.copytree(voc_root, str(folder / "VOC2012"))
    for out, extra in (("sh.rec", ["--shards", "2"]), ("d.lmdb", ["--format", "lmdb"])):
        p = run([sys.executable, "-m", "gluon_data", "convert", str(folder / "VOC2012"),
                 str(folder / out), "--layout", "voc", "--split", "train", "--quiet", *extra],
                "convert")
        assert p.returncode == 0, p.stderr
    return str(folder)


@pytest.mark.parametrize("how,words", [("fifo", "a FIFO"),
                                       ("loop", "a symbolic link that loops")])
@pytest.mark.parametrize("part", sorted(PARTS))
def test_a_part_found_beside_a_dataset_that_is_not_a_file_is_refused_promptly(
        datasets, tmp_path, part, how, words):
    """A FIFO, or a symbolic link that loops, found where a dataset keeps a part (a shard's
    file, a checkpoint, an LMDB's data file) is refused naming it and saying what it is:
    ``verify`` of a manifest and ``convert --resume`` once waited forever on a FIFO, a FIFO
    ``data.mdb`` was called a folder of unknown layout, and a looping link was "missing"."""
    name, args, _ = PARTS[part]
    folder = str(tmp_path / "w")
    shutil.copytree(datasets, folder)
    bad = os.path.join(folder, name)
    if os.path.exists(bad):
        os.remove(bad)
    os.makedirs(os.path.dirname(bad), exist_ok=True)
    if how == "fifo":
        os.mkfifo(bad)
    else:
        os.symlink(os.path.basename(bad), bad)
    before = listing(folder), listing(os.path.dirname(bad))
    p = run([sys.executable, "-m", "gluon_data", *args], "gluon-data " + " ".join(args),
            cwd=folder)
    p_text = p.stdout + p.stderr
    assert p.returncode == 1 and "Traceback" not in p_text, p_text
    assert os.path.relpath(bad, folder) in p_text and words in p_text, p_text
    assert "regular file" in p_text, p_text
    assert (listing(folder), listing(os.path.dirname(bad))) == before


@pytest.mark.parametrize("how,words", [("fifo", "a FIFO"),
                                       ("loop", "a symbolic link that loops")])
def test_reading_a_sharded_dataset_names_a_shard_that_is_not_a_file(datasets, tmp_path, how,
                                                                     words):
    """Reading (not verifying) a manifest's shards: a shard's ``.rec`` that is a FIFO was
    "0 bytes, the manifest says N", and a looping link "missing"; each is now named for what
    it is."""
    folder = str(tmp_path / "w")
    shutil.copytree(datasets, folder)
    bad = os.path.join(folder, "sh-00001-of-00002.rec")
    os.remove(bad)
    if how == "fifo":
        os.mkfifo(bad)
    else:
        os.symlink(os.path.basename(bad), bad)
    store = open_store(os.path.join(folder, "sh.shards.json"))
    with pytest.raises(FormatError) as e:
        store.read(len(store) - 1)  # a record of the second shard
    assert e.value.path == bad and "shard 1 of 2" in str(e.value), str(e.value)
    assert "is damaged: not a regular file (%s" % words in str(e.value), str(e.value)


def test_a_folder_whose_data_mdb_is_not_a_file_is_an_lmdb_everywhere(tmp_path):
    """One rule says what makes a folder an LMDB (a ``data.mdb`` entry of any kind): the
    location kind every command asks and the stores agree, so ``salvage`` names it an LMDB,
    and a link to nothing is named as such when read."""
    fifo, dangling = tmp_path / "f.lmdb", tmp_path / "d.lmdb"
    fifo.mkdir()
    dangling.mkdir()
    os.mkfifo(str(fifo / "data.mdb"))
    os.symlink("gone.mdb", str(dangling / "data.mdb"))
    for folder in (fifo, dangling):
        assert classify_location(str(folder)) == "lmdb" and is_lmdb(str(folder))
    with pytest.raises(FormatError, match="symbolic link to gone.mdb, which does not exist"):
        open_store(str(dangling))
    p = cli("salvage", str(fifo))
    assert p.returncode == 1 and "this is an LMDB environment" in p.stderr, p.stderr


def test_the_library_readers_of_a_whole_file_refuse_a_fifo(tmp_path, voc_rec):
    """The whole-file readers under the one input rule: a file's digest, a JSON document, and
    MXNet's indexed reader's ``.idx``, each refusing a FIFO with a typed error naming it."""
    folder = str(tmp_path / "d")
    rec, bad = plant("fifo-idx", folder, voc_rec)
    p = run_python("""
        from gluon_data.errors import FormatError
        from gluon_data.format.documents import load_document
        from gluon_data.mx_recordio import MXIndexedRecordIO
        from gluon_data.storage.fsutil import sha256_file
        for call in (lambda: sha256_file(%r), lambda: load_document(%r, "manifest"),
                     lambda: MXIndexedRecordIO(%r, %r, "r")):
            try:
                call()
                print("READ")
            except FormatError as e:
                print("REFUSED", e.path, e)
    """ % (bad, bad, bad, rec), "whole-file readers(FIFO)")
    lines = p.stdout.splitlines()
    assert p.returncode == 0 and len(lines) == 3, p.stdout + p.stderr[-2000:]
    for ln in lines:
        assert ln.startswith("REFUSED %s " % bad) and "a FIFO" in ln, p.stdout
