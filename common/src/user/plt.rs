//! The PLT stubs of an x86-64 ELF file, named as `objdump -d` and perf name
//! them: `malloc@plt` for the stub through which the file calls `malloc`. No
//! symbol covers a stub, so a symbolizer names a sample there by the symbol
//! before the section (`_init`), and BCC leaves it unknown.
//!
//! A stub is found by its `jmp *GOT(%rip)`: in `.plt` (lazy binding: one
//! after the header), `.plt.sec` (with IBT, the stubs proper) and `.plt.got`
//! (functions bound at load). The GOT slot it jumps through has a dynamic
//! relocation that names the function; a slot filled by an IFUNC's resolver
//! (`R_X86_64_IRELATIVE`, libc's calls of its own string functions) is named
//! by the IFUNC whose resolver it is, where objdump says `*ABS*+0x9f550@plt`.

use std::collections::HashMap;
use std::path::Path;

use object::read::elf::ElfFile64;
use object::{
    Endianness, Object, ObjectSection, ObjectSymbol, ObjectSymbolTable, ReadCache, RelocationTarget,
};

use crate::user::elf::{open_binary, plainness};

/// The sections stubs are in, and the size of each entry where the section
/// does not say (`sh_entsize` 0).
const SECTIONS: [(&str, u64); 3] = [(".plt", 16), (".plt.sec", 16), (".plt.got", 8)];

/// A file's PLT stubs, sorted by address.
#[derive(Debug, Default)]
pub struct Plt {
    stubs: Vec<Stub>,
}

#[derive(Debug)]
struct Stub {
    /// The file's virtual address, and the file offset, of its first byte.
    addr: u64,
    offset: u64,
    size: u64,
    /// With `@plt`.
    name: String,
}

impl Plt {
    /// The stubs of the ELF file at `path` (none for a file that cannot be
    /// read or has no PLT).
    pub fn read(path: &Path) -> Plt {
        let Ok(opened) = open_binary(path) else {
            return Plt::default();
        };
        let cache = ReadCache::new(&opened.file);
        let Ok(file) = ElfFile64::<Endianness, _>::parse(&cache) else {
            return Plt::default();
        };
        let sections: Vec<_> = SECTIONS
            .iter()
            .filter_map(|&(name, size)| Some((file.section_by_name(name)?, size)))
            .collect();
        if sections.is_empty() {
            return Plt::default(); // its relocations and symbols are not read
        }
        let slots = slot_names(&file);
        let mut stubs = Vec::new();
        for (s, default_size) in sections {
            let Ok(code) = s.data() else {
                continue;
            };
            let size = match s.elf_section_header().sh_entsize.get(file.endian()) {
                0 => default_size,
                n => n,
            };
            let Some((offset, _)) = s.file_range() else {
                continue;
            };
            for (i, entry) in code.chunks_exact(size as usize).enumerate() {
                let at = s.address() + i as u64 * size;
                if let Some(f) = jump_slot(entry, at).and_then(|slot| slots.get(&slot)) {
                    stubs.push(Stub {
                        addr: at,
                        offset: offset + i as u64 * size,
                        size,
                        name: format!("{f}@plt"),
                    });
                }
            }
        }
        // The sections are in one segment: by offset too, in that order.
        stubs.sort_unstable_by_key(|s| s.addr);
        Plt { stubs }
    }

    /// The stub holding file address `addr`: its name and `addr`'s offset in it.
    pub fn stub_at(&self, addr: u64) -> Option<(&str, u64)> {
        self.stub_by(addr, |s| s.addr)
    }

    /// The stub holding file offset `offset`, as [`Plt::stub_at`].
    pub fn stub_at_offset(&self, offset: u64) -> Option<(&str, u64)> {
        self.stub_by(offset, |s| s.offset)
    }

    /// The stub whose `start` (its address, or its offset: both sorted) is
    /// at or below `at` and holds it.
    fn stub_by(&self, at: u64, start: impl Fn(&Stub) -> u64) -> Option<(&str, u64)> {
        let i = self
            .stubs
            .partition_point(|s| start(s) <= at)
            .checked_sub(1)?;
        let s = &self.stubs[i];
        (at < start(s) + s.size).then(|| (s.name.as_str(), at - start(s)))
    }
}

/// The GOT slot that the stub `entry` at address `at` jumps through: its
/// first `jmp *disp32(%rip)` (ff 25; after endbr64 and a bnd prefix with
/// IBT, after the header's push in the first entry of `.plt`, which jumps
/// through a slot of no relocation).
fn jump_slot(entry: &[u8], at: u64) -> Option<u64> {
    let i = entry.windows(2).position(|w| w == [0xff, 0x25])?;
    let disp = i32::from_le_bytes(entry.get(i + 2..i + 6)?.try_into().ok()?);
    // rip-relative: from the end of the 6-byte instruction.
    Some((at + i as u64 + 6).wrapping_add_signed(disp.into()))
}

/// Per GOT slot with a dynamic relocation, the function it is filled with.
fn slot_names<'a, R: object::ReadRef<'a>>(
    file: &ElfFile64<'a, Endianness, R>,
) -> HashMap<u64, String> {
    let mut names = HashMap::new();
    let Some(relocs) = file.dynamic_relocations() else {
        return names;
    };
    let dynsym = file.dynamic_symbol_table();
    // IFUNCs by their resolver's address, for IRELATIVE slots; of the
    // aliases there the plainest (rawmemchr, not __rawmemchr).
    let mut ifuncs: HashMap<u64, &str> = HashMap::new();
    for sym in file.dynamic_symbols().chain(file.symbols()) {
        if sym.elf_symbol().st_type() != object::elf::STT_GNU_IFUNC {
            continue;
        }
        let Ok(n) = sym.name() else { continue };
        let e = ifuncs.entry(sym.address()).or_insert(n);
        if plainness(n) < plainness(e) {
            *e = n;
        }
    }
    for (slot, r) in relocs {
        let name = match r.target() {
            RelocationTarget::Symbol(i) => dynsym
                .as_ref()
                .and_then(|t| t.symbol_by_index(i).ok())
                .and_then(|s| s.name().ok().map(str::to_string)),
            RelocationTarget::Absolute => ifuncs.get(&(r.addend() as u64)).map(|n| n.to_string()),
            _ => None,
        };
        if let Some(n) = name.filter(|n| !n.is_empty()) {
            names.insert(slot, n);
        }
    }
    names
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    /// `objdump -d`'s `<name@plt>` labels of `path`: (address, name).
    fn objdump_stubs(path: &Path) -> Vec<(u64, String)> {
        let out = Command::new("objdump")
            .args(["-d", "--no-show-raw-insn"])
            .arg(path)
            .output()
            .expect("objdump (binutils)");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| {
                let (addr, rest) = l.split_once(" <")?;
                let name = rest.strip_suffix(">:")?;
                name.ends_with("@plt")
                    .then(|| (u64::from_str_radix(addr.trim(), 16).ok(), name.to_string()))
                    .and_then(|(a, n)| Some((a?, n)))
            })
            .collect()
    }

    #[test]
    fn stubs_are_named_as_objdump_names_them() {
        // Debian's packaged binaries: ls's .plt and .plt.got, and libc's,
        // whose calls of its own IFUNCs objdump leaves as *ABS*+0x...@plt.
        let libc = crate::user::targets::resolve("c", None).unwrap();
        for path in [Path::new("/usr/bin/ls"), libc.as_path()] {
            let plt = Plt::read(path);
            let want = objdump_stubs(path);
            assert!(want.len() > 10, "{}: {want:?}", path.display());
            let mut irelative = 0;
            for (addr, name) in &want {
                let got = plt.stub_at(*addr).map(|(n, off)| (n.to_string(), off));
                if name.starts_with("*ABS*") {
                    irelative += 1;
                    let (n, off) = got.unwrap_or_else(|| panic!("{name} at {addr:#x}"));
                    assert!(
                        n.ends_with("@plt") && !n.starts_with('*') && off == 0,
                        "{n}"
                    );
                } else {
                    assert_eq!(
                        got,
                        Some((name.clone(), 0)),
                        "{} at {addr:#x}",
                        path.display()
                    );
                }
                // A byte inside, and by file offset alike.
                assert_eq!(plt.stub_at(addr + 7).map(|s| s.1), Some(7));
                let i = plt.stubs.iter().position(|s| s.addr == *addr).unwrap();
                let off = plt.stubs[i].offset;
                assert_eq!(plt.stub_at_offset(off + 3), plt.stub_at(addr + 3));
            }
            assert_eq!(plt.stubs.len(), want.len(), "{}", path.display());
            if path == libc {
                assert!(irelative > 5, "libc's IRELATIVE stubs: {irelative}");
            }
        }
    }

    #[test]
    fn libc_calls_its_own_string_functions_through_stubs_named_by_their_ifunc() {
        let libc = crate::user::targets::resolve("c", None).unwrap();
        let plt = Plt::read(&libc);
        let names: Vec<&str> = plt.stubs.iter().map(|s| s.name.as_str()).collect();
        for f in ["memcpy@plt", "strlen@plt", "rawmemchr@plt"] {
            assert!(names.contains(&f), "{f} not in {names:?}");
        }
    }

    #[test]
    fn no_stub_outside_the_sections() {
        let plt = Plt::read(Path::new("/usr/bin/ls"));
        assert!(!plt.stubs.is_empty());
        assert_eq!(plt.stub_at(0), None);
        let last = plt.stubs.last().unwrap();
        assert_eq!(plt.stub_at(last.addr + last.size), None);
        assert!(Plt::read(Path::new("/etc/passwd")).stubs.is_empty());
    }
}
