// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/* trace: one record per probe hit, with values and a filter chosen at run time.
 *
 * No code is generated at run time: user space (tools/trace/) parses each probe
 * spec into a small bytecode program (struct spec) that this object interprets,
 * bounded (bpf_loop over at most MAX_INSNS instructions) and verified once:
 *
 *   inputs    registers, retval, $pid..., USDT arguments, the tracepoint record,
 *             gathered once per hit into per-CPU scratch;
 *   program   pushes and combines 64-bit values (arithmetic, comparisons, memory
 *             loads, STRCMP); FILTER drops the hit when the predicate is false
 *             (nothing reaches user space); VAL and STR store the values of the
 *             format's arguments into the record;
 *   record    header, values, strings, optional stacks, one ring buffer for all.
 *
 * The probe's attach cookie indexes `probes`, which names the specs (up to
 * MAX_SPECS) served at that site: `p:` specs emit at entry, `r:` specs at the
 * return, with the entry's argument registers saved per call (pairing.h), so a
 * return sees its own call's arguments under nesting and recursion.
 *
 * A probe whose one spec's predicate is one register compared with a constant
 * (after at most one arithmetic step) has a gate (struct gate): a hit reads that
 * register from ctx and is decided before anything else, so a dropped hit reads
 * no pid, no scratch and copies no argument. A one-probe run's gate is set before
 * load (the_gate): the verifier keeps only the branches its values take.
 *
 * Kernel memory is read only when `kernel_reads` is set (not under lockdown=
 * confidentiality): the verifier prunes those paths otherwise, so tracepoint,
 * uprobe and USDT programs load on locked-down kernels. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "regs.h"
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include <bpf/usdt.bpf.h>
#include "filter.h"
#include "events.h"
#define PAIR_ARGS 6
#define PAIR_DEPTH 16	/* keep in step with PAIR_DEPTH in tools/trace/main.rs */
#include "pairing.h"

/* Keep in step with tools/trace/compile.rs. */
#define MAX_INSNS 128
#define MAX_VALS 16
#define MAX_SPECS 4
#define NIN 32
#define EVAL_STACK 16
#define REC_MAX 512
#define LIT_MAX 128
#define LITS 256
#define STR_AREA 4096
#define STACK_BYTES (127 * 8)
/* The user stack's room: 127 frames of struct bpf_stack_build_id. */
#define USTACK_BYTES (127 * 32)

enum op {
	OP_CONST = 1,	/* push imm */
	OP_IN,		/* push in[a] */
	OP_REC,		/* push the record's field at a (size, b: signed) */
	OP_LOAD,	/* pop address, push the `size` bytes there (b: space | signed) */
	OP_BIN,		/* pop y, pop x, push x <a> y */
	OP_UN,		/* pop x, push <a> x */
	OP_CAST,	/* truncate to `size` bytes, sign-extend when b */
	OP_FILTER,	/* pop; drop the hit when 0 */
	OP_VAL,		/* pop into value a */
	OP_STR,		/* pop address, copy the string there (space b) to offset imm */
	OP_STRCMP,	/* pop address, push whether the string there (space b) equals
			 * literal a (a offset in lits, size: its length); with
			 * b & RAW, whether the size bytes there are the literal's */
};

enum space { SPACE_USER, SPACE_KERNEL, SPACE_REC, SPACE_DATALOC };
#define SIGNED 0x10
#define RAW 0x20	/* OP_STRCMP under -B: bytes as they are, not a string */

enum bin {
	B_ADD, B_SUB, B_MUL, B_DIV, B_MOD, B_SDIV, B_SMOD, B_AND, B_OR, B_XOR, B_SHL,
	B_SHR, B_SAR, B_EQ, B_NE, B_LTU, B_LEU, B_GTU, B_GEU, B_LTS, B_LES, B_GTS,
	B_GES, B_LAND, B_LOR,
};

enum un { U_NOT, U_NEG, U_BNOT };

/* Inputs: argument registers, then these. */
enum input {
	IN_RETVAL = 6, IN_TID, IN_TGID, IN_UID, IN_GID, IN_CPU, IN_USDT0,
	IN_USDT_LAST = IN_USDT0 + 11,
};

struct tk_insn {
	__u8 op;
	__u8 size;
	__u8 b;
	__u8 pad;
	__u32 a;
	__s64 imm;
};

/* Spec flags. */
#define F_RETURN 1	/* emits at the function's return */
#define F_SYSCALL 2	/* __x64_sys_* wrapper: arguments in the inner pt_regs */
#define F_IDS 4		/* reads $uid, $gid or $cpu */
#define F_FAST_PRED 8	/* the predicate is `pred`, run before anything else */
#define F_FAST_VALS 16	/* the values are the `fast` copies: no interpreter */
#define F_GATE 32	/* specs_of only: `gate` decides a function hit first */
#define F_ENTRY_ARGS 64	/* specs_of only: a return spec reads the entry's arguments */

/* A plain value: an input or a record field, truncated/extended to `size`. */
#define OPD_IN 1
#define OPD_REC 2
struct tk_operand {
	__u8 src;
	__u8 size;
	__u8 sign;
	__u8 val;	/* the value it is stored to (fast values) */
	__u32 a;	/* input index, or record offset */
};

#define NO_OP 0xff
#define CMP_LT 1
#define CMP_EQ 2
#define CMP_GT 4
#define CMP_SIGNED 8

/* Most specs are an operand compared with a constant and operands copied into
 * values. User space (compile.rs) recognises those shapes in the bytecode and
 * describes them here too, so a hit runs them straight-line, without a
 * bpf_loop callback per instruction; a dropped hit then costs a few loads. */
struct spec {
	__u32 flags;
	__u32 ninsns;
	__u32 usdt_mask;	/* USDT arguments read (bit n: argument n+1) */
	__u32 rec_words;	/* 8-byte words of the tracepoint record to copy */
	__u32 str_bytes;	/* bytes of strings in the record */
	__u32 body;		/* the predicate's instructions: the values start here */
	__u32 nvals;		/* values in the record */
	__u32 nfast;		/* F_FAST_VALS: entries of `fast` */
	/* F_FAST_PRED: v = pred, then v = pop[0](v, pimm[0]) (an arithmetic
	 * B_*, or NO_OP), then keep the hit when v compares with pimm[1] as pop[1]
	 * keeps (CMP_*). */
	struct tk_operand pred;
	__u8 pop[2];
	__u8 pad[6];
	__s64 pimm[2];
	struct tk_operand fast[MAX_VALS];
	struct tk_insn insns[MAX_INSNS];
	char lits[LITS + LIT_MAX];
};

/* F_GATE: a function probe's only spec has a fast predicate on one register
 * (an argument, or retval at a return), copied here by user space. A hit reads
 * that register from ctx and is decided before anything else: a dropped hit
 * costs no pid read, no spec or scratch lookup and no copy of the arguments. */
struct gate {
	__u8 reg;	/* argument 0..5, or IN_RETVAL */
	__u8 shift;	/* the operand's narrowing: 64 - 8 * size, or 0 */
	__u8 sign;
	__u8 op;	/* as spec.pop */
	__u8 keep;
	__u8 pad[3];
	__s64 imm[2];	/* as spec.pimm */
};

/* The specs of a probe, with what they need from a hit precomputed by user
 * space (no spec lookups to find out). */
struct specs_of {
	__u32 n;
	__u32 spec[MAX_SPECS];
	__u32 flags;		/* the specs' flags, or-ed, and F_GATE */
	__u32 usdt_mask;	/* or-ed */
	__u32 rec_words;	/* the largest */
	struct gate gate;
};

struct tk_event {
	__u64 ts;
	__u32 probe;
	__u32 spec;
	__u32 tgid;
	__u32 tid;
	__u32 uid;
	__u32 cpu;
	__u32 str_bytes;
	__s32 kstack;	/* bytes of kernel stack after the strings, or -errno */
	__s32 ustack;	/* bytes of user stack after that, or -errno */
	__u32 pad;
	char comm[16];
	__u64 vals[MAX_VALS];
	__u8 tail[2 * STR_AREA + 2 * STACK_BYTES];
};

_Static_assert(STR_AREA + STACK_BYTES + USTACK_BYTES <= sizeof(((struct tk_event *)0)->tail),
	       "the tail holds the strings and both stacks");

struct scratch {
	__u64 in[NIN];
	__u64 st[EVAL_STACK];
	/* The interpreter's state lives here, not on the stack: a value loaded
	 * from a map is not tracked precisely, so the verifier's walk of the
	 * bpf_loop callback converges at once instead of per step. */
	__u32 top;
	__u32 drop;
	__u32 pc0;	/* the first instruction to run */
	__u32 pad;
	__u64 regs[32];
	__u8 rec[REC_MAX + 16];
	char lit[STR_AREA];
	struct tk_event ev;
};

/* Set before load. */
const volatile bool kernel_reads = false;
#include "syscalls.h"
const volatile __u32 self_tgid = 0;	/* not traced (-S unset) */
const volatile __u32 filter_tid = 0;	/* -L */
const volatile __s64 filter_uid = -1;	/* --uid */
const volatile __u32 str_size = 80;	/* -Z */
const volatile bool want_kstack = false; /* -K */
const volatile bool want_ustack = false; /* -U */
/* -U frames as build ID + file offset (struct bpf_stack_build_id, 32 bytes). */
const volatile bool ustack_build_id = false;
const volatile bool want_extras = true;	/* the header's ts, uid and cpu (-t, -C, --json) */
const volatile bool want_stats = true;	/* -v: hits and drops counted per spec */
const volatile bool one_probe = false;	/* the run has one probe: its index is 0 */
/* A one-probe run whose one spec has a gate gets it here, set before load
 * (GATE_ENTRY or GATE_RETURN in gate_at): the verifier knows these values, so
 * it keeps only the branches they take, and a dropped hit reads no map. */
#define GATE_ENTRY 1
#define GATE_RETURN 2
const volatile __u8 gate_at = 0;
const volatile struct gate the_gate = {};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1); /* resized to the number of specs */
	__type(key, __u32);
	__type(value, struct spec);
} specs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1); /* resized to the number of probes */
	__type(key, __u32);
	__type(value, struct specs_of);
} probes SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct scratch);
} scratch SEC(".maps");

/* Per spec: [0] hits that passed the predicate, [1] hits dropped by it (one
 * counter touched per hit). Returns not paired are in pairing_lost. */
#define STATS 2
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, STATS); /* resized to STATS x specs */
	__type(key, __u32);
	__type(value, __u64);
} stats SEC(".maps");

static __always_inline void stat(__u32 spec, __u32 what)
{
	__u32 k = spec * STATS + what;
	__u64 *n;

	if (!want_stats)
		return;
	n = bpf_map_lookup_elem(&stats, &k);

	if (n)
		*n += 1;
}

/* The probe a hit is of: its attach cookie, not read (a helper call per hit)
 * when the run has one probe. */
static __always_inline __u64 probe_of(void *ctx)
{
	return one_probe ? 0 : bpf_get_attach_cookie(ctx);
}

static __always_inline bool skip_task(void)
{
	__u64 id = bpf_get_current_pid_tgid();

	if (filtered_out_id(id))
		return true;
	if (self_tgid && (id >> 32) == self_tgid)
		return true;
	if (filter_tid && (__u32)id != filter_tid)
		return true;
	if (filter_uid >= 0 && (__u32)bpf_get_current_uid_gid() != (__u32)filter_uid)
		return true;
	return false;
}

struct run {
	struct scratch *sc;
	struct spec *sp;
};

static __always_inline __u64 extend(__u64 v, __u32 size, bool sign)
{
	__u32 shift = 64 - 8 * (size & 15);

	if (size >= 8 || size == 0)
		return v;
	v <<= shift;
	return sign ? (__u64)((__s64)v >> shift) : v >> shift;
}

static __always_inline __u64 load(__u64 addr, __u32 size, __u32 space, bool *ok)
{
	__u64 v = 0;
	long err = -1;
	void *p = (void *)addr;

	if (space == SPACE_USER) {
		switch (size) {
		case 1: err = bpf_probe_read_user(&v, 1, p); break;
		case 2: err = bpf_probe_read_user(&v, 2, p); break;
		case 4: err = bpf_probe_read_user(&v, 4, p); break;
		default: err = bpf_probe_read_user(&v, 8, p); break;
		}
	} else if (space == SPACE_KERNEL && kernel_reads) {
		switch (size) {
		case 1: err = bpf_probe_read_kernel(&v, 1, p); break;
		case 2: err = bpf_probe_read_kernel(&v, 2, p); break;
		case 4: err = bpf_probe_read_kernel(&v, 4, p); break;
		default: err = bpf_probe_read_kernel(&v, 8, p); break;
		}
	}
	*ok = err == 0;
	return err ? 0 : v;
}

/* The record's bytes at `off` (bounded). */
static __always_inline __u64 rec_field(struct scratch *sc, __u32 off, __u32 size, bool sign)
{
	__u64 v = 0;

	off &= REC_MAX - 1;
	switch (size) {
	case 1: v = *(__u8 *)&sc->rec[off]; break;
	case 2: v = *(__u16 *)&sc->rec[off]; break;
	case 4: v = *(__u32 *)&sc->rec[off]; break;
	default: v = *(__u64 *)&sc->rec[off]; break;
	}
	return extend(v, size, sign);
}

struct copy {
	struct scratch *sc;
	char *dst;
	__u32 off;
	__u32 max;
	bool raw;	/* go on past a NUL */
};

static long copy_byte(__u64 i, struct copy *c)
{
	__u32 o = c->off + i;
	__u32 d = i;
	char ch;

	d &= STR_AREA - 1;
	if (i + 1 >= c->max || o >= REC_MAX) {
		c->dst[d] = 0;
		return 1;
	}
	o &= REC_MAX - 1;
	ch = c->sc->rec[o];
	c->dst[d] = ch;
	return ch || c->raw ? 0 : 1;
}

/* Copies a NUL-terminated string of at most `max` bytes (max >= 1) from the
 * record at `off` to dst (one bpf_loop: verified once, not per byte). */
static __always_inline void rec_string(struct scratch *sc, __u32 off, __u32 max, char *dst)
{
	struct copy c = { .sc = sc, .dst = dst, .off = off, .max = max };

	dst[0] = 0;
	bpf_loop(REC_MAX, copy_byte, &c, 0);
}

/* Reads the string at `v` (an address in `space`, or a place in the record) into
 * dst, at most `max` bytes with the NUL (1 <= max <= STR_AREA). */
static __always_inline void read_string(struct scratch *sc, __u64 v, __u32 space, char *dst, __u32 max)
{
	long n = -1;

	if (max > STR_AREA)
		max = STR_AREA;
	if (max < 1)
		max = 1;
	if (space == SPACE_USER)
		n = bpf_probe_read_user_str(dst, max, (void *)v);
	else if (space == SPACE_KERNEL && kernel_reads)
		n = bpf_probe_read_kernel_str(dst, max, (void *)v);
	else if (space == SPACE_REC)
		rec_string(sc, v, max, dst), n = 0;
	else if (space == SPACE_DATALOC) {
		__u32 len = (v >> 16) & 0xffff;

		if (len > 0 && len < max)
			max = len;
		rec_string(sc, v & 0xffff, max, dst), n = 0;
	}
	if (n < 0)
		dst[0] = 0;
}

static __always_inline void push(struct run *r, __u64 v)
{
	struct scratch *sc = r->sc;
	__u32 top = sc->top;

	if (top < EVAL_STACK) {
		sc->st[top & (EVAL_STACK - 1)] = v;
		sc->top = top + 1;
	}
}

static __always_inline __u64 pop(struct run *r)
{
	struct scratch *sc = r->sc;
	__u32 top = sc->top;

	if (top == 0)
		return 0;
	top -= 1;
	sc->top = top;
	return sc->st[top & (EVAL_STACK - 1)];
}

/* The arithmetic operations: a fast predicate's step, and binop's. */
static __always_inline __u64 arith(__u32 op, __u64 x, __u64 y)
{
	switch (op) {
	case B_ADD: return x + y;
	case B_SUB: return x - y;
	case B_MUL: return x * y;
	case B_DIV: return y ? x / y : 0;
	case B_MOD: return y ? x % y : 0;
	case B_AND: return x & y;
	case B_OR: return x | y;
	case B_XOR: return x ^ y;
	case B_SHL: return x << (y & 63);
	case B_SHR: return x >> (y & 63);
	case B_SAR: return (__s64)x >> (y & 63);
	}
	return x;
}

static __always_inline __u64 binop(__u32 op, __u64 x, __u64 y)
{
	__s64 sx = x, sy = y;

	switch (op) {
	case B_ADD: case B_SUB: case B_MUL: case B_DIV: case B_MOD: case B_AND:
	case B_OR: case B_XOR: case B_SHL: case B_SHR: case B_SAR:
		return arith(op, x, y);
	case B_SDIV: {
		__u64 ax = sx < 0 ? -sx : sx, ay = sy < 0 ? -sy : sy;
		__u64 q = ay ? ax / ay : 0;

		return (sx < 0) != (sy < 0) ? -q : q;
	}
	case B_SMOD: {
		__u64 ax = sx < 0 ? -sx : sx, ay = sy < 0 ? -sy : sy;
		__u64 m = ay ? ax % ay : 0;

		return sx < 0 ? -m : m;
	}
	case B_EQ: return x == y;
	case B_NE: return x != y;
	case B_LTU: return x < y;
	case B_LEU: return x <= y;
	case B_GTU: return x > y;
	case B_GEU: return x >= y;
	case B_LTS: return sx < sy;
	case B_LES: return sx <= sy;
	case B_GTS: return sx > sy;
	case B_GES: return sx >= sy;
	case B_LAND: return x && y;
	case B_LOR: return x || y;
	}
	return 0;
}

struct cmp {
	struct scratch *sc;
	struct spec *sp;
	__u32 off;
	__u32 len;
	bool equal;
};

static long cmp_byte(__u64 i, struct cmp *c)
{
	__u32 k = i;

	if (k > c->len)
		return 1;
	if (c->sc->lit[k & (LIT_MAX - 1)] != c->sp->lits[(c->off + k) & (LITS - 1)]) {
		c->equal = false;
		return 1;
	}
	return 0;
}

/* Reads the `len` bytes at `v` (space as read_string's) into dst as they are,
 * NULs included (1 <= len < LIT_MAX); false when they cannot all be read. */
static __always_inline bool read_bytes(struct scratch *sc, __u64 v, __u32 space, char *dst, __u32 len)
{
	struct copy c = { .sc = sc, .dst = dst, .max = len + 1, .raw = true };

	len &= LIT_MAX - 1;
	if (space == SPACE_USER)
		return bpf_probe_read_user(dst, len, (void *)v) == 0;
	if (space == SPACE_KERNEL)
		return kernel_reads && bpf_probe_read_kernel(dst, len, (void *)v) == 0;
	if (space == SPACE_DATALOC) {
		if (len > ((v >> 16) & 0xffff))
			return false;
		v &= 0xffff;
	}
	if (v + len > REC_MAX)
		return false;
	c.off = v;
	bpf_loop(REC_MAX, copy_byte, &c, 0);
	return true;
}

/* Whether the string at `addr` equals literal [off, off + len) (its NUL too:
 * the whole string, not a prefix); with `raw` (-B), whether the len bytes at
 * `addr` are the literal's. */
static __always_inline bool strcmp_lit(struct run *r, __u64 addr, __u32 space, __u32 off, __u32 len,
				       bool raw)
{
	struct scratch *sc = r->sc;
	/* cmp_byte compares bytes 0 to c.len: the NUL too, or the len bytes. */
	struct cmp c = { .sc = sc, .sp = r->sp, .off = off, .len = raw ? len - 1 : len,
			 .equal = true };

	if (len >= LIT_MAX - 2)
		return false;
	if (!raw)
		read_string(sc, addr, space, sc->lit, len + 2);
	else if (len == 0 || !read_bytes(sc, addr, space, sc->lit, len))
		return false;
	bpf_loop(LIT_MAX, cmp_byte, &c, 0);
	return c.equal;
}

/* One instruction; returns 1 to stop. */
static long step(__u64 i, struct run *r)
{
	struct spec *sp = r->sp;
	struct scratch *sc = r->sc;
	struct tk_insn *in;
	__u64 x, y;
	bool ok;

	i += sc->pc0;
	if (i >= MAX_INSNS)
		return 1;
	in = &sp->insns[i];
	switch (in->op) {
	case OP_CONST:
		push(r, in->imm);
		break;
	case OP_IN:
		push(r, sc->in[in->a & (NIN - 1)]);
		break;
	case OP_REC:
		push(r, rec_field(sc, in->a, in->size, in->b & SIGNED));
		break;
	case OP_LOAD:
		x = pop(r);
		push(r, extend(load(x, in->size, in->b & 0xf, &ok), in->size, in->b & SIGNED));
		break;
	case OP_BIN:
		y = pop(r);
		x = pop(r);
		push(r, binop(in->a, x, y));
		break;
	case OP_UN:
		x = pop(r);
		push(r, in->a == U_NOT ? !x : in->a == U_NEG ? -x : ~x);
		break;
	case OP_CAST:
		x = pop(r);
		push(r, extend(x, in->size, in->b & SIGNED));
		break;
	case OP_FILTER:
		if (!pop(r)) {
			sc->drop = 1;
			return 1;
		}
		break;
	case OP_VAL:
		sc->ev.vals[in->a & (MAX_VALS - 1)] = pop(r);
		break;
	case OP_STR: {
		__u64 off = in->imm;

		x = pop(r);
		if (off > STR_AREA)
			break;
		read_string(sc, x, in->b & 0xf, (char *)&sc->ev.tail[off], str_size);
		break;
	}
	case OP_STRCMP:
		x = pop(r);
		push(r, strcmp_lit(r, x, in->b & 0xf, in->a, in->size, in->b & RAW));
		break;
	default:
		return 1;
	}
	return 0;
}

/* The value of USDT argument n (0-based) from the registers copied in sc->regs
 * (libbpf's bpf_usdt_arg() without its kernel reads: the registers are read from
 * the context directly, so it works under lockdown). */
static __always_inline __u64 usdt_arg(struct pt_regs *ctx, struct scratch *sc, __u32 n)
{
	struct __bpf_usdt_spec *spec;
	struct __bpf_usdt_arg_spec *a;
	int id = __bpf_usdt_spec_id(ctx);
	__u64 val = 0, idx;

	if (id < 0)
		return 0;
	spec = bpf_map_lookup_elem(&__bpf_usdt_specs, &id);
	if (!spec || n >= BPF_USDT_MAX_ARG_CNT || n >= spec->arg_cnt)
		return 0;
	a = &spec->args[n];
	switch (a->arg_type) {
	case BPF_USDT_ARG_CONST:
		val = a->val_off;
		break;
	case BPF_USDT_ARG_REG:
		val = sc->regs[((__u16)a->reg_off >> 3) & 31];
		break;
	case BPF_USDT_ARG_REG_DEREF:
		val = sc->regs[((__u16)a->reg_off >> 3) & 31];
		if (bpf_probe_read_user(&val, sizeof(val), (void *)val + a->val_off))
			return 0;
		break;
	case BPF_USDT_ARG_SIB:
		val = sc->regs[((__u16)a->reg_off >> 3) & 31];
		idx = sc->regs[((__u16)a->idx_reg_off >> 3) & 31];
		if (bpf_probe_read_user(&val, sizeof(val),
					(void *)(val + (idx << a->scale_bitshift) + a->val_off)))
			return 0;
		break;
	default:
		return 0;
	}
	val <<= a->arg_bitshift;
	if (a->arg_signed)
		return (__u64)((__s64)val >> a->arg_bitshift);
	return val >> a->arg_bitshift;
}

/* Few branches (8 bytes read whatever the size, then truncated), as it runs
 * for every value of every spec the verifier walks. Not extend(): with it,
 * clang loses the bound on fast_val's value index and the verifier refuses. */
static __always_inline __u64 operand(struct scratch *sc, struct tk_operand *o)
{
	__u32 size = o->size, shift = size && size < 8 ? 64 - 8 * size : 0;
	__u64 v;

	if (o->src == OPD_REC)
		v = *(__u64 *)&sc->rec[o->a & (REC_MAX - 1)];
	else
		v = sc->in[o->a & (NIN - 1)];
	v <<= shift & 63;
	return o->sign ? (__u64)((__s64)v >> (shift & 63)) : v >> (shift & 63);
}

/* Whether v, after `op` with imm (NO_OP: none), compares with c as `keep`
 * keeps (a fast predicate's last two steps). */
static __always_inline bool keeps(__u64 v, __u32 op, __u64 imm, __u32 keep, __u64 c)
{
	if (op != NO_OP)
		v = arith(op, v, imm);
	/* Signed order is the unsigned order with the sign bits flipped. */
	if (keep & CMP_SIGNED) {
		v ^= 1ULL << 63;
		c ^= 1ULL << 63;
	}
	return keep & (v < c ? CMP_LT : v > c ? CMP_GT : CMP_EQ);
}

/* F_FAST_PRED: whether the hit is kept. Reads only what the hit's inputs
 * already hold (arguments, retval, USDT arguments, the record). */
static __always_inline bool fast_pred(struct scratch *sc, struct spec *sp)
{
	return keeps(operand(sc, &sp->pred), sp->pop[0], sp->pimm[0], sp->pop[1], sp->pimm[1]);
}

/* F_GATE: whether the hit whose gate register holds v is kept (volatile: the
 * gate may be the_gate, whose loads must stay loads). */
static __always_inline bool gate_keeps(const volatile struct gate *g, __u64 v)
{
	__u32 shift = g->shift;

	/* Only a narrowing cast shifts (the_gate's: pruned before load otherwise). */
	if (shift) {
		shift &= 63;
		v <<= shift;
		v = g->sign ? (__u64)((__s64)v >> shift) : v >> shift;
	}
	return keeps(v, g->op, g->imm[0], g->keep, g->imm[1]);
}

/* F_FAST_VALS: value i, copied (a bpf_loop callback: the verifier walks it
 * once, not once per value). */
static long fast_val(__u64 i, struct run *r)
{
	struct tk_operand *o;

	if (i >= MAX_VALS)
		return 1;
	o = &r->sp->fast[i];
	r->sc->ev.vals[o->val & (MAX_VALS - 1)] = operand(r->sc, o);
	return 0;
}

/* Runs instructions [from, to) of the spec; false when a FILTER drops the hit. */
static __always_inline bool interpret(struct run *r, __u32 from, __u32 to)
{
	struct scratch *sc = r->sc;

	if (to > MAX_INSNS)
		to = MAX_INSNS;
	if (from >= to)
		return true;
	sc->top = 0;
	sc->drop = 0;
	sc->pc0 = from;
	bpf_loop(to - from, step, r, 0);
	return !sc->drop;
}

/* Runs spec `id` on the hit's inputs and fills its record but for the stacks;
 * returns whether the hit is kept. The predicate goes first, with the inputs it
 * may read; the rest ($pid..., the header) is only gathered for a hit that is
 * kept.
 *
 * A global function: the verifier walks it once per program, on its own, not
 * once per place it is called from (each of a probe's MAX_SPECS, in every
 * kind of program). Inlined, it was most of the verifier's work: 27 ms of
 * trace's load on hardware, a quarter of a second under emulation. It takes no
 * ctx (whose type differs between program kinds), so emit() reads the stacks. */
__noinline int spec_run(struct scratch *sc, struct spec *sp, __u32 probe, __u32 id)
{
	struct tk_event *e;
	struct run r = { .sc = sc, .sp = sp };
	__u64 id64, ug = 0;
	__u32 cpu = 0, flags;

	if (!sc || !sp)
		return 0;
	e = &sc->ev;
	flags = sp->flags;
	if ((flags & F_FAST_PRED) && !fast_pred(sc, sp)) {
		stat(id, 1);
		return 0;
	}
	id64 = bpf_get_current_pid_tgid();
	sc->in[IN_TID] = (__u32)id64;
	sc->in[IN_TGID] = id64 >> 32;
	if (want_extras || (flags & F_IDS)) {
		ug = bpf_get_current_uid_gid();
		cpu = bpf_get_smp_processor_id();
	}
	sc->in[IN_UID] = (__u32)ug;
	sc->in[IN_GID] = ug >> 32;
	sc->in[IN_CPU] = cpu;
	/* The predicate (instructions [0, body)) unless it ran above, then the
	 * values (the rest). */
	if (!(flags & F_FAST_PRED) && !interpret(&r, 0, sp->body)) {
		stat(id, 1);
		return 0;
	}
	if ((flags & F_FAST_VALS) && sp->nfast)
		bpf_loop(sp->nfast < MAX_VALS ? sp->nfast : MAX_VALS, fast_val, &r, 0);
	else
		interpret(&r, sp->body, sp->ninsns);
	stat(id, 0);
	e->ts = want_extras ? bpf_ktime_get_ns() : 0;
	e->probe = probe;
	e->spec = id;
	e->tgid = id64 >> 32;
	e->tid = (__u32)id64;
	e->uid = (__u32)ug;
	e->cpu = cpu;
	bpf_get_current_comm(e->comm, sizeof(e->comm));
	return 1;
}

/* Runs spec `id` on the hit (spec_run) and sends its record, stacks included. */
static __always_inline void emit(void *ctx, __u32 probe, __u32 id, struct spec *sp,
				 struct scratch *sc)
{
	struct tk_event *e = &sc->ev;
	__u32 off, n;
	long k;

	if (!spec_run(sc, sp, probe, id))
		return;
	off = sp->str_bytes;
	if (off > STR_AREA)
		off = STR_AREA;
	e->str_bytes = off;
	e->kstack = 0;
	e->ustack = 0;
	if (!off && !want_kstack && !want_ustack) {
		/* Only the values the format uses (user space reads the rest as 0). */
		n = sp->nvals;
		if (n > MAX_VALS)
			n = MAX_VALS;
		n = offsetof(struct tk_event, vals) + n * 8;
		goto out;
	}
	if (want_kstack) {
		k = bpf_get_stack(ctx, &e->tail[off], STACK_BYTES, 0);
		e->kstack = k;
		if (k > 0)
			off += k;
	}
	if (want_ustack && off <= STR_AREA + STACK_BYTES) {
		k = bpf_get_stack(ctx, &e->tail[off], USTACK_BYTES,
				  BPF_F_USER_STACK | (ustack_build_id ? BPF_F_USER_BUILD_ID : 0));
		e->ustack = k;
		if (k > 0)
			off += k;
	}
	n = offsetof(struct tk_event, tail) + off;
	if (n > sizeof(*e))
		n = sizeof(*e);
out:
	event_output(e, n);
}

static __always_inline struct scratch *scratch_of_cpu(void)
{
	__u32 zero = 0;

	return bpf_map_lookup_elem(&scratch, &zero);
}

/* The argument registers of a function hit (through the syscall wrapper's inner
 * pt_regs when `syscall`). */
static __always_inline void read_args(struct pt_regs *ctx, __u64 *args, bool syscall)
{
	const struct tk_pt_regs *regs;
	__u64 w[8];

	args[0] = PT_REGS_PARM1(ctx);
	args[1] = PT_REGS_PARM2(ctx);
	args[2] = PT_REGS_PARM3(ctx);
	args[3] = PT_REGS_PARM4(ctx);
	args[4] = PT_REGS_PARM5(ctx);
	args[5] = PT_REGS_PARM6(ctx);
	if (!syscall || !kernel_reads)
		return;
	/* r10, r9, r8, ax, cx, dx, si, di: one read of the inner pt_regs. */
	regs = (const struct tk_pt_regs *)args[0];
	if (bpf_probe_read_kernel(w, sizeof(w), &regs->r10)) {
		__builtin_memset(args, 0, 6 * sizeof(*args));
		return;
	}
	args[0] = w[7];
	args[1] = w[6];
	args[2] = w[5];
	args[3] = w[0];
	args[4] = w[2];
	args[5] = w[1];
}

static __always_inline struct specs_of *specs_of(__u32 probe)
{
	return bpf_map_lookup_elem(&probes, &probe);
}

/* One load of ctx at offset `off` (a literal). Inline assembly: written in C,
 * clang merges a switch's loads into one load from a selected address, and the
 * verifier refuses any ctx access but at a constant offset. */
#define CTX_U64(ctx, off) ({							\
	__u64 __v;								\
	asm volatile("%0 = *(u64 *)(%1 + " #off ")" : "=r"(__v) : "r"(ctx));	\
	__v; })

/* x86-64's argument registers di, si, dx, cx, r8, r9 in struct tk_pt_regs. */
_Static_assert(__builtin_offsetof(struct tk_pt_regs, di) == 112 && __builtin_offsetof(struct tk_pt_regs, si) == 104 &&
	       __builtin_offsetof(struct tk_pt_regs, dx) == 96 && __builtin_offsetof(struct tk_pt_regs, cx) == 88 &&
	       __builtin_offsetof(struct tk_pt_regs, r8) == 72 && __builtin_offsetof(struct tk_pt_regs, r9) == 64,
	       "x86-64 pt_regs layout");

/* Argument register r (0-based) of a function hit, read from ctx. */
static __always_inline __u64 arg_reg(struct pt_regs *ctx, __u32 r)
{
	switch (r) {
	case 0: return CTX_U64(ctx, 112);
	case 1: return CTX_U64(ctx, 104);
	case 2: return CTX_U64(ctx, 96);
	case 3: return CTX_U64(ctx, 88);
	case 4: return CTX_U64(ctx, 72);
	case 5: return CTX_U64(ctx, 64);
	}
	return 0;
}

/* The register a return's gate reads: retval, or an argument saved at entry. */
static __always_inline __u64 ret_reg(struct pt_regs *ctx, struct frame *f, __u32 r)
{
	switch (r) {
	case 0: return f->args[0];
	case 1: return f->args[1];
	case 2: return f->args[2];
	case 3: return f->args[3];
	case 4: return f->args[4];
	case 5: return f->args[5];
	}
	return PT_REGS_RC(ctx);
}

/* A hit of spec `id` its gate dropped: counted for -v if the hit is the
 * traced process's. */
static __always_inline bool gate_drop(__u32 id)
{
	if (want_stats && !skip_task())
		stat(id, 1);
	return false;
}

/* A function's entry: emits its `p:` specs; saves the arguments for its `r:`
 * specs. Returns whether a return hook is wanted (a session's entry returns 1
 * to skip the return); `session`: called from a session program; `grouped`: a
 * function of a tracefs uprobe group, whose return must be paired with its
 * entry to be known. */
static __always_inline bool fn_entry(struct pt_regs *ctx, __u32 probe, bool session, bool user,
				     bool grouped)
{
	struct specs_of *so;
	struct scratch *sc;
	bool want_ret;

	/* Decided on its register alone, before the pid is read (the hits -v
	 * counts as dropped are the traced process's only). The one spec of a
	 * one-probe run is spec 0. */
	if (gate_at == GATE_ENTRY) {
		if (!gate_keeps(&the_gate, arg_reg(ctx, the_gate.reg)))
			return gate_drop(0);
		so = specs_of(probe);
		if (!so)
			return false;
	} else {
		so = specs_of(probe);
		if (!so)
			return false;
		if ((so->flags & (F_GATE | F_RETURN)) == F_GATE &&
		    !gate_keeps(&so->gate, arg_reg(ctx, so->gate.reg)))
			return gate_drop(so->spec[0]);
	}
	if (skip_task())
		return false;
	sc = scratch_of_cpu();
	if (!sc)
		return false;
	want_ret = so->flags & F_RETURN;
	read_args(ctx, sc->in, so->flags & F_SYSCALL);
	sc->in[IN_RETVAL] = 0;
	for (int k = 0; k < MAX_SPECS; k++) {
		__u32 id;
		struct spec *sp;

		if (k >= so->n)
			break;
		id = so->spec[k];
		sp = bpf_map_lookup_elem(&specs, &id);
		if (!sp || (sp->flags & F_RETURN))
			continue;
		emit(ctx, probe, id, sp, sc);
	}
	if (want_ret) {
		struct frame *f;

		/* Returns that read no argument keep no entry: their hook's cookie
		 * names the function, and no depth limit drops them. */
		if (!(so->flags & F_ENTRY_ARGS) && !grouped)
			return true;
		f = pair_enter(probe, session, user ? PT_REGS_SP(ctx) : 0);
		if (f)
			__builtin_memcpy(f->args, sc->in, sizeof(f->args));
		return f != NULL;
	}
	return false;
}

/* A function's return: emits its `r:` specs with the entry's arguments.
 * `entry_sp`: see pair_pop(). */
static __always_inline void fn_return(struct pt_regs *ctx, __u32 probe, __u64 entry_sp)
{
	struct specs_of *so = NULL;
	struct frame f;
	struct scratch *sc;

	if (!entry_sp) {
		so = specs_of(probe);
		if (!so)
			return;
	}
	if (so && !(so->flags & F_ENTRY_ARGS)) {
		/* Not paired (see fn_entry): filtered here. */
		if (skip_task())
			return;
		__builtin_memset(&f, 0, sizeof(f));
		f.probe = probe;
	} else {
		if (!pair_pop(probe, entry_sp, &f))
			return; /* no entry: filtered out there, or a p: only site */
		so = specs_of(f.probe);
		if (!so)
			return;
	}
	if (gate_at == GATE_RETURN) {
		if (!gate_keeps(&the_gate, ret_reg(ctx, &f, the_gate.reg))) {
			stat(0, 1);
			return;
		}
	} else if ((so->flags & F_GATE) && !gate_keeps(&so->gate, ret_reg(ctx, &f, so->gate.reg))) {
		stat(so->spec[0], 1);
		return;
	}
	sc = scratch_of_cpu();
	if (!sc)
		return;
	__builtin_memcpy(sc->in, f.args, sizeof(f.args));
	sc->in[IN_RETVAL] = PT_REGS_RC(ctx);
	for (int k = 0; k < MAX_SPECS; k++) {
		__u32 id;
		struct spec *sp;

		if (k >= so->n)
			break;
		id = so->spec[k];
		sp = bpf_map_lookup_elem(&specs, &id);
		if (!sp || !(sp->flags & F_RETURN))
			continue;
		emit(ctx, f.probe, id, sp, sc);
	}
}

static __always_inline int session(struct pt_regs *ctx, bool user)
{
	__u32 probe = probe_of(ctx);

	if (!session_is_return(ctx))
		return fn_entry(ctx, probe, true, user, false) ? 0 : 1;
	fn_return(ctx, probe, 0);
	return 0;
}

SEC("kprobe.session")
int trace_kprobe_session(struct pt_regs *ctx)
{
	return session(ctx, false);
}

SEC("uprobe.session")
int trace_uprobe_session(struct pt_regs *ctx)
{
	return session(ctx, true);
}

SEC("kprobe.multi")
int trace_kprobe_multi(struct pt_regs *ctx)
{
	fn_entry(ctx, probe_of(ctx), false, false, false);
	return 0;
}

SEC("kretprobe.multi")
int trace_kretprobe_multi(struct pt_regs *ctx)
{
	fn_return(ctx, probe_of(ctx), 0);
	return 0;
}

SEC("kprobe")
int trace_kprobe(struct pt_regs *ctx)
{
	fn_entry(ctx, probe_of(ctx), false, false, false);
	return 0;
}

SEC("kretprobe")
int trace_kretprobe(struct pt_regs *ctx)
{
	fn_return(ctx, probe_of(ctx), 0);
	return 0;
}

SEC("uprobe.multi")
int trace_uprobe_multi(struct pt_regs *ctx)
{
	fn_entry(ctx, probe_of(ctx), false, true, false);
	return 0;
}

SEC("uretprobe.multi")
int trace_uretprobe_multi(struct pt_regs *ctx)
{
	fn_return(ctx, probe_of(ctx), 0);
	return 0;
}

/* Without uprobe_multi, a binary's functions are grouped under tracefs uprobe
 * events, entries and returns (the cookie names the group). */
#include "uprobe_groups.h"

SEC("uprobe")
int trace_uprobe(struct pt_regs *ctx)
{
	__u64 cookie = probe_of(ctx);
	__u32 probe;

	if (uprobe_entry_probe(ctx, cookie, &probe))
		fn_entry(ctx, probe, false, true, cookie & UPROBE_GROUP);
	return 0;
}

SEC("uretprobe")
int trace_uretprobe(struct pt_regs *ctx)
{
	__u64 cookie = probe_of(ctx);

	fn_return(ctx, cookie, uprobe_return_sp(ctx, cookie));
	return 0;
}

/* Tracepoints and USDT probes: every spec emits at the hit. */
static __always_inline void hit(void *ctx, struct scratch *sc, __u32 probe, bool usdt_regs)
{
	struct specs_of *so;
	__u32 usdt;

	so = specs_of(probe);
	if (!so)
		return;
	usdt = so->usdt_mask;
	if (usdt_regs && usdt) {
		const struct tk_pt_regs *regs = (const struct tk_pt_regs *)ctx;

		sc->regs[0] = regs->r15;
		sc->regs[1] = regs->r14;
		sc->regs[2] = regs->r13;
		sc->regs[3] = regs->r12;
		sc->regs[4] = regs->bp;
		sc->regs[5] = regs->bx;
		sc->regs[6] = regs->r11;
		sc->regs[7] = regs->r10;
		sc->regs[8] = regs->r9;
		sc->regs[9] = regs->r8;
		sc->regs[10] = regs->ax;
		sc->regs[11] = regs->cx;
		sc->regs[12] = regs->dx;
		sc->regs[13] = regs->si;
		sc->regs[14] = regs->di;
		sc->regs[15] = regs->orig_ax;
		sc->regs[16] = regs->ip;
		sc->regs[17] = regs->cs;
		sc->regs[18] = regs->flags;
		sc->regs[19] = regs->sp;
		sc->regs[20] = regs->ss;
		for (int n = 0; n < BPF_USDT_MAX_ARG_CNT; n++) {
			if (usdt & (1u << n))
				sc->in[(IN_USDT0 + n) & (NIN - 1)] = usdt_arg(ctx, sc, n);
		}
	}
	for (int k = 0; k < MAX_SPECS; k++) {
		__u32 id;
		struct spec *sp;

		if (k >= so->n)
			break;
		id = so->spec[k];
		sp = bpf_map_lookup_elem(&specs, &id);
		if (!sp)
			continue;
		emit(ctx, probe, id, sp, sc);
	}
}

/* A tracepoint's record is copied from the context. With kernel reads, one
 * helper call copies what the specs need. Without them (lockdown), only loads at
 * constant offsets can read it, and the kernel refuses to attach a program that
 * reads past the record's fields (max_ctx_offset): so there is one program per
 * record size, copying exactly bytes [8, N); user space attaches each tracepoint
 * to the largest N its record has. The first 8 bytes (common fields) are not
 * readable by tracepoint programs. */
static __always_inline struct scratch *tp_start(void)
{
	if (skip_task())
		return NULL;
	return scratch_of_cpu();
}

SEC("tracepoint")
int trace_tp_read(void *ctx)
{
	struct scratch *sc = tp_start();
	__u32 probe = probe_of(ctx);
	struct specs_of *so;
	__u32 words = 0;

	if (!sc || !kernel_reads)
		return 0;
	so = specs_of(probe);
	if (!so)
		return 0;
	words = so->rec_words;
	if (words > REC_MAX / 8)
		words = REC_MAX / 8;
	if (words > 1)
		bpf_probe_read_kernel(&sc->rec[8], (words - 1) * 8, (char *)ctx + 8);
	hit(ctx, sc, probe, false);
	return 0;
}

#define TP_COPY8(o) \
	if ((o) + 8 <= N) *(__u64 *)&sc->rec[o] = *(__u64 *)((char *)ctx + (o)); \
	else if ((o) + 4 <= N) *(__u32 *)&sc->rec[o] = *(__u32 *)((char *)ctx + (o));

#define TP_CLASS(N_)							\
SEC("tracepoint")							\
int trace_tp_##N_(void *ctx)						\
{									\
	enum { N = N_ };						\
	struct scratch *sc = tp_start();				\
									\
	if (!sc)							\
		return 0;						\
	_Pragma("unroll")						\
	for (int o = 8; o < N; o += 8) {				\
		TP_COPY8(o)						\
	}								\
	hit(ctx, sc, probe_of(ctx), false);		\
	return 0;							\
}

TP_CLASS(12)
TP_CLASS(16)
TP_CLASS(20)
TP_CLASS(24)
TP_CLASS(28)
TP_CLASS(32)
TP_CLASS(36)
TP_CLASS(40)
TP_CLASS(44)
TP_CLASS(48)
TP_CLASS(52)
TP_CLASS(56)
TP_CLASS(60)
TP_CLASS(64)
TP_CLASS(72)
TP_CLASS(80)
TP_CLASS(88)
TP_CLASS(96)
TP_CLASS(112)
TP_CLASS(128)
TP_CLASS(160)
TP_CLASS(192)
TP_CLASS(256)
TP_CLASS(384)
TP_CLASS(512)

/* A tracepoint whose specs read none of its record's fields (user space checks;
 * $pid, $comm, stacks and the like come from helpers) on a raw tracepoint link,
 * the probe in its cookie (Linux 6.10+): it detaches at once, where a
 * perf-event tracepoint waits out RCU grace periods (about 70 ms each). */
SEC("raw_tp")
int trace_raw_tp(void *ctx)
{
	struct scratch *sc = tp_start();

	if (sc)
		hit(ctx, sc, probe_of(ctx), false);
	return 0;
}

SEC("usdt")
int trace_usdt(struct pt_regs *ctx)
{
	struct scratch *sc;

	if (skip_task())
		return 0;
	sc = scratch_of_cpu();
	if (sc)
		hit(ctx, sc, bpf_usdt_cookie(ctx), true);
	return 0;
}

/* The syscalls:sys_enter_* / sys_exit_* events through one raw link on
 * raw_syscalls' sys_enter / sys_exit for all of them (closing one does not wait
 * out the RCU grace periods a perf-event tracepoint does, 70 ms each). The
 * event's record is rebuilt from the registers as the kernel fills it
 * (perf_syscall_enter/exit): __syscall_nr at 8, then each argument as 8 bytes
 * from 16, or the return value at 16. User space sends only events whose format
 * says exactly that, and only with kernel reads (the registers are kernel
 * memory); the others are perf-event tracepoints. */
static __always_inline struct scratch *syscall_start(__u64 nr, __u32 base, __u32 *probe)
{
	*probe = syscall_probe(nr, base);
	if (!kernel_reads || !*probe || compat_syscall())
		return NULL;
	*probe -= 1;
	return tp_start();
}

SEC("raw_tp/sys_enter")
int trace_sys_enter(__u64 *args)
{
	/* sys_enter(struct pt_regs *regs, long id) */
	const void *regs = (const void *)args[0];
	__u64 nr = syscall_enter_nr(args);
	struct tk_pt_regs *r;
	struct scratch *sc;
	__u32 probe;

	sc = syscall_start(nr, 0, &probe);
	if (!sc)
		return 0;
	r = (struct tk_pt_regs *)sc->regs;
	if (bpf_probe_read_kernel(r, sizeof(*r), regs))
		return 0;
	*(__s32 *)&sc->rec[8] = (__s32)nr;
	/* x86-64's syscall argument registers (syscall_get_arguments) */
	*(__u64 *)&sc->rec[16] = r->di;
	*(__u64 *)&sc->rec[24] = r->si;
	*(__u64 *)&sc->rec[32] = r->dx;
	*(__u64 *)&sc->rec[40] = r->r10;
	*(__u64 *)&sc->rec[48] = r->r8;
	*(__u64 *)&sc->rec[56] = r->r9;
	hit(args, sc, probe, false);
	return 0;
}

SEC("raw_tp/sys_exit")
int trace_sys_exit(__u64 *args)
{
	/* sys_exit(struct pt_regs *regs, long ret) */
	struct scratch *sc;
	__u32 probe;
	__u64 nr;

	if (!syscall_exit_nr(args, &nr))
		return 0;
	sc = syscall_start(nr, SYSCALL_SLOTS, &probe);
	if (!sc)
		return 0;
	*(__s32 *)&sc->rec[8] = (__s32)nr;
	*(__u64 *)&sc->rec[16] = args[1];
	hit(args, sc, probe, false);
	return 0;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
