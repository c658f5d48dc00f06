//! Per-probe event counts kept by BPF in a per-CPU array indexed by attach cookie.

use std::os::fd::{AsRawFd, RawFd};

use anyhow::{bail, Result};
use libbpf_rs::MapCore;
use libbpf_sys as sys;

/// Reads a `BPF_MAP_TYPE_PERCPU_ARRAY` of `u64` counters in batches and reports
/// what each slot gained since the previous read. Slots are never zeroed from
/// user space, so no increment is lost between a read and a reset.
pub struct PerCpuCounters {
    fd: RawFd,
    slots: usize,
    cpus: usize,
    prev: Vec<u64>,
    keys: Vec<u32>,
    values: Vec<u64>,
}

impl PerCpuCounters {
    /// `map` must outlive the returned reader (it is borrowed by fd).
    pub fn new(map: &dyn MapCore, slots: usize) -> Result<Self> {
        if map.value_size() != 8 {
            bail!("counter map {:?} must hold u64 values", map.name());
        }
        let cpus = libbpf_rs::num_possible_cpus()?;
        Ok(PerCpuCounters {
            fd: map.as_fd().as_raw_fd(),
            slots,
            cpus,
            prev: vec![0; slots],
            keys: vec![0; slots],
            values: vec![0; slots * cpus],
        })
    }

    /// Totals per slot, summed over CPUs.
    pub fn totals(&mut self) -> Result<Vec<u64>> {
        let mut totals = vec![0u64; self.slots];
        let mut done = 0usize;
        let mut token: u32 = 0;
        let mut first = true;
        while done < self.slots {
            let mut count = (self.slots - done) as u32;
            let opts = sys::bpf_map_batch_opts {
                sz: size_of::<sys::bpf_map_batch_opts>() as _,
                ..Default::default()
            };
            let mut next: u32 = 0;
            // SAFETY: keys/values have room for `count` more entries at `done`
            // (values: `cpus` u64s per key); token and next are u32 array keys.
            let rc = unsafe {
                sys::bpf_map_lookup_batch(
                    self.fd,
                    if first {
                        std::ptr::null_mut()
                    } else {
                        (&mut token as *mut u32).cast()
                    },
                    (&mut next as *mut u32).cast(),
                    self.keys[done..].as_mut_ptr().cast(),
                    self.values[done * self.cpus..].as_mut_ptr().cast(),
                    &mut count,
                    &opts,
                )
            };
            let err = (rc < 0).then(std::io::Error::last_os_error);
            for k in 0..count as usize {
                let slot = self.keys[done + k] as usize;
                let row = &self.values[(done + k) * self.cpus..(done + k + 1) * self.cpus];
                if let Some(t) = totals.get_mut(slot) {
                    *t = row.iter().sum();
                }
            }
            done += count as usize;
            match err {
                None => {}
                Some(e) if e.raw_os_error() == Some(libc::ENOENT) => break,
                Some(e) => bail!("reading counters: {e}"),
            }
            if count == 0 {
                break;
            }
            token = next;
            first = false;
        }
        Ok(totals)
    }

    /// What each slot gained since the previous call (or since creation).
    pub fn deltas(&mut self) -> Result<Vec<u64>> {
        let totals = self.totals()?;
        let deltas = totals
            .iter()
            .zip(&self.prev)
            .map(|(t, p)| t.wrapping_sub(*p))
            .collect();
        self.prev = totals;
        Ok(deltas)
    }
}
