/* Stack test program in C, compiled by the test with the system gcc:
 * `gcc -O1 -g -fno-omit-frame-pointer`. Debian's gcc still omits the frame in leaf
 * functions, so tk_leaf has none: a probe at its entry must still see its caller.
 *
 * `leaf N`: prints `ready` with SIGUSR1 blocked, waits for SIGUSR1, then calls
 * tk_leaf exactly N times through main -> via_one -> tk_leaf, and exits. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>

__attribute__((noinline)) long tk_leaf(long x)
{
	return x * 3 + 1;
}

__attribute__((noinline)) long via_one(long x)
{
	long r = tk_leaf(x);

	__asm__ volatile("" ::: "memory"); /* no tail call */
	return r + 1;
}

int main(int argc, char **argv)
{
	long n = argc > 1 ? atol(argv[1]) : 0;
	volatile long sink = 0;
	sigset_t set;
	int sig;

	sigemptyset(&set);
	sigaddset(&set, SIGUSR1);
	sigprocmask(SIG_BLOCK, &set, NULL);
	printf("ready\n");
	fflush(stdout);
	while (sigwait(&set, &sig) != 0 || sig != SIGUSR1)
		;
	for (long i = 0; i < n; i++)
		sink += via_one(i);
	return 0;
}
