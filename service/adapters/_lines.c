/*
 * The per-byte loops of datasets and round files (service.adapters.scanner, .blobs): the
 * line census, in one pass over the bytes (how many b"\n" they hold, how many of those end
 * an empty line, and where the k-th line ends), and a round's index entries (each line's
 * first field).
 *
 * Every dataset poll and every round file runs each byte it reads through the census, so
 * it is the scan's inner loop. It compares 16 bytes at a time with the compiler's portable
 * vector extension (SSE2 on x86-64, NEON on arm64, plain code elsewhere: GCC and Clang
 * both build it), counting in one 8-bit lane per byte position for up to 255 steps before
 * the lanes are added up. The interpreter lock is released while a large buffer is
 * scanned, so the controller's other threads go on meanwhile; the buffer stays exported
 * (it cannot be resized) until the scan is done.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

typedef uint8_t lanes __attribute__((vector_size(16)));

#define LANES ((size_t)sizeof(lanes))
/* Steps an 8-bit lane can count before it could wrap. */
#define STEPS 255
/* Buffers at least this big are scanned without the interpreter lock (below it, releasing
   and taking the lock back costs more than the scan). */
#define UNLOCKED_BYTES (64 * 1024)

/* Lets go of the interpreter lock for a scan of len bytes when that is worth it; returns
   what `relock` takes back (NULL when the lock was kept). */
static PyThreadState *unlock_for(Py_ssize_t len) {
    return len >= UNLOCKED_BYTES ? PyEval_SaveThread() : NULL;
}

static void relock(PyThreadState *state) {
    if (state != NULL) {
        PyEval_RestoreThread(state);
    }
}

static inline lanes load(const uint8_t *p) {
    lanes v;
    memcpy(&v, p, sizeof v); /* an unaligned load */
    return v;
}

static inline uint64_t lane_sum(lanes v) {
    uint64_t sum = 0;
    for (size_t i = 0; i < LANES; i++) {
        sum += v[i];
    }
    return sum;
}

/* The b"\n" count of p[0..n) and how many of them end an empty line (one at p[0], or one
   right after another b"\n"). */
static void count_lines(const uint8_t *p, size_t n, uint64_t *lines, uint64_t *empty) {
    const lanes newline = (lanes){0} + '\n';
    uint64_t all = 0, blank = 0;
    size_t i = 1;
    if (n == 0) {
        *lines = *empty = 0;
        return;
    }
    all = blank = p[0] == '\n';
    while (n - i >= LANES) {
        lanes all_acc = {0}, blank_acc = {0};
        /* a comparison gives 0xff per matching byte: subtracting it counts one */
        for (int step = 0; step < STEPS && n - i >= LANES; step++, i += LANES) {
            lanes here = (lanes)(load(p + i) == newline);
            lanes before = (lanes)(load(p + i - 1) == newline);
            all_acc -= here;
            blank_acc -= here & before;
        }
        all += lane_sum(all_acc);
        blank += lane_sum(blank_acc);
    }
    for (; i < n; i++) {
        int here = p[i] == '\n';
        all += here;
        blank += here & (p[i - 1] == '\n');
    }
    *lines = all;
    *empty = blank;
}

/* The offset just past the k-th (k >= 1) b"\n" of p[0..n), or -1 with *seen the number of
   b"\n" there are when there are fewer than k. Whole stretches of STEPS * LANES bytes are
   counted with the vectors; the stretch holding the k-th is then walked byte by byte. */
static Py_ssize_t find_line_end(const uint8_t *p, size_t n, uint64_t k, uint64_t *seen) {
    const lanes newline = (lanes){0} + '\n';
    const size_t stretch = STEPS * LANES;
    uint64_t counted = 0;
    size_t i = 0;
    while (n - i >= stretch) {
        lanes acc = {0};
        for (size_t at = i; at < i + stretch; at += LANES) {
            acc -= (lanes)(load(p + at) == newline);
        }
        uint64_t here = lane_sum(acc);
        if (counted + here >= k) {
            break;
        }
        counted += here;
        i += stretch;
    }
    for (; i < n; i++) {
        if (p[i] == '\n' && ++counted == k) {
            return (Py_ssize_t)(i + 1);
        }
    }
    *seen = counted;
    return -1;
}

static PyObject *lines_count(PyObject *module, PyObject *data) {
    (void)module;
    Py_buffer view;
    uint64_t lines, empty;
    if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    PyThreadState *state = unlock_for(view.len);
    count_lines(view.buf, (size_t)view.len, &lines, &empty);
    relock(state);
    PyBuffer_Release(&view);
    return Py_BuildValue("(KK)", (unsigned long long)lines, (unsigned long long)empty);
}

static PyObject *lines_end_of_line(PyObject *module, PyObject *args) {
    (void)module;
    Py_buffer view;
    Py_ssize_t k, end = 0;
    uint64_t seen = 0;
    if (!PyArg_ParseTuple(args, "y*n:end_of_line", &view, &k)) {
        return NULL;
    }
    if (k < 0) {
        PyBuffer_Release(&view);
        return PyErr_Format(PyExc_ValueError, "line %zd asked: lines count from 0", k);
    }
    if (k > 0) {
        PyThreadState *state = unlock_for(view.len);
        end = find_line_end(view.buf, (size_t)view.len, (uint64_t)k, &seen);
        relock(state);
    }
    PyBuffer_Release(&view);
    if (end < 0) {
        return PyErr_Format(PyExc_ValueError, "line %zd asked of bytes holding %llu", k,
                            (unsigned long long)seen);
    }
    return PyLong_FromSsize_t(end);
}

/* Each line's first field (up to its first b" ", or all of it), each followed by b"\n",
   into out (which has room for n bytes: an entry is never longer than its line). p[0..n)
   is whole lines, each ended by b"\n". Returns the bytes written. */
static size_t first_fields(const uint8_t *p, size_t n, uint8_t *out) {
    const uint8_t *end = p + n;
    uint8_t *at = out;
    while (p < end) {
        const uint8_t *line_end = memchr(p, '\n', (size_t)(end - p));
        const uint8_t *space = memchr(p, ' ', (size_t)(line_end - p));
        const uint8_t *field_end = space != NULL ? space : line_end;
        memcpy(at, p, (size_t)(field_end - p));
        at += field_end - p;
        *at++ = '\n';
        p = line_end + 1;
    }
    return (size_t)(at - out);
}

static PyObject *lines_first_fields(PyObject *module, PyObject *data) {
    (void)module;
    Py_buffer view;
    PyObject *entries;
    size_t size;
    if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    if (view.len > 0 && ((const uint8_t *)view.buf)[view.len - 1] != '\n') {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "first fields asked of bytes whose last line is "
                                          "not ended by a newline");
        return NULL;
    }
    entries = PyBytes_FromStringAndSize(NULL, view.len);
    if (entries == NULL) {
        PyBuffer_Release(&view);
        return NULL;
    }
    /* the new bytes object is no one else's yet: it may be filled without the lock */
    uint8_t *out = (uint8_t *)PyBytes_AS_STRING(entries);
    PyThreadState *state = unlock_for(view.len);
    size = first_fields(view.buf, (size_t)view.len, out);
    relock(state);
    PyBuffer_Release(&view);
    if (_PyBytes_Resize(&entries, (Py_ssize_t)size) < 0) {
        return NULL;
    }
    return entries;
}

static PyMethodDef lines_methods[] = {
    {"count", lines_count, METH_O,
     "count(data, /)\n--\n\n"
     "(lines, empty): the b\"\\n\" count of the bytes and how many of those end an empty "
     "line (one at the very start, or right after another b\"\\n\")."},
    {"end_of_line", lines_end_of_line, METH_VARARGS,
     "end_of_line(data, k, /)\n--\n\n"
     "The offset just past the k-th b\"\\n\" of the bytes (0 for k = 0); ValueError if "
     "they hold fewer."},
    {"first_fields", lines_first_fields, METH_O,
     "first_fields(data, /)\n--\n\n"
     "Each line's first field (up to its first b\" \", or all of it), each followed by "
     "b\"\\n\": a round's index entries. The bytes must be whole lines."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef lines_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "service.adapters._lines",
    .m_doc = "The per-byte loops of datasets and round files: the line census (counts and "
             "line ends of newline-split bytes) and a round's index entries.",
    .m_size = 0,
    .m_methods = lines_methods,
};

PyMODINIT_FUNC PyInit__lines(void) { return PyModuleDef_Init(&lines_module); }
