/* The reduction kernels (see kernels.h): one plain loop per (dtype, op), written by a macro per family
 * so that every dtype of a family reads the same. The loops are simple enough for the compiler to
 * vectorize where the operation allows; none of them reorders or fuses arithmetic (no fast-math),
 * so each element's bits are those of numpy's ufunc on the same two operands.
 */
#include "kernels.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

/* ---- float16 and bfloat16: converted to float, computed there, rounded back to nearest even ---- */

static inline float bits_float(uint32_t x) { float f; memcpy(&f, &x, 4); return f; }
static inline uint32_t float_bits(float f) { uint32_t x; memcpy(&x, &f, 4); return x; }

static inline float half_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    if (exp == 0x1f)  /* inf or NaN, payload kept */
        return bits_float(sign | 0x7f800000u | (man << 13));
    if (exp == 0) {  /* zero or subnormal: man * 2^-24, exact in float */
        float v = (float)man * 5.9604644775390625e-08f;
        return sign ? -v : v;
    }
    return bits_float(sign | ((exp + 112) << 23) | (man << 13));
}

static inline uint16_t float_half(float f)
{
    uint32_t x = float_bits(f), sign = (x >> 16) & 0x8000, ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) {  /* inf, or NaN with the payload's top bits (never turned into inf) */
        uint32_t h = 0x7c00u + ((ax & 0x7fffffu) >> 13);
        return (uint16_t)(sign | (h == 0x7c00u && ax != 0x7f800000u ? h + 1 : h));
    }
    if (ax >= 0x477ff000u)  /* 65520 and above round to inf */
        return (uint16_t)(sign | 0x7c00u);
    if (ax < 0x38800000u) {  /* below 2^-14: a subnormal half, or zero */
        if (ax <= 0x33000000u)  /* at most 2^-25, half the smallest subnormal: ties to even zero */
            return (uint16_t)sign;
        uint32_t man = (ax & 0x7fffffu) | 0x800000u, shift = 126 - (ax >> 23);
        uint32_t h = man >> shift, rest = man & ((1u << shift) - 1), half = 1u << (shift - 1);
        h += rest > half || (rest == half && (h & 1));
        return (uint16_t)(sign | h);
    }
    /* normal: rebias the exponent, round the 13 dropped bits to nearest even (a carry is right) */
    return (uint16_t)(sign | ((ax - (112u << 23) + 0xfffu + ((ax >> 13) & 1)) >> 13));
}

static inline float brain_float(uint16_t h) { return bits_float((uint32_t)h << 16); }

static inline uint16_t float_brain(float f)
{
    uint32_t x = float_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u)  /* NaN: the quiet one of its sign */
        return (uint16_t)((x >> 16 & 0x8000) | 0x7fc0);
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1)) >> 16);
}

/* ---- MIN and MAX on floats: the same bits in either order (see allreduce.ops._Ordered) ---- */

/* Compared in F (WIDE converts). On equal operands (only zeros of opposite signs differ in bits),
 * MIN takes the negative one and MAX the positive one; a NaN operand gives the canonical NaN. */
#define PICK(fname, T, F, NAN_, WIDE, ISNAN, BEFORE, TIE)                                          \
    static void fname(void *dst, const void *a, const void *b, size_t n)                            \
    {                                                                                               \
        T *d = dst; const T *x = a, *y = b;                                                         \
        for (size_t i = 0; i < n; i++) {                                                            \
            T p = x[i], q = y[i];                                                                   \
            F fp = WIDE(p), fq = WIDE(q);                                                           \
            d[i] = ISNAN(p) || ISNAN(q) ? NAN_ : BEFORE(fp, fq) ? p : BEFORE(fq, fp) ? q : (TIE);   \
        }                                                                                           \
    }
#define LESS(u, v) ((u) < (v))
#define MORE(u, v) ((u) > (v))
#define ORDERED(name, T, F, NAN_, WIDE, ISNAN, NEG)                                                 \
    PICK(name##_min, T, F, NAN_, WIDE, ISNAN, LESS, NEG(p) ? p : q)                                 \
    PICK(name##_max, T, F, NAN_, WIDE, ISNAN, MORE, NEG(p) ? q : p)

/* SUM and PRODUCT, computed in WIDE's type and rounded back by NARROW. */
#define ARITHMETIC(name, T, WIDE, NARROW)                                                           \
    static void name##_sum(void *dst, const void *a, const void *b, size_t n)                       \
    {                                                                                               \
        T *d = dst; const T *x = a, *y = b;                                                         \
        for (size_t i = 0; i < n; i++) d[i] = NARROW(WIDE(x[i]) + WIDE(y[i]));                      \
    }                                                                                               \
    static void name##_product(void *dst, const void *a, const void *b, size_t n)                   \
    {                                                                                               \
        T *d = dst; const T *x = a, *y = b;                                                         \
        for (size_t i = 0; i < n; i++) d[i] = NARROW(WIDE(x[i]) * WIDE(y[i]));                      \
    }

#define SAME(v) (v)

static inline int f32_nan(float v) { return v != v; }
static inline int f64_nan(double v) { return v != v; }
static inline int f16_nan(uint16_t h) { return (h & 0x7fff) > 0x7c00; }
static inline int bf16_nan(uint16_t h) { return (h & 0x7fff) > 0x7f80; }
static inline int f32_neg(float v) { return signbit(v) != 0; }
static inline int f64_neg(double v) { return signbit(v) != 0; }
static inline int half_neg(uint16_t h) { return h >> 15; }

#define F32_NAN bits_float(0x7fc00000u)
static inline double f64_canonical_nan(void)
{
    uint64_t x = 0x7ff8000000000000ull;
    double d;
    memcpy(&d, &x, 8);
    return d;
}

ARITHMETIC(f32, float, SAME, SAME)
ARITHMETIC(f64, double, SAME, SAME)
ARITHMETIC(f16, uint16_t, half_float, float_half)
ARITHMETIC(bf16, uint16_t, brain_float, float_brain)
ORDERED(f32, float, float, F32_NAN, SAME, f32_nan, f32_neg)
ORDERED(f64, double, double, f64_canonical_nan(), SAME, f64_nan, f64_neg)
ORDERED(f16, uint16_t, float, 0x7e00, half_float, f16_nan, half_neg)
ORDERED(bf16, uint16_t, float, 0x7fc0, brain_float, bf16_nan, half_neg)

/* complex: SUM adds the real and imaginary parts as independent floats */
static void c64_sum(void *dst, const void *a, const void *b, size_t n) { f32_sum(dst, a, b, 2 * n); }
static void c128_sum(void *dst, const void *a, const void *b, size_t n) { f64_sum(dst, a, b, 2 * n); }

/* ---- integers: SUM and PRODUCT wrap around (computed unsigned, in W, at least as wide as T) ---- */

#define LOOP(name, T, EXPR)                                                                         \
    static void name(void *dst, const void *a, const void *b, size_t n)                             \
    {                                                                                               \
        T *d = dst; const T *x = a, *y = b;                                                         \
        for (size_t i = 0; i < n; i++) { T p = x[i], q = y[i]; d[i] = (T)(EXPR); }                  \
    }

#define INTEGER(name, T, W)                                                                         \
    LOOP(name##_sum, T, (W)p + (W)q)                                                                \
    LOOP(name##_product, T, (W)p * (W)q)                                                            \
    LOOP(name##_min, T, p < q ? p : q)                                                              \
    LOOP(name##_max, T, p > q ? p : q)                                                              \
    LOOP(name##_band, T, p & q)                                                                     \
    LOOP(name##_bor, T, p | q)                                                                      \
    LOOP(name##_bxor, T, p ^ q)

INTEGER(i8, int8_t, unsigned)
INTEGER(u8, uint8_t, unsigned)
INTEGER(i16, int16_t, unsigned)
INTEGER(u16, uint16_t, unsigned)
INTEGER(i32, int32_t, uint32_t)
INTEGER(u32, uint32_t, uint32_t)
INTEGER(i64, int64_t, uint64_t)
INTEGER(u64, uint64_t, uint64_t)

/* bool: logical (MIN = and, MAX = or), any non-zero byte read as true, results 0 or 1 */
LOOP(b_and, uint8_t, (p != 0) & (q != 0))
LOOP(b_or, uint8_t, (p != 0) | (q != 0))
LOOP(b_xor, uint8_t, (p != 0) ^ (q != 0))

/* ---- the table: [dtype][op], AVG's column the same as SUM's ---- */

#define INTS(name) \
    {name##_sum, name##_product, name##_min, name##_max, name##_band, name##_bor, name##_bxor, NULL}
#define FLOATS(name) {name##_sum, name##_product, name##_min, name##_max, NULL, NULL, NULL, name##_sum}

static const ar_fold_fn KERNELS[AR_DTYPES][AR_OPS] = {
    [AR_BOOL] = {NULL, NULL, b_and, b_or, b_and, b_or, b_xor, NULL},
    [AR_INT8] = INTS(i8), [AR_UINT8] = INTS(u8), [AR_INT16] = INTS(i16), [AR_UINT16] = INTS(u16),
    [AR_INT32] = INTS(i32), [AR_UINT32] = INTS(u32), [AR_INT64] = INTS(i64), [AR_UINT64] = INTS(u64),
    [AR_FLOAT16] = FLOATS(f16), [AR_FLOAT32] = FLOATS(f32), [AR_FLOAT64] = FLOATS(f64),
    [AR_BFLOAT16] = FLOATS(bf16),
    [AR_COMPLEX64] = {c64_sum}, [AR_COMPLEX128] = {c128_sum},
};

static const unsigned char ITEMSIZE[AR_DTYPES] = {
    [AR_BOOL] = 1, [AR_INT8] = 1, [AR_UINT8] = 1, [AR_INT16] = 2, [AR_UINT16] = 2, [AR_INT32] = 4,
    [AR_UINT32] = 4, [AR_INT64] = 8, [AR_UINT64] = 8, [AR_FLOAT16] = 2, [AR_FLOAT32] = 4,
    [AR_FLOAT64] = 8, [AR_COMPLEX64] = 8, [AR_COMPLEX128] = 16, [AR_BFLOAT16] = 2,
};

ar_fold_fn ar_kernel(int dtype, int op)
{
    if (dtype <= 0 || dtype >= AR_DTYPES || op < 0 || op >= AR_OPS)
        return NULL;
    return KERNELS[dtype][op];
}

int ar_supported(int dtype, int op) { return ar_kernel(dtype, op) != NULL; }

size_t ar_itemsize(int dtype) { return dtype > 0 && dtype < AR_DTYPES ? ITEMSIZE[dtype] : 0; }

int ar_fold(int dtype, int op, void *dst, const void *a, const void *b, size_t n)
{
    ar_fold_fn fold = ar_kernel(dtype, op);
    if (fold == NULL)
        return -1;
    fold(dst, a, b, n);
    return 0;
}

int ar_finish(int dtype, int op, void *dst, size_t n, int size)
{
    if (op != AR_AVG || size <= 1)
        return op == AR_AVG && ar_kernel(dtype, op) == NULL ? -1 : 0;
    if (dtype == AR_FLOAT32) {
        float *d = dst, by = (float)size;
        for (size_t i = 0; i < n; i++) d[i] /= by;
    } else if (dtype == AR_FLOAT64) {
        double *d = dst, by = (double)size;
        for (size_t i = 0; i < n; i++) d[i] /= by;
    } else if (dtype == AR_FLOAT16 || dtype == AR_BFLOAT16) {
        /* the divisor is the size as the dtype holds it (numpy casts the Python int first) */
        uint16_t *d = dst;
        int half = dtype == AR_FLOAT16;
        float by = half ? half_float(float_half((float)size)) : brain_float(float_brain((float)size));
        for (size_t i = 0; i < n; i++)
            d[i] = half ? float_half(half_float(d[i]) / by) : float_brain(brain_float(d[i]) / by);
    } else {
        return -1;
    }
    return 0;
}
