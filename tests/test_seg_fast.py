"""Segmentation ``train`` reading: masks independent of the installed stack, the fused
channels-first/labels path, ``mask_dtype``, and OpenCV single-threaded in loader workers.

Real datasets written by our converter from small generated images; the cross-stack check
runs the same ``.rec`` through this interpreter and the one ``GLUON_DATA_MXNET_PYTHON``
names (the full lane's: Python 3.11 + OpenCV 4, where this lane is Python 3.13 + OpenCV 5).
"""
import json
import os
import subprocess
import sys

import cv2
import numpy as np
import pytest

from gluon_data import convert
from gluon_data.arrays import SegmentationDataset
from gluon_data.arrays import transforms as T
from gluon_data.convert.sample import make_voc

from conftest import torch_client_env

#: digests of ``train`` samples (image and mask bytes, shapes, dtypes) of a dataset
DIGEST = r"""
import hashlib, json, sys
import numpy as np
from gluon_data.arrays import SegmentationDataset

out = {}
for base, crop, output in ((60, 48, None), (30, 40, "uint8"), (50, 24, None)):
    ds = SegmentationDataset(sys.argv[1], mode="train", seed=7, base_size=base,
                             crop_size=crop, output=output)
    img, mask = hashlib.sha1(), hashlib.sha1()
    for i in range(len(ds)):
        a, b = ds[i]
        img.update(np.ascontiguousarray(a).tobytes() + repr(a.shape).encode())
        mask.update(b.tobytes() + repr((b.shape, b.dtype.str)).encode())
    out["%d/%d/%s" % (base, crop, output)] = [img.hexdigest(), mask.hexdigest()]
print("DIGEST " + json.dumps(out, sort_keys=True))
"""


@pytest.fixture(scope="module")
def seg_rec(tmp_path_factory):
    d = tmp_path_factory.mktemp("segfast")
    voc = make_voc(str(d / "VOC2012"), num_images=30, size_range=(17, 61), seed=4)
    out = str(d / "train.rec")
    convert(voc, out, "voc", split="train")
    return out


def _digest(python, rec):
    run = subprocess.run([python, "-c", DIGEST, rec], capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    line = [x for x in run.stdout.splitlines() if x.startswith("DIGEST ")]
    assert line, run.stdout[-2000:]
    return json.loads(line[0][len("DIGEST "):])


def test_nearest_index_is_opencv_4s_exact_map():
    # OpenCV 4.x INTER_NEAREST_EXACT picks these; OpenCV 5 picks others for some sizes
    assert T.nearest_index(5, 3).tolist() == [0, 0, 1, 2, 2]
    assert T.nearest_index(3, 7).tolist() == [1, 3, 5]
    assert T.nearest_index(4, 4).tolist() == [0, 1, 2, 3]
    assert T.nearest_index(7, 7).tolist() == list(range(7))
    rng = np.random.default_rng(0)
    for _ in range(200):
        src, dst = (int(v) for v in rng.integers(1, 700, 2))
        idx = T.nearest_index(dst, src)
        assert idx.min() >= 0 and idx.max() <= src - 1 and (np.diff(idx) >= 0).all()
    with pytest.raises(ValueError):
        T.nearest_index(0, 5)
    if cv2.__version__.startswith("4."):  # where OpenCV resizes masks itself (same map)
        for _ in range(300):
            src, dst = (int(v) for v in rng.integers(1, 700, 2))
            row = np.arange(src, dtype=np.uint16)[None, :]
            got = cv2.resize(row, (dst, 1), interpolation=cv2.INTER_NEAREST_EXACT)[0]
            assert got.tolist() == T.nearest_index(dst, src).tolist(), (src, dst)


def test_resize_mask_mirrors_in_the_same_copy():
    m = np.arange(5 * 7, dtype=np.uint16).reshape(5, 7)
    plain = T.resize_mask(m, 11, 4)
    assert plain.dtype == np.uint16 and plain.flags["C_CONTIGUOUS"]
    assert plain.tolist() == m[T.nearest_index(4, 5)][:, T.nearest_index(11, 7)].tolist()
    mirrored = T.resize_mask(m[:, 1:6], 9, 3, flip=True)
    assert mirrored.tolist() == T.resize_mask(m[:, 1:6], 9, 3)[:, ::-1].tolist()
    rng = np.random.default_rng(1)
    big = rng.integers(0, 300, (90, 120))
    views = (lambda a: a[3:, 5:], lambda a: a[::-1, 2:], lambda a: a[:, ::-2])  # a box's
    for dtype, view in [(d, v) for d in (np.uint8, np.int64) for v in views]:  # rows; others
        src = view(big.astype(dtype))  # (OpenCV 4 resizes uint8; numpy indexes int64)
        for oh, ow in ((40, 50), (150, 170), (40, 170), (150, 20)):
            for flip in (False, True):
                cols = T.nearest_index(ow, src.shape[1])
                want = src[T.nearest_index(oh, src.shape[0])][:, cols[::-1] if flip else cols]
                got = T.resize_mask(src, ow, oh, flip)
                assert got.dtype == dtype and got.flags["C_CONTIGUOUS"]
                assert np.array_equal(got, want), (dtype, oh, ow, flip)


@pytest.mark.parametrize("dtype", [np.uint8, np.int16, np.int32])
def test_map_values_is_a_table_lookup(dtype):
    rng = np.random.default_rng(4)
    src = rng.integers(0, 256, (37, 53), dtype=np.uint8)
    src[::5, ::3] = 255
    identity = np.arange(256).astype(dtype)
    ignore = identity.copy()
    ignore[255] = 0 if dtype == np.uint8 else -1  # the ignore label mapped
    two = ignore.copy()
    two[0] = 9                                      # and one more entry: still a cast
    absent = identity.copy()
    absent[254] = 3                                 # an entry src never holds
    src[src == 254] = 253
    scattered = rng.permutation(256).astype(dtype)  # any table: cv2.LUT
    labels = src % 128                              # the usual: labels < 128, and 255
    labels[::5, ::3] = 255
    for table in (identity, ignore, two, absent, scattered):
        for stored in (src, labels):  # (the ignore mapping's sign-extension cast, and not)
            want = table[stored]
            out = np.full((40, 60), 77, dtype)
            got = T.map_values(stored, table, out[2:39, 4:57])  # a strided window
            assert np.array_equal(got, want) and np.shares_memory(got, out)
            assert ((out[:2] == 77).all() and (out[:, :4] == 77).all()
                    and (out[:, 57:] == 77).all())


def test_train_samples_are_the_same_on_both_stacks(seg_rec):
    other = os.environ.get("GLUON_DATA_MXNET_PYTHON")
    if not other or os.path.realpath(other) == os.path.realpath(sys.executable):
        pytest.skip("GLUON_DATA_MXNET_PYTHON names no second interpreter (the core lane "
                    "sets it to the full lane's)")
    mine, theirs = _digest(sys.executable, seg_rec), _digest(other, seg_rec)
    assert mine == theirs, "train samples differ between %s and %s" % (sys.executable, other)


def _reference(ds, i):
    """``train`` sample ``i`` by the unfused transform: HxWxC image, labels from the stored
    mask by the documented rule (ignore label -> ignore value, cast)."""
    rec, key, offset = ds._record(i)
    from gluon_data.format import codec
    img = codec.decode_image(rec.image, flag=1)
    mask = codec.decode_mask(rec.mask)
    with ds._sample(i, 0):
        box, params = ds._joint.plan(*mask.shape)
    y0, x0, y1, x1 = box
    img, m = ds._joint.apply(img[y0:y1, x0:x1], mask[y0:y1, x0:x1], params)
    labels = m.astype(np.int64)
    labels[m == ds.ignore_label] = -1
    return img, labels


@pytest.mark.parametrize("output", [None, "uint8"])
def test_fused_train_path_gives_the_unfused_values(seg_rec, output):
    ds = SegmentationDataset(seg_rec, mode="train", seed=3, base_size=50, crop_size=40,
                             output=output)
    for i in range(len(ds)):
        img, mask = ds[i]
        want_img, want_mask = _reference(ds, i)
        if output == "uint8":
            want_img = want_img.transpose(2, 0, 1)
        assert img.dtype == np.uint8 and img.flags["C_CONTIGUOUS"]
        assert np.array_equal(img, want_img), i
        assert mask.dtype == np.int32 and np.array_equal(mask, want_mask), i


@pytest.mark.parametrize("mask_dtype,ignore", [("int32", -1), ("int16", -1), ("uint8", 255)])
def test_labels_read_from_the_runs_are_the_expanded_masks(seg_rec, monkeypatch, mask_dtype,
                                                         ignore):
    """The run-length mask's box sampled straight from its runs (the C routine, each run
    one fill) gives the labels its expansion, resize and table give (the routine hidden)."""
    import types
    from gluon_data.format import masks
    if not hasattr(masks._ext, "sample"):
        pytest.skip("the C run sampler is not built here")
    calls, real = [], masks._ext

    def spy(*args):
        calls.append(args[11])  # flip
        return real.sample(*args)
    kw = dict(mode="train", seed=7, base_size=50, crop_size=40, mask_dtype=mask_dtype,
              ignore_value=ignore)
    monkeypatch.setattr(masks, "_ext", types.SimpleNamespace(
        expand=real.expand, check=real.check, runs=real.runs, sample=spy))
    got = [SegmentationDataset(seg_rec, **kw)[i][1] for i in range(8)]
    assert len(calls) == 8 and set(calls) == {True, False}  # both mirrorings drawn
    monkeypatch.setattr(masks, "_ext", types.SimpleNamespace(
        expand=real.expand, check=real.check, runs=real.runs))
    want = [SegmentationDataset(seg_rec, **kw)[i][1] for i in range(8)]
    for g, w in zip(got, want):
        assert g.dtype == w.dtype == np.dtype(mask_dtype) and np.array_equal(g, w)


def test_a_run_box_the_runs_cannot_be_sampled_into_is_expanded():
    """Tables of 8-byte entries, or an output of another dtype, take the expanded mask:
    the same labels as from an array."""
    from gluon_data.format import masks
    m = np.random.default_rng(2).integers(0, 5, (30, 40)).astype(np.uint8)
    buf = masks.encode_rle(m, block_rows=8)
    crop = T.RandomScaleCrop(30, 20, seed=1)
    box, params = crop.plan(30, 40)
    y0, x0, y1, x1 = box
    img = np.zeros((30, 40, 3), np.uint8)[y0:y1, x0:x1]
    for dtype, out_dtype in ((np.int64, np.int64), (np.float64, np.float64),
                             (np.int32, np.int16)):
        table = np.arange(256).astype(dtype)
        want = crop.apply(img, m[y0:y1, x0:x1], params, mask_map=table,
                          mask_out=np.empty(crop.size, out_dtype))[1]
        run = masks.run_box(buf, box=box)
        if run is None:
            pytest.skip("the C run sampler is not built here")
        got = crop.apply(img, run, params, mask_map=table,
                         mask_out=np.empty(crop.size, out_dtype))[1]
        assert got.dtype == want.dtype and np.array_equal(got, want)


def test_mask_dtype(seg_rec):
    base = SegmentationDataset(seg_rec, mode="train", seed=5, base_size=50, crop_size=40)
    small = SegmentationDataset(seg_rec, mode="train", seed=5, base_size=50, crop_size=40,
                                mask_dtype="uint8", ignore_value=255)
    wide = SegmentationDataset(seg_rec, mode="train", seed=5, base_size=50, crop_size=40,
                               mask_dtype="int16")
    plain = SegmentationDataset(seg_rec, mask_dtype="uint8", ignore_value=None)
    for i in range(len(base)):
        m32 = base[i][1]
        m8, m16 = small[i][1], wide[i][1]
        assert m8.dtype == np.uint8 and m16.dtype == np.int16 and m32.dtype == np.int32
        assert np.array_equal(m16, m32)
        assert np.array_equal(m8, np.where(m32 == -1, 255, m32))
        assert plain[i][1].dtype == np.uint8
    with pytest.raises(ValueError, match="ignore_value=255"):
        SegmentationDataset(seg_rec, mode="train", mask_dtype="uint8")
    with pytest.raises(ValueError, match="valid: uint8, int16, int32"):
        SegmentationDataset(seg_rec, mask_dtype="int64")


def test_mask_dtype_refuses_a_label_it_cannot_hold(tmp_path):
    voc = make_voc(str(tmp_path / "VOC2012"), num_images=4, size_range=(20, 30), seed=2)
    png = os.path.join(voc, "SegmentationClass")
    names = sorted(os.listdir(png))
    for k, name in enumerate(names):  # 16-bit masks; the third one holds label 300
        m = np.full((30, 30), 1, np.uint16)
        m[:4] = 65535 if k != 2 else 300
        for f in os.listdir(os.path.join(voc, "JPEGImages")):
            if f[:-4] == name[:-4]:
                cv2.imwrite(os.path.join(voc, "JPEGImages", f), np.zeros((30, 30, 3), np.uint8))
        assert cv2.imwrite(os.path.join(png, name), m)
    rec = str(tmp_path / "wide.rec")
    convert(voc, rec, "voc", split="trainval", ignore_label=65535,
            classes=["c%d" % k for k in range(301)])
    with pytest.raises(ValueError, match="301 classes, more than mask_dtype='uint8' holds"):
        SegmentationDataset(rec, mask_dtype="uint8", ignore_value=255)
    ds = SegmentationDataset(rec, mask_dtype="int16")
    got = {ds.name(i)[:-4]: ds[i][1] for i in range(len(ds))}
    assert all(m.dtype == np.int16 for m in got.values())
    assert got[names[2][:-4]].max() == 300 and got[names[0][:-4]].min() == -1


#: a multiprocessing pool reading the dataset, run as a script file (spawned children import
#: it as their main module)
POOL_THREADS = r"""
import json, multiprocessing, os, sys
import cv2
import numpy as np
from gluon_data.arrays import SegmentationDataset


def threads_in(item):
    ds, i = item
    ds[i]
    return cv2.getNumThreads(), len(os.listdir("/proc/self/task"))


if __name__ == "__main__":
    cv2.setNumThreads(3)
    big = np.zeros((1500, 1500, 3), np.uint8)
    for _ in range(3):  # the main process's OpenCV pool is running when the workers fork
        cv2.GaussianBlur(cv2.resize(big, (2500, 2500)), (0, 0), 2.0)
    # (no read here: the workers are forked from a process that never read a sample)
    ds = SegmentationDataset(sys.argv[1], mode="train", seed=1, base_size=50, crop_size=40)
    got = {"main": cv2.getNumThreads()}  # the main process keeps what its user set
    for method in ("fork", "spawn"):
        with multiprocessing.get_context(method).Pool(2) as pool:
            got[method] = pool.map_async(threads_in, [(ds, i) for i in range(4)],
                                         chunksize=1).get(timeout=120)
    got["main after"] = cv2.getNumThreads()
    print("THREADS " + json.dumps(got))
"""


def _threads_report(run):
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads([x for x in run.stdout.splitlines() if x.startswith("THREADS ")][0][8:])


def test_pool_workers_run_opencv_single_threaded_and_the_main_process_is_left(seg_rec,
                                                                              tmp_path):
    script = tmp_path / "pool_threads.py"
    script.write_text(POOL_THREADS)
    got = _threads_report(subprocess.run([sys.executable, str(script), seg_rec],
                                         capture_output=True, text=True, timeout=180))
    assert got["main"] == 3 and got["main after"] == 3, got
    for method in ("fork", "spawn"):
        assert {n for n, _ in got[method]} == {1}, got
        assert max(t for _, t in got[method]) <= 4, got  # no OpenCV thread pool started


TORCH_THREADS = r"""
import json, os, sys
import cv2
import numpy as np
import torch
from gluon_data.arrays import SegmentationDataset

class Probe(torch.utils.data.Dataset):
    def __init__(self, ds):
        self.ds = ds
    def __len__(self):
        return len(self.ds)
    def __getitem__(self, i):
        self.ds[i]
        return cv2.getNumThreads(), len(os.listdir("/proc/self/task"))

cv2.setNumThreads(2)
big = np.zeros((1500, 1500, 3), np.uint8)
for _ in range(3):  # the main process's OpenCV pool is running when the workers fork
    cv2.GaussianBlur(cv2.resize(big, (2500, 2500)), (0, 0), 2.0)
ds = SegmentationDataset(sys.argv[1], mode="train", seed=0, base_size=50, crop_size=40)
ds[0]
got = []
for epoch in range(2):  # workers forked twice
    loader = torch.utils.data.DataLoader(Probe(ds), batch_size=None, num_workers=2)
    got += [(int(n), int(t)) for n, t in loader]
print("THREADS " + json.dumps({"main": cv2.getNumThreads(), "workers": got}))
"""


def test_torch_workers_run_opencv_single_threaded(seg_rec):
    env = torch_client_env()
    run = subprocess.run([sys.executable, "-c", TORCH_THREADS, seg_rec], env=env,
                         capture_output=True, text=True, timeout=180)
    got = _threads_report(run)
    assert got["main"] == 2
    assert {n for n, _ in got["workers"]} == {1}, got


def test_gluon_views_take_mask_dtype(seg_rec):
    try:
        import gluon_data.gluon.datasets as G
    except ImportError:
        pytest.skip("MXNet is not installed here (the Gluon layer needs it)")
    ours = SegmentationDataset(seg_rec, mode="train", seed=2, base_size=50, crop_size=40,
                               mask_dtype="uint8", ignore_value=255)
    view = G.SegmentationRecordDataset(seg_rec, mode="train", seed=2, base_size=50,
                                       crop_size=40, mask_dtype="uint8", ignore_value=255)
    for i in range(4):
        mask = view[i][1]
        assert mask.dtype == np.uint8 and np.array_equal(mask.asnumpy(), ours[i][1])


TRAINER_THREADS = r"""
import json, multiprocessing, sys
import cv2


def trainer(path, q):
    # a training process started by multiprocessing (as torch.multiprocessing.spawn starts
    # one per GPU): it makes its own dataset, so it is that dataset's main process
    from gluon_data.arrays import SegmentationDataset
    cv2.setNumThreads(3)
    ds = SegmentationDataset(path, mode="train", seed=0, base_size=50, crop_size=40)
    ds[0]
    q.put(cv2.getNumThreads())


if __name__ == "__main__":
    ctx = multiprocessing.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=trainer, args=(sys.argv[1], q))
    p.start()
    got = q.get(timeout=120)
    p.join(60)
    print("THREADS " + json.dumps({"trainer": got}))
"""


def test_a_trainer_started_by_multiprocessing_keeps_its_opencv_setting(seg_rec, tmp_path):
    """Only a copy of a dataset read in another process is a worker's: a process started by
    multiprocessing that makes its own dataset keeps the OpenCV setting its user chose."""
    script = tmp_path / "trainer_threads.py"
    script.write_text(TRAINER_THREADS)
    got = _threads_report(subprocess.run([sys.executable, str(script), seg_rec],
                                         capture_output=True, text=True, timeout=180))
    assert got == {"trainer": 3}, got


#: page faults per sample in a spawned pool worker reading VOC-size ``train`` samples
POOL_FAULTS = r"""
import json, multiprocessing, resource, sys
from gluon_data.arrays import SegmentationDataset


def faults(ds):
    for i in range(len(ds)):  # warm: the buffers of every size seen once
        ds[i]
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for i in range(len(ds)):
        ds[i]
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / len(ds)


if __name__ == "__main__":
    ds = SegmentationDataset(sys.argv[1], mode="train", seed=1, base_size=520, crop_size=480,
                             output="uint8")
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        print("FAULTS " + json.dumps(pool.apply_async(faults, (ds,)).get(timeout=240)))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator (Linux)")
def test_a_workers_allocator_reuses_the_pages_of_freed_samples(tmp_path):
    """In a worker the sample buffers (about a megabyte each, of varying sizes) reuse freed
    pages: a few page faults per sample, where glibc's default policy maps and faults most
    of them in again (``GLUON_DATA_WORKER_MALLOC=0`` keeps that policy)."""
    voc = make_voc(str(tmp_path / "VOC2012"), num_images=16, size_range=(300, 500), seed=2,
                   photo=True)
    rec = str(tmp_path / "big.rec")
    convert(voc, rec, "voc", split="train")
    script = tmp_path / "pool_faults.py"
    script.write_text(POOL_FAULTS)
    got = {}
    for setting in ("1", "0"):
        run = subprocess.run([sys.executable, str(script), rec], capture_output=True,
                             text=True, timeout=300,
                             env=dict(os.environ, GLUON_DATA_WORKER_MALLOC=setting))
        assert run.returncode == 0, run.stderr[-3000:]
        got[setting] = json.loads([x for x in run.stdout.splitlines()
                                   if x.startswith("FAULTS ")][0][7:])
    assert got["1"] < 20 and got["0"] > 4 * got["1"], got
