/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/* Log2 histograms with BCC's slots (common/src/output/hist.rs prints them): slot i holds
 * [2^(i-1), 2^i - 1], slot 1 also holds 0, so slot = floor(log2 v) + 1; the last
 * slot, 63, also takes everything above (2^62 ns is 146 years). One row is 64
 * slots plus the total and count that funclatency's avg line needs. */
#ifndef TRACEKIT_HIST_H
#define TRACEKIT_HIST_H

#define LOG2_SLOTS 64

struct log2_hist {
	__u64 slots[LOG2_SLOTS];
	__u64 total; /* sum of the values, in nanoseconds */
	__u64 count;
};

/* floor(log2 v) + 1 for v >= 1, and 1 for v == 0: a branch-light binary search
 * (the BPF backend has no count-leading-zeros instruction). */
static __always_inline __u32 log2_slot(__u64 v)
{
	__u32 r = 0, s;

	if (v <= 1)
		return 1;
	s = (v > 0xffffffffULL) << 5; v >>= s; r |= s;
	s = (v > 0xffff) << 4; v >>= s; r |= s;
	s = (v > 0xff) << 3; v >>= s; r |= s;
	s = (v > 0xf) << 2; v >>= s; r |= s;
	s = (v > 0x3) << 1; v >>= s; r |= s;
	r |= (v >> 1);
	return r + 1;
}

/* Adds one measurement: `ns` counts toward the total, `v` (ns in the display
 * unit) picks the slot. h is a per-CPU row, so no atomics are needed. */
static __always_inline void hist_add(struct log2_hist *h, __u64 ns, __u64 v)
{
	__u32 slot = log2_slot(v);

	if (slot > LOG2_SLOTS - 1)
		slot = LOG2_SLOTS - 1;
	/* Hide the clamp from the compiler, so the mask stays in the code on the
	 * register used as the index: older verifiers (6.1) lose a bound checked on
	 * a copy. */
	barrier_var(slot);
	h->slots[slot & (LOG2_SLOTS - 1)] += 1;
	h->total += ns;
	h->count += 1;
}

#endif
