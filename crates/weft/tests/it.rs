//! The `weft` binary as a person runs it: exit codes, messages, `--json`, and the
//! fabric verbs against the real OpenSM on an ibsim fabric.

mod bench;
mod cluster;
mod doctor;
mod ha;
mod import;
mod launch;
mod plan;
mod readme;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use weft_testbed::{SimFabric, SmHandle, SmSpec, Topology};

fn weft(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_weft"))
        .args(args)
        .current_dir(dir)
        .env_remove("WEFT_CONFIG")
        .output()
        .expect("weft runs")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The stdout of a run that must exit 0 (else the assertion shows stdout and stderr).
fn ok(o: Output) -> String {
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Polls `f` every 10 ms until it gives a value, failing after `limit` with `what`.
fn until<T>(what: &str, limit: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let start = std::time::Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            start.elapsed() < limit,
            "timed out after {limit:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn every_command_has_help_with_an_example() {
    let dir = tempfile::tempdir().unwrap();
    for verb in ["check", "diff", "apply", "verify", "import", "status"] {
        let o = weft(dir.path(), &["fabric", verb, "--help"]);
        assert_eq!(o.status.code(), Some(0), "{verb}");
        assert!(text(&o).contains("Example"), "{verb}: {}", text(&o));
    }
    assert!(text(&weft(dir.path(), &["--help"])).contains("Exit codes"));
}

#[test]
fn a_plan_that_does_not_parse_is_a_failed_check_naming_the_line() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("plan.toml"),
        "[default]\npolicy = \"isolate\"\n\n[[partition]]\nname = \"a\"\ntenant = \"a\"\npkey = \"0x8001\"\n",
    )
    .unwrap();
    let o = weft(dir.path(), &["fabric", "check", "plan.toml"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("0x8001"), "{}", text(&o));
}

#[test]
fn a_missing_file_or_bad_config_is_an_environment_error() {
    let dir = tempfile::tempdir().unwrap();
    let o = weft(dir.path(), &["fabric", "check", "nothere.toml"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o).contains("nothere.toml"));
    std::fs::write(dir.path().join("weft.toml"), "[fabric]\nsweep_ms = 1\n").unwrap();
    std::fs::write(
        dir.path().join("plan.toml"),
        "[default]\npolicy = \"isolate\"\n",
    )
    .unwrap();
    let o = weft(dir.path(), &["fabric", "check", "plan.toml"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o).contains("sweep_ms"), "{}", text(&o));
    let o = weft(dir.path(), &["fabric", "frobnicate"]);
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn errors_under_json_are_json_with_their_causes() {
    let dir = tempfile::tempdir().unwrap();
    for args in [
        &["--json", "fabric", "check", "nothere.toml"][..],
        &["--json", "fabric", "frobnicate"][..],
        &["--json", "plan", "no/such/model"][..],
    ] {
        let o = weft(dir.path(), args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout)
            .unwrap_or_else(|e| panic!("{args:?}: stdout is not JSON ({e}): {}", text(&o)));
        assert!(v["error"].as_str().is_some_and(|s| !s.is_empty()), "{v}");
        assert!(v["causes"].is_array(), "{v}");
    }
    let o = weft(dir.path(), &["--json", "fabric", "check", "nothere.toml"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(v.to_string().contains("nothere.toml"), "{v}");
}

/// Every client command of the controller, under `--json`, against a controller that is
/// not there: stdout is one JSON error of the documented shape (`error`, `causes`, `exit`),
/// the exit code is 2, and the message names the URL and the cause once. The list is checked
/// against each command group's `--help`, so a new client command cannot be left out.
#[test]
fn every_client_command_under_json_fails_as_json_against_an_unreachable_controller() {
    let dir = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}");
    let commands: &[&[&str]] = &[
        &["nodes"],
        &["nodes", "list"],
        &["nodes", "enroll", "--server", "node1"],
        &["nodes", "claims"],
        &["nodes", "remove", "node1"],
        &["nodes", "approve", "1"],
        &["group", "create", "a", "--tenant", "alice"],
        &["group", "add", "a", "node1"],
        &["group", "move", "node1", "--to", "b"],
        &["group", "remove", "a", "node1"],
        &["group", "remove", "a"],
        &["group", "list"],
        &["tenant", "create", "alice"],
        &["tenant", "list"],
        &["tenant", "token", "alice"],
        &["tenant", "delete", "alice"],
        &["audit"],
        &["token", "list"],
        &["token", "admin"],
        &["token", "revoke", "0123456789abcdef"],
        &["plan", "tests/plan/nothere", "--group", "a"],
    ];
    // Every subcommand of the client groups is in the list.
    for group in ["nodes", "group", "tenant", "token"] {
        let help = text(&weft(dir.path(), &[group, "--help"]));
        let subs = help
            .split("Commands:")
            .nth(1)
            .unwrap_or_else(|| panic!("{group} --help lists no commands: {help}"))
            .split("\n\n")
            .next()
            .unwrap()
            .lines()
            .filter_map(|l| l.split_whitespace().next())
            .filter(|w| *w != "help")
            .collect::<Vec<_>>();
        assert!(!subs.is_empty(), "{help}");
        for sub in subs {
            assert!(
                commands
                    .iter()
                    .any(|c| c[0] == group && c.get(1) == Some(&sub)),
                "`weft {group} {sub}` is not in the list of client commands tested here"
            );
        }
    }
    for c in commands {
        let args = [
            &["--json"][..],
            c,
            &["--controller", &url, "--timeout-s", "5"],
        ]
        .concat();
        let o = Command::new(env!("CARGO_BIN_EXE_weft"))
            .args(&args)
            .current_dir(dir.path())
            .env_remove("WEFT_CONFIG")
            .env_remove("WEFT_CONTROLLER")
            .env("WEFT_TOKEN", "0123456789abcdef0123456789abcdef")
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(2), "{c:?}: {}", text(&o));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout)
            .unwrap_or_else(|e| panic!("{c:?}: stdout is not JSON ({e}): {}", text(&o)));
        assert_eq!(v["exit"], 2, "{c:?}: {v}");
        assert!(v["causes"].is_array(), "{c:?}: {v}");
        let all = format!(
            "{} {}",
            v["error"].as_str().unwrap_or_default(),
            v["causes"]
        );
        assert_eq!(all.matches(&url).count(), 1, "{c:?}: the URL once: {all}");
        assert_eq!(
            all.matches("Connection refused").count(),
            1,
            "{c:?}: the cause once: {all}"
        );
    }
    // The agent, which has no credentials yet and no enrollment token: the same shape.
    let o = Command::new(env!("CARGO_BIN_EXE_weft"))
        .args([
            "--json",
            "agent",
            "--state-file",
            "nothere.json",
            "--controller",
            &url,
        ])
        .current_dir(dir.path())
        .env_remove("WEFT_CONFIG")
        .env_remove("WEFT_ENROLL_TOKEN")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("agent: stdout is not JSON ({e}): {}", text(&o)));
    assert_eq!(v["exit"], 2, "{v}");
    assert!(
        v["error"]
            .as_str()
            .is_some_and(|e| e.starts_with("agent: ")),
        "{v}"
    );
}

/// The log on a terminal (a pty from util-linux `script`): coloured, unless `NO_COLOR` is
/// set (no-color.org), which once worked, then stopped when the colour was made to follow
/// the terminal. `--log-format json` writes one JSON object a line.
#[test]
fn no_color_turns_the_log_colour_off_on_a_terminal_and_the_log_can_be_json() {
    let dir = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let bin = env!("CARGO_BIN_EXE_weft");
    // A command that logs (reqwest's connection attempt, at DEBUG) and fails fast.
    let cmd = format!("{bin} nodes --controller http://127.0.0.1:{port} --timeout-s 2");
    let on_tty = |no_color: Option<&str>| {
        let mut c = Command::new("script");
        c.args(["-qec", &cmd, "/dev/null"])
            .current_dir(dir.path())
            .env_remove("WEFT_CONFIG")
            .env_remove("WEFT_LOG_FORMAT")
            .env("WEFT_LOG", "debug")
            .env_remove("NO_COLOR");
        if let Some(v) = no_color {
            c.env("NO_COLOR", v);
        }
        let o = c.output().expect("util-linux `script` runs");
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let coloured = on_tty(None);
    assert!(coloured.contains("DEBUG"), "the command logs: {coloured}");
    assert!(
        coloured.contains('\x1b'),
        "a terminal gets colour: {coloured:?}"
    );
    let plain = on_tty(Some("1"));
    assert!(plain.contains("DEBUG"), "{plain}");
    assert!(!plain.contains('\x1b'), "NO_COLOR=1: {plain:?}");
    // no-color.org: an empty NO_COLOR is as if unset.
    assert!(on_tty(Some("")).contains('\x1b'));

    let o = Command::new(bin)
        .args(["--log-format", "json", "nodes", "--controller"])
        .arg(format!("http://127.0.0.1:{port}"))
        .current_dir(dir.path())
        .env_remove("WEFT_CONFIG")
        .env("WEFT_LOG", "debug")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    let logged: Vec<serde_json::Value> = err
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert!(!logged.is_empty(), "{err}");
    assert!(
        logged
            .iter()
            .all(|v| v["level"].is_string() && v["timestamp"].is_string()),
        "{err}"
    );
    assert!(
        err.lines()
            .all(|l| l.starts_with('{') || l.starts_with("weft: ")),
        "only JSON lines and the error line: {err}"
    );
}

#[test]
fn a_broken_weft_toml_stops_only_the_commands_that_read_it() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("weft.toml"), "[fabric\nnot toml").unwrap();
    // `weft plan` reads no configuration: a broken file does not stop it.
    let o = weft(dir.path(), &["plan", "--help"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let o = weft(dir.path(), &["plan", "no/such/model"]);
    assert!(!text(&o).contains("weft.toml"), "{}", text(&o));
    // `weft fabric` does, and names the file.
    std::fs::write(
        dir.path().join("plan.toml"),
        "[default]\npolicy = \"isolate\"\n",
    )
    .unwrap();
    let o = weft(dir.path(), &["fabric", "check", "plan.toml"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("weft.toml"), "{}", text(&o));
}

/// `[bench]` gives the bench commands their defaults through the binary: the file's endpoint
/// is used, `WEFT_LLM_URL` wins over it, a flag over both; a fault in another section does
/// not stop a benchmark, one in `[bench]` is named with the file and the line.
#[test]
fn bench_takes_its_defaults_from_weft_toml_and_env_and_flags_win() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("weft.toml"),
        "[fabric]\nsweep_ms = 1\n\n[bench.llm]\nbase_url = \"http://127.0.0.1:9/v1\"\nmodel = \"m\"\nretries = 0\nconnect_timeout_s = 2\n",
    )
    .unwrap();
    let run = |env: &[(&str, &str)], args: &[&str]| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_weft"));
        c.args(args)
            .current_dir(dir.path())
            .env_remove("WEFT_CONFIG")
            .env_remove("WEFT_LLM_URL");
        for (k, v) in env {
            c.env(k, v);
        }
        c.output().expect("weft runs")
    };
    let o = run(&[], &["bench", "llm", "--runs", "1"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("127.0.0.1:9/v1"), "{}", text(&o));
    // `--help` shows the file's values as the defaults.
    let o = run(&[], &["bench", "llm", "--model", "x", "--help"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(
        text(&o).contains("[default: http://127.0.0.1:9/v1]"),
        "{}",
        text(&o)
    );
    let o = run(
        &[("WEFT_LLM_URL", "http://127.0.0.1:10/v1")],
        &["bench", "llm", "--runs", "1"],
    );
    assert!(text(&o).contains("127.0.0.1:10/v1"), "{}", text(&o));
    let o = run(
        &[("WEFT_LLM_URL", "http://127.0.0.1:10/v1")],
        &[
            "bench",
            "llm",
            "--runs",
            "1",
            "--base-url",
            "http://127.0.0.1:11/v1",
        ],
    );
    assert!(text(&o).contains("127.0.0.1:11/v1"), "{}", text(&o));
    std::fs::write(dir.path().join("weft.toml"), "[bench]\nvia = 3\n").unwrap();
    let o = run(&[], &["bench", "p2p", "--json"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("a JSON error");
    let all = v.to_string();
    assert!(
        all.contains("weft.toml") && all.contains("line 2") && all.contains("via"),
        "{all}"
    );
}

#[test]
fn the_controller_takes_its_settings_from_weft_toml_and_flags_win() {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("weft.toml"),
        "[controller]\nlisten = \"127.0.0.1:0\"\nmetrics_listen = \"127.0.0.1:0\"\ndb = \"from-file.db\"\nstale_after_s = 5\n\n[agent]\nheartbeat_s = 2.5\n",
    )
    .unwrap();
    let start = |extra: &[&str]| {
        let mut child = Command::new(env!("CARGO_BIN_EXE_weft"))
            .arg("controller")
            .args(["--no-fabric", "--init"])
            .args(extra)
            .current_dir(dir.path())
            .env_remove("WEFT_CONFIG")
            .env("WEFT_ADMIN_TOKEN", "0123456789abcdef0123456789abcdef")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let _ = child.kill();
        let _ = child.wait();
        line
    };
    let line = start(&[]);
    assert!(
        line.starts_with("weft controller: api http://127.0.0.1:"),
        "{line}"
    );
    assert!(dir.path().join("from-file.db").exists(), "{line}");
    start(&["--db", "from-flag.db"]);
    assert!(dir.path().join("from-flag.db").exists());
    // A key the section does not have is refused, naming it.
    std::fs::write(dir.path().join("weft.toml"), "[agent]\nheartbeat = 2\n").unwrap();
    let o = weft(dir.path(), &["agent", "--controller", "http://127.0.0.1:9"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("heartbeat"), "{}", text(&o));
}

#[test]
fn import_refuses_what_opensm_would_silently_misread() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("partitions.conf"),
        "Default=0x7fff, ipoib : ALL=full ;\ntenantA=0x0a0a : 0x0002c90300000101=full,\n   node3=full ;\n",
    )
    .unwrap();
    let o = weft(dir.path(), &["fabric", "import", "partitions.conf"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o).contains("line 3, column 4"), "{}", text(&o));
}

#[test]
fn import_then_check_renders_the_same_partitions() {
    let dir = tempfile::tempdir().unwrap();
    let original = "Default=0x7fff, ipoib : ALL=limited, SELF=full ;\n\
                    tenantA=0x0a0a, ipoib, mtu=4 : 0x0002c90300000101=full, 0x0002c90300000201=limited ;\n";
    std::fs::write(dir.path().join("partitions.conf"), original).unwrap();
    let o = weft(dir.path(), &["fabric", "import", "partitions.conf"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    std::fs::write(dir.path().join("plan.toml"), &o.stdout).unwrap();
    let o = weft(dir.path(), &["fabric", "check", "plan.toml", "--render"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let rendered = weft_fabric::conf::parse(&String::from_utf8_lossy(&o.stdout)).unwrap();
    assert_eq!(rendered, weft_fabric::conf::parse(original).unwrap());
}

/// A simulated fabric with one or two OpenSMs and a weft.toml that points at them.
struct Live {
    fabric: SimFabric,
    sms: Vec<(SmHandle, PathBuf)>,
}

const OPEN: &str = "Default=0x7fff, ipoib : ALL=full ;\n";

fn live(n_sms: usize) -> Live {
    live_on(&Topology::single_switch(4), n_sms, &[])
}

/// [`live`] on any topology, with extra `opensm.conf` lines for every SM.
fn live_on(topology: &Topology, n_sms: usize, extra: &[(&str, &str)]) -> Live {
    let mut fabric = SimFabric::start(topology).expect("ibsim starts");
    let mut sms = Vec::new();
    for (name, host, priority) in [("primary", "smhost", 10), ("standby", "smhost2", 5)]
        .into_iter()
        .take(n_sms)
    {
        let etc = fabric.dir().join(format!("{name}-etc"));
        std::fs::create_dir_all(&etc).unwrap();
        let file = etc.join("partitions.conf");
        std::fs::write(&file, OPEN).unwrap();
        let h = fabric
            .start_sm(SmSpec {
                name: name.into(),
                sim_host: host.into(),
                priority,
                partitions_file: file.clone(),
                extra_config: extra
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            })
            .expect("OpenSM starts");
        sms.push((h, file));
    }
    let mut cfg = format!(
        "[fabric.diag]\ncwd = \"{}\"\n[fabric.diag.env]\n",
        fabric.dir().display()
    );
    for (k, v) in fabric.client_env("node1") {
        cfg.push_str(&format!("{k} = \"{v}\"\n"));
    }
    for (h, file) in &sms {
        cfg.push_str(&format!(
            "[[fabric.sm]]\nname = \"{}\"\nport_guid = \"{:#x}\"\npartitions_file = \"{}\"\npid_file = \"{}\"\nlog_file = \"{}\"\n",
            h.name,
            h.port_guid,
            file.display(),
            h.pid_file.display(),
            h.log_file.display()
        ));
    }
    std::fs::write(fabric.dir().join("weft.toml"), cfg).unwrap();
    Live { fabric, sms }
}

const PLAN: &str = r#"
[default]
policy = "isolate"
[[partition]]
name = "alice"
tenant = "alice"
members = [{ node = "node1" }, { node = "node2" }]
[[partition]]
name = "bob"
tenant = "bob"
members = [{ node = "node3" }]
"#;

#[test]
fn apply_refuses_an_unknown_node_and_touches_nothing() {
    let l = live(1);
    let dir = l.fabric.dir();
    std::fs::write(dir.join("plan.toml"), PLAN.replace("node3", "nod3")).unwrap();
    let log_before = std::fs::metadata(&l.sms[0].0.log_file).unwrap().len();
    let o = weft(dir, &["fabric", "apply", "plan.toml"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("nod3"), "{}", text(&o));
    assert_eq!(std::fs::read_to_string(&l.sms[0].1).unwrap(), OPEN);
    // No reread was requested: OpenSM logged nothing new.
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(
        std::fs::metadata(&l.sms[0].0.log_file).unwrap().len(),
        log_before
    );
}

#[test]
fn apply_verify_and_status_with_json() {
    let l = live(2);
    let dir = l.fabric.dir();
    std::fs::write(dir.join("plan.toml"), PLAN).unwrap();
    let o = weft(dir, &["fabric", "verify", "plan.toml"]);
    assert_eq!(o.status.code(), Some(1), "before apply: {}", text(&o));
    let o = weft(
        dir,
        &["fabric", "apply", "plan.toml", "--json", "--allow-removal"],
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(report["changed"], true);
    assert!(report["ports_verified"].as_u64().unwrap() >= 6);
    let o = weft(dir, &["fabric", "verify", "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["mismatches"].as_array().unwrap().len(), 0);
    let o = weft(dir, &["fabric", "status", "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let s: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(s["in_sync"], true);
    assert_eq!(s["sms"][0]["master"], true);
    // A standby whose file drifted is reported out of sync.
    std::fs::write(&l.sms[1].1, OPEN).unwrap();
    let o = weft(dir, &["fabric", "status"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o).contains("OUT OF SYNC"));
}

/// Regression: `fabric status` said `OUT OF SYNC` when one SM's file could not be read,
/// and `in sync` when the only configured SM was not the master. Each is its own answer.
#[test]
fn status_tells_an_unreadable_sm_from_differing_ones_and_says_when_no_configured_sm_is_master() {
    let l = live(2);
    let dir = l.fabric.dir();
    let o = weft(dir, &["fabric", "status"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(text(&o).contains("in sync"), "{}", text(&o));
    // The standby's file cannot be read (a directory stands where it should be).
    let standby = &l.sms[1].1;
    std::fs::remove_file(standby).unwrap();
    std::fs::create_dir(standby).unwrap();
    let o = weft(dir, &["fabric", "status", "--json"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let s: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(s["state"], "unreadable", "{s}");
    assert!(
        s["message"]
            .as_str()
            .unwrap()
            .contains("cannot read SM `standby`"),
        "{s}"
    );
    assert!(
        !s["message"].as_str().unwrap().contains("OUT OF SYNC"),
        "{s}"
    );
    std::fs::remove_dir(standby).unwrap();
    std::fs::write(standby, OPEN).unwrap();
    // Only the standby configured: the SMs "agree", but none of them is master.
    let cfg = std::fs::read_to_string(dir.join("weft.toml")).unwrap();
    let parts: Vec<&str> = cfg.split("[[fabric.sm]]").collect();
    assert_eq!(parts.len(), 3, "{cfg}");
    std::fs::write(
        dir.join("weft.toml"),
        format!("{}[[fabric.sm]]{}", parts[0], parts[2]),
    )
    .unwrap();
    let o = weft(dir, &["fabric", "status"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("NO CONFIGURED MASTER"), "{}", text(&o));
    assert!(!text(&o).contains("in sync"), "{}", text(&o));
}

/// kill -9 of weft at points spread over a whole apply: the SM's file is always exactly
/// the previous or the new version, never a partial one, and a later apply cleans up.
#[test]
fn kill_9_during_apply_never_leaves_a_partial_file() {
    let l = live(1);
    let dir = l.fabric.dir();
    let file = &l.sms[0].1;
    let plans = [PLAN.to_string(), PLAN.replace("{ node = \"node1\" }, ", "")];
    assert_ne!(plans[0], plans[1]);
    // One complete apply tells how long an apply takes here.
    std::fs::write(dir.join("plan.toml"), &plans[1]).unwrap();
    let start = std::time::Instant::now();
    let o = weft(dir, &["fabric", "apply", "plan.toml", "--allow-removal"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let full = start.elapsed();

    // Kills from the very start (before any write) to three times a typical apply (after
    // it), until both outcomes were seen: load on the machine only moves where they fall.
    let (mut kept, mut replaced) = (0, 0);
    for i in 0..=24u32 {
        if i >= 8 && kept > 0 && replaced > 0 {
            break;
        }
        let before = std::fs::read_to_string(file).unwrap();
        // Every round's plan is new (its own P_Key), so an apply that lands always changes
        // the file.
        let plan = plans[0].replace(
            "name = \"alice\"\n",
            &format!("name = \"alice\"\npkey = \"{:#06x}\"\n", 0x100 + i),
        );
        assert_ne!(plan, plans[0]);
        std::fs::write(dir.join("plan.toml"), plan).unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_weft"))
            .args(["fabric", "apply", "plan.toml", "--allow-removal"])
            .current_dir(dir)
            .env_remove("WEFT_CONFIG")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(full * i / 8);
        let _ = child.kill();
        let _ = child.wait();
        let after = std::fs::read_to_string(file).unwrap();
        if after == before {
            kept += 1;
        } else {
            let conf = weft_fabric::conf::parse(&after)
                .unwrap_or_else(|e| panic!("partial file after kill in round {i}: {e}\n{after}"));
            assert_eq!(after, weft_fabric::conf::render(&conf), "round {i}");
            replaced += 1;
        }
    }
    assert!(kept > 0 && replaced > 0, "kept {kept}, replaced {replaced}");
    // A complete apply afterwards succeeds and clears any temporary file a kill left
    // (under its lock, which stays beside the file).
    std::fs::write(dir.join("plan.toml"), PLAN).unwrap();
    let o = weft(dir, &["fabric", "apply", "plan.toml", "--allow-removal"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let mut names: Vec<_> = std::fs::read_dir(file.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, [".partitions.conf.weft-lock", "partitions.conf"]);
}
