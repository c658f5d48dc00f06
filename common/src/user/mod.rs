//! What user binaries offer: ELF files and their symbols, debug files and build
//! IDs, PLT stubs, user-function and USDT targets, IFUNC resolution, the
//! instruction decoder that checks where a uprobe may go, and the unwind
//! tables built from their call frame information.

pub mod cfi;
pub mod elf;
pub mod ifunc;
pub mod insn;
pub mod maps;
pub mod plt;
pub mod targets;
