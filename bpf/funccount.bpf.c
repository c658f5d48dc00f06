// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/* funccount: count events per probe. Every attach carries a cookie that is the
 * probe's index, so one program serves any number of functions and the per-event
 * work is a filter check and a per-CPU array increment (no hashing, no atomics). */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "regs.h"
#include <bpf/bpf_tracing.h>
#include <bpf/usdt.bpf.h>
#include "filter.h"
#include "armed.h"

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1); /* resized to the number of probes before load */
	__type(key, __u32);
	__type(value, __u64);
} counts SEC(".maps");

static __always_inline int count(__u64 cookie)
{
	__u32 idx = cookie;
	__u64 *n;

	if (!armed || filtered_out())
		return 0;
	n = bpf_map_lookup_elem(&counts, &idx);
	if (n)
		*n += 1; /* per-CPU slot; BPF programs do not nest on a CPU */
	return 0;
}

/* One program per attach kind; userspace loads only the kinds a run needs. */
SEC("kprobe.multi")
int count_kprobe_multi(struct pt_regs *ctx)
{
	return count(bpf_get_attach_cookie(ctx));
}

SEC("kprobe")
int count_kprobe(struct pt_regs *ctx)
{
	return count(bpf_get_attach_cookie(ctx));
}

SEC("uprobe.multi")
int count_uprobe_multi(struct pt_regs *ctx)
{
	return count(bpf_get_attach_cookie(ctx));
}

#include "uprobe_groups.h"

SEC("uprobe")
int count_uprobe(struct pt_regs *ctx)
{
	__u32 probe;

	if (!uprobe_entry_probe(ctx, bpf_get_attach_cookie(ctx), &probe))
		return 0;
	return count(probe);
}

SEC("tracepoint")
int count_tracepoint(void *ctx)
{
	return count(bpf_get_attach_cookie(ctx));
}

/* Sampling and counter sources (profile:, software:, hardware:): one perf
 * event per CPU, each linked with its probe's index as cookie. */
SEC("perf_event")
int count_perf_event(void *ctx)
{
	return count(bpf_get_attach_cookie(ctx));
}

SEC("usdt")
int count_usdt(struct pt_regs *ctx)
{
	return count(bpf_usdt_cookie(ctx));
}

/* Raw tracepoint links (cookies from Linux 6.10) detach without the per-event
 * event_mutex and RCU waits of perf-event tracepoints. */
SEC("raw_tp")
int count_raw_tp(struct bpf_raw_tracepoint_args *ctx)
{
	return count(bpf_get_attach_cookie(ctx));
}

/* Before 6.10 a raw tracepoint link has no cookie. Tracepoints still get raw
 * links then, through clones of this program, one per tracepoint: userspace
 * takes its final instructions from libbpf (bpf_program__insns) and loads a
 * copy per probe with bpf_prog_load, the nth copy reading raw_tp_probes[n]
 * (the offset of the one load from this section's map is patched), which
 * names its probe. Closing a perf-event tracepoint waits out RCU grace periods
 * (tracepoint_synchronize_unregister, one event at a time: 75 ms each on the
 * host, 80 under emulation); closing a raw link does not. The array is a
 * section of its own so that the load is the only reference to its map. */
#define RAW_TP_CLONES 1024
const volatile __u32 raw_tp_probes[RAW_TP_CLONES] SEC(".rodata.raw_tp") = {};

SEC("raw_tracepoint")
int count_raw_tp_clone(struct bpf_raw_tracepoint_args *ctx)
{
	return count(raw_tp_probes[0]);
}

/* Whether this kernel lets BPF read kernel memory (not under lockdown=
 * confidentiality). Without it compat (ia32) syscalls cannot be told apart, and
 * the number of a syscall at its exit is remembered from its entry. */
const volatile bool kernel_reads = false;

#include "syscalls.h"

/* A syscall's probe is looked up first: every syscall on the system runs these
 * programs, and most are not traced (the compat check reads kernel memory). */
static __always_inline int count_syscall(__u64 nr, __u32 base)
{
	__u32 probe = syscall_probe(nr, base);

	if (!probe || compat_syscall())
		return 0;
	return count(probe - 1);
}

SEC("raw_tp/sys_enter")
int count_sys_enter(const __u64 *args)
{
	return count_syscall(syscall_enter_nr(args), 0);
}

SEC("raw_tp/sys_exit")
int count_sys_exit(const __u64 *args)
{
	__u64 nr;

	if (!syscall_exit_nr(args, &nr))
		return 0;
	return count_syscall(nr, SYSCALL_SLOTS);
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
