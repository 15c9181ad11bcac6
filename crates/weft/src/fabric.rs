//! `weft fabric`: partitions as code.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use serde::Serialize;
use weft_fabric::conf::{self, Conf};
use weft_fabric::{Compiled, FabricPlan, ImportOptions, Inventory, PortMismatch, Violation};
use weft_opensm::master::{FileState, SyncState, SyncStatus};
use weft_opensm::{Applier, ApplyError, ApplyReport, FabricSnapshot, VerifyScope};

use crate::config::{Config, FabricConfig};
use crate::output::{json, keys, table};
use crate::{EXIT_CHECK_FAILED, EXIT_OK};

#[derive(Subcommand)]
pub enum FabricCommand {
    /// Validate a plan and show the partitions it makes; with --live, against the fabric.
    #[command(
        after_help = "Examples:\n  weft fabric check plan.toml\n  weft fabric check plan.toml --live --render > partitions.conf"
    )]
    Check {
        /// The plan (TOML).
        plan: PathBuf,
        /// Also check GUIDs, node names and table capacities against the live fabric.
        #[arg(long)]
        live: bool,
        /// Print the partitions.conf the plan renders to instead of the summary.
        #[arg(long)]
        render: bool,
    },
    /// Show what applying a plan would change on each port, and on each SM's file.
    #[command(after_help = "Example:\n  weft fabric diff plan.toml")]
    Diff { plan: PathBuf },
    /// Apply a plan: write it to every SM, reread, verify every port, roll back on failure.
    #[command(
        after_help = "Example:\n  weft --config weft.toml fabric apply plan.toml\n\nExit codes:\n  0  applied: every SM holds the new file and the ports verified\n  1  not applied (the plan is invalid, or a check failed and the previous file was\n     restored); or applied and verified through the master while a standby's host\n     could not be reached: that standby still holds the old file and would bring it\n     back if it took over, so the apply is listed as degraded (WARN) and is to be\n     run again once the host is back\n  2  usage or environment error"
    )]
    Apply {
        plan: PathBuf,
        #[command(flatten)]
        timeouts: Timeouts,
        /// Allow an apply that removes a partition, removes members from one or lowers
        /// a member from full to limited (without it, such an apply shows what it would
        /// remove and writes nothing).
        #[arg(long)]
        allow_removal: bool,
        /// Allow a plan with no partition (it removes every tenant's partition).
        #[arg(long)]
        allow_empty: bool,
        /// Replace a file that a weft controller manages (its header names the owner);
        /// the controller then sees the change as drift.
        #[arg(long)]
        force: bool,
    },
    /// Compare the fabric's P_Key tables with a plan; without one, with what the controller
    /// applied when a controller owns the file (and `[controller] url` or WEFT_CONTROLLER
    /// names it; its file must be the master's too), else with the master SM's file.
    #[command(after_help = "Examples:\n  weft fabric verify plan.toml\n  weft fabric verify")]
    Verify { plan: Option<PathBuf> },
    /// Turn an existing partitions.conf into a plan (TOML on stdout) that means the same
    /// to OpenSM; notes on what was merged go to stderr.
    #[command(
        after_help = "Examples:\n  weft fabric import /etc/opensm/partitions.conf > plan.toml\n  weft fabric import partitions.conf --tenant-map storage=ops --tenant-map mgmt=ops --strict\n  weft --config weft.toml fabric import partitions.conf --live > plan.toml\n\nExit codes:\n  0  imported\n  1  the file has faults (all listed, with line and column), holds something a plan\n     cannot say, or (--strict) import had to merge or normalise something\n  2  usage or environment error"
    )]
    Import {
        file: PathBuf,
        /// Make every note an error: import only a file that needs no merging.
        #[arg(long)]
        strict: bool,
        /// Put partition PARTITION in tenant TENANT (repeatable; others are their own tenant).
        #[arg(long, value_name = "PARTITION=TENANT")]
        tenant_map: Vec<String>,
        /// Read the P_Keys of partitions the file gives none from the fabric (the master
        /// SM's tables), through the SMs and diag tools of the config.
        #[arg(long)]
        live: bool,
    },
    /// Show each configured SM: master or standby, whether their files agree, who owns the
    /// file, and (for a controller's file) what the controller's drift check found.
    #[command(
        after_help = "Examples:\n  weft fabric status --json\n  WEFT_CONTROLLER=https://ctl:7100 WEFT_PIN=sha256:... weft fabric status\n\nExit 1 when the SMs differ, none is master, or the controller reports drift."
    )]
    Status,
}

#[derive(Args)]
pub struct Timeouts {
    /// Bound on the sweep after a reread, in ms (overrides fabric.sweep_timeout_ms).
    #[arg(long, env = "WEFT_SWEEP_TIMEOUT_MS")]
    sweep_timeout_ms: Option<u64>,
    /// Bound on the ports showing the planned tables, in ms.
    #[arg(long, env = "WEFT_VERIFY_TIMEOUT_MS")]
    verify_timeout_ms: Option<u64>,
    /// Read back every end port, not only those the change touches (plus canaries).
    #[arg(long)]
    verify_all: bool,
}

pub fn run(cmd: FabricCommand, cfg: &Config, as_json: bool) -> Result<u8> {
    let fc = &cfg.fabric;
    match cmd {
        FabricCommand::Check { plan, live, render } => {
            let plan = plan_or_exit!(&plan, as_json);
            let inventory = if live {
                Some(applier(fc, None)?.diag.snapshot()?.inventory)
            } else {
                None
            };
            match compile(&plan, inventory.as_ref()) {
                Err(v) => report_violations(&v, as_json),
                Ok(c) if render => {
                    print!("{}", conf::render(&c.conf));
                    Ok(EXIT_OK)
                }
                Ok(c) => {
                    print_summary(&c, as_json)?;
                    Ok(EXIT_OK)
                }
            }
        }
        FabricCommand::Diff { plan } => {
            let plan = plan_or_exit!(&plan, as_json);
            let a = applier(fc, None)?;
            let snapshot = a.diag.snapshot()?;
            let compiled = match compile(&plan, Some(&snapshot.inventory)) {
                Ok(c) => c,
                Err(v) => return report_violations(&v, as_json),
            };
            let v = a.compare(&compiled.conf, &snapshot);
            let text = conf::render(&compiled.conf);
            let files = a.file_states(&text);
            if as_json {
                json(&DiffJson {
                    ports: port_rows(&v.mismatches, &snapshot),
                    files,
                })?;
            } else {
                print_port_changes(&v.mismatches, &snapshot, "change");
                for f in files {
                    println!("SM {}: {}", f.sm, f.state);
                }
            }
            Ok(EXIT_OK)
        }
        FabricCommand::Apply {
            plan,
            timeouts,
            allow_removal,
            allow_empty,
            force,
        } => {
            let start = std::time::Instant::now();
            let plan = plan_or_exit!(&plan, as_json);
            if plan.partitions.is_empty() && !allow_empty {
                return bad_input(
                    "the plan has no partition: applying it removes every tenant's partition; nothing was written (pass --allow-empty if that is meant)",
                    as_json,
                );
            }
            let a = applier(fc, Some(&timeouts))?;
            let snapshot = a.diag.snapshot()?;
            let snapshot_time = start.elapsed();
            let compiled = match compile(&plan, Some(&snapshot.inventory)) {
                Ok(c) => c,
                Err(v) => return report_violations(&v, as_json),
            };
            if !force && let Some((sm, owner)) = a.held_owner(&snapshot)? {
                let why = format!(
                    "SM `{sm}`'s partitions file is managed by {owner} (its header says so): change it through the controller; nothing was written (pass --force to replace it anyway, and the controller will report the drift)"
                );
                crate::output::error(
                    as_json,
                    EXIT_CHECK_FAILED,
                    &why,
                    &[],
                    serde_json::json!({ "owner": owner, "sm": sm }),
                );
                return Ok(EXIT_CHECK_FAILED);
            }
            if !allow_removal {
                let removed = a.removals(&compiled.conf, &snapshot.inventory)?;
                if removed.as_ref().is_none_or(|r| !r.is_empty()) {
                    return refuse_removal(&a, &compiled.conf, &snapshot, removed, as_json);
                }
            }
            match a.apply(&compiled.conf, &snapshot) {
                Ok(r) => {
                    let r = r.with_snapshot(snapshot_time);
                    if as_json {
                        json(&r)?;
                    } else {
                        println!(
                            "applied: {} ports verified in {:.0} ms (snapshot {:.0} ms, write {:.0} ms, sweep {:.0} ms, verify {:.0} ms){}",
                            r.ports_verified,
                            r.total_ms,
                            r.snapshot_ms,
                            r.write_ms,
                            r.sweep_ms,
                            r.verify_ms,
                            if r.changed {
                                ""
                            } else {
                                "; the file was already current"
                            }
                        );
                        println!("tables read by {}", r.read_by);
                        print_sm_states(&r.sms);
                        print_degraded(&r);
                    }
                    // Degraded: the ports are right, but a standby holds the old file and
                    // would program it if it took over; that is a failed check (retry).
                    Ok(if r.degraded.is_empty() {
                        EXIT_OK
                    } else {
                        EXIT_CHECK_FAILED
                    })
                }
                Err(ApplyError::RolledBack {
                    cause,
                    mismatches,
                    rollback,
                }) => {
                    if as_json {
                        let v = crate::output::error_value(
                            &format!("apply failed: {cause}"),
                            &[],
                            EXIT_CHECK_FAILED,
                            serde_json::json!({
                                "rollback": rollback,
                                "ports": port_rows(&mismatches, &snapshot),
                            }),
                        );
                        println!("{v}");
                    } else {
                        eprintln!("weft: apply failed: {cause}");
                        print_port_changes(&mismatches, &snapshot, "wrong");
                        eprintln!("rollback: {rollback}");
                    }
                    Ok(EXIT_CHECK_FAILED)
                }
                Err(e) => Err(e.into()),
            }
        }
        FabricCommand::Verify { plan } => {
            let a = applier(fc, None)?;
            let snapshot = a.diag.snapshot()?;
            // Without a plan: what the controller applied when a controller owns the
            // file (and is configured), else the master's file, the last one applied.
            let mut against = "the plan".to_string();
            let mut file_drift: Option<String> = None;
            let conf = match plan {
                Some(p) => match compile(&plan_or_exit!(&p, as_json), Some(&snapshot.inventory)) {
                    Ok(c) => c.conf,
                    Err(v) => return report_violations(&v, as_json),
                },
                None => {
                    let held = a.master_file(&snapshot)?;
                    let owner = held.as_deref().and_then(weft_opensm::owner_of);
                    match (owner, controller_status(cfg)) {
                        (Some(owner), Some(Ok(st))) if st.applied_conf.is_some() => {
                            let text = st.applied_conf.unwrap_or_default();
                            if held.as_deref() != Some(text.as_bytes()) {
                                file_drift = Some(format!(
                                    "the master's file is not the one {owner} applied (generation {}, checksum {})",
                                    st.applied_generation,
                                    st.applied_checksum
                                        .as_deref()
                                        .map_or("-", |c| &c[..12.min(c.len())])
                                ));
                            }
                            against = format!(
                                "what {owner} applied (generation {})",
                                st.applied_generation
                            );
                            conf::parse(&text).map_err(|e| {
                                anyhow::anyhow!("the controller's applied file: {e}")
                            })?
                        }
                        (Some(owner), Some(Err(e))) => {
                            anyhow::bail!(
                                "the master's file is managed by {owner}, whose applied file cannot be read: {e}"
                            )
                        }
                        (Some(owner), _) => {
                            against = format!(
                                "the master's file (managed by {owner}; set [controller] url or WEFT_CONTROLLER to compare with what it applied)"
                            );
                            a.master_conf(&snapshot)?
                        }
                        (None, _) => {
                            against = "the master's file (the last one applied)".into();
                            a.master_conf(&snapshot)?
                        }
                    }
                }
            };
            let v = a.compare(&conf, &snapshot);
            let ok = v.mismatches.is_empty() && file_drift.is_none();
            if as_json {
                json(&serde_json::json!({
                    "master": v.master,
                    "ports_checked": v.ports_checked,
                    "mismatches": v.mismatches,
                    "against": against,
                    "file_drift": file_drift,
                    "read_by": v.read_by,
                    "ok": ok,
                }))?;
            } else {
                if let Some(d) = &file_drift {
                    println!("DRIFT: {d}");
                }
                if v.mismatches.is_empty() {
                    println!(
                        "verified: all {} ports hold the P_Keys of {against} (master SM port {}; read by {})",
                        v.ports_checked, v.master, v.read_by
                    );
                } else {
                    println!("compared with {against}:");
                    print_port_changes(&v.mismatches, &snapshot, "wrong");
                }
            }
            Ok(if ok { EXIT_OK } else { EXIT_CHECK_FAILED })
        }
        FabricCommand::Import {
            file,
            strict,
            tenant_map,
            live,
        } => import(fc, &file, strict, &tenant_map, live, as_json),
        FabricCommand::Status => {
            let a = applier(fc, None)?;
            let SyncStatus {
                sms: states,
                state,
                message,
                owner,
                ..
            } = a.sync_status();
            let code = match state {
                SyncState::Unreadable => crate::EXIT_ENVIRONMENT,
                SyncState::Differ | SyncState::NoMaster => EXIT_CHECK_FAILED,
                SyncState::InSync => EXIT_OK,
            };
            let in_sync = state == SyncState::InSync;
            // When a controller is configured, what its drift check last found: also when
            // the file no longer names it (`weft fabric apply --force` replaced its file, a
            // drift). A controller that cannot be asked is a line of the report when it owns
            // the file, and nothing when it does not.
            let drift = controller_status(cfg).filter(|d| owner.is_some() || d.is_ok());
            let (drift_json, drift_line, drifted) = match &drift {
                Some(Ok(st)) => {
                    let mut line = format!("controller drift check: {}", st.drift.state.as_str());
                    for f in st
                        .drift
                        .files
                        .iter()
                        .chain(&st.drift.ports)
                        .chain(&st.drift.unreadable)
                    {
                        line.push_str(&format!("\n  {f}"));
                    }
                    (
                        serde_json::to_value(&st.drift).unwrap_or_default(),
                        Some(line),
                        st.drift.state == weft_controller::model::DriftState::Drift,
                    )
                }
                Some(Err(e)) => (
                    serde_json::json!({ "error": e.to_string() }),
                    Some(format!(
                        "controller drift check: cannot ask the controller: {e}"
                    )),
                    false,
                ),
                None => (serde_json::Value::Null, None, false),
            };
            let code = if code == EXIT_OK && drifted {
                EXIT_CHECK_FAILED
            } else {
                code
            };
            if as_json {
                json(&serde_json::json!({
                    "sms": states,
                    "in_sync": in_sync,
                    "state": state.as_str(),
                    "message": message,
                    "owner": owner,
                    "drift": drift_json,
                }))?;
            } else {
                print_sm_states(&states);
                println!("{}", crate::output::clean(&message));
                if let Some(o) = &owner {
                    println!("owner: {}", crate::output::clean(o));
                }
                if let Some(l) = drift_line {
                    println!("{}", crate::output::clean(&l));
                }
            }
            Ok(code)
        }
    }
}

/// The controller's status (drift, applied file) when one is configured (`[controller]
/// url` or `urls`, `WEFT_CONTROLLER` or `WEFT_CONTROLLER_URLS`); `None` when none is. The
/// client is every controller command's ([`crate::cluster::client_for`]): the `WEFT_*`
/// variables of their flags ([`crate::cluster::Remote::from_env`]) over `[controller]`.
fn controller_status(
    cfg: &Config,
) -> Option<Result<weft_controller::model::StatusView, weft_controller::client::ClientError>> {
    use weft_controller::client::ClientError;
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
    let c = &cfg.controller;
    if env("WEFT_CONTROLLER").is_none()
        && env("WEFT_CONTROLLER_URLS").is_none()
        && c.url.is_none()
        && c.urls.is_none()
    {
        return None;
    }
    let run = || {
        let remote = crate::cluster::Remote::from_env().map_err(|e| {
            let e = e.to_string();
            let first = e.lines().next().unwrap_or_default();
            ClientError::Config(format!(
                "{} (the WEFT_* environment)",
                first.trim_start_matches("error: ")
            ))
        })?;
        let (client, _url) = crate::cluster::client_for(&remote, c).map_err(|e| {
            e.downcast::<ClientError>()
                .unwrap_or_else(|e| ClientError::Config(e.to_string()))
        })?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| ClientError::Config(e.to_string()))?;
        rt.block_on(client.status())
    };
    Some(run())
}

/// `weft fabric import`.
fn import(
    fc: &FabricConfig,
    file: &Path,
    strict: bool,
    tenant_map: &[String],
    live: bool,
    as_json: bool,
) -> Result<u8> {
    let text =
        std::fs::read_to_string(file).with_context(|| format!("cannot read {}", file.display()))?;
    let mut opts = ImportOptions::default();
    for entry in tenant_map {
        let Some((part, tenant)) = entry.split_once('=') else {
            anyhow::bail!("--tenant-map `{entry}`: expected PARTITION=TENANT");
        };
        if part.is_empty() || tenant.trim().is_empty() {
            anyhow::bail!("--tenant-map `{entry}`: expected PARTITION=TENANT, both non-empty");
        }
        if let Some(old) = opts.tenant_map.insert(part.to_string(), tenant.to_string())
            && old != tenant
        {
            anyhow::bail!("--tenant-map names partition `{part}` twice ({old} and {tenant})");
        }
    }
    let show = |errs: &[conf::ParseError], what: &str| -> Result<u8> {
        if as_json {
            json(&serde_json::json!({ "file": file.display().to_string(), what: errs }))?;
        } else {
            for e in errs {
                eprintln!("weft: {}: {e}", file.display());
            }
            eprintln!("{} problem(s); no plan was written", errs.len());
        }
        Ok(EXIT_CHECK_FAILED)
    };
    if live {
        let parsed = match conf::parse_all(&text) {
            Ok(c) => c,
            Err(errs) => return show(&errs, "errors"),
        };
        // Partitions without ports are in no port's table: import gives them a free key.
        if !weft_fabric::live_keyed(&parsed).is_empty() {
            match live_keys(fc, &parsed)? {
                Ok(keys) => opts.keys = keys,
                Err(msg) => return bad_input(&format!("{}: {msg}", file.display()), as_json),
            }
        }
    }
    let imported = match FabricPlan::import(&text, &opts) {
        Ok(i) => i,
        Err(errs) => return show(&errs, "errors"),
    };
    if strict && !imported.notes.is_empty() {
        return show(&imported.notes, "errors");
    }
    // What is printed must pass weft's own check (without an inventory here).
    if let Err(v) = compile(&imported.plan, None) {
        return report_violations(&v, as_json);
    }
    if as_json {
        json(&serde_json::json!({ "plan": imported.plan, "notes": imported.notes }))?;
    } else {
        for n in &imported.notes {
            eprintln!("note: {}: {n}", file.display());
        }
        print!("{}", imported.plan.to_toml());
    }
    Ok(EXIT_OK)
}

/// The P_Keys the master uses for the partitions `parsed` gives none, read from the
/// fabric's tables ([`weft_fabric::keys_from_tables`]: a long-running master keeps keys it
/// assigned earlier, so they need not be those a fresh SM counts out). The inner `Err`
/// says why they could not be read.
fn live_keys(
    fc: &FabricConfig,
    parsed: &Conf,
) -> Result<std::result::Result<std::collections::BTreeMap<String, weft_fabric::PKey>, String>> {
    let a = applier(fc, None)?;
    let snapshot = a.diag.snapshot()?;
    let auto = weft_fabric::live_keyed(parsed);
    Ok(weft_fabric::keys_from_tables(
        parsed,
        &snapshot.inventory,
        &snapshot.tables,
        a.sm_options,
    )
    .map_err(|why| {
        format!(
            "partitions {} give no P_Key and the keys the master uses cannot be read from the ports: {why}; write the keys into the file",
            auto.iter()
                .map(|n| format!("`{n}`"))
                .collect::<Vec<_>>()
                .join(", ")
        )
    }))
}

/// An apply that would remove something, without --allow-removal: shows what it would
/// remove and the port changes, writes nothing, exit 1.
fn refuse_removal(
    a: &Applier,
    conf: &Conf,
    snapshot: &FabricSnapshot,
    removed: Option<Vec<weft_fabric::Removal>>,
    as_json: bool,
) -> Result<u8> {
    let v = a.compare(conf, snapshot);
    let why = match &removed {
        Some(_) => "the plan removes partitions or members".to_string(),
        None => "the master's current partitions file cannot be read by weft, so what the plan removes is unknown".to_string(),
    };
    if as_json {
        let e = crate::output::error_value(
            &format!("{why}; nothing was written (pass --allow-removal if that is meant)"),
            &[],
            EXIT_CHECK_FAILED,
            serde_json::json!({
                "removals": removed,
                "ports": port_rows(&v.mismatches, snapshot),
            }),
        );
        println!("{e}");
    } else {
        for r in removed.iter().flatten() {
            println!("{r}");
        }
        print_port_changes(&v.mismatches, snapshot, "change");
        eprintln!("weft: {why}; nothing was written (pass --allow-removal if that is meant)");
    }
    Ok(EXIT_CHECK_FAILED)
}

/// Reads a plan. An unreadable file is an environment error (the outer `Err`, exit 2);
/// a plan that does not parse is a failed check (the inner `Err`, exit 1).
fn load_plan(path: &Path) -> Result<std::result::Result<FabricPlan, String>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    Ok(FabricPlan::from_toml(&text).map_err(|e| format!("{}: {e}", path.display())))
}

/// Reports input that is wrong (a plan or a file that does not parse): exit 1.
fn bad_input(message: &str, as_json: bool) -> Result<u8> {
    crate::output::error(
        as_json,
        EXIT_CHECK_FAILED,
        message,
        &[],
        serde_json::Value::Null,
    );
    Ok(EXIT_CHECK_FAILED)
}

/// `load_plan` inside a command: returns from it with exit 1 on a bad plan.
macro_rules! plan_or_exit {
    ($path:expr, $json:expr) => {
        match load_plan($path)? {
            Ok(p) => p,
            Err(msg) => return bad_input(&msg, $json),
        }
    };
}
use plan_or_exit;

fn compile(plan: &FabricPlan, inventory: Option<&Inventory>) -> Result<Compiled, Vec<Violation>> {
    weft_fabric::compile(plan, inventory)
}

fn applier(fc: &FabricConfig, timeouts: Option<&Timeouts>) -> Result<Applier> {
    let mut a = fc.applier()?;
    if let Some(t) = timeouts {
        if let Some(ms) = t.sweep_timeout_ms {
            a.sweep_timeout = Duration::from_millis(ms);
        }
        if let Some(ms) = t.verify_timeout_ms {
            a.verify_timeout = Duration::from_millis(ms);
        }
        if t.verify_all {
            a.verify_scope = VerifyScope::All;
        }
    }
    Ok(a)
}

fn report_violations(v: &[Violation], as_json: bool) -> Result<u8> {
    if as_json {
        json(&serde_json::json!({ "violations": v }))?;
    } else {
        for x in v {
            eprintln!("FAIL {x}");
        }
        eprintln!("{} problem(s); nothing was written", v.len());
    }
    Ok(EXIT_CHECK_FAILED)
}

fn print_summary(c: &Compiled, as_json: bool) -> Result<()> {
    if as_json {
        return json(&serde_json::json!({ "conf": c.conf, "owners": c.owners }));
    }
    let rows = c.conf.partitions.iter().map(|p| {
        let tenant = p
            .pkey
            .and_then(|k| c.owners.get(&k).cloned())
            .unwrap_or_else(|| "-".into());
        [
            p.name.clone(),
            p.pkey
                .map(|k| k.to_string())
                .unwrap_or_else(|| "auto".into()),
            tenant,
            p.members.len().to_string(),
            if p.flags.ipoib { "yes" } else { "no" }.to_string(),
        ]
    });
    println!(
        "{}",
        table(["PARTITION", "PKEY", "TENANT", "MEMBERS", "IPOIB"], rows)
    );
    Ok(())
}

#[derive(Serialize)]
struct PortRow {
    port: String,
    node: String,
    lid: u16,
    missing: Vec<String>,
    unexpected: Vec<String>,
}

fn port_rows(m: &[PortMismatch], snapshot: &FabricSnapshot) -> Vec<PortRow> {
    m.iter()
        .map(|x| {
            let port = snapshot.inventory.port(x.port);
            PortRow {
                port: x.port.to_string(),
                node: port.map(|p| p.node_desc.clone()).unwrap_or_default(),
                lid: port.map(|p| p.lid).unwrap_or(0),
                missing: x.missing.iter().map(|k| format!("{k:#06x}")).collect(),
                unexpected: x.unexpected.iter().map(|k| format!("{k:#06x}")).collect(),
            }
        })
        .collect()
}

fn print_port_changes(m: &[PortMismatch], snapshot: &FabricSnapshot, what: &str) {
    if m.is_empty() {
        println!("no port would change");
        return;
    }
    let rows = m.iter().map(|x| {
        let port = snapshot.inventory.port(x.port);
        [
            port.map(|p| p.node_desc.clone()).unwrap_or_default(),
            x.port.to_string(),
            port.map(|p| p.lid.to_string()).unwrap_or_default(),
            keys(&x.missing),
            keys(&x.unexpected),
        ]
    });
    println!(
        "{}",
        table(["NODE", "PORT GUID", "LID", "+ P_KEYS", "- P_KEYS"], rows)
    );
    println!("{} port(s) {what}", m.len());
}

/// The WARN lines of a degraded apply: each SM left out and why, then what to do.
fn print_degraded(r: &ApplyReport) {
    if r.degraded.is_empty() {
        return;
    }
    for s in r.sms.iter().filter(|s| r.degraded.contains(&s.name)) {
        eprintln!(
            "WARN SM `{}` was not updated: {}",
            s.name,
            s.error.as_deref().unwrap_or("host unreachable")
        );
    }
    let master = r
        .sms
        .iter()
        .find(|s| s.master)
        .map(|s| format!(" `{}`", s.name))
        .unwrap_or_default();
    let names: Vec<String> = r.degraded.iter().map(|n| format!("`{n}`")).collect();
    eprintln!(
        "weft: applied and verified on the master{master}; standby {} unreachable and still on the old file: run the apply again once it is back",
        names.join(", ")
    );
}

fn print_sm_states(states: &[weft_opensm::SmState]) {
    let rows = states.iter().map(|s| {
        [
            s.name.clone(),
            if s.master { "master" } else { "standby" }.to_string(),
            s.checksum
                .as_deref()
                .map(|c| c[..12.min(c.len())].to_string())
                .unwrap_or_else(|| "none".into()),
        ]
    });
    println!("{}", table(["SM", "ROLE", "SHA-256"], rows));
}

#[derive(Serialize)]
struct DiffJson {
    ports: Vec<PortRow>,
    files: Vec<FileState>,
}
