/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/* The syscalls:sys_enter_* and sys_exit_* events served by one raw link on the
 * raw_syscalls sys_enter/sys_exit tracepoints (common/src/attach/tracepoints.rs,
 * `syscalls`), shared by the tools that have such programs. The includer
 * defines `kernel_reads` (whether BPF may read kernel memory: not under
 * lockdown=confidentiality; without it the verifier prunes the reads below)
 * before including this, and regs.h. */
#ifndef TRACEKIT_SYSCALLS_H
#define TRACEKIT_SYSCALLS_H

/* The syscall events are ftrace events on top of those two tracepoints: the
 * map takes the syscall number to the probe index (plus one; 0: not traced).
 * Exit slots follow the SYSCALL_SLOTS entry slots. */
#define SYSCALL_SLOTS 1024

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 2 * SYSCALL_SLOTS);
	__type(key, __u32);
	__type(value, __u32);
} syscall_probes SEC(".maps");

#define TS_COMPAT 0x0002 /* arch/x86/include/asm/thread_info.h */

/* Where a task keeps its TS_COMPAT flag: the byte offset of thread_info.status
 * in task_struct, found in the kernel's BTF by userspace and cached per boot
 * (common/src/kernel/features.rs); 0 when unknown. Not a CO-RE read: a relocation
 * would make libbpf parse the kernel's 5 MB BTF at every load of this object
 * (4 ms on hardware, about 90 ms under emulation, most of a syscall event
 * run's start-up there). */
const volatile __u32 task_status_off = 0;

/* The syscall events exclude compat syscalls (their numbers are ia32 ones).
 * Without kernel reads they cannot be told apart. */
static __always_inline bool compat_syscall(void)
{
	__u32 status;

	if (!kernel_reads || !task_status_off)
		return false;
	if (bpf_probe_read_kernel(&status, sizeof(status),
				  (void *)bpf_get_current_task() + task_status_off))
		return false;
	return status & TS_COMPAT;
}

/* The probe syscall `nr` is traced by at its entry (base 0) or exit (base
 * SYSCALL_SLOTS), plus one; 0 when it is not traced. */
static __always_inline __u32 syscall_probe(__u64 nr, __u32 base)
{
	__u32 slot, *probe;

	if (nr >= SYSCALL_SLOTS)
		return 0;
	slot = base + (__u32)nr;
	probe = bpf_map_lookup_elem(&syscall_probes, &slot);
	return probe ? *probe : 0;
}

/* Whether sys_enter must remember syscall numbers for sys_exit (set when exit
 * events are traced without kernel reads). */
const volatile bool remember_nr = false;

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, __u32);	/* thread id */
	__type(value, __u32);	/* syscall number */
} syscall_nrs SEC(".maps");

/* At sys_enter(struct pt_regs *regs, long id): the syscall's number,
 * remembered for its exit when sys_exit cannot read it. `args` is the raw
 * tracepoint's context, its arguments a __u64 each (UAPI's struct
 * bpf_raw_tracepoint_args), read as such: through vmlinux.h's struct, which
 * carries preserve_access_index, each read would be a CO-RE relocation. */
static __always_inline __u64 syscall_enter_nr(const __u64 *args)
{
	__u64 nr = args[1];

	/* Every syscall, traced or not: an entry left by a thread that never
	 * returned (exit_group) must not be taken for the next thread of its id. */
	if (remember_nr) {
		__u32 tid = (__u32)bpf_get_current_pid_tgid();
		__u32 n = nr;

		bpf_map_update_elem(&syscall_nrs, &tid, &n, BPF_ANY);
	}
	return nr;
}

/* At sys_exit(struct pt_regs *regs, long ret): the syscall's number, orig_ax
 * in the registers, or without kernel reads the one remembered at its entry;
 * false when it is not known (entered before we attached). */
static __always_inline bool syscall_exit_nr(const __u64 *args, __u64 *nr)
{
	if (kernel_reads) {
		const struct tk_pt_regs *regs = (const struct tk_pt_regs *)args[0];

		return bpf_probe_read_kernel(nr, sizeof(*nr), &regs->orig_ax) == 0;
	} else {
		__u32 tid = (__u32)bpf_get_current_pid_tgid();
		__u32 *n = bpf_map_lookup_elem(&syscall_nrs, &tid);

		if (!n)
			return false;
		*nr = *n;
		bpf_map_delete_elem(&syscall_nrs, &tid);
		return true;
	}
}

#endif /* TRACEKIT_SYSCALLS_H */
