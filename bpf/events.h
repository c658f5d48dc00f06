/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/* Per-event records to user space through one ring buffer (common/src/data/events.rs
 * reads them as the skeleton's generated types). A record that finds the buffer
 * full is counted in `events_lost`, per CPU, and reported, never dropped silently.
 *
 * There is no perf-buffer fallback: ring buffers came in Linux 5.8, before every
 * other facility these tools rely on. The buffer is sized by user space before
 * load (a power of two, at least a page). */
#ifndef TRACEKIT_EVENTS_H
#define TRACEKIT_EVENTS_H

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 20);
} events SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} events_lost SEC(".maps");

/* Wake the reader each time a CPU has added this many bytes since its last
 * wakeup (set by user space to a sixteenth of the buffer over the CPUs, so no
 * more than that waits unseen; 0: at every record, as the kernel does by
 * default). The reader also looks every 100 ms, so a quiet trace is not held
 * back longer than that, and a busy one costs one wakeup per batch instead of
 * one per record. Counted per CPU rather than asking the ring how much waits:
 * that reads the reader's position, a cache line it keeps writing, at every
 * record; and a wakeup must not repeat for every record while a busy reader
 * lags (an interrupt each, a VM exit under virtualisation). */
const volatile __u64 events_wakeup_bytes = 0;

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} events_pending SEC(".maps");

/* The submit flags for a record of `size` bytes. */
static __always_inline __u64 event_flags(__u64 size)
{
	__u32 zero = 0;
	__u64 *n;

	if (!events_wakeup_bytes)
		return 0;
	n = bpf_map_lookup_elem(&events_pending, &zero);
	if (!n)
		return 0;
	*n += size + 8; /* with the kernel's record header */
	if (*n < events_wakeup_bytes)
		return BPF_RB_NO_WAKEUP;
	*n = 0;
	return BPF_RB_FORCE_WAKEUP;
}

/* Room for one record of `size` bytes, or NULL (counted as lost). */
static __always_inline void *event_reserve(__u64 size)
{
	void *e = bpf_ringbuf_reserve(&events, size, 0);

	if (!e) {
		__u32 zero = 0;
		__u64 *n = bpf_map_lookup_elem(&events_lost, &zero);

		if (n) /* atomic: a program of another type may interrupt this one */
			__sync_fetch_and_add(n, 1);
	}
	return e;
}

/* `size`: the record's, as reserved. */
static __always_inline void event_submit(void *e, __u64 size)
{
	bpf_ringbuf_submit(e, event_flags(size));
}

/* Copies a record of `size` bytes (bounded by the caller) into the buffer, for
 * records whose length varies (strings, stacks); counted as lost when full. */
static __always_inline void event_output(void *data, __u64 size)
{
	if (bpf_ringbuf_output(&events, data, size, event_flags(size))) {
		__u32 zero = 0;
		__u64 *n = bpf_map_lookup_elem(&events_lost, &zero);

		if (n)
			__sync_fetch_and_add(n, 1);
	}
}

#endif
