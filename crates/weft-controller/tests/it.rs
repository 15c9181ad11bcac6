//! The controller over real HTTP on loopback: agents enrolling and reporting, tokens and
//! roles, GUID claims, staleness, retries, and (with the real OpenSM on an ibsim fabric,
//! primary and standby) groups created, moved and removed with every port verified.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;
use weft_agent::fixtures::{HcaSpec, HostSpec, PortSpec, write_host};
use weft_controller::agent::{AgentConfig, AgentError};
use weft_controller::auth::Secret;
use weft_controller::client::Client;
use weft_controller::model::{Liveness, OpState};
use weft_controller::reconcile::{Fabric, OpenSmFabric, RecordingFabric};
use weft_controller::store::SqliteStore;
use weft_controller::tls::{ClientTls, ServerTls};
use weft_controller::{Controller, ControllerConfig, StartError, local, serve, serve_tls};
use weft_fabric::Guid;

const ADMIN: &str = "wfa_test-admin-token-0123456789abcdef";

struct Ctl {
    base: String,
    metrics: String,
    admin: Client,
    dir: tempfile::TempDir,
    stop: watch::Sender<bool>,
    /// How the clients trust it (a pin when it speaks TLS).
    trust: ClientTls,
}

impl Ctl {
    async fn start(fabric: Arc<dyn Fabric>, stale_after_s: u64) -> Ctl {
        Ctl::start_limited(fabric, stale_after_s, Default::default()).await
    }

    async fn start_limited(
        fabric: Arc<dyn Fabric>,
        stale_after_s: u64,
        rate_limit: weft_controller::input::RateLimit,
    ) -> Ctl {
        Ctl::start_with(fabric, stale_after_s, rate_limit, false).await
    }

    /// A controller with a self-signed certificate (in its directory), its clients
    /// pinning it.
    async fn start_tls(fabric: Arc<dyn Fabric>) -> Ctl {
        Ctl::start_with(fabric, 30, Default::default(), true).await
    }

    async fn start_with(
        fabric: Arc<dyn Fabric>,
        stale_after_s: u64,
        rate_limit: weft_controller::input::RateLimit,
        with_tls: bool,
    ) -> Ctl {
        let config = ControllerConfig {
            admin_token: Some(Secret::new(ADMIN)),
            stale_after_s,
            recheck: Duration::from_secs(5),
            max_backoff: Duration::from_millis(500),
            rate_limit,
            ..ControllerConfig::default()
        };
        Ctl::start_config(fabric, config, with_tls).await
    }

    /// A controller with this configuration (its admin token must be [`ADMIN`]).
    async fn start_config(
        fabric: Arc<dyn Fabric>,
        config: ControllerConfig,
        with_tls: bool,
    ) -> Ctl {
        let dir = tempfile::tempdir().unwrap();
        let tls = with_tls.then(|| {
            ServerTls::self_signed(
                &dir.path().join("ctl.crt"),
                &dir.path().join("ctl.key"),
                &["localhost".into(), "127.0.0.1".into()],
            )
            .unwrap()
            .0
        });
        let trust = ClientTls {
            pin: tls.as_ref().map(|t| t.fingerprint().to_string()),
            ..ClientTls::default()
        };
        let store = SqliteStore::open(&dir.path().join("controller.db")).unwrap();
        let controller = Controller::start(Arc::new(store), fabric, config).unwrap();
        let api = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let metrics = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let scheme = if tls.is_some() { "https" } else { "http" };
        let base = format!("{scheme}://{}", local(&api));
        let metrics_url = format!("{scheme}://{}/metrics", local(&metrics));
        let (stop, mut rx) = watch::channel(false);
        tokio::spawn(serve_tls(controller, api, Some(metrics), tls, async move {
            let _ = rx.wait_for(|s| *s).await;
        }));
        let admin = Client::with_tls(
            &base,
            Some(Secret::new(ADMIN)),
            Duration::from_secs(10),
            &trust,
        )
        .unwrap();
        Ctl {
            base,
            metrics: metrics_url,
            admin,
            dir,
            stop,
            trust,
        }
    }

    fn client(&self, token: Option<Secret>) -> Client {
        Client::with_tls(&self.base, token, Duration::from_secs(10), &self.trust).unwrap()
    }

    /// Writes a fixture host whose one HCA has `ports` InfiniBand ports (GUID = node
    /// GUID + port) and returns the agent's config with a fresh enrollment token.
    async fn agent(&self, name: &str, node_guid: u64, ports: &[u8]) -> AgentConfig {
        let root = self.dir.path().join(format!("host-{name}"));
        write_fixture(&root, name, node_guid, ports);
        let token = self.admin.create_enrollment(None).await.unwrap().token;
        let mut cfg = AgentConfig::new(
            &self.base,
            self.dir.path().join(format!("{name}.state")),
            root,
        );
        cfg.enroll_token = Some(token);
        cfg.tls = self.trust.clone();
        cfg.heartbeat = Duration::from_millis(300);
        cfg.rescan = Duration::from_millis(300);
        cfg.request_timeout = Duration::from_secs(3);
        cfg.max_backoff = Duration::from_millis(500);
        cfg
    }
}

impl Drop for Ctl {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

fn write_fixture(root: &Path, name: &str, node_guid: u64, ports: &[u8]) {
    let mut hca = HcaSpec::new("mlx5_0", Guid(node_guid), "0000:01:00.0");
    for p in ports {
        hca = hca.with_port(PortSpec::infiniband(u32::from(*p)));
    }
    write_host(root, &HostSpec::new(name).with_hca(hca)).unwrap();
}

fn spawn_agent(
    cfg: AgentConfig,
) -> (
    watch::Sender<bool>,
    tokio::task::JoinHandle<Result<(), AgentError>>,
) {
    let (tx, rx) = watch::channel(false);
    (tx, tokio::spawn(weft_controller::agent::run(cfg, rx)))
}

/// Polls `f` until it returns `Some`, at most `limit`.
async fn until<T, F, Fut>(what: &str, limit: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(
            start.elapsed() < limit,
            "timed out after {limit:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn servers_with_ports(admin: &Client, n: usize) {
    until("agents to report", Duration::from_secs(15), || async {
        let s = admin.servers().await.ok()?;
        (s.len() == n && s.iter().all(|s| !s.ports.is_empty())).then_some(())
    })
    .await
}

/// An agent for every `node*` host of `topology`, reporting to `ctl`, once every one of
/// them has reported its ports (an agent stops when its handle is dropped).
async fn agents_on_nodes(
    ctl: &Ctl,
    topology: &weft_testbed::Topology,
) -> Vec<(
    watch::Sender<bool>,
    tokio::task::JoinHandle<Result<(), AgentError>>,
)> {
    let mut agents = Vec::new();
    for h in topology.end_nodes().filter(|h| h.name.starts_with("node")) {
        let ports: Vec<u8> = h.port_guids.iter().map(|(p, _)| *p).collect();
        agents.push(spawn_agent(ctl.agent(&h.name, h.node_guid, &ports).await));
    }
    servers_with_ports(&ctl.admin, agents.len()).await;
    agents
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_token_is_refused_and_a_tenant_reads_only_its_own_groups() {
    let ctl = Ctl::start(Arc::new(RecordingFabric::default()), 30).await;
    // An agent with a made-up enrollment token is refused, and stops (no retry loop).
    let mut cfg = ctl.agent("node1", 0x0002_c903_0000_0100, &[1]).await;
    cfg.enroll_token = Some(Secret::new("wfe_not-a-real-token"));
    let (_stop, task) = spawn_agent(cfg);
    let err = tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .unwrap()
        .unwrap()
        .unwrap_err();
    assert!(matches!(err, AgentError::Refused(_)), "{err}");
    // A report with a made-up secret is refused too.
    let report = weft_agent::discover(&ctl.dir.path().join("host-node1")).unwrap();
    let e = ctl
        .client(Some(Secret::new("wfs_forged")))
        .report(&report)
        .await
        .unwrap_err();
    assert_eq!(e.status(), Some(401), "{e}");
    // No token at all.
    assert_eq!(
        ctl.client(None).groups().await.unwrap_err().status(),
        Some(401)
    );

    let alice = ctl.admin.create_tenant("alice").await.unwrap();
    let bob = ctl.admin.create_tenant("bob").await.unwrap();
    ctl.admin.create_group("a", "alice").await.unwrap();
    ctl.admin.create_group("b", "bob").await.unwrap();
    let as_alice = ctl.client(Some(alice.token.clone()));
    let groups = as_alice.groups().await.unwrap();
    assert_eq!(
        groups.iter().map(|g| g.name.as_str()).collect::<Vec<_>>(),
        ["a"]
    );
    assert_eq!(as_alice.group("a").await.unwrap().tenant, "alice");
    // Bob's group answers alice exactly like a group that does not exist.
    let e = as_alice.group("b").await.unwrap_err();
    assert_eq!(e.status(), Some(404), "{e}");
    assert_eq!(
        ctl.client(Some(bob.token)).group("b").await.unwrap().tenant,
        "bob"
    );
    // Tenant tokens change nothing and read no servers or audit.
    assert_eq!(
        as_alice
            .create_group("c", "alice")
            .await
            .unwrap_err()
            .status(),
        Some(403)
    );
    assert_eq!(as_alice.servers().await.unwrap_err().status(), Some(403));
    assert_eq!(as_alice.audit(10).await.unwrap_err().status(), Some(403));
    // Secrets never reach the audit log.
    let audit = serde_json::to_string(&ctl.admin.audit(1000).await.unwrap()).unwrap();
    assert!(
        !audit.contains(alice.token.expose()) && !audit.contains(ADMIN),
        "{audit}"
    );
    assert!(audit.contains("refused"), "{audit}");
}

/// Link results (`--report-to`): an admin stores a run and is told its slow link; a tenant
/// reads only the links between its own nodes and may store none; a bad run (an unknown
/// field, a throughput out of range, a link to itself) is refused naming what is wrong, and
/// nothing of it is stored; the slow link is the metric `weft_link_below_expected`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn link_runs_are_stored_by_an_admin_read_per_tenant_and_refused_when_bad() {
    use weft_controller::links::{LinkResult, LinkRunIn, LinkSource};
    let ctl = Ctl::start(Arc::new(RecordingFabric::default()), 30).await;
    let mut agents = Vec::new();
    for (i, n) in ["node1", "node2", "node3"].iter().enumerate() {
        agents.push(spawn_agent(
            ctl.agent(n, 0x100 * (i as u64 + 1), &[1]).await,
        ));
    }
    servers_with_ports(&ctl.admin, 3).await;
    let alice = ctl.admin.create_tenant("alice").await.unwrap();
    ctl.admin.create_group("a", "alice").await.unwrap();
    ctl.admin.add_member("a", "node1").await.unwrap();
    ctl.admin.add_member("a", "node2").await.unwrap();
    let link = |src: &str, dst: &str, gbps: f64| LinkResult {
        src: src.into(),
        dst: dst.into(),
        nic: "ib0".into(),
        gbps,
        rtt_us: Some(5.0),
        error: None,
    };
    let run = LinkRunIn {
        source: LinkSource::P2p,
        results: vec![
            link("node1", "node2", 10.0),
            link("node2", "node1", 10.0),
            link("node1", "node3", 4.0),
            link("node3", "node1", 10.0),
        ],
    };
    let accepted = ctl.admin.add_link_run(&run).await.unwrap();
    assert_eq!(accepted.run.results, run.results);
    assert_eq!(accepted.slow.len(), 1, "{:?}", accepted.slow);
    assert_eq!(
        (accepted.slow[0].src.as_str(), accepted.slow[0].dst.as_str()),
        ("node1", "node3")
    );
    // Alice: the links between node1 and node2, and no flagged one (node3 is not hers).
    let as_alice = ctl.client(Some(alice.token.clone()));
    let runs = as_alice.link_runs(10).await.unwrap();
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0].results, run.results[..2]);
    assert!(as_alice.link_health().await.unwrap().pairs.is_empty());
    assert_eq!(ctl.admin.link_health().await.unwrap().pairs.len(), 1);
    let e = as_alice.add_link_run(&run).await.unwrap_err();
    assert_eq!(e.status(), Some(403), "{e}");
    // Bad runs: refused, named, nothing stored.
    let http = reqwest::Client::new();
    let post = |body: serde_json::Value| {
        http.post(format!("{}/v1/link-results", ctl.base))
            .bearer_auth(ADMIN)
            .json(&body)
            .send()
    };
    let one = serde_json::json!({"src": "node1", "dst": "node2", "nic": "ib0", "gbps": 1.0});
    for (body, says) in [
        (
            serde_json::json!({"source": "p2p", "results": [one], "scope": "all"}),
            "unknown field `scope`",
        ),
        (
            serde_json::json!({"source": "p2p", "results": [one, {"src": "node1", "dst": "node2", "nic": "ib0", "gbps": 1e6}]}),
            "results[1].gbps",
        ),
        (
            serde_json::json!({"source": "p2p", "results": [{"src": "node1", "dst": "node1", "nic": "ib0", "gbps": 1.0}]}),
            "results[0].dst",
        ),
        (
            serde_json::json!({"source": "p2p", "results": [{"src": "node1", "dst": "node2", "nic": "ib0", "gbps": 1.0, "note": "x"}]}),
            "unknown field `note`",
        ),
        (
            serde_json::json!({"source": "iperf", "results": [one]}),
            "source",
        ),
    ] {
        let r = post(body.clone()).await.unwrap();
        let status = r.status().as_u16();
        let text = r.text().await.unwrap();
        assert_eq!(status, 400, "{body}: {text}");
        assert!(text.contains(says), "{body}: {text}");
    }
    assert_eq!(ctl.admin.link_runs(10).await.unwrap().len(), 1);
    let metrics = reqwest::get(&ctl.metrics)
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("weft_link_below_expected{node=\"node1\",nic=\"ib0\",source=\"p2p\"} 1"),
        "{metrics}"
    );
    drop(agents);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guid_another_server_owns_is_held_pending_and_visible_until_approved() {
    let ctl = Ctl::start(Arc::new(RecordingFabric::default()), 30).await;
    let (_s1, _t1) = spawn_agent(ctl.agent("node1", 0x100, &[1]).await);
    servers_with_ports(&ctl.admin, 1).await;
    // node2's fixture claims node1's port GUID 0x101 (a card moved, or a forged report).
    let (_s2, _t2) = spawn_agent(ctl.agent("node2", 0x100, &[1]).await);
    let claim = until("the claim", Duration::from_secs(10), || async {
        ctl.admin.claims().await.ok()?.into_iter().next()
    })
    .await;
    assert_eq!(
        (
            claim.guid,
            claim.claimant.as_str(),
            claim.owner.as_str(),
            claim.state.as_str()
        ),
        (Guid(0x101), "node2", "node1", "pending")
    );
    let servers = ctl.admin.servers().await.unwrap();
    let node2 = servers.iter().find(|s| s.name == "node2").unwrap();
    assert!(
        node2.ports.is_empty() && node2.pending_claims == [Guid(0x101)],
        "{node2:?}"
    );
    ctl.admin.approve_claim(claim.id).await.unwrap();
    let servers = ctl.admin.servers().await.unwrap();
    assert_eq!(
        servers.iter().find(|s| s.name == "node2").unwrap().ports[0].guid,
        Guid(0x101)
    );
    assert!(
        servers
            .iter()
            .find(|s| s.name == "node1")
            .unwrap()
            .ports
            .is_empty()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_stops_reporting_is_shown_stale() {
    let ctl = Ctl::start(Arc::new(RecordingFabric::default()), 1).await;
    let (stop, task) = spawn_agent(ctl.agent("node1", 0x100, &[1]).await);
    servers_with_ports(&ctl.admin, 1).await;
    assert_eq!(ctl.admin.servers().await.unwrap()[0].liveness, Liveness::Ok);
    stop.send(true).unwrap();
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    until("staleness", Duration::from_secs(6), || async {
        (ctl.admin.servers().await.ok()?[0].liveness == Liveness::Stale).then_some(())
    })
    .await;
    assert_eq!(ctl.admin.status().await.unwrap().stale_servers, ["node1"]);
    let metrics = reqwest::get(&ctl.metrics)
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("weft_servers{liveness=\"stale\"} 1"),
        "{metrics}"
    );
    assert!(metrics.contains("weft_agent_reports_total"), "{metrics}");
    promtool_accepts(&ctl.metrics).await;
}

/// A scrape of `url` says what it is: the classic text format by default, which
/// `promtool check metrics` passes, and OpenMetrics (ending in `# EOF`) when asked for.
async fn promtool_accepts(url: &str) {
    let r = reqwest::get(url).await.unwrap();
    let ty = r.headers()["content-type"].to_str().unwrap().to_owned();
    assert!(ty.starts_with("text/plain; version=0.0.4"), "{ty}");
    let body = r.text().await.unwrap();
    assert!(!body.contains("# EOF"), "{body}");
    if !std::path::Path::new("/usr/bin/promtool").exists() {
        weft_netns::require::skip(
            "promtool_accepts",
            "promtool (Debian package prometheus) is not installed",
        );
        return;
    }
    let mut child = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(body.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics: {}{}\n{body}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let om = reqwest::Client::new()
        .get(url)
        .header("accept", "application/openmetrics-text; version=1.0.0")
        .send()
        .await
        .unwrap();
    assert!(
        om.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("application/openmetrics-text")
    );
    assert!(om.text().await.unwrap().ends_with("# EOF\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_delivery_is_retried_with_backoff_and_audited() {
    let fabric = Arc::new(RecordingFabric::default());
    *fabric.fail_next.lock().unwrap() = 2;
    let ctl = Ctl::start(fabric.clone(), 30).await;
    ctl.admin.create_tenant("alice").await.unwrap();
    let op = ctl
        .admin
        .create_group("a", "alice")
        .await
        .unwrap()
        .operation
        .unwrap();
    let done = ctl
        .admin
        .wait_applied(op.id, Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!((done.state, done.attempts), (OpState::Applied, 2));
    let audit = ctl.admin.audit(100).await.unwrap();
    let outcomes: Vec<&str> = audit
        .iter()
        .filter(|a| a.action == "apply")
        .map(|a| a.outcome.as_str())
        .collect();
    assert_eq!(outcomes, ["failed", "failed", "applied"]);
    assert!(
        fabric
            .delivered
            .lock()
            .unwrap()
            .last()
            .unwrap()
            .contains("a=0x0a01")
    );
}

/// A delivery that leaves a standby out (its host unreachable) applies the operation (the
/// ports verified through the master) and is delivered again, with backoff, until every
/// SM holds the file; the audit log says when the SM fell behind and when it caught up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_degraded_delivery_is_applied_audited_and_delivered_again_until_in_sync() {
    let fabric = Arc::new(RecordingFabric::default());
    *fabric.degrade_next.lock().unwrap() = 2;
    let ctl = Ctl::start(fabric.clone(), 30).await;
    ctl.admin.create_tenant("alice").await.unwrap();
    let op = ctl
        .admin
        .create_group("a", "alice")
        .await
        .unwrap()
        .operation
        .unwrap();
    let done = ctl
        .admin
        .wait_applied(op.id, Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!((done.state, done.attempts), (OpState::Applied, 0));
    // Two degraded deliveries, then one that reaches every SM; then nothing more.
    let in_sync = until("the standby in sync", Duration::from_secs(10), || async {
        let audit = ctl.admin.audit(100).await.ok()?;
        audit
            .iter()
            .any(|a| a.action == "sm" && a.outcome == "in-sync")
            .then_some(audit)
    })
    .await;
    let sm: Vec<(&str, &str)> = in_sync
        .iter()
        .filter(|a| a.action == "sm")
        .map(|a| (a.subject.as_str(), a.outcome.as_str()))
        .collect();
    assert_eq!(sm, [("sm standby", "degraded"), ("sm standby", "in-sync")]);
    let applied = in_sync
        .iter()
        .find(|a| a.action == "apply" && a.subject == format!("operation {}", op.id))
        .unwrap();
    assert_eq!(applied.outcome, "applied");
    assert!(
        applied.detail.contains("degraded") && applied.detail.contains("`standby`"),
        "{applied:?}"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let delivered = fabric.delivered.lock().unwrap().clone();
    assert_eq!(delivered.len(), 3, "{delivered:?}");
    assert!(delivered.iter().all(|d| d == &delivered[0]));
    let metrics = reqwest::get(&ctl.metrics)
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(metrics.contains("outcome=\"degraded\"} 2"), "{metrics}");
}

/// A controller that starts on a store with an applied state delivers that state once
/// more (an SM may have missed it while no controller ran), and then nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_started_controller_delivers_the_applied_state_once_more() {
    let fabric = Arc::new(RecordingFabric::default());
    let ctl = Ctl::start(fabric.clone(), 30).await;
    ctl.admin.create_tenant("alice").await.unwrap();
    let op = ctl
        .admin
        .create_group("a", "alice")
        .await
        .unwrap()
        .operation
        .unwrap();
    ctl.admin
        .wait_applied(op.id, Duration::from_secs(10))
        .await
        .unwrap();
    let last = fabric.delivered.lock().unwrap().last().cloned().unwrap();

    let store: Arc<SqliteStore> =
        Arc::new(SqliteStore::open(&ctl.dir.path().join("controller.db")).unwrap());
    let again = Arc::new(RecordingFabric::default());
    let config = ControllerConfig {
        admin_token: Some(Secret::new(ADMIN)),
        recheck: Duration::from_secs(5),
        max_backoff: Duration::from_millis(500),
        ..ControllerConfig::default()
    };
    // While the first controller runs, a second one on the same store refuses to start,
    // naming the holder of the store's lease.
    let err = Controller::start(store.clone(), again.clone(), config.clone())
        .err()
        .expect("a second controller on one store must not start");
    let text = err.to_string();
    assert!(
        matches!(err, StartError::Leased { .. })
            && text.contains(&format!("pid {}", std::process::id())),
        "{text}"
    );
    assert!(again.delivered.lock().unwrap().is_empty());
    // Once the first one stopped (its lease given back), the second starts.
    let _ = ctl.stop.send(true);
    let second = until("the lease given back", Duration::from_secs(10), || {
        let r = Controller::start(store.clone(), again.clone(), config.clone()).ok();
        async move { r }
    })
    .await;
    until(
        "the applied state delivered again",
        Duration::from_secs(10),
        || async { (!again.delivered.lock().unwrap().is_empty()).then_some(()) },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(*again.delivered.lock().unwrap(), [last]);
    drop(second);
}

/// The router and `/openapi.json` come from the same `routes!` lists: no route is added
/// beside them (a plain `.route(` in the API's source fails here), every documented
/// operation is served (a request without a token reaches its handler and gets a status
/// the document lists for it, never axum's 404 or 405), and the document passes
/// openapi-spec-validator.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openapi_describes_every_route() {
    let ctl = Ctl::start(Arc::new(RecordingFabric::default()), 30).await;
    let doc: serde_json::Value = reqwest::get(format!("{}/openapi.json", ctl.base))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    for (file, src) in [
        ("api.rs", include_str!("../src/api.rs")),
        ("server.rs", include_str!("../src/server.rs")),
    ] {
        for line in src.lines().filter(|l| l.contains(".route(\"")) {
            // `/metrics` is served on its own listener, outside the API and its document.
            assert!(
                file == "server.rs" && line.contains("\"/metrics\""),
                "{file}: `{}` adds a route outside utoipa-axum's routes!, so /openapi.json does not describe it",
                line.trim()
            );
        }
    }
    let http = reqwest::Client::new();
    let mut served = 0;
    for (path, item) in doc["paths"].as_object().unwrap() {
        let concrete: String = path
            .split('/')
            .map(|seg| if seg.starts_with('{') { "1" } else { seg })
            .collect::<Vec<_>>()
            .join("/");
        for (method, op) in item.as_object().unwrap() {
            let m = reqwest::Method::from_bytes(method.to_uppercase().as_bytes()).unwrap();
            let r = http
                .request(m, format!("{}{concrete}", ctl.base))
                .send()
                .await
                .unwrap();
            let status = r.status().as_u16();
            let ty = r
                .headers()
                .get("content-type")
                .map(|v| v.to_str().unwrap().to_string())
                .unwrap_or_default();
            assert!(
                op["responses"].get(status.to_string()).is_some(),
                "{method} {path} answered {status}, which its operation does not document"
            );
            // A handler's 404 carries the JSON error; the router's own has no body.
            assert!(
                status != 404 || ty.starts_with("application/json"),
                "{method} {path}: not routed"
            );
            served += 1;
        }
    }
    assert!(served >= 29, "{served} operations");
    // The document is valid OpenAPI by an independent validator (path parameters declared,
    // every status documented, schemas well-formed).
    let file = ctl.dir.path().join("openapi.json");
    std::fs::write(&file, doc.to_string()).unwrap();
    let out = std::process::Command::new("python3")
        .args(["-m", "openapi_spec_validator"])
        .arg(&file)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if text.contains("No module named openapi_spec_validator") {
        weft_netns::require::skip(
            "openapi_describes_every_route",
            "openapi-spec-validator (PyPI) is not installed",
        );
        return;
    }
    assert!(out.status.success() && text.contains(": OK"), "{text}");
}

// ---------------------------------------------------------------- the real fabric

mod failover;
mod fencing;
mod storage;

mod fabric {
    use super::*;
    use weft_fabric::conf;
    use weft_opensm::{Applier, DiagTools, LocalSm, SmHost, VerifyScope};
    use weft_testbed::{SimFabric, SmSpec, Topology};

    pub struct Bed {
        pub fabric: SimFabric,
        pub sms: Vec<(weft_testbed::SmHandle, PathBuf)>,
    }

    pub fn bed(topology: &Topology) -> Bed {
        let mut fabric = SimFabric::start(topology).expect("ibsim starts");
        let mut sms = Vec::new();
        for (name, host, priority) in [("primary", "smhost", 10u8), ("standby", "smhost2", 5)] {
            let etc = fabric.dir().join(format!("{name}-etc"));
            std::fs::create_dir_all(&etc).unwrap();
            let file = etc.join("partitions.conf");
            std::fs::write(&file, "Default=0x7fff, ipoib : ALL=full ;\n").unwrap();
            let h = fabric
                .start_sm(SmSpec::new(name, host, priority, &file))
                .expect("OpenSM starts");
            sms.push((h, file));
        }
        Bed { fabric, sms }
    }

    impl Bed {
        pub fn applier(&self) -> Applier {
            Applier {
                sms: self
                    .sms
                    .iter()
                    .map(|(h, file)| {
                        Box::new(LocalSm {
                            name: h.name.clone(),
                            port_guid: Guid(h.port_guid),
                            partitions_file: file.clone(),
                            pid_file: h.pid_file.clone(),
                            log_file: h.log_file.clone(),
                        }) as Box<dyn SmHost>
                    })
                    .collect(),
                diag: DiagTools {
                    env: self.fabric.client_env("smhost"),
                    cwd: Some(self.fabric.dir().to_path_buf()),
                    timeout: Duration::from_secs(10),
                    parallel: 4,
                },
                sm_options: Default::default(),
                verify_scope: VerifyScope::All,
                sweep_timeout: Duration::from_secs(10),
                verify_timeout: Duration::from_secs(5),
            }
        }

        /// Both SMs hold the same file, and every end port's table is what that file
        /// says. Returns the tables by node name.
        pub fn verified(&self) -> std::collections::BTreeMap<String, Vec<u16>> {
            let primary = std::fs::read_to_string(&self.sms[0].1).unwrap();
            let standby = std::fs::read_to_string(&self.sms[1].1).unwrap();
            assert_eq!(primary, standby, "primary and standby differ");
            let conf = conf::parse(&primary).unwrap();
            let a = self.applier();
            let v = a.verify(&conf).unwrap();
            assert!(v.mismatches.is_empty(), "{:?}\n{primary}", v.mismatches);
            let snap = a.diag.snapshot().unwrap();
            self.fabric
                .topology()
                .end_nodes()
                .filter(|h| h.name.starts_with("node"))
                .map(|h| {
                    let g = Guid(h.first_port_guid().unwrap());
                    (
                        h.name.clone(),
                        snap.tables.0.get(&g).cloned().unwrap_or_default(),
                    )
                })
                .collect()
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_agents_two_tenants_a_move_and_a_removal_each_verified_on_every_port() {
    let topology = weft_testbed::Topology::single_switch(4);
    let bed = tokio::task::block_in_place(|| fabric::bed(&topology));
    let ctl = Ctl::start(
        Arc::new(OpenSmFabric {
            applier: bed.applier(),
        }),
        30,
    )
    .await;
    let agents = agents_on_nodes(&ctl, &topology).await;
    assert_eq!(agents.len(), 4);
    let wait = Duration::from_secs(30);
    ctl.admin.create_tenant("alice").await.unwrap();
    ctl.admin.create_tenant("bob").await.unwrap();
    ctl.admin.create_group("a", "alice").await.unwrap();
    ctl.admin.create_group("b", "bob").await.unwrap();
    let mut last = 0;
    for (g, s) in [
        ("a", "node1"),
        ("a", "node2"),
        ("b", "node3"),
        ("b", "node4"),
    ] {
        last = ctl
            .admin
            .add_member(g, s)
            .await
            .unwrap()
            .operation
            .unwrap()
            .id;
    }
    ctl.admin.wait_applied(last, wait).await.unwrap();
    let t = tokio::task::block_in_place(|| bed.verified());
    let (ka, kb) = (0x8a01u16, 0x8a02u16);
    assert!(
        t["node1"].contains(&ka) && t["node2"].contains(&ka) && !t["node1"].contains(&kb),
        "{t:x?}"
    );
    assert!(
        t["node3"].contains(&kb) && t["node4"].contains(&kb) && !t["node3"].contains(&ka),
        "{t:x?}"
    );

    // Move node2 from alice's group to bob's.
    let op = ctl
        .admin
        .move_server("node2", "b")
        .await
        .unwrap()
        .operation
        .unwrap();
    assert!(
        op.diff.contains('-') && op.diff.contains('+'),
        "{}",
        op.diff
    );
    ctl.admin.wait_applied(op.id, wait).await.unwrap();
    let t = tokio::task::block_in_place(|| bed.verified());
    assert!(
        t["node2"].contains(&kb) && !t["node2"].contains(&ka),
        "{t:x?}"
    );
    assert!(
        t["node1"].contains(&ka) && t["node3"].contains(&kb),
        "{t:x?}"
    );

    // Remove alice's group: node1 keeps only the Default partition's limited key.
    let op = ctl
        .admin
        .delete_group("a")
        .await
        .unwrap()
        .operation
        .unwrap();
    ctl.admin.wait_applied(op.id, wait).await.unwrap();
    let t = tokio::task::block_in_place(|| bed.verified());
    assert!(
        !t["node1"].contains(&ka) && !t["node1"].contains(&kb),
        "{t:x?}"
    );
    assert!(
        t["node2"].contains(&kb) && t["node4"].contains(&kb),
        "{t:x?}"
    );

    let audit = ctl.admin.audit(1000).await.unwrap();
    assert!(
        audit
            .iter()
            .any(|a| a.action == "group.move" && a.diff.contains("+b=")),
        "{audit:?}"
    );
    assert!(
        audit
            .iter()
            .filter(|a| a.action == "apply")
            .all(|a| a.outcome == "applied"),
        "{audit:?}"
    );
    for (stop, _) in &agents {
        let _ = stop.send(true);
    }
}

/// The agent's own `/metrics`: enrollment, reports and heartbeats by outcome, the ports it
/// found, and requests that fail when the controller cannot be reached.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_exposes_its_requests_and_ports_as_metrics() {
    let ctl = Ctl::start(Arc::new(RecordingFabric::default()), 30).await;
    let metrics = Arc::new(weft_controller::metrics::AgentMetrics::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/metrics", local(&listener));
    tokio::spawn(metrics.clone().serve(listener));
    let mut cfg = ctl.agent("node1", 0x100, &[1, 2]).await;
    cfg.metrics = Some(metrics.clone());
    let (_stop, _task) = spawn_agent(cfg);
    let scrape = || async { reqwest::get(&url).await.ok()?.text().await.ok() };
    let text = until(
        "a heartbeat in the agent's metrics",
        Duration::from_secs(15),
        || async {
            let t = scrape().await?;
            t.contains("weft_agent_requests_total{kind=\"heartbeat\",outcome=\"ok\"}")
                .then_some(t)
        },
    )
    .await;
    assert!(
        text.contains("weft_agent_requests_total{kind=\"enroll\",outcome=\"ok\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("weft_agent_requests_total{kind=\"report\",outcome=\"ok\"} 1"),
        "{text}"
    );
    assert!(text.contains("weft_agent_rdma_ports 2"), "{text}");
    promtool_accepts(&url).await;
    // An agent whose controller cannot be reached counts its failed enrollments.
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let nowhere = format!("http://{}", local(&closed));
    drop(closed);
    let failing = Arc::new(weft_controller::metrics::AgentMetrics::default());
    let mut cfg = ctl.agent("node2", 0x200, &[1]).await;
    cfg.controller = nowhere;
    cfg.metrics = Some(failing.clone());
    let (_stop2, _task2) = spawn_agent(cfg);
    until("a failed enrollment", Duration::from_secs(15), || async {
        failing
            .encode()
            .contains("weft_agent_requests_total{kind=\"enroll\",outcome=\"error\"}")
            .then_some(())
    })
    .await;
}

/// POSTs `body` (raw JSON) to `path` with `token`; answers the status and the body text.
async fn post_raw(base: &str, path: &str, token: Option<&str>, body: String) -> (u16, String) {
    let mut req = reqwest::Client::new()
        .post(format!("{base}{path}"))
        .header("content-type", "application/json")
        .body(body);
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let resp = req.send().await.unwrap();
    (resp.status().as_u16(), resp.text().await.unwrap())
}

/// Regression: `POST /v1/tokens {"tenat":"alice"}` answered 201 with an admin token
/// (unknown fields ignored, a missing tenant read as admin), and `ttl_s = 2^64-1` made a
/// token already expired (or a panic in a debug build).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_misspelled_or_missing_field_mints_no_token_and_numbers_are_range_checked() {
    let ctl = Ctl::start(Arc::new(RecordingFabric::default()), 30).await;
    ctl.admin.create_tenant("alice").await.unwrap();
    let before = ctl.admin.tokens().await.unwrap().len();
    for body in [
        r#"{"tenat":"alice"}"#,
        r#"{"tennant":"alice"}"#,
        r#"{"Tenant":"alice"}"#,
        r#"{"tenant_name":"alice"}"#,
        r#"{}"#,
        r#"{"tenant":"alice"}"#,
        r#"{"role":"admin","tenant":"alice"}"#,
        r#"{"role":"tenant"}"#,
        r#"{"role":"root"}"#,
        r#"{"role":"admin","ttl_s":18446744073709551615}"#,
        r#"{"role":"tenant","tenant":"alice","ttl_s":0}"#,
        r#"{"role":"admin","ttl_s":-1}"#,
    ] {
        let (status, text) = post_raw(&ctl.base, "/v1/tokens", Some(ADMIN), body.into()).await;
        assert_eq!(status, 400, "{body} -> {status} {text}");
        let e: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert!(e["error"].is_string(), "{text}");
    }
    assert_eq!(ctl.admin.tokens().await.unwrap().len(), before);
    // Every other body refuses unknown fields too, and enrollment lifetimes are bounded.
    for (path, body) in [
        ("/v1/tenants", r#"{"name":"carol","admin":true}"#),
        (
            "/v1/groups",
            r#"{"name":"g","tenant":"alice","pkey":"0x7fff"}"#,
        ),
        ("/v1/moves", r#"{"server":"n","to":"g","force":true}"#),
        ("/v1/enrollments", r#"{"servr":"node1"}"#),
        ("/v1/enrollments", r#"{"ttl_s":18446744073709551615}"#),
        ("/v1/enrollments", r#"{"ttl_s":0}"#),
        (
            "/v1/agents/enroll",
            r#"{"token":"wfe_x","hostname":"n1","role":"admin"}"#,
        ),
    ] {
        let (status, text) = post_raw(&ctl.base, path, Some(ADMIN), body.into()).await;
        assert_eq!(status, 400, "{path} {body} -> {status} {text}");
    }
    assert!(
        ctl.admin
            .tenants()
            .await
            .unwrap()
            .iter()
            .all(|t| t.name != "carol")
    );
    // The explicit forms work, and a tenant token gets the default life.
    let (status, text) = post_raw(
        &ctl.base,
        "/v1/tokens",
        Some(ADMIN),
        r#"{"role":"tenant","tenant":"alice"}"#.into(),
    )
    .await;
    assert_eq!(status, 201, "{text}");
    let made: serde_json::Value = serde_json::from_str(&text).unwrap();
    let expires = made["expires"].as_u64().unwrap();
    let now = weft_controller::unix_now();
    assert!(
        (now + 89 * 86_400..=now + 91 * 86_400).contains(&expires),
        "{text}"
    );
    let as_alice = ctl.client(Some(Secret::new(made["token"].as_str().unwrap())));
    assert_eq!(as_alice.servers().await.unwrap_err().status(), Some(403));
}

/// Regression: a refused enrollment was audited with the caller's host name before the
/// name was checked, so 20 unauthenticated requests with a 1.9 MB name added 84 MB to
/// the append-only audit, and ESC, BEL and newlines in it reached `weft audit` raw.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unauthenticated_flood_leaves_the_store_bounded_and_no_control_character() {
    let limit = weft_controller::input::RateLimit {
        per_s: 0.5,
        burst: 10.0,
    };
    let ctl = Ctl::start_limited(Arc::new(RecordingFabric::default()), 30, limit).await;
    // The main file's size after folding the write-ahead log into it: the data kept.
    let db_bytes = |dir: &Path| -> u64 {
        let db = dir.join("controller.db");
        let c = rusqlite::Connection::open(&db).unwrap();
        c.busy_timeout(Duration::from_secs(5)).unwrap();
        c.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
            .unwrap();
        std::fs::metadata(&db).unwrap().len()
    };
    let audit_before = ctl.admin.audit(10_000).await.unwrap().len();
    let size_before = db_bytes(ctl.dir.path());
    let huge = format!("n{}", "x".repeat(1_900_000));
    let forged = "node1\x1b[2K\r2026-01-01 admin:0000 group.move\x07\nnode2";
    let mut statuses = std::collections::BTreeMap::<u16, usize>::new();
    let start = Instant::now();
    for i in 0..120 {
        let name = match i % 6 {
            0 => huge.as_str(),
            1 => forged,
            _ => "node9",
        };
        let body = serde_json::json!({ "token": "wfe_made-up", "hostname": name }).to_string();
        let (status, _) = post_raw(&ctl.base, "/v1/agents/enroll", None, body).await;
        *statuses.entry(status).or_default() += 1;
    }
    // Refused every time: too large, a bad name, an unknown token, or too many at once.
    assert!(
        statuses.keys().all(|s| [400, 401, 413, 429].contains(s)),
        "{statuses:?}"
    );
    // Bursts of 10, then one every 2 s.
    let limited = statuses.get(&429).copied().unwrap_or(0);
    let let_through = 120 - limited;
    let most = 10.0 + 0.5 * start.elapsed().as_secs_f64() + 1.0;
    assert!(
        limited > 0 && (let_through as f64) <= most,
        "{statuses:?} in {:?}",
        start.elapsed()
    );
    let grown = db_bytes(ctl.dir.path()).saturating_sub(size_before);
    assert!(grown < 64 * 1024, "the store grew by {grown} bytes");
    let audit = ctl.admin.audit(10_000).await.unwrap();
    let added = &audit[audit_before..];
    // Only refusals of a well-formed name are audited, and only until the rate limit.
    assert!(added.len() <= let_through, "{} audit lines", added.len());
    assert!(added.iter().all(|a| a.subject == "node9"), "{added:?}");
    let text = serde_json::to_string(&audit).unwrap();
    assert!(
        !text.contains("\\u001b") && !text.contains("\\u0007"),
        "{text}"
    );
    let metrics = reqwest::get(&ctl.metrics)
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("weft_http_rate_limited_total ") && !l.ends_with(" 0")),
        "{metrics}"
    );
}

/// One enrolled agent whose reports keep changing (60 ports, then 2, then 60 again, as fast
/// as it can for 10 s, its server in a group so that each change is an operation too)
/// grows the store by a bounded amount: its changes are rate-limited (an unchanged report
/// stays free), a report that drops ports is one audit line, and a report over the port
/// limit is refused whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_seconds_of_churning_reports_grow_the_store_by_a_bounded_amount() {
    let ctl = Ctl::start(Arc::new(RecordingFabric::default()), 30).await;
    let db_bytes = |dir: &Path| -> u64 {
        let db = dir.join("controller.db");
        let c = rusqlite::Connection::open(&db).unwrap();
        c.busy_timeout(Duration::from_secs(5)).unwrap();
        c.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
            .unwrap();
        std::fs::metadata(&db).unwrap().len()
    };
    let token = ctl
        .admin
        .create_enrollment(Some("node1"))
        .await
        .unwrap()
        .token;
    let enrolled = ctl.client(None).enroll(&token, "node1").await.unwrap();
    let agent = ctl.client(Some(enrolled.secret));
    let report = |name: &str, ports: &[u8]| {
        let root = ctl.dir.path().join(name);
        write_fixture(&root, "node1", 0x0002_c903_0000_0100, ports);
        weft_agent::discover(&root).unwrap()
    };
    let many: Vec<u8> = (1..=60).collect();
    let (big, small) = (report("big", &many), report("small", &[1, 2]));
    let too_many: Vec<u8> = (1..=200).collect();
    let e = agent.report(&report("huge", &too_many)).await.unwrap_err();
    assert_eq!(e.status(), Some(400), "{e}");
    assert!(e.to_string().contains("at most 64"), "{e}");
    agent.report(&big).await.unwrap();
    ctl.admin.create_tenant("alice").await.unwrap();
    ctl.admin.create_group("a", "alice").await.unwrap();
    ctl.admin.add_member("a", "node1").await.unwrap();

    let audit_before = ctl.admin.audit(100_000).await.unwrap().len();
    let size_before = db_bytes(ctl.dir.path());
    let start = Instant::now();
    let (mut sent, mut limited, mut same) = (0usize, 0usize, 0usize);
    while start.elapsed() < Duration::from_secs(10) {
        let r = if sent % 2 == 0 { &small } else { &big };
        match agent.report(r).await {
            Ok(_) => {}
            Err(e) if e.status() == Some(429) => limited += 1,
            Err(e) => panic!("{e}"),
        }
        // An unchanged report (the one just made again) is never limited.
        if agent.report(r).await.is_ok() {
            same += 1;
        }
        sent += 1;
    }
    assert!(limited > 0 && same > 0, "{sent} sent, {limited} limited");
    // 5 changes at once, then one every 10 s (a report equal to the last one taken is free
    // and changes nothing): at most 5 + 2 changes in these 10 s and a little more. Each
    // writes at most four audit lines: the ports gone, the group's change, the delivery
    // and the operation applied.
    let audit = ctl.admin.audit(100_000).await.unwrap();
    let added = audit.len() - audit_before;
    assert!(
        added <= 4 * 7,
        "{added} audit lines from {sent} reports ({limited} limited)"
    );
    let grown = db_bytes(ctl.dir.path()).saturating_sub(size_before);
    eprintln!(
        "churn: {sent} reports alternating 60 and 2 ports in 10 s (each sent twice), {limited} limited (429), {same} repeats taken; the audit grew by {added} lines, the store by {grown} bytes"
    );
    assert!(grown < 256 * 1024, "the store grew by {grown} bytes");
    // The controller states its Default policy (also in its log when it starts).
    let st = ctl.admin.status().await.unwrap();
    assert!(
        st.default_policy
            .starts_with("isolate: Default=0x7fff : ALL=limited, SELF=full"),
        "{}",
        st.default_policy
    );
}

/// Tokens end: revoked tokens stop at once, tenant tokens and deleted tenants stop, a
/// removed server's agent secret stops; the list shows ids and metadata, never a token;
/// each step has its audit line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_are_listed_without_secrets_revoked_and_end_with_their_tenant_or_server() {
    let ctl = Ctl::start(Arc::new(RecordingFabric::default()), 30).await;
    let alice = ctl.admin.create_tenant("alice").await.unwrap();
    let second = ctl
        .admin
        .create_token(Some("alice"), Some(3600))
        .await
        .unwrap();
    let extra_admin = ctl.admin.create_token(None, None).await.unwrap();
    let list = ctl.admin.tokens().await.unwrap();
    let text = serde_json::to_string(&list).unwrap();
    for t in [&alice.token, &second.token, &extra_admin.token] {
        assert!(!text.contains(t.expose()), "{text}");
        assert!(
            !text.contains(&t.hash()),
            "the full hash is not shown either: {text}"
        );
    }
    let mine = list.iter().find(|t| t.id == second.id).unwrap();
    assert_eq!(
        (mine.tenant.as_deref(), mine.expires),
        (Some("alice"), second.expires)
    );
    assert!(
        list.iter()
            .any(|t| t.source == "bootstrap" && t.revoked.is_none())
    );

    // Revoke: the token stops at once; revoking again is a 404.
    let as_second = ctl.client(Some(second.token.clone()));
    assert!(as_second.groups().await.is_ok());
    ctl.admin.revoke_token(&second.id).await.unwrap();
    assert_eq!(as_second.groups().await.unwrap_err().status(), Some(401));
    assert_eq!(
        ctl.admin
            .revoke_token(&second.id)
            .await
            .unwrap_err()
            .status(),
        Some(404)
    );
    assert_eq!(
        ctl.admin
            .revoke_token("not-an-id")
            .await
            .unwrap_err()
            .status(),
        Some(400)
    );
    let as_extra = ctl.client(Some(extra_admin.token.clone()));
    ctl.admin.revoke_token(&extra_admin.id).await.unwrap();
    assert_eq!(as_extra.servers().await.unwrap_err().status(), Some(401));

    // A tenant that owns a group is not deleted; once the group is gone it is, and its
    // token stops.
    let op = ctl
        .admin
        .create_group("a", "alice")
        .await
        .unwrap()
        .operation
        .unwrap();
    ctl.admin
        .wait_applied(op.id, Duration::from_secs(10))
        .await
        .unwrap();
    let e = ctl.admin.delete_tenant("alice").await.unwrap_err();
    assert!(
        e.status() == Some(409) && e.to_string().contains("`a`"),
        "{e}"
    );
    ctl.admin.delete_group("a").await.unwrap();
    ctl.admin.delete_tenant("alice").await.unwrap();
    let as_alice = ctl.client(Some(alice.token.clone()));
    assert_eq!(as_alice.groups().await.unwrap_err().status(), Some(401));
    assert!(ctl.admin.tenants().await.unwrap().is_empty());

    // A removed server is forgotten with its ports, and its agent secret stops.
    let token = ctl
        .admin
        .create_enrollment(Some("node1"))
        .await
        .unwrap()
        .token;
    let enrolled = ctl.client(None).enroll(&token, "node1").await.unwrap();
    write_fixture(
        &ctl.dir.path().join("h1"),
        "node1",
        0x0002_c903_0000_0100,
        &[1],
    );
    let report = weft_agent::discover(&ctl.dir.path().join("h1")).unwrap();
    let agent = ctl.client(Some(enrolled.secret));
    agent.report(&report).await.unwrap();
    ctl.admin.remove_server("node1").await.unwrap();
    assert!(ctl.admin.servers().await.unwrap().is_empty());
    assert_eq!(agent.report(&report).await.unwrap_err().status(), Some(401));

    let audit = ctl.admin.audit(1000).await.unwrap();
    for action in [
        "token.create",
        "token.revoke",
        "tenant.delete",
        "server.remove",
    ] {
        assert!(
            audit.iter().any(|a| a.action == action),
            "no {action}: {audit:?}"
        );
    }
}

/// The controller refuses to start without an admin token of 128 bits or more; a restart
/// with a new `WEFT_ADMIN_TOKEN` revokes the old one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_token_is_required_strong_and_rotated_by_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<SqliteStore> =
        Arc::new(SqliteStore::open(&dir.path().join("controller.db")).unwrap());
    let fabric = Arc::new(RecordingFabric::default());
    let with = |t: Option<&str>| ControllerConfig {
        admin_token: t.map(Secret::new),
        ..ControllerConfig::default()
    };
    for weak in [
        None,
        Some(""),
        Some("x"),
        Some("wfa_short"),
        Some(&*"a".repeat(64)),
    ] {
        let err = Controller::start(store.clone(), fabric.clone(), with(weak))
            .err()
            .expect("a weak admin token must be refused");
        assert!(matches!(err, StartError::AdminToken(_)), "{weak:?}: {err}");
    }
    let serve_with = |token: &'static str| {
        let store = store.clone();
        let fabric = fabric.clone();
        async move {
            let ctl = Controller::start(store, fabric, with(Some(token))).unwrap();
            let api = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let base = format!("http://{}", local(&api));
            let (stop, mut rx) = watch::channel(false);
            let task = tokio::spawn(serve(ctl, api, None, async move {
                let _ = rx.wait_for(|s| *s).await;
            }));
            (base, stop, task)
        }
    };
    const OLD: &str = "wfa_old-admin-0123456789abcdef0123456789";
    const NEW: &str = "wfa_new-admin-fedcba9876543210fedcba9876";
    let (base, stop, task) = serve_with(OLD).await;
    let old = Client::new(&base, Some(Secret::new(OLD)), Duration::from_secs(5)).unwrap();
    old.create_tenant("alice").await.unwrap();
    // An admin token made through the API has a lifetime by default (one day), and a
    // tenant's token its 90 days; both work until the rotation.
    let made = old.create_token(None, None).await.unwrap();
    let tenant = old.create_token(Some("alice"), None).await.unwrap();
    let day = weft_controller::unix_now() + 86_400;
    assert!(
        made.expires.is_some_and(|e| e.abs_diff(day) < 60),
        "{:?}",
        made.expires
    );
    let (made, tenant) = (made.token, tenant.token);
    assert!(old.with_token(Some(made.clone())).servers().await.is_ok());
    let _ = stop.send(true);
    task.await.unwrap().unwrap();

    let (base, _stop, _task) = serve_with(NEW).await;
    let old = Client::new(&base, Some(Secret::new(OLD)), Duration::from_secs(5)).unwrap();
    let new = old.with_token(Some(Secret::new(NEW)));
    assert_eq!(old.servers().await.unwrap_err().status(), Some(401));
    assert_eq!(new.tenants().await.unwrap().len(), 1);
    // The rotation ends the admin tokens made with the old one; a tenant's token stays.
    let made = new.with_token(Some(made));
    assert_eq!(made.servers().await.unwrap_err().status(), Some(401));
    assert!(new.with_token(Some(tenant)).groups().await.is_ok());
    let audit = new.audit(100).await.unwrap();
    assert!(
        audit
            .iter()
            .any(|a| a.action == "token.rotate" && a.outcome == "revoked"),
        "{audit:?}"
    );
}

/// schemathesis (installed by `cargo xtask test`) fuzzes the live API from its own
/// `/openapi.json` with an admin token: no generated request may get a 5xx, and every
/// answer must be one the document lists for its operation (status code, content type and
/// body schema: the generated document matches what the handlers really send). Bounded to
/// 20 examples an operation and 150 s; a missing `st` fails the test.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schemathesis_finds_no_server_error_in_the_live_api() {
    let ctl = Ctl::start_limited(
        Arc::new(RecordingFabric::default()),
        30,
        weft_controller::input::RateLimit {
            per_s: 1e6,
            burst: 1e6,
        },
    )
    .await;
    let schema = format!("{}/openapi.json", ctl.base);
    let auth = format!("Authorization: Bearer {ADMIN}");
    let (log, log_err) = (ctl.dir.path().join("st.out"), ctl.dir.path().join("st.err"));
    let mut child = std::process::Command::new("st")
        .args([
            "run",
            &schema,
            "-H",
            &auth,
            "--checks",
            "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance",
            "--max-examples",
            "20",
            "--phases",
            "examples,fuzzing",
            "--request-timeout",
            "5",
            "--seed",
            "1",
        ])
        .env("NO_COLOR", "1")
        // Its cache directory goes to the test's own directory, not the source tree.
        .current_dir(ctl.dir.path())
        // A file, not a pipe: a long report cannot block it while this waits.
        .stdout(std::fs::File::create(&log).unwrap())
        .stderr(std::fs::File::create(&log_err).unwrap())
        .spawn()
        .expect("schemathesis (`st`) runs; `cargo xtask deps` installs it");
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > Duration::from_secs(150) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("schemathesis did not finish within 150 s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let status = child.wait().unwrap();
    let text = format!(
        "{}{}",
        std::fs::read_to_string(&log).unwrap_or_default(),
        std::fs::read_to_string(&log_err).unwrap_or_default()
    );
    assert!(status.success(), "{text}");
    assert!(
        text.contains("passed") && !text.contains("Schema Error"),
        "{text}"
    );
}

/// TLS end to end: the admin client and an agent (enroll, report) speak https to a
/// controller with a self-signed certificate that they pin; the same certificate as a CA
/// file works too; a wrong pin is refused with both fingerprints named and nothing sent,
/// and an agent with it stops instead of retrying; plain HTTP to a TLS listener gets no
/// answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_a_pin_or_a_ca_file_works_end_to_end_and_a_wrong_pin_is_refused() {
    let ctl = Ctl::start_tls(Arc::new(RecordingFabric::default())).await;
    assert!(ctl.base.starts_with("https://127.0.0.1:"), "{}", ctl.base);
    let cfg = ctl.agent("node1", 0x0002_c903_0000_0100, &[1]).await;
    let (_stop, task) = spawn_agent(cfg);
    servers_with_ports(&ctl.admin, 1).await;
    assert!(!task.is_finished());

    // The certificate as a CA file: its names (127.0.0.1) are checked and match.
    let as_ca = Client::with_tls(
        &ctl.base,
        Some(Secret::new(ADMIN)),
        Duration::from_secs(5),
        &ClientTls {
            ca_file: Some(ctl.dir.path().join("ctl.crt")),
            ..ClientTls::default()
        },
    )
    .unwrap();
    assert_eq!(as_ca.servers().await.unwrap().len(), 1);

    // A wrong pin: refused before any request, naming both fingerprints.
    let wrong = format!("sha256:{}", "00".repeat(32));
    let bad = ClientTls {
        pin: Some(wrong.clone()),
        ..ClientTls::default()
    };
    let e = Client::with_tls(
        &ctl.base,
        Some(Secret::new(ADMIN)),
        Duration::from_secs(5),
        &bad,
    )
    .unwrap()
    .servers()
    .await
    .unwrap_err();
    let text = e.to_string();
    assert!(
        matches!(e, weft_controller::client::ClientError::Untrusted { .. }),
        "{e:?}"
    );
    assert!(
        text.contains(ctl.trust.pin.as_deref().unwrap())
            && text.contains(&wrong["sha256:".len()..]),
        "{text}"
    );
    // An agent with the wrong pin stops at once instead of retrying, having sent nothing
    // (no second server appears).
    let mut cfg = ctl.agent("node2", 0x0002_c903_0000_0200, &[1]).await;
    cfg.tls = bad;
    let (_stop2, task2) = spawn_agent(cfg);
    let err = tokio::time::timeout(Duration::from_secs(10), task2)
        .await
        .unwrap()
        .unwrap()
        .unwrap_err();
    assert!(matches!(err, AgentError::Untrusted(_)), "{err}");
    assert_eq!(ctl.admin.servers().await.unwrap().len(), 1);

    // A CA file that did not sign it: refused as untrusted.
    let other = ServerTls::self_signed(
        &ctl.dir.path().join("other.crt"),
        &ctl.dir.path().join("other.key"),
        &["127.0.0.1".into()],
    )
    .unwrap();
    drop(other);
    let e = Client::with_tls(
        &ctl.base,
        None,
        Duration::from_secs(5),
        &ClientTls {
            ca_file: Some(ctl.dir.path().join("other.crt")),
            ..ClientTls::default()
        },
    )
    .unwrap()
    .status()
    .await
    .unwrap_err();
    assert!(
        matches!(e, weft_controller::client::ClientError::Untrusted { .. }),
        "{e:?}"
    );

    // Plain HTTP to the TLS port gets no API answer.
    let plain = ctl.base.replace("https://", "http://");
    let e = Client::new(&plain, None, Duration::from_secs(3))
        .unwrap()
        .status()
        .await
        .unwrap_err();
    assert!(e.status().is_none(), "{e:?}");

    // A client refuses plain HTTP off loopback before it sends anything.
    let e = Client::new("http://192.0.2.1:7100", None, Duration::from_secs(1)).unwrap_err();
    assert!(e.to_string().contains("--insecure-http"), "{e}");
}

/// A fast-checking controller on a recording fabric whose "master's file" is `held`.
async fn ctl_on(held: Option<&str>, adopt: bool, repair: bool) -> (Ctl, Arc<RecordingFabric>) {
    let fabric = Arc::new(RecordingFabric {
        plays_sm: true,
        ..RecordingFabric::default()
    });
    *fabric.held.lock().unwrap() = held.map(String::from);
    let config = ControllerConfig {
        admin_token: Some(Secret::new(ADMIN)),
        recheck: Duration::from_millis(200),
        max_backoff: Duration::from_millis(300),
        adopt,
        port_check: Duration::from_millis(200),
        repair_drift: repair,
        ..ControllerConfig::default()
    };
    (
        Ctl::start_config(fabric.clone(), config, false).await,
        fabric,
    )
}

const HAND_WRITTEN: &str =
    "Default=0x7fff, ipoib : ALL=full ;\nlegacy=0x0a01, ipoib : 0x0002c90300000101=full ;\n";

/// One owner: a controller does not remove a partition it did not write (the delivery
/// fails naming it and `--adopt`); with `--adopt` it keeps it in every file, keeps its
/// P_Key off its groups, writes its owner header, and audits the adoption and each
/// delivery's diff with the removals (Default's `ALL=full` lowered) spelt out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_adopts_a_hand_written_file_only_when_told_and_audits_removals() {
    let (ctl, fabric) = ctl_on(Some(HAND_WRITTEN), false, false).await;
    ctl.admin.create_tenant("alice").await.unwrap();
    let op = ctl
        .admin
        .create_group("a", "alice")
        .await
        .unwrap()
        .operation
        .unwrap();
    let failed = until(
        "the delivery to be refused",
        Duration::from_secs(10),
        || async {
            let o = ctl.admin.operation(op.id).await.ok()?;
            o.last_error.filter(|e| e.contains("legacy"))
        },
    )
    .await;
    assert!(
        failed.contains("--adopt") && failed.contains("0x0a01"),
        "{failed}"
    );
    assert_eq!(
        fabric.held.lock().unwrap().as_deref(),
        Some(HAND_WRITTEN),
        "nothing written"
    );
    drop(ctl);

    let (ctl, fabric) = ctl_on(Some(HAND_WRITTEN), true, false).await;
    ctl.admin.create_tenant("alice").await.unwrap();
    let op = ctl
        .admin
        .create_group("a", "alice")
        .await
        .unwrap()
        .operation
        .unwrap();
    ctl.admin
        .wait_applied(op.id, Duration::from_secs(10))
        .await
        .unwrap();
    let file = fabric.held.lock().unwrap().clone().unwrap();
    assert!(file.starts_with("# weft-owner: controller "), "{file}");
    assert!(
        file.contains("legacy=0x0a01"),
        "the adopted partition is kept: {file}"
    );
    // The group got the next free key, not the adopted one.
    assert!(file.contains("a=0x0a02"), "{file}");
    assert_eq!(ctl.admin.groups().await.unwrap()[0].pkey, "0x0a02");
    let e = ctl.admin.create_group("legacy", "alice").await.unwrap_err();
    assert_eq!(e.status(), Some(409), "{e}");
    let audit = ctl.admin.audit(100).await.unwrap();
    let adopt = audit
        .iter()
        .find(|a| a.action == "adopt")
        .expect("an adopt line");
    assert!(
        adopt.detail.contains("`legacy` (0x0a01)") && adopt.diff.contains("+legacy"),
        "{adopt:?}"
    );
    let deliver = audit
        .iter()
        .find(|a| a.action == "deliver")
        .expect("a deliver line");
    assert!(
        deliver.diff.contains("-Default=0x7fff, ipoib : ALL=full ;"),
        "{deliver:?}"
    );
    assert!(deliver.diff.contains("+a=0x0a02"), "{deliver:?}");
    assert!(
        deliver.detail.contains("removes:") && deliver.detail.contains("ALL"),
        "{deliver:?}"
    );
}

/// Drift: editing the master's file behind the controller's back shows as a state in the
/// API, a metric and an audit line, and clears when the file is back; with repair on,
/// the controller writes its file again (counted), even over a partition someone added.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edited_master_file_is_drift_reported_and_repaired_when_configured() {
    use weft_controller::model::DriftState;
    let (ctl, fabric) = ctl_on(None, false, false).await;
    ctl.admin.create_tenant("alice").await.unwrap();
    let op = ctl
        .admin
        .create_group("a", "alice")
        .await
        .unwrap()
        .operation
        .unwrap();
    ctl.admin
        .wait_applied(op.id, Duration::from_secs(10))
        .await
        .unwrap();
    let applied = fabric.held.lock().unwrap().clone().unwrap();
    until("in sync", Duration::from_secs(10), || async {
        (ctl.admin.status().await.ok()?.drift.state == DriftState::InSync).then_some(())
    })
    .await;
    let edited = format!("{applied}intruder=0x0b0b : ALL=full ;\n");
    *fabric.held.lock().unwrap() = Some(edited.clone());
    let st = until("drift", Duration::from_secs(10), || async {
        let st = ctl.admin.status().await.ok()?;
        (st.drift.state == DriftState::Drift).then_some(st)
    })
    .await;
    assert!(st.drift.files[0].contains("SM `master`"), "{:?}", st.drift);
    let metrics = reqwest::get(&ctl.metrics)
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("weft_fabric_drift{kind=\"files\"} 1"),
        "{metrics}"
    );
    // Not repaired: the edit stays.
    assert_eq!(
        fabric.held.lock().unwrap().as_deref(),
        Some(edited.as_str())
    );
    *fabric.held.lock().unwrap() = Some(applied.clone());
    until("in sync again", Duration::from_secs(10), || async {
        (ctl.admin.status().await.ok()?.drift.state == DriftState::InSync).then_some(())
    })
    .await;
    let audit = ctl.admin.audit(100).await.unwrap();
    let drift: Vec<_> = audit
        .iter()
        .filter(|a| a.action == "drift")
        .map(|a| a.outcome.as_str())
        .collect();
    assert_eq!(drift, ["drift", "in-sync"], "{audit:?}");
    drop(ctl);

    let (ctl, fabric) = ctl_on(None, false, true).await;
    ctl.admin.create_tenant("alice").await.unwrap();
    let op = ctl
        .admin
        .create_group("a", "alice")
        .await
        .unwrap()
        .operation
        .unwrap();
    ctl.admin
        .wait_applied(op.id, Duration::from_secs(10))
        .await
        .unwrap();
    let applied = fabric.held.lock().unwrap().clone().unwrap();
    *fabric.held.lock().unwrap() = Some(format!("{applied}intruder=0x0b0b : ALL=full ;\n"));
    let st = until("a repair", Duration::from_secs(10), || async {
        let st = ctl.admin.status().await.ok()?;
        (st.drift.repairs >= 1).then_some(st)
    })
    .await;
    assert_eq!(
        fabric.held.lock().unwrap().as_deref(),
        Some(applied.as_str()),
        "{st:?}"
    );
    let audit = ctl.admin.audit(100).await.unwrap();
    assert!(
        audit
            .iter()
            .any(|a| a.action == "deliver" && a.detail.contains("intruder")),
        "the repair lists what it removed: {audit:?}"
    );
}

/// A server whose port is on no fabric (a host cabled elsewhere, a GUID typed wrong): its
/// group is applied and the other ports verified, but the operation and the audit line
/// carry a WARN naming the GUID, never "verified" for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_port_that_is_not_on_the_fabric_is_a_warning_naming_its_guid() {
    let topology = weft_testbed::Topology::single_switch(2);
    let bed = tokio::task::block_in_place(|| fabric::bed(&topology));
    let ctl = Ctl::start(
        Arc::new(OpenSmFabric {
            applier: bed.applier(),
        }),
        30,
    )
    .await;
    let node1 = topology.end_nodes().find(|h| h.name == "node1").unwrap();
    let ports: Vec<u8> = node1.port_guids.iter().map(|(p, _)| *p).collect();
    let (_s1, _a1) = spawn_agent(ctl.agent("node1", node1.node_guid, &ports).await);
    let (_s2, _a2) = spawn_agent(ctl.agent("ghost", 0x0002_c903_dead_0000, &[1]).await);
    servers_with_ports(&ctl.admin, 2).await;
    ctl.admin.create_tenant("alice").await.unwrap();
    ctl.admin.create_group("a", "alice").await.unwrap();
    ctl.admin.add_member("a", "node1").await.unwrap();
    let op = ctl
        .admin
        .add_member("a", "ghost")
        .await
        .unwrap()
        .operation
        .unwrap();
    let done = ctl
        .admin
        .wait_applied(op.id, Duration::from_secs(30))
        .await
        .unwrap();
    let warning = done.warning.expect("a warning for the absent port");
    assert!(
        warning.contains("0x0002c903dead0001") && warning.contains("not verified"),
        "{warning}"
    );
    let audit = ctl.admin.audit(100).await.unwrap();
    assert!(
        audit.iter().any(|a| a.action == "apply"
            && a.detail.contains("WARN")
            && a.detail.contains("0x0002c903dead0001")),
        "{audit:?}"
    );
    // node1's port does hold the key: the WARN is about the absent one only.
    let t = tokio::task::block_in_place(|| bed.verified());
    assert!(t["node1"].contains(&0x8a01), "{t:x?}");
}

// ---------------------------------------------------------------- node leases

#[path = "it/leases.rs"]
mod leases;

/// The shipped DGX Spark fixture (RoCE, no InfiniBand port): its agent's report reaches
/// `GET /v1/servers` with both RoCE devices, every NIC with its negotiated speed, MTU and
/// link layer, and its GPU; no InfiniBand port and no claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dgx_spark_reports_roce_devices_nics_and_its_gpu() {
    let ctl = Ctl::start(Arc::new(RecordingFabric::default()), 30).await;
    let mut cfg = ctl.agent("unused", 0x100, &[1]).await;
    cfg.sysfs_root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../weft-agent/fixtures/dgx-spark");
    let (_stop, _task) = spawn_agent(cfg);
    let s = until("the spark to report", Duration::from_secs(15), || async {
        let s = ctl.admin.servers().await.ok()?;
        s.into_iter().find(|s| !s.roce.is_empty())
    })
    .await;
    assert_eq!(s.name, "spark1");
    assert!(s.ports.is_empty() && s.pending_claims.is_empty());
    let roce: Vec<_> = s
        .roce
        .iter()
        .map(|r| {
            (
                r.device.as_str(),
                r.state.as_str(),
                r.rate.as_deref(),
                r.netdev.as_deref(),
            )
        })
        .collect();
    assert_eq!(
        roce,
        [
            (
                "roceP2p1s0f0",
                "ACTIVE",
                Some("200 Gb/sec (4X HDR)"),
                Some("enP2p1s0f0np0")
            ),
            (
                "rocep1s0f0",
                "ACTIVE",
                Some("200 Gb/sec (4X HDR)"),
                Some("enp1s0f0np0")
            ),
        ]
    );
    assert_eq!(s.roce[1].guid, Guid(0x0202_c9ff_fe02_0101));
    let nics: Vec<_> = s
        .nics
        .iter()
        .map(|n| (n.name.as_str(), n.speed_mbps, n.mtu, n.link_layer.as_str()))
        .collect();
    assert_eq!(
        nics,
        [
            ("enP2p1s0f0np0", Some(200_000), 9000, "Ethernet"),
            ("enP7s7", Some(1000), 1500, "Ethernet"),
            ("enp1s0f0np0", Some(200_000), 9000, "Ethernet"),
        ]
    );
    assert_eq!(s.gpus.len(), 1);
    assert_eq!(s.gpus[0].name, "NVIDIA GB10");
}
