// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/* funclatency (and vfsreadlat): a log2 histogram of the time from each call of a
 * function to its return. Every call is paired with its own return, so nested and
 * recursive calls are all measured (see pairing.h). The histogram row is the
 * probe's attach cookie with -F, else row 0; rows are per-CPU. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "regs.h"
#include <bpf/bpf_tracing.h>
#include "filter.h"
#include "hist.h"
#include "pairing.h"
#include "armed.h"

/* Nanoseconds per display unit (1, 1000, 1000000); set before load. */
const volatile __u64 unit_ns = 1;
/* -F: one histogram row per probe. */
const volatile bool per_probe = false;

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1); /* resized to the number of rows before load */
	__type(key, __u32);
	__type(value, struct log2_hist);
} hists SEC(".maps");

static __always_inline void record(__u32 probe, __u64 start)
{
	__u64 ns = bpf_ktime_get_ns() - start;
	__u32 row = per_probe ? probe : 0;
	struct log2_hist *h = bpf_map_lookup_elem(&hists, &row);

	if (h)
		hist_add(h, ns, ns / unit_ns);
}

/* One program at entry and return; the per-call cookie holds the entry time.
 * Returning 1 at entry skips the return run for filtered-out calls. */
static __always_inline int session(void *ctx)
{
	__u64 *start = session_cookie(ctx);

	if (!start)
		return 1;
	if (!session_is_return(ctx)) {
		if (!armed || filtered_out())
			return 1;
		*start = bpf_ktime_get_ns();
		/* Entries and returns counted: the difference is the calls whose
		 * return never came, which the kernel does not tell otherwise. */
		pairing_add(PAIR_ENTERED, 1);
		return 0;
	}
	if (*start) {
		record(bpf_get_attach_cookie(ctx), *start);
		pairing_add(PAIR_RETURNED, 1);
	}
	return 0;
}

/* `sp`: a user function's stack pointer at entry, 0 for a kernel function. */
static __always_inline int entry(__u32 probe, __u64 sp)
{
	if (armed && !filtered_out())
		pair_enter(probe, false, sp);
	return 0;
}

/* Not filtered: a return pairs only with an entry that passed the filter (the
 * thread may have moved to another CPU meanwhile). `entry_sp`: see pair_pop(). */
static __always_inline int exit(__u32 probe, __u64 entry_sp)
{
	struct frame f;
	__u64 start = pair_pop(probe, entry_sp, &f);

	if (start)
		record(f.probe, start);
	return 0;
}

SEC("kprobe.session")
int lat_kprobe_session(struct pt_regs *ctx)
{
	return session(ctx);
}

SEC("uprobe.session")
int lat_uprobe_session(struct pt_regs *ctx)
{
	return session(ctx);
}

SEC("kprobe.multi")
int lat_kprobe_multi(struct pt_regs *ctx)
{
	return entry(bpf_get_attach_cookie(ctx), 0);
}

SEC("kretprobe.multi")
int lat_kretprobe_multi(struct pt_regs *ctx)
{
	return exit(bpf_get_attach_cookie(ctx), 0);
}

SEC("kprobe")
int lat_kprobe(struct pt_regs *ctx)
{
	return entry(bpf_get_attach_cookie(ctx), 0);
}

SEC("kretprobe")
int lat_kretprobe(struct pt_regs *ctx)
{
	return exit(bpf_get_attach_cookie(ctx), 0);
}

SEC("uprobe.multi")
int lat_uprobe_multi(struct pt_regs *ctx)
{
	return entry(bpf_get_attach_cookie(ctx), PT_REGS_SP(ctx));
}

/* Paired by stack pointer (the entry's, which `ret` has popped the return
 * address from): the returns of calls too deep to time pass the frames by. */
SEC("uretprobe.multi")
int lat_uretprobe_multi(struct pt_regs *ctx)
{
	return exit(bpf_get_attach_cookie(ctx), PT_REGS_SP(ctx) - 8);
}

/* Without uprobe_multi, entries and returns are grouped under tracefs uprobe
 * events (the cookie names the group). */
#include "uprobe_groups.h"

SEC("uprobe")
int lat_uprobe(struct pt_regs *ctx)
{
	__u32 probe;

	if (!uprobe_entry_probe(ctx, bpf_get_attach_cookie(ctx), &probe))
		return 0;
	return entry(probe, PT_REGS_SP(ctx));
}

SEC("uretprobe")
int lat_uretprobe(struct pt_regs *ctx)
{
	/* Paired by stack pointer, as uretprobe.multi's. */
	return exit(bpf_get_attach_cookie(ctx), PT_REGS_SP(ctx) - 8);
}

/* A single kernel function through a BPF trampoline (cheapest per call); its
 * target is set before load, and it is probe 0. */
SEC("fentry")
int lat_fentry(void *ctx)
{
	return entry(0, 0);
}

SEC("fexit")
int lat_fexit(void *ctx)
{
	return exit(0, 0);
}

/* A thread's exit: its calls still open will never return (counted). */
SEC("raw_tp/sched_process_exit")
int lat_thread_exit(void *ctx)
{
	pair_thread_exit();
	return 0;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
