/* Where a task's new pages go: the allocation's memory nodes as the kernel's memory policy,
 * for the calling thread (set_mempolicy(2)) or for a range of the process (mbind(2)).
 * docs/design-enforce.md says when an engine needs this (affinity mode). */

#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "cod.h"

#define MAX_NODES 4096
#define WORD_BITS (8 * sizeof(unsigned long))

/* The allocation's memory nodes as a node mask; 1 when there are some, 0 when none, or COD_EINVAL. */
static int node_mask(const cod_allocation *a, int mode, unsigned long *mask, unsigned long *maxnode)
{
    if (!a || (a->nmemory_nodes && !a->memory_nodes))
        return COD_EINVAL;
    if (mode != COD_MEM_BIND && mode != COD_MEM_PREFERRED && mode != COD_MEM_INTERLEAVE)
        return COD_EINVAL;
    memset(mask, 0, MAX_NODES / 8);
    size_t n = mode == COD_MEM_PREFERRED && a->nmemory_nodes ? 1 : a->nmemory_nodes; /* preferred: one node */
    int top = -1;
    for (size_t i = 0; i < n; i++) {
        int node = a->memory_nodes[i];
        if (node < 0 || node >= MAX_NODES)
            return COD_EINVAL;
        mask[(unsigned)node / WORD_BITS] |= 1UL << ((unsigned)node % WORD_BITS);
        if (node > top)
            top = node;
    }
    *maxnode = ((unsigned long)top / WORD_BITS + 1) * WORD_BITS + 1; /* the kernel reads maxnode - 1 bits */
    return n > 0;
}

int cod_bind_thread_memory(const cod_allocation *a, int mode)
{
    unsigned long mask[MAX_NODES / WORD_BITS], maxnode = 0;
    int rc = node_mask(a, mode, mask, &maxnode);
    if (rc <= 0)
        return rc;
    return syscall(SYS_set_mempolicy, mode, mask, maxnode) == 0 ? COD_OK : COD_ESYSTEM;
}

int cod_bind_memory_range(void *addr, size_t len, const cod_allocation *a, int mode)
{
    long page = sysconf(_SC_PAGESIZE);
    if (!addr || len == 0 || page <= 0 || (uintptr_t)addr % (uintptr_t)page)
        return COD_EINVAL;
    unsigned long mask[MAX_NODES / WORD_BITS], maxnode = 0;
    int rc = node_mask(a, mode, mask, &maxnode);
    if (rc <= 0)
        return rc;
    return syscall(SYS_mbind, addr, len, mode, mask, maxnode, 0U) == 0 ? COD_OK : COD_ESYSTEM;
}
