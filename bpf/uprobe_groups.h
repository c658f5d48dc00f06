/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/* Without uprobe_multi, the functions of a binary are grouped under one tracefs
 * uprobe event per group (one perf event, so one detach, for the whole group;
 * common/src/attach/uprobe_groups.rs). A group's cookie is
 * UPROBE_GROUP | group << 12; within a group no two functions share the low 12
 * bits of their file offset, which are those of their address in any process
 * (mappings are page aligned), so group and page offset of the probed address
 * find the probe. A return, whose instruction pointer is the caller's, cannot
 * be found that way: returns are grouped one group per binary and paired with
 * their entries by stack pointer instead (pairing.h). Include after regs.h and
 * <bpf/bpf_tracing.h>. */
#ifndef TRACEKIT_UPROBE_GROUPS_H
#define TRACEKIT_UPROBE_GROUPS_H

#define UPROBE_GROUP (1ULL << 63)

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1); /* resized to the number of user functions */
	__type(key, __u64);	/* group << 12 | page offset */
	__type(value, __u32);	/* probe index */
} uprobe_groups SEC(".maps");

/* The probe of a uprobe entry hit whose attach cookie is `cookie`: the cookie
 * itself, or for a group the function at the probed address (at a uprobe the
 * instruction pointer is that address). False for an address the group does
 * not hold. */
static __always_inline bool uprobe_entry_probe(struct pt_regs *ctx, __u64 cookie, __u32 *probe)
{
	__u64 key;
	__u32 *p;

	if (!(cookie & UPROBE_GROUP)) {
		*probe = cookie;
		return true;
	}
	key = (cookie & ~UPROBE_GROUP) | (PT_REGS_IP(ctx) & 0xfff);
	p = bpf_map_lookup_elem(&uprobe_groups, &key);
	if (!p)
		return false;
	*probe = *p;
	return true;
}

/* For a uretprobe hit with attach cookie `cookie`: the stack pointer its
 * function was entered with when it is of a group, for pair_pop() (x86-64's
 * `ret` has popped the return address, which the stack pointer pointed to at
 * entry); 0 otherwise (the cookie names the function). */
static __always_inline __u64 uprobe_return_sp(struct pt_regs *ctx, __u64 cookie)
{
	return cookie & UPROBE_GROUP ? PT_REGS_SP(ctx) - 8 : 0;
}

#endif /* TRACEKIT_UPROBE_GROUPS_H */
