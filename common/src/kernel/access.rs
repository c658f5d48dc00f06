//! Whether kernel functions may be traced here at all (kprobes built in, the
//! traceable function list readable), and the lockdown mode that most often says
//! why not.

use std::fs;
use std::path::Path;

use anyhow::Result;

use crate::sys::mounts;

/// Fails when this kernel cannot trace kernel functions, saying why and what still works.
pub fn require_kernel_functions(tracefs: &Path) -> Result<()> {
    let has_kprobes = Path::new("/sys/bus/event_source/devices/kprobe").exists()
        || tracefs.join("kprobe_events").exists();
    let aff = tracefs.join("available_filter_functions");
    let aff_denied = fs::File::open(&aff)
        .err()
        .is_some_and(|e| e.kind() == std::io::ErrorKind::PermissionDenied);
    if has_kprobes && !aff_denied {
        return Ok(());
    }
    let mut why = Vec::new();
    if !has_kprobes {
        why.push("it was built without kprobes (CONFIG_KPROBES is not set)".to_string());
    }
    if aff_denied {
        why.push(match lockdown() {
            Some(mode) => {
                format!("kernel lockdown ({mode}) forbids reading the traceable function list")
            }
            None => "reading the traceable function list is not permitted (EPERM)".to_string(),
        });
    } else if let Some(mode) = lockdown().filter(|m| m != "none") {
        why.push(format!("kernel lockdown is '{mode}'"));
    }
    Err(NoKernelFunctions(why.join(" and ")).into())
}

/// This kernel cannot trace kernel functions, and why. Its message names what
/// still works; a tool without patterns (vfsreadlat) says what it needs instead.
#[derive(Debug)]
pub struct NoKernelFunctions(pub String);

impl std::fmt::Display for NoKernelFunctions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "kernel functions cannot be traced here: {}; tracepoints (t:CATEGORY:EVENT), \
             user functions (LIBRARY:FUNCTION) and USDT probes (u:LIBRARY:PROBE) still work",
            self.0
        )
    }
}

impl std::error::Error for NoKernelFunctions {}

/// The active lockdown mode, reading securityfs (mounting it if needed).
pub fn lockdown() -> Option<String> {
    let file = Path::new("/sys/kernel/security/lockdown");
    if !file.exists() {
        // Failure is tolerated: then there is no lockdown to read.
        let _ = mounts::mount("securityfs", "securityfs", "/sys/kernel/security");
    }
    let s = fs::read_to_string(file).ok()?;
    let start = s.find('[')? + 1;
    let end = s[start..].find(']')? + start;
    Some(s[start..end].to_string())
}
