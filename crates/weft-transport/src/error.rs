//! The one error type of the transport. Every variant that comes from the network names the
//! peer address and the local interface, so a log line alone says which link failed.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use crate::proto::{FrameError, HandleError};

/// Which step of a connection was running when it failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Opening the TCP connection (management or data).
    Connect,
    /// Exchanging hello/ack frames after the TCP connection is up.
    Handshake,
    /// Waiting for a receiver to accept.
    Accept,
    /// Moving message bytes.
    Data,
}

impl std::fmt::Display for Stage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Stage::Connect => "connect",
            Stage::Handshake => "handshake",
            Stage::Accept => "accept",
            Stage::Data => "data transfer",
        })
    }
}

impl From<weft_ifaddrs::IfSpecError> for Error {
    fn from(e: weft_ifaddrs::IfSpecError) -> Error {
        Error::Config(e.0)
    }
}

/// A transport error. `Clone` so that one failure seen by a helper thread can be reported on
/// every request of the connection.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// Bad configuration (an env var that does not parse, no interface matching a spec...).
    #[error("configuration: {0}")]
    Config(String),
    /// A listen handle that is not ours or is corrupt.
    #[error("invalid listen handle: {0}")]
    Handle(#[from] HandleError),
    /// The peer sent bytes that are not the weft protocol.
    #[error("protocol error from peer {peer} via {iface} during {stage}: {source}")]
    Protocol {
        /// Remote address.
        peer: SocketAddr,
        /// Local interface name.
        iface: String,
        /// Step that failed.
        stage: Stage,
        /// What was wrong.
        source: FrameError,
    },
    /// The peer refused the connection with a reason.
    #[error("peer {peer} via {iface} rejected the connection: {reason}")]
    Rejected {
        /// Remote address.
        peer: SocketAddr,
        /// Local interface name.
        iface: String,
        /// Reason given by the peer.
        reason: String,
    },
    /// An OS-level socket error.
    #[error("{op} with peer {peer} via {iface} during {stage}: {kind:?}: {message}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// Remote address.
        peer: SocketAddr,
        /// Local interface name.
        iface: String,
        /// Step that failed.
        stage: Stage,
        /// Kind of the io error.
        kind: io::ErrorKind,
        /// The io error's text.
        message: String,
    },
    /// The peer closed the connection.
    #[error("peer {peer} via {iface} closed the connection during {stage}")]
    Closed {
        /// Remote address.
        peer: SocketAddr,
        /// Local interface name.
        iface: String,
        /// Step that failed.
        stage: Stage,
    },
    /// The peer gave up on the connection and said why (an ABORT frame on the control stream).
    #[error("peer {peer} via {iface} aborted the connection: {reason}")]
    Aborted {
        /// Remote address (of the control stream).
        peer: SocketAddr,
        /// Local interface name (of the control stream).
        iface: String,
        /// The peer's reason, as a sentence.
        reason: String,
    },
    /// A network wait ran past the configured timeout.
    #[error("timed out after {after:?} waiting for peer {peer} via {iface} during {stage}")]
    Timeout {
        /// Remote address.
        peer: SocketAddr,
        /// Local interface name.
        iface: String,
        /// Step that was waiting.
        stage: Stage,
        /// The configured timeout.
        after: Duration,
    },
    /// The sender sent more bytes than the posted receive buffer holds.
    #[error(
        "message truncated: peer {peer} sent {sent} bytes (tag {tag}) into a {posted}-byte receive buffer"
    )]
    Truncated {
        /// Remote address.
        peer: SocketAddr,
        /// Bytes sent.
        sent: u64,
        /// Bytes posted.
        posted: usize,
        /// Tag of the message.
        tag: i32,
    },
    /// A message's tag matches no buffer of the posted receive.
    #[error("peer {peer} sent tag {tag}, which matches no buffer of the posted receive")]
    TagMismatch {
        /// Remote address.
        peer: SocketAddr,
        /// Tag received.
        tag: i32,
    },
    /// The caller used the API wrongly (unknown request, too many buffers, ...).
    #[error("invalid usage: {0}")]
    Usage(String),
    /// A local OS error not tied to a peer (creating a listener, reading interfaces).
    #[error("{op}: {kind:?}: {message}")]
    Local {
        /// What was being done.
        op: String,
        /// Kind of the io error.
        kind: io::ErrorKind,
        /// The io error's text.
        message: String,
    },
}

impl Error {
    pub(crate) fn local(op: impl Into<String>, e: &io::Error) -> Error {
        Error::Local {
            op: op.into(),
            kind: e.kind(),
            message: e.to_string(),
        }
    }

    /// Whether this error is the caller's fault (maps to ncclInvalidUsage / ncclInternalError)
    /// rather than the network's (ncclSystemError / ncclRemoteError).
    pub fn is_usage(&self) -> bool {
        matches!(
            self,
            Error::Usage(_) | Error::Truncated { .. } | Error::TagMismatch { .. }
        )
    }

    /// Whether the remote side is to blame (it sent garbage, rejected us or went away).
    pub fn is_remote(&self) -> bool {
        matches!(
            self,
            Error::Protocol { .. }
                | Error::Rejected { .. }
                | Error::Closed { .. }
                | Error::Timeout { .. }
                | Error::Aborted { .. }
        )
    }
}

/// Shorthand.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Where a connection runs: used to fill the peer/interface fields of errors.
#[derive(Debug, Clone)]
pub(crate) struct Link {
    pub peer: SocketAddr,
    pub iface: String,
}

impl Link {
    pub fn io(&self, op: &'static str, stage: Stage, e: &io::Error) -> Error {
        Error::Io {
            op,
            peer: self.peer,
            iface: self.iface.clone(),
            stage,
            kind: e.kind(),
            message: e.to_string(),
        }
    }
    pub fn closed(&self, stage: Stage) -> Error {
        Error::Closed {
            peer: self.peer,
            iface: self.iface.clone(),
            stage,
        }
    }
    pub fn timeout(&self, stage: Stage, after: Duration) -> Error {
        Error::Timeout {
            peer: self.peer,
            iface: self.iface.clone(),
            stage,
            after,
        }
    }
    pub fn aborted(&self, reason: String) -> Error {
        Error::Aborted {
            peer: self.peer,
            iface: self.iface.clone(),
            reason,
        }
    }
    pub fn protocol(&self, stage: Stage, source: FrameError) -> Error {
        Error::Protocol {
            peer: self.peer,
            iface: self.iface.clone(),
            stage,
            source,
        }
    }
}
