/* libFuzzer target: any bytes through the frame header parser (src/allreduce/native/frames.c).
 *
 * The parser must never read outside what it is given, and what it accepts must hold what the
 * engine relies on: a kind of this version, an ABORT reason within bounds. Every prefix of the input
 * is tried, as a header read off a socket may be cut anywhere. `make fuzz` builds and runs it.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "frames.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    for (size_t len = 0; len <= size && len <= 2 * AR_HEADER_SIZE; len++) {
        uint8_t *copy = malloc(len ? len : 1);  /* exactly len bytes, so ASan sees any overread */
        if (copy == NULL) return 0;
        memcpy(copy, data, len);
        ar_header h;
        int why = ar_header_parse(copy, len, &h);
        if (why == AR_FRAME_OK) {
            if (len != AR_HEADER_SIZE || h.kind < AR_KIND_DATA || h.kind > AR_KIND_LAST) abort();
            if (h.kind == AR_KIND_ABORT && h.nbytes > AR_MAX_ABORT_REASON) abort();
            uint8_t stamped[AR_HEADER_SIZE];
            memcpy(stamped, copy, AR_HEADER_SIZE);
            ar_header_stamp(stamped, h.step, h.seq, h.nbytes);
            if (memcmp(stamped, copy, AR_HEADER_SIZE) != 0) abort();  /* the stamp writes what parse read */
        } else if (why < AR_FRAME_SHORT || why > AR_FRAME_ABORT_SIZE) {
            abort();
        }
        free(copy);
    }
    return 0;
}
