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
 * sample(lengths, values, offsets, block_pixels, last_pixels, width, row_base, rows, cols,
 *        table, itemsize, flip, out, out_width) -> None
 *
 *   Nearest sampling of a uint8 mask straight from its runs, each value looked up in a table:
 *   out[j][x] = table[mask[rows[j]][cols[x]]] (x mirrored, vw - 1 - x, with flip), for the
 *   vh rows and vw columns given, without expanding the mask. lengths, values (1 byte
 *   each), offsets, block_pixels and last_pixels are expand's, already checked (check); the
 *   decoded blocks start at mask row row_base and are width pixels wide. rows (vh) and cols
 *   (vw) are int64 buffers of mask rows and columns, each non-decreasing, inside the decoded
 *   blocks and the width. table holds 256 entries of itemsize (1, 2 or 4) bytes; out is a
 *   writable buffer of rows of out_width entries of itemsize bytes, at least vh of them,
 *   out_width >= vw: its first vh rows' first vw entries are written. A run is one fill of
 *   the output columns its pixels map to; an output row whose mask row is the one before's
 *   is a copy of it. The blocks' runs are checked again first (as expand does), so nothing
 *   is read outside them whatever the caller checked. Raises ValueError for arguments that
 *   do not fit, and as expand does.
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

/* The ValueError of bad_block's block b: its offsets out of order (sum < 0) or its runs adding
 * up to sum pixels where want were expected. */
static void
set_bad_block(Py_ssize_t b, Py_ssize_t sum, Py_ssize_t want)
{
    if (sum < 0)
        PyErr_Format(PyExc_ValueError, "block %zd: run offsets not increasing", b);
    else
        PyErr_Format(PyExc_ValueError, "block %zd: runs add up to %zd pixels, %zd expected",
                     b, sum, want);
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
        if (b >= 0) {
            set_bad_block(b, sum, b == nblocks - 1 ? last_px : block_px);
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
        if (bad) {
            set_bad_block(bad_block, bad == 2 ? -1 : bad_sum, bad_want);
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

/* Fill out[a:b] (entries of itemsize bytes) with the entry at v. */
static inline void
fill_entries(unsigned char *out, Py_ssize_t a, Py_ssize_t b, const unsigned char *v, int itemsize)
{
    Py_ssize_t i;
    if (itemsize == 1) {
        memset(out + a, v[0], (size_t)(b - a));
    } else if (itemsize == 2) {
        uint16_t e, *o = (uint16_t *)(void *)out;
        memcpy(&e, v, 2);
        for (i = a; i < b; i++) o[i] = e;
    } else {
        uint32_t e, *o = (uint32_t *)(void *)out;
        memcpy(&e, v, 4);
        for (i = a; i < b; i++) o[i] = e;
    }
}

/* Whether the n int64 values at p are non-decreasing and inside [lo, hi). */
static int
in_order(const int64_t *p, Py_ssize_t n, int64_t lo, int64_t hi)
{
    Py_ssize_t i;
    for (i = 0; i < n; i++) {
        if (p[i] < lo || p[i] >= hi || (i > 0 && p[i] < p[i - 1])) return 0;
    }
    return 1;
}

static PyObject *
sample(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *o_len, *o_val, *o_off, *o_rows, *o_cols, *o_tab, *o_out;
    Py_ssize_t block_px, last_px, width, row_base, out_width;
    int itemsize, flip;
    Py_buffer len_b, val_b, off_b, rows_b, cols_b, tab_b, out_b;
    PyObject *result = NULL;

    if (!PyArg_ParseTuple(args, "OOOnnnnOOOipOn:sample", &o_len, &o_val, &o_off, &block_px,
                          &last_px, &width, &row_base, &o_rows, &o_cols, &o_tab, &itemsize,
                          &flip, &o_out, &out_width)) {
        return NULL;
    }
    if (itemsize != 1 && itemsize != 2 && itemsize != 4) {
        PyErr_SetString(PyExc_ValueError, "itemsize must be 1, 2 or 4");
        return NULL;
    }
    if (get_buffer(o_len, &len_b, 0, "lengths") < 0) return NULL;
    if (get_buffer(o_val, &val_b, 0, "values") < 0) goto rel_len;
    if (get_buffer(o_off, &off_b, 0, "offsets") < 0) goto rel_val;
    if (get_buffer(o_rows, &rows_b, 0, "rows") < 0) goto rel_off;
    if (get_buffer(o_cols, &cols_b, 0, "cols") < 0) goto rel_rows;
    if (get_buffer(o_tab, &tab_b, 0, "table") < 0) goto rel_cols;
    if (get_buffer(o_out, &out_b, 1, "out") < 0) goto rel_tab;
    {
        const unsigned char *lens = (const unsigned char *)len_b.buf;
        const unsigned char *vals = (const unsigned char *)val_b.buf;
        const unsigned char *offs = (const unsigned char *)off_b.buf;
        const unsigned char *tab = (const unsigned char *)tab_b.buf;
        const int64_t *rows = (const int64_t *)rows_b.buf, *cols = (const int64_t *)cols_b.buf;
        unsigned char *out = (unsigned char *)out_b.buf;
        Py_ssize_t nruns = len_b.len / 2, nblocks = off_b.len / 4 - 1;
        Py_ssize_t vh = rows_b.len / 8, vw = cols_b.len / 8;
        Py_ssize_t decoded = nblocks >= 1 ? (nblocks - 1) * block_px + last_px : 0;
        Py_ssize_t row_bytes = out_width * itemsize, *xmap = NULL;
        Py_ssize_t j, c, k, b = 0, r = 0, p = 0, left = 0, prev = -1;
        int ok;

        if (len_b.len % 2 || val_b.len != nruns || off_b.len % 4 || nblocks < 1
            || block_px < 1 || last_px < 1 || last_px > block_px || width < 1
            || block_px % width || last_px % width || row_base < 0 || rows_b.len % 8
            || cols_b.len % 8 || vh < 1 || vw < 1 || vw > out_width
            || tab_b.len != 256 * itemsize || out_b.len < vh * row_bytes
            || u32le(offs) != 0 || (Py_ssize_t)u32le(offs + 4 * nblocks) != nruns) {
            PyErr_SetString(PyExc_ValueError, "inconsistent sample arguments");
            goto rel_out;
        }
        ok = in_order(rows, vh, row_base, row_base + decoded / width)
             && in_order(cols, vw, 0, width);
        if (!ok) {
            PyErr_SetString(PyExc_ValueError, "rows and cols must be non-decreasing and inside "
                            "the decoded blocks");
            goto rel_out;
        }
        {
            Py_ssize_t sum = 0, bad = bad_block(lens, nruns, offs, nblocks, block_px, last_px,
                                                &sum);
            if (bad >= 0) {
                set_bad_block(bad, sum, bad == nblocks - 1 ? last_px : block_px);
                goto rel_out;
            }
        }
        xmap = (Py_ssize_t *)PyMem_RawMalloc(sizeof(Py_ssize_t) * (size_t)(width + 1));
        if (xmap == NULL) {
            PyErr_NoMemory();
            goto rel_out;
        }
        Py_BEGIN_ALLOW_THREADS
        /* xmap[c]: the output columns (unmirrored) whose mask column is under c */
        for (c = 0, k = 0; c <= width; c++) {
            while (k < vw && cols[k] < c) k++;
            xmap[c] = k;
        }
        for (j = 0; j < vh; j++) {
            unsigned char *row = out + j * row_bytes;
            Py_ssize_t target = (rows[j] - row_base) * width;
            if (rows[j] == prev) {
                memcpy(row, row - row_bytes, (size_t)(vw * itemsize));
                continue;
            }
            prev = rows[j];
            if (j == 0 || target >= (b + 1) * block_px) {  /* to the block's first run */
                b = target / block_px;
                r = (Py_ssize_t)u32le(offs + 4 * b);
                p = b * block_px;
                left = (Py_ssize_t)lens[2 * r] | ((Py_ssize_t)lens[2 * r + 1] << 8);
            }
            while (p + left <= target) {  /* runs fill their block: r stays in it */
                p += left;
                r++;
                left = (Py_ssize_t)lens[2 * r] | ((Py_ssize_t)lens[2 * r + 1] << 8);
            }
            left -= target - p;
            p = target;
            for (c = 0; c < width;) {
                Py_ssize_t n = left < width - c ? left : width - c;
                Py_ssize_t a = xmap[c], e = xmap[c + n];
                if (e > a) {
                    const unsigned char *v = tab + (size_t)vals[r] * (size_t)itemsize;
                    if (flip) fill_entries(row, vw - e, vw - a, v, itemsize);
                    else fill_entries(row, a, e, v, itemsize);
                }
                c += n;
                p += n;
                left -= n;
                if (left == 0 && r + 1 < nruns) {
                    r++;
                    left = (Py_ssize_t)lens[2 * r] | ((Py_ssize_t)lens[2 * r + 1] << 8);
                }
            }
        }
        Py_END_ALLOW_THREADS
        PyMem_RawFree(xmap);
        Py_INCREF(Py_None);
        result = Py_None;
    }
rel_out:
    PyBuffer_Release(&out_b);
rel_tab:
    PyBuffer_Release(&tab_b);
rel_cols:
    PyBuffer_Release(&cols_b);
rel_rows:
    PyBuffer_Release(&rows_b);
rel_off:
    PyBuffer_Release(&off_b);
rel_val:
    PyBuffer_Release(&val_b);
rel_len:
    PyBuffer_Release(&len_b);
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
    {"sample", sample, METH_VARARGS,
     "sample(lengths, values, offsets, block_pixels, last_pixels, width, row_base, rows, cols, "
     "table, itemsize, flip, out, out_width): a uint8 mask's nearest samples through a table, "
     "from its runs"},
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
