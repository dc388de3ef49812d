/* percpu THREADS SECONDS: THREADS threads spin for SECONDS and record where they ran.
 *
 * Each thread reads sched_getcpu() and then CLOCK_MONOTONIC in a loop; the time between two
 * consecutive clock reads (when under MAX_GAP_NS: a longer gap means the thread was not
 * running) is charged to the CPU read between them.  Every change of CPU is kept as
 * (ns, cpu, thread): the thread ran on cpu before ns (and after the previous record's ns).
 * The clock is read after the CPU, never before: a thread preempted and moved between the
 * two reads would otherwise date its arrival on the new CPU to before it was moved.
 * Output, one JSON object on stdout at the end:
 *   {"ns_per_cpu": {"CPU": ns, ...}, "moves": [[ns, cpu, thread], ...]}
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

static long long seconds_ns;
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

static void *spin(void *arg)
{
	long long self = (long long)(long)arg;
	long long mine[MAX_CPUS] = {0};
	long long start = now(), last = start, t;
	int cpu, prev = -1;
	for (;;) {
		cpu = sched_getcpu();
		if ((t = now()) - start >= seconds_ns)
			break;
		if (cpu < 0 || cpu >= MAX_CPUS)
			continue;
		if (t - last < MAX_GAP_NS)
			mine[cpu] += t - last;
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
	pthread_mutex_lock(&lock);
	for (int i = 0; i < MAX_CPUS; i++)
		per_cpu[i] += mine[i];
	pthread_mutex_unlock(&lock);
	return NULL;
}

int main(int argc, char **argv)
{
	if (argc != 3) {
		fprintf(stderr, "usage: %s THREADS SECONDS\n", argv[0]);
		return 2;
	}
	int n = atoi(argv[1]);
	seconds_ns = (long long)(atof(argv[2]) * 1e9);
	if (n < 1 || n > 64 || seconds_ns <= 0) {
		fprintf(stderr, "percpu: 1-64 threads and a positive duration\n");
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
	printf("]}\n");
	return 0;
}
