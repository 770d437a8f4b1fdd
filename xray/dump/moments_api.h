/* The C interface of xray.dump._moments, for other extensions (a PyCapsule named below).
 *
 * Both passes return min, max, sum and sum of squares of a CPU buffer's elements in out[0..3]
 * (NaN and Inf are not counted: any makes the sum non-finite, see _moments.c). They return 0
 * when done, 1 when they do not apply (a null address, an unknown kind, a non-positive size, no
 * unit-stride run): the caller then reduces the tensor its own way. No Python error is left set.
 * `kind` is the module's FLOAT32, FLOAT64, BFLOAT16, INT64, INT32, INT16, INT8 or UINT8. */
#ifndef XRAY_MOMENTS_API_H
#define XRAY_MOMENTS_API_H

#include <Python.h>

#define XRAY_MOMENTS_CAPSULE "xray.dump._moments._C_API"
#define XRAY_MOMENTS_API_VERSION 1

typedef struct {
    int version; /* XRAY_MOMENTS_API_VERSION */
    /* n contiguous elements at p */
    int (*contiguous)(const void *p, Py_ssize_t n, int kind, double out[4]);
    /* a strided tensor: ndim sizes and strides, in elements (at most 16 dimensions) */
    int (*strided)(const void *p, int kind, Py_ssize_t ndim, const Py_ssize_t *sizes, const Py_ssize_t *strides,
                   double out[4]);
} xray_moments_api;

#endif
