//! Opening a tool's BPF object on another thread from the first line of `main`,
//! while the tool parses its options and builds its plan.
//!
//! Opening (libbpf parsing the embedded ELF object, its BTF and relocations)
//! needs nothing from the command line, and the plan (tables, feature probes)
//! needs nothing from the object: run side by side they overlap. Under
//! emulation, where a run's start-up is mostly first-time code, that was 20-25 ms
//! of a tracepoint run's 160 (`cargo xtask bench-attach --startup`).
//!
//! The thread then answers the feature probes that the plan will ask of the
//! object's programs and that cannot change the kernel's state
//! ([`crate::kernel::features::answer_ahead`]; kernel reads are known from the warm-up
//! object's load when it loads), and libbpf's own: libbpf asks the kernel
//! what it supports once per process, in about 15 syscalls at the first load;
//! the thread first loads a minimal object that asks them all
//! (`bpf/warmup.bpf.c`), so the tool's load finds them answered (under
//! emulation, 8 ms of its 17). The tool does not wait for that object's closing.
//!
//! The inputs of opening that depend on the plan are libbpf's CO-RE target
//! ([`super::core_target`]) and, for objects with session programs, which build
//! of the object: the lean one, without the session kfuncs whose resolution
//! makes libbpf read the kernel's BTF ([`object_bytes`]). The thread guesses the
//! plan needs no kernel BTF and no session; a plan that does gets the object
//! opened again, on the calling thread.

use std::cell::Cell;
use std::mem::MaybeUninit;
use std::path::Path;
use std::sync::mpsc::{sync_channel, Receiver};

use anyhow::{Context, Result};
use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::OpenObject;

use crate::object::ProgKind;
use crate::plan::Plan;

/// A skeleton being opened on another thread; [`OpenAhead::take`] waits for it.
pub struct OpenAhead<B: SkelBuilder<'static>> {
    /// What the opening thread hands over (nothing if it could not start, or
    /// panicked).
    opened: Option<Receiver<Opened<B::Output>>>,
    core_sections: &'static [&'static str],
}

/// An open skeleton (or why not) handed from the opening thread to the caller,
/// with how it was opened.
struct Opened<S>(libbpf_rs::Result<S>, Build);

/// How an object is opened: libbpf's CO-RE target (None: the kernel's BTF),
/// and whether from its lean build (see [`object_bytes`]).
#[derive(Clone, Copy, PartialEq, Eq)]
struct Build {
    core: Option<&'static Path>,
    lean: bool,
}

impl Build {
    /// For `plan`, whose object's sections with CO-RE relocations are
    /// `core_sections`.
    fn of(plan: &Plan, core_sections: &[&str]) -> Build {
        Build {
            core: super::core_target(plan, core_sections),
            lean: !super::prog_kinds(plan)
                .iter()
                .any(|k| matches!(k, ProgKind::KprobeSession | ProgKind::UprobeSession)),
        }
    }

    /// Before there is a plan: the common case, no kernel BTF and no session.
    fn guess(core_sections: &[&str]) -> Build {
        Build {
            core: super::core_target_guess(core_sections),
            lean: true,
        }
    }
}

thread_local! {
    /// Whether the open in progress on this thread takes the lean build.
    static LEAN: Cell<bool> = const { Cell::new(false) };
}

/// The object bytes that a skeleton with a lean build opens: build.rs has such
/// skeletons (trace's, funclatency's) ask here between their two builds. The
/// lean one has no session kfunc extern: libbpf resolves every kfunc of an
/// object at load, loaded programs or not, by reading the kernel's BTF (5 MB; a
/// quarter of a second under emulation) and, for one the kernel lacks, every
/// module's. It is the same object otherwise, so a plan without session
/// programs loads it as it would the full one.
pub fn object_bytes(full: &'static [u8], lean: &'static [u8]) -> &'static [u8] {
    if LEAN.get() {
        lean
    } else {
        full
    }
}

// SAFETY: an open skeleton holds pointers into its libbpf object, which libbpf
// does not tie to a thread. Only one thread uses it at a time: the opening
// thread until it sends it, then the thread that receives it.
unsafe impl<S> Send for Opened<S> {}

impl<B: SkelBuilder<'static> + Default + 'static> OpenAhead<B> {
    /// Starts opening the skeleton `B` builds, whose sections with CO-RE
    /// relocations are `core_sections` (the skeleton's `CORE_SECTIONS`), and
    /// loading `warmup` (its `LIBBPF_WARMUP`). All but the spawn happens on the
    /// new thread, off the tool's path.
    pub fn start(core_sections: &'static [&'static str], warmup: &'static [u8]) -> Self {
        Self::start_as(Build::guess(core_sections), core_sections, warmup)
    }

    /// [`OpenAhead::start`] for a tool that times calls: its plans use session
    /// programs wherever the kernel has them, so the full build is opened ahead
    /// (on an older kernel, the lean one is opened again when the plan is made).
    pub fn start_timing(core_sections: &'static [&'static str], warmup: &'static [u8]) -> Self {
        let guess = Build {
            lean: false,
            ..Build::guess(core_sections)
        };
        Self::start_as(guess, core_sections, warmup)
    }

    fn start_as(
        guessed: Build,
        core_sections: &'static [&'static str],
        warmup: &'static [u8],
    ) -> Self {
        let (tx, rx) = sync_channel(1);
        let spawned = std::thread::Builder::new()
            .name("open-bpf".into())
            .spawn(move || {
                // libbpf's messages go where the tool wants them before it can
                // print any.
                crate::diag::route_libbpf_messages();
                // First, so that the tool never loads while libbpf's probes are
                // still being asked here (it would ask them again).
                let warm = load_warmup(warmup);
                if warm.is_some() {
                    crate::kernel::features::kernel_reads_seen_in_warmup();
                }
                let opened = open::<B>(guessed);
                if let Ok(open) = &opened {
                    // What the plan will ask of this object's programs.
                    let kinds = ProgKind::in_object(open.open_object());
                    crate::kernel::features::answer_ahead(
                        kinds.contains(&ProgKind::SyscallExit),
                        kinds.contains(&ProgKind::RawTracepoint),
                    );
                }
                let _ = tx.send(Opened(opened, guessed));
                // Closing the warm-up object is not the tool's wait.
                drop(warm);
            });
        OpenAhead {
            opened: spawned.is_ok().then_some(rx),
            core_sections,
        }
    }

    /// Starts opening the skeleton `B` builds for a tool that tries variants of
    /// its object ([`crate::object::trials::choose`]), with the kernel's BTF as CO-RE target.
    pub fn start_for_trials(warmup: &'static [u8]) -> Self {
        Self::start(&[], warmup)
    }

    /// The next open skeleton of a tool that opens its object once per trial:
    /// the one opened ahead first, then new ones.
    pub fn next_open(&mut self) -> Result<B::Output> {
        let ahead = self.opened.take().and_then(|rx| rx.recv().ok());
        let opened = match ahead {
            Some(Opened(opened, _)) => opened,
            None => open::<B>(Build::guess(self.core_sections)),
        };
        opened.context("opening the BPF object")
    }

    /// The open skeleton for `plan`: the one opened ahead when it was opened as
    /// the plan needs, else opened now.
    pub fn take(mut self, plan: &Plan) -> Result<B::Output> {
        let build = Build::of(plan, self.core_sections);
        let ahead = self.opened.take().and_then(|rx| rx.recv().ok());
        let (opened, how) = match ahead {
            Some(Opened(opened, guessed)) if build == guessed => (opened, "opened ahead".into()),
            Some(Opened(_, guessed)) if build.lean != guessed.lean => {
                let which = if build.lean { "without" } else { "with" };
                (
                    open::<B>(build),
                    format!("opened again {which} session programs"),
                )
            }
            Some(_) => (open::<B>(build), "opened again for the kernel's BTF".into()),
            // The thread could not start, or panicked.
            None => (open::<B>(build), "opened here".into()),
        };
        // Read for CO-RE (a target of None with relocations) or for kfuncs
        // (a full build).
        let btf = if build.lean && (build.core.is_some() || self.core_sections.is_empty()) {
            ", kernel BTF not read"
        } else {
            ""
        };
        crate::timing::note("load", format!("{how}{btf}"));
        opened.context("opening the BPF object")
    }
}

/// Opens the skeleton `B` as `build` says. Its storage lives as long as the
/// process, as the skeleton borrows it.
fn open<B: SkelBuilder<'static> + Default>(build: Build) -> libbpf_rs::Result<B::Output> {
    let mut builder = B::default();
    if let Some(btf) = build.core {
        builder.object_builder_mut().btf_custom_path(btf)?;
    }
    let storage: &'static mut MaybeUninit<OpenObject> = Box::leak(Box::new(MaybeUninit::uninit()));
    LEAN.set(build.lean);
    let opened = builder.open(storage);
    LEAN.set(false);
    opened
}

/// Loads the warm-up object (`bpf/warmup.bpf.c`): libbpf answers its feature
/// probes into its process-wide cache on the way. The object is returned to be
/// closed when it suits the caller. A failure is silent: the tool's own load
/// then asks what is left, as it would have anyway.
fn load_warmup(bytes: &[u8]) -> Option<libbpf_rs::Object> {
    // It has no CO-RE relocation: libbpf reads no kernel BTF for it.
    libbpf_rs::ObjectBuilder::default()
        .open_memory(bytes)
        .ok()?
        .load()
        .ok()
}
