//! `weft bench llm` as a library: the speed a user of an LLM server feels, measured from the
//! outside against any OpenAI-compatible endpoint (vLLM, SGLang, llama.cpp's server,
//! `transformers serve`), at context depths and concurrencies, and compared across node counts.
//!
//! * [`client`]: one streamed request over `/v1/chat/completions` or `/v1/completions` with
//!   `stream_options.include_usage`, timed chunk by chunk, every wait bounded, refused
//!   requests (429, 5xx) tried again within a bound.
//! * [`count`]: tokens from the server's usage or token ids, or a local `tokenizer.json` on the
//!   whole text (never chunk by chunk, never one chunk as one token).
//! * [`prompt`]: natural-looking prompt text cut to a token budget, unique per request.
//! * [`metrics`] and [`runner`]: pp and tg t/s, peak t/s, TTFR, TTFT, estimated prompt time,
//!   ITL and TPOT percentiles, totals under concurrency, mean and sd over runs.
//! * [`report`]: the `RUN.json` schema and the llama-bench style table, CSV and JSON.
//! * [`compare`]: the scaling report across runs on 1, 2, 4, 8 nodes, with PNG plots.
//!
//! It is not an engine and not a load generator for SLO studies: it sends the requests a
//! llama-bench style table needs and nothing else, and it never starts or configures a server.
//!
//! ```no_run
//! use weft_llmbench::client::{Api, Client, Endpoint, Limits, Prompt};
//!
//! # async fn demo() -> Result<(), weft_llmbench::LlmError> {
//! let ep = Endpoint {
//!     base_url: "http://127.0.0.1:8080/v1".into(),
//!     api_key: None,
//!     model: "tiny".into(),
//!     api: Api::Chat,
//!     extra_body: Default::default(),
//! };
//! let client = Client::new(ep, Limits::default())?;
//! let trace = client.stream(&Prompt { context: String::new(), text: "Hello.".into() }, 32).await?;
//! println!("first token after {:?}", trace.first_content);
//! # Ok(())
//! # }
//! ```

#![forbid(unsafe_code)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

use std::path::PathBuf;
use std::time::Duration;

pub mod client;
pub mod compare;
pub mod count;
pub mod metrics;
pub mod predicted;
pub mod prompt;
pub mod report;
pub mod runner;
pub mod scripted;
pub mod sse;

/// Everything that can go wrong, each naming what it was about.
#[derive(Debug, thiserror::Error)]
pub enum LlmError {
    #[error("{url}: cannot connect: {reason}")]
    Connect { url: String, reason: String },
    #[error("{url}: no {what} within {after:?}")]
    Timeout {
        url: String,
        what: &'static str,
        after: Duration,
    },
    #[error("{url}: HTTP {status} after {attempts} attempt(s): {body}")]
    Status {
        url: String,
        status: u16,
        body: String,
        attempts: u32,
    },
    #[error("{url} is not an OpenAI-compatible endpoint: it {what}")]
    NotOpenAi { url: String, what: String },
    #[error("model {model:?} is not served at {url}; the server lists: {}", if available.is_empty() { "no models".to_string() } else { available.join(", ") })]
    ModelNotFound {
        model: String,
        url: String,
        available: Vec<String>,
    },
    #[error("{url}: the stream broke off after {} chunk(s) ({:.0} ms): {reason}", partial.chunks.len(), partial.e2e.as_secs_f64() * 1e3)]
    Stream {
        url: String,
        reason: String,
        partial: Box<client::Trace>,
    },
    #[error("token counting: {0}")]
    Counting(String),
    #[error("tokenizer {}: {reason}", path.display())]
    Tokenizer { path: PathBuf, reason: String },
    #[error("{}: {reason}", path.display())]
    Io { path: PathBuf, reason: String },
    #[error("{}: not a weft bench llm run: {reason}", path.display())]
    BadRun { path: PathBuf, reason: String },
    #[error("{0}")]
    Input(String),
    #[error("plot {}: {reason}", path.display())]
    Plot { path: PathBuf, reason: String },
}
