/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/* Stack storage shared by the tools that record stacks: take_stack() copies the
 * current kernel or user stack and stores it by the 64-bit hash of its frames.
 * User space (common/src/data/stacks.rs) reads `stacks` by hash. */
#ifndef TRACEKIT_STACKS_H
#define TRACEKIT_STACKS_H

#define MAX_STACK_DEPTH 127

enum stack_kind { STACK_KERNEL, STACK_USER, STACK_KINDS };

/* A stack, stored by the 64-bit hash of its frames. A stack-trace map keeps one
 * stack per bucket and drops every event of a second stack hashing to it; a hash
 * map keyed by the full hash has no such collisions. It is preallocated: on-demand
 * allocation in tracing context fails under bursts of new stacks. */
struct stack {
	__u32 depth;
	__u32 first; /* the index in ip of the innermost frame: 0, or 1 (see add_entry_caller) */
	__u64 ip[MAX_STACK_DEPTH];
};

/* User stacks walked by the binaries' unwind tables (bpf/unwind.h) rather than
 * by frame pointers; set before load. */
const volatile bool unwind_tables = false;

#include "unwind.h"

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384); /* resized before load */
	__type(key, __u64);
	__type(value, struct stack);
} stacks SEC(".maps");

/* Per-CPU room to take a stack in, per kind. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, STACK_KINDS);
	__type(key, __u32);
	__type(value, struct stack);
} scratch SEC(".maps");

/* Stacks that could not be stored because `stacks` was full, per kind. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, STACK_KINDS);
	__type(key, __u32);
	__type(value, __u64);
} stacks_lost SEC(".maps");

/* At a function's entry the return address is at the stack pointer, not yet in
 * the frame chain: a frame-pointer walk from there skips the immediate caller
 * (the kernel repairs this since 6.12 only for functions that start with
 * `push %rbp`, not for frameless leaves). The walk was taken into ip[1..] with
 * ip[0] free, so the caller goes in without moving the other frames: the
 * function's own frame to ip[0], the caller to ip[1]. Returns where the stack
 * starts. (Moving the frames up one by one, as many as the walk gave, made the
 * verifier follow each frame's two cases: 25-50 ms per load on the host.) */
static __always_inline __u32 add_entry_caller(void *ctx, struct stack *s)
{
	__u64 ret = 0;

	if (bpf_probe_read_user(&ret, sizeof(ret), (void *)PT_REGS_SP((struct pt_regs *)ctx)) || !ret)
		return 1;
	if (s->depth >= 2 && s->ip[2] == ret)
		return 1;
	s->ip[0] = s->ip[1];
	s->ip[1] = ret;
	s->depth += 1;
	return 0;
}

/* Takes the current kernel or user stack and stores it; returns its hash, or 0
 * when there is no such stack or it could not be stored (counted in stacks_lost).
 * `at_entry`: ctx is a probe at a user function's entry (see add_entry_caller). */
static __always_inline __u64 take_stack(void *ctx, __u32 which, bool at_entry)
{
	__u64 h = 0xcbf29ce484222325ULL; /* FNV-1a over whole frames */
	struct stack *s;
	__u32 first = 0;
	long n;

	s = bpf_map_lookup_elem(&scratch, &which);
	if (!s)
		return 0;
	at_entry = at_entry && which == STACK_USER;
	if (which == STACK_USER && unwind_tables) {
		n = unwind_user(s->ip, 1) * sizeof(__u64);
		at_entry = false; /* the tables know where a function's caller is */
	} else if (at_entry)
		n = bpf_get_stack(ctx, &s->ip[1], sizeof(s->ip) - sizeof(s->ip[0]), BPF_F_USER_STACK);
	else
		n = bpf_get_stack(ctx, s->ip, sizeof(s->ip), which == STACK_USER ? BPF_F_USER_STACK : 0);
	if (n <= 0)
		return 0; /* e.g. the user stack of a kernel thread */
	s->depth = n / sizeof(__u64);
	if (at_entry)
		first = add_entry_caller(ctx, s);
	s->first = first;
	for (int i = 0; i < MAX_STACK_DEPTH; i++) {
		if (i >= s->depth || first + i >= MAX_STACK_DEPTH)
			break;
		h = (h ^ s->ip[first + i]) * 0x100000001b3ULL;
	}
	h = (h ^ s->depth) | 1; /* never 0, which means "no stack" */
	if (bpf_map_lookup_elem(&stacks, &h))
		return h;
	if (bpf_map_update_elem(&stacks, &h, s, BPF_NOEXIST) && !bpf_map_lookup_elem(&stacks, &h)) {
		__u64 *lost = bpf_map_lookup_elem(&stacks_lost, &which);

		if (lost)
			*lost += 1;
		return 0;
	}
	return h;
}

#endif
