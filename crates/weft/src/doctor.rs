//! `weft doctor`: checks on every host, PASS / WARN / FAIL lines, and the settings to use.

use std::time::Duration;

use anyhow::Result;
use clap::Args;
use weft_bench::doctor::{self, DoctorOptions, Level};

use crate::bench::HostArgs;
use crate::{EXIT_CHECK_FAILED, EXIT_OK};

#[derive(Args)]
#[command(
    after_help = after_help()
)]
pub struct DoctorArgs {
    #[command(flatten)]
    hosts: HostArgs,
    /// Expected MTU of every data interface (e.g. 9000).
    #[arg(long)]
    expect_mtu: Option<u32>,
    /// Expected link speed of every data interface, in Mb/s (e.g. 200000).
    #[arg(long)]
    expect_speed: Option<u32>,
    /// Clock offset (ms) above which to warn; 10x fails.
    #[arg(long, default_value_t = 100)]
    max_skew_ms: u64,
    /// Seconds of bulk transfer per ordered pair of the throughput check.
    #[arg(long, default_value_t = 0.5)]
    throughput_s: f64,
    /// Skip the throughput check (a short `weft bench p2p` between every ordered pair).
    #[arg(long)]
    no_throughput: bool,
    /// Connect timeout in seconds of each host-to-host SSH probe.
    #[arg(long, default_value_t = 5)]
    ssh_timeout_s: u64,
    /// Skip the host-to-host SSH check.
    #[arg(long)]
    no_ssh_pairs: bool,
    /// ICMP echoes (one every 2 ms) from every host to every other host's management
    /// address, for packet loss on the management network.
    #[arg(long, default_value_t = 300)]
    loss_echoes: u32,
    /// Skip the management loss check.
    #[arg(long)]
    no_loss: bool,
    #[command(flatten)]
    report: crate::report_to::ReportTo,
}

/// Examples, then every check from the doctor's own list (`weft_bench::doctor::CHECKS`).
fn after_help() -> String {
    format!(
        "Examples:\n  weft doctor --hosts spark1,spark2 --expect-mtu 9000 --expect-speed 200000\n  weft doctor --hosts node1,node2,node3 --ssh-config /etc/weft/ssh_config --no-throughput\n  weft doctor --hosts ns1,ns2,ns3 --via netns --mgmt-if =mgmt0 --data-if =data0 --json\n  WEFT_TOKEN=wfa_... weft doctor --hosts node1,node2 --report-to https://ctl:7100\n\nChecks on every host (the [name] of each finding):\n{}Prints the WEFT_/NCCL_ settings for jobs. Exit code 1 when any check FAILs.",
        doctor::checks_help()
    )
}

pub fn run(a: DoctorArgs, json: bool) -> Result<u8> {
    if !(a.throughput_s > 0.0 && a.throughput_s <= 60.0) {
        anyhow::bail!("--throughput-s must be in (0, 60] seconds");
    }
    a.report.check()?;
    if a.report.report_to.is_some() && a.no_throughput {
        anyhow::bail!(
            "--report-to stores the throughput check's pairs; it cannot go with --no-throughput"
        );
    }
    let (hosts, remote) = a.hosts.runners()?;
    // The checks take a while (a throughput pair per ordered pair of hosts): say so on a
    // terminal, on stderr, and clear it before the report.
    let spinner = std::io::IsTerminal::is_terminal(&std::io::stderr()).then(|| {
        let b = indicatif::ProgressBar::new_spinner();
        b.set_message(format!(
            "checking {} hosts (facts, DF probes{}{})",
            hosts.len(),
            if a.no_throughput {
                ""
            } else {
                ", throughput of every ordered pair"
            },
            if a.no_ssh_pairs {
                ""
            } else {
                ", host-to-host SSH"
            },
        ));
        b.enable_steady_tick(Duration::from_millis(120));
        b
    });
    let r = doctor::run(
        &hosts,
        &remote,
        &DoctorOptions {
            expect_mtu: a.expect_mtu,
            expect_speed_mbps: a.expect_speed,
            data_if: a.hosts.data_if.clone(),
            mgmt_if: a.hosts.mgmt_if.clone(),
            max_skew: Duration::from_millis(a.max_skew_ms),
            probe_timeout: Duration::from_millis(1000),
            throughput: (!a.no_throughput).then(|| Duration::from_secs_f64(a.throughput_s)),
            ssh_pairs: (!a.no_ssh_pairs)
                .then(|| Duration::from_secs(a.ssh_timeout_s.clamp(1, 120))),
            loss_echoes: (!a.no_loss && a.loss_echoes > 0).then_some(a.loss_echoes.min(10_000)),
        },
    );
    if let Some(b) = &spinner {
        b.finish_and_clear();
    }
    let r = r?;
    // The throughput check's pairs go to the controller (--report-to).
    let (reported, report_error) = crate::report_to::outcome(a.report.send(
        weft_controller::links::LinkSource::Doctor,
        crate::report_to::pair_results(&r.pairs),
    ));
    if json {
        let mut v = serde_json::to_value(&r)?;
        if let Some(o) = v.as_object_mut() {
            o.insert("reported".into(), serde_json::to_value(&reported)?);
            o.insert("report_error".into(), serde_json::to_value(&report_error)?);
        }
        crate::output::json(&v)?;
    } else {
        for f in &r.findings {
            let subj = f
                .subject
                .as_deref()
                .map(|s| format!(" {s}"))
                .unwrap_or_default();
            println!(
                "{:<4} {}{} [{}]: {}",
                f.level, f.host, subj, f.check, f.message
            );
            if f.level >= Level::Warn
                && let Some(rem) = &f.remedy
            {
                println!("       fix: {rem}");
            }
        }
        let n = |l: Level| r.findings.iter().filter(|f| f.level == l).count();
        println!(
            "\n{} PASS, {} WARN, {} FAIL on {} hosts",
            n(Level::Pass),
            n(Level::Warn),
            n(Level::Fail),
            r.hosts.len()
        );
        println!("\n# Settings for jobs on these hosts (do not pin NCCL_IB_GID_INDEX):");
        for (k, v) in &r.env {
            println!("export {k}={v}");
        }
        if let (Some(rep), Some(url)) = (&reported, &a.report.report_to) {
            println!("\n{}", crate::report_to::stored_line(url, rep));
        }
    }
    if let Some(e) = &report_error {
        eprintln!("weft: {e}");
        return Ok(crate::EXIT_ENVIRONMENT);
    }
    Ok(if r.failed { EXIT_CHECK_FAILED } else { EXIT_OK })
}
