//! Against the scripted stand-in server (`weft_llmbench::scripted`): it measures weft itself
//! and drives the error paths no real engine shows on demand.

use std::sync::atomic::Ordering;
use std::time::Duration;

use weft_llmbench::LlmError;
use weft_llmbench::client::{Api, Prompt};
use weft_llmbench::prompt::Corpus;
use weft_llmbench::runner;
use weft_llmbench::scripted::{Fault, Script, start};

use crate::{client, labels, plan, quick_limits};

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn scripted_chunks_of_three_tokens_are_counted_as_three_not_one() {
    rt().block_on(async {
        let s = start(Script {
            tokens_per_chunk: 3,
            itl: Duration::from_millis(15),
            role_chunk: true,
            ..Default::default()
        })
        .await
        .unwrap();
        let c = client(&s.base_url(), "scripted", Api::Chat, quick_limits());
        let r = runner::run(
            &c,
            &plan(&[64], &[30], &[0], &[1], 2),
            Corpus::words(),
            None,
            &labels(),
            &|_| {},
        )
        .await
        .unwrap();
        let t = &r.results[0];
        assert_eq!(t.gen_tokens.unwrap().mean, 30.0);
        // 27 tokens after the first chunk in 9 gaps of 15 ms: 200 t/s (chunk counting: 66).
        let tg = t.tg_tps.unwrap().mean;
        // (10 %: a loaded 2-core CI machine delays single chunks.)
        assert!((tg - 200.0).abs() < 200.0 * 0.1, "tg {tg}");
        // TTFT is the first content chunk, not the role-only chunk sent at once.
        assert!(t.e2e_ttft_ms.unwrap().mean >= 50.0, "{:?}", t.e2e_ttft_ms);
        assert!(
            r.context.counting.starts_with("usage"),
            "{}",
            r.context.counting
        );
        assert_eq!(t.tg_name, "tg30");
    });
}

#[test]
fn scripted_token_ids_win_over_usage_and_concurrency_totals_add_up() {
    rt().block_on(async {
        let s = start(Script {
            token_ids: true,
            ..Default::default()
        })
        .await
        .unwrap();
        let c = client(&s.base_url(), "scripted", Api::Completions, quick_limits());
        let r = runner::run(
            &c,
            &plan(&[32], &[20], &[0, 200], &[4], 1),
            Corpus::words(),
            None,
            &labels(),
            &|_| {},
        )
        .await
        .unwrap();
        assert!(
            r.context.counting.starts_with("token-ids"),
            "{}",
            r.context.counting
        );
        assert_eq!(r.results.len(), 2);
        let d = &r.results[1];
        assert_eq!(d.pp_name, "pp32 @ d200 (c4)");
        // Each of 4 streams: 100 t/s; together about 400.
        let total = d.tg_tps_total.unwrap().mean;
        assert!((total - 400.0).abs() < 40.0, "total {total}");
        // 4 requests in flight per run; warm-up sends 4 (one more with a tokenizer? no: 4).
        assert!(s.requests.load(Ordering::SeqCst) >= 8);
        // Depth and prompt reached the server: about 232 words in its count.
        let p = d.prompt_tokens.unwrap().mean;
        assert!((p - 232.0).abs() < 232.0 * 0.1, "prompt tokens {p}");
    });
}

#[test]
fn scripted_429_is_retried_within_the_bound_then_reported() {
    rt().block_on(async {
        let s = start(Script {
            fault: Fault::Status {
                status: 429,
                times: 2,
            },
            ..Default::default()
        })
        .await
        .unwrap();
        let c = client(&s.base_url(), "scripted", Api::Chat, quick_limits());
        let t = c
            .stream(
                &Prompt {
                    context: String::new(),
                    text: "a b c".into(),
                },
                4,
            )
            .await
            .unwrap();
        assert_eq!(t.attempts, 3);
        let s = start(Script {
            fault: Fault::Status {
                status: 500,
                times: 100,
            },
            ..Default::default()
        })
        .await
        .unwrap();
        let c = client(&s.base_url(), "scripted", Api::Chat, quick_limits());
        let began = std::time::Instant::now();
        match c
            .stream(
                &Prompt {
                    context: String::new(),
                    text: "a b c".into(),
                },
                4,
            )
            .await
        {
            Err(LlmError::Status {
                status: 500,
                attempts: 3,
                ..
            }) => {}
            other => panic!("{other:?}"),
        }
        assert!(began.elapsed() < Duration::from_secs(2));
        assert_eq!(s.requests.load(Ordering::SeqCst), 3);
    });
}

#[test]
fn scripted_server_dying_mid_stream_names_the_test_and_keeps_earlier_results() {
    rt().block_on(async {
        // Warm-up sends 5 requests (load, two calibrations, system+user... and api latency is GET);
        // the first measured test's requests then succeed; the server dies on the later ones.
        let s = start(Script {
            fault: Fault::DieAfter {
                after_requests: 6,
                chunks: 3,
            },
            ..Default::default()
        })
        .await
        .unwrap();
        let c = client(&s.base_url(), "scripted", Api::Chat, quick_limits());
        let r = runner::run(
            &c,
            &plan(&[16], &[8], &[0, 64], &[1], 2),
            Corpus::words(),
            None,
            &labels(),
            &|_| {},
        )
        .await
        .unwrap();
        let f = r.failure.as_ref().expect("the run must report the failure");
        assert_eq!(f.test, "pp16 @ d64", "{f:?}");
        assert!(
            f.error.contains("broke off") && f.error.contains("[DONE]"),
            "{}",
            f.error
        );
        assert_eq!(r.results[0].pp_name, "pp16");
        assert_eq!(r.results[0].runs.len(), 2);
        assert!(r.markdown().contains("FAILED at pp16 @ d64"));
    });
}

#[test]
fn scripted_wrong_model_and_html_endpoint_are_refused_with_clear_errors() {
    rt().block_on(async {
        let s = start(Script::default()).await.unwrap();
        let c = client(&s.base_url(), "no-such-model", Api::Chat, quick_limits());
        let e = c.probe().await.unwrap_err().to_string();
        assert!(
            e.contains("\"no-such-model\" is not served") && e.contains("scripted"),
            "{e}"
        );
        let h = start(Script {
            fault: Fault::Html,
            ..Default::default()
        })
        .await
        .unwrap();
        let c = client(&h.base_url(), "scripted", Api::Chat, quick_limits());
        let e = c.probe().await.unwrap_err().to_string();
        assert!(
            e.contains("is not an OpenAI-compatible endpoint") && e.contains("not JSON"),
            "{e}"
        );
        let e = c
            .stream(
                &Prompt {
                    context: String::new(),
                    text: "x".into(),
                },
                2,
            )
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains("text/html") && e.contains("event stream"), "{e}");
        // Nothing listens: a clear connect error within the bound.
        let dead = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap()
        };
        let c = client(&format!("http://{dead}/v1"), "m", Api::Chat, quick_limits());
        let e = c.probe().await.unwrap_err().to_string();
        assert!(e.contains("cannot connect"), "{e}");
    });
}

#[test]
fn scripted_stalled_stream_is_an_error_within_the_chunk_bound() {
    rt().block_on(async {
        let s = start(Script {
            itl: Duration::from_secs(5),
            ..Default::default()
        })
        .await
        .unwrap();
        let mut l = quick_limits();
        l.between_chunks = Duration::from_millis(300);
        let c = client(&s.base_url(), "scripted", Api::Chat, l);
        let began = std::time::Instant::now();
        let e = c
            .stream(
                &Prompt {
                    context: String::new(),
                    text: "x".into(),
                },
                4,
            )
            .await
            .unwrap_err();
        assert!(
            began.elapsed() < Duration::from_secs(2),
            "{:?}",
            began.elapsed()
        );
        match e {
            LlmError::Stream {
                reason, partial, ..
            } => {
                assert!(reason.contains("next chunk"), "{reason}");
                assert_eq!(partial.chunks.len(), 1);
            }
            other => panic!("{other:?}"),
        }
    });
}

#[test]
fn scripted_runs_compare_into_speedups_and_png_plots() {
    let dir = tempfile::tempdir().unwrap();
    let mut inputs = Vec::new();
    for (nodes, itl) in [(1u32, 40u64), (2, 24), (4, 10)] {
        let r = rt().block_on(async {
            let s = start(Script {
                itl: Duration::from_millis(itl),
                ..Default::default()
            })
            .await
            .unwrap();
            let c = client(&s.base_url(), "scripted", Api::Chat, quick_limits());
            let mut lb = labels();
            lb.nodes = Some(nodes);
            lb.layout = Some(format!("tp{nodes}"));
            runner::run(
                &c,
                &plan(&[32], &[12], &[0, 100], &[1], 1),
                Corpus::words(),
                None,
                &lb,
                &|_| {},
            )
            .await
            .unwrap()
        });
        let p = dir.path().join(format!("{nodes}n.json"));
        r.save(&p).unwrap();
        inputs.push((
            p.clone(),
            weft_llmbench::report::RunReport::load(&p).unwrap(),
        ));
    }
    let c = weft_llmbench::compare::compare(&inputs).unwrap();
    let tg = c.rows.iter().find(|r| r.test == "tg12").unwrap();
    let s4 = tg.points[2].speedup.unwrap();
    assert!((s4 - 4.0).abs() < 0.6, "speed-up at 4 nodes {s4}");
    assert!((tg.points[2].efficiency.unwrap() - s4 / 4.0).abs() < 1e-9);
    assert!(
        c.markdown().contains("| tg12 | 4 nodes tp4 |"),
        "{}",
        c.markdown()
    );
    let plots = c.plots(&dir.path().join("scaling")).unwrap();
    for p in &plots {
        let b = std::fs::read(p).unwrap();
        assert!(
            b.starts_with(b"\x89PNG") && b.len() > 2000,
            "{}",
            p.display()
        );
    }
    if let Ok(d) = std::env::var("WEFT_LLM_PLOTS") {
        for p in &plots {
            std::fs::copy(p, std::path::Path::new(&d).join(p.file_name().unwrap())).unwrap();
        }
    }
    // A run without --nodes is refused, naming the file.
    let mut bad = inputs[0].1.clone();
    bad.context.nodes = None;
    let e = weft_llmbench::compare::compare(&[(dir.path().join("x.json"), bad)])
        .unwrap_err()
        .to_string();
    assert!(e.contains("x.json") && e.contains("--nodes"), "{e}");
}

/// A tokenizer.json with one word-level token per piece that `pre` cuts out (every piece is
/// the unknown token: only the count matters).
fn word_tokenizer(dir: &std::path::Path, pre: &str) -> std::path::PathBuf {
    let p = dir.join(format!("{pre}.json"));
    let j = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
        "normalizer": null, "pre_tokenizer": {"type": pre}, "post_processor": null,
        "decoder": null,
        "model": {"type": "WordLevel", "vocab": {"[UNK]": 0}, "unk_token": "[UNK]"}
    });
    std::fs::write(&p, j.to_string()).unwrap();
    p
}

#[test]
fn scripted_prompt_counts_more_than_2_percent_apart_are_a_warning_and_agreeing_ones_are_not() {
    // The scripted server counts whitespace-separated words. A tokenizer that also cuts off
    // punctuation ("river." is two tokens) builds prompts the server counts about 10 % short.
    let dir = tempfile::tempdir().unwrap();
    let run = |pre: &str| {
        let counter = std::sync::Arc::new(
            weft_llmbench::count::Counter::from_file(&word_tokenizer(dir.path(), pre)).unwrap(),
        );
        rt().block_on(async {
            let s = start(Script {
                ttft: Duration::from_millis(5),
                itl: Duration::from_millis(2),
                ..Default::default()
            })
            .await
            .unwrap();
            let c = client(&s.base_url(), "scripted", Api::Chat, quick_limits());
            runner::run(
                &c,
                &plan(&[300], &[4], &[0], &[1], 1),
                Corpus::words(),
                Some(&counter),
                &labels(),
                &|_| {},
            )
            .await
            .unwrap()
        })
    };
    let off = run("Whitespace");
    let w: Vec<&String> = off
        .warnings
        .iter()
        .filter(|w| w.starts_with("prompt tokens"))
        .collect();
    assert_eq!(w.len(), 1, "{:?}", off.warnings);
    assert!(
        w[0].contains("where weft built 300") && w[0].contains("is --tokenizer the model's?"),
        "{}",
        w[0]
    );
    assert!(off.markdown().contains("warning: prompt tokens"));
    let same = run("WhitespaceSplit");
    assert!(
        !same.warnings.iter().any(|w| w.starts_with("prompt tokens")),
        "{:?}",
        same.warnings
    );
    assert_eq!(same.results[0].prompt_tokens.unwrap().mean, 300.0);
}
