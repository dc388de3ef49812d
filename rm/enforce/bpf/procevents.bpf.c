// SPDX-License-Identifier: GPL-2.0
/* Process events from BPF: fork, exec, exit and rename into one ring buffer.
 *
 * The same events as the proc connector (include/uapi/linux/cn_proc.h), with the same
 * meaning for parent_*: the child's real_parent, as proc_fork_connector reports them.
 * tp_btf programs: no vmlinux.h; the few task_struct fields read are CO-RE relocated
 * against the running kernel's BTF by libbpf.  Loaded by procevents_lib.c. */
#include <linux/types.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>

#include "procevents.h"

struct task_struct {
	int pid;
	int tgid;
	int exit_code;
	struct task_struct *real_parent;
} __attribute__((preserve_access_index));

char LICENSE[] SEC("license") = "GPL";

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, COD_PE_RINGBUF_BYTES);
} events SEC(".maps");

/* Events the ring buffer had no room for: the reader reports an overrun when it grows. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} dropped SEC(".maps");

static __always_inline struct cod_pe_event *reserve(__u32 kind, struct task_struct *p)
{
	struct cod_pe_event *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e) {
		__u32 zero = 0;
		__u64 *n = bpf_map_lookup_elem(&dropped, &zero);
		if (n)
			__sync_fetch_and_add(n, 1);
		return 0;
	}
	e->kind = kind;
	e->pid = p->pid;
	e->tgid = p->tgid;
	e->parent_pid = 0;
	e->parent_tgid = 0;
	e->exit_code = 0;
	e->timestamp_ns = bpf_ktime_get_ns();
	__builtin_memset(e->comm, 0, sizeof(e->comm));
	return e;
}

static __always_inline void with_parent(struct cod_pe_event *e, struct task_struct *p)
{
	struct task_struct *parent = p->real_parent;
	if (parent) {
		e->parent_pid = BPF_CORE_READ(parent, pid);
		e->parent_tgid = BPF_CORE_READ(parent, tgid);
	}
}

SEC("tp_btf/sched_process_fork")
int BPF_PROG(cod_fork, struct task_struct *parent, struct task_struct *child)
{
	struct cod_pe_event *e = reserve(COD_PE_FORK, child);
	if (!e)
		return 0;
	with_parent(e, child);
	bpf_ringbuf_submit(e, 0);
	return 0;
}

SEC("tp_btf/sched_process_exec")
int BPF_PROG(cod_exec, struct task_struct *p)
{
	struct cod_pe_event *e = reserve(COD_PE_EXEC, p);
	if (e)
		bpf_ringbuf_submit(e, 0);
	return 0;
}

SEC("tp_btf/sched_process_exit")
int BPF_PROG(cod_exit, struct task_struct *p)
{
	struct cod_pe_event *e = reserve(COD_PE_EXIT, p);
	if (!e)
		return 0;
	e->exit_code = p->exit_code;
	with_parent(e, p);
	bpf_ringbuf_submit(e, 0);
	return 0;
}

SEC("tp_btf/task_rename")
int BPF_PROG(cod_rename, struct task_struct *task, const char *comm)
{
	struct cod_pe_event *e = reserve(COD_PE_COMM, task);
	if (!e)
		return 0;
	bpf_probe_read_kernel_str(e->comm, sizeof(e->comm), comm);
	bpf_ringbuf_submit(e, 0);
	return 0;
}
