/* A C test program for user-function tracing of binaries built the way distributions
 * build them: the tests compile it with gcc at test time, without -g (no DWARF), and
 * strip copies of it with objcopy.
 *
 * userfuncs MODE N: blocks SIGUSR1, prints "ready", waits for SIGUSR1, does the work,
 * and exits with _exit (no exit-time calls are counted). Exit status 1 means the
 * program computed a wrong result (a probe corrupted it).
 *
 *   plain N   calls uf_target N times.
 *   entries N calls uf_sse, uf_vex (if the CPU has AVX2) and uf_evex (if it has
 *             AVX-512VL) N times each, checking every result. Their first
 *             instructions are SSE2, VEX (AVX2) and EVEX (AVX-512): a uprobe's
 *             out-of-line single step gets the last two wrong.
 *   victim N  N rounds of libc string and formatting functions (snprintf, strchr,
 *             strlen, memchr, memcpy, strcmp, strrchr), each result checked, as the
 *             hostile-input sweep's victim did.
 *   jump N    N calls of uf_jumper, which never returns: it longjmps back to its
 *             caller's setjmp; then uf_target N times.
 *   tail N    N calls of uf_tail, which tail-calls uf_target (a jmp: both are
 *             entered at the same stack pointer, and return once each).
 *   cold N    uf_split(i) and uf_split(-i - 1) for i < N, each result checked.
 *             A negative x goes through uf_split.cold, a cold part as GCC
 *             splits them off (entered by a jmp, not a call), which uses the
 *             word at its stack pointer: a return hook there overwrites it.
 *   cpu       prints "avx2 avx512" flags of this CPU and exits.
 *   ifuncs    prints "shared" when memmove and memcpy resolve to one
 *             implementation in this process, else "apart", and exits.
 *   copies N  N calls of memmove and 2N of memcpy, each result checked.
 */
#define _GNU_SOURCE
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

__attribute__((noinline)) long uf_target(long x) {
    __asm__ volatile("" : "+r"(x));
    return x * 3 + 1;
}

static jmp_buf jump_back;

__attribute__((noinline)) void uf_jumper(long x) {
    __asm__ volatile("" : "+r"(x));
    longjmp(jump_back, 1);
}

void uf_sse(unsigned char *out, int c);
void uf_vex(unsigned char *out, int c);
void uf_evex(unsigned char *out, int c);

#define FUNC(name, body)                                                                \
    ".globl " #name "\n.type " #name ",@function\n" #name ":\n" body " ret\n.size " #name \
    ", .-" #name "\n"
long uf_tail(long x);
__asm__(".text\n.globl uf_tail\n.type uf_tail,@function\nuf_tail:\n jmp uf_target\n"
        ".size uf_tail, .-uf_tail\n");

/* uf_split(x): x + 1 for x >= 0, -x + 1 otherwise, through uf_split.cold. */
long uf_split(long x);
__asm__(".text\n.globl uf_split\n.type uf_split,@function\nuf_split:\n push %rdi\n"
        " test %rdi,%rdi\n js uf_split.cold\n.Luf_split_back:\n pop %rax\n add $1,%rax\n ret\n"
        ".size uf_split, .-uf_split\n"
        ".type uf_split.cold,@function\nuf_split.cold:\n negq (%rsp)\n jmp .Luf_split_back\n"
        ".size uf_split.cold, .-uf_split.cold\n");

__asm__(".text\n" FUNC(uf_sse, " movd %esi,%xmm3\n movd %xmm3,(%rdi)\n")
            FUNC(uf_vex, " vmovd %esi,%xmm0\n vpbroadcastb %xmm0,%ymm2\n"
                         " vmovdqu %ymm2,(%rdi)\n vzeroupper\n")
                FUNC(uf_evex, " vpbroadcastb %esi,%ymm17\n vmovdqu64 %ymm17,(%rdi)\n"
                              " vzeroupper\n"));

static int check_bytes(const unsigned char *b, int n, int c) {
    for (int i = 0; i < n; i++)
        if (b[i] != (unsigned char)c) return 1;
    return 0;
}

static int victim(long n) {
    int bad = 0;
    char buf[64], copy[64];
    const char *text = "the quick brown fox jumps over the lazy dog";
    for (long i = 0; i < n; i++) {
        int len = snprintf(buf, sizeof buf, "%ld-%s", i, "x");
        char want[64];
        /* Build the expected text by hand. */
        long v = i;
        int k = 0;
        char digits[32];
        do {
            digits[k++] = (char)('0' + v % 10);
            v /= 10;
        } while (v);
        int w = 0;
        while (k) want[w++] = digits[--k];
        want[w++] = '-';
        want[w++] = 'x';
        want[w] = 0;
        if (len != w || memcmp(buf, want, (size_t)w + 1) != 0) {
            fprintf(stderr, "MISMATCH snprintf i=%ld got '%s'\n", i, buf);
            bad = 1;
        }
        if (strlen(text) != 43) bad = 1;
        if (strchr(text, 'q') != text + 4) bad = 1;
        if (strrchr(text, 'o') != text + 41) bad = 1;
        if (memchr(text, 'z', 43) != text + 37) bad = 1;
        memcpy(copy, text, 44);
        if (strcmp(copy, text) != 0) bad = 1;
        if (bad) {
            fprintf(stderr, "MISMATCH at i=%ld\n", i);
            return 1;
        }
    }
    return 0;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "";
    long n = argc > 2 ? atol(argv[2]) : 0;
    int avx2 = __builtin_cpu_supports("avx2");
    int avx512 = __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw");
    /* Through volatile pointers: the compiler may not inline the copies. */
    void *(*volatile move)(void *, const void *, size_t) = memmove;
    void *(*volatile copy)(void *, const void *, size_t) = memcpy;
    if (strcmp(mode, "ifuncs") == 0) {
        printf("%s\n", (void *)move == (void *)copy ? "shared" : "apart");
        return 0;
    }
    if (strcmp(mode, "cpu") == 0) {
        printf("%s%s\n", avx2 ? "avx2 " : "", avx512 ? "avx512" : "");
        return 0;
    }
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGUSR1);
    sigprocmask(SIG_BLOCK, &set, NULL);
    printf("ready\n");
    fflush(stdout);
    int sig;
    while (sigwait(&set, &sig) != 0 || sig != SIGUSR1) {
    }
    int bad = 0;
    if (strcmp(mode, "tail") == 0) {
        long s = 0;
        for (long i = 0; i < n; i++) s += uf_tail(i);
        if (s == -1) bad = 1;
    } else if (strcmp(mode, "cold") == 0) {
        for (long i = 0; i < n; i++) {
            bad |= uf_split(i) != i + 1;
            bad |= uf_split(-i - 1) != i + 2;
        }
    } else if (strcmp(mode, "copies") == 0) {
        char a[64] = "0123456789abcdef", b[64];
        for (long i = 0; i < n; i++) {
            move(b, a, 16 + i % 16);
            bad |= memcmp(a, b, 16) != 0;
            for (int k = 0; k < 2; k++) {
                copy(b, a, 16 + k);
                bad |= memcmp(a, b, 16) != 0;
            }
        }
    } else if (strcmp(mode, "jump") == 0) {
        for (volatile long i = 0; i < n; i++)
            if (!setjmp(jump_back)) uf_jumper(i);
        long s = 0;
        for (long i = 0; i < n; i++) s += uf_target(i);
        if (s == -1) bad = 1;
    } else if (strcmp(mode, "plain") == 0) {
        long s = 0;
        for (long i = 0; i < n; i++) s += uf_target(i);
        if (s == -1) bad = 1;
    } else if (strcmp(mode, "entries") == 0) {
        unsigned char out[32];
        for (long i = 0; i < n; i++) {
            int c = (int)(i % 200) + 1;
            memset(out, 0, sizeof out);
            uf_sse(out, c);
            int got;
            memcpy(&got, out, sizeof got);
            bad |= got != c;
            if (avx2) {
                memset(out, 0, sizeof out);
                uf_vex(out, c);
                bad |= check_bytes(out, 32, c);
            }
            if (avx512) {
                memset(out, 0, sizeof out);
                uf_evex(out, c);
                bad |= check_bytes(out, 32, c);
            }
        }
    } else if (strcmp(mode, "victim") == 0) {
        bad = victim(n);
    } else {
        fprintf(stderr, "usage: userfuncs plain|entries|victim|tail|jump|cold N | cpu\n");
        _exit(2);
    }
    if (bad) fprintf(stderr, "wrong results\n");
    _exit(bad);
}
