// SPDX-License-Identifier: GPL-2.0
/* scx_cod: COD's allocation carried out by the scheduler (sched_ext, Linux 6.12+).
 *
 * The RM puts each registered task in a group (tgid_group: by process, cgroup_group: by
 * cgroup v2 id) and writes each group's CPUs (group_cpus); group 0 is everything else and
 * gets the CPUs no registered task reserved.  A task runs only on its group's CPUs, from its
 * first wake-up: a newcomer is group 0 before it ever runs, so it never takes a database's
 * CPU.  A reallocation is a write of group_cpus (and a run of cod_kick to act at once); the
 * tick moves a task that finds itself outside its group.  A child process joins its parent's
 * group at fork (ops.enable, before its first wake-up).  Kernel threads, and tasks whose own affinity has none of their group's
 * CPUs, run where the kernel lets them (counted in stats).
 *
 * Each group has a FIFO dispatch queue (DSQ id = group); a CPU takes work from the groups
 * that own it, registered groups first. */
#include <scx/common.bpf.h>
#include "scx_cod.h"

char _license[] SEC("license") = "GPL";

struct cod_mask {
	u64 bits[COD_SCX_MASK_WORDS];
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, COD_SCX_MAX_GROUPS);
	__type(key, u32);
	__type(value, struct cod_mask);
} group_cpus SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, u32);   /* tgid */
	__type(value, u32); /* group */
} tgid_group SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, u64);   /* cgroup v2 id (the inode number of its directory) */
	__type(value, u32); /* group */
} cgroup_group SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, COD_STAT_NR);
	__type(key, u32);
	__type(value, u64);
} stats SEC(".maps");

/* Why the scheduler stopped (ops.exit), for the loader's log: the only global in .bss. */
struct cod_exit_info exit_info;

static void stat_inc(u32 idx)
{
	u64 *n = bpf_map_lookup_elem(&stats, &idx);
	if (n)
		(*n)++;
}

static bool in_mask(const struct cod_mask *m, s32 cpu)
{
	if (cpu < 0 || cpu >= COD_SCX_MAX_CPUS)
		return false;
	return m->bits[(u32)cpu / 64 & (COD_SCX_MASK_WORDS - 1)] & (1ULL << ((u32)cpu % 64));
}

static bool exempt(const struct task_struct *p)
{
	return p->flags & PF_KTHREAD;
}

static u32 group_of(struct task_struct *p)
{
	u32 tgid = p->tgid;
	u32 *g = bpf_map_lookup_elem(&tgid_group, &tgid);
	if (g)
		return *g;
	u64 cgid = p->cgroups->dfl_cgrp->kn->id; /* BTF pointer walk (probe-read by the JIT) */
	g = bpf_map_lookup_elem(&cgroup_group, &cgid);
	return g ? *g : 0;
}

/* The task's group's CPUs, or NULL when it has none the task itself allows (or is exempt). */
static const struct cod_mask *mask_of(struct task_struct *p, u32 *group)
{
	u32 g = group_of(p);
	const struct cod_mask *m = bpf_map_lookup_elem(&group_cpus, &g);
	u32 n = scx_bpf_nr_cpu_ids();
	s32 cpu;

	*group = g;
	if (!m)
		return NULL;
	bpf_for(cpu, 0, n) {
		if (in_mask(m, cpu) && bpf_cpumask_test_cpu(cpu, p->cpus_ptr))
			return m;
	}
	return NULL;
}

static bool allowed(struct task_struct *p, const struct cod_mask *m, s32 cpu)
{
	return in_mask(m, cpu) && bpf_cpumask_test_cpu(cpu, p->cpus_ptr);
}

s32 BPF_STRUCT_OPS(cod_select_cpu, struct task_struct *p, s32 prev_cpu, u64 wake_flags)
{
	const struct cod_mask *m;
	bool is_idle = false;
	u32 g, n = scx_bpf_nr_cpu_ids();
	s32 cpu, first = -1;

	if (exempt(p) || !(m = mask_of(p, &g))) {
		cpu = scx_bpf_select_cpu_dfl(p, prev_cpu, wake_flags, &is_idle);
		if (is_idle)
			scx_bpf_dispatch(p, SCX_DSQ_LOCAL, SCX_SLICE_DFL, 0);
		return cpu;
	}
	if (allowed(p, m, prev_cpu) && scx_bpf_test_and_clear_cpu_idle(prev_cpu)) {
		stat_inc(COD_STAT_DIRECT);
		scx_bpf_dispatch(p, SCX_DSQ_LOCAL, SCX_SLICE_DFL, 0);
		return prev_cpu;
	}
	bpf_for(cpu, 0, n) {
		if (!allowed(p, m, cpu))
			continue;
		if (first < 0)
			first = cpu;
		if (scx_bpf_test_and_clear_cpu_idle(cpu)) {
			stat_inc(COD_STAT_DIRECT);
			scx_bpf_dispatch(p, SCX_DSQ_LOCAL, SCX_SLICE_DFL, 0);
			return cpu;
		}
	}
	return allowed(p, m, prev_cpu) || first < 0 ? prev_cpu : first;
}

void BPF_STRUCT_OPS(cod_enqueue, struct task_struct *p, u64 enq_flags)
{
	const struct cod_mask *m;
	u32 g, n = scx_bpf_nr_cpu_ids();
	s32 cpu;

	if (exempt(p) || !(m = mask_of(p, &g))) {
		stat_inc(exempt(p) ? COD_STAT_EXEMPT : COD_STAT_UNBOUND);
		/* The last runnable task of its CPU (SCX_OPS_ENQ_LAST) keeps running there. */
		scx_bpf_dispatch(p, enq_flags & SCX_ENQ_LAST ? SCX_DSQ_LOCAL : SCX_DSQ_GLOBAL, SCX_SLICE_DFL, enq_flags);
		return;
	}
	if ((enq_flags & SCX_ENQ_LAST) && in_mask(m, scx_bpf_task_cpu(p))) {
		/* Its slice ended with nothing else to run here, and the CPU is still its group's. */
		scx_bpf_dispatch(p, SCX_DSQ_LOCAL, SCX_SLICE_DFL, enq_flags);
		return;
	}
	/* Queued on its group; with SCX_ENQ_LAST and a CPU its group lost, it leaves that CPU now
	 * (without the flag the kernel would keep it running there until something else came). */
	stat_inc(COD_STAT_QUEUED);
	scx_bpf_dispatch(p, g, SCX_SLICE_DFL, enq_flags);
	bpf_for(cpu, 0, n) {
		if (allowed(p, m, cpu) && scx_bpf_test_and_clear_cpu_idle(cpu)) {
			scx_bpf_kick_cpu(cpu, SCX_KICK_IDLE);
			break;
		}
	}
}

void BPF_STRUCT_OPS(cod_dispatch, s32 cpu, struct task_struct *prev)
{
	u32 i;

	/* Registered groups first, then group 0 (everything else). */
	bpf_for(i, 1, COD_SCX_MAX_GROUPS + 1) {
		u32 g = i % COD_SCX_MAX_GROUPS;
		const struct cod_mask *m = bpf_map_lookup_elem(&group_cpus, &g);
		if (m && in_mask(m, cpu) && scx_bpf_consume(g))
			return;
	}
}

void BPF_STRUCT_OPS(cod_tick, struct task_struct *p)
{
	const struct cod_mask *m;
	u32 g;

	if (exempt(p) || !(m = mask_of(p, &g)))
		return;
	if (!in_mask(m, scx_bpf_task_cpu(p))) {
		stat_inc(COD_STAT_MOVED);
		p->scx.slice = 0; /* preempted now, queued on its group, run where it belongs */
	}
}

void BPF_STRUCT_OPS(cod_enable, struct task_struct *p)
{
	u32 tgid, ptgid, *g;

	/* A new process forked by a registered one joins its group (threads share the tgid).
	 * ops.enable runs after fork has set real_parent and before the first wake-up. */
	if (p->pid != p->tgid)
		return;
	ptgid = p->real_parent->tgid; /* BTF pointer walk */
	g = bpf_map_lookup_elem(&tgid_group, &ptgid);
	if (g) {
		u32 group = *g;
		tgid = p->tgid;
		if (!bpf_map_lookup_elem(&tgid_group, &tgid)) {
			bpf_map_update_elem(&tgid_group, &tgid, &group, BPF_ANY);
			stat_inc(COD_STAT_INHERITED);
		}
	}
}

void BPF_STRUCT_OPS(cod_exit_task, struct task_struct *p, struct scx_exit_task_args *args)
{
	u32 tgid = p->tgid;

	if (p->pid == p->tgid) /* the process is gone: its pid may be reused */
		bpf_map_delete_elem(&tgid_group, &tgid);
}

s32 BPF_STRUCT_OPS_SLEEPABLE(cod_init)
{
	struct cod_mask all = {};
	u32 g, zero = 0, n = scx_bpf_nr_cpu_ids();
	s32 cpu, err;

	bpf_for(g, 0, COD_SCX_MAX_GROUPS) {
		err = scx_bpf_create_dsq(g, -1);
		if (err)
			return err;
	}
	/* Until the RM says otherwise, group 0 (everything) has every CPU. */
	bpf_for(cpu, 0, n) {
		if (cpu < COD_SCX_MAX_CPUS)
			all.bits[(u32)cpu / 64 & (COD_SCX_MASK_WORDS - 1)] |= 1ULL << ((u32)cpu % 64);
	}
	return bpf_map_update_elem(&group_cpus, &zero, &all, BPF_ANY);
}

void BPF_STRUCT_OPS(cod_exit, struct scx_exit_info *ei)
{
	/* The reason's text is in the kernel log; reading it here would need a helper
	 * (bpf_probe_read_kernel_str) that the guest's struct_ops programs were refused. */
	exit_info.kind = ei->kind;
	exit_info.exit_code = ei->exit_code;
}

/* Run by the RM (BPF_PROG_TEST_RUN) after a reallocation: every CPU reschedules now, so a
 * task on a CPU its group lost goes back to its group's queue within microseconds. */
SEC("syscall")
int cod_kick(void *ctx)
{
	u32 n = scx_bpf_nr_cpu_ids();
	s32 cpu;

	bpf_for(cpu, 0, n)
		scx_bpf_kick_cpu(cpu, SCX_KICK_PREEMPT);
	return 0;
}

SCX_OPS_DEFINE(cod_ops,
	       .select_cpu = (void *)cod_select_cpu,
	       .enqueue = (void *)cod_enqueue,
	       .dispatch = (void *)cod_dispatch,
	       .tick = (void *)cod_tick,
	       .enable = (void *)cod_enable,
	       .exit_task = (void *)cod_exit_task,
	       .init = (void *)cod_init,
	       .exit = (void *)cod_exit,
	       /* A task whose slice ends (or that a kick or the tick preempted) with nothing else
	        * to run on its CPU comes to cod_enqueue with SCX_ENQ_LAST, instead of the kernel
	        * running it on: that is how a task leaves a CPU its group lost. */
	       .flags = SCX_OPS_ENQ_LAST,
	       .name = "cod");
