// SPDX-License-Identifier: GPL-2.0
/* scx_cod's loader: loads scx_cod.bpf.o, attaches it as the sched_ext scheduler "cod", pins
 * the maps the RM fills and the kick program under COD_SCX_PIN_DIR, and stays until it is
 * told to stop (SIGINT/SIGTERM: the scheduler is detached, the pins removed) or the kernel
 * ejects the scheduler (its reason is printed, exit status 2).  If the loader is killed, its
 * link closes and the kernel switches every task back to the fair class; the RM sees the
 * scheduler gone (/sys/kernel/sched_ext/state) and falls back to cpusets.
 *
 *   scx_cod [-o OBJECT] [-p PIN_DIR] [-v]     (root; a kernel with CONFIG_SCHED_CLASS_EXT) */
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <linux/magic.h>
#include <bpf/bpf.h>
#include <bpf/libbpf.h>

#include "scx_cod.h"

#define STATE_FILE "/sys/kernel/sched_ext/state"
static const char *const PINNED_MAPS[] = {"group_cpus", "tgid_group", "cgroup_group", "stats"};
static volatile sig_atomic_t stop;
static int verbose;

static void on_signal(int sig)
{
	(void)sig;
	stop = 1;
}

static int print(enum libbpf_print_level level, const char *fmt, va_list ap)
{
	if (level == LIBBPF_DEBUG && !verbose)
		return 0;
	return vfprintf(stderr, fmt, ap);
}

static int sched_ext_enabled(void)
{
	char buf[32] = "";
	FILE *f = fopen(STATE_FILE, "r");
	if (!f)
		return -1;
	if (!fgets(buf, sizeof(buf), f))
		buf[0] = 0;
	fclose(f);
	return strncmp(buf, "enabled", 7) == 0;
}

static int ensure_bpffs(const char *pin_dir)
{
	struct statfs fs;
	if (statfs("/sys/fs/bpf", &fs) == 0 && fs.f_type == BPF_FS_MAGIC)
		goto mkdir;
	if (mount("bpf", "/sys/fs/bpf", "bpf", 0, "mode=0700")) {
		fprintf(stderr, "scx_cod: /sys/fs/bpf is no bpffs and mounting one failed: %s\n", strerror(errno));
		return -1;
	}
mkdir:
	if (mkdir(pin_dir, 0700) && errno != EEXIST) {
		fprintf(stderr, "scx_cod: cannot create %s: %s\n", pin_dir, strerror(errno));
		return -1;
	}
	return 0;
}

static void unpin(const char *pin_dir)
{
	char path[512];
	for (size_t i = 0; i < sizeof(PINNED_MAPS) / sizeof(PINNED_MAPS[0]); i++) {
		snprintf(path, sizeof(path), "%s/%s", pin_dir, PINNED_MAPS[i]);
		unlink(path);
	}
	snprintf(path, sizeof(path), "%s/kick", pin_dir);
	unlink(path);
	rmdir(pin_dir);
}

static int pin_all(struct bpf_object *obj, const char *pin_dir)
{
	char path[512];
	for (size_t i = 0; i < sizeof(PINNED_MAPS) / sizeof(PINNED_MAPS[0]); i++) {
		struct bpf_map *map = bpf_object__find_map_by_name(obj, PINNED_MAPS[i]);
		snprintf(path, sizeof(path), "%s/%s", pin_dir, PINNED_MAPS[i]);
		if (!map || bpf_map__pin(map, path)) {
			fprintf(stderr, "scx_cod: cannot pin %s: %s\n", path, strerror(errno));
			return -1;
		}
	}
	struct bpf_program *kick = bpf_object__find_program_by_name(obj, "cod_kick");
	snprintf(path, sizeof(path), "%s/kick", pin_dir);
	if (!kick || bpf_program__pin(kick, path)) {
		fprintf(stderr, "scx_cod: cannot pin %s: %s\n", path, strerror(errno));
		return -1;
	}
	return 0;
}

/* The reason ops.exit recorded (exit_info, the only global in .bss). */
static void print_exit(struct bpf_object *obj)
{
	struct bpf_map *bss = NULL, *map;
	bpf_object__for_each_map(map, obj) {
		if (strstr(bpf_map__name(map), ".bss"))
			bss = map;
	}
	size_t size = bss ? bpf_map__value_size(bss) : 0;
	char *data = size >= sizeof(struct cod_exit_info) ? calloc(1, size) : NULL;
	__u32 zero = 0;
	if (data && bpf_map_lookup_elem(bpf_map__fd(bss), &zero, data) == 0) {
		struct cod_exit_info *info = (struct cod_exit_info *)data;
		fprintf(stderr, "scx_cod: the kernel ejected the scheduler (exit kind %d%s; the reason "
			"is in the kernel log)\n", info->kind, info->kind == 67 ? ": SysRq-S" :
			info->kind == 1026 ? ": a task stalled" : "");
	} else {
		fprintf(stderr, "scx_cod: the kernel ejected the scheduler\n");
	}
	free(data);
}

int main(int argc, char **argv)
{
	char default_obj[4096];
	const char *obj_path = NULL, *pin_dir = COD_SCX_PIN_DIR;
	int opt, rc = 1;

	while ((opt = getopt(argc, argv, "o:p:vh")) != -1) {
		switch (opt) {
		case 'o': obj_path = optarg; break;
		case 'p': pin_dir = optarg; break;
		case 'v': verbose = 1; break;
		default:
			fprintf(stderr, "usage: %s [-o OBJECT] [-p PIN_DIR] [-v]\n", argv[0]);
			return opt != 'h';
		}
	}
	if (!obj_path) { /* beside the loader */
		ssize_t n = readlink("/proc/self/exe", default_obj, sizeof(default_obj) - 32);
		if (n < 0)
			return 1;
		default_obj[n] = 0;
		char *slash = strrchr(default_obj, '/');
		strcpy(slash ? slash + 1 : default_obj, "scx_cod.bpf.o");
		obj_path = default_obj;
	}
	if (sched_ext_enabled() < 0) {
		fprintf(stderr, "scx_cod: this kernel has no sched_ext (%s is missing: CONFIG_SCHED_CLASS_EXT)\n", STATE_FILE);
		return 1;
	}
	libbpf_set_print(print);
	signal(SIGINT, on_signal);
	signal(SIGTERM, on_signal);

	struct bpf_object *obj = bpf_object__open_file(obj_path, NULL);
	if (!obj) {
		fprintf(stderr, "scx_cod: cannot open %s: %s\n", obj_path, strerror(errno));
		return 1;
	}
	struct bpf_link *link = NULL;
	if (bpf_object__load(obj)) {
		fprintf(stderr, "scx_cod: the kernel refused %s\n", obj_path);
		goto out;
	}
	if (ensure_bpffs(pin_dir))
		goto out;
	unpin(pin_dir); /* a killed loader's pins */
	if (ensure_bpffs(pin_dir) || pin_all(obj, pin_dir))
		goto out;
	link = bpf_map__attach_struct_ops(bpf_object__find_map_by_name(obj, "cod_ops"));
	if (!link) {
		fprintf(stderr, "scx_cod: cannot attach the scheduler: %s (another sched_ext scheduler running?)\n",
			strerror(errno));
		goto out;
	}
	printf("scx_cod: running; maps pinned in %s\n", pin_dir);
	fflush(stdout);
	while (!stop) {
		if (sched_ext_enabled() != 1) {
			print_exit(obj);
			rc = 2;
			goto out;
		}
		usleep(100 * 1000);
	}
	rc = 0;
	printf("scx_cod: stopping\n");
out:
	bpf_link__destroy(link);
	unpin(pin_dir);
	bpf_object__close(obj);
	return rc;
}
