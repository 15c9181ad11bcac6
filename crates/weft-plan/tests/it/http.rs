//! Hugging Face repositories over HTTP Range requests, against a real HTTP server started
//! by the test (axum with tower-http's ServeDir, which implements Range), on loopback.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use tower_http::services::ServeDir;
use weft_plan::source::{self, HttpOptions};
use weft_plan::synth;

use super::*;

type Counts = Arc<Mutex<HashMap<String, u32>>>;

struct Server {
    url: String,
    root: tempfile::TempDir,
    counts: Counts,
}

impl Server {
    fn repo(&self, id: &str) -> PathBuf {
        self.root.path().join(id).join("resolve/main")
    }
    fn count(&self, path: &str) -> u32 {
        self.counts.lock().unwrap().get(path).copied().unwrap_or(0)
    }
}

async fn gate(State(counts): State<Counts>, req: Request, next: Next) -> Response {
    let path = req.uri().path().to_string();
    *counts.lock().unwrap().entry(path.clone()).or_default() += 1;
    if path.starts_with("/private/") {
        let ok = req
            .headers()
            .get("authorization")
            .is_some_and(|v| v == "Bearer s3cret");
        if !ok {
            return StatusCode::UNAUTHORIZED.into_response();
        }
    }
    if path.starts_with("/slow/") && path.ends_with("00002.safetensors") {
        tokio::time::sleep(Duration::from_secs(30)).await;
    }
    next.run(req).await
}

async fn serve() -> Server {
    let root = tempfile::tempdir().unwrap();
    let counts: Counts = Arc::default();
    let app = axum::Router::new()
        .fallback_service(ServeDir::new(root.path()))
        .layer(middleware::from_fn_with_state(counts.clone(), gate));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    Server { url, root, counts }
}

fn opts(s: &Server) -> HttpOptions {
    HttpOptions {
        endpoint: s.url.clone(),
        token: None,
        revision: "main".into(),
        timeout: Duration::from_secs(10),
        retries: 1,
        first_read: 256 << 10,
        parallel: 8,
    }
}

fn write_repo(dir: &Path, config: &serde_json::Value, shards: usize) -> usize {
    let m = model(config);
    synth::write_checkpoint(dir, config, &m.tensors, shards).unwrap();
    m.tensors.len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deepseek_v3_headers_over_http_take_at_most_two_requests_per_shard() {
    let s = serve().await;
    let n = write_repo(
        &s.repo("deepseek-ai/DeepSeek-V3"),
        &fixture("deepseek-v3"),
        163,
    );
    for first_read in [256 << 10, 4096] {
        s.counts.lock().unwrap().clear();
        let o = HttpOptions {
            first_read,
            ..opts(&s)
        };
        let (m, stats) = source::load_repo("deepseek-ai/DeepSeek-V3", o)
            .await
            .unwrap();
        assert_eq!(m.tensors.len(), n);
        assert!(n > 90_000);
        let shards: Vec<_> = stats
            .requests
            .keys()
            .filter(|k| k.ends_with(".safetensors"))
            .collect();
        assert_eq!(shards.len(), 163);
        for f in shards {
            let served = s.count(&format!("/deepseek-ai/DeepSeek-V3/resolve/main/{f}"));
            assert!((1..=2).contains(&served), "{f}: {served} requests");
            // A header larger than the first read takes exactly the second request.
            if first_read == 4096 {
                assert_eq!(served, 2, "{f}");
            } else {
                assert_eq!(served, 1, "{f}");
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repo_without_an_index_is_one_model_safetensors() {
    let s = serve().await;
    write_repo(
        &s.repo("Qwen/Qwen2.5-0.5B-Instruct"),
        &fixture("qwen2.5-0.5b-instruct"),
        1,
    );
    let (m, stats) = source::load_repo("Qwen/Qwen2.5-0.5B-Instruct", opts(&s))
        .await
        .unwrap();
    assert_eq!(m.arch.layers, 24);
    assert_eq!(stats.requests.get("model.safetensors"), Some(&1));
    assert_eq!(
        s.count("/Qwen/Qwen2.5-0.5B-Instruct/resolve/main/model.safetensors.index.json"),
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_that_stalls_is_an_error_within_the_bound() {
    let s = serve().await;
    write_repo(&s.repo("slow/model"), &fixture("qwen2.5-0.5b-instruct"), 2);
    let o = HttpOptions {
        // 3 s: long enough for the shard that does answer on a loaded 2-core machine.
        timeout: Duration::from_secs(3),
        retries: 1,
        ..opts(&s)
    };
    let t0 = Instant::now();
    let err = source::load_repo("slow/model", o)
        .await
        .unwrap_err()
        .to_string();
    let took = t0.elapsed();
    // Two attempts of at most 3 s each and a 200 ms pause between them.
    assert!(took < Duration::from_secs(10), "{took:?}");
    // The stalled shard is named; on a machine loaded far past its cores (load 14 on 2),
    // the small shard's answer can miss the bound too, and the first failure is named.
    assert!(
        err.contains("model-00002-of-00002.safetensors")
            || err.contains("model-00001-of-00002.safetensors"),
        "{err}"
    );
    assert!(
        err.contains("within") && err.contains("2 attempts"),
        "{err}"
    );
    // Retried once: two requests reached the server.
    assert_eq!(
        s.count("/slow/model/resolve/main/model-00002-of-00002.safetensors"),
        2
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_header_that_lies_about_its_length_is_a_clear_error() {
    let s = serve().await;
    let dir = s.repo("liar/model");
    write_repo(&dir, &fixture("qwen2.5-0.5b-instruct"), 1);
    let f = dir.join("model.safetensors");
    let mut b = 5000u64.to_le_bytes().to_vec();
    b.extend([b' '; 92]);
    std::fs::write(&f, &b).unwrap();
    let err = source::load_repo("liar/model", opts(&s))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("claims 5000 bytes but the file holds only 100"),
        "{err}"
    );
    let mut b = u64::MAX.to_le_bytes().to_vec();
    b.extend([b' '; 92]);
    std::fs::write(&f, &b).unwrap();
    let err = source::load_repo("liar/model", opts(&s))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("liar/model/model.safetensors") && err.contains("limit"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_shards_and_private_repos_say_what_to_do() {
    let s = serve().await;
    let dir = s.repo("holes/model");
    write_repo(&dir, &fixture("qwen2.5-0.5b-instruct"), 3);
    std::fs::remove_file(dir.join("model-00002-of-00003.safetensors")).unwrap();
    let err = source::load_repo("holes/model", opts(&s))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("model-00002-of-00003.safetensors") && err.contains("404"),
        "{err}"
    );
    let err = source::load_repo("nobody/nothing", opts(&s))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("config.json") && err.contains("404"), "{err}");

    write_repo(
        &s.repo("private/model"),
        &fixture("qwen2.5-0.5b-instruct"),
        1,
    );
    let err = source::load_repo("private/model", opts(&s))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("HF_TOKEN"), "{err}");
    let o = HttpOptions {
        token: Some("s3cret".into()),
        ..opts(&s)
    };
    assert!(source::load_repo("private/model", o).await.is_ok());
}
