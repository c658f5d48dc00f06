// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/* funccount: count events per probe. Every attach carries a cookie that is the
 * probe's index, so one program serves any number of functions and the per-event
 * work is a filter check and a per-CPU array increment (no hashing, no atomics). */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/usdt.bpf.h>
#include "filter.h"

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

	if (filtered_out())
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

SEC("uprobe")
int count_uprobe(struct pt_regs *ctx)
{
	return count(bpf_get_attach_cookie(ctx));
}

SEC("tracepoint")
int count_tracepoint(void *ctx)
{
	return count(bpf_get_attach_cookie(ctx));
}

SEC("usdt")
int count_usdt(struct pt_regs *ctx)
{
	return count(bpf_usdt_cookie(ctx));
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
