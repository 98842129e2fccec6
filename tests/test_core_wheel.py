"""The framework-free core as users install it where MXNet does not install: README.md's
install commands as written (the sdist built from this tree, installed with the extras README
names into a fresh virtual environment) on Python >= 3.12, where the pyproject markers leave
MXNet and gluoncv out, and used from an empty folder:

(a) ``gluon-data convert`` a VOC-like sample to ``.rec`` and to ``.lmdb``, then
    ``gluon-data verify --deep`` both;
(b) every sample read through :class:`gluon_data.arrays.SegmentationDataset` in a 2-process
    ``multiprocessing`` spawn pool, equal to the same samples read in the parent;
(c) :mod:`gluon_data.mx_recordio` writes a ``.rec`` and reads it back; and where
    ``GLUON_DATA_MXNET_PYTHON`` names an interpreter with real MXNet, that interpreter's
    ``mx.recordio.MXIndexedRecordIO`` reads our file identically, ours reads its file
    identically, and the two files are the same bytes.

Needs the package index pip is configured with (the install resolves against
constraints.txt). One build and install for the module (about half a minute).
"""
import importlib.util
import json
import os
import shutil
import struct
import subprocess
import sys
import textwrap
import venv
from pathlib import Path

import pytest

from test_installed_wheel import JUNK, ROOT, _clean_env, _run, run_readme_install

pytestmark = [
    pytest.mark.slow, pytest.mark.timeout(1800),
    pytest.mark.skipif(sys.version_info < (3, 12),
                       reason="on Python < 3.12 the wheel requires MXNet (pyproject markers): "
                              "the MXNet-free install is the core lane's (Python >= 3.12)")]

MXNET_PYTHON = os.environ.get("GLUON_DATA_MXNET_PYTHON")


@pytest.fixture(scope="module")
def core(tmp_path_factory):
    """README's install on this Python: the sdist built from a copy of the tree, installed
    (with the extras README names) into a fresh venv;
    a dict of the paths (``python``, ``gluon_data``, ``base`` for helper scripts)."""
    spec = importlib.util.find_spec("build")
    if spec is None or spec.origin is None:
        pytest.fail("this test needs the `build` package of the test extra: "
                    "pip install -c constraints.txt -e .[test]")
    base = tmp_path_factory.mktemp("core-wheel")
    src, env_dir = base / "src", base / "venv"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(*JUNK))
    venv.EnvBuilder(with_pip=True, clear=True).create(str(env_dir))
    py = env_dir / "bin" / "python"
    run_readme_install(src, py)  # README's commands as written, on this Python
    return {"python": py, "gluon_data": env_dir / "bin" / "gluon-data", "base": base,
            "venv": env_dir}


@pytest.fixture
def empty(core, tmp_path):
    d = tmp_path / "empty"
    d.mkdir()
    return d


def _script(core, name, text):
    """A helper script beside the venv (not in the folder the test runs from)."""
    path = core["base"] / name
    path.write_text(textwrap.dedent(text))
    return path


def test_the_install_has_no_mxnet_and_the_core_from_the_venv(core, empty):
    r = _run([core["python"], "-c", "import mxnet"], cwd=empty, timeout=120, check=False)
    assert r.returncode != 0 and "No module named 'mxnet'" in r.stderr, r.stderr[-2000:]
    probe = textwrap.dedent("""
        import importlib.util, json, gluon_data, numpy
        try:
            import gluon_data.gluon
            gluon = "imported"
        except ImportError as e:
            gluon = str(e)
        print(json.dumps({"file": gluon_data.__file__, "numpy": numpy.__version__,
                          "gluoncv": importlib.util.find_spec("gluoncv") is not None,
                          "gluon": gluon}))
    """)
    out = json.loads(_run([core["python"], "-c", probe], cwd=empty,
                          timeout=120).stdout.strip().splitlines()[-1])
    site = Path(out["file"]).resolve()
    assert core["venv"].resolve() in site.parents and ROOT not in site.parents, out["file"]
    assert out["numpy"].split(".")[0] == "2", out  # the core lane's stack: numpy 2
    assert out["gluoncv"] is False, out
    assert "needs MXNet" in out["gluon"], out["gluon"]


@pytest.fixture
def converted(core, empty):
    """(a): a tiny VOC-like sample converted to .rec and .lmdb by the installed command."""
    py, gd = core["python"], core["gluon_data"]
    _run([py, "-c", "from gluon_data.convert.sample import make_voc; "
                    "make_voc('voc', num_images=10, size_range=(24, 48), seed=5)"],
         cwd=empty, timeout=120)
    r = _run([gd, "convert", "voc", "out/voc.rec", "--layout", "voc", "--split", "trainval",
              "--workers", "2", "--quiet"], cwd=empty, timeout=300)
    assert "wrote 10 records to out/voc.rec" in r.stdout, r.stdout
    r = _run([gd, "convert", "voc", "out/voc.lmdb", "--layout", "voc", "--split", "train,val",
              "--workers", "2", "--quiet"], cwd=empty, timeout=300)
    assert "10 written" in r.stdout, r.stdout
    return empty


def test_convert_to_rec_and_lmdb_then_verify_deep(core, converted):
    gd = core["gluon_data"]
    r = _run([gd, "verify", "--deep", "out/voc.rec"], cwd=converted, timeout=300)
    assert "out/voc.rec: 10 records, 10 checked (deep: decoded): OK" in r.stdout, r.stdout
    r = _run([gd, "verify", "--deep", "out/voc.lmdb"], cwd=converted, timeout=300)
    assert "out/voc.lmdb: 10 records, 10 checked (deep: decoded): OK" in r.stdout, r.stdout


POOL_CHECK = """
    import json, multiprocessing, os, sys
    import numpy as np
    from gluon_data.arrays import SegmentationDataset

    _OPEN = {}

    def read(job):
        path, split, i = job
        if (path, split) not in _OPEN:  # each worker opens the dataset itself
            _OPEN[path, split] = SegmentationDataset(path, split=split)
        return os.getpid(), _OPEN[path, split][i]

    if __name__ == "__main__":
        report = {}
        with multiprocessing.get_context("spawn").Pool(2) as pool:
            for path, split in (("out/voc.rec", None), ("out/voc.lmdb", "train"),
                                ("out/voc.lmdb", "val")):
                ds = SegmentationDataset(path, split=split)
                ref = [ds[i] for i in range(len(ds))]
                got = pool.map(read, [(path, split, i) for i in range(len(ds))], chunksize=1)
                same = all(a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
                           for (_, pair), want in zip(got, ref) for a, b in zip(pair, want))
                report["%s:%s" % (path, split)] = {
                    "n": len(ds), "same": same, "got": len(got),
                    "in_parent": sum(pid == os.getpid() for pid, _ in got),
                    "dtypes": [str(x.dtype) for x in ref[0]],
                    "labelled": int(sum((m >= 0).sum() for _, m in ref))}
        print("POOL " + json.dumps(report))
"""


def test_every_sample_through_a_spawn_pool_equals_an_in_process_read(core, converted):
    """(b)"""
    script = _script(core, "pool_check.py", POOL_CHECK)
    r = _run([core["python"], script], cwd=converted, timeout=300)
    line = [ln for ln in r.stdout.splitlines() if ln.startswith("POOL ")]
    assert line, r.stdout[-2000:]
    report = json.loads(line[-1][len("POOL "):])
    assert set(report) == {"out/voc.rec:None", "out/voc.lmdb:train", "out/voc.lmdb:val"}
    assert report["out/voc.rec:None"]["n"] == 10
    assert report["out/voc.lmdb:train"]["n"] + report["out/voc.lmdb:val"]["n"] == 10
    for where, rep in report.items():
        assert rep["got"] == rep["n"] > 0 and rep["same"], (where, rep)
        assert rep["in_parent"] == 0, (where, rep)  # read in the workers, not here
        assert rep["dtypes"] == ["uint8", "int32"] and rep["labelled"] > 0, (where, rep)


# ------------------------------------------------------------------ (c) mx_recordio
RIO_CHECK = """
    import json, struct, sys

    MAGIC = struct.pack("<I", 0xced7230a)

    def records():
        '''(key, (flag, label, id, id2), payload): scalar and vector labels, payloads of every
        length mod 4, empty ones, and ones holding the magic word (split records).'''
        out = []
        for i in range(14):
            payload = bytes((i * 37 + j) % 256 for j in range(i * 5))
            if i % 3 == 1:
                payload = payload[:3] + MAGIC + payload + MAGIC
            label = float(i) if i % 2 == 0 else [float(i), i / 2.0, -1.5]
            out.append((i * 10 + 3, (0, label, i, 7 * i), payload))
        return out

    def write(rio, idx, rec):
        w = rio.MXIndexedRecordIO(idx, rec, "w")
        for key, header, payload in records():
            w.write_idx(key, rio.pack(rio.IRHeader(*header), payload))
        w.close()

    def read(rio, idx, rec):
        r = rio.MXIndexedRecordIO(idx, rec, "r")
        indexed = []
        for key in r.keys:
            h, payload = rio.unpack(r.read_idx(key))
            label = h.label.tolist() if hasattr(h.label, "tolist") else float(h.label)
            indexed.append([key, int(h.flag), label, int(h.id), int(h.id2), payload.hex()])
        r.reset()
        sequential = []
        while True:
            buf = r.read()
            if buf is None:
                break
            sequential.append(bytes(buf).hex())
        r.close()
        return {"indexed": indexed, "sequential": sequential}

    if __name__ == "__main__":
        which, action, idx, rec = sys.argv[1:]
        if which == "mxnet":
            from mxnet import recordio as rio
        else:
            from gluon_data import mx_recordio as rio
        if action == "write":
            write(rio, idx, rec)
            print("RIO " + json.dumps({"module": rio.__name__}))
        else:
            print("RIO " + json.dumps(dict(read(rio, idx, rec), module=rio.__name__)))
"""


def _expected():
    """What reading back ``records()`` must give, computed here (float32 labels)."""
    ns = {}
    exec(textwrap.dedent(RIO_CHECK), ns)
    f32 = lambda v: struct.unpack("<f", struct.pack("<f", v))[0]  # noqa: E731
    out = []
    for key, (_, label, id_, id2), payload in ns["records"]():
        if isinstance(label, list):
            flag, label = len(label), [f32(v) for v in label]
        else:
            flag, label = 0, f32(label)
        out.append([key, flag, label, id_, id2, payload.hex()])
    return out


def _rio(python, script, which, action, idx, rec, cwd, env=None):
    r = _run([python, script, which, action, str(idx), str(rec)], cwd=cwd, timeout=300,
             env=env)
    line = [ln for ln in r.stdout.splitlines() if ln.startswith("RIO ")]
    assert line, (r.stdout[-2000:], r.stderr[-2000:])
    return json.loads(line[-1][len("RIO "):])


def test_mx_recordio_writes_and_reads_back_without_mxnet(core, empty):
    """(c), ours alone: the records written come back, by key and in file order."""
    script = _script(core, "rio_check.py", RIO_CHECK)
    _rio(core["python"], script, "ours", "write", "ours.idx", "ours.rec", empty)
    got = _rio(core["python"], script, "ours", "read", "ours.idx", "ours.rec", empty)
    assert got["module"] == "gluon_data.mx_recordio"
    assert got["indexed"] == _expected()
    assert len(got["sequential"]) == len(got["indexed"])


def test_mx_recordio_files_interchange_with_real_mxnet(core, empty):
    """(c), against real MXNet: each side reads the other's file identically, and the two
    files (written from the same records) are byte for byte the same."""
    if not MXNET_PYTHON:
        pytest.skip("GLUON_DATA_MXNET_PYTHON is unset: no interpreter with real MXNet to "
                    "compare with (scripts/run.sh sets it to the full lane's)")
    probe = subprocess.run([MXNET_PYTHON, "-c", "import mxnet"], capture_output=True,
                           text=True, timeout=300, env=_clean_env())
    assert probe.returncode == 0, ("GLUON_DATA_MXNET_PYTHON=%s cannot import mxnet: %s"
                                   % (MXNET_PYTHON, probe.stderr[-1000:]))
    script = _script(core, "rio_check.py", RIO_CHECK)
    py = core["python"]
    _rio(py, script, "ours", "write", "ours.idx", "ours.rec", empty)
    _rio(MXNET_PYTHON, script, "mxnet", "write", "mx.idx", "mx.rec", empty)
    theirs_of_ours = _rio(MXNET_PYTHON, script, "mxnet", "read", "ours.idx", "ours.rec", empty)
    ours_of_theirs = _rio(py, script, "ours", "read", "mx.idx", "mx.rec", empty)
    ours_of_ours = _rio(py, script, "ours", "read", "ours.idx", "ours.rec", empty)
    assert theirs_of_ours["module"] == "mxnet.recordio"
    assert ours_of_theirs["module"] == "gluon_data.mx_recordio"
    want = _expected()
    assert theirs_of_ours["indexed"] == want  # real MXNet reads our file as written
    assert ours_of_theirs["indexed"] == want  # we read real MXNet's file as it wrote it
    assert theirs_of_ours["sequential"] == ours_of_theirs["sequential"] \
        == ours_of_ours["sequential"]
    for a, b in (("ours.rec", "mx.rec"), ("ours.idx", "mx.idx")):
        assert (empty / a).read_bytes() == (empty / b).read_bytes(), (a, b)
