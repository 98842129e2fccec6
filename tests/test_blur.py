"""The Gaussian blur of ``train`` augmentation gives OpenCV's pixels, with the optional C
routine (``gluon_data/arrays/_blur.c``) and without it."""
import cv2
import numpy as np
import pytest

from gluon_data.arrays import blur
from gluon_data.arrays.scalecrop import RandomScaleCrop
from gluon_data.sampling.seeding import sample_context


def _opencv(img, sigma):
    return cv2.GaussianBlur(img, (0, 0), sigmaX=sigma)


def test_the_routine_is_built_and_used_where_ci_builds_it():
    """CI builds every extension (``GLUON_DATA_BUILD_EXT=1``): there the routine must be in
    use, or every test below would only compare OpenCV with itself."""
    if blur._blur is None:
        pytest.skip("the C routine is not built in this install")
    assert blur.EXACT_ROUTINE


@pytest.mark.parametrize("channels", [None, 1, 3, 4])
def test_the_same_pixels_as_opencv_for_every_sigma_and_size(channels):
    rng = np.random.default_rng(channels or 0)
    compared = 0
    for t in range(600):
        h, w = (int(v) for v in rng.integers(1, 40, 2))
        shape = (h, w) if channels is None else (h, w, channels)
        img = rng.integers(0, 256, shape, dtype=np.uint8)
        if t % 3 == 0:  # smooth regions as well as noise
            img = _opencv(img, 2.0)
        sigma = float(rng.uniform(0.01, 2.2))
        got, want = blur.gaussian_blur(img, sigma), _opencv(img, sigma)
        assert got.dtype == np.uint8 and got.shape == want.shape  # HxWx1 comes back HxW
        assert np.array_equal(got, want), (shape, sigma)
        compared += 1
    assert compared == 600


def test_the_kernel_size_edges_and_extreme_values():
    """Sigmas at the edges of each kernel size (6 sigma + 1 rounding half to even), images
    of one value (the largest sums), views and a Fortran-ordered image."""
    rng = np.random.default_rng(5)
    img = rng.integers(0, 256, (37, 41, 3), dtype=np.uint8)
    edges = [(k - 1) / 6.0 + d for k in (1.5, 2.5, 3.5, 4.5, 5.5, 6.5, 7.5)
             for d in (-1e-9, 0.0, 1e-9)]
    for sigma in edges + [0.0834, 0.4166, 0.75, 0.9166, 1.0, 1.75, 1.9]:
        for x in (img, np.full_like(img, 255), np.zeros_like(img), img[3:30, 5:33],
                  img[:, ::-1], np.asfortranarray(img[:, :, 0])):
            assert np.array_equal(blur.gaussian_blur(x, sigma), _opencv(x, sigma)), sigma


def test_the_fixed_point_kernel_is_what_opencv_blurs_with():
    """A one-pixel impulse of 255 in a field of zeros: OpenCV's output at distance (dy, dx)
    is ``round(k[dy] * k[dx] * 255 / 2**16)``; the kernel sums to 256, is symmetric and
    has ``kernel_size`` taps."""
    for sigma in (0.1, 0.3, 0.5, 0.7, 0.8, 0.95, 1.3, 1.7):
        half = blur.fixed_point_kernel(sigma)
        assert 2 * len(half) - 1 == blur.kernel_size(sigma)
        assert half[0] + 2 * sum(half[1:]) == 256
        img = np.zeros((21, 21), np.uint8)
        img[10, 10] = 255
        got = _opencv(img, sigma)
        r = len(half) - 1
        for dy in range(-r, r + 1):
            for dx in range(-r, r + 1):
                want = (half[abs(dy)] * half[abs(dx)] * 255 + 32768) >> 16
                assert got[10 + dy, 10 + dx] == want, (sigma, dy, dx)


def test_opencv_blurs_what_the_routine_does_not_take():
    """Other dtypes, a radius over 5, an image no wider than the radius, 0 or more than 4
    channels: OpenCV's own result (the same call); a sigma OpenCV refuses (infinite, not a
    number, huge) raises OpenCV's error."""
    rng = np.random.default_rng(2)
    cases = [(rng.random((20, 20, 3)).astype(np.float32), 0.8),
             (rng.integers(0, 4000, (20, 20), dtype=np.uint16), 0.8),
             (rng.integers(0, 256, (30, 30, 3), dtype=np.uint8), 2.5),
             (rng.integers(0, 256, (3, 30, 3), dtype=np.uint8), 0.9),
             (rng.integers(0, 256, (30, 2), dtype=np.uint8), 0.6),
             (rng.integers(0, 256, (20, 20, 5), dtype=np.uint8), 0.6)]
    for img, sigma in cases:
        got, want = blur.gaussian_blur(img, sigma), _opencv(img, sigma)
        assert got.shape == want.shape and np.array_equal(got, want), (img.shape, sigma)
    many = rng.integers(0, 256, (20, 20, 600), dtype=np.uint8)  # OpenCV 4 blurs, 5 raises
    try:
        want = _opencv(many, 0.6)
    except cv2.error:
        with pytest.raises(cv2.error):
            blur.gaussian_blur(many, 0.6)
    else:
        assert np.array_equal(blur.gaussian_blur(many, 0.6), want)
    for sigma in (float("inf"), float("nan"), 1e9):
        with pytest.raises(cv2.error):
            blur.gaussian_blur(rng.integers(0, 256, (20, 20, 3), dtype=np.uint8), sigma)


def test_the_routine_refuses_what_it_cannot_do():
    if blur._blur is None:
        pytest.skip("the C routine is not built in this install")
    img = np.zeros((10, 10, 3), np.uint8)
    out = np.empty_like(img)
    g = blur._blur.gaussian
    with pytest.raises(ValueError, match="sums to 255"):
        g(img, out, 10, 10, 3, (169, 42, 1))
    with pytest.raises(ValueError, match="1 to 6 taps"):
        g(img, out, 10, 10, 3, (256,) + (0,) * 6)
    with pytest.raises(ValueError, match="too small for a radius of 2"):
        g(img[:2], out[:2], 2, 10, 3, (170, 42, 1))
    with pytest.raises(ValueError, match="buffers of 300 and 300 bytes"):
        g(img, out, 10, 10, 4, (170, 42, 1))
    with pytest.raises(ValueError, match="overlap"):
        g(img, img, 10, 10, 3, (170, 42, 1))
    with pytest.raises(ValueError, match="not in"):
        g(img, out, 10, 10, 3, (300, -22))
    with pytest.raises(ValueError, match="not C-contiguous"):
        g(img, img.copy()[:, ::2], 10, 5, 3, (256,))


def test_train_augmentation_is_the_same_with_and_without_the_routine(monkeypatch):
    """The fused ``train`` transform, blurring every sample, gives the same images either
    way."""
    rng = np.random.default_rng(3)
    img = cv2.GaussianBlur(rng.integers(0, 256, (90, 120, 3), dtype=np.uint8), (0, 0), 3)
    mask = rng.integers(0, 5, (90, 120), dtype=np.uint8)
    t = RandomScaleCrop(base_size=100, crop_size=64, blur=1.0, seed=4)

    def run():
        outs = []
        for i in range(40):
            with sample_context(0, i):
                outs.append(t(img, mask))
        return outs

    fast = run()
    monkeypatch.setattr(blur, "EXACT_ROUTINE", False)
    slow = run()
    for (a, am), (b, bm) in zip(fast, slow):
        assert np.array_equal(a, b) and np.array_equal(am, bm)
