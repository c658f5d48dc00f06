/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/* Pairing each function return with its own entry, correct under nesting and
 * recursion (BCC and bpftrace key the entry time by thread alone, so an inner call
 * overwrites the outer one's and the outer call is lost: bcc #2548).
 *
 * Two mechanisms, picked by user space from what the kernel has:
 * - session programs (kprobe.session 6.10+, uprobe.session 6.13+) keep a u64 per
 *   call in the kernel (bpf_session_cookie): nothing to pair here;
 * - separate entry and return programs push and pop a per-thread stack of
 *   (probe, entry time), as a call stack does. */
#ifndef TRACEKIT_PAIRING_H
#define TRACEKIT_PAIRING_H

#ifdef TRACEKIT_LEAN
/* The object's lean build (build.rs): the same maps, programs and globals with
 * no kfunc extern, so that libbpf loads it without reading the kernel's BTF
 * (5 MB, a quarter of a second under emulation, and every module's BTF where a
 * kfunc is missing). User space opens it for plans with no session program
 * (common::ahead), so its session programs are never loaded. */
static __always_inline __u64 *session_cookie(void *ctx)
{
	return NULL;
}

static __always_inline bool session_is_return(void *ctx)
{
	return false;
}
#else
/* The session kfuncs gained a ctx argument around Linux 7.0; one object must load
 * on both, so both prototypes are declared weak and the one the kernel has is
 * used (libbpf resolves a flavour whose prototype does not match to 0). */
extern __u64 *bpf_session_cookie___old(void) __ksym __weak;
extern __u64 *bpf_session_cookie___new(void *ctx) __ksym __weak;
extern bool bpf_session_is_return___old(void) __ksym __weak;
extern bool bpf_session_is_return___new(void *ctx) __ksym __weak;

static __always_inline __u64 *session_cookie(void *ctx)
{
	if (bpf_ksym_exists(bpf_session_cookie___new))
		return bpf_session_cookie___new(ctx);
	return bpf_session_cookie___old();
}

static __always_inline bool session_is_return(void *ctx)
{
	if (bpf_ksym_exists(bpf_session_is_return___new))
		return bpf_session_is_return___new(ctx);
	return bpf_session_is_return___old();
}
#endif

/* Calls deeper than this on one thread are not timed (counted in pairing_lost).
 * A tool may define a smaller depth before including this header. */
#ifndef PAIR_DEPTH
#define PAIR_DEPTH 32
#endif

struct frame {
	__u64 start; /* entry time, ns */
	__u64 sp;    /* user stack pointer at entry (0: a kernel function) */
	__u32 probe; /* attach cookie of the function */
	__u32 pad;
#ifdef PAIR_ARGS
	/* Values saved at entry for the return (a tool defines PAIR_ARGS). */
	__u64 args[PAIR_ARGS];
#endif
};

struct thread_calls {
	__u32 depth;    /* frames in use */
	__u32 untimed;  /* kernel functions' entries past PAIR_DEPTH whose returns are still to come */
	struct frame frames[PAIR_DEPTH];
};

/* Per-task storage, freed with the task: a thread that dies inside a timed call
 * (pthread_exit, cancellation, a kill) takes its frames with it. A hash keyed by
 * thread id kept them until it was full, and then no new thread was timed. */
struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct thread_calls);
} calls SEC(".maps");

/* Calls not timed, and the counts that show the ones the kernel never returned
 * from; indexes below. */
enum pairing_stat {
	PAIR_TOO_DEEP,   /* entries past PAIR_DEPTH */
	PAIR_LEFT,       /* frames dropped: their return never came (longjmp, an exception, a missed return) */
	PAIR_NO_ROOM,    /* no storage for the thread */
	PAIR_ENTERED,    /* session programs: calls timed from their entry */
	PAIR_RETURNED,   /* session programs: of those, the returns that came */
	PAIR_EXITED,     /* frames of threads that exited inside them */
	PAIR_STATS,
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, PAIR_STATS);
	__type(key, __u32);
	__type(value, __u64);
} pairing_lost SEC(".maps");

static __always_inline void pairing_add(__u32 why, __u64 n)
{
	__u64 *v = bpf_map_lookup_elem(&pairing_lost, &why);

	/* Atomic although per CPU: uprobe and tracepoint programs run with
	 * migration, not preemption, disabled, so another thread's program (a
	 * thread exit, say) can run between this one's load and store. */
	if (v)
		__sync_fetch_and_add(v, n);
}

static __always_inline void pairing_count_lost(__u32 why)
{
	pairing_add(why, 1);
}

static __always_inline struct thread_calls *thread_calls(bool create)
{
	return bpf_task_storage_get(&calls, bpf_get_current_task_btf(), NULL,
				    create ? BPF_LOCAL_STORAGE_GET_F_CREATE : 0);
}

/* At a thread's exit (a raw tracepoint program of the tool's, sched_process_exit):
 * the frames it still holds are calls that will never return. */
static __always_inline void pair_thread_exit(void)
{
	struct thread_calls *t = thread_calls(false);

	if (t && (t->depth || t->untimed))
		pairing_add(PAIR_EXITED, t->depth + t->untimed);
}

/* At a function's entry: pushes (probe, now); returns the frame pushed (for a
 * tool to save more in), or NULL when the call is not paired. `session`: the
 * caller is a session program, which skips the return of a call not paired (so
 * no return comes to be matched with it). `sp`: a user function's stack pointer
 * at entry, 0 for a kernel function. */
static __always_inline struct frame *pair_enter(__u32 probe, bool session, __u64 sp)
{
	struct thread_calls *t = thread_calls(true);
	struct frame *f;
	__u32 d;

	if (!t) {
		pairing_count_lost(PAIR_NO_ROOM);
		return NULL;
	}
	d = t->depth;
	/* A live caller's stack pointer is above ours. Frames below it are of
	 * calls that longjmp or an exception left without returning: no return
	 * will come for them (the kernel drops their return hooks the same way),
	 * nor for the untimed calls deeper still. At the same stack pointer, a
	 * frame of another function is a tail call's caller, alive (its return
	 * follows the callee's); one of this function was left. */
	for (int i = 0; i < PAIR_DEPTH && sp; i++) {
		struct frame *top;

		if (d == 0)
			break;
		top = &t->frames[(d - 1) & (PAIR_DEPTH - 1)];
		if (!top->sp || top->sp > sp || (top->sp == sp && top->probe != probe))
			break;
		d--;
		t->untimed = 0;
		pairing_count_lost(PAIR_LEFT);
	}
	t->depth = d;
	/* A user function's return finds its frame by stack pointer, so the
	 * returns of calls too deep to time pass over the frames (and the kernel
	 * omits returns nested deeper than 64: counting them would leave the
	 * outer calls waiting for returns that never come). */
	if (d >= PAIR_DEPTH || t->untimed) {
		if (!session && !sp)
			t->untimed += 1;
		pairing_count_lost(PAIR_TOO_DEEP);
		return NULL;
	}
	/* d < PAIR_DEPTH here; the mask (which the barrier keeps clang from
	 * dropping) keeps the verifier sure of it. */
	barrier_var(d);
	f = &t->frames[d & (PAIR_DEPTH - 1)];
	f->probe = probe;
	f->sp = sp;
	f->start = bpf_ktime_get_ns();
	t->depth = d + 1;
	return f;
}

/* At a function's return: pops its frame and returns the entry time, or 0 when
 * this return has no timed entry; the frame is copied to `out` when given.
 * The frame is the innermost of function `probe`, or with `entry_sp` (a return
 * that does not know its function: a uretprobe of a tracefs group, see
 * uprobe_groups.h) the innermost entered at that user stack pointer. Frames
 * above it, whose returns were missed, are dropped. */
static __always_inline __u64 pair_pop(__u32 probe, __u64 entry_sp, struct frame *out)
{
	struct thread_calls *t = thread_calls(false);
	__u64 start = 0;

	if (!t)
		return 0;
	if (t->untimed) {
		t->untimed -= 1; /* the innermost untimed call returns first */
		return 0;
	}
	for (int i = PAIR_DEPTH - 1; i >= 0; i--) {
		if (i >= t->depth)
			continue;
		if (entry_sp ? t->frames[i].sp != entry_sp : t->frames[i].probe != probe)
			continue;
		start = t->frames[i].start;
		if (out)
			*out = t->frames[i];
		if (i + 1 < t->depth)
			pairing_add(PAIR_LEFT, t->depth - i - 1);
		t->depth = i;
		break;
	}
	/* Not ours (filtered at entry, or entered before we attached) when 0.
	 * The thread keeps its storage (freed with it) for its next call. */
	return start;
}

#endif
