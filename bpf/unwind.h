/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/* The user stack walk for code built without frame pointers, in the kernel.
 *
 * User space (common/src/object/unwind.rs) turns each executable file's call
 * frame information (.eh_frame, .debug_frame) into a sorted table of rows
 * (common/src/user/cfi.rs): from an address on, how to find the canonical
 * frame address (CFA) from rsp or rbp, and where the caller's rbp was saved.
 * Each file's rows are an array map of their own in `unwind_files`; each
 * traced process' executable mappings are prefixes of (tgid, address) in the
 * LPM trie `unwind_mappings`, giving the file and its load bias. unwind_user()
 * starts from the registers the task had when it entered the kernel (a
 * uprobe's included) and, frame by frame in a bpf_loop: finds the mapping,
 * binary-searches the row, computes the CFA, reads the return address at
 * CFA-8 and the saved rbp. Code no table covers (JIT, anonymous memory, a
 * mapping not loaded yet) takes one frame-pointer step instead.
 *
 * The result is the frames, innermost first, as bpf_get_stack() gives them,
 * and whether the walk reached the outermost frame (_start, a thread's start)
 * or was cut short. A process whose tables are not loaded yet is announced on
 * `unwind_requests` once, and its stacks counted in `unwind_stats` until they
 * are (the run says how many). The per-event cost is a few map lookups per
 * frame and one or two 8-byte reads of user memory; nothing is copied to user
 * space. */
#ifndef TRACEKIT_UNWIND_H
#define TRACEKIT_UNWIND_H

/* How a row finds the CFA, and how it recovers rbp (common/src/user/cfi.rs). */
#define CFA_UNKNOWN 0
#define CFA_RSP 1
#define CFA_RBP 2
#define CFA_PLT 3
#define CFA_SIGNAL 4
#define CFA_END 5
#define CFA_RBP_DEREF 6
#define RBP_SAME 0
#define RBP_AT_CFA 1
#define RBP_UNDEFINED 2

/* No table: a mapping known to have none (anonymous code) walks by rbp. */
#define UNWIND_NO_FILE 0xffffffffu

struct uw_row {
	__u32 pc;
	__u8 cfa;
	__u8 rbp;
	__u16 pad;
	__s32 cfa_off;
	__s32 rbp_off;
};

/* Template of each file's rows; user space makes each at its own size. */
struct uw_rows {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_INNER_MAP);
	__uint(max_entries, 1);
	/* Sizes, not types: clang emits only a declaration of a type an inner
	 * map's pointer names, and libbpf cannot size that. */
	__uint(key_size, sizeof(__u32));
	__uint(value_size, sizeof(struct uw_row));
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY_OF_MAPS);
	__uint(max_entries, 4096); /* resized before load */
	__type(key, __u32);
	__array(values, struct uw_rows);
} unwind_files SEC(".maps");

/* Per file: its rows (the binary search's bound) and its build ID, which
 * names trace's frames as the kernel's build-ID walk does (zero: none). */
struct uw_file {
	__u32 rows;
	__u8 build_id[20];
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 4096); /* as unwind_files */
	__type(key, __u32);
	__type(value, struct uw_file);
} unwind_file_info SEC(".maps");

/* tgid and address big-endian, as an LPM trie compares keys bytewise. */
struct uw_map_key {
	__u32 prefixlen;
	__u32 tgid;
	__u64 addr;
};

struct uw_map {
	__u32 file; /* index in unwind_files, or UNWIND_NO_FILE */
	__u32 pad;
	__u64 bias; /* the file's address = the process' address - bias */
	__u64 off_bias; /* the file offset = the process' address - off_bias */
	__u64 start, end; /* the whole mapping, of which a prefix is a part */
};

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 262144); /* resized before load */
	__type(key, struct uw_map_key);
	__type(value, struct uw_map);
} unwind_mappings SEC(".maps");

/* Per process: UNWIND_PROC_ASKED from its first walk until user space has
 * loaded its mappings (UNWIND_PROC_READY); UNWIND_PROC_STALE when a walk met an
 * address no mapping holds (a dlopen since), asked again once. */
#define UNWIND_PROC_ASKED 0
#define UNWIND_PROC_READY 1
#define UNWIND_PROC_STALE 2

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32);
	__type(value, __u32);
} unwind_procs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 64 * 1024);
} unwind_requests SEC(".maps");

/* Counters (per CPU), for the run's report. */
enum uw_stat {
	UNWIND_STACKS,	   /* user stacks walked */
	UNWIND_EARLY,	   /* of a process whose tables were not loaded yet */
	UNWIND_TRUNCATED, /* cut short: no rule and no frame pointer, a read failed, too deep */
	UNWIND_FP_FRAMES, /* frames found by the frame-pointer step */
	UNWIND_STATS,
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, UNWIND_STATS);
	__type(key, __u32);
	__type(value, __u64);
} unwind_stats SEC(".maps");

static __always_inline void unwind_count(__u32 which)
{
	__u64 *n = bpf_map_lookup_elem(&unwind_stats, &which);

	if (n)
		*n += 1;
}

struct uw_state {
	__u64 pc, sp, bp;
	__u64 *ip;	/* the frames' room: MAX_STACK_DEPTH frames (see unwind_put) */
	__u32 n;	/* frames taken */
	__u32 tgid;
	/* The last frame's mapping: the next frame is most often in the same
	 * file, and an LPM trie lookup walks a node per differing bit. */
	struct uw_map map;
	bool have_map;
	bool exact;	/* pc is where the code is, not a return address */
	bool ended;	/* reached the outermost frame */
	bool cut;	/* stopped without reaching it */
	bool early;	/* the process' tables were not loaded */
};

/* Frame n: a bare address (stride 1), or (stride 4) a struct
 * bpf_stack_build_id: the build ID and file offset where the file `m` maps
 * has a build ID (`f`), else the address (status BPF_STACK_BUILD_ID_IP).
 * `stride` is a constant at each use: the verifier sees one layout. */
static __always_inline void unwind_put(struct uw_state *st, __u32 n, __u64 pc, __u32 stride,
				       struct uw_map *m, struct uw_file *f)
{
	if (n >= MAX_STACK_DEPTH)
		return;
	if (stride != 4) {
		st->ip[n] = pc;
		return;
	}
	if (m && f && (f->build_id[0] | f->build_id[1] | f->build_id[2] | f->build_id[3])) {
		__u8 *b = (__u8 *)&st->ip[n * 4];

		*(__s32 *)b = 1; /* BPF_STACK_BUILD_ID_VALID */
		__builtin_memcpy(b + 4, f->build_id, 20);
		st->ip[n * 4 + 3] = pc - m->off_bias;
	} else {
		st->ip[n * 4] = 2; /* BPF_STACK_BUILD_ID_IP */
		st->ip[n * 4 + 1] = 0;
		st->ip[n * 4 + 2] = 0;
		st->ip[n * 4 + 3] = pc;
	}
}

static __always_inline void unwind_ask(__u32 tgid, __u32 state)
{
	__u32 *t = bpf_ringbuf_reserve(&unwind_requests, sizeof(*t), 0);

	if (t) {
		*t = tgid;
		bpf_ringbuf_submit(t, 0);
	}
}

/* Rows found lately, per CPU, by file and address: the binary search below is a
 * helper call per halving (an inner map's lookups are not inlined), about 17
 * for libc, at each frame of each stack; the same return addresses come back in
 * every sample of a stack. A file's rows never change (its index is never
 * reused), so an entry is never stale; `check` covers the rest, so an entry
 * torn by a program that interrupted its writing (an NMI's) is no hit. */
struct uw_cached {
	__u32 file;
	__u32 rel;
	struct uw_row row;
	__u64 check;
};

#define UNWIND_ROW_CACHE 1024

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, UNWIND_ROW_CACHE);
	__type(key, __u32);
	__type(value, struct uw_cached);
} unwind_row_cache SEC(".maps");

static __always_inline __u64 unwind_check(__u32 file, __u32 rel, struct uw_row *r)
{
	__u64 h = ((__u64)file << 32 | rel) * 0x9e3779b97f4a7c15ULL;

	h ^= ((__u64)r->pc << 32 | (__u64)r->cfa << 8 | r->rbp) * 0xc2b2ae3d27d4eb4fULL;
	h ^= ((__u64)(__u32)r->cfa_off << 32 | (__u32)r->rbp_off) * 0x165667b19e3779f9ULL;
	return h | 1;
}

/* The row of `rel` in `file` (of `info`), copied to `out`; false for none. */
static __always_inline bool unwind_row_of(__u32 file, struct uw_file *info, __u64 rel,
					  struct uw_row *out)
{
	__u32 lo = 0, hi, slot;
	struct uw_cached *c;
	void *rows;

	if (rel > 0xffffffffULL)
		return false;
	slot = ((__u32)rel * 0x85ebca6bU ^ file * 0x9e3779b1U) & (UNWIND_ROW_CACHE - 1);
	c = bpf_map_lookup_elem(&unwind_row_cache, &slot);
	if (c && c->file == file && c->rel == (__u32)rel) {
		__u64 check = c->check;

		__builtin_memcpy(out, &c->row, sizeof(*out));
		if (check == unwind_check(file, (__u32)rel, out))
			return true;
	}
	rows = bpf_map_lookup_elem(&unwind_files, &file);
	if (!info || !rows || !info->rows)
		return false;
	hi = info->rows;
	/* The last row whose pc <= rel; 24 halvings cover 16M rows. */
	for (int k = 0; k < 24; k++) {
		__u32 mid;
		struct uw_row *r;

		if (lo + 1 >= hi)
			break;
		mid = lo + (hi - lo) / 2;
		r = bpf_map_lookup_elem(rows, &mid);
		if (!r)
			return false;
		if (r->pc <= (__u32)rel)
			lo = mid;
		else
			hi = mid;
	}
	{
		struct uw_row *r = bpf_map_lookup_elem(rows, &lo);

		if (!r || r->pc > (__u32)rel)
			return false;
		__builtin_memcpy(out, r, sizeof(*out));
	}
	if (c) {
		/* The check last, and cleared first: a reader that interrupts this
		 * sees no entry, or a whole one. */
		c->check = 0;
		c->file = file;
		c->rel = (__u32)rel;
		__builtin_memcpy(&c->row, out, sizeof(*out));
		c->check = unwind_check(file, (__u32)rel, out);
	}
	return true;
}

static __always_inline bool unwind_read(__u64 *v, __u64 addr)
{
	return bpf_probe_read_user(v, sizeof(*v), (void *)addr) == 0;
}

/* One frame-pointer step: rbp points at the saved rbp, the return address
 * above it. */
static __always_inline long unwind_fp_step(struct uw_state *st)
{
	__u64 ra = 0, bp = 0;

	if (!st->bp || st->bp < st->sp || !unwind_read(&bp, st->bp) || !unwind_read(&ra, st->bp + 8)) {
		st->cut = true;
		return 1;
	}
	unwind_count(UNWIND_FP_FRAMES);
	st->sp = st->bp + 16;
	st->bp = bp;
	st->pc = ra;
	st->exact = false;
	return 0;
}

static __always_inline long unwind_step(struct uw_state *st, __u32 stride)
{
	struct uw_map_key key;
	struct uw_file *info = NULL;
	struct uw_map *m;
	struct uw_row row, *r;
	__u64 look, cfa, ra = 0, bp;
	__u32 n = st->n;

	if (!st->pc) {
		st->ended = true; /* a zero return address: nothing called this frame */
		return 1;
	}
	if (n >= MAX_STACK_DEPTH) {
		st->cut = true;
		return 1;
	}
	/* A return address is after its call: look up the call itself. */
	look = st->exact ? st->pc : st->pc - 1;

	if (st->have_map && look >= st->map.start && look < st->map.end) {
		m = &st->map;
	} else {
		key.prefixlen = 96;
		key.tgid = __builtin_bswap32(st->tgid);
		key.addr = __builtin_bswap64(look);
		m = bpf_map_lookup_elem(&unwind_mappings, &key);
		if (m) {
			__builtin_memcpy(&st->map, m, sizeof(st->map));
			st->have_map = true;
			m = &st->map;
		}
	}
	if (m && m->file != UNWIND_NO_FILE)
		info = bpf_map_lookup_elem(&unwind_file_info, &m->file);
	unwind_put(st, n, st->pc, stride, m, info);
	st->n = n + 1;
	if (!m) {
		__u32 *state = bpf_map_lookup_elem(&unwind_procs, &st->tgid);

		/* An address no mapping holds: a library loaded since, or code in
		 * anonymous memory user space has not seen yet. Asked once. */
		if (state && *state == UNWIND_PROC_READY) {
			*state = UNWIND_PROC_STALE;
			unwind_ask(st->tgid, UNWIND_PROC_STALE);
		}
		return unwind_fp_step(st);
	}
	if (m->file == UNWIND_NO_FILE)
		return unwind_fp_step(st);
	if (!unwind_row_of(m->file, info, look - m->bias, &row))
		return unwind_fp_step(st);
	r = &row;

	switch (r->cfa) {
	case CFA_END:
		st->ended = true;
		return 1;
	case CFA_SIGNAL:
		/* rt_sigframe at rsp: its ucontext's saved rbp, rsp and rip. */
		if (!unwind_read(&bp, st->sp + 120) || !unwind_read(&cfa, st->sp + 160) ||
		    !unwind_read(&ra, st->sp + 168)) {
			st->cut = true;
			return 1;
		}
		st->bp = bp;
		st->sp = cfa;
		st->pc = ra;
		st->exact = true; /* where the signal came, not a return address */
		return 0;
	case CFA_RSP:
		cfa = st->sp + r->cfa_off;
		break;
	case CFA_RBP:
		cfa = st->bp + r->cfa_off;
		break;
	case CFA_RBP_DEREF:
		if (!unwind_read(&cfa, st->bp + r->cfa_off)) {
			st->cut = true;
			return 1;
		}
		break;
	case CFA_PLT:
		cfa = st->sp + 8 + ((st->pc & 15) >= (__u64)r->cfa_off ? 8 : 0);
		break;
	default:
		return unwind_fp_step(st);
	}
	if (cfa <= st->sp) {
		st->cut = true; /* a CFA below the stack pointer is no caller's */
		return 1;
	}
	if (r->rbp == RBP_AT_CFA && r->rbp_off == -16) {
		/* A frame of `push %rbp` at entry: rbp and the return address
		 * side by side, in one read of user memory instead of two. */
		__u64 pair[2];

		if (bpf_probe_read_user(pair, sizeof(pair), (void *)(cfa - 16))) {
			st->cut = true;
			return 1;
		}
		st->bp = pair[0];
		ra = pair[1];
	} else if (!unwind_read(&ra, cfa - 8)) {
		st->cut = true;
		return 1;
	} else if (r->rbp == RBP_AT_CFA) {
		if (!unwind_read(&bp, cfa + r->rbp_off)) {
			st->cut = true;
			return 1;
		}
		st->bp = bp;
	} else if (r->rbp == RBP_UNDEFINED) {
		st->bp = 0;
	}
	st->sp = cfa;
	st->pc = ra;
	st->exact = false;
	return 0;
}

/* bpf_loop's callbacks, one per frame layout. */
static long unwind_step_ips(__u32 i, void *st)
{
	return unwind_step(st, 1);
}

static long unwind_step_frames(__u32 i, void *st)
{
	return unwind_step(st, 4);
}

/* The frame that stands for "cut short here" (common/src/data/stacks.rs CUT). */
#define UNWIND_CUT 0xffffffffffffffffULL

/* Walks the current task's user stack into ip (MAX_STACK_DEPTH frames of
 * `stride` words, see unwind_put); returns the number of frames (0: no user
 * context, e.g. a kernel thread). A walk that stopped short of the outermost
 * frame ends with the frame UNWIND_CUT where there is room. */
static __always_inline __u32 unwind_user(__u64 *ip, __u32 stride)
{
	const struct tk_pt_regs *regs;
	struct uw_state st = {};
	__u32 *state;

	/* The registers saved at the task's entry to the kernel (a uprobe's are
	 * its trap's), read as bpf/regs.h's struct: no CO-RE relocation. */
	regs = (const struct tk_pt_regs *)bpf_task_pt_regs(bpf_get_current_task_btf());
	if (!regs || (regs->cs & 3) != 3)
		return 0; /* a kernel thread has no user context */
	st.pc = regs->ip;
	st.sp = regs->sp;
	st.bp = regs->bp;
	st.ip = ip;
	st.exact = true;
	st.tgid = bpf_get_current_pid_tgid() >> 32;
	unwind_count(UNWIND_STACKS);

	state = bpf_map_lookup_elem(&unwind_procs, &st.tgid);
	if (!state) {
		__u32 asked = UNWIND_PROC_ASKED;

		if (bpf_map_update_elem(&unwind_procs, &st.tgid, &asked, BPF_NOEXIST) == 0)
			unwind_ask(st.tgid, UNWIND_PROC_ASKED);
		st.early = true;
	} else if (*state != UNWIND_PROC_READY) {
		/* Asked, or stale (it mapped code since, or exec'd): being loaded. */
		st.early = true;
	}
	if (stride == 4)
		bpf_loop(MAX_STACK_DEPTH + 1, unwind_step_frames, &st, 0);
	else
		bpf_loop(MAX_STACK_DEPTH + 1, unwind_step_ips, &st, 0);
	if (st.early && !st.ended)
		unwind_count(UNWIND_EARLY);
	else if (!st.ended)
		unwind_count(UNWIND_TRUNCATED);
	if (!st.ended && st.n < MAX_STACK_DEPTH) {
		unwind_put(&st, st.n, UNWIND_CUT, stride, NULL, NULL);
		st.n++;
	}
	return st.n;
}

#endif
