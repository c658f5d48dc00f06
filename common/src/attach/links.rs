//! Attaching one program to many probe sites, each site carrying its probe index as
//! the BPF cookie. Sites that refuse to attach are skipped and reported, never fatal;
//! everything attached is detached when the [`Attached`] set is dropped.

use std::collections::HashSet;
use std::ffi::CString;
use std::os::raw::{c_char, c_ulong};
use std::path::Path;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::thread;

use libbpf_rs::{AsRawLibbpf, Link, ProgramMut as Program};
use libbpf_sys as sys;

use crate::kernel::functions::KernelFunc;
use crate::plan::Skipped;
use crate::probe::mode::Hook;
use crate::stop::Stop;
use crate::sys::errno::{errno_reason, tracepoint_errno_reason, user_errno_reason, IntoErrno};

pub(crate) use super::tracepoints::{
    raw_tracepoint_clones, raw_tracepoints, syscalls, tracepoints, CloneSite, SyscallSite,
};
use super::uprobe_groups::remove_uprobe_events;
pub(crate) use super::uprobe_groups::{remove_stale_uprobe_events, uprobe_groups};

/// Everything a plan attached. Dropping it detaches, in parallel when several
/// links each wait out an RCU grace period to close (kprobes and uprobes).
pub struct Attached {
    links: Vec<Held>,
    attached: Vec<bool>,
    pub skipped: Vec<Skipped>,
    /// Number of kprobe_multi links and the kernel functions they cover.
    pub kprobe_multi_links: usize,
    pub uprobe_multi_links: usize,
    /// Tracepoints attached as raw tracepoint links.
    pub raw_tracepoint_links: usize,
    /// Syscall events served by the raw sys_enter/sys_exit links, and those links.
    pub syscall_events: usize,
    pub syscall_links: usize,
    /// Tracepoints attached as perf events.
    pub perf_tracepoints: usize,
    /// User functions in tracefs uprobe groups, and those groups (one perf event
    /// and link each); user functions attached as single perf-event uprobes.
    pub grouped_uprobes: usize,
    pub uprobe_groups: usize,
    pub single_uprobes: usize,
    /// The tracefs uprobe events we created ("group/event"), removed after their
    /// perf events are closed.
    pub(super) tracefs_events: Vec<String>,
    pub(super) next_group: u64,
    /// The object's counting switch, armed ([`Attached::arm`]).
    armed: Option<super::armed::Armed>,
}

impl Attached {
    pub(crate) fn new(probes: usize) -> Self {
        Attached {
            links: Vec::new(),
            attached: vec![false; probes],
            skipped: Vec::new(),
            kprobe_multi_links: 0,
            uprobe_multi_links: 0,
            raw_tracepoint_links: 0,
            syscall_events: 0,
            syscall_links: 0,
            perf_tracepoints: 0,
            grouped_uprobes: 0,
            uprobe_groups: 0,
            single_uprobes: 0,
            armed: None,
            tracefs_events: Vec::new(),
            next_group: 0,
        }
    }

    /// How many probes have at least one attached site.
    pub fn probes_attached(&self) -> usize {
        self.attached.iter().filter(|a| **a).count()
    }

    pub fn is_attached(&self, probe: usize) -> bool {
        self.attached.get(probe).copied().unwrap_or(false)
    }

    pub fn links(&self) -> usize {
        self.links.len()
    }

    /// The kernel's missed-hit count over every link (see [`crate::attach::missed`]).
    pub fn missed(&self) -> u64 {
        use std::os::fd::AsFd;
        crate::attach::missed::missed(self.links.iter().map(|l| l.as_fd()))
    }

    pub(super) fn add(&mut self, link: Link, cookies: impl IntoIterator<Item = u64>) {
        self.links.push(Held::Libbpf(link));
        for c in cookies {
            self.attached[c as usize] = true;
        }
    }

    /// A link for one probe, libbpf's or a bare descriptor.
    pub(super) fn add_held(&mut self, link: Held, probe: u64) {
        self.links.push(link);
        self.attached[probe as usize] = true;
    }

    fn add_uprobe_multi(&mut self, link: Link, sites: &[UserSite<'_>]) {
        self.add(link, sites.iter().map(|s| s.0 as u64));
        self.uprobe_multi_links += 1;
    }

    /// A user function the kernel would not probe.
    pub(super) fn skip_user(&mut self, label: &str, errno: i32) {
        self.skip_why(label, user_errno_reason(errno));
    }

    pub(super) fn skip(&mut self, label: &str, errno: i32) {
        self.skip_why(label, errno_reason(errno));
    }

    pub(super) fn skip_tracepoint(&mut self, label: &str, errno: i32) {
        self.skip_why(label, tracepoint_errno_reason(errno));
    }

    pub(crate) fn skip_why(&mut self, label: &str, reason: String) {
        self.skipped.push(Skipped {
            label: label.to_string(),
            reason,
        });
    }
}

impl Drop for Attached {
    fn drop(&mut self) {
        // Signals during the detach must not end the process half way through it.
        match Stop::global() {
            Some(s) => s.detaching(|| self.detach()),
            None => self.detach(),
        }
    }
}

impl Attached {
    /// Arms `armed` (once every probe is attached); it is disarmed by
    /// [`Attached::disarm`] or, at the latest, before the detach.
    pub(crate) fn arm(&mut self, armed: Option<super::armed::Armed>) {
        if let Some(a) = &armed {
            a.set(true);
        }
        self.armed = armed;
    }

    /// Stops the counting of every probe at once: before the final summary, so
    /// that it reads counts of one window.
    pub fn disarm(&self) {
        if let Some(a) = &self.armed {
            a.set(false);
        }
    }

    fn detach(&mut self) {
        self.disarm();
        self.close_links();
        // Their perf events are closed now: the events can go.
        remove_uprobe_events(&std::mem::take(&mut self.tracefs_events));
    }

    fn close_links(&mut self) {
        let links = std::mem::take(&mut self.links);
        // Closing a kprobe or uprobe link (multi or perf event) waits out an RCU
        // grace period, 20-60 ms each on hardware, one after another when closed
        // in turn; closed in parallel, they share one. Tracepoint links close
        // without one (and perf-event ones serialize on the kernel's
        // event_mutex whatever we do): for those alone, no thread is worth
        // starting.
        let tracepoint_links =
            self.raw_tracepoint_links + self.syscall_links + self.perf_tracepoints;
        let waiting = links.len().saturating_sub(tracepoint_links);
        if waiting < 2 {
            return;
        }
        let per = links.len().div_ceil(waiting.min(DETACH_THREADS));
        let mut links = links.into_iter();
        thread::scope(|s| loop {
            let chunk: Vec<Held> = links.by_ref().take(per).collect();
            if chunk.is_empty() {
                break;
            }
            s.spawn(move || drop(chunk));
        });
    }
}

/// A link: libbpf's, or the bare descriptor of one made without libbpf (a
/// cloned program's, [`raw_tracepoint_clones`]). Closing either detaches.
pub(crate) enum Held {
    Libbpf(Link),
    Fd(std::os::fd::OwnedFd),
}

impl std::os::fd::AsFd for Held {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        match self {
            Held::Libbpf(l) => l.as_fd(),
            Held::Fd(f) => f.as_fd(),
        }
    }
}

pub(super) const ATTACH_THREADS: usize = 8;
const DETACH_THREADS: usize = 16;

/// A program shared by attach threads.
#[derive(Clone, Copy)]
pub(super) struct Prog(NonNull<sys::bpf_program>);
// SAFETY: libbpf's attach functions only read the loaded program (its fd and name)
// and allocate a new link; concurrent attaches of one program are independent.
unsafe impl Send for Prog {}
unsafe impl Sync for Prog {}

impl Prog {
    pub(super) fn of(p: &Program) -> Self {
        Prog(p.as_libbpf_object())
    }

    /// Going through a method makes closures capture the whole (Sync) wrapper.
    pub(super) fn ptr(self) -> *mut sys::bpf_program {
        self.0.as_ptr()
    }
}

pub(super) fn take_link(ptr: *mut sys::bpf_link) -> Result<Link, i32> {
    match NonNull::new(ptr) {
        // SAFETY: a non-null return from a libbpf attach call is a link we now own.
        Some(p) => Ok(unsafe { Link::from_ptr(p) }),
        None => Err(std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EINVAL)),
    }
}

/// One address (or name) in a kprobe_multi request.
#[derive(Clone, Copy)]
struct MultiSite<'a> {
    cookie: u64,
    addr: Option<u64>,
    name: &'a str,
}

fn kprobe_multi_link(prog: Prog, hook: Hook, sites: &[MultiSite<'_>]) -> Result<Link, i32> {
    let cookies: Vec<u64> = sites.iter().map(|s| s.cookie).collect();
    let addrs: Vec<c_ulong> = sites
        .iter()
        .filter_map(|s| s.addr)
        .map(|a| a as c_ulong)
        .collect();
    let names: Vec<CString> = if addrs.is_empty() {
        sites
            .iter()
            .map(|s| CString::new(s.name).map_err(|_| libc::EINVAL))
            .collect::<Result<_, _>>()?
    } else {
        Vec::new()
    };
    let mut name_ptrs: Vec<*const c_char> = names.iter().map(|n| n.as_ptr()).collect();
    let opts = sys::bpf_kprobe_multi_opts {
        sz: size_of::<sys::bpf_kprobe_multi_opts>() as _,
        syms: if names.is_empty() {
            std::ptr::null_mut()
        } else {
            name_ptrs.as_mut_ptr()
        },
        addrs: if addrs.is_empty() {
            std::ptr::null()
        } else {
            addrs.as_ptr()
        },
        cookies: cookies.as_ptr(),
        cnt: sites.len() as _,
        retprobe: hook == Hook::Return,
        session: hook == Hook::Session,
        ..Default::default()
    };
    // SAFETY: every array outlives the call and holds `cnt` elements.
    take_link(unsafe {
        sys::bpf_program__attach_kprobe_multi_opts(prog.ptr(), std::ptr::null(), &opts)
    })
}

/// Attaches `funcs` (probe index, function) with kprobe_multi: one link normally;
/// when the kernel refuses the set, bisects to find and skip the functions at fault
/// (an address the kernel rejects is retried by name before it is given up).
pub(crate) fn kprobe_multi(
    prog: &Program,
    hook: Hook,
    funcs: &[(usize, &KernelFunc)],
    stop: &Stop,
    out: &mut Attached,
) -> anyhow::Result<()> {
    let by_addr = funcs.iter().all(|(_, f)| !f.addrs.is_empty());
    let sites: Vec<MultiSite> = if by_addr {
        // An address once (two names can be one function).
        let mut seen = HashSet::with_capacity(funcs.len());
        funcs
            .iter()
            .flat_map(|&(i, f)| {
                f.addrs.iter().map(move |&a| MultiSite {
                    cookie: i as u64,
                    addr: Some(a),
                    name: &f.name,
                })
            })
            .filter(|s| s.addr.is_some_and(|a| seen.insert(a)))
            .collect()
    } else {
        funcs
            .iter()
            .map(|&(i, f)| MultiSite {
                cookie: i as u64,
                addr: None,
                name: &f.name,
            })
            .collect()
    };
    let prog = Prog::of(prog);
    match kprobe_multi_link(prog, hook, &sites) {
        Ok(link) => {
            out.add(link, sites.iter().map(|s| s.cookie));
            out.kprobe_multi_links += 1;
            Ok(())
        }
        Err(e @ (libc::EPERM | libc::EOPNOTSUPP)) => {
            anyhow::bail!("attaching kprobe_multi link: {}", errno_reason(e))
        }
        Err(_) => {
            let mut retried = HashSet::new();
            bisect(prog, hook, &sites, stop, out, &mut retried);
            Ok(())
        }
    }
}

fn bisect<'a>(
    prog: Prog,
    hook: Hook,
    sites: &[MultiSite<'a>],
    stop: &Stop,
    out: &mut Attached,
    retried: &mut HashSet<&'a str>,
) {
    if stop.is_set() || sites.is_empty() {
        return;
    }
    match kprobe_multi_link(prog, hook, sites) {
        Ok(link) => {
            out.add(link, sites.iter().map(|s| s.cookie));
            out.kprobe_multi_links += 1;
        }
        Err(e) if sites.len() == 1 => {
            let s = sites[0];
            // The kernel picks the first traceable instance of a name.
            let by_name = MultiSite { addr: None, ..s };
            if s.addr.is_some() && retried.insert(s.name) {
                if let Ok(link) = kprobe_multi_link(prog, hook, &[by_name]) {
                    out.add(link, [s.cookie]);
                    out.kprobe_multi_links += 1;
                    return;
                }
            }
            if !out.is_attached(s.cookie as usize) {
                out.skip(s.name, e);
            }
        }
        Err(_) => {
            let (a, b) = sites.split_at(sites.len() / 2);
            bisect(prog, hook, a, stop, out, retried);
            bisect(prog, hook, b, stop, out, retried);
        }
    }
}

/// Runs `attach` over `items` on several threads, stopping early on a stop request.
/// Results come back in item order; items never tried (stopped) are `None`.
pub(super) fn parallel<T: Sync, L: Send>(
    items: &[T],
    threads: usize,
    stop: &Stop,
    attach: impl Fn(&T) -> Result<L, i32> + Sync,
) -> Vec<Option<Result<L, i32>>> {
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<Result<L, i32>>>> =
        Mutex::new((0..items.len()).map(|_| None).collect());
    let threads = threads.min(items.len()).max(1);
    if threads == 1 {
        // One link (a tracepoint, one function): no thread to start and join.
        return items
            .iter()
            .map(|item| (!stop.is_set()).then(|| attach(item)))
            .collect();
    }
    thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= items.len() || stop.is_set() {
                    break;
                }
                let r = attach(&items[i]);
                results.lock().expect("results lock")[i] = Some(r);
            });
        }
    });
    results.into_inner().expect("results lock")
}

pub(super) fn collect<T>(
    items: &[T],
    results: Vec<Option<Result<Link, i32>>>,
    cookie: impl Fn(&T) -> usize,
    label: impl Fn(&T) -> &str,
    out: &mut Attached,
    skip: fn(&mut Attached, &str, i32),
) {
    for (item, r) in items.iter().zip(results) {
        match r {
            Some(Ok(link)) => out.add(link, [cookie(item) as u64]),
            Some(Err(e)) => skip(out, label(item), e),
            None => {}
        }
    }
}

/// One perf-event kprobe per function instance (by address when known).
pub(crate) fn kprobes(
    prog: &Program,
    hook: Hook,
    funcs: &[(usize, &KernelFunc)],
    stop: &Stop,
    out: &mut Attached,
) {
    let sites: Vec<(usize, &str, Option<u64>)> = funcs
        .iter()
        .flat_map(|&(i, f)| {
            let addrs: Vec<Option<u64>> = if f.addrs.is_empty() {
                vec![None]
            } else {
                f.addrs.iter().copied().map(Some).collect()
            };
            addrs.into_iter().map(move |a| (i, f.name.as_str(), a))
        })
        .collect();
    let prog = Prog::of(prog);
    // One at a time: the kernel serializes kprobe registration anyway, and arming
    // ftrace-based kprobes concurrently with thousands of others has crashed
    // kernels (ftrace hash updates racing with probed allocator functions).
    let results = parallel(&sites, 1, stop, |&(i, name, addr)| {
        let cname = CString::new(name).map_err(|_| libc::EINVAL)?;
        let opts = sys::bpf_kprobe_opts {
            sz: size_of::<sys::bpf_kprobe_opts>() as _,
            bpf_cookie: i as u64,
            offset: addr.unwrap_or(0) as _,
            retprobe: hook == Hook::Return,
            ..Default::default()
        };
        let func = if addr.is_some() {
            std::ptr::null()
        } else {
            cname.as_ptr()
        };
        // SAFETY: strings and opts outlive the call; a NULL name means offset is an address.
        take_link(unsafe { sys::bpf_program__attach_kprobe_opts(prog.ptr(), func, &opts) })
    });
    collect(&sites, results, |s| s.0, |s| s.1, out, Attached::skip);
}

/// A user function site: probe index, name, file offset.
pub(crate) type UserSite<'a> = (usize, &'a str, u64);

fn uprobe_multi_link(
    prog: Prog,
    hook: Hook,
    pid: Option<u32>,
    path: &CString,
    sites: &[UserSite<'_>],
) -> Result<Link, i32> {
    let offsets: Vec<c_ulong> = sites.iter().map(|s| s.2 as c_ulong).collect();
    let cookies: Vec<u64> = sites.iter().map(|s| s.0 as u64).collect();
    let opts = sys::bpf_uprobe_multi_opts {
        sz: size_of::<sys::bpf_uprobe_multi_opts>() as _,
        offsets: offsets.as_ptr(),
        cookies: cookies.as_ptr(),
        cnt: sites.len() as _,
        retprobe: hook == Hook::Return,
        session: hook == Hook::Session,
        ..Default::default()
    };
    // SAFETY: path, offsets and cookies outlive the call and hold `cnt` elements;
    // a NULL pattern means the offsets are given.
    take_link(unsafe {
        sys::bpf_program__attach_uprobe_multi(
            prog.ptr(),
            pid.map_or(-1, |p| p as i32),
            path.as_ptr(),
            std::ptr::null(),
            &opts,
        )
    })
}

/// All functions of one binary in one uprobe_multi link. When the kernel refuses
/// the set (one function whose first instruction uprobes cannot step refuses the
/// whole link), bisects it so that only the refused functions are skipped, each
/// with its reason, and the rest stay in uprobe_multi links.
pub(crate) fn uprobe_multi(
    prog: &Program,
    hook: Hook,
    pid: Option<u32>,
    binary: &Path,
    sites: &[UserSite<'_>],
    stop: &Stop,
    out: &mut Attached,
) {
    let Ok(path) = CString::new(binary.as_os_str().as_encoded_bytes()) else {
        for s in sites {
            out.skip_user(s.1, libc::EINVAL);
        }
        return;
    };
    let prog = Prog::of(prog);
    match uprobe_multi_link(prog, hook, pid, &path, sites) {
        Ok(link) => out.add_uprobe_multi(link, sites),
        // Nothing to bisect: the binary itself or the permission is the problem.
        Err(e @ (libc::EPERM | libc::EACCES | libc::ENOENT | libc::EBADF)) => {
            for s in sites {
                out.skip_user(s.1, e);
            }
        }
        Err(_) => bisect_uprobe_multi(prog, hook, pid, &path, sites, stop, out),
    }
}

fn bisect_uprobe_multi(
    prog: Prog,
    hook: Hook,
    pid: Option<u32>,
    path: &CString,
    sites: &[UserSite<'_>],
    stop: &Stop,
    out: &mut Attached,
) {
    if stop.is_set() || sites.is_empty() {
        return;
    }
    match uprobe_multi_link(prog, hook, pid, path, sites) {
        Ok(link) => out.add_uprobe_multi(link, sites),
        Err(e) if sites.len() == 1 => out.skip_user(sites[0].1, e),
        Err(_) => {
            let (a, b) = sites.split_at(sites.len() / 2);
            bisect_uprobe_multi(prog, hook, pid, path, a, stop, out);
            bisect_uprobe_multi(prog, hook, pid, path, b, stop, out);
        }
    }
}

/// One perf-event uprobe per function.
pub(crate) fn uprobes(
    prog: &Program,
    hook: Hook,
    pid: Option<u32>,
    binary: &Path,
    sites: &[UserSite<'_>],
    stop: &Stop,
    out: &mut Attached,
) {
    let Ok(path) = CString::new(binary.as_os_str().as_encoded_bytes()) else {
        return;
    };
    let prog = Prog::of(prog);
    let results = parallel(sites, ATTACH_THREADS, stop, |&(i, _, offset)| {
        let opts = sys::bpf_uprobe_opts {
            sz: size_of::<sys::bpf_uprobe_opts>() as _,
            bpf_cookie: i as u64,
            retprobe: hook == Hook::Return,
            ..Default::default()
        };
        // SAFETY: path and opts outlive the call.
        take_link(unsafe {
            sys::bpf_program__attach_uprobe_opts(
                prog.ptr(),
                pid.map_or(-1, |p| p as i32),
                path.as_ptr(),
                offset as _,
                &opts,
            )
        })
    });
    let before = out.links();
    collect(sites, results, |s| s.0, |s| s.1, out, Attached::skip_user);
    out.single_uprobes += out.links() - before;
}

/// USDT sites: probe index, binary, provider, name. libbpf resolves every call site
/// of the probe in the binary (and its semaphore) and passes our index as cookie.
pub(crate) fn usdts(
    prog: &Program,
    pid: Option<u32>,
    sites: &[(usize, &Path, &str, &str)],
    stop: &Stop,
    out: &mut Attached,
) {
    for &(i, binary, provider, name) in sites {
        if stop.is_set() {
            return;
        }
        let opts = libbpf_rs::UsdtOpts {
            cookie: i as u64,
            ..Default::default()
        };
        match prog.attach_usdt_with_opts(pid.map_or(-1, |p| p as i32), binary, provider, name, opts)
        {
            Ok(link) => out.add(link, [i as u64]),
            Err(e) => out.skip_user(name, e.kind().into_errno()),
        }
    }
}

/// A trampoline program (fentry/fexit) whose target was set before load: one
/// function, probe index `sites[0].0`.
pub(crate) fn trampoline(prog: &Program, sites: &[(usize, &KernelFunc)], out: &mut Attached) {
    let Some(&(i, f)) = sites.first() else {
        return;
    };
    match prog.attach_trace() {
        Ok(link) => out.add(link, [i as u64]),
        Err(e) => out.skip(&f.name, e.kind().into_errno()),
    }
}
