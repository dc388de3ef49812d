/* A horizontal partition of the table: a list of chunks, each holding up
 * to CSCS_CHUNK_TUPLES tuples column by column in one block of memory bound
 * to one NUMA node (the node of the core that filled it).
 *
 * Chunks make redistribution cheap: tuples that move between partitions on
 * the same node move as whole chunks (a pointer, no copy, no page faults);
 * only partial chunks and moves to another node are copied, by the thread
 * that receives them, into memory on its own node.  Tuples have no order in
 * a partition. */
#ifndef CSCS_PARTITION_H
#define CSCS_PARTITION_H

#include <stddef.h>
#include <stdint.h>

#include "schema.h"

/* 64 Ki tuples: 20.6 MB per chunk, 512 KiB of key column. */
#define CSCS_CHUNK_TUPLES ((size_t)1 << 16)

struct chunk {
    size_t n;    /* tuples held, at most CSCS_CHUNK_TUPLES */
    int node;    /* NUMA node of its memory; -1: default policy */
    void *mem;   /* one block for all columns */
    size_t bytes;
    void *col[CSCS_NATTR];
};

struct partition {
    int node;    /* where new chunks go; -1: default policy */
    size_t n;    /* tuples, over all chunks */
    struct chunk **chunks;
    size_t nchunks, cap_chunks;
};

/* Whether memory can be bound to nodes here (libnuma and a NUMA kernel). */
int numa_binding_available(void);
/* The NUMA node of a CPU (0 when the machine has no NUMA information). */
int cpu_numa_node(int cpu);

void partition_init(struct partition *p, int node);
void partition_free(struct partition *p);

/* Append tuples first_id .. first_id + count - 1, freshly generated.
 * Returns 0, or -1 with errno ENOMEM (the tuples appended so far stay). */
int partition_generate(struct partition *p, uint64_t seedh, uint64_t nkeys,
                       uint64_t first_id, size_t count);
/* Copy `count` tuples of chunk c from index `start` to p, into p's last
 * chunk and new chunks on p's node.  Returns 0 or -1 (ENOMEM). */
int partition_copy_in(struct partition *p, const struct chunk *c, size_t start, size_t count);
/* Append a whole chunk (taken from another partition). */
int partition_adopt(struct partition *p, struct chunk *c);
/* Keep the first `n` tuples (in chunk order): later chunks are freed, the
 * chunk holding the n-th tuple shortened.  For undoing an append. */
void partition_truncate(struct partition *p, size_t n);

/* The tuple at `i` of chunk c as a row of CSCS_TUPLE_BYTES, attributes in
 * schema order. */
void chunk_row(const struct chunk *c, size_t i, uint8_t *row);
void chunk_free(struct chunk *c);

#endif
