//! Choosing how functions are attached: the `--attach-mode` a user asks for, the
//! hooks a tool needs, and the mechanism the running kernel offers for them
//! (probed, never decided by version).

use anyhow::{bail, Result};

use crate::diag::warn;
use crate::kernel::features;
use crate::kernel::functions::KernelFunc;
use crate::plan::{Options, Probe, Site};
use crate::probe::mode::{AttachMode, Hooks};

/// The mechanism chosen for one kind of function (kernel or user).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    /// One session link: one program runs at entry and return, with a per-call
    /// cookie (kprobe.session 6.10+, uprobe.session 6.13+).
    Session,
    /// kprobe_multi / uprobe_multi links: one for entries, one for returns.
    Multi,
    /// One perf-event probe per function and hook.
    Single,
    /// fentry/fexit through a BPF trampoline, for a single kernel function.
    Trampoline,
}

impl Via {
    pub(crate) fn describe(self, kernel: bool, hooks: Hooks) -> &'static str {
        match (self, kernel, hooks) {
            (Via::Session, true, _) => "kprobe.session",
            (Via::Session, false, _) => "uprobe.session",
            (Via::Multi, true, Hooks::Entry) => "kprobe_multi",
            (Via::Multi, true, Hooks::EntryAndReturn) => "kprobe_multi + kretprobe_multi",
            (Via::Multi, false, Hooks::Entry) => "uprobe_multi",
            (Via::Multi, false, Hooks::EntryAndReturn) => "uprobe_multi + uretprobe_multi",
            (Via::Single, true, Hooks::Entry) => "single kprobes",
            (Via::Single, true, Hooks::EntryAndReturn) => "single kprobes + kretprobes",
            (Via::Single, false, Hooks::Entry) => "single uprobes",
            (Via::Single, false, Hooks::EntryAndReturn) => "single uprobes + uretprobes",
            (Via::Trampoline, _, Hooks::Entry) => "fentry",
            (Via::Trampoline, _, Hooks::EntryAndReturn) => "fentry + fexit",
        }
    }
}

/// Refuses the modes that only timing tools (entry and return hooks) have,
/// whatever the patterns match, before anything is read for them.
pub(crate) fn check_mode(opts: &Options) -> Result<()> {
    if opts.hooks == Hooks::EntryAndReturn {
        return Ok(());
    }
    match opts.mode {
        AttachMode::Session => {
            bail!("--attach-mode session is for tools that time calls (entry and return)")
        }
        AttachMode::Fentry => bail!(
            "--attach-mode fentry: fentry/fexit serve a single kernel function, in tools that time calls"
        ),
        _ => Ok(()),
    }
}

/// Picks how kernel functions are attached: the cheapest mechanism the kernel
/// has that `--attach-mode` allows, probed, never decided by version.
pub(crate) fn choose_kernel_via(probes: &[Probe], opts: &Options) -> Result<Option<Via>> {
    let kernel: Vec<&KernelFunc> = probes
        .iter()
        .filter_map(|p| match &p.site {
            Site::Kernel(f) => Some(f),
            _ => None,
        })
        .collect();
    let Some(first) = kernel.first() else {
        return Ok(None);
    };
    let ret = opts.hooks == Hooks::EntryAndReturn;
    let via = match opts.mode {
        AttachMode::Single => Via::Single,
        AttachMode::Fentry => {
            if !opts.trampoline || kernel.len() != 1 {
                bail!("--attach-mode fentry: fentry/fexit serve a single kernel function, in tools that time calls");
            }
            if let Err(why) = features::fentry(&first.name) {
                bail!("--attach-mode fentry: {why}");
            }
            Via::Trampoline
        }
        mode => {
            let wanted = ret && mode != AttachMode::Multi;
            let btf = wanted && features::kernel_btf();
            let session = match (wanted, btf) {
                (true, true) => features::kprobe_session(&first.name),
                (true, false) => Err(features::NO_KERNEL_BTF.to_string()),
                _ => Err(String::new()),
            };
            match session {
                // Cheapest per call where the kernel has it: the entry time lives in
                // the kernel's per-call cookie (measured by `cargo xtask
                // bench-latency`: about half the cost of fentry/fexit pairing
                // through a map).
                Ok(()) => Via::Session,
                Err(why) if mode == AttachMode::Session && !btf => {
                    bail!("--attach-mode session: {why}")
                }
                Err(why) if mode == AttachMode::Session => bail!(
                    "--attach-mode session: this kernel cannot create kprobe.session links ({why}; needs Linux 6.10+ with CONFIG_FPROBE)"
                ),
                // One function, no session: a trampoline beats kprobe pairs where
                // the kernel allows it (not under lockdown, nor for modules).
                Err(_)
                    if mode == AttachMode::Auto
                        && opts.trampoline
                        && kernel.len() == 1
                        && features::fentry(&first.name).is_ok() =>
                {
                    Via::Trampoline
                }
                Err(_) => match features::kprobe_multi(&first.name) {
                    Ok(()) => Via::Multi,
                    Err(why) if mode == AttachMode::Multi => bail!(
                        "--attach-mode multi: this kernel cannot create kprobe_multi links ({why}; needs Linux 5.18+ with CONFIG_FPROBE)"
                    ),
                    Err(why) => {
                        // One function costs one kprobe either way: nothing to say.
                        if kernel.len() > 1 {
                            warn(&format!(
                                "kprobe_multi is not available on this kernel ({why}): attaching one kprobe per function (slower to attach and detach)"
                            ));
                        }
                        Via::Single
                    }
                },
            }
        }
    };
    let n = kernel.len();
    if via == Via::Single && n > max_single_kprobes() {
        let why = if opts.mode == AttachMode::Single {
            "--attach-mode single"
        } else {
            "no kprobe_multi on this kernel"
        };
        bail!(
            "{n} kernel functions would need one kprobe each ({why}), over the \
             limit of {}: that takes minutes to attach and detach, and has crashed kernels; \
             narrow the pattern, or raise the limit with TRACEKIT_MAX_KPROBES=N",
            max_single_kprobes()
        );
    }
    Ok(Some(via))
}

/// Picks how user functions are attached, as [`choose_kernel_via`] does.
pub(crate) fn choose_user_via(probes: &[Probe], opts: &Options) -> Result<Option<Via>> {
    if !probes.iter().any(|p| matches!(p.site, Site::User { .. })) {
        return Ok(None);
    }
    let ret = opts.hooks == Hooks::EntryAndReturn;
    if opts.mode == AttachMode::Fentry {
        bail!("--attach-mode fentry is for a single kernel function, not user functions");
    }
    Ok(Some(match opts.mode {
        AttachMode::Single => Via::Single,
        mode => {
            let btf = ret && mode != AttachMode::Multi && features::kernel_btf();
            if btf && features::uprobe_session() {
                Via::Session
            } else if mode == AttachMode::Session && !btf {
                bail!("--attach-mode session: {}", features::NO_KERNEL_BTF);
            } else if mode == AttachMode::Session {
                bail!("--attach-mode session: this kernel cannot create uprobe.session links (needs Linux 6.13+)");
            } else if features::uprobe_multi() {
                Via::Multi
            } else if mode == AttachMode::Multi {
                bail!("--attach-mode multi: this kernel cannot create uprobe_multi links (needs Linux 6.10+)");
            } else {
                Via::Single
            }
        }
    }))
}

/// How many single kprobes a run may create (TRACEKIT_MAX_KPROBES overrides), as
/// BCC's BCC_PROBE_LIMIT and bpftrace's max_probes: mass single kprobes are slow
/// to attach and detach, and ftrace-based kprobes on every function have crashed
/// the 6.1 and 6.12 guest kernels. kprobe_multi links have no such limit.
pub const DEFAULT_MAX_KPROBES: usize = 5000;

pub(crate) fn max_single_kprobes() -> usize {
    std::env::var("TRACEKIT_MAX_KPROBES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEFAULT_MAX_KPROBES)
}
