// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/* disksnoop: one record per completed block request, with its latency from issue
 * to completion. Three program sets for the same events; user space loads the
 * first the kernel accepts (common/src/object/trials.rs):
 *
 * - tp_btf: block_rq_issue/complete/insert/io_start with typed arguments, request
 *   fields read through BTF pointers; requests keyed by their address;
 * - raw_tp: the same raw tracepoints, fields read with bpf_probe_read_kernel
 *   (kernels whose BTF cannot type tracepoint arguments);
 * - tracepoint: the classic tracepoints, whose records carry no request address,
 *   so requests are keyed by (device, sector): approximate when two requests to
 *   one sector are in flight at once (user space says so). Used where reading
 *   kernel memory is refused (lockdown=confidentiality). Fields are read at fixed
 *   offsets that user space checks against the tracepoint's format, so these
 *   programs need no kernel BTF.
 *
 * Never keyed by device alone (concurrent requests would pair wrongly) nor by
 * thread (the completing task is not the issuer). A request completed in parts
 * (block_rq_complete with fewer bytes than remain) is reported once, with its
 * full size, when its last part completes; the rest of such a request is put back
 * on the queue (block_rq_requeue) and issued again, which is not a new request.
 * Requests in flight when tracing began have no start and are ignored. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "regs.h"
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "filter.h"
#include "events.h"

/* The argument of block_rq_issue, _insert and _requeue that is the request: 1 where
 * the queue came first (before Linux 5.11 and 5.10.137), else 0. From BTF. */
const volatile __u32 rq_arg = 0;
/* Only requests to this disk (kernel dev_t: major << 20 | minor), 0 for all. */
const volatile __u32 filter_dev = 0;
/* Classic tracepoints: offset of rwbs in block_rq_issue's record (32 before the
 * ioprio field was added, 34 after), from its format. */
const volatile __u32 issue_rwbs_off = 34;

#define MINORBITS 20
#define REQ_OP_MASK 0xff
#define SECTOR_SHIFT 9

struct rq_key {
	__u64 a; /* request address, or device */
	__u64 b; /* 0, or sector */
};

struct start {
	__u64 ts;     /* issue time, ns */
	__u64 sector;
	__u32 bytes;  /* whole request, at issue */
	__u32 left;   /* classic tracepoints: bytes not yet completed */
	__u32 dev;
	__u32 pid;
	char comm[16];
	char type;
	__u8 requeued; /* put back on the queue: its next issue is not a new request */
};

/* The process that started a request (block_io_start, block_rq_insert), when
 * the kernel issues it from another context (a kworker). */
struct issuer {
	__u32 pid;
	char comm[16];
};

struct disk_event {
	__u64 ts;     /* completion time, ns (CLOCK_MONOTONIC) */
	__u64 lat_ns;
	__u64 sector;
	__u32 bytes;
	__u32 dev;
	__u32 pid;
	char comm[16];
	char type;    /* R W D F M */
};

/* LRU: an entry whose completion never comes (a request merged away after it
 * started) is evicted instead of filling the map. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, struct rq_key);
	__type(value, struct start);
} starts SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, struct rq_key);
	__type(value, struct issuer);
} issuers SEC(".maps");

/* For the skeleton's generated types (user space decodes records as this). */
struct disk_event _disk_event = {};

static __always_inline char type_of_op(__u32 op)
{
	switch (op & REQ_OP_MASK) {
	case REQ_OP_READ:
		return 'R';
	case REQ_OP_WRITE:
		return 'W';
	case REQ_OP_FLUSH:
		return 'F';
	case REQ_OP_DISCARD:
	case REQ_OP_SECURE_ERASE:
		return 'D';
	default:
		return 'M'; /* write zeroes, zone management, driver-private */
	}
}

/* blk_fill_rwbs: an optional 'F' (preflush), then the operation's letter (R, W,
 * D, F for a flush, N for others), then flags (F for FUA, A, S, M). */
static __always_inline char type_of_rwbs(char c0, char c1)
{
	char op = c0;

	if (c0 == 'F' && (c1 == 'W' || c1 == 'R' || c1 == 'D' || c1 == 'N'))
		op = c1;
	switch (op) {
	case 'R':
	case 'W':
	case 'D':
	case 'F':
		return op;
	default:
		return 'M';
	}
}

/* Remembers the current task as the issuer of the request under `k`, unless it
 * is filtered out; `replace` for the start of a request's life (io_start). */
static __always_inline void note_issuer(struct rq_key *k, bool replace)
{
	struct issuer i = {};

	if (filtered_out())
		return;
	i.pid = bpf_get_current_pid_tgid() >> 32;
	bpf_get_current_comm(i.comm, sizeof(i.comm));
	bpf_map_update_elem(&issuers, k, &i, replace ? BPF_ANY : BPF_NOEXIST);
}

static __always_inline void issue(struct rq_key *k, __u32 dev, __u64 sector, __u32 bytes, char type)
{
	struct start s = {};
	struct start *old;
	struct issuer *i;

	if (filter_dev && dev != filter_dev)
		return;
	old = bpf_map_lookup_elem(&starts, k);
	if (old && old->requeued) {
		/* The same request issued again (after a partial completion, or the
		 * driver was busy): it keeps its first issue time, size and issuer. */
		old->requeued = 0;
		return;
	}
	i = bpf_map_lookup_elem(&issuers, k);
	if (i) {
		s.pid = i->pid;
		__builtin_memcpy(s.comm, i->comm, sizeof(s.comm));
	} else {
		/* Issued where it was submitted, or an issuer we did not see. */
		if (filtered_out())
			return;
		s.pid = bpf_get_current_pid_tgid() >> 32;
		bpf_get_current_comm(s.comm, sizeof(s.comm));
	}
	s.ts = bpf_ktime_get_ns();
	s.sector = sector == (__u64)-1 ? 0 : sector;
	s.bytes = bytes;
	s.left = bytes;
	s.dev = dev;
	s.type = type;
	/* An entry left without its requeue mark is stale (a completion never
	 * seen): replaced. */
	bpf_map_update_elem(&starts, k, &s, BPF_ANY);
}

static __always_inline void requeue(struct rq_key *k)
{
	struct start *s = bpf_map_lookup_elem(&starts, k);

	if (s)
		s->requeued = 1;
}

static __always_inline void report(struct start *s)
{
	struct disk_event *e = event_reserve(sizeof(*e));

	if (!e)
		return;
	e->ts = bpf_ktime_get_ns();
	e->lat_ns = e->ts - s->ts;
	e->sector = s->sector;
	e->bytes = s->bytes;
	e->dev = s->dev;
	e->pid = s->pid;
	__builtin_memcpy(e->comm, s->comm, sizeof(e->comm));
	e->type = s->type;
	event_submit(e, sizeof(*e));
}

/* A completion of `done` bytes of the request under `k`, of which `left` bytes
 * remained before it (keyed by address: the request tells). */
static __always_inline void complete_rq(struct rq_key *k, __u32 done, __u32 left)
{
	struct start *s = bpf_map_lookup_elem(&starts, k);

	if (!s)
		return; /* in flight before tracing began, or filtered out */
	if (done < left)
		return; /* a part: the request completes later */
	report(s);
	bpf_map_delete_elem(&starts, k);
	bpf_map_delete_elem(&issuers, k);
}

/* ---- tp_btf: typed arguments, fields through BTF pointers ---- */

struct request___old {
	struct gendisk *rq_disk; /* before Linux 5.17 */
} __attribute__((preserve_access_index));

static __always_inline __u32 rq_dev_btf(struct request *rq)
{
	struct gendisk *disk;

	if (bpf_core_field_exists(((struct request___old *)0)->rq_disk))
		disk = ((struct request___old *)rq)->rq_disk;
	else
		disk = rq->q->disk;
	if (!disk)
		return 0;
	return ((__u32)disk->major << MINORBITS) | (__u32)disk->first_minor;
}

static __always_inline struct request *issue_arg(__u64 *ctx)
{
	return (struct request *)(rq_arg ? ctx[1] : ctx[0]);
}

SEC("tp_btf/block_rq_issue")
int btf_issue(__u64 *ctx)
{
	struct request *rq = issue_arg(ctx);
	struct rq_key k = {(__u64)rq, 0};

	issue(&k, rq_dev_btf(rq), rq->__sector, rq->__data_len, type_of_op(rq->cmd_flags));
	return 0;
}

SEC("tp_btf/block_rq_complete")
int btf_complete(__u64 *ctx)
{
	struct request *rq = (struct request *)ctx[0];
	struct rq_key k = {(__u64)rq, 0};

	complete_rq(&k, (__u32)ctx[2], rq->__data_len);
	return 0;
}

SEC("tp_btf/block_rq_requeue")
int btf_requeue(__u64 *ctx)
{
	struct rq_key k = {(__u64)issue_arg(ctx), 0};

	requeue(&k);
	return 0;
}

SEC("tp_btf/block_rq_insert")
int btf_insert(__u64 *ctx)
{
	struct rq_key k = {(__u64)issue_arg(ctx), 0};

	note_issuer(&k, false);
	return 0;
}

SEC("tp_btf/block_io_start")
int btf_io_start(__u64 *ctx)
{
	struct rq_key k = {ctx[0], 0};

	note_issuer(&k, true);
	return 0;
}

/* ---- raw_tp: the same, fields read with bpf_probe_read_kernel ---- */

static __always_inline __u32 rq_dev_raw(struct request *rq)
{
	struct gendisk *disk;

	if (bpf_core_field_exists(((struct request___old *)0)->rq_disk))
		disk = BPF_CORE_READ((struct request___old *)rq, rq_disk);
	else
		disk = BPF_CORE_READ(rq, q, disk);
	if (!disk)
		return 0;
	return ((__u32)BPF_CORE_READ(disk, major) << MINORBITS) |
	       (__u32)BPF_CORE_READ(disk, first_minor);
}

SEC("raw_tp/block_rq_issue")
int raw_issue(__u64 *ctx)
{
	struct request *rq = issue_arg(ctx);
	struct rq_key k = {(__u64)rq, 0};

	issue(&k, rq_dev_raw(rq), BPF_CORE_READ(rq, __sector), BPF_CORE_READ(rq, __data_len),
	      type_of_op(BPF_CORE_READ(rq, cmd_flags)));
	return 0;
}

SEC("raw_tp/block_rq_complete")
int raw_complete(__u64 *ctx)
{
	struct request *rq = (struct request *)ctx[0];
	struct rq_key k = {(__u64)rq, 0};

	complete_rq(&k, (__u32)ctx[2], BPF_CORE_READ(rq, __data_len));
	return 0;
}

SEC("raw_tp/block_rq_requeue")
int raw_requeue(__u64 *ctx)
{
	struct rq_key k = {(__u64)issue_arg(ctx), 0};

	requeue(&k);
	return 0;
}

SEC("raw_tp/block_rq_insert")
int raw_insert(__u64 *ctx)
{
	struct rq_key k = {(__u64)issue_arg(ctx), 0};

	note_issuer(&k, false);
	return 0;
}

SEC("raw_tp/block_io_start")
int raw_io_start(__u64 *ctx)
{
	struct rq_key k = {ctx[0], 0};

	note_issuer(&k, true);
	return 0;
}

/* ---- classic tracepoints: records at fixed offsets, keyed by (dev, sector) ----
 * Every block_rq record begins: common fields (8 bytes), dev_t dev @8,
 * sector_t sector @16, unsigned int nr_sector @24, then bytes (issue) or error
 * (complete) @28. User space checks this against each format before loading. */

struct tp_block_rq {
	__u64 common;
	__u32 dev;
	__u32 pad;
	__u64 sector;
	__u32 nr_sector;
	__u32 bytes; /* block_rq_issue, block_rq_insert, block_io_start */
};

SEC("tracepoint/block/block_rq_issue")
int tp_issue(struct tp_block_rq *ctx)
{
	struct rq_key k = {ctx->dev, ctx->sector};
	/* Every candidate byte is read at a constant offset (the verifier refuses
	 * a ctx pointer moved by a variable), then the right pair is picked. */
	char b32 = *((char *)ctx + 32), b33 = *((char *)ctx + 33);
	char b34 = *((char *)ctx + 34), b35 = *((char *)ctx + 35);
	char c0 = issue_rwbs_off == 32 ? b32 : b34;
	char c1 = issue_rwbs_off == 32 ? b33 : b35;

	issue(&k, ctx->dev, ctx->sector, ctx->bytes, type_of_rwbs(c0, c1));
	return 0;
}

SEC("tracepoint/block/block_rq_complete")
int tp_complete(struct tp_block_rq *ctx)
{
	struct rq_key k = {ctx->dev, ctx->sector};
	struct start *s = bpf_map_lookup_elem(&starts, &k);
	__u32 done = ctx->nr_sector << SECTOR_SHIFT;
	struct start rest;

	if (!s)
		return 0;
	if (done && done < s->left) {
		/* A part: the rest of the request now starts further on. */
		rest = *s;
		rest.left -= done;
		bpf_map_delete_elem(&starts, &k);
		k.b += ctx->nr_sector;
		bpf_map_update_elem(&starts, &k, &rest, BPF_ANY);
		return 0;
	}
	report(s);
	bpf_map_delete_elem(&starts, &k);
	bpf_map_delete_elem(&issuers, &k);
	return 0;
}

/* After a partial completion the request's sector has advanced, as the entry's
 * key has (tp_complete). */
SEC("tracepoint/block/block_rq_requeue")
int tp_requeue(struct tp_block_rq *ctx)
{
	struct rq_key k = {ctx->dev, ctx->sector};

	requeue(&k);
	return 0;
}

SEC("tracepoint/block/block_rq_insert")
int tp_insert(struct tp_block_rq *ctx)
{
	struct rq_key k = {ctx->dev, ctx->sector};

	note_issuer(&k, false);
	return 0;
}

SEC("tracepoint/block/block_io_start")
int tp_io_start(struct tp_block_rq *ctx)
{
	struct rq_key k = {ctx->dev, ctx->sector};

	note_issuer(&k, true);
	return 0;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
