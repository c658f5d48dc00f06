/* What sampling and counter sources measure, in known amounts. Built by the
 * tests with `gcc -O2`. Prints "ready", reads one line from stdin, then:
 *   burn MS     runs tk_burn until the process has used MS ms of CPU time
 *   threads MS  starts 2 threads (after the line, so a tracer started before
 *               never saw them) that run tk_burn until the process has used
 *               2 x MS ms of CPU time
 *   faults N    touches N fresh pages of an anonymous mapping (N page faults)
 *   sleeps K    sleeps 1 ms K times (K voluntary context switches)
 *   vdso MS     reads CLOCK_MONOTONIC (in the vDSO, no syscall) in tk_vdso
 *               until the process has used MS ms of CPU time
 * and exits. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

static double cpu_ms(void)
{
	struct timespec t;

	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
	return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

__attribute__((noinline)) void tk_burn(double ms)
{
	volatile unsigned long x = 0;
	double end = cpu_ms() + ms;

	while (cpu_ms() < end)
		for (int i = 0; i < 20000; i++)
			x += i;
}

__attribute__((noinline)) void tk_faults(long n)
{
	long page = sysconf(_SC_PAGESIZE);
	char *p = mmap(NULL, n * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	if (p == MAP_FAILED)
		exit(1);
	for (long i = 0; i < n; i++)
		p[i * page] = 1;
}

__attribute__((noinline)) void tk_sleeps(long k)
{
	struct timespec ms = {0, 1000000};

	for (long i = 0; i < k; i++)
		nanosleep(&ms, NULL);
}

__attribute__((noinline)) void tk_vdso(double ms)
{
	struct timespec t;
	double end = cpu_ms() + ms;

	while (cpu_ms() < end)
		for (int i = 0; i < 20000; i++)
			clock_gettime(CLOCK_MONOTONIC, &t);
}

static double burn_ms;

static void *tk_thread(void *arg)
{
	(void)arg;
	tk_burn(burn_ms);
	return NULL;
}

int main(int argc, char **argv)
{
	char line[16];
	long n = argc > 2 ? atol(argv[2]) : 0;

	setvbuf(stdout, NULL, _IONBF, 0);
	printf("ready\n");
	if (argc < 3 || !fgets(line, sizeof(line), stdin))
		return 2;
	if (!strcmp(argv[1], "burn"))
		tk_burn(n);
	else if (!strcmp(argv[1], "threads")) {
		pthread_t t[2];

		/* Both threads together: process CPU time runs twice as fast. */
		burn_ms = 2.0 * n;
		for (int i = 0; i < 2; i++)
			pthread_create(&t[i], NULL, tk_thread, NULL);
		for (int i = 0; i < 2; i++)
			pthread_join(t[i], NULL);
	} else if (!strcmp(argv[1], "faults"))
		tk_faults(n);
	else if (!strcmp(argv[1], "sleeps"))
		tk_sleeps(n);
	else if (!strcmp(argv[1], "vdso"))
		tk_vdso(n);
	else
		return 2;
	return 0;
}
