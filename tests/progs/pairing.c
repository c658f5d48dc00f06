/* Calls whose returns do not all come: what funclatency and trace must count
 * and report rather than lose in silence. Built by the tests with the system C
 * compiler. Prints "ready", waits for a line on stdin, then:
 *
 * - `rec C D`: C chains of tk_rec, each D calls deep (tk_rec calls itself D - 1
 *   times), on the main thread: C * D calls. The kernel gives at most 64 nested
 *   return probes per thread, so D > 64 leaves C * (D - 64) returns omitted.
 * - `jump N`: N calls of tk_jump, each left by longjmp: none returns.
 * - `leak T N`: T threads one after another, each calling tk_hold, which ends
 *   the thread with pthread_exit; then 100 threads one after another, each
 *   calling tk_work N times (100 * N returns).
 * - `chain N U`: N calls of usleep(U) (glibc's usleep calls nanosleep, which
 *   calls clock_nanosleep: N calls of each). */
#include <pthread.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static volatile int sink;
static jmp_buf back;

__attribute__((noinline)) int tk_rec(int depth)
{
	if (depth <= 1)
		return 1;
	/* Work after the call keeps it from becoming a tail call. */
	return tk_rec(depth - 1) + sink + 1;
}

__attribute__((noinline)) void tk_jump(int x)
{
	sink += x;
	longjmp(back, 1);
}

__attribute__((noinline)) void tk_hold(int x)
{
	sink += x;
	pthread_exit(NULL);
}

__attribute__((noinline)) int tk_work(int x)
{
	__asm__ volatile("");
	return x + sink;
}

static void *holder(void *arg)
{
	tk_hold((int)(long)arg);
	return NULL;
}

static void *worker(void *arg)
{
	long n = (long)arg;

	for (long i = 0; i < n; i++)
		sink += tk_work((int)i);
	return NULL;
}

static void one_thread(void *(*fn)(void *), long arg)
{
	pthread_t t;

	if (pthread_create(&t, NULL, fn, (void *)arg) || pthread_join(t, NULL)) {
		perror("pthread");
		exit(1);
	}
}

int main(int argc, char **argv)
{
	char line[16];
	long a = argc > 2 ? atol(argv[2]) : 0, b = argc > 3 ? atol(argv[3]) : 0;

	if (argc < 3) {
		fprintf(stderr, "usage: pairing rec C D | jump N | leak T N | chain N\n");
		return 2;
	}
	printf("ready\n");
	fflush(stdout);
	if (!fgets(line, sizeof(line), stdin))
		return 1;
	if (!strcmp(argv[1], "rec")) {
		for (long i = 0; i < a; i++)
			sink += tk_rec((int)b);
	} else if (!strcmp(argv[1], "jump")) {
		for (volatile long i = 0; i < a; i++)
			if (!setjmp(back))
				tk_jump((int)i);
	} else if (!strcmp(argv[1], "leak")) {
		for (long i = 0; i < a; i++)
			one_thread(holder, i);
		for (int i = 0; i < 100; i++)
			one_thread(worker, b);
	} else if (!strcmp(argv[1], "chain")) {
		for (long i = 0; i < a; i++)
			usleep(b);
	}
	return 0;
}
