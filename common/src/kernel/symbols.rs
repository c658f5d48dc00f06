//! The kernel's text symbols, for naming kernel stack frames without reading
//! /proc/kallsyms at every run.
//!
//! Reading /proc/kallsyms costs about 50 ms of kernel time on the host (the
//! kernel prints 120,000 lines at each read), most of what naming a profile's
//! few kernel stacks costs. Its symbols change only at boot and when modules
//! come or go, so the text symbols are kept, sorted by address, in the cache
//! directory beside the function table (`kernel::functions::cache`), keyed the
//! same way (boot id and module list). A lookup there is a binary search over
//! the mapped file.
//!
//! Only addresses in the core kernel's text (`_stext` to `_etext`, and its init
//! text, `_sinittext` to `_einittext`, where the idle task's stack begins) and
//! in a loaded module's are named here. The rest of the module area holds what comes
//! and goes without a module (BPF programs, ftrace and kprobe trampolines):
//! [`KernelSymbols::lookup`] leaves those to the caller, which asks the live
//! /proc/kallsyms.

use std::fmt::Write as _;

use crate::kernel::functions::cache::{self, Key};

/// The kernel's text symbols (from the cache, or read and cached now), and the
/// address ranges they name.
pub struct KernelSymbols {
    text: Text,
    /// Where each symbol line of `text` starts (after the header), in address
    /// order.
    lines: Vec<u32>,
    /// `_stext`..`_etext` and `_sinittext`..`_einittext`.
    core: Vec<(u64, u64)>,
    /// Loaded modules' [start, end), from /proc/modules.
    modules: Vec<(u64, u64)>,
}

enum Text {
    Mapped(memmap2::Mmap),
    Read(Vec<u8>),
}

impl std::ops::Deref for Text {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Text::Mapped(m) => m,
            Text::Read(v) => v,
        }
    }
}

/// The cached file's format: "tracekit-ksyms 2", the key line, "text START
/// END..." (the core text ranges), then "ADDR NAME" lines (16 hex digits,
/// sorted), then "end COUNT".
const MAGIC: &str = "tracekit-ksyms 2";

impl KernelSymbols {
    /// This boot's symbols: cached, or read from /proc/kallsyms and cached.
    /// None when the kernel hides its addresses (kptr_restrict) or lists no
    /// `_stext`/`_etext`.
    pub fn load() -> Option<KernelSymbols> {
        // One read of the module list: their ranges, and the cache's key.
        let modules_text = std::fs::read_to_string("/proc/modules").unwrap_or_default();
        let modules = module_ranges(&modules_text);
        let key = Key::of_modules(&modules_text);
        let dir = cache::dir();
        let use_cache = !cache::disabled() && key.is_some();
        if use_cache {
            let key = key.as_ref().expect("checked");
            if let Ok(m) = cache::load_symbols(&dir, key, MAGIC) {
                if let Some(s) = Self::parse(Text::Mapped(m), &modules) {
                    return Some(s);
                }
            }
        }
        let kallsyms = std::fs::read_to_string("/proc/kallsyms").ok()?;
        let body = render(&kallsyms)?;
        let header = match &key {
            Some(k) => cache::header(k),
            None => String::from("-"),
        };
        let text = format!("{MAGIC}\n{header}\n{body}");
        if use_cache {
            cache::store_symbols(&dir, &text);
        }
        Self::parse(Text::Read(text.into_bytes()), &modules)
    }

    /// Checks and indexes a cache file's text; None when it is not whole.
    fn parse(text: Text, modules: &[(u64, u64)]) -> Option<KernelSymbols> {
        let mut at = 0;
        let mut next_line = |text: &[u8]| -> Option<(usize, usize)> {
            let len = text.get(at..)?.iter().position(|&b| b == b'\n')?;
            let line = (at, at + len);
            at += len + 1;
            Some(line)
        };
        let (_magic, _key) = (next_line(&text)?, next_line(&text)?);
        let (s, e) = next_line(&text)?;
        let core_line = std::str::from_utf8(&text[s..e]).ok()?;
        let bounds: Vec<u64> = core_line
            .strip_prefix("text ")?
            .split(' ')
            .map(|w| u64::from_str_radix(w, 16).ok())
            .collect::<Option<_>>()?;
        if bounds.is_empty() || !bounds.len().is_multiple_of(2) {
            return None;
        }
        let core = bounds.chunks(2).map(|b| (b[0], b[1])).collect();
        let mut lines = Vec::new();
        loop {
            let (s, e) = next_line(&text)?;
            if let Some(n) = text[s..e].strip_prefix(b"end ") {
                let n: usize = std::str::from_utf8(n).ok()?.parse().ok()?;
                if n != lines.len() || at != text.len() {
                    return None;
                }
                break;
            }
            // "ADDR NAME": 16 hex digits, a space, a name.
            if e - s < 18 || text[s + 16] != b' ' {
                return None;
            }
            lines.push(u32::try_from(s).ok()?);
        }
        Some(KernelSymbols {
            text,
            lines,
            core,
            modules: modules.to_vec(),
        })
    }

    fn addr_at(&self, line: usize) -> u64 {
        let s = self.lines[line] as usize;
        std::str::from_utf8(&self.text[s..s + 16])
            .ok()
            .and_then(|h| u64::from_str_radix(h, 16).ok())
            .unwrap_or(u64::MAX)
    }

    fn name_at(&self, line: usize) -> &str {
        let s = self.lines[line] as usize + 17;
        let end = self.text[s..]
            .iter()
            .position(|&b| b == b'\n')
            .map_or(self.text.len(), |n| s + n);
        std::str::from_utf8(&self.text[s..end]).unwrap_or("")
    }

    /// The function holding `addr` and the offset into it, when `addr` is in
    /// the core kernel's text or a loaded module's; None otherwise (a BPF
    /// program, a trampoline, an address of no text), for the live kallsyms.
    pub fn lookup(&self, addr: u64) -> Option<(&str, u64)> {
        let inside = self
            .core
            .iter()
            .chain(&self.modules)
            .any(|&(s, e)| addr >= s && addr < e);
        if !inside {
            return None;
        }
        let mut line = self.lines_partition(addr).checked_sub(1)?;
        let start = self.addr_at(line);
        // Of aliases, the first listed (as blazesym names them).
        while line > 0 && self.addr_at(line - 1) == start {
            line -= 1;
        }
        Some((self.name_at(line), addr - start))
    }

    /// How many symbols start at or below `addr`.
    fn lines_partition(&self, addr: u64) -> usize {
        let (mut lo, mut hi) = (0, self.lines.len());
        while lo < hi {
            let mid = (lo + hi) / 2;
            if self.addr_at(mid) <= addr {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo
    }
}

/// The cache body of /proc/kallsyms: "text _stext _etext [_sinittext
/// _einittext]", then its text
/// symbols (types t, T, w, W) of the kernel and of real modules, sorted by
/// address (stably: of aliases, the first listed comes first), then "end
/// COUNT". None when the addresses
/// are hidden (all zero) or `_stext`/`_etext` are missing.
fn render(kallsyms: &str) -> Option<String> {
    let (mut stext, mut etext, mut sinit, mut einit) = (None, None, None, None);
    let mut syms: Vec<(u64, &str)> = Vec::with_capacity(128 * 1024);
    for line in kallsyms.lines() {
        let mut w = line.split_ascii_whitespace();
        let (Some(addr), Some(ty), Some(name)) = (w.next(), w.next(), w.next()) else {
            continue;
        };
        let Ok(addr) = u64::from_str_radix(addr, 16) else {
            continue;
        };
        match name {
            "_stext" => stext = Some(addr),
            "_etext" => etext = Some(addr),
            "_sinittext" => sinit = Some(addr),
            "_einittext" => einit = Some(addr),
            _ => {}
        }
        // Pseudo-modules ([bpf], [__builtin__ftrace], [__builtin__kprobes])
        // come and go within a boot: never cached.
        if w.next()
            .is_some_and(|m| m == "[bpf]" || m.starts_with("[__builtin"))
        {
            continue;
        }
        if addr != 0 && matches!(ty, "t" | "T" | "w" | "W") {
            syms.push((addr, name));
        }
    }
    let (stext, etext) = (stext?, etext?);
    if stext == 0 || syms.is_empty() {
        return None;
    }
    syms.sort_by_key(|s| s.0);
    let mut out = String::with_capacity(syms.len() * 40);
    let _ = write!(out, "text {stext:x} {etext:x}");
    if let (Some(s), Some(e)) = (sinit, einit) {
        let _ = write!(out, " {s:x} {e:x}");
    }
    out.push('\n');
    for (addr, name) in &syms {
        let _ = writeln!(out, "{addr:016x} {name}");
    }
    let _ = writeln!(out, "end {}", syms.len());
    Some(out)
}

/// Each loaded module's [start, end) from /proc/modules ("name size refs deps
/// state address"); none where addresses are hidden.
fn module_ranges(text: &str) -> Vec<(u64, u64)> {
    text.lines()
        .filter_map(|l| {
            let w: Vec<&str> = l.split_ascii_whitespace().collect();
            let size: u64 = w.get(1)?.parse().ok()?;
            let start = u64::from_str_radix(w.get(5)?.strip_prefix("0x")?, 16).ok()?;
            (start != 0).then_some((start, start + size))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const KALLSYMS: &str = "\
ffffffff81000000 T _stext
ffffffff81000000 T startup_64
ffffffff81001000 t early_helper
ffffffff81002000 T vfs_read
ffffffff81002000 T vfs_read_alias
ffffffff81003000 D some_data
ffffffff81004000 T _etext
ffffffff82000000 T _sinittext
ffffffff82000010 T start_kernel
ffffffff82001000 T _einittext
ffffffffc0001000 t mod_func\t[mymod]
ffffffffc0100000 t bpf_prog_1234_x\t[bpf]
ffffffffc0200000 t ftrace_trampoline\t[__builtin__ftrace]
";

    fn symbols(kallsyms: &str) -> KernelSymbols {
        let text = format!("{MAGIC}\n-\n{}", render(kallsyms).unwrap());
        KernelSymbols::parse(
            Text::Read(text.into_bytes()),
            &[(0xffffffffc0001000, 0xffffffffc0002000)],
        )
        .unwrap()
    }

    #[test]
    fn kernel_text_and_module_addresses_are_named_the_rest_left_to_kallsyms() {
        let s = symbols(KALLSYMS);
        assert_eq!(s.lookup(0xffffffff81002010), Some(("vfs_read", 0x10)));
        assert_eq!(s.lookup(0xffffffff81001fff), Some(("early_helper", 0xfff)));
        assert_eq!(s.lookup(0xffffffffc0001004), Some(("mod_func", 4)));
        assert_eq!(s.lookup(0xffffffff82000020), Some(("start_kernel", 0x10)));
        // A BPF program, a trampoline, data past _etext: not here.
        assert_eq!(s.lookup(0xffffffffc0100004), None);
        assert_eq!(s.lookup(0xffffffffc0200004), None);
        assert_eq!(s.lookup(0xffffffff81004000), None);
        assert_eq!(s.lookup(0x1000), None);
    }

    #[test]
    fn hidden_addresses_or_a_cut_file_give_no_table() {
        let hidden = KALLSYMS
            .lines()
            .map(|l| format!("0000000000000000{}\n", &l[16..]))
            .collect::<String>();
        assert!(render(&hidden).is_none());
        let whole = format!("{MAGIC}\n-\n{}", render(KALLSYMS).unwrap());
        let cut = &whole[..whole.len() - 10];
        assert!(KernelSymbols::parse(Text::Read(cut.as_bytes().to_vec()), &[]).is_none());
    }

    #[test]
    fn this_kernel_s_functions_are_named_as_kallsyms_names_them() {
        // The host's own table (cached or read now) against /proc/kallsyms.
        let Some(s) = KernelSymbols::load() else {
            return; // addresses hidden from this user
        };
        let kallsyms = std::fs::read_to_string("/proc/kallsyms").unwrap();
        let addr_of = |want: &str| {
            kallsyms.lines().find_map(|l| {
                let w: Vec<&str> = l.split_whitespace().collect();
                (w.len() == 3 && w[2] == want).then(|| u64::from_str_radix(w[0], 16).unwrap())
            })
        };
        for f in ["vfs_read", "do_syscall_64", "schedule"] {
            let a = addr_of(f).unwrap_or_else(|| panic!("{f} not in kallsyms"));
            assert_eq!(s.lookup(a + 3), Some((f, 3)), "{f}");
        }
    }
}
