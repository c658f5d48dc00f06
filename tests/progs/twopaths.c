/* One leaf function reached by two known paths, a known number of times each,
 * for stackcount --pprof (tests/host/pprof.rs). Built with `cc -g -O1`. Prints
 * "ready", reads one line from stdin, then calls tk_leaf 300 times through
 * main -> tk_path_a -> tk_leaf and 700 times through main -> tk_path_b ->
 * tk_leaf (from tk_inlined, inlined there), and exits. */
#include <stdio.h>

__attribute__((noinline)) long tk_leaf(long x)
{
	__asm__ volatile("" ::: "memory");
	return x * 3 + 1;
}

__attribute__((noinline)) long tk_path_a(long x)
{
	long r = tk_leaf(x);

	__asm__ volatile("" ::: "memory"); /* no tail call */
	return r + 1;
}

/* Inlined into tk_path_b: with --inline, the call's return address is in
 * tk_inlined, inlined in tk_path_b (one location, two lines). */
volatile long tk_stored;

static inline __attribute__((always_inline)) long tk_inlined(long x)
{
	long r = tk_leaf(x);

	tk_stored = r; /* the return address: a store of tk_inlined's */
	return r + 2;
}

__attribute__((noinline)) long tk_path_b(long x)
{
	long r = tk_inlined(x);

	__asm__ volatile("" ::: "memory");
	return r + 3;
}

int main(void)
{
	char line[16];
	volatile long sink = 0;

	setvbuf(stdout, NULL, _IONBF, 0);
	printf("ready\n");
	if (!fgets(line, sizeof(line), stdin))
		return 2;
	for (long i = 0; i < 300; i++)
		sink += tk_path_a(i);
	for (long i = 0; i < 700; i++)
		sink += tk_path_b(i);
	return 0;
}
