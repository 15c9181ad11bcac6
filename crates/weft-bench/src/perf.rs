//! The nccl-tests driver: sizes, warm-up, timed iterations, checking, bus bandwidth, and the
//! output nccl-tests users already read (its table, its footer), plus CSV and JSON.

use std::fmt::Write as _;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::BenchError;
use crate::comm::{Algo, Buf, Coll, Comm};
use crate::dtype::{DataType, Expect, RedOp, count_wrong, fill};

/// How per-rank times combine into the reported time (nccl-tests' `-a`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Average {
    Rank0,
    Avg,
    Min,
    Max,
}

impl Average {
    /// From nccl-tests' `-a` number (0 rank 0, 1 average, 2 min, 3 max).
    pub fn from_flag(a: u8) -> Option<Average> {
        [Average::Rank0, Average::Avg, Average::Min, Average::Max]
            .get(usize::from(a))
            .copied()
    }
}

/// What to run.
#[derive(Debug, Clone)]
pub struct PerfOptions {
    pub colls: Vec<Coll>,
    pub types: Vec<DataType>,
    pub ops: Vec<RedOp>,
    pub min_bytes: usize,
    pub max_bytes: usize,
    /// Multiply by this between sizes (`-f`), unless `step_bytes` is set.
    pub step_factor: f64,
    /// Add this between sizes (`-i`); 0: use the factor.
    pub step_bytes: usize,
    pub iters: usize,
    pub warmup: usize,
    /// Check results (`-c`): the number of checked runs per size (0: no check, `#wrong` N/A).
    pub check: usize,
    pub root: usize,
    pub algo: Algo,
    pub average: Average,
    /// Time every iteration (nccl-tests' `-I 1`): per-iteration statistics in the table and
    /// every rank's times in the JSON (`per_process_max_times_us`).
    pub per_iter: bool,
}

impl Default for PerfOptions {
    fn default() -> Self {
        PerfOptions {
            colls: vec![Coll::AllReduce],
            types: vec![DataType::F32],
            ops: vec![RedOp::Sum],
            min_bytes: 32 << 20,
            max_bytes: 32 << 20,
            step_factor: 2.0,
            step_bytes: 0,
            iters: 20,
            warmup: 1,
            check: 1,
            root: 0,
            algo: Algo::Ring,
            average: Average::Avg,
            per_iter: false,
        }
    }
}

impl PerfOptions {
    /// The sizes, from `min_bytes` to `max_bytes`.
    pub fn sizes(&self) -> Vec<usize> {
        let mut v = Vec::new();
        let mut s = self.min_bytes;
        while s <= self.max_bytes {
            v.push(s);
            let next = if self.step_bytes > 0 {
                s + self.step_bytes
            } else {
                ((s as f64) * self.step_factor) as usize
            };
            if next <= s {
                break;
            }
            s = next;
        }
        v
    }

    /// Number of table rows a run produces.
    pub fn rows(&self) -> usize {
        let mut n = 0;
        for c in &self.colls {
            let ops = if c.reduces() { self.ops.len() } else { 1 };
            n += ops * self.types.len() * self.sizes().len();
        }
        n
    }
}

/// Time and bandwidth of one variant (out-of-place or in-place).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
pub struct Measure {
    /// Microseconds per call.
    pub time_us: f64,
    /// GB/s (1e9 B/s).
    pub algbw: f64,
    pub busbw: f64,
    /// Wrong elements over all ranks; `None` when not checked.
    pub wrong: Option<u64>,
}

/// Every iteration's time of one variant (`-I 1`), microseconds.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct PerIter {
    /// Per iteration, the largest time over the ranks.
    pub times_us: Vec<f64>,
    /// Per rank (in rank order), its time of every iteration.
    pub per_rank_us: Vec<Vec<f64>>,
}

/// nccl-tests' per-iteration statistics (`computeIterStats`), microseconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct IterStats {
    pub min: f64,
    pub max: f64,
    pub avg: f64,
    pub p50: f64,
    pub p95: f64,
    pub p99: f64,
    pub stdev: f64,
}

impl IterStats {
    /// Statistics of `times` as nccl-tests computes them: sorted, p50 the element at n/2,
    /// pXX at `min(n-1, ceil(n*XX/100)-1)`, the population standard deviation.
    pub fn of(times: &[f64]) -> Option<IterStats> {
        if times.is_empty() {
            return None;
        }
        let mut v = times.to_vec();
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let pct = |p: usize| v[(n * p).div_ceil(100).saturating_sub(1).min(n - 1)];
        let avg = v.iter().sum::<f64>() / n as f64;
        let var = v.iter().map(|x| (x - avg) * (x - avg)).sum::<f64>() / n as f64;
        Some(IterStats {
            min: v[0],
            max: v[n - 1],
            avg,
            p50: v[n / 2],
            p95: pct(95),
            p99: pct(99),
            stdev: var.sqrt(),
        })
    }

    /// Coefficient of variation, percent.
    pub fn cv_pct(&self) -> f64 {
        if self.avg > 0.0 {
            self.stdev / self.avg * 100.0
        } else {
            0.0
        }
    }
}

/// One table row.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Row {
    pub collective: Coll,
    pub size: usize,
    pub count: usize,
    #[serde(rename = "type")]
    pub dtype: DataType,
    pub redop: Option<RedOp>,
    /// -1 for rootless collectives, as nccl-tests prints.
    pub root: i64,
    pub out_of_place: Measure,
    pub in_place: Measure,
    /// Every iteration's time, with `-I 1`: out-of-place, in-place.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_iter: Option<[PerIter; 2]>,
}

/// A whole run.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Report {
    pub nranks: usize,
    pub algo: Algo,
    pub rows: Vec<Row>,
    /// Mean bus bandwidth over all rows and both variants (nccl-tests' footer).
    pub avg_busbw: f64,
    /// Wrong elements in total.
    pub wrong: u64,
}

/// Expected contents of this rank's output after `coll`, as (byte offset in B, count, what).
#[allow(clippy::too_many_arguments)]
fn expectations(
    coll: Coll,
    dt: DataType,
    op: RedOp,
    n: usize,
    rank: usize,
    root: usize,
    count: usize,
    in_place: bool,
) -> Vec<(usize, usize, Expect)> {
    let es = dt.size();
    match coll {
        Coll::AllReduce => vec![(
            0,
            count,
            Expect::Reduced {
                op,
                nranks: n,
                first: 0,
            },
        )],
        Coll::Reduce if rank == root => {
            vec![(
                0,
                count,
                Expect::Reduced {
                    op,
                    nranks: n,
                    first: 0,
                },
            )]
        }
        Coll::Reduce => vec![],
        // In place, this rank's piece stays where it was in the input (nccl-tests' convention).
        Coll::ReduceScatter => vec![(
            if in_place { rank * count * es } else { 0 },
            count,
            Expect::Reduced {
                op,
                nranks: n,
                first: rank * count,
            },
        )],
        Coll::AllGather => (0..n)
            .map(|p| {
                (
                    p * count * es,
                    count,
                    Expect::Input {
                        rank: p,
                        first: 0,
                        op: None,
                    },
                )
            })
            .collect(),
        Coll::Broadcast => vec![(
            0,
            count,
            Expect::Input {
                rank: root,
                first: 0,
                op: None,
            },
        )],
        Coll::AllToAll => (0..n)
            .map(|p| {
                (
                    p * count * es,
                    count,
                    Expect::Input {
                        rank: p,
                        first: rank * count,
                        op: None,
                    },
                )
            })
            .collect(),
        Coll::SendRecv => vec![(
            0,
            count,
            Expect::Input {
                rank: (rank + n - 1) % n,
                first: 0,
                op: None,
            },
        )],
    }
}

/// Writes this rank's input where `coll` expects it.
fn prepare(comm: &mut Comm, coll: Coll, dt: DataType, op: RedOp, count: usize, in_place: bool) {
    let (n, r, es) = (comm.nranks(), comm.rank(), dt.size());
    let fop = coll.reduces().then_some(op);
    let total = if coll.per_rank_pieces() {
        count * n
    } else {
        count
    };
    let (buf, off, elems) = match (coll, in_place) {
        (Coll::AllGather, true) => (Buf::B, r * count * es, count),
        (Coll::AllGather, false) => (Buf::A, 0, count),
        (_, true) => (Buf::B, 0, total),
        (_, false) => (Buf::A, 0, total),
    };
    fill(dt, fop, r, 0, comm.slice(buf, off, elems * es));
    if !in_place {
        // Poison the output so a collective that forgets to write it is caught.
        let out = if coll.per_rank_pieces() && coll != Coll::ReduceScatter {
            count * n
        } else {
            count
        };
        comm.slice(Buf::B, 0, out * es).fill(0xA5);
    }
}

#[allow(clippy::too_many_arguments)]
fn check(
    comm: &mut Comm,
    coll: Coll,
    dt: DataType,
    op: RedOp,
    root: usize,
    count: usize,
    in_place: bool,
) -> u64 {
    let (n, r, es) = (comm.nranks(), comm.rank(), dt.size());
    expectations(coll, dt, op, n, r, root, count, in_place)
        .into_iter()
        .map(|(off, cnt, e)| count_wrong(dt, comm.slice(Buf::B, off, cnt * es), e))
        .sum()
}

fn combine(times: &[f64], a: Average) -> f64 {
    match a {
        Average::Rank0 => times[0],
        Average::Avg => times.iter().sum::<f64>() / times.len() as f64,
        Average::Min => times.iter().copied().fold(f64::INFINITY, f64::min),
        Average::Max => times.iter().copied().fold(0.0, f64::max),
    }
}

/// Runs `opts` on every rank (all ranks call this with the same options); `progress(row,
/// done, total)` is called after each row. Every rank gets the same report.
pub fn run(
    comm: &mut Comm,
    opts: &PerfOptions,
    progress: &mut dyn FnMut(&Row, usize, usize),
) -> Result<Report, BenchError> {
    let n = comm.nranks();
    if opts.root >= n {
        return Err(BenchError::Usage(format!(
            "root {} with {n} ranks",
            opts.root
        )));
    }
    let sizes = opts.sizes();
    if sizes.is_empty() {
        return Err(BenchError::Usage(format!(
            "no sizes from {} to {}",
            opts.min_bytes, opts.max_bytes
        )));
    }
    let total = opts.rows();
    let mut rows = Vec::new();
    let mut done = 0;
    for &coll in &opts.colls {
        let ops: Vec<RedOp> = if coll.reduces() {
            opts.ops.clone()
        } else {
            vec![RedOp::Sum]
        };
        for &dt in &opts.types {
            for &op in &ops {
                // Warm up at the largest size, as nccl-tests does.
                let (_, wcount) = comm.shape(coll, dt, *sizes.last().unwrap_or(&0));
                for _ in 0..opts.warmup {
                    comm.run(coll, opts.algo, dt, op, opts.root, wcount, false)?;
                }
                for &size in &sizes {
                    let (bytes, count) = comm.shape(coll, dt, size);
                    let mut m = [None, None];
                    let mut iters: [Option<PerIter>; 2] = [None, None];
                    for (v, in_place) in [false, true].into_iter().enumerate() {
                        // -n 0 (only checking) times nothing and reports time 0.
                        let t = if opts.iters == 0 {
                            0.0
                        } else {
                            comm.bootstrap().barrier()?;
                            let mut each = Vec::with_capacity(opts.iters);
                            let t0 = Instant::now();
                            for _ in 0..opts.iters {
                                let ti = Instant::now();
                                comm.run(coll, opts.algo, dt, op, opts.root, count, in_place)?;
                                if opts.per_iter {
                                    each.push(ti.elapsed().as_secs_f64() * 1e6);
                                }
                            }
                            let t = t0.elapsed().as_secs_f64() / opts.iters as f64;
                            if opts.per_iter {
                                iters[v] = Some(gather_iters(comm, &each)?);
                            }
                            let times = comm.bootstrap().allgather_f64(t)?;
                            combine(&times, opts.average)
                        };
                        let wrong = if opts.check > 0 {
                            let mut w = 0;
                            for _ in 0..opts.check {
                                prepare(comm, coll, dt, op, count, in_place);
                                comm.run(coll, opts.algo, dt, op, opts.root, count, in_place)?;
                                w += check(comm, coll, dt, op, opts.root, count, in_place);
                            }
                            let all = comm.bootstrap().allgather_f64(w as f64)?;
                            Some(all.iter().sum::<f64>() as u64)
                        } else {
                            None
                        };
                        let algbw = if t > 0.0 { bytes as f64 / t / 1e9 } else { 0.0 };
                        m[v] = Some(Measure {
                            time_us: t * 1e6,
                            algbw,
                            busbw: algbw * coll.bus_factor(n),
                            wrong,
                        });
                    }
                    let [Some(oop), Some(ip)] = m else {
                        unreachable!("both variants measured")
                    };
                    let row = Row {
                        collective: coll,
                        size: bytes,
                        count,
                        dtype: dt,
                        redop: coll.reduces().then_some(op),
                        root: if coll.rooted() { opts.root as i64 } else { -1 },
                        out_of_place: oop,
                        in_place: ip,
                        per_iter: match iters {
                            [Some(a), Some(b)] => Some([a, b]),
                            _ => None,
                        },
                    };
                    done += 1;
                    progress(&row, done, total);
                    rows.push(row);
                }
            }
        }
    }
    let bws: Vec<f64> = rows
        .iter()
        .flat_map(|r| [r.out_of_place.busbw, r.in_place.busbw])
        .collect();
    let avg_busbw = bws.iter().sum::<f64>() / bws.len().max(1) as f64;
    let wrong = rows
        .iter()
        .flat_map(|r| [r.out_of_place.wrong, r.in_place.wrong])
        .flatten()
        .sum();
    Ok(Report {
        nranks: n,
        algo: opts.algo,
        rows,
        avg_busbw,
        wrong,
    })
}

/// Every rank's per-iteration times (`mine`, microseconds), and their maximum per iteration.
fn gather_iters(comm: &mut Comm, mine: &[f64]) -> Result<PerIter, BenchError> {
    let per_rank = comm.bootstrap().allgather_f64s(mine)?;
    let times_us = (0..mine.len())
        .map(|i| {
            per_rank
                .iter()
                .filter_map(|r| r.get(i).copied())
                .fold(0.0, f64::max)
        })
        .collect();
    Ok(PerIter {
        times_us,
        per_rank_us: per_rank,
    })
}

/// `value` in `width` characters as nccl-tests' `getFloatStr` writes it: two decimals, else
/// one, else none, else scientific notation.
pub fn float_str(value: f64, width: usize) -> String {
    for prec in [2, 1, 0] {
        let s = format!("{value:>width$.prec$}");
        if s.len() <= width {
            return s;
        }
    }
    let prec = usize::from(width >= 7);
    let e = format!("{value:.prec$e}");
    // C writes the exponent with a sign and at least two digits.
    let (m, x) = e.split_once('e').unwrap_or((&e, "0"));
    let x: i32 = x.parse().unwrap_or(0);
    format!(
        "{:>width$}",
        format!("{m}e{}{:02}", if x < 0 { '-' } else { '+' }, x.abs())
    )
}

/// `x` as C's `%g` writes it (six significant digits, no trailing zeros).
pub fn g_str(x: f64) -> String {
    if x == 0.0 || !x.is_finite() {
        return if x.is_finite() {
            "0".into()
        } else {
            format!("{x}")
        };
    }
    let exp = x.abs().log10().floor() as i32;
    let trim = |s: String| -> String {
        if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            s
        }
    };
    if (-4..6).contains(&exp) {
        let prec = usize::try_from(5 - exp).unwrap_or(0);
        trim(format!("{x:.prec$}"))
    } else {
        let e = format!("{x:.5e}");
        let (m, ex) = e.split_once('e').unwrap_or((&e, "0"));
        let ex: i32 = ex.parse().unwrap_or(0);
        format!(
            "{}e{}{:02}",
            trim(m.to_string()),
            if ex < 0 { '-' } else { '+' },
            ex.abs()
        )
    }
}

/// The column header, exactly as nccl-tests (2.19) prints it without per-iteration timing
/// or timestamps (each line ends in one space, as theirs does).
pub fn header() -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}           out-of-place                       in-place          ",
        "", "", "", "", ""
    );
    let _ = writeln!(
        s,
        "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6} ",
        "size",
        "count",
        "type",
        "redop",
        "root",
        "time",
        "algbw",
        "busbw",
        "#wrong",
        "time",
        "algbw",
        "busbw",
        "#wrong"
    );
    let _ = writeln!(
        s,
        "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6} ",
        "(B)",
        "(elements)",
        "",
        "",
        "",
        "(us)",
        "(GB/s)",
        "(GB/s)",
        "",
        "(us)",
        "(GB/s)",
        "(GB/s)",
        ""
    );
    s
}

/// The column header with `-I 1`, exactly as nccl-tests (2.19) prints it: four
/// per-iteration columns (i_min, i_max, i_p99 in us, i_cv%) after each variant.
pub fn header_per_iter() -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}              out-of-place (+ per-iteration)                                in-place (+ per-iteration)",
        "", "", "", "", ""
    );
    let line = |v: [&str; 21]| {
        let mut l = format!(
            "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}",
            v[0], v[1], v[2], v[3], v[4]
        );
        for half in [&v[5..13], &v[13..21]] {
            let _ = write!(
                l,
                "  {:>7}  {:>6}  {:>6}  {:>6}  {:>7}  {:>7}  {:>7}  {:>7}",
                half[0], half[1], half[2], half[3], half[4], half[5], half[6], half[7]
            );
        }
        l.push_str(" \n");
        l
    };
    s.push_str(&line([
        "size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "i_min",
        "i_max", "i_p99", "i_cv%", "time", "algbw", "busbw", "#wrong", "i_min", "i_max", "i_p99",
        "i_cv%",
    ]));
    s.push_str(&line([
        "(B)",
        "(elements)",
        "",
        "",
        "",
        "(us)",
        "(GB/s)",
        "(GB/s)",
        "",
        "(us)",
        "(us)",
        "(us)",
        "(%)",
        "(us)",
        "(GB/s)",
        "(GB/s)",
        "",
        "(us)",
        "(us)",
        "(us)",
        "(%)",
    ]));
    s
}

/// One row, as nccl-tests prints it: the size in bytes, the per-rank count in elements
/// (for all-gather, reduce-scatter and all-to-all the count each rank contributes), then
/// time, algbw, busbw and #wrong for each variant.
pub fn format_row(r: &Row) -> String {
    let mut s = format!(
        "{:>12}  {:>12}  {:>8}  {:>6}  {:>6}",
        r.size,
        r.count,
        r.dtype.name(),
        r.redop.map_or("none", |o| o.name()),
        r.root
    );
    for (v, m) in [&r.out_of_place, &r.in_place].into_iter().enumerate() {
        let _ = write!(
            s,
            "  {:>7}  {:>6}  {:>6}",
            float_str(m.time_us, 7),
            float_str(m.algbw, 6),
            float_str(m.busbw, 6),
        );
        match m.wrong {
            Some(w) => {
                let _ = write!(s, "  {:>6}", g_str(w as f64));
            }
            None => s.push_str("    N/A"),
        }
        // With -I 1, nccl-tests' writePerIterReport: min, max, p99 (us) and the CV (%).
        if let Some(st) = r
            .per_iter
            .as_ref()
            .and_then(|p| IterStats::of(&p[v].times_us))
        {
            let _ = write!(
                s,
                "  {:>7}  {:>7}  {:>7}  {:>7}",
                float_str(st.min, 7),
                float_str(st.max, 7),
                float_str(st.p99, 7),
                float_str(st.cv_pct(), 7)
            );
        }
    }
    s
}

/// One rank in the `# Using devices` block.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RankLine {
    pub rank: usize,
    pub pid: u32,
    pub host: String,
    /// The name the rank was started by (its `--hosts` entry); empty when started otherwise.
    #[serde(default)]
    pub name: String,
    pub dev: usize,
    /// What the rank runs on: the plugin device and the interfaces it uses.
    pub what: String,
}

/// nccl-tests' preamble: the test's name, the run's parameters and the `# Using devices`
/// block, one line per rank (weft's ranks have no GPU: the PCI field is `0000:00:00`, the
/// name says which plugin device and interfaces the rank uses).
pub fn preamble(test: &str, o: &PerfOptions, ranks: &[RankLine]) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "# Collective test starting: {test}");
    let (step, unit) = if o.step_bytes > 0 {
        (o.step_bytes.to_string(), "bytes")
    } else {
        (g_str(o.step_factor), "factor")
    };
    let _ = writeln!(
        s,
        "# nThread 1 nGpus 1 minBytes {} maxBytes {} step: {step}({unit}) warmup iters: {} iters: {} agg iters: 1 validation: {} graph: 0 unalign: 0",
        o.min_bytes, o.max_bytes, o.warmup, o.iters, o.check
    );
    if o.per_iter {
        // nccl-tests says "CUDA event timing"; weft times each call on the host clock.
        s.push_str(
            "# Per-Iteration Report: host clock per call; i_* uses max over process rows \n",
        );
    }
    s.push_str("#\n# Using devices\n");
    for r in ranks {
        let _ = writeln!(
            s,
            "#  Rank {:>2} Group {:>2} Pid {:>6} on {:>10} device {:>2} [0000:00:00] {}",
            r.rank, 0, r.pid, r.host, r.dev, r.what
        );
    }
    s.push_str("#\n");
    s
}

/// The footer of one collective's rows, as nccl-tests prints it; with `min_bw`, `OK` or
/// `FAILED` after the average (failing below 90% of it, as nccl-tests' `check_avg_bw`).
pub fn footer_of(rows: &[&Row], test: &str, min_bw: Option<f64>) -> String {
    let wrong: u64 = rows
        .iter()
        .flat_map(|r| [r.out_of_place.wrong, r.in_place.wrong])
        .flatten()
        .sum();
    let bws: Vec<f64> = rows
        .iter()
        .flat_map(|r| [r.out_of_place.busbw, r.in_place.busbw])
        .collect();
    let avg = if bws.is_empty() {
        0.0
    } else {
        bws.iter().sum::<f64>() / bws.len() as f64
    };
    let verdict = match min_bw {
        None => "",
        Some(m) if avg < m * 0.9 => "FAILED",
        Some(_) => "OK",
    };
    format!(
        "# {:<20} : {} {}\n# {:<20} : {} {verdict}\n#\n# Collective test concluded: {test}\n",
        "Out of bounds values",
        wrong,
        if wrong == 0 { "OK" } else { "FAILED" },
        "Avg bus bandwidth",
        g_str(avg),
    )
}

/// The footer over every row of `rep`, as nccl-tests prints it.
pub fn footer(rep: &Report, test: &str) -> String {
    let rows: Vec<&Row> = rep.rows.iter().collect();
    footer_of(&rows, test, None)
}

/// What nccl-tests' JSON output (`-J FILE.json`) records besides the rows.
#[derive(Debug, Clone)]
pub struct JsonContext<'a> {
    /// The command line.
    pub args: &'a [String],
    /// The environment recorded (weft keeps only `WEFT_*` and `NCCL_*`), as `K=V`.
    pub env: &'a [String],
    /// `YYYY-MM-DD HH:MM:SS`, local time, as nccl-tests writes it.
    pub start_time: &'a str,
    pub end_time: &'a str,
    /// `--min-bw` (nccl-tests' `NCCL_TESTS_MIN_BW`).
    pub min_bw: Option<f64>,
}

/// One collective's rows as nccl-tests' JSON output (format version 3, `src/util.cu`): the
/// same keys, nesting and value types (booleans written as the strings `"true"`/`"false"`,
/// the root as its `%6i` text, `nwrong` a number or null), so that nccl-tests' own tools
/// (`tools/analyze_perf_json.py`) read it. `nccl_version` is 0: no NCCL is involved.
pub fn nccl_tests_json(
    o: &PerfOptions,
    ranks: &[RankLine],
    rows: &[&Row],
    cx: &JsonContext<'_>,
) -> serde_json::Value {
    use serde_json::{Value, json};
    let tf = |b: bool| Value::from(if b { "true" } else { "false" });
    let mut config = json!({
        "nthreads": 1,
        "ngpus": 1,
        "minimum_bytes": o.min_bytes,
        "maximum_bytes": o.max_bytes,
        "warmup_iters": o.warmup,
        "iterations": o.iters,
        "aggregated_iterations": 1,
        "validation": o.check,
        "graph": 0,
        "blocking_collectives": tf(false),
        "per_iter_timing": tf(o.per_iter),
        "per_iter_skip": 0,
        "parallel_init": tf(false),
        "devices": ranks.iter().map(|r| json!({
            "rank": r.rank,
            "group": 0,
            "pid": r.pid,
            "hostname": r.host,
            "device": r.dev,
            "device_hex": "0000:00:00",
            "device_info": r.what,
        })).collect::<Vec<_>>(),
    });
    if o.step_bytes > 0 {
        config["step_bytes"] = json!(o.step_bytes);
    } else {
        // nccl-tests writes the factor as an integer (%zu of a size_t).
        config["step_factor"] = json!(o.step_factor as u64);
    }
    let variant = |m: &Measure| {
        json!({
            "time": m.time_us,
            "alg_bw": m.algbw,
            "bus_bw": m.busbw,
            "nwrong": m.wrong.map(|w| w as f64),
        })
    };
    let per_iter = |p: &PerIter| {
        let st = IterStats::of(&p.times_us);
        let f = |g: fn(&IterStats) -> f64| st.as_ref().map_or(0.0, g);
        let mut v = json!({
            "skipped_iterations": 0,
            "min_us": f(|s| s.min),
            "max_us": f(|s| s.max),
            "avg_us": f(|s| s.avg),
            "p50_us": f(|s| s.p50),
            "p95_us": f(|s| s.p95),
            "p99_us": f(|s| s.p99),
            "stdev_us": f(|s| s.stdev),
            "cv_pct": f(IterStats::cv_pct),
            "times_us": p.times_us,
        });
        if p.per_rank_us.len() > 1 {
            v["per_process_max_times_us"] = json!(p.per_rank_us);
        }
        v
    };
    let results: Vec<Value> = rows
        .iter()
        .map(|r| {
            let mut v = json!({
                "size": r.size,
                "count": r.count,
                "type": r.dtype.name(),
                "redop": r.redop.map_or("none", |o| o.name()),
                "root": format!("{:>6}", r.root),
                "out_of_place": variant(&r.out_of_place),
                "in_place": variant(&r.in_place),
                "actual_iterations": o.iters,
                "experiment_name": "",
            });
            if let Some([a, b]) = &r.per_iter {
                v["out_of_place_per_iter"] = per_iter(a);
                v["in_place_per_iter"] = per_iter(b);
            }
            v
        })
        .collect();
    let wrong: u64 = rows
        .iter()
        .flat_map(|r| [r.out_of_place.wrong, r.in_place.wrong])
        .flatten()
        .sum();
    let bws: Vec<f64> = rows
        .iter()
        .flat_map(|r| [r.out_of_place.busbw, r.in_place.busbw])
        .collect();
    let avg = bws.iter().sum::<f64>() / bws.len().max(1) as f64;
    json!({
        "version": 3,
        "start_time": cx.start_time,
        "args": cx.args,
        "env": cx.env,
        "nccl_version": 0,
        "config": config,
        "results": results,
        "out_of_bounds": { "count": wrong, "okay": tf(wrong == 0) },
        "average_bus_bandwidth": {
            "bandwidth": avg,
            "okay": cx.min_bw.map_or(Value::from("unchecked"), |m| tf(avg >= m * 0.9)),
        },
        "errors": [],
        "end_time": cx.end_time,
    })
}

/// The local time as nccl-tests writes it (`%Y-%m-%d %H:%M:%S`).
pub fn local_time_string() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs()) as libc::time_t;
    // SAFETY: a zeroed `tm` is a valid out parameter; localtime_r writes only into it.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    // SAFETY: both pointers are live for the call.
    let r = unsafe { libc::localtime_r(&now, &mut tm) };
    if r.is_null() {
        return String::new();
    }
    format!(
        "{:04}-{:02}-{:02} {:02}:{:02}:{:02}",
        tm.tm_year + 1900,
        tm.tm_mon + 1,
        tm.tm_mday,
        tm.tm_hour,
        tm.tm_min,
        tm.tm_sec
    )
}

/// Where nccl-tests would write `-J PATH`: PATH if it does not exist yet, else the first free
/// `PATH.0`, `PATH.1`, ... (it never overwrites a result).
pub fn free_json_path(path: &std::path::Path) -> std::path::PathBuf {
    if !path.exists() {
        return path.to_path_buf();
    }
    (0..)
        .map(|i| std::path::PathBuf::from(format!("{}.{i}", path.display())))
        .find(|p| !p.exists())
        .unwrap_or_else(|| path.to_path_buf())
}

fn fmt_wrong(w: Option<u64>) -> String {
    w.map_or_else(|| "N/A".to_string(), |w| w.to_string())
}

/// The whole report as CSV: one line per row, both variants as columns.
pub fn to_csv(rep: &Report) -> Result<String, BenchError> {
    let mut w = csv::Writer::from_writer(Vec::new());
    let csv_err = |e: csv::Error| BenchError::Usage(format!("csv: {e}"));
    w.write_record([
        "collective",
        "size",
        "count",
        "type",
        "redop",
        "root",
        "oop_time_us",
        "oop_algbw",
        "oop_busbw",
        "oop_wrong",
        "ip_time_us",
        "ip_algbw",
        "ip_busbw",
        "ip_wrong",
    ])
    .map_err(csv_err)?;
    for r in &rep.rows {
        let mut rec = vec![
            r.collective.name().to_string(),
            r.size.to_string(),
            r.count.to_string(),
            r.dtype.name().to_string(),
            r.redop.map_or("none", |o| o.name()).to_string(),
            r.root.to_string(),
        ];
        for m in [&r.out_of_place, &r.in_place] {
            rec.push(format!("{:.3}", m.time_us));
            rec.push(format!("{:.4}", m.algbw));
            rec.push(format!("{:.4}", m.busbw));
            rec.push(fmt_wrong(m.wrong));
        }
        w.write_record(&rec).map_err(csv_err)?;
    }
    let bytes = w
        .into_inner()
        .map_err(|e| BenchError::Usage(format!("csv: {e}")))?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_follow_factor_and_step() {
        let o = PerfOptions {
            min_bytes: 8,
            max_bytes: 128,
            ..PerfOptions::default()
        };
        assert_eq!(o.sizes(), [8, 16, 32, 64, 128]);
        let o = PerfOptions {
            min_bytes: 100,
            max_bytes: 350,
            step_bytes: 100,
            ..PerfOptions::default()
        };
        assert_eq!(o.sizes(), [100, 200, 300]);
    }

    #[test]
    fn bus_bandwidth_factors_are_nccl_tests() {
        assert_eq!(Coll::AllReduce.bus_factor(4), 1.5);
        assert_eq!(Coll::AllGather.bus_factor(4), 0.75);
        assert_eq!(Coll::ReduceScatter.bus_factor(8), 0.875);
        assert_eq!(Coll::AllToAll.bus_factor(2), 0.5);
        assert_eq!(Coll::Broadcast.bus_factor(8), 1.0);
        assert_eq!(Coll::SendRecv.bus_factor(3), 1.0);
    }

    #[test]
    fn rows_line_up_under_the_header() {
        let m = Measure {
            time_us: 1234.5,
            algbw: 1.5,
            busbw: 2.25,
            wrong: Some(0),
        };
        let r = Row {
            collective: Coll::AllReduce,
            size: 8388608,
            count: 2097152,
            dtype: DataType::F32,
            redop: Some(RedOp::Sum),
            root: -1,
            out_of_place: m,
            in_place: m,
            per_iter: None,
        };
        let h = header();
        let cols = h.lines().nth(1).unwrap_or_default();
        // nccl-tests' header lines, byte for byte (each ends in spaces, as theirs does).
        let want = [
            "#                                                              out-of-place                       in-place          ",
            "#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   busbw  #wrong ",
            "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)             (us)  (GB/s)  (GB/s)         ",
        ];
        assert_eq!(h.lines().collect::<Vec<_>>(), want);
        let row = format_row(&r);
        assert_eq!(cols.len(), row.len() + 1, "\n{cols}\n{row}");
        // Each header word ends where its value ends.
        for word in ["size", "count", "type", "redop", "root"] {
            let end = cols.find(word).unwrap() + word.len();
            assert_ne!(row.as_bytes()[end - 1], b' ', "{word}\n{cols}\n{row}");
        }
        assert!(
            row.starts_with("     8388608       2097152     float     sum      -1"),
            "{row}"
        );
        assert!(row.ends_with("  1234.50    1.50    2.25       0"), "{row}");
        // nccl-tests' getFloatStr: fewer decimals, then scientific notation, to fit.
        assert_eq!(float_str(1234.567, 6), "1234.6");
        assert_eq!(float_str(123456.7, 6), "123457");
        assert_eq!(float_str(12345678.0, 6), " 1e+07");
        assert_eq!(float_str(12345678.0, 7), "1.2e+07");
        assert_eq!(g_str(0.0), "0");
        assert_eq!(g_str(12.5), "12.5");
        assert_eq!(g_str(1234567.0), "1.23457e+06");
        assert_eq!(g_str(0.000123), "0.000123");
        let f = footer_of(&[&r], "all_reduce_perf", None);
        assert_eq!(
            f,
            "# Out of bounds values : 0 OK\n# Avg bus bandwidth    : 2.25 \n#\n# Collective test concluded: all_reduce_perf\n"
        );
    }
}
