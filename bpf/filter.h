/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/* Process, CPU and cgroup filters shared by every tool. The values are .rodata
 * set by userspace before load, so the verifier prunes the branches a run does
 * not use. */
#ifndef TRACEKIT_FILTER_H
#define TRACEKIT_FILTER_H

/* Thread-group id to keep, 0 for all. In the pid namespace given below when
 * pidns_ino is set (the tool runs in a container), else in the initial one. */
const volatile __u32 filter_tgid = 0;
const volatile __u64 filter_pidns_dev = 0;
const volatile __u64 filter_pidns_ino = 0;
/* CPU to keep, -1 for all. */
const volatile __s32 filter_cpu = -1;
/* Keep only tasks in the cgroup v2 that userspace put in filter_cgroups[0], or
 * in any cgroup below it (BCC trace's -c). Without the filter the map is not
 * created: libbpf poisons its references, in code the verifier never reaches. */
const volatile bool filter_cgroup = false;

struct {
	__uint(type, BPF_MAP_TYPE_CGROUP_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} filter_cgroups SEC(".maps");

/* struct bpf_pidns_info is uapi (fixed layout): declared here, after vmlinux.h,
 * it needs no CO-RE relocation, and an object without relocations loads without
 * libbpf parsing the kernel's BTF (see regs.h). */
struct tk_pidns_info {
	__u32 pid;
	__u32 tgid;
};

/* filtered_out() for a caller that has bpf_get_current_pid_tgid()'s value
 * already (one helper call the fewer per hit). */
static __always_inline bool filtered_out_id(__u64 pid_tgid)
{
	if (filter_cpu >= 0 && bpf_get_smp_processor_id() != (__u32)filter_cpu)
		return true;
	/* 1: under it; 0: not; negative: no cgroup in the map (not yet armed). */
	if (filter_cgroup && bpf_current_task_under_cgroup(&filter_cgroups, 0) != 1)
		return true;
	if (!filter_tgid)
		return false;
	if (filter_pidns_ino) {
		struct tk_pidns_info ns = {};

		if (bpf_get_ns_current_pid_tgid(filter_pidns_dev, filter_pidns_ino,
						(struct bpf_pidns_info *)&ns, sizeof(ns)))
			return true;
		return ns.tgid != filter_tgid;
	}
	return (pid_tgid >> 32) != filter_tgid;
}

static __always_inline bool filtered_out(void)
{
	/* The pid is read only when a plain -p filter compares it. */
	return filtered_out_id(filter_tgid && !filter_pidns_ino ? bpf_get_current_pid_tgid() : 0);
}

#endif
