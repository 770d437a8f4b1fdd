/* xray.record._fastpath: the recorder's row path for the common ATen call, in C.
 *
 * Why it exists: recording every call (X_DEDUP=False) spent most of its time in the Python glue
 * around each call (argument walk, cache and producer lookups, the plan, the row), not in the
 * statistics: 5 ms of a 12 ms Llama forward (docs/performance.md). This file is that glue for
 * the calls that make up nearly all of a model's forward: plain tensors (torch.Tensor,
 * nn.Parameter) and plain values as arguments and results, on any device (the statistics of a
 * tensor off the CPU come from the recorder's own function, which queues them: DeferredStats).
 *
 * It takes its decisions from the general path, it does not make them. xray/record/rows.py is
 * the one path that records every call: every cell written here is the cell RowPath writes,
 * every cache entry the one StatsCache stores, every data edge the one Producers keeps, and both
 * share the same dicts, so the two interleave freely within one dump (tests/test_record_rows.py
 * records each scenario both ways and compares every field). What an op is (whether this path
 * takes its calls, which of the cache's rules apply to it) comes from rows.op_facts, once per
 * op. Whatever is not the common case goes back to Python at a point where nothing has been
 * done that Python would not redo identically:
 *   - the whole call (FastPath.on_op returns FALLBACK before anything changed): the recorder
 *     failed, other dispatch modes are below ours, autograd's backward is running, an op
 *     op_facts leaves to Python (a collective), an argument of a kind this path does not key
 *     (tensor subclasses, SymInts, opaque objects);
 *   - one tensor (RowPath._tensor): a tensor the recorder notes instead of reducing (meta,
 *     nested, quantized, sparse), a shape, stride, dtype or device never seen;
 *   - the call's result (Recorder._after): an in-place call, an op that keeps its input's values
 *     whose result is not new, a result of a kind the row path keys by its text.
 * Saved tensors (X_DUMP_NUM) and Python stacks (STACK) are the general path's: with either on,
 * rows.native_path builds no FastPath.
 * Python's errors keep their meaning: an error before the op runs stops the recording with a
 * warning (Recorder._fail) and the op runs; after it, the same and the result is returned.
 *
 * Statistics: the one-pass formula of xray/dump/stats.py (_reduce) on xray.dump._moments' C pass,
 * for the CPU tensors that pass takes and whose elements are all finite; every other tensor goes
 * to the recorder's own function (StatsCache.compute), which gives the same cells for these.
 *
 * Every tuple this file stores holds only atoms (ints, floats, untracked objects) and is taken
 * out of the garbage collector's lists at birth, as the collector itself would do on its first
 * pass (_PyTuple_MaybeUntrack): recording then adds next to no work for the collector.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stddef.h>
#include <structmember.h>

#include "../dump/moments_api.h"

/* xray.dump._moments' passes, where that extension is built: the statistics of a CPU tensor
 * without a Python call (native_stats); NULL: the recorder's own function computes them all. */
static const xray_moments_api *moments_api;

/* -- names, interned once ------------------------------------------------------------------ */
static PyObject *s_shape, *s_dtype, *s_stride, *s_device, *s_data_ptr, *s_version, *s_is_inference,
    *s_requires_grad, *s_is_cpu, *s_is_nested, *s_layout, *s_storage_offset, *s_numel, *s_count, *s_last,
    *s_dirty, *s_writes, *s_seq, *s_op_calls, *s_records_written, *s_failed, *s_by_id, *s_sweep_at, *s_op,
    *s_skeleton, *s_roles, *s_names, *s_f,
    *s_name_attr, *s_is_neg, *s_builder, *s_row_lists, *s_flush, *s_flush_records, *s_flush_seconds,
    *s_last_flush, *s_writer, *s_folds, *s_folds_flush, *s_folds_full, *s_unwritten_buffers, *s_wrote_through,
    *s_input;

static PyObject *FALLBACK; /* FastPath.on_op's answer: Python takes this call, nothing was done */

/* -- RowCall: a call between its inputs' description and its result ----------------------- */
typedef struct {
    PyObject_HEAD
    PyObject *info, *seq, *direction, *frames, *key, *signature, *args, *kwargs, *layouts, *stats, *sources,
        *notes, *outs, *data, *stack;
} RowCall;

#define RC_MEMBER(name) {#name, T_OBJECT, offsetof(RowCall, name), 0, NULL}
static PyMemberDef rowcall_members[] = {
    RC_MEMBER(info), RC_MEMBER(seq), RC_MEMBER(direction), RC_MEMBER(frames), RC_MEMBER(key),
    RC_MEMBER(signature), RC_MEMBER(args), RC_MEMBER(kwargs), RC_MEMBER(layouts), RC_MEMBER(stats),
    RC_MEMBER(sources), RC_MEMBER(notes), RC_MEMBER(outs), RC_MEMBER(data), RC_MEMBER(stack),
    {NULL, 0, 0, 0, NULL},
};

static void rowcall_dealloc(RowCall *c) {
    Py_XDECREF(c->info), Py_XDECREF(c->seq), Py_XDECREF(c->direction), Py_XDECREF(c->frames);
    Py_XDECREF(c->key), Py_XDECREF(c->signature), Py_XDECREF(c->args), Py_XDECREF(c->kwargs);
    Py_XDECREF(c->layouts), Py_XDECREF(c->stats), Py_XDECREF(c->sources), Py_XDECREF(c->notes);
    Py_XDECREF(c->outs), Py_XDECREF(c->data), Py_XDECREF(c->stack);
    PyObject_Free(c);
}

/* No cycle can pass through a RowCall (it holds an op's arguments and cells, which never refer
 * back to it), so it stays out of the garbage collector's lists, like the tuples it holds. */
static PyTypeObject RowCallType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "xray.record._fastpath.RowCall",
    .tp_basicsize = sizeof(RowCall),
    .tp_dealloc = (destructor)rowcall_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A call between before and after: its inputs' cells, taken before it ran (rows.RowCall).",
    .tp_members = rowcall_members,
    .tp_new = PyType_GenericNew,
};

/* -- per-op facts, keyed by the OpOverload's address (held, so never reused) --------------- */
/* Worked out once per op in Python (rows.op_facts), where every rule they carry lives; this
 * table only remembers them: the OpInfo, whether this path takes the op's calls at all
 * (``common``), whether it also takes those that make a new record (``records``; else only the
 * calls de-dup folds), and which of the statistics cache's rules apply (cache_rules.py). */
typedef struct {
    PyObject *func, *info, *roles; /* the OpOverload, its OpInfo (encode.op_info) and the OpInfo's roles */
    int common, records, view, preserving, mutates, writes, checked;
} OpFacts;

/* -- FastPath ------------------------------------------------------------------------------ */
typedef struct {
    PyObject_HEAD
    /* shared state: the same objects the Python row path reads and writes */
    PyObject *rdict, *cache, *producers, *entries, *seen, *stack, *plans, *frame_ids, *dims, *dtypes,
        *state, *devices;
    PyObject *cpu, *keyed, *tensor_mark, *input_source, *no_source, *src_op, *none_id, *forward, *zero, *one;
    PyObject *tensor_type, *param_type, *folds_into, *op_facts, *compute, *len_modes, *graph_task;
    /* Python's own steps, for everything that is not the common case */
    PyObject *py_tensor, *py_layout, *py_plan, *py_state_cells, *py_frame_ids, *py_after, *py_fail, *py_add_rows,
        *py_count_changed, *py_sweep, *py_wrote, *py_produced, *py_producers_sweep,
        *py_checks; /* RowPath.checks: a checked op's self-checks (self_check.py), in Python */
    PyObject *native_kinds, *strided; /* stats._NATIVE_KINDS (empty: no native statistics), torch.strided */
    /* the cache's resample (a value handed on to a tensor of the same elements gets that tensor's
     * own sample) and samples.offsets_bytes (the sample's storage offsets per shape and stride) */
    PyObject *resample, *sample_offsets;
    /* Direct appends to the writer's pending chunk (ColumnBuilder.row_lists), where the writer
     * is a DumpWriter's own; writer None: every record through py_add_rows. */
    PyObject *writer, *monotonic, *builder, *lists;
    Py_ssize_t native_max; /* stats._NATIVE_MAX */
    Py_ssize_t reductions; /* tensors reduced by native_stats (tests count them) */
    int dedup, writes_seen;
    OpFacts *ops;
    Py_ssize_t ops_cap, ops_len;
} FastPath;

#define FP_OBJECTS(X)                                                                                      \
    X(rdict) X(cache) X(producers) X(entries) X(seen) X(stack) X(plans) X(frame_ids) X(dims)    \
    X(dtypes) X(devices) X(state) X(cpu) X(keyed) X(tensor_mark) X(input_source) X(no_source) X(src_op) X(none_id)      \
    X(forward) X(zero) X(one) X(tensor_type) X(param_type) X(folds_into) X(op_facts) X(compute) X(len_modes)   \
    X(graph_task) X(py_tensor) X(py_layout) X(py_plan) X(py_state_cells) X(py_frame_ids) X(py_after)         \
    X(py_fail) X(py_add_rows) X(py_count_changed) X(py_sweep) X(py_wrote) X(py_produced)                     \
    X(py_producers_sweep) X(native_kinds) X(strided) X(writer) X(monotonic) X(builder) X(lists)             \
    X(resample) X(sample_offsets) X(py_checks)

static int fp_traverse(FastPath *self, visitproc visit, void *arg) {
#define VISIT(name) Py_VISIT(self->name);
    FP_OBJECTS(VISIT)
#undef VISIT
    for (Py_ssize_t i = 0; i < self->ops_cap; i++) {
        Py_VISIT(self->ops[i].func);
        Py_VISIT(self->ops[i].info);
        Py_VISIT(self->ops[i].roles);
    }
    return 0;
}

static int fp_clear(FastPath *self) {
#define CLEAR(name) Py_CLEAR(self->name);
    FP_OBJECTS(CLEAR)
#undef CLEAR
    for (Py_ssize_t i = 0; i < self->ops_cap; i++) {
        Py_CLEAR(self->ops[i].func);
        Py_CLEAR(self->ops[i].info);
        Py_CLEAR(self->ops[i].roles);
    }
    self->ops_len = 0;
    return 0;
}

static void fp_dealloc(FastPath *self) {
    PyObject_GC_UnTrack(self);
    fp_clear(self);
    PyMem_Free(self->ops);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* The keyword arguments, in the order of the struct's pointers they fill (rows.native_path). */
static const char *const init_names[] = {
    "recorder", "cache", "producers", "entries", "seen", "stack", "plans", "frame_ids", "dims", "dtypes", "state",
    "cpu", "keyed", "tensor_mark", "input_source", "no_source", "src_op", "none_id", "forward", "tensor_type",
    "param_type", "folds_into", "op_facts", "compute", "len_modes", "graph_task", "py_tensor", "py_layout",
    "py_plan", "py_state_cells", "py_frame_ids", "py_after", "py_fail", "py_add_rows", "py_count_changed",
    "py_sweep", "py_wrote", "py_produced", "py_producers_sweep", "native_kinds", "strided", "writer",
    "monotonic", "resample", "sample_offsets", "py_checks", "devices"};
#define N_INIT_OBJECTS ((int)(sizeof init_names / sizeof init_names[0]))

static int fp_init(FastPath *self, PyObject *args, PyObject *kw) {
    PyObject *recorder = NULL; /* only its instance dict is kept (rdict) */
    PyObject **slots[] = {
        &recorder, &self->cache, &self->producers, &self->entries, &self->seen, &self->stack, &self->plans,
        &self->frame_ids, &self->dims, &self->dtypes, &self->state, &self->cpu, &self->keyed, &self->tensor_mark,
        &self->input_source, &self->no_source, &self->src_op, &self->none_id, &self->forward, &self->tensor_type,
        &self->param_type, &self->folds_into, &self->op_facts, &self->compute, &self->len_modes, &self->graph_task,
        &self->py_tensor, &self->py_layout, &self->py_plan, &self->py_state_cells, &self->py_frame_ids,
        &self->py_after, &self->py_fail, &self->py_add_rows, &self->py_count_changed, &self->py_sweep,
        &self->py_wrote, &self->py_produced, &self->py_producers_sweep, &self->native_kinds, &self->strided,
        &self->writer, &self->monotonic, &self->resample, &self->sample_offsets, &self->py_checks, &self->devices};
    _Static_assert(sizeof slots / sizeof slots[0] == sizeof init_names / sizeof init_names[0], "one slot a name");
    (void)recorder;
    if (PyTuple_GET_SIZE(args) != 0 || kw == NULL) {
        PyErr_SetString(PyExc_TypeError, "FastPath takes keyword arguments only");
        return -1;
    }
    PyObject *values[N_INIT_OBJECTS];
    for (int i = 0; i < N_INIT_OBJECTS; i++) {
        if ((values[i] = PyDict_GetItemString(kw, init_names[i])) == NULL) {
            PyErr_Format(PyExc_TypeError, "FastPath: missing %s", init_names[i]);
            return -1;
        }
    }
    PyObject *native_max = PyDict_GetItemString(kw, "native_max"), *ws = PyDict_GetItemString(kw, "writes_seen");
    if (native_max == NULL || ws == NULL || PyDict_GET_SIZE(kw) != N_INIT_OBJECTS + 2) {
        PyErr_SetString(PyExc_TypeError, "FastPath: native_max and writes_seen, and no other names");
        return -1;
    }
    PyObject *seen = values[4];
    if (!PyDict_Check(values[3]) || !(seen == Py_None || PyDict_Check(seen)) || !PyList_Check(values[5]) ||
        !PyDict_Check(values[6]) || !PyDict_Check(values[7]) || !PyDict_Check(values[8]) ||
        !PyDict_Check(values[9]) || !PyDict_Check(values[10]) || !PyAnySet_Check(values[12]) ||
        !PyType_Check(values[19]) || !PyType_Check(values[20]) || !PyDict_Check(values[39]) ||
        !PyDict_Check(values[N_INIT_OBJECTS - 1])) {
        PyErr_SetString(PyExc_TypeError, "FastPath: entries, seen, plans, frame_ids, dims, dtypes, state, "
                                         "native_kinds and devices are dicts, stack a list, keyed a set, the tensor types types");
        return -1;
    }
    /* The recorder's counters and failure are read and written in its instance dict: they must
     * be plain attributes there (Recorder.__init__ sets them). */
    PyObject *rdict = PyObject_GenericGetDict(values[0], NULL);
    if (rdict == NULL)
        return -1;
    PyObject *needed[] = {s_seq, s_op_calls, s_records_written, s_failed};
    for (int i = 0; i < 4; i++) {
        if (PyDict_GetItemWithError(rdict, needed[i]) == NULL) {
            if (!PyErr_Occurred())
                PyErr_Format(PyExc_TypeError, "FastPath: the recorder has no attribute %U", needed[i]);
            Py_DECREF(rdict);
            return -1;
        }
    }
    Py_XSETREF(self->rdict, rdict);
    for (int i = 1; i < N_INIT_OBJECTS; i++)
        Py_XSETREF(*slots[i], Py_NewRef(values[i]));
    self->native_max = PyLong_AsSsize_t(native_max);
    self->writes_seen = PyObject_IsTrue(ws);
    self->dedup = seen != Py_None;
    Py_XSETREF(self->zero, PyLong_FromLong(0));
    Py_XSETREF(self->one, PyLong_FromLong(1));
    return (PyErr_Occurred() || self->zero == NULL || self->one == NULL || self->writes_seen < 0) ? -1 : 0;
}

/* -- small helpers -------------------------------------------------------------------------- */
static inline PyObject *call0(PyObject *obj, PyObject *name) {
    return PyObject_VectorcallMethod(name, &obj, 1 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
}

static inline PyObject *call1(PyObject *callable, PyObject *a) {
    return PyObject_Vectorcall(callable, &a, 1, NULL);
}

/* A call whose result is not wanted: 0, or -1 with its error. */
static int done_with(PyObject *result) {
    if (result == NULL)
        return -1;
    Py_DECREF(result);
    return 0;
}

/* 1 true, 0 false, -1 error */
static int attr_true(PyObject *obj, PyObject *name) {
    PyObject *v = PyObject_GetAttr(obj, name);
    if (v == NULL)
        return -1;
    int r = PyObject_IsTrue(v);
    Py_DECREF(v);
    return r;
}

/* The object a weak reference points to, for an identity test only (never dereferenced). */
static PyObject *weak_target(PyObject *ref) {
    if (!PyWeakref_CheckRef(ref))
        return NULL;
#if PY_VERSION_HEX >= 0x030D0000
    PyObject *o = NULL;
    if (PyWeakref_GetRef(ref, &o) <= 0) {
        PyErr_Clear();
        return NULL;
    }
    Py_DECREF(o);
    return o;
#else
    PyObject *o = PyWeakref_GetObject(ref);
    return o == Py_None ? NULL : o;
#endif
}

/* Clear a RuntimeError (what torch raises for tensors without storage or strides): 1 if it was
 * one, 0 (error kept) otherwise. */
static int clear_runtime_error(void) {
    if (PyErr_ExceptionMatches(PyExc_RuntimeError)) {
        PyErr_Clear();
        return 1;
    }
    return 0;
}

/* Hand a failed step to Python's own: an Exception is cleared (1: Python redoes the step);
 * anything else (KeyboardInterrupt...) stays set (-1). */
static int to_python(void) {
    if (PyErr_Occurred() && !PyErr_ExceptionMatches(PyExc_Exception))
        return -1;
    PyErr_Clear();
    return 1;
}

/* A tuple of atoms leaves the collector's lists now rather than at its first pass; any other
 * tuple stays. Returns the tuple. */
static PyObject *untracked(PyObject *tuple) {
    if (tuple == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(tuple); i++) {
        PyObject *item = PyTuple_GET_ITEM(tuple, i);
        if (PyObject_IS_GC(item) && PyObject_GC_IsTracked(item))
            return tuple;
    }
    PyObject_GC_UnTrack(tuple);
    return tuple;
}

/* The weak reference to t that identity checks use: torch's tensors share one without a
 * callback, which refers to nothing the collector could follow, so it is untracked too. */
static PyObject *weak_ref(PyObject *t) {
    PyObject *ref = PyWeakref_NewRef(t, NULL);
    if (ref != NULL && PyObject_GC_IsTracked(ref))
        PyObject_GC_UnTrack(ref);
    return ref;
}

static inline int is_plain(FastPath *self, PyObject *a) {
    PyObject *t = (PyObject *)Py_TYPE(a);
    return t == self->tensor_type || t == self->param_type;
}

static int is_atom(PyObject *a) { /* encode.ATOMS */
    return a == Py_None || PyBool_Check(a) || PyLong_CheckExact(a) || PyUnicode_CheckExact(a);
}

static Py_ssize_t int_attr(PyObject *obj, PyObject *name) {
    PyObject *v = PyObject_GetAttr(obj, name);
    Py_ssize_t n = v ? PyLong_AsSsize_t(v) : -1;
    Py_XDECREF(v);
    return n;
}

static double float_attr(PyObject *obj, PyObject *name) {
    PyObject *v = PyObject_GetAttr(obj, name);
    double d = v ? PyFloat_AsDouble(v) : -1.0;
    Py_XDECREF(v);
    return d;
}

/* recorder.<name> += 1; *before (optional) gets the old value (new reference). */
static int bump(FastPath *self, PyObject *name, PyObject **before) {
    PyObject *v = PyDict_GetItemWithError(self->rdict, name);
    if (v == NULL) {
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_RuntimeError, "xray fast path: the recorder lost %U", name);
        return -1;
    }
    Py_INCREF(v);
    PyObject *next = PyNumber_Add(v, self->one);
    int r = next ? PyDict_SetItem(self->rdict, name, next) : -1;
    Py_XDECREF(next);
    if (before != NULL && r == 0)
        *before = v;
    else
        Py_DECREF(v);
    return r;
}

/* -- per-op facts ----------------------------------------------------------------------------- */
static size_t op_slot(FastPath *self, PyObject *func) {
    size_t mask = (size_t)self->ops_cap - 1, i = (((size_t)func >> 4) * 11400714819323198485ull) & mask;
    while (self->ops[i].func != NULL && self->ops[i].func != func)
        i = (i + 1) & mask;
    return i;
}

static OpFacts *op_facts(FastPath *self, PyObject *func) {
    if (self->ops_cap) {
        OpFacts *f = &self->ops[op_slot(self, func)];
        if (f->func == func)
            return f;
    }
    if ((self->ops_len + 1) * 2 > self->ops_cap) { /* grow, keeping the table at most half full */
        OpFacts *old = self->ops;
        Py_ssize_t old_cap = self->ops_cap, cap = old_cap ? old_cap * 2 : 256;
        OpFacts *fresh = PyMem_Calloc((size_t)cap, sizeof(OpFacts));
        if (fresh == NULL) {
            PyErr_NoMemory();
            return NULL;
        }
        self->ops = fresh, self->ops_cap = cap;
        for (Py_ssize_t j = 0; j < old_cap; j++)
            if (old[j].func != NULL)
                self->ops[op_slot(self, old[j].func)] = old[j];
        PyMem_Free(old);
    }
    /* (info, common, records, view, preserving, mutates, writes, checked) */
    PyObject *facts = call1(self->op_facts, func);
    if (facts == NULL)
        return NULL;
    if (!PyTuple_CheckExact(facts) || PyTuple_GET_SIZE(facts) != 8) {
        Py_DECREF(facts);
        PyErr_SetString(PyExc_TypeError, "xray fast path: op_facts gives (info, common, records, view, "
                                         "preserving, mutates, writes, checked)");
        return NULL;
    }
    int flags[7];
    for (int i = 0; i < 7; i++)
        flags[i] = PyObject_IsTrue(PyTuple_GET_ITEM(facts, i + 1));
    PyObject *info = PyTuple_GET_ITEM(facts, 0), *roles = PyObject_GetAttr(info, s_roles);
    OpFacts f = {func, Py_NewRef(info), roles, flags[0], flags[1], flags[2], flags[3], flags[4], flags[5], flags[6]};
    Py_DECREF(facts);
    if (PyErr_Occurred() || f.common < 0 || f.records < 0 || f.view < 0 || f.preserving < 0 || f.mutates < 0
        || f.writes < 0 || f.checked < 0) {
        Py_DECREF(f.info), Py_XDECREF(f.roles);
        return NULL;
    }
    int strs = PyTuple_CheckExact(roles) && PyTuple_GET_SIZE(roles) > 0;
    for (Py_ssize_t i = 0; strs && i < PyTuple_GET_SIZE(roles); i++)
        strs = PyUnicode_CheckExact(PyTuple_GET_ITEM(roles, i));
    if (!strs) { /* atoms, so the producers' entries stay untracked */
        Py_DECREF(f.info), Py_DECREF(f.roles);
        PyErr_SetString(PyExc_TypeError, "xray fast path: an OpInfo's roles are not a tuple of str");
        return NULL;
    }
    Py_INCREF(func);
    OpFacts *slot = &self->ops[op_slot(self, func)];
    *slot = f;
    self->ops_len++;
    return slot;
}

/* -- arguments and results: the values the row path keys (rows.RowPath._input, _output) ------ */
/* 1: a plain tensor, a value keyed by itself, a float, or a list/tuple of them; 0: anything else
 * (an argument the row path does not key, a result it keys by its text: Python's). */
static int supported(FastPath *self, PyObject *a, int depth) {
    if (is_plain(self, a) || PyFloat_CheckExact(a))
        return 1;
    int keyed = PySet_Contains(self->keyed, (PyObject *)Py_TYPE(a));
    if (keyed != 0)
        return keyed; /* 1, or -1 on error */
    if ((PyList_CheckExact(a) || PyTuple_CheckExact(a)) && depth < 8) {
        Py_ssize_t n = PySequence_Fast_GET_SIZE(a);
        for (Py_ssize_t i = 0; i < n; i++) {
            int r = supported(self, PySequence_Fast_GET_ITEM(a, i), depth + 1);
            if (r != 1)
                return r;
        }
        return 1;
    }
    return 0;
}

/* encode.signature_key's key of a tensor: (shape, dtype, stride, device). */
static PyObject *tensor_key(PyObject *t) {
    PyObject *shape = PyObject_GetAttr(t, s_shape), *dtype = shape ? PyObject_GetAttr(t, s_dtype) : NULL;
    PyObject *stride = dtype ? call0(t, s_stride) : NULL, *device = stride ? PyObject_GetAttr(t, s_device) : NULL;
    PyObject *key = device ? PyTuple_Pack(4, shape, dtype, stride, device) : NULL;
    Py_XDECREF(shape), Py_XDECREF(dtype), Py_XDECREF(stride), Py_XDECREF(device);
    return key;
}

/* encode._key, for the values `supported` lets through. */
static PyObject *value_key(FastPath *self, PyObject *a) {
    if (is_plain(self, a))
        return tensor_key(a);
    if (PyList_CheckExact(a) || PyTuple_CheckExact(a)) {
        Py_ssize_t n = PySequence_Fast_GET_SIZE(a);
        PyObject *out = PyTuple_New(n);
        for (Py_ssize_t i = 0; out != NULL && i < n; i++) {
            PyObject *k = value_key(self, PySequence_Fast_GET_ITEM(a, i));
            if (k == NULL)
                Py_CLEAR(out);
            else
                PyTuple_SET_ITEM(out, i, k);
        }
        return out;
    }
    if (PyFloat_CheckExact(a)) {
        PyObject *r = PyObject_Repr(a), *out = r ? PyTuple_Pack(2, s_f, r) : NULL;
        Py_XDECREF(r);
        return out;
    }
    if (is_atom(a))
        return PyTuple_Pack(2, (PyObject *)Py_TYPE(a), a);
    /* dtype, device, layout, memory_format: (type name, repr) */
    PyObject *name = PyObject_GetAttr((PyObject *)Py_TYPE(a), s_name_attr), *r = name ? PyObject_Repr(a) : NULL;
    PyObject *out = r ? PyTuple_Pack(2, name, r) : NULL;
    Py_XDECREF(name), Py_XDECREF(r);
    return out;
}

/* encode.signature_key: the de-dup identity of a call; NULL without error when it has none
 * (a getter raised TypeError or RuntimeError: recorded, never folded). */
static PyObject *signature_key(FastPath *self, OpFacts *op, PyObject *args, PyObject *kwargs) {
    Py_ssize_t n = PyTuple_GET_SIZE(args), nk = PyDict_GET_SIZE(kwargs);
    PyObject *parts = PyTuple_New(1 + n + nk);
    if (parts == NULL)
        return NULL;
    PyTuple_SET_ITEM(parts, 0, Py_NewRef(op->info));
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *a = PyTuple_GET_ITEM(args, i);
        PyObject *k = is_atom(a) ? PyTuple_Pack(2, (PyObject *)Py_TYPE(a), a) : value_key(self, a);
        if (k == NULL)
            goto fail;
        PyTuple_SET_ITEM(parts, 1 + i, k);
    }
    Py_ssize_t pos = 0, i = 1 + n;
    PyObject *name, *value;
    while (PyDict_Next(kwargs, &pos, &name, &value)) {
        PyObject *vk = value_key(self, value), *k = vk ? PyTuple_Pack(2, name, vk) : NULL;
        Py_XDECREF(vk);
        if (k == NULL)
            goto fail;
        PyTuple_SET_ITEM(parts, i++, k);
    }
    return parts;
fail:
    Py_DECREF(parts);
    if (PyErr_ExceptionMatches(PyExc_TypeError) || PyErr_ExceptionMatches(PyExc_RuntimeError))
        PyErr_Clear();
    return NULL;
}

static PyObject *data_ptr(PyObject *t);
static int producer_entry(FastPath *self, PyObject *t, PyObject *id, PyObject *ptr, PyObject **entry);

/* Producers.roles: the role of each tensor in a (a list's items too) appended to roles: its
 * producer entry's, or "input" without one. 0, or -1 on error. */
static int add_roles(FastPath *self, PyObject *a, PyObject *roles) {
    if (is_plain(self, a)) {
        PyObject *id = PyLong_FromVoidPtr(a), *ptr = id ? data_ptr(a) : NULL, *entry = NULL;
        int r = ptr == NULL || producer_entry(self, a, id, ptr, &entry) < 0
                    ? -1 : PyList_Append(roles, entry ? PyTuple_GET_ITEM(entry, 4) : s_input);
        Py_XDECREF(id), Py_XDECREF(ptr), Py_XDECREF(entry);
        return r;
    }
    if (PyList_CheckExact(a) || PyTuple_CheckExact(a))
        for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(a); i++)
            if (add_roles(self, PySequence_Fast_GET_ITEM(a, i), roles) < 0)
                return -1;
    return 0;
}

/* Producers.roles: what produced each tensor argument, positional then keyword (new reference). */
static PyObject *roles_of(FastPath *self, PyObject *args, PyObject *kwargs) {
    PyObject *roles = PyList_New(0), *name, *value;
    for (Py_ssize_t i = 0; roles != NULL && i < PyTuple_GET_SIZE(args); i++)
        if (add_roles(self, PyTuple_GET_ITEM(args, i), roles) < 0)
            Py_CLEAR(roles);
    Py_ssize_t pos = 0;
    while (roles != NULL && PyDict_Next(kwargs, &pos, &name, &value))
        if (add_roles(self, value, roles) < 0)
            Py_CLEAR(roles);
    PyObject *out = roles ? PyList_AsTuple(roles) : NULL;
    Py_XDECREF(roles);
    return out;
}

/* encode.dedup_key: (signature, the innermost module's path or None, the arguments' roles); the
 * forward stack, as this path takes forward calls only. NULL without error where the call has
 * no signature, or a TypeError or RuntimeError came up (recorder._before: recorded, never folded). */
static PyObject *dedup_key(FastPath *self, OpFacts *op, PyObject *args, PyObject *kwargs) {
    PyObject *signature = signature_key(self, op, args, kwargs);
    if (signature == NULL)
        return NULL;
    Py_ssize_t depth = PyList_GET_SIZE(self->stack);
    PyObject *frame = depth ? PyList_GET_ITEM(self->stack, depth - 1) : NULL;
    if (frame != NULL && (!PyTuple_Check(frame) || PyTuple_GET_SIZE(frame) < 1)) {
        Py_DECREF(signature);
        PyErr_SetString(PyExc_RuntimeError, "xray fast path: a module frame is not a (path, class) pair");
        return NULL;
    }
    PyObject *roles = roles_of(self, args, kwargs);
    PyObject *key = roles ? PyTuple_Pack(3, signature, frame ? PyTuple_GET_ITEM(frame, 0) : Py_None, roles) : NULL;
    Py_DECREF(signature), Py_XDECREF(roles);
    if (key == NULL && (PyErr_ExceptionMatches(PyExc_TypeError) || PyErr_ExceptionMatches(PyExc_RuntimeError)))
        PyErr_Clear();
    return key;
}

/* -- tensors ---------------------------------------------------------------------------------- */
/* StatsCache.stamp: the version a cache entry is valid for, or None (new reference). */
static PyObject *stamp(FastPath *self, PyObject *t) {
    PyObject *inf = call0(t, s_is_inference);
    if (inf == NULL)
        return NULL;
    int inference = inf == Py_True;
    Py_DECREF(inf);
    if (inference) {
        if (!self->writes_seen)
            Py_RETURN_NONE;
        PyObject *writes = PyObject_GetAttr(self->cache, s_writes);
        if (writes == NULL)
            return NULL;
        long long w = PyLong_AsLongLong(writes);
        Py_DECREF(writes);
        if (w == -1 && PyErr_Occurred())
            return NULL;
        return PyLong_FromLongLong(-1 - w);
    }
    PyObject *v = PyObject_GetAttr(t, s_version);
    if (v == NULL && clear_runtime_error())
        Py_RETURN_NONE;
    return v;
}

/* t.data_ptr(), or None where it has none (new reference). */
static PyObject *data_ptr(PyObject *t) {
    PyObject *p = call0(t, s_data_ptr);
    if (p == NULL && clear_runtime_error())
        Py_RETURN_NONE;
    return p;
}

/* What describing a new tensor reads once: its layout cells, and the shape, strides and dtype
 * its statistics need (new references; all NULL when not filled). */
typedef struct {
    PyObject *cells, *shape, *stride, *dtype;
    int cpu; /* its memory is the host's: native_stats may read it */
} Layout;

static void layout_clear(Layout *l) {
    Py_CLEAR(l->cells);
    Py_CLEAR(l->shape);
    Py_CLEAR(l->stride);
    Py_CLEAR(l->dtype);
}

/* RowPath._layout for a strided tensor whose texts are all interned: (dtype, shape, stride,
 * offset, device) ids, on any device (an accelerator's statistics go to the recorder's own
 * function, which queues them). 1: filled; 0: not that case (Python's _layout decides, notes
 * included), *unseen set where only a text was missing; -1: error. What encode.unsupported
 * refuses never gets here: a meta device and a quantized dtype are never interned (Python's
 * _layout notes the tensor before interning it), and a nested one is asked. */
static int layout_cells(FastPath *self, PyObject *t, Layout *l, int *unseen) {
    *l = (Layout){NULL, NULL, NULL, NULL, 0};
    PyObject *v = NULL, *offset = NULL, *shape_id, *dtype_id, *stride_id, *device_id;
    int r = 0;
    *unseen = 0;
    if ((v = PyObject_GetAttr(t, s_is_nested)) == NULL || v != Py_False)
        goto done;
    Py_SETREF(v, PyObject_GetAttr(t, s_layout));
    if (v != self->strided)
        goto done;
    Py_SETREF(v, PyObject_GetAttr(t, s_is_cpu));
    if (v == NULL)
        goto done;
    l->cpu = v == Py_True;
    *unseen = 1;
    if (l->cpu)
        device_id = self->cpu;
    else { /* another device: its text, interned by Python's _layout the first time */
        Py_SETREF(v, PyObject_GetAttr(t, s_device));
        if (v == NULL || (device_id = PyDict_GetItemWithError(self->devices, v)) == NULL)
            goto done;
    }
    if ((l->shape = PyObject_GetAttr(t, s_shape)) == NULL ||
        (shape_id = PyDict_GetItemWithError(self->dims, l->shape)) == NULL)
        goto done;
    if ((l->dtype = PyObject_GetAttr(t, s_dtype)) == NULL ||
        (dtype_id = PyDict_GetItemWithError(self->dtypes, l->dtype)) == NULL)
        goto done;
    if ((l->stride = call0(t, s_stride)) == NULL || (stride_id = PyDict_GetItemWithError(self->dims, l->stride)) == NULL)
        goto done;
    *unseen = 0;
    if ((offset = call0(t, s_storage_offset)) == NULL)
        goto done;
    if ((l->cells = untracked(PyTuple_Pack(5, dtype_id, shape_id, stride_id, offset, device_id))) != NULL)
        r = 1;
done:
    Py_XDECREF(v), Py_XDECREF(offset);
    if (r == 1)
        return 1;
    layout_clear(l);
    if (PyErr_Occurred() && !clear_runtime_error()) /* RuntimeError (no strides): Python decides */
        return -1;
    return 0;
}

/* layout_cells, where a text seen for the first time is first interned by Python's
 * RowPath._layout (which raises for what it notes: -1 with that error set). */
static int layout_interned(FastPath *self, PyObject *t, Layout *l) {
    int unseen, r = layout_cells(self, t, l, &unseen);
    if (r != 0 || !unseen)
        return r;
    if (done_with(call1(self->py_layout, t)) < 0)
        return -1;
    return layout_cells(self, t, l, &unseen);
}

/* layout_interned, or Python's RowPath._layout for the rest (l->shape NULL then: no native
 * statistics). -1 with an error set: the tensor is noted (rows._Noted) or cannot be read, which
 * RowPath._tensor turns into a note. */
static int layout_of(FastPath *self, PyObject *t, Layout *l) {
    int r = layout_interned(self, t, l);
    if (r != 0)
        return r;
    return (l->cells = call1(self->py_layout, t)) != NULL ? 1 : -1;
}

/* stats.stats_row for a CPU tensor that stats._native_moments takes and whose elements are all
 * finite, by the same one-pass formula (new reference). NULL without an error: not such a tensor,
 * or the formula does not hold (constant sums lost to rounding, NaN or Inf): the recorder's own
 * function then reduces it exactly as before. */
static PyObject *native_stats(FastPath *self, PyObject *t, PyObject *ptr, Layout *l) {
    if (moments_api == NULL || !l->cpu || l->shape == NULL || ptr == Py_None || !PyTuple_Check(l->shape) ||
        !PyTuple_Check(l->stride))
        return NULL;
    PyObject *kind = PyDict_GetItemWithError(self->native_kinds, l->dtype), *out = NULL;
    Py_ssize_t ndim = PyTuple_GET_SIZE(l->shape), sizes[16], strides[16], n = 1;
    if (kind == NULL || ndim > 16 || PyTuple_GET_SIZE(l->stride) != ndim)
        goto done;
    for (Py_ssize_t i = 0; i < ndim; i++) { /* numel, without asking */
        sizes[i] = PyLong_AsSsize_t(PyTuple_GET_ITEM(l->shape, i));
        strides[i] = PyLong_AsSsize_t(PyTuple_GET_ITEM(l->stride, i));
        if (sizes[i] < 0 || (sizes[i] && n > self->native_max / sizes[i]))
            goto done;
        n *= sizes[i];
    }
    if (PyErr_Occurred() || n <= 0 || n > self->native_max)
        goto done;
    PyObject *neg = call0(t, s_is_neg);
    int negated = neg != Py_False;
    Py_XDECREF(neg);
    if (negated)
        goto done;
    const void *p = PyLong_AsVoidPtr(ptr);
    long k = PyLong_AsLong(kind);
    double m[4];
    /* one pass over the tensor's contiguous runs (a contiguous tensor is one run) */
    if (PyErr_Occurred() || moments_api->strided(p, (int)k, ndim, sizes, strides, m) != 0)
        goto done;
    double lo = m[0], hi = m[1], total = m[2], sq = m[3], mean, std;
    /* stats._reduce, operation for operation (built with -ffp-contract=off: the same bits) */
    if (!(lo - lo == 0.0 && hi - hi == 0.0 && total - total == 0.0))
        goto done;
    if (lo == hi) {
        mean = lo, std = 0.0;
    } else {
        mean = total / (double)n;
        double var = sq / (double)n - mean * mean;
        if (!(var - var == 0.0 && var > 1e-3 * mean * mean))
            goto done;
        std = pow(var, 0.5); /* Python's var ** 0.5 */
    }
    /* the sample (stats.sample_bytes): the elements at the offsets Python keeps per shape and stride */
    PyObject *key_offsets = PyObject_CallFunctionObjArgs(self->sample_offsets, l->shape, l->stride, NULL);
    if (key_offsets == NULL || !PyBytes_Check(key_offsets))
        goto sampled;
    Py_ssize_t taken = PyBytes_GET_SIZE(key_offsets) / 8;
    PyObject *sample = taken ? PyBytes_FromStringAndSize(NULL, taken * 8) : NULL;
    if (sample != NULL && moments_api->gather(p, (int)k, (const int64_t *)PyBytes_AS_STRING(key_offsets), taken,
                                              (double *)PyBytes_AS_STRING(sample)) != 0)
        Py_CLEAR(sample);
    Py_DECREF(key_offsets);
    if (sample == NULL)
        goto sampled;
    out = untracked(Py_BuildValue("(iiddddiiinN)", 1, 0, lo, hi, mean, std, 0, 0, 0, n, sample));
    self->reductions++;
sampled:
done:
    if (out == NULL)
        PyErr_Clear(); /* the recorder's own function says what is wrong, if anything */
    return out;
}

/* The statistics cells of t: native_stats where it applies, else the recorder's own function. */
static PyObject *stats_of(FastPath *self, PyObject *t, PyObject *ptr, Layout *l) {
    PyObject *cells = native_stats(self, t, ptr, l);
    return cells != NULL ? cells : call1(self->compute, t);
}

/* (layout + (requires_grad,)): the six layout cells of a tensor row (meta on). */
static PyObject *row_layout(PyObject *layout, PyObject *t) {
    if (!PyTuple_CheckExact(layout) || PyTuple_GET_SIZE(layout) != 5) {
        PyErr_SetString(PyExc_RuntimeError, "xray fast path: a layout is not 5 cells");
        return NULL;
    }
    PyObject *rg = PyObject_GetAttr(t, s_requires_grad), *out = rg ? PyTuple_New(6) : NULL;
    if (out == NULL) {
        Py_XDECREF(rg);
        return NULL;
    }
    for (int i = 0; i < 5; i++)
        PyTuple_SET_ITEM(out, i, Py_NewRef(PyTuple_GET_ITEM(layout, i)));
    PyTuple_SET_ITEM(out, 5, rg);
    return untracked(out);
}

static int append3(RowCall *call, PyObject *layout, PyObject *stats, PyObject *source) {
    return (PyList_Append(call->layouts, layout) < 0 || PyList_Append(call->stats, stats) < 0 ||
            PyList_Append(call->sources, source) < 0) ? -1 : 0;
}

/* cache_rules.same_values: the condition under which an op that keeps its input's values hands
 * on that input's statistics: the same dtype and as many elements, in the same memory (a view;
 * a copy gets statistics of its own). 1 yes, 0 no, -1 error. */
static int same_values(PyObject *src, PyObject *dst) {
    PyObject *d1 = PyObject_GetAttr(src, s_dtype), *d2 = d1 ? PyObject_GetAttr(dst, s_dtype) : NULL;
    PyObject *n1 = d2 ? call0(src, s_numel) : NULL, *n2 = n1 ? call0(dst, s_numel) : NULL;
    int same = n2 ? (d1 == d2 ? PyObject_RichCompareBool(n1, n2, Py_EQ) : 0) : -1;
    Py_XDECREF(d1), Py_XDECREF(d2), Py_XDECREF(n1), Py_XDECREF(n2);
    if (same != 1)
        return same;
    PyObject *a = call0(src, s_data_ptr), *b = a ? call0(dst, s_data_ptr) : NULL;
    same = b ? PyObject_RichCompareBool(a, b, Py_EQ) : -1;
    Py_XDECREF(a), Py_XDECREF(b);
    return same;
}

/* StatsCache.store: the one entry of t, as of version and ptr, and the sweep of dead ones. */
static int store(FastPath *self, PyObject *id, PyObject *t, PyObject *version, PyObject *ptr, PyObject *value,
                 PyObject *layout) {
    PyObject *ref = weak_ref(t);
    PyObject *entry = ref ? untracked(PyTuple_Pack(5, ref, version, ptr, value, layout ? layout : Py_None)) : NULL;
    Py_XDECREF(ref);
    int r = entry ? PyDict_SetItem(self->entries, id, entry) : -1;
    Py_XDECREF(entry);
    if (r < 0)
        return -1;
    Py_ssize_t sweep_at = int_attr(self->cache, s_sweep_at);
    if (sweep_at == -1 && PyErr_Occurred())
        return -1;
    return PyDict_GET_SIZE(self->entries) >= sweep_at ? done_with(PyObject_CallNoArgs(self->py_sweep)) : 0;
}

/* The live cache entry of this very tensor object (a borrowed reference), or NULL. */
static PyObject *entry_of(FastPath *self, PyObject *id, PyObject *t) {
    PyObject *hit = PyDict_GetItemWithError(self->entries, id);
    if (hit != NULL && PyTuple_CheckExact(hit) && PyTuple_GET_SIZE(hit) == 5 && weak_target(PyTuple_GET_ITEM(hit, 0)) == t)
        return hit;
    return NULL;
}

/* StatsCache.put: cache value for t under version (a view's result: its base's counter),
 * keeping the layout this same tensor was just described with. */
static int put(FastPath *self, PyObject *t, PyObject *value, PyObject *version) {
    if ((PyObject *)Py_TYPE(t) == self->param_type) /* parameters are never cached */
        return 0;
    PyObject *ptr = data_ptr(t), *id = ptr ? PyLong_FromVoidPtr(t) : NULL;
    int r = -1;
    if (id == NULL || ptr == Py_None) {
        r = ptr == Py_None ? 0 : -1; /* no storage: not cached */
        goto done;
    }
    PyObject *old = entry_of(self, id, t), *layout = NULL;
    if (old != NULL) {
        int same = PyObject_RichCompareBool(PyTuple_GET_ITEM(old, 2), ptr, Py_EQ);
        if (same < 0)
            goto done;
        if (same)
            layout = Py_NewRef(PyTuple_GET_ITEM(old, 4));
    } else if (PyErr_Occurred()) {
        goto done;
    }
    r = store(self, id, t, version, ptr, value, layout == Py_None ? NULL : layout);
    Py_XDECREF(layout);
done:
    Py_XDECREF(ptr), Py_XDECREF(id);
    return r;
}

/* StatsCache.describe(t, RowPath._layout) for a plain tensor (id and ptr: its id and data
 * pointer): 1 with *value and *layout set (new references); 0: Python describes it
 * (RowPath._tensor), nothing was changed; -1: error. */
static int describe(FastPath *self, PyObject *t, PyObject *id, PyObject *ptr, PyObject **value, PyObject **layout) {
    *value = *layout = NULL;
    PyObject *version = stamp(self, t);
    if (version == NULL)
        return -1;
    if (ptr == Py_None) /* no storage: StatsCache never caches it */
        Py_SETREF(version, Py_NewRef(Py_None));
    Layout l = {NULL, NULL, NULL, NULL};
    int result = 0;
    PyObject *hit = version == Py_None ? NULL : PyDict_GetItemWithError(self->entries, id);
    Py_XINCREF(hit); /* held: the layout below may run Python code */
    if (hit != NULL && PyTuple_CheckExact(hit) && PyTuple_GET_SIZE(hit) == 5) {
        int same = PyObject_RichCompareBool(PyTuple_GET_ITEM(hit, 1), version, Py_EQ);
        if (same == 1)
            same = PyObject_RichCompareBool(PyTuple_GET_ITEM(hit, 2), ptr, Py_EQ);
        if (same < 0) {
            result = -1;
            goto done;
        }
        if (same == 1 && weak_target(PyTuple_GET_ITEM(hit, 0)) == t) {
            PyObject *cells = PyTuple_GET_ITEM(hit, 4);
            if (cells == Py_None) { /* cached by put() without a layout: add it */
                if (layout_of(self, t, &l) < 0)
                    goto python;
                PyObject *entry = untracked(PyTuple_Pack(5, PyTuple_GET_ITEM(hit, 0), PyTuple_GET_ITEM(hit, 1),
                                                         PyTuple_GET_ITEM(hit, 2), PyTuple_GET_ITEM(hit, 3), l.cells));
                if (entry == NULL || PyDict_SetItem(self->entries, id, entry) < 0) {
                    Py_XDECREF(entry);
                    result = -1;
                    goto done;
                }
                Py_DECREF(entry);
                cells = l.cells;
            }
            *value = Py_NewRef(PyTuple_GET_ITEM(hit, 3));
            *layout = Py_NewRef(cells);
            result = 1;
            goto done;
        }
    } else if (hit == NULL && PyErr_Occurred()) {
        result = -1;
        goto done;
    }
    /* a miss: layout first (it refuses what cannot be reduced), then the statistics */
    if (layout_of(self, t, &l) < 0 || (*value = stats_of(self, t, ptr, &l)) == NULL)
        goto python;
    *layout = Py_NewRef(l.cells);
    /* parameters are never cached (StatsCache(keep_parameters=False)) */
    if (version != Py_None && (PyObject *)Py_TYPE(t) == self->tensor_type &&
        store(self, id, t, version, ptr, *value, *layout) < 0) {
        Py_CLEAR(*value);
        Py_CLEAR(*layout);
        result = -1;
        goto done;
    }
    result = 1;
    goto done;
python:
    /* a note (rows._Noted) or an error in the statistics: RowPath._tensor gives the answer the
     * Python path gives, notes included */
    result = to_python() < 0 ? -1 : 0;
done:
    layout_clear(&l);
    Py_XDECREF(hit), Py_DECREF(version);
    return result;
}

/* Producers.entry_of: t's producer entry (a new reference in *entry; NULL when t is a model
 * input: no entry, another object under its id, or another storage). 0, or -1 on error. */
static int producer_entry(FastPath *self, PyObject *t, PyObject *id, PyObject *ptr, PyObject **entry) {
    *entry = NULL;
    PyObject *by_id = PyObject_GetAttr(self->producers, s_by_id), *hit;
    int r = -1;
    if (by_id == NULL)
        return -1;
    if (!PyDict_Check(by_id)) {
        PyErr_SetString(PyExc_RuntimeError, "xray fast path: Producers._by_id is not a dict");
        goto done;
    }
    if ((hit = PyDict_GetItemWithError(by_id, id)) == NULL) {
        r = PyErr_Occurred() ? -1 : 0;
        goto done;
    }
    Py_INCREF(hit); /* held: Python code may run below */
    if (!PyTuple_CheckExact(hit) || PyTuple_GET_SIZE(hit) != 5 || weak_target(PyTuple_GET_ITEM(hit, 0)) != t) {
        Py_DECREF(hit);
        r = 0;
        goto done;
    }
    int same = PyObject_RichCompareBool(ptr, PyTuple_GET_ITEM(hit, 3), Py_EQ);
    if (same > 0)
        *entry = hit;
    else
        Py_DECREF(hit);
    r = same < 0 ? -1 : 0;
done:
    Py_DECREF(by_id);
    return r;
}

/* RowPath._source: the input's data-edge cells (new reference). */
static PyObject *source_cells(FastPath *self, PyObject *t, PyObject *id, PyObject *ptr) {
    PyObject *entry, *out = NULL;
    if (producer_entry(self, t, id, ptr, &entry) < 0)
        return NULL;
    if (entry == NULL)
        return Py_NewRef(self->input_source);
    PyObject *src = PyTuple_GET_ITEM(entry, 1);
    if (PyLong_CheckExact(src))
        out = untracked(PyTuple_Pack(4, self->src_op, src, PyTuple_GET_ITEM(entry, 2), self->none_id));
    else if ((out = PyDict_GetItemWithError(self->state, src)) != NULL)
        Py_INCREF(out);
    else if (!PyErr_Occurred())
        out = call1(self->py_state_cells, src);
    Py_DECREF(entry);
    return out;
}

/* RowPath._tensor: one tensor's cells into the call, or Python's own step for it. */
static int add_tensor(FastPath *self, RowCall *call, PyObject *t, PyObject *source) {
    PyObject *value, *layout;
    PyObject *ptr = data_ptr(t), *id = ptr ? PyLong_FromVoidPtr(t) : NULL;
    int r = -1;
    if (id == NULL)
        goto done;
    /* an input's data edge (an output's source is given: it has none) */
    source = source != NULL ? Py_NewRef(source) : source_cells(self, t, id, ptr);
    if (source == NULL)
        goto done;
    r = describe(self, t, id, ptr, &value, &layout);
    if (r == 1) {
        PyObject *cells = row_layout(layout, t);
        r = cells ? append3(call, cells, value, source) : -1;
        Py_XDECREF(cells), Py_DECREF(value), Py_DECREF(layout);
    } else if (r == 0) {
        PyObject *argv[] = {t, (PyObject *)call, source};
        r = done_with(PyObject_Vectorcall(self->py_tensor, argv, 3, NULL));
    }
    Py_DECREF(source);
done:
    Py_XDECREF(ptr), Py_XDECREF(id);
    return r < 0 ? -1 : 0;
}

/* -- before the call ---------------------------------------------------------------------------- */
/* RowPath._input and RowPath._output: a value's part of the plan key; its tensors' cells go into
 * the call (a result's tensors also into call->outs, with no data edge). Floats are keyed by
 * their text (1.0 == 1 == True and NaN != NaN in a dict). */
static PyObject *key_part(FastPath *self, RowCall *call, PyObject *v, int result) {
    if (is_plain(self, v)) {
        if (result && PyList_Append(call->outs, v) < 0)
            return NULL;
        return add_tensor(self, call, v, result ? self->no_source : NULL) < 0 ? NULL : Py_NewRef(self->tensor_mark);
    }
    if (PyFloat_CheckExact(v)) {
        PyObject *r = PyObject_Repr(v), *out = r ? PyTuple_Pack(2, (PyObject *)&PyFloat_Type, r) : NULL;
        Py_XDECREF(r);
        return out;
    }
    if (PyList_CheckExact(v) || PyTuple_CheckExact(v)) {
        Py_ssize_t n = PySequence_Fast_GET_SIZE(v);
        PyObject *items = PyTuple_New(n);
        for (Py_ssize_t i = 0; items != NULL && i < n; i++) {
            PyObject *part = key_part(self, call, PySequence_Fast_GET_ITEM(v, i), result);
            if (part == NULL)
                Py_CLEAR(items);
            else
                PyTuple_SET_ITEM(items, i, part);
        }
        PyObject *out = items ? PyTuple_Pack(2, (PyObject *)Py_TYPE(v), items) : NULL;
        Py_XDECREF(items);
        return out;
    }
    return PyTuple_Pack(2, (PyObject *)Py_TYPE(v), v); /* keyed by value (checked by `supported`) */
}

/* RowPath.before, for a call whose arguments are all `supported`. */
static RowCall *before(FastPath *self, OpFacts *op, PyObject *args, PyObject *kwargs, PyObject *seq,
                       PyObject *signature) {
    RowCall *call = PyObject_New(RowCall, &RowCallType);
    if (call == NULL)
        return NULL;
    call->info = Py_NewRef(op->info), call->seq = Py_NewRef(seq), call->direction = Py_NewRef(self->forward);
    call->args = Py_NewRef(args), call->kwargs = Py_NewRef(kwargs);
    call->signature = Py_NewRef(signature ? signature : Py_None);
    call->notes = Py_NewRef(Py_None), call->outs = Py_NewRef(Py_None);
    call->data = Py_NewRef(Py_None), call->stack = Py_NewRef(Py_None); /* saved data and Python stacks: Python's */
    call->frames = PyList_AsTuple(self->stack); /* the module stack as it is now */
    call->layouts = PyList_New(0), call->stats = PyList_New(0), call->sources = PyList_New(0);
    Py_ssize_t n = PyTuple_GET_SIZE(args), nk = PyDict_GET_SIZE(kwargs);
    call->key = PyTuple_New(1 + n + nk);
    if (call->frames == NULL || call->layouts == NULL || call->stats == NULL || call->sources == NULL ||
        call->key == NULL)
        goto fail;
    PyTuple_SET_ITEM(call->key, 0, Py_NewRef(op->info)); /* the op, hashed by identity */
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *part = key_part(self, call, PyTuple_GET_ITEM(args, i), 0);
        if (part == NULL)
            goto fail;
        PyTuple_SET_ITEM(call->key, 1 + i, part);
    }
    Py_ssize_t pos = 0, i = 1 + n;
    PyObject *name, *value;
    while (PyDict_Next(kwargs, &pos, &name, &value)) {
        PyObject *part = key_part(self, call, value, 0), *pair = part ? PyTuple_Pack(2, name, part) : NULL;
        Py_XDECREF(part);
        if (pair == NULL)
            goto fail;
        PyTuple_SET_ITEM(call->key, i++, pair);
    }
    return call;
fail:
    Py_DECREF(call);
    return NULL;
}

/* -- after the call: data edges ----------------------------------------------------------------- */
/* Producers._produce: the tensor t now holds output k of call seq, in role (an OpInfo.roles item). */
static int produce(FastPath *self, PyObject *by_id, PyObject *t, PyObject *seq, PyObject *k, PyObject *role) {
    PyObject *id = PyLong_FromVoidPtr(t), *ptr = NULL, *ref = NULL, *fresh = NULL;
    int r = -1;
    if (id == NULL)
        return -1;
    PyObject *entry = PyDict_GetItemWithError(by_id, id);
    if (entry == NULL && PyErr_Occurred())
        goto done;
    if (entry != NULL && PyTuple_CheckExact(entry) && PyTuple_GET_SIZE(entry) == 5 &&
        PyUnicode_CheckExact(PyTuple_GET_ITEM(entry, 1)) && weak_target(PyTuple_GET_ITEM(entry, 0)) == t) {
        r = 0; /* module state mutated in place keeps its name */
        goto done;
    }
    if ((ptr = data_ptr(t)) == NULL || (ref = weak_ref(t)) == NULL ||
        (fresh = untracked(PyTuple_Pack(5, ref, seq, k, ptr, role))) == NULL || PyDict_SetItem(by_id, id, fresh) < 0)
        goto done;
    Py_ssize_t sweep_at = int_attr(self->producers, s_sweep_at);
    if (sweep_at == -1 && PyErr_Occurred())
        goto done;
    r = PyDict_GET_SIZE(by_id) > sweep_at ? done_with(PyObject_CallNoArgs(self->py_producers_sweep)) : 0;
done:
    Py_XDECREF(id), Py_XDECREF(ptr), Py_XDECREF(ref), Py_XDECREF(fresh);
    return r;
}

/* Producers.produced: one plain tensor, or a list/tuple of plain tensors and non-tensors, here
 * (item i in role op->roles[i], or roles[0] past them: a Tensor[] result); anything else in Python. */
static int produced(FastPath *self, OpFacts *op, PyObject *seq, PyObject *out) {
    int simple = is_plain(self, out);
    if (!simple && (PyTuple_CheckExact(out) || PyList_CheckExact(out))) {
        simple = 1;
        for (Py_ssize_t i = 0; simple && i < PySequence_Fast_GET_SIZE(out); i++) {
            PyObject *o = PySequence_Fast_GET_ITEM(out, i);
            simple = is_plain(self, o) || is_atom(o) || PyFloat_CheckExact(o);
        }
    }
    if (!simple) {
        PyObject *argv[] = {seq, op->roles, out};
        return done_with(PyObject_Vectorcall(self->py_produced, argv, 3, NULL));
    }
    int single = is_plain(self, out), r = 0;
    Py_ssize_t n = single ? 1 : PySequence_Fast_GET_SIZE(out), k = 0;
    for (Py_ssize_t i = 0; r == 0 && i < n; i++) {
        PyObject *o = single ? out : PySequence_Fast_GET_ITEM(out, i);
        if (!is_plain(self, o))
            continue;
        PyObject *role = PyTuple_GET_ITEM(op->roles, i < PyTuple_GET_SIZE(op->roles) ? i : 0);
        PyObject *by_id = PyObject_GetAttr(self->producers, s_by_id); /* each time: a sweep replaces it */
        PyObject *index = by_id ? PyLong_FromSsize_t(k++) : NULL;
        if (index != NULL && !PyDict_Check(by_id))
            PyErr_SetString(PyExc_RuntimeError, "xray fast path: Producers._by_id is not a dict");
        r = index != NULL && PyDict_Check(by_id) ? produce(self, by_id, o, seq, index, role) : -1;
        Py_XDECREF(by_id), Py_XDECREF(index);
    }
    return r;
}

/* -- after the call: the result ----------------------------------------------------------------- */
/* RowPath._new_output: describe and cache a call's single new result in one step. 1: done;
 * 0: not the common case, nothing changed (the general steps take it); -1: error. */
static int new_output(FastPath *self, OpFacts *op, RowCall *call, PyObject *t) {
    if ((PyObject *)Py_TYPE(t) != self->tensor_type)
        return 0;
    PyObject *args = call->args, *first = PyTuple_GET_SIZE(args) ? PyTuple_GET_ITEM(args, 0) : NULL;
    PyObject *id = PyLong_FromVoidPtr(t), *version = NULL, *ptr = NULL, *stats = NULL;
    Layout l = {NULL, NULL, NULL, NULL};
    int r = -1;
    if (id == NULL)
        return -1;
    if (entry_of(self, id, t) != NULL) { /* an existing tensor (lift_fresh returns its input) */
        r = 0;
        goto done;
    }
    if (PyErr_Occurred())
        goto done;
    if (op->view) { /* a view takes its base's counter once the call returns */
        if (first == NULL || !is_plain(self, first)) {
            r = 0;
            goto done;
        }
        version = stamp(self, first);
    } else {
        version = stamp(self, t);
    }
    if (version == NULL || version == Py_None || (ptr = call0(t, s_data_ptr)) == NULL)
        goto python;
    int laid = layout_interned(self, t, &l);
    if (laid < 0)
        goto python; /* noted, or a getter raised: the general steps note the tensor */
    if (laid == 0) {
        r = 0;
        goto done;
    }
    int reuse = 0; /* the op keeps its first input's values: that input's statistics */
    if (op->preserving && first != NULL && is_plain(self, first) && PyList_GET_SIZE(call->stats) > 0) {
        int noted = call->notes != Py_None && PyDict_Check(call->notes) ? PyDict_Contains(call->notes, self->zero) : 0;
        if (noted < 0)
            goto python;
        if (!noted && (reuse = same_values(first, t)) < 0)
            goto python;
    }
    stats = reuse ? PyObject_CallFunctionObjArgs(self->resample, PyList_GET_ITEM(call->stats, 0), t, NULL)
                  : stats_of(self, t, ptr, &l);
    if (stats == NULL)
        goto python;
    if (store(self, id, t, version, ptr, stats, l.cells) < 0)
        goto done;
    PyObject *cells = row_layout(l.cells, t);
    r = cells && append3(call, cells, stats, self->no_source) == 0 ? 1 : -1;
    Py_XDECREF(cells);
    goto done;
python:
    r = to_python() < 0 ? -1 : 0; /* an exotic tensor: the general steps describe (or note) it */
done:
    layout_clear(&l);
    Py_DECREF(id), Py_XDECREF(version), Py_XDECREF(ptr), Py_XDECREF(stats);
    return r;
}

/* cache_rules.cache_view_outputs: a view's results take their base's counter once the call
 * returns; their statistics are cached under that stamp. */
static int cache_view_outputs(FastPath *self, RowCall *call, Py_ssize_t first_out) {
    PyObject *base = PyTuple_GET_SIZE(call->args) ? PyTuple_GET_ITEM(call->args, 0) : NULL;
    if (base == NULL || !is_plain(self, base))
        return 0;
    PyObject *version = stamp(self, base);
    if (version == NULL)
        return -1;
    int r = 0;
    for (Py_ssize_t i = 0; r == 0 && version != Py_None && i < PyList_GET_SIZE(call->outs); i++) {
        Py_ssize_t row = first_out + i;
        PyObject *index = NULL;
        int noted = 0;
        if (call->notes != Py_None && PyDict_Check(call->notes)) {
            index = PyLong_FromSsize_t(row);
            noted = index ? PyDict_Contains(call->notes, index) : -1;
            Py_XDECREF(index);
        }
        if (noted < 0)
            r = -1;
        else if (!noted)
            r = put(self, PyList_GET_ITEM(call->outs, i), PyList_GET_ITEM(call->stats, row), version);
    }
    Py_DECREF(version);
    return r;
}

/* cache_rules.reuse_input_stats for a single result: it holds the first input's values, so it
 * is cached with the statistics that input was described with. 1: done (or nothing to do); 0:
 * not this case (Python's after takes the call; nothing was changed); -1: error. */
static int reuse_input_stats(FastPath *self, RowCall *call, PyObject *out) {
    PyObject *src = PyTuple_GET_SIZE(call->args) ? PyTuple_GET_ITEM(call->args, 0) : NULL;
    if (src == NULL || !is_plain(self, src))
        return 1; /* not a tensor: nothing to hand on */
    int noted = call->notes != Py_None && PyDict_Check(call->notes) ? PyDict_Contains(call->notes, self->zero) : 0;
    if (noted != 0 || !is_plain(self, out) || PyList_GET_SIZE(call->stats) == 0)
        return noted < 0 ? -1 : 0; /* the input was not described, or several results */
    int same = same_values(src, out);
    if (same <= 0)
        return same < 0 ? -1 : 1;
    PyObject *version = stamp(self, out);
    if (version == NULL)
        return -1;
    PyObject *value = version == Py_None ? NULL
                                         : PyObject_CallFunctionObjArgs(self->resample, PyList_GET_ITEM(call->stats, 0),
                                                                        out, NULL);
    int r = version == Py_None ? 0 : value == NULL ? -1 : put(self, out, value, version);
    Py_DECREF(version), Py_XDECREF(value);
    return r < 0 ? -1 : 1;
}

/* RowPath.after's general steps, for a result new_output did not take: the plan key's part of
 * the result (NULL without error: Python's after takes the call; nothing was changed). */
static PyObject *general_outputs(FastPath *self, OpFacts *op, RowCall *call, PyObject *out) {
    /* in place: the written arguments are forgotten first, in Python */
    int ok = op->mutates ? 0 : supported(self, out, 0); /* else: keyed by its text, in Python */
    if (ok == 1 && op->preserving)
        ok = reuse_input_stats(self, call, out);
    if (ok <= 0) {
        if (ok < 0)
            to_python(); /* an Exception: Python's after redoes the step; anything else stays set */
        return NULL;
    }
    Py_ssize_t first_out = PyList_GET_SIZE(call->layouts);
    Py_SETREF(call->outs, PyList_New(0));
    if (call->outs == NULL)
        return NULL;
    PyObject *part = key_part(self, call, out, 1);
    if (part != NULL && op->view && PyList_GET_SIZE(call->outs) && cache_view_outputs(self, call, first_out) < 0)
        Py_CLEAR(part);
    if (part == NULL && !PyErr_Occurred())
        PyErr_SetString(PyExc_RuntimeError, "xray fast path: a result could not be described");
    return part;
}

/* -- the record ---------------------------------------------------------------------------------- */
/* The writer's flush timer (DumpWriter._maybe_flush, DumpWriter.folded): 1 when flush_seconds
 * have passed since its last flush, 0 if not, -1 on error. */
static int timer_due(FastPath *self, PyObject *writer) {
    PyObject *now = PyObject_CallNoArgs(self->monotonic);
    double t = now ? PyFloat_AsDouble(now) : -1.0;
    Py_XDECREF(now);
    double last = float_attr(writer, s_last_flush), every = float_attr(writer, s_flush_seconds);
    if (PyErr_Occurred())
        return -1;
    return t - last >= every;
}

/* DumpWriter.add_rows: the record and its tensors' cells appended to the pending chunk
 * (ColumnBuilder.add_rows), then the writer's flush rule (DumpWriter._maybe_flush). A record
 * with notes or self-checks (``checks``: None, or {row: check}) goes through Python's. */
static int add_rows(FastPath *self, PyObject *record, RowCall *call, PyObject *roles, PyObject *names,
                    PyObject *checks) {
    if (self->writer == Py_None || call->notes != Py_None || checks != Py_None) {
        PyObject *argv[] = {record, call->layouts, call->stats, call->sources, roles, names, call->notes,
                            Py_None, checks};
        return done_with(PyObject_Vectorcall(self->py_add_rows, argv, 9, NULL));
    }
    PyObject *builder = PyObject_GetAttr(self->writer, s_builder);
    if (builder == NULL)
        return -1;
    if (builder != self->builder) { /* a flush started a new chunk */
        PyObject *lists = call0(builder, s_row_lists);
        int seven = lists != NULL && PyTuple_CheckExact(lists) && PyTuple_GET_SIZE(lists) == 7;
        for (int i = 0; seven && i < 7; i++)
            seven = PyList_CheckExact(PyTuple_GET_ITEM(lists, i));
        if (!seven) {
            if (lists != NULL)
                PyErr_SetString(PyExc_RuntimeError, "xray fast path: row_lists() is not 7 lists");
            Py_XDECREF(lists), Py_DECREF(builder);
            return -1;
        }
        Py_XSETREF(self->lists, lists);
        Py_XSETREF(self->builder, builder);
    } else {
        Py_DECREF(builder);
    }
    PyObject *records = PyTuple_GET_ITEM(self->lists, 0), *count = PyLong_FromSsize_t(PyList_GET_SIZE(call->layouts));
    PyObject *parts[] = {call->layouts, call->stats, call->sources, roles, names};
    int r = count ? PyList_Append(records, record) : -1;
    if (r == 0)
        r = PyList_Append(PyTuple_GET_ITEM(self->lists, 1), count);
    for (int i = 0; r == 0 && i < 5; i++) {
        PyObject *list = PyTuple_GET_ITEM(self->lists, 2 + i);
        r = PyList_SetSlice(list, PyList_GET_SIZE(list), PyList_GET_SIZE(list), parts[i]);
    }
    Py_XDECREF(count);
    if (r < 0)
        return -1;
    Py_ssize_t most = int_attr(self->writer, s_flush_records);
    if (most == -1 && PyErr_Occurred())
        return -1;
    int due = PyList_GET_SIZE(records) >= most;
    if (!due && (due = timer_due(self, self->writer)) < 0)
        return -1;
    return due ? done_with(call0(self->writer, s_flush)) : 0;
}

/* The end of RowPath.after and Recorder._after: the plan of this shape of call, the record. */
static int finish(FastPath *self, OpFacts *op, RowCall *call, PyObject *out, PyObject *result_part,
                  Py_ssize_t first_out) {
    PyObject *key = PyTuple_Pack(2, call->key, result_part), *plan = NULL, *ids = NULL;
    PyObject *pop = NULL, *skeleton = NULL, *roles = NULL, *names = NULL, *record = NULL, *checks = NULL;
    int r = -1;
    if (key == NULL || produced(self, op, call->seq, out) < 0)
        goto done;
    if ((plan = PyDict_GetItemWithError(self->plans, key)) != NULL) {
        Py_INCREF(plan);
    } else {
        if (PyErr_Occurred())
            goto done;
        PyObject *n = PyLong_FromSsize_t(PyList_GET_SIZE(call->layouts));
        PyObject *argv[] = {(PyObject *)call, key, out, n};
        plan = n ? PyObject_Vectorcall(self->py_plan, argv, 4, NULL) : NULL;
        Py_XDECREF(n);
        if (plan == NULL || PyDict_SetItem(self->plans, key, plan) < 0)
            goto done;
    }
    if ((ids = PyDict_GetItemWithError(self->frame_ids, call->frames)) != NULL)
        Py_INCREF(ids);
    else if (PyErr_Occurred() || (ids = call1(self->py_frame_ids, call->frames)) == NULL)
        goto done;
    if (!PyTuple_CheckExact(ids) || PyTuple_GET_SIZE(ids) != 2) {
        PyErr_SetString(PyExc_RuntimeError, "xray fast path: a module stack's ids are not a pair");
        goto done;
    }
    if ((pop = PyObject_GetAttr(plan, s_op)) == NULL || (skeleton = PyObject_GetAttr(plan, s_skeleton)) == NULL ||
        (roles = PyObject_GetAttr(plan, s_roles)) == NULL || (names = PyObject_GetAttr(plan, s_names)) == NULL)
        goto done;
    PyObject *seq = call->seq;
    record = untracked(PyTuple_Pack(13, seq, self->zero, call->direction, pop, PyTuple_GET_ITEM(ids, 0), self->one,
                                    seq, seq, self->zero, self->none_id, PyTuple_GET_ITEM(ids, 1), self->none_id,
                                    skeleton));
    if (record == NULL)
        goto done;
    if (op->checked) { /* RowPath.checks: None, or the checks of its outputs' rows */
        PyObject *first = PyLong_FromSsize_t(first_out);
        PyObject *argv[] = {(PyObject *)call, out, first};
        checks = first ? PyObject_Vectorcall(self->py_checks, argv, 3, NULL) : NULL;
        Py_XDECREF(first);
        if (checks == NULL)
            goto done;
    }
    if (add_rows(self, record, call, roles, names, checks ? checks : Py_None) < 0
        || bump(self, s_records_written, NULL) < 0)
        goto done;
    if (call->signature != Py_None) { /* Recorder._folds_into: whether later calls fold into this record */
        PyObject *fold_args[] = {call->signature, call->seq, op->writes ? Py_True : Py_False};
        if (done_with(PyObject_Vectorcall(self->folds_into, fold_args, 3, NULL)) < 0)
            goto done;
    }
    r = 0;
done:
    Py_XDECREF(key), Py_XDECREF(plan), Py_XDECREF(ids), Py_XDECREF(pop), Py_XDECREF(skeleton);
    Py_XDECREF(roles), Py_XDECREF(names), Py_XDECREF(record), Py_XDECREF(checks);
    return r;
}

/* Recorder._after for the call: 1 done here, 0 handed to Python's after, -1 error. */
static int after(FastPath *self, OpFacts *op, RowCall *call, PyObject *out) {
    Py_ssize_t first_out = PyList_GET_SIZE(call->layouts); /* the outputs' rows follow the inputs' */
    int r = op->mutates ? 0 : new_output(self, op, call, out);
    if (r == 1)
        return finish(self, op, call, out, self->tensor_mark, first_out) < 0 ? -1 : 1;
    if (r < 0)
        return -1;
    PyObject *part = general_outputs(self, op, call, out);
    if (part == NULL)
        return PyErr_Occurred() ? -1 : 0;
    r = finish(self, op, call, out, part, first_out) < 0 ? -1 : 1;
    Py_DECREF(part);
    return r;
}

/* -- de-dup ---------------------------------------------------------------------------------------- */
static int bump_slot(PyObject *obj, PyObject *name, PyObject *one) {
    PyObject *v = PyObject_GetAttr(obj, name), *next = v ? PyNumber_Add(v, one) : NULL;
    int r = next ? PyObject_SetAttr(obj, name, next) : -1;
    Py_XDECREF(v), Py_XDECREF(next);
    return r;
}

/* Producers.op_source: (seq, k) of the op call that produced t, as new references in *src and
 * *k; both -1 when t is no plain tensor or came from a parameter, a buffer or outside. */
static int op_source(FastPath *self, PyObject *t, PyObject **src, PyObject **k) {
    PyObject *entry = NULL, *id = NULL, *ptr = NULL;
    int r = 0;
    if (t != NULL && PyObject_TypeCheck(t, (PyTypeObject *)self->tensor_type)) {
        r = (ptr = data_ptr(t)) == NULL || (id = PyLong_FromVoidPtr(t)) == NULL
            || producer_entry(self, t, id, ptr, &entry) < 0 ? -1 : 0;
    }
    int op = entry != NULL && PyLong_CheckExact(PyTuple_GET_ITEM(entry, 1));
    *src = op ? Py_NewRef(PyTuple_GET_ITEM(entry, 1)) : PyLong_FromLong(-1);
    *k = op ? Py_NewRef(PyTuple_GET_ITEM(entry, 2)) : PyLong_FromLong(-1);
    Py_XDECREF(entry), Py_XDECREF(id), Py_XDECREF(ptr);
    if (r < 0 || *src == NULL || *k == NULL) {
        Py_CLEAR(*src);
        Py_CLEAR(*k);
        return -1;
    }
    return 0;
}

/* DumpWriter.folded: the call's seq, its record's, and its first argument's producer, appended
 * to the recorder's writer's ``folds`` list; ``folds_full`` at ``folds_flush`` ints or when the
 * flush timer is due (a de-dup'd loop makes no new record that would check it). */
static int fold_edge(FastPath *self, PyObject *seen, PyObject *seq, PyObject *args) {
    PyObject *writer = PyDict_GetItemWithError(self->rdict, s_writer), *folds = NULL, *record = NULL, *src, *k;
    if (writer == NULL)
        return PyErr_Occurred() ? -1 : 0;
    Py_INCREF(writer);
    int r = -1;
    if ((folds = PyObject_GetAttr(writer, s_folds)) == NULL || (record = PyObject_GetAttr(seen, s_seq)) == NULL)
        goto done;
    if (!PyList_CheckExact(folds)) {
        PyErr_SetString(PyExc_RuntimeError, "xray fast path: DumpWriter.folds is not a list");
        goto done;
    }
    if (op_source(self, PyTuple_GET_SIZE(args) ? PyTuple_GET_ITEM(args, 0) : NULL, &src, &k) < 0)
        goto done;
    r = PyList_Append(folds, seq) < 0 || PyList_Append(folds, record) < 0 || PyList_Append(folds, src) < 0
        || PyList_Append(folds, k) < 0 ? -1 : 0;
    Py_DECREF(src), Py_DECREF(k);
    if (r == 0) {
        Py_ssize_t limit = int_attr(writer, s_folds_flush);
        if (limit < 0 && PyErr_Occurred())
            r = -1;
        else {
            int due = PyList_GET_SIZE(folds) >= limit;
            if (!due && (due = timer_due(self, writer)) < 0)
                r = -1;
            else if (due)
                r = done_with(PyObject_CallMethodNoArgs(writer, s_folds_full));
        }
    }
done:
    Py_DECREF(writer), Py_XDECREF(folds), Py_XDECREF(record);
    return r;
}

/* A folded call: the count of the record it folds into, and its data edge (Recorder._before). */
static int fold(FastPath *self, PyObject *seen, PyObject *seq, PyObject *args) {
    if (bump_slot(seen, s_count, self->one) < 0 || PyObject_SetAttr(seen, s_last, seq) < 0)
        return -1;
    int dirty = attr_true(seen, s_dirty);
    if (dirty < 0)
        return -1;
    if (!dirty && (PyObject_SetAttr(seen, s_dirty, Py_True) < 0 || done_with(call1(self->py_count_changed, seen)) < 0))
        return -1;
    int writes = attr_true(seen, s_writes);
    if (writes < 0)
        return -1;
    if (writes && done_with(PyObject_CallNoArgs(self->py_wrote)) < 0) /* not described, but it wrote */
        return -1;
    return fold_edge(self, seen, seq, args);
}

/* -- the call ---------------------------------------------------------------------------------------- */
/* Recorder._fail for the error set now: recording stops with a warning, the user's code goes
 * on. 0: handed over; -1: not an Exception (KeyboardInterrupt...), left set to propagate. */
static int fail(FastPath *self) {
    if (!PyErr_ExceptionMatches(PyExc_Exception))
        return -1;
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (tb != NULL && value != NULL)
        PyException_SetTraceback(value, tb);
    PyObject *r = call1(self->py_fail, value ? value : Py_None);
    Py_XDECREF(type), Py_XDECREF(value), Py_XDECREF(tb);
    return done_with(r);
}

static PyObject *run_op(PyObject *func, PyObject *args, PyObject *kwargs) {
    return PyObject_Call(func, args, PyDict_GET_SIZE(kwargs) ? kwargs : NULL);
}

/* Whether Python takes the whole call: the recorder failed, modes below ours, autograd's
 * backward, a collective, an argument of another kind. 1: Python's; 0: ours; -1: error. */
static int python_call(FastPath *self, OpFacts **op, PyObject *func, PyObject *args, PyObject *kwargs) {
    PyObject *failed = PyDict_GetItemWithError(self->rdict, s_failed);
    if (failed == NULL)
        return PyErr_Occurred() ? -1 : 1;
    if (failed != Py_None)
        return 1;
    /* uninitialised memory is tracked (xray/record/unwritten.py): Python takes every call */
    PyObject *buffers = PyDict_GetItemWithError(self->rdict, s_unwritten_buffers);
    if (buffers == NULL)
        return PyErr_Occurred() ? -1 : 1;
    if (!PyDict_Check(buffers) || PyDict_GET_SIZE(buffers))
        return 1;
    PyObject *v = PyObject_CallNoArgs(self->len_modes);
    long below = v ? PyLong_AsLong(v) : -1;
    Py_XDECREF(v);
    if (below != 0)
        return PyErr_Occurred() ? -1 : 1;
    v = PyObject_CallNoArgs(self->graph_task);
    long task = v ? PyLong_AsLong(v) : 0;
    Py_XDECREF(v);
    if (PyErr_Occurred())
        return -1;
    if (task != -1)
        return 1;
    if ((*op = op_facts(self, func)) == NULL) {
        PyErr_Clear(); /* Python's op_facts says what is wrong, on its path */
        return 1;
    }
    if (!(*op)->common || (!(*op)->records && !self->dedup))
        return 1;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(args); i++) {
        int s = supported(self, PyTuple_GET_ITEM(args, i), 0);
        if (s != 1)
            return s < 0 ? -1 : 1; /* not a kind this path keys: Python's */
    }
    Py_ssize_t pos = 0;
    PyObject *name, *value;
    while (PyDict_Next(kwargs, &pos, &name, &value)) {
        int s = supported(self, value, 0);
        if (s != 1)
            return s < 0 ? -1 : 1;
    }
    return 0;
}

/* Recorder.on_op for the common call; FALLBACK (nothing done) for Python to take it. */
static PyObject *fp_on_op(FastPath *self, PyObject *const *argv, Py_ssize_t nargs) {
    if (nargs != 3 || !PyTuple_CheckExact(argv[1]) || !PyDict_CheckExact(argv[2])) {
        PyErr_SetString(PyExc_TypeError, "on_op(func, args: tuple, kwargs: dict)");
        return NULL;
    }
    PyObject *func = argv[0], *args = argv[1], *kwargs = argv[2];
    OpFacts *op = NULL;
    if (self->rdict == NULL) /* cleared by the collector */
        return Py_NewRef(FALLBACK);
    int theirs = python_call(self, &op, func, args, kwargs);
    if (theirs != 0) /* an Exception here: Python's path meets the same problem and says so */
        return theirs < 0 && to_python() < 0 ? NULL : Py_NewRef(FALLBACK);
    /* From here on the call is ours (Recorder._before), unless it would make a new record of an
     * op whose records Python makes: the de-dup key, which changes nothing, says which */
    PyObject *seq = NULL, *signature = NULL, *out = NULL, *seen = NULL;
    RowCall *call = NULL;
    if (self->dedup) {
        signature = dedup_key(self, op, args, kwargs);
        if (signature == NULL && PyErr_Occurred())
            goto failed_before;
        seen = signature ? PyDict_GetItemWithError(self->seen, signature) : NULL;
        if (seen == NULL && PyErr_Occurred()) { /* as signature_key: recorded, never folded */
            if (!PyErr_ExceptionMatches(PyExc_TypeError) && !PyErr_ExceptionMatches(PyExc_RuntimeError))
                goto failed_before;
            PyErr_Clear();
            Py_CLEAR(signature);
        }
        Py_XINCREF(seen); /* held: Python code runs below */
        if (seen == NULL && !op->records) {
            Py_XDECREF(signature);
            return Py_NewRef(FALLBACK);
        }
    }
    if (bump(self, s_op_calls, NULL) < 0 || bump(self, s_seq, &seq) < 0)
        goto failed_before;
    if (self->dedup) {
        if (seen != NULL) { /* folded into an earlier record: only counted, and its outputs produced */
            int r = fold(self, seen, seq, args);
            if (r < 0)
                goto failed_before;
            /* Producers.produced, then wrote_through for a writing call (a base written through a view) */
            if ((out = run_op(func, args, kwargs)) != NULL
                && (produced(self, op, seq, out) < 0
                    || (op->mutates && done_with(PyObject_CallMethodObjArgs(self->producers, s_wrote_through, seq,
                                                                             op->roles, out, NULL)) < 0))
                && fail(self) < 0)
                Py_CLEAR(out);
            goto cleanup;
        }
    }
    if ((call = before(self, op, args, kwargs, seq, signature)) == NULL)
        goto failed_before;
    if ((out = run_op(func, args, kwargs)) == NULL)
        goto cleanup;
    int done = after(self, op, call, out);
    if (done == 0) { /* Recorder._after: produced, RowPath.after, the counts */
        PyObject *after_argv[] = {(PyObject *)call, args, out};
        done = done_with(PyObject_Vectorcall(self->py_after, after_argv, 3, NULL));
    }
    if (done < 0 && fail(self) < 0)
        Py_CLEAR(out);
    goto cleanup;
failed_before:
    if (fail(self) == 0)
        out = run_op(func, args, kwargs);
cleanup:
    Py_XDECREF(seq), Py_XDECREF(signature), Py_XDECREF(seen), Py_XDECREF(call);
    return out;
}

static PyMethodDef fp_methods[] = {
    {"on_op", (PyCFunction)(void (*)(void))fp_on_op, METH_FASTCALL,
     "on_op(func, args, kwargs) -> the op's result, recorded; FALLBACK: Python takes the call (nothing done)."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef fp_members[] = {
    {"reductions", T_PYSSIZET, offsetof(FastPath, reductions), READONLY,
     "tensors reduced here (native_stats) so far; the others went to the recorder's own function"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject FastPathType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "xray.record._fastpath.FastPath",
    .tp_basicsize = sizeof(FastPath),
    .tp_dealloc = (destructor)fp_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The row path's common call in C, over the Python row path's own state (rows.native_path).",
    .tp_traverse = (traverseproc)fp_traverse,
    .tp_clear = (inquiry)fp_clear,
    .tp_methods = fp_methods,
    .tp_members = fp_members,
    .tp_init = (initproc)fp_init,
    .tp_new = PyType_GenericNew,
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, .m_name = "_fastpath", .m_size = -1};

PyMODINIT_FUNC PyInit__fastpath(void) {
    struct {
        PyObject **slot;
        const char *text;
    } names[] = {
        {&s_shape, "shape"}, {&s_dtype, "dtype"}, {&s_stride, "stride"}, {&s_device, "device"},
        {&s_data_ptr, "data_ptr"}, {&s_version, "_version"}, {&s_is_inference, "is_inference"},
        {&s_requires_grad, "requires_grad"}, {&s_is_cpu, "is_cpu"}, {&s_is_nested, "is_nested"},
        {&s_layout, "layout"}, {&s_storage_offset, "storage_offset"}, {&s_numel, "numel"}, {&s_count, "count"},
        {&s_last, "last"}, {&s_dirty, "dirty"}, {&s_writes, "writes"}, {&s_seq, "seq"}, {&s_op_calls, "op_calls"},
        {&s_records_written, "records_written"}, {&s_failed, "failed"}, {&s_by_id, "_by_id"},
        {&s_sweep_at, "_sweep_at"}, {&s_op, "op"}, {&s_skeleton, "skeleton"}, {&s_roles, "roles"},
        {&s_names, "names"}, {&s_f, "f"}, {&s_name_attr, "__name__"},
        {&s_is_neg, "is_neg"}, {&s_builder, "_builder"}, {&s_row_lists, "row_lists"}, {&s_flush, "flush"},
        {&s_flush_records, "flush_records"}, {&s_flush_seconds, "flush_seconds"}, {&s_last_flush, "_last_flush"},
        {&s_writer, "writer"}, {&s_folds, "folds"}, {&s_folds_flush, "folds_flush"}, {&s_folds_full, "folds_full"},
        {&s_unwritten_buffers, "unwritten_buffers"}, {&s_wrote_through, "wrote_through"},
        {&s_input, "input"}, /* producers.INPUT_ROLE */
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if ((*names[i].slot = PyUnicode_InternFromString(names[i].text)) == NULL)
            return NULL;
    if (PyType_Ready(&RowCallType) < 0 || PyType_Ready(&FastPathType) < 0)
        return NULL;
    /* not PyCapsule_Import: it walks attributes, and xray.dump is also a function */
    PyObject *ext = PyImport_ImportModule("xray.dump._moments");
    PyObject *capsule = ext ? PyObject_GetAttrString(ext, "_C_API") : NULL;
    moments_api = capsule ? PyCapsule_GetPointer(capsule, XRAY_MOMENTS_CAPSULE) : NULL;
    Py_XDECREF(ext), Py_XDECREF(capsule); /* the module, and so the capsule, stays in sys.modules */
    if (moments_api == NULL || moments_api->version != XRAY_MOMENTS_API_VERSION) {
        PyErr_Clear(); /* not built, or another build: statistics by the recorder's own function */
        moments_api = NULL;
    }
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    FALLBACK = PyObject_CallNoArgs((PyObject *)&PyBaseObject_Type);
    if (FALLBACK == NULL || PyModule_AddObjectRef(m, "FALLBACK", FALLBACK) < 0 ||
        PyModule_AddObjectRef(m, "RowCall", (PyObject *)&RowCallType) < 0 ||
        PyModule_AddObjectRef(m, "FastPath", (PyObject *)&FastPathType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
