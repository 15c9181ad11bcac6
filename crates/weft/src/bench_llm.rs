//! `weft bench llm` and `weft bench llm compare`: argument parsing and printing around
//! weft-llmbench.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, anyhow};
use clap::{Args, Subcommand};
use weft_llmbench::client::{Api, Client, Endpoint, Limits};
use weft_llmbench::compare::compare;
use weft_llmbench::count::Counter;
use weft_llmbench::prompt::Corpus;
use weft_llmbench::report::{Format, RunReport};
use weft_llmbench::runner::{self, Labels, LatencyMode, Sweep};

use crate::{EXIT_CHECK_FAILED, EXIT_ENVIRONMENT, EXIT_OK};

pub const AFTER_HELP: &str = "Examples:
  weft bench llm --base-url http://127.0.0.1:8000/v1 --model Qwen/Qwen3-0.6B --pp 512,2048 --tg 32,128 --depth 0,4096
  weft bench llm --base-url http://node1:8000/v1 --model m --nodes 2 --layout tp2pp1 --engine-log vllm.log --save 2n.json
  weft bench llm compare 1n.json 2n.json 4n.json --plot scaling

Each test sends --concurrency requests together, --runs times: `ppN @ dD` rows time the prompt
(t/s = prompt tokens / (time to the first chunk with a token - latency); llama-benchy's figure, to
the first byte, is kept as pp_tps_first_byte in the JSON), `tgN @ dD` rows the generation (t/s = tokens after the
first chunk / time from first to last chunk). Tokens come from the server's token ids or usage,
or from --tokenizer on the whole text, never one chunk as one token. Every request starts with a
unique tag, so no cache is hit unless --prefix-cache asks for the two-step test.
Exit codes: 0 ok, 1 a test failed (the tests before it are printed and saved), 2 usage or environment.";

#[derive(Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct LlmArgs {
    #[command(subcommand)]
    pub cmd: Option<LlmCommand>,
    #[command(flatten)]
    pub run: RunArgs,
}

#[derive(Subcommand)]
pub enum LlmCommand {
    /// Scaling report across runs on different node counts or layouts: table and PNG plots.
    #[command(
        after_help = "Example:\n  weft bench llm compare 1n.json 2n.json 4n.json --plot scaling\n  weft bench llm compare --plan plan.json 1n.json 2n.json 4n.json\n\nWith --plan (a saved `weft plan --json`), each single-stream test is shown beside the plan's\nprediction for the fastest layout at the run's node count; a one-node run fits the engine's\nstep overhead, and the corrected prediction is shown for every node count.\n\nSpeed-up is over the run with the fewest nodes; efficiency per node is the speed-up divided by\nthe ratio of node counts. Under concurrency above 1 the total t/s of all requests is compared.\nThe plots draw one sd over the runs as error bars. Warnings: two runs of one node count and\nlayout, different models or tests, efficiency per node above 115 %, runs that spread over 20 %."
    )]
    Compare(CompareArgs),
}

#[derive(Args)]
pub struct CompareArgs {
    /// RUN.json files written by `weft bench llm --save` (each with --nodes).
    #[arg(required = true)]
    pub runs: Vec<PathBuf>,
    /// Writes PREFIX-depth.png and PREFIX-speedup.png.
    #[arg(long, default_value = "llm-scaling")]
    pub plot: PathBuf,
    /// Do not write plots.
    #[arg(long)]
    pub no_plot: bool,
    /// A saved `weft plan --json`: each test's prediction beside its measurement, and,
    /// with a one-node run, the engine's step overhead fitted to it.
    #[arg(long)]
    pub plan: Option<PathBuf>,
}

#[derive(Args)]
pub struct RunArgs {
    /// Base URL of the OpenAI-compatible API, ending in /v1.
    #[arg(long, env = "WEFT_LLM_URL")]
    pub base_url: Option<String>,
    /// Model name as the server lists it in /v1/models.
    #[arg(long)]
    pub model: Option<String>,
    /// API key (sent as a bearer token).
    #[arg(long, env = "OPENAI_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// chat (/v1/chat/completions) or completions (/v1/completions).
    #[arg(long, default_value = "chat")]
    pub api: String,
    /// Prompt sizes in tokens.
    #[arg(
        id = "pp",
        long = "pp",
        value_name = "PP",
        value_delimiter = ',',
        default_value = "2048"
    )]
    pub prompt_sizes: Vec<u64>,
    /// Tokens to generate.
    #[arg(long, value_delimiter = ',', default_value = "32")]
    pub tg: Vec<u64>,
    /// Context depths in tokens (prior context before the prompt).
    #[arg(long, value_delimiter = ',', default_value = "0")]
    pub depth: Vec<u64>,
    /// Requests sent together.
    #[arg(long, value_delimiter = ',', default_value = "1")]
    pub concurrency: Vec<u32>,
    /// Runs of each test (mean and sd are over runs).
    #[arg(long, default_value_t = 3)]
    pub runs: u32,
    /// A Hugging Face tokenizer.json (or its folder) to build exact prompts and count locally.
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// Prompt text from this file instead of the built-in word list.
    #[arg(long)]
    pub text: Option<PathBuf>,
    /// Two-step test per depth: load the context, then follow up on it (measures the cache).
    #[arg(long)]
    pub prefix_cache: bool,
    /// How the latency subtracted from ttfr is measured: api, generation, none.
    #[arg(long, default_value = "api")]
    pub latency_mode: String,
    /// Do not fit the prompt to the chat-template overhead.
    #[arg(long)]
    pub no_adapt_prompt: bool,
    /// Node count the server runs on (recorded; compare needs it).
    #[arg(long)]
    pub nodes: Option<u32>,
    /// Layout, e.g. tp4pp1 (recorded).
    #[arg(long)]
    pub layout: Option<String>,
    /// Free-form label (recorded).
    #[arg(long)]
    pub label: Option<String>,
    /// The engine's log (NCCL_DEBUG=INFO): the NCCL network it used is recorded.
    #[arg(long)]
    pub engine_log: Option<PathBuf>,
    /// Output: md (llama-benchy table), csv, json (RUN.json schema).
    #[arg(long, default_value = "md")]
    pub format: String,
    /// Also write the results as RUN.json.
    #[arg(long)]
    pub save: Option<PathBuf>,
    /// JSON object merged into every request body, e.g. '{"ignore_eos": true}'.
    #[arg(long)]
    pub extra_body: Option<String>,
    /// Seed for the prompt text.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Seconds to connect.
    #[arg(long, default_value_t = 10)]
    pub connect_timeout: u64,
    /// Seconds to the first byte of an answer (covers the longest prompt processing).
    #[arg(long, default_value_t = 600)]
    pub first_byte_timeout: u64,
    /// Seconds between two chunks of a stream.
    #[arg(long, default_value_t = 60)]
    pub chunk_timeout: u64,
    /// Retries of a request answered 429 or 5xx, or refused.
    #[arg(long, default_value_t = 3)]
    pub retries: u32,
    /// Milliseconds before the first retry (doubled each time).
    #[arg(long, default_value_t = 500)]
    pub backoff_ms: u64,
}

pub fn run(a: LlmArgs, json: bool) -> Result<u8> {
    let out = match a.cmd {
        Some(LlmCommand::Compare(c)) => compare_cmd(&c, json),
        None => bench(&a.run, json),
    };
    match out {
        Ok(code) => Ok(code),
        Err(e) if json => {
            crate::output::anyhow_error(true, EXIT_ENVIRONMENT, &e);
            Ok(EXIT_ENVIRONMENT)
        }
        Err(e) => Err(e),
    }
}

fn bench(a: &RunArgs, json: bool) -> Result<u8> {
    let base_url = a
        .base_url
        .clone()
        .ok_or_else(|| anyhow!("--base-url is required (e.g. http://127.0.0.1:8000/v1)"))?;
    let model = a
        .model
        .clone()
        .ok_or_else(|| anyhow!("--model is required (the id the server lists in /v1/models)"))?;
    let api = match a.api.as_str() {
        "chat" => Api::Chat,
        "completions" => Api::Completions,
        o => return Err(anyhow!("--api {o:?}: expected chat or completions")),
    };
    let format: Format = if json {
        Format::Json
    } else {
        a.format.parse()?
    };
    let extra_body = match &a.extra_body {
        None => Default::default(),
        Some(s) => match serde_json::from_str::<serde_json::Value>(s) {
            Ok(serde_json::Value::Object(m)) => m,
            _ => return Err(anyhow!("--extra-body {s:?}: expected a JSON object")),
        },
    };
    let sweep = Sweep {
        prompt_sizes: a.prompt_sizes.clone(),
        tg: a.tg.clone(),
        depth: a.depth.clone(),
        concurrency: a.concurrency.clone(),
        runs: a.runs,
        prefix_cache: a.prefix_cache,
        latency_mode: a.latency_mode.parse::<LatencyMode>()?,
        adapt_prompt: !a.no_adapt_prompt,
        seed: a.seed,
    };
    sweep.check()?;
    let counter = match &a.tokenizer {
        Some(p) => Some(Arc::new(Counter::from_file(p)?)),
        None => None,
    };
    let corpus = match &a.text {
        Some(p) => Corpus::file(p)?,
        None => Corpus::words(),
    };
    let limits = Limits {
        connect: Duration::from_secs(a.connect_timeout.max(1)),
        first_byte: Duration::from_secs(a.first_byte_timeout.max(1)),
        between_chunks: Duration::from_secs(a.chunk_timeout.max(1)),
        request: Duration::from_secs(a.first_byte_timeout.max(1) + 1200),
        retries: a.retries,
        backoff: Duration::from_millis(a.backoff_ms),
    };
    let client = Client::new(
        Endpoint {
            base_url,
            api_key: a.api_key.clone(),
            model,
            api,
            extra_body,
        },
        limits,
    )?;
    let labels = Labels {
        nodes: a.nodes,
        layout: a.layout.clone(),
        label: a.label.clone(),
        engine_log: a.engine_log.clone(),
        weft_version: env!("CARGO_PKG_VERSION").to_string(),
    };
    let bar = std::io::stderr().is_terminal().then(|| {
        let b = indicatif::ProgressBar::new(sweep.requests());
        b.set_style(
            indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} requests  {msg}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        b
    });
    let progress = |p: runner::Progress<'_>| {
        if let Some(b) = &bar {
            b.set_length(p.total);
            b.set_position(p.done);
            b.set_message(p.test.to_string());
        }
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("tokio runtime")?;
    let report = rt.block_on(runner::run(
        &client,
        &sweep,
        corpus,
        counter.as_ref(),
        &labels,
        &progress,
    ))?;
    if let Some(b) = &bar {
        b.finish_and_clear();
    }
    if let Some(p) = &a.save {
        report.save(p)?;
    }
    print!("{}", report.render(format)?);
    if format != Format::Md {
        for w in &report.warnings {
            eprintln!("warning: {w}");
        }
    }
    if let Some(f) = &report.failure {
        if format != Format::Md {
            eprintln!("weft: test {} failed: {}", f.test, f.error);
        }
        return Ok(EXIT_CHECK_FAILED);
    }
    Ok(EXIT_OK)
}

fn compare_cmd(a: &CompareArgs, json: bool) -> Result<u8> {
    let mut inputs = Vec::new();
    for p in &a.runs {
        inputs.push((p.clone(), RunReport::load(p)?));
    }
    let c = compare(&inputs)?;
    let predicted = match &a.plan {
        Some(p) => {
            let bytes = std::fs::read(p).with_context(|| format!("--plan {}", p.display()))?;
            let scaling =
                weft_llmbench::predicted::scaling_from_plan(&bytes, &p.display().to_string())?;
            let tests = weft_llmbench::predicted::measured(&c);
            Some(weft_llmbench::predicted::predicted(&tests, &scaling))
        }
        None => None,
    };
    let plots = if a.no_plot {
        Vec::new()
    } else {
        let lines = predicted
            .as_ref()
            .map(weft_llmbench::predicted::Predicted::speedup_lines)
            .unwrap_or_default();
        c.plots_with(&a.plot, &lines)?
    };
    if json {
        let mut v = serde_json::to_value(&c)?;
        v["plots"] = serde_json::json!(
            plots
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
        );
        if let Some(p) = &predicted {
            v["predicted"] = serde_json::to_value(p)?;
        }
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        print!("{}", c.markdown());
        if let Some(p) = &predicted {
            print!("\n{}", p.markdown());
        }
        for p in &plots {
            println!("plot: {}", p.display());
        }
    }
    Ok(EXIT_OK)
}
