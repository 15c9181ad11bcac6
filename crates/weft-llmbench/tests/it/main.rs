//! Integration tests. `scripted`: weft's error paths and counting against the scripted
//! stand-in server (it measures weft itself; no engine is imitated). `llamacpp`: a real
//! llama.cpp server (llama-cpp-python) serving a tiny random-weights GGUF the test writes, and
//! llama-benchy side by side on it.

mod llamacpp;
mod scripted;

use std::time::Duration;

use weft_llmbench::client::{Api, Client, Endpoint, Limits};
use weft_llmbench::runner::{Labels, LatencyMode, Plan};

pub fn client(base_url: &str, model: &str, api: Api, limits: Limits) -> Client {
    Client::new(
        Endpoint {
            base_url: base_url.into(),
            api_key: None,
            model: model.into(),
            api,
            extra_body: Default::default(),
        },
        limits,
    )
    .unwrap()
}

pub fn quick_limits() -> Limits {
    Limits {
        connect: Duration::from_secs(2),
        first_byte: Duration::from_secs(20),
        between_chunks: Duration::from_secs(5),
        request: Duration::from_secs(60),
        retries: 2,
        backoff: Duration::from_millis(50),
    }
}

pub fn plan(pp: &[u64], tg: &[u64], depth: &[u64], c: &[u32], runs: u32) -> Plan {
    Plan {
        pp: pp.to_vec(),
        tg: tg.to_vec(),
        depth: depth.to_vec(),
        concurrency: c.to_vec(),
        runs,
        prefix_cache: false,
        latency_mode: LatencyMode::Api,
        adapt_prompt: true,
        seed: 3,
    }
}

pub fn labels() -> Labels {
    Labels {
        weft_version: "test".into(),
        ..Default::default()
    }
}
