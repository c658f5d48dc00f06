// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/* trace: one record per probe hit, with values and a filter chosen at run time.
 *
 * No code is generated at run time: user space (tools/trace/) parses each probe
 * spec into a small bytecode program (struct spec) that this object interprets,
 * bounded (bpf_loop over at most MAX_INSNS instructions) and verified once:
 *
 *   inputs    registers, retval, $pid..., USDT arguments, the tracepoint record,
 *             gathered once per hit into per-CPU scratch;
 *   program   pushes and combines 64-bit values (arithmetic, comparisons, memory
 *             loads, STRCMP); FILTER drops the hit when the predicate is false
 *             (nothing reaches user space); VAL and STR store the values of the
 *             format's arguments into the record;
 *   record    header, values, strings, optional stacks, one ring buffer for all.
 *
 * The probe's attach cookie indexes `probes`, which names the specs (up to
 * MAX_SPECS) served at that site: `p:` specs emit at entry, `r:` specs at the
 * return, with the entry's argument registers saved per call (pairing.h), so a
 * return sees its own call's arguments under nesting and recursion.
 *
 * A probe whose one spec's predicate is one register compared with a constant
 * (after at most one arithmetic step) has a gate (struct gate): a hit reads that
 * register from ctx and is decided before anything else, so a dropped hit reads
 * no pid, no scratch and copies no argument. A one-probe run's gate is set before
 * load (the_gate): the verifier keeps only the branches its values take.
 *
 * Kernel memory is read only when `kernel_reads` is set (not under lockdown=
 * confidentiality): the verifier prunes those paths otherwise, so tracepoint,
 * uprobe and USDT programs load on locked-down kernels. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "regs.h"
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include <bpf/usdt.bpf.h>
#include "filter.h"
#include "events.h"
#define PAIR_ARGS 6
#define PAIR_DEPTH 16	/* user space reads it as thread_calls.frames' length */
#include "pairing.h"
#include "trace/abi.h"

struct scratch {
	__u64 in[NIN];
	__u64 st[EVAL_STACK];
	/* The interpreter's state lives here, not on the stack: a value loaded
	 * from a map is not tracked precisely, so the verifier's walk of the
	 * bpf_loop callback converges at once instead of per step. */
	__u32 top;
	__u32 drop;
	__u32 pc0;	/* the first instruction to run */
	__u32 pad;
	__u64 regs[32];
	__u8 rec[REC_MAX + 16];
	char lit[STR_AREA];
	struct tk_event ev;
};

/* Set before load. */
const volatile bool kernel_reads = false;
#include "syscalls.h"
const volatile __u32 self_tgid = 0;	/* not traced (-S unset) */
const volatile __u32 filter_tid = 0;	/* -L */
const volatile __s64 filter_uid = -1;	/* --uid */
const volatile __u32 str_size = 80;	/* -Z */
const volatile bool want_kstack = false; /* -K */
const volatile bool want_ustack = false; /* -U */
/* -U frames as build ID + file offset (struct bpf_stack_build_id, 32 bytes). */
const volatile bool ustack_build_id = false;
/* -U stacks walked by the binaries' unwind tables (bpf/unwind.h), as frames of
 * the build-ID layout in address form. */
const volatile bool unwind_tables = false;
#define MAX_STACK_DEPTH 127
#include "unwind.h"
const volatile bool want_extras = true;	/* the header's ts, uid and cpu (-t, -C, --json) */
const volatile bool want_stats = true;	/* -v: hits and drops counted per spec */
const volatile bool one_probe = false;	/* the run has one probe: its index is 0 */
/* A one-probe run whose one spec has a gate gets it here, set before load
 * (GATE_ENTRY or GATE_RETURN in gate_at): the verifier knows these values, so
 * it keeps only the branches they take, and a dropped hit reads no map. */
const volatile __u8 gate_at = 0;
const volatile struct gate the_gate = {};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1); /* resized to the number of specs */
	__type(key, __u32);
	__type(value, struct spec);
} specs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1); /* resized to the number of probes */
	__type(key, __u32);
	__type(value, struct specs_of);
} probes SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct scratch);
} scratch SEC(".maps");

/* Per spec: STATS counters (bpf/trace/abi.h), one touched per hit. Returns not
 * paired are in pairing_lost. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, STATS); /* resized to STATS x specs */
	__type(key, __u32);
	__type(value, __u64);
} stats SEC(".maps");

#include "trace/vm.h"

static __always_inline struct scratch *scratch_of_cpu(void)
{
	__u32 zero = 0;

	return bpf_map_lookup_elem(&scratch, &zero);
}

/* The argument registers of a function hit (through the syscall wrapper's inner
 * pt_regs when `syscall`). */
static __always_inline void read_args(struct pt_regs *ctx, __u64 *args, bool syscall)
{
	const struct tk_pt_regs *regs;
	__u64 w[8];

	args[0] = PT_REGS_PARM1(ctx);
	args[1] = PT_REGS_PARM2(ctx);
	args[2] = PT_REGS_PARM3(ctx);
	args[3] = PT_REGS_PARM4(ctx);
	args[4] = PT_REGS_PARM5(ctx);
	args[5] = PT_REGS_PARM6(ctx);
	if (!syscall || !kernel_reads)
		return;
	/* r10, r9, r8, ax, cx, dx, si, di: one read of the inner pt_regs. */
	regs = (const struct tk_pt_regs *)args[0];
	if (bpf_probe_read_kernel(w, sizeof(w), &regs->r10)) {
		__builtin_memset(args, 0, 6 * sizeof(*args));
		return;
	}
	args[0] = w[7];
	args[1] = w[6];
	args[2] = w[5];
	args[3] = w[0];
	args[4] = w[2];
	args[5] = w[1];
}

static __always_inline struct specs_of *specs_of(__u32 probe)
{
	return bpf_map_lookup_elem(&probes, &probe);
}

/* One load of ctx at offset `off` (a literal). Inline assembly: written in C,
 * clang merges a switch's loads into one load from a selected address, and the
 * verifier refuses any ctx access but at a constant offset. */
#define CTX_U64(ctx, off) ({							\
	__u64 __v;								\
	asm volatile("%0 = *(u64 *)(%1 + " #off ")" : "=r"(__v) : "r"(ctx));	\
	__v; })

/* x86-64's argument registers di, si, dx, cx, r8, r9 in struct tk_pt_regs. */
_Static_assert(__builtin_offsetof(struct tk_pt_regs, di) == 112 && __builtin_offsetof(struct tk_pt_regs, si) == 104 &&
	       __builtin_offsetof(struct tk_pt_regs, dx) == 96 && __builtin_offsetof(struct tk_pt_regs, cx) == 88 &&
	       __builtin_offsetof(struct tk_pt_regs, r8) == 72 && __builtin_offsetof(struct tk_pt_regs, r9) == 64,
	       "x86-64 pt_regs layout");

/* Argument register r (0-based) of a function hit, read from ctx. */
static __always_inline __u64 arg_reg(struct pt_regs *ctx, __u32 r)
{
	switch (r) {
	case 0: return CTX_U64(ctx, 112);
	case 1: return CTX_U64(ctx, 104);
	case 2: return CTX_U64(ctx, 96);
	case 3: return CTX_U64(ctx, 88);
	case 4: return CTX_U64(ctx, 72);
	case 5: return CTX_U64(ctx, 64);
	}
	return 0;
}

/* The register a return's gate reads: retval, or an argument saved at entry. */
static __always_inline __u64 ret_reg(struct pt_regs *ctx, struct frame *f, __u32 r)
{
	switch (r) {
	case 0: return f->args[0];
	case 1: return f->args[1];
	case 2: return f->args[2];
	case 3: return f->args[3];
	case 4: return f->args[4];
	case 5: return f->args[5];
	}
	return PT_REGS_RC(ctx);
}

/* A hit of spec `id` its gate dropped: counted for -v if the hit is the
 * traced process's. */
static __always_inline bool gate_drop(__u32 id)
{
	if (want_stats && !skip_task())
		stat(id, 1);
	return false;
}

/* A function's entry: emits its `p:` specs; saves the arguments for its `r:`
 * specs. Returns whether a return hook is wanted (a session's entry returns 1
 * to skip the return); `session`: called from a session program; `grouped`: a
 * function of a tracefs uprobe group, whose return must be paired with its
 * entry to be known. */
static __always_inline bool fn_entry(struct pt_regs *ctx, __u32 probe, bool session, bool user,
				     bool grouped)
{
	struct specs_of *so;
	struct scratch *sc;
	bool want_ret;

	/* Decided on its register alone, before the pid is read (the hits -v
	 * counts as dropped are the traced process's only). The one spec of a
	 * one-probe run is spec 0. */
	if (gate_at == GATE_ENTRY) {
		if (!gate_keeps(&the_gate, arg_reg(ctx, the_gate.reg)))
			return gate_drop(0);
		so = specs_of(probe);
		if (!so)
			return false;
	} else {
		so = specs_of(probe);
		if (!so)
			return false;
		if ((so->flags & (F_GATE | F_RETURN)) == F_GATE &&
		    !gate_keeps(&so->gate, arg_reg(ctx, so->gate.reg)))
			return gate_drop(so->spec[0]);
	}
	if (skip_task())
		return false;
	sc = scratch_of_cpu();
	if (!sc)
		return false;
	want_ret = so->flags & F_RETURN;
	read_args(ctx, sc->in, so->flags & F_SYSCALL);
	sc->in[IN_RETVAL] = 0;
	for (int k = 0; k < MAX_SPECS; k++) {
		__u32 id;
		struct spec *sp;

		if (k >= so->n)
			break;
		id = so->spec[k];
		sp = bpf_map_lookup_elem(&specs, &id);
		if (!sp || (sp->flags & F_RETURN))
			continue;
		emit(ctx, probe, id, sp, sc, user);
	}
	if (want_ret) {
		struct frame *f;

		/* Returns that read no argument keep no entry: their hook's cookie
		 * names the function, and no depth limit drops them. */
		if (!(so->flags & F_ENTRY_ARGS) && !grouped) {
			/* Entries whose return is awaited, against the returns
			 * that came: the kernel omits some (nested deeper than 64). */
			pairing_add(PAIR_ENTERED, 1);
			return true;
		}
		f = pair_enter(probe, session, user ? PT_REGS_SP(ctx) : 0);
		if (f) {
			__builtin_memcpy(f->args, sc->in, sizeof(f->args));
			pairing_add(PAIR_ENTERED, 1);
		}
		return f != NULL;
	}
	return false;
}

/* A function's return: emits its `r:` specs with the entry's arguments.
 * `entry_sp`: see pair_pop(); `known`: `probe` names the function (not a
 * tracefs group's return). */
static __always_inline void fn_return(struct pt_regs *ctx, __u32 probe, __u64 entry_sp,
				      bool known)
{
	struct specs_of *so = NULL;
	struct frame f;
	struct scratch *sc;

	if (known) {
		so = specs_of(probe);
		if (!so)
			return;
	}
	if (so && !(so->flags & F_ENTRY_ARGS)) {
		/* Not paired (see fn_entry): filtered here. */
		if (skip_task())
			return;
		__builtin_memset(&f, 0, sizeof(f));
		f.probe = probe;
		pairing_add(PAIR_RETURNED, 1);
	} else {
		if (!pair_pop(probe, entry_sp, &f))
			return; /* no entry: filtered out there, or a p: only site */
		pairing_add(PAIR_RETURNED, 1);
		so = specs_of(f.probe);
		if (!so)
			return;
	}
	if (gate_at == GATE_RETURN) {
		if (!gate_keeps(&the_gate, ret_reg(ctx, &f, the_gate.reg))) {
			stat(0, 1);
			return;
		}
	} else if ((so->flags & F_GATE) && !gate_keeps(&so->gate, ret_reg(ctx, &f, so->gate.reg))) {
		stat(so->spec[0], 1);
		return;
	}
	sc = scratch_of_cpu();
	if (!sc)
		return;
	__builtin_memcpy(sc->in, f.args, sizeof(f.args));
	sc->in[IN_RETVAL] = PT_REGS_RC(ctx);
	for (int k = 0; k < MAX_SPECS; k++) {
		__u32 id;
		struct spec *sp;

		if (k >= so->n)
			break;
		id = so->spec[k];
		sp = bpf_map_lookup_elem(&specs, &id);
		if (!sp || !(sp->flags & F_RETURN))
			continue;
		emit(ctx, f.probe, id, sp, sc, false);
	}
}

static __always_inline int session(struct pt_regs *ctx, bool user)
{
	__u32 probe = probe_of(ctx);

	if (!session_is_return(ctx))
		return fn_entry(ctx, probe, true, user, false) ? 0 : 1;
	fn_return(ctx, probe, 0, true);
	return 0;
}

SEC("kprobe.session")
int trace_kprobe_session(struct pt_regs *ctx)
{
	return session(ctx, false);
}

SEC("uprobe.session")
int trace_uprobe_session(struct pt_regs *ctx)
{
	return session(ctx, true);
}

SEC("kprobe.multi")
int trace_kprobe_multi(struct pt_regs *ctx)
{
	fn_entry(ctx, probe_of(ctx), false, false, false);
	return 0;
}

SEC("kretprobe.multi")
int trace_kretprobe_multi(struct pt_regs *ctx)
{
	fn_return(ctx, probe_of(ctx), 0, true);
	return 0;
}

SEC("kprobe")
int trace_kprobe(struct pt_regs *ctx)
{
	fn_entry(ctx, probe_of(ctx), false, false, false);
	return 0;
}

SEC("kretprobe")
int trace_kretprobe(struct pt_regs *ctx)
{
	fn_return(ctx, probe_of(ctx), 0, true);
	return 0;
}

SEC("uprobe.multi")
int trace_uprobe_multi(struct pt_regs *ctx)
{
	fn_entry(ctx, probe_of(ctx), false, true, false);
	return 0;
}

SEC("uretprobe.multi")
int trace_uretprobe_multi(struct pt_regs *ctx)
{
	fn_return(ctx, probe_of(ctx), PT_REGS_SP(ctx) - 8, true);
	return 0;
}

/* Without uprobe_multi, a binary's functions are grouped under tracefs uprobe
 * events, entries and returns (the cookie names the group). */
#include "uprobe_groups.h"

SEC("uprobe")
int trace_uprobe(struct pt_regs *ctx)
{
	__u64 cookie = probe_of(ctx);
	__u32 probe;

	if (uprobe_entry_probe(ctx, cookie, &probe))
		fn_entry(ctx, probe, false, true, cookie & UPROBE_GROUP);
	return 0;
}

SEC("uretprobe")
int trace_uretprobe(struct pt_regs *ctx)
{
	__u64 cookie = probe_of(ctx);

	/* Paired by stack pointer, as uretprobe.multi's. */
	fn_return(ctx, cookie, PT_REGS_SP(ctx) - 8, !(cookie & UPROBE_GROUP));
	return 0;
}

/* Tracepoints and USDT probes: every spec emits at the hit. */
static __always_inline void hit(void *ctx, struct scratch *sc, __u32 probe, bool usdt_regs)
{
	struct specs_of *so;
	__u32 usdt;

	so = specs_of(probe);
	if (!so)
		return;
	usdt = so->usdt_mask;
	if (usdt_regs && usdt) {
		const struct tk_pt_regs *regs = (const struct tk_pt_regs *)ctx;

		sc->regs[0] = regs->r15;
		sc->regs[1] = regs->r14;
		sc->regs[2] = regs->r13;
		sc->regs[3] = regs->r12;
		sc->regs[4] = regs->bp;
		sc->regs[5] = regs->bx;
		sc->regs[6] = regs->r11;
		sc->regs[7] = regs->r10;
		sc->regs[8] = regs->r9;
		sc->regs[9] = regs->r8;
		sc->regs[10] = regs->ax;
		sc->regs[11] = regs->cx;
		sc->regs[12] = regs->dx;
		sc->regs[13] = regs->si;
		sc->regs[14] = regs->di;
		sc->regs[15] = regs->orig_ax;
		sc->regs[16] = regs->ip;
		sc->regs[17] = regs->cs;
		sc->regs[18] = regs->flags;
		sc->regs[19] = regs->sp;
		sc->regs[20] = regs->ss;
		for (int n = 0; n < BPF_USDT_MAX_ARG_CNT; n++) {
			if (usdt & (1u << n))
				sc->in[(IN_USDT0 + n) & (NIN - 1)] = usdt_arg(ctx, sc, n);
		}
	}
	for (int k = 0; k < MAX_SPECS; k++) {
		__u32 id;
		struct spec *sp;

		if (k >= so->n)
			break;
		id = so->spec[k];
		sp = bpf_map_lookup_elem(&specs, &id);
		if (!sp)
			continue;
		emit(ctx, probe, id, sp, sc, false);
	}
}

/* A tracepoint's record is copied from the context. With kernel reads, one
 * helper call copies what the specs need. Without them (lockdown), only loads at
 * constant offsets can read it, and the kernel refuses to attach a program that
 * reads past the record's fields (max_ctx_offset): so there is one program per
 * record size, copying exactly bytes [8, N); user space attaches each tracepoint
 * to the largest N its record has. The first 8 bytes (common fields) are not
 * readable by tracepoint programs. */
static __always_inline struct scratch *tp_start(void)
{
	if (skip_task())
		return NULL;
	return scratch_of_cpu();
}

SEC("tracepoint")
int trace_tp_read(void *ctx)
{
	struct scratch *sc = tp_start();
	__u32 probe = probe_of(ctx);
	struct specs_of *so;
	__u32 words = 0;

	if (!sc || !kernel_reads)
		return 0;
	so = specs_of(probe);
	if (!so)
		return 0;
	words = so->rec_words;
	if (words > REC_MAX / 8)
		words = REC_MAX / 8;
	if (words > 1)
		bpf_probe_read_kernel(&sc->rec[8], (words - 1) * 8, (char *)ctx + 8);
	hit(ctx, sc, probe, false);
	return 0;
}

#define TP_COPY8(o) \
	if ((o) + 8 <= N) *(__u64 *)&sc->rec[o] = *(__u64 *)((char *)ctx + (o)); \
	else if ((o) + 4 <= N) *(__u32 *)&sc->rec[o] = *(__u32 *)((char *)ctx + (o));

#define TP_CLASS(N_)							\
SEC("tracepoint")							\
int trace_tp_##N_(void *ctx)						\
{									\
	enum { N = N_ };						\
	struct scratch *sc = tp_start();				\
									\
	if (!sc)							\
		return 0;						\
	_Pragma("unroll")						\
	for (int o = 8; o < N; o += 8) {				\
		TP_COPY8(o)						\
	}								\
	hit(ctx, sc, probe_of(ctx), false);		\
	return 0;							\
}

TP_CLASS(12)
TP_CLASS(16)
TP_CLASS(20)
TP_CLASS(24)
TP_CLASS(28)
TP_CLASS(32)
TP_CLASS(36)
TP_CLASS(40)
TP_CLASS(44)
TP_CLASS(48)
TP_CLASS(52)
TP_CLASS(56)
TP_CLASS(60)
TP_CLASS(64)
TP_CLASS(72)
TP_CLASS(80)
TP_CLASS(88)
TP_CLASS(96)
TP_CLASS(112)
TP_CLASS(128)
TP_CLASS(160)
TP_CLASS(192)
TP_CLASS(256)
TP_CLASS(384)
TP_CLASS(512)

/* A tracepoint whose specs read none of its record's fields (user space checks;
 * $pid, $comm, stacks and the like come from helpers) on a raw tracepoint link,
 * the probe in its cookie (Linux 6.10+): it detaches at once, where a
 * perf-event tracepoint waits out RCU grace periods (about 70 ms each). */
SEC("raw_tp")
int trace_raw_tp(void *ctx)
{
	struct scratch *sc = tp_start();

	if (sc)
		hit(ctx, sc, probe_of(ctx), false);
	return 0;
}

/* Sampling and counter sources (profile:, software:, hardware:): one record
 * per sample, of the probe the cookie names; no arguments. */
SEC("perf_event")
int trace_perf_event(void *ctx)
{
	struct scratch *sc;

	if (skip_task())
		return 0;
	sc = scratch_of_cpu();
	if (sc)
		hit(ctx, sc, bpf_get_attach_cookie(ctx), false);
	return 0;
}

SEC("usdt")
int trace_usdt(struct pt_regs *ctx)
{
	struct scratch *sc;

	if (skip_task())
		return 0;
	sc = scratch_of_cpu();
	if (sc)
		hit(ctx, sc, bpf_usdt_cookie(ctx), true);
	return 0;
}

/* The syscalls:sys_enter_* / sys_exit_* events through one raw link on
 * raw_syscalls' sys_enter / sys_exit for all of them (closing one does not wait
 * out the RCU grace periods a perf-event tracepoint does, 70 ms each). The
 * event's record is rebuilt from the registers as the kernel fills it
 * (perf_syscall_enter/exit): __syscall_nr at 8, then each argument as 8 bytes
 * from 16, or the return value at 16. User space sends only events whose format
 * says exactly that, and only with kernel reads (the registers are kernel
 * memory); the others are perf-event tracepoints. */
static __always_inline struct scratch *syscall_start(__u64 nr, __u32 base, __u32 *probe)
{
	*probe = syscall_probe(nr, base);
	if (!kernel_reads || !*probe || compat_syscall())
		return NULL;
	*probe -= 1;
	return tp_start();
}

SEC("raw_tp/sys_enter")
int trace_sys_enter(__u64 *args)
{
	/* sys_enter(struct pt_regs *regs, long id) */
	const void *regs = (const void *)args[0];
	__u64 nr = syscall_enter_nr(args);
	struct tk_pt_regs *r;
	struct scratch *sc;
	__u32 probe;

	sc = syscall_start(nr, 0, &probe);
	if (!sc)
		return 0;
	r = (struct tk_pt_regs *)sc->regs;
	if (bpf_probe_read_kernel(r, sizeof(*r), regs))
		return 0;
	*(__s32 *)&sc->rec[8] = (__s32)nr;
	/* x86-64's syscall argument registers (syscall_get_arguments) */
	*(__u64 *)&sc->rec[16] = r->di;
	*(__u64 *)&sc->rec[24] = r->si;
	*(__u64 *)&sc->rec[32] = r->dx;
	*(__u64 *)&sc->rec[40] = r->r10;
	*(__u64 *)&sc->rec[48] = r->r8;
	*(__u64 *)&sc->rec[56] = r->r9;
	hit(args, sc, probe, false);
	return 0;
}

SEC("raw_tp/sys_exit")
int trace_sys_exit(__u64 *args)
{
	/* sys_exit(struct pt_regs *regs, long ret) */
	struct scratch *sc;
	__u32 probe;
	__u64 nr;

	if (!syscall_exit_nr(args, &nr))
		return 0;
	sc = syscall_start(nr, SYSCALL_SLOTS, &probe);
	if (!sc)
		return 0;
	*(__s32 *)&sc->rec[8] = (__s32)nr;
	*(__u64 *)&sc->rec[16] = args[1];
	hit(args, sc, probe, false);
	return 0;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
