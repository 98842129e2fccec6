"""The conversion package's seams: one writer interface for every container, legacy LMDB
imports through the driver (workers, resume), and the CLI choosing convert / copy / import."""
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from gluon_data import SegmentationRecordDataset
from gluon_data.format import codec
from gluon_data import convert
from gluon_data.cli import main
from gluon_data.convert import ConversionReport, import_lmdb, outputs_for
from gluon_data.convert.copy import stock_meta
from gluon_data.stores.lmdbio import LMDBFile
from gluon_data.format.meta import read_meta
from gluon_data.stores.base import open_store
from test_legacy import make_recipe_lmdb


def _files(rec):
    return [open(p, "rb").read() for p in (rec, rec[:-4] + ".idx")]


@pytest.mark.parametrize("name", ["w.rec", "w.lmdb"])
def test_writers_share_one_interface(tmp_path, name):
    """The same calls write, checkpoint, finish and publish either container."""
    out = str(tmp_path / name)
    outputs = outputs_for(out)
    assert outputs.paths(out, ["train"]) == {"train": out}
    writers = outputs.open(out, ["train"], overwrite=False)
    w = writers["train"]
    payloads = [codec.pack_classification(float(i), b"img%d" % i, id=i) for i in range(3)]
    for i, p in enumerate(payloads[:2]):
        w.write(i, p)
    pos = w.sync()  # the resume position: what a checkpoint records
    if w.keeps_progress:  # the container keeps the checkpoint with the records
        w.checkpoint(b'{"x": 1}')
    w.suspend()  # an interrupted run: partial files kept
    if outputs.keeps_progress:
        assert outputs.progress(out, out + ".resume.json") == b'{"x": 1}'
    assert not os.path.exists(out)  # nothing under the final name before publish
    w = outputs.open(out, ["train"], overwrite=False, positions={"train": list(pos)})["train"]
    assert w.count == 2
    w.write(2, payloads[2])
    w.finish(dict(stock_meta(out, 3), checksum="crc32-id2"))
    w.publish()
    st = open_store(out, "train")
    assert [bytes(st.read(i)) for i in range(len(st))] == payloads
    assert outputs.published_meta(out, {"train": out})["train"]["num_records"] == 3


def test_legacy_import_with_workers_equals_one_process(tmp_path):
    src = str(tmp_path / "recipe")
    make_recipe_lmdb(src, n=10)
    one, two = str(tmp_path / "one.rec"), str(tmp_path / "two.rec")
    rep1 = import_lmdb(src, one, "raw-lmdb", image_shape=(24, 32, 3), encoding="png")
    rep2 = import_lmdb(src, two, "raw-lmdb", image_shape=(24, 32, 3), encoding="png",
                       workers=2)
    assert isinstance(rep2, ConversionReport) and rep1.written == rep2.written == {"train": 10}
    assert _files(one) == _files(two)
    m1, m2 = read_meta(one), read_meta(two)
    assert m1["conversion_id"] == m2["conversion_id"] and m1["num_records"] == 10


@pytest.mark.parametrize("name", ["r.rec", "r.lmdb"])
def test_legacy_import_resumes_after_a_kill(tmp_path, name):
    src = str(tmp_path / "recipe")
    make_recipe_lmdb(src, n=12)
    ref, out = str(tmp_path / ("ref_" + name)), str(tmp_path / name)
    kw = dict(image_shape=(24, 32, 3), encoding="png", checkpoint_every=4)
    import_lmdb(src, ref, "raw-lmdb", **kw)
    code = ("import importlib, os, signal\n"
            "c = importlib.import_module('gluon_data.convert')\n"
            "real = c.resume.Checkpoint.save\n"
            "def save(self, *a):\n    real(self, *a)\n    os.kill(os.getpid(), signal.SIGKILL)\n"
            "c.resume.Checkpoint.save = save\n"
            "c.import_lmdb(%r, %r, 'raw-lmdb', image_shape=(24, 32, 3), encoding='png', "
            "checkpoint_every=4)\n" % (src, out))
    p = subprocess.run([sys.executable, "-c", code], timeout=120)
    assert p.returncode == -signal.SIGKILL and not os.path.exists(out)
    with pytest.raises(Exception, match="other inputs or options"):
        import_lmdb(src, out, "raw-lmdb", image_shape=(24, 32, 3), encoding="raw",
                    checkpoint_every=4, resume=True)
    rep = import_lmdb(src, out, "raw-lmdb", resume=True, **kw)
    assert rep.written == {"train": 12}
    if name.endswith(".rec"):
        assert _files(ref) == _files(out) and read_meta(ref) == read_meta(out)
    else:
        a, b = LMDBFile(ref, "train"), LMDBFile(out, "train")
        assert [a.read(i) for i in range(len(a))] == [b.read(i) for i in range(len(b))]
        assert a.meta == b.meta


def test_cli_chooses_import_copy_and_convert(tmp_path, voc_root, capsys):
    src = str(tmp_path / "recipe")
    pairs = make_recipe_lmdb(src, n=6)
    rec, lmdb_out, back = (str(tmp_path / n) for n in ("i.rec", "c.lmdb", "back.rec"))
    assert main(["convert", src, rec, "--layout", "raw-lmdb", "--image-shape", "24,32,3",
                 "--workers", "2", "--quiet"]) == 0
    ds = SegmentationRecordDataset(rec, ignore_value=None)
    np.testing.assert_array_equal(ds[3][0].asnumpy(), pairs[3][0])
    np.testing.assert_array_equal(ds[3][1].asnumpy(), pairs[3][1])
    assert main(["convert", rec, lmdb_out, "--quiet"]) == 0  # a dataset: copied
    assert main(["convert", lmdb_out, back, "--quiet"]) == 0
    assert _files(rec) == _files(back)
    out = str(tmp_path / "v.rec")
    assert main(["convert", voc_root, out, "--layout", "voc", "--quiet"]) == 0
    assert "wrote" in capsys.readouterr().out and read_meta(out)["task"] == "segmentation"
    # the Python API keeps taking the same sources
    assert convert(src, str(tmp_path / "p.rec"), "raw-lmdb", image_shape=(24, 32, 3)).written \
        == {"train": 6}
