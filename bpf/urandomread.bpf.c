// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/* urandomread: one record per read of random bytes, with the bits delivered.
 * Sources, each picked by user space from what the kernel accepts
 * (common/src/object/trials.rs):
 *
 * - reads of /dev/urandom and /dev/random: the random:urandom_read tracepoint
 *   where it exists (removed in Linux 5.18 and in the 5.4/5.10/5.15 stable
 *   kernels), else a return hook on urandom_read_iter/random_read_iter (fexit,
 *   else kretprobe; urandom_read/random_read before 5.19), whose return value
 *   is the bytes actually copied;
 * - getrandom(2): the syscalls:sys_exit_getrandom tracepoint (most programs use
 *   getrandom now, not the device files). */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "regs.h"
#include <bpf/bpf_tracing.h>
#include "filter.h"
#include "events.h"

enum source {
	SRC_URANDOM = 0,
	SRC_RANDOM = 1,
	SRC_GETRANDOM = 2,
};

struct rand_event {
	__u64 ts;   /* ns, CLOCK_MONOTONIC */
	__u64 bits;
	__u32 pid;  /* process (thread group) */
	__u32 tid;
	__u32 source;
	char comm[16];
};

/* For the skeleton's generated types (user space decodes records as this). */
struct rand_event _rand_event = {};

static __always_inline void report(__u64 bits, enum source src)
{
	struct rand_event *e;
	__u64 id;

	if (filtered_out())
		return;
	e = event_reserve(sizeof(*e));
	if (!e)
		return;
	id = bpf_get_current_pid_tgid();
	e->ts = bpf_ktime_get_ns();
	e->bits = bits;
	e->pid = id >> 32;
	e->tid = (__u32)id;
	e->source = src;
	bpf_get_current_comm(e->comm, sizeof(e->comm));
	event_submit(e, sizeof(*e));
}

/* A read's return value: bytes copied, or a negative error (not reported). */
static __always_inline int returned(long ret, enum source src)
{
	if (ret > 0)
		report((__u64)ret * 8, src);
	return 0;
}

/* random:urandom_read before Linux 5.18: got_bits after the common fields
 * (declared by hand: vmlinux.h comes from a kernel without it). */
struct urandom_read_args {
	__u64 common;
	__u32 got_bits;
	__u32 pool_left;
	__u32 input_left;
};

SEC("tracepoint/random/urandom_read")
int tp_urandom_read(struct urandom_read_args *ctx)
{
	report(ctx->got_bits, SRC_URANDOM);
	return 0;
}

SEC("fexit/urandom_read_iter")
int BPF_PROG(fexit_urandom_read_iter, struct kiocb *kiocb, struct iov_iter *iter, long ret)
{
	return returned(ret, SRC_URANDOM);
}

SEC("fexit/random_read_iter")
int BPF_PROG(fexit_random_read_iter, struct kiocb *kiocb, struct iov_iter *iter, long ret)
{
	return returned(ret, SRC_RANDOM);
}

SEC("kretprobe/urandom_read_iter")
int BPF_KRETPROBE(kret_urandom_read_iter, long ret)
{
	return returned(ret, SRC_URANDOM);
}

SEC("kretprobe/random_read_iter")
int BPF_KRETPROBE(kret_random_read_iter, long ret)
{
	return returned(ret, SRC_RANDOM);
}

/* Linux 5.18: the tracepoint is gone and the files still have .read. */
SEC("kretprobe/urandom_read")
int BPF_KRETPROBE(kret_urandom_read, long ret)
{
	return returned(ret, SRC_URANDOM);
}

SEC("kretprobe/random_read")
int BPF_KRETPROBE(kret_random_read, long ret)
{
	return returned(ret, SRC_RANDOM);
}

/* syscalls:sys_exit_* records: common fields, the syscall number, the return. */
struct sys_exit_args {
	__u64 common;
	long id;
	long ret;
};

SEC("tracepoint/syscalls/sys_exit_getrandom")
int tp_getrandom(struct sys_exit_args *ctx)
{
	return returned(ctx->ret, SRC_GETRANDOM);
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
