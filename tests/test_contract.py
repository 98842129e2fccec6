"""One contract, every store x task: what a dataset over any record store must do.

Like torchvision's dataset test harness, every store runs the same tests: the store protocol
(len, key, offset, read, view, scan, meta, identity, location, split), the same samples as
the reference for the same source, dtypes and shapes, pickling, DataLoader workers (fork,
``thread_pool=True``, spawn), hints then reads, typed errors naming the store and record,
gluoncv's modes, and randomness that depends on ``(seed, epoch, index)`` only.

The stores (test ids): ``rec``, ``lmdb``, ``sharded-rec``, ``sharded-lmdb``, the legacy
``recipe`` (segmentation) and ``caffe`` (classification), and the remote ones: the local
datasets uploaded by ``upload_dataset`` (LMDB shards: converted to the URI by
``convert_to_uri``) into moto's S3 server on 127.0.0.1 and read back through fsspec
(``s3-rec`` downloads into the cache, ``s3-rec-ranged`` reads ranges, ``s3-lmdb``,
``s3-sharded``, ``s3-sharded-lmdb``), and the same objects served by a static HTTP server with
byte ranges (``http-rec``, ``http-rec-ranged``, ``http-lmdb``, ``http-sharded``; reading needs
no directory listing). Each dataset is built once per run (module-scoped fixtures).

Adding a store = adding one fixture
-----------------------------------
Write a fixture that builds your store from the shared source and returns a
:class:`Case`, and add ``id: fixture name`` to ``SEGMENTATION_STORES`` or
``CLASSIFICATION_STORES``::

    @pytest.fixture(scope="module")
    def seg_shards(seg_source, tmp_path_factory):
        path = ...  # write seg_source["rec"]'s records into your container
        return Case("shards", lambda **kw: SegmentationDataset(open_store(path), **kw),
                    lambda tmp: SegmentationDataset(open_store(damaged_copy(path, tmp))))

``make(**options)`` builds the task dataset with the given options (``mode``, ``seed``,
``transform``, ...). ``damage(tmp_dir)`` builds it over a copy (in ``tmp_dir``, or uploaded
under a fresh prefix) whose record 1 is damaged (a flipped byte, a truncated value): reading
it must raise a typed error naming the copy. ``replace(tmp_dir)`` (optional) returns a
dataset over a private copy and a function that replaces that copy with other bytes. The
reference samples are the ``.rec`` converted from the source; a store must return exactly
them, and a remote store exactly the payloads, keys and offsets of the local store it was
uploaded from (``origin``). A store that differs on purpose says so in ``KNOWN``.
"""
import gc
import itertools
import multiprocessing
import os
import pickle
import shutil
from typing import Callable, NamedTuple, Optional

import lmdb
import mxnet as mx
import numpy as np
import pytest

from gluon_data import CaffeLMDBDataset, ClassificationDataset, ImageLMDBDataset, ImageRecordDataset, RecipeLMDBDataset, SampleKey, SegmentationDataset, SegmentationLMDBDataset, SegmentationRecordDataset
from gluon_data.format import codec
from gluon_data import convert
from gluon_data.errors import FormatError, GluonDataError
from gluon_data.stores.lmdbio import record_key
from gluon_data.stores.recordio import RecordFile
from gluon_data.convert.to_uri import convert_to_uri
from gluon_data.storage.remotefs import filesystem
from gluon_data.convert.upload import upload_dataset
from gluon_data.convert.sample import make_voc
from gluon_data.stores.shards import read_manifest
from gluon_data.stores.base import RecordStore, open_store
from http_range_server import RangeServer

# test id -> the fixture building that store (remote ones: built by seg_remote / cls_remote)
SEGMENTATION_STORES = {"rec": "seg_rec", "lmdb": "seg_lmdb", "recipe": "seg_recipe",
                       "sharded-rec": "seg_shards", "sharded-lmdb": "seg_shards_lmdb",
                       "s3-rec": "seg_remote", "s3-rec-ranged": "seg_remote",
                       "s3-lmdb": "seg_remote", "s3-sharded": "seg_remote",
                       "s3-sharded-lmdb": "seg_remote", "http-rec": "seg_remote",
                       "http-rec-ranged": "seg_remote", "http-lmdb": "seg_remote",
                       "http-sharded": "seg_remote"}
CLASSIFICATION_STORES = {"rec": "cls_rec_case", "lmdb": "cls_lmdb", "caffe": "cls_caffe",
                         "sharded-rec": "cls_shards", "s3-rec": "cls_remote",
                         "s3-rec-ranged": "cls_remote", "s3-lmdb": "cls_remote",
                         "s3-sharded": "cls_remote", "http-rec": "cls_remote",
                         "http-rec-ranged": "cls_remote", "http-lmdb": "cls_remote",
                         "http-sharded": "cls_remote"}
# The default run reads classification from one remote store of each kind (segmentation:
# from every one); GLUON_DATA_STRESS=1 runs every classification x remote store too.
STRESS = os.environ.get("GLUON_DATA_STRESS") == "1"
CLS_REMOTE_SHORT = ("s3-rec", "s3-sharded", "http-rec-ranged", "http-lmdb")
if not STRESS:
    CLASSIFICATION_STORES = {k: v for k, v in CLASSIFICATION_STORES.items()
                             if v != "cls_remote" or k in CLS_REMOTE_SHORT}
# remote id -> (the local store it is uploaded from, reads)
REMOTE = {"s3-rec": ("rec", "cache"), "s3-rec-ranged": ("rec", "ranged"),
          "s3-lmdb": ("lmdb", "cache"), "s3-sharded": ("sharded-rec", "cache"),
          "s3-sharded-lmdb": ("sharded-lmdb", "cache"), "http-rec": ("rec", "cache"),
          "http-rec-ranged": ("rec", "ranged"), "http-lmdb": ("lmdb", "cache"),
          "http-sharded": ("sharded-rec", "cache")}
LEGACY = ("recipe", "caffe")
SIZE = 32  # the recipe layout needs one image shape
BUCKET = "gd-contract"

# (test, store id) -> why that store fails that test today: a strict xfail (each one is a bug,
# to be fixed in the store) or, starting with "skip: ", where the store differs on purpose
KNOWN = {}


class Case(NamedTuple):
    name: str
    open: Callable  # open(location, **options) -> dataset over the store at location
    damage: Optional[Callable]  # damage(tmp_dir) -> dataset over a copy whose record 1 is damaged
    location: str  # where the store is (a path, or a URI)
    other: Optional[str] = None  # (local) the store converted from another source, same names
    origin: Optional["Case"] = None  # (remote) the local store it was uploaded from
    publish: Optional[Callable] = None  # (remote) publish(local path, prefix) -> its URI here

    def make(self, **options):
        """The task dataset over this store, with ``options``."""
        return self.open(self.location, **options)


def _flip(value: bytes, at: int) -> bytes:
    b = bytearray(value)
    b[at] ^= 0xFF
    return bytes(b)


def _copy_lmdb_and_put(src: str, tmp_dir, db: Optional[bytes], key: bytes, fn) -> str:
    """A copy of the environment at ``src`` with ``key``'s value in ``db`` replaced by
    ``fn(old value)``."""
    dst = os.path.join(str(tmp_dir), os.path.basename(src.rstrip("/")) + "-damaged")
    shutil.copytree(src, dst)
    env = lmdb.open(dst, max_dbs=64, subdir=True)
    with env.begin(write=True) as txn:
        handle = env.open_db(db, txn=txn, create=False) if db else None
        txn.put(key, fn(bytes(txn.get(key, db=handle))), db=handle)
    env.close()
    return dst


def _damaged_rec(rec: str, tmp_dir) -> str:
    """A copy of the ``.rec`` (with its ``.idx`` and metadata) with a byte of record 1's
    image flipped: its CRC-32 no longer matches."""
    stem = os.path.join(str(tmp_dir), "damaged")
    for ext in (".rec", ".idx", ".meta.json"):
        if os.path.exists(rec[:-4] + ext):
            shutil.copy(rec[:-4] + ext, stem + ext)
    at = RecordFile(stem + ".rec").offset(1) + 8 + 40
    with open(stem + ".rec", "r+b") as f:
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0xFF]))
    return stem + ".rec"


def _damaged_shards(manifest: str, tmp_dir) -> str:
    """A copy of a sharded dataset (RecordIO shards) whose record 1 (in shard 0) has a byte
    of its image flipped."""
    dst = os.path.join(str(tmp_dir), "shards")
    shutil.copytree(os.path.dirname(manifest), dst)
    shard0 = sorted(f for f in os.listdir(dst) if f.endswith(".rec"))[0]
    path = os.path.join(dst, shard0)
    at = RecordFile(path).offset(1) + 8 + 40
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0xFF]))
    return os.path.join(dst, os.path.basename(manifest))


# ------------------------------------------------------------------ sources and stores
def _seg_convert(tmp_path_factory, tag, seed):
    """One VOC source (8 images) and its .rec, LMDB, RecordIO and LMDB shards, each in a
    folder of its own under the same names whatever the source (so one replaces another)."""
    from gluon_data.convert.sharded import convert_sharded
    root = make_voc(str(tmp_path_factory.mktemp(tag + "voc") / "VOC2012"), num_images=8,
                    size_range=(SIZE, SIZE), seed=seed)
    rec = convert(root, str(tmp_path_factory.mktemp(tag + "rec") / "seg.rec"), "voc",
                  split="trainval").outputs["trainval"]
    lm = str(tmp_path_factory.mktemp(tag + "lmdb") / "seg.lmdb")
    convert(root, lm, "voc", split="trainval")
    man = convert_sharded(root, str(tmp_path_factory.mktemp(tag + "shards") / "seg.rec"), "voc",
                          split="trainval", shards=3).outputs["trainval"]
    lman = convert_sharded(man, str(tmp_path_factory.mktemp(tag + "shl") / "seg.lmdb")
                           ).outputs["trainval"]  # copied shard by shard from the .rec shards
    ref = SegmentationRecordDataset(rec, ignore_value=None)
    samples = [(ref[i][0].asnumpy(), ref[i][1].asnumpy()) for i in range(len(ref))]
    recipe = str(tmp_path_factory.mktemp(tag + "recipe") / "recipe")
    _write_recipe(recipe, samples)
    return {"root": root, "rec": rec, "lmdb": lm, "shards": man, "shards_lmdb": lman,
            "recipe": recipe, "samples": samples}


def _write_recipe(path, samples):
    """The recipe layout written from samples (raw arrays, str(i) keys)."""
    env = lmdb.open(path, max_dbs=4, map_size=1 << 24)
    d, lab = env.open_db(b"trainval_data"), env.open_db(b"trainval_label")
    with env.begin(write=True) as txn:
        for i, (img, mask) in enumerate(samples):
            txn.put(str(i).encode(), np.ascontiguousarray(img).tobytes(), db=d)
            txn.put(str(i).encode(), mask.astype(np.uint8).tobytes(), db=lab)
    env.close()


@pytest.fixture(scope="module")
def seg_source(tmp_path_factory):
    return _seg_convert(tmp_path_factory, "c", 5)


@pytest.fixture(scope="module")
def seg_other(tmp_path_factory):
    """The same stores converted from another source (replacing the first)."""
    return _seg_convert(tmp_path_factory, "o", 6)


def _seg_store(location, **kw):
    return SegmentationDataset(open_store(location), **kw)


@pytest.fixture(scope="module")
def seg_rec(seg_source, seg_other):
    return Case("rec", lambda where, **kw: SegmentationRecordDataset(where, **kw),
                lambda tmp: SegmentationRecordDataset(_damaged_rec(seg_source["rec"], tmp)),
                seg_source["rec"], seg_other["rec"])


@pytest.fixture(scope="module")
def seg_lmdb(seg_source, seg_other):
    lm = seg_source["lmdb"]
    return Case("lmdb", lambda where, **kw: SegmentationLMDBDataset(where, split="trainval",
                                                                    **kw),
                lambda tmp: SegmentationLMDBDataset(_copy_lmdb_and_put(
                    lm, tmp, b"trainval", record_key(1), lambda v: _flip(v, 40)),
                    split="trainval"), lm, seg_other["lmdb"])


@pytest.fixture(scope="module")
def seg_shards(seg_source, seg_other):
    man = seg_source["shards"]
    return Case("shards", _seg_store,
                lambda tmp: SegmentationDataset(open_store(_damaged_shards(man, tmp))),
                man, seg_other["shards"])


@pytest.fixture(scope="module")
def seg_shards_lmdb(seg_source, seg_other):
    """LMDB shards, copied shard by shard from the RecordIO shards."""
    man = seg_source["shards_lmdb"]
    def damage(tmp):
        dst = os.path.join(str(tmp), "lshards")
        shutil.copytree(os.path.dirname(man), dst)
        _copy_lmdb_and_put(os.path.join(dst, "seg-00000-of-00003.lmdb"), tmp, b"trainval",
                           record_key(1), lambda v: _flip(v, 40))
        shutil.rmtree(os.path.join(dst, "seg-00000-of-00003.lmdb"))
        os.rename(os.path.join(str(tmp), "seg-00000-of-00003.lmdb-damaged"),
                  os.path.join(dst, "seg-00000-of-00003.lmdb"))
        return SegmentationDataset(open_store(os.path.join(dst, "seg.shards.json")))
    return Case("shards-lmdb", _seg_store, damage, man, seg_other["shards_lmdb"])


@pytest.fixture(scope="module")
def seg_recipe(seg_source, seg_other):
    """The recipe layout written from the reference samples (raw arrays, str(i) keys)."""
    def make(where, **kw):
        return RecipeLMDBDataset(where, split="trainval", image_shape=(SIZE, SIZE, 3),
                                 ignore_label=255, num_classes=21, **kw)
    path = seg_source["recipe"]
    return Case("recipe", make, lambda tmp: make(_copy_lmdb_and_put(
        path, tmp, b"trainval_data", b"1", lambda v: v[:-5])), path, seg_other["recipe"])


def _cls_convert(folder_root, tmp_path_factory, tag):
    from gluon_data.convert.sharded import convert_sharded
    rec = str(tmp_path_factory.mktemp(tag + "cls") / "cls.rec")
    convert(folder_root, rec, "imagefolder")
    lm = str(tmp_path_factory.mktemp(tag + "clsl") / "cls.lmdb")
    convert(rec, lm)
    man = convert_sharded(rec, str(tmp_path_factory.mktemp(tag + "clsh") / "cls.rec"),
                          shards=3).outputs["train"]
    ref = ImageRecordDataset(rec)
    samples = [(ref[i][0].asnumpy(), ref[i][1]) for i in range(len(ref))]
    caffe = str(tmp_path_factory.mktemp(tag + "caffe") / "caffe")
    _write_caffe(caffe, samples)
    return {"rec": rec, "lmdb": lm, "shards": man, "caffe": caffe, "samples": samples}


def _write_caffe(path, samples):
    """A Caffe LMDB written from samples: raw BGR CHW Datums."""
    from test_legacy import datum_bytes
    env = lmdb.open(path, map_size=1 << 24)
    with env.begin(write=True) as txn:
        for i, (img, label) in enumerate(samples):
            chw = np.ascontiguousarray(img[:, :, ::-1].transpose(2, 0, 1))
            txn.put(b"%08d_x.jpg" % i, datum_bytes(int(label), chw.tobytes(), False,
                                                   *chw.shape))
    env.close()


@pytest.fixture(scope="module")
def cls_source(folder_root, tmp_path_factory):
    return _cls_convert(folder_root, tmp_path_factory, "c")


@pytest.fixture(scope="module")
def cls_other(tmp_path_factory):
    from gluon_data.convert.sample import make_imagefolder
    root = make_imagefolder(str(tmp_path_factory.mktemp("ofolder") / "data"), per_class=3,
                            seed=9)
    return _cls_convert(root, tmp_path_factory, "o")


def _cls_store(location, **kw):
    return ClassificationDataset(open_store(location), **kw)


@pytest.fixture(scope="module")
def cls_rec_case(cls_source, cls_other):
    rec = cls_source["rec"]
    return Case("rec", lambda where, **kw: ImageRecordDataset(where, **kw),
                lambda tmp: ImageRecordDataset(_damaged_rec(rec, tmp)), rec, cls_other["rec"])


@pytest.fixture(scope="module")
def cls_lmdb(cls_source, cls_other):
    lm = cls_source["lmdb"]
    return Case("lmdb", lambda where, **kw: ImageLMDBDataset(where, split="train", **kw),
                lambda tmp: ImageLMDBDataset(_copy_lmdb_and_put(
                    lm, tmp, b"train", record_key(1), lambda v: _flip(v, 40)), split="train"),
                lm, cls_other["lmdb"])


@pytest.fixture(scope="module")
def cls_shards(cls_source, cls_other):
    man = cls_source["shards"]
    return Case("shards", _cls_store,
                lambda tmp: ClassificationDataset(open_store(_damaged_shards(man, tmp))),
                man, cls_other["shards"])


@pytest.fixture(scope="module")
def cls_caffe(cls_source, cls_other):
    path = cls_source["caffe"]
    return Case("caffe", lambda where, **kw: CaffeLMDBDataset(where, **kw),
                lambda tmp: CaffeLMDBDataset(_copy_lmdb_and_put(
                    path, tmp, None, b"%08d_x.jpg" % 1, lambda v: b"\xff\xff not a Datum")),
                path, cls_other["caffe"])


# ------------------------------------------------------------------ remote stores
class Servers:
    """moto's S3 server and a static HTTP server (with ranges) on 127.0.0.1; the HTTP one
    serves a mirror of the bucket (what a web server in front of a bucket serves)."""

    def __init__(self, s3, http, mirror):
        self.s3, self.http, self.mirror = s3, http, mirror
        # (the credentials too: a worker spawned before moto_s3 set them has none)
        self.s3_options = {"endpoint_url": s3.url, "key": "testing", "secret": "testing",
                           "config_kwargs": {"connect_timeout": 2, "read_timeout": 10}}
        self._count = itertools.count()

    def fresh(self, tag: str) -> str:
        return "%s-%d" % (tag, next(self._count))

    def publish(self, local: str, prefix: str, overwrite: bool = False) -> str:
        """Upload the local dataset (``upload_dataset``; LMDB shards: ``convert_to_uri``)
        under ``s3://BUCKET/prefix/``, mirror that prefix for HTTP; return its S3 URI."""
        base = "s3://%s/%s/" % (BUCKET, prefix)
        if local.endswith(".shards.json") and _manifest_container(local) == "lmdb":
            uri = convert_to_uri(local, base + os.path.basename(local)[:-12] + ".lmdb",
                                 storage_options=self.s3_options,
                                 overwrite=overwrite).outputs
            uri = next(iter(uri.values()))
        else:
            uri = upload_dataset([local], base + os.path.basename(local.rstrip("/")),
                                 storage_options=self.s3_options, overwrite=overwrite)[local]
        self._mirror(prefix)
        return uri

    def _mirror(self, prefix: str) -> None:
        fs, _ = filesystem("s3://" + BUCKET, self.s3_options)
        fs.invalidate_cache()
        dst = os.path.join(self.mirror, prefix)
        shutil.rmtree(dst, ignore_errors=True)
        fs.get("%s/%s" % (BUCKET, prefix), dst, recursive=True)

    def at(self, scheme: str, s3_uri: str) -> str:
        return s3_uri if scheme == "s3" else s3_uri.replace("s3://" + BUCKET, self.http.url)

    def options(self, uri: str, reads: str) -> dict:
        return {"storage_options": self.s3_options if uri.startswith("s3://") else {},
                "reads": reads, "retries": 2, "backoff": 0.05}


def _manifest_container(path):
    return read_manifest(path)["container"]


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    pytest.importorskip("moto.server")
    pytest.importorskip("s3fs")
    from test_remote import moto_s3
    mirror = str(tmp_path_factory.mktemp("http-root"))
    with moto_s3(BUCKET) as s3, RangeServer(mirror) as http:
        gc.freeze()  # moto's many modules: out of the full collection each DataLoader makes
        try:
            yield Servers(s3, http, mirror)
        finally:
            gc.unfreeze()


def _remote_cases(servers, task, origins, dataset):
    """The remote Cases of ``task``: each local origin uploaded once (under ``task/id``),
    opened over S3 and over HTTP, with the reads of :data:`REMOTE`."""
    uploaded, damaged, cases = {}, {}, {}
    for rid, (local, reads) in REMOTE.items():
        if local not in origins:
            continue
        origin = origins[local]
        if local not in uploaded:
            uploaded[local] = servers.publish(origin.location, "%s/%s" % (task, local))
        scheme = rid.split("-", 1)[0]

        def open_(where, reads=reads, store=None, **kw):
            return dataset(open_store(where, **servers.options(where, reads), **(store or {})),
                           **kw)

        def publish(path, prefix, overwrite=False, scheme=scheme):
            return servers.at(scheme, servers.publish(path, prefix, overwrite))

        def damage(tmp, origin=origin, open_=open_, publish=publish, rid=rid):
            if rid not in damaged:  # uploaded once, read by each test that needs it
                bad = origin.damage(tmp).store.location
                if os.path.isdir(bad) and not bad.endswith(".lmdb"):  # an LMDB: name it so
                    shutil.copytree(bad, bad + ".lmdb")
                    bad += ".lmdb"
                damaged[rid] = publish(bad, servers.fresh("damaged/" + rid))
            return open_(damaged[rid])

        cases[rid] = Case(rid, open_, None if local == "sharded-lmdb" else damage,
                          servers.at(scheme, uploaded[local]),
                          origin=origin, publish=publish)
    return cases


@pytest.fixture(scope="module")
def seg_remote(servers, seg_rec, seg_lmdb, seg_shards, seg_shards_lmdb):
    return _remote_cases(servers, "seg", {"rec": seg_rec, "lmdb": seg_lmdb,
                                          "sharded-rec": seg_shards,
                                          "sharded-lmdb": seg_shards_lmdb}, SegmentationDataset)


@pytest.fixture(scope="module")
def cls_remote(servers, cls_rec_case, cls_lmdb, cls_shards):
    return _remote_cases(servers, "cls", {"rec": cls_rec_case, "lmdb": cls_lmdb,
                                          "sharded-rec": cls_shards}, ClassificationDataset)


def _case(request, stores):
    sid = request.param
    name = request.node.originalname
    why = KNOWN.get((name, sid))
    if why is not None and why.startswith("skip: "):
        pytest.skip(why[6:])
    if why is not None:
        request.node.add_marker(pytest.mark.xfail(strict=True, reason=why))
    got = request.getfixturevalue(stores[sid])
    return got[sid] if sid in REMOTE else got


@pytest.fixture(params=list(SEGMENTATION_STORES))
def seg(request):
    return _case(request, SEGMENTATION_STORES)


@pytest.fixture(params=list(CLASSIFICATION_STORES))
def cls(request):
    return _case(request, CLASSIFICATION_STORES)


@pytest.fixture(scope="module")
def spawn_pool():
    """One spawned worker process for the module: every store's dataset is pickled to it."""
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        yield pool


# ------------------------------------------------------------------ helpers
def to_numpy(x):
    return x.asnumpy() if hasattr(x, "asnumpy") else np.asarray(x)


def _seg_batch(samples):
    """Picklable batchify keeping every sample as numpy (the batch order is the sampler's)."""
    return [(to_numpy(a), to_numpy(b)) for a, b in samples]


def _cls_batch(samples):
    return [(to_numpy(a), float(np.asarray(b).ravel()[0])) for a, b in samples]


def _through(ds, batches, batchify, **loader):
    out = []
    for batch in mx.gluon.data.DataLoader(ds, batch_sampler=batches, batchify_fn=batchify,
                                          **loader):
        out.extend(batch)
    return out


def _sums(args):
    ds, idx = args
    return [int(to_numpy(ds[i][0]).astype(np.int64).sum()) for i in idx]


# ------------------------------------------------------------------ the contract: any task
def _check_protocol(case, n):
    store = case.make().store
    assert isinstance(store, RecordStore)
    assert len(store) == n and store.location == case.location
    assert store.split is None or isinstance(store.split, str)
    payloads = [store.read(i) for i in range(n)]
    assert all(type(p) is bytes and p for p in payloads)
    assert [bytes(store.view(i)) for i in range(n)] == payloads
    assert [bytes(v) for v in store.scan()] == payloads
    keys = [store.key(i) for i in range(n)]
    assert all(int(k) == k for k in keys) and len(set(keys)) == n
    offsets = [store.offset(i) for i in range(n)]
    assert all(o is None or int(o) >= 0 for o in offsets)
    with pytest.raises(IndexError):
        store.read(n)
    if case.name not in LEGACY:
        assert store.meta["task"] in ("segmentation", "classification")
    ident = store.identity()
    assert isinstance(ident, str) and ident
    assert case.make().store.identity() == ident  # the same bytes: the same identity
    assert pickle.loads(pickle.dumps(store)).identity() == ident
    if case.origin is not None:  # a remote store holds exactly what was uploaded
        local = case.origin.make().store
        assert payloads == [local.read(i) for i in range(n)]
        assert keys == [local.key(i) for i in range(n)]
        assert offsets == [local.offset(i) for i in range(n)]
        assert store.split == local.split
        upload = ("files", "meta_crc32")  # what the upload adds: the sums, so another CRC
        assert {k: v for k, v in store.meta.items() if k not in upload} == \
            {k: v for k, v in local.meta.items() if k not in upload}


def test_seg_store_protocol(seg, seg_source):
    """Expected: the store behind the dataset satisfies RecordStore: read, view and scan
    agree, keys are unique ints, offsets ints or None, a read past the end is an IndexError,
    identity is stable across opens and pickles; a remote store reads exactly the payloads,
    keys, offsets and metadata (but the upload's file sums) of the store it came from."""
    _check_protocol(seg, len(seg_source["samples"]))


def test_cls_store_protocol(cls, cls_source):
    _check_protocol(cls, len(cls_source["samples"]))


def _copy_store(case, tmp_path):
    """``(location, swap)``: a private copy of ``case``'s store (local: copied; remote: the
    origin uploaded under a fresh prefix) and a function replacing it with ``other``."""
    if case.origin is not None:
        prefix = case.name + "-" + os.path.basename(str(tmp_path))
        where = case.publish(case.origin.location, "replaced/" + prefix)
        return where, lambda: case.publish(case.origin.other, "replaced/" + prefix,
                                           overwrite=True)
    folder = case.location if os.path.isdir(case.location) else os.path.dirname(case.location)
    dst = str(tmp_path / "copy")
    shutil.copytree(folder, dst)
    where = os.path.join(dst, os.path.relpath(case.location, folder)).rstrip("/.")
    other = case.other if os.path.isdir(case.other) else os.path.dirname(case.other)

    def swap():  # every file replaced (a new inode), as a re-conversion does
        for top, _, names in os.walk(other):
            for name in names:
                target = os.path.join(dst, os.path.relpath(os.path.join(top, name), other))
                shutil.copy(os.path.join(top, name), target + ".swap")
                os.replace(target + ".swap", target)
    return where, swap


def _check_replaced(case, tmp_path):
    where, swap = _copy_store(case, tmp_path)
    ds = case.open(where)
    first = [to_numpy(ds[i][0]).tobytes() for i in range(len(ds))]
    blob = pickle.dumps(ds)
    other_node = {} if case.origin is None else {"store": {"cache_dir": str(tmp_path / "c2")}}
    unread = pickle.dumps(case.open(where, **other_node))  # nothing read (nor cached) yet
    swap()
    if case.origin is not None and REMOTE[case.name][1] == "cache" and "sharded" not in case.name:
        # Differs on purpose: these stores read verified whole copies, so a copy keeps
        # reading the version it opened while the cache holds it (never a mixture), and one
        # that must download the replaced object says it was replaced. (A sharded store
        # re-reads its manifest when unpickled and refuses a changed one, as a local one.)
        clone = pickle.loads(blob)
        assert [to_numpy(clone[i][0]).tobytes() for i in range(len(clone))] == first
        with pytest.raises(FormatError) as e:
            pickle.loads(unread)[0]
    else:
        with pytest.raises(FormatError, match="replaced") as e:
            clone = pickle.loads(blob)  # (a manifest is checked here already)
            for i in range(len(clone)):  # one read must notice; none may return other bytes
                clone[i]
    assert e.value.path is not None and os.path.dirname(where) in e.value.path, e.value
    src = case.origin or case
    assert len(case.open(where)) == len(src.open(src.other))  # opened again: the new one


def test_seg_replaced_store_is_detected(seg, tmp_path):
    """Expected: a dataset pickled (to a worker) before its store was replaced by another
    conversion raises FormatError naming the store ("replaced") on the copy's first read,
    instead of reading the new bytes through the old index; opening it again works."""
    _check_replaced(seg, tmp_path)


def test_cls_replaced_store_is_detected(cls, tmp_path):
    _check_replaced(cls, tmp_path)


NO_DAMAGED_UPLOAD = ("no upload path publishes a damaged dataset of LMDB shards: "
                     "upload_dataset takes RecordIO shards only, and convert_to_uri verifies "
                     "every shard before it uploads it")


def _check_damaged(case, tmp_path):
    if case.damage is None:
        pytest.skip(NO_DAMAGED_UPLOAD)
    ds = case.damage(tmp_path)
    with pytest.raises(GluonDataError) as e:
        ds[1]
    home = os.path.dirname(ds.store.location.rstrip("/"))
    assert e.value.path is not None and home in e.value.path, e.value
    assert "record" in str(e.value) or e.value.key is not None, e.value
    assert to_numpy(ds[0][0]).ndim == 3 and to_numpy(ds[2][0]).ndim == 3


def test_seg_damaged_record_is_a_typed_error_naming_the_store(seg, tmp_path):
    """Expected: reading the damaged record raises a GluonDataError (CorruptRecordError for
    checksummed stores, FormatError for legacy values) whose path is the damaged copy (a
    file of it, or its URI) and that names the record; the records around it still read."""
    _check_damaged(seg, tmp_path)


def test_cls_damaged_record_is_a_typed_error_naming_the_store(cls, tmp_path):
    _check_damaged(cls, tmp_path)


def _hinted_loader(ds, batches, batchify, **loader):
    from gluon_data import DataLoader
    out = []
    for batch in DataLoader(ds, batch_sampler=batches, batchify_fn=batchify, **loader):
        out.extend(batch)
    return out


def _check_will_need(case, batchify, tmp_path):
    from gluon_data.stores.base import will_need
    ds = case.make()
    store = ds.store
    assert hasattr(store, "will_need") == (case.name not in LEGACY), case.name
    single = [bytes(store.read(i)) for i in range(len(store))]
    fresh = pickle.loads(pickle.dumps(ds))  # a copy that has opened nothing yet
    order = list(np.random.default_rng(2).permutation(len(store)))
    will_need(fresh.store, order + [len(store), -1, len(store) + 5])
    fresh.will_need([SampleKey(int(i), epoch=1) for i in order] + [-1, 10 ** 6])
    assert [bytes(fresh.store.read(int(i))) for i in order] == [single[i] for i in order]
    batches = [[int(i) for i in order[k:k + 3]] for k in range(0, len(order), 3)]
    want = _through(ds, batches, batchify)
    for loader in ({}, {"num_workers": 2}, {"num_workers": 2, "thread_pool": True}):
        got = _hinted_loader(ds, batches, batchify, **loader)
        assert len(got) == len(want), loader
        for (a, b), (c, d) in zip(got, want):
            np.testing.assert_array_equal(a, c)
            assert np.array_equal(b, d), loader
    if case.damage is None:
        return  # (NO_DAMAGED_UPLOAD)
    bad = case.damage(tmp_path)
    home = os.path.dirname(bad.store.location.rstrip("/"))
    will_need(bad.store, range(len(bad.store)))  # a hint reads and checks nothing
    bad.will_need(range(len(bad)))
    for loader in ({}, {"num_workers": 2, "thread_pool": True}):
        with pytest.raises(GluonDataError) as e:
            _hinted_loader(bad, [[2, 1, 0]], batchify, **loader)
        assert e.value.path is not None and home in e.value.path, (loader, e.value)
    assert to_numpy(bad[2][0]).ndim == 3


def test_seg_will_need_then_read_gives_the_single_reads_bytes(seg, tmp_path):
    """Every store, hinted (``store.will_need``: every store but the legacy layouts; a remote
    one starts its download) then read, returns exactly the bytes of plain reads; a hint never
    raises, not for positions out of range, SampleKeys, or a damaged record; the damaged
    record's read (and gluon_data.DataLoader, which hints every batch) still raises the
    typed error naming the damaged copy."""
    _check_will_need(seg, _seg_batch, tmp_path)


def test_cls_will_need_then_read_gives_the_single_reads_bytes(cls, tmp_path):
    _check_will_need(cls, _cls_batch, tmp_path)


def _check_missing(case, tmp_path):
    if case.origin is None:
        missing = str(tmp_path / "missing")
        with pytest.raises((FileNotFoundError, FormatError)) as e:
            SegmentationDataset(open_store(missing))
    else:  # a name beside the store, dispatched to the same backend
        base = case.location.rstrip("/")
        suffix = ".shards.json" if base.endswith(".shards.json") else os.path.splitext(base)[1]
        missing = base.rsplit("/", 1)[0] + "/missing" + suffix
        with pytest.raises((FileNotFoundError, FormatError)) as e:
            case.open(missing)
    assert "missing" in str(e.value)


def test_seg_missing_location_is_typed(seg, tmp_path):
    _check_missing(seg, tmp_path)


def test_cls_missing_location_is_typed(cls, tmp_path):
    _check_missing(cls, tmp_path)


def test_http_test_server_answers_like_an_object_store(servers):
    """Expected (the helper the HTTP stores run on): 206 with exactly the bytes of a range
    (first-last, open-ended, suffix), 416 past the end, 404 for a folder (no listings),
    HEAD with the size; Python's http.server answers 200 with the whole file instead."""
    import urllib.error
    import urllib.request
    data = bytes(range(256)) * 4
    os.makedirs(os.path.join(servers.mirror, "probe"), exist_ok=True)
    with open(os.path.join(servers.mirror, "probe", "blob"), "wb") as f:
        f.write(data)

    def get(path, rng=None, method="GET"):
        req = urllib.request.Request(servers.http.url + path, method=method,
                                     headers={"Range": rng} if rng else {})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status, r.read(), r.headers
        except urllib.error.HTTPError as e:
            return e.code, b"", e.headers
    assert get("/probe/blob", "bytes=10-19")[:2] == (206, data[10:20])
    assert get("/probe/blob", "bytes=1000-")[:2] == (206, data[1000:])
    assert get("/probe/blob", "bytes=-5")[:2] == (206, data[-5:])
    assert get("/probe/blob")[:2] == (200, data)
    assert get("/probe/blob", "bytes=1024-")[0] == 416
    assert get("/probe/")[0] == 404 and get("/probe/nothing")[0] == 404
    status, body, headers = get("/probe/blob", method="HEAD")
    assert status == 200 and body == b"" and headers["Content-Length"] == str(len(data))


def test_ranged_reads_fetch_only_ranges_of_the_rec(seg_remote, servers):
    """Expected: ``http-rec-ranged`` reads a record with ranged GETs of the ``.rec`` only
    (never the whole object), so the HTTP stores run the ranged path they claim to."""
    case = seg_remote["http-rec-ranged"]
    ds = case.make()
    start = len(servers.http.log)
    ds[3]
    gets = [e for e in servers.http.log[start:] if e[0] == "GET" and e[1].endswith(".rec")]
    size = os.path.getsize(case.origin.location)
    assert gets and all(e[2] for e in gets) and sum(e[3] for e in gets) < size / 2, gets


# ------------------------------------------------------------------ the contract: segmentation
def test_seg_same_samples_as_the_reference(seg, seg_source):
    ds = seg.make(ignore_value=None)
    ref = seg_source["samples"]
    assert len(ds) == len(ref) and "%d records" % len(ref) in repr(ds)
    assert isinstance(ds, SegmentationDataset)
    for i, (img, mask) in enumerate(ref):
        a, b = ds[i]
        assert a.dtype == np.uint8 and b.dtype == np.int32 and a.shape == (SIZE, SIZE, 3)
        np.testing.assert_array_equal(a.asnumpy(), img)
        np.testing.assert_array_equal(b.asnumpy(), mask)
    mapped = seg.make()[0][1].asnumpy()  # the ignore label comes back as -1 by default
    np.testing.assert_array_equal(mapped, np.where(ref[0][1] == 255, -1, ref[0][1]))
    assert ds.num_class == 21 and ds.NUM_CLASS == 21


def test_seg_pickling_and_workers(seg, seg_source, spawn_pool):
    ds = seg.make(ignore_value=None)
    want = _sums((ds, range(len(ds))))
    assert _sums((pickle.loads(pickle.dumps(ds)), range(len(ds)))) == want
    batches = [[0, 1, 2], [3, 4, 5], [6, 7]]
    for loader in ({"num_workers": 2}, {"num_workers": 2, "thread_pool": True}):
        got = _through(ds, batches, _seg_batch, **loader)
        assert [int(a.astype(np.int64).sum()) for a, _ in got] == want, loader
    assert spawn_pool.map(_sums, [(ds, range(len(ds)))])[0] == want


def test_seg_typed_errors(seg):
    ds = seg.make()
    with pytest.raises(IndexError):
        ds[len(ds)]
    assert to_numpy(ds[-1][0]).shape == to_numpy(ds[len(ds) - 1][0]).shape
    with pytest.raises(ValueError, match="unknown mode"):
        seg.make(mode="nope")


def test_seg_modes(seg):
    train = seg.make(mode="train", base_size=24, crop_size=20, seed=3)
    img, mask = train[SampleKey(1, epoch=2)]
    assert img.shape == (20, 20, 3) and mask.shape == (20, 20)
    again = train[SampleKey(1, epoch=2)]
    np.testing.assert_array_equal(again[0].asnumpy(), img.asnumpy())
    np.testing.assert_array_equal(again[1].asnumpy(), mask.asnumpy())
    val = seg.make(mode="val", crop_size=16)
    assert val[0][0].shape == (16, 16, 3)
    testval = seg.make(mode="testval")
    assert testval[0][0].shape == (SIZE, SIZE, 3)
    img, name = seg.make(mode="test")[2]
    assert img.shape == (SIZE, SIZE, 3) and isinstance(name, str)


# ------------------------------------------------------------------ the contract: classification
def test_cls_same_samples_as_the_reference(cls, cls_source):
    ds = cls.make()
    ref = cls_source["samples"]
    assert len(ds) == len(ref) and isinstance(ds, ClassificationDataset)
    for i, (img, label) in enumerate(ref):
        a, b = ds[i]
        assert a.dtype == np.uint8
        np.testing.assert_array_equal(a.asnumpy(), img)
        assert b == label
    assert ds[SampleKey(3, epoch=4)][1] == ref[3][1]


def test_cls_pickling_workers_and_errors(cls, spawn_pool):
    ds = cls.make()
    want = _sums((ds, range(len(ds))))
    assert _sums((pickle.loads(pickle.dumps(ds)), range(len(ds)))) == want
    batches = [list(range(i, min(i + 5, len(ds)))) for i in range(0, len(ds), 5)]
    for loader in ({"num_workers": 2}, {"num_workers": 2, "thread_pool": True}):
        got = _through(ds, batches, _cls_batch, **loader)
        assert [int(a.astype(np.int64).sum()) for a, _ in got] == want, loader
    assert spawn_pool.map(_sums, [(ds, range(len(ds)))])[0] == want
    with pytest.raises(IndexError):
        ds[len(ds)]
    with pytest.raises(ValueError, match="flag"):
        cls.make(flag=3)


# ------------------------------------------------------------------ randomness that repeats
def _keyed_batches(order, epoch, size):
    keys = [SampleKey(i, epoch) for i in order]
    return [keys[j:j + size] for j in range(0, len(keys), size)]


CONFIGS = [{"num_workers": 0}, {"num_workers": 2}, {"num_workers": 2, "thread_pool": True}]


@pytest.mark.parametrize("store", ["seg_rec", "seg_lmdb"])
def test_epoch_e_sample_i_is_identical_in_every_configuration(store, request):
    """Expected: with SampleKeys, sample (e, i) of a seeded train set is bit-identical with
    0 or 2 workers, with the thread pool, and for two sampler configurations (sequential,
    batch 3 / shuffled, batch 4); epochs differ from each other."""
    case = request.getfixturevalue(store)
    n = len(case.make())
    results = []
    for loader in CONFIGS:
        for order, size in ((list(range(n)), 3), (list(np.random.default_rng(0).permutation(n)),
                                                   4)):
            ds = case.make(mode="train", base_size=24, crop_size=20, seed=11)
            got = {}
            for epoch in (0, 1):
                batches = _keyed_batches(order, epoch, size)
                keys = [k for b in batches for k in b]
                for k, (img, mask) in zip(keys, _through(ds, batches, _seg_batch, **loader)):
                    got[int(k.index), epoch] = (img.tobytes(), mask.tobytes())
            results.append(got)
    for got in results[1:]:
        assert got == results[0]
    assert any(results[0][i, 0] != results[0][i, 1] for i in range(n))


def test_stock_int_samplers_first_pass_reproducible_everywhere(seg_rec, seg_lmdb):
    """Expected: plain ints (Gluon's samplers) give the same first pass in every
    configuration and from every store; a second pass in one process repeats across runs."""
    n = len(seg_rec.make())
    firsts = []
    for case in (seg_rec, seg_lmdb):
        for loader in CONFIGS:
            ds = case.make(mode="train", base_size=24, crop_size=20, seed=2)
            order = list(np.random.default_rng(len(firsts)).permutation(n))
            batches = [order[j:j + 3] for j in range(0, n, 3)]
            got = dict(zip(order, ((a.tobytes(), b.tobytes()) for a, b in
                                   _through(ds, batches, _seg_batch, **loader))))
            firsts.append(got)
    for got in firsts[1:]:
        assert got == firsts[0]
    a, b = seg_rec.make(mode="train", base_size=24, crop_size=20, seed=2), \
        seg_rec.make(mode="train", base_size=24, crop_size=20, seed=2)
    second_a = [(a[i], a[i])[1][0].asnumpy().tobytes() for i in range(n)]
    second_b = [(b[i], b[i])[1][0].asnumpy().tobytes() for i in range(n)]
    assert second_a == second_b
    assert second_a != [firsts[0][i][0] for i in range(n)]


def test_unseeded_datasets_draw_fresh_entropy(seg_rec):
    a = seg_rec.make(mode="train", base_size=24, crop_size=20)
    b = seg_rec.make(mode="train", base_size=24, crop_size=20)
    n = len(a)
    assert [a[i][0].asnumpy().tobytes() for i in range(n)] != \
        [b[i][0].asnumpy().tobytes() for i in range(n)]


@pytest.mark.parametrize("store", ["cls_rec_case", "cls_lmdb"])
def test_classification_fast_path_repeats_per_sample(store, request):
    """Expected: the recognised RandomResizedCrop + flip fast path draws from (seed, epoch,
    index): identical across workers, thread pool and sample order."""
    from mxnet.gluon.data.vision import transforms as VT
    case = request.getfixturevalue(store)
    recipe = VT.Compose([VT.RandomResizedCrop(12), VT.RandomFlipLeftRight(), VT.ToTensor()])
    n = len(case.make())
    results = []
    for loader in CONFIGS:
        for order in (list(range(n)), list(np.random.default_rng(1).permutation(n))):
            ds = case.make(seed=4).transform_first(recipe)
            assert ds.fast_path is not None
            batches = _keyed_batches(order, 3, 5)
            keys = [k for b in batches for k in b]
            got = {int(k.index): a.tobytes()
                   for k, (a, _) in zip(keys, _through(ds, batches, _cls_batch, **loader))}
            results.append(got)
    for got in results[1:]:
        assert got == results[0]
    other = case.make(seed=5).transform_first(recipe)
    assert [to_numpy(other[SampleKey(i, 3)][0]).tobytes() for i in range(n)] != \
        [results[0][i] for i in range(n)]


def test_codec_reads_what_every_segmentation_store_holds(seg):
    store = seg.make().store
    for payload in store.scan():
        rec = codec.unpack(payload)
        assert codec.decode_mask(rec.mask).shape == (SIZE, SIZE)


def test_seg_shard_is_the_same_dataset_type_over_part_of_the_store(seg):
    """Expected: shard() keeps the class, options and fast paths; its samples are the whole
    dataset's, random draws included (they follow the index in the store)."""
    full = seg.make(mode="train", base_size=24, crop_size=20, seed=7)
    part = full.shard(3, 1)
    assert type(part) is type(full) and len(part) == 3 and part.mode == "train"
    start = len(full) // 3 + 1  # Gluon's layout: 8 records -> 3, 3, 2
    for j in range(len(part)):
        a, b = part[SampleKey(j, 2)], full[SampleKey(start + j, 2)]
        np.testing.assert_array_equal(a[0].asnumpy(), b[0].asnumpy())
    assert sum(len(full.shard(3, k)) for k in range(3)) == len(full)
    with pytest.raises(IndexError):
        part[3]
    with pytest.raises(ValueError, match="index"):
        full.shard(3, 3)


def test_cls_shard_keeps_the_type_and_the_fast_path(cls):
    from mxnet.gluon.data.vision import transforms as VT
    fast = cls.make(seed=1).transform_first(VT.Compose([VT.CenterCrop(8), VT.ToTensor()]))
    piece = fast.shard(2, 1)
    assert type(piece) is type(fast) and piece.fast_path is fast.fast_path
    np.testing.assert_array_equal(piece[0][0].asnumpy(), fast[len(fast) // 2][0].asnumpy())
