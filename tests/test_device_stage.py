"""The batch stage (gluon_data.arrays.plan / .device): plans drawn on the CPU, batches made from
them equal to dataset[i]; the GPU path's geometry checked in PyTorch on the CPU."""
from __future__ import annotations

import os
import pickle
import subprocess
import sys

import numpy as np
import pytest

from gluon_data.arrays import ClassificationDataset, SegmentationDataset
from gluon_data.arrays.device import DeviceStage, device_decodable, select_backend
from gluon_data.arrays.plan import PlanDataset, plan_sample, replay
from gluon_data.arrays.tensorize import ImageCropNormalize, ToTensorNormalize
from gluon_data.errors import DecodeError
from gluon_data.format import codec
from gluon_data.sampling.sampler import SampleKey
from gluon_data.stores.recwriter import RecordWriter
from jpeg_variants import ODD_SAMPLINGS, baseline_jpeg, lossless_jpeg
from conftest import torch_client_env

TRAIN = dict(mode="train", base_size=40, crop_size=32, seed=5)
VAL = dict(mode="val", crop_size=24)
CROP = ImageCropNormalize(("random", (16, 16), (0.08, 1.0), (3 / 4, 4 / 3), 1), flip=True,
                          mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))


def _expected(ds, keys):
    samples = [ds[k] for k in keys]
    second = [s[1] for s in samples]
    return (np.stack([s[0] for s in samples]),
            np.stack(second) if isinstance(second[0], np.ndarray) and second[0].ndim == 2
            else np.asarray(second, np.float32))


def _segmentation_cases(voc_rec):
    return [SegmentationDataset(voc_rec, **TRAIN),
            SegmentationDataset(voc_rec, **TRAIN, transform=ToTensorNormalize()),
            SegmentationDataset(voc_rec, **TRAIN, output="uint8"),
            SegmentationDataset(voc_rec, **VAL),
            SegmentationDataset(voc_rec, **VAL, transform=ToTensorNormalize()),
            SegmentationDataset(voc_rec, mode="testval")]


@pytest.mark.parametrize("case", range(6))
def test_cpu_stage_equals_the_segmentation_samples(voc_rec, case):
    ds = _segmentation_cases(voc_rec)[case]
    stage = DeviceStage(ds, backend="cpu")
    for epoch in (0, 3):
        keys = [SampleKey(i, epoch) for i in range(len(ds))]
        plans = [plan_sample(ds, k) for k in keys]
        got = stage(plans) if case != 5 else None
        if case == 5:  # testval: samples of different sizes, made one by one
            for k, p in zip(keys, plans):
                assert p.kind == "replay"
                for a, b in zip(replay(ds, p), ds[k]):
                    np.testing.assert_array_equal(a, b)
            continue
        want = _expected(ds, keys)
        assert got[0].dtype == want[0].dtype and got[1].dtype == want[1].dtype
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])
    assert stage.counts == {"device": 0, "cpu": 2 * len(ds) if case != 5 else 0}


def test_plans_carry_the_exact_mask_and_the_drawn_geometry(voc_rec):
    for kw, kind in ((TRAIN, "train"), (VAL, "val")):
        ds = SegmentationDataset(voc_rec, **kw)
        for i in range(len(ds)):
            p = plan_sample(ds, SampleKey(i, 2))
            assert p.kind == kind and p.image[:2] == b"\xff\xd8"
            np.testing.assert_array_equal(p.mask, ds[SampleKey(i, 2)][1])
            assert p.mask.dtype == np.int32
    ds = SegmentationDataset(voc_rec, **TRAIN)
    a, b = plan_sample(ds, SampleKey(1, 4)), plan_sample(ds, SampleKey(1, 4))
    assert a.geometry == b.geometry
    assert plan_sample(ds, SampleKey(1, 5)).geometry != a.geometry or \
        plan_sample(ds, SampleKey(1, 6)).geometry != a.geometry
    back = pickle.loads(pickle.dumps(a))
    assert back.geometry == a.geometry and back.image == a.image


def test_plain_int_indices_count_epochs_as_the_dataset_does(voc_rec):
    ds, twin = (SegmentationDataset(voc_rec, **TRAIN) for _ in range(2))
    plans = PlanDataset(ds)
    for _ in range(2):  # the second request of index 3 is epoch 1, in both
        p = plans[3]
        img, mask = twin[3]
        np.testing.assert_array_equal(replay(ds, p)[0], img)
        np.testing.assert_array_equal(p.mask, mask)
    assert p.epoch == 1


@pytest.mark.parametrize("transform", [None, CROP, ImageCropNormalize(
    ("center", (12, 12), 1), mean=0, std=1, uint8=True)])
def test_cpu_stage_equals_the_classification_samples(cls_rec, transform):
    ds = ClassificationDataset(cls_rec, image_transform=transform, seed=3,
                               output="uint8" if transform is not None and transform.uint8
                               else None)
    keys = [SampleKey(i, 1) for i in range(len(ds))]
    plans = [PlanDataset(ds)[k] for k in keys]
    assert {p.kind for p in plans} == {"crop"}
    if transform is None:  # images of different sizes: one by one
        for k, p in zip(keys, plans):
            np.testing.assert_array_equal(replay(ds, p)[0], ds[k][0])
        return
    got, want = DeviceStage(ds, backend="cpu")(plans), _expected(ds, keys)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])


def test_backend_choice_and_the_missing_extra(voc_rec, monkeypatch):
    monkeypatch.delenv("GLUON_DATA_DEVICE_BACKEND", raising=False)
    assert select_backend("cpu") == "cpu"
    with pytest.raises(ValueError, match="valid backends"):
        select_backend("opencl")
    import importlib.util
    if importlib.util.find_spec("torch") is None:  # this lane has no GPU stack at all
        assert select_backend() == "cpu"
        for name in ("nvimgcodec", "torchvision"):
            with pytest.raises(RuntimeError, match=r"pip install gluon-data\[gpu\]"):
                select_backend(name)
            monkeypatch.setenv("GLUON_DATA_DEVICE_BACKEND", name)
            with pytest.raises(RuntimeError, match=r"pip install gluon-data\[gpu\]"):
                DeviceStage(SegmentationDataset(voc_rec, **VAL))
            monkeypatch.delenv("GLUON_DATA_DEVICE_BACKEND")
        with pytest.raises(RuntimeError, match="torchvision, the CUDA build that matches"):
            select_backend("torchvision")  # (the extra does not install it: said so)
    test = SegmentationDataset(voc_rec, mode="test")  # (image, name): the names listed
    plans = [plan_sample(test, i) for i in range(2)]
    images, names = DeviceStage(test, backend="cpu")(plans[:1] * 2)
    assert names == [test.name(0)] * 2 and images.shape[0] == 2
    with pytest.raises(ValueError, match="empty batch"):
        DeviceStage(SegmentationDataset(voc_rec, **VAL), backend="cpu")([])


def test_the_device_is_named_as_torch_names_it(voc_rec):
    """``device=`` takes an index, ``"cuda"`` or ``"cuda:N"``; anything else is a ValueError
    saying what it takes (``"cuda"`` was an ``int()`` error)."""
    ds = SegmentationDataset(voc_rec, **VAL)
    for given, index in ((1, 1), ("cuda", 0), ("cuda:2", 2)):
        assert DeviceStage(ds, backend="cpu", device=given).device == index
    for bad in ("cpu", "cuda:x", -1, True):
        with pytest.raises(ValueError, match="must name a CUDA device"):
            DeviceStage(ds, backend="cpu", device=bad)


def _stock_rec(path: str, images) -> str:
    """A .rec of classification records holding ``images`` as they are (as stock tools
    keep them)."""
    with RecordWriter(path, overwrite=True) as w:
        for i, buf in enumerate(images):
            w.write(i, codec.pack_classification(float(i), buf, id=i))
        w.finish()
        w.publish()
    return path


def test_refused_jpegs_are_refused_by_the_stage_as_by_the_dataset(tmp_path):
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, (16, 24, 3), dtype=np.uint8)
    odd, lossless = baseline_jpeg(pixels, ODD_SAMPLINGS["3x1"]), lossless_jpeg(pixels)
    plain = baseline_jpeg(pixels)
    damaged = plain[:len(plain) // 2] + bytes(8) + plain[len(plain) // 2 + 8:]
    assert device_decodable(plain)
    assert not device_decodable(odd) and not device_decodable(lossless)
    path = _stock_rec(str(tmp_path / "v.rec"), [odd, lossless, plain, damaged])
    for transform in (None, CROP):
        ds = ClassificationDataset(path, image_transform=transform, seed=1)
        stage, plans = DeviceStage(ds, backend="cpu"), PlanDataset(ds)
        refused = set()
        for i in range(len(ds)):
            p = plans[SampleKey(i, 0)]
            try:
                want = ds[SampleKey(i, 0)]
            except DecodeError as e:
                refused.add(i)
                with pytest.raises(DecodeError) as got:
                    stage([p])
                assert str(got.value) == str(e) and "v.rec" in str(e)
                continue
            np.testing.assert_array_equal(stage([p])[0][0], want[0])
        assert refused == {0, 3}  # the odd sampling and the damaged stream; lossless reads


#: The stage after PyTorch's DataLoader (2 worker processes read and draw, this process makes
#: the batches), and the GPU path's geometry run by PyTorch on the CPU against the decoder of
#: record's pixels. In its own interpreter, as tests/test_arrays.py's torch client.
TORCH_STAGE = r"""
import sys
import numpy as np
import torch
from gluon_data.arrays import ClassificationDataset, SegmentationDataset
from gluon_data.arrays.device import DeviceStage, apply_geometry
from gluon_data.arrays.plan import PlanDataset, collate_plans, image_output
from gluon_data.arrays.tensorize import ImageCropNormalize
from gluon_data.format import codec
from gluon_data.sampling.sampler import SampleKey

voc, cls, out = sys.argv[1:4]
crop = ImageCropNormalize(("random", (16, 16), (0.08, 1.0), (3 / 4, 4 / 3), 1), flip=True,
                          mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))
cases = {"train": SegmentationDataset(voc, mode="train", base_size=40, crop_size=32, seed=12),
         "val": SegmentationDataset(voc, mode="val", crop_size=24),
         "cls": ClassificationDataset(cls, image_transform=crop, seed=3)}
saved, worst = {}, {}
for name, ds in cases.items():
    stage = DeviceStage(ds, backend="cpu")
    keys = [SampleKey(int(i), 2) for i in np.random.default_rng(0).permutation(len(ds))]
    loader = torch.utils.data.DataLoader(PlanDataset(ds), sampler=keys, batch_size=4,
                                         collate_fn=collate_plans, num_workers=2)
    layout, diffs = image_output(ds), []
    for b, plans in enumerate(loader):
        images, targets = stage(plans)
        assert torch.equal(torch.from_dlpack(images), torch.from_numpy(images))
        saved["%s_%d_img" % (name, b)], saved["%s_%d_tgt" % (name, b)] = images, targets
        saved["%s_%d_idx" % (name, b)] = np.array([p.index for p in plans])
        for p, want in zip(plans, images):
            got = apply_geometry(torch.from_numpy(codec.decode_image(p.image)), p, layout)
            scale = 255 * 0.226 if layout[0] == "tensor" else 1  # in levels
            diffs.append(float((got.double() - torch.from_numpy(want).double()).abs().max())
                         * scale)
    worst[name] = max(diffs)
np.savez(out, **saved)
print("torch", torch.__version__, repr(worst))
"""


@pytest.mark.slow
def test_the_stage_after_a_torch_dataloader_with_two_workers(voc_rec, cls_rec, tmp_path):
    out = str(tmp_path / "stage.npz")
    run = subprocess.run([sys.executable, "-c", TORCH_STAGE, voc_rec, cls_rec, out],
                         env=torch_client_env(), capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.startswith("torch 2."), run.stdout
    worst = eval(run.stdout.split(" ", 2)[2])
    # the GPU path's geometry (PyTorch's resize, flip, pad, blur) within one level of OpenCV's
    # and Pillow's on the same pixels; masks are the CPU's own
    assert set(worst) == {"train", "val", "cls"} and max(worst.values()) <= 1.05, worst
    got = np.load(out)
    datasets = {"train": SegmentationDataset(voc_rec, mode="train", base_size=40, crop_size=32,
                                             seed=12),
                "val": SegmentationDataset(voc_rec, mode="val", crop_size=24),
                "cls": ClassificationDataset(cls_rec, image_transform=CROP, seed=3)}
    for name, ds in datasets.items():
        batches = sorted({k.rsplit("_", 2)[1] for k in got.files if k.startswith(name + "_")})
        seen = []
        for b in batches:
            keys = [SampleKey(int(i), 2) for i in got["%s_%s_idx" % (name, b)]]
            want = _expected(ds, keys)
            np.testing.assert_array_equal(got["%s_%s_img" % (name, b)], want[0])
            np.testing.assert_array_equal(got["%s_%s_tgt" % (name, b)], want[1])
            seen += [k.index for k in keys]
        assert sorted(seen) == list(range(len(ds)))


RECIPE = os.path.join(os.path.dirname(__file__), "..", "scripts", "train_segmentation.py")


def test_the_gluon_dataloader_with_the_stage_yields_the_samples(voc_rec):
    pytest.importorskip("mxnet")
    from gluon_data.gluon.datasets import SegmentationDataset as GluonSegmentation
    from gluon_data.gluon.device import DeviceLoader
    from mxnet.gluon.data.vision import transforms as VT
    from gluon_data.sampling.sampler import DistributedSampler
    tensor = VT.Compose([VT.ToTensor(), VT.Normalize([.485, .456, .406], [.229, .224, .225])])
    ds = GluonSegmentation(voc_rec, **TRAIN, transform=tensor)
    ref = SegmentationDataset(voc_rec, **TRAIN, transform=ToTensorNormalize())
    sampler = DistributedSampler(len(ds), num_replicas=1, rank=0, seed=0, batch_size=4)
    sampler.set_epoch(1)
    loader = DeviceLoader(ds, batch_sampler=sampler.batch_sampler(), num_workers=2)
    assert loader.stage.backend == "cpu" and len(loader) == len(sampler.batch_sampler())
    seen = 0
    for keys, (data, target) in zip(sampler.batch_sampler(), loader):
        want = _expected(ref, keys)
        assert data.dtype == np.float32 and target.dtype == np.int32
        np.testing.assert_array_equal(data.asnumpy(), want[0])
        np.testing.assert_array_equal(target.asnumpy(), want[1])
        seen += len(keys)
    assert seen == len(ds) and loader.stage.counts["cpu"] == seen
    with pytest.raises(ValueError, match="batchify_fn"):
        DeviceLoader(ds, 4, batchify_fn=list)


def test_the_recipe_trains_on_the_same_samples_with_the_stage(voc_rec, tmp_path):
    pytest.importorskip("mxnet")
    logs = {}
    for name, extra in (("loader", []), ("stage", ["--device-stage"])):
        out = tmp_path / name
        run = subprocess.run(
            [sys.executable, RECIPE, "--data", voc_rec, "--split", "trainval", "--model", "tiny",
             "--iters", "3",
             "--base-size", "40", "--crop-size", "32", "--batch-size", "4", "--workers", "2",
             "--log-dir", str(out)] + extra, capture_output=True, text=True, timeout=600,
            env=dict(os.environ, OMP_NUM_THREADS="1", MXNET_CPU_WORKER_NTHREADS="1"))
        assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
        with open(out / "samples.rank0.jsonl") as f:
            logs[name] = f.read().splitlines()
    assert len(logs["loader"]) == 12 and logs["stage"] == logs["loader"]  # image and mask CRCs


#: The device path itself (which JPEGs go to the device, the per-item CPU path, the counts,
#: torch batches), run on PyTorch's CPU with the decoder of record standing in for nvJPEG
#: (a decode it refuses reads as a device decoder's failure).
TORCH_DEVICE_PATH = r"""
import sys
import numpy as np
import torch
from gluon_data.arrays import ClassificationDataset
from gluon_data.arrays.device import DeviceStage
from gluon_data.arrays.plan import PlanDataset
from gluon_data.arrays.tensorize import ImageCropNormalize
from gluon_data.errors import DecodeError
from gluon_data.format import codec
from gluon_data.sampling.sampler import SampleKey


class OnTorchCpu(DeviceStage):
    def __init__(self, ds):
        super().__init__(ds, backend="cpu")
        self.backend, self._where, self.asked = "test", "cpu", []

    def _decode(self, buffers):
        self.asked.append(len(buffers))
        out = []
        for b in buffers:
            try:
                out.append(torch.from_numpy(codec.decode_image(b)))
            except DecodeError:
                out.append(None)
        return out


crop = ImageCropNormalize(("random", (16, 16), (0.08, 1.0), (3 / 4, 4 / 3), 1), flip=True,
                          mean=0, std=1, uint8=True)
ds = ClassificationDataset(sys.argv[1], image_transform=crop, seed=1, output="uint8")
stage = OnTorchCpu(ds)
plans = [PlanDataset(ds)[SampleKey(i, 0)] for i in (1, 2, 2)]  # lossless, plain, plain
images, labels = stage(plans)
assert images.dtype == torch.uint8 and tuple(images.shape) == (3, 3, 16, 16), images.shape
want = np.stack([ds[SampleKey(i, 0)][0] for i in (1, 2, 2)])
assert np.array_equal(images[0].numpy(), want[0])  # the lossless one: the CPU's pixels
assert int((images[1:].int() - torch.from_numpy(want[1:]).int()).abs().max()) <= 1
assert labels.tolist() == [1.0, 2.0, 2.0]
assert stage.counts == {"device": 2, "cpu": 1} and stage.asked == [2], (stage.counts, stage.asked)
for i in (0, 3):  # the odd sampling (never sent) and the damaged stream (the device fails)
    try:
        stage([PlanDataset(ds)[SampleKey(2, 0)], PlanDataset(ds)[SampleKey(i, 0)]])
    except DecodeError as e:
        assert "v.rec" in str(e) and ("record %d" % i in str(e) or str(i) in str(e)), str(e)
    else:
        raise AssertionError("record %d was not refused" % i)
assert stage.asked == [2, 1, 2], stage.asked
print("ok", stage.counts)
"""


@pytest.mark.slow
def test_the_device_path_sends_what_the_device_cannot_read_to_the_cpu(tmp_path):
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, (24, 32, 3), dtype=np.uint8)
    plain = baseline_jpeg(pixels)
    damaged = plain[:len(plain) // 2] + bytes(8) + plain[len(plain) // 2 + 8:]
    path = _stock_rec(str(tmp_path / "v.rec"), [baseline_jpeg(pixels, ODD_SAMPLINGS["3x1"]),
                                                lossless_jpeg(pixels), plain, damaged])
    run = subprocess.run([sys.executable, "-c", TORCH_DEVICE_PATH, path], env=torch_client_env(),
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.startswith("ok "), run.stdout


def test_the_bench_gpu_step_says_why_it_is_skipped(voc_rec, cls_rec):
    from gluon_data.cli.bench import load_bench_part
    part = load_bench_part("bench_gpu", os.path.join(os.path.dirname(__file__), "..",
                                                     "benchmarks"))
    said = []
    reason = part.gpu_skip_reason()
    if reason is None:
        pytest.skip("a CUDA device and a GPU backend are present: the step measures")
    assert part.run_gpu(voc_rec, cls_rec, say=said.append) == {}
    assert said == ["gpu: " + reason] and reason.startswith("skipped: ")
