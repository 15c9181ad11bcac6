//! `weft lease`: a tenant leases nodes from the provider's free pool for a time, and the
//! controller moves them into its group and back by itself; an admin sets the quotas.
//! Glue only: the rules are weft-lease's, the loop and the API weft-controller's.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Result, anyhow};
use clap::Subcommand;
use weft_controller::lease::model::{LeaseAccepted, LeaseRequest, LeaseView, SetLeaseQuota};

use crate::cluster::{Remote, client, failed};
use crate::config::ControllerClientConfig;
use crate::output;
use crate::{EXIT_CHECK_FAILED, EXIT_OK};

#[derive(Subcommand)]
pub enum LeaseCommand {
    /// Ask for nodes from the pool (a tenant's token): granted now, queued with its place,
    /// waiting for --start, or refused with the reason.
    #[command(
        after_help = "Examples:\n  weft lease request --nodes 4 --for 8h\n  weft lease request --nodes 2 --for 30m --start +1h --same-switch\n  weft lease request --nodes 1 --for 90s --start 2026-12-03T20:00:00Z --json\n\nExit codes: 0 granted, queued or waiting; 1 refused; 2 usage or environment error."
    )]
    Request {
        /// How many nodes.
        #[arg(long)]
        nodes: u32,
        /// For how long: `8h`, `30m`, `90s`, `2d`.
        #[arg(long = "for", value_name = "DURATION", value_parser = parse_duration)]
        duration: Duration,
        /// The earliest start: `+1h` (from now), Unix seconds, or an RFC 3339 UTC time.
        #[arg(long, value_name = "TIME", value_parser = parse_time)]
        start: Option<u64>,
        /// Every node under one leaf switch, or wait for that.
        #[arg(long)]
        same_switch: bool,
        #[command(flatten)]
        remote: Remote,
    },
    /// Leases this token may see, the queue and (for an admin) the pool.
    #[command(after_help = "Examples:\n  weft lease list\n  weft lease list --json")]
    List {
        #[command(flatten)]
        remote: Remote,
    },
    /// One lease with every decision about it.
    #[command(after_help = "Example:\n  weft lease show 7")]
    Show {
        /// The lease's number.
        id: u64,
        #[command(flatten)]
        remote: Remote,
    },
    /// Make a lease that holds its nodes last longer (withdraws a warning given).
    #[command(after_help = "Example:\n  weft lease extend 7 --by 2h")]
    Extend {
        /// The lease's number.
        id: u64,
        /// How much longer: `2h`, `30m`.
        #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
        by: Duration,
        #[command(flatten)]
        remote: Remote,
    },
    /// Give a lease back: its nodes return to the pool now (a queued one leaves the queue).
    #[command(after_help = "Example:\n  weft lease release 7")]
    Release {
        /// The lease's number.
        id: u64,
        #[command(flatten)]
        remote: Remote,
    },
    /// Tenants' lease quotas: nodes at once and node-hours per period (set by an admin).
    #[command(subcommand)]
    Quota(QuotaCommand),
}

#[derive(Subcommand)]
pub enum QuotaCommand {
    /// Every quota and its use (a tenant sees its own).
    #[command(after_help = "Example:\n  weft lease quota list")]
    List {
        #[command(flatten)]
        remote: Remote,
    },
    /// Set a tenant's quota (an admin's token).
    #[command(
        after_help = "Example:\n  weft lease quota set alice --nodes 4 --node-hours 200 --period 7d"
    )]
    Set {
        /// The tenant.
        tenant: String,
        /// Nodes held at once.
        #[arg(long)]
        nodes: u32,
        /// Node-hours of the leases started in one period.
        #[arg(long)]
        node_hours: f64,
        /// The period: `7d`, `24h`.
        #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "7d")]
        period: Duration,
        #[command(flatten)]
        remote: Remote,
    },
    /// Remove a tenant's quota: it cannot request leases any more.
    #[command(after_help = "Example:\n  weft lease quota remove alice")]
    Remove {
        /// The tenant.
        tenant: String,
        #[command(flatten)]
        remote: Remote,
    },
}

/// `8h`, `30m`, `90s`, `2d` (humantime's grammar; a bare number is seconds).
pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
    let d = match s.parse::<u64>() {
        Ok(n) => Duration::from_secs(n),
        Err(_) => humantime::parse_duration(s)
            .map_err(|e| format!("`{s}` is not a duration ({e}); write e.g. 8h, 30m, 90s or 2d"))?,
    };
    if d.as_secs() == 0 {
        return Err(format!("`{s}`: at least one second"));
    }
    Ok(d)
}

/// `+1h` (from now), Unix seconds, or an RFC 3339 time (`2026-12-03T20:00:00Z`).
pub(crate) fn parse_time(s: &str) -> Result<u64, String> {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_err(|e| e.to_string())?
        .as_secs();
    if let Some(rel) = s.strip_prefix('+') {
        return parse_duration(rel).map(|d| now + d.as_secs());
    }
    if let Ok(n) = s.parse::<u64>() {
        return Ok(n);
    }
    humantime::parse_rfc3339_weak(s)
        .map_err(|e| {
            format!("`{s}` is not a time ({e}); write +1h, Unix seconds or 2026-12-03T20:00:00Z")
        })?
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .map_err(|_| format!("`{s}` is before 1970"))
}

/// Unix seconds as an RFC 3339 UTC time, `-` for none.
fn when(t: Option<u64>) -> String {
    t.map_or_else(
        || "-".into(),
        |t| humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_secs(t)).to_string(),
    )
}

fn hours(s: u64) -> String {
    humantime::format_duration(Duration::from_secs(s)).to_string()
}

fn row(l: &LeaseView) -> [String; 8] {
    [
        l.id.to_string(),
        l.tenant.clone(),
        l.phase.clone() + &l.position.map(|p| format!(" #{p}")).unwrap_or_default(),
        l.nodes_wanted.to_string() + if l.same_switch { " (1 switch)" } else { "" },
        hours(l.duration_s),
        when(l.start),
        when(l.end),
        if l.nodes.is_empty() {
            l.reason.clone().unwrap_or_else(|| "-".into())
        } else {
            l.nodes.join(",")
        },
    ]
}

const HEADER: [&str; 8] = [
    "LEASE",
    "TENANT",
    "PHASE",
    "NODES",
    "FOR",
    "START",
    "END",
    "NODES/REASON",
];

/// Prints what a request, an extension or a release did; exit 1 for a refusal.
fn accepted(a: &LeaseAccepted, json: bool) -> Result<u8> {
    let refused = a.lease.phase == "refused";
    if json {
        output::json(a)?;
    } else {
        println!("{}", output::table(HEADER, [row(&a.lease)]));
        for d in a
            .decisions
            .iter()
            .filter(|d| d.kind != "move-in" && d.kind != "move-out")
        {
            println!("  {}: {}", output::clean(&d.kind), output::clean(&d.detail));
        }
        if !a.operations.is_empty() {
            let ids: Vec<String> = a.operations.iter().map(i64::to_string).collect();
            println!(
                "  group changes accepted as operation(s) {}; the controller delivers them (`weft group list`, `weft audit`)",
                ids.join(", ")
            );
        }
    }
    Ok(if refused { EXIT_CHECK_FAILED } else { EXIT_OK })
}

/// Runs one `weft lease` command.
pub async fn run(cmd: LeaseCommand, file: &ControllerClientConfig, json: bool) -> Result<u8> {
    macro_rules! api {
        ($e:expr) => {
            match $e.await {
                Ok(v) => v,
                Err(e) => return failed(e, json),
            }
        };
    }
    match cmd {
        LeaseCommand::Request {
            nodes,
            duration,
            start,
            same_switch,
            remote,
        } => {
            let req = LeaseRequest {
                nodes,
                duration_s: duration.as_secs(),
                start,
                same_switch,
            };
            let a = api!(client(&remote, file)?.request_lease(&req));
            accepted(&a, json)
        }
        LeaseCommand::List { remote } => {
            let list = api!(client(&remote, file)?.leases());
            if json {
                output::json(&list)?;
                return Ok(EXIT_OK);
            }
            println!("{}", output::table(HEADER, list.leases.iter().map(row)));
            println!(
                "pool: {} node(s), {} free; queue: {}",
                list.pool_size,
                list.pool_free,
                if list.queue.is_empty() {
                    "empty".to_string()
                } else {
                    list.queue
                        .iter()
                        .map(u64::to_string)
                        .collect::<Vec<_>>()
                        .join(" ")
                }
            );
            if !list.pool.is_empty() {
                println!(
                    "{}",
                    output::table(
                        ["POOL NODE", "SWITCH", "LEASE"],
                        list.pool.iter().map(|n| [
                            n.name.clone(),
                            n.switch.clone().unwrap_or_else(|| "-".into()),
                            n.lease.map_or_else(|| "free".into(), |l| l.to_string()),
                        ])
                    )
                );
            }
            Ok(EXIT_OK)
        }
        LeaseCommand::Show { id, remote } => {
            let d = api!(client(&remote, file)?.lease(id));
            if json {
                output::json(&d)?;
                return Ok(EXIT_OK);
            }
            println!("{}", output::table(HEADER, [row(&d.lease)]));
            println!(
                "{}",
                output::table(
                    ["AT", "DECISION", "DETAIL"],
                    d.decisions.iter().map(|x| [
                        when(Some(x.at)),
                        x.kind.clone(),
                        x.detail.clone()
                    ])
                )
            );
            Ok(EXIT_OK)
        }
        LeaseCommand::Extend { id, by, remote } => {
            let a = api!(client(&remote, file)?.extend_lease(id, by.as_secs()));
            accepted(&a, json)
        }
        LeaseCommand::Release { id, remote } => {
            let a = api!(client(&remote, file)?.release_lease(id));
            accepted(&a, json)
        }
        LeaseCommand::Quota(QuotaCommand::List { remote }) => {
            let q = api!(client(&remote, file)?.lease_quotas());
            if json {
                output::json(&q)?;
                return Ok(EXIT_OK);
            }
            println!(
                "{}",
                output::table(
                    ["TENANT", "NODES", "HELD", "NODE-HOURS", "USED", "PERIOD"],
                    q.iter().map(|q| [
                        q.tenant.clone(),
                        q.max_nodes.to_string(),
                        q.held_nodes.to_string(),
                        format!("{:.2}", q.node_seconds as f64 / 3600.0),
                        format!("{:.2}", q.used_node_seconds as f64 / 3600.0),
                        hours(q.period_s),
                    ])
                )
            );
            Ok(EXIT_OK)
        }
        LeaseCommand::Quota(QuotaCommand::Set {
            tenant,
            nodes,
            node_hours,
            period,
            remote,
        }) => {
            if !(node_hours.is_finite() && node_hours >= 0.0) {
                return Err(anyhow!(
                    "--node-hours {node_hours}: give a number of hours, 0 or more"
                ));
            }
            let q = SetLeaseQuota {
                max_nodes: nodes,
                node_seconds: (node_hours * 3600.0).round() as u64,
                period_s: period.as_secs(),
            };
            api!(client(&remote, file)?.set_lease_quota(&tenant, &q));
            crate::cluster::done(
                json,
                &format!(
                    "tenant `{tenant}` may lease {nodes} node(s) at once and {node_hours} node-hours per {}",
                    hours(q.period_s)
                ),
            );
            Ok(EXIT_OK)
        }
        LeaseCommand::Quota(QuotaCommand::Remove { tenant, remote }) => {
            api!(client(&remote, file)?.delete_lease_quota(&tenant));
            crate::cluster::done(json, &format!("tenant `{tenant}` can no longer lease"));
            Ok(EXIT_OK)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_and_times_parse_or_name_the_input() {
        assert_eq!(parse_duration("8h").unwrap(), Duration::from_secs(8 * 3600));
        assert_eq!(parse_duration("90").unwrap(), Duration::from_secs(90));
        assert!(
            parse_duration("0s")
                .unwrap_err()
                .contains("at least one second")
        );
        assert!(
            parse_duration("eight hours")
                .unwrap_err()
                .contains("`eight hours`")
        );
        assert_eq!(parse_time("1700000000").unwrap(), 1_700_000_000);
        assert_eq!(parse_time("2023-11-14T22:13:20Z").unwrap(), 1_700_000_000);
        assert!(parse_time("+1h").unwrap() > 1_700_000_000);
        assert!(parse_time("tomorrow").unwrap_err().contains("`tomorrow`"));
    }
}
