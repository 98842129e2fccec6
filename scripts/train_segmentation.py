#!/usr/bin/env python
"""Train a gluoncv segmentation model (FCN or DeepLabV3) from a packed .rec or .lmdb (a path
or a URI: s3://...), on one process or data-parallel over an MXNet kvstore (dist_sync) or
Horovod.

The data side is gluoncv's own recipe (``scripts/segmentation/train.py``) with one change:
the dataset is ``SegmentationRecordDataset`` / ``SegmentationLMDBDataset`` in ``mode='train'``
instead of ``get_segmentation_dataset(...)``, and the batchify stacks crops in one step.
Batches come from a ``DistributedSampler``: one seeded order per epoch whatever the number of
workers, equal padded shards, and a resumable position saved with the model. Each epoch
prints a progress bar with an ETA, the loss, pixAcc and mIoU of the epoch and the throughput
of all ranks, validates (every --val-interval epochs) and, with --save-dir, saves
checkpoint.params (every epoch) and best.params (best validation mIoU).

A quick start that runs in about a minute on a CPU (the defaults are gluoncv's GPU recipe):

    gluon-data demo --workdir data
    python scripts/train_segmentation.py --data data/voc_train.rec --val-data data/voc_val.rec \\
        --base-size 160 --crop-size 128 --batch-size 4 --epochs 2 --save-dir runs/fcn
    # 2 workers on this machine (see docs/distributed.md):
    python -m gluon_data.gluon.launch -n 2 -s 1 -- python scripts/train_segmentation.py \\
        --kvstore dist_sync --data data/voc_train.rec --val-data data/voc_val.rec \\
        --base-size 160 --crop-size 128 --batch-size 4 --epochs 2 --save-dir runs/fcn-dist
    horovodrun --gloo -np 2 -H localhost:2 python scripts/train_segmentation.py --horovod ...

On a GPU: --ctx gpu --crop-size 480 --base-size 520 --batch-size 16 --pretrained-base.
Without --pretrained-base (no network needed) the backbone starts from scratch, so the numbers
only show that the pipeline trains.
"""
import argparse
import json
import os
import shutil
import sys
import threading
import time
import zlib

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon
from mxnet.gluon.data.vision import transforms

from gluon_data import DataLoader, DistributedSampler, SegmentationBatchify
from gluon_data.cli import storage_option_parser
from gluon_data.gluon.datasets import SegmentationDataset
from gluon_data.gluon.device import DeviceLoader
from gluon_data.storage.remotefs import parse_storage_options
from gluon_data.stores.base import is_uri, open_store
from gluon_data.tools.progress import progress_bar

LAUNCHER = "python -m gluon_data.gluon.launch"


class _Formatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    pass


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=_Formatter,
                                parents=[storage_option_parser()])  # as the CLI's commands
    p.add_argument("--data", required=True, help="training .rec or .lmdb (path or URI)")
    p.add_argument("--split", default="train", help="LMDB split to train on")
    p.add_argument("--val-data", help="validation .rec or .lmdb (evaluated in 'val' mode)")
    p.add_argument("--val-split", default="val", help="LMDB split to validate on")
    p.add_argument("--val-interval", type=int, default=1,
                   help="validate every N epochs (and after the last one)")
    p.add_argument("--model", choices=["fcn", "deeplab", "tiny"], default="fcn",
                   help="tiny: two 3x3 convolutions, for quick pipeline checks")
    p.add_argument("--backbone", default="resnet18",
                   help="resnet18, resnet34, resnet50, resnet101, resnet152")
    p.add_argument("--pretrained-base", action="store_true",
                   help="start the backbone from gluoncv's ImageNet weights (downloads them)")
    p.add_argument("--ctx", default="cpu", help="cpu, gpu (GPU 0; Horovod: the local rank's) "
                                                "or gpu:N")
    p.add_argument("--base-size", type=int, default=520,
                   help="train: long side scaled to [0.5, 2] x this before the crop")
    p.add_argument("--crop-size", type=int, default=480, help="training and validation crop")
    p.add_argument("--batch-size", type=int, default=8, help="per worker")
    p.add_argument("--workers", type=int, default=2, help="DataLoader worker processes")
    p.add_argument("--device-stage", action="store_true", help="workers draw, this process "
                   "decodes and augments the batch (on the GPU when one is present; docs/gpu.md)")
    p.add_argument("--iters", type=int, default=100,
                   help="training iterations (ignored with --epochs)")
    p.add_argument("--epochs", type=int, help="train this many epochs (instead of --iters)")
    p.add_argument("--lr", type=float, default=0.01, help="SGD learning rate (momentum 0.9)")
    p.add_argument("--seed", type=int, default=0,
                   help="sample order, augmentation and weight init seed")
    p.add_argument("--log-every", type=int, default=0,
                   help="also print a plain line every N iterations (0: only the bar)")
    p.add_argument("--kvstore", default=None,
                   help="MXNet kvstore: dist_sync for multi-worker training, launched with "
                        "%s or the DMLC_* environment (docs/distributed.md); "
                        "default: one process" % LAUNCHER)
    p.add_argument("--horovod", action="store_true", help="data-parallel over Horovod")
    p.add_argument("--stall-timeout", type=float, default=600.0,
                   help="distributed runs: exit with an error when no batch finishes for this "
                        "many seconds (a dead worker or server leaves the others waiting "
                        "forever); 0: wait forever")
    p.add_argument("--save-dir", help="save DIR/checkpoint.params/.states/.json every epoch "
                                      "and DIR/best.params/.json at the best validation mIoU")
    p.add_argument("--checkpoint", metavar="PREFIX",
                   help="save PREFIX.params/.states/.json (model, optimizer, sampler position) "
                        "at the end")
    p.add_argument("--checkpoint-every", type=int, default=0,
                   help="also save --checkpoint every N iterations (0: only at the end)")
    p.add_argument("--resume", metavar="PREFIX",
                   help="continue from a checkpoint (--checkpoint PREFIX, or DIR/checkpoint)")
    p.add_argument("--log-dir", help="write rank<R>.json (results) and samples.rank<R>.jsonl "
                                     "(every trained sample: epoch, index, pad, checksums; "
                                     "flushed every batch)")
    p.add_argument("--cache-dir", help="local cache of a URI's files (default: the gluon_data "
                                       "cache, $GLUON_DATA_CACHE_DIR)")
    p.add_argument("--cache-limit", help="bound on the cache's size, e.g. 20GB")
    args = p.parse_args(argv)
    if args.horovod and args.kvstore:
        p.error("--horovod and --kvstore are exclusive")
    if args.val_interval < 1:
        p.error("--val-interval must be >= 1")
    try:
        args.store_options = parse_storage_options(args.storage_option)
    except ValueError as exc:
        p.error(str(exc))
    return args


def store_options(args, location):
    """What ``open_store`` takes for ``location``: the remote options for a URI (as the
    ``gluon-data`` command passes them), nothing for a local path."""
    if not is_uri(location):
        return {}
    out = {"storage_options": args.store_options}
    if args.cache_dir:
        out["cache_dir"] = args.cache_dir
    if args.cache_limit:
        out["cache_limit"] = args.cache_limit
    return out


def open_dataset(args, location, split, **kwargs):
    return SegmentationDataset(open_store(location, split, **store_options(args, location)),
                               **kwargs)


def parse_ctx(value, world=None):
    """``cpu``, ``gpu`` (GPU 0, or Horovod's local rank) or ``gpu:N``."""
    kind, _, index = value.partition(":")
    if kind == "cpu" and not index:
        return mx.cpu()
    if kind == "gpu":
        if index:
            return mx.gpu(int(index))
        return mx.gpu(world.hvd.local_rank() if world is not None and world.hvd else 0)
    raise SystemExit("error: --ctx expects cpu, gpu or gpu:N, got %r" % value)


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


def build_model(name, backbone, nclass, base_size, crop_size, pretrained_base=False):
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
        return DeepLabV3(nclass, backbone=backbone, aux=False, pretrained_base=pretrained_base,
                         base_size=base_size, crop_size=crop_size)
    model = FCN(nclass, backbone=backbone, aux=False, pretrained_base=pretrained_base,
                base_size=base_size, crop_size=crop_size)
    if backbone in SMALL_BACKBONES:
        with model.name_scope():
            model.head = _FCNHead(512, nclass)
    warnings.filterwarnings("ignore", message=".*already initialized.*")
    return model


def evaluate(model, dataset, batch_size, workers, nclass, ctx=None, progress=None):
    """Single-process validation: gluoncv's SegmentationMetric over the whole set
    (``progress``: called once per batch)."""
    from gluoncv.utils.metrics import SegmentationMetric
    metric = SegmentationMetric(nclass)
    loader = DataLoader(dataset, batch_size, num_workers=workers,  # (a dead worker raises)
                        batchify_fn=SegmentationBatchify(channels_first=True))
    for data, target in loader:
        data = data if ctx is None else data.as_in_context(ctx)
        metric.update(target, model(data)[0].as_in_context(target.context))
        if progress is not None:
            progress()
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
                raise SystemExit("error: --horovod needs horovod.mxnet (%s); see docs/distributed.md, "
                                 "'Horovod'" % exc)
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


class Watchdog:
    """Ends a distributed worker that stops making progress. A dead worker or server leaves
    the others blocked in a kvstore call forever (ps-lite's PS_HEARTBEAT_* settings only
    mark a node dead for a replacement to take its place; nothing aborts), so every batch
    calls :meth:`beat`, and after ``seconds`` without one the process exits with an error."""

    def __init__(self, seconds):
        self.seconds, self.last, self.rank = seconds, time.monotonic(), "?"
        if seconds > 0:
            threading.Thread(target=self._watch, name="stall-watchdog", daemon=True).start()

    def beat(self):
        self.last = time.monotonic()

    def _watch(self):
        while True:
            time.sleep(min(5.0, self.seconds / 4))
            idle = time.monotonic() - self.last
            if idle > self.seconds:
                sys.stdout.flush()
                sys.stderr.write("\nerror: worker %s: no batch finished for %.0f s "
                                 "(--stall-timeout %g): another worker or a server has "
                                 "probably died; exiting\n" % (self.rank, idle, self.seconds))
                sys.stderr.flush()
                os._exit(1)


def _bar(world, total, desc):
    """gluoncv's progress bar (rank 0 only): count, ETA, rate; on stdout, in order with the
    epoch lines. The package's one progress bar: a terminal reporting 0x0 (docker, CI ptys)
    gets a fixed width instead of an invisible bar."""
    return progress_bar(total, desc, unit="batch", stdout=True, enabled=world.rank == 0)


def train_epoch(job, epoch, it, budget):
    """One pass (at most ``budget`` batches): returns ``(iterations, batches, loss)``.
    Prints the bar and the epoch line (rank 0); the throughput is every rank's real samples
    over rank 0's time."""
    args, world, metric = job["args"], job["world"], job["metric"]
    model, ctx, batches, log = job["model"], job["ctx"], job["batches"], job["log"]
    metric.reset()
    total = min(len(batches), budget)
    bar = _bar(world, total, "Epoch %d" % epoch + ("/%d" % args.epochs if args.epochs else ""))
    done, rows, real, loss_sum, loss_value = 0, 0, 0, 0.0, float("nan")
    t0 = time.perf_counter()
    for keys, (data, target) in zip(batches, job["loader"]):
        data, gpu_target = data.as_in_context(ctx), target.as_in_context(ctx)
        with autograd.record(True):
            outputs = model(data)
            losses = job["criterion"](*outputs, gpu_target)
        losses.backward()
        job["trainer"].step(world.step_size(args.batch_size, data.shape[0]))
        loss_value = float(losses.mean().asscalar())
        metric.update(target, outputs[0].as_in_context(target.context))
        it, done, rows = it + 1, done + 1, rows + data.shape[0]
        real += sum(not k.pad for k in keys)
        loss_sum += loss_value
        if log is not None:
            d, t = data.asnumpy(), target.asnumpy()
            log.write("".join(json.dumps({"epoch": k.epoch, "index": k.index, "pad": k.pad,
                                          "iteration": it, "image": _crc(d[row]),
                                          "mask": _crc(t[row])}) + "\n"
                              for row, k in enumerate(keys)))
            log.flush()  # a killed job's log holds every batch up to its last
        job["watchdog"].beat()
        if world.rank == 0:
            pix_acc, miou = metric.get()
            rate = rows * world.size / (time.perf_counter() - t0)
            bar.set_postfix_str("loss %.4f, pixAcc %.4f, mIoU %.4f, %.1f samples/s"
                                % (loss_sum / done, pix_acc, miou, rate), refresh=False)
            bar.update(1)
            if args.log_every and it % args.log_every == 0:
                bar.write("iter %4d  loss %.4f  pixAcc %.4f  mIoU %.4f  %.1f samples/s"
                          % (it, loss_value, pix_acc, miou, rate))
        if args.checkpoint and args.checkpoint_every and \
                it % args.checkpoint_every == 0 and world.rank == 0:
            save_checkpoint(args.checkpoint, model, job["trainer"], job["sampler"], done, it,
                            not world.servers_update)
        if done >= budget:
            break
    bar.close()
    elapsed = time.perf_counter() - t0
    if world.distributed:
        from gluon_data.gluon.distributed import allreduce_sum
        real = int(allreduce_sum([real], world.kv, horovod=world.hvd is not None)[0])
    if world.rank == 0:
        pix_acc, miou = metric.get()
        print("Epoch %d: %d iterations, loss %.4f, pixAcc %.4f, mIoU %.4f, %.1f samples/s "
              "(%d samples over %d ranks in %.1f s)"
              % (epoch, done, loss_sum / max(done, 1), pix_acc, miou, real / elapsed, real,
                 world.size, elapsed), flush=True)
    return it, done, loss_value


def validate(job, valset, epoch):
    """(pixAcc, mIoU, samples) on the whole validation set (exact over ranks), with a bar."""
    args, world, model, ctx = job["args"], job["world"], job["model"], job["ctx"]
    val_sampler = world.sampler(len(valset), shuffle=False, batch_size=args.batch_size)
    bar = _bar(world, val_sampler.num_batches if world.distributed
               else -(-len(valset) // args.batch_size), "Epoch %d validation" % epoch)

    def step():
        bar.update(1)
        job["watchdog"].beat()

    if world.distributed:
        from gluon_data.gluon.distributed import evaluate_segmentation

        def forward(x):
            scores = model(x.as_in_context(ctx))[0].as_in_context(x.context)
            step()
            return scores
        pix_acc, miou, count = evaluate_segmentation(
            forward, valset, val_sampler, kvstore=world.kv, horovod=world.hvd is not None,
            num_workers=args.workers, batchify_fn=SegmentationBatchify(channels_first=True))
    else:
        pix_acc, miou = evaluate(model, valset, args.batch_size, args.workers, valset.num_class,
                                 ctx, step)
        count = len(valset)
    bar.close()
    job["last_val"] = {"pixAcc": pix_acc, "mIoU": miou, "samples": count}
    if world.rank == 0:
        print("Epoch %d validation on %d samples: pixAcc %.4f  mIoU %.4f"
              % (epoch, count, pix_acc, miou), flush=True)
    return pix_acc, miou, count


class Saver:
    """``--save-dir``: DIR/checkpoint.* after every epoch (the model, optimizer and sampler
    position: ``--resume DIR/checkpoint``), DIR/best.params + best.json (epoch, iteration,
    pixAcc, mIoU) whenever the validation mIoU beats the best so far (with --resume: the
    best of the runs before too).
    Rank 0 writes; every file is replaced atomically."""

    def __init__(self, directory, world, resumed):
        self.dir, self.world = directory, world
        self.best = float("-inf")
        if world.rank == 0:
            os.makedirs(directory, exist_ok=True)
        if not resumed:  # a new run's first validation is its best so far
            return
        try:
            with open(os.path.join(directory, "best.json")) as f:
                self.best = float(json.load(f)["mIoU"])
        except (OSError, ValueError, KeyError):
            pass

    def save(self, job, batches_done, it, epoch, val):
        if self.world.rank != 0:
            return
        prefix = os.path.join(self.dir, "checkpoint")
        save_checkpoint(prefix, job["model"], job["trainer"], job["sampler"], batches_done, it,
                        not self.world.servers_update)
        saved = "saved %s.params" % prefix
        if val is not None and val[1] > self.best:
            self.best = val[1]
            best = os.path.join(self.dir, "best")
            _atomic(best + ".params", lambda tmp: shutil.copyfile(prefix + ".params", tmp))
            state = {"epoch": epoch, "iteration": it, "pixAcc": val[0], "mIoU": val[1]}

            def write_json(path):
                with open(path, "w") as f:
                    json.dump(state, f)
            _atomic(best + ".json", write_json)
            saved += ", %s.params (best mIoU %.4f)" % (best, val[1])
        print(saved, flush=True)


def setup(args, world, ctx, input_transform):
    """The training set, sampler, loader and model (initialised on ``ctx``)."""
    trainset = open_dataset(args, args.data, args.split, mode="train", base_size=args.base_size,
                            crop_size=args.crop_size, transform=input_transform,
                            seed=args.seed)
    sampler = world.sampler(len(trainset), shuffle=True, seed=args.seed,
                            batch_size=args.batch_size)
    batches = sampler.batch_sampler()
    # gluon_data's DataLoader: a worker killed (out of memory) raises WorkerDiedError at once,
    # where Gluon's waits for it forever
    loader = DeviceLoader(trainset, batch_sampler=batches, num_workers=args.workers) \
        if args.device_stage else DataLoader(trainset, batch_sampler=batches,
        num_workers=args.workers, batchify_fn=SegmentationBatchify(channels_first=True))
    model = build_model(args.model, args.backbone, trainset.num_class, args.base_size,
                        args.crop_size, args.pretrained_base)
    if len(trainset) == 0:
        raise SystemExit("error: %s has no samples to train on" % args.data)
    model.initialize(mx.init.Xavier(), ctx=ctx)  # (pretrained backbone weights are kept)
    model.collect_params().reset_ctx(ctx)
    return trainset, sampler, batches, loader, model


def main(argv=None):
    args = parse_args(argv)
    dist = args.horovod or "dist" in (args.kvstore or "")
    watchdog = Watchdog(args.stall_timeout if dist else 0)
    world = World(args)
    watchdog.rank = world.rank
    ctx = parse_ctx(args.ctx, world)
    mx.random.seed(args.seed)
    np.random.seed(args.seed)
    from gluoncv.loss import MixSoftmaxCrossEntropyLoss
    from gluoncv.utils.metrics import SegmentationMetric

    input_transform = transforms.Compose([
        transforms.ToTensor(),
        transforms.Normalize([.485, .456, .406], [.229, .224, .225]),
    ])
    trainset, sampler, batches, loader, model = setup(args, world, ctx, input_transform)
    trainer = world.trainer(model.collect_params(),
                            {"learning_rate": args.lr, "momentum": 0.9, "wd": 1e-4})
    it = (load_checkpoint(args.resume, model, trainer, sampler, not world.servers_update)
          if args.resume else 0)
    valset = (open_dataset(args, args.val_data, args.val_split, mode="val",
                           crop_size=args.crop_size, transform=input_transform)
              if args.val_data else None)
    job = dict(args=args, world=world, ctx=ctx, model=model, trainer=trainer, sampler=sampler,
               batches=batches, loader=loader, watchdog=watchdog, log=None,
               criterion=MixSoftmaxCrossEntropyLoss(aux=False, ignore_label=-1),
               metric=SegmentationMetric(trainset.num_class))
    if args.log_dir:
        os.makedirs(args.log_dir, exist_ok=True)
        job["log"] = open(os.path.join(args.log_dir, "samples.rank%d.jsonl" % world.rank), "a")
    saver = Saver(args.save_dir, world, bool(args.resume)) if args.save_dir else None
    if world.rank == 0:
        print("training %s/%s on %r (%d classes), crop %d, batch %d x %d ranks, %d workers, "
              "%s%s" % (args.model, args.backbone, trainset, trainset.num_class,
                        args.crop_size, args.batch_size, world.size, args.workers, ctx,
                        ", resumed at epoch %d, sample %d" % (sampler.epoch, sampler.consumed)
                        if args.resume else ""), flush=True)
    epoch, done, loss_value, val = sampler.epoch, 0, float("nan"), None
    while args.epochs is None and it < args.iters or args.epochs is not None and \
            epoch < args.epochs:
        sampler.set_epoch(epoch)
        if len(batches) == 0:  # resumed from the end of this epoch
            epoch += 1
            continue
        budget = len(batches) if args.epochs is not None else args.iters - it
        it, done, loss_value = train_epoch(job, epoch, it, budget)
        last = it >= args.iters if args.epochs is None else epoch + 1 >= args.epochs
        if valset is not None and ((epoch + 1) % args.val_interval == 0 or last):
            val = validate(job, valset, epoch)
        if saver is not None:
            saver.save(job, done, it, epoch, val if valset is not None else None)
        val = None
        if last:
            break
        epoch += 1
    if job["log"] is not None:
        job["log"].close()
    if args.checkpoint and world.rank == 0:
        save_checkpoint(args.checkpoint, model, trainer, sampler, done, it,
                        not world.servers_update)
    if not np.isfinite(loss_value):
        print("error: the loss is not finite (%r)" % loss_value, file=sys.stderr)
        return 1
    report = {"rank": world.rank, "world": world.size, "iterations": it, "loss": loss_value}
    if job.get("last_val") is not None:
        report["val"] = job["last_val"]
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
