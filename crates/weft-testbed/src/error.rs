//! The error type of the test bed: what failed to start, and why.

use std::path::PathBuf;
use std::time::Duration;

/// Everything that can go wrong while driving the simulated fabric.
#[derive(Debug, thiserror::Error)]
pub enum TestbedError {
    /// The topology failed [`crate::Topology::validate`].
    #[error("invalid topology: {0}")]
    InvalidTopology(String),
    /// A bad argument (unknown SIM_HOST, SM name in use, …).
    #[error("invalid request: {0}")]
    Invalid(String),
    /// A required program or library is missing.
    #[error("prerequisite missing: {0} (install opensm, ibsim-utils, infiniband-diags)")]
    Missing(String),
    /// An I/O error, with what was being done.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// Sending a signal failed.
    #[error("kill({pid}, {signal}): {source}")]
    Signal {
        /// Target pid.
        pid: u32,
        /// Signal name.
        signal: String,
        /// The errno.
        #[source]
        source: nix::errno::Errno,
    },
    /// A bounded wait ran out.
    #[error("timed out after {timeout:?} waiting for {what}; {detail}")]
    Timeout {
        /// What was awaited.
        what: String,
        /// The bound.
        timeout: Duration,
        /// Context: stderr so far, log tail, …
        detail: String,
    },
    /// A process exited before it became ready, or a diag tool exited non-zero.
    #[error("{program} failed ({status}); stderr: {stderr}")]
    ProcessFailed {
        /// Program (and arguments).
        program: String,
        /// Exit status, as text.
        status: String,
        /// Its stdout (may be empty).
        stdout: String,
        /// Its stderr, or a log tail for a daemon.
        stderr: String,
    },
    /// A log file did not contain what was expected.
    #[error("log {path}: {detail}")]
    Log {
        /// The log.
        path: PathBuf,
        /// What was wrong.
        detail: String,
    },
}

pub(crate) fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> TestbedError {
    let context = context.into();
    move |source| TestbedError::Io { context, source }
}
