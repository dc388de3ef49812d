// SPDX-License-Identifier: GPL-2.0
/* Loads procevents.bpf.o, attaches its tp_btf programs and hands its ring buffer's events to
 * the caller in batches: the small C side of cod.rm.enforce.bpfevents (loaded with ctypes).
 * Everything is tied to the caller's file descriptors: when the process ends, the kernel
 * detaches the programs. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/types.h>
#include <bpf/bpf.h>
#include <bpf/libbpf.h>

#include "procevents.h"

struct cod_pe {
	struct bpf_object *obj;
	struct ring_buffer *rb;
	struct bpf_link *links[8];
	int nlinks;
	int dropped_fd;
	struct cod_pe_event *out; /* the batch being filled by cod_pe_read */
	int n, max;
};

static void say(char *err, size_t len, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(err, len, fmt, ap);
	va_end(ap);
}

static int quiet(enum libbpf_print_level level, const char *fmt, va_list ap)
{
	(void)level; (void)fmt; (void)ap;
	return 0;
}

static int on_event(void *ctx, void *data, size_t size)
{
	struct cod_pe *pe = ctx;
	if (size < sizeof(struct cod_pe_event))
		return 0;
	memcpy(&pe->out[pe->n++], data, sizeof(struct cod_pe_event));
	return pe->n >= pe->max ? -E2BIG : 0; /* full: stop here, this event is taken */
}

void cod_pe_close(struct cod_pe *pe)
{
	if (!pe)
		return;
	ring_buffer__free(pe->rb);
	for (int i = 0; i < pe->nlinks; i++)
		bpf_link__destroy(pe->links[i]);
	bpf_object__close(pe->obj);
	free(pe);
}

/* NULL with the reason in err when the object does not load (no BTF, no permission, ...). */
struct cod_pe *cod_pe_open(const char *path, char *err, size_t errlen)
{
	struct bpf_program *prog;
	struct cod_pe *pe = calloc(1, sizeof(*pe));
	if (!pe) {
		say(err, errlen, "out of memory");
		return NULL;
	}
	libbpf_set_print(quiet);
	pe->obj = bpf_object__open_file(path, NULL);
	if (!pe->obj) {
		say(err, errlen, "cannot open %s: %s", path, strerror(errno));
		pe->obj = NULL;
		goto fail;
	}
	int rc = bpf_object__load(pe->obj);
	if (rc) {
		say(err, errlen, "the kernel refused the programs of %s: %s", path, strerror(-rc));
		goto fail;
	}
	bpf_object__for_each_program(prog, pe->obj) {
		if (pe->nlinks == (int)(sizeof(pe->links) / sizeof(pe->links[0]))) {
			say(err, errlen, "too many programs in %s", path);
			goto fail;
		}
		struct bpf_link *link = bpf_program__attach(prog);
		if (!link) {
			say(err, errlen, "cannot attach %s: %s", bpf_program__name(prog), strerror(errno));
			goto fail;
		}
		pe->links[pe->nlinks++] = link;
	}
	pe->dropped_fd = bpf_object__find_map_fd_by_name(pe->obj, "dropped");
	int events_fd = bpf_object__find_map_fd_by_name(pe->obj, "events");
	if (pe->dropped_fd < 0 || events_fd < 0) {
		say(err, errlen, "%s lacks its maps", path);
		goto fail;
	}
	pe->rb = ring_buffer__new(events_fd, on_event, pe, NULL);
	if (!pe->rb) {
		say(err, errlen, "cannot map the ring buffer: %s", strerror(errno));
		goto fail;
	}
	return pe;
fail:
	cod_pe_close(pe);
	return NULL;
}

/* An fd that polls readable when events wait (epoll over the ring buffer). */
int cod_pe_fd(struct cod_pe *pe)
{
	return ring_buffer__epoll_fd(pe->rb);
}

/* Up to max waiting events into out, without blocking; their number, or -errno. */
int cod_pe_read(struct cod_pe *pe, struct cod_pe_event *out, int max)
{
	if (max <= 0)
		return -EINVAL;
	pe->out = out;
	pe->n = 0;
	pe->max = max;
	int rc = ring_buffer__consume(pe->rb);
	if (rc < 0 && rc != -E2BIG)
		return rc;
	return pe->n;
}

/* How many events the BPF side could not queue (the ring buffer was full), since the start. */
long long cod_pe_dropped(struct cod_pe *pe)
{
	__u32 zero = 0;
	__u64 n = 0;
	if (bpf_map_lookup_elem(pe->dropped_fd, &zero, &n))
		return -errno;
	return (long long)n;
}
