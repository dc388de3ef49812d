/* A batch of point requests on the key attribute, its predicate index and
 * the shared scan that answers the whole batch in one pass (ClockScan,
 * Unterbrunner et al., PVLDB 2009; COD paper Section 4.1).
 *
 * Semantics of a batch: for every tuple, the updates of the batch whose key
 * matches are applied in arrival order, then every query whose key matches
 * sees the updated tuple.  So a batch answers its queries on the table as
 * it is after all of the batch's updates (and all earlier batches').  */
#ifndef CSCS_BATCH_H
#define CSCS_BATCH_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "partition.h"

/* SELECT * FROM t WHERE key = `key` */
struct query {
    int64_t key;
    double submitted; /* seconds on CLOCK_MONOTONIC */
};

/* UPDATE t SET attr = value WHERE key = `key` (attr numeric, not id/key) */
struct update {
    int64_t key;
    int attr;
    int64_t value; /* an I32 attribute takes the low 32 bits */
    double submitted;
};

/* Predicate index: an open-addressing hash table from key to the chains of
 * queries and updates with that key, probed once per scanned tuple. */
struct index_slot {
    int64_t key;
    int32_t qhead, uhead; /* first query / update with this key, -1: none */
};

struct predicate_index {
    struct index_slot *slots;
    size_t mask;           /* slots - 1 (a power of two) */
    unsigned shift;        /* 64 - log2(slots), for multiplicative hashing */
    int32_t *qnext, *unext; /* chains, in arrival order */
    size_t cap_slots, cap_q, cap_u;
};

struct batch {
    uint64_t seq;
    struct query *q;
    size_t nq, cap_q;
    struct update *u;
    size_t nu, cap_u;
    struct predicate_index index;
};

void batch_init(struct batch *b);
void batch_free(struct batch *b);
void batch_clear(struct batch *b);
int batch_add_query(struct batch *b, const struct query *q);
int batch_add_update(struct batch *b, const struct update *u);
/* Build the predicate index over the batch's requests. */
int batch_index(struct batch *b);
/* Validate an update (the attribute is updatable). */
int update_valid(const struct update *u);

/* Matches found by one scan thread: query number and the materialised row. */
struct result_buf {
    uint32_t *qidx;
    uint8_t *rows;
    size_t n, cap;
    int failed; /* out of memory while scanning: the batch's answer is void */
};

void result_buf_free(struct result_buf *r);

/* Scan the partition once against the batch: apply matching updates in
 * place, append every query match to `out`.  Returns tuples updated. */
size_t scan_partition(struct partition *p, const struct batch *b, struct result_buf *out);

/* The answer to a batch: for query i, rows[offset[i] .. offset[i+1]), each
 * CSCS_TUPLE_BYTES, ordered by id. */
struct batch_output {
    size_t nq;
    size_t *offset;
    uint8_t *rows;
    size_t nrows, cap_rows, cap_q;
};

void batch_output_free(struct batch_output *o);
/* The merge step: gather the threads' matches into the batch's answer. */
int merge_results(struct result_buf *bufs, size_t nbufs, size_t nq, struct batch_output *out);

static inline int64_t row_id(const uint8_t *row)
{
    int64_t id;
    memcpy(&id, row, sizeof id);
    return id;
}

#endif
