/* A program all of whose code keeps frame pointers, as a Go program's does: no
 * libc (distributions build theirs without), built by the tests with `gcc -O2
 * -fno-omit-frame-pointer -static -nostdlib`. gcc sets up no frame in the
 * leaf tk_inner. _start is the outermost frame, as glibc's: rbp 0 and rip
 * undefined in its call frame information.
 *
 * Prints "ready", reads one line from stdin, then calls tk_inner 100 times
 * from tk_outer (10^7 additions each, about a second in all), and exits. */
static long sys(long n, long a, long b, long c)
{
	long r;

	__asm__ volatile("syscall" : "=a"(r) : "a"(n), "D"(a), "S"(b), "d"(c) : "rcx", "r11", "memory");
	return r;
}

static volatile unsigned long sink;

__attribute__((noinline)) void tk_inner(unsigned long n)
{
	for (unsigned long i = 0; i < n; i++)
		sink += i;
	__asm__ volatile("" ::: "memory"); /* no tail call */
}

__attribute__((noinline)) void tk_outer(unsigned long n)
{
	for (int i = 0; i < 100; i++)
		tk_inner(n);
	__asm__ volatile("" ::: "memory");
}

__attribute__((noinline, used)) void tk_main(void)
{
	char line[16];

	sys(1, 1, (long)"ready\n", 6);		/* write */
	sys(0, 0, (long)line, sizeof(line));	/* read */
	tk_outer(10000000);
	sys(60, 0, 0, 0);			/* exit */
}

__asm__(".globl _start\n"
	"_start:\n"
	"	.cfi_startproc\n"
	"	.cfi_undefined rip\n"
	"	xor %ebp, %ebp\n"
	"	call tk_main\n"
	"	hlt\n"
	"	.cfi_endproc\n");
