//! A whole `weft bench llm` run: probe the server, warm up (latency, chat-template overhead,
//! tokens per word), then every (depth, pp, tg, concurrency) `runs` times, in llama-benchy's
//! order (depth, then pp, then tg, then concurrency).

use std::path::PathBuf;
use std::time::Duration;

use tokio::task::JoinSet;

use crate::LlmError;
use crate::client::{Api, Client, Prompt, Trace};
use crate::count::{Counter, spread};
use crate::metrics::{Request, run_figures};
use crate::prompt::{Builder, Corpus, Rng, unique_tag};
use crate::report::{Context, Failure, Overhead, Phase, RunReport, SCHEMA, TestResult, rfc3339};

/// How the request latency subtracted from the time to first byte is measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LatencyMode {
    /// Time to the answer of `GET /v1/models` (llama-benchy's default).
    Api,
    /// Time to first byte of a one-token generation with a tiny prompt.
    Generation,
    None,
}

impl std::str::FromStr for LatencyMode {
    type Err = LlmError;
    fn from_str(s: &str) -> Result<Self, LlmError> {
        match s {
            "api" => Ok(LatencyMode::Api),
            "generation" => Ok(LatencyMode::Generation),
            "none" => Ok(LatencyMode::None),
            o => Err(LlmError::Input(format!(
                "--latency-mode {o:?}: expected api, generation or none"
            ))),
        }
    }
}

impl LatencyMode {
    fn name(self) -> &'static str {
        match self {
            LatencyMode::Api => "api",
            LatencyMode::Generation => "generation",
            LatencyMode::None => "none",
        }
    }
}

/// What to measure.
#[derive(Debug, Clone)]
pub struct Sweep {
    /// Prompt sizes in tokens (`--pp`: llama-benchy's prompt processing).
    pub prompt_sizes: Vec<u64>,
    pub tg: Vec<u64>,
    pub depth: Vec<u64>,
    pub concurrency: Vec<u32>,
    pub runs: u32,
    pub prefix_cache: bool,
    pub latency_mode: LatencyMode,
    /// Fit the prompt to the measured chat-template overhead so `pp2048` is 2,048 tokens.
    pub adapt_prompt: bool,
    pub seed: u64,
}

impl Sweep {
    /// Refuses empty or zero axes.
    pub fn check(&self) -> Result<(), LlmError> {
        let bad = |flag: &str, what: &str| Err(LlmError::Input(format!("{flag}: {what}")));
        if self.prompt_sizes.is_empty() || self.tg.is_empty() || self.depth.is_empty() {
            return bad("--pp/--tg/--depth", "each needs at least one value");
        }
        if self.tg.contains(&0) {
            return bad("--tg", "0 tokens cannot be timed; the smallest is 1");
        }
        if self.concurrency.is_empty() || self.concurrency.contains(&0) {
            return bad("--concurrency", "values must be 1 or more");
        }
        if self.runs == 0 {
            return bad("--runs", "must be 1 or more");
        }
        if self.prefix_cache && self.depth.iter().all(|d| *d == 0) {
            return bad(
                "--prefix-cache",
                "needs a --depth above 0 (the context to cache)",
            );
        }
        Ok(())
    }

    /// Tests in the order they run.
    pub fn tests(&self) -> Vec<(u64, u64, u64, u32)> {
        let mut v = Vec::new();
        for &d in &self.depth {
            for &p in &self.prompt_sizes {
                for &t in &self.tg {
                    for &c in &self.concurrency {
                        v.push((d, p, t, c));
                    }
                }
            }
        }
        v
    }

    /// Requests the whole run sends (not counting the warm-up).
    pub fn requests(&self) -> u64 {
        let per_test: u64 = self.concurrency.iter().map(|&c| u64::from(c)).sum();
        let steps = if self.prefix_cache { 2 } else { 1 };
        (self.depth.len() * self.prompt_sizes.len() * self.tg.len()) as u64
            * per_test
            * u64::from(self.runs)
            * steps
    }
}

/// Labels recorded with the results.
#[derive(Debug, Clone, Default)]
pub struct Labels {
    pub nodes: Option<u32>,
    pub layout: Option<String>,
    pub label: Option<String>,
    pub engine_log: Option<PathBuf>,
    pub weft_version: String,
}

/// Progress of a run, for a progress bar.
#[derive(Debug, Clone)]
pub struct Progress<'a> {
    pub done: u64,
    pub total: u64,
    pub test: &'a str,
}

/// The NCCL network named in an engine log: the last of `NET/weft`, `NET/IB`, `NET/Socket`
/// (NCCL prints `via NET/IB/0` per channel and `Using network IB` once).
pub fn nccl_transport(log: &str) -> Option<String> {
    let mut best: Option<(usize, String)> = None;
    for (pat, name) in [
        ("NET/weft", "NET/weft"),
        ("Using network weft", "NET/weft"),
        ("NET/IB", "NET/IB"),
        ("Using network IB", "NET/IB"),
        ("NET/Socket", "NET/Socket"),
        ("Using network Socket", "NET/Socket"),
    ] {
        if let Some(i) = log.rfind(pat)
            && best.as_ref().is_none_or(|(j, _)| i > *j)
        {
            best = Some((i, name.to_string()));
        }
    }
    best.map(|b| b.1)
}

struct Warm {
    latency: Duration,
    overhead: Overhead,
    builder: Builder,
}

/// Runs the sweep. A failing test stops the run: the report then holds the tests before it and
/// a [`Failure`] naming it. Errors before the first test (the server cannot be reached, the
/// model is not served) are returned as errors.
pub async fn run(
    client: &Client,
    sweep: &Sweep,
    corpus: Corpus,
    counter: Option<&std::sync::Arc<Counter>>,
    labels: &Labels,
    progress: &(dyn Fn(Progress<'_>) + Sync),
) -> Result<RunReport, LlmError> {
    sweep.check()?;
    let date = rfc3339(std::time::SystemTime::now());
    let server = client.probe().await?;
    let nccl = match &labels.engine_log {
        Some(p) => {
            let text = std::fs::read(p).map_err(|e| LlmError::Io {
                path: p.clone(),
                reason: e.to_string(),
            })?;
            let t = nccl_transport(&String::from_utf8_lossy(&text));
            if t.is_none() {
                tracing::warn!(path = %p.display(), "the engine log names no NCCL network (NET/IB, NET/Socket, NET/weft); is NCCL_DEBUG=INFO set?");
            }
            t
        }
        None => None,
    };
    let mut rng = Rng::new(sweep.seed);
    let mut warnings = Vec::new();
    let warm = warm_up(client, sweep, corpus, counter.map(|c| &**c), &mut rng).await?;
    let mut report = RunReport {
        schema: SCHEMA,
        context: Context {
            endpoint: client.endpoint.base_url.clone(),
            api: client.endpoint.api,
            model: client.endpoint.model.clone(),
            server,
            date,
            weft_version: labels.weft_version.clone(),
            nodes: labels.nodes,
            layout: labels.layout.clone(),
            label: labels.label.clone(),
            nccl_transport: nccl,
            latency_mode: sweep.latency_mode.name().into(),
            latency_ms: warm.latency.as_secs_f64() * 1e3,
            template_overhead: warm.overhead,
            counting: String::new(),
            prompt_time_from: String::new(),
            tokenizer: counter.map(|c| c.path.display().to_string()),
            text: warm.builder.corpus.source.clone(),
            prefix_cache: sweep.prefix_cache,
            runs: sweep.runs,
        },
        results: Vec::new(),
        warnings: Vec::new(),
        failure: None,
    };
    let total = sweep.requests();
    let mut done = 0u64;
    let mut counting = CountingSeen::default();
    for (d, p, t, c) in sweep.tests() {
        let phases: &[Phase] = if sweep.prefix_cache && d > 0 {
            &[Phase::Context, Phase::FollowUp]
        } else {
            &[Phase::Cold]
        };
        let mut per_phase: Vec<Vec<crate::metrics::RunFigures>> = vec![Vec::new(); phases.len()];
        let name = crate::report::test_names(p, t, d, c, Phase::Cold).0;
        for _run in 0..sweep.runs {
            // One context per run and request slot: the follow-up reuses it, nothing else does.
            let contexts: Vec<String> = (0..c)
                .map(|_| {
                    let tag = unique_tag(&mut rng);
                    if d == 0 {
                        Ok(String::new())
                    } else {
                        warm.builder.build(&mut rng, &tag, d, counter.map(|c| &**c))
                    }
                })
                .collect::<Result<_, _>>()?;
            for (k, &phase) in phases.iter().enumerate() {
                let user_tokens = |over: i64| {
                    (p as i64 - if sweep.adapt_prompt { over } else { 0 }).max(1) as u64
                };
                let prompts: Vec<Prompt> = contexts
                    .iter()
                    .map(|ctx| {
                        let tag = unique_tag(&mut rng);
                        let (text, context) = match (phase, client.endpoint.api) {
                            (Phase::Context, _) => (String::from("Hi."), ctx.clone()),
                            (_, Api::Chat) if d == 0 => (
                                warm.builder.build(
                                    &mut rng,
                                    &tag,
                                    user_tokens(warm.overhead.user),
                                    counter.map(|c| &**c),
                                )?,
                                String::new(),
                            ),
                            (_, Api::Chat) => (
                                warm.builder.build(
                                    &mut rng,
                                    &tag,
                                    user_tokens(warm.overhead.system_user),
                                    counter.map(|c| &**c),
                                )?,
                                ctx.clone(),
                            ),
                            (_, Api::Completions) => (
                                warm.builder.build(
                                    &mut rng,
                                    &tag,
                                    user_tokens(if d == 0 { warm.overhead.user } else { 0 }),
                                    counter.map(|c| &**c),
                                )?,
                                ctx.clone(),
                            ),
                        };
                        Ok::<_, LlmError>(Prompt { context, text })
                    })
                    .collect::<Result<_, _>>()?;
                progress(Progress {
                    done,
                    total,
                    test: &name,
                });
                let batch = match send_batch(client, prompts, t).await {
                    Ok(b) => b,
                    Err(e) => {
                        // Keep what finished: the tests before, and the runs of this one.
                        for (k2, &ph) in phases.iter().enumerate() {
                            if !per_phase[k2].is_empty() {
                                report.results.push(TestResult::new(
                                    p,
                                    t,
                                    d,
                                    c,
                                    ph,
                                    std::mem::take(&mut per_phase[k2]),
                                ));
                            }
                        }
                        report.failure = Some(Failure {
                            test: crate::report::test_names(p, t, d, c, phase).0,
                            error: e.to_string(),
                        });
                        let mut seen_w = std::collections::BTreeSet::new();
                        warnings.retain(|w: &String| seen_w.insert(w.clone()));
                        report.warnings = warnings;
                        report.context.counting = counting.describe();
                        report.context.prompt_time_from = counting.prompt_time_from();
                        return Ok(report);
                    }
                };
                done += u64::from(c);
                let reqs: Vec<Request> = batch
                    .iter()
                    .map(|tr| {
                        let expected = match phase {
                            Phase::Cold => d + p,
                            Phase::Context => d,
                            Phase::FollowUp => p,
                        };
                        reduce(
                            tr,
                            phase,
                            d,
                            expected,
                            t,
                            counter.map(|c| &**c),
                            &mut counting,
                            &mut warnings,
                        )
                    })
                    .collect::<Result<_, _>>()?;
                per_phase[k].push(run_figures(&reqs, warm.latency));
            }
        }
        for (k, &ph) in phases.iter().enumerate() {
            report.results.push(TestResult::new(
                p,
                t,
                d,
                c,
                ph,
                std::mem::take(&mut per_phase[k]),
            ));
        }
    }
    progress(Progress {
        done,
        total,
        test: "done",
    });
    early_first_byte(&report.results, &mut warnings);
    let mut seen_w = std::collections::BTreeSet::new();
    warnings.retain(|w| seen_w.insert(w.clone()));
    report.warnings = warnings;
    report.context.counting = counting.describe();
    report.context.prompt_time_from = counting.prompt_time_from();
    Ok(report)
}

/// A warning when the server's first byte came well before its first token (a role-only chunk
/// sent before prefill, as vLLM does): llama-benchy's prompt speed, timed to the first byte,
/// is then far off, and weft's, timed to the first token, is the one to quote.
fn early_first_byte(results: &[TestResult], warnings: &mut Vec<String>) {
    let early = results.iter().find(|t| {
        matches!(
            (t.est_ppt_ms, t.est_ppt_first_byte_ms),
            (Some(a), Some(b)) if a.mean > 1.0 && b.mean < 0.5 * a.mean
        )
    });
    if let Some(t) = early {
        warnings.push(format!(
            "the server sends its first byte before its first token ({}: {:.1} ms against {:.1} ms, less latency): pp t/s is timed to the first token; llama-benchy's figure, timed to the first byte, is pp_tps_first_byte in the JSON and is not the prompt speed here",
            t.pp_name,
            t.est_ppt_first_byte_ms.map_or(0.0, |s| s.mean),
            t.est_ppt_ms.map_or(0.0, |s| s.mean),
        ));
    }
}

#[derive(Default)]
struct CountingSeen {
    ids: bool,
    logprobs: bool,
    usage: bool,
    length: bool,
    tokenizer: bool,
    chunks_by: std::collections::BTreeSet<&'static str>,
    /// Requests reduced, and those without a content chunk (their prompt time ends at the
    /// first byte).
    requests: u64,
    no_content: u64,
}

impl CountingSeen {
    fn describe(&self) -> String {
        let total = if self.ids {
            "token-ids"
        } else if self.logprobs {
            "logprobs"
        } else if self.usage {
            "usage"
        } else if self.length {
            "finish-length"
        } else if self.tokenizer {
            "tokenizer"
        } else {
            "none"
        };
        let by: Vec<&str> = self.chunks_by.iter().copied().collect();
        format!("{total} (tokens per chunk: {})", by.join(", "))
    }

    /// `Context::prompt_time_from`: where the prompt time of `pp_tps` ended.
    fn prompt_time_from(&self) -> String {
        match self.no_content {
            0 => "first-content".into(),
            n if n == self.requests => "first-byte".into(),
            n => format!(
                "first-content (first-byte for {n} of {} requests, which carried no content chunk)",
                self.requests
            ),
        }
    }
}

/// Sends `prompts` together; all must finish.
async fn send_batch(
    client: &Client,
    prompts: Vec<Prompt>,
    max_tokens: u64,
) -> Result<Vec<Trace>, LlmError> {
    let mut set = JoinSet::new();
    for (i, p) in prompts.into_iter().enumerate() {
        let c = client.clone();
        set.spawn(async move { (i, c.stream(&p, max_tokens).await) });
    }
    let mut out: Vec<Option<Trace>> = vec![None; set.len()];
    let mut first_err = None;
    while let Some(j) = set.join_next().await {
        match j {
            Ok((i, Ok(t))) => out[i] = Some(t),
            Ok((_, Err(e))) => {
                if first_err.is_none() {
                    first_err = Some(e);
                    set.abort_all();
                }
            }
            Err(e) if e.is_cancelled() => {}
            Err(e) => {
                first_err.get_or_insert(LlmError::Input(format!("a request task failed: {e}")));
            }
        }
    }
    if let Some(e) = first_err {
        return Err(e);
    }
    Ok(out.into_iter().flatten().collect())
}

/// Counts the tokens of one trace and reduces it.
///
/// Generated tokens, best first: the server's token ids, its `logprobs` entries (one per
/// token), its usage, `finish_reason: "length"` (the server stopped at `max_tokens`, so it
/// generated exactly that many), then the local tokenizer on the whole text. Whenever a local
/// tokenizer is given and the server gave a count, the two are compared and a difference above
/// 2 % is a warning; so is a prompt the server counted more than 2 % away from what weft built.
#[allow(clippy::too_many_arguments)]
fn reduce(
    tr: &Trace,
    phase: Phase,
    depth: u64,
    expected_prompt: u64,
    max_tokens: u64,
    counter: Option<&Counter>,
    seen: &mut CountingSeen,
    warnings: &mut Vec<String>,
) -> Result<Request, LlmError> {
    let texts: Vec<&str> = tr.chunks.iter().map(|c| c.text.as_str()).collect();
    let ids = tr.token_ids();
    let logprobs = if ids.is_none() {
        tr.logprob_tokens()
    } else {
        None
    };
    let local = match counter {
        Some(c) => Some(c.per_chunk(&texts)?),
        None => None,
    };
    let by_length = tr.finish_reason.as_deref() == Some("length");
    let server_total: Option<(u64, &'static str)> = if let Some(ids) = &ids {
        Some((ids.len() as u64, "token ids"))
    } else if let Some(l) = &logprobs {
        Some((l.iter().sum(), "logprobs"))
    } else if let Some(u) = tr.usage {
        Some((u.completion_tokens, "usage"))
    } else if by_length {
        Some((max_tokens, "finish_reason length"))
    } else {
        None
    };
    let gen_total = match (server_total, &local) {
        (Some((n, how)), _) => {
            match how {
                "token ids" => seen.ids = true,
                "logprobs" => seen.logprobs = true,
                "usage" => seen.usage = true,
                _ => seen.length = true,
            }
            n
        }
        (None, Some(l)) => {
            seen.tokenizer = true;
            l.iter().sum()
        }
        (None, None) => {
            return Err(LlmError::Counting(
                "the server sent neither usage (stream_options.include_usage), token ids, logprobs nor a finish_reason of \"length\"; give --tokenizer to count locally".into(),
            ));
        }
    };
    if tr.finish_reason.is_none() {
        warnings.push(format!(
            "a stream ended with [DONE] but no finish_reason after {gen_total} of {max_tokens} tokens: the server may have cut it short (llama-cpp-python does so when another request arrives, unless started with --interrupt_requests False)"
        ));
    }
    if let (Some(l), Some((n, how))) = (&local, server_total) {
        let l: u64 = l.iter().sum();
        let diff = (l as f64 - n as f64).abs() / (n.max(1) as f64);
        if diff > 0.02 {
            warnings.push(format!(
                "generated tokens: the server's {how} says {n} and the local tokenizer {l} ({:.1} % apart); is --tokenizer the model's?",
                diff * 100.0
            ));
        }
    }
    let per_chunk: Vec<u64> = if ids.is_some() {
        seen.chunks_by.insert("token ids");
        tr.chunks
            .iter()
            .map(|c| c.token_ids.as_ref().map_or(0, |v| v.len() as u64))
            .collect()
    } else if let Some(l) = logprobs {
        seen.chunks_by.insert("logprobs");
        l
    } else if let Some(l) = local {
        seen.chunks_by.insert("tokenizer on the whole text");
        // Scale to the server's total when both exist, so the sum matches what it reports.
        let s: u64 = l.iter().sum();
        if s == gen_total {
            l
        } else {
            spread_like(&l, gen_total)
        }
    } else {
        seen.chunks_by.insert("estimated from bytes");
        spread(gen_total, &texts)
    };
    let prompt_tokens = match tr.usage {
        // A follow-up's context was cached by the step before: the server's cached count when
        // it gives one, else the depth the context was built to.
        Some(u) => {
            // The whole prompt as sent: a follow-up's holds the depth too. The context step
            // of a prefix-cache test is no pp row and is not checked.
            let built = match phase {
                Phase::FollowUp => depth + expected_prompt,
                _ => expected_prompt,
            };
            let diff = (u.prompt_tokens as f64 - built as f64).abs() / built.max(1) as f64;
            if phase != Phase::Context && diff > 0.02 {
                warnings.push(format!(
                    "prompt tokens: the server counted {} where weft built {built} ({:.1} % apart); {}",
                    u.prompt_tokens,
                    diff * 100.0,
                    if counter.is_some() {
                        "is --tokenizer the model's?"
                    } else {
                        "give --tokenizer (the model's tokenizer.json) to build prompts exactly"
                    }
                ));
            }
            match (phase, u.cached_tokens) {
                (_, Some(c)) => u.prompt_tokens.saturating_sub(c),
                (Phase::FollowUp, None) => u.prompt_tokens.saturating_sub(depth),
                _ => u.prompt_tokens,
            }
        }
        None => {
            warnings.push(format!(
                "the server sent no usage in its streams: prompt tokens are those weft built ({}), generated tokens {}",
                if counter.is_some() {
                    "exact with --tokenizer"
                } else {
                    "estimated from the warm-up; give --tokenizer"
                },
                if seen.ids || seen.logprobs {
                    "from its token ids or logprobs"
                } else if seen.length {
                    "from finish_reason \"length\" (max_tokens reached)"
                } else {
                    "counted with the local tokenizer"
                }
            ));
            expected_prompt
        }
    };
    seen.requests += 1;
    if tr.first_content.is_none() {
        seen.no_content += 1;
    }
    Ok(Request {
        prompt_tokens,
        gen_tokens: gen_total,
        ttfr: tr.ttfr.unwrap_or(tr.e2e),
        // The prompt time ends here: the first chunk with text or tokens, or (a stream with
        // none) the first byte.
        ttft: tr.first_content.or(tr.ttfr).unwrap_or(tr.e2e),
        e2e: tr.e2e,
        chunks: tr
            .chunks
            .iter()
            .zip(per_chunk)
            .map(|(c, k)| (c.at, k))
            .collect(),
    })
}

fn spread_like(weights: &[u64], total: u64) -> Vec<u64> {
    let strs: Vec<String> = weights
        .iter()
        .map(|w| "x".repeat((*w).max(1) as usize))
        .collect();
    let refs: Vec<&str> = strs.iter().map(String::as_str).collect();
    spread(total, &refs)
}

/// The server's prompt-token count for `p`: from a one-token stream's usage, else from the
/// same request without streaming.
async fn prompt_tokens(client: &Client, p: Prompt, what: &str) -> Result<i64, LlmError> {
    if let Some(u) = client.stream(&p, 1).await?.usage {
        return Ok(u.prompt_tokens as i64);
    }
    match client.usage_of(&p, 1).await? {
        Some(u) => Ok(u.prompt_tokens as i64),
        None => Err(LlmError::Counting(format!(
            "the warm-up request ({what}) came back without usage, streamed or not; the chat-template overhead cannot be measured"
        ))),
    }
}

/// Latency, template overhead and tokens per word, measured with one-token requests.
async fn warm_up(
    client: &Client,
    sweep: &Sweep,
    corpus: Corpus,
    counter: Option<&Counter>,
    rng: &mut Rng,
) -> Result<Warm, LlmError> {
    let one = |ctx: String, text: String| Prompt { context: ctx, text };
    // A first request loads whatever the engine loads lazily; it is not measured.
    client
        .stream(&one(String::new(), "Hello.".into()), 1)
        .await?;
    let a_words = 60;
    let b_words = 180;
    let a = corpus.text(rng, a_words);
    let b = corpus.text(rng, b_words);
    let pa = prompt_tokens(client, one(String::new(), a.clone()), "user message").await?;
    let pb = prompt_tokens(client, one(String::new(), b.clone()), "user message").await?;
    let (tokens_per_word, user_over, sys_over) = match counter {
        Some(c) => {
            let (la, lb) = (c.count(&a)? as i64, c.count(&b)? as i64);
            let ps = prompt_tokens(
                client,
                one(a.clone(), b.clone()),
                "system and user messages",
            )
            .await?;
            let tpw = lb as f64 / b_words as f64;
            (tpw, pa - la, ps - la - lb)
        }
        None => {
            let tpw = (pb - pa) as f64 / (b_words - a_words) as f64;
            let user_over = pa - (tpw * a_words as f64).round() as i64;
            let ps = prompt_tokens(
                client,
                one(a.clone(), b.clone()),
                "system and user messages",
            )
            .await?;
            (
                tpw,
                user_over,
                ps - pb - (tpw * a_words as f64).round() as i64,
            )
        }
    };
    if !(0.05..=20.0).contains(&tokens_per_word) {
        return Err(LlmError::Counting(format!(
            "the warm-up measured {tokens_per_word:.2} tokens per word, which no tokenizer gives; does the server count prompt tokens?"
        )));
    }
    let latency = match sweep.latency_mode {
        LatencyMode::None => Duration::ZERO,
        LatencyMode::Api => {
            let mut v = Vec::new();
            for _ in 0..3 {
                v.push(client.api_latency().await?);
            }
            v.sort();
            v[1]
        }
        LatencyMode::Generation => {
            let mut v = Vec::new();
            for _ in 0..3 {
                let t = client.stream(&one(String::new(), "Hi.".into()), 1).await?;
                v.push(t.ttfr.unwrap_or(t.e2e));
            }
            v.sort();
            v[1]
        }
    };
    Ok(Warm {
        latency,
        overhead: Overhead {
            user: user_over.max(0),
            system_user: sys_over.max(0),
        },
        builder: Builder {
            corpus,
            tokens_per_word,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_network_named_in_the_log_wins() {
        assert_eq!(
            nccl_transport("NCCL INFO Using network IB\n... via NET/IB/0"),
            Some("NET/IB".into())
        );
        assert_eq!(
            nccl_transport("NET/IB failed\nNCCL INFO Using network Socket"),
            Some("NET/Socket".into())
        );
        assert_eq!(
            nccl_transport("NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/weft/0"),
            Some("NET/weft".into())
        );
        assert_eq!(nccl_transport("nothing here"), None);
    }

    #[test]
    fn sweeps_refuse_empty_or_zero_axes() {
        let ok = Sweep {
            prompt_sizes: vec![512],
            tg: vec![32],
            depth: vec![0],
            concurrency: vec![1, 4],
            runs: 3,
            prefix_cache: false,
            latency_mode: LatencyMode::Api,
            adapt_prompt: true,
            seed: 1,
        };
        assert!(ok.check().is_ok());
        assert_eq!(ok.requests(), 15);
        assert!(
            Sweep {
                tg: vec![0],
                ..ok.clone()
            }
            .check()
            .is_err()
        );
        assert!(
            Sweep {
                runs: 0,
                ..ok.clone()
            }
            .check()
            .is_err()
        );
        assert!(
            Sweep {
                prefix_cache: true,
                ..ok.clone()
            }
            .check()
            .is_err()
        );
        assert!(
            Sweep {
                concurrency: vec![],
                ..ok
            }
            .check()
            .is_err()
        );
    }
}
