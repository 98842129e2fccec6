"""Every ``>>>`` example in the package runs, against real files of the names it uses.

The examples name ``train.rec``, ``voc_train.rec``, ``voc.lmdb``, ``photos.lmdb``,
``old.lmdb`` (the recipe layout) and ``ilsvrc12_train_lmdb`` (Caffe): this module writes
tiny ones with our converters into a temporary directory and runs each module's doctests
there. An example that cannot run anywhere is marked ``# doctest: +SKIP`` in the source.
"""
import doctest
import importlib
import importlib.util
import os
import pkgutil
import tempfile

import pytest

import gluon_data
from gluon_data import convert



def _module_names(path, prefix=""):
    """The modules under ``path``, sub-packages' too (``convert.loop``), found without
    importing them: the Gluon layer's are listed where MXNet is absent (and skip there)."""
    for m in pkgutil.iter_modules(path):
        yield prefix + m.name
        if m.ispkg:
            yield from _module_names([os.path.join(p, m.name) for p in path],
                                     prefix + m.name + ".")


MODULES = sorted(n for n in _module_names(gluon_data.__path__) if n != "__main__")
#: modules whose examples must not disappear (SplitJobs: convert.loop)
KEEP_EXAMPLES = ("gluon.datasets", "gluon.taskdatasets", "arrays.datasets", "stores.recordio",
                 "stores.lmdbio", "stores.legacy", "arrays.transforms", "sampling.seeding",
                 "arrays.tensorize", "sampling.sampler", "format.codec", "mx_recordio",
                 "tools.stats", "convert.outputs", "convert.loop")
HAS_MXNET = importlib.util.find_spec("mxnet") is not None


def _gluon_layer(name: str) -> bool:
    """A module of the Gluon layer (``gluon_data.gluon`` and below): it imports MXNet."""
    return name == "gluon" or name.startswith("gluon.")


@pytest.fixture(scope="module")
def example_dir(voc_root, folder_root, tmp_path_factory):
    from legacy_lmdbs import make_caffe_lmdb, make_recipe_lmdb
    d = tmp_path_factory.mktemp("examples")
    convert(voc_root, str(d / "voc.rec"), "voc", split="train,val")
    convert(voc_root, str(d / "voc.lmdb"), "voc", split="train,val")
    convert(folder_root, str(d / "train.rec"), "imagefolder")
    convert(folder_root, str(d / "photos.lmdb"), "imagefolder")
    make_recipe_lmdb(str(d / "old.lmdb"))
    make_caffe_lmdb(str(d / "ilsvrc12_train_lmdb"), folder_root)
    return d


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name, request, monkeypatch, tmp_path):
    """Each module's examples pass, and leave nothing in the temporary folder: an example
    that makes a scratch folder removes it (a reader copies the example, leak and all)."""
    if _gluon_layer(name) and not HAS_MXNET:
        pytest.skip("gluon_data.%s is the Gluon layer: its examples need MXNet, not installed "
                    "here (they run in the full lane)" % name)
    example_dir = request.getfixturevalue("example_dir")
    module = importlib.import_module("gluon_data." + name)
    monkeypatch.chdir(example_dir)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    finder = doctest.DocTestFinder(exclude_empty=True)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    out = []
    for test in finder.find(module, module.__name__):
        runner.run(test, out=out.append)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, "".join(out)
    assert sorted(os.listdir(scratch)) == [], "the examples left these in the temporary folder"
    if name in KEEP_EXAMPLES:
        assert result.attempted > 0, "%s lost its examples" % name


def test_the_modules_that_must_keep_examples_exist():
    """KEEP_EXAMPLES names modules that exist (a name left from an old layout would make
    its check above pass by naming nothing)."""
    assert [n for n in KEEP_EXAMPLES if n not in MODULES] == []
