#!/usr/bin/env python
"""Train a gluoncv segmentation model (FCN or DeepLabV3) from a packed .rec or .lmdb, on one
process or data-parallel over an MXNet kvstore (dist_sync) or Horovod.

The data side is gluoncv's own recipe (``scripts/segmentation/train.py``) with one change:
the dataset is ``SegmentationRecordDataset`` / ``SegmentationLMDBDataset`` in ``mode='train'``
instead of ``get_segmentation_dataset(...)``, and the batchify stacks crops in one step.
Batches come from a ``DistributedSampler``: one seeded order per epoch whatever the number of
workers, equal padded shards, and a resumable position saved with the model.

    python scripts/train_segmentation.py --data data/voc_train.rec --val-data data/voc_val.rec
    python scripts/train_segmentation.py --data data/voc.lmdb --split train --iters 200
    # 2 workers on this machine (see README, "Distributed training"):
    python $MXNET/tools/launch.py -n 2 -s 1 --launcher local \\
        python scripts/train_segmentation.py --kvstore dist_sync --data ... --epochs 2
    horovodrun --gloo -np 2 -H localhost:2 python scripts/train_segmentation.py --horovod ...

No pretrained weights are loaded (this machine has no network): the backbone starts from
scratch, so the numbers only show that the pipeline trains.
"""
import argparse
import json
import os
import sys
import time
import zlib

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon
from mxnet.gluon.data.vision import transforms

from gluon_data import DistributedSampler, SegmentationBatchify
from gluon_data.datasets import open_segmentation as open_dataset


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, help="training .rec or .lmdb")
    p.add_argument("--split", default="train", help="LMDB split to train on")
    p.add_argument("--val-data", help="validation .rec or .lmdb (evaluated in 'val' mode)")
    p.add_argument("--val-split", default="val", help="LMDB split to validate on")
    p.add_argument("--model", choices=["fcn", "deeplab", "tiny"], default="fcn",
                   help="tiny: two 3x3 convolutions, for quick pipeline checks")
    p.add_argument("--backbone", default="resnet18",
                   help="resnet18, resnet34, resnet50, resnet101, resnet152")
    p.add_argument("--base-size", type=int, default=520)
    p.add_argument("--crop-size", type=int, default=480)
    p.add_argument("--batch-size", type=int, default=8, help="per worker")
    p.add_argument("--workers", type=int, default=2, help="DataLoader worker processes")
    p.add_argument("--iters", type=int, default=100, help="training iterations")
    p.add_argument("--epochs", type=int, help="train this many epochs (instead of --iters)")
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=0,
                   help="sample order, augmentation and weight init seed")
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--kvstore", default=None,
                   help="MXNet kvstore: dist_sync for multi-worker training (launched with "
                        "tools/launch.py or the DMLC_* environment); default: one process")
    p.add_argument("--horovod", action="store_true", help="data-parallel over Horovod")
    p.add_argument("--checkpoint", metavar="PREFIX",
                   help="save PREFIX.params/.states/.json (model, optimizer, sampler position)")
    p.add_argument("--checkpoint-every", type=int, default=0,
                   help="also save every N iterations (0: only at the end)")
    p.add_argument("--resume", metavar="PREFIX", help="continue from a --checkpoint")
    p.add_argument("--log-dir", help="write rank<R>.json (results) and samples.rank<R>.jsonl "
                                     "(every trained sample: epoch, index, pad, checksums)")
    args = p.parse_args(argv)
    if args.horovod and args.kvstore:
        p.error("--horovod and --kvstore are exclusive")
    return args


SMALL_BACKBONES = ("resnet18", "resnet34")  # basic blocks: 512 channels out, not 2048


class TinySegNet(gluon.HybridBlock):
    """Two 3x3 convolutions returning ``(scores,)`` like gluoncv's models (pipeline checks)."""

    def __init__(self, nclass):
        super().__init__()
        with self.name_scope():
            self.body = gluon.nn.HybridSequential()
            self.body.add(gluon.nn.Conv2D(8, 3, padding=1, activation="relu"),
                          gluon.nn.Conv2D(nclass, 3, padding=1))

    def hybrid_forward(self, F, x):
        return (self.body(x),)


def build_model(name, backbone, nclass, base_size, crop_size):
    """gluoncv's FCN / DeepLabV3, randomly initialised. gluoncv sizes the FCN head for the
    2048 channels of ResNet-50 and deeper; for ResNet-18/34 the same head is built for 512."""
    import warnings
    if name == "tiny":
        return TinySegNet(nclass)
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
    """Single-process validation: gluoncv's SegmentationMetric over the whole set."""
    from gluoncv.utils.metrics import SegmentationMetric
    metric = SegmentationMetric(nclass)
    loader = gluon.data.DataLoader(dataset, batch_size, num_workers=workers,
                                   batchify_fn=SegmentationBatchify(channels_first=True))
    for data, target in loader:
        metric.update(target, model(data)[0])
    return metric.get()


class World:
    """Who this process is: rank, number of workers, and how gradients and metrics travel."""

    def __init__(self, args):
        self.kv, self.hvd = None, None
        self.rank, self.size = 0, 1
        if args.horovod:
            try:
                import horovod.mxnet as hvd
            except ImportError as exc:
                raise SystemExit("error: --horovod needs horovod.mxnet (%s); see README, "
                                 "'Distributed training'" % exc)
            hvd.init()
            self.hvd, self.rank, self.size = hvd, hvd.rank(), hvd.size()
        elif args.kvstore:
            self.kv = mx.kv.create(args.kvstore)
            self.rank, self.size = self.kv.rank, self.kv.num_workers

    @property
    def distributed(self):
        return self.size > 1 or self.hvd is not None

    def trainer(self, params, opts):
        if self.hvd is not None:
            self.hvd.broadcast_parameters(params, root_rank=0)
            return self.hvd.DistributedTrainer(params, "sgd", opts)
        if self.kv is not None:
            # MXNet's default for dist stores: the servers run the optimizer. (With
            # update_on_kvstore=False, MXNet 1.9.1's Trainer gave run-to-run different
            # weights on dist_sync here: benchmarks/probe_update_on_kvstore.py.)
            return gluon.Trainer(params, "sgd", opts, kvstore=self.kv)
        return gluon.Trainer(params, "sgd", opts)

    @property
    def servers_update(self):
        """The kvstore's servers hold the optimizer (and its state)."""
        return self.kv is not None and "dist" in self.kv.type

    def step_size(self, batch_size, rows):
        """Trainer.step's argument. dist servers sum gradients over workers, and keep the
        normalisation of the first step (MXNet sends the optimizer once): always the
        global batch. Horovod's trainer averages over ranks: this rank's rows."""
        return batch_size * self.size if self.servers_update else rows

    def sampler(self, length, **options):
        return DistributedSampler(length, num_replicas=self.size, rank=self.rank, **options)


def _atomic(path, write):
    tmp = "%s.tmp%d" % (path, os.getpid())
    write(tmp)
    os.replace(tmp, path)


def save_checkpoint(prefix, model, trainer, sampler, batches_done, iteration, states=True):
    """Model, optimizer state and the sampler position after ``batches_done`` batches of the
    current pass (every file replaced atomically; the .json last). ``states=False`` when the
    optimizer state lives on dist kvstore servers, which MXNet cannot save from a worker:
    a resumed run then restarts the momentum."""
    state = {"iteration": iteration, "sampler": sampler.state_dict(batches_done=batches_done),
             "optimizer_states": bool(states)}
    _atomic(prefix + ".params", model.save_parameters)
    if states:
        _atomic(prefix + ".states", trainer.save_states)

    def write_json(path):
        with open(path, "w") as f:
            json.dump(state, f)
    _atomic(prefix + ".json", write_json)


def load_checkpoint(prefix, model, trainer, sampler, states=True):
    """Restore what :func:`save_checkpoint` saved; returns the iteration. ``states=False``
    (dist kvstore servers hold the optimizer) skips the optimizer state."""
    with open(prefix + ".json") as f:
        state = json.load(f)
    model.load_parameters(prefix + ".params")
    if states and state.get("optimizer_states", True):
        trainer.load_states(prefix + ".states")
    sampler.load_state_dict(state["sampler"])
    return int(state["iteration"])


def _crc(array):
    return zlib.crc32(np.ascontiguousarray(array).tobytes())


def main(argv=None):
    args = parse_args(argv)
    world = World(args)
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
    sampler = world.sampler(len(trainset), shuffle=True, seed=args.seed,
                            batch_size=args.batch_size)
    batches = sampler.batch_sampler()
    loader = gluon.data.DataLoader(trainset, batch_sampler=batches, num_workers=args.workers,
                                   batchify_fn=SegmentationBatchify(channels_first=True))
    nclass = trainset.num_class
    model = build_model(args.model, args.backbone, nclass, args.base_size, args.crop_size)
    model.initialize(mx.init.Xavier())
    criterion = MixSoftmaxCrossEntropyLoss(aux=False, ignore_label=-1)
    trainer = world.trainer(model.collect_params(),
                            {"learning_rate": args.lr, "momentum": 0.9, "wd": 1e-4})
    it = (load_checkpoint(args.resume, model, trainer, sampler, not world.servers_update)
          if args.resume else 0)
    metric = SegmentationMetric(nclass)
    log = None
    if args.log_dir:
        os.makedirs(args.log_dir, exist_ok=True)
        log = open(os.path.join(args.log_dir, "samples.rank%d.jsonl" % world.rank), "a")
    if world.rank == 0:
        print("training %s/%s on %r (%d classes), crop %d, batch %d x %d ranks, %d workers%s"
              % (args.model, args.backbone, trainset, nclass, args.crop_size, args.batch_size,
                 world.size, args.workers,
                 ", resumed at epoch %d, sample %d" % (sampler.epoch, sampler.consumed)
                 if args.resume else ""), flush=True)

    def finished(epoch):
        return epoch >= args.epochs if args.epochs is not None else it >= args.iters

    epoch, seen, t0, loss_value = sampler.epoch, 0, time.perf_counter(), float("nan")
    done, stopped = 0, False
    while not finished(epoch):
        sampler.set_epoch(epoch)
        done = 0
        for keys, (data, target) in zip(batches, loader):
            with autograd.record(True):
                outputs = model(data)
                losses = criterion(*outputs, target)
            losses.backward()
            trainer.step(world.step_size(args.batch_size, data.shape[0]))
            loss_value = float(losses.mean().asscalar())
            metric.update(target, outputs[0])
            it, done, seen = it + 1, done + 1, seen + data.shape[0]
            if log is not None:
                d, t = data.asnumpy(), target.asnumpy()
                for row, k in enumerate(keys):
                    log.write(json.dumps({"epoch": k.epoch, "index": k.index, "pad": k.pad,
                                          "iteration": it, "image": _crc(d[row]),
                                          "mask": _crc(t[row])}) + "\n")
            if world.rank == 0 and (it % args.log_every == 0 or it == args.iters):
                pix_acc, miou = metric.get()
                print("iter %4d  loss %.4f  pixAcc %.4f  mIoU %.4f  %.1f samples/s"
                      % (it, loss_value, pix_acc, miou, seen / (time.perf_counter() - t0)),
                      flush=True)
            if args.checkpoint and args.checkpoint_every and \
                    it % args.checkpoint_every == 0 and world.rank == 0:
                save_checkpoint(args.checkpoint, model, trainer, sampler, done, it,
                                not world.servers_update)
            if args.epochs is None and it >= args.iters:
                stopped = True
                break
        if stopped:
            break
        epoch += 1
    if log is not None:
        log.close()
    if args.checkpoint and world.rank == 0:
        save_checkpoint(args.checkpoint, model, trainer, sampler, done, it,
                        not world.servers_update)
    if not np.isfinite(loss_value):
        print("error: the loss is not finite (%r)" % loss_value, file=sys.stderr)
        return 1
    report = {"rank": world.rank, "world": world.size, "iterations": it, "loss": loss_value}
    if args.val_data:
        valset = open_dataset(args.val_data, args.val_split, mode="val",
                              crop_size=args.crop_size, transform=input_transform)
        if world.distributed:
            from gluon_data.distributed import evaluate_segmentation
            val_sampler = world.sampler(len(valset), shuffle=False, batch_size=args.batch_size)
            pix_acc, miou, count = evaluate_segmentation(
                lambda x: model(x)[0], valset, val_sampler, kvstore=world.kv,
                horovod=world.hvd is not None, num_workers=args.workers,
                batchify_fn=SegmentationBatchify(channels_first=True))
        else:
            pix_acc, miou = evaluate(model, valset, args.batch_size, args.workers, nclass)
            count = len(valset)
        report["val"] = {"pixAcc": pix_acc, "mIoU": miou, "samples": count}
        if world.rank == 0:
            print("validation on %d samples: pixAcc %.4f  mIoU %.4f" % (count, pix_acc, miou))
    if args.log_dir:
        with open(os.path.join(args.log_dir, "rank%d.json" % world.rank), "w") as f:
            json.dump(report, f)
    return 0


def run(argv=None):
    """``main``, but a failed dist_sync worker exits at once: a Python exit would wait in
    MXNet's kvstore exit barrier for the other workers, which wait for this one."""
    try:
        return main(argv)
    except BaseException as exc:
        if isinstance(exc, SystemExit) or "DMLC_ROLE" not in os.environ:
            raise
        import traceback
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)


if __name__ == "__main__":
    sys.exit(run())
