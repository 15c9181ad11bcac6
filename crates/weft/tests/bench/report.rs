//! `weft bench collectives --report-to` against a real `weft controller`: over three
//! namespace hosts (data egress 400 Mbit/s, host 2's 80), the links timed through the plugin
//! are stored as a `collectives` run, one per ordered pair of hosts, read back through the
//! API (host 2's links flagged) and listed on the console's Links page. Without a token
//! nothing runs; a controller that cannot be reached is said, the measurement kept. And
//! `WEFT_TOKEN` exported for other commands does not stop doctor, p2p or collectives without
//! `--report-to`, nor does it reach the ranks.

use std::io::{Read, Write};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use crate::doctor::{ADMIN, controller};
use crate::text;

/// One plain-HTTP request on loopback (bounded); the whole answer, head and body.
fn http(url: &str, method: &str, headers: &str, body: &str) -> String {
    let rest = url.strip_prefix("http://").unwrap();
    let (host, path) = rest.split_once('/').unwrap();
    let mut s = std::net::TcpStream::connect(host).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "{method} /{path} HTTP/1.0\r\nHost: {host}\r\n{headers}Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

/// The console's Links page as the admin sees it (logged in with the token).
fn links_page(api: &str) -> String {
    let login = http(
        &format!("{api}/console/login"),
        "POST",
        "Content-Type: application/x-www-form-urlencoded\r\n",
        &format!("token={ADMIN}"),
    );
    let cookie = login
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("set-cookie").then(|| v.trim())
        })
        .and_then(|v| v.split(';').next())
        .unwrap_or_else(|| panic!("a session cookie in {login}"))
        .to_string();
    http(
        &format!("{api}/console/links"),
        "GET",
        &format!("Cookie: {cookie}\r\n"),
        "",
    )
}

#[test]
fn collectives_store_their_links_in_the_controller_whose_console_lists_them() {
    if let Err(why) = weft_netns::available() {
        weft_netns::require::skip(
            "collectives_store_their_links_in_the_controller_whose_console_lists_them",
            &why,
        );
        return;
    }
    let c = weft_netns::Cluster::create(&weft_netns::ClusterSpec::new(3, 1)).unwrap();
    for i in 0..3 {
        let rate = if i == 2 { "80mbit" } else { "400mbit" };
        c.shape(i, "data0", &weft_netns::Shape::rate(rate)).unwrap();
    }
    let names: Vec<String> = c.hosts().iter().map(|h| h.name.clone()).collect();
    let hosts = names.join(",");
    let rdv = format!("{}:29600", c.host(0).mgmt_addr);
    let on_hosts = [
        "--hosts",
        hosts.as_str(),
        "--via",
        "netns",
        "--mgmt-if",
        "=mgmt0",
        "--data-if",
        "=data0",
    ];
    let dir = tempfile::tempdir().unwrap();
    let json_file = dir.path().join("nccl.json");
    let json_file_s = json_file.display().to_string();
    // `token`: WEFT_TOKEN, or none in the environment.
    let weft = |args: &[&str], token: Option<&str>| -> Output {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_weft"));
        cmd.args(args)
            .env("WEFT_PLUGIN", super::plugin())
            .env_remove("WEFT_CONFIG")
            .env_remove("WEFT_MGMT_IFNAME")
            .env_remove("WEFT_DATA_IFNAME")
            .env_remove("NCCL_TESTS_MIN_BW")
            .env_remove("NCCL_ALGO");
        match token {
            Some(t) => cmd.env("WEFT_TOKEN", t),
            None => cmd.env_remove("WEFT_TOKEN"),
        };
        cmd.output().unwrap()
    };
    let coll = |extra: &[&str], token: Option<&str>| -> Output {
        let mut args = vec!["bench", "collectives"];
        args.extend(on_hosts);
        args.extend(["--rendezvous", rdv.as_str(), "--timeout", "60"]);
        args.extend(["-b", "64K", "-e", "64K", "-n", "1", "--link-bytes", "2M"]);
        args.extend(extra);
        weft(&args, token)
    };

    // WEFT_TOKEN exported for other commands: doctor, p2p and collectives run as ever
    // without --report-to (clap does not take it for a --token without its --report-to),
    // and the ranks never get it (rank 0's -J file lists its WEFT_ variables).
    let secret = "wfa_exported-for-other-commands-0123456789";
    let mut doctor = vec!["doctor", "--no-throughput"];
    doctor.extend(on_hosts);
    let o = weft(&doctor, Some(secret));
    assert!(matches!(o.status.code(), Some(0 | 1)), "{}", text(&o));
    assert!(text(&o).contains("PASS"), "{}", text(&o));
    let mut p2p = vec!["bench", "p2p", "--duration", "0.3", "--pings", "5"];
    p2p.extend(on_hosts);
    let o = weft(&p2p, Some(secret));
    // Host 2's pairs are slow (exit 1); what matters is that it ran.
    assert!(matches!(o.status.code(), Some(0 | 1)), "{}", text(&o));
    assert!(text(&o).contains("GBIT/S"), "{}", text(&o));
    let o = coll(&["-J", &json_file_s], Some(secret));
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let written = std::fs::read_to_string(&json_file).expect("rank 0's -J file");
    assert!(written.contains("WEFT_PLUGIN="), "{written}");
    assert!(!written.contains(secret), "{written}");
    // An explicit --token without --report-to is still a usage error.
    let o = coll(&["--token", "x"], None);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("--report-to"), "{}", text(&o));

    // No token: refused at once, before any rank starts.
    let ctl = controller();
    let t = Instant::now();
    let o = coll(&["--json", "--report-to", &ctl.api], None);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("no token"), "{}", text(&o));
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    // Local ranks are not links between nodes.
    let o = weft(
        &[
            "bench",
            "collectives",
            "--nranks",
            "2",
            "--report-to",
            &ctl.api,
        ],
        Some(ADMIN),
    );
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("needs --hosts"), "{}", text(&o));

    // Stored: --json carries the run the controller answered.
    let o = coll(&["--json", "--report-to", &ctl.api], Some(ADMIN));
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("one JSON document");
    assert!(v["report_error"].is_null(), "{v:#}");
    assert_eq!(v["passed"], true, "{v:#}");
    let run = &v["reported"]["run"];
    assert_eq!(run["source"], "collectives", "{v:#}");
    let stored = run["results"].as_array().unwrap();
    let measured = v["links"]["links"].as_array().unwrap();
    assert_eq!((stored.len(), measured.len()), (6, 6), "{v:#}");
    for l in measured {
        let (s, d) = (
            &names[l["src_rank"].as_u64().unwrap() as usize],
            &names[l["dst_rank"].as_u64().unwrap() as usize],
        );
        let r = stored
            .iter()
            .find(|r| r["src"] == s.as_str() && r["dst"] == d.as_str())
            .unwrap_or_else(|| panic!("{s} -> {d} not stored: {v:#}"));
        assert_eq!(r["nic"], "plugin");
        assert!((r["gbps"].as_f64().unwrap() - l["gbps"].as_f64().unwrap()).abs() < 1e-9);
    }

    // Read back through the API: the run, and host 2's two links flagged (a fifth of the
    // others' speed, below 70% of the run's median).
    let client = weft_controller::client::Client::new(
        &ctl.api,
        Some(weft_controller::auth::Secret::new(ADMIN)),
        Duration::from_secs(10),
    )
    .unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let runs = rt.block_on(client.link_runs(10)).unwrap();
    assert_eq!(runs.len(), 1, "{runs:#?}");
    assert_eq!(runs[0].source.as_str(), "collectives");
    assert_eq!(runs[0].id, run["id"].as_i64().unwrap());
    assert_eq!(runs[0].results.len(), 6);
    let health = rt.block_on(client.link_health()).unwrap();
    let flagged: Vec<(&str, &str, &str)> = health
        .pairs
        .iter()
        .map(|p| (p.source.as_str(), p.src.as_str(), p.nic.as_str()))
        .collect();
    assert_eq!(
        flagged,
        [("collectives", names[2].as_str(), "plugin"); 2],
        "{health:#?}"
    );

    // The console lists it, labelled, and flags host 2's links under it.
    let page = links_page(&ctl.api);
    assert!(
        page.starts_with("HTTP/1.1 200") || page.starts_with("HTTP/1.0 200"),
        "{page}"
    );
    assert!(page.contains("data-source=\"collectives\""), "{page}");
    assert!(
        page.contains(&format!("(collectives run {})", runs[0].id)),
        "{page}"
    );

    // The human form: nccl-tests' output as ever, the stored line a `#` line, the link
    // report's own line taken out.
    let o = coll(&["--report-to", &ctl.api], Some(ADMIN));
    let t = text(&o);
    assert_eq!(o.status.code(), Some(0), "{t}");
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("# stored as run ") && l.contains("6 link(s), 2 below")),
        "{t}"
    );
    assert!(!stdout.contains("weft-links-json"), "{t}");
    let blocks = super::parse_nccl_tests(&stdout);
    assert_eq!(blocks.len(), 1, "{t}");
    assert_eq!(blocks[0].wrong, Some(0), "{t}");
    assert_eq!(rt.block_on(client.link_runs(10)).unwrap().len(), 2);

    // A controller that cannot be reached: said on stderr, exit 2, the measurement kept.
    let gone = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", l.local_addr().unwrap())
    };
    let o = coll(&["--json", "--report-to", &gone], Some(ADMIN));
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("one JSON document");
    assert!(v["reported"].is_null(), "{v:#}");
    let e = v["report_error"].as_str().unwrap();
    assert!(e.starts_with(&format!("--report-to {gone}")), "{e}");
    assert_eq!(v["links"]["links"].as_array().unwrap().len(), 6, "{v:#}");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains(e),
        "{}",
        text(&o)
    );
}
