//! Sampling and counter sources (`profile:`, `software:`, `hardware:`): one
//! perf event per CPU (or the `-c` CPU), each with the tool's `perf_event`
//! program linked to it with the probe's index as cookie. System-wide events
//! filtered in BPF (by `-p`, `--cgroup`, as every program is) rather than one
//! event per thread: a thread created during the run is covered without being
//! seen, and a process's threads cost one event per CPU, not one each.
//!
//! The kernel's refusals are said in words: a machine without a PMU (most
//! VMs), an event the PMU lacks, a rate above perf_event_max_sample_rate,
//! perf_event_paranoid, and the open-file limit.

use std::path::Path;

use anyhow::{bail, Result};
use libbpf_rs::ProgramMut;
use libbpf_sys as sys;

use super::links::{take_link, Attached, Prog};
use crate::probe::perf::{Every, Family, PerfSource};
use crate::stop::Stop;

/// The CPUs events are opened on: `cpu`, or every online one.
pub(super) fn cpus(cpu: Option<u32>) -> Vec<u32> {
    if let Some(c) = cpu {
        return vec![c];
    }
    let text = std::fs::read_to_string("/sys/devices/system/cpu/online").unwrap_or_default();
    let mut out = Vec::new();
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        if let (Ok(a), Ok(b)) = (a.parse::<u32>(), b.parse::<u32>()) {
            out.extend(a..=b);
        }
    }
    if out.is_empty() {
        out.push(0);
    }
    out
}

/// Opens `src`'s event on every CPU and links `prog` to each. A refusal on
/// the first CPU is an error naming the source and why (a hardware event on a
/// machine without counters, say): nothing of it could be counted.
pub(super) fn attach(
    prog: &ProgramMut,
    probes: &[(usize, &PerfSource)],
    cpu: Option<u32>,
    stop: &Stop,
    out: &mut Attached,
) -> Result<()> {
    let cpus = cpus(cpu);
    let prog = Prog::of(prog);
    for &(i, src) in probes {
        for (n, &c) in cpus.iter().enumerate() {
            if stop.is_set() {
                return Ok(());
            }
            let fd = match open(src, c) {
                Ok(fd) => fd,
                // A CPU gone offline since the list was read.
                Err(libc::ENODEV) if n > 0 => continue,
                Err(e) => bail!("{}", refusal(src, e)),
            };
            let opts = sys::bpf_perf_event_opts {
                sz: size_of::<sys::bpf_perf_event_opts>() as _,
                bpf_cookie: i as u64,
                ..Default::default()
            };
            // SAFETY: fd is our perf event; on success the link owns it (and
            // enables the event).
            match take_link(unsafe {
                sys::bpf_program__attach_perf_event_opts(prog.ptr(), fd, &opts)
            }) {
                Ok(link) => out.add(link, [i as u64]),
                Err(e) => {
                    // SAFETY: fd is ours and not owned by any link.
                    unsafe { libc::close(fd) };
                    bail!(
                        "{}: its program could not be linked to the event: {}",
                        src.name,
                        std::io::Error::from_raw_os_error(e)
                    );
                }
            }
        }
    }
    Ok(())
}

/// perf_event_open(2) of `src` on CPU `cpu`, every process; the fd or errno.
fn open(src: &PerfSource, cpu: u32) -> Result<i32, i32> {
    // SAFETY: perf_event_attr is plain data; all-zero is a valid start.
    let mut attr: sys::perf_event_attr = unsafe { std::mem::zeroed() };
    attr.type_ = src.type_;
    attr.size = size_of::<sys::perf_event_attr>() as u32;
    attr.config = src.config;
    match src.every {
        Every::Hz(n) => {
            attr.set_freq(1);
            attr.__bindgen_anon_1.sample_freq = n;
        }
        Every::Period(n) => attr.__bindgen_anon_1.sample_period = n,
    }
    // Enabled by the link.
    attr.set_disabled(1);
    crate::sys::perf::perf_event_open(&attr, -1, cpu as i32)
}

/// Why the kernel refused `src`'s event (errno `e`), in words.
fn refusal(src: &PerfSource, e: i32) -> String {
    let name = &src.name;
    let read = |p: &str| {
        std::fs::read_to_string(p)
            .ok()
            .map(|s| s.trim().to_string())
    };
    match e {
        libc::ENOENT | libc::EOPNOTSUPP | libc::ENODEV if src.family == Family::Hardware => {
            let devices = Path::new("/sys/bus/event_source/devices");
            let pmu = ["cpu", "cpu_core", "cpu_atom", "armv8_pmuv3_0"]
                .iter()
                .any(|d| devices.join(d).exists());
            if pmu {
                format!("{name}: this machine's PMU does not count that event")
            } else {
                format!(
                    "{name}: this machine has no hardware performance counters (no cpu PMU under \
                     {}: most virtual machines expose none); software: and profile: sources work",
                    devices.display()
                )
            }
        }
        libc::EINVAL if matches!(src.every, Every::Hz(_)) => {
            let max =
                read("/proc/sys/kernel/perf_event_max_sample_rate").unwrap_or_else(|| "?".into());
            format!(
                "{name}: the kernel refused the rate: it samples at most {max} times a second \
                 (kernel.perf_event_max_sample_rate, which the kernel lowers when sampling takes \
                 too long); lower the rate or raise that sysctl"
            )
        }
        libc::EACCES | libc::EPERM => {
            let level = read("/proc/sys/kernel/perf_event_paranoid").unwrap_or_else(|| "?".into());
            format!(
                "{name}: the kernel refused the perf event (kernel.perf_event_paranoid is {level}); \
                 run as root or lower that sysctl"
            )
        }
        libc::EMFILE | libc::ENFILE => format!(
            "{name}: out of file descriptors for one perf event per CPU: {}",
            crate::sys::fds::fd_limit_hint()
        ),
        e => format!(
            "{name}: the kernel refused the perf event: {}",
            std::io::Error::from_raw_os_error(e)
        ),
    }
}
