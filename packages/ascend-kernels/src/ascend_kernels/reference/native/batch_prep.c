/* Slot mapping of the reference backend as one loop: each scheduled token's cache slot from its request's block
 * table. reference/batch_prep.py's torch formulation is what this is held to; it exists because that formulation
 * is ~10 eager torch ops a step for a few dozen integers. Built with layers.c (see native_build). */
#include <stdint.h>

#include "common.h"

/* out[t] = table[req, pos / bs] * bs + pos % bs for token t of request r (tokens [qsl[r], qsl[r + 1])), req =
 * reqs[r]; -1 for a request index below 0 and for out[qsl[num_reqs]:n_out]. Returns 0, -1 when qsl is not
 * non-decreasing from 0 up to at most n_out, or 1 + the index of the first token whose block column is past the table
 * (or negative); nothing is written unless it returns 0. */
int64_t ak_slot_mapping(const void *table, int table_i64, int64_t t_rs, int64_t t_cols, const void *reqs,
                        int reqs_i64, const void *qsl, int qsl_i64, int64_t num_reqs, const void *positions,
                        int pos_i64, int64_t block_size, int64_t *out, int64_t n_out) {
    if (!ak_offsets_ok(qsl, qsl_i64, num_reqs, n_out)) return -1;
    const int64_t tokens = num_reqs ? ak_index(qsl, qsl_i64, num_reqs) : 0;
    for (int64_t r = 0; r < num_reqs; r++) {
        if (ak_index(reqs, reqs_i64, r) < 0) continue;
        for (int64_t t = ak_index(qsl, qsl_i64, r); t < ak_index(qsl, qsl_i64, r + 1); t++) {
            const int64_t col = ak_index(positions, pos_i64, t) / block_size;
            if (ak_index(positions, pos_i64, t) < 0 || col >= t_cols) return 1 + t;
        }
    }
    for (int64_t r = 0; r < num_reqs; r++) {
        const int64_t req = ak_index(reqs, reqs_i64, r);
        for (int64_t t = ak_index(qsl, qsl_i64, r); t < ak_index(qsl, qsl_i64, r + 1); t++) {
            const int64_t pos = ak_index(positions, pos_i64, t);
            out[t] = req < 0 ? -1
                             : ak_index(table, table_i64, req * t_rs + pos / block_size) * block_size + pos % block_size;
        }
    }
    for (int64_t t = tokens; t < n_out; t++) out[t] = -1;
    return 0;
}
