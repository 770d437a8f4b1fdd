/* xray.debugger._tap: PrecisionDebugger's per-module-call work in C, for its common case.
 *
 * Why it exists: a statistics-only module dump runs, for every module call, a walk over the
 * arguments, a cache lookup per tensor and a row per tensor. In Python that was ~5 us a module
 * call warm and 2-3x more inside a forward that evicts the interpreter from the caches: most
 * of the debugger's cost on a small Llama. A Tap does the same work in C.
 *
 * A Tap replaces a module's forward (hooks.py puts it in the instance's __dict__). It takes
 * its fast path only when the whole call is plain: the State is active, no dispatch mode is
 * on (dump_torch_api's tracer), no gradients will be captured (backward off or grad disabled).
 * Otherwise it calls ``slow``, the Python wrapper with the same behaviour, which remains the
 * reference. Everything that is not plain inside the fast path goes back to Python as well:
 * a tensor without cached statistics (State.cells_of computes them), an argument that is not
 * a plain tensor, None, bool, int, float, str or an exact tuple/list/dict (State.flatten), and
 * a non-finite output (State.on_overflow). A row is the 8-tuple of capture.TensorCapture:
 * (call, name, role, key, cells, requires_grad, data, keyword).
 *
 * An error in the capture goes to State.on_error and never reaches the user's forward, which
 * runs exactly once either way; an error in the forward propagates untouched.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#define NKEYS 256 /* positional keys "0".."255" made once */
#define MAX_DEPTH 32 /* nesting walked in C; deeper values go to State.flatten */

static PyObject *KEYS[NKEYS];
static PyObject *ONE, *S_VERSION, *S_REQUIRES_GRAD, *S_EMPTY, *S_FORWARD;
/* the roles, and the same followed by "." (a name is "<module prefix>.<role>.<key>") */
static PyObject *S_INPUT, *S_PARAMS, *S_OUTPUT, *S_INPUT_DOT, *S_PARAMS_DOT, *S_OUTPUT_DOT;

/* ---- State: what every Tap of one ModuleHooks shares; its fields are set from Python. ---- */
typedef struct {
    PyObject_HEAD
    int active;            /* capturing now */
    int backward;          /* gradients are captured when grad mode is on */
    PyObject *step;        /* int: the step being captured */
    PyObject *rows;        /* list: that step's rows (ModuleDumpWriter.step_rows) */
    PyObject *calls;       /* dict: module path -> calls so far this step */
    PyObject *entries;     /* dict: StatsCache.entries, id -> (weakref, version, cells) */
    PyObject *cells_of;    /* t -> cells (StatsCache.get: the miss path) */
    PyObject *next_seq;    /* () -> int */
    PyObject *call_key;    /* tuple -> CallKey */
    PyObject *flatten;     /* value -> list of tensors (record.flatten.flatten_tensors) */
    PyObject *on_overflow; /* (call, name, stats) or None */
    PyObject *on_error;    /* (exception) */
    PyObject *grad_enabled;   /* () -> bool (torch.is_grad_enabled) */
    PyObject *dispatch_depth; /* () -> int (torch._C._len_torch_dispatch_stack) */
    PyObject *tensor_types;   /* tuple of the exact types taken as tensors without a check */
} State;

#define STATE_OBJECTS(X)                                                                       \
    X(step) X(rows) X(calls) X(entries) X(cells_of) X(next_seq) X(call_key) X(flatten) X(on_overflow) \
    X(on_error) X(grad_enabled) X(dispatch_depth) X(tensor_types)

static int State_traverse(State *s, visitproc visit, void *arg) {
#define VISIT(f) Py_VISIT(s->f);
    STATE_OBJECTS(VISIT)
#undef VISIT
    return 0;
}

static int State_clear(State *s) {
#define CLEAR(f) Py_CLEAR(s->f);
    STATE_OBJECTS(CLEAR)
#undef CLEAR
    return 0;
}

static void State_dealloc(State *s) {
    PyObject_GC_UnTrack(s);
    State_clear(s);
    Py_TYPE(s)->tp_free((PyObject *)s);
}

static PyMemberDef State_members[] = {
    {"active", T_INT, offsetof(State, active), 0, NULL},
    {"backward", T_INT, offsetof(State, backward), 0, NULL},
#define MEMBER(f) {#f, T_OBJECT, offsetof(State, f), 0, NULL},
    STATE_OBJECTS(MEMBER)
#undef MEMBER
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject StateType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "xray.debugger._tap.State",
    .tp_basicsize = sizeof(State),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "What every Tap of one ModuleHooks shares (fields set from Python).",
    .tp_new = PyType_GenericNew,
    .tp_traverse = (traverseproc)State_traverse,
    .tp_clear = (inquiry)State_clear,
    .tp_dealloc = (destructor)State_dealloc,
    .tp_members = State_members,
};

/* ---- the fast path ---------------------------------------------------------------------- */

static int is_tensor(State *s, PyObject *v) {
    PyObject *types = s->tensor_types;
    PyTypeObject *t = Py_TYPE(v);
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(types); i++)
        if ((PyObject *)t == PyTuple_GET_ITEM(types, i))
            return 1;
    return 0;
}

static int is_atom(PyObject *v) {
    return v == Py_None || PyBool_Check(v) || PyLong_CheckExact(v) || PyFloat_CheckExact(v) ||
           PyUnicode_CheckExact(v);
}

/* Append the tensors of v to out, in flatten_tensors' order. */
static int walk(State *s, PyObject *v, PyObject *out, int depth) {
    if (is_tensor(s, v))
        return PyList_Append(out, v);
    if (is_atom(v))
        return 0;
    if (depth < MAX_DEPTH && (PyTuple_CheckExact(v) || PyList_CheckExact(v))) {
        PyObject *seq = PySequence_Fast(v, "");  /* a new reference to v itself */
        if (seq == NULL)
            return -1;
        int rc = 0;
        for (Py_ssize_t i = 0; rc == 0 && i < PySequence_Fast_GET_SIZE(seq); i++) {
            PyObject *item = PySequence_Fast_GET_ITEM(seq, i);
            Py_INCREF(item); /* State.flatten may run Python code that changes a list */
            rc = walk(s, item, out, depth + 1);
            Py_DECREF(item);
        }
        Py_DECREF(seq);
        return rc;
    }
    if (depth < MAX_DEPTH && PyDict_CheckExact(v)) {
        PyObject *values = PyDict_Values(v); /* a snapshot: the walk runs no Python code, but be safe */
        if (values == NULL)
            return -1;
        int rc = walk(s, values, out, depth + 1);
        Py_DECREF(values);
        return rc;
    }
    PyObject *found = PyObject_CallOneArg(s->flatten, v); /* anything else: Python's own walk */
    if (found == NULL)
        return -1;
    int rc = PyList_Check(found) ? 0 : (PyErr_SetString(PyExc_TypeError, "flatten must return a list"), -1);
    if (rc == 0 && PyList_GET_SIZE(found))
        rc = PyList_SetSlice(out, PY_SSIZE_T_MAX, PY_SSIZE_T_MAX, found);
    Py_DECREF(found);
    return rc;
}

static PyObject *position_key(Py_ssize_t i) {
    if (i < NKEYS) {
        Py_INCREF(KEYS[i]);
        return KEYS[i];
    }
    return PyUnicode_FromFormat("%zd", i);
}

/* The cached cells of t's current version (a new reference), or NULL with no error on a miss. */
static PyObject *cached_cells(State *s, PyObject *t) {
    PyObject *id = PyLong_FromVoidPtr(t);
    if (id == NULL)
        return NULL;
    PyObject *hit = PyDict_GetItemWithError(s->entries, id); /* borrowed */
    Py_DECREF(id);
    if (hit == NULL || !PyTuple_Check(hit) || PyTuple_GET_SIZE(hit) != 3 ||
        !PyWeakref_Check(PyTuple_GET_ITEM(hit, 0)))
        return NULL;
    Py_INCREF(hit); /* the version lookup below runs torch code: keep the entry alive */
    PyObject *cells = NULL;
#if PY_VERSION_HEX >= 0x030D0000
    PyObject *referent = NULL;
    if (PyWeakref_GetRef(PyTuple_GET_ITEM(hit, 0), &referent) < 0) {
        Py_DECREF(hit);
        return NULL;
    }
    Py_XDECREF(referent); /* only its identity is compared */
#else
    PyObject *referent = PyWeakref_GetObject(PyTuple_GET_ITEM(hit, 0));
#endif
    if (referent == t) {
        PyObject *version = PyObject_GetAttr(t, S_VERSION);
        if (version == NULL) {  /* an inference tensor: never cached, so never here; be safe */
            PyErr_Clear();
        } else {
            int same = PyObject_RichCompareBool(version, PyTuple_GET_ITEM(hit, 1), Py_EQ);
            Py_DECREF(version);
            if (same > 0) {
                cells = PyTuple_GET_ITEM(hit, 2);
                Py_INCREF(cells);
            }
        }
    }
    Py_DECREF(hit);
    return cells;
}

/* One row for tensor t. prefix is "<module prefix>.<role>." */
static int capture(State *s, PyObject *call, PyObject *prefix, PyObject *role, PyObject *key, PyObject *t,
                   PyObject *keyword) {
    PyObject *cells = cached_cells(s, t);
    if (cells == NULL) {
        if (PyErr_Occurred())
            return -1;
        cells = PyObject_CallOneArg(s->cells_of, t);
        if (cells == NULL)
            return -1;
    }
    PyObject *name = NULL, *grad = NULL, *row = NULL;
    int rc = -1;
    if ((name = PyUnicode_Concat(prefix, key)) == NULL || (grad = PyObject_GetAttr(t, S_REQUIRES_GRAD)) == NULL ||
        (row = PyTuple_Pack(8, call, name, role, key, cells, grad, S_EMPTY, keyword)) == NULL ||
        PyList_Append(s->rows, row) < 0)
        goto done;
    rc = 0;
    /* cells is a capture.Cells: (stats, meta, numbers, csv, finite) */
    if (role == S_OUTPUT && s->on_overflow != Py_None && PyTuple_Check(cells) && PyTuple_GET_SIZE(cells) >= 5 &&
        PyTuple_GET_ITEM(cells, 4) == Py_False) {
        PyObject *r = PyObject_CallFunctionObjArgs(s->on_overflow, call, name, PyTuple_GET_ITEM(cells, 0), NULL);
        rc = r == NULL ? -1 : 0;
        Py_XDECREF(r);
    }
done:
    Py_XDECREF(row);
    Py_XDECREF(grad);
    Py_XDECREF(name);
    Py_DECREF(cells);
    return rc;
}

/* Rows for the tensors of `found`, keyed from `first` on. */
static int capture_all(State *s, PyObject *call, PyObject *prefix, PyObject *role, PyObject *found, Py_ssize_t first,
                       PyObject *keyword) {
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(found); i++) {
        PyObject *key = position_key(first + i);
        if (key == NULL)
            return -1;
        int rc = capture(s, call, prefix, role, key, PyList_GET_ITEM(found, i), keyword);
        Py_DECREF(key);
        if (rc < 0)
            return -1;
    }
    return 0;
}

/* ---- Tap: a module's forward, wrapped ---------------------------------------------------- */
typedef struct {
    PyObject_HEAD
    State *state;
    PyObject *forward; /* what it wraps: __wrapped__ */
    PyObject *slow;    /* the Python wrapper: every call that is not plain */
    PyObject *path, *cls, *params; /* the module's path, class name and live _parameters dict */
    vectorcallfunc vectorcall;
} Tap;

/* A call's "<path>.<Class>.<index>." (the root module, path "", is named by its class alone). */
static PyObject *call_prefix(Tap *tap, PyObject *index) {
    if (PyUnicode_GET_LENGTH(tap->path) == 0)
        return PyUnicode_FromFormat("%U.%S.", tap->cls, index);
    return PyUnicode_FromFormat("%U.%U.%S.", tap->path, tap->cls, index);
}

/* The inputs' and parameters' rows; returns the call's CallKey and module prefix. */
static int enter(Tap *tap, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames, PyObject **call_out,
                 PyObject **prefix_out) {
    State *s = tap->state;
    PyObject *index = NULL, *next = NULL, *seq = NULL, *fields = NULL, *call = NULL, *prefix = NULL;
    PyObject *role_prefix = NULL, *found = NULL;
    int rc = -1;
    index = PyDict_GetItemWithError(s->calls, tap->path);
    if (index == NULL) {
        if (PyErr_Occurred())
            goto done;
        index = PyLong_FromLong(0);
    } else {
        Py_INCREF(index);
    }
    if (index == NULL || (next = PyNumber_Add(index, ONE)) == NULL)
        goto done;
    if (PyDict_SetItem(s->calls, tap->path, next) < 0 || (seq = PyObject_CallNoArgs(s->next_seq)) == NULL)
        goto done;
    if ((fields = PyTuple_Pack(6, s->step, seq, tap->path, tap->cls, index, S_FORWARD)) == NULL ||
        (call = PyObject_CallOneArg(s->call_key, fields)) == NULL || (prefix = call_prefix(tap, index)) == NULL)
        goto done;
    /* positional tensors first, then each keyword's, numbered on: flatten_tensors((args, kwargs)) */
    if ((found = PyList_New(0)) == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < nargs; i++)
        if (walk(s, args[i], found, 0) < 0)
            goto done;
    Py_ssize_t numbered = PyList_GET_SIZE(found);
    if ((role_prefix = PyUnicode_Concat(prefix, S_INPUT_DOT)) == NULL ||
        capture_all(s, call, role_prefix, S_INPUT, found, 0, S_EMPTY) < 0)
        goto done;
    Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    for (Py_ssize_t j = 0; j < nkw; j++) {
        PyObject *value = args[nargs + j];
        if (is_atom(value))
            continue;
        Py_SETREF(found, PyList_New(0));
        if (found == NULL || walk(s, value, found, 0) < 0 ||
            capture_all(s, call, role_prefix, S_INPUT, found, numbered, PyTuple_GET_ITEM(kwnames, j)) < 0)
            goto done;
        numbered += PyList_GET_SIZE(found);
    }
    if (PyDict_GET_SIZE(tap->params)) {
        Py_SETREF(role_prefix, PyUnicode_Concat(prefix, S_PARAMS_DOT));
        if (role_prefix == NULL)
            goto done;
        PyObject *params = PyDict_Copy(tap->params); /* a snapshot: capture may run Python code */
        if (params == NULL)
            goto done;
        Py_ssize_t pos = 0;
        PyObject *name, *p;
        int failed = 0;
        while (!failed && PyDict_Next(params, &pos, &name, &p))
            if (p != Py_None)
                failed = capture(s, call, role_prefix, S_PARAMS, name, p, S_EMPTY) < 0;
        Py_DECREF(params);
        if (failed)
            goto done;
    }
    *call_out = call, *prefix_out = prefix;
    call = prefix = NULL;
    rc = 0;
done:
    Py_XDECREF(index);
    Py_XDECREF(next);
    Py_XDECREF(seq);
    Py_XDECREF(fields);
    Py_XDECREF(call);
    Py_XDECREF(prefix);
    Py_XDECREF(role_prefix);
    Py_XDECREF(found);
    return rc;
}

/* The outputs' rows. */
static int leave(Tap *tap, PyObject *call, PyObject *prefix, PyObject *output) {
    State *s = tap->state;
    PyObject *found = PyList_New(0), *role_prefix = NULL;
    int rc = -1;
    if (found != NULL && walk(s, output, found, 0) == 0 && (role_prefix = PyUnicode_Concat(prefix, S_OUTPUT_DOT)) != NULL)
        rc = capture_all(s, call, role_prefix, S_OUTPUT, found, 0, S_EMPTY);
    Py_XDECREF(found);
    Py_XDECREF(role_prefix);
    return rc;
}

/* Hand the pending exception to State.on_error (which stops the capture); 0 unless that fails. */
static int report(State *s) {
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (tb != NULL && value != NULL)
        PyException_SetTraceback(value, tb);
    PyObject *r = PyObject_CallOneArg(s->on_error, value != NULL ? value : Py_None);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    return 0;
}

/* Whether this call may take the fast path (-1: error). */
static int plain_call(State *s) {
    PyObject *depth = PyObject_CallNoArgs(s->dispatch_depth);
    if (depth == NULL)
        return -1;
    int modes = PyObject_IsTrue(depth);
    Py_DECREF(depth);
    if (modes != 0)
        return modes < 0 ? -1 : 0;
    if (!s->backward)
        return 1;
    PyObject *grad = PyObject_CallNoArgs(s->grad_enabled);
    if (grad == NULL)
        return -1;
    int on = PyObject_IsTrue(grad);
    Py_DECREF(grad);
    return on < 0 ? -1 : !on;
}

static PyObject *Tap_vectorcall(Tap *tap, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    State *s = tap->state;
    if (!s->active)
        return PyObject_Vectorcall(tap->forward, args, nargsf, kwnames);
    int plain = plain_call(s);
    if (plain < 0)
        return NULL;
    if (!plain)
        return PyObject_Vectorcall(tap->slow, args, nargsf, kwnames);
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    PyObject *call = NULL, *prefix = NULL;
    Py_INCREF(tap); /* a failing capture may remove this Tap from the module */
    if (enter(tap, args, nargs, kwnames, &call, &prefix) < 0 && report(s) < 0) {
        Py_DECREF(tap);
        return NULL;
    }
    PyObject *output = PyObject_Vectorcall(tap->forward, args, nargsf, kwnames);
    if (output != NULL && call != NULL && s->active && leave(tap, call, prefix, output) < 0 && report(s) < 0)
        Py_CLEAR(output);
    Py_XDECREF(call);
    Py_XDECREF(prefix);
    Py_DECREF(tap);
    return output;
}

static PyObject *Tap_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    State *state;
    PyObject *forward, *slow, *path, *cls, *params;
    static char *names[] = {"state", "forward", "slow", "path", "cls", "params", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!OOUUO!:Tap", names, &StateType, &state, &forward, &slow, &path,
                                     &cls, &PyDict_Type, &params))
        return NULL;
    Tap *tap = (Tap *)type->tp_alloc(type, 0);
    if (tap == NULL)
        return NULL;
    Py_INCREF(state), Py_INCREF(forward), Py_INCREF(slow), Py_INCREF(path), Py_INCREF(cls), Py_INCREF(params);
    tap->state = state, tap->forward = forward, tap->slow = slow, tap->path = path, tap->cls = cls;
    tap->params = params;
    tap->vectorcall = (vectorcallfunc)Tap_vectorcall;
    return (PyObject *)tap;
}

#define TAP_OBJECTS(X) X(state) X(forward) X(slow) X(path) X(cls) X(params)

static int Tap_traverse(Tap *tap, visitproc visit, void *arg) {
#define VISIT(f) Py_VISIT(tap->f);
    TAP_OBJECTS(VISIT)
#undef VISIT
    return 0;
}

static int Tap_clear(Tap *tap) {
#define CLEAR(f) Py_CLEAR(tap->f);
    TAP_OBJECTS(CLEAR)
#undef CLEAR
    return 0;
}

static void Tap_dealloc(Tap *tap) {
    PyObject_GC_UnTrack(tap);
    Tap_clear(tap);
    Py_TYPE(tap)->tp_free((PyObject *)tap);
}

static PyObject *Tap_reduce(Tap *tap, PyObject *unused) {
    /* A copy would run the original module's forward: refuse loudly (copy, deepcopy, pickle). */
    PyErr_SetString(PyExc_TypeError, "xray PrecisionDebugger: a module cannot be copied or pickled between "
                                     "start() and stop(); do it before start() or after stop()");
    return NULL;
}

static PyMethodDef Tap_methods[] = {
    {"__reduce__", (PyCFunction)Tap_reduce, METH_NOARGS, NULL},
    {"__reduce_ex__", (PyCFunction)Tap_reduce, METH_O, NULL},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef Tap_members[] = {
    {"__wrapped__", T_OBJECT, offsetof(Tap, forward), READONLY, "the forward this Tap wraps"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject TapType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "xray.debugger._tap.Tap",
    .tp_basicsize = sizeof(Tap),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "Tap(state, forward, slow, path, cls, params): a module's forward, captured (see the module doc).",
    .tp_new = Tap_new,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(Tap, vectorcall),
    .tp_traverse = (traverseproc)Tap_traverse,
    .tp_clear = (inquiry)Tap_clear,
    .tp_dealloc = (destructor)Tap_dealloc,
    .tp_members = Tap_members,
    .tp_methods = Tap_methods,
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, .m_name = "_tap", .m_size = -1};

PyMODINIT_FUNC PyInit__tap(void) {
    for (int i = 0; i < NKEYS; i++)
        if ((KEYS[i] = PyUnicode_FromFormat("%d", i)) == NULL)
            return NULL;
#define INTERN(var, text)                                                                      \
    if ((var = PyUnicode_InternFromString(text)) == NULL)                                      \
        return NULL;
    INTERN(S_VERSION, "_version")
    INTERN(S_REQUIRES_GRAD, "requires_grad")
    INTERN(S_EMPTY, "")
    INTERN(S_FORWARD, "forward")
    INTERN(S_INPUT, "forward_input")
    INTERN(S_PARAMS, "forward_params")
    INTERN(S_OUTPUT, "forward_output")
    INTERN(S_INPUT_DOT, "forward_input.")
    INTERN(S_PARAMS_DOT, "forward_params.")
    INTERN(S_OUTPUT_DOT, "forward_output.")
#undef INTERN
    if ((ONE = PyLong_FromLong(1)) == NULL || PyType_Ready(&StateType) < 0 || PyType_Ready(&TapType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&StateType);
    Py_INCREF(&TapType);
    if (PyModule_AddObject(m, "State", (PyObject *)&StateType) < 0 ||
        PyModule_AddObject(m, "Tap", (PyObject *)&TapType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
