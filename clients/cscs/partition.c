#include "partition.h"

#include <errno.h>
#include <numa.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

int numa_binding_available(void)
{
    static int avail = -2;
    if (avail == -2)
        avail = numa_available() >= 0;
    return avail;
}

int cpu_numa_node(int cpu)
{
    if (!numa_binding_available())
        return 0;
    int node = numa_node_of_cpu(cpu);
    return node < 0 ? 0 : node;
}

/* Column offsets in a chunk's block, each column cache-line aligned. */
static size_t column_offset[CSCS_NATTR];
static size_t chunk_bytes;

static void layout_init(void)
{
    size_t off = 0;
    for (int a = 0; a < CSCS_NATTR; a++) {
        column_offset[a] = off;
        off += (CSCS_CHUNK_TUPLES * cscs_schema[a].width + 63) & ~(size_t)63;
    }
    chunk_bytes = off;
}

/* A chunk's block goes on transparent huge pages where the kernel offers
 * them only on request ("madvise" mode): a scan walks all of it, and
 * materialising one matching row touches all 48 columns, a TLB miss each on
 * 4 KiB pages.  Advice only: failure changes nothing. */
static struct chunk *chunk_new(int node)
{
    if (chunk_bytes == 0)
        layout_init();
    struct chunk *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->node = node;
    c->bytes = chunk_bytes;
    if (node >= 0 && numa_binding_available()) {
        c->mem = numa_alloc_onnode(chunk_bytes, node);
        if (c->mem)
            (void)madvise(c->mem, chunk_bytes, MADV_HUGEPAGE);
    } else {
        c->mem = malloc(chunk_bytes);
    }
    if (!c->mem) {
        free(c);
        return NULL;
    }
    for (int a = 0; a < CSCS_NATTR; a++)
        c->col[a] = (uint8_t *)c->mem + column_offset[a];
    return c;
}

void chunk_free(struct chunk *c)
{
    if (!c)
        return;
    if (c->node >= 0 && numa_binding_available())
        numa_free(c->mem, c->bytes);
    else
        free(c->mem);
    free(c);
}

void partition_init(struct partition *p, int node)
{
    memset(p, 0, sizeof *p);
    p->node = node;
}

void partition_free(struct partition *p)
{
    for (size_t i = 0; i < p->nchunks; i++)
        chunk_free(p->chunks[i]);
    free(p->chunks);
    partition_init(p, p->node);
}

int partition_adopt(struct partition *p, struct chunk *c)
{
    if (p->nchunks == p->cap_chunks) {
        size_t cap = p->cap_chunks ? 2 * p->cap_chunks : 8;
        struct chunk **m = realloc(p->chunks, cap * sizeof *m);
        if (!m) {
            errno = ENOMEM;
            return -1;
        }
        p->chunks = m;
        p->cap_chunks = cap;
    }
    p->chunks[p->nchunks++] = c;
    p->n += c->n;
    return 0;
}

/* The chunk to append to: the last one if it has room, else a new one. */
static struct chunk *tail_with_room(struct partition *p)
{
    if (p->nchunks && p->chunks[p->nchunks - 1]->n < CSCS_CHUNK_TUPLES)
        return p->chunks[p->nchunks - 1];
    struct chunk *c = chunk_new(p->node);
    if (!c || partition_adopt(p, c) != 0) {
        chunk_free(c);
        errno = ENOMEM;
        return NULL;
    }
    return c;
}

int partition_generate(struct partition *p, uint64_t seedh, uint64_t nkeys,
                       uint64_t first_id, size_t count)
{
    while (count > 0) {
        struct chunk *c = tail_with_room(p);
        if (!c)
            return -1;
        size_t k = CSCS_CHUNK_TUPLES - c->n;
        if (k > count)
            k = count;
        for (int a = 0; a < CSCS_NATTR; a++) {
            uint16_t w = cscs_schema[a].width;
            uint8_t *col = (uint8_t *)c->col[a] + c->n * w;
            for (size_t i = 0; i < k; i++)
                cscs_gen_value(seedh, nkeys, first_id + i, a, col + i * w);
        }
        c->n += k;
        p->n += k;
        first_id += k;
        count -= k;
    }
    return 0;
}

int partition_copy_in(struct partition *p, const struct chunk *src, size_t start, size_t count)
{
    if (start > src->n || count > src->n - start) {
        errno = EINVAL;
        return -1;
    }
    while (count > 0) {
        struct chunk *c = tail_with_room(p);
        if (!c)
            return -1;
        size_t k = CSCS_CHUNK_TUPLES - c->n;
        if (k > count)
            k = count;
        for (int a = 0; a < CSCS_NATTR; a++) {
            uint16_t w = cscs_schema[a].width;
            memcpy((uint8_t *)c->col[a] + c->n * w, (const uint8_t *)src->col[a] + start * w, k * w);
        }
        c->n += k;
        p->n += k;
        start += k;
        count -= k;
    }
    return 0;
}

void partition_truncate(struct partition *p, size_t n)
{
    while (p->n > n) {
        struct chunk *c = p->chunks[p->nchunks - 1];
        size_t drop = p->n - n;
        if (drop >= c->n) {
            p->n -= c->n;
            p->nchunks--;
            chunk_free(c);
        } else {
            c->n -= drop;
            p->n -= drop;
        }
    }
}

void chunk_row(const struct chunk *c, size_t i, uint8_t *row)
{
    for (int a = 0; a < CSCS_NATTR; a++) {
        uint16_t w = cscs_schema[a].width;
        memcpy(row + cscs_schema[a].offset, (const uint8_t *)c->col[a] + i * w, w);
    }
}
