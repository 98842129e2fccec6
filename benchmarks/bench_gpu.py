"""``gluon-data bench``'s ``gpu`` step (``python benchmarks/bench_gpu.py --seg voc.rec --cls
train.rec``): the batch stage on the GPU against the CPU pipeline, in one run, as ratios.

* segmentation ``train`` (base 400, crop 320, ``ToTensor`` + ``Normalize``, batch 64): images/s
  of the CPU pipeline (PyTorch ``DataLoader`` over the dataset, all cores as workers, batches
  moved to the GPU) against the stage (the same workers drawing plans, the GPU decoding and
  augmenting); target: the stage at least 1.5x;
* the classification recipe at 224x224 (``RandomResizedCrop`` + flip, uint8 batches normalised
  on the GPU, a ResNet-50 training step in PyTorch, batch 64): steps/s fed by the CPU pipeline,
  fed by the stage, and on GPU-resident data (one batch kept on the device); target: the stage
  fed at least 0.97x the resident rate.

Without a CUDA device, PyTorch, or a GPU backend it prints why and measures nothing. Each row
is the median of ``--rounds`` rounds, the paths interleaved within a round. Loaded by the
harness as module ``gluon_data_bench_gpu``.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Callable, Dict, Optional


from gluon_data.arrays import ClassificationDataset, SegmentationDataset
from gluon_data.arrays.device import DeviceStage, select_backend
from gluon_data.arrays.plan import PlanDataset, collate_plans
from gluon_data.arrays.tensorize import ImageCropNormalize, ToTensorNormalize

__all__ = ["gpu_skip_reason", "run_gpu", "main"]

#: The ratios and their targets.
TARGETS = {"stage / CPU pipeline, segmentation train": 1.5,
           "classification fed by the stage / GPU-resident": 0.97}
_MEAN, _STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def gpu_skip_reason() -> Optional[str]:
    """Why the step cannot run here, or ``None``."""
    try:
        import torch
    except ImportError:
        return "skipped: PyTorch is not installed (pip install gluon-data[gpu])"
    if not torch.cuda.is_available():
        return "skipped: no CUDA device is visible to PyTorch"
    if select_backend() == "cpu":
        return ("skipped: neither nvImageCodec nor torchvision is installed "
                "(pip install gluon-data[gpu])")
    return None


def _median_rates(paths: Dict[str, Callable[[], int]], rounds: int) -> Dict[str, float]:
    """Median items/s of each path (a callable returning the items it made), interleaved."""
    for fn in paths.values():  # warm-up: workers, decoders, allocators
        fn()
    got: Dict[str, list] = {k: [] for k in paths}
    for _ in range(rounds):
        for name, fn in paths.items():
            t0 = time.perf_counter()
            n = fn()
            got[name].append(n / (time.perf_counter() - t0))
    return {k: statistics.median(v) for k, v in got.items()}


def _loader(torch, dataset, workers: int, batch: int, collate=None):
    kw = {} if collate is None else {"collate_fn": collate}
    return torch.utils.data.DataLoader(dataset, batch_size=batch, shuffle=True, drop_last=True,
                                       num_workers=workers, persistent_workers=workers > 0,
                                       **kw)


def _drain(torch, loader, stage=None, consume=None, limit: int = 0) -> int:
    """Items through ``loader`` (and ``stage``), each batch on the GPU and ``consume``d."""
    n = 0
    for k, batch in enumerate(loader):
        images, targets = stage(batch) if stage is not None else batch
        images = torch.as_tensor(images).cuda(non_blocking=True)
        if consume is not None:
            consume(images, torch.as_tensor(targets).cuda(non_blocking=True))
        n += len(images)
        if limit and k + 1 >= limit:
            break
    torch.cuda.synchronize()
    return n


def _model(torch):
    try:
        from torchvision.models import resnet50
        net = resnet50(num_classes=1000)
    except ImportError:  # a plain conv net of similar per-image cost where torchvision lacks
        net = torch.nn.Sequential(*[m for c in (64, 128, 256, 512) for m in (
            torch.nn.LazyConv2d(c, 3, stride=2, padding=1), torch.nn.ReLU())],
            torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.LazyLinear(1000))
    net = net.cuda().to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    mean = torch.tensor(_MEAN, device="cuda").reshape(1, 3, 1, 1) * 255
    std = torch.tensor(_STD, device="cuda").reshape(1, 3, 1, 1) * 255

    def step(images, labels):
        x = ((images.float() - mean) / std).contiguous(memory_format=torch.channels_last)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(net(x), labels.long() % 1000)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return step


def run_gpu(seg_rec: str, cls_rec: str, workers: Optional[int] = None, rounds: int = 3,
            batches: int = 20, say=print) -> Dict[str, float]:
    """The step's rows (``{name: rate}`` and the ratios), printed with ``say``; ``{}`` with
    the reason printed where it cannot run."""
    reason = gpu_skip_reason()
    if reason is not None:
        say("gpu: " + reason)
        return {}
    import torch
    workers = workers or os.cpu_count() or 1
    seg = SegmentationDataset(seg_rec, mode="train", base_size=400, crop_size=320, seed=0,
                              transform=ToTensorNormalize(_MEAN, _STD))
    stage = DeviceStage(seg)
    say("gpu: backend %s, %d workers, %s" % (stage.backend, workers,
                                            torch.cuda.get_device_name(0)))
    cpu_l, plan_l = (_loader(torch, seg, workers, 64),
                     _loader(torch, PlanDataset(seg), workers, 64, collate_plans))
    rows = _median_rates({
        "segmentation train, CPU pipeline": lambda: _drain(torch, cpu_l, limit=batches),
        "segmentation train, stage": lambda: _drain(torch, plan_l, stage, limit=batches)},
        rounds)
    crop = ImageCropNormalize(("random", (224, 224), (0.08, 1.0), (3 / 4, 4 / 3), 1),
                              flip=True, uint8=True)
    cls = ClassificationDataset(cls_rec, image_transform=crop, seed=0, output="uint8")
    cstage, step = DeviceStage(cls), _model(torch)
    resident = (torch.randint(0, 256, (64, 3, 224, 224), dtype=torch.uint8, device="cuda"),
                torch.randint(0, 1000, (64,), device="cuda"))

    def on_resident() -> int:
        for _ in range(batches):
            step(*resident)
        torch.cuda.synchronize()
        return 64 * batches

    ccpu, cplan = (_loader(torch, cls, workers, 64),
                   _loader(torch, PlanDataset(cls), workers, 64, collate_plans))
    rows.update(_median_rates({
        "classification 224, GPU-resident": on_resident,
        "classification 224, fed by the CPU pipeline": lambda: _drain(
            torch, ccpu, consume=step, limit=batches),
        "classification 224, fed by the stage": lambda: _drain(
            torch, cplan, cstage, consume=step, limit=batches)}, rounds))
    rows["stage / CPU pipeline, segmentation train"] = (
        rows["segmentation train, stage"] / rows["segmentation train, CPU pipeline"])
    rows["classification fed by the stage / GPU-resident"] = (
        rows["classification 224, fed by the stage"] / rows["classification 224, GPU-resident"])
    rows["classification fed by the CPU pipeline / GPU-resident"] = (
        rows["classification 224, fed by the CPU pipeline"]
        / rows["classification 224, GPU-resident"])
    for name, value in rows.items():
        target = TARGETS.get(name)
        say("  %-58s %10.2f%s" % (name, value, "" if target is None else
                                  "  (target >= %.2f: %s)" % (target, "met" if value >= target
                                                              else "NOT met")))
    say("  stage items on the GPU / on the CPU path: %r, %r" % (stage.counts, cstage.counts))
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seg", required=True, help="a segmentation .rec or .lmdb (VOC size)")
    p.add_argument("--cls", required=True, help="a classification .rec or .lmdb")
    p.add_argument("--workers", type=int, default=None, help="loader workers (default: cores)")
    p.add_argument("--rounds", type=int, default=3, help="timed rounds (median)")
    p.add_argument("--batches", type=int, default=20, help="batches of 64 per timed pass")
    a = p.parse_args(argv)
    run_gpu(a.seg, a.cls, a.workers, a.rounds, a.batches)
    return 0


if __name__ == "__main__":
    sys.exit(main())
