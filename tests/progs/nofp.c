/* Whole user stacks without frame pointers: built by the tests with
 * `gcc -O2 -fomit-frame-pointer` (no -g), as distributions build. Every
 * function of the chain puts garbage in rbp around its call, so a walk by
 * frame pointers cannot get past the first frame; only the unwind tables
 * (.eh_frame) can.
 *
 * Prints "ready", reads one line from stdin, then, by its first argument:
 *   chain N    main -> tk_c1 -> ... -> tk_c6 -> tk_leaf, N times; tk_leaf makes
 *              one getppid() syscall each time
 *   slow N     the chain N times, 1 ms apart
 *   qsort N    qsort() of N ints whose comparator tk_cmp calls tk_leaf; prints
 *              "compared K" (K calls of tk_leaf) on stderr at the end
 *   signal N   tk_c1 .. tk_c3 then kill(SIGUSR2) to itself, N times; the handler
 *              tk_handler calls tk_leaf (through __restore_rt on the stack)
 *   thread N   one thread, tk_thread -> tk_c1 -> ... -> tk_leaf, N times
 *   dlopen N LIB  dlopen()s LIB (this file built with -shared -DTK_LIB), calls
 *              its tk_lib_entry(1), waits 300 ms, then tk_lib_entry(N): each
 *              runs the chain in the library (the first call comes before a
 *              tracer can have read the new mapping)
 * and exits. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define NOINLINE __attribute__((noinline))
/* Garbage in rbp for the call below it (gcc saves and restores rbp, which it
 * may use as any register here). */
#define CLOBBER_RBP() __asm__ volatile("mov $0x5a5a5a5a, %%rbp" ::: "rbp", "memory")

static volatile long sink;
static volatile long leaf_calls;

NOINLINE void tk_leaf(long x)
{
	leaf_calls++;
	sink += syscall(SYS_getppid) + x;
	__asm__ volatile("" ::: "memory");
}

#define LINK(name, next)                                                                           \
	NOINLINE void name(long x)                                                                 \
	{                                                                                          \
		volatile char pad[24 + 8 * (sizeof(#name) % 5)];                                   \
		pad[0] = (char)x;                                                                  \
		CLOBBER_RBP();                                                                     \
		next(x + pad[0]);                                                                  \
		__asm__ volatile("" ::: "memory"); /* no tail call */                              \
	}

LINK(tk_c6, tk_leaf)
LINK(tk_c5, tk_c6)
LINK(tk_c4, tk_c5)
LINK(tk_c3, tk_c4)
LINK(tk_c2, tk_c3)
LINK(tk_c1, tk_c2)

#ifdef TK_LIB
NOINLINE void tk_lib_entry(long n)
{
	for (long i = 0; i < n; i++)
		tk_c1(i);
}
#else

NOINLINE int tk_cmp(const void *a, const void *b)
{
	int x = *(const int *)a, y = *(const int *)b;

	tk_leaf(x);
	return (x > y) - (x < y);
}

NOINLINE void tk_handler(int sig)
{
	CLOBBER_RBP();
	tk_leaf(sig);
	__asm__ volatile("" ::: "memory");
}

/* The signal chain: tk_c1 -> tk_s2 -> tk_s3 -> kill(). */
NOINLINE void tk_s3(long x)
{
	CLOBBER_RBP();
	kill(getpid(), SIGUSR2);
	__asm__ volatile("" ::: "memory");
	sink += x;
}

NOINLINE void tk_s2(long x)
{
	CLOBBER_RBP();
	tk_s3(x);
	__asm__ volatile("" ::: "memory");
}

static long thread_n;

NOINLINE void *tk_thread(void *arg)
{
	(void)arg;
	for (long i = 0; i < thread_n; i++)
		tk_c1(i);
	return NULL;
}

int main(int argc, char **argv)
{
	const char *mode = argc > 1 ? argv[1] : "chain";
	long n = argc > 2 ? atol(argv[2]) : 1;
	char line[16];

	setvbuf(stdout, NULL, _IONBF, 0);
	printf("ready\n");
	if (!fgets(line, sizeof(line), stdin))
		return 1;
	if (!strcmp(mode, "chain")) {
		for (long i = 0; i < n; i++)
			tk_c1(i);
	} else if (!strcmp(mode, "slow")) {
		for (long i = 0; i < n; i++) {
			tk_c1(i);
			usleep(1000);
		}
	} else if (!strcmp(mode, "qsort")) {
		int *v = malloc(n * sizeof(*v));

		for (long i = 0; i < n; i++)
			v[i] = (int)((i * 7919) % n);
		qsort(v, n, sizeof(*v), tk_cmp);
		fprintf(stderr, "compared %ld\n", (long)leaf_calls);
		free(v);
	} else if (!strcmp(mode, "signal")) {
		struct sigaction sa;

		memset(&sa, 0, sizeof(sa));
		sa.sa_handler = tk_handler;
		sigaction(SIGUSR2, &sa, NULL);
		for (long i = 0; i < n; i++)
			tk_s2(i);
	} else if (!strcmp(mode, "thread")) {
		pthread_t t;

		thread_n = n;
		pthread_create(&t, NULL, tk_thread, NULL);
		pthread_join(t, NULL);
	} else if (!strcmp(mode, "dlopen")) {
		void *lib = dlopen(argc > 3 ? argv[3] : "", RTLD_NOW);
		void (*entry)(long) = lib ? (void (*)(long))dlsym(lib, "tk_lib_entry") : NULL;

		if (!entry) {
			fprintf(stderr, "dlopen: %s\n", dlerror());
			return 1;
		}
		entry(1);
		usleep(300000);
		entry(n);
	} else {
		return 2;
	}
	return 0;
}
#endif
