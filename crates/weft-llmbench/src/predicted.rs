//! Predicted beside measured (`weft bench llm compare --plan plan.json ...`): every
//! single-stream test of every run against what `weft plan` predicts for the fastest layout
//! at the run's node count, and, given a one-node run, the engine's fixed time per step
//! fitted to it and the prediction corrected with it for the other node counts. Pure: a
//! comparison and the plan's speed models in, a table out.
//!
//! A `tgN @ dD` test is predicted as decode at a context of D + N/2 tokens (the prompt of
//! the request is left out); a `ppN @ dD` test as a prompt of N tokens after D cached ones.

use serde::{Deserialize, Serialize};
use weft_plan::speed::{ScalePoint, StepModel};

use crate::LlmError;
use crate::compare::Comparison;

/// One single-stream test of one run as measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Measured {
    /// Index into the comparison's runs.
    pub run: usize,
    pub file: String,
    pub nodes: u32,
    /// `tg32 @ d4096`.
    pub test: String,
    /// `pp` or `tg`.
    pub kind: String,
    pub size: u64,
    pub depth: u64,
    pub tps: f64,
}

/// The single-stream tests of a comparison, run by run.
pub fn measured(c: &Comparison) -> Vec<Measured> {
    let mut out = Vec::new();
    for row in c.rows.iter().filter(|r| r.concurrency == 1) {
        for pt in &row.points {
            let id = &c.runs[pt.run];
            out.push(Measured {
                run: pt.run,
                file: id.file.clone(),
                nodes: id.nodes,
                test: row.test.clone(),
                kind: row.kind.clone(),
                size: row.size,
                depth: row.depth,
                tps: pt.tps.mean,
            });
        }
    }
    out
}

/// One test of one run, measured and predicted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PredictedRow {
    pub test: String,
    /// Index into the comparison's runs.
    pub run: usize,
    pub nodes: u32,
    /// The layout predicted (`tp2 pp1`): the plan's fastest at that node count.
    pub layout: String,
    pub measured_tps: f64,
    pub predicted_tps: f64,
    /// Measured / predicted.
    pub ratio: f64,
    /// With the step overhead fitted to the one-node run.
    pub corrected_tps: Option<f64>,
    pub corrected_ratio: Option<f64>,
    /// The term that bounds the (corrected) prediction.
    pub dominant: String,
}

/// The fixed time per step fitted to the one-node run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Calibration {
    pub run: usize,
    /// The median over its decode tests of measured step time less the predicted time
    /// without overhead (never below 0).
    pub step_overhead_us: f64,
    /// What the plan assumed.
    pub assumed_us: f64,
    pub tests: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Predicted {
    pub rows: Vec<PredictedRow>,
    pub calibration: Option<Calibration>,
    pub warnings: Vec<String>,
}

/// The speed models a saved `weft plan --json` carries (its `scaling`), refused with the
/// file's name when it has none.
pub fn scaling_from_plan(bytes: &[u8], what: &str) -> Result<Vec<ScalePoint>, LlmError> {
    let v: serde_json::Value = serde_json::from_slice(bytes)
        .map_err(|e| LlmError::Input(format!("--plan {what}: not JSON ({e})")))?;
    let Some(s) = v.get("scaling") else {
        return Err(LlmError::Input(format!(
            "--plan {what}: not the output of `weft plan --json` (no \"scaling\")"
        )));
    };
    let points: Vec<ScalePoint> = serde_json::from_value(s.clone())
        .map_err(|e| LlmError::Input(format!("--plan {what}: \"scaling\": {e}")))?;
    if points.is_empty() {
        return Err(LlmError::Input(format!(
            "--plan {what}: no layout fits at any node count, so nothing is predicted"
        )));
    }
    Ok(points)
}

fn predict(m: &StepModel, kind: &str, size: u64, depth: u64) -> weft_plan::speed::Speed {
    if kind == "pp" {
        m.prompt(size, depth)
    } else {
        m.decode(depth + size / 2)
    }
}

fn median(v: &mut [f64]) -> Option<f64> {
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(v[n / 2]),
        _ => Some((v[n / 2 - 1] + v[n / 2]) / 2.0),
    }
}

/// Predicted beside measured for every single-stream test ([`measured`] of a comparison).
pub fn predicted(tests: &[Measured], scaling: &[ScalePoint]) -> Predicted {
    let mut warnings = Vec::new();
    let point = |nodes: u32| scaling.iter().find(|p| p.nodes == u64::from(nodes));
    let mut runs: Vec<(usize, &str, u32)> = tests
        .iter()
        .map(|t| (t.run, t.file.as_str(), t.nodes))
        .collect();
    runs.dedup();
    for (_, file, nodes) in &runs {
        if point(*nodes).is_none() {
            warnings.push(format!(
                "{file}: the plan predicts no layout for {nodes} node(s) (it covers {})",
                scaling
                    .iter()
                    .map(|p| p.nodes.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
    }
    // Fit the step overhead to the first one-node run's decode tests.
    let one = tests.iter().find(|t| t.nodes == 1).map(|t| t.run);
    let calibration = one.and_then(|run| {
        let p = point(1)?;
        let mut zero = p.model.clone();
        zero.step_overhead_us = 0.0;
        let mut gaps = Vec::new();
        let mut names = Vec::new();
        for t in tests
            .iter()
            .filter(|t| t.run == run && t.kind == "tg" && t.tps > 0.0)
        {
            let s = predict(&zero, "tg", t.size, t.depth);
            gaps.push(1.0 / t.tps - s.terms.total_s());
            names.push(t.test.clone());
        }
        let fit = median(&mut gaps)?;
        Some(Calibration {
            run,
            step_overhead_us: (fit * 1e6).max(0.0),
            assumed_us: p.model.step_overhead_us,
            tests: names,
        })
    });
    if one.is_none() {
        warnings
            .push("no one-node run: the step overhead is the plan's assumption, not fitted".into());
    }
    let mut rows = Vec::new();
    for t in tests {
        let Some(p) = point(t.nodes) else { continue };
        let s = predict(&p.model, &t.kind, t.size, t.depth);
        let corrected = calibration.as_ref().map(|cal| {
            let mut m = p.model.clone();
            m.step_overhead_us = cal.step_overhead_us;
            predict(&m, &t.kind, t.size, t.depth)
        });
        let ratio = |pred: f64| if pred > 0.0 { t.tps / pred } else { 0.0 };
        rows.push(PredictedRow {
            test: t.test.clone(),
            run: t.run,
            nodes: t.nodes,
            layout: format!("tp{} pp{}", p.layout.tp, p.layout.pp)
                + if p.layout.ep { " ep" } else { "" },
            measured_tps: t.tps,
            predicted_tps: s.tokens_per_s,
            ratio: ratio(s.tokens_per_s),
            corrected_tps: corrected.as_ref().map(|x| x.tokens_per_s),
            corrected_ratio: corrected.as_ref().map(|x| ratio(x.tokens_per_s)),
            dominant: corrected.map_or(s.dominant, |x| x.dominant),
        });
    }
    Predicted {
        rows,
        calibration,
        warnings,
    }
}

impl Predicted {
    /// Per test, the predicted speed-up over its prediction at the fewest nodes measured
    /// (the corrected prediction where a one-node run calibrated it), node count by node
    /// count: the dashed lines of the scaling plot ([`crate::compare::Comparison::plots_with`]).
    pub fn speedup_lines(&self) -> Vec<(String, Vec<(u32, f64)>)> {
        let mut out: Vec<(String, Vec<(u32, f64)>)> = Vec::new();
        for r in &self.rows {
            let tps = r.corrected_tps.unwrap_or(r.predicted_tps);
            match out.iter_mut().find(|(t, _)| *t == r.test) {
                Some((_, pts)) => {
                    if !pts.iter().any(|(n, _)| *n == r.nodes) {
                        pts.push((r.nodes, tps));
                    }
                }
                None => out.push((r.test.clone(), vec![(r.nodes, tps)])),
            }
        }
        for (_, pts) in &mut out {
            pts.sort_by_key(|(n, _)| *n);
            let base = pts.first().map_or(0.0, |(_, t)| *t);
            for (_, t) in pts.iter_mut() {
                *t = if base > 0.0 { *t / base } else { 0.0 };
            }
        }
        out
    }

    /// | test | nodes | layout | measured | predicted | ratio | corrected | ratio | bound by |.
    pub fn markdown(&self) -> String {
        let mut out = String::from(
            "| test | nodes | layout | measured t/s | predicted t/s | measured/predicted | corrected t/s | measured/corrected | bound by |\n|:-----|------:|:-------|-------------:|--------------:|------:|--------------:|------:|:---------|\n",
        );
        let opt = |v: Option<f64>, d: usize| v.map_or("-".to_string(), |v| format!("{v:.d$}"));
        for r in &self.rows {
            out.push_str(&format!(
                "| {} | {} | {} | {:.2} | {:.2} | {:.2} | {} | {} | {} |\n",
                r.test,
                r.nodes,
                r.layout,
                r.measured_tps,
                r.predicted_tps,
                r.ratio,
                opt(r.corrected_tps, 2),
                opt(r.corrected_ratio, 2),
                r.dominant
            ));
        }
        if let Some(c) = &self.calibration {
            out.push_str(&format!(
                "\nstep overhead fitted to the one-node run: {:.0} us (the plan assumed {:.0} us), from {}\n",
                c.step_overhead_us,
                c.assumed_us,
                c.tests.join(", ")
            ));
        }
        for w in &self.warnings {
            out.push_str(&format!("warning: {w}\n"));
        }
        out
    }
}
