/* The reduction kernels every native path shares: dst = a (op) b over n elements of one dtype.
 *
 * The codes are the library's own: dtypes by allreduce.dtypes.code_of, ops by allreduce.ops.ReduceOp,
 * so a frame header's dtype and op bytes index these tables directly. The kernels give the bits the
 * Python engine's numpy kernels (allreduce.ops.kernel) give: integers wrap around, float16 and
 * bfloat16 compute in float and round to nearest even once, MIN/MAX of floats pick the same bits in
 * either operand order (-0 below +0, any NaN becomes the one canonical quiet NaN), bool is logical.
 * AVG combines as SUM; ar_finish divides by the group size afterwards, as ops.finish does.
 * A pair that is not supported here (complex PRODUCT, say) stays on the Python engine.
 */
#ifndef ALLREDUCE_KERNELS_H
#define ALLREDUCE_KERNELS_H

#include <stddef.h>

enum ar_dtype {
    AR_BOOL = 1, AR_INT8, AR_UINT8, AR_INT16, AR_UINT16, AR_INT32, AR_UINT32, AR_INT64, AR_UINT64,
    AR_FLOAT16, AR_FLOAT32, AR_FLOAT64, AR_COMPLEX64, AR_COMPLEX128, AR_BFLOAT16,
    AR_DTYPES  /* one past the last code */
};

enum ar_op { AR_SUM = 0, AR_PRODUCT, AR_MIN, AR_MAX, AR_BAND, AR_BOR, AR_BXOR, AR_AVG, AR_OPS };

/* dst[i] = a[i] (op) b[i] for i < n. dst may be a or b itself (not a partial overlap); every pointer is
 * aligned to the item size. */
typedef void (*ar_fold_fn)(void *dst, const void *a, const void *b, size_t n);

/* The kernel of (dtype, op), or NULL where the pair is not supported (or either code is unknown). */
ar_fold_fn ar_kernel(int dtype, int op);

/* Whether (dtype, op) has a kernel here. */
int ar_supported(int dtype, int op);

/* Bytes per element of dtype, 0 for an unknown code. */
size_t ar_itemsize(int dtype);

/* dst = a (op) b through ar_kernel; returns 0, or -1 (nothing written) for an unsupported pair. */
int ar_fold(int dtype, int op, void *dst, const void *a, const void *b, size_t n);

/* What op still owes after combining: AVG divides each of the n elements by size (in the dtype's own
 * arithmetic, as numpy's divide with a Python int); every other op owes nothing. Returns -1 for a
 * dtype AVG is not defined on. */
int ar_finish(int dtype, int op, void *dst, size_t n, int size);

#endif
