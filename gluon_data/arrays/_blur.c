/* The optional C routine of the Gaussian blur of uint8 images (gluon_data/arrays/blur.py):
 * the pixels of OpenCV 4's cv2.GaussianBlur on 8-bit images, in integer arithmetic.
 *
 * gaussian(src, dst, height, width, channels, kernel) -> None
 *
 *   src, dst  C-contiguous buffers of height * width * channels uint8 samples (HxWxC); not
 *             the same memory
 *   kernel    OpenCV's 8-bit fixed-point kernel, half of it, the centre first: k[0] the
 *             centre tap, k[d] the taps at distance d (the kernel sums to 256)
 *
 * OpenCV 4 blurs an 8-bit image with that kernel in fixed point: the horizontal pass sums
 * tap * sample exactly (8 fraction bits, at most 256 * 255), the vertical pass sums tap *
 * that exactly (16 fraction bits), and each output is rounded half up, (sum + 2^15) >> 16.
 * Every step is exact integer arithmetic, so the order of the passes does not change a
 * sum: this routine runs the vertical pass first (one output row at a time, on contiguous
 * rows, in 16-bit lanes) and then the horizontal one (32-bit lanes), each a loop a
 * compiler turns into vector operations. Borders are OpenCV's default, BORDER_REFLECT_101
 * (... 2 1 | 0 1 2 ...), which needs the radius to be under the height and the width.
 *
 * Raises ValueError for buffers of another size, a radius over 5 (11 taps) or not under
 * the image's height and width, a kernel that does not sum to 256; MemoryError without memory.
 * No library beyond Python's own.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>

#define MAX_RADIUS 5

/* x86-64 Linux with GCC: the row loops also in an AVX2 version, chosen at load time. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define VECTOR_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define VECTOR_CLONES
#endif

/* One output row, both passes, for a radius R known where it is inlined (the tap loops then
 * unroll and each pass is one vector loop of 16-bit lanes): rows[d] is source row y + d - R.
 * The vertical sums V (at most 256 * 255) are kept as their high and low bytes, hi and lo,
 * each with R pixels of margin each side, so that the horizontal pass also sums in 16 bits:
 * with A = sum k * hi and B = sum k * lo (each at most 256 * 255), the exact 32-bit sum is
 * S = 256 A + B, and (S + 2^15) >> 16 = (A + 128 + (B >> 8)) >> 8, where A + (B >> 8) is at
 * most S / 256 <= 65280 (no 16-bit overflow). */
static inline __attribute__((always_inline)) void
blur_row(const uint8_t *const *rows, uint8_t *restrict out, Py_ssize_t w, Py_ssize_t c,
         const uint16_t *k, const int R, uint8_t *restrict hi, uint8_t *restrict lo)
{
    Py_ssize_t n = w * c, i, ch;
    int d;
    for (i = 0; i < n; i++) {  /* exact: every partial sum is at most 256 * 255 */
        uint16_t s = (uint16_t)(k[0] * rows[R][i]);
        for (d = 1; d <= R; d++) {
            s = (uint16_t)(s + (uint16_t)(k[d] * (uint16_t)(rows[R - d][i] + rows[R + d][i])));
        }
        hi[i] = (uint8_t)(s >> 8);
        lo[i] = (uint8_t)s;
    }
    for (d = 1; d <= R; d++) {  /* reflect-101 margins of the row */
        for (ch = 0; ch < c; ch++) {
            hi[-d * c + ch] = hi[d * c + ch];
            hi[(w - 1 + d) * c + ch] = hi[(w - 1 - d) * c + ch];
            lo[-d * c + ch] = lo[d * c + ch];
            lo[(w - 1 + d) * c + ch] = lo[(w - 1 - d) * c + ch];
        }
    }
    for (i = 0; i < n; i++) {
        uint16_t a = (uint16_t)(k[0] * hi[i]), b = (uint16_t)(k[0] * lo[i]);
        for (d = 1; d <= R; d++) {
            a = (uint16_t)(a + (uint16_t)(k[d] * (uint16_t)(hi[i - d * c] + hi[i + d * c])));
            b = (uint16_t)(b + (uint16_t)(k[d] * (uint16_t)(lo[i - d * c] + lo[i + d * c])));
        }
        out[i] = (uint8_t)((uint16_t)(a + 128 + (b >> 8)) >> 8);
    }
}

/* Reflect-101 row index: valid for -h < y < 2h - 1 (the radius is under the height). */
static Py_ssize_t
reflect(Py_ssize_t y, Py_ssize_t h)
{
    if (y < 0) {
        return -y;
    }
    if (y >= h) {
        return 2 * h - 2 - y;
    }
    return y;
}

#define ROWS_OF_RADIUS(R)                                                   \
    static VECTOR_CLONES void                                               \
    rows_##R(const uint8_t *src, uint8_t *dst, Py_ssize_t h, Py_ssize_t w,  \
             Py_ssize_t c, const uint16_t *k, uint8_t *hi, uint8_t *lo)     \
    {                                                                       \
        const uint8_t *rows[2 * (R) + 1];                                   \
        Py_ssize_t y, n = w * c;                                            \
        int d;                                                              \
        for (y = 0; y < h; y++) {                                           \
            for (d = -(R); d <= (R); d++) {                                 \
                rows[d + (R)] = src + reflect(y + d, h) * n;                \
            }                                                               \
            blur_row(rows, dst + y * n, w, c, k, (R), hi + (R) * c,         \
                     lo + (R) * c);                                         \
        }                                                                   \
    }

ROWS_OF_RADIUS(0)
ROWS_OF_RADIUS(1)
ROWS_OF_RADIUS(2)
ROWS_OF_RADIUS(3)
ROWS_OF_RADIUS(4)
ROWS_OF_RADIUS(5)

static void
blur_rows(const uint8_t *src, uint8_t *dst, Py_ssize_t h, Py_ssize_t w, Py_ssize_t c,
          const uint16_t *k, int r, uint8_t *hi, uint8_t *lo)
{
    switch (r) {
    case 0: rows_0(src, dst, h, w, c, k, hi, lo); break;
    case 1: rows_1(src, dst, h, w, c, k, hi, lo); break;
    case 2: rows_2(src, dst, h, w, c, k, hi, lo); break;
    case 3: rows_3(src, dst, h, w, c, k, hi, lo); break;
    case 4: rows_4(src, dst, h, w, c, k, hi, lo); break;
    default: rows_5(src, dst, h, w, c, k, hi, lo); break;
    }
}

static PyObject *
gaussian(PyObject *self, PyObject *args)
{
    PyObject *src_obj, *dst_obj, *kernel_obj, *seq = NULL;
    Py_buffer src, dst;
    Py_ssize_t h, w, c, taps, j;
    uint16_t k[MAX_RADIUS + 1];
    long total = 0;
    uint8_t *bytes = NULL;
    Py_ssize_t row;
    int r;
    if (!PyArg_ParseTuple(args, "OOnnnO", &src_obj, &dst_obj, &h, &w, &c, &kernel_obj)) {
        return NULL;
    }
    seq = PySequence_Fast(kernel_obj, "kernel must be a sequence of ints");
    if (seq == NULL) {
        return NULL;
    }
    taps = PySequence_Fast_GET_SIZE(seq);
    if (taps < 1 || taps > MAX_RADIUS + 1) {
        Py_DECREF(seq);
        PyErr_Format(PyExc_ValueError, "a half kernel of 1 to %d taps, got %zd",
                     MAX_RADIUS + 1, taps);
        return NULL;
    }
    for (j = 0; j < taps; j++) {
        long t = PyLong_AsLong(PySequence_Fast_GET_ITEM(seq, j));
        if (t == -1 && PyErr_Occurred()) {
            Py_DECREF(seq);
            return NULL;
        }
        if (t < 0 || t > 256) {
            Py_DECREF(seq);
            PyErr_Format(PyExc_ValueError, "kernel tap %ld is not in [0, 256]", t);
            return NULL;
        }
        k[j] = (uint16_t)t;
        total += j ? 2 * t : t;
    }
    Py_DECREF(seq);
    r = (int)(taps - 1);
    if (total != 256) {
        PyErr_Format(PyExc_ValueError, "the kernel sums to %ld, not 256", total);
        return NULL;
    }
    if (h < 1 || w < 1 || c < 1 || r >= h || r >= w) {
        PyErr_Format(PyExc_ValueError, "a %zdx%zdx%zd image is too small for a radius of %d",
                     h, w, c, r);
        return NULL;
    }
    if (PyObject_GetBuffer(src_obj, &src, PyBUF_C_CONTIGUOUS) < 0) {
        return NULL;
    }
    if (PyObject_GetBuffer(dst_obj, &dst, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&src);
        return NULL;
    }
    if (src.itemsize != 1 || dst.itemsize != 1 || src.len != h * w * c || dst.len != src.len) {
        PyErr_Format(PyExc_ValueError, "buffers of %zd and %zd bytes for a %zdx%zdx%zd uint8 "
                     "image", src.len, dst.len, h, w, c);
        goto fail;
    }
    if ((const char *)src.buf < (const char *)dst.buf + dst.len
            && (const char *)dst.buf < (const char *)src.buf + src.len) {
        PyErr_SetString(PyExc_ValueError, "src and dst overlap");
        goto fail;
    }
    row = (w + 2 * r) * c;  /* a row's high bytes, then its low bytes, with margins */
    bytes = (uint8_t *)malloc((size_t)(2 * row));
    if (bytes == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    Py_BEGIN_ALLOW_THREADS
    blur_rows((const uint8_t *)src.buf, (uint8_t *)dst.buf, h, w, c, k, r, bytes,
              bytes + row);
    Py_END_ALLOW_THREADS
    free(bytes);
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    Py_RETURN_NONE;
fail:
    free(bytes);
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    return NULL;
}

static PyMethodDef methods[] = {
    {"gaussian", gaussian, METH_VARARGS,
     "gaussian(src, dst, height, width, channels, kernel) -> None: OpenCV 4's 8-bit "
     "Gaussian blur of an HxWxC uint8 image into dst, with a half fixed-point kernel"},
    {NULL, NULL, 0, NULL}
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_blur",
    "OpenCV 4's 8-bit Gaussian blur in integer arithmetic (optional; see blur.py).",
    -1, methods, NULL, NULL, NULL, NULL
};

PyMODINIT_FUNC
PyInit__blur(void)
{
    return PyModule_Create(&module);
}
