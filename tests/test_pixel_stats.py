"""A conversion's pixel statistics (the dataset's mean and std): exact, with the optional C
routine (``gluon_data/convert/_moments.c``) and without it."""
import numpy as np
import pytest

from gluon_data.convert import encode


@pytest.mark.parametrize("shape", [(375, 500, 3), (7, 13, 3), (1, 1, 3), (31, 17), (1, 47, 3),
                                   (64, 64, 4)])
def test_pixel_statistics_are_exact_with_the_c_routine_and_without(shape, monkeypatch):
    """The conversion's per-channel sums and sums of squares (the dataset's mean and std):
    the optional C routine and OpenCV's histograms give the same exact integers as numpy in
    int64, for sizes that are and are not whole 48-byte blocks."""
    rgb = np.random.default_rng(sum(shape)).integers(0, 256, shape, dtype=np.uint8)
    flat = rgb.reshape(-1, shape[2] if len(shape) == 3 else 1).astype(np.int64)
    want = (flat.shape[0], flat.sum(0).tolist(), (flat * flat).sum(0).tolist())
    if encode._moments is None:
        pytest.skip("the optional C routine is not built (no C compiler at install)")
    got = {}
    encode._pixel_stats(rgb, got)
    monkeypatch.setattr(encode, "_moments", None)
    fallback = {}
    encode._pixel_stats(rgb, fallback)
    assert got["pix"] == fallback["pix"] == want
    assert all(type(v) is float for v in got["pix"][1] + got["pix"][2])  # as the metadata had


def test_pixel_statistics_of_a_large_bright_image_do_not_overflow():
    """More than 4096 blocks of 48 bytes at 255 (the C routine's 32-bit lanes are emptied
    every 4096 blocks), from a strided view (made contiguous first)."""
    if encode._moments is None:
        pytest.skip("the optional C routine is not built (no C compiler at install)")
    rgb = np.full((1200, 2000, 3), 255, np.uint8)[::2, ::-1]
    got = {}
    encode._pixel_stats(rgb, got)
    n = 600 * 2000
    assert got["pix"] == (n, [255.0 * n] * 3, [65025.0 * n] * 3)
    with pytest.raises(ValueError, match="2-byte items"):
        encode._moments.moments(np.zeros((4, 3), np.uint16), 3)
    with pytest.raises(ValueError, match="whole pixels"):
        encode._moments.moments(np.zeros(7, np.uint8), 3)
    with pytest.raises(ValueError, match="channels must be 1 to 4"):
        encode._moments.moments(np.zeros(10, np.uint8), 5)
