//! The README's commands, run: every fenced block marked ```` ```sh test ```` is executed as
//! one bash script (`set -euo pipefail`, so an `export` holds for the lines after it and
//! every command must succeed, each step of an `a && b` chain and each `! cmd` included) against the simulated fabric of [`crate::live`] (two real
//! OpenSMs on ibsim), each block on a fresh fabric, with the README's own `# plan.toml`
//! block as the plan; and every ```` ```text ```` block that starts with `$ weft plan` is
//! run from the repository root and must print exactly what the README shows. So the README
//! cannot show a command that does not work as shown.
//!
//! What the harness substitutes, so that the README can show the paths a user has: the
//! `weft` binary comes first on `PATH`; `WEFT_CONFIG` points at the test fabric's weft.toml
//! (the README's weft.toml names `/etc` paths of a real host), which also gives `weft agent`
//! the sysfs tree of a fixture host `node1` whose port GUIDs are the fabric's (`[agent]
//! sysfs_root`); `/etc/opensm/partitions.conf` is the primary SM's file; ports `7100` and
//! `7101` are free ports. Whatever a block leaves running in the background (`weft controller &`) is
//! stopped with its process group when the block ends. Blocks that stay unmarked need what
//! no test machine has; each says why in [`UNMARKED`].

use std::os::unix::process::CommandExt;
use std::process::Command;
use std::time::{Duration, Instant};

use weft_agent::fixtures::{HcaSpec, HostSpec, PortSpec, write_host};
use weft_fabric::Guid;

/// The README's shell blocks that are not run, by their first command, and why.
const UNMARKED: &[(&str, &str)] = &[
    (
        "createdb weft",
        "an operator's PostgreSQL server and role; `cluster::a_controller_on_postgresql_through_the_cli_backed_up_with_pg_dump_and_restored_fresh` runs `weft controller --store` on a real PostgreSQL it starts",
    ),
    (
        "export WEFT_STORE_URL='postgres://weft@db.example/weft'",
        "two hosts and an operator's PostgreSQL; `ha::two_controllers_on_postgresql_survive_kill_9_of_the_leader_20_times_and_a_cut_off` runs two `weft controller --store --advertise-url` on a real PostgreSQL it starts",
    ),
    (
        "cargo xtask demo",
        "the demo and the whole test suite: CI runs both itself",
    ),
    (
        "weft doctor --hosts node1,node2,node3,node4",
        "real hosts over SSH; the block after the [bench] example runs doctor and p2p on namespace hosts",
    ),
    (
        "cargo build --release -p weft-nccl-net",
        "a NCCL job on GPUs; the plugin's ABI is tested by weft-nccl-net's conformance harness",
    ),
    (
        "fi_info -p 'verbs;ofi_rxm'",
        "an InfiniBand or RoCE HCA (verbs) and a NCCL job on GPUs",
    ),
    (
        "cargo xtask deb",
        "a release build; `cargo xtask deb-test` installs the package in a clean Debian and runs these units under systemd",
    ),
    (
        "install -m 0600 /dev/stdin /etc/weft/controller.env",
        "systemd as PID 1: `cargo xtask deb-test` runs exactly these steps in a booted clean Debian (packaging/deb-test)",
    ),
    (
        "WEFT_TOKEN=... weft plan Qwen/Qwen3-235B-A22B",
        "a controller whose agents reported GPUs, and a Hugging Face repo read over the network",
    ),
    (
        "H=spark1,spark2,spark3,spark4",
        "four real hosts over SSH, GPUs for the jobs",
    ),
    (
        "weft bench llm compare",
        "RUN.json files of runs on 1, 2 and 4 nodes of a real server",
    ),
];

/// The fenced blocks of `markdown` as (info string, body).
fn blocks(markdown: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut current: Option<(String, String)> = None;
    for line in markdown.lines() {
        let fence = line.trim_start().strip_prefix("```");
        match (fence, current.take()) {
            (Some(_), Some(done)) => out.push(done),
            (Some(info), None) => current = Some((info.trim().to_string(), String::new())),
            (None, Some((info, mut body))) => {
                body.push_str(line.trim_start());
                body.push('\n');
                current = Some((info, body));
            }
            (None, None) => {}
        }
    }
    out
}

fn readme() -> String {
    std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md"))
        .expect("README.md")
}

#[test]
fn blocks_are_found_with_their_info_strings() {
    let md = "text\n```sh test\nweft a\n  weft b\n```\n```toml\n# plan.toml\nx = 1\n```\n";
    let b = blocks(md);
    assert_eq!(b.len(), 2);
    assert_eq!(b[0], ("sh test".into(), "weft a\nweft b\n".into()));
    assert!(b[1].1.starts_with("# plan.toml"));
}

/// Every shell block is either run or listed in [`UNMARKED`] with a reason, and every
/// entry of that list still names a block.
#[test]
fn every_shell_block_is_run_or_says_why_not() {
    let all = blocks(&readme());
    let first_command = |body: &str| {
        body.lines()
            .map(str::trim)
            .find(|l| !l.is_empty() && !l.starts_with('#'))
            .unwrap_or("")
            .to_string()
    };
    let mut used = vec![false; UNMARKED.len()];
    for (info, body) in &all {
        if info != "sh" && !info.is_empty() {
            continue;
        }
        if info.is_empty() && !body.trim_start().starts_with("weft ") {
            continue;
        }
        let first = first_command(body);
        let hit = UNMARKED
            .iter()
            .position(|(start, _)| first.starts_with(start));
        match hit {
            Some(i) => used[i] = true,
            None => panic!(
                "README block starting `{first}` is neither ```sh test nor in UNMARKED with a reason"
            ),
        }
    }
    for (i, (start, _)) in UNMARKED.iter().enumerate() {
        assert!(
            used[i],
            "UNMARKED names `{start}`, which no README block starts with"
        );
    }
}

/// A free TCP port on loopback.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Where the top level of a shell line has `&&` (byte offsets), and where its comment
/// starts: outside quotes, `$(...)`, backquotes and parentheses.
fn top_level(line: &str) -> (Vec<usize>, Option<usize>, bool) {
    let b = line.as_bytes();
    let (mut ands, mut or) = (Vec::new(), false);
    let (mut single, mut double, mut back, mut depth) = (false, false, false, 0usize);
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if single {
            single = c != b'\'';
        } else if c == b'\\' {
            i += 1;
        } else if c == b'"' {
            double = !double;
        } else if c == b'`' {
            back = !back;
        } else if !double && c == b'\'' {
            single = true;
        } else if c == b'(' {
            depth += 1;
        } else if c == b')' {
            depth = depth.saturating_sub(1);
        } else if !double && !back && depth == 0 {
            if c == b'#' && (i == 0 || b[i - 1].is_ascii_whitespace()) {
                return (ands, Some(i), or);
            }
            if b[i..].starts_with(b"&&") {
                ands.push(i);
                i += 1;
            } else if b[i..].starts_with(b"||") {
                or = true;
                i += 1;
            }
        }
        i += 1;
    }
    (ands, None, or)
}

/// The block with every command of it checked: `set -e` does not stop at a failed step of
/// `a && b && c` (only the last one counts) nor at a `! cmd` that succeeds, so each such
/// chain becomes one line per command, and `! cmd` a check that `cmd` fails. A line with a
/// top-level `||` (a failure meant to be tolerated) or one that ends with `&` (a background
/// job) stays as it is.
fn every_step_checked(script: &str) -> String {
    let mut out = String::new();
    for line in script.lines() {
        let (ands, comment, or) = top_level(line);
        let code = comment.map_or(line, |c| &line[..c]).trim_end();
        if code.trim().is_empty() || or || code.ends_with('&') {
            out.push_str(line);
            out.push('\n');
            continue;
        }
        let mut parts = Vec::new();
        let mut from = 0;
        for a in ands {
            parts.push(code[from..a].trim());
            from = a + 2;
        }
        parts.push(code[from..].trim());
        for part in parts {
            match part.strip_prefix("! ") {
                Some(cmd) => out.push_str(&format!(
                    "if {cmd}; then echo \"README step succeeded, which it must not: {}\" >&2; exit 1; fi\n",
                    cmd.replace(['"', '\\', '$', '`'], "'")
                )),
                None => {
                    out.push_str(part);
                    out.push('\n');
                }
            }
        }
    }
    out
}

#[test]
fn a_block_with_a_failing_middle_step_fails_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let (ok, out) = run_block(
        "true && false && echo chained\necho after > after.txt\n",
        dir.path(),
        &[],
    );
    assert!(!ok, "{out}");
    assert!(out.contains("README line failed (exit 1): false"), "{out}");
    assert!(!dir.path().join("after.txt").exists(), "{out}");
    // A negated step that succeeds fails the block too; one that fails is what it says.
    let (ok, out) = run_block("! true  # must fail\necho after\n", dir.path(), &[]);
    assert!(!ok && out.contains("must not: true"), "{out}");
    let (ok, out) = run_block(
        "! false 2> x.txt   # exit 1: \"quoted && not split\"\necho 'a && b' && echo \"$(echo c && echo d)\"\nfalse || echo tolerated\n",
        dir.path(),
        &[],
    );
    assert!(ok, "{out}");
    assert!(
        out.contains("a && b\nc\nd\ntolerated"),
        "quotes and $(...) are not split: {out}"
    );
}

/// Runs one block as a bash script in its own process group, bounded; stops what it left
/// running. Returns (success, output). Every command of it must succeed
/// ([`every_step_checked`]); the one that failed is named in the output.
fn run_block(script: &str, dir: &std::path::Path, env: &[(&str, String)]) -> (bool, String) {
    let script = every_step_checked(script);
    let wrapped = format!(
        "set -euo pipefail\ntrap 'echo \"README line failed (exit $?): $BASH_COMMAND\" >&2' ERR\n{script}"
    );
    let log = dir.join("block.log");
    let mut cmd = Command::new("bash");
    cmd.args(["-c", &wrapped])
        .current_dir(dir)
        .stdout(std::fs::File::create(&log).unwrap())
        .stderr(std::fs::File::create(dir.join("block.err")).unwrap())
        .process_group(0);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    let pgid = nix::unistd::Pid::from_raw(-(child.id() as i32));
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if start.elapsed() > Duration::from_secs(180) {
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    // What the block started in the background goes with it.
    let _ = nix::sys::signal::kill(pgid, nix::sys::signal::Signal::SIGTERM);
    std::thread::sleep(Duration::from_millis(300));
    let _ = nix::sys::signal::kill(pgid, nix::sys::signal::Signal::SIGKILL);
    let _ = child.wait();
    let out = format!(
        "{}{}",
        std::fs::read_to_string(&log).unwrap_or_default(),
        std::fs::read_to_string(dir.join("block.err")).unwrap_or_default()
    );
    match status {
        Some(s) => (s.success(), out),
        None => (
            false,
            format!("{out}\n(the block did not finish within 180 s)"),
        ),
    }
}

#[test]
fn every_runnable_readme_command_works_on_the_simulated_fabric() {
    let all = blocks(&readme());
    let plan = all
        .iter()
        .find(|(info, body)| info == "toml" && body.starts_with("# plan.toml"))
        .map(|(_, b)| b.clone())
        .expect("the README shows a plan.toml");
    let runnable: Vec<&String> = all
        .iter()
        .filter(|(info, _)| info == "sh test")
        .map(|(_, b)| b)
        .collect();
    assert!(runnable.len() >= 3, "{} ```sh test blocks", runnable.len());
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_weft"))
        .parent()
        .unwrap()
        .to_path_buf();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    for block in runnable {
        // A fresh fabric for each block: the controller's story starts from a fabric that
        // `weft fabric apply` has not touched.
        let l = crate::live(2);
        let dir = l.fabric.dir();
        std::fs::write(dir.join("plan.toml"), &plan).unwrap();
        // node1 as its agent sees it: one HCA whose ports are the fabric's.
        let topology = weft_testbed::Topology::single_switch(4);
        let node1 = topology
            .end_nodes()
            .find(|h| h.name == "node1")
            .expect("the fabric has node1");
        let mut hca = HcaSpec::new("mlx5_0", Guid(node1.node_guid), "0000:01:00.0");
        for (p, _) in &node1.port_guids {
            hca = hca.with_port(PortSpec::infiniband(u32::from(*p)));
        }
        let sysfs = dir.join("host-node1");
        write_host(&sysfs, &HostSpec::new("node1").with_hca(hca)).unwrap();
        let config = dir.join("weft.toml");
        let mut toml = std::fs::read_to_string(&config).unwrap();
        toml.push_str(&format!(
            "\n[agent]\nsysfs_root = \"{}\"\n",
            sysfs.display()
        ));
        // The doctor and bench block: three namespace hosts as `[bench]` names them; a pair
        // is slow only below 5 % of the median (the CI machine's 2 cores are shared by
        // every test, which p2p would rightly report as slow pairs at the default 50 %).
        let _cluster = if block.contains("weft doctor") || block.contains("weft bench p2p") {
            if let Err(why) = weft_netns::available() {
                weft_netns::require::skip("the README's doctor and bench block", &why);
                continue;
            }
            let c = weft_netns::Cluster::create(&weft_netns::ClusterSpec::new(3, 1))
                .expect("namespace hosts");
            let hosts: Vec<String> = c
                .hosts()
                .iter()
                .map(|h| format!("\"{}\"", h.name))
                .collect();
            toml.push_str(&format!(
                "\n[bench]\nhosts = [{}]\nvia = \"netns\"\nmgmt_if = \"=mgmt0\"\ndata_if = \"=data0\"\n\n[bench.p2p]\nduration_s = 0.5\nthreshold = 0.05\n",
                hosts.join(", ")
            ));
            Some(c)
        } else {
            None
        };
        std::fs::write(&config, toml).unwrap();
        let master_file = l.sms[0].1.display().to_string();
        let port = free_port();
        let script = block
            .replace("/etc/opensm/partitions.conf", &master_file)
            .replace(":7100", &format!(":{port}"))
            .replace(":7101", &format!(":{}", free_port()));
        let (ok, out) = run_block(
            &script,
            dir,
            &[
                ("PATH", path.clone()),
                ("WEFT_CONFIG", config.display().to_string()),
            ],
        );
        assert!(ok, "README block failed:\n{block}\n--- output:\n{out}");
    }
}

/// The `weft plan` examples print exactly what the README shows (run from the repository
/// root on the checked-in fixtures; leading blanks aside, as the README indents nothing).
#[test]
fn the_readme_plan_examples_print_what_it_shows() {
    let root = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."));
    let mut n = 0;
    for (info, body) in blocks(&readme()) {
        let Some(cmd) = body
            .lines()
            .next()
            .and_then(|l| l.strip_prefix("$ weft plan "))
        else {
            continue;
        };
        if info != "text" {
            continue;
        }
        n += 1;
        let o = Command::new(env!("CARGO_BIN_EXE_weft"))
            .arg("plan")
            .args(cmd.split_whitespace())
            .current_dir(root)
            .env_remove("WEFT_CONFIG")
            .env("NO_COLOR", "1")
            .output()
            .unwrap();
        let got: Vec<String> = String::from_utf8_lossy(&o.stdout)
            .lines()
            .map(|l| l.trim().to_string())
            .collect();
        let want: Vec<String> = body.lines().skip(1).map(|l| l.trim().to_string()).collect();
        assert_eq!(
            got.join("\n").trim_end(),
            want.join("\n").trim_end(),
            "README's `weft plan {cmd}` differs from what it prints (stderr: {})",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    assert!(n >= 2, "{n} plan examples");
}
