/* One process event, as procevents.bpf.c writes it and cod.rm.enforce.bpfevents reads it
 * (Python's struct "=IIIIIiQ16s": keep the two in step). */
#ifndef COD_PROCEVENTS_H
#define COD_PROCEVENTS_H

#define COD_PE_FORK 1
#define COD_PE_EXEC 2
#define COD_PE_EXIT 3
#define COD_PE_COMM 4

#define COD_PE_RINGBUF_BYTES (4 << 20) /* as the connector's socket buffer: room for bursts */

struct cod_pe_event {
	__u32 kind;
	__u32 pid;
	__u32 tgid;
	__u32 parent_pid;
	__u32 parent_tgid;
	__s32 exit_code;
	__u64 timestamp_ns; /* CLOCK_MONOTONIC (bpf_ktime_get_ns) */
	char comm[16];
};

#endif
