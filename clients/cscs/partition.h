/* A horizontal partition of the table, stored column by column in memory
 * bound to one NUMA node (the node of the core whose scan thread owns it). */
#ifndef CSCS_PARTITION_H
#define CSCS_PARTITION_H

#include <stddef.h>
#include <stdint.h>

#include "schema.h"

struct partition {
    int node;      /* NUMA node its memory is bound to; -1: no binding */
    size_t n;      /* tuples held */
    size_t cap;    /* tuples the columns have room for */
    void *col[CSCS_NATTR];
    size_t col_bytes[CSCS_NATTR]; /* bytes allocated for each column */
};

/* Whether memory can be bound to nodes here (libnuma and a NUMA kernel). */
int numa_binding_available(void);
/* The NUMA node of a CPU (0 when the machine has no NUMA information). */
int cpu_numa_node(int cpu);

/* An empty partition on `node` (-1: default policy) with room for `cap`
 * tuples.  Returns 0, or -1 with errno set (ENOMEM). */
int partition_init(struct partition *p, int node, size_t cap);
/* Grow the columns to room for at least `cap` tuples, keeping the data and
 * the node binding (libnuma's numa_realloc moves pages without copying). */
int partition_reserve(struct partition *p, size_t cap);
/* Give memory back once the partition has shrunk to `n` tuples. */
int partition_shrink_to_fit(struct partition *p);
void partition_free(struct partition *p);

/* Append tuples first_id .. first_id + count - 1, freshly generated. */
int partition_generate(struct partition *p, uint64_t seedh, uint64_t nkeys,
                       uint64_t first_id, size_t count);
/* Append `count` tuples of src starting at src_first (every column). */
int partition_append(struct partition *dst, const struct partition *src,
                     size_t src_first, size_t count);
/* The tuple at `i` as a row of CSCS_TUPLE_BYTES, attributes in schema order. */
void partition_row(const struct partition *p, size_t i, uint8_t *row);

static inline int64_t partition_key(const struct partition *p, size_t i)
{
    return ((const int64_t *)p->col[CSCS_ATTR_KEY])[i];
}

#endif
