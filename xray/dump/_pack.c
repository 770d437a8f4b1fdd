/* xray.dump._pack: rows of Python numbers into column arrays, for the writer's flush.
 *
 * Why it exists: the recorder hands the writer each record and tensor as a tuple of cells, and
 * every flush turns thousands of them into the index's columns (ColumnBuilder.build). numpy
 * converts a list of tuples into a structured array at about 20 ns a cell and then each field is
 * copied out again; this writes each cell straight into its column at a few ns a cell. On
 * anything it does not expect (a row of another length, a value that is not a number of the
 * column's kind, one out of the column's range) it raises, and the caller takes numpy's path,
 * which converts or refuses it exactly as before.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* One cell into a column of kind k: 'q' int64, 'i' int32, 'B' uint8, 'd' float64. */
static int put_cell(char *base, Py_ssize_t row, char kind, PyObject *v) {
    if (kind == 'd') {
        double d = PyFloat_AsDouble(v);
        if (d == -1.0 && PyErr_Occurred())
            return -1;
        memcpy(base + row * 8, &d, 8);
        return 0;
    }
    if (PyFloat_Check(v)) { /* never truncated here: numpy's path decides */
        PyErr_SetString(PyExc_TypeError, "a float in an integer column");
        return -1;
    }
    long long x = PyLong_AsLongLong(v);
    if (x == -1 && PyErr_Occurred())
        return -1;
    if (kind == 'q') {
        int64_t y = (int64_t)x;
        memcpy(base + row * 8, &y, 8);
    } else if (kind == 'i') {
        if (x < INT32_MIN || x > INT32_MAX) {
            PyErr_SetString(PyExc_OverflowError, "out of an int32 column's range");
            return -1;
        }
        int32_t y = (int32_t)x;
        memcpy(base + row * 4, &y, 4);
    } else {
        if (x < 0 || x > 255) {
            PyErr_SetString(PyExc_OverflowError, "out of a uint8 column's range");
            return -1;
        }
        ((uint8_t *)base)[row] = (uint8_t)x;
    }
    return 0;
}

static Py_ssize_t kind_size(char kind) {
    return kind == 'q' || kind == 'd' ? 8 : kind == 'i' ? 4 : kind == 'B' ? 1 : 0;
}

static PyObject *rows_to_columns(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 3 || !PyList_CheckExact(args[0]) || !PyTuple_CheckExact(args[1]) || !PyUnicode_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "rows_to_columns(rows: list, columns: tuple, kinds: str)");
        return NULL;
    }
    PyObject *rows = args[0], *columns = args[1];
    Py_ssize_t nrows = PyList_GET_SIZE(rows), ncols = PyTuple_GET_SIZE(columns), nkinds;
    const char *kinds = PyUnicode_AsUTF8AndSize(args[2], &nkinds);
    if (kinds == NULL)
        return NULL;
    if (nkinds != ncols || ncols > 64) {
        PyErr_SetString(PyExc_ValueError, "rows_to_columns: one kind a column, at most 64 columns");
        return NULL;
    }
    Py_buffer views[64];
    Py_ssize_t held = 0;
    PyObject *result = NULL;
    for (; held < ncols; held++) {
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(columns, held), &views[held], PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0)
            goto done;
        if (kind_size(kinds[held]) == 0 || views[held].len != nrows * kind_size(kinds[held])) {
            held++;
            PyErr_SetString(PyExc_ValueError, "rows_to_columns: a column of another size or kind");
            goto done;
        }
    }
    for (Py_ssize_t r = 0; r < nrows; r++) {
        PyObject *row = PyList_GET_ITEM(rows, r);
        if (!PyTuple_CheckExact(row) || PyTuple_GET_SIZE(row) != ncols) {
            PyErr_SetString(PyExc_ValueError, "rows_to_columns: a row is not a tuple of one cell a column");
            goto done;
        }
        for (Py_ssize_t c = 0; c < ncols; c++)
            if (put_cell(views[c].buf, r, kinds[c], PyTuple_GET_ITEM(row, c)) < 0)
                goto done;
    }
    result = Py_NewRef(Py_None);
done:
    for (Py_ssize_t i = 0; i < held; i++)
        PyBuffer_Release(&views[i]);
    return result;
}

static PyMethodDef methods[] = {
    {"rows_to_columns", (PyCFunction)(void (*)(void))rows_to_columns, METH_FASTCALL,
     "rows_to_columns(rows, columns, kinds): cell c of each row (a tuple) into columns[c], a writable\n"
     "contiguous array of len(rows) items of kinds[c] ('q' int64, 'i' int32, 'B' uint8, 'd' float64).\n"
     "Raises TypeError, ValueError or OverflowError on anything else."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, .m_name = "_pack", .m_size = -1, .m_methods = methods};

PyMODINIT_FUNC PyInit__pack(void) { return PyModule_Create(&module); }
