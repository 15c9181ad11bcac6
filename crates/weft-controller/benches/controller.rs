//! Fabric controller benchmarks.
//!
//! `cargo bench -p weft-controller --bench controller [-- --agents N --secs S --runs R]`
//!
//! 1. N simulated agents (default 1000), each a Tokio task with its own HTTP client over
//!    loopback, report to one controller (SQLite store in a temp dir, a recording fabric)
//!    as fast as they can for S seconds: reports per second, and p50/p99 latency of the
//!    API while it runs.
//!    With `--stores`, instead: the same N agents against a controller on SQLite and on
//!    PostgreSQL (Debian's, started here on a unix socket with fsync on and
//!    synchronous_commit off, as SQLite's WAL with synchronous=NORMAL: durable across a
//!    crash of the process, not of the machine), R rounds alternating the two, each round
//!    S seconds of agents each reporting once per `--period-ms P` (default 1000: ten times
//!    a real fleet's heartbeat) at random phases, then S seconds back to back: the medians
//!    over the rounds of p50 and p99, and the ratio PostgreSQL / SQLite. `--pg-no-fsync`
//!    runs PostgreSQL with fsync off, to tell the disk's part from the code's.
//! 2. From `group move` (the API call `weft group move` makes) to verified ports, on a
//!    32-HCA two-level fat tree (Topology::fat_tree(4, 2, 32, 4)) under the real OpenSM
//!    with a primary and a standby: median, min and max of R moves (default 9).
//!    Skipped when ibsim/OpenSM are not installed.

use std::sync::Arc;
use std::time::{Duration, Instant};

use weft_agent::HostReport;
use weft_agent::fixtures::{HcaSpec, HostSpec, PortSpec, write_host};
use weft_controller::auth::Secret;
use weft_controller::client::Client;
use weft_controller::reconcile::{Fabric, OpenSmFabric, RecordingFabric};
use weft_controller::store::{PgStore, SqliteStore, Store};
use weft_controller::{Controller, ControllerConfig, local, serve};
use weft_fabric::Guid;
use weft_opensm::{
    Applier, DiagTools, LocalSm, RemotePaths, SmHost, SshConfig, SshSm, VerifyScope,
};
use weft_testbed::{SimFabric, SmSpec, Sshd, Topology};

const ADMIN: &str = "wfa_bench-admin-0123456789abcdef0123456789";

fn arg(name: &str, default: u64) -> u64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

async fn controller(dir: &std::path::Path, fabric: Arc<dyn Fabric>) -> (String, Client) {
    let store = SqliteStore::open(&dir.join("controller.db")).unwrap();
    controller_on(Arc::new(store), fabric).await
}

async fn controller_on(store: Arc<dyn Store>, fabric: Arc<dyn Fabric>) -> (String, Client) {
    let config = ControllerConfig {
        admin_token: Some(Secret::new(ADMIN)),
        // A thousand simulated agents enroll from one address.
        rate_limit: weft_controller::input::RateLimit {
            per_s: 1e6,
            burst: 1e6,
        },
        ..ControllerConfig::default()
    };
    let ctl = Controller::start(store, fabric, config).unwrap();
    let api = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", local(&api));
    tokio::spawn(serve(ctl, api, None, std::future::pending()));
    let admin = Client::new(&base, Some(Secret::new(ADMIN)), Duration::from_secs(30)).unwrap();
    (base, admin)
}

/// A report for host `name` whose single HCA has node GUID `node_guid` and `ports` ports.
fn host_report(dir: &std::path::Path, name: &str, node_guid: u64, ports: &[u8]) -> HostReport {
    let root = dir.join(format!("host-{name}"));
    let mut hca = HcaSpec::new("mlx5_0", Guid(node_guid), "0000:01:00.0");
    for p in ports {
        hca = hca.with_port(PortSpec::infiniband(u32::from(*p)));
    }
    write_host(&root, &HostSpec::new(name).with_hca(hca)).unwrap();
    weft_agent::discover(&root).unwrap()
}

async fn enroll(base: &str, admin: &Client, name: &str) -> Client {
    let token = admin.create_enrollment(Some(name)).await.unwrap().token;
    let anon = Client::new(base, None, Duration::from_secs(30)).unwrap();
    let e = anon.enroll(&token, name).await.unwrap();
    anon.with_token(Some(e.secret))
}

/// `agents` enrolled agents of the controller at `base`, each with its report.
async fn fleet(
    dir: &std::path::Path,
    base: &str,
    admin: &Client,
    agents: usize,
) -> Vec<(Client, HostReport)> {
    // One discovered report, cloned with each agent's name and GUIDs.
    let template = host_report(dir, "template", 0x0100_0000_0000, &[1]);
    let mut clients = Vec::new();
    for i in 0..agents {
        let name = format!("sim{i}");
        let mut r = template.clone();
        r.hostname = name.clone();
        let g = 0x0100_0000_0000 + (i as u64 + 1) * 0x100;
        r.rdma[0].node_guid = Guid(g);
        r.rdma[0].ports[0].port_guid = Guid(g + 1);
        clients.push((enroll(base, admin, &name).await, r));
    }
    clients
}

/// Every agent reports for `secs`: back to back (`period` None), or once per `period` at a
/// random phase. Answers the sorted latencies (ms), the errors and the elapsed seconds.
async fn drive(
    clients: &[(Client, HostReport)],
    secs: u64,
    period: Option<Duration>,
) -> (Vec<f64>, u64, f64) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    let start = Instant::now();
    let mut tasks = Vec::new();
    for (i, (c, r)) in clients.iter().enumerate() {
        let (c, r) = (c.clone(), r.clone());
        // A phase spread evenly over the period (deterministic, no RNG needed).
        let phase = period.map(|p| p.mul_f64(i as f64 / clients.len() as f64));
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let mut errors = 0u64;
            if let Some(ph) = phase {
                tokio::time::sleep(ph).await;
            }
            let mut next = Instant::now();
            while Instant::now() < deadline {
                let t = Instant::now();
                match c.report(&r).await {
                    Ok(_) => lat.push(t.elapsed().as_secs_f64() * 1e3),
                    Err(_) => errors += 1,
                }
                if let Some(p) = period {
                    next += p;
                    tokio::time::sleep_until(next.into()).await;
                }
            }
            (lat, errors)
        }));
    }
    let mut all = Vec::new();
    let mut errors = 0;
    for t in tasks {
        let (l, e) = t.await.unwrap();
        all.extend(l);
        errors += e;
    }
    all.sort_by(f64::total_cmp);
    (all, errors, start.elapsed().as_secs_f64())
}

async fn reports(agents: usize, secs: u64) {
    let dir = tempfile::tempdir().unwrap();
    let (base, admin) = controller(dir.path(), Arc::new(RecordingFabric::default())).await;
    let clients = fleet(dir.path(), &base, &admin, agents).await;
    let (all, errors, elapsed) = drive(&clients, secs, None).await;
    println!(
        "reports: {agents} agents, {secs} s: {} reports, {:.0} reports/s, latency p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms, {errors} errors",
        all.len(),
        all.len() as f64 / elapsed,
        pct(&all, 0.5),
        pct(&all, 0.99),
        all.last().copied().unwrap_or(f64::NAN),
    );
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    pct(&v, 0.5)
}

/// The same fleet against SQLite and PostgreSQL, alternating, `rounds` times.
async fn stores(agents: usize, secs: u64, rounds: usize, period: Duration) {
    // Durable like SQLite's WAL with synchronous=NORMAL: fsync on, commits not waited for.
    // `--pg-no-fsync`: fsync off, to tell the disk's part from the code's.
    let start = if std::env::args().any(|a| a == "--pg-no-fsync") {
        weft_testbed::Postgres::start
    } else {
        weft_testbed::Postgres::start_durable
    };
    let pg = tokio::task::block_in_place(start)
        .expect("PostgreSQL (Debian's postgresql package) for --stores");
    println!(
        "postgresql: fsync {}, full_page_writes {}, synchronous_commit {}",
        pg.psql("SHOW fsync").unwrap().trim(),
        pg.psql("SHOW full_page_writes").unwrap().trim(),
        pg.psql("SHOW synchronous_commit").unwrap().trim()
    );
    let dir = tempfile::tempdir().unwrap();
    let sqlite: Arc<dyn Store> =
        Arc::new(SqliteStore::open(&dir.path().join("controller.db")).unwrap());
    let url = pg.database("bench").unwrap();
    let postgres: Arc<dyn Store> =
        Arc::new(tokio::task::block_in_place(|| PgStore::open(&url, true)).unwrap());
    let mut fleets = Vec::new();
    for (name, store) in [("sqlite", sqlite), ("postgresql", postgres)] {
        let (base, admin) = controller_on(store, Arc::new(RecordingFabric::default())).await;
        let clients = fleet(&dir.path().join(name), &base, &admin, agents).await;
        fleets.push((name, clients));
    }
    // (store, mode) -> each round's (p50, p99, reports/s, errors)
    type Round = (f64, f64, f64, u64);
    let mut got: std::collections::BTreeMap<(&str, &str), Vec<Round>> = Default::default();
    for round in 0..rounds {
        for (name, clients) in &fleets {
            for (mode, p) in [("paced", Some(period)), ("back to back", None)] {
                let (all, errors, elapsed) = drive(clients, secs, p).await;
                let row = (
                    pct(&all, 0.5),
                    pct(&all, 0.99),
                    all.len() as f64 / elapsed,
                    errors,
                );
                println!(
                    "round {round} {name:>10} {mode:>12}: {:>7} reports, {:>6.0}/s, p50 {:>7.2} ms, p99 {:>7.2} ms, {errors} errors",
                    all.len(),
                    row.2,
                    row.0,
                    row.1
                );
                got.entry((name, mode)).or_default().push(row);
            }
        }
    }
    println!(
        "\n{agents} agents, {rounds} rounds of {secs} s each; paced: one report per agent every {} ms",
        period.as_millis()
    );
    for mode in ["paced", "back to back"] {
        let m =
            |store: &str, f: fn(&Round) -> f64| median(got[&(store, mode)].iter().map(f).collect());
        let (s50, s99, srate) = (
            m("sqlite", |r| r.0),
            m("sqlite", |r| r.1),
            m("sqlite", |r| r.2),
        );
        let (p50, p99, prate) = (
            m("postgresql", |r| r.0),
            m("postgresql", |r| r.1),
            m("postgresql", |r| r.2),
        );
        let errors: u64 = got
            .iter()
            .filter(|((_, md), _)| *md == mode)
            .flat_map(|(_, v)| v.iter().map(|r| r.3))
            .sum();
        println!(
            "{mode}: median p50 sqlite {s50:.2} ms, postgresql {p50:.2} ms; median p99 sqlite {s99:.2} ms, postgresql {p99:.2} ms, ratio {:.2}; reports/s sqlite {srate:.0}, postgresql {prate:.0}; {errors} errors",
            p99 / s99
        );
    }
}

/// `group move` to verified ports; with `over_ssh`, each SM is reached through its own real
/// sshd on loopback (strict host keys, key auth, connection multiplexing), as in production.
async fn moves(runs: usize, over_ssh: bool) {
    let topology = Topology::fat_tree(4, 2, 32, 4);
    let setup = tokio::task::spawn_blocking(move || -> Result<_, String> {
        let mut fabric = SimFabric::start(&topology).map_err(|e| e.to_string())?;
        let mut sms = Vec::new();
        let mut sshds = Vec::new();
        for (name, host, prio) in [("primary", "smhost", 10u8), ("standby", "smhost2", 5)] {
            let etc = fabric.dir().join(format!("{name}-etc"));
            std::fs::create_dir_all(&etc).map_err(|e| e.to_string())?;
            let file = etc.join("partitions.conf");
            std::fs::write(&file, "Default=0x7fff, ipoib : ALL=full ;\n")
                .map_err(|e| e.to_string())?;
            let h = fabric
                .start_sm(SmSpec::new(name, host, prio, &file))
                .map_err(|e| e.to_string())?;
            if over_ssh {
                let d = Sshd::start().map_err(|e| e.to_string())?;
                let mut c =
                    SshConfig::new(d.host(), d.user(), d.identity_file(), d.known_hosts_file());
                c.port = d.port();
                let paths = RemotePaths {
                    partitions_file: file,
                    pid_file: h.pid_file.clone(),
                    log_file: h.log_file.clone(),
                };
                let sm = SshSm::new(h.name.clone(), Guid(h.port_guid), c, paths)
                    .map_err(|e| e.to_string())?;
                sms.push(Box::new(sm) as Box<dyn SmHost>);
                sshds.push(d);
            } else {
                sms.push(Box::new(LocalSm {
                    name: h.name.clone(),
                    port_guid: Guid(h.port_guid),
                    partitions_file: file,
                    pid_file: h.pid_file.clone(),
                    log_file: h.log_file.clone(),
                }) as Box<dyn SmHost>);
            }
        }
        let applier = Applier {
            sms,
            diag: DiagTools {
                env: fabric.client_env("smhost"),
                cwd: Some(fabric.dir().to_path_buf()),
                timeout: Duration::from_secs(10),
                parallel: 4,
            },
            sm_options: Default::default(),
            verify_scope: VerifyScope::Changed,
            sweep_timeout: Duration::from_secs(10),
            verify_timeout: Duration::from_secs(5),
        };
        Ok((fabric, applier, sshds))
    })
    .await
    .unwrap();
    let (fabric, applier, sshds) = match setup {
        Ok(v) => v,
        Err(e) => {
            println!("move: skipped (no simulated fabric: {e})");
            return;
        }
    };
    let dir = tempfile::tempdir().unwrap();
    let (base, admin) = controller(dir.path(), Arc::new(OpenSmFabric { applier })).await;
    let hcas: Vec<_> = fabric
        .topology()
        .end_nodes()
        .filter(|h| h.name.starts_with("node"))
        .cloned()
        .collect();
    for h in &hcas {
        let ports: Vec<u8> = h.port_guids.iter().map(|(p, _)| *p).collect();
        let report = host_report(dir.path(), &h.name, h.node_guid, &ports);
        enroll(&base, &admin, &h.name)
            .await
            .report(&report)
            .await
            .unwrap();
    }
    admin.create_tenant("alice").await.unwrap();
    admin.create_tenant("bob").await.unwrap();
    admin.create_group("a", "alice").await.unwrap();
    admin.create_group("b", "bob").await.unwrap();
    let mut last = 0;
    for (i, h) in hcas.iter().enumerate() {
        let g = if i < hcas.len() / 2 { "a" } else { "b" };
        last = admin
            .add_member(g, &h.name)
            .await
            .unwrap()
            .operation
            .unwrap()
            .id;
    }
    admin
        .wait_applied(last, Duration::from_secs(60))
        .await
        .unwrap();
    let mut times = Vec::new();
    for run in 0..runs {
        let to = if run % 2 == 0 { "b" } else { "a" };
        let t = Instant::now();
        let op = admin
            .move_server("node5", to)
            .await
            .unwrap()
            .operation
            .unwrap();
        admin
            .wait_applied(op.id, Duration::from_secs(60))
            .await
            .unwrap();
        times.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let mut sorted = times.clone();
    sorted.sort_by(f64::total_cmp);
    println!(
        "move: {} HCAs, primary + standby {}, {runs} moves of node5: median {:.0} ms, min {:.0} ms, max {:.0} ms (all: {:?}); target 2000 ms; median/target = {:.2}",
        hcas.len(),
        if over_ssh {
            "each behind its own sshd"
        } else {
            "local"
        },
        pct(&sorted, 0.5),
        sorted[0],
        sorted[sorted.len() - 1],
        times.iter().map(|t| t.round() as u64).collect::<Vec<_>>(),
        pct(&sorted, 0.5) / 2000.0
    );
    drop(fabric);
    drop(sshds);
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` runs this too: keep it short then.
    let quick = !std::env::args().any(|a| a == "--bench");
    let agents = arg("--agents", if quick { 20 } else { 1000 }) as usize;
    let secs = arg("--secs", if quick { 1 } else { 10 });
    let runs = arg("--runs", if quick { 1 } else { 9 }) as usize;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    if std::env::args().any(|a| a == "--stores") {
        let period = Duration::from_millis(arg("--period-ms", 1000));
        let rounds = arg("--runs", if quick { 1 } else { 3 }) as usize;
        rt.block_on(stores(agents, secs, rounds, period));
        return;
    }
    rt.block_on(async {
        reports(agents, secs).await;
        if !quick || std::env::args().any(|a| a == "--moves") {
            moves(runs, false).await;
            moves(runs, true).await;
        }
    });
}
