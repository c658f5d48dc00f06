/* Samples in a PLT stub. Built by the tests twice: with -DTK_LIB as
 * libtkplt.so, whose tk_one is two instructions; and as the program, which
 * calls it through the stub tk_one@plt (`gcc -O2 plt.c -L DIR -ltkplt
 * -Wl,-rpath,DIR`), so a good part of its samples fall in the stub.
 *
 * `plt MS`: prints "ready", reads one line from stdin, then calls tk_one in
 * tk_calls until the process has used MS ms of CPU time, and exits. */
#ifdef TK_LIB
int tk_one(int x)
{
	return x;
}
#else
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

int tk_one(int x);

static double cpu_ms(void)
{
	struct timespec t;

	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
	return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

__attribute__((noinline)) void tk_calls(double ms)
{
	volatile int x = 0;
	double end = cpu_ms() + ms;

	while (cpu_ms() < end)
		for (int i = 0; i < 20000; i++)
			x += tk_one(i);
}

int main(int argc, char **argv)
{
	char line[16];

	if (argc < 3)
		return 2;
	puts("ready");
	fflush(stdout);
	if (!fgets(line, sizeof(line), stdin))
		return 1;
	tk_calls(atof(argv[2]));
	return 0;
}
#endif
