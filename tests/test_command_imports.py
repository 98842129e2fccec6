"""The commands that read or write files import no framework: ``gluon-data convert``, ``info``,
``verify``, ``salvage``, ``show`` and ``stats`` run where MXNet is absent (the core lane,
Python 3.13), and where it is installed they never load it (``show`` once took 7-13 s, most
of it ``import mxnet``, reading through the Gluon datasets).

Each interpreter runs the commands one after another in one fresh process, as the
``gluon-data`` script does (``gluon_data.cli.main``), and lists after each command the
modules of MXNet, gluoncv, Horovod and the Gluon layer that are loaded: the first command to
load one is named. The interpreters: this one, and the one ``GLUON_DATA_MXNET_PYTHON`` names
(the full lane's, with MXNet installed), so the core lane checks against a real MXNet too.
"""
import json
import os
import subprocess
import sys

import pytest

from gluon_data import convert
from gluon_data.convert.sample import make_voc

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: runs ``json.loads(argv[1])``, a list of command lines, through ``main`` in this process
PROBE = r"""
import json, sys
from gluon_data.cli import main

def heavy():
    return sorted(m for m in sys.modules
                  if m.split(".")[0] in ("mxnet", "gluoncv", "horovod")
                  or m == "gluon_data.gluon" or m.startswith("gluon_data.gluon."))

report = []
for argv in json.loads(sys.argv[1]):
    sys.argv = ["gluon-data"] + argv
    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code
    sys.stdout.flush()
    report.append({"argv": argv, "code": code, "heavy": heavy()})
print("PROBE-REPORT " + json.dumps(report))
"""


def _interpreters():
    out = [pytest.param(sys.executable, id="this-python")]
    other = os.environ.get("GLUON_DATA_MXNET_PYTHON")
    if other and os.path.realpath(other) != os.path.realpath(sys.executable):
        out.append(pytest.param(other, id="mxnet-python"))
    return out


@pytest.fixture(scope="module")
def voc(tmp_path_factory):
    return make_voc(str(tmp_path_factory.mktemp("cmdvoc") / "VOC2012"), num_images=8,
                    size_range=(20, 40), seed=3)


def _commands(d, voc):
    rec, lmdb = os.path.join(d, "a.rec"), os.path.join(d, "a.lmdb")
    lost = os.path.join(d, "lost.rec")  # a .rec whose index is gone: salvage rebuilds it
    return [
        ["convert", voc, rec, "--layout", "voc", "--split", "train", "--workers", "1",
         "--quiet"],
        ["convert", voc, lmdb, "--layout", "voc", "--split", "train,val", "--workers", "1",
         "--quiet"],
        ["convert", rec, os.path.join(d, "copy.lmdb"), "--quiet"],  # a dataset copied
        ["info", rec], ["info", lmdb, "--json"],
        ["verify", "--deep", rec], ["verify", "--deep", lmdb],
        ["stats", rec], ["stats", lmdb, "--split", "val", "--json"],
        ["show", rec, "--index", "1", "--out", os.path.join(d, "rec.png")],
        ["show", lmdb, "--split", "val", "--out", os.path.join(d, "lmdb.png")],
        ["salvage", lost],
    ]


@pytest.mark.parametrize("python", _interpreters())
def test_file_commands_never_import_a_framework(python, voc, tmp_path):
    d = str(tmp_path)
    lost = os.path.join(d, "lost.rec")
    convert(voc, lost, "voc", split="train")
    for f in ("lost.idx", "lost.idx.gdx"):  # the index and its binary form
        os.remove(os.path.join(d, f))
    commands = _commands(d, voc)
    p = subprocess.run([python, "-c", PROBE, json.dumps(commands)], cwd=d,
                       env=dict(os.environ, PYTHONPATH=ROOT), capture_output=True, text=True,
                       timeout=600)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("PROBE-REPORT ")]
    assert p.returncode == 0 and lines, (p.returncode, p.stdout[-3000:], p.stderr[-3000:])
    report = json.loads(lines[-1][len("PROBE-REPORT "):])
    assert [r["argv"] for r in report] == commands
    for r in report:
        assert r["code"] == 0, (r, p.stderr[-3000:])
        assert r["heavy"] == [], "`gluon-data %s` loaded %s" % (" ".join(r["argv"]),
                                                                 r["heavy"][:8])
    # the commands did their work (a preview each, the index rebuilt, both containers)
    for f in ("rec.png", "lmdb.png", "lost.idx", "a.rec", "a.lmdb", "copy.lmdb"):
        assert os.path.exists(os.path.join(d, f)), f


def test_the_probe_sees_a_framework_import(tmp_path):
    """The check can fail: a command that loads a framework is named. Here ``info`` is made
    to import ``mxnet`` (an empty stand-in package on the path, so this runs with or without
    MXNet) and the probe must report it."""
    fake = tmp_path / "fake"
    (fake / "mxnet").mkdir(parents=True)
    (fake / "mxnet" / "__init__.py").write_text("")
    probe = ("import importlib, gluon_data.cli.commands as c\n"
             "c.cmd_info = lambda a: importlib.import_module('mxnet') and 0\n" + PROBE)
    p = subprocess.run([sys.executable, "-c", probe, json.dumps([["info", "x"]])],
                       cwd=str(tmp_path), capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, str(fake)])))
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("PROBE-REPORT ")]
    assert lines, (p.stdout[-2000:], p.stderr[-2000:])
    report = json.loads(lines[-1][len("PROBE-REPORT "):])
    assert report[0]["heavy"] == ["mxnet"], report
