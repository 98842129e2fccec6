"""One output lock, taken by every writer: the unsharded converter, each shard task and
salvage all refuse to write where another gluon-data process holds the lock."""
import os
import shutil

import pytest

from gluon_data import convert
from gluon_data.convert.sample import make_imagefolder
from gluon_data.convert.sharded import convert_sharded
from gluon_data.errors import ConversionError
from gluon_data.storage.fsutil import OutputLock
from gluon_data.stores.recordio import RecordFile
from gluon_data.stores.shards import manifest_path, prefix_of, shard_name
from gluon_data.tools.salvage import salvage


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_imagefolder(str(tmp_path_factory.mktemp("lock") / "data"), per_class=3)


def test_a_shard_task_takes_the_output_lock(folder, tmp_path):
    out = str(tmp_path / "c.rec")
    first = shard_name(prefix_of(out), 0, 2)
    with OutputLock([first]):
        with pytest.raises(ConversionError, match="another gluon-data process"):
            convert_sharded(folder, out, "imagefolder", shards=2)
    assert not os.path.exists(manifest_path(prefix_of(out)))
    assert not os.path.exists(first)
    report = convert_sharded(folder, out, "imagefolder", shards=2)  # released: it runs
    assert os.path.exists(first) and not os.path.exists(first + OutputLock.SUFFIX)
    assert report is not None


def test_salvage_takes_the_output_lock(folder, tmp_path):
    out = str(tmp_path / "c.rec")
    convert(folder, out, "imagefolder")
    f = RecordFile(out)
    n = len(f)
    f.close()
    idx = out[:-4] + ".idx"
    os.remove(idx)
    with OutputLock([out]):
        with pytest.raises(ConversionError, match="another gluon-data process"):
            salvage(out)
    assert not os.path.exists(idx)
    assert salvage(out).records == n and os.path.exists(idx)
    assert not os.path.exists(out + OutputLock.SUFFIX)


def test_a_conversion_and_a_salvage_exclude_each_other(folder, tmp_path):
    """The same lock file: a salvage's lock refuses a conversion of that output."""
    out = str(tmp_path / "c.rec")
    shutil.rmtree(str(tmp_path), ignore_errors=True)
    os.makedirs(str(tmp_path))
    with OutputLock([out]):
        with pytest.raises(ConversionError, match="another gluon-data process"):
            convert(folder, out, "imagefolder")
