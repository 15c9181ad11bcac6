//! `--report-to`: the link measurements of `weft bench p2p`, `weft bench collectives` and
//! `weft doctor` sent to the controller (`POST /v1/link-results`), where the console shows
//! them and the metrics flag a slow link. The token is the usual one (`--token`,
//! `WEFT_TOKEN`); how the controller is trusted comes from `WEFT_CA_FILE`, `WEFT_PIN` and
//! `WEFT_INSECURE_HTTP` over `[controller]` of weft.toml, read as every controller command
//! reads them (`cluster::Remote`).
//!
//! `WEFT_TOKEN` is read here, not through clap's `env`: clap counts a value from the
//! environment as given, so `requires = "report_to"` would refuse every run of these
//! commands in a shell that exports `WEFT_TOKEN` for other commands. An explicit `--token`
//! without `--report-to` stays a usage error.

use std::time::Duration;

use anyhow::{Context, Result, anyhow};
use clap::Args;
use weft_controller::auth::Secret;
use weft_controller::client::Client;
use weft_controller::links::api::LinkRunAccepted;
use weft_controller::links::{LinkResult, LinkRunIn, LinkSource};

/// Where to store the results.
#[derive(Args, Clone, Default)]
pub struct ReportTo {
    /// Store the measured links in the controller at this URL (https://HOST:PORT, or
    /// http:// on loopback), where `weft controller`'s console shows them; needs an admin
    /// token (--token or WEFT_TOKEN).
    #[arg(long, value_name = "URL")]
    pub report_to: Option<String>,
    /// The admin API token for --report-to [default: $WEFT_TOKEN, read only with
    /// --report-to].
    #[arg(long, requires = "report_to")]
    pub token: Option<String>,
}

impl ReportTo {
    /// The token: --token, else a non-empty `WEFT_TOKEN`.
    fn token(&self) -> Option<String> {
        self.token.clone().or_else(|| {
            std::env::var("WEFT_TOKEN")
                .ok()
                .filter(|t| !t.trim().is_empty())
        })
    }

    /// Refuses, before anything is measured, a --report-to that cannot be sent: no token.
    pub fn check(&self) -> Result<()> {
        match (&self.report_to, self.token()) {
            (Some(url), None) => Err(anyhow!(
                "--report-to {url}: no token; pass --token or set WEFT_TOKEN (an admin token)"
            )),
            _ => Ok(()),
        }
    }

    /// Sends `results` as one run, if --report-to was given; `Ok(None)` when it was not.
    pub fn send(
        &self,
        source: LinkSource,
        results: Vec<LinkResult>,
    ) -> Result<Option<LinkRunAccepted>> {
        let Some(url) = &self.report_to else {
            return Ok(None);
        };
        let token = self.token().ok_or_else(|| {
            anyhow!("--report-to {url}: no token; pass --token or set WEFT_TOKEN (an admin token)")
        })?;
        if results.is_empty() {
            return Err(anyhow!(
                "--report-to {url}: nothing was measured, so nothing is stored"
            ));
        }
        let file = crate::config::Config::load(crate::config_path().as_deref())
            .with_context(|| format!("--report-to {url}: reading weft.toml for [controller]"))?
            .controller;
        // Trusted as every controller command trusts it (one rule: `cluster::Remote`).
        let tls = crate::cluster::Remote::from_env()
            .map_err(|e| anyhow!("--report-to {url}: the WEFT_* environment: {e}"))?
            .tls(&file);
        let client = Client::with_tls(url, Some(Secret::new(token)), Duration::from_secs(10), &tls)
            .with_context(|| format!("--report-to {url}"))?;
        let run = LinkRunIn { source, results };
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("cannot start the async runtime")?;
        let accepted = rt
            .block_on(client.add_link_run(&run))
            .map_err(|e| anyhow!("--report-to {url}: {e}"))?;
        Ok(Some(accepted))
    }
}

/// What `send` came to, for the commands' output: the stored run, or why it was not
/// stored (the measurement is printed either way, so that a refused report loses nothing).
pub fn outcome(r: Result<Option<LinkRunAccepted>>) -> (Option<LinkRunAccepted>, Option<String>) {
    match r {
        Ok(a) => (a, None),
        Err(e) => (None, Some(format!("{e:#}"))),
    }
}

/// The measured pairs of `weft bench p2p` or of `weft doctor`'s throughput check as links
/// for the controller ([`LinkResult::measured`]).
pub fn pair_results(pairs: &[weft_bench::p2p::Pair]) -> Vec<LinkResult> {
    pairs
        .iter()
        .map(|p| {
            LinkResult::measured(
                &p.src,
                &p.dst,
                &p.src_if,
                p.gbps,
                p.rtt_us,
                p.error.as_deref(),
            )
        })
        .collect()
}

/// The links that `weft bench collectives` timed before its collectives
/// ([`weft_bench::links`]: `--link-bytes` from every rank to every other through the plugin,
/// one ordered pair at a time, the best of two rounds), one result per ordered pair of the
/// ranks' hosts, as the ranks were started (their `--hosts` entries). Only those per-pair
/// times are reported: the collectives' bus bandwidth is one figure for the whole ring and
/// says nothing about one link, so it is not sent. The interface is `plugin` (the plugin
/// picks it among the data interfaces); no round trip is measured; a link with no time is
/// sent as failed with 0 Gb/s.
pub fn collective_results(report: &weft_bench::links::LinkReport) -> Vec<LinkResult> {
    let host = |rank: usize| {
        report
            .hosts
            .get(rank)
            .cloned()
            .unwrap_or_else(|| format!("rank{rank}"))
    };
    report
        .links
        .iter()
        .map(|l| {
            LinkResult::timed(
                &host(l.src_rank),
                &host(l.dst_rank),
                report.bytes as u64,
                l.seconds,
                l.gbps,
            )
        })
        .collect()
}

/// The line a human reads after a run was stored.
pub fn stored_line(url: &str, a: &LinkRunAccepted) -> String {
    format!(
        "stored as run {} in {url}: {} link(s), {} below 70% of their run's median or failed",
        a.run.id,
        a.run.results.len(),
        a.slow.len()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_timed_pair_of_ranks_is_one_link_between_their_hosts_and_an_untimed_one_failed() {
        let names: Vec<String> = ["n1", "n2", "n3"].iter().map(|s| s.to_string()).collect();
        // times[dst][src]: 1 MB in 1 ms = 8 Gb/s, n3 -> n1 in 4 ms, n2 -> n3 never timed.
        let times = vec![
            vec![0.0, 1e-3, 4e-3],
            vec![1e-3, 0.0, 1e-3],
            vec![1e-3, f64::NAN, 0.0],
        ];
        let report = weft_bench::links::judge(&names, 1_000_000, &times);
        let r = collective_results(&report);
        assert_eq!(r.len(), 6, "{r:?}");
        let get = |s: &str, d: &str| r.iter().find(|x| x.src == s && x.dst == d).unwrap();
        assert!((get("n1", "n2").gbps - 8.0).abs() < 1e-9);
        assert!((get("n3", "n1").gbps - 2.0).abs() < 1e-9);
        assert!(r.iter().all(|x| x.nic == "plugin" && x.rtt_us.is_none()));
        let failed = get("n2", "n3");
        assert_eq!(failed.gbps, 0.0);
        assert_eq!(
            failed.error.as_deref(),
            Some("no time measured for 1000000 B through the plugin")
        );
        assert_eq!(r.iter().filter(|x| x.error.is_some()).count(), 1);
        // What the controller takes.
        let run = LinkRunIn {
            source: LinkSource::Collectives,
            results: r,
        };
        weft_controller::links::check_run(&run).unwrap();
    }

    #[test]
    fn a_token_without_a_url_is_not_needed_and_a_url_without_one_is_refused() {
        let none = ReportTo::default();
        assert!(none.check().is_ok());
        assert!(matches!(
            none.send(LinkSource::Collectives, vec![]),
            Ok(None)
        ));
        let url = ReportTo {
            report_to: Some("http://127.0.0.1:9".into()),
            token: Some("t".into()),
        };
        assert!(url.check().is_ok());
        let e = url.send(LinkSource::Collectives, vec![]).unwrap_err();
        assert!(format!("{e}").contains("nothing was measured"), "{e}");
    }
}
