/* cod_noexec: no program can be executed by this process or any of its threads.
 *
 * Preloaded into the SKB engine (LD_PRELOAD, set by skb/lockdown.py after
 * PR_SET_NO_NEW_PRIVS): its constructor runs before SWI-Prolog's main, while
 * the process has one thread, and installs a seccomp filter that makes
 * execve and execveat fail with EPERM.  Every thread the engine creates
 * later inherits the filter.  It closes what Landlock leaves open: Landlock
 * must let the engine's ELF interpreter be executed for the engine itself
 * to start, and the interpreter can load any readable program by hand.
 *
 * If the filter cannot be installed the process exits at once (status 126):
 * an engine that was asked for the filter never runs without it.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#if defined(__x86_64__)
#define COD_AUDIT_ARCH AUDIT_ARCH_X86_64
#elif defined(__aarch64__)
#define COD_AUDIT_ARCH AUDIT_ARCH_AARCH64
#else
#error "cod_noexec: unknown architecture (add its AUDIT_ARCH)"
#endif

#define X32_SYSCALL_BIT 0x40000000u

static struct sock_filter filter[] = {
    BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, COD_AUDIT_ARCH, 1, 0),
    BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS), /* another ABI: no way around the filter */
    BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
    BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, X32_SYSCALL_BIT, 3, 0),
    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_execve, 2, 0),
    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_execveat, 1, 0),
    BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)),
};

__attribute__((constructor)) static void cod_noexec(void)
{
    struct sock_fprog prog = {
        .len = (unsigned short)(sizeof filter / sizeof filter[0]),
        .filter = filter,
    };
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
        syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC, &prog) != 0) {
        fprintf(stderr, "COD SKB lockdown: cannot install the seccomp filter: errno %d\n", errno);
        _exit(126);
    }
}
