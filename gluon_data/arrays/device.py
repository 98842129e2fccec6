"""The batch stage: a batch of :class:`~gluon_data.arrays.plan.SamplePlan` made into arrays,
on a GPU when one is present, on the CPU otherwise.

:class:`DeviceStage` decodes the batch's JPEGs on the device (nvImageCodec, else
``torchvision.io.decode_jpeg``: nvJPEG either way), applies each plan's geometry there (PyTorch
operators) and returns one batch of DLPack-capable arrays (``torch.from_dlpack``,
``jax.dlpack.from_dlpack``, ``mx.nd.from_dlpack`` take them). On the CPU it returns numpy
arrays equal to ``dataset[i]``, made by the dataset's own code (:func:`~gluon_data.arrays.plan.
replay`). A JPEG the device path does not read as the decoder of record does (see
:func:`device_decodable`), a sample whose transform only the CPU knows, or an image the device
decoder fails on goes through the CPU path, alone, with the CPU's pixels (or its typed error);
:attr:`DeviceStage.counts` says how many did.
"""
from __future__ import annotations

import os
from typing import Any, List, Optional, Sequence, Tuple, Union, cast

import cv2
import numpy as np

from ..format import codec
from ..format.decode import region_exact
from ..format.headers import JPEG_SOI, BytesLike
from .blur import kernel_size
from .datasets import ClassificationDataset, SegmentationDataset
from .plan import SamplePlan, image_output, replay
from .tensorize import to_numpy

__all__ = ["DeviceStage", "BACKENDS", "select_backend", "device_decodable", "GPU_EXTRA"]

#: The backends, preferred first. ``cpu`` is the decoder of record through the dataset's code.
BACKENDS = ("nvimgcodec", "torchvision", "cpu")
#: What to install for the GPU backends.
GPU_EXTRA = "pip install gluon-data[gpu]"
#: What each GPU backend needs installed, as its refusal says it.
_INSTALLS = {"nvimgcodec": "`%s` installs nvImageCodec and PyTorch" % GPU_EXTRA,
             "torchvision": "it needs torchvision, the CUDA build that matches your PyTorch "
                            "(`%s` installs PyTorch, not torchvision)" % GPU_EXTRA}
#: Overrides the automatic choice (one of :data:`BACKENDS`).
BACKEND_ENV = "GLUON_DATA_DEVICE_BACKEND"


def _torch():
    try:
        import torch
    except ImportError:
        return None
    return torch


def _cuda(torch) -> bool:
    return torch is not None and torch.cuda.is_available()


def _nvimgcodec():
    try:
        from nvidia import nvimgcodec
    except ImportError:
        return None
    return nvimgcodec


def _torchvision_io():
    try:
        from torchvision import io
    except ImportError:
        return None
    return io if hasattr(io, "decode_jpeg") else None


def select_backend(backend: Optional[str] = None) -> str:
    """The backend a stage uses: ``backend`` (or ``$GLUON_DATA_DEVICE_BACKEND``) when given,
    checked; else the first of :data:`BACKENDS` that is importable with a CUDA device
    present (PyTorch runs the geometry on the device, so both need a CUDA build of it).

    Raises
    ------
    RuntimeError
        A GPU backend asked for where it or a CUDA device is missing (naming
        :data:`GPU_EXTRA`); ``ValueError`` for an unknown name.
    """
    backend = backend or os.environ.get(BACKEND_ENV) or None
    if backend is not None and backend not in BACKENDS:
        raise ValueError("unknown device backend %r; valid backends: %s"
                         % (backend, ", ".join(BACKENDS)))
    if backend == "cpu":
        return backend
    torch = _torch()
    found = {"nvimgcodec": _nvimgcodec() is not None,
             "torchvision": _torchvision_io() is not None}
    if backend is not None:
        if not _cuda(torch) or not found[backend]:
            raise RuntimeError(
                "the %s backend decodes on a CUDA GPU, but %s: %s, and a CUDA device must be "
                "visible; or use backend='cpu'"
                % (backend, "no CUDA device is visible to PyTorch" if torch is not None and
                   found[backend] else "%s is not installed" % (
                       backend if torch is not None else "PyTorch"), _INSTALLS[backend]))
        return backend
    if _cuda(torch):
        for name in BACKENDS[:2]:
            if found[name]:
                return name
    return "cpu"


def _device_index(device: Any) -> int:
    """The CUDA device index ``device`` names: an index, ``"cuda"`` (0), ``"cuda:N"`` or a
    ``torch.device`` of CUDA; anything else is a ``ValueError`` saying what is taken."""
    if isinstance(device, int) and not isinstance(device, bool):
        index = device
    else:
        kind, _, number = str(device).partition(":")
        if kind != "cuda" or (number and not number.isdigit()):
            raise ValueError("device must name a CUDA device: an index (0), 'cuda' or "
                             "'cuda:N'; got %r" % (device,))
        index = int(number) if number else 0
    if index < 0:
        raise ValueError("device must name a CUDA device: an index of 0 or more; got %r"
                         % (device,))
    return index


def device_decodable(buf: BytesLike) -> bool:
    """Whether nvJPEG may decode these bytes for the stage: a JPEG the decoder of record reads
    and a second libjpeg-turbo reads identically (8-bit Huffman, baseline/extended/
    progressive, grey or a standard chroma layout: :func:`gluon_data.format.decode.
    region_exact`). Lossless frames and the sampling factors the decoder of record refuses
    go to the CPU path, which reads or refuses them as every read does."""
    return bytes(buf[:2]) == JPEG_SOI and region_exact(codec.jpeg_frame(bytes(buf)))


class DeviceStage:
    """Make a batch of plans into a batch of arrays, on the device (see the module docstring).

    Parameters
    ----------
    dataset : SegmentationDataset or ClassificationDataset
        The dataset the plans were drawn from (:class:`~gluon_data.arrays.plan.PlanDataset`).
    backend : {None, 'nvimgcodec', 'torchvision', 'cpu'}
        ``None``: :func:`select_backend`'s choice.
    device : int or str, default 0
        The CUDA device of a GPU backend: its index, ``"cuda"`` (device 0) or ``"cuda:N"``
        (a ``torch.device`` of CUDA too).

    Returns
    -------
    (images, targets)
        ``stage(plans)``: images stacked as the dataset returns one (HxWxC or CxHxW uint8, or
        CxHxW float32), masks stacked (int32) or labels (float32). numpy on the CPU; torch
        tensors on the device (DLPack-capable).

    Examples
    --------
    >>> from gluon_data.arrays import SegmentationDataset
    >>> from gluon_data.arrays.plan import PlanDataset
    >>> ds = SegmentationDataset("voc_train.rec", mode="train", base_size=40, crop_size=32,
    ...                          seed=0)
    >>> stage = DeviceStage(ds, backend="cpu")
    >>> images, masks = stage([PlanDataset(ds)[i] for i in range(4)])
    >>> images.shape, masks.dtype
    ((4, 32, 32, 3), dtype('int32'))
    """

    def __init__(self, dataset: Union[SegmentationDataset, ClassificationDataset],
                 backend: Optional[str] = None, device: Union[int, str] = 0) -> None:
        self.dataset = dataset
        self.backend = select_backend(backend)
        self.device = _device_index(device)
        self._where = "cuda:%d" % self.device  # the torch device of the GPU path
        self._layout = image_output(dataset)
        self._decoder: Any = None  # nvImageCodec's, made on first use
        #: Samples made on the device and on the CPU path (per item), since construction.
        self.counts = {"device": 0, "cpu": 0}

    @property
    def on_device(self) -> bool:
        """Whether the batches are made on a GPU."""
        return self.backend != "cpu"

    def __call__(self, plans: Sequence[SamplePlan]):
        plans = list(plans)
        if not plans:
            raise ValueError("an empty batch: give the stage at least one plan")
        if not self.on_device:
            samples = [replay(self.dataset, p) for p in plans]
            self.counts["cpu"] += len(plans)
            return _stack_numpy(samples)
        return self._device_batch(plans)

    # ------------------------------------------------------------------ the device path
    def _wanted(self, plan: SamplePlan) -> bool:
        return (plan.kind != "replay" and self._layout is not None
                and device_decodable(plan.image))

    def _decode(self, buffers: List[bytes]):
        """HxWx3 uint8 tensors on the device, ``None`` where the decoder failed."""
        torch = _torch()
        if self.backend == "nvimgcodec":
            nv = _nvimgcodec()
            if self._decoder is None:  # libjpeg-turbo's smooth chroma upsampling, as the
                self._decoder = nv.Decoder(device_id=self.device,  # decoder of record's
                                           options=":fancy_upsampling=1")
            params = nv.DecodeParams(apply_exif_orientation=False,  # as the decoder of record
                                     color_spec=nv.ColorSpec.RGB)
            stream = torch.cuda.current_stream(self.device).cuda_stream  # ordered with ours
            sources = ([nv.DecodeSource(b) for b in buffers] if hasattr(nv, "DecodeSource")
                       else buffers)  # (releases before 0.5 take the bytes)
            images = self._decoder.decode(sources, params=params, cuda_stream=stream)
            return [None if im is None else torch.as_tensor(im, device=self._where)
                    for im in images]
        io = _torchvision_io()
        data = [torch.frombuffer(bytearray(b), dtype=torch.uint8) for b in buffers]
        try:
            chw = io.decode_jpeg(data, mode=io.ImageReadMode.RGB, device=self._where)
        except RuntimeError:  # one bad stream fails the batch: decode one by one
            chw = []
            for d in data:
                try:
                    chw.append(io.decode_jpeg(d, mode=io.ImageReadMode.RGB,
                                              device=self._where))
                except RuntimeError:
                    chw.append(None)
        return [None if x is None else x.permute(1, 2, 0) for x in chw]

    def _device_batch(self, plans: List[SamplePlan]):
        torch = _torch()
        dev = torch.device(self._where)
        wanted = [j for j, p in enumerate(plans) if self._wanted(p)]
        decoded = dict(zip(wanted, self._decode([plans[j].image for j in wanted]))
                       ) if wanted else {}
        images, targets = [], []
        for j, plan in enumerate(plans):
            img = decoded.get(j)
            if img is None or tuple(img.shape[:2]) != tuple(
                    cast(Tuple[int, int], codec.image_size(plan.image))):  # a planned image's
                image, target = replay(self.dataset, plan)  # the CPU's pixels, or its error
                images.append(torch.from_numpy(np.ascontiguousarray(to_numpy(image))).to(dev))
                targets.append(to_numpy(target) if hasattr(target, "asnumpy") else target)
                self.counts["cpu"] += 1
                continue
            images.append(apply_geometry(img, plan, cast(Tuple, self._layout)))  # (wanted)
            targets.append(plan.mask if plan.mask is not None else plan.label)
            self.counts["device"] += 1
        return torch.stack(images), _targets(torch, targets, dev)


def _targets(torch, targets, dev):
    if isinstance(targets[0], str):  # mode="test": the names
        return list(targets)
    if isinstance(targets[0], np.ndarray) and targets[0].ndim == 2:
        return torch.from_numpy(np.stack(targets)).to(dev, non_blocking=True)
    return torch.from_numpy(np.asarray(targets, np.float32)).to(dev, non_blocking=True)


def _stack_numpy(samples):
    images = np.stack([to_numpy(s[0]) for s in samples])  # (a Gluon dataset's are NDArrays)
    second = [to_numpy(s[1]) if hasattr(s[1], "asnumpy") else s[1] for s in samples]
    if isinstance(second[0], np.ndarray) and second[0].ndim == 2:
        return images, np.stack(second)
    if isinstance(second[0], str):  # mode="test": the names
        return images, second
    return images, np.asarray(second, np.float32)


# ---------------------------------------------------------------------- geometry in torch
def _resize(torch, x, oh: int, ow: int, mode: str = "bilinear", antialias: bool = False):
    """CxHxW float -> CxOHxOW, rounded to uint8 levels (as OpenCV's uint8 output)."""
    if tuple(x.shape[1:]) == (oh, ow):
        return x
    kw = {} if mode in ("nearest", "area") else {"align_corners": False,
                                                   "antialias": antialias}
    y = torch.nn.functional.interpolate(x[None], size=(oh, ow), mode=mode, **kw)[0]
    return y.round().clamp_(0, 255)


def _fill(torch, x, fill):
    value = torch.as_tensor(np.asarray(fill, np.float32).reshape(-1), device=x.device)
    return value.reshape(-1, 1, 1).expand(x.shape[0], 1, 1) if value.numel() > 1 else value


def _pad(torch, x, th: int, tw: int, fill):
    """Pad bottom/right to at least ``th`` x ``tw`` with ``fill``."""
    c, h, w = x.shape
    if h >= th and w >= tw:
        return x
    out = torch.empty((c, max(h, th), max(w, tw)), dtype=x.dtype, device=x.device)
    out[:] = _fill(torch, out, fill)
    out[:, :h, :w] = x
    return out


def _blur(torch, x, sigma: float):
    """OpenCV's ``GaussianBlur(sigmaX=sigma)`` on a uint8 image: its kernel (size
    ``round(6 sigma + 1) | 1``), separable, mirrored border (``BORDER_REFLECT_101``)."""
    k = kernel_size(sigma)
    kern = torch.as_tensor(cv2.getGaussianKernel(k, sigma).reshape(-1).astype(np.float32),
                           device=x.device)
    p = k // 2
    c, h, w = x.shape
    mode = "reflect" if p < h and p < w else "replicate"
    y = torch.nn.functional.pad(x[None], (p, p, p, p), mode=mode)
    y = torch.nn.functional.conv2d(y, kern.reshape(1, 1, 1, k).expand(c, 1, 1, k), groups=c)
    y = torch.nn.functional.conv2d(y, kern.reshape(1, 1, k, 1).expand(c, 1, k, 1), groups=c)
    return y[0].round().clamp_(0, 255)


_MODES = {0: "nearest", 1: "bilinear", 2: "bicubic", 3: "area", 4: "bicubic"}


def _crop_resize(torch, x, plan: SamplePlan):
    """Classification: the box, resized as the recipe's interpolation (``mx.image``'s codes;
    9: by direction), flipped."""
    (y0, x0, y1, x1), flip, size, interp = plan.geometry
    x = x[:, y0:y1, x0:x1]
    if size is not None:
        (w, h), (sh, sw) = size, x.shape[1:]
        if interp == 9:
            interp = 2 if h > sh and w > sw else 3 if h < sh and w < sw else 1
        mode = _MODES.get(interp, "bilinear")
        if mode == "area" and (h > sh or w > sw):
            mode = "bilinear"
        x = _resize(torch, x, h, w, mode)
    return x.flip(2) if flip else x


def _train(torch, x, plan: SamplePlan):
    """Segmentation ``train``: box, resize to the drawn size, flip, pad, blur."""
    (y0, x0, y1, x1), (flip, vh, vw, blur, sigma), (ch, cw), fill = plan.geometry
    x = _resize(torch, x[:, y0:y1, x0:x1], vh, vw)
    if flip:
        x = x.flip(2)
    x = _pad(torch, x, ch, cw, fill)
    return _blur(torch, x, sigma) if blur else x


def _val(torch, x, plan: SamplePlan):
    """Segmentation ``val``: short side resized with an antialiasing bilinear filter
    (Pillow's), padded, centre crop."""
    oh, ow, size, fill = plan.geometry
    x = _pad(torch, _resize(torch, x, oh, ow, antialias=True), size, size, fill)
    h, w = x.shape[1:]
    x1, y1 = int(round((w - size) / 2.)), int(round((h - size) / 2.))
    return x[:, y1:y1 + size, x1:x1 + size]


def apply_geometry(img: Any, plan: SamplePlan, layout: Tuple) -> Any:
    """One decoded HxWx3 uint8 tensor (any torch device) -> the sample's image, laid out as
    ``layout`` (:func:`~gluon_data.arrays.plan.image_output`)."""
    torch = _torch()
    x = img.permute(2, 0, 1).float()
    x = {"train": _train, "val": _val, "crop": _crop_resize}[plan.kind](torch, x, plan)
    if layout[0] == "tensor":
        mean = torch.as_tensor(layout[1], device=x.device).reshape(-1, 1, 1)
        std = torch.as_tensor(layout[2], device=x.device).reshape(-1, 1, 1)
        return ((x / 255.0) - mean) / std  # float32 throughout, as the numpy tables
    x = x.to(torch.uint8)
    return x.contiguous() if layout[0] == "chw" else x.permute(1, 2, 0).contiguous()
