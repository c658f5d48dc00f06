//! The set of kernel functions that can be traced, read once per run.
//!
//! Source of truth is ftrace's `available_filter_functions_addrs` (kernel 6.5+), else
//! `available_filter_functions` reconciled with `/proc/kallsyms` for addresses. Functions
//! on the kprobe blacklist or on a deny list of functions known to hang or recurse when
//! traced are removed. A kprobe_multi link fails as a whole on one untraceable address,
//! which is why nothing outside ftrace's list is ever offered.

use std::collections::{HashMap, HashSet};
use std::fs;

use anyhow::{Context, Result};

use crate::kcache;
use crate::pattern::Matcher;
use crate::tracefs;

/// Functions that are traceable in ftrace's eyes but hang, recurse or trip RCU
/// when BPF runs on them (the union of the lists kept by the kernel's kprobe_multi
/// selftests, bpftrace and retsnoop).
/// Each entry is a name or `PREFIX*` (see [`denied`]).
pub const DENY_LIST: &[&str] = &[
    "arch_cpu_idle",
    "default_idle",
    "bpf_dispatcher_xdp_func",
    "__ftrace_invalid_address__*",
    "rcu_*",
    "__rcu_*",
    "migrate_enable",
    "migrate_disable",
    "preempt_count_add",
    "preempt_count_sub",
    "bpf_get_smp_processor_id",
    "bpf_get_numa_node_id",
    "__bpf_prog_enter*",
    "__bpf_prog_exit*",
    "__bpf_tramp_enter*",
    "__bpf_tramp_exit*",
    "bpf_spin_lock",
    "bpf_spin_unlock",
    "update_prog_stats",
    "inc_misses_counter",
    "bpf_prog_start_time",
];

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelFunc {
    pub name: String,
    /// The module that defines it, `None` for vmlinux.
    pub module: Option<String>,
    /// Entry addresses of every traceable instance (static functions may share a
    /// name). Empty when instances could not be told apart; then the kernel resolves
    /// the name itself and traces its first traceable instance.
    pub addrs: Vec<u64>,
}

#[derive(Debug)]
pub struct KernelFuncs {
    /// Sorted by name, one entry per name.
    funcs: Vec<KernelFunc>,
    /// Where the list came from, for `-D`.
    pub source: String,
    /// How it was obtained this run (the cache, or the kernel and why), for the
    /// `timing:` line.
    pub how: &'static str,
    /// How many traceable names the deny list and kprobe blacklist removed.
    pub removed: usize,
    removed_names: HashSet<String>,
    /// How many traceable functions the kernel has (`funcs` may hold only those a
    /// run asked for, when they came from the cache).
    total: usize,
}

impl KernelFuncs {
    /// The traceable functions of the running kernel, at least those whose names
    /// `wanted` accepts: from the cache when it is fresh ([`crate::kcache`]), else
    /// read from the kernel (and cached).
    pub fn load(wanted: &dyn Fn(&str) -> bool) -> Result<Self> {
        let tracefs = tracefs::tracefs()?;
        crate::system::require_kernel_functions(tracefs)?;
        let (key, miss) = match Self::cached(wanted) {
            Ok(k) => return Ok(k),
            Err(m) => m,
        };
        let mut k = Self::read(tracefs)?;
        k.how = miss;
        if let Some(key) = key {
            kcache::store(&kcache::dir(), &key, &k.table());
        }
        Ok(k)
    }

    /// The cached table when it is fresh; else the cache key (if any) and why the
    /// cache was not used. The caller has checked that kernel functions can be
    /// traced at all.
    pub fn cached(
        wanted: &dyn Fn(&str) -> bool,
    ) -> Result<Self, (Option<kcache::Key>, &'static str)> {
        if kcache::disabled() {
            return Err((None, "kernel, cache off"));
        }
        let Some(key) = kcache::Key::current() else {
            return Err((None, "kernel, no boot id"));
        };
        match kcache::load(&kcache::dir(), &key, wanted) {
            Ok(t) => Ok(Self::from_table(t)),
            Err(kcache::Miss::Absent) => Err((Some(key), "kernel, no cache yet")),
            Err(kcache::Miss::Stale) => Err((Some(key), "kernel, cache stale")),
            Err(kcache::Miss::Corrupt) => Err((Some(key), "kernel, cache unreadable")),
        }
    }

    /// Reads the kernel's lists.
    fn read(tracefs: &std::path::Path) -> Result<Self> {
        let addrs_file = tracefs.join("available_filter_functions_addrs");
        let kallsyms = fs::read_to_string("/proc/kallsyms").unwrap_or_default();
        let (funcs, source) = if let Ok(text) = fs::read_to_string(&addrs_file) {
            (
                to_entry_addrs(parse_aff_addrs(&text), &kallsyms),
                "available_filter_functions_addrs + /proc/kallsyms",
            )
        } else {
            let aff = tracefs.join("available_filter_functions");
            let text =
                fs::read_to_string(&aff).with_context(|| format!("reading {}", aff.display()))?;
            (
                reconcile(&text, &kallsyms),
                "available_filter_functions + /proc/kallsyms",
            )
        };
        Ok(Self::from_parts(funcs, source, &blacklist()))
    }

    fn from_table(t: kcache::Table) -> Self {
        KernelFuncs {
            funcs: t.funcs,
            source: format!("cache of {}", t.source),
            how: "cache",
            removed: t.removed.len(),
            removed_names: t.removed.into_iter().collect(),
            total: t.total,
        }
    }

    fn table(&self) -> kcache::Table {
        let mut removed: Vec<String> = self.removed_names.iter().cloned().collect();
        removed.sort();
        kcache::Table {
            source: self.source.clone(),
            funcs: self.funcs.clone(),
            total: self.funcs.len(),
            removed,
        }
    }

    fn from_parts(
        mut funcs: Vec<KernelFunc>,
        source: &'static str,
        blacklist: &HashSet<String>,
    ) -> Self {
        let mut removed_names = HashSet::new();
        funcs.retain(|f| {
            let bad = blacklist.contains(&f.name) || denied(&f.name);
            if bad {
                removed_names.insert(f.name.clone());
            }
            !bad
        });
        funcs.sort_by(|a, b| a.name.cmp(&b.name));
        KernelFuncs {
            total: funcs.len(),
            funcs,
            source: source.to_string(),
            how: "kernel",
            removed: removed_names.len(),
            removed_names,
        }
    }

    /// How many traceable functions the kernel has.
    pub fn len(&self) -> usize {
        self.total
    }

    pub fn is_empty(&self) -> bool {
        self.total == 0
    }

    /// Every traceable function whose name the matcher accepts, in name order.
    pub fn matching<'a>(&'a self, m: &'a Matcher) -> Box<dyn Iterator<Item = &'a KernelFunc> + 'a> {
        match m.literal() {
            Some(name) => Box::new(self.get(name).into_iter()),
            None => Box::new(self.funcs.iter().filter(|f| m.is_match(&f.name))),
        }
    }

    pub fn get(&self, name: &str) -> Option<&KernelFunc> {
        self.funcs
            .binary_search_by(|f| f.name.as_str().cmp(name))
            .ok()
            .map(|i| &self.funcs[i])
    }

    /// True when `name` is traceable but was removed as unsafe to trace.
    pub fn is_removed(&self, name: &str) -> bool {
        self.removed_names.contains(name)
    }
}

/// Whether the deny list names `name`. Its entries are names or `PREFIX*`, matched
/// here without compiling them into regular expressions (that took longer than
/// the rest of a one-function run's table work under emulation).
fn denied(name: &str) -> bool {
    DENY_LIST.iter().any(|d| match d.strip_suffix('*') {
        Some(prefix) => name.starts_with(prefix),
        None => name == *d,
    })
}

/// Whether `name` is unsafe to trace (the deny list or the kprobe blacklist), for
/// a function named exactly, without reading the traceable-function table: the
/// kernel resolves the name when it attaches, and refuses one it cannot trace.
pub fn unsafe_to_trace(name: &str) -> bool {
    denied(name) || blacklist().contains(name)
}

/// The kprobe blacklist (debugfs), empty when unreadable; cached as the table is.
fn blacklist() -> HashSet<String> {
    let key = (!kcache::disabled()).then(kcache::Key::current).flatten();
    if let Some(key) = &key {
        if let Ok(names) = kcache::load_blacklist(&kcache::dir(), key) {
            return names.into_iter().collect();
        }
    }
    let names = tracefs::debugfs()
        .and_then(|d| fs::read_to_string(d.join("kprobes/blacklist")).ok())
        .map(|t| parse_blacklist(&t));
    if let (Some(key), Some(names)) = (&key, &names) {
        kcache::store_blacklist(&kcache::dir(), key, names.iter());
    }
    names.unwrap_or_default()
}

/// Text symbols of kallsyms as (address, name without `.llvm.HASH`).
fn text_symbols(kallsyms: &str) -> impl Iterator<Item = (u64, &str)> {
    kallsyms.lines().filter_map(|line| {
        let mut f = line.split_whitespace();
        let (addr, ty, name) = (f.next()?, f.next()?, f.next()?);
        if !matches!(ty, "t" | "T" | "w" | "W") {
            return None;
        }
        // Clang LTO renames statics to NAME.llvm.HASH in kallsyms only.
        let name = name.split(".llvm.").next().unwrap_or(name);
        Some((u64::from_str_radix(addr, 16).ok()?, name))
    })
}

/// Rewrites ftrace call-site addresses (`_addrs` gives `sym+4` after an IBT `endbr`)
/// to the functions' entry addresses from kallsyms: the kernel looks a kprobe_multi
/// cookie up by the entry address (`get_entry_ip()` steps back over the `endbr`, or
/// its sealed form), so a call-site address would lose the cookie. A function
/// with an instance that cannot be mapped is left to the kernel by name.
fn to_entry_addrs(mut funcs: Vec<KernelFunc>, kallsyms: &str) -> Vec<KernelFunc> {
    let mut syms: Vec<(u64, &str)> = text_symbols(kallsyms).filter(|s| s.0 != 0).collect();
    syms.sort_unstable();
    for f in &mut funcs {
        let entries: Option<Vec<u64>> = f
            .addrs
            .iter()
            .map(|&site| {
                let i = syms.partition_point(|s| s.0 <= site).checked_sub(1)?;
                let (start, name) = syms[i];
                // The call site sits within the first instructions of its function.
                (name == f.name && site - start < 32).then_some(start)
            })
            .collect();
        f.addrs = entries.unwrap_or_default();
    }
    funcs
}

/// `available_filter_functions_addrs`: `ADDR NAME [MODULE]` per traceable instance.
fn parse_aff_addrs(text: &str) -> Vec<KernelFunc> {
    let mut by_name: HashMap<&str, KernelFunc> = HashMap::new();
    for line in text.lines() {
        let mut f = line.split_whitespace();
        let (Some(addr), Some(name)) = (f.next(), f.next()) else {
            continue;
        };
        let Ok(addr) = u64::from_str_radix(addr, 16) else {
            continue;
        };
        let module = f.next().map(|m| m.trim_matches(|c| c == '[' || c == ']'));
        by_name
            .entry(name)
            .or_insert_with(|| KernelFunc {
                name: name.to_string(),
                module: module.map(str::to_string),
                addrs: Vec::new(),
            })
            .addrs
            .push(addr);
    }
    by_name.into_values().collect()
}

/// Joins `available_filter_functions` (`NAME [MODULE]`, no addresses before 6.5)
/// with kallsyms. A name whose kallsyms instances outnumber its traceable ones
/// cannot be resolved to the right addresses, so it is left to the kernel by name.
fn reconcile(aff: &str, kallsyms: &str) -> Vec<KernelFunc> {
    let mut funcs: HashMap<&str, (Option<&str>, usize)> = HashMap::new();
    for line in aff.lines() {
        let mut f = line.split_whitespace();
        let Some(name) = f.next() else { continue };
        let module = f.next().map(|m| m.trim_matches(|c| c == '[' || c == ']'));
        funcs.entry(name).or_insert((module, 0)).1 += 1;
    }
    let mut addrs: HashMap<&str, Vec<u64>> = HashMap::new();
    for (addr, name) in text_symbols(kallsyms) {
        if let Some((key, _)) = funcs.get_key_value(name) {
            addrs.entry(key).or_default().push(addr);
        }
    }
    funcs
        .into_iter()
        .filter_map(|(name, (module, count))| {
            // Not in kallsyms at all: a placeholder such as __ftrace_invalid_address__.
            let found = addrs.remove(name)?;
            // Zero addresses mean kptr_restrict hides them.
            let exact = found.len() == count && found.iter().all(|&a| a != 0);
            Some(KernelFunc {
                name: name.to_string(),
                module: module.map(str::to_string),
                addrs: if exact { found } else { Vec::new() },
            })
        })
        .collect()
}

/// debugfs `kprobes/blacklist`: `0xSTART-0xEND\tNAME` per line.
fn parse_blacklist(text: &str) -> HashSet<String> {
    text.lines()
        .filter_map(|l| l.split_whitespace().nth(1).map(str::to_string))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(k: &KernelFuncs, pat: &str) -> Vec<String> {
        let m = Matcher::glob(pat).unwrap();
        k.matching(&m).map(|f| f.name.clone()).collect()
    }

    #[test]
    fn addrs_file_groups_instances() {
        let text = "ffffffff81000010 vfs_read\nffffffff81000020 t_start\n\
                    ffffffff81000030 t_start\nffffffffc0001000 ext4_sync_fs [ext4]\n";
        let k = KernelFuncs::from_parts(parse_aff_addrs(text), "t", &HashSet::new());
        assert_eq!(k.len(), 3);
        assert_eq!(k.get("t_start").unwrap().addrs.len(), 2);
        let e = k.get("ext4_sync_fs").unwrap();
        assert_eq!(e.module.as_deref(), Some("ext4"));
        assert_eq!(e.addrs, vec![0xffffffffc0001000]);
    }

    #[test]
    fn call_sites_become_entry_addresses() {
        // IBT kernels: the ftrace call site is 4 bytes past the symbol (endbr64).
        let text =
            "ffffffff81000014 vfs_read\nffffffff81000044 t_start\nffffffff81000074 t_start\n\
                    ffffffff81000104 lonely\n";
        let kallsyms = "ffffffff81000010 T vfs_read\nffffffff81000040 t t_start\n\
                        ffffffff81000070 t t_start\nffffffff81000100 t other\n";
        let funcs = to_entry_addrs(parse_aff_addrs(text), kallsyms);
        let k = KernelFuncs::from_parts(funcs, "t", &HashSet::new());
        assert_eq!(k.get("vfs_read").unwrap().addrs, vec![0xffffffff81000010]);
        let mut t = k.get("t_start").unwrap().addrs.clone();
        t.sort();
        assert_eq!(t, vec![0xffffffff81000040, 0xffffffff81000070]);
        // The enclosing symbol has another name: leave it to the kernel by name.
        assert!(k.get("lonely").unwrap().addrs.is_empty());
    }

    #[test]
    fn reconcile_uses_addresses_only_when_counts_agree() {
        let aff = "vfs_read\nt_start\ns_show\ns_show\next4_sync_fs [ext4]\n__ftrace_invalid_address___64\n";
        let kallsyms = "ffffffff81000010 T vfs_read\n\
                        ffffffff81000020 t t_start\nffffffff81000030 t t_start\n\
                        ffffffff81000040 t s_show\nffffffff81000050 t s_show.llvm.123\n\
                        ffffffff81000060 D vfs_read_data\n\
                        ffffffffc0001000 t ext4_sync_fs\t[ext4]\n";
        let funcs = reconcile(aff, kallsyms);
        let k = KernelFuncs::from_parts(funcs, "t", &HashSet::new());
        assert_eq!(k.get("vfs_read").unwrap().addrs, vec![0xffffffff81000010]);
        // Two kallsyms instances, one traceable: cannot tell which, resolve by name.
        assert!(k.get("t_start").unwrap().addrs.is_empty());
        assert_eq!(k.get("s_show").unwrap().addrs.len(), 2);
        assert_eq!(
            k.get("ext4_sync_fs").unwrap().module.as_deref(),
            Some("ext4")
        );
        assert!(k.get("__ftrace_invalid_address___64").is_none());
    }

    #[test]
    fn deny_list_entries_are_names_or_prefixes() {
        for d in DENY_LIST {
            let body = d.strip_suffix('*').unwrap_or(d);
            assert!(!body.contains(['*', '?']), "{d}");
        }
        assert!(denied("rcu_note_context_switch"));
        assert!(denied("__bpf_prog_enter_recur"));
        assert!(denied("migrate_disable"));
        assert!(!denied("migrate_disable_x"));
        assert!(!denied("vfs_read"));
    }

    #[test]
    fn deny_list_and_blacklist_remove() {
        let text =
            "1 vfs_read\n2 rcu_read_lock_held\n3 default_idle\n4 kprobe_handler\n5 vfs_write\n";
        let bl = parse_blacklist("0x4-0x5\tkprobe_handler\n");
        let k = KernelFuncs::from_parts(parse_aff_addrs(text), "t", &bl);
        assert_eq!(names(&k, "*"), vec!["vfs_read", "vfs_write"]);
        assert_eq!(k.removed, 3);
        assert!(k.is_removed("default_idle"));
        assert_eq!(names(&k, "vfs_read"), vec!["vfs_read"]);
        assert!(names(&k, "nope").is_empty());
    }
}
