"""Every ``>>>`` example in the package runs, against real files of the names it uses.

The examples name ``train.rec``, ``voc_train.rec``, ``voc.lmdb``, ``photos.lmdb``,
``old.lmdb`` (the recipe layout) and ``ilsvrc12_train_lmdb`` (Caffe): this module writes
tiny ones with our converters into a temporary directory and runs each module's doctests
there. An example that cannot run anywhere is marked ``# doctest: +SKIP`` in the source.
"""
import doctest
import importlib
import pkgutil

import pytest

import gluon_data
from gluon_data import convert

MODULES = sorted(m.name[len("gluon_data."):]  # sub-packages' modules too (convert.loop)
                 for m in pkgutil.walk_packages(gluon_data.__path__, "gluon_data.")
                 if m.name != "gluon_data.__main__")


@pytest.fixture(scope="module")
def example_dir(voc_root, folder_root, tmp_path_factory):
    from test_legacy import make_caffe_lmdb, make_recipe_lmdb
    d = tmp_path_factory.mktemp("examples")
    convert(voc_root, str(d / "voc.rec"), "voc", split="train,val")
    convert(voc_root, str(d / "voc.lmdb"), "voc", split="train,val")
    convert(folder_root, str(d / "train.rec"), "imagefolder")
    convert(folder_root, str(d / "photos.lmdb"), "imagefolder")
    make_recipe_lmdb(str(d / "old.lmdb"))
    make_caffe_lmdb(str(d / "ilsvrc12_train_lmdb"), folder_root)
    return d


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name, example_dir, monkeypatch):
    module = importlib.import_module("gluon_data." + name)
    monkeypatch.chdir(example_dir)
    finder = doctest.DocTestFinder(exclude_empty=True)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    out = []
    for test in finder.find(module, module.__name__):
        runner.run(test, out=out.append)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, "".join(out)
    if name in ("datasets", "taskdatasets", "recordio", "lmdbio", "legacy", "transforms",
                "seeding", "tensorize", "sampler", "codec",
                "stats", "convert.outputs", "convert.loop"):  # SplitJobs: convert.loop
        assert result.attempted > 0, "%s lost its examples" % name
