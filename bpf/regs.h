/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/* pt_regs read without CO-RE. Include after vmlinux.h and before
 * <bpf/bpf_tracing.h>, whose PT_REGS_*() then read this struct.
 *
 * x86-64's pt_regs is user ABI: ptrace's user_regs_struct has the same layout,
 * so its offsets cannot change. Read through vmlinux.h's struct (which carries
 * preserve_access_index) every PT_REGS_*() is a CO-RE relocation, and one
 * relocation anywhere in an object makes libbpf read and parse the kernel's
 * 5 MB BTF at every load: 4 ms on hardware, 100 ms under emulation, for offsets
 * known at compile time. */
#ifndef TRACEKIT_REGS_H
#define TRACEKIT_REGS_H

#ifndef __TARGET_ARCH_x86
#error "bpf/regs.h describes x86-64's pt_regs; build with -D__TARGET_ARCH_x86 (libbpf-cargo's default here)"
#endif

/* Declared after vmlinux.h's `#pragma clang attribute pop`: no preserve_access_index. */
struct tk_pt_regs {
	unsigned long r15, r14, r13, r12, bp, bx, r11, r10, r9, r8;
	unsigned long ax, cx, dx, si, di, orig_ax, ip, cs, flags, sp, ss;
};

#define __PT_REGS_CAST(x) ((const struct tk_pt_regs *)(x))

#endif /* TRACEKIT_REGS_H */
