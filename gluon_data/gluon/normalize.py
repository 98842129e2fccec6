"""The consumer's half of ``output="uint8"``: :class:`InputNormalize`, a Gluon block that
turns a uint8 NCHW batch into the float32 tensor ``ToTensor`` + ``Normalize`` make.

As DALI and FFCV do, the DataLoader workers then deliver uint8 images (a quarter of the
bytes of float32, no arithmetic per sample) and the normalisation runs once per batch where
the model runs: on the GPU after ``batch.as_in_context(ctx)``, or as the model's first block.
"""
from __future__ import annotations

import mxnet as mx
import numpy as np

from .buffers import host_view
from ..arrays.tensorize import ToTensorNormalize

__all__ = ["InputNormalize"]


class InputNormalize(mx.gluon.HybridBlock):
    """uint8 NCHW batch -> float32 NCHW ``(x / 255 - mean) / std``, on the batch's context.

    It runs Gluon's ``ToTensor`` and ``Normalize(mean, std)`` operators on the batch, so a
    batch from ``output="uint8"`` gives the values the float32 path gives (the datasets'
    numpy fast path of those transforms), to the bit on CPU. Put it
    first in your model, or call it on the batch after ``as_in_context(ctx)``; it holds no
    parameters (nothing to initialise) and hybridizes and exports like any block. Called
    eagerly (not hybridized) on a CPU NDArray, it computes the same values by one table
    lookup per image plane (as the float32 path's workers do), about 3x cheaper than the
    operators on CPU: without a GPU, leave it unhybridized.

    Parameters
    ----------
    mean, std : float or sequence of float
        Per channel (one value: every channel), as for Gluon's ``Normalize``; the default is
        ImageNet's, as gluoncv's recipes use.

    Examples
    --------
    >>> import mxnet as mx
    >>> norm = InputNormalize(mean=0.5, std=0.5)
    >>> norm(mx.nd.full((1, 3, 2, 2), 255, dtype="uint8"))[0, :, 0, 0].asnumpy().tolist()
    [1.0, 1.0, 1.0]
    """

    def __init__(self, mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225), **kwargs):
        super().__init__(**kwargs)
        m = np.asarray(mean, np.float32).reshape(-1)
        s = np.asarray(std, np.float32).reshape(-1)
        if m.size == 0 or s.size == 0 or (m.size != s.size and 1 not in (m.size, s.size)):
            raise ValueError("mean and std need one value or one per channel, got %d and %d"
                             % (m.size, s.size))
        if not (np.isfinite(m).all() and np.isfinite(s).all() and (s > 0).all()):
            raise ValueError("mean must be finite and std positive, got %s and %s"
                             % (m.tolist(), s.tolist()))
        n = max(m.size, s.size)
        self.mean = np.broadcast_to(m, (n,)).tolist()
        self.std = np.broadcast_to(s, (n,)).tolist()
        self._tables = ToTensorNormalize(m, s)

    def forward(self, x, *args):
        if isinstance(x, mx.nd.NDArray):  # checked here: a hybridized block sees symbols
            if x.dtype != np.uint8:
                raise TypeError("InputNormalize takes the uint8 batch of output='uint8' "
                                "datasets, got %s: this batch is converted already (do not "
                                "normalise twice)" % np.dtype(x.dtype).name)
            if x.ndim != 4 or len(self.mean) not in (1, x.shape[1]):
                raise ValueError("InputNormalize takes an NxCxHxW batch with %s channels, got "
                                 "shape %s (is the dataset's output='uint8' set?)"
                                 % ("any" if len(self.mean) == 1 else len(self.mean),
                                    x.shape))
            if (not self._active and not args
                    and x.context.device_type in ("cpu", "cpu_shared", "cpu_pinned")):
                return self._lookup(x)
        return super().forward(x, *args)

    def _lookup(self, x: mx.nd.NDArray) -> mx.nd.NDArray:
        """A CPU batch: the same values by one table lookup per plane (what the float32
        path's workers run), several times cheaper on CPU than the operators."""
        src = host_view(x)
        out = np.empty(src.shape, np.float32)
        return mx.nd.from_numpy(self._tables.planes(src, out), zero_copy=True)

    def hybrid_forward(self, F, x):
        # Gluon's own operators, so the values are Gluon's: ToTensor (``/ 255`` in float32)
        # on the N*C planes as 1-channel NHWC images (a reshape, no transpose), then
        # Normalize; one pass each, several times faster on CPU than broadcast arithmetic.
        # Gluon's Normalize takes 1 or 3 channels only, so any channel count the eager path
        # takes is normalised here too: one (mean, std) for all -> the N*C planes as
        # 1-channel images; 3 -> one call; any other count -> each channel on its own.
        planes = F.expand_dims(F.reshape(x, shape=(-3, -2)), axis=3)
        y = F.image.to_tensor(planes)  # (N*C, 1, H, W)
        k = len(self.mean)
        if k == 1:
            return F.reshape_like(F.image.normalize(y, mean=self.mean[0], std=self.std[0]), x)
        y = F.reshape_like(y, x)
        if k == 3:
            return F.image.normalize(y, mean=tuple(self.mean), std=tuple(self.std))
        parts = F.split(y, num_outputs=k, axis=1)
        return F.concat(*[F.image.normalize(parts[c], mean=self.mean[c], std=self.std[c])
                          for c in range(k)], dim=1)

    def __repr__(self):
        return "InputNormalize(mean=%s, std=%s)" % (self.mean, self.std)
