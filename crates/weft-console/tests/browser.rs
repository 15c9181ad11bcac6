//! The console in a real browser: Debian's headless Chromium driven over WebDriver
//! (chromedriver, through thirtyfour: a maintained Rust client, so the test lives beside the
//! other controller tests and shares their fixtures and types), against a real controller
//! with real agents and two OpenSMs (primary and standby) on an ibsim fabric.
//!
//! One test, one fabric (the expensive part), in the order a person would go: admin login,
//! overview, partitions matrix against the store, a move from the form followed to
//! "verified" and found in the history with its diff, a stale agent, API docs; axe-core on
//! every page; then a tenant, and hand-made requests a tenant or a replayed session might
//! try, each refused, audited, and changing nothing. Link health: stored p2p runs as a heat
//! map with a half-rate link flagged by name. Screenshots of every page go to
//! `docs/img/console-*.png`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use thirtyfour::prelude::*;
use tokio::sync::watch;
use weft_agent::fixtures::{HcaSpec, HostSpec, PortSpec, write_host};
use weft_controller::agent::AgentConfig;
use weft_controller::auth::Secret;
use weft_controller::client::Client;
use weft_controller::reconcile::OpenSmFabric;
use weft_controller::store::SqliteStore;
use weft_controller::{Controller, ControllerConfig, local, serve};
use weft_fabric::Guid;
use weft_opensm::{Applier, DiagTools, LocalSm, SmHost, VerifyScope};
use weft_testbed::{SimFabric, SmSpec, Topology};

const ADMIN: &str = "wfa_console-test-admin-0123456789abcdef";
const STALE_S: u64 = 3;

/// The Chromium flags that work in this container and in CI.
const CHROMIUM_FLAGS: &[&str] = &[
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1400,1000",
];

struct Bed {
    fabric: SimFabric,
    sms: Vec<(weft_testbed::SmHandle, PathBuf)>,
}

fn bed(topology: &Topology) -> Bed {
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
    fn applier(&self) -> Applier {
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
}

/// chromedriver on a free port, killed when dropped.
struct Driver(Child, u16);

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Starts chromedriver, or says why it cannot run here.
fn chromedriver() -> Result<Driver, String> {
    for (what, path) in [
        ("chromium", "/usr/bin/chromium"),
        ("chromium-driver", "/usr/bin/chromedriver"),
    ] {
        if !Path::new(path).exists() {
            return Err(format!("{path} is missing (Debian package {what})"));
        }
    }
    let port = free_port();
    let child = Command::new("/usr/bin/chromedriver")
        .arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("chromedriver: {e}"))?;
    let start = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if start.elapsed() > Duration::from_secs(10) {
            return Err("chromedriver did not listen within 10 s".into());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(Driver(child, port))
}

async fn browser(d: &Driver, profile: &Path) -> WebDriver {
    let mut caps = DesiredCapabilities::chrome();
    caps.set_binary("/usr/bin/chromium").unwrap();
    for f in CHROMIUM_FLAGS {
        caps.add_arg(f).unwrap();
    }
    caps.add_arg(&format!("--user-data-dir={}", profile.display()))
        .unwrap();
    WebDriver::new(format!("http://127.0.0.1:{}", d.1), caps)
        .await
        .expect("a Chromium session")
}

fn img(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/img");
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(format!("console-{name}.png"))
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
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// axe-core (npm `axe-core@4.11.0`, vendored; SHA-256 checked) on the page: the serious
/// and critical violations, as `id: help (n nodes)`.
async fn axe(driver: &WebDriver, page: &str) -> Vec<String> {
    let src = include_str!("assets/axe.min.js");
    use sha2::Digest;
    let sum: String = sha2::Sha256::digest(src.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(
        sum, "e9e5863c33a874f09bc01acd9234b7e3c871479f5eef8802fa582544465e6d01",
        "tests/assets/axe.min.js is the pinned axe-core 4.11.0"
    );
    driver.execute(src, Vec::new()).await.unwrap();
    let r = driver
        .execute(
            "return axe.run(document, { resultTypes: ['violations'] }).then(r =>
               r.violations.filter(v => v.impact === 'serious' || v.impact === 'critical')
                 .map(v => v.id + ': ' + v.help + ' (' + v.nodes.length + ' nodes: ' +
                      v.nodes.slice(0, 3).map(n => n.target.join(' ')).join(', ') + ')'));",
            Vec::new(),
        )
        .await
        .unwrap();
    let v: Vec<String> = r.convert().unwrap();
    v.into_iter().map(|x| format!("{page}: {x}")).collect()
}

async fn login(driver: &WebDriver, base: &str, token: &str) {
    driver.goto(format!("{base}/console/login")).await.unwrap();
    let input = driver.find(By::Id("token")).await.unwrap();
    input.send_keys(token).await.unwrap();
    input.send_keys(Key::Enter + "").await.unwrap();
    until(
        "the overview after login",
        Duration::from_secs(10),
        || async {
            let url = driver.current_url().await.ok()?;
            url.path().ends_with("/console").then_some(())
        },
    )
    .await;
}

/// Logs out with the console's button and waits for the login page.
async fn logout(driver: &WebDriver, base: &str) {
    driver.goto(format!("{base}/console")).await.unwrap();
    driver
        .find(By::Css("form[action='/console/logout'] button"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    until("the login page", Duration::from_secs(10), || async {
        driver
            .current_url()
            .await
            .ok()?
            .path()
            .ends_with("/login")
            .then_some(())
    })
    .await;
}

async fn session_cookie(driver: &WebDriver) -> String {
    let c = driver.get_named_cookie("weft_session").await.unwrap();
    assert_eq!(c.secure, Some(true), "{c:?}");
    assert!(
        matches!(c.same_site, Some(thirtyfour::SameSite::Strict)),
        "{c:?}"
    );
    // HttpOnly: the page's scripts cannot read it.
    let seen: String = driver
        .execute("return document.cookie", Vec::new())
        .await
        .unwrap()
        .convert()
        .unwrap();
    assert!(!seen.contains("weft_session"), "{seen}");
    // Never a token in a URL.
    assert!(
        !driver
            .current_url()
            .await
            .unwrap()
            .as_str()
            .contains("wfa_")
    );
    c.value
}

async fn csrf_of(driver: &WebDriver) -> String {
    driver
        .find(By::Css("form[action='/console/logout'] input[name=csrf]"))
        .await
        .unwrap()
        .attr("value")
        .await
        .unwrap()
        .unwrap()
}

/// A hand-made form POST with a session cookie (no browser): status and body.
async fn post(base: &str, path: &str, cookie: &str, form: &[(&str, &str)]) -> (u16, String) {
    let r = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
        .post(format!("{base}{path}"))
        .header("cookie", format!("weft_session={cookie}"))
        .form(form)
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_in_chromium_overview_matrix_move_history_roles_and_refusals() {
    let driver_proc = match chromedriver() {
        Ok(d) => d,
        Err(why) => {
            weft_netns::require::skip("the console's browser test", &why);
            return;
        }
    };
    let topology = Topology::single_switch(4);
    let bed = tokio::task::block_in_place(|| bed(&topology));
    let dir = tempfile::tempdir().unwrap();

    // The controller, with the console mounted, on loopback.
    let store = SqliteStore::open(&dir.path().join("controller.db")).unwrap();
    let config = ControllerConfig {
        admin_token: Some(Secret::new(ADMIN)),
        stale_after_s: STALE_S,
        recheck: Duration::from_secs(5),
        max_backoff: Duration::from_millis(500),
        ..ControllerConfig::default()
    };
    let mut ctl = Controller::start(
        Arc::new(store),
        Arc::new(OpenSmFabric {
            applier: bed.applier(),
        }),
        config,
    )
    .unwrap();
    ctl.mount(weft_console::router(
        ctl.state(),
        weft_console::ConsoleConfig::default(),
    ));
    let api = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", local(&api));
    let (stop, mut rx) = watch::channel(false);
    tokio::spawn(serve(ctl, api, None, async move {
        let _ = rx.wait_for(|s| *s).await;
    }));
    let admin = Client::new(&base, Some(Secret::new(ADMIN)), Duration::from_secs(10)).unwrap();

    // Real agents: the four InfiniBand nodes of the fabric and the DGX Spark fixture.
    let mut agents = Vec::new();
    for h in topology.end_nodes().filter(|h| h.name.starts_with("node")) {
        let root = dir.path().join(format!("host-{}", h.name));
        let mut hca = HcaSpec::new("mlx5_0", Guid(h.node_guid), "0000:01:00.0");
        for (p, _) in &h.port_guids {
            hca = hca.with_port(PortSpec::infiniband(u32::from(*p)));
        }
        write_host(&root, &HostSpec::new(h.name.clone()).with_hca(hca)).unwrap();
        agents.push((h.name.clone(), root));
    }
    agents.push((
        "spark1".into(),
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../weft-agent/fixtures/dgx-spark"),
    ));
    // A second Spark whose first RoCE link came up at half rate (100 of 200 Gb/s).
    let spark2 = dir.path().join("host-spark2");
    let ok = Command::new("cp")
        .arg("-a")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("../weft-agent/fixtures/dgx-spark"))
        .arg(&spark2)
        .status()
        .unwrap();
    assert!(ok.success());
    std::fs::write(spark2.join("etc/hostname"), "spark2\n").unwrap();
    std::fs::write(
        spark2.join("sys/devices/pci0000:00/0000:01:00.0/net/enp1s0f0np0/speed"),
        "100000\n",
    )
    .unwrap();
    agents.push(("spark2".into(), spark2));
    let mut stops = std::collections::BTreeMap::new();
    for (name, root) in agents {
        let mut cfg = AgentConfig::new(&base, dir.path().join(format!("{name}.state")), root);
        cfg.enroll_token = Some(admin.create_enrollment(None).await.unwrap().token);
        cfg.heartbeat = Duration::from_millis(500);
        cfg.rescan = Duration::from_secs(2);
        let (tx, rx) = watch::channel(false);
        tokio::spawn(weft_controller::agent::run(cfg, rx));
        stops.insert(name, tx);
    }
    until("six agents", Duration::from_secs(20), || async {
        let s = admin.servers().await.ok()?;
        (s.len() == 6 && s.iter().filter(|s| !s.ports.is_empty()).count() == 4).then_some(())
    })
    .await;
    let alice = admin.create_tenant("alice").await.unwrap().token;
    admin.create_tenant("bob").await.unwrap();
    admin.create_group("a", "alice").await.unwrap();
    admin.create_group("b", "bob").await.unwrap();
    let mut last = 0;
    for (g, s) in [("a", "node1"), ("a", "node2"), ("b", "node3")] {
        last = admin.add_member(g, s).await.unwrap().operation.unwrap().id;
    }
    admin
        .wait_applied(last, Duration::from_secs(60))
        .await
        .unwrap();

    let profile = tempfile::tempdir().unwrap();
    let driver = browser(&driver_proc, profile.path()).await;
    let mut violations = Vec::new();

    // Admin: log in; the overview lists every node with what its agent reported.
    login(&driver, &base, ADMIN).await;
    let admin_cookie = session_cookie(&driver).await;
    let body = driver
        .find(By::Tag("main"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for n in ["node1", "node2", "node3", "node4", "spark1", "spark2"] {
        assert!(body.contains(n), "{n} on the overview:\n{body}");
    }
    let spark = driver
        .find(By::Css("tr[data-node=spark1]"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for want in [
        "rocep1s0f0/1 200 Gb/sec (4X HDR) ACTIVE",
        "enp1s0f0np0 200 Gb/s, MTU 9000, Ethernet",
        "NVIDIA GB10",
    ] {
        assert!(spark.contains(want), "{want} in the spark's row: {spark}");
    }
    assert!(
        body.contains("every SM holds the applied file") || body.contains("not checked yet"),
        "{body}"
    );
    // The half-rate link is flagged, named, against its peers' speed.
    let slow = driver.find(By::Id("link-health")).await.unwrap();
    assert_eq!(slow.attr("data-slow").await.unwrap().as_deref(), Some("1"));
    let slow = driver
        .find(By::Css("[data-link='spark2/enp1s0f0np0']"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        slow.contains("100 Gb/s") && slow.contains("peers' 200 Gb/s"),
        "{slow}"
    );
    driver.screenshot(&img("overview")).await.unwrap();
    violations.extend(axe(&driver, "overview").await);

    // Partitions: the matrix equals the store's groups.
    driver
        .goto(format!("{base}/console/partitions"))
        .await
        .unwrap();
    let groups = admin.groups().await.unwrap();
    let cols: Vec<String> = {
        let mut v = Vec::new();
        for th in driver.find_all(By::Css("th[data-group]")).await.unwrap() {
            v.push(th.attr("data-group").await.unwrap().unwrap());
        }
        v
    };
    assert_eq!(cols, ["a", "b"]);
    for row in driver.find_all(By::Css("#matrix tbody tr")).await.unwrap() {
        let node = row.attr("data-node").await.unwrap().unwrap();
        let cells = row.find_all(By::Css("td[data-cell]")).await.unwrap();
        for (col, cell) in cols.iter().zip(cells) {
            let g = groups.iter().find(|g| &g.name == col).unwrap();
            let is_member = g.members.contains(&node);
            let server = admin
                .servers()
                .await
                .unwrap()
                .into_iter()
                .find(|s| s.name == node)
                .unwrap();
            let want = if is_member && !server.ports.is_empty() {
                "full"
            } else {
                "none"
            };
            assert_eq!(cell.text().await.unwrap(), want, "{node} in {col}");
        }
    }
    driver.screenshot(&img("partitions")).await.unwrap();
    violations.extend(axe(&driver, "partitions").await);

    // A move from the form, by keyboard only: Tab to the node, type it, Tab to the group,
    // type it, Tab to the button, Enter; then confirm, and follow it to "verified".
    driver.goto(format!("{base}/console/move")).await.unwrap();
    violations.extend(axe(&driver, "move").await);
    let body_el = driver.find(By::Tag("body")).await.unwrap();
    let mut focused = String::new();
    for _ in 0..20 {
        driver
            .active_element()
            .await
            .unwrap()
            .send_keys(Key::Tab + "")
            .await
            .unwrap();
        focused = driver
            .execute("return document.activeElement.id", Vec::new())
            .await
            .unwrap()
            .convert()
            .unwrap();
        if focused == "server" {
            break;
        }
    }
    assert_eq!(focused, "server", "the node's select is reachable by Tab");
    drop(body_el);
    let active = driver.active_element().await.unwrap();
    active.send_keys("node2").await.unwrap();
    active.send_keys(Key::Tab + "").await.unwrap();
    let active = driver.active_element().await.unwrap();
    assert_eq!(active.attr("id").await.unwrap().as_deref(), Some("to"));
    active.send_keys("b").await.unwrap();
    active.send_keys(Key::Tab + "").await.unwrap();
    let active = driver.active_element().await.unwrap();
    assert_eq!(
        active.attr("id").await.unwrap().as_deref(),
        Some("preview-button")
    );
    active.send_keys(Key::Enter + "").await.unwrap();
    let confirm = driver
        .query(By::Id("confirm"))
        .wait(Duration::from_secs(10), Duration::from_millis(100))
        .first()
        .await
        .unwrap();
    let preview = driver
        .find(By::Id("preview"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(preview.contains("Moving node2 to b"), "{preview}");
    assert!(
        preview.contains("-a=0x0a01") || preview.contains("-a=0x"),
        "the diff shows a's line changing:\n{preview}"
    );
    assert!(
        preview.contains("+b=0x"),
        "the diff shows b's line changing:\n{preview}"
    );
    driver.screenshot(&img("move-preview")).await.unwrap();
    // Nothing changed before the confirmation.
    assert!(
        admin
            .groups()
            .await
            .unwrap()
            .iter()
            .any(|g| g.name == "a" && g.members.contains(&"node2".to_string()))
    );
    let started = Instant::now();
    confirm.send_keys(Key::Enter + "").await.unwrap();
    driver
        .query(By::Css("[data-state=verified]"))
        .wait(Duration::from_secs(60), Duration::from_millis(100))
        .first()
        .await
        .expect("the move is shown verified");
    let to_verified = started.elapsed();
    eprintln!("console move: confirmation to \"verified\" shown in {to_verified:?}");
    driver.screenshot(&img("move-verified")).await.unwrap();
    // The anchor: a move through the API client `weft group move` uses, to verified.
    let started = Instant::now();
    let op = admin
        .move_server("node4", "b")
        .await
        .unwrap()
        .operation
        .unwrap();
    admin
        .wait_applied(op.id, Duration::from_secs(60))
        .await
        .unwrap();
    eprintln!(
        "api move: request to verified in {:?} (console/api {:.2})",
        started.elapsed(),
        to_verified.as_secs_f64() / started.elapsed().as_secs_f64()
    );
    violations.extend(axe(&driver, "move (verified)").await);
    let groups = admin.groups().await.unwrap();
    assert!(
        groups
            .iter()
            .any(|g| g.name == "b" && g.members.contains(&"node2".to_string())),
        "{groups:?}"
    );

    // History: the move, with its diff, found by the node and action filters.
    driver
        .goto(format!(
            "{base}/console/history?tenant=&node=node2&action=group.move"
        ))
        .await
        .unwrap();
    let ops = driver
        .find(By::Id("operations"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        ops.contains("group.move node2 -> b") && ops.contains("verified"),
        "{ops}"
    );
    let diff_html = driver
        .find(By::Css("#operations pre.diff"))
        .await
        .unwrap()
        .inner_html()
        .await
        .unwrap();
    assert!(diff_html.contains("+b=0x"), "{diff_html}");
    let audit = driver
        .find(By::Id("audit"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        audit.contains("group.move") && !audit.contains("group.add"),
        "filtered by action:\n{audit}"
    );
    driver.screenshot(&img("history")).await.unwrap();
    violations.extend(axe(&driver, "history").await);

    // A stale agent: node4's agent stops; within the bound (plus a refresh) it shows stale.
    stops["node4"].send(true).unwrap();
    driver.goto(format!("{base}/console")).await.unwrap();
    until(
        "node4 shown stale",
        Duration::from_secs(STALE_S + 15),
        || async {
            let s = driver
                .find(By::Css("tr[data-node=node4] [data-liveness]"))
                .await
                .ok()?
                .attr("data-liveness")
                .await
                .ok()??;
            (s == "stale").then_some(())
        },
    )
    .await;
    driver.screenshot(&img("overview-stale")).await.unwrap();

    // API docs.
    driver.goto(format!("{base}/docs")).await.unwrap();
    let docs = driver
        .find(By::Tag("main"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        docs.contains("POST /v1/moves") && docs.contains("GET /v1/servers"),
        "{docs}"
    );
    driver.screenshot(&img("docs")).await.unwrap();
    violations.extend(axe(&driver, "docs").await);

    // Links: two p2p runs stored as `weft bench p2p --report-to` stores them (through the
    // same API client; the CLI's side is weft's doctor test); in the second, node3's link
    // to node4 runs at half its peers' speed. The heat map writes every value in its cell,
    // the half-rate link is flagged by name with the agent's half-rate NIC, and every node
    // that sent has its trend.
    let nodes = ["node1", "node2", "node3", "node4"];
    let run = |slow: f64| weft_controller::links::LinkRunIn {
        source: weft_controller::links::LinkSource::P2p,
        results: nodes
            .iter()
            .enumerate()
            .flat_map(|(i, s)| {
                nodes.iter().filter(move |d| *d != s).map(move |d| {
                    weft_controller::links::LinkResult {
                        src: s.to_string(),
                        dst: d.to_string(),
                        nic: "ib0".into(),
                        gbps: if (*s, *d) == ("node3", "node4") {
                            slow
                        } else {
                            100.0 - i as f64
                        },
                        rtt_us: Some(8.0),
                        error: None,
                    }
                })
            })
            .collect(),
    };
    let first = admin.add_link_run(&run(98.0)).await.unwrap();
    assert!(first.slow.is_empty(), "{:?}", first.slow);
    let second = admin.add_link_run(&run(49.5)).await.unwrap();
    assert_eq!(second.slow.len(), 1, "{:?}", second.slow);
    driver.goto(format!("{base}/console/links")).await.unwrap();
    let cells = driver
        .find_all(By::Css("#heatmap td[data-link]"))
        .await
        .unwrap();
    assert_eq!(cells.len(), 12);
    for c in &cells {
        let link = c.attr("data-link").await.unwrap().unwrap();
        let (src, dst) = link.split_once("->").unwrap();
        let want = second
            .run
            .results
            .iter()
            .find(|r| r.src == src && r.dst == dst)
            .unwrap()
            .gbps;
        let text = c.text().await.unwrap();
        let shown: f64 = text.split_whitespace().next().unwrap().parse().unwrap();
        assert!((shown - want).abs() < 0.06, "{link}: {text} for {want}");
    }
    let half = driver
        .find(By::Css("#heatmap td[data-link='node3->node4']"))
        .await
        .unwrap();
    assert_eq!(
        half.attr("data-slow").await.unwrap().as_deref(),
        Some("true")
    );
    assert!(half.text().await.unwrap().contains("slow"));
    let flagged = driver.find(By::Id("links-flagged")).await.unwrap();
    assert_eq!(
        flagged.attr("data-flagged").await.unwrap().as_deref(),
        Some("2")
    );
    let named = driver
        .find(By::Css("#links-flagged [data-link='node3->node4/ib0']"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        named.contains("node3 ib0 → node4") && named.contains("49.5 Gb/s"),
        "{named}"
    );
    assert!(
        driver
            .find(By::Css("#links-flagged [data-link='spark2/enp1s0f0np0']"))
            .await
            .is_ok()
    );
    let trend = driver
        .find(By::Css("#trends tr[data-node=node3] svg"))
        .await
        .unwrap()
        .attr("aria-label")
        .await
        .unwrap()
        .unwrap();
    assert!(
        trend.contains("2 run(s)") && trend.contains("slowest link last 49.5 Gb/s"),
        "{trend}"
    );
    driver.screenshot(&img("links")).await.unwrap();
    // The trends are below the fold: their table alone.
    let trends = driver.find(By::Id("trends")).await.unwrap();
    trends.scroll_into_view().await.unwrap();
    trends.screenshot(&img("links-trends")).await.unwrap();
    violations.extend(axe(&driver, "links").await);

    // Hand-made: a request without the CSRF token is refused and changes nothing.
    let before = admin.groups().await.unwrap();
    let audit_before = admin.audit(10_000).await.unwrap().len();
    let (code, _) = post(
        &base,
        "/console/move",
        &admin_cookie,
        &[("server", "node1"), ("to", "b")],
    )
    .await;
    assert_eq!(code, 403, "no CSRF token");
    assert_eq!(admin.groups().await.unwrap(), before);

    // Log out (the button), then log in as tenant alice.
    logout(&driver, &base).await;
    driver.screenshot(&img("login")).await.unwrap();
    violations.extend(axe(&driver, "login").await);
    // The admin's session ended on the server: replaying its cookie is refused.
    let (code, _) = post(
        &base,
        "/console/move",
        &admin_cookie,
        &[("csrf", "x"), ("server", "node1"), ("to", "b")],
    )
    .await;
    assert_eq!(code, 401, "a replayed session after logout");

    login(&driver, &base, alice.expose()).await;
    let alice_cookie = session_cookie(&driver).await;
    let alice_csrf = csrf_of(&driver).await;
    let body = driver
        .find(By::Tag("main"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(body.contains("node1"), "{body}");
    for other in ["node2", "node3", "node4", "spark1", "spark2"] {
        assert!(!body.contains(other), "alice sees {other}:\n{body}");
    }
    driver.screenshot(&img("tenant-overview")).await.unwrap();
    violations.extend(axe(&driver, "tenant overview").await);
    driver
        .goto(format!("{base}/console/partitions"))
        .await
        .unwrap();
    let m = driver
        .find(By::Id("matrix"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        m.contains("tenant alice") && !m.contains("bob") && !m.contains("node3"),
        "{m}"
    );
    // Alice's links: only those between her nodes. She holds node1 alone now (node2 was
    // moved away), so no stored link is hers, and neither is any flagged one.
    driver.goto(format!("{base}/console/links")).await.unwrap();
    let t = driver
        .find(By::Tag("main"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for other in ["node2", "node3", "node4", "spark2"] {
        assert!(!t.contains(other), "alice sees {other}:\n{t}");
    }
    assert!(t.contains("No link is flagged"), "{t}");
    assert!(
        driver
            .find_all(By::Css("#heatmap td[data-link]"))
            .await
            .unwrap()
            .is_empty()
    );
    violations.extend(axe(&driver, "tenant links").await);
    // The move page and the history are an admin's.
    driver.goto(format!("{base}/console/move")).await.unwrap();
    let t = driver
        .find(By::Tag("main"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(t.contains("need an admin token"), "{t}");
    // Hand-made: alice, with her valid CSRF token, tries to move bob's node3 into her group.
    let (code, _) = post(
        &base,
        "/console/move",
        &alice_cookie,
        &[("csrf", &alice_csrf), ("server", "node3"), ("to", "a")],
    )
    .await;
    assert_eq!(code, 403, "a tenant's move of another tenant's node");
    let (code, _) = post(
        &base,
        "/console/move/preview",
        &alice_cookie,
        &[("csrf", &alice_csrf), ("server", "node3"), ("to", "a")],
    )
    .await;
    assert_eq!(code, 403, "a tenant's preview of another tenant's node");
    // ... and the event stream of an operation.
    let r = reqwest::Client::new()
        .get(format!("{base}/console/operations/{last}/events"))
        .header("cookie", format!("weft_session={alice_cookie}"))
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 403);
    // Alice logs out; her cookie replayed is refused too.
    logout(&driver, &base).await;
    let (code, _) = post(
        &base,
        "/console/move",
        &alice_cookie,
        &[("csrf", &alice_csrf), ("server", "node1"), ("to", "b")],
    )
    .await;
    assert_eq!(code, 401);
    let r = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
        .get(format!("{base}/console"))
        .header("cookie", format!("weft_session={alice_cookie}"))
        .send()
        .await
        .unwrap();
    assert_eq!(
        r.status().as_u16(),
        303,
        "a page with an ended session sends to the login form"
    );

    // Nothing changed, and every refusal is in the audit log under the session's actor.
    assert_eq!(admin.groups().await.unwrap(), before);
    let audit = admin.audit(10_000).await.unwrap();
    let refused: Vec<_> = audit[audit_before..]
        .iter()
        .filter(|a| a.outcome == "refused")
        .collect();
    let has = |actor: &str, detail: &str| {
        refused
            .iter()
            .any(|a| a.actor.starts_with(actor) && a.detail.contains(detail))
    };
    assert!(has("admin:", "CSRF"), "{refused:#?}");
    assert!(has("admin:", "ended"), "{refused:#?}");
    assert!(has("tenant:alice:", "admin token"), "{refused:#?}");
    assert!(has("tenant:alice:", "ended"), "{refused:#?}");
    assert!(
        refused
            .iter()
            .filter(|a| a.actor.starts_with("tenant:alice:"))
            .count()
            >= 3,
        "{refused:#?}"
    );

    driver.quit().await.unwrap();
    assert!(
        violations.is_empty(),
        "axe-core: serious or critical violations:\n{}",
        violations.join("\n")
    );
    let _ = stop.send(true);
    for tx in stops.values() {
        let _ = tx.send(true);
    }
}
