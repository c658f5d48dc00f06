//! The kernel function table cache: used only when fresh, and fentry decided
//! from it without a trial attach.

use crate::funccount::{funccount, vfs_read_count};
use crate::funclatency::{funclatency, hist_total};
use crate::util::*;
use crate::{assert_nothing_left, read_data, T};

/// The function table cache (TRACEKIT_CACHE_DIR here): the first run reads the
/// kernel and writes it, later runs use it and count the same (an exact name
/// too, attached by address); a table of another boot or a corrupt one is not
/// used, silently.
#[test]
#[ignore = "kernel functions: runs in guest kernels (cargo xtask test)"]
fn function_table_cache_is_used_only_when_fresh() {
    let cache = Scratch::new();
    // Counts 300 reads with `pattern`; returns the timing line's table source.
    let env = format!("TRACEKIT_CACHE_DIR={}", cache.0.display());
    let tool = funccount();
    let via = [
        "env",
        env.as_str(),
        "TRACEKIT_TIMING=1",
        tool.to_str().unwrap(),
    ];
    let count = |pattern: &str| -> String {
        let dir = Scratch::new();
        let w = read_data(&dir, 300, &[]);
        let out = trace_workload_via(&via, w, &[pattern], T);
        assert_eq!(vfs_read_count(&out), 300, "{pattern}: {}", out.stdout);
        let timing = out.stderr.lines().find(|l| l.starts_with("timing:"));
        timing
            .and_then(|l| l.split("tables ").nth(1))
            .and_then(|t| t.split(['(', ')']).nth(1))
            .unwrap_or_else(|| panic!("no table source in {}", out.stderr))
            .to_string()
    };
    // One function named exactly needs no table: the kernel resolves the name.
    assert_eq!(count("vfs_read"), "none: kernel functions by name");
    assert_eq!(count("vfs_rea*"), "kernel, no cache yet");
    assert_eq!(count("vfs_rea*"), "cache");
    // With a fresh table, an exact name is attached by its address from it.
    assert_eq!(count("vfs_read"), "cache");
    let table = cache.0.join("kfuncs");
    let text = std::fs::read_to_string(&table).unwrap();
    std::fs::write(&table, text.replacen("\nboot ", "\nboot 0", 1)).unwrap();
    assert_eq!(count("vfs_rea*"), "kernel, cache stale");
    std::fs::write(&table, "tracekit-kfuncs 1\ngarbage\n").unwrap();
    assert_eq!(count("vfs_rea*"), "kernel, cache unreadable");
    assert_eq!(count("vfs_rea*"), "cache");
    assert_nothing_left("cached-table runs");
}

#[test]
#[ignore = "kernel functions: runs in guest kernels (cargo xtask test)"]
fn fentry_is_decided_from_the_cached_table_without_a_trial_attach() {
    let cache = Scratch::new();
    let env = format!("TRACEKIT_CACHE_DIR={}", cache.0.display());
    // A wildcard run writes the function table.
    let out = run_env(&funccount(), &["-d", "0.1", "vfs_rea*"], &env);
    assert_eq!(out.code(), 0, "stderr: {}", out.stderr);
    // vfs_read is in it: fentry/fexit time exactly the reads made.
    let lat = funclatency();
    let via = ["env", env.as_str(), lat.to_str().unwrap()];
    let dir = Scratch::new();
    let w = read_data(&dir, 200, &[]);
    let out = trace_workload_via(&via, w, &["-D", "--attach-mode", "fentry", "vfs_read"], T);
    assert_contains(
        &out.stderr,
        "attach mode: kernel functions: fentry + fexit (1 functions",
    );
    assert_eq!(hist_total(&out.stdout), 200, "{}", out.stdout);
    // A table without vfs_read is taken at its word: the name is refused from
    // the table, and no trial attach (which would succeed) overrules it.
    let table = cache.0.join("kfuncs");
    let text = std::fs::read_to_string(&table).unwrap();
    let mut lines: Vec<String> = text.lines().map(String::from).collect();
    let at = lines
        .iter()
        .position(|l| l.starts_with("f vfs_read "))
        .expect("vfs_read in the table");
    lines.remove(at);
    let end = lines.last_mut().unwrap();
    let mut f = end.split(' ').skip(1);
    let (total, removed): (usize, &str) = (f.next().unwrap().parse().unwrap(), f.next().unwrap());
    *end = format!("end {} {removed}", total - 1);
    std::fs::write(&table, lines.join("\n") + "\n").unwrap();
    let out = run_env(
        &lat,
        &["--attach-mode", "fentry", "-d", "0.1", "vfs_read"],
        &env,
    );
    assert_eq!(out.code(), 1, "{}", out.stderr);
    assert_eq!(
        out.stderr,
        "funclatency: error: \"vfs_read\" is not a traceable kernel function (it may not exist, be inlined, or be marked notrace)\n"
    );
    assert_nothing_left("fentry decided from the table");
}

/// Runs `tool args` to completion with one more environment variable (`NAME=VALUE`).
fn run_env(tool: &std::path::Path, args: &[&str], env: &str) -> Output {
    let mut all = vec![env, tool.to_str().unwrap()];
    all.extend_from_slice(args);
    run(std::path::Path::new("env"), &all, T)
}
