/* The optional C routines of run-length masks (FORMAT.md, "Run-length mask"): the same
 * checks, runs and pixels as the numpy path in gluon_data/format/masks.py, at memset speed.
 *
 * expand(lengths, values, itemsize, offsets, block_pixels, last_pixels, out) -> None
 *
 *   lengths       uint16 little-endian run lengths of the blocks decoded (a buffer)
 *   values        their values, itemsize (1 or 2) bytes each, little-endian
 *   offsets       uint32 little-endian: the first run of each block decoded, then the end
 *                 (relative to lengths[0]); strictly increasing, offsets[0] == 0 and the last
 *                 equal to the number of runs
 *   block_pixels  the pixels of every block but the last one decoded
 *   last_pixels   the pixels of the last block decoded
 *   out           a writable buffer of exactly the decoded blocks' pixels * itemsize bytes
 *
 * Raises ValueError naming the block whose runs do not add up to its pixels; writes nothing
 * past out.
 *
 * check(lengths, offsets, block_pixels, last_pixels) -> None
 *
 *   The same arguments' checks, every block's sum included, with nothing written: called
 *   before out is allocated, so runs that cannot fill a declared size never cost its memory.
 *   Raises ValueError as expand does.
 *
 * runs(mask, width, block_rows) -> (lengths, values, offsets)
 *
 *   The encoder's side, for uint8 masks: mask is a C-contiguous buffer of 1-byte ids, width
 *   pixels a row, cut in blocks of block_rows rows. Returns bytes: the uint16 little-endian
 *   lengths of its runs in C order (cut at every block's first pixel and at 65535 pixels),
 *   their 1-byte values, and the uint32 little-endian first run of each block, then the run
 *   count: exactly what masks.mask_runs computes with numpy.
 *
 * No library beyond Python's own.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

static int
get_buffer(PyObject *obj, Py_buffer *view, int writable, const char *name)
{
    if (PyObject_GetBuffer(obj, view, writable ? PyBUF_WRITABLE : PyBUF_SIMPLE) < 0) {
        return -1;
    }
    if (!PyBuffer_IsContiguous(view, 'C')) {
        PyBuffer_Release(view);
        PyErr_Format(PyExc_ValueError, "%s must be a contiguous buffer", name);
        return -1;
    }
    return 0;
}

static uint32_t
u32le(const unsigned char *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16)
           | ((uint32_t)p[3] << 24);
}

/* The first block (from 0) whose runs are out of order (*sum = -1) or do not add up to its
 * pixels, or -1 when every block is filled exactly. */
static Py_ssize_t
bad_block(const unsigned char *lens, Py_ssize_t nruns, const unsigned char *offs,
          Py_ssize_t nblocks, Py_ssize_t block_px, Py_ssize_t last_px, Py_ssize_t *sum)
{
    Py_ssize_t b, r;
    for (b = 0; b < nblocks; b++) {
        Py_ssize_t r0 = u32le(offs + 4 * b), r1 = u32le(offs + 4 * (b + 1)), s = 0;
        if (r1 <= r0 || r1 > nruns) {
            *sum = -1;
            return b;
        }
        for (r = r0; r < r1; r++) {
            s += (Py_ssize_t)lens[2 * r] | ((Py_ssize_t)lens[2 * r + 1] << 8);
        }
        if (s != (b == nblocks - 1 ? last_px : block_px)) {
            *sum = s;
            return b;
        }
    }
    return -1;
}

static PyObject *
check(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *o_len, *o_off;
    Py_ssize_t block_px, last_px, b, sum = 0;
    Py_buffer len_b, off_b;
    PyObject *result = NULL;

    if (!PyArg_ParseTuple(args, "OOnn:check", &o_len, &o_off, &block_px, &last_px)) {
        return NULL;
    }
    if (get_buffer(o_len, &len_b, 0, "lengths") < 0) return NULL;
    if (get_buffer(o_off, &off_b, 0, "offsets") < 0) goto rel_len;
    {
        const unsigned char *offs = (const unsigned char *)off_b.buf;
        Py_ssize_t nruns = len_b.len / 2, nblocks = off_b.len / 4 - 1;
        if (len_b.len % 2 || off_b.len % 4 || nblocks < 1 || block_px < 1 || last_px < 1
            || last_px > block_px || u32le(offs) != 0
            || (Py_ssize_t)u32le(offs + 4 * nblocks) != nruns) {
            PyErr_SetString(PyExc_ValueError, "inconsistent run table arguments");
            goto rel_off;
        }
        Py_BEGIN_ALLOW_THREADS
        b = bad_block((const unsigned char *)len_b.buf, nruns, offs, nblocks, block_px,
                      last_px, &sum);
        Py_END_ALLOW_THREADS
        if (b >= 0 && sum < 0) {
            PyErr_Format(PyExc_ValueError, "block %zd: run offsets not increasing", b);
        } else if (b >= 0) {
            PyErr_Format(PyExc_ValueError, "block %zd: runs add up to %zd pixels, %zd expected",
                         b, sum, b == nblocks - 1 ? last_px : block_px);
        } else {
            Py_INCREF(Py_None);
            result = Py_None;
        }
    }
rel_off:
    PyBuffer_Release(&off_b);
rel_len:
    PyBuffer_Release(&len_b);
    return result;
}

static PyObject *
expand(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *o_len, *o_val, *o_off, *o_out;
    int itemsize;
    Py_ssize_t block_px, last_px;
    Py_buffer len_b, val_b, off_b, out_b;
    PyObject *result = NULL;

    if (!PyArg_ParseTuple(args, "OOiOnnO:expand", &o_len, &o_val, &itemsize, &o_off,
                          &block_px, &last_px, &o_out)) {
        return NULL;
    }
    if (itemsize != 1 && itemsize != 2) {
        PyErr_SetString(PyExc_ValueError, "itemsize must be 1 or 2");
        return NULL;
    }
    if (get_buffer(o_len, &len_b, 0, "lengths") < 0) return NULL;
    if (get_buffer(o_val, &val_b, 0, "values") < 0) goto rel_len;
    if (get_buffer(o_off, &off_b, 0, "offsets") < 0) goto rel_val;
    if (get_buffer(o_out, &out_b, 1, "out") < 0) goto rel_off;
    {
        const unsigned char *lens = (const unsigned char *)len_b.buf;
        const unsigned char *vals = (const unsigned char *)val_b.buf;
        const unsigned char *offs = (const unsigned char *)off_b.buf;
        unsigned char *out = (unsigned char *)out_b.buf;
        Py_ssize_t nruns = len_b.len / 2, nblocks = off_b.len / 4 - 1;
        Py_ssize_t want, b, r, pos = 0, end;
        int bad = 0;
        Py_ssize_t bad_block = 0, bad_sum = 0, bad_want = 0;

        if (len_b.len % 2 || val_b.len != nruns * itemsize || off_b.len % 4 || nblocks < 1
            || block_px < 1 || last_px < 1 || last_px > block_px
            || out_b.len != ((nblocks - 1) * block_px + last_px) * itemsize
            || u32le(offs) != 0 || (Py_ssize_t)u32le(offs + 4 * nblocks) != nruns) {
            PyErr_SetString(PyExc_ValueError, "inconsistent run table arguments");
            goto rel_out;
        }
        Py_BEGIN_ALLOW_THREADS
        for (b = 0; b < nblocks && !bad; b++) {
            Py_ssize_t r0 = u32le(offs + 4 * b), r1 = u32le(offs + 4 * (b + 1)), sum = 0;
            want = b == nblocks - 1 ? last_px : block_px;
            if (r1 <= r0 || r1 > nruns) {
                bad = 2; bad_block = b;
                break;
            }
            for (r = r0; r < r1; r++) {  /* sum first: never write past the block */
                sum += (Py_ssize_t)lens[2 * r] | ((Py_ssize_t)lens[2 * r + 1] << 8);
            }
            if (sum != want) {
                bad = 1; bad_block = b; bad_sum = sum; bad_want = want;
                break;
            }
            if (itemsize == 1) {
                for (r = r0; r < r1; r++) {
                    Py_ssize_t n = (Py_ssize_t)lens[2 * r] | ((Py_ssize_t)lens[2 * r + 1] << 8);
                    memset(out + pos, vals[r], (size_t)n);
                    pos += n;
                }
            } else {
                for (r = r0; r < r1; r++) {  /* little-endian on any host */
                    Py_ssize_t n = (Py_ssize_t)lens[2 * r] | ((Py_ssize_t)lens[2 * r + 1] << 8);
                    unsigned char lo = vals[2 * r], hi = vals[2 * r + 1];
                    for (end = pos + n; pos < end; pos++) {
                        out[2 * pos] = lo;
                        out[2 * pos + 1] = hi;
                    }
                }
            }
        }
        Py_END_ALLOW_THREADS
        if (bad == 1) {
            PyErr_Format(PyExc_ValueError, "block %zd: runs add up to %zd pixels, %zd expected",
                         bad_block, bad_sum, bad_want);
            goto rel_out;
        }
        if (bad == 2) {
            PyErr_Format(PyExc_ValueError, "block %zd: run offsets not increasing", bad_block);
            goto rel_out;
        }
        Py_INCREF(Py_None);
        result = Py_None;
    }
rel_out:
    PyBuffer_Release(&out_b);
rel_off:
    PyBuffer_Release(&off_b);
rel_val:
    PyBuffer_Release(&val_b);
rel_len:
    PyBuffer_Release(&len_b);
    return result;
}

static void
put_u32le(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
    p[2] = (unsigned char)(v >> 16);
    p[3] = (unsigned char)(v >> 24);
}

static PyObject *
runs(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *o_mask, *lens = NULL, *vals = NULL, *offs = NULL, *result = NULL;
    Py_ssize_t width, block_rows;
    Py_buffer m;

    if (!PyArg_ParseTuple(args, "Onn:runs", &o_mask, &width, &block_rows)) {
        return NULL;
    }
    if (get_buffer(o_mask, &m, 0, "mask") < 0) return NULL;
    if (m.itemsize != 1 || width < 1 || block_rows < 1 || block_rows > 0xFFFF || m.len < 1
        || m.len % width || m.len / width > 0xFFFFFFFFLL || m.len > 0xFFFFFFFFLL) {
        PyErr_SetString(PyExc_ValueError, "runs: a non-empty mask of 1-byte ids, whole rows of "
                        "width pixels, block_rows in 1..65535 and under 2**32 pixels");
        goto rel;
    }
    {
        const unsigned char *px = (const unsigned char *)m.buf;
        Py_ssize_t n = m.len, step = width * block_rows, nblocks = (n + step - 1) / step;
        Py_ssize_t count = 0, i, start, b;
        unsigned char *lp, *vp, *op;
        /* at most one run per pixel: sized for that, cut to the runs found */
        lens = PyBytes_FromStringAndSize(NULL, 2 * n);
        vals = PyBytes_FromStringAndSize(NULL, n);
        offs = PyBytes_FromStringAndSize(NULL, 4 * (nblocks + 1));
        if (lens == NULL || vals == NULL || offs == NULL) goto rel;
        lp = (unsigned char *)PyBytes_AS_STRING(lens);
        vp = (unsigned char *)PyBytes_AS_STRING(vals);
        op = (unsigned char *)PyBytes_AS_STRING(offs);
        Py_BEGIN_ALLOW_THREADS
        for (b = 0; b < nblocks; b++) {  /* a run never crosses a block's first pixel */
            Py_ssize_t end = b * step + step < n ? b * step + step : n;
            put_u32le(op + 4 * b, (uint32_t)count);
            for (start = b * step; start < end; start = i) {
                unsigned char v = px[start];
                Py_ssize_t limit = end - start > 0xFFFF ? start + 0xFFFF : end;
                uint64_t word = 0x0101010101010101ULL * v, got;
                i = start + 1;
                while (i + 8 <= limit) {  /* 8 pixels at a time while they all equal v */
                    memcpy(&got, px + i, 8);
                    if (got != word) break;
                    i += 8;
                }
                while (i < limit && px[i] == v) i++;
                lp[2 * count] = (unsigned char)(i - start);
                lp[2 * count + 1] = (unsigned char)((i - start) >> 8);
                vp[count] = v;
                count++;
            }
        }
        put_u32le(op + 4 * nblocks, (uint32_t)count);
        Py_END_ALLOW_THREADS
        if (_PyBytes_Resize(&lens, 2 * count) < 0 || _PyBytes_Resize(&vals, count) < 0) {
            goto rel;
        }
        result = PyTuple_Pack(3, lens, vals, offs);
    }
rel:
    Py_XDECREF(lens);
    Py_XDECREF(vals);
    Py_XDECREF(offs);
    PyBuffer_Release(&m);
    return result;
}

static PyMethodDef methods[] = {
    {"expand", expand, METH_VARARGS,
     "expand(lengths, values, itemsize, offsets, block_pixels, last_pixels, out): run-length "
     "blocks into out"},
    {"check", check, METH_VARARGS,
     "check(lengths, offsets, block_pixels, last_pixels): expand's checks, nothing written "
     "(before out is allocated)"},
    {"runs", runs, METH_VARARGS,
     "runs(mask, width, block_rows): a uint8 mask's runs, as masks.mask_runs computes them"},
    {NULL, NULL, 0, NULL}
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_maskrle",
    "Run-length masks: runs found and expanded (optional; see masks.py).",
    -1, methods, NULL, NULL, NULL, NULL
};

PyMODINIT_FUNC
PyInit__maskrle(void)
{
    return PyModule_Create(&module);
}
