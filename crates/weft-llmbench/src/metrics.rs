//! From timed requests to figures: per request, per run (the requests sent together), and
//! mean and standard deviation over runs. Pure functions, no I/O.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Mean and sample standard deviation of a figure over runs.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Stat {
    pub mean: f64,
    pub sd: f64,
    /// Values it was made of.
    pub n: usize,
}

impl Stat {
    /// `None` for no values; sd is 0 for one value.
    pub fn of(v: &[f64]) -> Option<Stat> {
        let v: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
        if v.is_empty() {
            return None;
        }
        let n = v.len();
        let mean = v.iter().sum::<f64>() / n as f64;
        let sd = if n > 1 {
            (v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64).sqrt()
        } else {
            0.0
        };
        Some(Stat { mean, sd, n })
    }
}

/// The `q`-quantile (0..=1) of `v` by linear interpolation; `None` when empty.
pub fn quantile(v: &[f64], q: f64) -> Option<f64> {
    let mut s: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    if s.is_empty() {
        return None;
    }
    s.sort_by(f64::total_cmp);
    let pos = q.clamp(0.0, 1.0) * (s.len() - 1) as f64;
    let lo = pos.floor() as usize;
    let hi = pos.ceil() as usize;
    Some(s[lo] + (s[hi] - s[lo]) * (pos - lo as f64))
}

/// One request, reduced: times since the batch began (all requests of a run start together).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Request {
    /// Prompt tokens the server processed (its usage, less cached tokens).
    pub prompt_tokens: u64,
    /// Generated tokens.
    pub gen_tokens: u64,
    pub ttfr: Duration,
    pub ttft: Duration,
    pub e2e: Duration,
    /// Content chunks: arrival time and tokens in it.
    pub chunks: Vec<(Duration, u64)>,
}

impl Request {
    /// Generation speed: tokens after the first chunk over the time from the first to the
    /// last content chunk. `None` with fewer than two content chunks.
    pub fn tg_tps(&self) -> Option<f64> {
        let (first, last) = (self.chunks.first()?, self.chunks.last()?);
        let span = last.0.checked_sub(first.0)?.as_secs_f64();
        let toks = self.gen_tokens.saturating_sub(first.1);
        (span > 0.0 && toks > 0).then(|| toks as f64 / span)
    }

    /// Prompt-processing speed: prompt tokens over the estimated prompt time, which ends at
    /// the first chunk that carries generated text or tokens ([`Request::est_ppt`]).
    pub fn pp_tps(&self, latency: Duration) -> Option<f64> {
        tps(self.prompt_tokens, self.est_ppt(latency))
    }

    /// Time to the first chunk with generated text or tokens less the request latency: a
    /// server that sends a role-only chunk (or headers and a comment) before prefill has not
    /// processed the prompt by its first byte, one that sends the first token as its first
    /// byte gives the same time as [`Request::est_ppt_first_byte`].
    pub fn est_ppt(&self, latency: Duration) -> Duration {
        self.ttft.saturating_sub(latency)
    }

    /// llama-benchy's prompt speed: prompt tokens over the time to the first response byte
    /// less the latency. Kept beside [`Request::pp_tps`] so the two tools can be set side by
    /// side; meaningless on a server whose first byte comes before prefill.
    pub fn pp_tps_first_byte(&self, latency: Duration) -> Option<f64> {
        tps(self.prompt_tokens, self.est_ppt_first_byte(latency))
    }

    /// Time to first response byte less the request latency (llama-benchy's `est_ppt`).
    pub fn est_ppt_first_byte(&self, latency: Duration) -> Duration {
        self.ttfr.saturating_sub(latency)
    }

    /// Time per output token after the first: (e2e - ttft) / (tokens - 1).
    pub fn tpot(&self) -> Option<Duration> {
        let n = self.gen_tokens.checked_sub(1).filter(|n| *n > 0)?;
        Some(self.e2e.saturating_sub(self.ttft) / n as u32)
    }

    /// Inter-token latencies: a chunk of `k` tokens that came `g` after the previous one gives
    /// `k` latencies of `g / k`.
    pub fn itls(&self) -> Vec<f64> {
        let mut v = Vec::new();
        for w in self.chunks.windows(2) {
            let g = w[1].0.saturating_sub(w[0].0).as_secs_f64();
            let k = w[1].1.max(1);
            v.extend(std::iter::repeat_n(g / k as f64, k as usize));
        }
        v
    }
}

fn tps(tokens: u64, t: Duration) -> Option<f64> {
    let t = t.as_secs_f64();
    (t > 0.0 && tokens > 0).then(|| tokens as f64 / t)
}

/// The most tokens in any window of `window` (or of the whole generation when it is
/// shorter), per second, across all requests of a run.
pub fn peak_tps(reqs: &[Request], window: Duration) -> Option<f64> {
    let mut ev: Vec<(Duration, u64)> = reqs.iter().flat_map(|r| r.chunks.iter().copied()).collect();
    if ev.len() < 2 {
        return None;
    }
    ev.sort();
    let span = ev[ev.len() - 1].0 - ev[0].0;
    let w = window.min(span);
    if w.is_zero() {
        return None;
    }
    // Tokens in (end - w, end]: a chunk at the window's start was made before it.
    let (mut best, mut sum, mut lo) = (0u64, 0u64, 0usize);
    for hi in 0..ev.len() {
        sum += ev[hi].1;
        while ev[hi].0 - ev[lo].0 >= w {
            sum -= ev[lo].1;
            lo += 1;
        }
        best = best.max(sum);
    }
    Some(best as f64 / w.as_secs_f64())
}

/// Figures of one run (the requests sent together).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunFigures {
    /// Per-request means.
    pub pp_tps: Option<f64>,
    pub tg_tps: Option<f64>,
    pub ttfr_ms: f64,
    /// From the request to its first chunk with text or tokens, less latency.
    pub est_ppt_ms: f64,
    /// llama-benchy's figures: prompt time up to the first byte, less latency, and the
    /// prompt speed from it.
    pub pp_tps_first_byte: Option<f64>,
    pub est_ppt_first_byte_ms: f64,
    pub e2e_ttft_ms: f64,
    pub e2e_ms: f64,
    pub peak_tps: Option<f64>,
    /// All requests together: prompt tokens over the time until the last first content
    /// chunk (less latency); generated tokens over the time from the first to the last content chunk.
    pub pp_tps_total: Option<f64>,
    pub tg_tps_total: Option<f64>,
    pub itl_ms: Percentiles,
    pub tpot_ms: Percentiles,
    pub prompt_tokens: f64,
    pub gen_tokens: f64,
}

/// p50, p90, p99 in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Percentiles {
    pub p50: Option<f64>,
    pub p90: Option<f64>,
    pub p99: Option<f64>,
}

impl Percentiles {
    pub fn of(v: &[f64]) -> Percentiles {
        Percentiles {
            p50: quantile(v, 0.5),
            p90: quantile(v, 0.9),
            p99: quantile(v, 0.99),
        }
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn mean(v: impl Iterator<Item = f64>) -> Option<f64> {
    let v: Vec<f64> = v.collect();
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

/// Reduces the requests of one run.
pub fn run_figures(reqs: &[Request], latency: Duration) -> RunFigures {
    let n = reqs.len().max(1) as f64;
    let itl: Vec<f64> = reqs
        .iter()
        .flat_map(|r| r.itls())
        .map(|s| s * 1e3)
        .collect();
    let tpot: Vec<f64> = reqs.iter().filter_map(|r| r.tpot()).map(ms).collect();
    let last_first = reqs.iter().map(|r| r.ttft).max().unwrap_or_default();
    let pp_total = reqs.iter().map(|r| r.prompt_tokens).sum::<u64>() as f64
        / last_first.saturating_sub(latency).as_secs_f64();
    let first_tok = reqs
        .iter()
        .filter_map(|r| r.chunks.first())
        .map(|c| c.0)
        .min();
    let last_tok = reqs
        .iter()
        .filter_map(|r| r.chunks.last())
        .map(|c| c.0)
        .max();
    let gen_after_first: u64 = reqs
        .iter()
        .map(|r| {
            r.gen_tokens
                .saturating_sub(r.chunks.first().map_or(0, |c| c.1))
        })
        .sum();
    let tg_total = match (first_tok, last_tok) {
        (Some(a), Some(b)) if b > a => Some(gen_after_first as f64 / (b - a).as_secs_f64()),
        _ => None,
    };
    RunFigures {
        pp_tps: mean(reqs.iter().filter_map(|r| r.pp_tps(latency))),
        tg_tps: mean(reqs.iter().filter_map(|r| r.tg_tps())),
        ttfr_ms: reqs.iter().map(|r| ms(r.ttfr)).sum::<f64>() / n,
        est_ppt_ms: reqs.iter().map(|r| ms(r.est_ppt(latency))).sum::<f64>() / n,
        pp_tps_first_byte: mean(reqs.iter().filter_map(|r| r.pp_tps_first_byte(latency))),
        est_ppt_first_byte_ms: reqs
            .iter()
            .map(|r| ms(r.est_ppt_first_byte(latency)))
            .sum::<f64>()
            / n,
        e2e_ttft_ms: reqs.iter().map(|r| ms(r.ttft)).sum::<f64>() / n,
        e2e_ms: reqs.iter().map(|r| ms(r.e2e)).sum::<f64>() / n,
        peak_tps: peak_tps(reqs, Duration::from_secs(1)),
        pp_tps_total: pp_total.is_finite().then_some(pp_total),
        tg_tps_total: tg_total,
        itl_ms: Percentiles::of(&itl),
        tpot_ms: Percentiles::of(&tpot),
        prompt_tokens: reqs.iter().map(|r| r.prompt_tokens as f64).sum::<f64>() / n,
        gen_tokens: reqs.iter().map(|r| r.gen_tokens as f64).sum::<f64>() / n,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms_(x: u64) -> Duration {
        Duration::from_millis(x)
    }

    #[test]
    fn stat_and_quantiles() {
        let s = Stat::of(&[2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0]).unwrap();
        assert_eq!(s.mean, 5.0);
        assert!((s.sd - 2.138).abs() < 1e-3, "{s:?}");
        assert_eq!(Stat::of(&[3.0]).unwrap().sd, 0.0);
        assert_eq!(Stat::of(&[]), None);
        assert_eq!(quantile(&[1.0, 2.0, 3.0, 4.0, 5.0], 0.5), Some(3.0));
        assert_eq!(quantile(&[1.0, 2.0], 0.99), Some(1.99));
    }

    #[test]
    fn a_chunk_of_several_tokens_counts_them_all() {
        // 1 token at 100 ms, then 3 tokens (speculative decoding) every 30 ms: 10 tokens.
        let r = Request {
            prompt_tokens: 500,
            gen_tokens: 10,
            ttfr: ms_(100),
            ttft: ms_(100),
            e2e: ms_(190),
            chunks: vec![(ms_(100), 1), (ms_(130), 3), (ms_(160), 3), (ms_(190), 3)],
        };
        assert!((r.tg_tps().unwrap() - 100.0).abs() < 1e-9); // 9 tokens in 90 ms
        assert!((r.pp_tps(ms_(50)).unwrap() - 10_000.0).abs() < 1e-6);
        assert_eq!(r.pp_tps(ms_(50)), r.pp_tps_first_byte(ms_(50)));
        assert_eq!(r.tpot(), Some(ms_(10)));
        let itl = r.itls();
        assert_eq!(itl.len(), 9);
        assert!(itl.iter().all(|x| (x - 0.010).abs() < 1e-12), "{itl:?}");
    }

    #[test]
    fn prompt_time_ends_at_the_first_token_not_the_first_byte() {
        // A role-only chunk at 1 ms, the first token after a 128 ms prefill of 512 tokens.
        let r = Request {
            prompt_tokens: 512,
            gen_tokens: 2,
            ttfr: ms_(1),
            ttft: ms_(128),
            e2e: ms_(138),
            chunks: vec![(ms_(128), 1), (ms_(138), 1)],
        };
        assert!((r.pp_tps(Duration::ZERO).unwrap() - 4000.0).abs() < 1e-6);
        assert!((r.pp_tps_first_byte(Duration::ZERO).unwrap() - 512_000.0).abs() < 1e-6);
        // The first byte less a latency longer than it: no llama-benchy figure at all.
        assert_eq!(r.pp_tps_first_byte(ms_(2)), None);
    }

    #[test]
    fn peak_counts_tokens_across_requests_in_the_window() {
        let a = Request {
            chunks: (0..=20).map(|i| (ms_(i * 100), 1)).collect(),
            ..Default::default()
        };
        let b = Request {
            chunks: (0..=20).map(|i| (ms_(1000 + i * 50), 1)).collect(),
            ..Default::default()
        };
        // From 1.0 to 2.0 s: a gives 10 tokens after 1.0, b gives 20.
        let p = peak_tps(&[a.clone(), b], Duration::from_secs(1)).unwrap();
        assert!((p - 30.0).abs() < 1e-9, "{p}");
        assert!((peak_tps(&[a], Duration::from_secs(1)).unwrap() - 10.0).abs() < 1e-9);
    }
}
