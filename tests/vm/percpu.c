/* percpu THREADS SECONDS [SLICE_MS]: THREADS threads spin for SECONDS and record where they ran.
 *
 * Each thread reads sched_getcpu() and then CLOCK_MONOTONIC in a loop; the time between two
 * consecutive clock reads (when under MAX_GAP_NS: a longer gap means the thread was not
 * running) is charged to the CPU read between them.  Every change of CPU is kept as
 * (ns, cpu, thread): the thread ran on cpu before ns (and after the previous record's ns).
 * The clock is read after the CPU, never before: a thread preempted and moved between the
 * two reads would otherwise date its arrival on the new CPU to before it was moved.
 * Output, one JSON object on stdout at the end:
 *   {"ns_per_cpu": {"CPU": ns, ...}, "moves": [[ns, cpu, thread], ...]}
 * With SLICE_MS, also "slices": [[start_ns, end_ns, cpu, ran_ns, thread], ...]: the run time
 * charged to one CPU between two clock reads no more than SLICE_MS apart (a slice ends at a
 * change of CPU or when it is SLICE_MS long), so that run time can be set against a timeline.
 * Prints "ready" on stderr once every thread runs. */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define MAX_CPUS 256
#define MAX_MOVES 100000
#define MAX_GAP_NS 200000LL
#define MAX_SLICES 200000

static long long seconds_ns, slice_ns;
static long long slices[MAX_SLICES][5];
static int nslices;
static long long per_cpu[MAX_CPUS];
static long long moves[MAX_MOVES][3];
static int nmoves;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static long long now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void add_slice(long long start, long long end, int cpu, long long ran, long long self)
{
	if (cpu < 0 || ran <= 0)
		return;
	pthread_mutex_lock(&lock);
	if (nslices < MAX_SLICES) {
		long long *s = slices[nslices++];
		s[0] = start;
		s[1] = end;
		s[2] = cpu;
		s[3] = ran;
		s[4] = self;
	}
	pthread_mutex_unlock(&lock);
}

static void *spin(void *arg)
{
	long long self = (long long)(long)arg;
	long long mine[MAX_CPUS] = {0};
	long long start = now(), last = start, t;
	long long sstart = start, sran = 0; /* the open slice */
	int cpu, prev = -1, scpu = -1;
	for (;;) {
		cpu = sched_getcpu();
		if ((t = now()) - start >= seconds_ns)
			break;
		if (cpu < 0 || cpu >= MAX_CPUS)
			continue;
		if (slice_ns && (cpu != scpu || t - sstart >= slice_ns)) {
			add_slice(sstart, last, scpu, sran, self);
			sstart = last;
			scpu = cpu;
			sran = 0;
		}
		if (t - last < MAX_GAP_NS) {
			mine[cpu] += t - last;
			sran += t - last;
		}
		if (cpu != prev) {
			pthread_mutex_lock(&lock);
			if (nmoves < MAX_MOVES) {
				moves[nmoves][0] = t;
				moves[nmoves][1] = cpu;
				moves[nmoves][2] = self;
				nmoves++;
			}
			pthread_mutex_unlock(&lock);
			prev = cpu;
		}
		last = t;
	}
	if (slice_ns)
		add_slice(sstart, last, scpu, sran, self);
	pthread_mutex_lock(&lock);
	for (int i = 0; i < MAX_CPUS; i++)
		per_cpu[i] += mine[i];
	pthread_mutex_unlock(&lock);
	return NULL;
}

int main(int argc, char **argv)
{
	if (argc != 3 && argc != 4) {
		fprintf(stderr, "usage: %s THREADS SECONDS [SLICE_MS]\n", argv[0]);
		return 2;
	}
	int n = atoi(argv[1]);
	seconds_ns = (long long)(atof(argv[2]) * 1e9);
	slice_ns = argc == 4 ? (long long)(atof(argv[3]) * 1e6) : 0;
	if (n < 1 || n > 64 || seconds_ns <= 0 || (argc == 4 && slice_ns <= 0)) {
		fprintf(stderr, "percpu: 1-64 threads, a positive duration and a positive slice\n");
		return 2;
	}
	pthread_t th[64];
	for (int i = 0; i < n; i++)
		pthread_create(&th[i], NULL, spin, (void *)(long)i);
	fprintf(stderr, "ready\n");
	for (int i = 0; i < n; i++)
		pthread_join(th[i], NULL);
	printf("{\"ns_per_cpu\": {");
	const char *sep = "";
	for (int i = 0; i < MAX_CPUS; i++) {
		if (per_cpu[i]) {
			printf("%s\"%d\": %lld", sep, i, per_cpu[i]);
			sep = ", ";
		}
	}
	printf("}, \"moves\": [");
	for (int i = 0; i < nmoves; i++)
		printf("%s[%lld, %lld, %lld]", i ? ", " : "", moves[i][0], moves[i][1], moves[i][2]);
	printf("]");
	if (slice_ns) {
		printf(", \"slices\": [");
		for (int i = 0; i < nslices; i++)
			printf("%s[%lld, %lld, %lld, %lld, %lld]", i ? ", " : "", slices[i][0], slices[i][1],
			       slices[i][2], slices[i][3], slices[i][4]);
		printf("]");
	}
	printf("}\n");
	return 0;
}
