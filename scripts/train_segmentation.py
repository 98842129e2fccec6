#!/usr/bin/env python
"""Train a gluoncv segmentation model (FCN or DeepLabV3) from a packed .rec or .lmdb.

The data side is gluoncv's own recipe (``scripts/segmentation/train.py``) with one change:
the dataset is ``SegmentationRecordDataset`` / ``SegmentationLMDBDataset`` in ``mode='train'``
instead of ``get_segmentation_dataset(...)``, and the batchify stacks crops in one step.

    python scripts/train_segmentation.py --data data/voc_train.rec --val-data data/voc_val.rec
    python scripts/train_segmentation.py --data data/voc.lmdb --split train --iters 200

No pretrained weights are loaded (this machine has no network): the backbone starts from
scratch, so the numbers only show that the pipeline trains.
"""
import argparse
import sys
import time

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon
from mxnet.gluon.data.vision import transforms

from gluon_data import SegmentationBatchify
from gluon_data.datasets import open_segmentation as open_dataset


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, help="training .rec or .lmdb")
    p.add_argument("--split", default="train", help="LMDB split to train on")
    p.add_argument("--val-data", help="validation .rec or .lmdb (evaluated in 'val' mode)")
    p.add_argument("--val-split", default="val", help="LMDB split to validate on")
    p.add_argument("--model", choices=["fcn", "deeplab"], default="fcn")
    p.add_argument("--backbone", default="resnet18",
                   help="resnet18, resnet34, resnet50, resnet101, resnet152")
    p.add_argument("--base-size", type=int, default=520)
    p.add_argument("--crop-size", type=int, default=480)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--workers", type=int, default=2, help="DataLoader worker processes")
    p.add_argument("--iters", type=int, default=100, help="training iterations")
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=0, help="augmentation and weight init seed")
    p.add_argument("--log-every", type=int, default=10)
    return p.parse_args(argv)


SMALL_BACKBONES = ("resnet18", "resnet34")  # basic blocks: 512 channels out, not 2048


def build_model(name, backbone, nclass, base_size, crop_size):
    """gluoncv's FCN / DeepLabV3, randomly initialised. gluoncv sizes the FCN head for the
    2048 channels of ResNet-50 and deeper; for ResNet-18/34 the same head is built for 512."""
    import warnings
    from gluoncv.model_zoo import DeepLabV3, FCN
    from gluoncv.model_zoo.fcn import _FCNHead
    if name == "deeplab":
        if backbone in SMALL_BACKBONES:
            raise SystemExit("error: DeepLabV3's ASPP expects 2048 channels: use --backbone "
                             "resnet50 or deeper, or --model fcn")
        return DeepLabV3(nclass, backbone=backbone, aux=False, pretrained_base=False,
                         base_size=base_size, crop_size=crop_size)
    model = FCN(nclass, backbone=backbone, aux=False, pretrained_base=False,
                base_size=base_size, crop_size=crop_size)
    if backbone in SMALL_BACKBONES:
        with model.name_scope():
            model.head = _FCNHead(512, nclass)
    warnings.filterwarnings("ignore", message=".*already initialized.*")
    return model


def evaluate(model, dataset, batch_size, workers, nclass):
    from gluoncv.utils.metrics import SegmentationMetric
    metric = SegmentationMetric(nclass)
    loader = gluon.data.DataLoader(dataset, batch_size, num_workers=workers,
                                   batchify_fn=SegmentationBatchify(channels_first=True))
    for data, target in loader:
        metric.update(target, model(data)[0])
    return metric.get()


def main(argv=None):
    args = parse_args(argv)
    mx.random.seed(args.seed)
    np.random.seed(args.seed)
    from gluoncv.loss import MixSoftmaxCrossEntropyLoss
    from gluoncv.utils.metrics import SegmentationMetric

    input_transform = transforms.Compose([
        transforms.ToTensor(),
        transforms.Normalize([.485, .456, .406], [.229, .224, .225]),
    ])
    trainset = open_dataset(args.data, args.split, mode="train", base_size=args.base_size,
                            crop_size=args.crop_size, transform=input_transform,
                            seed=args.seed)
    loader = gluon.data.DataLoader(trainset, args.batch_size, shuffle=True,
                                   last_batch="rollover", num_workers=args.workers,
                                   batchify_fn=SegmentationBatchify(channels_first=True))
    nclass = trainset.num_class
    model = build_model(args.model, args.backbone, nclass, args.base_size, args.crop_size)
    model.initialize(mx.init.Xavier())
    criterion = MixSoftmaxCrossEntropyLoss(aux=False, ignore_label=-1)
    trainer = gluon.Trainer(model.collect_params(), "sgd",
                            {"learning_rate": args.lr, "momentum": 0.9, "wd": 1e-4})
    metric = SegmentationMetric(nclass)
    print("training %s/%s on %r (%d classes), crop %d, batch %d, %d workers"
          % (args.model, args.backbone, trainset, nclass, args.crop_size, args.batch_size,
             args.workers), flush=True)
    it, seen, t0, loss_value = 0, 0, time.perf_counter(), float("nan")
    while it < args.iters:
        for data, target in loader:
            with autograd.record(True):
                outputs = model(data)
                losses = criterion(*outputs, target)
            losses.backward()
            trainer.step(data.shape[0])
            loss_value = float(losses.mean().asscalar())
            metric.update(target, outputs[0])
            it += 1
            seen += data.shape[0]
            if it % args.log_every == 0 or it == args.iters:
                pix_acc, miou = metric.get()
                print("iter %4d  loss %.4f  pixAcc %.4f  mIoU %.4f  %.1f samples/s"
                      % (it, loss_value, pix_acc, miou, seen / (time.perf_counter() - t0)),
                      flush=True)
            if it >= args.iters:
                break
    if not np.isfinite(loss_value):
        print("error: the loss is not finite (%r)" % loss_value, file=sys.stderr)
        return 1
    if args.val_data:
        valset = open_dataset(args.val_data, args.val_split, mode="val",
                              crop_size=args.crop_size, transform=input_transform)
        pix_acc, miou = evaluate(model, valset, args.batch_size, args.workers, nclass)
        print("validation on %d samples: pixAcc %.4f  mIoU %.4f" % (len(valset), pix_acc, miou))
    return 0


if __name__ == "__main__":
    sys.exit(main())
