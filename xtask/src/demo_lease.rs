//! The demo's lease: a controller (recording only, `--no-fabric`: the demo's fabric belongs
//! to `weft fabric apply` by then) with two agents, a free pool, a tenant's quota, and a
//! lease from request to its end: granted, warned on the nodes (a file and a hook the agents
//! run), moved back to the pool by the controller itself. The moves verified on a real
//! fabric are the tests' (`weft lease` in crates/weft/tests/cluster, the README's block).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use weft_agent::fixtures::{HcaSpec, HostSpec, PortSpec, write_host};
use weft_fabric::Guid;

/// A child process, killed (by its own pid) when dropped.
struct Kid(Child);

impl Drop for Kid {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn cmd(bin: &Path, dir: &Path, env: &[(&str, &str)], args: &[&str]) -> Command {
    let mut c = Command::new(bin);
    c.args(args).current_dir(dir).env_remove("WEFT_CONFIG");
    for (k, v) in env {
        c.env(k, v);
    }
    c
}

/// Runs `weft ARGS`, showing the command and its output; fails on a non-zero exit.
fn show(bin: &Path, dir: &Path, env: &[(&str, &str)], args: &[&str]) -> Result<()> {
    println!("$ weft {}", args.join(" "));
    let status = cmd(bin, dir, env, args).status()?;
    if !status.success() {
        bail!("weft {} exited with {status}", args.join(" "));
    }
    Ok(())
}

/// Runs `weft ARGS` quietly and returns its stdout.
fn quiet(bin: &Path, dir: &Path, env: &[(&str, &str)], args: &[&str]) -> Result<String> {
    let o = cmd(bin, dir, env, args).stderr(Stdio::null()).output()?;
    if !o.status.success() {
        bail!("weft {} exited with {}", args.join(" "), o.status);
    }
    Ok(String::from_utf8_lossy(&o.stdout).into_owned())
}

fn wait_until(what: &str, limit: Duration, mut f: impl FnMut() -> bool) -> Result<()> {
    let start = Instant::now();
    while !f() {
        if start.elapsed() > limit {
            bail!("timed out after {limit:?} waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    Ok(())
}

/// The demo's lease, with the `weft` binary `bin`.
pub fn run(bin: &Path) -> Result<()> {
    let bin = &std::fs::canonicalize(bin).with_context(|| format!("{}", bin.display()))?;
    println!(
        "\n\x1b[1m== a tenant leases two nodes from the free pool; the controller takes them back\x1b[0m"
    );
    let dir: PathBuf = std::env::temp_dir().join(format!("weft-demo-lease-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let admin = format!(
        "wfa_demo-{:032x}",
        std::process::id() as u128 * 0x9e37_79b9_7f4a_7c15
    );
    let mut ctl = cmd(
        bin,
        &dir,
        &[("WEFT_ADMIN_TOKEN", &admin)],
        &[
            "controller",
            "--no-fabric",
            "--listen",
            "127.0.0.1:0",
            "--metrics-listen",
            "127.0.0.1:0",
            "--db",
            "ctl.db",
            "--init",
            "--lease-warn-s",
            "4",
        ],
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::null())
    .spawn()
    .context("starting weft controller")?;
    let stdout = ctl.stdout.take().context("the controller's stdout")?;
    let _ctl = Kid(ctl);
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line)?;
    let url = line
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .context("the controller did not say where it listens")?
        .to_string();
    let env = [
        ("WEFT_CONTROLLER", url.as_str()),
        ("WEFT_TOKEN", admin.as_str()),
    ];
    let mut agents = Vec::new();
    for (i, node) in ["node1", "node2"].iter().enumerate() {
        let root = dir.join(format!("host-{node}"));
        let hca = HcaSpec::new(
            "mlx5_0",
            Guid(0x0002_c903_00d0_0000 + 0x100 * i as u64),
            "0000:01:00.0",
        )
        .with_port(PortSpec::infiniband(1));
        write_host(&root, &HostSpec::new(*node).with_hca(hca))?;
        let token = quiet(bin, &dir, &env, &["nodes", "enroll", "--server", node])?;
        let hook = format!(
            "echo \"lease $WEFT_LEASE_ID ends at $WEFT_LEASE_END\" > {}",
            root.join("hook.out").display()
        );
        let notice = root.join("lease-ending");
        let child = cmd(
            bin,
            &dir,
            &[
                ("WEFT_CONTROLLER", &url),
                ("WEFT_ENROLL_TOKEN", token.trim()),
            ],
            &[
                "agent",
                "--state-file",
                &format!("{node}.json"),
                "--sysfs-root",
                &root.display().to_string(),
                "--heartbeat-s",
                "0.5",
                "--lease-notice-file",
                &notice.display().to_string(),
                "--lease-hook",
                &hook,
            ],
        )
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
        agents.push(Kid(child));
    }
    wait_until("two agents reporting", Duration::from_secs(20), || {
        quiet(bin, &dir, &env, &["--json", "nodes"])
            .is_ok_and(|t| t.matches("\"liveness\": \"ok\"").count() >= 2)
    })?;
    quiet(bin, &dir, &env, &["tenant", "create", "provider"])?;
    show(
        bin,
        &dir,
        &env,
        &["group", "create", "pool", "--tenant", "provider"],
    )?;
    show(bin, &dir, &env, &["group", "add", "pool", "node1"])?;
    show(bin, &dir, &env, &["group", "add", "pool", "node2"])?;
    let alice = quiet(bin, &dir, &env, &["tenant", "create", "alice"])?
        .trim()
        .to_string();
    show(
        bin,
        &dir,
        &env,
        &[
            "lease",
            "quota",
            "set",
            "alice",
            "--nodes",
            "2",
            "--node-hours",
            "10",
            "--period",
            "7d",
        ],
    )?;
    let as_alice = [
        ("WEFT_CONTROLLER", url.as_str()),
        ("WEFT_TOKEN", alice.as_str()),
    ];
    show(
        bin,
        &dir,
        &as_alice,
        &[
            "lease",
            "request",
            "--nodes",
            "2",
            "--for",
            "10s",
            "--same-switch",
        ],
    )
    .ok();
    show(
        bin,
        &dir,
        &as_alice,
        &["lease", "request", "--nodes", "2", "--for", "10s"],
    )?;
    show(bin, &dir, &as_alice, &["lease", "list"])?;
    let hook = dir.join("host-node1/hook.out");
    wait_until("the warning on node1", Duration::from_secs(30), || {
        hook.exists()
    })?;
    println!(
        "node1's agent ran its hook: {}",
        std::fs::read_to_string(&hook)?.trim()
    );
    wait_until("the lease's end", Duration::from_secs(30), || {
        quiet(bin, &dir, &as_alice, &["--json", "lease", "show", "2"])
            .is_ok_and(|t| t.contains("\"ended\""))
    })?;
    show(bin, &dir, &as_alice, &["lease", "show", "2"])?;
    show(bin, &dir, &env, &["group", "list"])?;
    drop(agents);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
