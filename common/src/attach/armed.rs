//! The counting window of the tools whose programs check `armed` (bpf/armed.h):
//! armed once every probe is attached, disarmed before the final summary and the
//! detach, so that every probe counts over the same window. Probes attach and
//! detach one at a time; without it a caller and its callee disagreed.

use libbpf_rs::{MapCore, MapFlags, MapHandle, Object};

/// The `.data.armed` map of an object that has one.
pub struct Armed(MapHandle);

impl Armed {
    /// The object's switch; None for an object without one (trace, the fixed
    /// tools), whose programs count from their own attach.
    pub fn of(obj: &Object) -> Option<Armed> {
        let map = obj.maps().find(|m| m.name() == ".data.armed")?;
        MapHandle::try_from(&map).ok().map(Armed)
    }

    /// Sets or clears the switch. A failure (which would leave the programs
    /// counting nothing, or counting on) is reported once, not fatal.
    pub fn set(&self, on: bool) {
        let mut value = vec![0u8; self.0.value_size() as usize];
        value[0] = u8::from(on);
        if let Err(e) = self.0.update(&0u32.to_ne_bytes(), &value, MapFlags::ANY) {
            crate::diag::warn(&format!(
                "could not {} counting: {e}",
                if on { "arm" } else { "disarm" }
            ));
        }
    }
}
