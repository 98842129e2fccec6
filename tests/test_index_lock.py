"""The public index writer takes the one output lock: ``write_binary_index`` refuses to
write a ``.rec``'s ``.idx.gdx`` while another writer (a conversion, a salvage) holds it."""
import os

import pytest

from gluon_data import convert
from gluon_data.convert.sample import make_imagefolder
from gluon_data.errors import ConversionError
from gluon_data.format.recindex import BINARY_INDEX_SUFFIX, idx_path_for, write_binary_index
from gluon_data.storage.fsutil import OutputLock


@pytest.fixture(scope="module")
def rec(tmp_path_factory):
    root = tmp_path_factory.mktemp("idxlock")
    folder = make_imagefolder(str(root / "data"), per_class=2)
    out = str(root / "c.rec")
    convert(folder, out, "imagefolder")
    return out


def test_write_binary_index_waits_for_no_one_and_refuses_a_held_rec(rec):
    idx = idx_path_for(rec)
    gdx = idx + BINARY_INDEX_SUFFIX
    os.remove(gdx)
    with OutputLock([rec]):
        with pytest.raises(ConversionError, match="another gluon-data process"):
            write_binary_index(idx)
        assert not os.path.exists(gdx)  # nothing written beside the writer at work
        assert write_binary_index(idx, lock_held=True) == gdx  # the holder itself may
    os.remove(gdx)
    assert write_binary_index(idx) == gdx  # released: it runs, and leaves no lock file
    assert not os.path.exists(rec + OutputLock.SUFFIX)
