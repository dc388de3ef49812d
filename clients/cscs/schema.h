/* The CSCS table: one relation of 48 attributes, 315-byte tuples, generated
 * deterministically from a seed and a tuple count (COD paper, Sections 4.4
 * and 7.2: one table, 48 attributes, 315 B per tuple).
 *
 * Attribute 0 (`id`) numbers the tuples 0..N-1 and is unique; attribute 1
 * (`key`) is the predicate attribute of every request, with about
 * CSCS_TUPLES_PER_KEY tuples per value, so a point request matches a few
 * records as in the paper's workload.  The generator is mirrored in
 * tests/helpers/cscs_ref.py; change both together. */
#ifndef CSCS_SCHEMA_H
#define CSCS_SCHEMA_H

#include <stddef.h>
#include <stdint.h>

#define CSCS_NATTR 48
#define CSCS_TUPLE_BYTES 315
#define CSCS_ATTR_ID 0
#define CSCS_ATTR_KEY 1
/* Updates may set the numeric attributes after id and key. */
#define CSCS_FIRST_UPDATABLE 2
#define CSCS_LAST_UPDATABLE 38
#define CSCS_TUPLES_PER_KEY 4

enum cscs_type { CSCS_I32, CSCS_I64, CSCS_CHAR };

struct cscs_attr {
    const char *name;
    enum cscs_type type;
    uint16_t width;  /* bytes in a column and in a row */
    uint16_t offset; /* byte offset in a materialised row */
};

extern const struct cscs_attr cscs_schema[CSCS_NATTR];

/* The seed as the generator uses it (one splitmix64 step, so that nearby
 * seeds give unrelated tables). */
uint64_t cscs_seed_hash(uint64_t seed);
uint64_t cscs_splitmix64(uint64_t x);
/* Number of distinct key values for a table of `ntuples`. */
uint64_t cscs_nkeys(uint64_t ntuples);
uint64_t cscs_key_of(uint64_t seedh, uint64_t nkeys, uint64_t id);
/* Write the value of attribute `attr` of tuple `id` (width bytes) to out. */
void cscs_gen_value(uint64_t seedh, uint64_t nkeys, uint64_t id, int attr, void *out);

#endif
