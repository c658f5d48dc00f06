// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/* warmup: loaded, never attached, by the thread that opens a tool's object
 * while the tool parses its options (common/src/object/ahead.rs). libbpf asks the
 * kernel what it supports (BTF kinds, global data, mmapable arrays, program
 * names, map binding, arg:ctx tags, bpf_probe_read_kernel, and for
 * usdt.bpf.h's LINUX_HAS_BPF_COOKIE the attach cookie) once per process, in
 * about 15 syscalls; loading this object asks them all, so the tool's own load
 * finds the answers cached. That its program loads also answers tracekit's own
 * question of whether BPF may read kernel memory (common/src/kernel/features.rs). No
 * CO-RE relocation: it never needs kernel BTF. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>

const volatile __u32 warm_value = 0;

/* As usdt.bpf.h declares it (funccount, stackcount and trace include that). */
extern const _Bool LINUX_HAS_BPF_COOKIE __kconfig;

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} warm_map SEC(".maps");

SEC("kprobe")
int warmup(void *ctx)
{
	__u64 v = 0;
	__u32 k = 0;

	bpf_probe_read_kernel(&v, sizeof(v), (void *)(long)warm_value);
	if (LINUX_HAS_BPF_COOKIE)
		v++;
	bpf_map_update_elem(&warm_map, &k, &v, BPF_ANY);
	return 0;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
