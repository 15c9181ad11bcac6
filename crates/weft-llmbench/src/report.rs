//! A run's results and the context they were measured in (the `RUN.json` schema, version 2,
//! documented in docs/bench-llm.md), and the three ways of printing them: the llama-bench /
//! llama-benchy markdown table, CSV and JSON.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::LlmError;
use crate::client::{Api, ServerInfo};
use crate::metrics::{Percentiles, RunFigures, Stat};

/// The schema version written into every `RUN.json`.
///
/// 2: `pp_tps`, `est_ppt_ms` and `pp_tps_total` end the prompt time at the first chunk with
/// text or tokens (1: the first byte, as llama-benchy's); the first-byte figures are kept as
/// `pp_tps_first_byte` and `est_ppt_first_byte_ms`, and `context.prompt_time_from` says which
/// end was used.
pub const SCHEMA: u32 = 2;

/// Everything one `weft bench llm` measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunReport {
    pub schema: u32,
    pub context: Context,
    /// One per (depth, pp, tg, concurrency, phase), in the order they ran.
    pub results: Vec<TestResult>,
    /// Counting disagreements and other things a reader must know.
    pub warnings: Vec<String>,
    /// The test that failed and why, when the run stopped early (the results before it are
    /// kept above).
    pub failure: Option<Failure>,
}

/// The test that stopped a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Failure {
    pub test: String,
    pub error: String,
}

/// Where and how the figures were measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Context {
    pub endpoint: String,
    pub api: Api,
    pub model: String,
    pub server: ServerInfo,
    /// RFC 3339, UTC, when the run began.
    pub date: String,
    pub weft_version: String,
    /// Given with `--nodes`; never guessed.
    pub nodes: Option<u32>,
    /// Given with `--layout` (`tp4pp1`).
    pub layout: Option<String>,
    pub label: Option<String>,
    /// The NCCL network the engine's log says it used (`NET/weft`, `NET/IB`, `NET/Socket`),
    /// when `--engine-log` was given.
    pub nccl_transport: Option<String>,
    /// `api`, `generation` or `none`, and the latency measured that way (ms).
    pub latency_mode: String,
    pub latency_ms: f64,
    /// Prompt tokens the chat template adds: user message only, and system plus user.
    pub template_overhead: Overhead,
    /// How generated tokens were counted: `token-ids`, `usage`, `tokenizer`.
    pub counting: String,
    /// Where the prompt time of `pp_tps` and `est_ppt_ms` ends: `first-content` (the first
    /// chunk with text or tokens), `first-byte` (no request carried one), or
    /// `first-content (first-byte for N of M requests, ...)`.
    pub prompt_time_from: String,
    pub tokenizer: Option<String>,
    pub text: String,
    pub prefix_cache: bool,
    pub runs: u32,
}

/// Template overhead in tokens.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Overhead {
    pub user: i64,
    pub system_user: i64,
}

/// What a request of a test is for in a `--prefix-cache` run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Phase {
    /// The ordinary test: the whole prompt is new to the server.
    Cold,
    /// `--prefix-cache`, step 1: load the context (`ctx_pp @ dN`).
    Context,
    /// `--prefix-cache`, step 2: follow up on the cached context.
    FollowUp,
}

/// One test: one (depth, pp, tg, concurrency), measured `runs` times.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TestResult {
    /// `pp2048 @ d4096 (c4)` style names of its two table rows.
    pub pp_name: String,
    pub tg_name: String,
    /// The prompt size asked for, in tokens (`pp` in the JSON, llama-benchy's prompt
    /// processing).
    #[serde(rename = "pp")]
    pub prompt_size: u64,
    pub tg: u64,
    pub depth: u64,
    pub concurrency: u32,
    pub phase: Phase,
    pub runs: Vec<RunFigures>,
    pub pp_tps: Option<Stat>,
    pub tg_tps: Option<Stat>,
    pub peak_tps: Option<Stat>,
    pub ttfr_ms: Option<Stat>,
    pub est_ppt_ms: Option<Stat>,
    /// llama-benchy's prompt speed and time, to the first byte ([`RunFigures`]).
    pub pp_tps_first_byte: Option<Stat>,
    pub est_ppt_first_byte_ms: Option<Stat>,
    pub e2e_ttft_ms: Option<Stat>,
    pub e2e_ms: Option<Stat>,
    pub pp_tps_total: Option<Stat>,
    pub tg_tps_total: Option<Stat>,
    /// Percentiles of each run, averaged over runs.
    pub itl_ms: StatPercentiles,
    pub tpot_ms: StatPercentiles,
    /// Prompt tokens the server processed and tokens generated, per request.
    pub prompt_tokens: Option<Stat>,
    pub gen_tokens: Option<Stat>,
}

/// p50, p90, p99 as mean and sd over runs.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StatPercentiles {
    pub p50: Option<Stat>,
    pub p90: Option<Stat>,
    pub p99: Option<Stat>,
}

impl StatPercentiles {
    fn of(v: &[Percentiles]) -> StatPercentiles {
        let f = |g: fn(&Percentiles) -> Option<f64>| {
            Stat::of(&v.iter().filter_map(g).collect::<Vec<_>>())
        };
        StatPercentiles {
            p50: f(|p| p.p50),
            p90: f(|p| p.p90),
            p99: f(|p| p.p99),
        }
    }
}

/// llama-bench names: `pp2048`, `tg32 @ d4096`, `(c4)` for concurrency above 1, and
/// `ctx_pp`/`ctx_tg` for the context step of a prefix-cache run.
pub fn test_names(prompt_size: u64, tg: u64, depth: u64, c: u32, phase: Phase) -> (String, String) {
    let d = if depth > 0 {
        format!(" @ d{depth}")
    } else {
        String::new()
    };
    let cc = if c > 1 {
        format!(" (c{c})")
    } else {
        String::new()
    };
    match phase {
        Phase::Context => (format!("ctx_pp{d}{cc}"), format!("ctx_tg{d}{cc}")),
        _ => (format!("pp{prompt_size}{d}{cc}"), format!("tg{tg}{d}{cc}")),
    }
}

impl TestResult {
    pub fn new(
        prompt_size: u64,
        tg: u64,
        depth: u64,
        c: u32,
        phase: Phase,
        runs: Vec<RunFigures>,
    ) -> Self {
        let (pp_name, tg_name) = test_names(prompt_size, tg, depth, c, phase);
        let s = |g: fn(&RunFigures) -> Option<f64>| {
            Stat::of(&runs.iter().filter_map(g).collect::<Vec<_>>())
        };
        let multi = c > 1;
        TestResult {
            pp_name,
            tg_name,
            prompt_size,
            tg,
            depth,
            concurrency: c,
            phase,
            pp_tps: s(|r| r.pp_tps),
            tg_tps: s(|r| r.tg_tps),
            peak_tps: s(|r| r.peak_tps),
            ttfr_ms: s(|r| Some(r.ttfr_ms)),
            est_ppt_ms: s(|r| Some(r.est_ppt_ms)),
            pp_tps_first_byte: s(|r| r.pp_tps_first_byte),
            est_ppt_first_byte_ms: s(|r| Some(r.est_ppt_first_byte_ms)),
            e2e_ttft_ms: s(|r| Some(r.e2e_ttft_ms)),
            e2e_ms: s(|r| Some(r.e2e_ms)),
            pp_tps_total: if multi { s(|r| r.pp_tps_total) } else { None },
            tg_tps_total: if multi { s(|r| r.tg_tps_total) } else { None },
            itl_ms: StatPercentiles::of(&runs.iter().map(|r| r.itl_ms).collect::<Vec<_>>()),
            tpot_ms: StatPercentiles::of(&runs.iter().map(|r| r.tpot_ms).collect::<Vec<_>>()),
            prompt_tokens: s(|r| Some(r.prompt_tokens)),
            gen_tokens: s(|r| Some(r.gen_tokens)),
            runs,
        }
    }
}

/// Output formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Md,
    Csv,
    Json,
}

impl std::str::FromStr for Format {
    type Err = LlmError;
    fn from_str(s: &str) -> Result<Format, LlmError> {
        match s {
            "md" | "markdown" => Ok(Format::Md),
            "csv" => Ok(Format::Csv),
            "json" => Ok(Format::Json),
            other => Err(LlmError::Input(format!(
                "--format {other:?}: expected md, csv or json"
            ))),
        }
    }
}

fn pm(s: &Option<Stat>, digits: usize) -> String {
    match s {
        Some(s) => format!("{:.*} ± {:.*}", digits, s.mean, digits, s.sd),
        None => String::new(),
    }
}

/// One printed row: the columns of the markdown table and of the CSV.
struct Row<'a> {
    test: &'a str,
    kind: &'static str,
    r: &'a TestResult,
}

impl Row<'_> {
    fn tps(&self) -> &Option<Stat> {
        if self.kind == "pp" {
            &self.r.pp_tps
        } else {
            &self.r.tg_tps
        }
    }
    fn total(&self) -> &Option<Stat> {
        if self.kind == "pp" {
            &self.r.pp_tps_total
        } else {
            &self.r.tg_tps_total
        }
    }
}

fn rows(rep: &RunReport) -> Vec<Row<'_>> {
    rep.results
        .iter()
        .flat_map(|r| {
            [
                Row {
                    test: &r.pp_name,
                    kind: "pp",
                    r,
                },
                Row {
                    test: &r.tg_name,
                    kind: "tg",
                    r,
                },
            ]
        })
        .collect()
}

impl RunReport {
    /// The llama-benchy table: pp rows carry prompt timings, tg rows generation timings.
    pub fn markdown(&self) -> String {
        let multi = self.results.iter().any(|r| r.concurrency > 1);
        let mut head = vec!["model", "test", "t/s"];
        if multi {
            head.push("t/s (total)");
        }
        head.extend([
            "peak t/s",
            "ttfr (ms)",
            "est_ppt (ms)",
            "e2e_ttft (ms)",
            "itl p50 (ms)",
            "itl p99 (ms)",
        ]);
        let mut lines: Vec<Vec<String>> = Vec::new();
        for row in rows(self) {
            let pp = row.kind == "pp";
            let mut l = vec![
                self.context.model.clone(),
                row.test.to_string(),
                pm(row.tps(), 2),
            ];
            if multi {
                l.push(pm(row.total(), 2));
            }
            let blank = String::new;
            l.push(if pp { blank() } else { pm(&row.r.peak_tps, 2) });
            l.push(if pp { pm(&row.r.ttfr_ms, 2) } else { blank() });
            l.push(if pp {
                pm(&row.r.est_ppt_ms, 2)
            } else {
                blank()
            });
            l.push(if pp {
                pm(&row.r.e2e_ttft_ms, 2)
            } else {
                blank()
            });
            l.push(if pp {
                blank()
            } else {
                pm(&row.r.itl_ms.p50, 2)
            });
            l.push(if pp {
                blank()
            } else {
                pm(&row.r.itl_ms.p99, 2)
            });
            lines.push(l);
        }
        let widths: Vec<usize> = (0..head.len())
            .map(|i| {
                lines
                    .iter()
                    .map(|l| l[i].chars().count())
                    .chain([head[i].len()])
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let fmt_line = |cells: Vec<String>| {
            let mut s = String::from("|");
            for (i, c) in cells.iter().enumerate() {
                let pad = widths[i] - c.chars().count();
                if i < 2 {
                    s.push_str(&format!(" {c}{} |", " ".repeat(pad)));
                } else {
                    s.push_str(&format!(" {}{c} |", " ".repeat(pad)));
                }
            }
            s
        };
        let mut out = String::new();
        out.push_str(&fmt_line(head.iter().map(|h| h.to_string()).collect()));
        out.push('\n');
        let mut sep = String::from("|");
        for (i, w) in widths.iter().enumerate() {
            if i < 2 {
                sep.push_str(&format!(":{}|", "-".repeat(w + 1)));
            } else {
                sep.push_str(&format!("{}:|", "-".repeat(w + 1)));
            }
        }
        out.push_str(&sep);
        out.push('\n');
        for l in lines {
            out.push_str(&fmt_line(l));
            out.push('\n');
        }
        out.push('\n');
        out.push_str(&self.footer());
        out.push('\n');
        out
    }

    /// `weft 0.0.0 | llama.cpp b1234 | 2 nodes tp2pp1 | date ... | latency mode: api (1.2 ms)`.
    pub fn footer(&self) -> String {
        let c = &self.context;
        let mut parts = vec![format!("weft {}", c.weft_version)];
        let engine = match (&c.server.engine, &c.server.engine_version) {
            (Some(e), Some(v)) => format!("{e} {v}"),
            (Some(e), None) => e.clone(),
            (None, Some(v)) => format!("engine {v}"),
            (None, None) => "engine unknown".into(),
        };
        parts.push(engine);
        if let Some(n) = c.nodes {
            let mut s = format!("{n} node{}", if n == 1 { "" } else { "s" });
            if let Some(l) = &c.layout {
                s.push_str(&format!(" {l}"));
            }
            parts.push(s);
        }
        if let Some(t) = &c.nccl_transport {
            parts.push(format!("NCCL {t}"));
        }
        if let Some(l) = &c.label {
            parts.push(l.clone());
        }
        parts.push(format!("date: {}", c.date));
        parts.push(format!(
            "latency mode: {} ({:.2} ms)",
            c.latency_mode, c.latency_ms
        ));
        parts.push(format!("counting: {}", c.counting));
        parts.push(format!("prompt time to: {}", c.prompt_time_from));
        let mut s = parts.join(" | ");
        for w in &self.warnings {
            s.push_str(&format!("\nwarning: {w}"));
        }
        if let Some(f) = &self.failure {
            s.push_str(&format!("\nFAILED at {}: {}", f.test, f.error));
        }
        s
    }

    /// One CSV line per table row, mean and sd in separate columns.
    pub fn csv(&self) -> String {
        let mut out = String::from(
            "model,test,kind,pp,tg,depth,concurrency,phase,tps_mean,tps_sd,tps_total_mean,tps_total_sd,peak_tps_mean,peak_tps_sd,ttfr_ms_mean,ttfr_ms_sd,est_ppt_ms_mean,est_ppt_ms_sd,e2e_ttft_ms_mean,e2e_ttft_ms_sd,e2e_ms_mean,itl_p50_ms,itl_p90_ms,itl_p99_ms,tpot_p50_ms,tpot_p90_ms,tpot_p99_ms,prompt_tokens,gen_tokens,runs,pp_tps_first_byte_mean,est_ppt_first_byte_ms_mean\n",
        );
        let f = |s: &Option<Stat>| {
            s.map_or((String::new(), String::new()), |s| {
                (format!("{:.4}", s.mean), format!("{:.4}", s.sd))
            })
        };
        let m = |s: &Option<Stat>| f(s).0;
        for row in rows(self) {
            let r = row.r;
            let (a, b) = f(row.tps());
            let (c, d) = f(row.total());
            let (e, g) = f(&r.peak_tps);
            let (h, i) = f(&r.ttfr_ms);
            let (j, k) = f(&r.est_ppt_ms);
            let (l, n) = f(&r.e2e_ttft_ms);
            let phase = serde_json::to_value(r.phase)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_default();
            let cells = [
                csv_cell(&self.context.model),
                csv_cell(row.test),
                row.kind.into(),
                r.prompt_size.to_string(),
                r.tg.to_string(),
                r.depth.to_string(),
                r.concurrency.to_string(),
                phase,
                a,
                b,
                c,
                d,
                e,
                g,
                h,
                i,
                j,
                k,
                l,
                n,
                m(&r.e2e_ms),
                m(&r.itl_ms.p50),
                m(&r.itl_ms.p90),
                m(&r.itl_ms.p99),
                m(&r.tpot_ms.p50),
                m(&r.tpot_ms.p90),
                m(&r.tpot_ms.p99),
                m(&r.prompt_tokens),
                m(&r.gen_tokens),
                r.runs.len().to_string(),
                if row.kind == "pp" {
                    m(&r.pp_tps_first_byte)
                } else {
                    String::new()
                },
                if row.kind == "pp" {
                    m(&r.est_ppt_first_byte_ms)
                } else {
                    String::new()
                },
            ];
            out.push_str(&cells.join(","));
            out.push('\n');
        }
        out
    }

    pub fn json(&self) -> Result<String, LlmError> {
        serde_json::to_string_pretty(self).map_err(|e| LlmError::Input(format!("JSON: {e}")))
    }

    pub fn render(&self, f: Format) -> Result<String, LlmError> {
        Ok(match f {
            Format::Md => self.markdown(),
            Format::Csv => self.csv(),
            Format::Json => self.json()? + "\n",
        })
    }

    /// Writes `RUN.json`.
    pub fn save(&self, path: &Path) -> Result<(), LlmError> {
        let tmp = path.with_extension("json.tmp");
        std::fs::write(&tmp, self.json()?)
            .and_then(|_| std::fs::rename(&tmp, path))
            .map_err(|e| LlmError::Io {
                path: path.to_path_buf(),
                reason: e.to_string(),
            })
    }

    /// Reads a `RUN.json`, refusing unknown fields and other schema versions.
    pub fn load(path: &Path) -> Result<RunReport, LlmError> {
        let text = std::fs::read_to_string(path).map_err(|e| LlmError::Io {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
        let r: RunReport = serde_json::from_str(&text).map_err(|e| LlmError::BadRun {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
        if r.schema != SCHEMA {
            return Err(LlmError::BadRun {
                path: path.to_path_buf(),
                reason: format!("schema {} (this weft reads {SCHEMA})", r.schema),
            });
        }
        Ok(r)
    }
}

fn csv_cell(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

/// RFC 3339 UTC time of `t` (seconds precision), e.g. `2026-12-02T02:47:24Z`.
pub fn rfc3339(t: std::time::SystemTime) -> String {
    humantime::format_rfc3339_seconds(t).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_llama_bench() {
        assert_eq!(
            test_names(2048, 32, 0, 1, Phase::Cold),
            ("pp2048".into(), "tg32".into())
        );
        assert_eq!(
            test_names(2048, 128, 4096, 4, Phase::FollowUp),
            ("pp2048 @ d4096 (c4)".into(), "tg128 @ d4096 (c4)".into())
        );
        assert_eq!(
            test_names(512, 32, 8192, 1, Phase::Context).0,
            "ctx_pp @ d8192"
        );
    }

    #[test]
    fn dates_are_rfc3339() {
        let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_764_619_200 + 3661);
        assert_eq!(rfc3339(t), "2025-12-01T21:01:01Z");
        assert_eq!(rfc3339(std::time::UNIX_EPOCH), "1970-01-01T00:00:00Z");
    }
}
