//! The scaling report: runs of the same tests on different node counts (or layouts) side by
//! side, with the speed-up over the smallest run and the efficiency per node, as a table and
//! as PNG plots (t/s against depth, one line per run; speed-up against nodes; the spread of
//! each figure over its runs as error bars), and warnings on runs that cannot be compared
//! and figures that cannot be true ([`check`]).
//!
//! The steps are separate functions so that others can be added beside them: [`compare`]
//! builds the rows, [`check`] warns, [`Comparison::markdown`] and [`Comparison::plots`] draw.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::LlmError;
use crate::metrics::Stat;
use crate::report::{Phase, RunReport, TestResult};

/// One input run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunId {
    pub file: String,
    pub nodes: u32,
    pub layout: Option<String>,
    pub label: Option<String>,
    pub model: String,
    pub nccl_transport: Option<String>,
}

impl RunId {
    /// `2 nodes tp2pp1`.
    pub fn name(&self) -> String {
        let mut s = format!(
            "{} node{}",
            self.nodes,
            if self.nodes == 1 { "" } else { "s" }
        );
        if let Some(l) = &self.layout {
            s.push(' ');
            s.push_str(l);
        }
        s
    }
}

/// One test in one run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Point {
    /// Index into [`Comparison::runs`].
    pub run: usize,
    pub tps: Stat,
    /// Over the same test in the first run (the fewest nodes).
    pub speedup: Option<f64>,
    /// Its standard deviation, from the spread of this run and of the first (relative
    /// errors added in quadrature).
    #[serde(default)]
    pub speedup_sd: Option<f64>,
    /// Speed-up divided by the ratio of node counts.
    pub efficiency: Option<f64>,
}

/// One test across runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Row {
    /// `pp2048 @ d4096`, `tg32 (c4)`.
    pub test: String,
    /// `pp` or `tg`.
    pub kind: String,
    /// The pp or tg size.
    pub size: u64,
    pub depth: u64,
    pub concurrency: u32,
    pub points: Vec<Point>,
}

/// The scaling report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Comparison {
    /// Sorted by node count, then layout.
    pub runs: Vec<RunId>,
    pub rows: Vec<Row>,
    pub warnings: Vec<String>,
}

/// Builds the report. Every run must name its node count (`--nodes`); none is assumed.
/// Under concurrency above 1 the figure compared is the total t/s of all requests, else the
/// per-request t/s.
pub fn compare(inputs: &[(PathBuf, RunReport)]) -> Result<Comparison, LlmError> {
    if inputs.is_empty() {
        return Err(LlmError::Input(
            "compare needs at least one RUN.json".into(),
        ));
    }
    let mut runs = Vec::new();
    for (path, r) in inputs {
        let Some(nodes) = r.context.nodes else {
            return Err(LlmError::BadRun {
                path: path.clone(),
                reason: "the run records no node count; measure it with `weft bench llm --nodes N`"
                    .into(),
            });
        };
        if nodes == 0 {
            return Err(LlmError::BadRun {
                path: path.clone(),
                reason: "the run records 0 nodes".into(),
            });
        }
        runs.push((
            RunId {
                file: path.display().to_string(),
                nodes,
                layout: r.context.layout.clone(),
                label: r.context.label.clone(),
                model: r.context.model.clone(),
                nccl_transport: r.context.nccl_transport.clone(),
            },
            r,
        ));
    }
    runs.sort_by(|a, b| (a.0.nodes, &a.0.layout).cmp(&(b.0.nodes, &b.0.layout)));
    let mut warnings = Vec::new();
    let models: std::collections::BTreeSet<&str> =
        runs.iter().map(|r| r.0.model.as_str()).collect();
    if models.len() > 1 {
        warnings.push(format!(
            "the runs measured different models ({}); speed-ups compare unlike things",
            models.into_iter().collect::<Vec<_>>().join(", ")
        ));
    }
    for (id, r) in &runs {
        if r.failure.is_some() {
            warnings.push(format!(
                "{} stopped early; only its finished tests are compared",
                id.file
            ));
        }
    }
    let mut rows: Vec<Row> = Vec::new();
    for (k, (_, r)) in runs.iter().enumerate() {
        let names = row_names(&r.results);
        for (t, (pp_name, tg_name)) in r.results.iter().zip(&names) {
            if t.phase == Phase::Context {
                continue;
            }
            let multi = t.concurrency > 1;
            for (kind, name, size, st, total) in [
                ("pp", pp_name, t.prompt_size, t.pp_tps, t.pp_tps_total),
                ("tg", tg_name, t.tg, t.tg_tps, t.tg_tps_total),
            ] {
                let Some(tps) = (if multi { total } else { st }) else {
                    continue;
                };
                let row = match rows.iter_mut().find(|x| x.test == *name) {
                    Some(x) => x,
                    None => {
                        rows.push(Row {
                            test: name.clone(),
                            kind: kind.into(),
                            size,
                            depth: t.depth,
                            concurrency: t.concurrency,
                            points: Vec::new(),
                        });
                        let n = rows.len() - 1;
                        &mut rows[n]
                    }
                };
                row.points.push(Point {
                    run: k,
                    tps,
                    speedup: None,
                    speedup_sd: None,
                    efficiency: None,
                });
            }
        }
    }
    let ids: Vec<RunId> = runs.into_iter().map(|r| r.0).collect();
    speedups(&ids, &mut rows);
    rows.sort_by(|a, b| {
        (&a.kind, a.size, a.concurrency, a.depth).cmp(&(&b.kind, b.size, b.concurrency, b.depth))
    });
    warnings.extend(check(&ids, &rows));
    Ok(Comparison {
        runs: ids,
        rows,
        warnings,
    })
}

/// The row names of a run's tests. llama-bench's names repeat within one run when it pairs
/// several prompt sizes with one generation length (`--pp 512,2048 --tg 128` gives two
/// `tg128`, generated after different prompts), and a repeated name would read as another
/// run of the same test: such a name gets the other half of its pair (`tg128 after pp2048`,
/// `pp512 before tg32`).
fn row_names(results: &[TestResult]) -> Vec<(String, String)> {
    let count = |f: fn(&TestResult) -> &String, name: &String| {
        results
            .iter()
            .filter(|t| t.phase != Phase::Context && f(t) == name)
            .count()
    };
    results
        .iter()
        .map(|t| {
            let pp = if count(|t| &t.pp_name, &t.pp_name) > 1 {
                format!("{} before tg{}", t.pp_name, t.tg)
            } else {
                t.pp_name.clone()
            };
            let tg = if count(|t| &t.tg_name, &t.tg_name) > 1 {
                format!("{} after pp{}", t.tg_name, t.prompt_size)
            } else {
                t.tg_name.clone()
            };
            (pp, tg)
        })
        .collect()
}

/// Speed-up over the row's first run (the fewest nodes), its spread, and the efficiency per
/// node.
fn speedups(ids: &[RunId], rows: &mut [Row]) {
    for row in rows {
        let Some((base, base_nodes, base_rel)) = row
            .points
            .first()
            .map(|p| (p.tps.mean, ids[p.run].nodes, rel_sd(&p.tps)))
        else {
            continue;
        };
        for p in &mut row.points {
            if base > 0.0 {
                let s = p.tps.mean / base;
                p.speedup = Some(s);
                p.speedup_sd = Some(s * (rel_sd(&p.tps).powi(2) + base_rel.powi(2)).sqrt());
                p.efficiency = Some(s * f64::from(base_nodes) / f64::from(ids[p.run].nodes));
            }
        }
        if let Some(first) = row.points.first_mut() {
            // The base against itself: exactly 1.
            first.speedup_sd = Some(0.0);
        }
    }
}

/// sd / mean, 0 when the mean is not positive.
fn rel_sd(s: &Stat) -> f64 {
    if s.mean > 0.0 { s.sd / s.mean } else { 0.0 }
}

/// Efficiency per node above this cannot come from adding nodes alone.
pub const EFFICIENCY_MAX: f64 = 1.15;
/// A figure whose runs spread more than this (sd / mean) is too noisy to compare.
pub const SPREAD_MAX: f64 = 0.20;

/// Warnings on runs that cannot be compared (the same node count and layout twice, tests
/// that only some runs have) and on figures that cannot be true (efficiency per node well
/// over 100 %) or are too noisy (runs that spread more than [`SPREAD_MAX`]).
pub fn check(ids: &[RunId], rows: &[Row]) -> Vec<String> {
    let mut w = Vec::new();
    for (i, a) in ids.iter().enumerate() {
        for b in &ids[i + 1..] {
            if (a.nodes, &a.layout) == (b.nodes, &b.layout) {
                w.push(format!(
                    "{} and {} both measured {}: they are not two points of a scaling series, so speed-ups and efficiencies between them mean nothing; give runs of one node count different --layout values, or compare one of them",
                    a.file,
                    b.file,
                    a.name()
                ));
            }
        }
    }
    for r in rows {
        if r.points.len() < ids.len() {
            let have: Vec<&str> = r.points.iter().map(|p| ids[p.run].file.as_str()).collect();
            w.push(format!(
                "{} was measured only in {}: the runs ran different tests",
                r.test,
                have.join(", ")
            ));
        }
        for p in &r.points {
            if let Some(e) = p.efficiency
                && e > EFFICIENCY_MAX
            {
                w.push(format!(
                    "{} on {}: {:.0} % efficiency per node, more than adding nodes can give (a cache, another configuration, or a slow first run); check the runs before trusting this speed-up",
                    r.test,
                    ids[p.run].name(),
                    e * 100.0
                ));
            }
            let spread = rel_sd(&p.tps);
            if p.tps.n > 1 && spread > SPREAD_MAX {
                w.push(format!(
                    "{} on {}: its {} runs spread {:.0} % (sd / mean); the speed-up is uncertain, measure with more --runs on a quieter machine",
                    r.test,
                    ids[p.run].name(),
                    p.tps.n,
                    spread * 100.0
                ));
            }
        }
    }
    w
}

impl Comparison {
    /// | test | run | t/s | speed-up | efficiency |.
    pub fn markdown(&self) -> String {
        let mut out = String::from(
            "| test | run | t/s | speed-up | efficiency per node |\n|:-----|:----|----:|--------:|--------------------:|\n",
        );
        for r in &self.rows {
            for p in &r.points {
                out.push_str(&format!(
                    "| {} | {} | {:.2} ± {:.2} | {} | {} |\n",
                    r.test,
                    self.runs[p.run].name(),
                    p.tps.mean,
                    p.tps.sd,
                    match (p.speedup, p.speedup_sd) {
                        (Some(s), Some(sd)) if sd > 0.0 => format!("{s:.2}x ± {sd:.2}"),
                        (Some(s), _) => format!("{s:.2}x"),
                        _ => String::new(),
                    },
                    p.efficiency
                        .map_or(String::new(), |e| format!("{:.0} %", e * 100.0)),
                ));
            }
        }
        for w in &self.warnings {
            out.push_str(&format!("\nwarning: {w}"));
        }
        out
    }

    /// Writes `PREFIX-depth.png` (t/s against depth, one panel per pp or tg size and
    /// concurrency, one line per run) and `PREFIX-speedup.png` (speed-up against nodes, one
    /// line per test, with the ideal line); returns their paths.
    pub fn plots(&self, prefix: &Path) -> Result<Vec<PathBuf>, LlmError> {
        self.plots_with(prefix, &[])
    }

    /// [`Comparison::plots`], the speed-up plot with a dashed predicted line per test in
    /// the test's colour (`predicted`: test name and (nodes, predicted speed-up) points,
    /// as [`crate::predicted::Predicted::speedup_lines`] gives them).
    pub fn plots_with(
        &self,
        prefix: &Path,
        predicted: &[(String, Vec<(u32, f64)>)],
    ) -> Result<Vec<PathBuf>, LlmError> {
        let depth = PathBuf::from(format!("{}-depth.png", prefix.display()));
        let speed = PathBuf::from(format!("{}-speedup.png", prefix.display()));
        plot::depth(self, &depth)?;
        plot::speedup(self, &speed, predicted)?;
        Ok(vec![depth, speed])
    }
}

mod plot {
    use super::*;
    use plotters::prelude::*;
    use weft_font::{draw_text, text_size};

    const PALETTE: [RGBColor; 8] = [
        RGBColor(31, 119, 180),
        RGBColor(255, 127, 14),
        RGBColor(44, 160, 44),
        RGBColor(214, 39, 40),
        RGBColor(148, 103, 189),
        RGBColor(140, 86, 75),
        RGBColor(227, 119, 194),
        RGBColor(127, 127, 127),
    ];
    /// Text height, pixels.
    const PX: u32 = 15;
    const TH: i32 = PX as i32;
    pub const PW: i32 = 520; // panel width
    pub const PH: i32 = 360; // panel height

    pub struct Series {
        pub name: String,
        pub colour: RGBColor,
        pub dashed: bool,
        /// (x index, y, the spread of y: one sd either side, drawn as an error bar)
        pub points: Vec<(usize, f64, f64)>,
        /// Whether the series has its own line in the legend.
        pub legend: bool,
    }

    /// Why a plot could not be drawn: the font's error, or the backend's message (plotters'
    /// drawing errors are generic over the backend, so they are kept as text).
    #[derive(Debug, thiserror::Error)]
    pub enum DrawError {
        #[error(transparent)]
        Font(#[from] weft_font::FontError),
        #[error("{0}")]
        Backend(String),
    }

    fn e<E: std::fmt::Display>(x: E) -> DrawError {
        DrawError::Backend(x.to_string())
    }

    type Area<'a> = DrawingArea<BitMapBackend<'a>, plotters::coord::Shift>;

    fn err(path: &Path) -> impl Fn(DrawError) -> LlmError + '_ {
        move |reason| LlmError::Plot {
            path: path.to_path_buf(),
            reason: reason.to_string(),
        }
    }

    /// A value with 3 significant digits: `8521`, `73.2`, `0.95`.
    fn num(v: f64) -> String {
        if v >= 100.0 {
            format!("{v:.0}")
        } else if v >= 10.0 {
            format!("{v:.1}")
        } else {
            format!("{v:.2}")
        }
    }

    fn nice_max(v: f64) -> f64 {
        if v <= 0.0 {
            return 1.0;
        }
        let e = 10f64.powf(v.log10().floor());
        for m in [1.0, 2.0, 2.5, 5.0, 10.0] {
            if m * e >= v {
                return m * e;
            }
        }
        10.0 * e
    }

    /// One line chart at `(ox, oy)` of size PW x PH.
    #[allow(clippy::too_many_arguments)]
    pub fn panel(
        root: &Area<'_>,
        (ox, oy): (i32, i32),
        title: &str,
        xlabels: &[String],
        xname: &str,
        yname: &str,
        series: &[Series],
        ymax: Option<f64>,
    ) -> Result<(), DrawError> {
        let (l, r, t, b) = (ox + 70, ox + PW - 20, oy + 40, oy + PH - 60);
        draw_text(root, title, (ox + 10, oy + 10), PX, false, &BLACK)?;
        let top = nice_max(
            ymax.unwrap_or(0.0).max(
                series
                    .iter()
                    .flat_map(|s| s.points.iter().map(|p| p.1 + p.2))
                    .fold(0.0, f64::max),
            ) * 1.05,
        );
        let nx = xlabels.len().max(1);
        let px = |i: usize| {
            if nx == 1 {
                (l + r) / 2
            } else {
                l + 10 + (i as i32) * (r - l - 20) / (nx as i32 - 1)
            }
        };
        let py = |y: f64| b - ((y / top) * f64::from(b - t)) as i32;
        // Grid and y ticks.
        for k in 0..=4 {
            let y = top * f64::from(k) / 4.0;
            let yy = py(y);
            root.draw(&PathElement::new(
                vec![(l, yy), (r, yy)],
                RGBColor(225, 225, 225),
            ))
            .map_err(e)?;
            let s = num(y);
            let (w, _) = text_size(&s, PX);
            draw_text(root, &s, (l - 6 - w, yy - TH / 2), PX, false, &BLACK)?;
        }
        root.draw(&PathElement::new(vec![(l, t), (l, b), (r, b)], BLACK))
            .map_err(e)?;
        for (i, s) in xlabels.iter().enumerate() {
            let (w, _) = text_size(s, PX);
            draw_text(root, s, (px(i) - w / 2, b + 8), PX, false, &BLACK)?;
            root.draw(&PathElement::new(vec![(px(i), b), (px(i), b + 4)], BLACK))
                .map_err(e)?;
        }
        let (w, _) = text_size(xname, PX);
        draw_text(
            root,
            xname,
            ((l + r) / 2 - w / 2, b + 30),
            PX,
            false,
            &BLACK,
        )?;
        let (w, _) = text_size(yname, PX);
        draw_text(root, yname, (ox + 6, (t + b) / 2 - w / 2), PX, true, &BLACK)?;
        // Lines, points and the legend.
        let mut k = 0;
        for s in series {
            let pts: Vec<(i32, i32)> = s.points.iter().map(|&(i, y, _)| (px(i), py(y))).collect();
            // Error bars: one sd either side, with caps.
            for &(i, y, sd) in &s.points {
                if sd > 0.0 {
                    let (x, lo, hi) = (px(i), py((y - sd).max(0.0)), py(y + sd));
                    for seg in [
                        vec![(x, lo), (x, hi)],
                        vec![(x - 5, lo), (x + 5, lo)],
                        vec![(x - 5, hi), (x + 5, hi)],
                    ] {
                        root.draw(&PathElement::new(seg, s.colour.stroke_width(2)))
                            .map_err(e)?;
                    }
                }
            }
            if s.dashed {
                for w in pts.windows(2) {
                    let (a, c) = (w[0], w[1]);
                    let n = 12;
                    for j in (0..n).step_by(2) {
                        let f = |q: i32| (a.0 + (c.0 - a.0) * q / n, a.1 + (c.1 - a.1) * q / n);
                        root.draw(&PathElement::new(
                            vec![f(j), f(j + 1)],
                            s.colour.stroke_width(2),
                        ))
                        .map_err(e)?;
                    }
                }
            } else {
                root.draw(&PathElement::new(pts.clone(), s.colour.stroke_width(3)))
                    .map_err(e)?;
                for p in &pts {
                    root.draw(&Circle::new(*p, 4, s.colour.filled()))
                        .map_err(e)?;
                }
            }
            if !s.legend {
                continue;
            }
            let ly = t + 4 + k * (TH + 6);
            k += 1;
            let lx = l + 12;
            root.draw(&Rectangle::new(
                [(lx, ly + 2), (lx + 14, ly + TH - 2)],
                s.colour.filled(),
            ))
            .map_err(e)?;
            draw_text(root, &s.name, (lx + 20, ly), PX, false, &BLACK)?;
        }
        Ok(())
    }

    fn grid(n: usize) -> (i32, i32) {
        let cols = n.clamp(1, 2) as i32;
        let rows = n.div_ceil(2).max(1) as i32;
        (cols, rows)
    }

    /// t/s against depth: one panel per (kind, size, concurrency), one line per run.
    pub fn depth(c: &Comparison, path: &Path) -> Result<(), LlmError> {
        let mut keys: Vec<(String, u64, u32)> = Vec::new();
        for r in &c.rows {
            let k = (r.kind.clone(), r.size, r.concurrency);
            if !keys.contains(&k) {
                keys.push(k);
            }
        }
        let (cols, rows) = grid(keys.len());
        let size = ((cols * PW) as u32, (rows * PH) as u32);
        let root = BitMapBackend::new(path, size).into_drawing_area();
        root.fill(&WHITE).map_err(|x| err(path)(e(x)))?;
        for (n, (kind, sz, cc)) in keys.iter().enumerate() {
            let mut depths: Vec<u64> = c
                .rows
                .iter()
                .filter(|r| (&r.kind, r.size, r.concurrency) == (kind, *sz, *cc))
                .map(|r| r.depth)
                .collect();
            depths.sort();
            depths.dedup();
            let series: Vec<Series> = c
                .runs
                .iter()
                .enumerate()
                .map(|(k, id)| Series {
                    name: id.name(),
                    colour: PALETTE[k % PALETTE.len()],
                    dashed: false,
                    legend: true,
                    points: depths
                        .iter()
                        .enumerate()
                        .filter_map(|(i, d)| {
                            c.rows
                                .iter()
                                .find(|r| {
                                    (&r.kind, r.size, r.concurrency, r.depth)
                                        == (kind, *sz, *cc, *d)
                                })
                                .and_then(|r| r.points.iter().find(|p| p.run == k))
                                .map(|p| (i, p.tps.mean, p.tps.sd))
                        })
                        .collect(),
                })
                .filter(|s| !s.points.is_empty())
                .collect();
            let title = format!(
                "{kind}{sz}{} t/s vs depth",
                if *cc > 1 {
                    format!(" (c{cc}, total)")
                } else {
                    String::new()
                }
            );
            let xl: Vec<String> = depths.iter().map(|d| format!("d{d}")).collect();
            let o = ((n as i32 % cols) * PW, (n as i32 / cols) * PH);
            panel(
                &root,
                o,
                &title,
                &xl,
                "context depth (tokens)",
                "t/s",
                &series,
                None,
            )
            .map_err(err(path))?;
        }
        root.present().map_err(|x| err(path)(e(x)))
    }

    /// Speed-up against node count: one line per test (at most 8), and the ideal.
    pub fn speedup(
        c: &Comparison,
        path: &Path,
        predicted: &[(String, Vec<(u32, f64)>)],
    ) -> Result<(), LlmError> {
        let root = BitMapBackend::new(path, (PW as u32, (PH + 40) as u32)).into_drawing_area();
        draw_speedup(c, &root, predicted).map_err(err(path))?;
        root.present().map_err(|x| err(path)(e(x)))
    }

    /// [`speedup`] into RGB pixels of `size`.
    #[cfg(test)]
    pub fn speedup_into(c: &Comparison, buf: &mut [u8], size: (u32, u32)) -> Result<(), DrawError> {
        let root = BitMapBackend::with_buffer(buf, size).into_drawing_area();
        draw_speedup(c, &root, &[])?;
        root.present().map_err(e)
    }

    fn draw_speedup(
        c: &Comparison,
        root: &Area<'_>,
        predicted: &[(String, Vec<(u32, f64)>)],
    ) -> Result<(), DrawError> {
        let mut nodes: Vec<u32> = c.runs.iter().map(|r| r.nodes).collect();
        nodes.dedup();
        root.fill(&WHITE).map_err(e)?;
        let mut series: Vec<Series> = Vec::new();
        let base = nodes.first().copied().unwrap_or(1);
        series.push(Series {
            name: "ideal".into(),
            colour: RGBColor(150, 150, 150),
            dashed: true,
            legend: true,
            points: nodes
                .iter()
                .enumerate()
                .map(|(i, n)| (i, f64::from(*n) / f64::from(base), 0.0))
                .collect(),
        });
        for (k, r) in c.rows.iter().take(8).enumerate() {
            if let Some((_, line)) = predicted.iter().find(|(t, _)| *t == r.test) {
                series.push(Series {
                    name: String::new(),
                    colour: PALETTE[k % PALETTE.len()],
                    dashed: true,
                    legend: false,
                    points: line
                        .iter()
                        .filter_map(|(n, s)| Some((nodes.iter().position(|x| x == n)?, *s, 0.0)))
                        .collect(),
                });
            }
            series.push(Series {
                name: r.test.clone(),
                colour: PALETTE[k % PALETTE.len()],
                dashed: false,
                legend: true,
                points: r
                    .points
                    .iter()
                    .filter_map(|p| {
                        let i = nodes.iter().position(|n| *n == c.runs[p.run].nodes)?;
                        p.speedup.map(|s| (i, s, p.speedup_sd.unwrap_or(0.0)))
                    })
                    .collect(),
            });
        }
        if !predicted.is_empty() {
            series.push(Series {
                name: "dashed: predicted (plan)".into(),
                colour: RGBColor(60, 60, 60),
                dashed: true,
                legend: true,
                points: Vec::new(),
            });
        }
        let xl: Vec<String> = nodes.iter().map(|n| n.to_string()).collect();
        panel(
            root,
            (0, 0),
            "speed-up over the fewest nodes",
            &xl,
            "nodes",
            "speed-up",
            &series,
            Some(1.0),
        )?;
        if c.rows.len() > 8 {
            draw_text(
                root,
                &format!("(first 8 of {} tests)", c.rows.len()),
                (10, PH + 14),
                PX,
                false,
                &BLACK,
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::{Api, ServerInfo};
    use crate::metrics::RunFigures;
    use crate::report::{Context, Overhead, SCHEMA};

    /// A run of `nodes` whose pp512 and tg64 figures are `pp` and `tg` (one value per run).
    fn run(nodes: u32, model: &str, pp: &[f64], tg: &[f64]) -> RunReport {
        let runs: Vec<RunFigures> = pp
            .iter()
            .zip(tg)
            .map(|(&p, &t)| RunFigures {
                pp_tps: Some(p),
                tg_tps: Some(t),
                ..Default::default()
            })
            .collect();
        RunReport {
            schema: SCHEMA,
            context: Context {
                endpoint: "http://127.0.0.1:1/v1".into(),
                api: Api::Chat,
                model: model.into(),
                server: ServerInfo::default(),
                date: "2026-12-03T00:00:00Z".into(),
                weft_version: "test".into(),
                nodes: Some(nodes),
                layout: None,
                label: None,
                nccl_transport: None,
                latency_mode: "none".into(),
                latency_ms: 0.0,
                template_overhead: Overhead::default(),
                counting: "usage".into(),
                prompt_time_from: "first-content".into(),
                tokenizer: None,
                text: "built-in word list".into(),
                prefix_cache: false,
                runs: runs.len() as u32,
            },
            results: vec![TestResult::new(512, 64, 0, 1, Phase::Cold, runs)],
            warnings: Vec::new(),
            failure: None,
        }
    }

    fn inputs(v: Vec<(&str, RunReport)>) -> Vec<(PathBuf, RunReport)> {
        v.into_iter().map(|(f, r)| (PathBuf::from(f), r)).collect()
    }

    /// `--pp 512,2048 --tg 128` in one run: the two `tg128` tests (after different prompts)
    /// are two rows of one run, not two runs of one row (the H200 validation's compare read
    /// the second as a 1.31x speed-up at 131 % efficiency).
    #[test]
    fn repeated_names_in_one_run_are_separate_rows() {
        let mut one = run(1, "m", &[1000.0], &[20.0]);
        let f = |tg| RunFigures {
            pp_tps: Some(4000.0),
            tg_tps: Some(tg),
            ..Default::default()
        };
        one.results = vec![
            TestResult::new(512, 128, 0, 1, Phase::Cold, vec![f(15.0)]),
            TestResult::new(2048, 128, 0, 1, Phase::Cold, vec![f(19.0)]),
        ];
        let c = compare(&inputs(vec![("a.json", one)])).unwrap();
        let names: Vec<&str> = c.rows.iter().map(|r| r.test.as_str()).collect();
        assert_eq!(
            names,
            ["pp512", "pp2048", "tg128 after pp512", "tg128 after pp2048"],
            "{names:?}"
        );
        assert!(c.rows.iter().all(|r| r.points.len() == 1), "{:?}", c.rows);
        assert!(
            c.warnings.iter().all(|w| !w.contains("efficiency")),
            "{:?}",
            c.warnings
        );
    }

    #[test]
    fn two_runs_of_one_node_count_are_not_a_scaling_series() {
        let c = compare(&inputs(vec![
            ("a.json", run(1, "m1", &[1000.0, 1010.0], &[50.0, 51.0])),
            ("b.json", run(1, "m2", &[2290.0, 2300.0], &[60.0, 61.0])),
        ]))
        .unwrap();
        let w = c.warnings.join("\n");
        assert!(
            w.contains("a.json and b.json both measured 1 node")
                && w.contains("not two points of a scaling series"),
            "{w}"
        );
        assert!(w.contains("different models (m1, m2)"), "{w}");
        // And the 229 % on "1 node" is flagged as impossible.
        assert!(
            w.contains("pp512 on 1 node: 228 % efficiency per node"),
            "{w}"
        );
    }

    #[test]
    fn impossible_efficiency_and_a_large_spread_are_warned_and_sound_runs_are_not() {
        let c = compare(&inputs(vec![
            ("1n.json", run(1, "m", &[1000.0, 1000.0], &[50.0, 52.0])),
            ("2n.json", run(2, "m", &[3400.0, 3400.0], &[70.0, 130.0])),
        ]))
        .unwrap();
        let w = c.warnings.join("\n");
        assert!(
            w.contains("pp512 on 2 nodes: 170 % efficiency per node"),
            "{w}"
        );
        assert!(w.contains("tg64 on 2 nodes: its 2 runs spread 42 %"), "{w}");
        let tg = c.rows.iter().find(|r| r.test == "tg64").unwrap();
        let sd = tg.points[1].speedup_sd.unwrap();
        assert!(sd > 0.5 && sd < 0.9, "{sd}");
        assert!(c.markdown().contains("± "), "{}", c.markdown());
        // Sound runs: no warning.
        let ok = compare(&inputs(vec![
            ("1n.json", run(1, "m", &[1000.0, 1010.0], &[50.0, 51.0])),
            ("2n.json", run(2, "m", &[1900.0, 1950.0], &[90.0, 92.0])),
        ]))
        .unwrap();
        assert!(ok.warnings.is_empty(), "{:?}", ok.warnings);
    }

    /// The PNGs' text is the built-in TrueType font (anti-aliased: grey pixels between ink
    /// and paper, which a bitmap font never draws), and the error bars are there. Set
    /// `WEFT_LLM_PLOTS=DIR` to keep them and look.
    #[test]
    fn plots_draw_text_with_the_ttf_and_error_bars() {
        let c = compare(&inputs(vec![
            ("1n.json", run(1, "m", &[1000.0, 1100.0], &[50.0, 58.0])),
            ("2n.json", run(2, "m", &[1900.0, 2150.0], &[90.0, 110.0])),
            ("4n.json", run(4, "m", &[3500.0, 3900.0], &[150.0, 200.0])),
        ]))
        .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let keep = std::env::var("WEFT_LLM_PLOTS").map(PathBuf::from);
        let at = keep.as_deref().unwrap_or(dir.path()).join("unit");
        let plots = c.plots(&at).unwrap();
        for p in &plots {
            let b = std::fs::read(p).unwrap();
            assert!(
                b.starts_with(b"\x89PNG") && b.len() > 2000,
                "{}",
                p.display()
            );
        }
        // The speed-up panel in memory: anti-aliased grey text pixels.
        let (w, h) = (plot::PW as u32, (plot::PH + 40) as u32);
        let mut buf = vec![0u8; (w * h * 3) as usize];
        plot::speedup_into(&c, &mut buf, (w, h)).unwrap();
        let greys = buf
            .chunks(3)
            .filter(|p| p[0] == p[1] && p[1] == p[2] && p[0] > 40 && p[0] < 200)
            .count();
        assert!(greys > 100, "{greys} grey pixels: no anti-aliased text");
    }
}
