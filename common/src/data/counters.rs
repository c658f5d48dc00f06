//! Per-probe event counts kept by BPF in a per-CPU array indexed by attach cookie,
//! and tables of such rows (a histogram per probe): read in batches, summed over
//! CPUs, reported as what each cell gained since the previous read.
//!
//! libbpf-rs reads one key per syscall; the raw `bpf_map_lookup_batch` of
//! libbpf-sys reads the whole array in one or a few.

use std::os::fd::{AsRawFd, RawFd};

use anyhow::{bail, Result};
use libbpf_rs::MapCore;
use libbpf_sys as sys;

/// Reads a `BPF_MAP_TYPE_PERCPU_ARRAY` of `u64` counters in batches and reports
/// what each slot gained since the previous read. Slots are never zeroed from
/// user space, so no increment is lost between a read and a reset.
pub struct PerCpuCounters(PerCpuTable);

impl PerCpuCounters {
    /// `map` must outlive the returned reader (it is borrowed by fd).
    pub fn new(map: &dyn MapCore, slots: usize) -> Result<Self> {
        if map.value_size() != 8 {
            bail!("counter map {:?} must hold u64 values", map.name());
        }
        Ok(PerCpuCounters(PerCpuTable::new(map, slots)?))
    }

    /// Totals per slot, summed over CPUs.
    pub fn totals(&mut self) -> Result<Vec<u64>> {
        self.0.totals()
    }

    /// What each slot gained since the previous call (or since creation).
    pub fn deltas(&mut self) -> Result<Vec<u64>> {
        self.0.deltas()
    }

    /// What the next [`deltas`](Self::deltas) would return so far (`GET /summary`).
    pub fn peek(&mut self) -> Result<Vec<u64>> {
        self.0.peek()
    }
}

/// A `BPF_MAP_TYPE_PERCPU_ARRAY` whose values are rows of `u64` cells (its value
/// size / 8), read like [`PerCpuCounters`]. Results are flat, row after row.
pub struct PerCpuTable {
    fd: RawFd,
    rows: usize,
    width: usize,
    cpus: usize,
    prev: Vec<u64>,
    keys: Vec<u32>,
    values: Vec<u64>,
}

impl PerCpuTable {
    /// `map` must outlive the returned reader (it is borrowed by fd).
    pub fn new(map: &dyn MapCore, rows: usize) -> Result<Self> {
        let size = map.value_size() as usize;
        if size == 0 || !size.is_multiple_of(8) {
            bail!("map {:?} must hold rows of u64 values", map.name());
        }
        let width = size / 8;
        let cpus = libbpf_rs::num_possible_cpus()?;
        Ok(PerCpuTable {
            fd: map.as_fd().as_raw_fd(),
            rows,
            width,
            cpus,
            prev: vec![0; rows * width],
            keys: vec![0; rows],
            values: vec![0; rows * width * cpus],
        })
    }

    /// Cells per row.
    pub fn width(&self) -> usize {
        self.width
    }

    /// Totals per cell, summed over CPUs: `rows * width` values.
    pub fn totals(&mut self) -> Result<Vec<u64>> {
        let (w, cpus) = (self.width, self.cpus);
        let mut totals = vec![0u64; self.rows * w];
        let mut done = 0usize;
        let mut token: u32 = 0;
        let mut first = true;
        while done < self.rows {
            let mut count = (self.rows - done) as u32;
            let opts = sys::bpf_map_batch_opts {
                sz: size_of::<sys::bpf_map_batch_opts>() as _,
                ..Default::default()
            };
            let mut next: u32 = 0;
            // SAFETY: keys/values have room for `count` more entries at `done`
            // (values: `cpus * width` u64s per key); token and next are u32 keys.
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
                    self.values[done * cpus * w..].as_mut_ptr().cast(),
                    &mut count,
                    &opts,
                )
            };
            let err = (rc < 0).then(std::io::Error::last_os_error);
            for k in 0..count as usize {
                let row = self.keys[done + k] as usize;
                if row >= self.rows {
                    continue;
                }
                let base = (done + k) * cpus * w;
                let cells = &mut totals[row * w..(row + 1) * w];
                cells.iter_mut().for_each(|c| *c = 0);
                for cpu in 0..cpus {
                    let v = &self.values[base + cpu * w..base + (cpu + 1) * w];
                    for (c, x) in cells.iter_mut().zip(v) {
                        *c = c.wrapping_add(*x);
                    }
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

    /// What each cell gained since the previous call (or since creation).
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

    /// What each cell gained since the previous [`deltas`](Self::deltas), which
    /// still counts from where it did.
    pub fn peek(&mut self) -> Result<Vec<u64>> {
        let totals = self.totals()?;
        Ok(totals
            .iter()
            .zip(&self.prev)
            .map(|(t, p)| t.wrapping_sub(*p))
            .collect())
    }
}
