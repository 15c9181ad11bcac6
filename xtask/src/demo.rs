//! `cargo xtask demo`: weft's main job on embedded defaults.
//!
//! No InfiniBand hardware is configured here, so the demo builds one: a two-level fat
//! tree of 32 HCAs (every fourth with two ports) in ibsim, a primary and a standby
//! OpenSM, each with its own partitions file as if on its own host. Then it drives the
//! real `weft` binary as an operator would: check a plan against the live fabric, show
//! the diff, apply, verify, move a node between tenants, and kill the master SM to show
//! the standby takes over with every P_Key intact.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use weft_testbed::{SimFabric, SmSpec, Topology};

/// The demo's tenants and the nodes each one owns at the start.
const TENANTS: &[(&str, std::ops::RangeInclusive<usize>)] =
    &[("alice", 1..=12), ("bob", 13..=24), ("carol", 25..=32)];

/// The tenant that owns `node<n>`; after the move, node5 belongs to bob.
fn owner(n: usize, moved: bool) -> &'static str {
    if moved && n == 5 {
        return "bob";
    }
    TENANTS
        .iter()
        .find(|(_, nodes)| nodes.contains(&n))
        .map_or("nobody", |(t, _)| *t)
}

fn plan(moved: bool) -> String {
    let mut text = String::from(
        "# The demo's plan: three tenants, isolated from each other and from the Default partition.\n\
         [default]\npolicy = \"isolate\"\nipoib = true\n",
    );
    for (tenant, _) in TENANTS {
        let members: Vec<String> = (1..=32)
            .filter(|&n| owner(n, moved) == *tenant)
            .map(|n| format!("{{ node = \"node{n}\" }}"))
            .collect();
        text.push_str(&format!(
            "\n[[partition]]\nname = \"{tenant}\"\ntenant = \"{tenant}\"\nipoib = true\nmembers = [{}]\n",
            members.join(", ")
        ));
    }
    text
}

fn weft_binary() -> Result<PathBuf> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(cargo)
        .args(["build", "--quiet", "--package", "weft"])
        .status()
        .context("cannot run cargo build")?;
    if !status.success() {
        bail!("cargo build --package weft failed");
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"));
    Ok(target.join("debug/weft"))
}

fn step(title: &str) {
    println!("\n\x1b[1m== {title}\x1b[0m");
}

/// Runs `weft ARGS` in `dir`, showing the command and its output; returns its exit code.
fn weft(bin: &Path, dir: &Path, args: &[&str]) -> Result<i32> {
    println!("$ weft {}", args.join(" "));
    let status = Command::new(bin)
        .args(args)
        .current_dir(dir)
        .env("WEFT_CONFIG", dir.join("weft.toml"))
        .status()
        .with_context(|| format!("cannot run {}", bin.display()))?;
    Ok(status.code().unwrap_or(-1))
}

fn expect_ok(code: i32, what: &str) -> Result<()> {
    if code != 0 {
        bail!("{what} exited with {code}");
    }
    Ok(())
}

pub fn run() -> Result<()> {
    let bin = weft_binary()?;
    step("a simulated fabric: two-level fat tree, 32 HCAs, every 4th with two ports");
    let topology = Topology::fat_tree(4, 2, 32, 4);
    let mut fabric = SimFabric::start(&topology).context("starting ibsim")?;
    let dir = fabric.dir().to_path_buf();
    println!(
        "ibsim is up in {} with {} HCAs",
        dir.display(),
        topology.hcas().len()
    );

    // Before weft: the file a fresh install has, with every port in one partition.
    let mut sms = Vec::new();
    for (name, host, priority) in [("primary", "smhost", 10), ("standby", "smhost2", 5)] {
        let sm_dir = dir.join(format!("{name}-etc"));
        std::fs::create_dir_all(&sm_dir)?;
        let file = sm_dir.join("partitions.conf");
        std::fs::write(&file, "Default=0x7fff, ipoib : ALL=full ;\n")?;
        let handle = fabric.start_sm(SmSpec {
            name: name.into(),
            sim_host: host.into(),
            priority,
            partitions_file: file.clone(),
            extra_config: Vec::new(),
        })?;
        println!("OpenSM `{name}` on {host}: pid {}", handle.pid);
        sms.push((name, handle, file));
    }

    let mut config = String::from(
        "[fabric]\nsweep_timeout_ms = 5000\nverify_timeout_ms = 5000\n\n[fabric.diag]\nparallel = 6\n",
    );
    config.push_str(&format!("cwd = \"{}\"\n", dir.display()));
    config.push_str("[fabric.diag.env]\n");
    for (k, v) in fabric.client_env("node1") {
        config.push_str(&format!("{k} = \"{v}\"\n"));
    }
    for (name, h, file) in &sms {
        config.push_str(&format!(
            "\n[[fabric.sm]]\nname = \"{name}\"\nport_guid = \"{:#018x}\"\npartitions_file = \"{}\"\npid_file = \"{}\"\nlog_file = \"{}\"\n",
            h.port_guid,
            file.display(),
            h.pid_file.display(),
            h.log_file.display()
        ));
    }
    std::fs::write(dir.join("weft.toml"), config)?;
    std::fs::write(dir.join("plan.toml"), plan(false))?;

    step("check the plan against the live fabric");
    expect_ok(
        weft(&bin, &dir, &["fabric", "check", "plan.toml", "--live"])?,
        "check",
    )?;
    step("what applying it would change");
    expect_ok(weft(&bin, &dir, &["fabric", "diff", "plan.toml"])?, "diff")?;
    step("apply to primary and standby, reread, verify every port");
    expect_ok(
        // The fabric starts open (Default ALL=full) and the plan isolates it, which the
        // removal guard refuses unless told.
        weft(
            &bin,
            &dir,
            &["fabric", "apply", "plan.toml", "--allow-removal"],
        )?,
        "apply",
    )?;
    expect_ok(weft(&bin, &dir, &["fabric", "status"])?, "status")?;

    step("move node5 from alice to bob");
    std::fs::write(dir.join("plan.toml"), plan(true))?;
    expect_ok(weft(&bin, &dir, &["fabric", "diff", "plan.toml"])?, "diff")?;
    expect_ok(
        // The fabric starts open (Default ALL=full) and the plan isolates it, which the
        // removal guard refuses unless told.
        weft(
            &bin,
            &dir,
            &["fabric", "apply", "plan.toml", "--allow-removal"],
        )?,
        "apply",
    )?;

    plan_step(&bin, &dir)?;

    step("a typo never reaches OpenSM");
    std::fs::write(
        dir.join("typo.toml"),
        plan(true).replace("node = \"node7\"", "node = \"nod7\""),
    )?;
    let code = weft(&bin, &dir, &["fabric", "apply", "typo.toml"])?;
    if code != 1 {
        bail!("a plan naming an unknown node should exit 1, got {code}");
    }

    step("kill -9 the master SM; the standby takes over with the same P_Keys");
    let t0 = Instant::now();
    fabric.kill_sm("primary", nix_kill())?;
    let deadline = t0 + Duration::from_secs(30);
    let standby_guid = sms[1].1.port_guid;
    loop {
        let out = fabric.diag("node1", "sminfo", &[]).unwrap_or_default();
        if out.contains(&format!("sm guid {standby_guid:#x}")) && out.contains("MASTER") {
            break;
        }
        if Instant::now() > deadline {
            bail!("the standby did not become master within 30 s");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    println!(
        "standby is master after {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    expect_ok(
        weft(&bin, &dir, &["fabric", "verify", "plan.toml"])?,
        "verify",
    )?;
    println!(
        "\ndemo done: the fabric in {} is torn down now",
        dir.display()
    );
    Ok(())
}

/// `weft plan` on carol's nodes: a real model's config and safetensors headers (no
/// weights), every layout of her GPUs ranked, refused ones with the rule they break.
fn plan_step(bin: &Path, dir: &Path) -> Result<()> {
    let nodes = TENANTS
        .iter()
        .find(|(t, _)| *t == "carol")
        .map_or(8, |(_, r)| r.clone().count());
    step(&format!(
        "will Qwen2.5-7B-Instruct fit on carol's {nodes} nodes of one 24 GiB GPU? (headers only)"
    ));
    let model = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../crates/weft-plan/fixtures/qwen2.5-7b-instruct");
    let model = model.to_str().context("a UTF-8 path")?;
    let nodes = nodes.to_string();
    let args = [
        "plan",
        model,
        "--nodes",
        &nodes,
        "--gpu-memory",
        "24GiB",
        "--max-model-len",
        "32768",
    ];
    expect_ok(weft(bin, dir, &args)?, "plan")
}

fn nix_kill() -> weft_testbed::Signal {
    weft_testbed::Signal::SIGKILL
}
