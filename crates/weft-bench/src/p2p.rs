//! Pairwise bandwidth and latency between hosts over plain TCP on their data addresses.
//!
//! A server ([`serve`]) runs on every host; from each host in turn a probe ([`probe`]) measures
//! every other host: several streams for bandwidth (bytes counted by the receiver, time until
//! the receiver has them all), a ping-pong for latency, and the TCP MSS the two ends agreed on
//! (a path MTU smaller than the others shows here). [`analyse`] finds the pairs far below the
//! median and, when every pair of one host in one direction is slow, blames the host.

use std::io::{self, BufRead, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::BenchError;

const BULK: u8 = b'B';
const PING: u8 = b'L';

/// A TCP socket bound to interface `dev` (SO_BINDTODEVICE): it sends and receives on that
/// interface only, so that with the interface down nothing takes another route (the
/// management network's default route) in its place.
fn socket_on(dev: Option<&str>) -> io::Result<socket2::Socket> {
    let s = socket2::Socket::new(
        socket2::Domain::IPV4,
        socket2::Type::STREAM,
        Some(socket2::Protocol::TCP),
    )?;
    if let Some(d) = dev {
        s.bind_device(Some(d.as_bytes())).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("binding to interface {d} (SO_BINDTODEVICE): {e}"),
            )
        })?;
    }
    Ok(s)
}

/// Serves probes on `binds` (each address its own listener on `port`, 0: any; bound to its
/// interface when one is given, so a connection that arrives on another interface, e.g.
/// through the management network, is refused) until `lifetime` ends or, when `tethered`,
/// until stdin reaches end of file: the command that started the server holds its stdin, so
/// the server ends with that command (its exit, a Ctrl-C, or the SSH session closing).
/// Prints `ready PORT...` (one port per address, in order) once listening.
pub fn serve(
    binds: &[(Ipv4Addr, Option<String>)],
    port: u16,
    lifetime: Duration,
    tethered: bool,
) -> io::Result<()> {
    if binds.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "no address to listen on",
        ));
    }
    let mut ls = Vec::new();
    for (a, dev) in binds {
        let s = socket_on(dev.as_deref())?;
        s.set_reuse_address(true)?;
        s.bind(&SocketAddr::from((*a, port)).into())
            .map_err(|e| io::Error::new(e.kind(), format!("listening on {a}:{port}: {e}")))?;
        s.listen(128)?;
        let l: TcpListener = s.into();
        l.set_nonblocking(true)?;
        ls.push(l);
    }
    let ports: Vec<String> = ls
        .iter()
        .map(|l| l.local_addr().map(|a| a.port().to_string()))
        .collect::<io::Result<_>>()?;
    println!("ready {}", ports.join(" "));
    io::stdout().flush()?;
    let gone = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    if tethered {
        let g = gone.clone();
        std::thread::spawn(move || {
            let mut sink = [0u8; 256];
            let mut stdin = io::stdin();
            // Anything read is ignored; end of file or an error means the caller is gone.
            while matches!(stdin.read(&mut sink), Ok(n) if n > 0) {}
            g.store(true, std::sync::atomic::Ordering::SeqCst);
        });
    }
    let end = Instant::now() + lifetime;
    while Instant::now() < end && !gone.load(std::sync::atomic::Ordering::SeqCst) {
        let mut idle = true;
        for l in &ls {
            match l.accept() {
                Ok((s, _)) => {
                    idle = false;
                    std::thread::spawn(move || {
                        let _ = handle(s, end);
                    });
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
        if idle {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    Ok(())
}

fn handle(mut s: TcpStream, end: Instant) -> io::Result<()> {
    s.set_nonblocking(false)?;
    s.set_read_timeout(Some(
        end.saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1)),
    ))?;
    s.set_nodelay(true)?;
    let mut mode = [0u8; 1];
    s.read_exact(&mut mode)?;
    match mode[0] {
        BULK => {
            let mut buf = vec![0u8; 1 << 20];
            let mut total: u64 = 0;
            loop {
                let n = s.read(&mut buf)?;
                if n == 0 {
                    break;
                }
                total += n as u64;
            }
            s.write_all(&total.to_le_bytes())
        }
        PING => {
            let mut b = [0u8; 8];
            loop {
                match s.read_exact(&mut b) {
                    Ok(()) => s.write_all(&b)?,
                    Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
                    Err(e) => return Err(e),
                }
            }
        }
        _ => Ok(()),
    }
}

/// How one probe runs.
#[derive(Debug, Clone)]
pub struct ProbeOptions {
    pub streams: usize,
    pub duration: Duration,
    pub pings: usize,
    /// Bound on connecting and on each read and write.
    pub timeout: Duration,
    /// This host's data interface for the pair: every connection is bound to it
    /// (SO_BINDTODEVICE), so a down interface fails the pair instead of sending over
    /// another route.
    pub dev: Option<String>,
}

/// What one probe measured from this host to one peer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ProbeReport {
    pub bytes: u64,
    pub seconds: f64,
    pub gbps: f64,
    /// Median round trip of an 8-byte ping-pong, microseconds.
    pub rtt_us: f64,
    /// TCP maximum segment size of the latency connection.
    pub mss: u32,
}

fn connect(
    to: SocketAddr,
    mode: u8,
    timeout: Duration,
    dev: Option<&str>,
) -> io::Result<TcpStream> {
    let sock = socket_on(dev)?;
    sock.connect_timeout(&to.into(), timeout).map_err(|e| {
        let via = dev.map_or_else(String::new, |d| format!(" from {d}"));
        io::Error::new(e.kind(), format!("connecting to {to}{via}: {e}"))
    })?;
    let mut s: TcpStream = sock.into();
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    s.write_all(&[mode])?;
    Ok(s)
}

fn mss(s: &TcpStream) -> u32 {
    let mut v: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt(2) on a live socket into a c_int of the given length.
    let rc = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_MAXSEG,
            (&mut v as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if rc == 0 {
        u32::try_from(v).unwrap_or(0)
    } else {
        0
    }
}

/// Measures bandwidth, latency and MSS to the server at `to`.
pub fn probe(to: SocketAddr, o: &ProbeOptions) -> io::Result<ProbeReport> {
    // Latency first, on an idle link.
    let mut s = connect(to, PING, o.timeout, o.dev.as_deref())?;
    s.set_nodelay(true)?;
    let mut rtts = Vec::with_capacity(o.pings);
    let mut b = [0u8; 8];
    for i in 0..o.pings + 5 {
        let t = Instant::now();
        s.write_all(&(i as u64).to_le_bytes())?;
        s.read_exact(&mut b)?;
        if i >= 5 {
            rtts.push(t.elapsed().as_secs_f64() * 1e6);
        }
    }
    let seg = mss(&s);
    drop(s);
    let rtt_us = median(&mut rtts).unwrap_or(0.0);

    let start = Instant::now();
    let stop = start + o.duration;
    let results: Vec<io::Result<(u64, Instant)>> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..o.streams.max(1))
            .map(|_| {
                sc.spawn(move || -> io::Result<(u64, Instant)> {
                    let mut s = connect(to, BULK, o.timeout, o.dev.as_deref())?;
                    let buf = vec![0x5au8; 256 << 10];
                    while Instant::now() < stop {
                        s.write_all(&buf)?;
                    }
                    s.shutdown(std::net::Shutdown::Write)?;
                    let mut n = [0u8; 8];
                    s.read_exact(&mut n)?;
                    Ok((u64::from_le_bytes(n), Instant::now()))
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(io::Error::other("probe thread panicked")))
            })
            .collect()
    });
    let mut bytes = 0;
    let mut last = start;
    for r in results {
        let (n, t) = r?;
        bytes += n;
        last = last.max(t);
    }
    let seconds = (last - start).as_secs_f64().max(1e-9);
    Ok(ProbeReport {
        bytes,
        seconds,
        gbps: bytes as f64 * 8.0 / seconds / 1e9,
        rtt_us,
        mss: seg,
    })
}

/// The median of `v` (sorted in place).
pub fn median(v: &mut [f64]) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

/// One ordered pair on one rail.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Pair {
    pub src: String,
    pub dst: String,
    /// The source's data interface and the destination's address.
    pub src_if: String,
    pub dst_addr: Ipv4Addr,
    pub rail: usize,
    pub gbps: f64,
    pub rtt_us: f64,
    pub mss: u32,
    /// Why the pair could not be measured.
    pub error: Option<String>,
}

/// A pair far below its reference ([`crate::judge`]).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Slow {
    pub src: String,
    pub dst: String,
    pub rail: usize,
    pub gbps: f64,
    /// What the pair was judged against, Gb/s, and where that came from.
    pub reference_gbps: f64,
    pub basis: crate::judge::Basis,
    /// Percent of the reference.
    pub pct_of_reference: f64,
}

/// A host that explains slow pairs (bandwidth), small MSSs (mtu), or whose every pair failed
/// (unreachable).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Blame {
    pub host: String,
    pub rail: usize,
    /// `sending`, `receiving`, or `both` (MTU: the MSS is the smaller end's).
    pub direction: String,
    /// `bandwidth`, `mtu` or `unreachable`.
    pub what: String,
    pub message: String,
}

/// The whole matrix and what stands out.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Matrix {
    pub hosts: Vec<String>,
    pub pairs: Vec<Pair>,
    /// Median of the measured pairs (failed pairs excluded), for display.
    pub median_gbps: f64,
    pub median_rtt_us: f64,
    /// Pairs below this fraction of their reference are slow.
    pub threshold: f64,
    pub slow: Vec<Slow>,
    /// Pairs whose MSS is well below the largest one (a smaller MTU on the path).
    pub small_mss: Vec<Pair>,
    pub blamed: Vec<Blame>,
}

/// What a matrix says of its links as one figure (`weft plan --links`): the medians over the
/// measured pairs, and how many there were.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinkSummary {
    pub median_gbps: f64,
    pub median_rtt_us: f64,
    pub pairs: usize,
}

impl Matrix {
    /// The medians of the measured pairs; none when no pair was measured or the median is not
    /// a positive speed.
    pub fn link_summary(&self) -> Option<LinkSummary> {
        let pairs = self.pairs.iter().filter(|p| p.error.is_none()).count();
        (pairs > 0 && self.median_gbps > 0.0).then_some(LinkSummary {
            median_gbps: self.median_gbps,
            median_rtt_us: self.median_rtt_us,
            pairs,
        })
    }
}

/// What each host's rails should reach, Gb/s, by host name and rail (`judge::IndexedRailTargets` is
/// the same by host index).
pub type RailTargets = std::collections::BTreeMap<(String, usize), f64>;

/// Finds the slow pairs and the hosts to blame, against peers only.
pub fn analyse(hosts: Vec<String>, pairs: Vec<Pair>, threshold: f64) -> Matrix {
    analyse_with(hosts, pairs, threshold, &RailTargets::new())
}

/// Finds the slow pairs and the hosts to blame: [`crate::judge::judge`] for bandwidth
/// (`expected` first, peers second, failed pairs excluded), and the MSS for the MTU.
pub fn analyse_with(
    hosts: Vec<String>,
    pairs: Vec<Pair>,
    threshold: f64,
    expected: &RailTargets,
) -> Matrix {
    use crate::judge;
    let ok = |p: &&Pair| p.error.is_none();
    let median_gbps =
        median(&mut pairs.iter().filter(ok).map(|p| p.gbps).collect::<Vec<_>>()).unwrap_or(0.0);
    let median_rtt_us = median(
        &mut pairs
            .iter()
            .filter(ok)
            .map(|p| p.rtt_us)
            .collect::<Vec<_>>(),
    )
    .unwrap_or(0.0);
    let index = |h: &str| hosts.iter().position(|x| x == h);
    // Pairs between hosts not in `hosts` are left out of the judgement.
    let measured: Vec<(usize, judge::Measured)> = pairs
        .iter()
        .enumerate()
        .filter_map(|(k, p)| {
            Some((
                k,
                judge::Measured {
                    src: index(&p.src)?,
                    dst: index(&p.dst)?,
                    rail: p.rail,
                    gbps: p.error.is_none().then_some(p.gbps),
                },
            ))
        })
        .collect();
    let exp: judge::IndexedRailTargets = expected
        .iter()
        .filter_map(|((h, rail), g)| Some(((index(h)?, *rail), *g)))
        .collect();
    let only: Vec<judge::Measured> = measured.iter().map(|m| m.1.clone()).collect();
    let v = judge::judge(hosts.len(), &only, &exp, threshold);
    let slow: Vec<Slow> = v
        .slow
        .iter()
        .filter_map(|&j| {
            let p = &pairs[measured[j].0];
            let r = v.reference[j]?;
            Some(Slow {
                src: p.src.clone(),
                dst: p.dst.clone(),
                rail: p.rail,
                gbps: p.gbps,
                reference_gbps: r.gbps,
                basis: r.basis,
                pct_of_reference: if r.gbps > 0.0 {
                    100.0 * p.gbps / r.gbps
                } else {
                    0.0
                },
            })
        })
        .collect();
    let max_mss = pairs.iter().filter(ok).map(|p| p.mss).max().unwrap_or(0);
    let small = |p: &Pair| p.error.is_none() && f64::from(p.mss) < 0.9 * f64::from(max_mss);
    let small_mss: Vec<Pair> = pairs.iter().filter(|p| small(p)).cloned().collect();
    let mut blamed = Vec::new();
    for b in &v.blamed {
        let h = &hosts[b.host];
        let dir = b.direction;
        let mine: Vec<&Slow> = slow
            .iter()
            .filter(|s| s.rail == b.rail)
            .filter(|s| match dir {
                judge::Direction::Sending => &s.src == h,
                judge::Direction::Receiving => &s.dst == h,
                judge::Direction::Both => &s.src == h || &s.dst == h,
            })
            .collect();
        let rates = mine
            .iter()
            .map(|s| format!("{:.2}", s.gbps))
            .collect::<Vec<_>>()
            .join(", ");
        let reference = mine.iter().map(|s| s.reference_gbps).fold(0.0, f64::max);
        let basis = match mine.first().map(|s| s.basis) {
            Some(judge::Basis::Expected) => "what its links should do",
            _ => "the median of every host's best pair",
        };
        let way = match dir {
            judge::Direction::Sending => format!("every pair from {h}"),
            judge::Direction::Receiving => format!("every pair to {h}"),
            judge::Direction::Both => format!("every pair from and to {h}"),
        };
        blamed.push(Blame {
            host: h.clone(),
            rail: b.rail,
            direction: dir.as_str().into(),
            what: "bandwidth".into(),
            message: format!(
                "{way} (rail {}) is below {:.0}% of {reference:.2} Gb/s, {basis} ({rates} Gb/s): check its link speed, cable, switch port and shaping",
                b.rail,
                threshold * 100.0,
            ),
        });
    }
    for &(host, rail) in &v.unreachable {
        let h = &hosts[host];
        let first = pairs
            .iter()
            .filter(|p| p.rail == rail && (&p.src == h || &p.dst == h))
            .find_map(|p| p.error.clone())
            .unwrap_or_default();
        blamed.push(Blame {
            host: h.clone(),
            rail,
            direction: "both".into(),
            what: "unreachable".into(),
            message: format!(
                "every pair from and to {h} (rail {rail}) failed, left out of every statistic: {first}"
            ),
        });
    }
    let mut rails: Vec<usize> = pairs.iter().map(|p| p.rail).collect();
    rails.sort_unstable();
    rails.dedup();
    for &rail in &rails {
        let on: Vec<&Pair> = pairs.iter().filter(|p| p.rail == rail).collect();
        for h in &hosts {
            let touching: Vec<&&Pair> = on
                .iter()
                .filter(|p| p.error.is_none() && (&p.src == h || &p.dst == h))
                .collect();
            if !touching.is_empty() && touching.iter().all(|p| small(p)) {
                blamed.push(Blame {
                    host: h.clone(),
                    rail,
                    direction: "both".into(),
                    what: "mtu".into(),
                    message: format!(
                        "every connection with {h} (rail {rail}) has a TCP MSS of {} while others reach {max_mss}: its data interface has a smaller MTU",
                        touching.iter().map(|p| p.mss).min().unwrap_or(0)
                    ),
                });
            }
        }
    }
    Matrix {
        hosts,
        pairs,
        median_gbps,
        median_rtt_us,
        threshold,
        slow,
        small_mss,
        blamed,
    }
}

/// Colour of a cell: red (0) through yellow to green (the best pair).
fn colour(frac: f64) -> (u8, u8, u8) {
    let f = frac.clamp(0.0, 1.0);
    if f < 0.5 {
        (220, (f * 2.0 * 200.0) as u8, 40)
    } else {
        ((220.0 * (1.0 - f) * 2.0) as u8, 200, 40)
    }
}

/// Height of the heat map's text, pixels.
const TEXT_PX: u32 = 14;
/// The same as an `i32`, for layout arithmetic.
const TEXT_H: i32 = TEXT_PX as i32;
/// Side of one cell, image pixels.
const CELL: i32 = 60;
const MARGIN: i32 = 10;

/// Height of the colour legend under the grid, image pixels.
const LEGEND_H: i32 = 3 * MARGIN + 2 * TEXT_H + 20;
/// Width of the legend's colour ramp, image pixels.
const RAMP_W: i32 = 200;

fn legend_labels(best: f64) -> [String; 4] {
    [
        "0".into(),
        format!("{} Gb/s (fastest pair)", cell_label(best)),
        "diagonal".into(),
        "ERR: not measured".into(),
    ]
}

/// Size of the heat map of `m`, image pixels.
fn heatmap_size(m: &Matrix) -> (u32, u32) {
    let text_size = |s: &str| weft_font::text_size(s, TEXT_PX);
    let (left, top) = heatmap_origin(m);
    let n = m.hosts.len().max(1) as i32;
    let (tw, _) = text_size(&heatmap_title(m, 0));
    let best = m.pairs.iter().map(|p| p.gbps).fold(0.0, f64::max);
    let l = legend_labels(best);
    // As `render` lays it out: ramp, its top label, then each swatch with its label.
    let legend_w = MARGIN
        + RAMP_W
        + MARGIN
        + text_size(&l[1]).0
        + 2 * MARGIN
        + [&l[2], &l[3]]
            .iter()
            .map(|t| 26 + text_size(t).0 + 2 * MARGIN)
            .sum::<i32>();
    let w = (left + n * CELL + MARGIN)
        .max(MARGIN * 2 + tw)
        .max(legend_w);
    (w as u32, (top + n * CELL + MARGIN + LEGEND_H) as u32)
}

/// Top-left corner of the cell grid: room for the title, the row labels (left) and the turned
/// column labels (top).
fn heatmap_origin(m: &Matrix) -> (i32, i32) {
    let longest = m
        .hosts
        .iter()
        .map(|h| weft_font::text_size(h, TEXT_PX).0)
        .max()
        .unwrap_or(0);
    let title_h = TEXT_H + MARGIN;
    (MARGIN * 2 + longest, MARGIN + title_h + longest + MARGIN)
}

fn heatmap_title(m: &Matrix, rail: usize) -> String {
    format!(
        "Gb/s on rail {rail}: rows send, columns receive (median {:.2})",
        m.median_gbps
    )
}

/// A cell's text: the rate in Gb/s with 3 significant digits or so.
pub fn cell_label(gbps: f64) -> String {
    if gbps >= 100.0 {
        format!("{gbps:.0}")
    } else if gbps >= 10.0 {
        format!("{gbps:.1}")
    } else {
        format!("{gbps:.2}")
    }
}

/// Draws the heat map of `rail` on `root` (of [`heatmap_size`]).
fn render<DB: plotters::prelude::DrawingBackend>(
    m: &Matrix,
    rail: usize,
    root: &plotters::prelude::DrawingArea<DB, plotters::coord::Shift>,
) -> Result<(), String> {
    use plotters::prelude::*;
    let text_size = |s: &str| weft_font::text_size(s, TEXT_PX);
    let draw_text = |root: &DrawingArea<DB, plotters::coord::Shift>,
                     s: &str,
                     at: (i32, i32),
                     turned: bool,
                     ink: &RGBColor| {
        weft_font::draw_text(root, s, at, TEXT_PX, turned, ink).map_err(|e| e.to_string())
    };
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    root.fill(&WHITE).map_err(e)?;
    let (left, top) = heatmap_origin(m);
    draw_text(
        root,
        &heatmap_title(m, rail),
        (MARGIN, MARGIN),
        false,
        &BLACK,
    )?;
    let best = m.pairs.iter().map(|p| p.gbps).fold(0.0, f64::max);
    for (i, src) in m.hosts.iter().enumerate() {
        let y = top + i as i32 * CELL;
        let x = left + i as i32 * CELL;
        // Row label (sender), right-aligned against the grid, centred on the row.
        let (w, _) = text_size(src);
        draw_text(
            root,
            src,
            (left - MARGIN - w, y + (CELL - TEXT_H) / 2),
            false,
            &BLACK,
        )?;
        // Column label (receiver), turned, bottom-aligned against the grid.
        draw_text(
            root,
            src,
            (x + (CELL - TEXT_H) / 2, top - MARGIN - w),
            true,
            &BLACK,
        )?;
        for (j, dst) in m.hosts.iter().enumerate() {
            let (c, label, ink) = if i == j {
                (RGBColor(190, 190, 190), "-".to_string(), BLACK)
            } else {
                match m
                    .pairs
                    .iter()
                    .find(|p| &p.src == src && &p.dst == dst && p.rail == rail)
                {
                    Some(p) if p.error.is_none() && best > 0.0 => {
                        let (r, g, b) = colour(p.gbps / best);
                        // Black on light cells (green, yellow), white on dark (red).
                        let luma =
                            0.299 * f64::from(r) + 0.587 * f64::from(g) + 0.114 * f64::from(b);
                        let ink = if luma < 110.0 { WHITE } else { BLACK };
                        (RGBColor(r, g, b), cell_label(p.gbps), ink)
                    }
                    Some(p) if p.error.is_some() => (RGBColor(0, 0, 0), "ERR".into(), WHITE),
                    _ => (RGBColor(0, 0, 0), "?".into(), WHITE),
                }
            };
            let x = left + j as i32 * CELL;
            root.draw(&Rectangle::new(
                [(x + 1, y + 1), (x + CELL - 1, y + CELL - 1)],
                c.filled(),
            ))
            .map_err(e)?;
            let (w, h) = text_size(&label);
            draw_text(
                root,
                &label,
                (x + (CELL - w) / 2, y + (CELL - h) / 2),
                false,
                &ink,
            )?;
        }
    }
    // Legend: the colour ramp from 0 to the fastest pair, then the grey and black cells.
    let n = m.hosts.len() as i32;
    let y = top + n * CELL + 2 * MARGIN;
    let labels = legend_labels(best);
    for k in 0..RAMP_W {
        let (r, g, b) = colour(f64::from(k) / f64::from(RAMP_W - 1));
        root.draw(&Rectangle::new(
            [(MARGIN + k, y), (MARGIN + k + 1, y + 20)],
            RGBColor(r, g, b).filled(),
        ))
        .map_err(e)?;
    }
    let ty = y + 20 + MARGIN / 2;
    draw_text(root, &labels[0], (MARGIN, ty), false, &BLACK)?;
    let (w1, _) = text_size(&labels[1]);
    let x1 = MARGIN + RAMP_W + MARGIN;
    draw_text(root, &labels[1], (x1, y + 3), false, &BLACK)?;
    let mut x = x1 + w1 + 2 * MARGIN;
    for (swatch, label) in [
        (RGBColor(190, 190, 190), &labels[2]),
        (RGBColor(0, 0, 0), &labels[3]),
    ] {
        root.draw(&Rectangle::new([(x, y), (x + 20, y + 20)], swatch.filled()))
            .map_err(e)?;
        draw_text(root, label, (x + 26, y + 3), false, &BLACK)?;
        x += 26 + text_size(label).0 + 2 * MARGIN;
    }
    Ok(())
}

/// Writes the bandwidth matrix of `rail` as a PNG heat map: rows are senders, columns
/// receivers in `m.hosts` order, each labelled with the host's name; each cell holds the rate
/// in Gb/s; red is slow, green the fastest pair, grey the diagonal, black a pair that could not
/// be measured (`ERR`). Text is drawn with the font built into the binary (`weft_font`): no
/// font file, no system font.
pub fn heatmap(m: &Matrix, rail: usize, path: &Path) -> Result<(), BenchError> {
    use plotters::prelude::*;
    let err = |e: String| BenchError::Io {
        context: format!("writing {}", path.display()),
        source: io::Error::other(e),
    };
    let root = BitMapBackend::new(path, heatmap_size(m)).into_drawing_area();
    render(m, rail, &root).map_err(err)?;
    root.present().map_err(|e| err(e.to_string()))?;
    Ok(())
}

/// The heat map of `rail` as RGB pixels (width, height, 3 bytes a pixel), as [`heatmap`] would
/// write it.
pub fn heatmap_rgb(m: &Matrix, rail: usize) -> Result<(u32, u32, Vec<u8>), BenchError> {
    use plotters::prelude::*;
    let (w, h) = heatmap_size(m);
    let mut buf = vec![0u8; w as usize * h as usize * 3];
    {
        let root = BitMapBackend::with_buffer(&mut buf, (w, h)).into_drawing_area();
        render(m, rail, &root).map_err(BenchError::Usage)?;
        root.present()
            .map_err(|e| BenchError::Usage(format!("heat map: {e}")))?;
    }
    Ok((w, h, buf))
}

/// Why a p2p server's `ready PORT...` line did not come ([`read_ready`]).
#[derive(Debug, thiserror::Error)]
pub enum ReadyError {
    /// It printed something else.
    #[error("server said {0:?} instead of `ready PORT...`")]
    Unexpected(String),
    #[error("reading from server: {0}")]
    Read(#[source] io::Error),
    #[error("server not ready within {0:?}")]
    Timeout(Duration),
    /// The server was started without a pipe for its output.
    #[error("no stdout")]
    NoStdout,
}

/// Reads the `ready PORT...` line a server prints, waiting at most `timeout`.
pub fn read_ready(
    out: impl Read + Send + 'static,
    timeout: Duration,
) -> Result<Vec<u16>, ReadyError> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let r = io::BufReader::new(out).read_line(&mut line).map(|_| line);
        let _ = tx.send(r);
    });
    match rx.recv_timeout(timeout) {
        Ok(Ok(l)) => l
            .trim()
            .strip_prefix("ready ")
            .and_then(|p| {
                p.split_whitespace()
                    .map(|x| x.parse().ok())
                    .collect::<Option<Vec<u16>>>()
            })
            .filter(|v| !v.is_empty())
            .ok_or_else(|| ReadyError::Unexpected(l.trim().to_string())),
        Ok(Err(e)) => Err(ReadyError::Read(e)),
        Err(_) => Err(ReadyError::Timeout(timeout)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(src: &str, dst: &str, gbps: f64, mss: u32) -> Pair {
        Pair {
            src: src.into(),
            dst: dst.into(),
            src_if: "data0".into(),
            dst_addr: Ipv4Addr::LOCALHOST,
            rail: 0,
            gbps,
            rtt_us: 50.0,
            mss,
            error: None,
        }
    }

    #[test]
    fn a_link_summary_needs_a_measured_pair() {
        let hosts = vec!["a".to_string(), "b".to_string()];
        let m = analyse(
            hosts.clone(),
            vec![pair("a", "b", 10.0, 8948), pair("b", "a", 20.0, 8948)],
            0.5,
        );
        let l = m.link_summary().unwrap();
        assert_eq!((l.pairs, l.median_gbps), (2, m.median_gbps));
        assert!(l.median_gbps > 0.0);
        let mut failed = pair("a", "b", 0.0, 8948);
        failed.error = Some("refused".into());
        assert_eq!(analyse(hosts, vec![failed], 0.5).link_summary(), None);
    }

    #[test]
    fn a_slow_sender_and_a_small_mtu_are_blamed_and_nothing_else() {
        let hosts: Vec<String> = (0..4).map(|i| format!("h{i}")).collect();
        let mut pairs = Vec::new();
        for s in &hosts {
            for d in &hosts {
                if s != d {
                    let g = if s == "h2" { 0.2 } else { 1.0 };
                    let mss = if s == "h3" || d == "h3" { 1448 } else { 8948 };
                    pairs.push(pair(s, d, g, mss));
                }
            }
        }
        let m = analyse(hosts, pairs, 0.5);
        assert_eq!(m.slow.len(), 3);
        let b: Vec<(&str, &str, &str)> = m
            .blamed
            .iter()
            .map(|b| (b.host.as_str(), b.direction.as_str(), b.what.as_str()))
            .collect();
        assert_eq!(b, [("h2", "sending", "bandwidth"), ("h3", "both", "mtu")]);
    }

    #[test]
    fn probe_against_a_local_server() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let end = Instant::now() + Duration::from_secs(30);
        std::thread::spawn(move || {
            for s in l.incoming().take(3) {
                let s = s.unwrap();
                std::thread::spawn(move || handle(s, end));
            }
        });
        let r = probe(
            SocketAddr::from(([127, 0, 0, 1], port)),
            &ProbeOptions {
                streams: 2,
                duration: Duration::from_millis(200),
                pings: 10,
                timeout: Duration::from_secs(20),
                dev: Some("lo".into()),
            },
        )
        .unwrap();
        assert!(
            r.bytes > 0 && r.gbps > 0.0 && r.rtt_us > 0.0 && r.mss > 0,
            "{r:?}"
        );
    }

    /// Writes the heat map of a 4-host matrix with one slow sender to
    /// `$WEFT_HEATMAP_SAMPLE`, to look at; without the variable it only checks the PNG.
    #[test]
    fn heat_map_sample() {
        let hosts: Vec<String> = ["node1", "node2", "spark-a", "gpu03"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let mut pairs = Vec::new();
        for s in &hosts {
            for d in &hosts {
                if s != d {
                    let g = if s == "node2" { 0.08 } else { 0.39 };
                    pairs.push(pair(s, d, g, 8948));
                }
            }
        }
        pairs[5].error = Some("refused".into());
        let m = analyse(hosts, pairs, 0.5);
        let d = tempfile::tempdir().unwrap();
        let p = std::env::var("WEFT_HEATMAP_SAMPLE")
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|_| d.path().join("m.png"));
        heatmap(&m, 0, &p).unwrap();
        assert_eq!(&std::fs::read(&p).unwrap()[..4], b"\x89PNG");
    }

    #[test]
    fn heat_map_is_a_png() {
        let m = analyse(
            vec!["a".into(), "b".into()],
            vec![pair("a", "b", 1.0, 1448), pair("b", "a", 0.3, 1448)],
            0.5,
        );
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("m.png");
        heatmap(&m, 0, &p).unwrap();
        assert_eq!(&std::fs::read(&p).unwrap()[..4], b"\x89PNG");
    }

    /// The labels are drawn: the row label of the first host holds dark (label) pixels, and
    /// it differs between two host names; each measured cell holds its value in black on its
    /// colour, and another value draws other pixels.
    #[test]
    fn heat_map_has_host_labels_and_cell_values() {
        let mk = |a: &str, gbps: f64| {
            analyse(
                vec![a.into(), "node2".into()],
                vec![pair(a, "node2", gbps, 1448), pair("node2", a, 0.3, 1448)],
                0.5,
            )
        };
        let m1 = mk("node1", 1.0);
        let m2 = mk("node7", 1.0);
        let (w, h, p1) = heatmap_rgb(&m1, 0).unwrap();
        let (w2, h2, p2) = heatmap_rgb(&m2, 0).unwrap();
        assert_eq!((w, h), (w2, h2));
        let (left, top) = heatmap_origin(&m1);
        let px = |p: &[u8], x: i32, y: i32| -> (u8, u8, u8) {
            let k = (y as usize * w as usize + x as usize) * 3;
            (p[k], p[k + 1], p[k + 2])
        };
        let region = |p: &[u8], x0: i32, y0: i32, x1: i32, y1: i32| -> Vec<(u8, u8, u8)> {
            (y0..y1)
                .flat_map(|y| (x0..x1).map(move |x| (x, y)))
                .map(|(x, y)| px(p, x, y))
                .collect()
        };
        // Row label of host 0: left of the grid, on row 0.
        let l1 = region(&p1, 0, top, left, top + CELL);
        let l2 = region(&p2, 0, top, left, top + CELL);
        // Dark pixels: the font is drawn anti-aliased, so few are pure black.
        let black = |v: &[(u8, u8, u8)]| {
            v.iter()
                .filter(|c| c.0 < 90 && c.1 < 90 && c.2 < 90)
                .count()
        };
        assert!(black(&l1) > 20, "no label pixels");
        assert_ne!(l1, l2, "two names, one picture");
        // Column label of host 0: above the grid.
        let c1 = region(&p1, left, 0, left + CELL, top);
        assert!(black(&c1) > 20);
        // Cell (0, 1): green (the best pair) with "1.00" in black.
        let cell = region(
            &p1,
            left + CELL + 2,
            top + 2,
            left + 2 * CELL - 2,
            top + CELL - 2,
        );
        assert!(black(&cell) > 20, "no value in the cell");
        assert!(cell.iter().any(|c| c.1 == 200 && c.0 < 50), "not green");
        let m3 = mk("node1", 2.0);
        let (_, _, p3) = heatmap_rgb(&m3, 0).unwrap();
        let cell3 = region(
            &p3,
            left + CELL + 2,
            top + 2,
            left + 2 * CELL - 2,
            top + CELL - 2,
        );
        assert_ne!(cell, cell3, "1.00 and 2.00 drew the same pixels");
        assert_eq!(cell_label(394.2), "394");
        assert_eq!(cell_label(23.45), "23.4");
        assert_eq!(cell_label(0.3), "0.30");
    }

    #[test]
    fn ready_lines_are_ports_or_a_named_error() {
        let t = Duration::from_secs(5);
        assert_eq!(
            read_ready(&b"ready 5001 5002\n"[..], t).unwrap(),
            [5001, 5002]
        );
        let e = read_ready(&b"listening\n"[..], t).unwrap_err();
        assert!(matches!(e, ReadyError::Unexpected(_)));
        assert_eq!(
            e.to_string(),
            "server said \"listening\" instead of `ready PORT...`"
        );
        // A pipe nobody writes to: the bound ends the wait.
        let (r, _w) = std::io::pipe().unwrap();
        let e = read_ready(r, Duration::from_millis(50)).unwrap_err();
        assert_eq!(e.to_string(), "server not ready within 50ms");
    }
}
