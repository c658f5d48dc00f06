// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/* stackcount: count events by (process, kernel stack, user stack), in the kernel.
 * Stacks that cannot be stored (a full map) are counted as lost per cause instead
 * of showing up as empty stacks. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "regs.h"
#include <bpf/bpf_tracing.h>
#include <bpf/usdt.bpf.h>
#include "filter.h"
#include "armed.h"
#include "stacks.h"
#include "uprobe_groups.h"

/* Which stacks to collect; set before load. */
const volatile bool kernel_stacks = true;
const volatile bool user_stacks = true;
/* Key stacks by probe too (a pprof profile's `probe` label, in a run of several
 * probes); otherwise `probe` stays 0 and stacks are keyed alike whichever probe
 * took them. */
const volatile bool probe_keys = false;

struct stack_key {
	__u32 tgid;
	__u32 probe; /* the plan's index, with probe_keys */
	__u64 kernel_stack; /* stack hash, 0 for none */
	__u64 user_stack;
	char comm[16];
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536); /* resized before load */
	__type(key, struct stack_key);
	__type(value, __u64);
} counts SEC(".maps");

/* Events not counted because the counts map was full. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} counts_lost SEC(".maps");

/* Processes seen so far; the first event of each is announced on `new_procs`, so
 * user space can snapshot its memory map while it is alive (and symbolize its
 * stacks after it exits). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, __u32);
	__type(value, __u8);
} seen SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 64 * 1024);
} new_procs SEC(".maps");

/* `at_entry`: a probe at a user function's entry (uprobes). `probe`: the
 * plan's index of the probe that fired (read only with probe_keys). */
static __always_inline int record(void *ctx, bool at_entry, __u32 probe)
{
	struct stack_key key = {};
	__u64 one = 1, *n;
	__u8 yes = 1;

	if (!armed || filtered_out())
		return 0;
	key.tgid = bpf_get_current_pid_tgid() >> 32;
	if (probe_keys)
		key.probe = probe;
	if (kernel_stacks)
		key.kernel_stack = take_stack(ctx, STACK_KERNEL, false);
	if (user_stacks)
		key.user_stack = take_stack(ctx, STACK_USER, at_entry);
	bpf_get_current_comm(&key.comm, sizeof(key.comm));

	/* Looked up first: an LRU update takes a free node (and its lock) before it
	 * finds the key there, at every event. */
	if (user_stacks && key.tgid && !bpf_map_lookup_elem(&seen, &key.tgid) &&
	    bpf_map_update_elem(&seen, &key.tgid, &yes, BPF_NOEXIST) == 0) {
		__u32 *t = bpf_ringbuf_reserve(&new_procs, sizeof(*t), 0);

		if (t) {
			*t = key.tgid;
			bpf_ringbuf_submit(t, 0);
		}
	}

	n = bpf_map_lookup_elem(&counts, &key);
	if (n) {
		__sync_fetch_and_add(n, 1);
		return 0;
	}
	if (bpf_map_update_elem(&counts, &key, &one, BPF_NOEXIST) == 0)
		return 0;
	/* Another CPU inserted the key first, or the map is full. */
	n = bpf_map_lookup_elem(&counts, &key);
	if (n) {
		__sync_fetch_and_add(n, 1);
	} else {
		__u32 zero = 0;

		n = bpf_map_lookup_elem(&counts_lost, &zero);
		if (n)
			*n += 1;
	}
	return 0;
}

SEC("kprobe.multi")
int stack_kprobe_multi(struct pt_regs *ctx)
{
	return record(ctx, false, probe_keys ? bpf_get_attach_cookie(ctx) : 0);
}

SEC("kprobe")
int stack_kprobe(struct pt_regs *ctx)
{
	return record(ctx, false, probe_keys ? bpf_get_attach_cookie(ctx) : 0);
}

SEC("uprobe.multi")
int stack_uprobe_multi(struct pt_regs *ctx)
{
	return record(ctx, true, probe_keys ? bpf_get_attach_cookie(ctx) : 0);
}

SEC("uprobe")
int stack_uprobe(struct pt_regs *ctx)
{
	__u32 probe = 0;

	/* A uprobe group's cookie names the group; the address, its function. */
	if (probe_keys && !uprobe_entry_probe(ctx, bpf_get_attach_cookie(ctx), &probe))
		return 0;
	return record(ctx, true, probe);
}

SEC("tracepoint")
int stack_tracepoint(void *ctx)
{
	return record(ctx, false, probe_keys ? bpf_get_attach_cookie(ctx) : 0);
}

/* Tracepoints as raw tracepoint links: on any kernel when this program serves
 * every tracepoint alike; with probe_keys, only where links carry a cookie
 * (6.10+; before, perf-event tracepoints carry it). Raw links detach without the
 * per-event RCU waits of perf events. The kernel stack taken here begins in this program
 * and bpf_trace_run*; user space leaves those frames out
 * (common/src/data/stacks.rs). */
SEC("raw_tp")
int stack_raw_tp(void *ctx)
{
	return record(ctx, false, probe_keys ? bpf_get_attach_cookie(ctx) : 0);
}

/* Whether this kernel lets BPF read kernel memory (not under lockdown=
 * confidentiality), for the syscall programs below. */
const volatile bool kernel_reads = false;

#include "syscalls.h"

/* The syscalls:sys_enter_* / sys_exit_* events: one raw link on sys_enter and
 * one on sys_exit for all of them (bpf/syscalls.h); the kernel stack begins, as
 * a raw tracepoint's, in this program (left out by user space). */
SEC("raw_tp/sys_enter")
int stack_sys_enter(__u64 *args)
{
	/* The probe first: most syscalls are not traced. */
	__u32 probe = syscall_probe(syscall_enter_nr(args), 0);

	if (!probe || compat_syscall())
		return 0;
	return record(args, false, probe - 1);
}

SEC("raw_tp/sys_exit")
int stack_sys_exit(__u64 *args)
{
	__u64 nr;
	__u32 probe;

	if (!syscall_exit_nr(args, &nr))
		return 0;
	probe = syscall_probe(nr, SYSCALL_SLOTS);
	if (!probe || compat_syscall())
		return 0;
	return record(args, false, probe - 1);
}

/* Sampling and counter sources (profile:, software:, hardware:): the stacks
 * where the sample came, the kernel's from the interrupted registers and the
 * user's from those the task entered the kernel with. */
SEC("perf_event")
int stack_perf_event(void *ctx)
{
	return record(ctx, false, probe_keys ? bpf_get_attach_cookie(ctx) : 0);
}

SEC("usdt")
int stack_usdt(struct pt_regs *ctx)
{
	return record(ctx, false, probe_keys ? bpf_usdt_cookie(ctx) : 0);
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
