//! The client's own overhead: how far weft's measured TTFT and ITL sit from a known schedule,
//! and where the difference goes.
//!
//! The server is the scripted stand-in (`weft_llmbench::scripted`), which measures weft itself
//! and imitates no engine: it sends the first token `TTFT` after it has read a request and then
//! one token every `ITL`. It runs on a multi-thread tokio runtime over the cores the client does
//! not use (all of them but the first; `--server-threads N` sets its worker count), so reading
//! 256 requests and writing their chunks does not queue on one thread. weft's client, the real
//! one (`Client::stream`), runs on one current-thread tokio runtime on the first core, so the
//! figures hold for a client that has one core to itself. weft times each request from when it
//! is written to the socket (after the connection is open, and after the client's own turn
//! among the 256). At concurrency 1 and 256 it sends one uncounted batch, then `REPEATS`
//! batches.
//!
//! It prints, per concurrency: the median over requests of weft's TTFT and of its per-request
//! median ITL against the schedule; then where that went, from the stand-in's own record of
//! each request (`Script::trace`: when it had read the request, when each chunk was due and
//! when its write returned, on the same clock as weft's): weft's write to the stand-in's read,
//! the stand-in's own lateness, and the stand-in's write to weft's read (the client's overhead
//! proper, loopback included).
//!
//! The target (issue 18): within 1 % or 0.2 ms of the schedule, whichever is larger. With
//! `--bench` the binary exits 1 when a figure misses it.
//!
//! ```text
//! cargo bench -p weft-llmbench --bench client_overhead [-- --server-threads N]
//! ```

use std::collections::HashMap;
use std::time::{Duration, Instant};

use weft_llmbench::client::{Api, Client, Endpoint, Limits, Prompt};
use weft_llmbench::metrics::{Request, quantile};
use weft_llmbench::scripted::{Script, ScriptedServer, Served, start};

const TTFT: Duration = Duration::from_millis(100);
const ITL: Duration = Duration::from_millis(20);
const TOKENS: u64 = 48;
const REPEATS: usize = 5;

/// The cores this process may run on.
fn allowed_cores() -> Vec<usize> {
    let Ok(cur) = nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0)) else {
        return Vec::new();
    };
    (0..nix::sched::CpuSet::count())
        .filter(|&i| cur.is_set(i).unwrap_or(false))
        .collect()
}

/// Pins the calling thread to `core`.
fn pin_thread(core: usize) -> Option<usize> {
    pin_thread_to(&[core]).then_some(core)
}

/// Keeps the calling thread to `cores`; false when that could not be set.
fn pin_thread_to(cores: &[usize]) -> bool {
    let mut set = nix::sched::CpuSet::new();
    for &c in cores {
        if set.set(c).is_err() {
            return false;
        }
    }
    nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set).is_ok()
}

/// A request's times in ms: what weft measured, and where each part of its TTFT and ITL went.
#[derive(Default)]
struct Parts {
    /// weft's TTFT and median ITL (what a user of `weft bench llm` is shown).
    ttft: Vec<f64>,
    itl: Vec<f64>,
    /// From weft's socket write to the stand-in having read the whole request.
    to_read: Vec<f64>,
    /// The stand-in's first content chunk: written less due.
    server_first_late: Vec<f64>,
    /// The client's first content chunk: read by weft less written by the stand-in.
    client_first_late: Vec<f64>,
    /// The stand-in's median gap between chunk writes.
    server_itl: Vec<f64>,
    /// All chunks: written less due, and read by weft less written.
    server_late: Vec<f64>,
    client_late: Vec<f64>,
    /// CPU time of the client's thread over the counted batches, in ms.
    client_cpu: f64,
}

/// CPU time of the calling thread, in ms (NaN where the clock cannot be read).
fn thread_cpu_ms() -> f64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID).map_or(f64::NAN, |t| {
        t.tv_sec() as f64 * 1e3 + t.tv_nsec() as f64 / 1e6
    })
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// `a - b` in ms, negative when `a` is earlier.
fn diff_ms(a: Instant, b: Instant) -> f64 {
    if a >= b { ms(a - b) } else { -ms(b - a) }
}

fn median(v: &[f64]) -> f64 {
    quantile(v, 0.5).unwrap_or(f64::NAN)
}

fn measure(
    client: &Client,
    server: &ScriptedServer,
    rt: &tokio::runtime::Runtime,
    c: usize,
) -> Parts {
    let mut p = Parts::default();
    // One batch first that is not counted: lazy set-up in the client and the server.
    for rep in 0..=REPEATS {
        let cpu = thread_cpu_ms();
        let traces = rt.block_on(async {
            let mut set = tokio::task::JoinSet::new();
            for i in 0..c {
                let cl = client.clone();
                set.spawn(async move {
                    let p = Prompt {
                        context: String::new(),
                        text: format!("request {i} of the overhead bench"),
                    };
                    let t = cl.stream(&p, TOKENS).await;
                    (p.text, t)
                });
            }
            let mut v = Vec::new();
            while let Some(j) = set.join_next().await {
                match j {
                    Ok((text, Ok(t))) => v.push((text, t)),
                    Ok((_, Err(e))) => panic!("request failed: {e}"),
                    Err(e) => panic!("task failed: {e}"),
                }
            }
            v
        });
        let mut served: HashMap<String, Served> = server
            .take_served()
            .into_iter()
            .map(|s| (s.prompt.clone(), s))
            .collect();
        if rep == 0 {
            continue;
        }
        p.client_cpu += thread_cpu_ms() - cpu;
        for (text, t) in traces {
            assert_eq!(t.chunks.len() as u64, TOKENS, "one token per chunk");
            let r = Request {
                prompt_tokens: 1,
                gen_tokens: TOKENS,
                ttfr: t.ttfr.unwrap_or(t.e2e),
                ttft: t.first_content.unwrap_or(t.e2e),
                e2e: t.e2e,
                chunks: t.chunks.iter().map(|ch| (ch.at, 1)).collect(),
            };
            p.ttft.push(ms(r.ttft));
            if let Some(m) = quantile(&r.itls(), 0.5) {
                p.itl.push(m * 1e3);
            }
            let s = served
                .remove(&text)
                .unwrap_or_else(|| panic!("the stand-in kept no trace of {text:?}"));
            let sent = t.sent.expect("a streamed trace knows when it was sent");
            assert_eq!(s.written.len(), t.chunks.len(), "chunks written and read");
            p.to_read.push(diff_ms(s.arrived, sent));
            p.server_first_late.push(diff_ms(s.written[0], s.due[0]));
            p.client_first_late
                .push(diff_ms(sent + t.chunks[0].at, s.written[0]));
            let gaps: Vec<f64> = s.written.windows(2).map(|w| ms(w[1] - w[0])).collect();
            p.server_itl.push(median(&gaps));
            for (k, ch) in t.chunks.iter().enumerate() {
                p.server_late.push(diff_ms(s.written[k], s.due[k]));
                p.client_late.push(diff_ms(sent + ch.at, s.written[k]));
            }
        }
    }
    p
}

/// `--server-threads N`: the stand-in's worker threads (default: one per core the client
/// does not use, at least one).
fn server_threads_arg() -> Option<usize> {
    let args: Vec<String> = std::env::args().collect();
    let i = args.iter().position(|a| a == "--server-threads")?;
    let n = args.get(i + 1).and_then(|v| v.parse().ok());
    match n {
        Some(n) if n > 0 => Some(n),
        _ => {
            eprintln!("client_overhead: --server-threads needs a whole number above 0");
            std::process::exit(2);
        }
    }
}

fn main() {
    // `cargo bench` passes --bench; `cargo test --benches` passes nothing: run quickly there.
    let quick = !std::env::args().any(|a| a == "--bench");
    // The client on one core; the stand-in on the others where there are any: what the
    // stand-in spends reading 256 requests and writing their chunks is not the client's
    // overhead, and it is measured apart below.
    let cores = allowed_cores();
    let client_core = cores.first().copied().and_then(pin_thread);
    let mut server_cores: Vec<usize> = cores.iter().skip(1).copied().collect();
    if server_cores.is_empty() {
        server_cores = cores.clone();
    }
    let threads = server_threads_arg().unwrap_or(server_cores.len().max(1));
    let pin_to = server_cores.clone();
    let server_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .on_thread_start(move || {
            pin_thread_to(&pin_to);
        })
        .build()
        .expect("server runtime");
    let server = server_rt
        .block_on(start(Script {
            model: "scripted".into(),
            ttft: TTFT,
            itl: ITL,
            trace: true,
            // Its cores are idle but for it: yield from 3 ms before each chunk, past both
            // of tokio's millisecond roundings.
            spin_before: Duration::from_millis(3),
            ..Default::default()
        }))
        .expect("scripted server");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("client runtime");
    let client = Client::new(
        Endpoint {
            base_url: server.base_url(),
            api_key: None,
            model: "scripted".into(),
            api: Api::Chat,
            extra_body: Default::default(),
        },
        Limits::default(),
    )
    .expect("client");
    println!(
        "client overhead against the scripted stand-in: ttft {} ms, itl {} ms, {} tokens, {} batch(es) per concurrency, client on one tokio thread pinned to core {}, stand-in on {} tokio thread(s) over cores {:?}",
        TTFT.as_millis(),
        ITL.as_millis(),
        TOKENS,
        REPEATS,
        client_core.map_or("none (affinity not set)".into(), |c| c.to_string()),
        threads,
        server_cores,
    );
    let levels: &[usize] = if quick { &[1, 8] } else { &[1, 256] };
    let mut ok = true;
    let began = Instant::now();
    let sched = (ms(TTFT), ms(ITL));
    let mut rows = Vec::new();
    for &c in levels {
        rows.push((c, measure(&client, &server, &rt, c)));
    }
    println!();
    println!("What weft measured:");
    println!();
    println!(
        "| concurrency | requests | ttft median (ms) | vs schedule | itl median (ms) | vs schedule | target met |"
    );
    println!("|---:|---:|---:|---:|---:|---:|:---|");
    for (c, p) in &rows {
        let (ttft, itl) = (median(&p.ttft), median(&p.itl));
        let within = |got: f64, want: f64| (got - want).abs() <= (want * 0.01).max(0.2);
        let met = within(ttft, sched.0) && within(itl, sched.1);
        ok &= met;
        println!(
            "| {c} | {} | {:.3} | {:+.3} ms ({:+.2} %) | {:.3} | {:+.3} ms ({:+.2} %) | {} |",
            p.ttft.len(),
            ttft,
            ttft - sched.0,
            (ttft / sched.0 - 1.0) * 100.0,
            itl,
            itl - sched.1,
            (itl / sched.1 - 1.0) * 100.0,
            if met { "yes" } else { "NO" }
        );
    }
    println!();
    println!(
        "Where it went (ms, medians over requests; TTFT over the schedule is about the sum of the first three, each median taken alone):"
    );
    println!();
    println!(
        "| concurrency | ttft over schedule | weft's write to the stand-in's read | stand-in's first chunk late | first chunk: stand-in's write to weft's read | itl over schedule | stand-in's itl over schedule | weft's itl over the stand-in's |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (c, p) in &rows {
        println!(
            "| {c} | {:+.3} | {:+.3} | {:+.3} | {:+.3} | {:+.3} | {:+.3} | {:+.3} |",
            median(&p.ttft) - sched.0,
            median(&p.to_read),
            median(&p.server_first_late),
            median(&p.client_first_late),
            median(&p.itl) - sched.1,
            median(&p.server_itl) - sched.1,
            median(&p.itl) - median(&p.server_itl),
        );
    }
    println!();
    println!("Every chunk (ms over all requests' chunks):");
    println!();
    println!(
        "| concurrency | chunks | stand-in late p50 | p99 | max | stand-in's write to weft's read p50 | p99 | max | weft's CPU per chunk (µs, all its work / chunks) |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (c, p) in &rows {
        let q = |v: &[f64], x: f64| quantile(v, x).unwrap_or(f64::NAN);
        println!(
            "| {c} | {} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {:.1} |",
            p.client_late.len(),
            q(&p.server_late, 0.5),
            q(&p.server_late, 0.99),
            q(&p.server_late, 1.0),
            q(&p.client_late, 0.5),
            q(&p.client_late, 0.99),
            q(&p.client_late, 1.0),
            p.client_cpu * 1e3 / p.client_late.len() as f64,
        );
    }
    println!();
    println!("took {:.1} s", began.elapsed().as_secs_f64());
    drop(server);
    if !ok && !quick {
        eprintln!("client_overhead: a figure is more than 1 % (and 0.2 ms) off the schedule");
        std::process::exit(1);
    }
}
