/* Calls that never return, for stackcount's naming of callers
 * (tests/host/stackcount.rs). Built with `cc -g -O1`. Prints "ready", reads one
 * line from stdin, then main calls tk_last_call, which calls tk_end, which
 * exits: neither call returns, so each is its function's last instruction and
 * its return address is past the function's end. */
#include <stdio.h>
#include <stdlib.h>

__attribute__((noinline, noreturn)) void tk_end(long n)
{
	fflush(stdout);
	exit((int)(n - 1));
}

__attribute__((noinline, noreturn)) void tk_last_call(long n)
{
	tk_end(n + 1);
}

/* Placed after tk_last_call: its return address's neighbour. */
__attribute__((noinline)) long tk_next(long n)
{
	return n * 7;
}

int main(int argc, char **argv)
{
	char line[16];

	(void)argv;
	setvbuf(stdout, NULL, _IONBF, 0);
	printf("ready\n");
	if (!fgets(line, sizeof(line), stdin))
		return 2 + (int)tk_next(argc);
	tk_last_call(0);
}
