//! Whether a run goes on to trace once attaching is over: the one place every
//! tool learns that a signal came while it was planning, loading or attaching,
//! and says so. Such a stop is never an error (the man pages promise exit 0 for
//! Ctrl-C, SIGTERM and SIGHUP), and no tool prints its "Tracing ... Hit Ctrl-C"
//! line or column header for a run that is already ending.

use crate::run::session::Session;
use crate::stop::StopReason;

impl Session {
    /// True when tracing begins. False when a signal stopped the run before
    /// attaching was over; then, if fewer probes were attached than planned,
    /// how far it got is printed (stderr): "stopped by a signal while
    /// attaching: N of M probes were attached". The tool still runs its loop
    /// (which ends at once) and detaches as after any stop.
    pub fn begins(&self) -> bool {
        if self.stop.reason() != Some(StopReason::Signal) {
            return true;
        }
        // A tool with fixed programs attached all of its links or failed: its
        // plan is empty, and there is nothing to say.
        let n = self
            .attached
            .as_ref()
            .map_or(self.links.len(), |a| a.probes_attached());
        let planned = self.plan.probes.len();
        if n < planned {
            crate::diag::warn(&format!(
                "stopped by a signal while attaching: {n} of {planned} probes were attached"
            ));
        }
        false
    }
}
