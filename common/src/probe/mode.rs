//! How a probe hooks its functions: the `--attach-mode` a user asks for, the hooks a
//! tool needs of a function, and where one program runs in it. Vocabulary only: the
//! choice of mechanism for a running kernel is `plan::mechanism`.

/// How kernel and user functions are attached (`--attach-mode`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum AttachMode {
    /// The best the kernel has: session links for entry+return tools, else one
    /// multi link per kind (and hook), else one probe per function.
    #[default]
    Auto,
    /// Session links (kprobe.session, uprobe.session), failing if the kernel
    /// lacks them; only for tools that hook returns.
    Session,
    /// kprobe_multi / uprobe_multi links (entry and return links apart), failing
    /// if the kernel lacks them.
    Multi,
    /// One perf-event probe per function (and hook).
    Single,
    /// fentry/fexit through a BPF trampoline: one kernel function, in tools that
    /// time calls.
    Fentry,
}

/// How user stacks are walked (`--user-stacks`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum UserStacks {
    /// By the binaries' unwind tables, unless the traced process keeps frame
    /// pointers everywhere (then by those, which costs less) or the kernel
    /// cannot (then by frame pointers, said once).
    #[default]
    Auto,
    /// By frame pointers (the kernel's own walk): stops at the first function
    /// built without them.
    Fp,
    /// By the unwind tables (.eh_frame, .debug_frame), in the kernel.
    Dwarf,
}

impl std::str::FromStr for UserStacks {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(UserStacks::Auto),
            "fp" => Ok(UserStacks::Fp),
            "dwarf" => Ok(UserStacks::Dwarf),
            _ => Err(format!(
                "'{s}' is not a user stack walk: use auto, fp or dwarf"
            )),
        }
    }
}

impl std::str::FromStr for AttachMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(AttachMode::Auto),
            "session" => Ok(AttachMode::Session),
            "multi" => Ok(AttachMode::Multi),
            "single" => Ok(AttachMode::Single),
            "fentry" => Ok(AttachMode::Fentry),
            _ => Err(format!(
                "'{s}' is not an attach mode (auto, session, multi, single, fentry)"
            )),
        }
    }
}

/// Which points of a function a tool hooks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Hooks {
    /// Function entry only (counting tools).
    #[default]
    Entry,
    /// Entry and return of each call, paired (latency tools).
    EntryAndReturn,
}

/// Where a program runs in the functions it is attached to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hook {
    Entry,
    Return,
    /// At entry and at return, with a per-call cookie (session links).
    Session,
}
