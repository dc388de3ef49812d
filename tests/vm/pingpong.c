/* pingpong ROUNDS: two processes pass one byte back and forth over two pipes ROUNDS times
 * (two context switches per round); prints the nanoseconds per round. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

int main(int argc, char **argv)
{
	long rounds = argc == 2 ? atol(argv[1]) : 0;
	int there[2], back[2];
	char c = 0;
	struct timespec a, b;
	if (rounds <= 0 || pipe(there) || pipe(back)) {
		fprintf(stderr, "usage: %s ROUNDS\n", argv[0]);
		return 2;
	}
	pid_t child = fork();
	if (child == 0) {
		for (long i = 0; i < rounds; i++)
			if (read(there[0], &c, 1) != 1 || write(back[1], &c, 1) != 1)
				_exit(1);
		_exit(0);
	}
	clock_gettime(CLOCK_MONOTONIC, &a);
	for (long i = 0; i < rounds; i++)
		if (write(there[1], &c, 1) != 1 || read(back[0], &c, 1) != 1)
			return 1;
	clock_gettime(CLOCK_MONOTONIC, &b);
	waitpid(child, NULL, 0);
	printf("%.1f\n", ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / rounds);
	return 0;
}
