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

/* Columns are never empty allocations: room for at least one tuple keeps
 * every pointer valid and numa_realloc happy. */
static size_t column_bytes(int attr, size_t cap)
{
    return (cap ? cap : 1) * cscs_schema[attr].width;
}

/* Large columns on transparent huge pages where the kernel offers them
 * only on request ("madvise" mode): a scan walks columns of hundreds of
 * megabytes, and materialising one matching row touches all 48 columns,
 * a TLB miss each on 4 KiB pages.  Advice only: failure changes nothing. */
#define HUGE_PAGE_BYTES (2u << 20)

static void *advise_huge(void *mem, size_t bytes)
{
    if (mem && bytes >= HUGE_PAGE_BYTES)
        (void)madvise(mem, bytes, MADV_HUGEPAGE);
    return mem;
}

static void *column_alloc(int node, size_t bytes)
{
    if (node >= 0 && numa_binding_available())
        return advise_huge(numa_alloc_onnode(bytes, node), bytes);
    return malloc(bytes);
}

static void *column_realloc(int node, void *old, size_t old_bytes, size_t bytes)
{
    if (node >= 0 && numa_binding_available())
        return advise_huge(numa_realloc(old, old_bytes, bytes), bytes);
    return realloc(old, bytes);
}

static void column_free(int node, void *mem, size_t bytes)
{
    if (!mem)
        return;
    if (node >= 0 && numa_binding_available())
        numa_free(mem, bytes);
    else
        free(mem);
}

int partition_init(struct partition *p, int node, size_t cap)
{
    memset(p, 0, sizeof *p);
    p->node = node;
    p->cap = cap;
    for (int a = 0; a < CSCS_NATTR; a++) {
        p->col_bytes[a] = column_bytes(a, cap);
        p->col[a] = column_alloc(node, p->col_bytes[a]);
        if (!p->col[a]) {
            partition_free(p);
            errno = ENOMEM;
            return -1;
        }
    }
    return 0;
}

/* Tuples every column has room for. */
static size_t common_capacity(const struct partition *p)
{
    size_t cap = SIZE_MAX;
    for (int a = 0; a < CSCS_NATTR; a++) {
        size_t c = p->col_bytes[a] / cscs_schema[a].width;
        if (c < cap)
            cap = c;
    }
    return cap;
}

/* Every column to room for `cap` tuples (never fewer than p->n).  On
 * failure the columns already resized keep their new size (col_bytes says
 * so) and p->cap becomes what every column has room for: the data is
 * intact and later appends still reserve before they write. */
static int partition_resize(struct partition *p, size_t cap)
{
    for (int a = 0; a < CSCS_NATTR; a++) {
        size_t bytes = column_bytes(a, cap);
        if (bytes == p->col_bytes[a])
            continue;
        void *m = column_realloc(p->node, p->col[a], p->col_bytes[a], bytes);
        if (!m) {
            p->cap = common_capacity(p);
            errno = ENOMEM;
            return -1;
        }
        p->col[a] = m;
        p->col_bytes[a] = bytes;
    }
    p->cap = cap;
    return 0;
}

int partition_reserve(struct partition *p, size_t cap)
{
    if (cap <= p->cap)
        return 0;
    return partition_resize(p, cap);
}

int partition_shrink_to_fit(struct partition *p)
{
    if (p->n >= p->cap)
        return 0;
    return partition_resize(p, p->n);
}

void partition_free(struct partition *p)
{
    for (int a = 0; a < CSCS_NATTR; a++) {
        column_free(p->node, p->col[a], p->col_bytes[a]);
        p->col[a] = NULL;
        p->col_bytes[a] = 0;
    }
    p->n = p->cap = 0;
}

int partition_generate(struct partition *p, uint64_t seedh, uint64_t nkeys,
                       uint64_t first_id, size_t count)
{
    if (partition_reserve(p, p->n + count) != 0)
        return -1;
    for (int a = 0; a < CSCS_NATTR; a++) {
        uint16_t w = cscs_schema[a].width;
        uint8_t *c = (uint8_t *)p->col[a] + p->n * w;
        for (size_t i = 0; i < count; i++)
            cscs_gen_value(seedh, nkeys, first_id + i, a, c + i * w);
    }
    p->n += count;
    return 0;
}

int partition_append(struct partition *dst, const struct partition *src,
                     size_t src_first, size_t count)
{
    if (src_first > src->n || count > src->n - src_first) {
        errno = EINVAL;
        return -1;
    }
    if (partition_reserve(dst, dst->n + count) != 0)
        return -1;
    for (int a = 0; a < CSCS_NATTR; a++) {
        uint16_t w = cscs_schema[a].width;
        memcpy((uint8_t *)dst->col[a] + dst->n * w,
               (const uint8_t *)src->col[a] + src_first * w, count * w);
    }
    dst->n += count;
    return 0;
}

void partition_row(const struct partition *p, size_t i, uint8_t *row)
{
    for (int a = 0; a < CSCS_NATTR; a++) {
        uint16_t w = cscs_schema[a].width;
        memcpy(row + cscs_schema[a].offset, (const uint8_t *)p->col[a] + i * w, w);
    }
}
