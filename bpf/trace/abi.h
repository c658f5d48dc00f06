/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/* trace's BPF/user ABI: the limits, the bytecode (struct tk_insn and its enums),
 * the tables user space fills before a run (struct spec per compiled probe,
 * struct specs_of per attached probe, struct gate) and the record it reads
 * (struct tk_event).
 *
 * User space does not copy these numbers: every type here reaches Rust through
 * the skeleton (skel::types::*; a C enum becomes a newtype with its values as
 * associated consts), the enums by way of struct tk_abi below, so a change here
 * that tools/trace/ does not follow fails to compile there.
 *
 * Inputs: none (vmlinux.h's integer types). */
#ifndef TRACEKIT_TRACE_ABI_H
#define TRACEKIT_TRACE_ABI_H

enum tk_limit {
	MAX_INSNS = 128,	/* instructions per spec */
	MAX_VALS = 16,		/* values per record */
	MAX_SPECS = 4,		/* specs per probe */
	NIN = 32,		/* inputs gathered per hit (enum input) */
	EVAL_STACK = 16,	/* the interpreter's value stack */
	REC_MAX = 512,		/* bytes of a tracepoint record read */
	LIT_MAX = 128,		/* bytes of one STRCMP literal, its NUL included */
	LITS = 256,		/* bytes of a spec's STRCMP literals */
	STR_AREA = 4096,	/* bytes of strings per record */
	STACK_BYTES = 127 * 8,
	/* The user stack's room: 127 frames of struct bpf_stack_build_id. */
	USTACK_BYTES = 127 * 32,
	/* Counters per spec in `stats`: [0] hits that passed the predicate, [1]
	 * hits dropped by it. */
	STATS = 2,
};

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

/* Or-ed with a space in tk_insn.b. */
enum insn_flag {
	SIGNED = 0x10,
	RAW = 0x20,	/* OP_STRCMP under -B: bytes as they are, not a string */
};

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
enum spec_flag {
	F_RETURN = 1,		/* emits at the function's return */
	F_SYSCALL = 2,		/* __x64_sys_* wrapper: arguments in the inner pt_regs */
	F_IDS = 4,		/* reads $uid, $gid or $cpu */
	F_FAST_PRED = 8,	/* the predicate is `pred`, run before anything else */
	F_FAST_VALS = 16,	/* the values are the `fast` copies: no interpreter */
	F_GATE = 32,		/* specs_of only: `gate` decides a function hit first */
	F_ENTRY_ARGS = 64,	/* specs_of only: a return spec reads the entry's arguments */
	F_USER_ENTRY = 128,	/* a user function's first instruction: -U adds the caller */
};

/* A plain value: an input or a record field, truncated/extended to `size`. */
enum operand_src { OPD_IN = 1, OPD_REC };
struct tk_operand {
	__u8 src;
	__u8 size;
	__u8 sign;
	__u8 val;	/* the value it is stored to (fast values) */
	__u32 a;	/* input index, or record offset */
};

/* A fast predicate's arithmetic step (pop[0], gate.op): a B_* or none. */
enum fast_op { NO_OP = 0xff };

/* The outcomes a fast predicate's comparison keeps (pop[1], gate.keep). */
enum cmp_keep { CMP_LT = 1, CMP_EQ = 2, CMP_GT = 4, CMP_SIGNED = 8 };

/* Most specs are an operand compared with a constant and operands copied into
 * values. User space (tools/trace/compile/fast.rs) recognises those shapes in
 * the bytecode and describes them here too, so a hit runs them straight-line,
 * without a bpf_loop callback per instruction; a dropped hit then costs a few
 * loads. */
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

/* Where the_gate applies (gate_at), set before load. */
enum gate_site { GATE_ENTRY = 1, GATE_RETURN = 2 };

/* Not a record: it names each enum of this header, so that BTF (and so the
 * skeleton) carries them, through tk_event's `abi` (which has no bytes: an
 * anchor global, as libbpf-tools' `struct event _event`, would have moved the
 * other .rodata globals and so changed the programs' code). */
struct tk_abi {
	enum tk_limit limit;
	enum op op;
	enum space space;
	enum insn_flag insn_flag;
	enum bin bin;
	enum un un;
	enum input input;
	enum spec_flag spec_flag;
	enum operand_src operand_src;
	enum fast_op fast_op;
	enum cmp_keep cmp_keep;
	enum gate_site gate_site;
};

/* A record's header: what every record has, before its values. */
struct tk_event_head {
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
	__u16 ucaller;		/* 1: the user stack's frame 1 is the caller, read at entry (entry_ustack()) */
	__u16 ustack_skip;	/* bytes left unused before the user stack */
	char comm[16];
};

/* A record. Only the values the format uses are sent when it has no strings
 * and no stacks (emit()); user space reads the rest as 0. */
struct tk_event {
	struct tk_event_head h;
	__u64 vals[MAX_VALS];
	__u8 tail[2 * STR_AREA + 2 * STACK_BYTES];
	struct tk_abi abi[0];	/* no bytes: see struct tk_abi */
};

_Static_assert(STR_AREA + STACK_BYTES + USTACK_BYTES <= sizeof(((struct tk_event *)0)->tail),
	       "the tail holds the strings and both stacks");

#endif /* TRACEKIT_TRACE_ABI_H */
