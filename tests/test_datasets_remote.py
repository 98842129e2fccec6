"""The public dataset classes read a dataset in object storage from its URI, given the storage
and cache options directly (no store built by hand), and refuse those options for a local path.

Real parts only: files written by our converter, uploaded byte for byte to moto's S3 server on
127.0.0.1 (the fixtures of ``tests/test_remote.py``); the standard endpoint variable points at
a closed loopback port, so a view that dropped its ``storage_options`` fails at once instead
of reaching anything else."""
import os
import pickle

import numpy as np
import pytest

from gluon_data import convert
from gluon_data.gluon.datasets import (CaffeLMDBDataset, ImageLMDBDataset, ImageRecordDataset,
                                 RecipeLMDBDataset, SegmentationLMDBDataset,
                                 SegmentationRecordDataset, open_segmentation)
from gluon_data.storage.remotefs import filesystem
from gluon_data.convert.sharded import convert_sharded

from test_remote import BUCKET, s3, so  # noqa: F401 - moto's S3 server fixtures


def _upload(so, local, uri):
    """Put a local ``.rec`` (with its ``.idx`` and ``.meta.json``), an LMDB folder's
    ``data.mdb`` or a manifest with its shards (the files of its folder) at ``uri``, as they
    are."""
    fs, path = filesystem(uri, so)
    if local.endswith(".shards.json"):
        folder, rfolder = os.path.dirname(local), path.rsplit("/", 1)[0]
        for name in os.listdir(folder):
            fs.put_file(os.path.join(folder, name), rfolder + "/" + name)
        return uri
    if os.path.isdir(local):
        fs.put_file(os.path.join(local, "data.mdb"), path + "/data.mdb")
        return uri
    stem, rstem = local[:-len(".rec")], path[:-len(".rec")]
    for suffix in (".rec", ".idx", ".meta.json"):
        fs.put_file(stem + suffix, rstem + suffix)
    return uri


@pytest.fixture(scope="module")
def local_sets(voc_root, folder_root, tmp_path_factory):
    d = tmp_path_factory.mktemp("views_lmdb")
    convert(voc_root, str(d / "voc.lmdb"), "voc", split="trainval", val_ratio=0.5)
    convert(folder_root, str(d / "cls.lmdb"), "imagefolder")
    sharded = convert_sharded(voc_root, str(d / "sharded" / "voc.rec"), "voc",
                              split="trainval", shard_items=5).outputs["trainval"]
    return {"voc": str(d / "voc.lmdb"), "cls": str(d / "cls.lmdb"), "sharded": sharded}


@pytest.fixture(scope="module")
def uploaded(s3, cls_rec, voc_rec, local_sets):
    """``{name: (uri, local)}`` for each kind of dataset, in the bucket and on disk."""
    opts = {"endpoint_url": s3.url}
    local = {"cls.rec": cls_rec, "voc.rec": voc_rec, "cls.lmdb": local_sets["cls"],
             "voc.lmdb": local_sets["voc"], "sharded/voc.shards.json": local_sets["sharded"]}
    return {name: (_upload(opts, path, "s3://%s/views/%s" % (BUCKET, name)), path)
            for name, path in local.items()}


@pytest.fixture
def no_default_endpoint(monkeypatch):
    """Where a view lost its storage_options, s3fs would fall back to the standard endpoint:
    a closed port on loopback, refused at once."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")


VIEWS = [  # (name, dataset uploaded, how to open it)
    ("ImageRecordDataset", "cls.rec", lambda p, **kw: ImageRecordDataset(p, **kw)),
    ("ImageLMDBDataset", "cls.lmdb", lambda p, **kw: ImageLMDBDataset(p, split="train", **kw)),
    ("SegmentationRecordDataset", "voc.rec",
     lambda p, **kw: SegmentationRecordDataset(p, ignore_value=None, **kw)),
    ("SegmentationLMDBDataset", "voc.lmdb",
     lambda p, **kw: SegmentationLMDBDataset(p, split="val", ignore_value=None, **kw)),
    ("SegmentationRecordDataset", "sharded/voc.shards.json",
     lambda p, **kw: SegmentationRecordDataset(p, ignore_value=None, **kw)),
    ("open_segmentation", "voc.lmdb",
     lambda p, **kw: open_segmentation(p, "train", mode="val", crop_size=16, **kw)),
]

IDS = ["%s-%s" % (name, data.rsplit("/", 1)[-1]) for name, data, _ in VIEWS]


def _as_arrays(sample):
    return [x.asnumpy() if hasattr(x, "asnumpy") else np.asarray(x) for x in sample]


def _same(a, b):
    return all(x.shape == y.shape and np.array_equal(x, y)
               for x, y in zip(_as_arrays(a), _as_arrays(b)))


@pytest.mark.parametrize("name,data,view", VIEWS, ids=IDS)
def test_each_view_reads_a_bucket_with_its_options_like_the_local_file(
        name, data, view, uploaded, so, tmp_path, no_default_endpoint):
    """Expected: ``View(uri, storage_options=..., cache_dir=..., cache_limit=...)`` reads
    every sample exactly as the same view over the local file; the download lands in the
    given cache folder; a pickled copy (a DataLoader worker's) reads the same."""
    uri, local = uploaded[data]
    cache = tmp_path / "cache"
    ds = view(uri, storage_options=so, cache_dir=str(cache), cache_limit="1GB")
    ref = view(local)
    assert ds.filename == uri and len(ds) == len(ref) > 0
    for i in range(len(ref)):
        assert _same(ds[i], ref[i]), "%s: sample %d differs" % (name, i)
    objects = os.listdir(cache / "objects")
    assert objects, "nothing was downloaded into cache_dir"
    copy = pickle.loads(pickle.dumps(ds))
    assert _same(copy[len(ref) - 1], ref[len(ref) - 1])


def test_cache_limit_reaches_the_store(uploaded, so, tmp_path, no_default_endpoint):
    """Expected: a cache_limit smaller than the dataset is the cache's own error on the
    first read (it is passed through, not dropped)."""
    uri, _ = uploaded["voc.rec"]
    ds = SegmentationRecordDataset(uri, storage_options=so, cache_dir=str(tmp_path / "c"),
                                   cache_limit=64)
    with pytest.raises(ValueError, match="more than the whole cache_limit"):
        ds[0]


@pytest.mark.parametrize("name,data,view", VIEWS, ids=IDS)
@pytest.mark.parametrize("option,value", [("storage_options", {"anon": True}),
                                          ("cache_dir", "/nonexistent/cache"),
                                          ("cache_limit", "1GB")])
def test_storage_options_for_a_local_path_are_an_error_naming_them(
        name, data, view, option, value, uploaded):
    """Expected: a ValueError naming the view and the option (nothing would use it), not a
    TypeError from a store nor a silent ignore; nothing is created at ``cache_dir``."""
    local = uploaded[data][1]
    with pytest.raises(ValueError, match=r"^%s\(.*\): %s applies only to a dataset in object "
                                         r"storage" % (name, option)):
        view(local, **{option: value})
    assert not os.path.exists("/nonexistent/cache")
    view(local, storage_options={})  # empty: configures nothing, as not given


def test_legacy_views_refuse_a_uri_clearly():
    """Expected: the legacy layouts are read in place from a local folder; a URI is a
    ValueError that says so (before, a TypeError about a ``layout`` keyword)."""
    with pytest.raises(ValueError, match="reads a legacy LMDB in place from a local folder"):
        RecipeLMDBDataset("s3://%s/old.lmdb" % BUCKET, image_shape=(4, 4, 3))
    with pytest.raises(ValueError, match="CaffeLMDBDataset reads a legacy LMDB in place"):
        CaffeLMDBDataset("s3://%s/caffe_lmdb" % BUCKET)


def test_endpoint_in_client_kwargs(uploaded, s3, tmp_path, no_default_endpoint):
    """Expected: the botocore form of the endpoint (``client_kwargs``) works the same."""
    uri, local = uploaded["voc.rec"]
    ds = SegmentationRecordDataset(uri, storage_options={"client_kwargs": {
        "endpoint_url": s3.url}}, cache_dir=str(tmp_path / "c"))
    assert _same(ds[3], SegmentationRecordDataset(local)[3])
