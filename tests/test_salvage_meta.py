"""salvage with damaged metadata beside the .rec: the index is rebuilt, the metadata (which
salvage rewrites only when it reads) is left byte for byte."""
import os

from gluon_data import convert
from gluon_data.convert.sample import make_imagefolder
from gluon_data.format.meta import meta_path
from gluon_data.stores.recordio import RecordFile
from gluon_data.tools.salvage import salvage


def test_damaged_meta_is_left_alone_and_the_index_rebuilt(tmp_path):
    rec = str(tmp_path / "cls.rec")
    convert(make_imagefolder(str(tmp_path / "folder")), rec, "imagefolder")
    before = [RecordFile(rec).read(i) for i in range(len(RecordFile(rec)))]
    mp = meta_path(rec)
    with open(mp, "rb") as f:
        damaged = f.read()[:-7]  # truncated: no longer a valid document
    with open(mp, "wb") as f:
        f.write(damaged)
    os.remove(rec[:-4] + ".idx")
    for p in os.listdir(tmp_path):
        if p.endswith(".gdx"):
            os.remove(tmp_path / p)
    report = salvage(rec)
    assert report.records == len(before)
    with open(mp, "rb") as f:
        assert f.read() == damaged
    assert not os.path.exists(mp + ".bak")
    idx = open(rec[:-4] + ".idx").read().split("\n")
    assert len([line for line in idx if line]) == len(before)
