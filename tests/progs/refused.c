/* A program with one function uprobes refuse to probe (its first instruction is a
 * breakpoint, which the kernel will not single-step) beside functions it calls an
 * exact number of times. Built by the tests with the system C compiler (naked
 * functions of Rust carry no debug info, and the tools find functions through it).
 *
 * Prints "ready", waits for a line on stdin, calls tk_one 10 times, tk_two 20 times
 * and tk_three 30 times, and exits. */
#include <stdio.h>

__attribute__((naked, used)) void tk_refused(void)
{
	__asm__ volatile("int3\n\tret");
}

__attribute__((noinline)) int tk_one(int x) { __asm__ volatile(""); return x + 1; }
__attribute__((noinline)) int tk_two(int x) { __asm__ volatile(""); return x * 3; }
__attribute__((noinline)) int tk_three(int x) { __asm__ volatile(""); return x ^ 5; }

int main(void)
{
	char line[16];
	volatile int s = 0;

	printf("ready\n");
	fflush(stdout);
	if (!fgets(line, sizeof(line), stdin))
		return 1;
	for (int i = 0; i < 10; i++)
		s += tk_one(i);
	for (int i = 0; i < 20; i++)
		s += tk_two(i);
	for (int i = 0; i < 30; i++)
		s += tk_three(i);
	(void)s;
	return 0;
}
