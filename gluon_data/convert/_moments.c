/* The optional C routine of a conversion's pixel statistics (gluon_data/convert/encode.py,
 * _pixel_stats): the same exact integers as the per-channel histograms it replaces, in one
 * pass over the pixels.
 *
 * moments(pixels, channels) -> (sums, squares)
 *
 *   pixels    a C-contiguous buffer of 1-byte (uint8) samples, channels interleaved (HxWxC)
 *   channels  1 to 4; the buffer's length a multiple of it
 *
 *   sums      a tuple of each channel's sum of samples (Python ints)
 *   squares   a tuple of each channel's sum of squared samples
 *
 * Exact for any size: 48-byte blocks (a multiple of every channel count) are added lane by
 * lane into 32-bit lanes, which a compiler turns into vector adds, emptied into 64-bit totals
 * every 4096 blocks (4096 * 255 * 255 < 2**32), then each lane folded into its channel.
 * Raises ValueError for another channel count, samples wider than a byte, or a buffer that
 * is not whole pixels.
 *
 * No library beyond Python's own.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#define LANES 48
#define FLUSH_BLOCKS 4096

static void
moments_of(const uint8_t *p, Py_ssize_t n, int c, uint64_t *sum, uint64_t *sq)
{
    uint64_t total[LANES] = {0}, total_sq[LANES] = {0};
    Py_ssize_t blocks = n / LANES, b = 0, i;
    int j;
    while (b < blocks) {
        uint32_t s[LANES] = {0}, q[LANES] = {0};
        Py_ssize_t end = blocks - b > FLUSH_BLOCKS ? b + FLUSH_BLOCKS : blocks;
        for (; b < end; b++) {
            const uint8_t *x = p + b * LANES;
            for (j = 0; j < LANES; j++) {
                uint32_t v = x[j];
                s[j] += v;
                q[j] += v * v;
            }
        }
        for (j = 0; j < LANES; j++) {
            total[j] += s[j];
            total_sq[j] += q[j];
        }
    }
    for (j = 0; j < c; j++) {
        sum[j] = 0;
        sq[j] = 0;
    }
    for (j = 0; j < LANES; j++) {
        sum[j % c] += total[j];
        sq[j % c] += total_sq[j];
    }
    for (i = blocks * LANES; i < n; i++) {
        uint64_t v = p[i];
        sum[i % c] += v;
        sq[i % c] += v * v;
    }
}

static PyObject *
moments(PyObject *self, PyObject *args)
{
    PyObject *obj, *sums = NULL, *squares = NULL, *out = NULL;
    Py_buffer view;
    int c, k;
    uint64_t sum[4], sq[4];
    if (!PyArg_ParseTuple(args, "Oi", &obj, &c)) {
        return NULL;
    }
    if (c < 1 || c > 4) {
        PyErr_Format(PyExc_ValueError, "channels must be 1 to 4, got %d", c);
        return NULL;
    }
    if (PyObject_GetBuffer(obj, &view, PyBUF_C_CONTIGUOUS) < 0) {
        return NULL;
    }
    if (view.itemsize != 1) {
        PyErr_Format(PyExc_ValueError, "pixels must be 1-byte samples, got %zd-byte items",
                     view.itemsize);
        PyBuffer_Release(&view);
        return NULL;
    }
    if (view.len % c) {
        PyErr_Format(PyExc_ValueError, "%zd bytes are not whole pixels of %d channels",
                     view.len, c);
        PyBuffer_Release(&view);
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    moments_of((const uint8_t *)view.buf, view.len, c, sum, sq);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    sums = PyTuple_New(c);
    squares = PyTuple_New(c);
    if (sums == NULL || squares == NULL) {
        goto done;
    }
    for (k = 0; k < c; k++) {
        PyObject *a = PyLong_FromUnsignedLongLong(sum[k]);
        PyObject *b = PyLong_FromUnsignedLongLong(sq[k]);
        if (a == NULL || b == NULL) {
            Py_XDECREF(a);
            Py_XDECREF(b);
            goto done;
        }
        PyTuple_SET_ITEM(sums, k, a);
        PyTuple_SET_ITEM(squares, k, b);
    }
    out = PyTuple_Pack(2, sums, squares);
done:
    Py_XDECREF(sums);
    Py_XDECREF(squares);
    return out;
}

static PyMethodDef methods[] = {
    {"moments", moments, METH_VARARGS,
     "moments(pixels, channels) -> (sums, squares): each channel's sum of uint8 samples and "
     "of their squares, exact"},
    {NULL, NULL, 0, NULL}
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_moments",
    "Per-channel sums of uint8 pixels and of their squares (optional; see encode.py).",
    -1, methods, NULL, NULL, NULL, NULL
};

PyMODINIT_FUNC
PyInit__moments(void)
{
    return PyModule_Create(&module);
}
