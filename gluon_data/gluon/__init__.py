"""The Gluon layer: NDArray datasets, batchify functions, ``DataLoader``, ``InputNormalize``,
distributed metrics and the launcher -- thin views over the framework-free core.

It needs MXNet 1.9.1, the last MXNet release, which installs on Python <= 3.11 with
numpy < 1.24 (``pip install gluon-data`` there brings it). On newer Pythons the core works
without it: ``gluon_data.arrays`` gives the same samples as numpy arrays, for any framework.
"""
import sys

try:
    import mxnet  # noqa: F401
except ImportError as _exc:  # pragma: no cover - the core lane runs without MXNet
    raise ImportError(
        "gluon_data's Gluon layer (datasets returning NDArrays, DataLoader, batchify, "
        "InputNormalize) needs MXNet, which is not importable here (%s). MXNet 1.9.1 installs "
        "on Python <= 3.11 with numpy < 1.24: `pip install gluon-data` on such a Python brings "
        "it (this is Python %d.%d). Without MXNet, read the same samples as numpy arrays with "
        "gluon_data.arrays.SegmentationDataset / ClassificationDataset."
        % (_exc, sys.version_info[0], sys.version_info[1])) from _exc
