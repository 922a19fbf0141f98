/* The 40-byte frame header of allreduce.wire, in C: packed by the Python side, stamped and checked here.
 *
 * A planned call knows every header it will send and expect before it runs; only the step, the
 * sequence number and the payload length change between frames, so the engine stamps those three
 * fields into a template and compares whole headers with memcmp. ar_header_parse is the one place a
 * header from a peer is interpreted field by field (an ABORT's reason length, garbage from a
 * stranger); it reads exactly AR_HEADER_SIZE bytes and trusts none of them.
 */
#ifndef ALLREDUCE_FRAMES_H
#define ALLREDUCE_FRAMES_H

#include <stddef.h>
#include <stdint.h>

#define AR_HEADER_SIZE 40
#define AR_VERSION 2
#define AR_KIND_DATA 1
#define AR_KIND_ABORT 2
#define AR_KIND_LAST 8            /* the highest kind wire.KINDS knows */
#define AR_MAX_ABORT_REASON 4096  /* wire.MAX_ABORT_REASON */

/* Where the fields of wire._HEADER ("<2sBBBBBxiIIIQQ") lie. */
#define AR_AT_STEP 12
#define AR_AT_SEQ 16
#define AR_AT_NBYTES 32

typedef struct {
    uint8_t kind, collective, dtype, op;
    int32_t root;
    uint32_t step, seq, algorithm;
    uint64_t count, nbytes;
} ar_header;

enum {
    AR_FRAME_OK = 0,
    AR_FRAME_SHORT = 1,        /* not AR_HEADER_SIZE bytes */
    AR_FRAME_MAGIC = 2,        /* not "AR": not a peer of ours */
    AR_FRAME_VERSION = 3,      /* another frame version */
    AR_FRAME_KIND = 4,         /* a kind this version does not have */
    AR_FRAME_ABORT_SIZE = 5,   /* an ABORT whose reason exceeds AR_MAX_ABORT_REASON */
};

/* Parse ``len`` bytes at ``buf`` into ``out``: AR_FRAME_OK, or why they are not a header. */
int ar_header_parse(const uint8_t *buf, size_t len, ar_header *out);

/* Write a frame's step, sequence number and payload length into ``header`` (little-endian, in place). */
void ar_header_stamp(uint8_t *header, uint32_t step, uint32_t seq, uint64_t nbytes);

#endif
