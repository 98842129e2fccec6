/* Region decoding of baseline and progressive JPEGs with libjpeg-turbo >= 2.1.
 *
 * decode(buf, y0, x0, y1, x1, colour[, strict[, denom]]) -> (bytearray, channels) | None
 *
 * The pixels of rows y0..y1-1, columns x0..x1-1 of the full decode, exactly: libjpeg-turbo's
 * jpeg_crop_scanline() limits the inverse DCT, upsampling and colour conversion to a column
 * range and jpeg_skip_scanlines() to the rows needed. One extra column each side is decoded
 * and dropped, as fancy upsampling treats the decoded range's first and last column as the
 * image's edge (and at least 4 MCU columns' worth, as a chroma range 2 samples wide is
 * upsampled without the fancy filter).
 *
 * Strict, as the full decode is: every libjpeg warning ("Corrupt JPEG data: ...") is an
 * error, and the whole entropy-coded stream is read. Skipped rows and columns are still
 * Huffman-decoded (that cannot be skipped), but jpeg_skip_scanlines() to the very last row
 * would mark the end of the image reached without reading it; so the rows after the box are
 * skipped up to the last one, which is read, and jpeg_finish_decompress() reads through the
 * end-of-image marker.
 *
 * None: the stream is valid so far but not one this decoder reproduces exactly (CMYK/YCCK,
 * arithmetic coding, not 1 or 3 components): the caller decodes it whole. Which JPEGs are
 * sent here at all is decided in Python (gluon_data.decode): only the variants that the
 * decoder of record (simplejpeg's libjpeg-turbo) reads identically.
 * ValueError: a box that is empty, negative or outside the image the frame header declares
 * (checked after reading the header and before the output is allocated, so a huge box on a
 * small image costs nothing), or corrupt or truncated data (libjpeg's message).
 * The GIL is released while libjpeg runs (the buffer is pinned by the Py_buffer).
 *
 * denom (1, 2, 4 or 8; default 1): decode at 1/denom of the size with libjpeg's DCT-domain
 * scaling (scale_num = 1, scale_denom = denom), the box given in the scaled image's pixels
 * (ceil(width / denom) x ceil(height / denom)). Not the full decode's pixels: an opt-in of the
 * caller, which measures and documents the difference (gluon_data.format.decode).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <setjmp.h>
#include <stdio.h>
#include <string.h>
#include <jpeglib.h>

/* jpeg_crop_scanline and jpeg_skip_scanlines exist since 1.5; the fixes to skipping with
 * fancy upsampling that exactness relies on are in 2.1 (tested: 2.1.5). */
#if !defined(LIBJPEG_TURBO_VERSION_NUMBER) || LIBJPEG_TURBO_VERSION_NUMBER < 2001000
#error "the region decoder needs libjpeg-turbo >= 2.1 (jpeg_crop_scanline, jpeg_skip_scanlines)"
#endif

struct err_mgr {
    struct jpeg_error_mgr pub;
    jmp_buf jump;
    JSAMPROW row;  /* here, not a local: it must survive the longjmp */
    char message[JMSG_LENGTH_MAX];
};

static void on_error(j_common_ptr cinfo)
{
    struct err_mgr *err = (struct err_mgr *)cinfo->err;
    (*cinfo->err->format_message)(cinfo, err->message);
    longjmp(err->jump, 1);
}

static void on_message(j_common_ptr cinfo, int level)
{
    if (level < 0)  /* a warning: corrupt data that libjpeg would otherwise repair */
        on_error(cinfo);
}

/* FAILED: libjpeg's message is in err->message; RAISED: a Python exception is set. */
enum { DONE = 0, FALLBACK = 1, FAILED = 2, NOMEM = 3, RAISED = 4 };

/* The header, without the GIL: DONE (cinfo holds the frame's size), FALLBACK or FAILED. */
static int read_header(struct jpeg_decompress_struct *cinfo, struct err_mgr *err,
                       const unsigned char *data, size_t size)
{
    if (setjmp(err->jump))
        return FAILED;
    jpeg_mem_src(cinfo, (unsigned char *)data, (unsigned long)size);
    jpeg_read_header(cinfo, TRUE);
    if (cinfo->arith_code || !(cinfo->num_components == 1 || cinfo->num_components == 3) ||
        cinfo->jpeg_color_space == JCS_CMYK || cinfo->jpeg_color_space == JCS_YCCK ||
        cinfo->jpeg_color_space == JCS_UNKNOWN)
        return FALLBACK;
    return DONE;
}

/* The decode itself, after read_header() and without the GIL. Fills out (h x w x channels);
 * the box lies inside the image (checked by the caller against the header). */
static int run(struct jpeg_decompress_struct *cinfo, struct err_mgr *err, int y0, int x0,
               int y1, int x1, int colour, int strict, unsigned char *out)
{
    JSAMPROW row;
    JDIMENSION xoff, cw, skip;
    int c = colour ? 3 : 1, mx0, mx1, min_w, y;

    err->row = NULL;
    if (setjmp(err->jump)) {
        free(err->row);
        err->row = NULL;
        return FAILED;
    }
    cinfo->out_color_space = colour ? JCS_RGB : JCS_GRAYSCALE;
    cinfo->dct_method = JDCT_ISLOW;
    cinfo->do_fancy_upsampling = TRUE;
    jpeg_start_decompress(cinfo);
    mx0 = x0 > 0 ? x0 - 1 : 0;
    mx1 = x1 < (int)cinfo->output_width ? x1 + 1 : x1;
    /* libjpeg-turbo upsamples a component only 2 samples wide without "fancy" filtering:
     * keep the decoded range wide enough that the chroma spans more than 2 samples. */
    min_w = 4 * cinfo->max_h_samp_factor;
    if (mx1 - mx0 < min_w) {
        mx1 = mx0 + min_w < (int)cinfo->output_width ? mx0 + min_w : (int)cinfo->output_width;
        mx0 = mx1 - min_w > 0 ? mx1 - min_w : 0;
    }
    xoff = (JDIMENSION)mx0;
    cw = (JDIMENSION)(mx1 - mx0);
    if (xoff > 0 || cw < cinfo->output_width)
        jpeg_crop_scanline(cinfo, &xoff, &cw);
    row = err->row = (JSAMPROW)malloc((size_t)cinfo->output_width * (size_t)c);
    if (row == NULL)
        return NOMEM;
    if (y0 > 0)
        jpeg_skip_scanlines(cinfo, (JDIMENSION)y0);
    for (y = y0; y < y1; y++) {
        jpeg_read_scanlines(cinfo, &row, 1);
        memcpy(out + (size_t)(y - y0) * (size_t)(x1 - x0) * c, row + (size_t)(x0 - (int)xoff) * c,
               (size_t)(x1 - x0) * c);
    }
    if (!strict) {
        jpeg_abort_decompress(cinfo);
        free(row);
        err->row = NULL;
        return DONE;
    }
    /* Strict: entropy-decode the rest (all but the last row skipped, the last one read). */
    if (cinfo->output_scanline + 1 < cinfo->output_height) {
        skip = cinfo->output_height - 1 - cinfo->output_scanline;
        jpeg_skip_scanlines(cinfo, skip);
    }
    while (cinfo->output_scanline < cinfo->output_height)
        jpeg_read_scanlines(cinfo, &row, 1);
    jpeg_finish_decompress(cinfo);
    free(row);
    err->row = NULL;
    return DONE;
}

static PyObject *decode(PyObject *self, PyObject *args)
{
    Py_buffer view;
    int y0, x0, y1, x1, colour, strict = 1, denom = 1, rc;
    JDIMENSION height, width;
    struct jpeg_decompress_struct cinfo;
    struct err_mgr err;
    PyObject *out = NULL;

    if (!PyArg_ParseTuple(args, "y*iiiip|pi", &view, &y0, &x0, &y1, &x1, &colour,
                          &strict, &denom))
        return NULL;
    if (denom != 1 && denom != 2 && denom != 4 && denom != 8) {
        PyBuffer_Release(&view);
        PyErr_Format(PyExc_ValueError, "denom must be 1, 2, 4 or 8, got %d", denom);
        return NULL;
    }
    if (y0 < 0 || x0 < 0 || y1 <= y0 || x1 <= x0) {
        PyBuffer_Release(&view);
        PyErr_Format(PyExc_ValueError, "box (%d, %d, %d, %d) is empty or negative",
                     y0, x0, y1, x1);
        return NULL;
    }
    memset(&cinfo, 0, sizeof(cinfo));
    cinfo.err = jpeg_std_error(&err.pub);
    err.pub.error_exit = on_error;
    err.pub.emit_message = on_message;
    err.message[0] = '\0';
    jpeg_create_decompress(&cinfo);
    Py_BEGIN_ALLOW_THREADS
    rc = read_header(&cinfo, &err, (const unsigned char *)view.buf, (size_t)view.len);
    Py_END_ALLOW_THREADS
    height = cinfo.image_height;
    width = cinfo.image_width;
    if (rc == DONE && denom != 1) {  /* the box is in the scaled image's pixels */
        cinfo.scale_num = 1;
        cinfo.scale_denom = (unsigned int)denom;
        height = (height + (JDIMENSION)denom - 1) / (JDIMENSION)denom;
        width = (width + (JDIMENSION)denom - 1) / (JDIMENSION)denom;
    }
    if (rc == DONE && ((JDIMENSION)y1 > height || (JDIMENSION)x1 > width)) {
        PyErr_Format(PyExc_ValueError, "box (%d, %d, %d, %d) lies outside the %ux%u image "
                     "its frame header declares", y0, x0, y1, x1, (unsigned)width,
                     (unsigned)height);
        rc = RAISED;
    } else if (rc == DONE) {  /* the box is inside the image: at most its size is allocated */
        out = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)(y1 - y0) * (Py_ssize_t)(x1 - x0)
                                            * (colour ? 3 : 1));
        if (out == NULL) {
            rc = RAISED;
        } else {
            Py_BEGIN_ALLOW_THREADS
            rc = run(&cinfo, &err, y0, x0, y1, x1, colour, strict,
                     (unsigned char *)PyByteArray_AS_STRING(out));
            Py_END_ALLOW_THREADS
        }
    }
    jpeg_destroy_decompress(&cinfo);
    PyBuffer_Release(&view);
    if (rc == DONE)
        return Py_BuildValue("(Ni)", out, colour ? 3 : 1);
    Py_XDECREF(out);
    if (rc == NOMEM)
        return PyErr_NoMemory();
    if (rc == FAILED)
        PyErr_SetString(PyExc_ValueError, err.message);
    if (rc == FAILED || rc == RAISED)
        return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"decode", decode, METH_VARARGS,
     "decode(buf, y0, x0, y1, x1, colour) -> (bytearray, channels) or None: the box "
     "[y0:y1, x0:x1] of the strict full decode (RGB or grey), decoding only that region; "
     "None for a JPEG this decoder does not reproduce exactly (CMYK, arithmetic coding); "
     "ValueError for corrupt data or a box outside the image its header declares (checked "
     "before anything is allocated). denom (2, 4, 8): decode at 1/denom of the size "
     "(DCT-domain scaling), the box in the scaled image's pixels."},
    {NULL, NULL, 0, NULL}
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_jpegregion",
    "Exact, strict region decoding of JPEGs with libjpeg-turbo (see gluon_data.decode).",
    -1, methods
};

PyMODINIT_FUNC PyInit__jpegregion(void)
{
    PyObject *m = PyModule_Create(&module);
    if (m != NULL)
        PyModule_AddIntConstant(m, "LIBJPEG_TURBO_VERSION", LIBJPEG_TURBO_VERSION_NUMBER);
    return m;
}
