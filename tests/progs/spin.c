/* CPU-bound workload for the profiling benchmark (cargo xtask bench-profile),
 * built by it with `gcc -O2 -fno-omit-frame-pointer -pthread`.
 *
 * `spin THREADS SECONDS`: starts THREADS threads (idle on a barrier), prints
 * "ready", reads one line from stdin, then every thread runs tk_spin (through
 * tk_worker -> tk_spin -> tk_round -> tk_chunk: a few frames to walk) counting
 * chunks of work until SECONDS of wall time have passed; prints "iterations N"
 * (the sum over the threads) and "seconds S" (the wall time measured), and
 * exits. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static volatile int stop;
volatile unsigned long tk_sink;
static pthread_barrier_t go;

__attribute__((noinline)) unsigned long tk_chunk(unsigned long x)
{
	for (int i = 0; i < 1000; i++)
		x = x * 6364136223846793005UL + 1442695040888963407UL;
	__asm__ volatile("" ::: "memory"); /* no tail call */
	return x;
}

__attribute__((noinline)) unsigned long tk_round(unsigned long x)
{
	x = tk_chunk(x);
	__asm__ volatile("" ::: "memory");
	return x + 1;
}

__attribute__((noinline)) unsigned long tk_spin(unsigned long *iters)
{
	unsigned long x = 1, n = 0;

	while (!stop) {
		x = tk_round(x);
		n++;
	}
	*iters = n;
	return x;
}

static void *tk_worker(void *arg)
{
	pthread_barrier_wait(&go);
	tk_sink = tk_spin(arg);
	return NULL;
}

static double now(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
	int threads = argc > 1 ? atoi(argv[1]) : 2;
	double secs = argc > 2 ? atof(argv[2]) : 10;
	pthread_t *t = calloc(threads, sizeof *t);
	unsigned long *iters = calloc(threads, sizeof *iters), sum = 0;
	char line[16];

	if (threads < 1 || !t || !iters || pthread_barrier_init(&go, NULL, threads + 1))
		return 1;
	for (int i = 0; i < threads; i++)
		if (pthread_create(&t[i], NULL, tk_worker, &iters[i]))
			return 1;
	printf("ready\n");
	fflush(stdout);
	if (!fgets(line, sizeof line, stdin))
		return 1;
	double start = now();
	struct timespec d = { (time_t)secs, (long)((secs - (time_t)secs) * 1e9) };

	pthread_barrier_wait(&go);
	nanosleep(&d, NULL);
	stop = 1;
	for (int i = 0; i < threads; i++) {
		pthread_join(t[i], NULL);
		sum += iters[i];
	}
	printf("iterations %lu\nseconds %.6f\n", sum, now() - start);
	return 0;
}
