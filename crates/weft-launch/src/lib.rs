//! `weft mesh`, `weft sync` and `weft run` as a library: what the CLI calls to take N bare
//! boxes to one job on all of them.
//!
//! * [`manifest`]: a directory as content-addressed chunks (blake3) and what a node lacks of
//!   it. Pure apart from reading files; the resume and skip logic lives here.
//! * [`wire`]: the frames of the sync chain (hello, need, data, end, report, heartbeat).
//! * [`sync`]: pipelined chain replication. The source streams each chunk once, to the first
//!   node; every node writes what it lacks and forwards at once what the nodes after it lack,
//!   so N nodes take about one copy's time. [`sync::serve`] is the receiving side, started on
//!   every node as the hidden `weft sync-serve`.
//! * [`mesh`]: every node's key authorized on every other, known_hosts filled with host keys
//!   confirmed by fingerprint, all ordered pairs proven with the doctor's SSH check.
//! * [`run`]: the environment of a multi-node job (ranks, master, interface variables), the
//!   recipes for torchrun, vLLM and Ray, the pre-launch version check, and the launcher with
//!   its per-node supervisor ([`run::supervise`], the hidden `weft run-node`).
//! * [`llamacpp`]: the llama.cpp recipe (rpc-server on the other nodes, llama-server with
//!   `--rpc` on the first) and the `-ngl`/`--tensor-split` that place a planned pipeline.
//!
//! Hosts are reached only through `weft-bench`'s [`hosts`] runner API (local, SSH,
//! `ip netns exec`), the same as the doctor and the bench.
//!
//! It is not a scheduler, not an engine and not a general file synchroniser: one source
//! directory to N nodes, files only (symbolic links are followed), nothing deleted on the
//! nodes.
//!
//! ```no_run
//! use weft_launch::manifest::Manifest;
//! # fn main() -> Result<(), weft_launch::LaunchError> {
//! let m = Manifest::scan(std::path::Path::new("models/llama"), weft_launch::manifest::CHUNK)?;
//! println!("{} files, {} bytes, {} chunks", m.files.len(), m.total_bytes(), m.chunk_count());
//! # Ok(()) }
//! ```

#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod hosts;
pub mod layout;
pub mod llamacpp;
pub mod manifest;
pub mod mesh;
pub mod run;
pub mod stall;
pub mod sync;
pub mod wire;

/// Errors of the launcher. Messages name the host, file or rank at fault.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// Bad arguments or input.
    #[error("{0}")]
    Usage(String),
    /// A file or directory could not be read or written.
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    /// A host could not be reached or a command on it failed.
    #[error("host {host}: {msg}")]
    Host { host: String, msg: String },
    /// A peer broke the protocol or went silent past its bound.
    #[error("{peer}: {msg}")]
    Peer { peer: String, msg: String },
    /// Reaching a host or reading what it said ([`weft_hosts`]).
    #[error(transparent)]
    Hosts(#[from] hosts::HostsError),
}

/// `|e| LaunchError::Io { context, source: e }`.
pub(crate) fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> LaunchError {
    let context = context.into();
    move |source| LaunchError::Io { context, source }
}
