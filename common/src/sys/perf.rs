//! perf_event_open(2), raw: the attributes are the caller's (a tracepoint's
//! perf event, a sampling source's).

use libbpf_sys as sys;

/// perf_event_open(`attr`, `pid`, `cpu`, no group, close-on-exec): the new
/// descriptor, or the errno.
pub fn perf_event_open(attr: &sys::perf_event_attr, pid: i32, cpu: i32) -> Result<i32, i32> {
    // SAFETY: attr is valid for the call; a non-negative result is a new fd.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            attr as *const sys::perf_event_attr,
            pid as libc::c_int,
            cpu as libc::c_int,
            -1 as libc::c_int,
            sys::PERF_FLAG_FD_CLOEXEC as libc::c_ulong,
        )
    };
    if fd < 0 {
        Err(std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EINVAL))
    } else {
        Ok(fd as i32)
    }
}
