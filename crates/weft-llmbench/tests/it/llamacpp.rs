//! Against a real llama.cpp server: llama-cpp-python's OpenAI-compatible server serving a tiny
//! llama-architecture GGUF with random weights that `tests/make_tiny_gguf.py` writes (no
//! download). One server is shared by the tests of this module. Needs the PyPI packages
//! `llama-cpp-python[server]`, `gguf`, `tokenizers` and `llama-benchy` (`cargo xtask test`
//! installs them); without them these tests fail, they do not skip.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use weft_llmbench::client::{Api, Prompt};
use weft_llmbench::count::Counter;
use weft_llmbench::prompt::Corpus;
use weft_llmbench::runner;

use crate::{client, labels, quick_limits, sweep};

const MODEL: &str = "weft-tiny";

struct Server {
    base_url: String,
    dir: PathBuf,
    pid: u32,
}

/// Writes the tiny model into a fresh folder (once per test process).
fn model_dir() -> &'static PathBuf {
    static D: OnceLock<PathBuf> = OnceLock::new();
    D.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("weft-llmbench-it-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/make_tiny_gguf.py");
        let out = Command::new("python3")
            .arg(&script)
            .arg(&dir)
            .output()
            .expect("python3");
        assert!(
            out.status.success(),
            "make_tiny_gguf.py failed (pip install gguf tokenizers?): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        dir
    })
}

/// Starts llama-cpp-python's server on the tiny model; it logs to `LOG` in the model's folder.
///
/// `--interrupt_requests False`: by default llama-cpp-python ends the stream in progress
/// (`data: [DONE]` without a finish_reason) as soon as another request arrives, so requests
/// sent together cut each other short.
fn start_server(log: &str) -> Server {
    let dir = model_dir().clone();
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let (tx, rx) = std::sync::mpsc::channel();
    let (d2, log) = (dir.clone(), dir.join(log));
    let log2 = log.clone();
    // The server is started from a thread that lives as long as the test process, with
    // PDEATHSIG, so it goes when the tests end.
    std::thread::spawn(move || {
        use std::os::unix::process::CommandExt;
        let mut cmd = Command::new("python3");
        cmd.args(["-m", "llama_cpp.server", "--model"])
            .arg(d2.join("tiny.gguf"))
            .args([
                "--model_alias",
                MODEL,
                "--host",
                "127.0.0.1",
                "--port",
                &port.to_string(),
            ])
            .args([
                "--n_ctx",
                "8192",
                "--n_threads",
                "1",
                "--n_batch",
                "512",
                "--interrupt_requests",
                "False",
                "--verbose",
                "false",
            ])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log2).unwrap());
        // SAFETY: prctl(PR_SET_PDEATHSIG) is async-signal-safe and touches no memory of
        // the parent.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let child = cmd.spawn();
        let _ = tx.send(child.map(|c| c.id()).map_err(|e| e.to_string()));
        loop {
            std::thread::park();
        }
    });
    let pid = rx
        .recv()
        .unwrap()
        .expect("start python3 -m llama_cpp.server (pip install 'llama-cpp-python[server]')");
    let base_url = format!("http://127.0.0.1:{port}/v1");
    let began = Instant::now();
    loop {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            break;
        }
        assert!(
            began.elapsed() < Duration::from_secs(120),
            "llama_cpp.server did not listen within 120 s: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    Server { base_url, dir, pid }
}

/// The server the tests of this module share.
fn server() -> &'static Server {
    static S: OnceLock<Server> = OnceLock::new();
    S.get_or_init(|| start_server("server.log"))
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// The tests of this module one at a time: they share one server, and the side by side
/// times it.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static L: std::sync::Mutex<()> = std::sync::Mutex::new(());
    L.lock().unwrap_or_else(|e| e.into_inner())
}

#[test]
fn llamacpp_prompt_and_generated_counts_match_the_servers_at_depth_and_concurrency() {
    let _g = serial();
    let s = server();
    let counter = std::sync::Arc::new(Counter::from_file(&s.dir.join("tokenizer")).unwrap());
    // llama-cpp-python sends no usage in streams. Asked for logprobs, it lists every token it
    // generated: weft counts those, and the tokenizer on the whole text must agree.
    let mut c = client(&s.base_url, MODEL, Api::Chat, quick_limits());
    c.endpoint
        .extra_body
        .insert("logprobs".into(), serde_json::json!(true));
    c.endpoint
        .extra_body
        .insert("top_logprobs".into(), serde_json::json!(0));
    let r = rt()
        .block_on(runner::run(
            &c,
            &sweep(&[256], &[16], &[0, 1024], &[1, 2], 1),
            Corpus::words(),
            Some(&counter),
            &labels(),
            &|_| {},
        ))
        .unwrap();
    assert!(r.failure.is_none(), "{:?}", r.failure);
    assert_eq!(r.results.len(), 4);
    for t in &r.results {
        assert_eq!(t.gen_tokens.unwrap().mean, 16.0, "{}", t.tg_name);
        assert!(t.pp_tps.unwrap().mean > 0.0 && t.tg_tps.unwrap().mean > 0.0);
    }
    assert_eq!(r.results[3].pp_name, "pp256 @ d1024 (c2)");
    assert!(r.results[3].tg_tps_total.is_some());
    assert!(
        r.context.template_overhead.user > 0,
        "{:?}",
        r.context.template_overhead
    );
    assert!(
        r.context
            .counting
            .starts_with("logprobs (tokens per chunk: logprobs)"),
        "{}",
        r.context.counting
    );
    assert!(
        !r.warnings.iter().any(|w| w.starts_with("generated tokens")),
        "the tokenizer disagrees with the server's logprobs: {:?}",
        r.warnings
    );

    // Without logprobs: every stream ends with finish_reason "length", so the server
    // generated max_tokens; the tokenizer on the whole text agrees.
    let c = client(&s.base_url, MODEL, Api::Chat, quick_limits());
    let r2 = rt()
        .block_on(runner::run(
            &c,
            &sweep(&[256], &[16], &[1024], &[2], 1),
            Corpus::words(),
            Some(&counter),
            &labels(),
            &|_| {},
        ))
        .unwrap();
    assert!(r2.failure.is_none(), "{:?}", r2.failure);
    assert_eq!(r2.results[0].gen_tokens.unwrap().mean, 16.0);
    assert!(
        r2.context.counting.starts_with("finish-length"),
        "{}",
        r2.context.counting
    );
    assert!(
        !r2.warnings
            .iter()
            .any(|w| w.starts_with("generated tokens")),
        "{:?}",
        r2.warnings
    );

    // The prompts weft builds hold what the server counts: a pp256 @ d1024 chat request built
    // the way the run builds it (exact with the tokenizer, fitted to the measured template
    // overhead) is 1,280 prompt tokens by the server's own (non-streamed) usage.
    let builder = weft_llmbench::prompt::Builder {
        corpus: Corpus::words(),
        tokens_per_word: 1.3,
    };
    let mut rng = weft_llmbench::prompt::Rng::new(11);
    let over = r.context.template_overhead.system_user;
    let ctx = builder
        .build(&mut rng, "Note 1. ", 1024, Some(&counter))
        .unwrap();
    let text = builder
        .build(&mut rng, "Note 2. ", (256 - over) as u64, Some(&counter))
        .unwrap();
    let u = rt()
        .block_on(c.usage_of(&Prompt { context: ctx, text }, 1))
        .unwrap()
        .expect("non-streamed usage");
    assert_eq!(u.prompt_tokens, 1280, "{u:?}");
}

#[test]
fn llamacpp_completions_api_counts_by_finish_reason_and_the_tokenizer_agrees() {
    let _g = serial();
    let s = server();
    let counter = std::sync::Arc::new(Counter::from_file(&s.dir.join("tokenizer")).unwrap());
    let c = client(&s.base_url, MODEL, Api::Completions, quick_limits());
    let r = rt()
        .block_on(runner::run(
            &c,
            &sweep(&[200], &[8], &[0], &[1], 1),
            Corpus::words(),
            Some(&counter),
            &labels(),
            &|_| {},
        ))
        .unwrap();
    let got = r.results[0].prompt_tokens.unwrap().mean;
    assert!((got - 200.0).abs() <= 200.0 * 0.02, "prompt tokens {got}");
    assert_eq!(r.results[0].gen_tokens.unwrap().mean, 8.0);
    assert!(
        !r.warnings.iter().any(|w| w.starts_with("generated tokens")),
        "{:?}",
        r.warnings
    );
}

#[test]
fn llamacpp_wrong_model_and_a_base_url_without_v1_are_refused_with_clear_errors() {
    let _g = serial();
    let s = server();
    let c = client(&s.base_url, "no-such-model", Api::Chat, quick_limits());
    let e = rt().block_on(c.probe()).unwrap_err().to_string();
    assert!(
        e.contains("\"no-such-model\" is not served") && e.contains(MODEL),
        "{e}"
    );
    let root = s.base_url.trim_end_matches("/v1");
    let c = client(root, MODEL, Api::Chat, quick_limits());
    let e = rt().block_on(c.probe()).unwrap_err().to_string();
    assert!(
        e.contains("is not an OpenAI-compatible endpoint") && e.contains("HTTP 404"),
        "{e}"
    );
}

#[test]
fn llamacpp_prefix_cache_two_step_test_finds_the_cached_context_faster() {
    let _g = serial();
    let s = server();
    let counter = std::sync::Arc::new(Counter::from_file(&s.dir.join("tokenizer")).unwrap());
    let c = client(&s.base_url, MODEL, Api::Chat, quick_limits());
    let mut p = sweep(&[64], &[4], &[3000], &[1], 2);
    p.prefix_cache = true;
    let r = rt()
        .block_on(runner::run(
            &c,
            &p,
            Corpus::words(),
            Some(&counter),
            &labels(),
            &|_| {},
        ))
        .unwrap();
    assert!(r.failure.is_none(), "{:?}", r.failure);
    let names: Vec<&str> = r.results.iter().map(|t| t.pp_name.as_str()).collect();
    assert_eq!(names, ["ctx_pp @ d3000", "pp64 @ d3000"]);
    // llama-cpp-python keeps the last prompt's KV cache and reuses its longest common prefix:
    // the follow-up only processes its own 64 tokens, so its prompt time is far shorter.
    let ctx = r.results[0].est_ppt_ms.unwrap().mean;
    let follow = r.results[1].est_ppt_ms.unwrap().mean;
    assert!(
        follow * 3.0 < ctx,
        "follow-up {follow:.1} ms, context {ctx:.1} ms"
    );
    assert!(r.context.prefix_cache);
}

#[test]
fn llamacpp_server_killed_mid_stream_names_the_test_and_keeps_the_results_before() {
    let _g = serial();
    let s = start_server("dying.log");
    let pid = s.pid;
    let c = client(&s.base_url, MODEL, Api::Chat, quick_limits());
    let killed = std::sync::atomic::AtomicBool::new(false);
    let progress = |p: weft_llmbench::runner::Progress<'_>| {
        // The second test's requests are about to go: kill the server while they stream.
        if p.test == "pp32 @ d256" && !killed.swap(true, std::sync::atomic::Ordering::SeqCst) {
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(300));
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid as i32),
                    nix::sys::signal::Signal::SIGKILL,
                );
            });
        }
    };
    let mut l = quick_limits();
    l.retries = 1;
    let c = weft_llmbench::client::Client::new(c.endpoint.clone(), l).unwrap();
    let r = rt()
        .block_on(runner::run(
            &c,
            &sweep(&[32], &[4000], &[0, 256], &[1], 1),
            Corpus::words(),
            None,
            &labels(),
            &progress,
        ))
        .unwrap();
    let f = r.failure.as_ref().expect("the run must report the failure");
    assert_eq!(f.test, "pp32 @ d256", "{f:?}");
    assert!(
        f.error.contains("broke off") || f.error.contains("cannot connect"),
        "{}",
        f.error
    );
    assert_eq!(r.results.len(), 1);
    assert_eq!(r.results[0].pp_name, "pp32");
    assert!(r.markdown().contains("FAILED at pp32 @ d256"));
}

/// The per-run pp and tg t/s of llama-benchy's run at `depth` in its JSON report.
pub(crate) fn benchy_values(v: &serde_json::Value, depth: u64) -> (Vec<f64>, Vec<f64>) {
    let runs = v["benchmarks"]
        .as_array()
        .expect("llama-benchy JSON has `benchmarks`");
    let r = runs
        .iter()
        .find(|r| {
            r["context_size"].as_u64() == Some(depth) && r["is_context_prefill_phase"] != true
        })
        .expect("llama-benchy run at the depth");
    let vals = |k: &str| -> Vec<f64> {
        r[k]["values"]
            .as_array()
            .unwrap_or_else(|| panic!("llama-benchy {k}.values: {r}"))
            .iter()
            .filter_map(|x| x.as_f64())
            .collect()
    };
    (vals("pp_throughput"), vals("tg_throughput"))
}

pub(crate) fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Runs llama-benchy 0.4 against the server. Its defaults cannot work here, each for a reason
/// read from its stderr and source: it downloads its prompt text (a Project Gutenberg book)
/// on every start unless the book is in `~/.cache/llama-benchy/<md5 of --book-url>.txt`, and
/// this machine reaches no such host, so the test puts weft's own prompt text there under a
/// local URL; and it asks the model "What is the capital of France?" after the warm-up and
/// exits 1 unless the answer holds "Paris", which random weights never say
/// (`--skip-coherence`).
fn llama_benchy(s: &Server, pp: u64, tg: u64, runs: u32, out: &std::path::Path, post_run: &str) {
    let home = s.dir.join("benchy-home");
    crate::llama_benchy_home(&home, 40_000);
    let url = crate::BENCHY_BOOK_URL;
    let o = Command::new("python3")
        .args([
            "-m",
            "llama_benchy",
            "--base-url",
            &s.base_url,
            "--model",
            MODEL,
            "--tokenizer",
        ])
        .arg(s.dir.join("tokenizer"))
        .args([
            "--book-url",
            url,
            "--skip-coherence",
            "--post-run-cmd",
            post_run,
            "--pp",
        ])
        .arg(pp.to_string())
        .arg("--tg")
        .arg(tg.to_string())
        .args(["--depth", "0", "--runs"])
        .arg(runs.to_string())
        .args(["--format", "json", "--save-result"])
        .arg(out)
        .env("HOME", &home)
        .env("HF_HUB_OFFLINE", "1")
        .output()
        .expect("python3 -m llama_benchy (pip install llama-benchy)");
    assert!(
        o.status.success(),
        "llama-benchy failed ({}): {}\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}

/// weft and llama-benchy take turns on the same server, run by run: llama-benchy's
/// `--post-run-cmd` blocks on a FIFO after each of its runs while this test makes one weft run
/// of the same test, so each pair is measured within a few seconds (this machine's load moves
/// its speed by up to 10x over tens of seconds; within a pair it barely moves). The median of
/// the per-pair ratios is compared, and the medians of each tool's own figures are printed.
/// Both count the same way here: no usage in llama-cpp-python's streams, so both count the
/// generated text with the model's tokenizer on the whole text (which, for this model, is
/// exactly what it generated), and both time tg from the first to the last content chunk and
/// pp as prompt tokens over (time to first response less the `GET /v1/models` latency).
///
/// The 5 % agreement of issue 18 cannot be asserted on the 2-core build machine: under a load
/// average of 12-14 from parallel builds, two runs of the same tool a few seconds apart differ
/// by up to 4x (figures in docs/benchmarks.md). The test asserts that both tools run, and that
/// the median ratio lies within 0.6x-1.6x, which any counting fault of the kinds users report
/// (one chunk as one token, per-chunk tokenising, a template not counted at small pp) would
/// break; the 5 % comparison is measured on a quiet machine by scripts/gpu/bench_llm_gpu.sh.
#[test]
fn llamacpp_side_by_side_with_llama_benchy_run_by_run() {
    let _g = serial();
    let s = server();
    let (pp, tg, runs) = (PP_SIDE, TG_SIDE, 10u32);
    let counter = std::sync::Arc::new(Counter::from_file(&s.dir.join("tokenizer")).unwrap());
    let c = client(&s.base_url, MODEL, Api::Chat, quick_limits());
    let (go, done) = (s.dir.join("go.fifo"), s.dir.join("done.fifo"));
    for f in [&go, &done] {
        let _ = std::fs::remove_file(f);
        nix::unistd::mkfifo(f, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    }
    let post = format!("echo run > {}; read x < {}", go.display(), done.display());
    let out = s.dir.join("benchy.json");
    let benchy = {
        let (s_dir, base_url, out) = (s.dir.clone(), s.base_url.clone(), out.clone());
        std::thread::spawn(move || {
            let s = Server {
                base_url,
                dir: s_dir,
                pid: 0,
            };
            llama_benchy(&s, pp, tg, runs, &out, &post);
        })
    };
    // llama-benchy's warm-up run, then its `runs` runs, each followed by one weft run.
    let (mut w_pp, mut w_tg) = (vec![], vec![]);
    for k in 0..=runs {
        let line = std::fs::read_to_string(&go).unwrap();
        assert_eq!(line.trim(), "run");
        let mut p = sweep(&[pp], &[tg], &[0], &[1], 1);
        p.seed = u64::from(k) + 100;
        let r = rt()
            .block_on(runner::run(
                &c,
                &p,
                Corpus::words(),
                Some(&counter),
                &labels(),
                &|_| {},
            ))
            .unwrap();
        assert!(r.failure.is_none(), "{:?}", r.failure);
        if k > 0 {
            w_pp.push(r.results[0].runs[0].pp_tps.unwrap());
            w_tg.push(r.results[0].runs[0].tg_tps.unwrap());
        }
        std::fs::write(&done, "ok\n").unwrap();
    }
    benchy.join().unwrap();
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let (mut b_pp, mut b_tg) = benchy_values(&v, 0);
    assert_eq!(b_pp.len(), runs as usize);
    let mut r_pp: Vec<f64> = w_pp.iter().zip(&b_pp).map(|(w, b)| w / b).collect();
    let mut r_tg: Vec<f64> = w_tg.iter().zip(&b_tg).map(|(w, b)| w / b).collect();
    eprintln!("llama-benchy pp {b_pp:.0?} tg {b_tg:.0?}\nweft pp {w_pp:.0?} tg {w_tg:.0?}");
    let (rp, rt_) = (median(&mut r_pp), median(&mut r_tg));
    let (bp, bt, wp, wt) = (
        median(&mut b_pp),
        median(&mut b_tg),
        median(&mut w_pp),
        median(&mut w_tg),
    );
    eprintln!(
        "side by side (pp{pp}, tg{tg}, {runs} pairs): median weft/llama-benchy pp {:+.1} %, tg {:+.1} %; medians pp weft {wp:.1} llama-benchy {bp:.1}, tg weft {wt:.1} llama-benchy {bt:.1}",
        (rp - 1.0) * 100.0,
        (rt_ - 1.0) * 100.0
    );
    assert!((0.6..1.6).contains(&rp), "pp: weft/llama-benchy {rp}");
    assert!((0.6..1.6).contains(&rt_), "tg: weft/llama-benchy {rt_}");
}

const PP_SIDE: u64 = 2048;
const TG_SIDE: u64 = 128;
