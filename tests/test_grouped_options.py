"""Options that belong together travel as one object: a dataset's ``remote=``
(:class:`RemoteOptions`: storage options, cache folder and limit of a dataset in object
storage) and ``RecipeLMDBDataset``'s ``layout=`` (:class:`RecipeLayout`). The separate
keywords they replace keep working exactly, with a ``DeprecationWarning`` that names the new
spelling and points at the caller's line.

Real parts only: a ``.rec`` written by our converter and put byte for byte on moto's S3
server on 127.0.0.1 (``tests/s3_server.py``), recipe LMDBs written by
``tests/legacy_lmdbs.py``. The standard endpoint variable points at a closed loopback port,
so options that did not reach the store fail at once instead of reaching anything else. The
numpy datasets run in both lanes; the Gluon views where MXNet is installed."""
import os
import pickle
import warnings

import numpy as np
import pytest

from gluon_data.arrays import SegmentationDataset
from gluon_data.arrays.base import as_store, open_location
from gluon_data.storage.options import RemoteOptions
from gluon_data.storage.remotefs import filesystem
from gluon_data.stores.recipe_layout import RecipeLayout

from s3_server import BUCKET, _options, moto_s3  # moto's S3 server (skips without moto)


@pytest.fixture(scope="module")
def s3():
    with moto_s3() as server:
        yield server


@pytest.fixture
def so(s3):
    return _options(s3)


@pytest.fixture(scope="module")
def voc_uri(s3, voc_rec):
    """The session's VOC ``.rec`` (with its ``.idx`` and ``.meta.json``) in the bucket."""
    fs, path = filesystem("s3://%s/grouped/voc.rec" % BUCKET, {"endpoint_url": s3.url})
    stem, rstem = voc_rec[:-len(".rec")], path[:-len(".rec")]
    for suffix in (".rec", ".idx", ".meta.json"):
        fs.put_file(stem + suffix, rstem + suffix)
    return "s3://%s/grouped/voc.rec" % BUCKET


@pytest.fixture(autouse=True)
def no_default_endpoint(monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")


def _same(a, b):
    return all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(a, b))


@pytest.mark.parametrize("form", ["object", "dict"])
def test_remote_reaches_the_store_without_a_warning(form, voc_uri, voc_rec, so, tmp_path):
    """``remote=RemoteOptions(...)`` (or a dict of its fields) reads every sample as the local
    file does, downloads into its ``cache_dir``, and warns nothing."""
    opts = dict(storage_options=so, cache_dir=str(tmp_path / "cache"), cache_limit="1GB")
    remote = RemoteOptions(**opts) if form == "object" else opts
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ds = SegmentationDataset(voc_uri, ignore_value=None, remote=remote)
    ref = SegmentationDataset(voc_rec, ignore_value=None)
    assert len(ds) == len(ref) > 0
    for i in range(len(ref)):
        assert _same(ds[i], ref[i]), "sample %d differs" % i
    assert os.listdir(tmp_path / "cache" / "objects")
    assert _same(pickle.loads(pickle.dumps(ds))[0], ref[0])


def test_the_cache_limit_in_remote_is_the_caches(voc_uri, so, tmp_path):
    """Passed through, not dropped: a limit below the dataset is the cache's own error."""
    ds = SegmentationDataset(voc_uri, remote=RemoteOptions(so, str(tmp_path / "c"), 64))
    with pytest.raises(ValueError, match="more than the whole cache_limit"):
        ds[0]


def test_the_old_keywords_work_with_a_warning_naming_remote(voc_uri, voc_rec, so, tmp_path):
    """The separate keywords read the same samples; the warning names the new spelling and
    the caller's line (this file), not the library's."""
    with pytest.warns(DeprecationWarning) as caught:
        ds = SegmentationDataset(voc_uri, ignore_value=None, storage_options=so,
                                 cache_dir=str(tmp_path / "c"))
    [w] = [w for w in caught if issubclass(w.category, DeprecationWarning)]
    assert ("SegmentationDataset(storage_options=..., cache_dir=...): these keywords are "
            "deprecated; write remote=RemoteOptions(storage_options=..., cache_dir=...)"
            in str(w.message))
    assert w.filename == __file__
    assert _same(ds[2], SegmentationDataset(voc_rec, ignore_value=None)[2])


def test_both_spellings_or_a_misspelling_are_type_errors(voc_rec, so):
    with pytest.raises(TypeError, match=r"give storage_options once, as "
                                        r"remote=RemoteOptions\(\.\.\.\)"):
        SegmentationDataset(voc_rec, remote=RemoteOptions(so), storage_options=so)
    with pytest.raises(TypeError, match="got an unexpected keyword argument 'cache_dri'"):
        SegmentationDataset(voc_rec, cache_dri="/tmp/x")
    with pytest.raises(TypeError, match="no option 'cache_dri' in RemoteOptions; valid: "
                                        "storage_options, cache_dir, cache_limit"):
        SegmentationDataset(voc_rec, remote={"cache_dri": "/tmp/x"})
    with pytest.raises(TypeError, match="takes a RemoteOptions"):
        SegmentationDataset(voc_rec, remote="s3://elsewhere")


@pytest.mark.parametrize("remote,named", [(RemoteOptions(cache_dir="/nonexistent/c"),
                                           "cache_dir"),
                                          ({"cache_limit": "1GB"}, "cache_limit")])
def test_remote_for_a_local_path_is_an_error_naming_the_option(voc_rec, remote, named):
    with pytest.raises(ValueError, match=r"^SegmentationDataset\(.*\): %s applies only to a "
                                         r"dataset in object storage" % named):
        SegmentationDataset(voc_rec, remote=remote)
    assert not os.path.exists("/nonexistent/c")
    SegmentationDataset(voc_rec, remote=RemoteOptions(storage_options={}))  # configures nothing


def test_as_store_and_open_location_take_remote_and_the_old_keywords(voc_uri, so, tmp_path):
    store = open_location("X", voc_uri, remote=RemoteOptions(so, str(tmp_path / "c")))
    assert len(store) > 0
    with pytest.raises(ValueError, match=r"the store .* is open already"):
        as_store("X", store, remote={"cache_dir": str(tmp_path)})
    with pytest.warns(DeprecationWarning, match=r"open_location\(storage_options=\.\.\.\).*"
                                                r"remote=RemoteOptions"):
        assert len(open_location("X", voc_uri, storage_options=so)) == len(store)


def test_remote_options_hide_the_values_of_storage_options():
    opts = RemoteOptions({"key": "AKIA-not-shown", "secret": "s3cr3t"}, cache_dir="/c")
    assert "s3cr3t" not in repr(opts) and "AKIA" not in repr(opts)
    assert repr(opts) == "RemoteOptions(storage_options={'key': ..., 'secret': ...}, " \
                         "cache_dir='/c')"


# ---------------------------------------------------------------- the Gluon views

@pytest.fixture
def gluon():
    pytest.importorskip("mxnet")
    from gluon_data.gluon import datasets
    return datasets


def test_each_gluon_view_takes_remote(gluon, voc_uri, voc_rec, so, tmp_path):
    remote = RemoteOptions(so, str(tmp_path / "cache"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ds = gluon.SegmentationRecordDataset(voc_uri, ignore_value=None, remote=remote)
        opened = gluon.open_segmentation(voc_uri, remote=remote, ignore_value=None)
    ref = gluon.SegmentationRecordDataset(voc_rec, ignore_value=None)
    for i in (0, len(ref) - 1):
        want = [x.asnumpy() for x in ref[i]]
        assert _same([x.asnumpy() for x in ds[i]], want)
        assert _same([x.asnumpy() for x in opened[i]], want)


@pytest.mark.parametrize("view", ["SegmentationRecordDataset", "ImageRecordDataset",
                                  "open_segmentation"])
def test_each_gluon_view_warns_for_the_old_keywords_at_the_callers_line(gluon, view, voc_rec):
    """Given a local path, the old keyword still ends in the same ValueError as before; the
    warning comes first, naming the view and the new spelling, at this file's line."""
    with pytest.warns(DeprecationWarning) as caught, \
            pytest.raises(ValueError, match="cache_dir applies only to a dataset in object"):
        getattr(gluon, view)(voc_rec, cache_dir="/nonexistent/c")
    [w] = [w for w in caught if issubclass(w.category, DeprecationWarning)]
    assert "%s(cache_dir=...)" % view in str(w.message) and "remote=RemoteOptions" in \
        str(w.message)
    assert w.filename == __file__


def test_recipe_layout_reads_as_the_old_keywords(gluon, tmp_path):
    from legacy_lmdbs import make_recipe_lmdb
    path = str(tmp_path / "old.lmdb")
    pairs = make_recipe_lmdb(path, n=4, shape=(8, 12), channels_first=True, bgr=True)
    layout = RecipeLayout((3, 8, 12), channels_first=True, bgr=True, ignore_label=255,
                          num_classes=21)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ds = gluon.RecipeLMDBDataset(path, split="train", layout=layout, ignore_value=None)
        as_dict = gluon.RecipeLMDBDataset(path, layout=vars(layout), ignore_value=None)
    with pytest.warns(DeprecationWarning, match=r"RecipeLMDBDataset\(image_shape=\.\.\., "
                                                r"channels_first=\.\.\., bgr=\.\.\..*"
                                                r"layout=RecipeLayout\("):
        old = gluon.RecipeLMDBDataset(path, image_shape=(3, 8, 12), channels_first=True,
                                      bgr=True, ignore_label=255, num_classes=21,
                                      ignore_value=None)
    assert ds.num_class == old.num_class == as_dict.num_class == 21
    for i, (img, mask) in enumerate(pairs):
        for d in (ds, old, as_dict):
            assert np.array_equal(d[i][0].asnumpy(), img)
            assert np.array_equal(d[i][1].asnumpy(), mask)
    with pytest.raises(ValueError, match="image_shape is required"):
        gluon.RecipeLMDBDataset(path, layout=RecipeLayout())
