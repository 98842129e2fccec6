"""Datasets in object storage, against a real S3 API: moto's server on 127.0.0.1.

The server (``tests/s3_server.py``) runs in-process (``ThreadedMotoServer``); a tiny WSGI
middleware in front of it logs every request with the bytes it served, and can cut a response
short and stop the server (a server dying mid-download). s3fs talks to it through
``endpoint_url``.
"""
import contextlib
import json
import os
import socket
import signal
import sys
import threading
import time

import mxnet as mx
import numpy as np
import pytest

from gluon_data import convert
from gluon_data.cli import main
from gluon_data.gluon.datasets import (ImageRecordDataset, SegmentationDataset,
                                 SegmentationRecordDataset)
from gluon_data.errors import (ChecksumMismatchError, FormatError, OutputError,
                               RemoteConnectionError, RemoteNotFoundError)
from gluon_data.stores.base import will_need
from gluon_data.stores.recordio import RecordFile
from gluon_data.sampling.remote import BlockShuffleSampler, PrefetchSampler
from gluon_data.stores.remote.stores import RemoteStore
from gluon_data.storage.objects import ShardCache
from gluon_data.convert.to_uri import convert_to_uri
from gluon_data.storage.remotefs import filesystem, parse_storage_options
from gluon_data.storage.cache import parse_size
from gluon_data.convert.sample import make_voc
from gluon_data.stores.base import open_store

# the server (skips this module without moto); S3Server is borrowed by test_cluster
from s3_server import BUCKET, FAST, S3Server, _options, moto_s3  # noqa: F401


@pytest.fixture(scope="session")
def s3():
    with moto_s3() as server:
        yield server


@pytest.fixture
def so(s3):
    if s3._server is None:  # a test that stopped it failed before restarting it
        s3.start()
    s3.kill_after = s3.kill_on_put = s3.drop_put = None
    return _options(s3)


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    """Caches and staging folders the CLI makes by default go under the test's tmp_path."""
    monkeypatch.setenv("GLUON_DATA_CACHE_DIR", str(tmp_path / "default-cache"))


def _remote(so, tmp_path, **extra):
    return dict(storage_options=so, cache_dir=str(tmp_path / "cache"), **FAST, **extra)


@pytest.fixture(scope="session")
def voc_src(tmp_path_factory):
    return make_voc(str(tmp_path_factory.mktemp("rvoc") / "VOC2012"), num_images=16,
                    size_range=(24, 48), seed=3)


@pytest.fixture(scope="session")
def voc_s3(s3, voc_src, tmp_path_factory):
    """The VOC sample converted straight into S3 (one split), and the same locally."""
    uri = "s3://%s/sess/voc.rec" % BUCKET
    cache = str(tmp_path_factory.mktemp("stage"))
    convert_to_uri(voc_src, uri, layout="voc", split="trainval", storage_options=_options(s3),
                   cache_dir=cache)
    local = str(tmp_path_factory.mktemp("rlocal") / "voc.rec")
    convert(voc_src, local, "voc", split="trainval")
    return uri, local


def _fresh_uri(name):
    return "s3://%s/%s" % (BUCKET, name)


def test_convert_to_s3_reads_back_byte_identical(voc_s3, so, tmp_path):
    uri, local = voc_s3
    remote_ds = SegmentationDataset(open_store(uri, **_remote(so, tmp_path)), ignore_value=None)
    local_ds = SegmentationRecordDataset(local, ignore_value=None)
    assert len(remote_ds) == len(local_ds) == 16
    raw = RecordFile(local)
    for i in range(len(local_ds)):
        assert remote_ds._file.read(i) == raw.read(i)
        (a, m), (b, n) = remote_ds._arrays(i), local_ds._arrays(i)
        assert np.array_equal(a, b) and np.array_equal(m, n)
    # the uploaded metadata records what readers verify downloads against
    meta = remote_ds.meta
    assert meta["files"]["voc.rec"]["bytes"] == os.path.getsize(local)
    assert set(meta["files"]) == {"voc.rec", "voc.idx"}
    fs, _ = filesystem(uri, so)
    names = sorted(os.path.basename(p) for p in fs.ls("%s/sess" % BUCKET))
    assert names == ["voc.idx", "voc.meta.json", "voc.rec"]  # no marker left behind


def test_classification_dataset_and_cli_round_trip(s3, so, tmp_path, capsys, monkeypatch):
    from gluon_data.convert.sample import make_imagefolder
    src = make_imagefolder(str(tmp_path / "folder"), per_class=3)
    uri = _fresh_uri("cli/cls.rec")
    ep = "endpoint_url=" + s3.url
    s3.log.clear()
    assert main(["convert", src, uri, "--quiet", "--workers", "1",
                 "--storage-option", ep]) == 0
    assert "wrote 9 records to %s" % uri in capsys.readouterr().out
    # the metadata is the commit marker: uploaded after the records and the index
    puts = [e[1] for e in s3.log if e[0] == "PUT"]
    order = {suffix: max(i for i, p in enumerate(puts) if p.endswith(suffix))
             for suffix in ("cls.rec", "cls.idx", "cls.meta.json")}
    assert order["cls.meta.json"] > max(order["cls.rec"], order["cls.idx"])
    marker = [i for i, e in enumerate(s3.log) if e[1].endswith("cls.uploading.json")]
    assert s3.log[marker[0]][0] == "PUT" and s3.log[marker[-1]][0] == "DELETE"
    local = str(tmp_path / "cls.rec")
    convert(src, local, "imagefolder")
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3.url)  # the public class, configured by env
    ds = ImageRecordDataset(uri)
    ref = ImageRecordDataset(local)
    for i in range(len(ref)):
        (a, la), (b, lb) = ds[i], ref[i]
        assert np.array_equal(a.asnumpy(), b.asnumpy()) and la == lb
    assert main(["info", uri, "--json", "--storage-option", ep]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["records"] == 9 and info["task"] == "classification"
    assert main(["verify", uri, "--storage-option", ep]) == 0
    assert "9 checked: OK" in capsys.readouterr().out
    # a second convert to the same URI refuses; --resume finds it complete, sends nothing
    assert main(["convert", src, uri, "--quiet", "--workers", "1", "--storage-option", ep]) == 1
    assert "already exists" in capsys.readouterr().err
    s3.log.clear()
    assert main(["convert", src, uri, "--quiet", "--workers", "1", "--resume",
                 "--storage-option", ep]) == 0
    assert not [e for e in s3.log if e[0] in ("PUT", "POST", "DELETE")]
    assert main(["convert", src, uri, "--quiet", "--workers", "1", "--overwrite",
                 "--storage-option", ep]) == 0
    assert s3.requests("cls.rec", "PUT")


def test_endpoint_from_the_standard_environment(voc_s3, s3, tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3.url)
    store = open_store(voc_s3[0], cache_dir=str(tmp_path / "c"), **FAST)
    assert len(store) == 16 and store.read(3) == RecordFile(voc_s3[1]).read(3)


def test_interrupted_upload_is_invisible_then_resumes(s3, so, voc_src, tmp_path):
    uri = _fresh_uri("resume/voc.rec")
    cache = str(tmp_path / "cache")
    s3.kill_on_put = "resume/voc.idx"  # the server dies when the index upload starts
    with pytest.raises(RemoteConnectionError) as e:
        convert_to_uri(voc_src, uri, layout="voc", split="trainval", storage_options=so,
                       cache_dir=cache, retries=1)
    assert "voc.idx" in str(e.value)
    s3.start()
    with pytest.raises(FormatError, match="upload of this dataset is in progress"):
        open_store(uri, storage_options=so, cache_dir=cache, **FAST)
    s3.log.clear()
    convert_to_uri(voc_src, uri, layout="voc", split="trainval", storage_options=so,
                   cache_dir=cache, resume=True)
    assert not s3.requests("voc.rec", "PUT")  # the journal knew it was uploaded
    assert s3.requests("voc.idx", "PUT") and s3.requests("voc.meta.json", "PUT")
    store = open_store(uri, storage_options=so, cache_dir=cache, **FAST)
    local = str(tmp_path / "local" / "voc.rec")
    convert(voc_src, local, "voc", split="trainval")
    ref = RecordFile(local)
    assert [store.read(i) for i in range(len(store))] == [ref.read(i) for i in range(16)]
    s3.log.clear()  # again, once complete: nothing sent, and the summary says so
    again = convert_to_uri(voc_src, uri, layout="voc", split="trainval", storage_options=so,
                           cache_dir=cache, resume=True)
    assert not [e for e in s3.log if e[0] in ("PUT", "POST", "DELETE")]
    assert again.resumed == again.written == {"trainval": 16}
    assert str(again).splitlines() == [
        "wrote 16 records to %s (complete already, kept by --resume)" % uri,
        "nothing left to convert: 16 records complete already, 0 skipped"]


def test_two_dataloader_workers_share_one_download(voc_s3, s3, so, tmp_path):
    uri, local = voc_s3
    ds = SegmentationDataset(open_store(uri, **_remote(so, tmp_path)), ignore_value=None)
    assert not os.path.exists(tmp_path / "cache" / "objects" / "x")
    s3.log.clear()
    loader = mx.gluon.data.DataLoader(ds.transform(lambda a, b: (a.shape[0], b.sum())),
                                      batch_size=2, num_workers=2, timeout=120)
    got = [tuple(x.asnumpy().tolist()) for batch in loader for x in batch]
    ref = SegmentationRecordDataset(local, ignore_value=None)
    want_h = [ref._arrays(i)[0].shape[0] for i in range(len(ref))]
    assert sum((list(g) for g in got[0::2]), []) == want_h
    # the .rec was downloaded once, by one worker; the other used the same cached copy
    assert s3.served("sess/voc.rec") == os.path.getsize(local)
    objects = os.listdir(tmp_path / "cache" / "objects")
    assert len(objects) == 2  # .rec and .idx, nothing partial
    for d in objects:
        assert not [n for n in os.listdir(tmp_path / "cache" / "objects" / d) if "partial" in n]


def test_cache_evicts_least_recently_used_under_a_limit(s3, so, voc_src, tmp_path):
    uri = _fresh_uri("evict/voc.rec")
    convert_to_uri(voc_src, uri, layout="voc", split="trainval", val_ratio=0.5,
                   storage_options=so, cache_dir=str(tmp_path / "stage"))
    train, val = uri.replace("voc.rec", "voc_train.rec"), uri.replace("voc.rec", "voc_val.rec")
    sizes = {u: open_store(u, storage_options=so).file_size for u in (train, val)}
    idx = {u: filesystem(u, so)[0].info(u.replace(".rec", ".idx"))["size"] for u in sizes}
    total = sum(sizes.values()) + sum(idx.values())
    limit = max(sizes[u] + idx[u] for u in sizes) + 16  # one split fits, not both
    assert limit < total
    opts = _remote(so, tmp_path, cache_limit=limit)
    cache = ShardCache(opts["cache_dir"], limit)
    a = open_store(train, **opts)
    first = [a.read(i) for i in range(len(a))]
    a.close()  # unpinned: evictable
    assert cache.usage() == sizes[train] + idx[train]
    b = open_store(val, **opts)
    assert b.read(0) and cache.usage() <= limit
    b.close()
    s3.log.clear()
    a = open_store(train, **opts)  # evicted: downloaded again, same bytes
    assert [a.read(i) for i in range(len(a))] == first
    assert s3.served("evict/voc_train.rec") == sizes[train]
    assert cache.usage() <= limit
    # a copy in use is never evicted: with train pinned, val still opens (over the limit)
    with pytest.warns(RuntimeWarning, match="in use exceed cache_limit"):
        b = open_store(val, **opts)
        b.read(0)
    assert a.read(1) == first[1] and cache.usage() > limit
    a.close()
    b.close()
    with pytest.raises(ValueError, match="more than the whole cache_limit"):
        open_store(train, **dict(opts, cache_dir=str(tmp_path / "small"),
                                 cache_limit=100)).read(0)


def test_server_stopped_mid_download_then_retry_succeeds(voc_s3, s3, so, tmp_path):
    uri, local = voc_s3
    store = open_store(uri, **_remote(so, tmp_path))
    store.fetch(store.idx_location)
    s3.kill_after = ("sess/voc.rec", 1000, True)  # cut the .rec download short, stop
    with pytest.raises(RemoteConnectionError) as e:
        store.read(0)
    assert uri in str(e.value) and e.value.path == uri
    objects = tmp_path / "cache" / "objects"
    leftovers = [n for d in os.listdir(objects) for n in os.listdir(objects / d)]
    assert leftovers == ["voc.idx"]  # no partial (or unverified) .rec kept
    s3.start()  # same port, same objects
    assert [store.read(i) for i in range(len(store))] == \
        [RecordFile(local).read(i) for i in range(16)]


def test_a_response_cut_short_once_is_retried(voc_s3, s3, so, tmp_path):
    uri, local = voc_s3
    store = open_store(uri, **_remote(so, tmp_path))
    s3.kill_after = ("sess/voc.rec", 1000, False)  # the server survives
    s3.log.clear()
    assert store.read(3) == RecordFile(local).read(3)
    assert len(s3.requests("sess/voc.rec", "GET")) == 2  # the cut one, then the retry


def test_tampered_object_is_a_checksum_error(s3, so, voc_src, tmp_path):
    uri = _fresh_uri("tamper/voc.rec")
    convert_to_uri(voc_src, uri, layout="voc", split="trainval", storage_options=so,
                   cache_dir=str(tmp_path / "stage"))
    fs, path = filesystem(uri, so)
    data = bytearray(fs.cat_file(path))
    data[len(data) // 2] ^= 0xFF  # same size, one byte flipped
    fs.pipe_file(path, bytes(data))
    store = open_store(uri, **_remote(so, tmp_path))
    with pytest.raises(ChecksumMismatchError) as e:
        store.read(0)
    assert e.value.path == uri and "SHA-256" in str(e.value)
    objects = tmp_path / "cache" / "objects"
    assert not [n for d in os.listdir(objects) for n in os.listdir(objects / d)
                if n.startswith("voc.rec")]
    fs.pipe_file(path, bytes(data[:-4]))  # shorter: refused on open, before any download
    with pytest.raises(ChecksumMismatchError, match="metadata records"):
        open_store(uri, **_remote(so, tmp_path))


def test_inspection_reads_fetch_only_what_they_need(voc_s3, s3, so, tmp_path, capsys,
                                                    monkeypatch):
    uri, local = voc_s3
    monkeypatch.setenv("GLUON_DATA_CACHE_DIR", str(tmp_path / "cache"))
    ep = "endpoint_url=" + s3.url
    rec_size = os.path.getsize(local)
    idx_size = os.path.getsize(local.replace(".rec", ".idx"))
    s3.log.clear()
    assert main(["info", uri, "--json", "--storage-option", ep]) == 0
    assert json.loads(capsys.readouterr().out)["records"] == 16
    assert s3.served("voc.rec") == 0 and s3.served("voc.idx") == 0  # metadata only
    meta_uri = uri.replace(".rec", ".meta.json")
    assert s3.served("voc.meta.json") == filesystem(meta_uri, so)[0].info(meta_uri)["size"]
    s3.log.clear()
    out = str(tmp_path / "s.png")
    assert main(["show", uri, "--index", "5", "--out", out, "--storage-option", ep]) == 0
    f = RecordFile(local)
    start, end = f.extent(5)
    extent = end - start
    assert s3.served("voc.rec") == extent < rec_size / 8  # just record 5
    assert s3.served("voc.idx") == idx_size and os.path.getsize(out) > 0
    s3.log.clear()
    assert main(["verify", uri, "--storage-option", ep]) == 0
    assert "16 checked: OK" in capsys.readouterr().out
    lo, hi = f.extent(-1)
    last = hi - lo  # the tail check reads the last record first
    assert s3.served("voc.rec") <= rec_size + last  # read ahead: every byte once
    assert len(s3.requests("voc.rec", "GET")) < 16  # sequential reads are batched


def test_missing_objects_and_missing_extra(s3, so, tmp_path, monkeypatch, capsys):
    uri = _fresh_uri("nothing/here.rec")
    with pytest.raises(RemoteNotFoundError) as e:
        open_store(uri, **_remote(so, tmp_path))
    assert e.value.path == uri and isinstance(e.value, FileNotFoundError)
    assert main(["info", uri, "--storage-option", "endpoint_url=" + s3.url]) == 1
    assert uri in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "fsspec", None)
    monkeypatch.setitem(sys.modules, "fsspec.core", None)
    with pytest.raises(ImportError, match=r"pip install gluon-data\[remote\]"):
        open_store(uri, **_remote(so, tmp_path))


def test_connection_refused_is_a_typed_error_after_bounded_retries(tmp_path):
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    so = {"endpoint_url": "http://127.0.0.1:%d" % port,
          "config_kwargs": {"connect_timeout": 1, "retries": {"max_attempts": 1}}}
    with pytest.raises(RemoteConnectionError, match="after 3 attempts") as e:
        open_store("s3://b/x.rec", **_remote(so, tmp_path))
    assert e.value.path.startswith("s3://b/x.")


def test_block_shuffle_is_seeded_complete_and_shard_local():
    sizes = [5, 3, 0, 7, 4]
    starts = np.concatenate(([0], np.cumsum(sizes)))
    s = BlockShuffleSampler(sizes, seed=7, parts_per_block=2)
    orders = []
    for epoch in (0, 1):
        s.set_epoch(epoch)
        keys = list(s)
        assert sorted(int(k) for k in keys) == list(range(19))
        assert {k.epoch for k in keys} == {epoch}
        for block in s.blocks():  # each block draws from at most 2 parts
            assert len(set(np.searchsorted(starts, block, side="right"))) <= 2
        orders.append([int(k) for k in keys])
    assert orders[0] != orders[1]
    again = BlockShuffleSampler(sizes, seed=7, parts_per_block=2)
    again.set_epoch(1)
    assert [int(k) for k in again] == orders[1]
    assert [int(k) for k in BlockShuffleSampler(sizes, shuffle=False)] == list(range(19))


def test_prefetch_sampler_downloads_ahead_in_sampler_order(voc_s3, so, tmp_path):
    uri, local = voc_s3
    store = open_store(uri, **_remote(so, tmp_path))
    inner = BlockShuffleSampler(store.parts(), seed=3)
    sampler = PrefetchSampler(inner, store, lookahead=4)
    it = iter(sampler)
    first = next(it)
    store._pending.peek().result(timeout=60)  # the download started by the first step
    rec_copy = [n for d in os.listdir(tmp_path / "cache" / "objects")
                for n in os.listdir(tmp_path / "cache" / "objects" / d)]
    assert sorted(rec_copy) == ["voc.idx", "voc.rec"]
    assert [int(first)] + [int(k) for k in it] == [int(k) for k in inner]
    store.close()


def test_options_parsing():
    assert parse_size("2GB") == 2 * 10 ** 9 and parse_size("1GiB") == 1 << 30
    assert parse_size(1234) == 1234 and parse_size(None) is None
    with pytest.raises(ValueError):
        parse_size("lots")
    assert parse_storage_options(["endpoint_url=http://h:1", "anon=true",
                                  'config_kwargs={"connect_timeout": 5}']) == {
        "endpoint_url": "http://h:1", "anon": True, "config_kwargs": {"connect_timeout": 5}}
    with pytest.raises(ValueError, match="KEY=VALUE"):
        parse_storage_options(["novalue"])
    with pytest.raises(ValueError, match="reads must be"):  # before any request
        RemoteStore("s3://b/x.rec", reads="everything")


def test_sharded_dataset_in_s3_read_shard_by_shard_under_a_small_cache(s3, so, voc_src,
                                                                        voc_s3, tmp_path):
    pytest.importorskip("gluon_data.stores.shards")
    uri = _fresh_uri("sharded/voc.rec")
    s3.log.clear()
    report = convert_to_uri(voc_src, uri, layout="voc", split="trainval", shard_items=4,
                            storage_options=so, cache_dir=str(tmp_path / "stage"))
    manifest = report.outputs["trainval"]
    assert manifest == _fresh_uri("sharded/voc.shards.json")
    puts = [e[1] for e in s3.log if e[0] == "PUT"]
    assert puts.index("/%s/sharded/voc.shards.json" % BUCKET) > max(
        i for i, p in enumerate(puts) if p.endswith(".rec"))  # the manifest goes up last
    ref = RecordFile(voc_s3[1])  # the unsharded conversion: same payloads
    store = open_store(manifest, **_remote(so, tmp_path, max_open_shards=1))
    assert len(store) == 16 and store.parts() == [4, 4, 4, 4]
    fs, _ = filesystem(manifest, so)
    sizes = [fs.info(u)["size"] + fs.info(u[:-4] + ".idx")["size"] for u in store.uris]
    limit = 2 * max(sizes) + 16  # room for two of the four shards: the one read, the next
    store = open_store(manifest, **_remote(so, tmp_path, max_open_shards=1,
                                           cache_limit=limit))
    assert limit < sum(sizes)
    sampler = BlockShuffleSampler(store.parts(), seed=5)
    s3.log.clear()
    got = {int(k): store.read(int(k)) for k in PrefetchSampler(sampler, store, lookahead=6)}
    assert got == {i: ref.read(i) for i in range(16)}
    for u in store.uris:  # block shuffle: every shard downloaded exactly once
        assert s3.served(u.split(BUCKET, 1)[1]) == fs.info(u)["size"]
    assert ShardCache(str(tmp_path / "cache"), limit).usage() <= limit
    store.close()
    ep = "endpoint_url=" + s3.url
    s3.log.clear()
    assert main(["verify", manifest, "--storage-option", ep]) == 0  # ranged reads, no cache
    assert main(["info", manifest, "--storage-option", ep]) == 0
    assert s3.served(".rec") <= sum(fs.info(u)["size"] for u in store.uris) + 4 * 4096
    damaged = store.uris[2]
    fs.pipe_file(damaged.split("://", 1)[1], b"\0" * fs.info(damaged)["size"])
    fresh = open_store(manifest, **_remote(so, tmp_path / "other"))
    with pytest.raises(ChecksumMismatchError) as e:
        fresh.read(9)
    assert e.value.path == damaged


def test_cli_sharded_convert_to_s3_manifest_last_then_read(s3, so, tmp_path, capsys,
                                                           monkeypatch):
    from gluon_data.convert.sample import make_imagefolder
    src = make_imagefolder(str(tmp_path / "folder"), per_class=3)
    uri = _fresh_uri("clishards/cls.rec")
    ep = "endpoint_url=" + s3.url
    s3.log.clear()
    assert main(["convert", src, uri, "--quiet", "--workers", "1", "--shards", "2",
                 "--storage-option", ep]) == 0
    manifest = _fresh_uri("clishards/cls.shards.json")
    puts = [e[1] for e in s3.log if e[0] == "PUT"]
    assert [p for p in puts if p.endswith(".shards.json")] == ["/%s/clishards/cls.shards.json"
                                                               % BUCKET]
    assert puts.index("/%s/clishards/cls.shards.json" % BUCKET) > max(
        i for i, p in enumerate(puts) if p.endswith((".rec", ".idx", ".meta.json")))
    local = str(tmp_path / "cls.rec")
    convert(src, local, "imagefolder")
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3.url)
    ds, ref = ImageRecordDataset(manifest), ImageRecordDataset(local)
    assert len(ds) == len(ref) == 9
    for i in range(len(ref)):
        (a, la), (b, lb) = ds[i], ref[i]
        assert np.array_equal(a.asnumpy(), b.asnumpy()) and la == lb
    capsys.readouterr()
    assert main(["info", manifest, "--json", "--storage-option", ep]) == 0
    assert json.loads(capsys.readouterr().out)["records"] == 9
    assert main(["verify", manifest, "--storage-option", ep]) == 0


def test_overwrite_replaces_only_our_own_output(s3, so, tmp_path, capsys):
    from gluon_data.convert.sample import make_imagefolder
    src = make_imagefolder(str(tmp_path / "folder"), per_class=2)
    fs, _ = filesystem(_fresh_uri("x"), so)
    ep = "endpoint_url=" + s3.url
    # someone else's object under the output name (no metadata of ours beside it)
    fs.pipe_file("%s/foreign/data.rec" % BUCKET, b"not a dataset of ours")
    s3.log.clear()
    with pytest.raises(OutputError) as e:
        convert_to_uri(src, _fresh_uri("foreign/data.rec"), "imagefolder", overwrite=True,
                       storage_options=so, cache_dir=str(tmp_path / "stage"))
    assert e.value.path == _fresh_uri("foreign/data.rec")
    assert not [x for x in s3.log if x[0] in ("PUT", "POST", "DELETE")]
    assert fs.cat_file("%s/foreign/data.rec" % BUCKET) == b"not a dataset of ours"
    # a foreign metadata-named object: the CLI refuses too, and says why
    fs.pipe_file("%s/foreign2/data.meta.json" % BUCKET, b'{"format": "someone-else"}')
    fs.pipe_file("%s/foreign2/data.rec" % BUCKET, b"theirs")
    assert main(["convert", src, _fresh_uri("foreign2/data.rec"), "--quiet", "--workers", "1",
                 "--overwrite", "--storage-option", ep]) == 1
    assert "not a dataset written by gluon-data" in capsys.readouterr().err
    assert fs.cat_file("%s/foreign2/data.rec" % BUCKET) == b"theirs"
    # a foreign object under a shard's name: refused before anything is uploaded
    fs.pipe_file("%s/foreign3/data-00000-of-00002.rec" % BUCKET, b"theirs")
    s3.log.clear()
    with pytest.raises(OutputError):
        convert_to_uri(src, _fresh_uri("foreign3/data.rec"), "imagefolder", overwrite=True,
                       shards=2, storage_options=so, cache_dir=str(tmp_path / "stage"))
    assert not [x for x in s3.log if x[0] in ("PUT", "POST", "DELETE")]
    # our own output (sharded, committed by its manifest) is replaced
    uri = _fresh_uri("ours/data.rec")
    convert_to_uri(src, uri, "imagefolder", shards=2, storage_options=so,
                   cache_dir=str(tmp_path / "stage"))
    with pytest.raises(FileExistsError):
        convert_to_uri(src, uri, "imagefolder", shards=2, storage_options=so,
                       cache_dir=str(tmp_path / "stage"))
    s3.log.clear()
    convert_to_uri(src, uri, "imagefolder", shards=2, overwrite=True, storage_options=so,
                   cache_dir=str(tmp_path / "stage"))
    assert s3.requests("ours/data.shards.json", "PUT")


def test_split_outputs_that_exist_are_refused_before_any_work(so, voc_src, tmp_path):
    """A ``.rec`` conversion of two splits to a URI whose split objects exist is refused
    before the source is converted: nothing staged in the cache (it converted everything
    into staging, then refused at the upload, and left the staging behind)."""
    uri = _fresh_uri("splits-again/voc.rec")
    stage = tmp_path / "stage"
    kw = dict(split="train,val", storage_options=so, cache_dir=str(stage))
    convert_to_uri(voc_src, uri, "voc", **kw)
    with pytest.raises(FileExistsError, match="voc_train.rec already exists"):
        convert_to_uri(voc_src, uri, "voc", **kw)
    staged = stage / "staging"
    assert not staged.exists() or not any(staged.iterdir()), list(staged.rglob("*"))


class _Stalled(str):
    """The URL of a stalled server, with the connections it accepted (``held``)."""
    held: list


@pytest.fixture
def stalled_server():
    """A TCP server on 127.0.0.1 that accepts connections and never answers."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    srv.settimeout(0.2)
    held, stop = [], threading.Event()

    def accept():
        while not stop.is_set():  # bounded by stop; each accept waits at most 0.2 s
            try:
                held.append(srv.accept()[0])
            except (socket.timeout, OSError):
                continue

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    url = _Stalled("http://127.0.0.1:%d" % srv.getsockname()[1])
    url.held = held
    yield url
    stop.set()
    t.join(5)
    for c in held:
        c.close()
    srv.close()


@pytest.fixture
def unreachable_server():
    """A TCP port on 127.0.0.1 whose listener never accepts and whose backlog is full: new
    connections are never established (SYNs dropped), as with a host that is down."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(0)
    fillers = []
    for _ in range(4):  # fill the accept queue (its length is backlog + 1 on Linux)
        c = socket.socket()
        c.setblocking(False)
        c.connect_ex(srv.getsockname())
        fillers.append(c)
    time.sleep(0.2)
    yield "http://127.0.0.1:%d" % srv.getsockname()[1]
    for c in fillers:
        c.close()
    srv.close()


@pytest.mark.parametrize("configured", ["environment", "storage_options"])
def test_stalled_server_is_a_bounded_typed_error(stalled_server, tmp_path, monkeypatch,
                                                 configured):
    from gluon_data.storage.remotefs import call_bound
    uri = "s3://%s/stalled/x.rec" % BUCKET
    so = {"endpoint_url": stalled_server, "key": "testing", "secret": "testing"}
    if configured == "environment":
        monkeypatch.setenv("GLUON_DATA_REMOTE_READ_TIMEOUT", "0.5")
        monkeypatch.setenv("GLUON_DATA_REMOTE_CONNECT_TIMEOUT", "0.5")
    else:
        so["config_kwargs"] = {"read_timeout": 0.5, "connect_timeout": 0.5}
    bound = call_bound(retries=1, backoff=0.01, storage_options=so)
    assert bound == pytest.approx(2 * 1.0 + 0.01)
    filesystem(uri, so)  # imports and client set-up are not part of a call's bound
    t0 = time.monotonic()
    with pytest.raises(RemoteConnectionError) as e:
        open_store(uri, storage_options=so, cache_dir=str(tmp_path / "c"), retries=1,
                   backoff=0.01)
    elapsed = time.monotonic() - t0
    assert e.value.path in (uri, uri[:-4] + ".meta.json")  # the object that stalled
    assert "2 attempts" in str(e.value)
    assert "Timeout" in str(e.value)
    # two attempts of one 0.5 s read timeout each: s3fs no longer retries inside an attempt
    # (it made 5 tries with sleeps each, so one call against a stalled server took
    # 5 x 5 x 60 s with the defaults, and here opened 20 connections, not 4). Counted in
    # connections, as the time of each also holds the client's work on a loaded machine
    # (the other test worker's included); the time bound is only a generous ceiling (the
    # defaults would take 2 x 70 s), never a floor at the expected value
    assert 2 <= len(stalled_server.held) <= 4, len(stalled_server.held)
    assert elapsed < bound + 20.0



# --------------------------------------------------------------------------- LMDB in S3
@pytest.fixture(scope="session")
def voc_lmdb(voc_src, tmp_path_factory):
    """The VOC sample as a local LMDB (splits train and val), written by our converter."""
    local = str(tmp_path_factory.mktemp("rlmdb") / "voc.lmdb")
    convert(voc_src, local, "voc", split="trainval", val_ratio=0.5)
    return local


def _upload_lmdb(so, local, uri, commit=False):
    """Upload a local environment folder as it is (data.mdb; there is no lock.mdb), and
    with ``commit`` the commit document of FORMAT.md §8 after it, as the writer does."""
    import hashlib
    from gluon_data.stores.lmdbio import read_lmdb_meta
    fs, path = filesystem(uri, so)
    assert sorted(os.listdir(local)) == ["data.mdb"]
    data = os.path.join(local, "data.mdb")
    fs.put_file(data, path + "/data.mdb")
    if commit:
        with open(data, "rb") as f:
            sha = hashlib.sha256(f.read()).hexdigest()
        doc = {"format": "gluon_data-lmdb", "format_version": 1, "container": "lmdb",
               "splits": read_lmdb_meta(local),
               "files": {"data.mdb": {"bytes": os.path.getsize(data), "sha256": sha}}}
        fs.pipe_file(path + "/meta.json", json.dumps(doc, sort_keys=True).encode())
    return uri


def test_lmdb_in_s3_reads_byte_identical_through_two_workers_sharing_the_cache(
        s3, so, voc_lmdb, tmp_path):
    from gluon_data.stores.lmdbio import LMDBFile
    uri = _upload_lmdb(so, voc_lmdb, _fresh_uri("lm/voc.lmdb"))
    size = os.path.getsize(os.path.join(voc_lmdb, "data.mdb"))
    s3.log.clear()
    store = open_store(uri, "val", **_remote(so, tmp_path))
    assert store.splits == ["train", "val"] and store.split == "val"
    assert s3.served("lm/voc.lmdb/data.mdb") == size  # downloaded whole, once
    ref = LMDBFile(voc_lmdb, "val")
    assert len(store) == len(ref) == 8 and store.meta == ref.meta
    assert [store.read(i) for i in range(len(store))] == [ref.read(i) for i in range(8)]
    assert [bytes(v) for v in store.scan()] == [ref.read(i) for i in range(8)]
    # the cached copy is an LMDB folder holding data.mdb, opened read-only without a lock file
    (entry,) = os.listdir(tmp_path / "cache" / "objects")
    assert os.listdir(tmp_path / "cache" / "objects" / entry) == ["data.mdb"]
    ds = SegmentationDataset(store, ignore_value=None)
    local_ds = SegmentationDataset(open_store(voc_lmdb, "val"), ignore_value=None)
    def digest(a, b):  # what batches of differently sized samples can carry
        a, b = (x.asnumpy() if hasattr(x, "asnumpy") else x for x in (a, b))
        w = np.arange(a.size, dtype=np.float64) % 251
        return np.array([a.shape[0], a.shape[1], (a.ravel() * w).sum(),
                         (b.ravel() * w[:b.size]).sum()])
    loader = mx.gluon.data.DataLoader(ds.transform(digest), batch_size=2, num_workers=2,
                                      timeout=120)
    got = np.concatenate([batch.asnumpy() for batch in loader])
    want = np.stack([digest(*local_ds._arrays(i)) for i in range(8)])
    assert got.shape == (8, 4) and np.array_equal(got, want)
    # a second store on the same cache (another job on the node, an unpickled copy in a
    # worker) finds the copy: no second download
    import pickle
    again = pickle.loads(pickle.dumps(open_store(uri, "train", **_remote(so, tmp_path))))
    assert again.read(0) == LMDBFile(voc_lmdb, "train").read(0)
    assert s3.served("lm/voc.lmdb/data.mdb") == size
    with pytest.raises(FormatError, match="split 'test' not found; available splits: "
                                          "train, val") as e:
        open_store(uri, "test", **_remote(so, tmp_path))
    assert e.value.path == uri
    store.close()


def test_lmdb_in_s3_info_verify_stats_show(s3, so, voc_lmdb, tmp_path, capsys, monkeypatch):
    uri = _upload_lmdb(so, voc_lmdb, _fresh_uri("lmcli/voc.lmdb"))
    monkeypatch.setenv("GLUON_DATA_CACHE_DIR", str(tmp_path / "cache"))
    ep = ["--storage-option", "endpoint_url=" + s3.url]
    assert main(["info", uri, "--json"] + ep) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["container"] == "lmdb" and sorted(info["splits"]) == ["train", "val"]
    assert info["splits"]["val"]["records"] == 8
    assert info["bytes"] == os.path.getsize(os.path.join(voc_lmdb, "data.mdb"))
    assert main(["verify", uri] + ep) == 0
    assert "16 checked: OK" in capsys.readouterr().out
    assert main(["stats", uri, "--split", "val", "--json"] + ep) == 0
    assert json.loads(capsys.readouterr().out)["classes"]
    out = str(tmp_path / "s.png")
    assert main(["show", uri, "--split", "val", "--index", "3", "--out", out] + ep) == 0
    assert os.path.getsize(out) > 0
    # every dataset class takes the URI (endpoint from the standard environment)
    from gluon_data.gluon.datasets import SegmentationLMDBDataset
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3.url)
    ds = SegmentationLMDBDataset(uri, split="train", ignore_value=None)
    ref = SegmentationLMDBDataset(voc_lmdb, split="train", ignore_value=None)
    for i in range(len(ref)):
        (a, m), (b, n) = ds._arrays(i), ref._arrays(i)
        assert np.array_equal(a, b) and np.array_equal(m, n)


def test_tampered_lmdb_in_s3_is_a_checksum_error_naming_it(s3, so, voc_lmdb, tmp_path):
    from gluon_data.stores.lmdbio import LMDBFile
    uri = _fresh_uri("lmtamper/voc.lmdb")
    data = bytearray(open(os.path.join(voc_lmdb, "data.mdb"), "rb").read())
    payload = LMDBFile(voc_lmdb, "train").read(2)
    at = data.find(payload[-64:])  # inside record 2's image bytes
    assert at > 0
    while at >= 0:  # (LMDB may hold stale copies of a page: change them all)
        data[at + 10] ^= 0xFF  # same size, one byte of one record flipped
        at = data.find(payload[-64:], at + 1)
    fs, path = filesystem(uri, so)
    fs.pipe_file(path + "/data.mdb", bytes(data))
    with pytest.raises(ChecksumMismatchError) as e:
        open_store(uri, **_remote(so, tmp_path))
    assert e.value.path == uri + "/data.mdb" and "checksum mismatch" in str(e.value)
    assert "split train" in str(e.value) and e.value.key == 2
    objects = tmp_path / "cache" / "objects"
    assert not [n for d in os.listdir(objects) for n in os.listdir(objects / d)]  # discarded
    fs.pipe_file(path + "/data.mdb", bytes(data[:len(data) // 2]))  # truncated upload
    with pytest.raises(ChecksumMismatchError, match="truncated"):
        open_store(uri, **_remote(so, tmp_path))
    fs.rm_file(path + "/data.mdb")
    with pytest.raises(RemoteNotFoundError, match="no LMDB environment here"):
        open_store(uri, **_remote(so, tmp_path))


# --------------------------------------------------------------------------- copy from a URI
def _files_equal(a, b):
    with open(a, "rb") as f, open(b, "rb") as g:
        return f.read() == g.read()


def test_copy_from_s3_rec_to_local_lmdb_equal_sample_for_sample(voc_s3, s3, tmp_path,
                                                                 capsys, monkeypatch):
    from gluon_data.convert import copy_dataset
    from gluon_data.stores.lmdbio import LMDBFile, read_lmdb_meta
    uri, local = voc_s3
    monkeypatch.setenv("GLUON_DATA_CACHE_DIR", str(tmp_path / "cache"))
    out = str(tmp_path / "from_s3.lmdb")
    assert main(["convert", uri, out, "--quiet", "--storage-option",
                 "endpoint_url=" + s3.url]) == 0
    assert "wrote 16 records to %s" % out in capsys.readouterr().out
    ref = str(tmp_path / "from_local.lmdb")
    copy_dataset(local, ref)  # the same copy from the local file
    assert read_lmdb_meta(out) == read_lmdb_meta(ref)
    assert "files" not in read_lmdb_meta(out)["trainval"]  # the upload's record stays behind
    a, b = LMDBFile(out, "trainval"), LMDBFile(ref, "trainval")
    raw = RecordFile(local)
    assert [a.read(i) for i in range(16)] == [b.read(i) for i in range(16)] == \
        [raw.read(i) for i in range(16)]
    got = SegmentationDataset(open_store(out, "trainval"), ignore_value=None)
    want = SegmentationRecordDataset(local, ignore_value=None)
    for i in range(16):
        (x, m), (y, n) = got._arrays(i), want._arrays(i)
        assert np.array_equal(x, y) and np.array_equal(m, n)
    # the same rules as a local copy: an existing output is refused without --overwrite
    assert main(["convert", uri, out, "--quiet", "--storage-option",
                 "endpoint_url=" + s3.url]) == 1
    assert "already exists" in capsys.readouterr().err


def test_copy_from_s3_lmdb_to_local_rec_byte_identical(s3, so, voc_lmdb, tmp_path, capsys,
                                                       monkeypatch):
    from gluon_data.convert import copy_dataset
    uri = _upload_lmdb(so, voc_lmdb, _fresh_uri("lmcopy/voc.lmdb"))
    monkeypatch.setenv("GLUON_DATA_CACHE_DIR", str(tmp_path / "cache"))
    out = str(tmp_path / "val.rec")
    assert main(["convert", uri, out, "--split", "val", "--quiet", "--storage-option",
                 "endpoint_url=" + s3.url]) == 0
    ref = str(tmp_path / "ref" / "val.rec")
    os.makedirs(os.path.dirname(ref))
    copy_dataset(voc_lmdb, ref, split="val")
    for ext in (".rec", ".idx", ".meta.json"):
        assert _files_equal(out.replace(".rec", ext), ref.replace(".rec", ext)), ext


def test_reshard_from_s3_rec_same_shards_and_resume_rules(voc_s3, s3, tmp_path, capsys,
                                                          monkeypatch):
    from gluon_data.stores.shards import read_manifest
    uri, local = voc_s3
    monkeypatch.setenv("GLUON_DATA_CACHE_DIR", str(tmp_path / "cache"))
    ep = ["--storage-option", "endpoint_url=" + s3.url]
    out = str(tmp_path / "remote" / "voc.rec")
    ref = str(tmp_path / "local" / "voc.rec")
    os.makedirs(os.path.dirname(out))
    os.makedirs(os.path.dirname(ref))
    s3.log.clear()
    assert main(["convert", uri, out, "--shards", "2", "--workers", "2", "--quiet"] + ep) == 0
    assert "written" in capsys.readouterr().out
    assert s3.served("sess/voc.rec") == os.path.getsize(local)  # once, for both tasks
    assert main(["convert", local, ref, "--shards", "2", "--workers", "1", "--quiet"]) == 0
    capsys.readouterr()
    doc = read_manifest(str(tmp_path / "remote" / "voc.shards.json"))
    assert doc["plan"]["source"] == uri and doc["num_records"] == 16
    assert "files" not in doc["meta"]
    for sh in doc["shards"]:  # the records and the index, byte for byte
        for ext in (".rec", ".idx"):
            name = sh["name"].replace(".rec", ext)
            assert _files_equal(str(tmp_path / "remote" / name), str(tmp_path / "local" / name))
    # a rerun keeps the finished shards (the local rule), downloading nothing
    s3.log.clear()
    assert main(["convert", uri, out, "--shards", "2", "--quiet"] + ep) == 0
    assert capsys.readouterr().out.count("kept (already done)") == 2
    assert s3.served("sess/voc.rec") == 0


def test_merge_a_remote_manifest_into_one_local_shard(s3, so, voc_src, tmp_path, capsys,
                                                      monkeypatch):
    from gluon_data.stores.shards import read_manifest
    uri = _fresh_uri("mergesrc/voc.rec")
    report = convert_to_uri(voc_src, uri, layout="voc", split="trainval", shard_items=4,
                            storage_options=so, cache_dir=str(tmp_path / "stage"))
    manifest = report.outputs["trainval"]
    monkeypatch.setenv("GLUON_DATA_CACHE_DIR", str(tmp_path / "cache"))
    out = str(tmp_path / "merged.rec")
    assert main(["convert", manifest, out, "--shards", "1", "--quiet", "--storage-option",
                 "endpoint_url=" + s3.url]) == 0
    doc = read_manifest(str(tmp_path / "merged.shards.json"))
    assert [s["records"] for s in doc["shards"]] == [16]
    local = str(tmp_path / "local.rec")
    convert(voc_src, local, "voc", split="trainval")
    merged, ref = RecordFile(str(tmp_path / doc["shards"][0]["name"])), RecordFile(local)
    assert [merged.read(i) for i in range(16)] == [ref.read(i) for i in range(16)]
    assert [merged.key(i) for i in range(16)] == [ref.key(i) for i in range(16)]


def test_lmdb_in_s3_with_its_commit_document(s3, so, voc_lmdb, tmp_path, capsys, monkeypatch):
    from gluon_data.stores.lmdbio import LMDBFile
    uri = _upload_lmdb(so, voc_lmdb, _fresh_uri("lmcommit/voc.lmdb"), commit=True)
    size = os.path.getsize(os.path.join(voc_lmdb, "data.mdb"))
    monkeypatch.setenv("GLUON_DATA_CACHE_DIR", str(tmp_path / "cache"))
    s3.log.clear()
    assert main(["info", uri, "--json", "--storage-option", "endpoint_url=" + s3.url]) == 0
    assert sorted(json.loads(capsys.readouterr().out)["splits"]) == ["train", "val"]
    assert s3.served("lmcommit/voc.lmdb/data.mdb") == 0  # meta.json is enough for info
    store = open_store(uri, "train", **_remote(so, tmp_path))
    assert store.meta == LMDBFile(voc_lmdb, "train").meta and len(store) == 8
    assert s3.served("lmcommit/voc.lmdb/data.mdb") == 0
    store.will_need(range(4), wait=True)  # the sampler's next indices, downloaded
    import pickle
    store = pickle.loads(pickle.dumps(store))  # (what a spawned worker gets)
    assert s3.served("lmcommit/voc.lmdb/data.mdb") == size
    ref = LMDBFile(voc_lmdb, "train")
    assert [store.read(i) for i in range(8)] == [ref.read(i) for i in range(8)]
    assert s3.served("lmcommit/voc.lmdb/data.mdb") == size  # once
    assert store.identity().startswith("sha256:")
    # damaged after upload: the SHA-256 in meta.json refuses the download
    fs, path = filesystem(uri, so)
    data = bytearray(open(os.path.join(voc_lmdb, "data.mdb"), "rb").read())
    data[-100] ^= 0xFF  # (bytes no record check would read)
    fs.pipe_file(path + "/data.mdb", bytes(data))
    bad = open_store(uri, **dict(_remote(so, tmp_path), cache_dir=str(tmp_path / "c2")))
    with pytest.raises(ChecksumMismatchError, match="SHA-256") as e:
        bad.read(0)
    assert e.value.path == uri + "/data.mdb"
    fs.pipe_file(path + "/data.mdb", bytes(data[:-4096]))  # another size: refused at open
    with pytest.raises(ChecksumMismatchError, match="meta.json records"):
        open_store(uri, **_remote(so, tmp_path))
    # an upload in progress (its marker, no commit document yet) is not a dataset
    fs.rm_file(path + "/meta.json")
    fs.pipe_file(path + "/uploading.json", b'{"writer": "gluon_data", "started": 0}')
    with pytest.raises(FormatError, match="upload of this dataset is in progress"):
        open_store(uri, **_remote(so, tmp_path))


def test_lmdb_shards_in_s3_read_as_one_dataset(s3, so, voc_src, tmp_path, capsys,
                                               monkeypatch):
    import hashlib
    from gluon_data.convert.sharded import convert_sharded
    local = str(tmp_path / "lm" / "voc.lmdb")
    convert_sharded(voc_src, local, "voc", split="trainval", shard_items=6)
    folder = os.path.dirname(local)
    with open(os.path.join(folder, "voc.shards.json")) as f:
        doc = json.load(f)
    assert doc["container"] == "lmdb" and len(doc["shards"]) == 3
    fs, base = filesystem(_fresh_uri("lmshards"), so)
    files = {}
    for sh in doc["shards"]:
        data = os.path.join(folder, sh["name"], "data.mdb")
        fs.put_file(data, "%s/%s/data.mdb" % (base, sh["name"]))
        with open(data, "rb") as f:
            files[sh["name"] + "/data.mdb"] = {"bytes": os.path.getsize(data),
                                               "sha256": hashlib.sha256(f.read()).hexdigest()}
    from gluon_data.format.meta import dumps_meta  # as the uploader writes it: with its checksum
    fs.pipe_file(base + "/voc.shards.json", dumps_meta(dict(doc, files=files)))
    store = open_store(_fresh_uri("lmshards/voc.shards.json"),
                       **_remote(so, tmp_path, max_open_shards=1))
    ref = open_store(os.path.join(folder, "voc.shards.json"))
    assert len(store) == len(ref) == 16
    assert [store.read(i) for i in range(16)] == [ref.read(i) for i in range(16)]
    assert [store.key(i) for i in range(16)] == [ref.key(i) for i in range(16)]
    ds = SegmentationDataset(store, ignore_value=None)
    a, m = ds._arrays(13)
    b, n = SegmentationDataset(ref, ignore_value=None)._arrays(13)
    assert np.array_equal(a, b) and np.array_equal(m, n)
    store.close()
    ep = ["--storage-option", "endpoint_url=" + s3.url]
    monkeypatch.setenv("GLUON_DATA_CACHE_DIR", str(tmp_path / "cache"))
    assert main(["verify", _fresh_uri("lmshards/voc.shards.json")] + ep) == 0
    assert "16 checked: OK" in capsys.readouterr().out


def test_a_dataset_copied_to_a_uri_is_uploaded_not_written_to_a_local_s3_folder(
        voc_s3, s3, so, tmp_path, capsys, monkeypatch):
    uri, local = voc_s3
    monkeypatch.setenv("GLUON_DATA_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    target = _fresh_uri("copyup/voc.rec")
    assert main(["convert", uri, target, "--quiet", "--storage-option",
                 "endpoint_url=" + s3.url]) == 0  # from S3 to S3, through the staging folder
    assert not os.path.exists(tmp_path / "s3:")
    store = open_store(target, **_remote(so, tmp_path))
    ref = RecordFile(local)
    assert [store.read(i) for i in range(len(store))] == [ref.read(i) for i in range(16)]


def test_unreachable_endpoint_is_a_bounded_typed_error(unreachable_server, tmp_path,
                                                       monkeypatch):
    from gluon_data.storage.remotefs import call_bound
    monkeypatch.setenv("GLUON_DATA_REMOTE_CONNECT_TIMEOUT", "0.5")
    monkeypatch.setenv("GLUON_DATA_REMOTE_READ_TIMEOUT", "0.5")
    so = {"endpoint_url": unreachable_server, "key": "testing", "secret": "testing"}
    uri = "s3://%s/unreachable/x.rec" % BUCKET
    filesystem(uri, so)  # imports and client set-up are not part of a call's bound
    t0 = time.monotonic()
    with pytest.raises(RemoteConnectionError, match="after 3 attempts") as e:
        open_store(uri, storage_options=so, cache_dir=str(tmp_path / "c"), retries=2,
                   backoff=0.01)
    elapsed = time.monotonic() - t0
    assert e.value.path.startswith("s3://%s/unreachable/x." % BUCKET)
    # bounded by counts: 3 attempts (the message), each a connect that never completes; the
    # time is only a generous ceiling (expected ~3 s: 3 x the 0.5 s connect + 0.5 s read
    # timeouts; the default 10 s connect timeout alone would take 30 s), far from its
    # expected value, so a loaded machine does not fail it
    assert call_bound(retries=2, backoff=0.01) < 4.0
    assert elapsed < 25.0, elapsed


def test_a_server_silent_after_taking_an_upload_is_retried_within_the_bound(s3, so, tmp_path):
    """The server answers the PUT's ``Expect: 100-continue``, reads the body and never answers:
    aiohttp then has no read timeout at all (a 1xx answer disarms it), so without our own
    per-attempt limit this upload waited forever. Now the attempt is cancelled at its limit and
    our next attempt succeeds; s3fs retries nothing inside an attempt."""
    from gluon_data.storage.remotefs import Remote, attempt_limit, call_bound
    fast = dict(so, config_kwargs={"connect_timeout": 1.5, "read_timeout": 1.5,
                                   "retries": {"max_attempts": 1}})
    remote = Remote(fast, retries=1, backoff=0.01)
    uri = _fresh_uri("dropped/a.bin")
    s3.drop_put = ("dropped/a.bin", 1)
    s3.log.clear()
    t0 = time.monotonic()
    remote.pipe(uri, b"payload")  # our second attempt succeeds
    # counted: two PUTs (the silent one cancelled at its limit, then ours); the time is a
    # ceiling far from the ~3 s expected (without the limit the call never returned)
    assert time.monotonic() - t0 < 5 * attempt_limit(fast, 7)
    assert len(s3.requests("dropped/a.bin", "PUT")) == 2
    assert remote.cat(uri) == b"payload"
    assert remote.fs(uri)[0].retries == 1
    s3.drop_put = ("dropped/a.bin", 100)  # silent for good: a typed error, in bounded time
    s3.log.clear()
    t0 = time.monotonic()
    with pytest.raises(RemoteConnectionError, match="after 2 attempts") as e:
        remote.pipe(uri, b"other")
    assert e.value.path == uri
    # two attempts (the message), each at most two PUTs (the client library may send one
    # again inside an attempt when the server drops the connection): counted, not timed
    assert 2 <= len(s3.requests("dropped/a.bin", "PUT")) <= 4, s3.log
    assert time.monotonic() - t0 < 5 * call_bound(1, 0.01, fast, nbytes=5)  # a ceiling
    s3.drop_put = None
    assert remote.cat(uri) == b"payload"


# ---------------------------------------------------------------- shards uploaded by their tasks
def _objects(fs, prefix):
    """``{name: bytes}`` of every object under ``BUCKET/prefix/``."""
    return {p.rsplit("/", 1)[-1] if "/" not in p[len(BUCKET) + len(prefix) + 2:]
            else p[len(BUCKET) + len(prefix) + 2:]: fs.cat_file(p)
            for p in fs.find("%s/%s/" % (BUCKET, prefix))}


def _shard_files_under(root):
    return [os.path.join(d, n) for d, _, names in os.walk(root) for n in names
            if "-of-" in os.path.relpath(os.path.join(d, n), root)]  # a shard's, or partial


def test_dask_workers_upload_their_own_shards(s3, so, tmp_path):
    """``--engine dask``: every shard is written, verified and uploaded on a worker, staged
    under the worker's own cache folder (never the client's), the client uploads the manifest
    last, the objects equal the local engine's byte for byte, credentials travel with the
    tasks only, and a task that failed mid-upload and was retried by Dask gives the same
    bytes."""
    dd = pytest.importorskip("dask.distributed")
    from gluon_data.convert.sample import make_imagefolder
    from gluon_data.convert.sharded import convert_sharded
    src = make_imagefolder(str(tmp_path / "folder"), per_class=4)
    worker_cache, client_cache = tmp_path / "worker-cache", tmp_path / "client-cache"
    # the workers know neither the endpoint nor any credentials: they come with the tasks
    creds = dict(so, key="gd-key-7f3a1", secret="gd-secret-91c2e")
    cluster = dd.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                              dashboard_address=None,
                              env={"GLUON_DATA_CACHE_DIR": str(worker_cache),
                                   "AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": "",
                                   "AWS_ENDPOINT_URL": ""})
    seen, stop = [], threading.Event()

    def watch():  # the client's staging folder must never hold a shard, not even briefly
        while not stop.is_set():
            seen.extend(_shard_files_under(client_cache))
            time.sleep(0.005)

    watcher = threading.Thread(target=watch, daemon=True)
    try:
        with dd.Client(cluster, timeout=60) as client:
            env = client.run(lambda: os.environ.get("AWS_SECRET_ACCESS_KEY"))
            assert set(env.values()) == {""}
            watcher.start()
            s3.log.clear()
            report = convert_to_uri(src, _fresh_uri("dask/c.rec"), "imagefolder", shards=3,
                                    engine="dask", scheduler=cluster.scheduler_address,
                                    storage_options=creds, cache_dir=str(client_cache))
            stop.set()
            watcher.join(10)
            assert report.outputs == {"train": _fresh_uri("dask/c.shards.json")}
            assert not seen and not _shard_files_under(client_cache)
            staged = worker_cache / "staging" / "shards"
            assert staged.is_dir() and not _shard_files_under(staged)  # used, then emptied
            puts = [e[1] for e in s3.log if e[0] == "PUT" and "/dask/" in e[1]]
            shard_puts = [i for i, p in enumerate(puts) if "-of-00003" in p]
            assert len(shard_puts) == 3 * 4  # .rec .idx .meta.json and a receipt per shard
            assert puts[-1].endswith("dask/c.shards.json") and len(shard_puts) == len(puts) - 2
            assert puts[0].endswith("dask/c.uploading.json")
            assert s3.requests("dask/c.uploading.json", "DELETE")

            # a task whose upload fails is retried by Dask: same bytes. The server takes shard
            # 1's .idx and goes silent; with retries=0 the task raises, Dask runs it again.
            fast = dict(creds, config_kwargs={"connect_timeout": 2, "read_timeout": 2,
                                              "retries": {"max_attempts": 1}})
            s3.drop_put = ("retry/c-00001-of-00003.idx", 1)
            s3.log.clear()
            convert_to_uri(src, _fresh_uri("retry/c.rec"), "imagefolder", shards=3,
                           engine="dask", scheduler=cluster.scheduler_address,
                           storage_options=fast, cache_dir=str(client_cache), retries=0)
            assert len(s3.requests("retry/c-00001-of-00003.idx", "PUT")) == 2
            assert s3.drop_put is None
    finally:
        stop.set()
        cluster.close()
    convert_to_uri(src, _fresh_uri("local/c.rec"), "imagefolder", shards=3, workers=1,
                   storage_options=so, cache_dir=str(tmp_path / "local-cache"))
    fs, _ = filesystem(_fresh_uri("x"), so)
    dask_objects = _objects(fs, "dask")
    assert dask_objects == _objects(fs, "local") == _objects(fs, "retry")
    assert sorted(dask_objects) == sorted(
        ["c.shards.json"] + ["c-%05d-of-00003%s" % (k, ext) for k in range(3)
                             for ext in (".rec", ".idx", ".meta.json", ".upload.json")])
    for blob in dask_objects.values():
        assert b"gd-key-7f3a1" not in blob and b"gd-secret-91c2e" not in blob
    # the shards are the local sharded conversion's files, byte for byte, and read back
    local = convert_sharded(src, str(tmp_path / "plain" / "c.rec"), "imagefolder", shards=3)
    for k in range(3):
        for ext in (".rec", ".idx", ".meta.json"):
            name = "c-%05d-of-00003%s" % (k, ext)
            with open(tmp_path / "plain" / name, "rb") as f:
                assert dask_objects[name] == f.read()
    manifest = json.loads(dask_objects["c.shards.json"])
    assert sorted(manifest["files"]) == ["c-%05d-of-00003.rec" % k for k in range(3)]
    store = open_store(_fresh_uri("dask/c.shards.json"), **_remote(so, tmp_path))
    ref = open_store(local.outputs["train"])
    assert [store.read(i) for i in range(len(store))] == [ref.read(i) for i in range(12)]
    store.close()


def test_sharded_upload_resumes_from_the_receipts(s3, so, voc_src, tmp_path):
    """A sharded upload that failed at shard 2: nothing is readable; ``resume`` sends only
    shard 2 and the manifest; resuming a complete upload sends nothing."""
    uri = _fresh_uri("shresume/voc.rec")
    cache = str(tmp_path / "cache")
    # the dropped PUT is given up after read_timeout; every other request must not be
    # (1 s was too short for moto's answers on a loaded machine)
    fast = dict(so, config_kwargs={"connect_timeout": 2, "read_timeout": 2,
                                   "retries": {"max_attempts": 1}})
    s3.drop_put = ("shresume/voc-00002-of-00003.rec", 100)
    with pytest.raises(RemoteConnectionError) as e:
        convert_to_uri(voc_src, uri, layout="voc", split="trainval", shards=3,
                       storage_options=fast, cache_dir=cache, retries=0)
    assert e.value.path == _fresh_uri("shresume/voc-00002-of-00003.rec")
    s3.drop_put = None
    manifest = _fresh_uri("shresume/voc.shards.json")
    with pytest.raises(RemoteNotFoundError):
        open_store(manifest, **_remote(so, tmp_path))
    assert not os.listdir(os.path.join(cache, "staging", "shards",
                                       os.listdir(os.path.join(cache, "staging", "shards"))[0]))
    with pytest.raises(FileExistsError):  # neither resume nor overwrite: refused
        convert_to_uri(voc_src, uri, layout="voc", split="trainval", shards=3,
                       storage_options=so, cache_dir=cache)
    s3.log.clear()
    convert_to_uri(voc_src, uri, layout="voc", split="trainval", shards=3,
                   storage_options=so, cache_dir=cache, resume=True)
    puts = sorted({e[1].rsplit("/", 1)[-1] for e in s3.log if e[0] == "PUT"})
    assert puts == ["voc-00002-of-00003.idx", "voc-00002-of-00003.meta.json",
                    "voc-00002-of-00003.rec", "voc-00002-of-00003.upload.json",
                    "voc.shards.json", "voc.uploading.json"]
    store = open_store(manifest, **_remote(so, tmp_path))
    local = str(tmp_path / "local" / "voc.rec")
    convert(voc_src, local, "voc", split="trainval")
    ref = RecordFile(local)
    assert [store.read(i) for i in range(len(store))] == [ref.read(i) for i in range(16)]
    store.close()
    s3.log.clear()
    convert_to_uri(voc_src, uri, layout="voc", split="trainval", shards=3,
                   storage_options=so, cache_dir=cache, resume=True)
    assert not [e for e in s3.log if e[0] in ("PUT", "POST", "DELETE")]


def test_lmdb_to_s3_uploads_data_mdb_then_its_commit_document(s3, so, tmp_path):
    from gluon_data.stores.lmdbio import LMDBFile, read_lmdb_meta
    from gluon_data.convert.sample import make_imagefolder
    src = make_imagefolder(str(tmp_path / "folder"), per_class=3)
    uri = _fresh_uri("lmdb/cls.lmdb")
    s3.log.clear()
    report = convert_to_uri(src, uri, "imagefolder", val_ratio=0.34, storage_options=so,
                            cache_dir=str(tmp_path / "stage"))
    assert report.outputs == {"train": uri, "val": uri}
    fs, _ = filesystem(uri, so)
    assert sorted(p.rsplit("/", 1)[-1] for p in fs.find("%s/lmdb/" % BUCKET)) == [
        "data.mdb", "meta.json"]  # no lock.mdb, no marker left
    puts = [e[1] for e in s3.log if e[0] == "PUT" and "/lmdb/" in e[1]
            and "gluon-data-probe" not in e[1]]  # (the writability probe, before converting)
    assert puts[0].endswith("cls.lmdb/uploading.json")
    assert puts[-1].endswith("cls.lmdb/meta.json") and puts.index(
        "/%s/lmdb/cls.lmdb/data.mdb" % BUCKET) < len(puts) - 1
    doc = json.loads(fs.cat_file("%s/lmdb/cls.lmdb/meta.json" % BUCKET))
    data = fs.cat_file("%s/lmdb/cls.lmdb/data.mdb" % BUCKET)
    import hashlib
    assert doc["format"] == "gluon_data-lmdb" and doc["container"] == "lmdb"
    assert doc["files"] == {"data.mdb": {"bytes": len(data),
                                         "sha256": hashlib.sha256(data).hexdigest()}}
    copy = tmp_path / "copy.lmdb"  # the object is the environment: it opens as one
    copy.mkdir()
    (copy / "data.mdb").write_bytes(data)
    assert read_lmdb_meta(str(copy)) == doc["splits"] and sorted(doc["splits"]) == [
        "train", "val"]
    local = str(tmp_path / "local.lmdb")
    convert(src, local, "imagefolder", val_ratio=0.34)
    for split in ("train", "val"):
        a, b = LMDBFile(str(copy), split), LMDBFile(local, split)
        assert len(a) == len(b) > 0
        assert [a.read(i) for i in range(len(a))] == [b.read(i) for i in range(len(b))]
        # and through the remote LMDB reader (download checked against meta.json's SHA-256)
        remote_store = open_store(uri, split, **_remote(so, tmp_path))
        assert [remote_store.read(i) for i in range(len(remote_store))] == \
            [b.read(i) for i in range(len(b))]
        remote_store.close()
        a.close()
        b.close()
    with pytest.raises(FileExistsError):
        convert_to_uri(src, uri, "imagefolder", storage_options=so,
                       cache_dir=str(tmp_path / "stage"))
    s3.log.clear()
    convert_to_uri(src, uri, "imagefolder", overwrite=True, storage_options=so,
                   cache_dir=str(tmp_path / "stage"))  # ours: replaced (one split now)
    assert sorted(json.loads(fs.cat_file("%s/lmdb/cls.lmdb/meta.json" % BUCKET))["splits"]) \
        == ["train"]
    # LMDB shards: each task uploads its environment's data.mdb
    report = convert_to_uri(src, _fresh_uri("lmdbsh/cls.lmdb"), "imagefolder", shards=2,
                            storage_options=so, cache_dir=str(tmp_path / "stage"))
    manifest = json.loads(fs.cat_file("%s/lmdbsh/cls.shards.json" % BUCKET))
    assert manifest["container"] == "lmdb"
    assert sorted(manifest["files"]) == ["cls-00000-of-00002.lmdb/data.mdb",
                                         "cls-00001-of-00002.lmdb/data.mdb"]
    for name, f in manifest["files"].items():
        blob = fs.cat_file("%s/lmdbsh/%s" % (BUCKET, name))
        assert f == {"bytes": len(blob), "sha256": hashlib.sha256(blob).hexdigest()}
    sharded = open_store(report.outputs["train"], **_remote(so, tmp_path))
    one = str(tmp_path / "one.rec")  # the same records, unsharded: the same payloads
    convert(src, one, "imagefolder")
    ref = RecordFile(one)
    assert [sharded.read(i) for i in range(len(sharded))] == [ref.read(i) for i in range(9)]
    sharded.close()


# --------------------------------------------------------------------------- one remote path
class _RangeHandler(__import__("http.server").server.SimpleHTTPRequestHandler):
    """A static file server on loopback that answers ``Range: bytes=a-b`` with a 206 (what
    fsspec's HTTP filesystem reads objects with) and logs every request."""

    log = []

    def log_message(self, *args):
        pass

    def send_head(self):
        path = self.translate_path(self.path)
        self.log.append((self.command, self.path))
        if not os.path.isfile(path):
            self.send_error(404)
            return None
        f = open(path, "rb")
        size = os.fstat(f.fileno()).st_size
        rng = self.headers.get("Range")
        if rng and rng.startswith("bytes="):
            a, _, b = rng[6:].partition("-")
            start, end = int(a or 0), min(size - 1, int(b) if b else size - 1)
            f.seek(start)
            self.send_response(206)
            self.send_header("Content-Range", "bytes %d-%d/%d" % (start, end, size))
            self.send_header("Content-Length", str(end - start + 1))
            self.send_header("Accept-Ranges", "bytes")
            self.end_headers()
            self._left = end - start + 1
            return f
        self.send_response(200)
        self.send_header("Content-Length", str(size))
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()
        self._left = size
        return f

    def copyfile(self, source, outputfile):
        outputfile.write(source.read(self._left))


@contextlib.contextmanager
def http_server(folder):
    """``folder`` served over HTTP on 127.0.0.1 (a free port); yields the base URL and the
    request log; the server is shut down after."""
    import functools
    from http.server import ThreadingHTTPServer
    handler = type("Handler", (_RangeHandler,), {"log": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0),
                                 functools.partial(handler, directory=str(folder)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield "http://127.0.0.1:%d" % server.server_address[1], handler.log
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def test_a_manifest_at_a_uri_is_a_sharded_store_of_the_remote_stores(s3, so, voc_src, voc_s3,
                                                                     tmp_path):
    """One remote path: the manifest at a URI is the local ShardedStore, its shards opened
    through open_store (each the very class a single remote .rec gives, given the manifest's
    entry: opening one sends no request); RemoteShardedStore still opens it, deprecated."""
    import pickle
    from gluon_data.stores.remote.stores import RemoteShardedStore
    from gluon_data.stores.shardstore import ShardedStore
    uri = _fresh_uri("onepath/voc.rec")
    manifest = convert_to_uri(voc_src, uri, layout="voc", split="trainval", shard_items=8,
                              storage_options=so, cache_dir=str(tmp_path / "stage")
                              ).outputs["trainval"]
    ref = RecordFile(voc_s3[1])
    s3.log.clear()
    store = open_store(manifest, **_remote(so, tmp_path))
    assert type(store) is ShardedStore and store.parts() == [8, 8]
    shard = store.shard(1)
    assert type(shard) is type(open_store(voc_s3[0], **_remote(so, tmp_path)))
    assert {e[1] for e in s3.log if "onepath" in e[1]} == {"/%s/onepath/voc.shards.json"
                                                           % BUCKET}  # the manifest alone
    assert [store.read(i) for i in range(16)] == [ref.read(i) for i in range(16)]
    copy = pickle.loads(pickle.dumps(store))  # what a DataLoader worker gets
    assert type(copy) is ShardedStore and copy.read(11) == ref.read(11)
    assert copy.identity() == store.identity()
    with pytest.warns(DeprecationWarning, match="open_store"):
        old = RemoteShardedStore(manifest, **_remote(so, tmp_path))
    assert isinstance(old, ShardedStore) and old.read(3) == ref.read(3)
    store.close()


def test_an_http_served_rec_and_manifest_read(voc_src, voc_s3, tmp_path):
    """Plain HTTP(S) is a scheme like S3: a .rec and a sharded dataset served by a loopback
    HTTP server with range requests read through the same stores, the shards downloaded into
    the cache once."""
    from gluon_data.stores.shardstore import ShardedStore
    folder = tmp_path / "www"
    folder.mkdir()
    convert(voc_src, str(folder / "voc.rec"), "voc", split="trainval")
    from gluon_data.convert.sharded import convert_sharded
    convert_sharded(voc_src, str(folder / "sh.rec"), "voc", split="trainval", shard_items=8)
    ref = RecordFile(voc_s3[1])
    opts = dict(storage_options={}, cache_dir=str(tmp_path / "cache"), **FAST)
    with http_server(folder) as (base, log):
        single = open_store(base + "/voc.rec", **opts)
        assert len(single) == 16 and single.read(5) == ref.read(5)
        store = open_store(base + "/sh.shards.json", **opts)
        assert type(store) is ShardedStore and type(store.shard(0)) is type(single)
        assert [store.read(i) for i in range(16)] == [ref.read(i) for i in range(16)]
        assert [p for m, p in log if m == "GET" and p.endswith("-of-00002.rec")] and \
            len({p for m, p in log if p.endswith(".rec")}) == 3
        log.clear()
        again = open_store(base + "/sh.shards.json", **opts)  # the cache serves the shards
        assert again.read(15) == ref.read(15)
        assert {p for m, p in log if m == "GET"} == {"/sh.shards.json"}  # HEADs of the shards
        store.close()


def test_a_server_down_after_the_open_is_retried_then_a_connection_error(voc_src, tmp_path,
                                                                         monkeypatch):
    """fsspec's HTTP stat says "not found" of a server it cannot reach (the connection error
    is its cause): a server restarting while a worker reads was "no such object", untried
    again. It is retried under the policy, then a RemoteConnectionError; an object that is
    not there is still a RemoteNotFoundError."""
    from gluon_data.arrays import SegmentationDataset as Samples
    from gluon_data.errors import RemoteConnectionError, RemoteNotFoundError
    folder = tmp_path / "www"
    folder.mkdir()
    convert(voc_src, str(folder / "voc.rec"), "voc", split="trainval")
    monkeypatch.setenv("GLUON_DATA_REMOTE_RETRIES", "2")
    monkeypatch.setenv("GLUON_DATA_REMOTE_BACKOFF", "0.01")
    opts = dict(storage_options={}, cache_dir=str(tmp_path / "cache"))
    with http_server(folder) as (base, log):
        with pytest.raises(RemoteNotFoundError, match="no such object"):
            open_store(base + "/missing.rec", **opts)
        ds = Samples(base + "/voc.rec", remote=opts)
    with pytest.raises(RemoteConnectionError, match=r"voc\.idx: stat failed after 3 attempts"):
        ds[0]


def _wait_for(cond, seconds=60):
    deadline = time.monotonic() + seconds
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_will_need_on_a_remote_store_downloads_and_the_read_needs_no_request(voc_s3, s3, so,
                                                                            tmp_path):
    """The hint is the prefetch: ``will_need`` on a remote store (what the DataLoader's
    hints and PrefetchSampler give) starts the download in the background; once it is done,
    reading sends no request at all."""
    from gluon_data.stores.base import will_need
    uri, local = voc_s3
    store = open_store(uri, **_remote(so, tmp_path))
    s3.log.clear()
    will_need(store, [3, 1, 10 ** 6, -1])  # returns at once; out-of-range positions ignored
    assert _wait_for(lambda: s3.served("sess/voc.rec") == os.path.getsize(local))
    store.will_need([3], wait=True)  # waits for the same download (no second one)
    assert s3.served("sess/voc.rec") == os.path.getsize(local)
    s3.log.clear()
    ref = RecordFile(local)
    assert [store.read(i) for i in range(16)] == [ref.read(i) for i in range(16)]
    assert not [e for e in s3.log if "sess/voc" in e[1]]  # no request: the cache serves it
    store.close()


def test_prefetch_is_a_deprecated_alias_of_the_hint(voc_s3, s3, so, tmp_path):
    """``prefetch`` (a remote store's, a sharded store's) still returns the download's
    future, with a DeprecationWarning naming ``will_need(..., wait=True)``."""
    uri, local = voc_s3
    store = open_store(uri, **_remote(so, tmp_path))
    with pytest.warns(DeprecationWarning, match=r"will_need\(indices, wait=True\)"):
        fut = store.prefetch([0])
    fut.result(timeout=60)
    assert s3.served("sess/voc.rec") >= os.path.getsize(local)
    s3.log.clear()
    will_need(store, [1], wait=True)  # done already: no request
    assert not [e for e in s3.log if "sess/voc" in e[1]]
    store.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_fetches_on_its_own_and_never_waits_for_its_parents_download(
        voc_s3, so, tmp_path):
    """The background download belongs to the process that started it: a child forked while
    the parent's is in flight (here: never finishing) hints, reads and closes on its own."""
    from concurrent.futures import Future
    uri, local = voc_s3
    store = open_store(uri, **_remote(so, tmp_path))
    stuck = Future()  # the parent's download, in flight at the fork
    store._pending.set(stuck)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(r)
            signal.alarm(60)  # a child that waits on the parent's future dies, not hangs
            inherited = store._pending.peek()
            store.will_need([0, 1], wait=True)
            same = [store.read(i) for i in range(4)] == [RecordFile(local).read(i)
                                                          for i in range(4)]
            store.close()
            os.write(w, repr((inherited, same)).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        out = f.read().decode()
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0 and out == "(None, True)"
    assert store._pending.peek() is stuck  # the parent's is its own
    stuck.set_result(None)
    store.close()


def test_dataset_hints_reach_the_shards_of_a_remote_manifest(s3, so, voc_src, voc_s3,
                                                            tmp_path):
    """A dataset's ``will_need`` (what ``gluon_data.DataLoader`` calls with each batch) on a
    manifest at a URI downloads the shard that holds the hinted records, and only it."""
    uri = _fresh_uri("hinted/voc.rec")
    manifest = convert_to_uri(voc_src, uri, layout="voc", split="trainval", shard_items=8,
                              storage_options=so, cache_dir=str(tmp_path / "stage")
                              ).outputs["trainval"]
    ds = SegmentationDataset(open_store(manifest, **_remote(so, tmp_path)), ignore_value=None)
    shard1 = "hinted/voc-00001-of-00002.rec"
    size = filesystem(_fresh_uri(shard1), so)[0].info(_fresh_uri(shard1))["size"]
    s3.log.clear()
    ds.will_need([9, 12])
    assert _wait_for(lambda: s3.served(shard1) == size)
    assert s3.served("hinted/voc-00000-of-00002.rec") == 0
    will_need(ds.store, [9], wait=True)  # the one way to wait for a hint
    s3.log.clear()
    assert ds.store.read(12) == RecordFile(voc_s3[1]).read(12)
    assert not [e for e in s3.log if e[0] == "GET" and "hinted/" in e[1]]
    ds.store.close()


def test_one_remote_store_for_rec_and_lmdb(s3, so, voc_s3, voc_lmdb, tmp_path):
    """A .rec and an LMDB at a URI are the same remote store (described, fetched by the
    cache, opened as the local store), pickled alike; RemoteLMDBStore names it."""
    import pickle
    from gluon_data.stores.lmdbio import LMDBFile
    from gluon_data.stores.remote.stores import RemoteLMDBStore
    uri = _upload_lmdb(so, voc_lmdb, _fresh_uri("onestore/voc.lmdb"), commit=True)
    lm, rec = open_store(uri, "val", **_remote(so, tmp_path)), open_store(voc_s3[0],
                                                                          **_remote(so, tmp_path))
    assert type(lm) is type(rec) is RemoteStore and RemoteLMDBStore is RemoteStore
    assert (lm.container, rec.container) == ("lmdb", "rec")
    assert lm.parts() == [8] and rec.parts() == [16]
    lm = pickle.loads(pickle.dumps(lm))
    assert lm.read(2) == LMDBFile(voc_lmdb, "val").read(2)
    assert type(lm.lmdb_file()) is type(open_store(voc_lmdb, "val"))  # the local store
    lm.close()
