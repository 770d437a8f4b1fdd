/* The C interface of xray.dump._moments, for other extensions (a PyCapsule named below).
 *
 * The pass returns min, max, sum and sum of squares of a CPU tensor's elements in out[0..3]
 * (NaN and Inf are not counted: any makes the sum non-finite, see _moments.c); a contiguous
 * tensor is one run. It returns 0 when done, 1 when it does not apply (a null address, an
 * unknown kind, a non-positive size, no unit-stride run): the caller then reduces the tensor its
 * own way. No Python error is left set.
 * `kind` is the module's FLOAT32, FLOAT64, BFLOAT16, INT64, INT32, INT16, INT8 or UINT8. */
#ifndef XRAY_MOMENTS_API_H
#define XRAY_MOMENTS_API_H

#include <Python.h>
#include <stdint.h>

#define XRAY_MOMENTS_CAPSULE "xray.dump._moments._C_API"
#define XRAY_MOMENTS_API_VERSION 2 /* 2: gather */

typedef struct {
    int version; /* XRAY_MOMENTS_API_VERSION */
    /* a tensor's ndim sizes and strides, in elements (at most 16 dimensions) */
    int (*strided)(const void *p, int kind, Py_ssize_t ndim, const Py_ssize_t *sizes, const Py_ssize_t *strides,
                   double out[4]);
    /* the n elements at int64 storage offsets (in elements from p) as doubles: a sample (samples.py);
     * 0 when done, 1 for a null address or an unknown kind */
    int (*gather)(const void *p, int kind, const int64_t *offsets, Py_ssize_t n, double *out);
} xray_moments_api;

#endif
