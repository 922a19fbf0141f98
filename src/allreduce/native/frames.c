/* The frame header's parser and stamp (see frames.h): plain C, no Python, so a fuzzer links it alone. */
#include "frames.h"

#include <string.h>

static uint32_t le32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t le64(const uint8_t *p) { return (uint64_t)le32(p) | (uint64_t)le32(p + 4) << 32; }

static void put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static void put64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

int ar_header_parse(const uint8_t *buf, size_t len, ar_header *out) {
    if (buf == NULL || len != AR_HEADER_SIZE) return AR_FRAME_SHORT;
    if (buf[0] != 'A' || buf[1] != 'R') return AR_FRAME_MAGIC;
    if (buf[2] != AR_VERSION) return AR_FRAME_VERSION;
    out->kind = buf[3];
    out->collective = buf[4];
    out->dtype = buf[5];
    out->op = buf[6];
    out->root = (int32_t)le32(buf + 8);
    out->step = le32(buf + AR_AT_STEP);
    out->seq = le32(buf + AR_AT_SEQ);
    out->algorithm = le32(buf + 20);
    out->count = le64(buf + 24);
    out->nbytes = le64(buf + AR_AT_NBYTES);
    if (out->kind < AR_KIND_DATA || out->kind > AR_KIND_LAST) return AR_FRAME_KIND;
    if (out->kind == AR_KIND_ABORT && out->nbytes > AR_MAX_ABORT_REASON) return AR_FRAME_ABORT_SIZE;
    return AR_FRAME_OK;
}

void ar_header_stamp(uint8_t *header, uint32_t step, uint32_t seq, uint64_t nbytes) {
    put32(header + AR_AT_STEP, step);
    put32(header + AR_AT_SEQ, seq);
    put64(header + AR_AT_NBYTES, nbytes);
}
