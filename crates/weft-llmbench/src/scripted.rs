//! A scripted stand-in for an OpenAI-compatible server: it emits tokens on a fixed schedule
//! (first chunk `ttft` after the request arrived, then one chunk every `itl`), or misbehaves on
//! purpose (answers 429/500, dies mid-stream, speaks HTML). It exists to measure weft itself
//! (the client's own overhead against a known schedule) and its error paths; it is not an
//! engine and never stands in for one where a user meets a real server.
//!
//! Its "tokenizer" is one token per whitespace-separated word of the prompt (message contents
//! on chat, no template); each generated token is the text `tok ` (token id 7). A request
//! without `"stream": true` gets one JSON answer with usage when its last token would have
//! been sent.
//!
//! Connections are kept alive (HTTP/1.1 persistent connections, the stream sent with chunked
//! transfer encoding), as a real engine's server keeps them, so a client that reads each
//! answer to its end can reuse them; only [`Fault::DieAfter`] answers with
//! `Connection: close` and closes mid-stream.
//!
//! With [`Script::trace`] it also notes, per streamed request, when it had read the request
//! and when each content chunk's write returned ([`Served`]), so a bench can tell the
//! stand-in's own lateness from the client's.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

/// What the server does.
#[derive(Debug, Clone)]
pub struct Script {
    pub model: String,
    /// From the end of the request to the first content chunk (plus `prefill_per_token` for
    /// each prompt token).
    pub ttft: Duration,
    /// Added to `ttft` per prompt token: prompt processing at a known rate, 1 / this.
    pub prefill_per_token: Duration,
    /// Between content chunks.
    pub itl: Duration,
    /// Tokens in each content chunk (above 1: as speculative decoding sends them).
    pub tokens_per_chunk: u32,
    /// Send `token_ids` with each chunk.
    pub token_ids: bool,
    /// Send a role-only chunk right away (as vLLM does) before the first token.
    pub role_chunk: bool,
    pub fault: Fault,
    /// Keep a [`Served`] per streamed request, read back with [`ScriptedServer::take_served`].
    pub trace: bool,
    /// How long before each chunk's instant the stand-in stops sleeping and yields until the
    /// instant (see `sleep_precisely`): 2 ms or more keeps a chunk on time on an idle machine,
    /// but yielding keeps a thread busy, which on a loaded one costs more than it saves.
    pub spin_before: Duration,
}

impl Default for Script {
    fn default() -> Script {
        Script {
            model: "scripted".into(),
            ttft: Duration::from_millis(50),
            prefill_per_token: Duration::ZERO,
            itl: Duration::from_millis(10),
            tokens_per_chunk: 1,
            token_ids: false,
            role_chunk: false,
            fault: Fault::None,
            trace: false,
            spin_before: Duration::from_millis(1),
        }
    }
}

/// A deliberate misbehaviour.
#[derive(Debug, Clone, PartialEq)]
pub enum Fault {
    None,
    /// The first `times` completion requests are answered with `status`, then all is well.
    Status {
        status: u16,
        times: u64,
    },
    /// Completion requests after the first `after_requests` close the connection after
    /// `chunks` content chunks.
    DieAfter {
        after_requests: u64,
        chunks: u64,
    },
    /// Every path answers 200 with an HTML page.
    Html,
    /// The first `times` completion requests that arrive on a connection which already
    /// answered one are not answered: the connection is closed, as a server closes an idle
    /// kept-alive connection just as the client sends on it (llama.cpp's server does).
    CloseReused {
        times: u64,
    },
}

/// What the stand-in did for one streamed request (kept when [`Script::trace`] is set), on
/// this process's monotonic clock, so it can be set against a client's times in the same
/// process.
#[derive(Debug, Clone, PartialEq)]
pub struct Served {
    /// The prompt: the last message's content on chat, `prompt` on completions.
    pub prompt: String,
    /// When the whole request had been read; the schedule counts from here.
    pub arrived: std::time::Instant,
    /// When each content chunk was due by the schedule.
    pub due: Vec<std::time::Instant>,
    /// When each content chunk's write to the socket returned (on loopback the bytes are in
    /// the client's receive queue by then).
    pub written: Vec<std::time::Instant>,
}

/// A running scripted server; dropped, it stops.
pub struct ScriptedServer {
    pub addr: std::net::SocketAddr,
    /// Completion requests received.
    pub requests: Arc<AtomicU64>,
    served: Arc<Mutex<Vec<Served>>>,
    task: tokio::task::JoinHandle<()>,
}

impl ScriptedServer {
    /// `http://ADDR/v1`.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// The streamed requests finished since the last call (none unless [`Script::trace`]).
    pub fn take_served(&self) -> Vec<Served> {
        let mut g = self.served.lock().unwrap_or_else(|e| e.into_inner());
        std::mem::take(&mut *g)
    }
}

/// What every connection's task shares.
struct Shared {
    script: Script,
    requests: Arc<AtomicU64>,
    served: Arc<Mutex<Vec<Served>>>,
    /// Requests left unanswered by [`Fault::CloseReused`].
    closed_reused: AtomicU64,
}

impl Drop for ScriptedServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Starts the server on 127.0.0.1 (a free port) in the current tokio runtime.
pub async fn start(script: Script) -> std::io::Result<ScriptedServer> {
    let l = TcpListener::bind("127.0.0.1:0").await?;
    let addr = l.local_addr()?;
    let requests = Arc::new(AtomicU64::new(0));
    let served = Arc::new(Mutex::new(Vec::new()));
    let shared = Arc::new(Shared {
        script,
        requests: requests.clone(),
        served: served.clone(),
        closed_reused: AtomicU64::new(0),
    });
    let task = tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            let _ = s.set_nodelay(true);
            let sh = shared.clone();
            tokio::spawn(async move {
                let _ = serve(s, &sh).await;
            });
        }
    });
    Ok(ScriptedServer {
        addr,
        requests,
        served,
        task,
    })
}

/// Reads one request; `buf` keeps what arrived past it (the next request on this connection).
async fn read_request(
    s: &mut TcpStream,
    buf: &mut Vec<u8>,
) -> std::io::Result<Option<(String, String)>> {
    let mut tmp = [0u8; 8192];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = s.read(&mut tmp).await?;
        if n == 0 {
            return Ok(None);
        }
        buf.extend_from_slice(&tmp[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
    let len = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse::<usize>().ok())?
        })
        .unwrap_or(0);
    while buf.len() < head_end + len {
        let n = s.read(&mut tmp).await?;
        if n == 0 {
            return Ok(None);
        }
        buf.extend_from_slice(&tmp[..n]);
    }
    let line = head.lines().next().unwrap_or("").to_string();
    let body = String::from_utf8_lossy(&buf[head_end..head_end + len]).to_string();
    buf.drain(..head_end + len);
    Ok(Some((line, body)))
}

async fn respond(s: &mut TcpStream, status: u16, ctype: &str, body: &str) -> std::io::Result<()> {
    let r = format!(
        "HTTP/1.1 {status} X\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(r.as_bytes()).await
}

/// Tokio's timer rounds a sleep's deadline up to the next millisecond, and the wait for it in
/// the kernel is rounded up to a millisecond again, so a sleep can end up to 2 ms after its
/// deadline (measured with [`Script::trace`]: sleeping to 1 ms before left the stand-in's
/// median chunk 0.4-0.6 ms late at concurrency 1 on an idle VM). So: sleep to `spin` before
/// `at`, then yield until it.
async fn sleep_precisely(at: Instant, spin: Duration) {
    tokio::time::sleep_until(at - spin).await;
    while Instant::now() < at {
        tokio::task::yield_now().await;
    }
}

/// Answers the requests of one connection until the client closes it (or a fault does).
async fn serve(mut s: TcpStream, sh: &Shared) -> std::io::Result<()> {
    let mut buf = Vec::new();
    let mut answered = 0u64;
    loop {
        let Some((line, body)) = read_request(&mut s, &mut buf).await? else {
            return Ok(());
        };
        if let Fault::CloseReused { times } = sh.script.fault
            && answered > 0
            && line.contains("completions")
            && sh.closed_reused.fetch_add(1, Ordering::SeqCst) < times
        {
            return s.shutdown().await;
        }
        answered += 1;
        if !answer(&mut s, sh, &line, &body).await? {
            return s.shutdown().await;
        }
    }
}

/// The prompt of a request body: the last message's content on chat, `prompt` on completions.
fn prompt_of(v: &serde_json::Value, chat: bool) -> &str {
    if chat {
        v["messages"]
            .as_array()
            .and_then(|m| m.last())
            .and_then(|m| m["content"].as_str())
            .unwrap_or("")
    } else {
        v["prompt"].as_str().unwrap_or("")
    }
}

/// One SSE event as a chunk of a chunked body.
fn http_chunk(data: &str) -> String {
    format!("{:x}\r\n{data}\r\n", data.len())
}

/// Answers one request; false when the connection is to be closed.
async fn answer(s: &mut TcpStream, sh: &Shared, line: &str, body: &str) -> std::io::Result<bool> {
    let arrived = Instant::now();
    let (sc, n) = (&sh.script, &*sh.requests);
    if sc.fault == Fault::Html {
        respond(s, 200, "text/html", "<html><body>It works!</body></html>").await?;
        return Ok(true);
    }
    if line.starts_with("GET ") {
        if line.contains("/v1/models") {
            let b = serde_json::json!({"object": "list", "data": [{"id": sc.model, "object": "model", "owned_by": "weft-scripted"}]});
            respond(s, 200, "application/json", &b.to_string()).await?;
        } else {
            respond(s, 404, "text/plain", "not found").await?;
        }
        return Ok(true);
    }
    if !line.contains("/v1/chat/completions") && !line.contains("/v1/completions") {
        respond(s, 404, "text/plain", "not found").await?;
        return Ok(true);
    }
    let k = n.fetch_add(1, Ordering::SeqCst);
    if let Fault::Status { status, times } = sc.fault
        && k < times
    {
        let b = serde_json::json!({"error": {"message": format!("scripted {status}")}});
        respond(s, status, "application/json", &b.to_string()).await?;
        return Ok(true);
    }
    let v: serde_json::Value = serde_json::from_str(body).unwrap_or_default();
    let chat = v.get("messages").is_some();
    if v.get("model").and_then(|m| m.as_str()) != Some(sc.model.as_str()) {
        let b = serde_json::json!({"error": {"message": "model not found"}});
        respond(s, 404, "application/json", &b.to_string()).await?;
        return Ok(true);
    }
    let prompt_tokens: u64 = if chat {
        v["messages"]
            .as_array()
            .map(|m| {
                m.iter()
                    .map(|x| {
                        x["content"]
                            .as_str()
                            .unwrap_or("")
                            .split_whitespace()
                            .count() as u64
                    })
                    .sum()
            })
            .unwrap_or(0)
    } else {
        v["prompt"]
            .as_str()
            .unwrap_or("")
            .split_whitespace()
            .count() as u64
    };
    let max_tokens = v["max_tokens"].as_u64().unwrap_or(16);
    let first = arrived + sc.ttft + sc.prefill_per_token * (prompt_tokens as u32);
    let usage = serde_json::json!({"prompt_tokens": prompt_tokens, "completion_tokens": max_tokens, "total_tokens": prompt_tokens + max_tokens});
    if v["stream"].as_bool() != Some(true) {
        // One JSON answer when the last token would have been sent.
        sleep_precisely(
            first + sc.itl * (max_tokens.saturating_sub(1) as u32),
            sc.spin_before,
        )
        .await;
        let text = "tok ".repeat(max_tokens as usize);
        let choice = if chat {
            serde_json::json!({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"})
        } else {
            serde_json::json!({"index": 0, "text": text, "finish_reason": "length"})
        };
        let b = serde_json::json!({"choices": [choice], "usage": usage});
        respond(s, 200, "application/json", &b.to_string()).await?;
        return Ok(true);
    }
    let die = match sc.fault {
        Fault::DieAfter {
            after_requests,
            chunks,
        } if k >= after_requests => Some(chunks),
        _ => None,
    };
    // A stream that is to die is sent as a plain body that ends with the connection; every
    // other one in chunks, so the connection outlives it.
    let chunked = die.is_none();
    let frame = |data: String| if chunked { http_chunk(&data) } else { data };
    s.write_all(if chunked {
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n".as_slice()
    } else {
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nConnection: close\r\n\r\n".as_slice()
    })
    .await?;
    let chunk = |k: u32| {
        let text = "tok ".repeat(k as usize);
        let mut c = if chat {
            serde_json::json!({"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": null}]})
        } else {
            serde_json::json!({"choices": [{"index": 0, "text": text, "finish_reason": null}]})
        };
        if sc.token_ids {
            c["choices"][0]["token_ids"] = serde_json::json!(vec![7; k as usize]);
        }
        frame(format!("data: {c}\n\n"))
    };
    if sc.role_chunk && chat {
        s.write_all(
            frame(
                "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\"}}]}\n\n".into(),
            )
            .as_bytes(),
        )
        .await?;
    }
    let mut trace = sc.trace.then(|| Served {
        prompt: prompt_of(&v, chat).to_string(),
        arrived: arrived.into_std(),
        due: Vec::with_capacity(max_tokens as usize),
        written: Vec::with_capacity(max_tokens as usize),
    });
    // Every chunk but a short last one is the same bytes: encoded once, before the clock
    // matters.
    let per = sc.tokens_per_chunk.max(1);
    let full = chunk(per);
    let mut sent = 0u64;
    let mut i = 0u32;
    while sent < max_tokens {
        if die == Some(u64::from(i)) {
            return Ok(false);
        }
        let at = first + sc.itl * i;
        let kk = u64::from(per).min(max_tokens - sent) as u32;
        let short = (kk != per).then(|| chunk(kk));
        sleep_precisely(at, sc.spin_before).await;
        s.write_all(short.as_ref().unwrap_or(&full).as_bytes())
            .await?;
        if let Some(t) = trace.as_mut() {
            t.written.push(std::time::Instant::now());
            t.due.push(at.into_std());
        }
        sent += u64::from(kk);
        i += 1;
    }
    if let Some(t) = trace {
        sh.served.lock().unwrap_or_else(|e| e.into_inner()).push(t);
    }
    let fin =
        serde_json::json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]});
    let usage = serde_json::json!({"choices": [], "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": sent, "total_tokens": prompt_tokens + sent}});
    let mut end = frame(format!("data: {fin}\n\ndata: {usage}\n\ndata: [DONE]\n\n"));
    if chunked {
        end.push_str("0\r\n\r\n");
    }
    s.write_all(end.as_bytes()).await?;
    Ok(chunked)
}
