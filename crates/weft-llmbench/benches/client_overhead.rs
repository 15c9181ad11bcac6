//! The client's own overhead: how far weft's measured TTFT and ITL sit from a known schedule.
//!
//! The server is the scripted stand-in (`weft_llmbench::scripted`), which measures weft itself
//! and imitates no engine: it sends the first token `TTFT` after a request arrived and then one
//! token every `ITL`, on its own tokio thread, pinned to a second core where the process may use
//! one. weft's client runs on another single tokio thread pinned to one core, so the figures
//! hold for a client that has one core to itself. weft times each request from when it is
//! written to the socket (after the connection is open, and after the client's own turn among
//! the 256), so neither connection set-up nor the stand-in's reading of other requests counts. At concurrency 1 and 256 it sends
//! one uncounted batch, then `REPEATS` batches, and prints, per concurrency, the median over requests of the measured TTFT
//! and of the per-request median ITL, and how far each is from the schedule.
//!
//! The target (issue 18): within 1 % or 0.2 ms of the schedule, whichever is larger. The binary
//! exits 1 when a figure misses it.
//!
//! ```text
//! cargo bench -p weft-llmbench --bench client_overhead
//! ```

use std::time::{Duration, Instant};

use weft_llmbench::client::{Api, Client, Endpoint, Limits, Prompt};
use weft_llmbench::metrics::{Request, quantile};
use weft_llmbench::scripted::{Script, start};

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
    let mut one = nix::sched::CpuSet::new();
    one.set(core).ok()?;
    nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &one).ok()?;
    Some(core)
}

struct Figures {
    ttft_ms: f64,
    itl_ms: f64,
    requests: usize,
}

fn measure(client: &Client, rt: &tokio::runtime::Runtime, c: usize) -> Figures {
    let mut ttft = Vec::new();
    let mut itl = Vec::new();
    // One batch first that is not counted: lazy set-up in the client and the server.
    for rep in 0..=REPEATS {
        let traces = rt.block_on(async {
            let mut set = tokio::task::JoinSet::new();
            for i in 0..c {
                let cl = client.clone();
                set.spawn(async move {
                    let p = Prompt {
                        context: String::new(),
                        text: format!("request {i} of the overhead bench"),
                    };
                    cl.stream(&p, TOKENS).await
                });
            }
            let mut v = Vec::new();
            while let Some(j) = set.join_next().await {
                match j {
                    Ok(Ok(t)) => v.push(t),
                    Ok(Err(e)) => panic!("request failed: {e}"),
                    Err(e) => panic!("task failed: {e}"),
                }
            }
            v
        });
        if rep == 0 {
            continue;
        }
        for t in traces {
            assert_eq!(t.chunks.len() as u64, TOKENS, "one token per chunk");
            let r = Request {
                prompt_tokens: 1,
                gen_tokens: TOKENS,
                ttfr: t.ttfr.unwrap_or(t.e2e),
                ttft: t.first_content.unwrap_or(t.e2e),
                e2e: t.e2e,
                chunks: t.chunks.iter().map(|ch| (ch.at, 1)).collect(),
            };
            ttft.push(r.ttft.as_secs_f64() * 1e3);
            if let Some(m) = quantile(&r.itls(), 0.5) {
                itl.push(m * 1e3);
            }
        }
    }
    Figures {
        ttft_ms: quantile(&ttft, 0.5).unwrap_or(f64::NAN),
        itl_ms: quantile(&itl, 0.5).unwrap_or(f64::NAN),
        requests: ttft.len(),
    }
}

fn main() {
    // `cargo bench` passes --bench; `cargo test --benches` passes nothing: run quickly there.
    let quick = !std::env::args().any(|a| a == "--bench");
    // The client on one core, the stand-in on another where there is one: what the stand-in
    // spends reading 256 requests and writing their chunks is not the client's overhead.
    let cores = allowed_cores();
    let client_core = cores.first().copied().and_then(pin_thread);
    let server_core = cores.get(1).or(cores.first()).copied();
    let server_rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("server runtime");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        if let Some(c) = server_core {
            pin_thread(c);
        }
        server_rt.block_on(async {
            let s = start(Script {
                model: "scripted".into(),
                ttft: TTFT,
                itl: ITL,
                ..Default::default()
            })
            .await
            .expect("scripted server");
            tx.send(s.base_url()).expect("send url");
            std::future::pending::<()>().await;
            drop(s);
        })
    });
    let base_url = rx.recv().expect("server url");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("client runtime");
    let client = Client::new(
        Endpoint {
            base_url,
            api_key: None,
            model: "scripted".into(),
            api: Api::Chat,
            extra_body: Default::default(),
        },
        Limits::default(),
    )
    .expect("client");
    println!(
        "client overhead against the scripted stand-in: ttft {} ms, itl {} ms, {} tokens, {} batch(es) per concurrency, client pinned to core {}, stand-in to core {}",
        TTFT.as_millis(),
        ITL.as_millis(),
        TOKENS,
        REPEATS,
        client_core.map_or("none (affinity not set)".into(), |c| c.to_string()),
        server_core.map_or("none".into(), |c| c.to_string())
    );
    println!(
        "| concurrency | requests | ttft median (ms) | vs schedule | itl median (ms) | vs schedule | target met |"
    );
    println!("|---:|---:|---:|---:|---:|---:|:---|");
    let levels: &[usize] = if quick { &[1, 8] } else { &[1, 256] };
    let mut ok = true;
    let began = Instant::now();
    for &c in levels {
        let f = measure(&client, &rt, c);
        let sched = (TTFT.as_secs_f64() * 1e3, ITL.as_secs_f64() * 1e3);
        let within = |got: f64, want: f64| (got - want).abs() <= (want * 0.01).max(0.2);
        let met = within(f.ttft_ms, sched.0) && within(f.itl_ms, sched.1);
        ok &= met;
        println!(
            "| {c} | {} | {:.3} | {:+.3} ms ({:+.2} %) | {:.3} | {:+.3} ms ({:+.2} %) | {} |",
            f.requests,
            f.ttft_ms,
            f.ttft_ms - sched.0,
            (f.ttft_ms / sched.0 - 1.0) * 100.0,
            f.itl_ms,
            f.itl_ms - sched.1,
            (f.itl_ms / sched.1 - 1.0) * 100.0,
            if met { "yes" } else { "NO" }
        );
    }
    println!("took {:.1} s", began.elapsed().as_secs_f64());
    if !ok && !quick {
        eprintln!("client_overhead: a figure is more than 1 % (and 0.2 ms) off the schedule");
        std::process::exit(1);
    }
}
