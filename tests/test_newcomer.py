"""What a newcomer runs into first: ``--classes`` on an image folder, the CLI's parsers, the
input kinds every command recognises alike."""
import json
import os
import subprocess
import sys

import pytest

from gluon_data import convert
from gluon_data.errors import SourceError
from gluon_data.format import codec
from gluon_data.stores.recordio import RecordFile


def _labels(rec):
    f = RecordFile(rec)
    return [codec.unpack(f.read(i)).label for i in range(len(f))]


def _cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "gluon_data.cli", *args], capture_output=True,
                          text=True, cwd=cwd, timeout=120)


def test_classes_are_matched_to_folders_by_name(folder_root, tmp_path):
    out = str(tmp_path / "named.rec")
    convert(folder_root, out, "imagefolder", classes=["dog", "fish", "cat"])
    # the folders are cat/, dog/, fish/ (4 images each, read in that order): cat is named 3rd
    assert _labels(out) == [2.0] * 4 + [0.0] * 4 + [1.0] * 4
    meta = json.load(open(out[:-4] + ".meta.json"))
    assert meta["classes"] == ["dog", "fish", "cat"]


@pytest.mark.parametrize("names, said", [
    (["dog", "fish"], "cat/ not named"),
    (["dog", "fish", "cow"], "no folder is named cow"),
    (["dog", "fish", "cat", "cow"], "no folder is named cow"),
])  # (a name given twice is refused by the options already: test_convert_options)
def test_classes_that_do_not_name_exactly_the_folders_are_refused(folder_root, tmp_path,
                                                                   names, said):
    out = tmp_path / "bad.rec"
    with pytest.raises(SourceError, match=said) as e:
        convert(folder_root, str(out), "imagefolder", classes=names)
    assert e.value.path == folder_root and "cat, dog, fish" in str(e.value)
    assert not out.exists()


def test_classes_on_the_command_line_name_the_folders(folder_root, tmp_path):
    r = _cli("convert", folder_root, str(tmp_path / "x.rec"), "--layout", "imagefolder",
             "--classes", "dog,fish", "--quiet")
    assert r.returncode != 0 and "cat/ not named" in r.stderr, r.stderr


@pytest.fixture(scope="module")
def both(folder_root, tmp_path_factory):
    d = tmp_path_factory.mktemp("both")
    rec, lmdb = str(d / "x.rec"), str(d / "y.lmdb")
    convert(folder_root, rec, "imagefolder")
    convert(folder_root, lmdb, "imagefolder")
    return rec, lmdb


@pytest.mark.parametrize("command", ["info", "stats", "show", "verify", "salvage"])
@pytest.mark.parametrize("part", ["idx", "data.mdb", "lock.mdb"])
def test_every_command_names_a_file_of_a_dataset_as_such(both, command, part):
    """``verify x.idx`` or ``info y.lmdb/data.mdb`` is a mistake of names, not a damaged
    dataset: every command says what the file is and which path to give, never salvage."""
    rec, lmdb = both
    path, give = ((rec[:-4] + ".idx", "give the .rec (%s)" % rec) if part == "idx" else
                  (os.path.join(lmdb, part), "give the LMDB directory (%s)" % lmdb))
    if not os.path.exists(path):
        open(path, "wb").close()  # (lock.mdb: made by a reader)
    before = {f: os.path.getsize(os.path.join(d, f)) for d in (os.path.dirname(rec), lmdb)
              for f in os.listdir(d)}
    r = _cli(command, path)
    assert r.returncode == 1 and "not a dataset: " + give in r.stderr, r.stdout + r.stderr
    assert "salvage can" not in r.stdout + r.stderr
    assert before == {f: os.path.getsize(os.path.join(d, f))
                      for d in (os.path.dirname(rec), lmdb) for f in os.listdir(d)}


def test_the_library_verify_and_salvage_name_a_file_of_a_dataset(both):
    from gluon_data import salvage, verify
    from gluon_data.errors import FormatError
    rec, lmdb = both
    for path in (rec[:-4] + ".idx", os.path.join(lmdb, "data.mdb")):
        with pytest.raises(FormatError, match="not a dataset: give") as e:
            verify(path)
        assert e.value.path == path
        with pytest.raises(FormatError, match="salvage repairs a single .rec file; this is "):
            salvage(path, overwrite=True)
    assert verify(rec).ok and verify(lmdb).ok


def test_no_option_is_taken_by_an_abbreviation():
    from gluon_data.cli.parser import build_parser
    p = build_parser()
    for argv in (["demo", "--worker", "2"], ["convert", "a", "b.rec", "--work", "2"],
                 ["verify", "x.rec", "--de"], ["info", "x.rec", "--js"]):
        with pytest.raises(SystemExit):
            p.parse_args(argv)
    assert p.parse_args(["demo", "--workers", "3"]).workers == 3


def test_an_lmdb_conversion_names_each_split_and_info_takes_one(folder_root, tmp_path):
    out = str(tmp_path / "z.lmdb")
    r = _cli("convert", folder_root, out, "--layout", "imagefolder", "--val-ratio", "0.25",
             "--quiet")
    assert r.returncode == 0, r.stderr
    assert "wrote 9 records to %s split train\nwrote 3 records to %s split val" % (out, out) \
        in r.stdout, r.stdout
    r = _cli("info", out)  # the whole environment: its records in all, then each split's
    assert r.returncode == 0 and "records:         12\n" in r.stdout, r.stdout
    r = _cli("info", out, "--split", "val", "--json")
    assert r.returncode == 0, r.stderr
    assert list(json.loads(r.stdout)["splits"]) == ["val"]
    assert json.loads(r.stdout)["splits"]["val"]["records"] == 3
    r = _cli("info", out, "--split", "test")
    assert r.returncode == 1 and "split 'test' not found" in r.stderr


def test_help_and_stats_speak_to_either_stack(voc_rec):
    r = _cli("--help")
    assert "DataLoader where MXNet is installed, else as numpy arrays" in " ".join(r.stdout.split())
    r = _cli("stats", voc_rec)
    assert r.returncode == 0 and "mx.nd" not in r.stdout and "median_freq" in r.stdout


def test_the_allowed_skips_hold_where_they_say():
    from conftest import allowed_skips, unallowed_skips
    torch = ("t", "PyTorch is not installed for the client test (scripts/run.sh installs it)")
    moto = ("m", "could not import 'moto.server': No module named 'moto'")
    mxnet = ("x", "could not import 'mxnet': No module named 'mxnet'")
    ext = ("e", "the region decoder extension is not built")
    assert unallowed_skips([torch, moto, mxnet, ext], allowed_skips(
        {"GLUON_DATA_BUILD_EXT": "1"}, has_mxnet=True)) == [torch, moto, mxnet, ext]
    assert unallowed_skips([torch, moto, mxnet, ext], allowed_skips(
        {"GLUON_DATA_TORCH_ABSENT": "1"}, has_mxnet=False)) == [moto]


def test_a_run_with_a_skip_it_does_not_allow_fails(tmp_path):
    import shutil
    here = os.path.dirname(os.path.abspath(__file__))
    tests = tmp_path / "tests"
    tests.mkdir()
    for f in ("conftest.py", "allowed_skips.txt"):
        shutil.copy(os.path.join(here, f), str(tests / f))
    (tests / "test_s.py").write_text(
        "import pytest\n"
        "def test_ok():\n    pass\n"
        "def test_platform():\n    pytest.skip('needs os.fork')\n"
        "def test_setup():\n    pytest.skip(\"could not import 'moto.server': gone\")\n")
    env = dict(os.environ, GLUON_DATA_STRICT_SKIPS="1")
    run = [sys.executable, "-m", "pytest", str(tests), "-q", "-p", "no:cacheprovider",
           "-p", "no:xdist", "-k"]
    r = subprocess.run(run + ["ok or platform"], capture_output=True, text=True, env=env,
                       cwd=str(tmp_path), timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    r = subprocess.run(run + ["ok or platform or setup"], capture_output=True, text=True,
                       env=env, cwd=str(tmp_path), timeout=120)
    assert r.returncode == 1 and "1 skip(s) that tests/allowed_skips.txt does not allow" \
        in r.stdout and "test_s.py::test_setup: could not import 'moto.server'" in r.stdout, \
        r.stdout + r.stderr
    env.pop("GLUON_DATA_STRICT_SKIPS")
    r = subprocess.run(run + ["ok or platform or setup"], capture_output=True, text=True,
                       env=env, cwd=str(tmp_path), timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_readme_install_is_what_the_wheel_tests_run():
    """tests/test_installed_wheel.py and tests/test_core_wheel.py run README's install block
    as written (on 3.11 and 3.13): its commands are these, and none expands to several files."""
    from test_installed_wheel import ROOT, readme_install_commands
    clone, build, sdist = readme_install_commands()
    assert clone == ["pip", "install", "-c", "constraints.txt", ".[dask,remote]"]
    assert build == ["python", "-m", "build"]
    assert sdist == ["pip", "install", "-c", "constraints.txt",
                     "dist/gluon_data-0.1.0.tar.gz[dask,remote]"]
    from gluon_data import __version__
    assert "gluon_data-%s.tar.gz" % __version__ in sdist[-1]
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "$(ls" not in readme and "not a supported wheel" in readme


def test_pyproject_bounds_hold_the_pins_of_constraints():
    """Where MXNet installs, pyproject bounds what gluoncv pulls (a plain ``pip install`` then
    resolves at once instead of fetching and rejecting releases that need numpy >= 1.24); the
    versions constraints.txt pins for that stack lie within every bound."""
    import tomllib
    from packaging.markers import Marker
    from packaging.requirements import Requirement
    from test_installed_wheel import ROOT
    env = {"python_version": "3.11", "python_full_version": "3.11.0"}
    deps = [Requirement(d) for d in tomllib.loads(
        (ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["dependencies"]]
    pins = {}
    for line in (ROOT / "constraints.txt").read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate(env):
                pins[req.name.lower()] = next(iter(req.specifier)).version
    bounded = {r.name.lower() for r in deps if r.marker is not None
               and r.marker.evaluate(env) and any(s.operator == "<" for s in r.specifier)}
    assert {"numpy", "pandas", "scipy", "matplotlib", "contourpy"} <= bounded
    for r in deps:
        if r.marker is None or r.marker.evaluate(env):
            assert r.specifier.contains(pins[r.name.lower()]), (str(r), pins[r.name.lower()])
    assert Marker("python_version < '3.12'").evaluate(env)


@pytest.mark.parametrize("command", ["info", "show", "verify"])
def test_a_rec_without_its_idx_says_salvage_rebuilds_it(both, tmp_path, command):
    """The ``.idx`` left behind in a copy: every command that opens the ``.rec`` names the
    missing index and the command that makes it again, once."""
    rec = both[0]
    lone = str(tmp_path / "lone.rec")
    with open(rec, "rb") as f, open(lone, "wb") as g:
        g.write(f.read())
    r = _cli(command, lone)
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    assert "index file %s not found" % (lone[:-4] + ".idx") in out
    assert out.count("salvage") == 1 and "gluon-data salvage" in out, out


def test_show_takes_a_negative_index_checks_the_opacity_and_makes_its_folder(voc_rec,
                                                                             tmp_path):
    """``show --index -1`` is the last record (it was read under key -1 and blamed on the
    index); ``--alpha`` outside [0, 1] is refused (the blend wrapped around); ``--out`` into
    a folder that does not exist makes it, as the writers do."""
    from gluon_data.arrays import SegmentationDataset
    last = len(SegmentationDataset(voc_rec)) - 1
    out = tmp_path / "new" / "folder" / "last.png"
    p = _cli("show", voc_rec, "--index", "-1", "--out", str(out))
    assert p.returncode == 0, p.stderr
    assert "record %d of" % last in p.stdout and out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    q = _cli("show", voc_rec, "--index", str(last), "--out", str(tmp_path / "same.png"))
    assert q.returncode == 0 and (tmp_path / "same.png").read_bytes() == out.read_bytes()
    for alpha in ("-2", "3", "nan"):
        p = _cli("show", voc_rec, "--alpha", alpha, "--out", str(tmp_path / "a.png"))
        assert p.returncode == 1 and "--alpha" in p.stderr and "[0, 1]" in p.stderr, p.stderr
        assert not (tmp_path / "a.png").exists()


def test_a_missing_rec_names_the_split_files_beside_it(voc_root, tmp_path):
    """``convert ... data/voc.rec --split train,val`` writes ``voc_train.rec`` and
    ``voc_val.rec``; ``info data/voc.rec`` then says so, not only "not found"."""
    convert(voc_root, str(tmp_path / "voc.rec"), "voc", split="train,val")
    p = _cli("info", str(tmp_path / "voc.rec"))
    assert p.returncode == 1
    assert "not found" in p.stderr and "one file per split: %s, %s" % (
        tmp_path / "voc_train.rec", tmp_path / "voc_val.rec") in p.stderr, p.stderr
    p = _cli("info", str(tmp_path / "other.rec"))
    assert p.returncode == 1 and "not found" in p.stderr and "beside it" not in p.stderr


def test_an_index_that_does_not_parse_says_salvage_rebuilds_it(voc_rec, tmp_path):
    import shutil
    from gluon_data.errors import FormatError
    rec = str(tmp_path / "t.rec")
    shutil.copy(voc_rec, rec)
    lines = open(voc_rec[:-4] + ".idx").read().splitlines(True)
    open(rec[:-4] + ".idx", "w").write("".join(lines[:3]) + "3\t")
    with pytest.raises(FormatError, match="line 4.*salvage rebuilds the index"):
        RecordFile(rec)


def test_an_error_naming_a_file_puts_the_file_first(tmp_path):
    """An ``OSError`` that names its file reads ``FILE: what``, without ``[Errno 2]``."""
    missing = str(tmp_path / "nosuch.rec")
    p = _cli("show", missing, "--out", str(tmp_path / "s.png"))
    assert p.returncode == 1 and "Errno" not in p.stderr
    assert p.stderr.startswith("gluon-data: error: %s: " % missing), p.stderr


def test_a_split_whose_items_are_all_skipped_keeps_nothing_to_resume(voc_root, tmp_path):
    """Every item of ``val`` skipped (its list names files that are not there): the error
    names them, and no partial output or checkpoint is kept with a ``--resume`` hint that a
    rerun could never honour (the same plan ends the same way)."""
    import shutil
    from gluon_data.errors import EmptyOutputError
    src = str(tmp_path / "voc")
    shutil.copytree(voc_root, src)
    with open(os.path.join(src, "ImageSets", "Segmentation", "val.txt"), "w") as fh:
        fh.write("nope_1\nnope_2\n")
    out = tmp_path / "o" / "v.rec"
    for resume in (False, True):
        with pytest.raises(EmptyOutputError, match="split 'val' would be empty") as e:
            convert(src, str(out), "voc", split="train,val", on_error="skip",
                    checkpoint_every=2, resume=resume)
        assert "2 skipped" in str(e.value) and "nope_1" in str(e.value)
        assert "--resume" not in str(e.value)
        assert sorted(os.listdir(out.parent)) == []  # no partial file, no checkpoint


def test_an_error_prints_its_traceback_only_when_asked(tmp_path):
    missing = str(tmp_path / "nosuch.rec")
    p = _cli("info", missing)
    assert p.returncode == 1 and "Traceback" not in p.stderr
    q = subprocess.run([sys.executable, "-m", "gluon_data.cli", "info", missing],
                       capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, GLUON_DATA_TRACEBACK="1"))
    assert q.returncode == 1 and "Traceback (most recent call last)" in q.stderr
    assert q.stderr.rstrip().splitlines()[-1] == p.stderr.rstrip().splitlines()[-1]
