//! Whether a uprobe may sit on a user function's first instruction.
//!
//! A uprobe replaces the instruction with a breakpoint and, when it fires, runs the
//! original instruction out of line (a copy, single-stepped). The kernel refuses some
//! instructions itself (`uprobe_init_insn` in arch/x86/kernel/uprobes.c: a table of
//! one-byte opcodes, segment and LOCK prefixes, `mov ss`); those are refused here
//! first, with a reason instead of an attach error. Worse are the ones it accepts and
//! then steps wrongly: on this project's machines every VEX- or EVEX-encoded (AVX,
//! AVX-512) instruction that uses a vector register computes the wrong value when
//! single-stepped out of line (its result or its vector input is lost), so a probe at
//! glibc's `__strchrnul_evex` corrupted every traced process's `printf`. Those are
//! refused too. Measured with tests/progs/avx.c-style functions under bpftrace and
//! tracekit: legacy SSE and VEX instructions on general registers only (BMI) step
//! correctly.

/// `Err(reason)` when a uprobe must not be placed on `code` (the bytes at a function's
/// entry); the reason reads after "FUNCTION cannot be traced: ".
pub fn check_entry(code: &[u8]) -> Result<(), String> {
    check_insn(code, "its first")
}

/// [`check_entry`] for the instruction `code` begins with, wherever it is in its
/// function; `which` names it in the reason ("its first", "the").
#[cfg(target_arch = "x86_64")]
pub fn check_insn(code: &[u8], which: &str) -> Result<(), String> {
    use iced_x86::{
        Decoder, DecoderOptions, EncodingKind, Formatter, GasFormatter, Instruction,
        InstructionInfoFactory,
    };

    /// An instruction's text, formatted only when a refusal shows it: iced's
    /// formatter costs more to build than the checks (3% of a user-function
    /// run's CPU when it was made for every function checked).
    struct Text<'a>(&'a Instruction);

    impl std::fmt::Display for Text<'_> {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            let mut t = String::new();
            GasFormatter::new().format(self.0, &mut t);
            f.write_str(&t)
        }
    }

    if code.is_empty() {
        return Err("its code is not in the file".to_string());
    }
    let mut decoder = Decoder::with_ip(64, code, 0, DecoderOptions::NONE);
    let insn = decoder.decode();
    let hex = |b: &[u8]| {
        b.iter()
            .take(8)
            .map(|b| format!("{b:02x}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    if insn.is_invalid() {
        return Err(format!(
            "{which} bytes ({}) are not a valid x86-64 instruction",
            hex(code)
        ));
    }
    let text = Text(&insn);
    let bytes = &code[..insn.len().min(code.len())];

    match insn.encoding() {
        EncodingKind::EVEX | EncodingKind::MVEX => {
            return Err(format!(
                "{which} instruction (`{text}`) is AVX-512 (EVEX-encoded), which a uprobe's \
                 out-of-line single step does not execute correctly: the traced program would \
                 compute wrong results"
            ));
        }
        EncodingKind::VEX | EncodingKind::XOP => {
            let mut info = InstructionInfoFactory::new();
            let vector = info
                .info(&insn)
                .used_registers()
                .iter()
                .any(|r| r.register().is_vector_register());
            if vector {
                return Err(format!(
                    "{which} instruction (`{text}`) is AVX (VEX-encoded) on vector registers, \
                     which a uprobe's out-of-line single step does not execute correctly: the \
                     traced program would compute wrong results"
                ));
            }
        }
        _ => {}
    }

    // The kernel's own checks, on the raw bytes as its decoder sees them.
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        match b {
            0x26 | 0x2e | 0x36 | 0x3e => {
                return Err(format!(
                    "{which} instruction (`{text}`) has a segment or notrack prefix, which \
                     the kernel does not single-step for uprobes"
                ));
            }
            0xf0 => {
                return Err(format!(
                    "{which} instruction (`{text}`) has a LOCK prefix, which the kernel does \
                     not single-step for uprobes"
                ));
            }
            0x64 | 0x65 | 0x66 | 0x67 | 0xf2 | 0xf3 => i += 1,
            0x40..=0x4f => {
                i += 1;
                break; // REX is the last prefix
            }
            _ => break,
        }
    }
    // The opcode byte the kernel tests: after the VEX/EVEX/XOP prefix for those.
    let opcode_at = match insn.encoding() {
        EncodingKind::VEX if bytes.get(i) == Some(&0xc5) => i + 2,
        EncodingKind::VEX | EncodingKind::XOP => i + 3,
        EncodingKind::EVEX => i + 4,
        _ => i,
    };
    let Some(&op) = bytes.get(opcode_at) else {
        return Ok(());
    };
    if !good_opcode_64(op) {
        return Err(format!(
            "{which} instruction (`{text}`, opcode {op:#04x}) is one the kernel does not \
             single-step for uprobes"
        ));
    }
    // `mov ss` masks exceptions for one instruction: the kernel refuses it.
    if insn.encoding() == EncodingKind::Legacy
        && op == 0x8e
        && bytes.get(opcode_at + 1).is_some_and(|m| (m >> 3) & 7 == 2)
    {
        return Err(format!(
            "{which} instruction (`{text}`) loads SS, which the kernel does not single-step \
             for uprobes"
        ));
    }
    Ok(())
}

#[cfg(not(target_arch = "x86_64"))]
pub fn check_insn(_code: &[u8], _which: &str) -> Result<(), String> {
    Ok(())
}

/// `Ok` when one of the instructions of `code` (a function's bytes from its
/// entry) begins at `off`: a breakpoint anywhere else would corrupt the
/// instruction it lands in. The reason reads after "FUNC+OFF cannot be traced: ".
#[cfg(target_arch = "x86_64")]
pub fn check_boundary(code: &[u8], off: u64) -> Result<(), String> {
    use iced_x86::{Decoder, DecoderOptions};

    let mut decoder = Decoder::with_ip(64, code, 0, DecoderOptions::NONE);
    let mut prev = 0;
    while decoder.can_decode() {
        let ip = decoder.ip();
        if ip == off {
            return Ok(());
        }
        if ip > off {
            return Err(format!(
                "it is inside the instruction at +{prev:#x} (the next one begins at +{ip:#x})"
            ));
        }
        if decoder.decode().is_invalid() {
            return Err(format!(
                "the function's code before it does not decode as x86-64 (at +{ip:#x})"
            ));
        }
        prev = ip;
    }
    Err("it is past the function's code in the file".to_string())
}

#[cfg(not(target_arch = "x86_64"))]
pub fn check_boundary(_code: &[u8], _off: u64) -> Result<(), String> {
    Ok(())
}

/// `good_insns_64` of arch/x86/kernel/uprobes.c: one-byte opcodes (or the opcode
/// byte after a VEX prefix) the kernel will single-step. Rows of 16 opcodes.
#[cfg(target_arch = "x86_64")]
fn good_opcode_64(op: u8) -> bool {
    const ROWS: [u16; 16] = [
        row([1, 1, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1, 1, 1, 0, 1]), // 00
        row([1, 1, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1, 1, 1, 0, 0]), // 10
        row([1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 1, 0]), // 20
        row([1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 1, 0]), // 30
        row([1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]), // 40
        row([1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]), // 50
        row([0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0]), // 60
        row([1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]), // 70
        row([1, 1, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]), // 80
        row([1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1]), // 90
        row([1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]), // a0
        row([1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]), // b0
        row([1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0]), // c0
        row([1, 1, 1, 1, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1]), // d0
        row([1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 0, 1, 0, 0, 0, 0]), // e0
        row([1, 0, 1, 1, 0, 1, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1]), // f0
    ];
    const fn row(bits: [u16; 16]) -> u16 {
        let mut r = 0;
        let mut i = 0;
        while i < 16 {
            r |= bits[i] << i;
            i += 1;
        }
        r
    }
    ROWS[(op >> 4) as usize] & (1 << (op & 0xf)) != 0
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;

    fn reason(code: &[u8]) -> String {
        check_entry(code).unwrap_err()
    }

    #[test]
    fn plain_instructions_are_fine() {
        for code in [
            &b"\x89\xf8"[..],                        // mov %edi,%eax
            b"\xf3\x0f\x1e\xfa",                     // endbr64
            b"\x55",                                 // push %rbp
            b"\x48\x83\xec\x08",                     // sub $8,%rsp
            b"\x66\x0f\xef\xc0",                     // pxor %xmm0,%xmm0 (SSE2)
            b"\xb8\x27\x00\x00\x00",                 // mov $0x27,%eax
            b"\xc4\xe2\xc8\xf7\xc7",                 // bextr (BMI, VEX on GPRs only)
            b"\xc4\xe2\x40\xf2\xc6",                 // andn %esi,%edi,%eax
            b"\x64\x48\x8b\x04\x25\x28\x00\x00\x00", // mov %fs:0x28,%rax
            b"\xe9\x00\x00\x00\x00",                 // jmp
            b"\xff\x25\x00\x00\x00\x00",             // jmp *(%rip)
        ] {
            assert_eq!(check_entry(code), Ok(()), "{code:x?}");
        }
    }

    #[test]
    fn evex_is_refused() {
        // __strchrnul_evex: vpbroadcastb %esi,%ymm17
        let r = reason(b"\x62\xe2\x7d\x28\x7a\xce\x89\xf8");
        assert!(
            r.starts_with(
                "its first instruction (`vpbroadcastb %esi,%ymm17`) is AVX-512 (EVEX-encoded)"
            ),
            "{r}"
        );
    }

    #[test]
    fn vex_on_vector_registers_is_refused() {
        // vpbroadcastb %xmm0,%ymm2
        let r = reason(b"\xc4\xe2\x7d\x78\xd0");
        assert!(
            r.contains("is AVX (VEX-encoded) on vector registers"),
            "{r}"
        );
        // vmovdqu %ymm5,(%rdi): a vector register read is lost as well
        let r = reason(b"\xc5\xfe\x7f\x2f");
        assert!(r.contains("AVX (VEX-encoded)"), "{r}");
        // vzeroupper (implicit vector registers)
        let r = reason(b"\xc5\xf8\x77");
        assert!(r.contains("AVX (VEX-encoded)"), "{r}");
    }

    #[test]
    fn kernel_refusals_have_reasons() {
        assert!(reason(b"\xf0\x0f\xb1\x17").contains("LOCK prefix"));
        assert!(reason(b"\x3e\xff\xe0").contains("notrack prefix"));
        assert!(reason(b"\xcc").contains("(`int3`, opcode 0xcc) is one the kernel does not"));
        assert!(reason(b"\xf4").contains("`hlt`"));
        assert!(reason(b"\xcd\x80").contains("opcode 0xcd"));
        assert!(reason(b"\x8e\xd0").contains("loads SS"));
        assert!(reason(b"\x06").contains("are not a valid x86-64 instruction"));
        assert_eq!(reason(b""), "its code is not in the file");
        assert!(reason(b"\x0f").contains("(0f) are not a valid"));
    }
}
