"""The consumer's half of ``output="uint8"``: :class:`InputNormalize`, a Gluon block that
turns a uint8 NCHW batch into the float32 tensor ``ToTensor`` + ``Normalize`` make.

As DALI and FFCV do, the DataLoader workers then deliver uint8 images (a quarter of the
bytes of float32, no arithmetic per sample) and the normalisation runs once per batch where
the model runs: on the GPU after ``batch.as_in_context(ctx)``, or as the model's first block.
"""
from __future__ import annotations

import mxnet as mx
import numpy as np

__all__ = ["InputNormalize"]


class InputNormalize(mx.gluon.HybridBlock):
    """uint8 NCHW batch -> float32 NCHW ``(x / 255 - mean) / std``, on the batch's context.

    The same float32 operations, in the same order, as Gluon's ``ToTensor`` then
    ``Normalize(mean, std)`` (and the datasets' numpy fast path of them), so a batch from
    ``output="uint8"`` gives the values the float32 path gives, to the bit on CPU. Put it
    first in your model, or call it on the batch after ``as_in_context(ctx)``; it holds no
    parameters (nothing to initialise) and hybridizes and exports like any block.

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
        self._ctx_consts = {}

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
        return super().forward(x, *args)

    def _consts(self, F, x):
        """mean and std as (1, C, 1, 1) float32 arrays (on ``x``'s context for NDArrays)."""
        shape = (1, len(self.mean), 1, 1)
        if F is mx.nd:
            key = x.context
            if key not in self._ctx_consts:
                self._ctx_consts[key] = tuple(
                    mx.nd.array(np.asarray(v, np.float32).reshape(shape), ctx=key,
                                dtype=np.float32) for v in (self.mean, self.std))
            return self._ctx_consts[key]
        return tuple(F.reshape(F.concat(*[F.full((1,), float(np.float32(v)), dtype="float32")
                                          for v in vals], dim=0), shape)
                     for vals in (self.mean, self.std))

    def hybrid_forward(self, F, x):
        mean, std = self._consts(F, x)
        y = F.cast(x, dtype="float32") / 255.0  # Gluon's ToTensor
        return F.broadcast_div(F.broadcast_sub(y, mean), std)  # Gluon's Normalize

    def __repr__(self):
        return "InputNormalize(mean=%s, std=%s)" % (self.mean, self.std)
