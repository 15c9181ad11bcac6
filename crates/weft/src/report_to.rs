//! `--report-to`: the link measurements of `weft bench p2p` and `weft doctor` sent to the
//! controller (`POST /v1/link-results`), where the console shows them and the metrics
//! flag a slow link. The token is the usual one (`--token`, `WEFT_TOKEN`); how the
//! controller is trusted comes from `[controller]` of weft.toml (`ca_file`, `pin`,
//! `insecure_http`) or `WEFT_CA_FILE` / `WEFT_PIN`.

use std::time::Duration;

use anyhow::{Context, Result, anyhow};
use clap::Args;
use weft_controller::auth::Secret;
use weft_controller::client::Client;
use weft_controller::links::api::LinkRunAccepted;
use weft_controller::links::{LinkResult, LinkRunIn, LinkSource};
use weft_controller::tls::ClientTls;

/// Where to store the results.
#[derive(Args, Clone, Default)]
pub struct ReportTo {
    /// Store the measured links in the controller at this URL (https://HOST:PORT, or
    /// http:// on loopback), where `weft controller`'s console shows them; needs an admin
    /// token (--token or WEFT_TOKEN).
    #[arg(long, value_name = "URL")]
    pub report_to: Option<String>,
    /// The admin API token for --report-to.
    #[arg(
        long,
        env = "WEFT_TOKEN",
        hide_env_values = true,
        requires = "report_to"
    )]
    pub token: Option<String>,
}

impl ReportTo {
    /// Refuses, before anything is measured, a --report-to that cannot be sent: no token.
    pub fn check(&self) -> Result<()> {
        match (&self.report_to, &self.token) {
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
        let token = self.token.clone().ok_or_else(|| {
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
        let tls = ClientTls {
            ca_file: std::env::var_os("WEFT_CA_FILE")
                .map(Into::into)
                .or(file.ca_file),
            pin: std::env::var("WEFT_PIN").ok().or(file.pin),
            insecure_http: file.insecure_http,
        };
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
/// for the controller (an error text cut to what the API takes).
pub fn pair_results(pairs: &[weft_bench::p2p::Pair]) -> Vec<LinkResult> {
    pairs
        .iter()
        .map(|p| LinkResult {
            src: p.src.clone(),
            dst: p.dst.clone(),
            nic: p.src_if.clone(),
            gbps: p.gbps,
            rtt_us: (p.error.is_none() && p.rtt_us.is_finite()).then_some(p.rtt_us),
            error: p
                .error
                .as_ref()
                .map(|e| e.chars().take(weft_controller::links::MAX_ERROR).collect()),
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
