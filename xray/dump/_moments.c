/* xray.dump._moments: min, max, sum and sum of squares of a contiguous CPU buffer in ONE pass.
 *
 * Why it exists: tensor_stats (xray/dump/stats.py) runs on every recorded tensor. Through torch
 * it takes three reductions (aminmax, dot, sum) and four .item() calls, i.e. three passes over
 * memory plus dispatcher overhead; this reads the memory once and returns all four numbers.
 *
 * NaN/Inf are not counted here. Any non-finite element makes the sum NaN or +-Inf (Inf + finite
 * is Inf, Inf - Inf and NaN + x are NaN), so the caller sees it and takes its exact slow path.
 * A large but finite tensor may overflow sum/sumsq too; the slow path is then merely slower.
 *
 * Vectorisation uses GCC/Clang vector extensions with two accumulators per statistic: 16-byte
 * vectors by default (SSE2 on x86-64, NEON on arm64) and 32- and 64-byte copies compiled for
 * AVX2 and AVX-512, picked at import with __builtin_cpu_supports (the widest the CPU runs; torch
 * picks AVX-512 kernels on such CPUs too). Never compile the wide kernels without their ISA:
 * GCC then emulates them through the stack, several times slower than torch. Other compilers
 * get the plain C loop. float32/bfloat16 lanes sum in float32 and are flushed into doubles every
 * CHUNK steps (at most 2*CHUNK terms per float partial sum); float64 sums in double.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

enum { KIND_FLOAT32, KIND_FLOAT64, KIND_BFLOAT16, KIND_INT64, KIND_INT32, KIND_INT16, KIND_INT8, KIND_UINT8,
       NKINDS };

typedef struct { double min, max, sum, sumsq; } moments_t;
typedef void (*kernel_t)(const void *, size_t, moments_t *);

static float bf16_to_float(uint16_t bits) {
    uint32_t u = (uint32_t)bits << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Plain C: the tail after the vector loop, and the whole job on other compilers. */
#define SCALAR_KERNEL(NAME, ELEM, TO_DOUBLE)                                                   \
    static void NAME(const void *data, size_t n, moments_t *r) {                              \
        const ELEM *p = (const ELEM *)data;                                                    \
        double lo = r->min, hi = r->max, s = r->sum, q = r->sumsq;                             \
        for (size_t i = 0; i < n; i++) {                                                       \
            ELEM e;                                                                            \
            memcpy(&e, p + i, sizeof e);                                                       \
            double x = TO_DOUBLE(e);                                                           \
            lo = x < lo ? x : lo;                                                              \
            hi = x > hi ? x : hi;                                                              \
            s += x;                                                                            \
            q += x * x;                                                                        \
        }                                                                                      \
        r->min = lo, r->max = hi, r->sum = s, r->sumsq = q;                                    \
    }
#define AS_DOUBLE(e) ((double)(e))
#define BF16_AS_DOUBLE(e) ((double)bf16_to_float(e))
SCALAR_KERNEL(scalar_f32, float, AS_DOUBLE)
SCALAR_KERNEL(scalar_f64, double, AS_DOUBLE)
SCALAR_KERNEL(scalar_bf16, uint16_t, BF16_AS_DOUBLE)
/* Integer tensors (token ids, positions, masks; bool is stored as uint8) are small: the plain
 * loop in double, as the torch path's float64 copy would do, but without ~30 us of dispatch. */
SCALAR_KERNEL(scalar_i64, int64_t, AS_DOUBLE)
SCALAR_KERNEL(scalar_i32, int32_t, AS_DOUBLE)
SCALAR_KERNEL(scalar_i16, int16_t, AS_DOUBLE)
SCALAR_KERNEL(scalar_i8, int8_t, AS_DOUBLE)
SCALAR_KERNEL(scalar_u8, uint8_t, AS_DOUBLE)
#define INT_KERNELS scalar_i64, scalar_i32, scalar_i16, scalar_i8, scalar_u8
static const kernel_t scalar_kernels[NKINDS] = {scalar_f32, scalar_f64, scalar_bf16, INT_KERNELS};

/* 16-byte vectors are native on SSE2 (every x86-64) and NEON; elsewhere GCC would emulate them. */
#if (defined(__GNUC__) || defined(__clang__)) && \
    (defined(__SSE2__) || defined(__ARM_NEON) || defined(__aarch64__))
#define HAVE_VECTORS 1
#define CHUNK 64 /* vector steps between flushes of the float32 partial sums into double */

/* One vector step loads two vectors x0, x1 of lanes (STEP elements). bfloat16 reinterprets
 * VB bytes as uint32 pairs: the low halves shifted up and the high halves masked are both
 * exact float32 values (in a different order, which min/max/sums ignore). */
#define LOAD_PLAIN(x0, x1, q)                                                                  \
    (memcpy(&x0, (q), sizeof x0), memcpy(&x1, (q) + L, sizeof x1))
#define LOAD_BF16(x0, x1, q)                                                                   \
    do {                                                                                       \
        W w_;                                                                                  \
        memcpy(&w_, (q), sizeof w_);                                                           \
        x0 = (V)(w_ << 16);                                                                    \
        x1 = (V)(w_ & 0xFFFF0000u);                                                            \
    } while (0)

/* Elementwise x < m ? x : m without a vector ternary (C has none): a bitwise blend. */
#define SELECT(mask, a, b)                                                                     \
    ((__typeof__(a))(((mask) & (__typeof__(mask))(a)) | (~(mask) & (__typeof__(mask))(b))))
#define BLEND_MIN(x, m) SELECT((x) < (m), x, m)
#define BLEND_MAX(x, m) SELECT((x) > (m), x, m)

#define VECTOR_KERNEL(NAME, ATTR, ELEM, LANE, VB, LOAD, VMIN, VMAX, TAIL)                      \
    ATTR static void NAME(const void *data, size_t n, moments_t *r) {                         \
        typedef LANE V __attribute__((vector_size(VB)));                                       \
        typedef uint32_t W __attribute__((vector_size(VB), unused));                           \
        enum { L = VB / sizeof(LANE), STEP = 2 * L };                                          \
        const ELEM *p = (const ELEM *)data;                                                    \
        const size_t steps = n / STEP;                                                         \
        V mn0 = (V){0} + (LANE)INFINITY, mn1 = mn0, mx0 = -mn0, mx1 = mx0;                     \
        double S[L], Q[L];                                                                     \
        for (int l = 0; l < L; l++) S[l] = Q[l] = 0.0;                                         \
        for (size_t done = 0; done < steps;) {                                                 \
            size_t end = steps - done < CHUNK ? steps : done + CHUNK;                          \
            V s0 = {0}, s1 = {0}, q0 = {0}, q1 = {0};                                          \
            for (; done < end; done++) {                                                       \
                V x0, x1;                                                                      \
                LOAD(x0, x1, p + done * STEP);                                                 \
                mn0 = VMIN(x0, mn0), mn1 = VMIN(x1, mn1);                                      \
                mx0 = VMAX(x0, mx0), mx1 = VMAX(x1, mx1);                                      \
                s0 += x0, s1 += x1;                                                            \
                q0 += x0 * x0, q1 += x1 * x1;                                                  \
            }                                                                                  \
            s0 += s1, q0 += q1;                                                                \
            for (int l = 0; l < L; l++) S[l] += s0[l], Q[l] += q0[l];                          \
        }                                                                                      \
        double lo = r->min, hi = r->max;                                                       \
        for (int l = 0; l < L; l++) {                                                          \
            lo = mn0[l] < lo ? mn0[l] : lo, lo = mn1[l] < lo ? mn1[l] : lo;                    \
            hi = mx0[l] > hi ? mx0[l] : hi, hi = mx1[l] > hi ? mx1[l] : hi;                    \
            r->sum += S[l], r->sumsq += Q[l];                                                  \
        }                                                                                      \
        r->min = lo, r->max = hi;                                                              \
        TAIL(p + steps * STEP, n - steps * STEP, r);                                           \
    }

#if defined(__SSE2__) /* every x86-64 */
#include <immintrin.h> /* min/max intrinsics: one instruction instead of a 4-op blend */
#define MIN_F32 _mm_min_ps
#define MAX_F32 _mm_max_ps
#define MIN_F64 _mm_min_pd
#define MAX_F64 _mm_max_pd
#ifndef XRAY_NO_AVX2 /* defined only to benchmark the 16-byte kernels on an AVX2 machine */
#define DISPATCH_AVX2 1
#define AVX2 __attribute__((target("avx2")))
VECTOR_KERNEL(avx2_f32, AVX2, float, float, 32, LOAD_PLAIN, _mm256_min_ps, _mm256_max_ps, scalar_f32)
VECTOR_KERNEL(avx2_f64, AVX2, double, double, 32, LOAD_PLAIN, _mm256_min_pd, _mm256_max_pd, scalar_f64)
VECTOR_KERNEL(avx2_bf16, AVX2, uint16_t, float, 32, LOAD_BF16, _mm256_min_ps, _mm256_max_ps, scalar_bf16)
static const kernel_t avx2_kernels[NKINDS] = {avx2_f32, avx2_f64, avx2_bf16, INT_KERNELS};
#endif
#ifndef XRAY_NO_AVX512 /* likewise, to benchmark the AVX2 kernels on an AVX-512 machine */
#define DISPATCH_AVX512 1
#define AVX512 __attribute__((target("avx512f")))
VECTOR_KERNEL(avx512_f32, AVX512, float, float, 64, LOAD_PLAIN, _mm512_min_ps, _mm512_max_ps, scalar_f32)
VECTOR_KERNEL(avx512_f64, AVX512, double, double, 64, LOAD_PLAIN, _mm512_min_pd, _mm512_max_pd, scalar_f64)
VECTOR_KERNEL(avx512_bf16, AVX512, uint16_t, float, 64, LOAD_BF16, _mm512_min_ps, _mm512_max_ps, scalar_bf16)
static const kernel_t avx512_kernels[NKINDS] = {avx512_f32, avx512_f64, avx512_bf16, INT_KERNELS};
#endif
#else
#define MIN_F32 BLEND_MIN
#define MAX_F32 BLEND_MAX
#define MIN_F64 BLEND_MIN
#define MAX_F64 BLEND_MAX
#endif

VECTOR_KERNEL(v16_f32, , float, float, 16, LOAD_PLAIN, MIN_F32, MAX_F32, scalar_f32)
VECTOR_KERNEL(v16_f64, , double, double, 16, LOAD_PLAIN, MIN_F64, MAX_F64, scalar_f64)
VECTOR_KERNEL(v16_bf16, , uint16_t, float, 16, LOAD_BF16, MIN_F32, MAX_F32, scalar_bf16)
static const kernel_t v16_kernels[NKINDS] = {v16_f32, v16_f64, v16_bf16, INT_KERNELS};
#endif /* HAVE_VECTORS */

static const kernel_t *kernels = scalar_kernels;

/* Tensors this small are reduced without releasing the GIL: releasing and taking it back costs
 * more than the pass. */
#define GIL_FREE_ELEMENTS 65536

/* The two passes as plain C, shared with other extensions through the capsule below (the
 * recorder's row path in xray/record/_fastpath.c calls them without a Python call). */
static void pass_contiguous(const void *p, Py_ssize_t n, int kind, moments_t *r) {
    kernel_t kernel = kernels[kind];
    if (n < GIL_FREE_ELEMENTS) {
        kernel(p, (size_t)n, r);
    } else {
        Py_BEGIN_ALLOW_THREADS
        kernel(p, (size_t)n, r);
        Py_END_ALLOW_THREADS
    }
}

/* Strided tensors (slices, transposes, permuted or broadcast results): the same kernels over the
 * tensor's contiguous innermost runs. Statistics ignore element order, so dimensions are sorted
 * by stride and merged where they tile memory; a broadcast (stride-0) dimension repeats every
 * element `size` times, which leaves min and max alone and scales sum and sum of squares.
 * Returns 1 when no unit-stride run remains (the caller takes the torch path), -1 for sizes or
 * strides out of range (ValueError set), 0 when done. */
#define MAX_DIMS 16
#define GATHER_BYTES 16384
static const size_t elem_size[NKINDS] = {4, 8, 2, 8, 4, 2, 1, 1};

static int pass_strided(const char *p, int kind, Py_ssize_t ndim, const Py_ssize_t *sizes,
                        const Py_ssize_t *strides, moments_t *r) {
    Py_ssize_t nd = 0, size[MAX_DIMS], stride[MAX_DIMS];
    double repeat = 1.0;
    if (ndim > MAX_DIMS) {
        PyErr_SetString(PyExc_ValueError, "moments_strided: at most 16 dimensions");
        return -1;
    }
    for (Py_ssize_t i = 0; i < ndim; i++) {
        Py_ssize_t sz = sizes[i], st = strides[i];
        if (sz <= 0 || st < 0) {
            PyErr_SetString(PyExc_ValueError, "moments_strided: sizes must be > 0, strides >= 0");
            return -1;
        }
        if (sz == 1)
            continue;
        if (st == 0) {
            repeat *= (double)sz;
            continue;
        }
        /* insertion by descending stride */
        Py_ssize_t j = nd++;
        for (; j > 0 && stride[j - 1] < st; j--)
            size[j] = size[j - 1], stride[j] = stride[j - 1];
        size[j] = sz, stride[j] = st;
    }
    /* merge a dimension into the one inside it where they tile memory */
    Py_ssize_t m = 0;
    for (Py_ssize_t i = 1; i < nd; i++) {
        if (stride[m] == size[i] * stride[i])
            size[m] *= size[i], stride[m] = stride[i];
        else
            m++, size[m] = size[i], stride[m] = stride[i];
    }
    nd = nd ? m + 1 : 0;
    size_t inner = 1;
    if (nd > 0) {
        if (stride[nd - 1] != 1)
            return 1;
        inner = (size_t)size[--nd];
    }
    if (nd == 0) { /* one run: a contiguous tensor */
        pass_contiguous(p, (Py_ssize_t)inner, kind, r);
        r->sum *= repeat, r->sumsq *= repeat;
        return 0;
    }
    const size_t es = elem_size[kind];
    kernel_t kernel = kernels[kind];
    Py_ssize_t idx[MAX_DIMS] = {0}, elements = (Py_ssize_t)inner;
    for (Py_ssize_t d = 0; d < nd; d++)
        elements *= size[d];
    /* Short runs (a half-width slice of a head) are packed into a block first: one kernel call
     * per block instead of one per run, whose set-up would dominate. */
    double block[GATHER_BYTES / sizeof(double)]; /* on the stack: 16 KiB */
    const size_t run_bytes = inner * es, gather = inner < 256 ? GATHER_BYTES / run_bytes : 0;
    size_t packed = 0;
    PyThreadState *released = elements < GIL_FREE_ELEMENTS ? NULL : PyEval_SaveThread();
    for (;;) {
        Py_ssize_t off = 0;
        for (Py_ssize_t d = 0; d < nd; d++)
            off += idx[d] * stride[d];
        if (gather) {
            memcpy((char *)block + packed * run_bytes, p + (size_t)off * es, run_bytes);
            if (++packed == gather)
                kernel(block, packed * inner, r), packed = 0;
        } else {
            kernel(p + (size_t)off * es, inner, r);
        }
        Py_ssize_t d = nd - 1;
        for (; d >= 0 && ++idx[d] == size[d]; d--)
            idx[d] = 0;
        if (d < 0)
            break;
    }
    if (packed)
        kernel(block, packed * inner, r);
    if (released != NULL)
        PyEval_RestoreThread(released);
    r->sum *= repeat, r->sumsq *= repeat;
    return 0;
}

static PyObject *moments(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "moments(address, n, kind) takes 3 arguments");
        return NULL;
    }
    const void *p = PyLong_AsVoidPtr(args[0]);
    Py_ssize_t n = PyLong_AsSsize_t(args[1]);
    long kind = PyLong_AsLong(args[2]);
    if (PyErr_Occurred())
        return NULL;
    if (p == NULL || n <= 0 || kind < 0 || kind >= NKINDS) {
        PyErr_SetString(PyExc_ValueError, "moments: need a non-null address, n > 0, a known kind");
        return NULL;
    }
    moments_t r = {INFINITY, -INFINITY, 0.0, 0.0};
    pass_contiguous(p, n, (int)kind, &r);
    return Py_BuildValue("(dddd)", r.min, r.max, r.sum, r.sumsq);
}

static PyObject *moments_strided(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "moments_strided(address, kind, sizes, strides) takes 4 arguments");
        return NULL;
    }
    const char *p = (const char *)PyLong_AsVoidPtr(args[0]);
    long kind = PyLong_AsLong(args[1]);
    if (PyErr_Occurred())
        return NULL;
    if (p == NULL || kind < 0 || kind >= NKINDS || !PyTuple_Check(args[2]) || !PyTuple_Check(args[3]) ||
        PyTuple_GET_SIZE(args[2]) != PyTuple_GET_SIZE(args[3]) || PyTuple_GET_SIZE(args[2]) > MAX_DIMS) {
        PyErr_SetString(PyExc_ValueError, "moments_strided: need a non-null address, a known kind, "
                                          "sizes and strides tuples of one length <= 16");
        return NULL;
    }
    Py_ssize_t ndim = PyTuple_GET_SIZE(args[2]), size[MAX_DIMS], stride[MAX_DIMS];
    for (Py_ssize_t i = 0; i < ndim; i++) {
        size[i] = PyLong_AsSsize_t(PyTuple_GET_ITEM(args[2], i));
        stride[i] = PyLong_AsSsize_t(PyTuple_GET_ITEM(args[3], i));
        if (PyErr_Occurred())
            return NULL;
    }
    moments_t r = {INFINITY, -INFINITY, 0.0, 0.0};
    int done = pass_strided(p, (int)kind, ndim, size, stride, &r);
    if (done < 0)
        return NULL;
    if (done > 0)
        Py_RETURN_NONE;
    return Py_BuildValue("(dddd)", r.min, r.max, r.sum, r.sumsq);
}

/* A tensor's sample (xray/dump/samples.py): the elements at n storage offsets (in elements, from
 * the address), as doubles. The offsets are the caller's (samples.storage_offsets, cached per shape
 * and stride in Python): this only reads, so it cannot disagree with the positions. */
static double element(const char *p, int kind, int64_t off) {
    const size_t es = elem_size[kind];
    const char *at = p + (size_t)off * es;
    switch (kind) {
    case KIND_FLOAT32: { float v; memcpy(&v, at, 4); return (double)v; }
    case KIND_FLOAT64: { double v; memcpy(&v, at, 8); return v; }
    case KIND_BFLOAT16: { uint16_t v; memcpy(&v, at, 2); return (double)bf16_to_float(v); }
    case KIND_INT64: { int64_t v; memcpy(&v, at, 8); return (double)v; }
    case KIND_INT32: { int32_t v; memcpy(&v, at, 4); return (double)v; }
    case KIND_INT16: { int16_t v; memcpy(&v, at, 2); return (double)v; }
    case KIND_INT8: { int8_t v; memcpy(&v, at, 1); return (double)v; }
    default: { uint8_t v; memcpy(&v, at, 1); return (double)v; }
    }
}

static void gather_into(const char *p, int kind, const int64_t *offsets, Py_ssize_t n, double *out) {
    for (Py_ssize_t i = 0; i < n; i++)
        out[i] = element(p, kind, offsets[i]);
}

static PyObject *gather(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 3 || !PyBytes_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "gather(address, kind, offsets) takes an int, an int and bytes");
        return NULL;
    }
    const char *p = (const char *)PyLong_AsVoidPtr(args[0]);
    long kind = PyLong_AsLong(args[1]);
    if (PyErr_Occurred())
        return NULL;
    Py_ssize_t nbytes = PyBytes_GET_SIZE(args[2]), n = nbytes / 8;
    if (p == NULL || kind < 0 || kind >= NKINDS || nbytes % 8) {
        PyErr_SetString(PyExc_ValueError, "gather: need a non-null address, a known kind, int64 offsets");
        return NULL;
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, n * 8);
    if (out == NULL)
        return NULL;
    int64_t offsets[256];
    const char *raw = PyBytes_AS_STRING(args[2]);
    for (Py_ssize_t i = 0; i < n; i += 256) {
        Py_ssize_t m = n - i < 256 ? n - i : 256;
        memcpy(offsets, raw + i * 8, (size_t)m * 8);
        gather_into(p, (int)kind, offsets, m, (double *)PyBytes_AS_STRING(out) + i);
    }
    return out;
}

/* The capsule xray.dump._moments._C_API: the passes for C callers (xray/dump/moments_api.h). */
#include "moments_api.h"

static int api_strided(const void *p, int kind, Py_ssize_t ndim, const Py_ssize_t *sizes, const Py_ssize_t *strides,
                       double out[4]) {
    if (p == NULL || kind < 0 || kind >= NKINDS)
        return 1;
    moments_t r = {INFINITY, -INFINITY, 0.0, 0.0};
    int done = pass_strided(p, kind, ndim, sizes, strides, &r);
    if (done < 0) {
        PyErr_Clear();
        return 1;
    }
    out[0] = r.min, out[1] = r.max, out[2] = r.sum, out[3] = r.sumsq;
    return done;
}

static int api_gather(const void *p, int kind, const int64_t *offsets, Py_ssize_t n, double *out) {
    if (p == NULL || kind < 0 || kind >= NKINDS)
        return 1;
    gather_into((const char *)p, kind, offsets, n, out);
    return 0;
}

static xray_moments_api c_api = {XRAY_MOMENTS_API_VERSION, api_strided, api_gather};

static PyMethodDef methods[] = {
    {"moments", (PyCFunction)(void (*)(void))moments, METH_FASTCALL,
     "moments(address, n, kind) -> (min, max, sum, sumsq) of n contiguous elements at the raw\n"
     "address (tensor.data_ptr()); kind is FLOAT32, FLOAT64, BFLOAT16, INT64, INT32, INT16, INT8 or\n"
     "UINT8 (also bool). The caller keeps the memory alive. NaN/Inf are not counted: any makes\n"
     "sum non-finite."},
    {"moments_strided", (PyCFunction)(void (*)(void))moments_strided, METH_FASTCALL,
     "moments_strided(address, kind, sizes, strides) -> (min, max, sum, sumsq) of a strided tensor\n"
     "(sizes and strides in elements, tuples), or None when it has no contiguous innermost run."},
    {"gather", (PyCFunction)(void (*)(void))gather, METH_FASTCALL,
     "gather(address, kind, offsets) -> bytes: the float64 values of the elements at the int64\n"
     "storage offsets (in elements from the address; bytes, native order): a tensor's sample."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, .m_name = "_moments", .m_size = -1, .m_methods = methods};

PyMODINIT_FUNC PyInit__moments(void) {
    const char *isa = "scalar";
#ifdef HAVE_VECTORS
    kernels = v16_kernels, isa = "vec16";
#endif
#ifdef DISPATCH_AVX2
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2"))
        kernels = avx2_kernels, isa = "avx2";
#endif
#ifdef DISPATCH_AVX512
    if (__builtin_cpu_supports("avx512f"))
        kernels = avx512_kernels, isa = "avx512";
#endif
    PyObject *m = PyModule_Create(&module), *capsule = PyCapsule_New(&c_api, XRAY_MOMENTS_CAPSULE, NULL);
    int added = m != NULL && capsule != NULL ? PyModule_AddObjectRef(m, "_C_API", capsule) : -1;
    Py_XDECREF(capsule);
    if (m == NULL || added < 0 || PyModule_AddStringConstant(m, "ISA", isa) < 0 ||
        PyModule_AddIntConstant(m, "FLOAT32", KIND_FLOAT32) < 0 ||
        PyModule_AddIntConstant(m, "FLOAT64", KIND_FLOAT64) < 0 ||
        PyModule_AddIntConstant(m, "BFLOAT16", KIND_BFLOAT16) < 0 ||
        PyModule_AddIntConstant(m, "INT64", KIND_INT64) < 0 || PyModule_AddIntConstant(m, "INT32", KIND_INT32) < 0 ||
        PyModule_AddIntConstant(m, "INT16", KIND_INT16) < 0 || PyModule_AddIntConstant(m, "INT8", KIND_INT8) < 0 ||
        PyModule_AddIntConstant(m, "UINT8", KIND_UINT8) < 0) {
        Py_XDECREF(m);
        return NULL;
    }
    return m;
}
