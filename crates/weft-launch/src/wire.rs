//! The frames of the sync chain: `kind: u8`, `len: u32` (little endian), `len` bytes.
//! Control frames carry JSON; a data frame carries the chunk number (`u32`) and the chunk's
//! bytes, so that a node forwards it while it is still arriving.
//!
//! Upstream to downstream: [`Kind::Hello`], [`Kind::Data`]..., [`Kind::End`].
//! Downstream to upstream: [`Kind::Heartbeat`] (while a node scans or finishes),
//! [`Kind::Need`], [`Kind::Report`].

use std::io::{Read, Write};

use serde::{Deserialize, Serialize};

use crate::LaunchError;
use crate::manifest::Manifest;

/// Protocol version in [`Hello`].
pub const VERSION: u32 = 1;

/// Largest control frame (a manifest of ~200k chunks is ~15 MB of JSON).
pub const MAX_CONTROL: u32 = 256 << 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    Hello = 1,
    Need = 2,
    Data = 3,
    End = 4,
    Report = 5,
    Heartbeat = 6,
}

impl Kind {
    pub fn from_u8(b: u8) -> Option<Kind> {
        Some(match b {
            1 => Kind::Hello,
            2 => Kind::Need,
            3 => Kind::Data,
            4 => Kind::End,
            5 => Kind::Report,
            6 => Kind::Heartbeat,
            _ => return None,
        })
    }
}

/// One node of the chain still ahead.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Hop {
    /// The host's name, for reports.
    pub name: String,
    /// Where its `sync-serve` listens.
    pub addr: String,
}

/// The first frame to every node.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Hello {
    pub version: u32,
    /// The node this frame is for (so a node knows its name in the report).
    pub name: String,
    pub manifest: Manifest,
    /// The nodes after this one, in chain order.
    pub rest: Vec<Hop>,
    /// Bound in ms on every wait for a peer.
    pub timeout_ms: u64,
}

/// What one node needs and found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeNeed {
    pub name: String,
    pub chunks: usize,
    pub bytes: u64,
    /// Paths of files that existed on the node but differed from the source.
    pub changed: Vec<String>,
}

/// A node's [`Kind::Need`]: the union of what it and the nodes after it need, and each one's
/// own figures.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NeedMsg {
    /// [`crate::manifest::Bits::to_hex`].
    pub union: String,
    pub nodes: Vec<NodeNeed>,
    /// Nodes skipped because they could not be reached: (name, why).
    pub skipped: Vec<(String, String)>,
}

/// One node's outcome.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeReport {
    pub name: String,
    /// Bytes of chunks written to disk.
    pub bytes_written: u64,
    pub chunks_written: usize,
    /// Every file's hash (manifest order) as the node has it now: from its disk for files it
    /// did not need, from the verified bytes it wrote for the others. `None`: missing.
    pub file_hashes: Vec<Option<crate::manifest::Hash>>,
    /// Why the node could not finish, if it could not.
    pub error: Option<String>,
}

/// A node's [`Kind::Report`]: its own and those of the nodes after it.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReportMsg {
    pub nodes: Vec<NodeReport>,
    /// Nodes the chain lost on the way: (name, why).
    pub lost: Vec<(String, String)>,
}

/// Writes a frame header.
pub fn write_header(w: &mut impl Write, kind: Kind, len: u32) -> std::io::Result<()> {
    let mut h = [0u8; 5];
    h[0] = kind as u8;
    h[1..].copy_from_slice(&len.to_le_bytes());
    w.write_all(&h)
}

/// Writes a JSON control frame.
pub fn write_json<T: Serialize>(w: &mut impl Write, kind: Kind, v: &T) -> std::io::Result<()> {
    let body = serde_json::to_vec(v).map_err(std::io::Error::other)?;
    let len = u32::try_from(body.len()).map_err(std::io::Error::other)?;
    write_header(w, kind, len)?;
    w.write_all(&body)?;
    w.flush()
}

/// Writes an empty frame.
pub fn write_empty(w: &mut impl Write, kind: Kind) -> std::io::Result<()> {
    write_header(w, kind, 0)?;
    w.flush()
}

/// Reads a frame header: the kind and the length.
pub fn read_header(r: &mut impl Read, peer: &str) -> Result<(Kind, u32), LaunchError> {
    let mut h = [0u8; 5];
    r.read_exact(&mut h)
        .map_err(|e| peer_err(peer, "read", e))?;
    let kind = Kind::from_u8(h[0]).ok_or_else(|| LaunchError::Peer {
        peer: peer.into(),
        msg: format!("unknown frame kind {}", h[0]),
    })?;
    let mut l = [0u8; 4];
    l.copy_from_slice(&h[1..]);
    Ok((kind, u32::from_le_bytes(l)))
}

/// Reads the body of a control frame of `len` bytes as JSON.
pub fn read_json<T: for<'de> Deserialize<'de>>(
    r: &mut impl Read,
    len: u32,
    peer: &str,
) -> Result<T, LaunchError> {
    if len > MAX_CONTROL {
        return Err(LaunchError::Peer {
            peer: peer.into(),
            msg: format!("control frame of {len} bytes is over the limit"),
        });
    }
    let mut body = vec![0u8; len as usize];
    r.read_exact(&mut body)
        .map_err(|e| peer_err(peer, "read", e))?;
    serde_json::from_slice(&body).map_err(|e| LaunchError::Peer {
        peer: peer.into(),
        msg: format!("bad frame: {e}"),
    })
}

/// An I/O error with a peer, with "no answer within the bound" for a timeout.
pub fn peer_err(peer: &str, what: &str, e: std::io::Error) -> LaunchError {
    let msg = match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
            format!("{what}: no answer within the bound")
        }
        std::io::ErrorKind::UnexpectedEof => format!("{what}: connection closed"),
        _ => format!("{what}: {e}"),
    };
    LaunchError::Peer {
        peer: peer.into(),
        msg,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_unknown_kinds_are_refused() {
        let mut buf = Vec::new();
        let r = ReportMsg {
            nodes: vec![],
            lost: vec![("h2".into(), "gone".into())],
        };
        write_json(&mut buf, Kind::Report, &r).unwrap();
        write_empty(&mut buf, Kind::End).unwrap();
        let mut rd = &buf[..];
        let (k, len) = read_header(&mut rd, "up").unwrap();
        assert_eq!(k, Kind::Report);
        let back: ReportMsg = read_json(&mut rd, len, "up").unwrap();
        assert_eq!(back.lost, r.lost);
        assert_eq!(read_header(&mut rd, "up").unwrap(), (Kind::End, 0));
        let e = read_header(&mut &[9u8, 0, 0, 0, 0][..], "up").unwrap_err();
        assert!(e.to_string().contains("unknown frame kind 9"), "{e}");
        let e = read_json::<ReportMsg>(&mut &b"{\"nodes\":[],\"lost\":[],\"x\":1}"[..], 27, "up")
            .unwrap_err();
        assert!(e.to_string().contains("unknown field"), "{e}");
    }
}
