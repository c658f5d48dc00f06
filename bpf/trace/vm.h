/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/* trace's interpreter: runs a struct spec (bpf/trace/abi.h) on a hit's inputs
 * and sends its record. The predicate's fast form, then the bytecode under
 * bpf_loop (step()), or the values' fast copies; spec_run() is verified once per
 * program, emit() adds the stacks and sends the record (events.h).
 *
 * Inputs, declared before including it (bpf/trace.bpf.c): struct scratch and
 * the maps `specs`, `scratch`, `stats` (STATS counters per spec); the globals
 * kernel_reads, self_tgid, filter_tid, filter_uid, str_size, want_kstack,
 * want_ustack, ustack_build_id, want_extras, want_stats, one_probe; and
 * filter.h, events.h, usdt.bpf.h. */
#ifndef TRACEKIT_TRACE_VM_H
#define TRACEKIT_TRACE_VM_H

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
	/* As if shifted a bit at a time: a count of 64 or more leaves nothing
	 * (the sign, for >> of a negative signed value), where the CPU would
	 * take the count mod 64 and C leaves it undefined. */
	case B_SHL: return y > 63 ? 0 : x << y;
	case B_SHR: return y > 63 ? 0 : x >> y;
	case B_SAR: return (__s64)x >> (y > 63 ? 63 : y);
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
	e->h.ts = want_extras ? bpf_ktime_get_ns() : 0;
	e->h.probe = probe;
	e->h.spec = id;
	e->h.tgid = id64 >> 32;
	e->h.tid = (__u32)id64;
	e->h.uid = (__u32)ug;
	e->h.cpu = cpu;
	bpf_get_current_comm(e->h.comm, sizeof(e->h.comm));
	return 1;
}

/* The user stack at a user function's entry, its caller included: the return
 * address is at the stack pointer, not yet in the frame chain, so a
 * frame-pointer walk skips it (the kernel adds it since 6.12 for functions
 * that begin with push %rbp or endbr64, not for frameless leaves). As stacks.h's
 * add_entry_caller(), which stackcount uses: the walk goes to frames 1.., then
 * the function's own frame to 0 and the caller to 1, without moving the
 * others. The caller is an address (BPF_STACK_BUILD_ID_IP: its build ID is not
 * known here); user space drops it where the walk has it already, which only
 * names can tell in build-ID form. Returns the bytes taken; *skip: the bytes
 * left unused before them, *caller: whether frame 1 is the one added. */
/* struct bpf_stack_build_id's layout, declared here: vmlinux.h's type would
 * make its field accesses CO-RE relocations, and every program would need the
 * kernel's BTF at load (the lean build's point is not to read it). */
struct ustack_frame {
	__s32 status;
	__u8 build_id[20];
	__u64 ip;
};
_Static_assert(sizeof(struct ustack_frame) == sizeof(struct bpf_stack_build_id),
	       "a build-ID stack frame");

static __always_inline long entry_ustack(void *ctx, __u8 *at, __u16 *skip, __u16 *caller)
{
	struct ustack_frame *f = (struct ustack_frame *)at;
	__u64 ret = 0;
	long k;

	*skip = sizeof(*f);
	*caller = 0;
	k = bpf_get_stack(ctx, &f[1], USTACK_BYTES - sizeof(*f),
			  BPF_F_USER_STACK | BPF_F_USER_BUILD_ID);
	if (k < (long)sizeof(*f))
		return k;
	if (bpf_probe_read_user(&ret, sizeof(ret), (void *)PT_REGS_SP((struct pt_regs *)ctx)) || !ret)
		return k;
	__builtin_memcpy(&f[0], &f[1], sizeof(*f));
	__builtin_memset(&f[1], 0, sizeof(*f));
	f[1].status = BPF_STACK_BUILD_ID_IP;
	f[1].ip = ret;
	*skip = 0;
	*caller = 1;
	return k + sizeof(*f);
}

/* Runs spec `id` on the hit (spec_run) and sends its record, stacks included.
 * `user_fn`: ctx is a user function's pt_regs (a constant at each call, so
 * that other programs, whose ctx has no stack pointer, do not read one). */
static __always_inline void emit(void *ctx, __u32 probe, __u32 id, struct spec *sp,
				 struct scratch *sc, bool user_fn)
{
	struct tk_event *e = &sc->ev;
	__u32 off, n;
	__u64 len;
	long k;

	if (!spec_run(sc, sp, probe, id))
		return;
	off = sp->str_bytes;
	if (off > STR_AREA)
		off = STR_AREA;
	e->h.str_bytes = off;
	e->h.kstack = 0;
	e->h.ustack = 0;
	e->h.ucaller = 0;
	e->h.ustack_skip = 0;
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
		e->h.kstack = k;
		if (k > 0)
			off += k;
	}
	if (want_ustack && off <= STR_AREA + STACK_BYTES) {
		if (unwind_tables) {
			/* The tables know a function's caller at its entry too. */
			k = unwind_user((__u64 *)&e->tail[off], 4) * sizeof(struct ustack_frame);
		} else if (user_fn && ustack_build_id && (sp->flags & F_USER_ENTRY)) {
			__u16 skip = 0, caller = 0;

			k = entry_ustack(ctx, &e->tail[off], &skip, &caller);
			e->h.ustack_skip = skip;
			e->h.ucaller = caller;
			if (k > 0)
				off += skip;
		} else {
			k = bpf_get_stack(ctx, &e->tail[off], USTACK_BYTES,
					  BPF_F_USER_STACK | (ustack_build_id ? BPF_F_USER_BUILD_ID : 0));
		}
		e->h.ustack = k;
		if (k > 0)
			off += k;
	}
	/* Clamped in 64 bits, and that register passed on, not a 32-bit copy
	 * tested before: 6.1's verifier follows the branch of k > 0 even after
	 * entry_ustack() returned k <= 0, where off has no bound, and refused an
	 * unbounded size at bpf_ringbuf_output. */
	len = (__u64)offsetof(struct tk_event, tail) + off;
	if (len > sizeof(*e))
		len = sizeof(*e);
	asm volatile("" : "+r"(len));
	n = len;
out:
	event_output(e, n);
}

#endif /* TRACEKIT_TRACE_VM_H */
