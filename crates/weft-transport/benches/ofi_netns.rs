//! weft's ofi backend against libfabric's own `fi_pingpong`, same provider (`tcp;ofi_rxm`),
//! same message sizes and iteration counts, and weft's TCP backend, all between the same pair
//! of network namespaces (weft-netns, 2 hosts, data0 MTU 9000). Prints the markdown tables of
//! docs/benchmarks.md ("RDMA data path (libfabric)").
//!
//! ```text
//! cargo bench -p weft-transport --bench ofi_netns                  # 5 repetitions, pinned
//! cargo bench -p weft-transport --bench ofi_netns -- --reps 3 --scale 0.2   # a slow host
//! cargo bench -p weft-transport --bench ofi_netns -- --no-pin --sizes 8,1048576
//! ```
//!
//! Each measurement is two fresh processes, one per namespace, as fi_pingpong is: host 1
//! runs fi_pingpong's server or weft's echo side, host 0 the client, each pinned to its own
//! half of the CPUs with `taskset` (on 2 CPUs: CPU 0 and CPU 1; `--no-pin` leaves placement to
//! the scheduler), so that two spinning ends never wait for each other's time slice. Both ends
//! busy-poll (fi_pingpong spins on `fi_cq_read`, weft on `test`). Like fi_pingpong, MB/s is
//! both directions (`2 * iterations * size / time`, 10^6 bytes) and µs is half a round trip.
//!
//! Fairness: fi_pingpong has no warm-up. Its timed loop includes `ofi_rxm`'s lazy connection
//! set-up on the first send and the first touch of its buffers, 20-200 ms on this VM, which
//! with its default 10 iterations (or the 40 of the earlier loopback run) is a large share.
//! So every fi_pingpong figure here is corrected: the same command with `-I 1` runs next to
//! it, and time per iteration = (T(N) - T(1)) / (N - 1) (the raw figure is printed too). weft
//! connects before timing and leaves its first iteration untimed, so both figures are the
//! steady state without the first iteration. Repetitions alternate the three (fi_pingpong,
//! weft ofi, weft TCP, in an order rotated per repetition) so that all see the same load;
//! ratios are computed per repetition (adjacent runs) and their median is reported.
//!
//! Needs root, iproute2, libfabric and fi_pingpong (libfabric-bin); otherwise it says why and
//! exits.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::{Duration, Instant};

use weft_netns::{Cluster, ClusterSpec};
use weft_transport::{BackendKind, Config, Transport};

type R<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

const PROVIDER: &str = "tcp;ofi_rxm";

/// Iterations per size: 0.2 to 1 s of ping-pong on a quiet 16-core host, so that process
/// start and connection set-up are amortised; `--scale` multiplies them (0.2 on the 2-vCPU VM,
/// where every round trip is 10 to 40 times slower).
fn iters(size: usize, scale: f64) -> usize {
    let n = match size {
        0..=8192 => 20_000,
        8193..=262_144 => 5000,
        262_145..=1_048_576 => 1000,
        1_048_577..=4_194_304 => 300,
        _ => 80,
    };
    ((n as f64 * scale) as usize).max(10)
}

/// `taskset` CPU list of host `h`'s process: host 0 the first half of the CPUs, host 1 the
/// second (on 2 CPUs: CPU 0 and CPU 1), so the two ends never share a core and weft's helper
/// threads (TCP backend) stay with their process.
fn cpus(host: usize) -> String {
    let n = std::thread::available_parallelism().map_or(1, |n| n.get());
    let half = (n / 2).max(1);
    let (lo, hi) = if host == 0 || n == 1 {
        (0, half - 1)
    } else {
        (half, n - 1)
    };
    if lo == hi {
        lo.to_string()
    } else {
        format!("{lo}-{hi}")
    }
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return f64::NAN;
    }
    v[v.len() / 2]
}

fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

// ---------------------------------------------------------------------------------------------
// Worker: one end of weft's ping-pong, inside a namespace
// ---------------------------------------------------------------------------------------------

fn hex(b: &[u8]) -> String {
    b.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> R<Vec<u8>> {
    (0..s.len() / 2)
        .map(|i| Ok(u8::from_str_radix(&s[2 * i..2 * i + 2], 16)?))
        .collect()
}

/// `--worker client|server ofi|tcp <size> <iters>`: listens (prints `H <handle>`), connects
/// to the peer's handle (reads `C <handle>`), prints `READY`, waits for `GO`, runs the
/// ping-pong; the client prints `RES <MB/s> <µs per transfer>`.
fn worker(args: &[String]) -> R<()> {
    let client = args.first().is_some_and(|a| a == "client");
    let backend = match args.get(1).map(String::as_str) {
        Some("ofi") => BackendKind::Ofi,
        _ => BackendKind::Tcp,
    };
    let size: usize = args.get(2).ok_or("size")?.parse()?;
    let n: usize = args.get(3).ok_or("iters")?.parse()?;
    let mut cfg = Config::from_env()?;
    cfg.mgmt_ifname = Some("=mgmt0".parse()?);
    cfg.data_ifname = Some("=data0".parse()?);
    cfg.backend = backend;
    cfg.ofi_provider = Some(PROVIDER.into());
    cfg.timeout = Duration::from_secs(30);
    let t = Transport::new(cfg)?;
    if backend == BackendKind::Ofi && !t.is_ofi() {
        return Err(format!("ofi backend unavailable: {:?}", t.backend_note()).into());
    }
    let mut l = t.listen(0)?;
    println!("H {}", hex(&l.handle()));
    let mut line = String::new();
    std::io::stdin().read_line(&mut line)?;
    let peer = unhex(line.trim().strip_prefix("C ").ok_or("expected C")?)?;
    let (tx, rx) = t.connect_and_accept(0, &peer, &mut l)?;
    println!("READY");
    line.clear();
    std::io::stdin().read_line(&mut line)?;
    let res = weft_transport::ping_pong(tx, rx, size, n, client, Duration::from_secs(60))?;
    if client {
        let el = res.elapsed.as_secs_f64();
        println!(
            "RES {} {}",
            2.0 * (size * n) as f64 / el / 1e6,
            el * 1e6 / (2 * n) as f64
        );
    }
    println!("DONE");
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Parent
// ---------------------------------------------------------------------------------------------

struct Proc {
    child: Child,
    lines: Receiver<String>,
}

impl Proc {
    fn spawn(c: &Cluster, host: usize, pin: bool, prog: &str, args: &[&str]) -> R<Proc> {
        let mut cmd = if pin {
            let mut cmd = c.command(host, "taskset")?;
            cmd.args(["-c", &cpus(host), prog]);
            cmd
        } else {
            c.command(host, prog)?
        };
        let mut child = cmd
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()?;
        let out = child.stdout.take().ok_or("no stdout")?;
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines() {
                let Ok(l) = l else { break };
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        Ok(Proc { child, lines })
    }

    fn expect(&mut self, prefix: &str, within: Duration) -> R<String> {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let l = self
                .lines
                .recv_timeout(left)
                .map_err(|_| format!("no {prefix:?} within {within:?}"))?;
            if l.starts_with(prefix) {
                return Ok(l);
            }
        }
    }

    fn send(&mut self, l: &str) -> R<()> {
        let i = self.child.stdin.as_mut().ok_or("no stdin")?;
        writeln!(i, "{l}")?;
        Ok(())
    }

    /// Waits for exit within `within`, else kills.
    fn finish(&mut self, within: Duration) -> R<()> {
        let deadline = Instant::now() + within;
        while self.child.try_wait()?.is_none() {
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                return Err(format!("process did not exit within {within:?}").into());
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(())
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// weft's ping-pong: (MB/s, µs per transfer).
fn weft(c: &Cluster, pin: bool, backend: &str, size: usize, n: usize) -> R<(f64, f64)> {
    let exe = std::env::current_exe()?;
    let exe = exe.to_string_lossy();
    let (s, ns) = (size.to_string(), n.to_string());
    let mut srv = Proc::spawn(c, 1, pin, &exe, &["--worker", "server", backend, &s, &ns])?;
    let mut cli = Proc::spawn(c, 0, pin, &exe, &["--worker", "client", backend, &s, &ns])?;
    let hs = srv.expect("H ", Duration::from_secs(30))?;
    let hc = cli.expect("H ", Duration::from_secs(30))?;
    // Each side connects to the other's listener (one one-way connection each way).
    srv.send(&format!("C {}", &hc[2..]))?;
    cli.send(&format!("C {}", &hs[2..]))?;
    srv.expect("READY", Duration::from_secs(30))?;
    cli.expect("READY", Duration::from_secs(30))?;
    srv.send("GO")?;
    cli.send("GO")?;
    let res = cli.expect("RES", Duration::from_secs(300))?;
    srv.finish(Duration::from_secs(30))?;
    let f: Vec<f64> = res
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    match f.as_slice() {
        [bw, lat] => Ok((*bw, *lat)),
        _ => Err(format!("bad result line {res:?}").into()),
    }
}

/// fi_pingpong's client output, last line: (MB/s, µs per transfer).
fn parse_fi(text: &str) -> Option<(f64, f64)> {
    let line = text.lines().rev().find(|l| !l.trim().is_empty())?;
    let f: Vec<&str> = line.split_whitespace().collect();
    if f.len() < 8 {
        return None;
    }
    Some((f[5].parse().ok()?, f[6].parse().ok()?))
}

/// One fi_pingpong run between the namespaces: (MB/s, µs per transfer) as it prints them.
fn fi_run(c: &Cluster, pin: bool, size: usize, n: usize, port: u16) -> R<(f64, f64)> {
    let (s, ns, p) = (size.to_string(), n.to_string(), port.to_string());
    let common = [
        "-p", PROVIDER, "-e", "rdm", "-d", "data0", "-S", &s, "-I", &ns,
    ];
    let srv_args: Vec<&str> = common.iter().copied().chain(["-B", &p]).collect();
    let mut srv = Proc::spawn(c, 1, pin, "fi_pingpong", &srv_args)?;
    let dst = c.host(1).data_ifs[0].1.to_string();
    let cli_args: Vec<&str> = common.iter().copied().chain(["-P", &p, &dst]).collect();
    let mut last = String::new();
    for _ in 0..50 {
        std::thread::sleep(Duration::from_millis(100));
        let mut cli = Proc::spawn(c, 0, pin, "fi_pingpong", &cli_args)?;
        let ok = cli.finish(Duration::from_secs(120));
        // Until the reader thread sees EOF (the process has exited or been killed).
        let mut text = String::new();
        while let Ok(l) = cli.lines.recv_timeout(Duration::from_secs(5)) {
            text.push_str(&l);
            text.push('\n');
        }
        if ok.is_ok()
            && let Some(r) = parse_fi(&text)
        {
            srv.finish(Duration::from_secs(10))?;
            return Ok(r);
        }
        last = text;
    }
    Err(format!("fi_pingpong gave no result: {last}").into())
}

/// fi_pingpong corrected for its set-up inside the timed loop: (MB/s, µs per transfer,
/// uncorrected MB/s, uncorrected µs).
fn fi_pingpong(c: &Cluster, pin: bool, size: usize, n: usize, port: u16) -> R<[f64; 4]> {
    let (bw, lat) = fi_run(c, pin, size, n, port)?;
    let (_, lat1) = fi_run(c, pin, size, 1, port + 1)?;
    // µs/xfer * 2 = µs per iteration (round trip).
    let (tn, t1) = (lat * 2.0 * n as f64, lat1 * 2.0);
    let per_iter = ((tn - t1) / (n as f64 - 1.0)).max(f64::MIN_POSITIVE);
    Ok([2.0 * size as f64 / per_iter, per_iter / 2.0, bw, lat])
}

fn human(size: usize) -> String {
    if size >= 1 << 20 {
        format!("{} MiB", size >> 20)
    } else if size >= 1 << 10 {
        format!("{} KiB", size >> 10)
    } else {
        format!("{size} B")
    }
}

fn main() -> R<()> {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).is_some_and(|a| a == "--worker") {
        if let Err(e) = worker(&args[2..]) {
            println!("ERR {e}");
            std::process::exit(2);
        }
        return Ok(());
    }
    let val = |k: &str| {
        args.iter()
            .position(|a| a == k)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let reps: usize = val("--reps")
        .and_then(|v| v.parse().ok())
        .unwrap_or(5)
        .max(1);
    let pin = !args.iter().any(|a| a == "--no-pin");
    let scale: f64 = val("--scale").and_then(|v| v.parse().ok()).unwrap_or(1.0);
    let sizes: Vec<usize> = val("--sizes")
        .map(|v| v.split(',').filter_map(|s| s.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![8, 1024, 65536, 1 << 20, 4 << 20, 16 << 20]);
    if let Err(why) = weft_netns::available() {
        println!("ofi_netns: skipped: {why}");
        return Ok(());
    }
    if std::process::Command::new("fi_pingpong")
        .arg("-h")
        .output()
        .is_err()
    {
        println!("ofi_netns: skipped: no fi_pingpong (libfabric-bin)");
        return Ok(());
    }
    let fi_version = std::process::Command::new("fi_info")
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).replace('\n', " "))
        .unwrap_or_default();
    let c = Cluster::create(&ClusterSpec {
        hosts: 2,
        data_rails: 1,
        mtu: 9000,
    })?;
    println!(
        "provider {PROVIDER}, data0 MTU 9000, {reps} repetitions, {}; {} CPUs; load average \
         before: {}; {}",
        if pin {
            format!(
                "client (host 0) pinned to CPUs {}, server (host 1) to CPUs {}",
                cpus(0),
                cpus(1)
            )
        } else {
            "not pinned".to_string()
        },
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        load(),
        fi_version.trim()
    );
    // [size][rep] -> (fi corrected bw, lat, fi raw bw, lat), (ofi bw, lat), (tcp bw, lat)
    let mut fi: Vec<Vec<[f64; 4]>> = vec![Vec::new(); sizes.len()];
    let mut ofi: Vec<Vec<(f64, f64)>> = vec![Vec::new(); sizes.len()];
    let mut tcp: Vec<Vec<(f64, f64)>> = vec![Vec::new(); sizes.len()];
    let mut port = 47000u16;
    for rep in 0..reps {
        for (k, &size) in sizes.iter().enumerate() {
            let n = iters(size, scale);
            for which in 0..3 {
                match (which + rep) % 3 {
                    0 => {
                        port += 2;
                        fi[k].push(fi_pingpong(&c, pin, size, n, port)?);
                    }
                    1 => ofi[k].push(weft(&c, pin, "ofi", size, n)?),
                    _ => tcp[k].push(weft(&c, pin, "tcp", size, n)?),
                }
            }
        }
        eprintln!(
            "repetition {} of {reps} done, load average {}",
            rep + 1,
            load()
        );
    }
    println!(
        "\n| size | iterations | fi_pingpong MB/s (raw) | weft ofi MB/s | ofi / fi_pingpong | \
         fi_pingpong µs (raw) | weft ofi µs | ofi / fi_pingpong | weft tcp MB/s | weft tcp µs | \
         ofi / tcp time |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (k, &size) in sizes.iter().enumerate() {
        let col = |f: &dyn Fn(usize) -> f64| median(&(0..reps).map(f).collect::<Vec<_>>());
        let range = |f: &dyn Fn(usize) -> f64| {
            let v: Vec<f64> = (0..reps).map(f).collect();
            let lo = v.iter().copied().fold(f64::MAX, f64::min);
            let hi = v.iter().copied().fold(f64::MIN, f64::max);
            format!("{:.2} ({lo:.2}-{hi:.2})", median(&v))
        };
        println!(
            "| {} | {} | {:.1} ({:.1}) | {:.1} | {} | {:.2} ({:.2}) | {:.2} | {} | {:.1} | {:.2} | {} |",
            human(size),
            iters(size, scale),
            col(&|r| fi[k][r][0]),
            col(&|r| fi[k][r][2]),
            col(&|r| ofi[k][r].0),
            range(&|r| ofi[k][r].0 / fi[k][r][0]),
            col(&|r| fi[k][r][1]),
            col(&|r| fi[k][r][3]),
            col(&|r| ofi[k][r].1),
            range(&|r| ofi[k][r].1 / fi[k][r][1]),
            col(&|r| tcp[k][r].0),
            col(&|r| tcp[k][r].1),
            range(&|r| ofi[k][r].1 / tcp[k][r].1),
        );
    }
    println!("\nload average after: {}", load());
    Ok(())
}
