//! Pipelined chain replication of a directory: the source (where `weft sync` runs) streams
//! every chunk some node lacks once, to the first node; each node writes the chunks it lacks
//! and forwards, while they arrive, those that the nodes after it lack. Every link carries
//! the data once, so N nodes take about one copy's time.
//!
//! A sync, as the source sees it:
//! 1. [`crate::manifest::Manifest::scan_stamped`] of the source directory: the only pass that
//!    hashes the source's bytes; when a chunk is sent, its file's [`Stamp`] must be the one
//!    taken before that pass, else the sync stops ("changed while it was being synced").
//! 2. `weft sync-serve` started on every node through its [`HostRunner`]; it binds its data
//!    address (the doctor's data interface, `--data-if`) on a free port and says which on its
//!    first line. A node whose helper does not start in time is *unreachable* and named.
//! 3. The chain: the source connects to the first node and sends [`Hello`] with the nodes
//!    after it; each node connects to the next one it can reach (one it cannot is skipped and
//!    named) and passes the rest on.
//! 4. Every node hashes what it already has ([`crate::manifest::look`]) and answers with what
//!    it and the nodes after it need; the source sends the union.
//! 5. Each node verifies every chunk it keeps against the manifest before writing it, writes
//!    files as `*.weft-part` and renames each when complete, and reports the hash of every
//!    file; the source compares them with its own and names every mismatch.
//!
//! A node lost in the middle (its link or its host died) is named by the node before it;
//! the nodes after it, cut off, are served again in a new chain without it (at most
//! [`SyncOptions::rounds`] chains). A sync killed at any point resumes: the chunks already
//! written are found by the next run and not sent again.
//!
//! Every wait has a bound ([`SyncOptions::timeout`]); nodes that are busy (scanning,
//! finishing) send heartbeats so that the bound is on silence, not on work. The helpers exit
//! when the source goes away (their stdin closes) and when the chain ends.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, BufWriter, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::hosts::{self, HostRunner};
use crate::manifest::{self, Bits, Hash, Manifest, Need, Stamp};
use crate::wire::{self, Hello, Hop, Kind, NeedMsg, NodeNeed, NodeReport, ReportMsg};
use crate::{LaunchError, io};

/// Marker of the helper's first line: `weft-sync-serve listening on ADDR:PORT`.
pub const LISTENING: &str = "weft-sync-serve listening on ";

/// Size of the pieces a node reads and forwards a chunk in.
const PIECE: usize = 256 << 10;

/// Chunks a node has received and not yet written, at most (each a buffer of a chunk).
const QUEUE: usize = 8;

/// How often a waiting node tells the one before it that it is alive.
const HEARTBEAT: Duration = Duration::from_millis(500);

/// How a sync is done.
#[derive(Debug, Clone)]
pub struct SyncOptions {
    /// The destination directory on the nodes; `{host}` is replaced by the host's name.
    pub dest: String,
    /// The `weft` binary on the nodes.
    pub remote_exe: String,
    /// Data interface selection (NCCL syntax) passed to the helpers.
    pub data_if: Option<String>,
    /// Management interface selection, to tell it from the data ones.
    pub mgmt_if: Option<String>,
    /// Bound on every wait for a peer (silence, connection, helper start).
    pub timeout: Duration,
    pub chunk_size: u64,
    /// At most this many chains (the first plus retries for nodes cut off behind a lost one).
    pub rounds: usize,
}

/// Where the source is.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Progress {
    pub sent: u64,
    pub total: u64,
}

/// One node's outcome.
#[derive(Debug, Clone, Serialize)]
pub struct NodeOutcome {
    pub name: String,
    /// `ok`, `mismatch`, `failed` or `unreachable`.
    pub status: String,
    pub error: Option<String>,
    /// Bytes the node lacked at the start of its last chain.
    pub bytes_needed: u64,
    pub bytes_written: u64,
    /// Files that were on the node but differed from the source (found and rewritten).
    pub changed: Vec<String>,
}

/// A file whose hash on a node is not the source's.
#[derive(Debug, Clone, Serialize)]
pub struct Mismatch {
    pub node: String,
    pub path: String,
    pub expected: String,
    /// `None`: the node has no complete copy.
    pub found: Option<String>,
}

/// What a sync did.
#[derive(Debug, Clone, Serialize)]
pub struct SyncReport {
    pub source: String,
    pub files: usize,
    pub bytes: u64,
    pub chunks: usize,
    /// Bytes of chunk data the source sent (all chains).
    pub bytes_sent: u64,
    pub chains: usize,
    pub nodes: Vec<NodeOutcome>,
    pub mismatches: Vec<Mismatch>,
    /// Seconds from the first data frame to the last report, summed over the chains.
    pub transfer_s: f64,
    pub elapsed_s: f64,
    /// Every node ok and every hash equal.
    pub ok: bool,
}

/// A helper started on a node.
struct Served {
    host: usize,
    name: String,
    addr: String,
    child: Child,
    stdin: Option<ChildStdin>,
}

impl Served {
    /// Closes its stdin (it exits), waits a little, kills its group.
    fn stop(mut self, bound: Duration) {
        drop(self.stdin.take());
        let deadline = Instant::now() + bound;
        loop {
            match self.child.try_wait() {
                Ok(Some(_)) => return,
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10))
                }
                _ => break,
            }
        }
        hosts::kill_group(&self.child);
        let _ = self.child.wait();
    }
}

/// Syncs `src` to every host of `hosts`. See the module docs.
pub fn sync(
    src: &Path,
    hosts: &[Box<dyn HostRunner>],
    o: &SyncOptions,
    progress: &mut dyn FnMut(Progress),
) -> Result<SyncReport, LaunchError> {
    let t0 = Instant::now();
    if o.rounds == 0 {
        return Err(LaunchError::Usage("rounds must be at least 1".into()));
    }
    let (m, stamps) = Manifest::scan_stamped(src, o.chunk_size)?;
    let refs = m.chunk_refs();
    let mut outcomes: BTreeMap<usize, NodeOutcome> = BTreeMap::new();
    let mut pending: Vec<usize> = (0..hosts.len()).collect();
    let (mut bytes_sent, mut chains, mut transfer_s) = (0u64, 0usize, 0f64);
    let mut mismatches = Vec::new();
    let name_idx = |n: &str| hosts.iter().position(|h| h.name() == n);
    while !pending.is_empty() && chains < o.rounds {
        chains += 1;
        let served = start_all(hosts, &pending, o);
        let mut chain: Vec<Served> = Vec::new();
        for r in served {
            match r {
                Ok(s) => chain.push(s),
                Err((i, why)) => {
                    outcomes.insert(i, unreachable(hosts[i].name(), why));
                }
            }
        }
        let in_chain: Vec<usize> = chain.iter().map(|s| s.host).collect();
        let hops: Vec<Hop> = chain
            .iter()
            .map(|s| Hop {
                name: s.name.clone(),
                addr: s.addr.clone(),
            })
            .collect();
        let result = if hops.is_empty() {
            None
        } else {
            Some(drive_chain(
                &m, &stamps, &refs, src, &hops, o, bytes_sent, progress,
            ))
        };
        for s in chain {
            s.stop(Duration::from_secs(2));
        }
        let mut reported = Vec::new();
        if let Some(result) = result {
            let r = result?;
            bytes_sent += r.sent;
            transfer_s += r.transfer_s;
            for (name, why) in &r.lost {
                if let Some(i) = name_idx(name) {
                    outcomes.insert(i, unreachable(name, why.clone()));
                    reported.push(i);
                }
            }
            for n in &r.nodes {
                let Some(i) = name_idx(&n.name) else { continue };
                reported.push(i);
                let need = r.needs.iter().find(|x| x.name == n.name);
                let mut node_mm = Vec::new();
                for (fi, f) in m.files.iter().enumerate() {
                    let found = n.file_hashes.get(fi).copied().flatten();
                    if found != Some(f.hash) {
                        node_mm.push(Mismatch {
                            node: n.name.clone(),
                            path: f.path.clone(),
                            expected: f.hash.hex(),
                            found: found.map(|h| h.hex()),
                        });
                    }
                }
                let status = if n.error.is_some() {
                    "failed"
                } else if !node_mm.is_empty() {
                    "mismatch"
                } else {
                    "ok"
                };
                outcomes.insert(
                    i,
                    NodeOutcome {
                        name: n.name.clone(),
                        status: status.into(),
                        error: n.error.clone(),
                        bytes_needed: need.map_or(0, |x| x.bytes),
                        bytes_written: n.bytes_written,
                        changed: need.map(|x| x.changed.clone()).unwrap_or_default(),
                    },
                );
                mismatches.retain(|mm: &Mismatch| mm.node != n.name);
                mismatches.extend(node_mm);
            }
            if let Some(e) = &r.first_hop_error {
                tracing::debug!("chain {chains}: {e}");
            }
        }
        pending = in_chain
            .into_iter()
            .filter(|i| !reported.contains(i))
            .collect();
    }
    for i in pending {
        outcomes.insert(
            i,
            NodeOutcome {
                name: hosts[i].name().to_string(),
                status: "failed".into(),
                error: Some(format!(
                    "cut off behind a lost node in every one of {chains} chains"
                )),
                bytes_needed: 0,
                bytes_written: 0,
                changed: vec![],
            },
        );
    }
    let nodes: Vec<NodeOutcome> = (0..hosts.len())
        .map(|i| {
            outcomes.remove(&i).unwrap_or_else(|| NodeOutcome {
                name: hosts[i].name().to_string(),
                status: "failed".into(),
                error: Some("no outcome".into()),
                bytes_needed: 0,
                bytes_written: 0,
                changed: vec![],
            })
        })
        .collect();
    let ok = nodes.iter().all(|n| n.status == "ok") && mismatches.is_empty();
    Ok(SyncReport {
        source: src.display().to_string(),
        files: m.files.len(),
        bytes: m.total_bytes(),
        chunks: m.chunk_count(),
        bytes_sent,
        chains,
        nodes,
        mismatches,
        transfer_s,
        elapsed_s: t0.elapsed().as_secs_f64(),
        ok,
    })
}

fn unreachable(name: &str, why: String) -> NodeOutcome {
    NodeOutcome {
        name: name.to_string(),
        status: "unreachable".into(),
        error: Some(why),
        bytes_needed: 0,
        bytes_written: 0,
        changed: vec![],
    }
}

/// Starts the helper on every host of `which`, at once.
fn start_all(
    hosts: &[Box<dyn HostRunner>],
    which: &[usize],
    o: &SyncOptions,
) -> Vec<Result<Served, (usize, String)>> {
    // A node may wait for every node before it to skip one that is down (a bound each).
    let accept = o.timeout * (which.len() as u32 + 2);
    hosts::each_host(which, |&i| {
        start_one(hosts[i].as_ref(), i, o, accept).map_err(|e| (i, e))
    })
}

fn start_one(
    host: &dyn HostRunner,
    i: usize,
    o: &SyncOptions,
    accept: Duration,
) -> Result<Served, String> {
    let mut argv: Vec<String> = vec![
        o.remote_exe.clone(),
        "sync-serve".into(),
        "--dest".into(),
        hosts::per_host(&o.dest, host.name()),
        "--timeout-ms".into(),
        o.timeout.as_millis().to_string(),
        "--accept-timeout-ms".into(),
        accept.as_millis().to_string(),
        "--exit-on-stdin-eof".into(),
    ];
    if let Some(d) = &o.data_if {
        argv.extend(["--data-if".into(), d.clone()]);
    }
    if let Some(m) = &o.mgmt_if {
        argv.extend(["--mgmt-if".into(), m.clone()]);
    }
    let mut c = hosts::command(host, &argv, &[]);
    c.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c
        .spawn()
        .map_err(|e| format!("cannot start the helper: {e}"))?;
    let stdin = child.stdin.take();
    let (tx, rx) = mpsc::channel::<String>();
    if let Some(out) = child.stdout.take() {
        let tx = tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
    }
    let (etx, erx) = mpsc::channel::<String>();
    if let Some(err) = child.stderr.take() {
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                let _ = etx.send(line);
            }
        });
    }
    drop(tx);
    let deadline = Instant::now() + o.timeout;
    let stderr_tail = |erx: &mpsc::Receiver<String>| {
        let v: Vec<String> = erx.try_iter().collect();
        let s = v.join(" / ");
        if s.is_empty() {
            "it said nothing".to_string()
        } else {
            s
        }
    };
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left.min(Duration::from_millis(100))) {
            Ok(line) => {
                if let Some(addr) = line.strip_prefix(LISTENING) {
                    return Ok(Served {
                        host: i,
                        name: host.name().to_string(),
                        addr: addr.trim().to_string(),
                        child,
                        stdin,
                    });
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) if !left.is_zero() => {
                if let Ok(Some(st)) = child.try_wait() {
                    std::thread::sleep(Duration::from_millis(50));
                    return Err(format!(
                        "the sync helper exited ({st}) before listening: {}",
                        stderr_tail(&erx)
                    ));
                }
            }
            Err(_) => {
                hosts::kill_group(&child);
                let st = child.wait();
                std::thread::sleep(Duration::from_millis(50));
                return Err(match st {
                    Ok(_) if left.is_zero() => format!(
                        "the sync helper did not listen within {:?} (killed): {}",
                        o.timeout,
                        stderr_tail(&erx)
                    ),
                    Ok(st) => format!(
                        "the sync helper exited ({st}) before listening: {}",
                        stderr_tail(&erx)
                    ),
                    Err(e) => format!("the sync helper: {e}"),
                });
            }
        }
    }
}

/// What one chain gave the source.
struct ChainResult {
    sent: u64,
    transfer_s: f64,
    needs: Vec<NodeNeed>,
    nodes: Vec<NodeReport>,
    lost: Vec<(String, String)>,
    first_hop_error: Option<String>,
}

/// Connects to the first reachable hop of `hops`; the stream, its index, and the ones
/// skipped.
#[allow(clippy::type_complexity)]
fn connect_first(
    hops: &[Hop],
    timeout: Duration,
) -> (Option<(TcpStream, usize)>, Vec<(String, String)>) {
    let mut skipped = Vec::new();
    for (k, h) in hops.iter().enumerate() {
        match connect(&h.addr, timeout) {
            Ok(s) => return (Some((s, k)), skipped),
            Err(e) => skipped.push((h.name.clone(), format!("connect to {}: {e}", h.addr))),
        }
    }
    (None, skipped)
}

fn connect(addr: &str, timeout: Duration) -> std::io::Result<TcpStream> {
    let sa: SocketAddr = addr
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| std::io::Error::other("no address"))?;
    let s = TcpStream::connect_timeout(&sa, timeout)?;
    s.set_nodelay(true)?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    Ok(s)
}

/// Waits for a frame from `peer` that is not a heartbeat; silence past `timeout` is an error.
fn next_frame(
    r: &mut impl Read,
    peer: &str,
    timeout: Duration,
) -> Result<(Kind, u32), LaunchError> {
    let mut last = Instant::now();
    loop {
        match wire::read_header(r, peer) {
            Ok((Kind::Heartbeat, _)) => last = Instant::now(),
            Ok(x) => return Ok(x),
            Err(e) => {
                // A read timeout shorter than the bound (set by the caller) is only a tick.
                if last.elapsed() < timeout && e.to_string().contains("within the bound") {
                    continue;
                }
                return Err(e);
            }
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn drive_chain(
    m: &Manifest,
    stamps: &[Stamp],
    refs: &[manifest::ChunkRef],
    src: &Path,
    hops: &[Hop],
    o: &SyncOptions,
    sent_before: u64,
    progress: &mut dyn FnMut(Progress),
) -> Result<ChainResult, LaunchError> {
    let (first, mut lost) = connect_first(hops, o.timeout);
    let Some((stream, k)) = first else {
        return Ok(ChainResult {
            sent: 0,
            transfer_s: 0.0,
            needs: vec![],
            nodes: vec![],
            lost,
            first_hop_error: None,
        });
    };
    let peer = hops[k].name.clone();
    let lose = |lost: &mut Vec<(String, String)>, e: LaunchError| {
        lost.push((peer.clone(), e.to_string()));
    };
    let mut w = stream.try_clone().map_err(io("clone socket"))?;
    let mut r = BufReader::new(stream);
    let hello = Hello {
        version: wire::VERSION,
        name: peer.clone(),
        manifest: m.clone(),
        rest: hops[k + 1..].to_vec(),
        timeout_ms: o.timeout.as_millis() as u64,
    };
    let mut result = ChainResult {
        sent: 0,
        transfer_s: 0.0,
        needs: vec![],
        nodes: vec![],
        lost: vec![],
        first_hop_error: None,
    };
    if let Err(e) = wire::write_json(&mut w, Kind::Hello, &hello) {
        lose(&mut lost, wire::peer_err(&peer, "send hello", e));
        result.lost = lost;
        return Ok(result);
    }
    let need: NeedMsg = match next_frame(&mut r, &peer, o.timeout)
        .and_then(|(kind, len)| expect(kind, Kind::Need, &peer).map(|_| len))
        .and_then(|len| wire::read_json(&mut r, len, &peer))
    {
        Ok(n) => n,
        Err(e) => {
            lose(&mut lost, e);
            result.lost = lost;
            return Ok(result);
        }
    };
    lost.extend(need.skipped.iter().cloned());
    result.needs = need.nodes.clone();
    let union = Bits::from_hex(m.chunk_count(), &need.union)?;
    let total: u64 = (0..refs.len())
        .filter(|&i| union.get(i))
        .map(|i| refs[i].len)
        .sum();
    let t_start = Instant::now();
    let mut files: BTreeMap<usize, File> = BTreeMap::new();
    progress(Progress {
        sent: sent_before,
        total: sent_before + total,
    });
    let mut broken: Option<LaunchError> = None;
    for (i, c) in refs.iter().enumerate() {
        if !union.get(i) {
            continue;
        }
        let p = src.join(&m.files[c.file].path);
        let f = match files.entry(c.file) {
            std::collections::btree_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::btree_map::Entry::Vacant(v) => {
                v.insert(File::open(&p).map_err(io(format!("open {}", p.display())))?)
            }
        };
        // The bytes were hashed by the scan; a file whose stamp is still the one taken
        // before that hashing has not been written since, so the chunk is neither hashed
        // again nor read here: it goes from the page cache to the socket. The stamp is
        // checked before and after. A write that leaves no trace in it (the same size,
        // within the clock's granularity of the scan) is still caught: every node verifies
        // each chunk against the manifest before keeping it, and fails, named, if it differs.
        let unchanged = |f: &File| -> Result<(), LaunchError> {
            let now = f.metadata().map_err(io(format!("stat {}", p.display())))?;
            if Stamp::of(&now) != stamps[c.file] {
                return Err(LaunchError::Usage(format!(
                    "{} changed while it was being synced; run again",
                    p.display()
                )));
            }
            Ok(())
        };
        unchanged(f)?;
        let mut head = [0u8; 9];
        head[0] = Kind::Data as u8;
        head[1..5].copy_from_slice(&((c.len + 4) as u32).to_le_bytes());
        head[5..9].copy_from_slice(&(i as u32).to_le_bytes());
        let sent = w
            .write_all(&head)
            .map_err(SendError::Peer)
            .and_then(|_| send_range(&w, f, c.offset, c.len));
        match sent {
            Ok(()) => unchanged(f)?,
            Err(SendError::Peer(e)) => {
                broken = Some(wire::peer_err(&peer, "send data", e));
                break;
            }
            Err(SendError::File(e)) => {
                unchanged(f)?;
                return Err(io(format!("read {}", p.display()))(e));
            }
        }
        result.sent += c.len;
        progress(Progress {
            sent: sent_before + result.sent,
            total: sent_before + total,
        });
    }
    drop(files);
    if let Some(e) = broken {
        lose(&mut lost, e);
        result.lost = lost;
        return Ok(result);
    }
    if let Err(e) = wire::write_empty(&mut w, Kind::End) {
        lose(&mut lost, wire::peer_err(&peer, "send end", e));
        result.lost = lost;
        return Ok(result);
    }
    let report: ReportMsg = match next_frame(&mut r, &peer, o.timeout)
        .and_then(|(kind, len)| expect(kind, Kind::Report, &peer).map(|_| len))
        .and_then(|len| wire::read_json(&mut r, len, &peer))
    {
        Ok(x) => x,
        Err(e) => {
            lose(&mut lost, e);
            result.lost = lost;
            return Ok(result);
        }
    };
    result.transfer_s = t_start.elapsed().as_secs_f64();
    lost.extend(report.lost);
    result.nodes = report.nodes;
    result.lost = lost;
    Ok(result)
}

/// Why [`send_range`] stopped: the peer (the socket) or the source file.
enum SendError {
    Peer(std::io::Error),
    File(std::io::Error),
}

/// Sends `len` bytes of `f` from `offset` on `sock` with sendfile(2): from the page cache to
/// the socket, with no copy through this process. The socket's send timeout bounds it.
fn send_range(sock: &TcpStream, f: &File, offset: u64, len: u64) -> Result<(), SendError> {
    use std::os::fd::AsRawFd as _;
    let mut off = libc::off_t::try_from(offset).map_err(|e| SendError::File(io_other(e)))?;
    let mut left = usize::try_from(len).map_err(|e| SendError::File(io_other(e)))?;
    while left > 0 {
        // SAFETY: both descriptors are open for the whole call (`sock` and `f` are
        // borrowed), and `off` is a valid, exclusive pointer to a local for its duration.
        let n = unsafe { libc::sendfile(sock.as_raw_fd(), f.as_raw_fd(), &mut off, left) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINTR) => continue,
                // The file's side: a read error, or a file that is not one sendfile reads.
                Some(libc::EIO | libc::EINVAL | libc::ENOMEM | libc::EOVERFLOW) => {
                    return Err(SendError::File(e));
                }
                _ => return Err(SendError::Peer(e)),
            }
        }
        if n == 0 {
            return Err(SendError::File(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the file is shorter than when it was scanned",
            )));
        }
        left -= n as usize;
    }
    Ok(())
}

fn io_other(e: impl std::error::Error + Send + Sync + 'static) -> std::io::Error {
    std::io::Error::other(e)
}

fn expect(got: Kind, want: Kind, peer: &str) -> Result<(), LaunchError> {
    if got == want {
        Ok(())
    } else {
        Err(LaunchError::Peer {
            peer: peer.into(),
            msg: format!("expected a {want:?} frame, got {got:?}"),
        })
    }
}

// ---------------------------------------------------------------------------------------
// The receiving side.

/// How `weft sync-serve` runs.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    pub dest: PathBuf,
    /// Listen here; default: the first data interface's IPv4 address.
    pub listen: Option<IpAddr>,
    pub data_if: Option<String>,
    pub mgmt_if: Option<String>,
    pub timeout: Duration,
    /// Bound on the wait for the node before it to connect.
    pub accept_timeout: Duration,
}

/// The address to listen on: the first data interface's IPv4 address, by the doctor's rules.
pub fn data_address(data_if: Option<&str>, mgmt_if: Option<&str>) -> Result<IpAddr, LaunchError> {
    let facts = hosts::local_facts()?;
    let choice = hosts::IfChoice::parse(mgmt_if, data_if)?;
    let roles = hosts::roles_for(&[&facts], &choice);
    let data = roles.first().map(|r| r.data.as_slice()).unwrap_or_default();
    data.iter()
        .find_map(|n| hosts::ipv4(n).map(|(a, _)| IpAddr::V4(a)))
        .ok_or_else(|| {
            LaunchError::Usage(format!(
                "no data interface with an IPv4 address here (data interfaces {:?}; set --data-if)",
                data.iter().map(|n| n.name.as_str()).collect::<Vec<_>>()
            ))
        })
}

enum Event {
    Scanned(Result<(manifest::Local, Need), LaunchError>),
    /// The next node (its name and stream, the hello sent), and those skipped.
    Down(Option<(String, TcpStream)>, Vec<(String, String)>),
    Need(NeedMsg),
    Report(ReportMsg),
    DownHeartbeat,
    DownError(String),
}

/// The receiving side of a sync: binds, prints [`LISTENING`] and the address on `announce`,
/// serves one chain, returns. See the module docs.
pub fn serve(o: &ServeOptions, announce: &mut dyn Write) -> Result<(), LaunchError> {
    let ip = match o.listen {
        Some(a) => a,
        None => data_address(o.data_if.as_deref(), o.mgmt_if.as_deref())?,
    };
    let l = TcpListener::bind((ip, 0)).map_err(io(format!("bind {ip}")))?;
    let addr = l.local_addr().map_err(io("local address"))?;
    writeln!(announce, "{LISTENING}{addr}").map_err(io("announce"))?;
    announce.flush().map_err(io("announce"))?;
    l.set_nonblocking(true).map_err(io("listener"))?;
    let deadline = Instant::now() + o.accept_timeout;
    let up = loop {
        match l.accept() {
            Ok((s, _)) => break s,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() > deadline {
                    return Err(LaunchError::Peer {
                        peer: "upstream".into(),
                        msg: format!("nobody connected within {:?}", o.accept_timeout),
                    });
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => return Err(io("accept")(e)),
        }
    };
    drop(l);
    up.set_nonblocking(false).map_err(io("socket"))?;
    up.set_nodelay(true).map_err(io("socket"))?;
    up.set_read_timeout(Some(o.timeout)).map_err(io("socket"))?;
    up.set_write_timeout(Some(o.timeout))
        .map_err(io("socket"))?;
    Node::run(up, &o.dest, o.timeout)
}

struct Node {
    name: String,
    up_w: TcpStream,
    tx: mpsc::Sender<Event>,
    rx: mpsc::Receiver<Event>,
}

impl Node {
    fn run(up: TcpStream, dest: &Path, timeout: Duration) -> Result<(), LaunchError> {
        let mut up_r = BufReader::with_capacity(64 << 10, up.try_clone().map_err(io("clone"))?);
        let (kind, len) = wire::read_header(&mut up_r, "upstream")?;
        expect(kind, Kind::Hello, "upstream")?;
        let hello: Hello = wire::read_json(&mut up_r, len, "upstream")?;
        if hello.version != wire::VERSION {
            return Err(LaunchError::Peer {
                peer: "upstream".into(),
                msg: format!(
                    "protocol version {} (this weft speaks {}): use the same weft on every host",
                    hello.version,
                    wire::VERSION
                ),
            });
        }
        hello.manifest.validate()?;
        let (tx, rx) = mpsc::channel();
        let mut node = Node {
            name: hello.name.clone(),
            up_w: up,
            tx,
            rx,
        };
        let m = std::sync::Arc::new(hello.manifest.clone());
        std::fs::create_dir_all(dest).map_err(io(format!("create {}", dest.display())))?;
        {
            let (m, dest, tx) = (m.clone(), dest.to_path_buf(), node.tx.clone());
            std::thread::spawn(move || {
                let r = manifest::look(&dest, &m).map(|local| {
                    let n = manifest::need(&m, &local);
                    (local, n)
                });
                let _ = tx.send(Event::Scanned(r));
            });
        }
        // The next node we can reach, found on a thread so that heartbeats go on meanwhile
        // (skipping a node that is down costs up to a bound).
        {
            let (rest, tx) = (hello.rest.clone(), node.tx.clone());
            let (mf, timeout_ms) = (hello.manifest.clone(), hello.timeout_ms);
            std::thread::spawn(move || {
                let r = connect_down(&rest, &mf, timeout_ms, timeout);
                let _ = tx.send(Event::Down(r.0, r.1));
            });
        }
        let mut skipped = Vec::new();
        let mut down: Option<(String, BufWriter<TcpStream>)> = None;
        let mut down_known = false;
        // Wait for our own scan and the next node's need, heartbeating upstream.
        let mut scanned = None;
        let mut down_need: Option<NeedMsg> = None;
        let mut lost: Vec<(String, String)> = Vec::new();
        let mut last_down = Instant::now();
        let mut last_beat = Instant::now();
        while scanned.is_none() || !down_known || (down.is_some() && down_need.is_none()) {
            match node.rx.recv_timeout(HEARTBEAT) {
                Ok(Event::Scanned(r)) => scanned = Some(r?),
                Ok(Event::Down(d, sk)) => {
                    down_known = true;
                    skipped = sk;
                    last_down = Instant::now();
                    if let Some((name, s)) = d {
                        match s.try_clone() {
                            Ok(c) => {
                                let _ = c.set_read_timeout(Some(HEARTBEAT));
                                let tx = node.tx.clone();
                                let n2 = name.clone();
                                std::thread::spawn(move || read_down(c, &n2, &tx));
                                down = Some((name, BufWriter::with_capacity(PIECE, s)));
                            }
                            Err(e) => lost.push((name, format!("socket: {e}"))),
                        }
                    }
                }
                Ok(Event::Need(n)) => down_need = Some(n),
                Ok(Event::DownHeartbeat) => last_down = Instant::now(),
                Ok(Event::DownError(e)) => {
                    if let Some((n, _)) = down.take() {
                        lost.push((n, e));
                    }
                }
                Ok(Event::Report(_)) => {}
                Err(_) => {}
            }
            if down.is_some()
                && down_need.is_none()
                && last_down.elapsed() > timeout
                && let Some((n, _)) = down.take()
            {
                lost.push((n, format!("no answer within {timeout:?}")));
            }
            if last_beat.elapsed() >= HEARTBEAT {
                node.beat()?;
                last_beat = Instant::now();
            }
        }
        let Some((local, need)) = scanned else {
            return Err(LaunchError::Usage("scan did not finish".into()));
        };
        let mf = &hello.manifest;
        let refs = mf.chunk_refs();
        let mut union = need.chunks.clone();
        let down_union = match &down_need {
            Some(n) => Some(Bits::from_hex(mf.chunk_count(), &n.union)?),
            None => None,
        };
        if let Some(d) = &down_union {
            union.union(d);
        }
        let my = NodeNeed {
            name: node.name.clone(),
            chunks: need.chunks.count(),
            bytes: (0..refs.len())
                .filter(|&i| need.chunks.get(i))
                .map(|i| refs[i].len)
                .sum(),
            changed: need
                .changed
                .iter()
                .map(|&f| mf.files[f].path.clone())
                .collect(),
        };
        let mut nodes = vec![my];
        let mut all_skipped = skipped;
        if let Some(n) = &down_need {
            nodes.extend(n.nodes.iter().cloned());
            all_skipped.extend(n.skipped.iter().cloned());
        }
        all_skipped.append(&mut lost);
        wire::write_json(
            &mut node.up_w,
            Kind::Need,
            &NeedMsg {
                union: union.to_hex(),
                nodes,
                skipped: all_skipped,
            },
        )
        .map_err(|e| wire::peer_err("upstream", "send need", e))?;

        // The data phase.
        let writer = Writer::start(dest.to_path_buf(), mf.clone(), &local, &need);
        let mut down_err: Option<(String, String)> = None;
        let mut piece = vec![0u8; PIECE];
        let result: Result<(), LaunchError> = (|| {
            loop {
                let (kind, len) = wire::read_header(&mut up_r, "upstream")?;
                match kind {
                    Kind::Data => {
                        let mut ib = [0u8; 4];
                        up_r.read_exact(&mut ib)
                            .map_err(|e| wire::peer_err("upstream", "read", e))?;
                        let idx = u32::from_le_bytes(ib) as usize;
                        let clen = len.saturating_sub(4) as u64;
                        if idx >= refs.len() || refs[idx].len != clen {
                            return Err(LaunchError::Peer {
                                peer: "upstream".into(),
                                msg: format!(
                                    "data frame for chunk {idx} of {clen} bytes does not fit the manifest"
                                ),
                            });
                        }
                        let fwd = down_union.as_ref().is_some_and(|d| d.get(idx)) && down.is_some();
                        if fwd && let Some((n, w)) = &mut down {
                            let r = wire::write_header(w, Kind::Data, len)
                                .and_then(|_| w.write_all(&ib));
                            if let Err(e) = r {
                                down_err = Some((n.clone(), format!("send data: {e}")));
                                down = None;
                            }
                        }
                        let mine = need.chunks.get(idx);
                        // A chunk we keep is read straight into its buffer (one the writer
                        // has given back, so no fresh allocation per chunk) and forwarded
                        // from there; one we only pass on goes through `piece`.
                        let mut keep = if mine {
                            writer.buffer(clen as usize)
                        } else {
                            Vec::new()
                        };
                        let mut off = 0usize;
                        while off < clen as usize {
                            let k = (clen as usize - off).min(PIECE);
                            let buf: &mut [u8] = if mine {
                                &mut keep[off..off + k]
                            } else {
                                &mut piece[..k]
                            };
                            up_r.read_exact(buf)
                                .map_err(|e| wire::peer_err("upstream", "read", e))?;
                            if let Some((n, w)) = &mut down
                                && fwd
                                && let Err(e) = w.write_all(buf)
                            {
                                down_err = Some((n.clone(), format!("send data: {e}")));
                                down = None;
                            }
                            off += k;
                        }
                        if let Some((n, w)) = &mut down
                            && fwd
                            && let Err(e) = w.flush()
                        {
                            down_err = Some((n.clone(), format!("send data: {e}")));
                            down = None;
                        }
                        if mine {
                            writer.send(idx, keep)?;
                        }
                    }
                    Kind::End => return Ok(()),
                    other => {
                        return Err(LaunchError::Peer {
                            peer: "upstream".into(),
                            msg: format!("unexpected {other:?} frame during the data phase"),
                        });
                    }
                }
            }
        })();
        // The end goes on before this node's writer drains its queue, so that the nodes
        // after it finish their writes at the same time as this one, not one after another.
        if result.is_ok()
            && let Some((n, w)) = &mut down
            && let Err(e) = wire::write_empty(w, Kind::End)
        {
            down_err = Some((n.clone(), format!("send end: {e}")));
            down = None;
        }
        // The writer finishes what it has either way: complete files are renamed.
        let done = writer.finish();
        result?;
        let mut report = ReportMsg {
            nodes: vec![],
            lost: vec![],
        };
        let mine = match done {
            Ok(w) => NodeReport {
                name: node.name.clone(),
                bytes_written: w.bytes,
                chunks_written: w.chunks,
                file_hashes: w.file_hashes,
                error: None,
            },
            Err(e) => NodeReport {
                name: node.name.clone(),
                bytes_written: 0,
                chunks_written: 0,
                file_hashes: vec![None; mf.files.len()],
                error: Some(e.to_string()),
            },
        };
        report.nodes.push(mine);
        if let Some(e) = down_err {
            report.lost.push(e);
        }
        // The next node's report, heartbeating upstream meanwhile.
        if let Some((n, _)) = &down {
            let mut last_down = Instant::now();
            let mut last_beat = Instant::now();
            loop {
                match node.rx.recv_timeout(HEARTBEAT) {
                    Ok(Event::Report(r)) => {
                        report.nodes.extend(r.nodes);
                        report.lost.extend(r.lost);
                        break;
                    }
                    Ok(Event::DownHeartbeat) => last_down = Instant::now(),
                    Ok(Event::DownError(e)) => {
                        report.lost.push((n.clone(), e));
                        break;
                    }
                    _ => {}
                }
                if last_down.elapsed() > timeout {
                    report
                        .lost
                        .push((n.clone(), format!("no report within {timeout:?}")));
                    break;
                }
                if last_beat.elapsed() >= HEARTBEAT {
                    node.beat()?;
                    last_beat = Instant::now();
                }
            }
        }
        wire::write_json(&mut node.up_w, Kind::Report, &report)
            .map_err(|e| wire::peer_err("upstream", "send report", e))?;
        Ok(())
    }

    fn beat(&mut self) -> Result<(), LaunchError> {
        wire::write_empty(&mut self.up_w, Kind::Heartbeat)
            .map_err(|e| wire::peer_err("upstream", "heartbeat", e))
    }
}

/// Connects to the first node of `rest` that answers and sends it its hello.
#[allow(clippy::type_complexity)]
fn connect_down(
    rest: &[Hop],
    m: &Manifest,
    timeout_ms: u64,
    timeout: Duration,
) -> (Option<(String, TcpStream)>, Vec<(String, String)>) {
    let mut skipped = Vec::new();
    for (k, h) in rest.iter().enumerate() {
        let mut s = match connect(&h.addr, timeout) {
            Ok(s) => s,
            Err(e) => {
                skipped.push((h.name.clone(), format!("connect to {}: {e}", h.addr)));
                continue;
            }
        };
        let next = Hello {
            version: wire::VERSION,
            name: h.name.clone(),
            manifest: m.clone(),
            rest: rest[k + 1..].to_vec(),
            timeout_ms,
        };
        match wire::write_json(&mut s, Kind::Hello, &next) {
            Ok(()) => return (Some((h.name.clone(), s)), skipped),
            Err(e) => skipped.push((h.name.clone(), format!("send hello to {}: {e}", h.addr))),
        }
    }
    (None, skipped)
}

/// Reads the next node's frames into events until it closes or fails.
fn read_down(s: TcpStream, name: &str, tx: &mpsc::Sender<Event>) {
    let mut r = BufReader::new(s);
    loop {
        let ev = match wire::read_header(&mut r, name) {
            Ok((Kind::Heartbeat, _)) => Event::DownHeartbeat,
            Ok((Kind::Need, len)) => match wire::read_json(&mut r, len, name) {
                Ok(n) => Event::Need(n),
                Err(e) => Event::DownError(e.to_string()),
            },
            Ok((Kind::Report, len)) => match wire::read_json(&mut r, len, name) {
                Ok(n) => Event::Report(n),
                Err(e) => Event::DownError(e.to_string()),
            },
            Ok((k, _)) => Event::DownError(format!("unexpected {k:?} frame")),
            Err(e) if e.to_string().contains("within the bound") => continue,
            Err(e) => Event::DownError(e.to_string()),
        };
        let stop = matches!(ev, Event::DownError(_) | Event::Report(_));
        if tx.send(ev).is_err() || stop {
            return;
        }
    }
}

/// What the writer did.
struct Written {
    bytes: u64,
    chunks: usize,
    file_hashes: Vec<Option<Hash>>,
}

/// Writes verified chunks into `*.weft-part` files on its own thread and renames each file
/// when its last chunk is in.
struct Writer {
    tx: Option<mpsc::SyncSender<(usize, Vec<u8>)>>,
    /// Buffers the writer is done with, to be filled again.
    spare: mpsc::Receiver<Vec<u8>>,
    handle: Option<std::thread::JoinHandle<Result<Written, LaunchError>>>,
}

impl Writer {
    fn start(dest: PathBuf, m: Manifest, local: &manifest::Local, need: &Need) -> Writer {
        let (tx, rx) = mpsc::sync_channel::<(usize, Vec<u8>)>(QUEUE);
        let (back, spare) = mpsc::channel::<Vec<u8>>();
        let local = local.clone();
        let need = need.clone();
        let handle = std::thread::spawn(move || write_loop(&dest, &m, &local, &need, &rx, &back));
        Writer {
            tx: Some(tx),
            spare,
            handle: Some(handle),
        }
    }

    /// A buffer of `len` bytes to read a chunk into: one given back when there is one (its
    /// old bytes are overwritten by the read), else a new one.
    fn buffer(&self, len: usize) -> Vec<u8> {
        let mut b = self.spare.try_recv().unwrap_or_default();
        b.resize(len, 0);
        b
    }

    fn send(&self, idx: usize, data: Vec<u8>) -> Result<(), LaunchError> {
        match &self.tx {
            Some(tx) => tx.send((idx, data)).map_err(|_| {
                LaunchError::Usage("the writer stopped (see the node's report)".into())
            }),
            None => Ok(()),
        }
    }

    fn finish(mut self) -> Result<Written, LaunchError> {
        drop(self.tx.take());
        match self.handle.take().map(|h| h.join()) {
            Some(Ok(r)) => r,
            _ => Err(LaunchError::Usage("the writer thread panicked".into())),
        }
    }
}

fn write_loop(
    dest: &Path,
    m: &Manifest,
    local: &manifest::Local,
    need: &Need,
    rx: &mpsc::Receiver<(usize, Vec<u8>)>,
    back: &mpsc::Sender<Vec<u8>>,
) -> Result<Written, LaunchError> {
    let refs = m.chunk_refs();
    let mut first_chunk = Vec::with_capacity(m.files.len());
    let mut base = 0usize;
    for f in &m.files {
        first_chunk.push(base);
        base += f.chunks.len();
    }
    let mut remaining: Vec<usize> = vec![0; m.files.len()];
    for (i, r) in refs.iter().enumerate() {
        if need.chunks.get(i) {
            remaining[r.file] += 1;
        }
    }
    let mut open: BTreeMap<usize, File> = BTreeMap::new();
    let mut done: Vec<bool> = vec![false; m.files.len()];
    let (mut bytes, mut chunks) = (0u64, 0usize);
    let mut error: Option<LaunchError> = None;
    for (idx, data) in rx.iter() {
        if error.is_some() {
            continue;
        }
        let r = refs[idx];
        let f = &m.files[r.file];
        let ci = idx - first_chunk[r.file];
        if Hash::of(&data) != f.chunks[ci] {
            error = Some(LaunchError::Peer {
                peer: "upstream".into(),
                msg: format!(
                    "chunk {ci} of {} arrived corrupted (blake3 differs)",
                    f.path
                ),
            });
            continue;
        }
        let res = (|| -> Result<(), LaunchError> {
            let file = match open.entry(r.file) {
                std::collections::btree_map::Entry::Occupied(e) => e.into_mut(),
                std::collections::btree_map::Entry::Vacant(v) => {
                    v.insert(open_part(dest, m, r.file, local)?)
                }
            };
            let final_path = dest.join(&f.path);
            file.write_all_at(&data, r.offset).map_err(io(format!(
                "write {}",
                manifest::part_path(&final_path).display()
            )))?;
            Ok(())
        })();
        if let Err(e) = res {
            error = Some(e);
            continue;
        }
        bytes += data.len() as u64;
        chunks += 1;
        // The receiver may have stopped taking buffers back; then this one is dropped.
        let _ = back.send(data);
        remaining[r.file] -= 1;
        if remaining[r.file] == 0 {
            let file = open.remove(&r.file);
            if let Err(e) = finish_file(dest, m, r.file, file) {
                error = Some(e);
                continue;
            }
            done[r.file] = true;
        }
    }
    if let Some(e) = error {
        return Err(e);
    }
    // Files that needed no chunk but still a final copy: empty files, complete partial ones.
    for &fi in &need.files {
        if !done[fi] && remaining[fi] == 0 {
            let file = match open.remove(&fi) {
                Some(f) => Some(f),
                None => Some(open_part(dest, m, fi, local)?),
            };
            finish_file(dest, m, fi, file)?;
            done[fi] = true;
        }
    }
    let file_hashes =
        m.files
            .iter()
            .enumerate()
            .map(|(fi, f)| {
                if need.files.contains(&fi) && !done[fi] {
                    None
                } else {
                    // Every chunk is now either one we found with this hash on disk or one we
                    // verified against it before writing.
                    let mut hs: Vec<Hash> = match &local.files[fi] {
                        manifest::Found::Final { chunks, .. }
                        | manifest::Found::Part { chunks } => chunks.clone(),
                        manifest::Found::Missing => vec![],
                    };
                    hs.resize(f.chunks.len(), Hash([0; 32]));
                    for (ci, h) in f.chunks.iter().enumerate() {
                        if need.chunks.get(first_chunk[fi] + ci) {
                            hs[ci] = *h;
                        }
                    }
                    Some(manifest::file_hash(&hs))
                }
            })
            .collect();
    Ok(Written {
        bytes,
        chunks,
        file_hashes,
    })
}

/// Opens (creating it) the partial copy of file `fi`. A final file of the right size whose
/// chunks partly match is copied first, so that only the differing chunks are written.
fn open_part(
    dest: &Path,
    m: &Manifest,
    fi: usize,
    local: &manifest::Local,
) -> Result<File, LaunchError> {
    let f = &m.files[fi];
    let final_path = dest.join(&f.path);
    let part = manifest::part_path(&final_path);
    if let Some(parent) = part.parent() {
        std::fs::create_dir_all(parent).map_err(io(format!("create {}", parent.display())))?;
    }
    if let manifest::Found::Final { size, .. } = &local.files[fi]
        && *size == f.size
        && !part.exists()
    {
        std::fs::copy(&final_path, &part).map_err(io(format!(
            "copy {} to {}",
            final_path.display(),
            part.display()
        )))?;
    }
    OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(&part)
        .map_err(io(format!("open {}", part.display())))
}

/// Cuts the partial copy to size, sets its mode and renames it into place.
fn finish_file(
    dest: &Path,
    m: &Manifest,
    fi: usize,
    file: Option<File>,
) -> Result<(), LaunchError> {
    use std::os::unix::fs::PermissionsExt as _;
    let f = &m.files[fi];
    let final_path = dest.join(&f.path);
    let part = manifest::part_path(&final_path);
    // No fsync: a kill -9 loses nothing that is in the page cache, and after a power loss
    // the next run re-hashes every chunk on the node and resends whatever is not intact.
    // (An fsync per file made a directory of many small files ten times slower.)
    if let Some(file) = file {
        file.set_len(f.size)
            .map_err(io(format!("truncate {}", part.display())))?;
    }
    std::fs::set_permissions(&part, std::fs::Permissions::from_mode(f.mode))
        .map_err(io(format!("chmod {}", part.display())))?;
    std::fs::rename(&part, &final_path).map_err(io(format!(
        "rename {} to {}",
        part.display(),
        final_path.display()
    )))
}

#[cfg(test)]
mod tests;
