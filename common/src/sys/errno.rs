//! Errno values in words: what the kernel meant by refusing an attach of a kernel
//! function, a tracepoint or a user function (one wording each, as the same errno
//! means different things), and the errno inside a libbpf-rs error.

/// Describes an attach errno for the user.
pub fn errno_reason(errno: i32) -> String {
    let why = match errno {
        libc::EINVAL => "EINVAL: not traceable (notrace, inlined, or not a function entry)",
        libc::ESRCH | libc::ENOENT => "not found in the running kernel",
        libc::EBUSY => "EBUSY: already probed exclusively",
        libc::EADDRNOTAVAIL => "ambiguous: several kernel functions have this name",
        libc::EOPNOTSUPP | 524 => "not supported by this kernel",
        libc::EMFILE | libc::ENFILE => "out of file descriptors",
        libc::EPERM | libc::EACCES => "permission denied",
        _ => return std::io::Error::from_raw_os_error(errno).to_string(),
    };
    why.to_string()
}

/// The errno an error's text ends with (`... (os error 22)`): libbpf-rs keeps
/// the io::Error it wraps out of the source chain.
pub fn errno_of(e: &dyn std::fmt::Display) -> Option<i32> {
    // The alternate form has the whole chain: "context: ... (os error N)".
    let text = format!("{e:#}");
    let (_, n) = text.rsplit_once("(os error ")?;
    n.strip_suffix(')')?.parse().ok()
}

/// Describes an errno from attaching a tracepoint (the kernel-function wording of
/// [`errno_reason`] would mislead).
pub fn tracepoint_errno_reason(errno: i32) -> String {
    let why = match errno {
        libc::EINVAL => {
            "the kernel refused it (EINVAL): BPF cannot attach to ftrace's own events or \
             to events defined in tracefs (kprobe, uprobe, synthetic)"
        }
        libc::EPERM | libc::EACCES => "the kernel does not let BPF attach to it (EPERM)",
        libc::ENOENT | libc::ESRCH => "not found in the running kernel (ENOENT)",
        libc::EOPNOTSUPP | 524 => "not supported by this kernel (ENOTSUPP)",
        libc::EMFILE | libc::ENFILE => "out of file descriptors",
        _ => return std::io::Error::from_raw_os_error(errno).to_string(),
    };
    why.to_string()
}

/// Describes an errno from attaching a uprobe or USDT probe (a user function), for
/// the user (the kernel-function wording of [`errno_reason`] would mislead).
pub fn user_errno_reason(errno: i32) -> String {
    let why = match errno {
        // The kernel keeps one uprobe per file and offset, with one USDT
        // semaphore (reference counter): a probe there with another one is
        // refused (uprobes.c's "ref_ctr_offset mismatch"). The address itself
        // was checked against the ELF before, so this is the cause seen.
        libc::EINVAL => {
            "the kernel refused a probe at this address (EINVAL): another tracer (BCC, \
             bpftrace, perf) holds one there with a different USDT semaphore, as dmesg's \
             \"ref_ctr_offset mismatch\" says; stop that tracer and retry"
        }
        libc::ENOENT => "the kernel could not find the file or offset (ENOENT)",
        libc::ESRCH => "the traced process is gone (ESRCH)",
        libc::EOPNOTSUPP | 524 => {
            "the kernel refuses to single-step its first instruction (ENOTSUPP)"
        }
        libc::EBUSY => "another probe holds this address exclusively (EBUSY)",
        libc::EMFILE | libc::ENFILE => "out of file descriptors",
        libc::EPERM | libc::EACCES => "permission denied",
        _ => return std::io::Error::from_raw_os_error(errno).to_string(),
    };
    why.to_string()
}

/// The errno a libbpf-rs error kind stands for (libbpf-rs keeps only the kind).
pub trait IntoErrno {
    fn into_errno(self) -> i32;
}

impl IntoErrno for libbpf_rs::ErrorKind {
    fn into_errno(self) -> i32 {
        use libbpf_rs::ErrorKind as K;
        match self {
            K::NotFound => libc::ENOENT,
            K::PermissionDenied => libc::EPERM,
            K::Unsupported => libc::EOPNOTSUPP,
            K::OutOfMemory => libc::ENOMEM,
            K::TooBig => libc::E2BIG,
            _ => libc::EINVAL,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_function_reasons_are_not_kernel_function_reasons() {
        for e in [
            libc::EINVAL,
            libc::ENOENT,
            libc::ESRCH,
            libc::EOPNOTSUPP,
            524,
            libc::EBUSY,
        ] {
            let r = user_errno_reason(e);
            for kernel_words in ["running kernel", "notrace", "inlined", "kernel functions"] {
                assert!(!r.contains(kernel_words), "{e}: {r}");
            }
        }
        assert_eq!(
            user_errno_reason(524),
            "the kernel refuses to single-step its first instruction (ENOTSUPP)"
        );
    }
}
