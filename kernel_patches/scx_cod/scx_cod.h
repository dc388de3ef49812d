/* What scx_cod.bpf.c, its loader scx_cod.c and the RM (cod.rm.enforce.scx) share.
 * The RM writes the maps the loader pins under COD_SCX_PIN_DIR; keep cod/rm/enforce/scx.py in step. */
#ifndef COD_SCX_H
#define COD_SCX_H

#define COD_SCX_PIN_DIR "/sys/fs/bpf/cod_scx"
#define COD_SCX_MAX_CPUS 256   /* bits of a group's CPU mask */
#define COD_SCX_MASK_WORDS (COD_SCX_MAX_CPUS / 64)
#define COD_SCX_MAX_GROUPS 32  /* group 0: everything not registered; 1..: registered tasks */

/* What ops.exit records for the loader (scx_exit_info's kind and exit code; the kernel logs
 * the reason).  Kinds (enum scx_exit_kind): 64 unregistered by the loader, 65 by BPF,
 * 66 by the kernel, 67 SysRq-S; 1024 a BPF error, 1025 scx_bpf_error(), 1026 a stall. */
struct cod_exit_info {
	long long exit_code;
	int kind;
};

/* Per-CPU counters in the "stats" map. */
enum cod_scx_stat {
	COD_STAT_DIRECT,     /* woken onto an idle CPU of its group */
	COD_STAT_QUEUED,     /* queued on its group's DSQ */
	COD_STAT_UNBOUND,    /* its group has none of the task's own allowed CPUs: kernel's choice */
	COD_STAT_INHERITED,  /* a child of a registered process joined its parent's group at fork */
	COD_STAT_MOVED,      /* preempted at a tick because it ran outside its group's CPUs */
	COD_STAT_EXEMPT,     /* kernel threads: where the kernel lets them run */
	COD_STAT_NR,
};

#endif
