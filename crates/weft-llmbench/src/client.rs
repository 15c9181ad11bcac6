//! One streamed request to an OpenAI-compatible server, timed chunk by chunk, with a bound on
//! every wait: connecting, the first byte, the gap between chunks and the whole request.

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use weft_chain::error_chain;

use crate::LlmError;
use crate::sse::{Event, SseParser, Usage};

/// Which OpenAI API the requests go to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Api {
    /// `POST /v1/chat/completions`: depth as a system message, the prompt as the user message.
    Chat,
    /// `POST /v1/completions`: depth and prompt as one text.
    Completions,
}

impl Api {
    pub fn path(self) -> &'static str {
        match self {
            Api::Chat => "chat/completions",
            Api::Completions => "completions",
        }
    }
}

/// Where requests go.
#[derive(Debug, Clone)]
pub struct Endpoint {
    /// Base URL ending in `/v1`, e.g. `http://127.0.0.1:8080/v1`.
    pub base_url: String,
    pub api_key: Option<String>,
    pub model: String,
    pub api: Api,
    /// Fields merged into every request body (engine-specific options such as `ignore_eos`).
    pub extra_body: serde_json::Map<String, serde_json::Value>,
}

impl Endpoint {
    pub fn url(&self, path: &str) -> String {
        format!("{}/{}", self.base_url.trim_end_matches('/'), path)
    }

    /// The server root: the base URL without its trailing `/v1`.
    pub fn root(&self) -> &str {
        let b = self.base_url.trim_end_matches('/');
        b.strip_suffix("/v1").unwrap_or(b)
    }
}

/// Bounds on every wait, and how often a refused request (429, 5xx, connection refused) is
/// tried again.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    pub connect: Duration,
    /// From sending the request to the response's first body byte (this includes prompt
    /// processing, so it must cover the longest prefill).
    pub first_byte: Duration,
    /// Between two body reads once the stream has begun.
    pub between_chunks: Duration,
    /// The whole request.
    pub request: Duration,
    /// Attempts after the first for 429, 500, 502, 503, 504 and refused connections.
    pub retries: u32,
    /// Wait before the first retry; doubled after each (a `Retry-After` of up to 10 s wins).
    pub backoff: Duration,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            connect: Duration::from_secs(10),
            first_byte: Duration::from_secs(600),
            between_chunks: Duration::from_secs(60),
            request: Duration::from_secs(1800),
            retries: 3,
            backoff: Duration::from_millis(500),
        }
    }
}

/// The text of one request.
#[derive(Debug, Clone, Default)]
pub struct Prompt {
    /// Prior context (the depth): a system message on chat, the start of the prompt on
    /// completions. Empty for depth 0.
    pub context: String,
    /// The prompt proper: the user message on chat.
    pub text: String,
}

/// A chunk that carried generated text or tokens.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Chunk {
    /// Since the request was sent (written to the socket).
    pub at: Duration,
    pub text: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_ids: Option<Vec<u32>>,
    /// Tokens the server's `logprobs` listed for this chunk, when it sent them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprob_tokens: Option<u64>,
}

/// Everything timed about one request.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Trace {
    /// When the request was sent (written to the socket), on this process's monotonic clock:
    /// every other time here counts from it.
    pub sent: Option<Instant>,
    /// First body byte since the request was sent (written to the socket).
    pub ttfr: Option<Duration>,
    /// First chunk with generated text or tokens (role-only chunks do not count).
    pub first_content: Option<Duration>,
    pub chunks: Vec<Chunk>,
    pub usage: Option<Usage>,
    /// Last byte (end of stream).
    pub e2e: Duration,
    pub finish_reason: Option<String>,
    /// Attempts made, 1 when the first was answered.
    pub attempts: u32,
}

impl Trace {
    pub fn text(&self) -> String {
        self.chunks.iter().map(|c| c.text.as_str()).collect()
    }

    /// All token ids, when every content chunk carried them.
    pub fn token_ids(&self) -> Option<Vec<u32>> {
        let mut v = Vec::new();
        for c in &self.chunks {
            v.extend(c.token_ids.as_ref()?);
        }
        Some(v)
    }

    /// Tokens per content chunk as the server's `logprobs` listed them, when every content
    /// chunk carried them.
    pub fn logprob_tokens(&self) -> Option<Vec<u64>> {
        if self.chunks.is_empty() {
            return None;
        }
        self.chunks.iter().map(|c| c.logprob_tokens).collect()
    }
}

/// An HTTP client for one endpoint.
#[derive(Debug, Clone)]
pub struct Client {
    http: reqwest::Client,
    pub endpoint: Endpoint,
    pub limits: Limits,
}

/// What the server says about itself.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerInfo {
    /// Model ids from `GET /v1/models`.
    pub models: Vec<String>,
    /// `owned_by` of the model in use.
    #[serde(default)]
    pub owned_by: Option<String>,
    /// The engine, when the server names itself (`/version`, `/props`, the `Server` header).
    #[serde(default)]
    pub engine: Option<String>,
    #[serde(default)]
    pub engine_version: Option<String>,
}

/// Whether `e` is a connection closed before any of the response arrived (hyper's "connection
/// closed before message completed" on a reused connection). hyper is not a direct dependency,
/// so its error is recognised by its message in the source chain.
fn closed_before_answer(e: &reqwest::Error) -> bool {
    let mut src: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(e);
    while let Some(s) = src {
        if s.to_string()
            .contains("connection closed before message completed")
        {
            return true;
        }
        src = s.source();
    }
    false
}

impl Client {
    pub fn new(endpoint: Endpoint, limits: Limits) -> Result<Client, LlmError> {
        let http = reqwest::Client::builder()
            .connect_timeout(limits.connect)
            .pool_max_idle_per_host(1024)
            .tcp_nodelay(true)
            .build()
            .map_err(|e| LlmError::Input(format!("HTTP client: {e}")))?;
        Ok(Client {
            http,
            endpoint,
            limits,
        })
    }

    fn authed(&self, r: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match &self.endpoint.api_key {
            Some(k) => r.bearer_auth(k),
            None => r,
        }
    }

    /// `GET url`, bounded; the status and body.
    async fn get(&self, url: &str) -> Result<(u16, reqwest::header::HeaderMap, String), LlmError> {
        let fut = async {
            let r = self.authed(self.http.get(url)).send().await?;
            let status = r.status().as_u16();
            let headers = r.headers().clone();
            let body = r.text().await?;
            Ok::<_, reqwest::Error>((status, headers, body))
        };
        match tokio::time::timeout(self.limits.between_chunks.max(self.limits.connect), fut).await {
            Err(_) => Err(LlmError::Timeout {
                url: url.to_string(),
                what: "an answer to GET",
                after: self.limits.between_chunks.max(self.limits.connect),
            }),
            Ok(Err(e)) => Err(LlmError::Connect {
                url: url.to_string(),
                reason: error_chain(&e),
            }),
            Ok(Ok(x)) => Ok(x),
        }
    }

    /// Time to the first byte of `GET /v1/models` (llama-benchy's `api` latency).
    pub async fn api_latency(&self) -> Result<Duration, LlmError> {
        let t = Instant::now();
        self.get(&self.endpoint.url("models")).await?;
        Ok(t.elapsed())
    }

    /// Checks that the endpoint speaks the OpenAI API and serves the model; reads what the
    /// engine says about itself.
    pub async fn probe(&self) -> Result<ServerInfo, LlmError> {
        let url = self.endpoint.url("models");
        let (status, headers, body) = self.get(&url).await?;
        if status != 200 {
            return Err(LlmError::NotOpenAi {
                url,
                what: format!(
                    "answered HTTP {status} ({}); an OpenAI-compatible base URL usually ends in /v1",
                    clip(&body)
                ),
            });
        }
        let v: serde_json::Value =
            serde_json::from_str(&body).map_err(|_| LlmError::NotOpenAi {
                url: url.clone(),
                what: format!("answered something that is not JSON: {}", clip(&body)),
            })?;
        let Some(data) = v.get("data").and_then(|d| d.as_array()) else {
            return Err(LlmError::NotOpenAi {
                url,
                what: format!(
                    "answered JSON without a `data` list of models: {}",
                    clip(&body)
                ),
            });
        };
        let mut info = ServerInfo::default();
        for m in data {
            if let Some(id) = m.get("id").and_then(|x| x.as_str()) {
                info.models.push(id.to_string());
                if id == self.endpoint.model {
                    info.owned_by = m
                        .get("owned_by")
                        .and_then(|x| x.as_str())
                        .map(str::to_string);
                }
            }
        }
        if !info.models.contains(&self.endpoint.model) {
            return Err(LlmError::ModelNotFound {
                model: self.endpoint.model.clone(),
                url,
                available: info.models,
            });
        }
        let server_header = headers
            .get(reqwest::header::SERVER)
            .and_then(|h| h.to_str().ok())
            .map(str::to_string);
        // vLLM and SGLang: GET /version {"version": ...}; llama.cpp's server: GET /props.
        let root = self.endpoint.root().to_string();
        if let Ok((200, _, b)) = self.get(&format!("{root}/version")).await
            && let Ok(v) = serde_json::from_str::<serde_json::Value>(&b)
        {
            info.engine_version = v
                .get("version")
                .and_then(|x| x.as_str())
                .map(str::to_string);
        }
        if info.engine_version.is_none()
            && let Ok((200, _, b)) = self.get(&format!("{root}/props")).await
            && let Ok(v) = serde_json::from_str::<serde_json::Value>(&b)
            && let Some(bi) = v.get("build_info").and_then(|x| x.as_str())
        {
            info.engine = Some("llama.cpp".into());
            info.engine_version = Some(bi.to_string());
        }
        if info.engine.is_none() {
            info.engine = match info.owned_by.as_deref() {
                Some("vllm") => Some("vllm".into()),
                Some("sglang") => Some("sglang".into()),
                Some("llamacpp") => Some("llama.cpp".into()),
                _ => server_header,
            };
        }
        Ok(info)
    }

    fn body(&self, p: &Prompt, max_tokens: u64) -> serde_json::Value {
        let mut b = serde_json::Map::new();
        b.insert("model".into(), self.endpoint.model.clone().into());
        match self.endpoint.api {
            Api::Chat => {
                let mut msgs = Vec::new();
                if !p.context.is_empty() {
                    msgs.push(serde_json::json!({"role": "system", "content": p.context}));
                }
                msgs.push(serde_json::json!({"role": "user", "content": p.text}));
                b.insert("messages".into(), msgs.into());
            }
            Api::Completions => {
                b.insert("prompt".into(), format!("{}{}", p.context, p.text).into());
            }
        }
        b.insert("max_tokens".into(), max_tokens.into());
        b.insert("stream".into(), true.into());
        b.insert(
            "stream_options".into(),
            serde_json::json!({"include_usage": true}),
        );
        for (k, v) in &self.endpoint.extra_body {
            b.insert(k.clone(), v.clone());
        }
        serde_json::Value::Object(b)
    }

    /// The server's usage for a prompt, from a request without streaming (for servers such as
    /// llama-cpp-python that send no usage in a stream).
    pub async fn usage_of(&self, p: &Prompt, max_tokens: u64) -> Result<Option<Usage>, LlmError> {
        let url = self.endpoint.url(self.endpoint.api.path());
        let mut body = self.body(p, max_tokens);
        body["stream"] = false.into();
        if let Some(m) = body.as_object_mut() {
            m.remove("stream_options");
        }
        let fut = async {
            let r = self.authed(self.http.post(&url)).json(&body).send().await?;
            let st = r.status().as_u16();
            Ok::<_, reqwest::Error>((st, r.text().await?))
        };
        let (st, text) = match tokio::time::timeout(self.limits.first_byte, fut).await {
            Err(_) => {
                return Err(LlmError::Timeout {
                    url,
                    what: "an answer",
                    after: self.limits.first_byte,
                });
            }
            Ok(Err(e)) => {
                return Err(LlmError::Connect {
                    url,
                    reason: error_chain(&e),
                });
            }
            Ok(Ok(x)) => x,
        };
        if st != 200 {
            return Err(LlmError::Status {
                url,
                status: st,
                body: clip(&text),
                attempts: 1,
            });
        }
        let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
        let u = &v["usage"];
        Ok(
            match (u["prompt_tokens"].as_u64(), u["completion_tokens"].as_u64()) {
                (Some(p), Some(c)) => Some(Usage {
                    prompt_tokens: p,
                    completion_tokens: c,
                    cached_tokens: u["prompt_tokens_details"]["cached_tokens"].as_u64(),
                }),
                _ => None,
            },
        )
    }

    /// Sends one streaming request and times it. Refused requests are tried again within
    /// [`Limits::retries`]; a stream that breaks off is [`LlmError::Stream`] with what arrived.
    pub async fn stream(&self, p: &Prompt, max_tokens: u64) -> Result<Trace, LlmError> {
        let url = self.endpoint.url(self.endpoint.api.path());
        let body = self.body(p, max_tokens);
        let mut backoff = self.limits.backoff;
        let mut attempt = 0u32;
        loop {
            attempt += 1;
            let last = attempt > self.limits.retries;
            match self.attempt(&url, &body).await {
                Ok(mut t) => {
                    t.attempts = attempt;
                    return Ok(t);
                }
                Err(Attempt::Retry {
                    status,
                    wait,
                    error,
                }) if !last => {
                    tracing::warn!(%url, ?status, attempt, "request refused, trying again: {error}");
                    tokio::time::sleep(wait.unwrap_or(backoff)).await;
                    backoff *= 2;
                }
                Err(Attempt::Retry { error, .. }) => {
                    return Err(match error {
                        LlmError::Status {
                            url, status, body, ..
                        } => LlmError::Status {
                            url,
                            status,
                            body,
                            attempts: attempt,
                        },
                        other => other,
                    });
                }
                Err(Attempt::Fatal(e)) => return Err(e),
            }
        }
    }

    async fn attempt(&self, url: &str, body: &serde_json::Value) -> Result<Trace, Attempt> {
        // The body is serialised before the clock starts, and every time is taken from when
        // the request went to the socket (see [`TimedBody`]), so neither the client's own
        // encoding nor its queue of other requests (at high concurrency), nor opening a
        // connection, is counted as the server's time.
        let bytes = bytes::Bytes::from(serde_json::to_vec(body).unwrap_or_default());
        let len = bytes.len();
        let written = Arc::new(OnceLock::new());
        let start = Instant::now();
        let deadline = start + self.limits.request;
        let send = self
            .authed(self.http.post(url))
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header(reqwest::header::CONTENT_LENGTH, len)
            .body(reqwest::Body::wrap(TimedBody {
                data: Some(bytes),
                written: written.clone(),
            }))
            .send();
        let resp = match tokio::time::timeout(self.limits.first_byte, send).await {
            Err(_) => {
                return Err(Attempt::Fatal(LlmError::Timeout {
                    url: url.into(),
                    what: "the response headers",
                    after: self.limits.first_byte,
                }));
            }
            Ok(Err(e)) if e.is_connect() => {
                return Err(Attempt::Retry {
                    status: None,
                    wait: None,
                    error: LlmError::Connect {
                        url: url.into(),
                        reason: error_chain(&e),
                    },
                });
            }
            // A kept-alive connection the server closed just as this request went out on it
            // (llama.cpp's server closes idle ones): no answer was begun, so the request is
            // sent again at once, on a new connection, within the same bound on attempts.
            Ok(Err(e)) if closed_before_answer(&e) => {
                return Err(Attempt::Retry {
                    status: None,
                    wait: Some(Duration::ZERO),
                    error: LlmError::Connect {
                        url: url.into(),
                        reason: error_chain(&e),
                    },
                });
            }
            Ok(Err(e)) => {
                return Err(Attempt::Fatal(LlmError::Connect {
                    url: url.into(),
                    reason: error_chain(&e),
                }));
            }
            Ok(Ok(r)) => r,
        };
        let status = resp.status().as_u16();
        if status != 200 {
            let wait = resp
                .headers()
                .get(reqwest::header::RETRY_AFTER)
                .and_then(|h| h.to_str().ok())
                .and_then(|s| s.trim().parse::<u64>().ok())
                .map(|s| Duration::from_secs(s.min(10)));
            let text = tokio::time::timeout(self.limits.between_chunks, resp.text())
                .await
                .ok()
                .and_then(|r| r.ok())
                .unwrap_or_default();
            let error = LlmError::Status {
                url: url.into(),
                status,
                body: clip(&text),
                attempts: 1,
            };
            return Err(match status {
                429 | 500 | 502 | 503 | 504 => Attempt::Retry {
                    status: Some(status),
                    wait,
                    error,
                },
                404 if !text.contains("odel") => Attempt::Fatal(LlmError::NotOpenAi {
                    url: url.into(),
                    what: format!(
                        "answered HTTP 404 ({}); an OpenAI-compatible base URL usually ends in /v1",
                        clip(&text)
                    ),
                }),
                _ => Attempt::Fatal(error),
            });
        }
        let ctype = resp
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|h| h.to_str().ok())
            .unwrap_or("")
            .to_string();
        if !ctype.starts_with("text/event-stream") {
            let text = tokio::time::timeout(self.limits.between_chunks, resp.text())
                .await
                .ok()
                .and_then(|r| r.ok())
                .unwrap_or_default();
            return Err(Attempt::Fatal(LlmError::NotOpenAi {
                url: url.into(),
                what: format!(
                    "answered a `{ctype}` body instead of an event stream (stream: true was asked): {}",
                    clip(&text)
                ),
            }));
        }
        let mut resp = resp;
        // The request was written before its answer came.
        let sent = written.get().copied().unwrap_or(start);
        let mut t = Trace {
            sent: Some(sent),
            ..Trace::default()
        };
        let mut parser = SseParser::new();
        let mut done = false;
        let mut first_wait = self.limits.first_byte;
        // One timer for the whole stream, moved on only when it fires before the wait it
        // stands for is over (arming a timer for every chunk is work on every chunk): it is
        // due at the latest when the current wait since the last read, or the whole
        // request's bound, runs out.
        let mut last = Instant::now();
        let timer = tokio::time::sleep_until((last + first_wait).min(deadline).into());
        tokio::pin!(timer);
        loop {
            let next = loop {
                tokio::select! {
                    biased;
                    r = resp.chunk() => break Ok(r),
                    () = &mut timer => {
                        let due = (last + first_wait).min(deadline);
                        if Instant::now() >= due {
                            break Err(());
                        }
                        timer.as_mut().reset(due.into());
                    }
                }
            };
            // The time the bytes came, before anything is made of them.
            let now = Instant::now();
            let at = now.saturating_duration_since(sent);
            last = now;
            let bytes = match next {
                Err(()) => {
                    let budget = if now >= deadline {
                        self.limits.request
                    } else {
                        first_wait
                    };
                    t.e2e = at;
                    let what = if t.ttfr.is_none() {
                        "the first byte of the stream"
                    } else if Instant::now() >= deadline {
                        "the end of the request"
                    } else {
                        "the next chunk of the stream"
                    };
                    return Err(Attempt::Fatal(LlmError::Stream {
                        url: url.into(),
                        reason: format!("no {what} within {budget:?}"),
                        partial: Box::new(t),
                    }));
                }
                Ok(Err(e)) => {
                    t.e2e = at;
                    return Err(Attempt::Fatal(LlmError::Stream {
                        url: url.into(),
                        reason: format!("the connection broke: {}", error_chain(&e)),
                        partial: Box::new(t),
                    }));
                }
                Ok(Ok(None)) => break,
                Ok(Ok(Some(b))) => b,
            };
            if bytes.is_empty() {
                continue;
            }
            if t.ttfr.is_none() {
                t.ttfr = Some(at);
                first_wait = self.limits.between_chunks;
                // The wait may have become shorter than the one the timer was set for.
                timer
                    .as_mut()
                    .reset((last + first_wait).min(deadline).into());
            }
            for ev in parser.push(&bytes) {
                match ev {
                    Event::Done => done = true,
                    Event::Error(m) => {
                        t.e2e = at;
                        return Err(Attempt::Fatal(LlmError::Stream {
                            url: url.into(),
                            reason: format!("the server sent an error in the stream: {m}"),
                            partial: Box::new(t),
                        }));
                    }
                    Event::Chunk(d) => {
                        if d.usage.is_some() {
                            t.usage = d.usage;
                        }
                        if d.finish_reason.is_some() {
                            t.finish_reason = d.finish_reason.clone();
                        }
                        if !d.text.is_empty()
                            || d.token_ids.as_ref().is_some_and(|v| !v.is_empty())
                            || d.logprob_tokens.is_some_and(|n| n > 0)
                        {
                            if t.first_content.is_none() {
                                t.first_content = Some(at);
                            }
                            t.chunks.push(Chunk {
                                at,
                                text: d.text,
                                token_ids: d.token_ids,
                                logprob_tokens: d.logprob_tokens,
                            });
                        }
                    }
                }
            }
            if done {
                break;
            }
        }
        t.e2e = sent.elapsed();
        if !done && t.finish_reason.is_none() {
            return Err(Attempt::Fatal(LlmError::Stream {
                url: url.into(),
                reason: "the stream ended before `data: [DONE]` or a finish_reason".into(),
                partial: Box::new(t),
            }));
        }
        Ok(t)
    }
}

/// A request body that notes when hyper first asks for it: hyper encodes the request's head
/// just before and writes both to the socket together, so that instant is when the request was
/// sent (within microseconds), after any wait for a connection or for the client's own turn.
struct TimedBody {
    data: Option<bytes::Bytes>,
    written: Arc<OnceLock<Instant>>,
}

impl http_body::Body for TimedBody {
    type Data = bytes::Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, Self::Error>>> {
        let _ = self.written.set(Instant::now());
        std::task::Poll::Ready(self.data.take().map(|d| Ok(http_body::Frame::data(d))))
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_none()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        http_body::SizeHint::with_exact(self.data.as_ref().map_or(0, |d| d.len() as u64))
    }
}

enum Attempt {
    Retry {
        status: Option<u16>,
        wait: Option<Duration>,
        error: LlmError,
    },
    Fatal(LlmError),
}

pub(crate) fn clip(s: &str) -> String {
    let s = s.trim();
    let mut t: String = s.chars().take(300).collect();
    if t.len() < s.len() {
        t.push('…');
    }
    t
}
