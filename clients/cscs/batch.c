#include "batch.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define EMPTY_KEY INT64_MIN

static int grow(void **mem, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return 0;
    size_t c = *cap ? *cap : 16;
    while (c < need)
        c *= 2;
    void *m = realloc(*mem, c * elem);
    if (!m) {
        errno = ENOMEM;
        return -1;
    }
    *mem = m;
    *cap = c;
    return 0;
}

void batch_init(struct batch *b)
{
    memset(b, 0, sizeof *b);
}

void batch_free(struct batch *b)
{
    free(b->q);
    free(b->u);
    free(b->index.slots);
    free(b->index.qnext);
    free(b->index.unext);
    batch_init(b);
}

void batch_clear(struct batch *b)
{
    b->nq = b->nu = 0;
}

int batch_add_query(struct batch *b, const struct query *q)
{
    if (q->key == EMPTY_KEY) {
        errno = EINVAL;
        return -1;
    }
    if (grow((void **)&b->q, &b->cap_q, b->nq + 1, sizeof *b->q) != 0)
        return -1;
    b->q[b->nq++] = *q;
    return 0;
}

int update_valid(const struct update *u)
{
    return u->key != EMPTY_KEY && u->attr >= CSCS_FIRST_UPDATABLE &&
           u->attr <= CSCS_LAST_UPDATABLE && cscs_schema[u->attr].type != CSCS_CHAR;
}

int batch_add_update(struct batch *b, const struct update *u)
{
    if (!update_valid(u)) {
        errno = EINVAL;
        return -1;
    }
    if (grow((void **)&b->u, &b->cap_u, b->nu + 1, sizeof *b->u) != 0)
        return -1;
    b->u[b->nu++] = *u;
    return 0;
}

static inline size_t slot_of(const struct predicate_index *ix, int64_t key)
{
    return (size_t)(((uint64_t)key * 0x9E3779B97F4A7C15ULL) >> ix->shift);
}

/* The slot holding `key`, or the empty slot where it belongs. */
static inline struct index_slot *find_slot(const struct predicate_index *ix, int64_t key)
{
    size_t h = slot_of(ix, key);
    for (;;) {
        struct index_slot *s = &ix->slots[h];
        if (s->key == key || s->key == EMPTY_KEY)
            return s;
        h = (h + 1) & ix->mask;
    }
}

int batch_index(struct batch *b)
{
    struct predicate_index *ix = &b->index;
    size_t nreq = b->nq + b->nu, nslots = 16;
    unsigned bits = 4;
    while (nslots < 2 * nreq) { /* load factor at most 1/2 */
        nslots *= 2;
        bits++;
    }
    if (grow((void **)&ix->slots, &ix->cap_slots, nslots, sizeof *ix->slots) != 0 ||
        grow((void **)&ix->qnext, &ix->cap_q, b->nq + 1, sizeof *ix->qnext) != 0 ||
        grow((void **)&ix->unext, &ix->cap_u, b->nu + 1, sizeof *ix->unext) != 0)
        return -1;
    ix->mask = nslots - 1;
    ix->shift = 64 - bits;
    for (size_t i = 0; i < nslots; i++)
        ix->slots[i] = (struct index_slot){ EMPTY_KEY, -1, -1 };
    /* Insert backwards, pushing on the chain heads, so chains end up in
     * arrival order. */
    for (size_t i = b->nu; i-- > 0;) {
        struct index_slot *s = find_slot(ix, b->u[i].key);
        s->key = b->u[i].key;
        ix->unext[i] = s->uhead;
        s->uhead = (int32_t)i;
    }
    for (size_t i = b->nq; i-- > 0;) {
        struct index_slot *s = find_slot(ix, b->q[i].key);
        s->key = b->q[i].key;
        ix->qnext[i] = s->qhead;
        s->qhead = (int32_t)i;
    }
    return 0;
}

void result_buf_free(struct result_buf *r)
{
    free(r->qidx);
    free(r->rows);
    memset(r, 0, sizeof *r);
}

static int result_append(struct result_buf *r, uint32_t q, const struct chunk *c, size_t i)
{
    if (r->n == r->cap) {
        size_t c = r->cap ? 2 * r->cap : 64;
        uint32_t *qi = realloc(r->qidx, c * sizeof *qi);
        if (!qi)
            return -1;
        r->qidx = qi;
        uint8_t *rows = realloc(r->rows, c * CSCS_TUPLE_BYTES);
        if (!rows)
            return -1;
        r->rows = rows;
        r->cap = c;
    }
    r->qidx[r->n] = q;
    chunk_row(c, i, r->rows + r->n * CSCS_TUPLE_BYTES);
    r->n++;
    return 0;
}

static void apply_update(struct chunk *c, size_t i, const struct update *u)
{
    if (cscs_schema[u->attr].type == CSCS_I32)
        ((int32_t *)c->col[u->attr])[i] = (int32_t)(uint32_t)(uint64_t)u->value;
    else
        ((int64_t *)c->col[u->attr])[i] = u->value;
}

static size_t scan_chunk(struct chunk *c, const struct batch *b, struct result_buf *out)
{
    const struct predicate_index *ix = &b->index;
    const int64_t *keys = c->col[CSCS_ATTR_KEY];
    size_t n = c->n, updated = 0;
    for (size_t i = 0; i < n; i++) {
        int64_t k = keys[i];
        size_t h = slot_of(ix, k);
        const struct index_slot *s;
        for (;;) {
            s = &ix->slots[h];
            if (s->key == k)
                break;
            if (s->key == EMPTY_KEY)
                goto next_tuple;
            h = (h + 1) & ix->mask;
        }
        for (int32_t u = s->uhead; u >= 0; u = ix->unext[u]) {
            apply_update(c, i, &b->u[u]);
            updated++;
        }
        for (int32_t q = s->qhead; q >= 0; q = ix->qnext[q])
            if (result_append(out, (uint32_t)q, c, i) != 0)
                out->failed = 1;
    next_tuple:;
    }
    return updated;
}

size_t scan_partition(struct partition *p, const struct batch *b, struct result_buf *out)
{
    size_t updated = 0;
    out->n = 0;
    out->failed = 0;
    for (size_t k = 0; k < p->nchunks; k++)
        updated += scan_chunk(p->chunks[k], b, out);
    return updated;
}

void batch_output_free(struct batch_output *o)
{
    free(o->offset);
    free(o->rows);
    memset(o, 0, sizeof *o);
}

static int cmp_row_id(const void *a, const void *b)
{
    int64_t x = row_id(a), y = row_id(b);
    return (x > y) - (x < y);
}

int merge_results(struct result_buf *bufs, size_t nbufs, size_t nq, struct batch_output *out)
{
    size_t total = 0;
    for (size_t t = 0; t < nbufs; t++) {
        if (bufs[t].failed) {
            errno = ENOMEM;
            return -1;
        }
        total += bufs[t].n;
    }
    if (grow((void **)&out->offset, &out->cap_q, nq + 1, sizeof *out->offset) != 0 ||
        grow((void **)&out->rows, &out->cap_rows, total, CSCS_TUPLE_BYTES) != 0)
        return -1;
    out->nq = nq;
    out->nrows = total;
    size_t *off = out->offset;
    memset(off, 0, (nq + 1) * sizeof *off);
    for (size_t t = 0; t < nbufs; t++)
        for (size_t i = 0; i < bufs[t].n; i++)
            off[bufs[t].qidx[i] + 1]++;
    for (size_t q = 0; q < nq; q++)
        off[q + 1] += off[q];
    /* Place rows using off[q] as the fill cursor of query q, then shift the
     * cursors back into offsets. */
    for (size_t t = 0; t < nbufs; t++)
        for (size_t i = 0; i < bufs[t].n; i++) {
            uint32_t q = bufs[t].qidx[i];
            memcpy(out->rows + off[q] * CSCS_TUPLE_BYTES,
                   bufs[t].rows + i * CSCS_TUPLE_BYTES, CSCS_TUPLE_BYTES);
            off[q]++;
        }
    for (size_t q = nq; q > 0; q--)
        off[q] = off[q - 1];
    off[0] = 0;
    for (size_t q = 0; q < nq; q++)
        if (off[q + 1] - off[q] > 1)
            qsort(out->rows + off[q] * CSCS_TUPLE_BYTES, off[q + 1] - off[q],
                  CSCS_TUPLE_BYTES, cmp_row_id);
    return 0;
}
