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

/// `keep`: after the fabric part, leave the simulated fabric and its two OpenSMs running and
/// print how to point `weft` at it, until Ctrl-C (or SIGTERM) tears it down.
pub fn run(keep: bool) -> Result<()> {
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
    llm_step(&bin, &dir)?;
    let _console = crate::console_tour::tour(&bin, &dir)?;

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
    if keep {
        let bin = std::fs::canonicalize(&bin).unwrap_or(bin);
        let bin_dir = bin.parent().map_or_else(|| bin.clone(), Path::to_path_buf);
        println!(
            "\n\x1b[1m== the simulated fabric stays up (--keep)\x1b[0m\n\
             point weft at it from another terminal:\n\
             \n  export WEFT_CONFIG={cfg}\n  export PATH={bin}:$PATH\n  cd {dir}\n\
             \n  weft fabric status\n  weft fabric verify plan.toml\n  \
             $EDITOR plan.toml && weft fabric diff plan.toml && weft fabric apply plan.toml\n\
             \nits OpenSM logs are in {dir}; stop it all with Ctrl-C here (or kill -TERM {pid})",
            cfg = dir.join("weft.toml").display(),
            bin = bin_dir.display(),
            dir = dir.display(),
            pid = std::process::id(),
        );
        wait_for_stop_signal();
        println!(
            "\nstopping: the fabric in {} is torn down now",
            dir.display()
        );
        drop(fabric);
        return Ok(());
    }
    println!("\nthe fabric in {} is torn down now", dir.display());
    drop(fabric);
    launch_tour()?;
    println!("\ndemo done");
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

/// `weft bench llm` against a real llama.cpp server (llama-cpp-python) serving a tiny
/// random-weights GGUF written on the spot: a short run at two depths, about 20 s.
fn llm_step(bin: &Path, dir: &Path) -> Result<()> {
    step("weft bench llm against a local llama.cpp server (tiny random-weights model)");
    crate::ensure_pip_packages()?;
    let llm = dir.join("llm");
    std::fs::create_dir_all(&llm)?;
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../crates/weft-llmbench/tests/make_tiny_gguf.py");
    let out = Command::new("python3")
        .arg(&script)
        .arg(&llm)
        .args(["--ctx", "4096"])
        .output()
        .context("cannot run python3")?;
    if !out.status.success() {
        bail!(
            "make_tiny_gguf.py failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let log = std::fs::File::create(llm.join("server.log"))?;
    let mut server = Command::new("python3")
        .args(["-m", "llama_cpp.server", "--model"])
        .arg(llm.join("tiny.gguf"))
        .args([
            "--model_alias",
            "weft-tiny",
            "--host",
            "127.0.0.1",
            "--port",
        ])
        .arg(port.to_string())
        .args([
            "--n_ctx",
            "4096",
            "--n_threads",
            "1",
            "--interrupt_requests",
            "False",
        ])
        .args(["--verbose", "false"])
        .stdout(std::process::Stdio::null())
        .stderr(log)
        .spawn()
        .context("cannot start python3 -m llama_cpp.server")?;
    let result = (|| {
        let t0 = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if t0.elapsed() > Duration::from_secs(60) {
                bail!(
                    "llama_cpp.server did not listen within 60 s (see {})",
                    llm.display()
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        let url = format!("http://127.0.0.1:{port}/v1");
        let tok = llm.join("tokenizer");
        let tok = tok.to_str().context("a UTF-8 path")?;
        let args = [
            "bench",
            "llm",
            "--base-url",
            &url,
            "--model",
            "weft-tiny",
            "--tokenizer",
            tok,
            "--pp",
            "256",
            "--tg",
            "16",
            "--depth",
            "0,1024",
            "--runs",
            "2",
            "--nodes",
            "1",
        ];
        expect_ok(weft(bin, dir, &args)?, "bench llm")
    })();
    let _ = server.kill();
    let _ = server.wait();
    result
}

/// `weft mesh`, `weft sync` and `weft run` across 4 namespace hosts, each with a real sshd
/// on its management address: the SSH mesh from nothing, a directory replicated as a chain
/// over the data links (then a re-run that sends nothing), and one command on every host
/// with its rank and interfaces. Needs root (namespaces).
pub fn launch_tour() -> Result<()> {
    use weft_testbed::{Sshd, SshdOptions};
    let bin = weft_binary()?;
    step("four hosts in network namespaces, an sshd on each; you reach them, they not each other");
    weft_netns::available().map_err(|e| anyhow::anyhow!("network namespaces: {e}"))?;
    let c = weft_netns::Cluster::create(&weft_netns::ClusterSpec::new(4, 1))?;
    let names: Vec<String> = c.hosts().iter().map(|h| h.name.clone()).collect();
    let mut sshds: Vec<Sshd> = Vec::new();
    for h in c.hosts() {
        let o = SshdOptions {
            netns: Some(h.name.clone()),
            listen: Some(h.mgmt_addr.into()),
            port: None,
            authorized_keys: sshds
                .first()
                .map(|s| vec![s.user_public_key().to_string()])
                .unwrap_or_default(),
            set_env: vec![("WEFT_SSH_FROM".into(), h.name.clone())],
        };
        sshds.push(Sshd::start_with(&o)?);
    }
    let tmp = tempfile_dir()?;
    let d = tmp.as_path();
    std::fs::copy(sshds[0].identity_file(), d.join("id.operator"))?;
    let mut cfg = String::new();
    for h in c.hosts() {
        cfg.push_str(&format!("Host {}\n    HostName {}\n", h.name, h.mgmt_addr));
    }
    cfg.push_str(&format!(
        "Host *\n    User {}\n    IdentityFile {d}/id.${{WEFT_SSH_FROM}}\n    IdentitiesOnly yes\n    UserKnownHostsFile {d}/known_hosts.${{WEFT_SSH_FROM}}\n    GlobalKnownHostsFile /dev/null\n    StrictHostKeyChecking yes\n    BatchMode yes\n    LogLevel ERROR\n",
        sshds[0].user(),
        d = d.display()
    ));
    std::fs::write(d.join("ssh_config"), cfg)?;
    let known: String = sshds.iter().map(Sshd::known_hosts_line).collect();
    std::fs::write(d.join("known_hosts.operator"), known)?;
    let mut expect = String::new();
    for (s, n) in sshds.iter().zip(&names) {
        let f = d.join(format!("hk.{n}.pub"));
        std::fs::write(&f, format!("{}\n", s.host_public_key()))?;
        let o = Command::new("ssh-keygen").arg("-lf").arg(&f).output()?;
        let out = String::from_utf8_lossy(&o.stdout).to_string();
        let fp = out.split_whitespace().nth(1).unwrap_or("");
        expect.push_str(&format!("{n} {fp}\n"));
        std::os::unix::fs::symlink(s.dir().join("authorized_keys"), d.join(format!("auth.{n}")))?;
    }
    std::fs::write(d.join("expect"), expect)?;
    let ds = d.display().to_string();
    let hosts = names.join(",");
    let cfg_s = format!("{ds}/ssh_config");
    let exe = bin.display().to_string();
    let as_operator = |args: &[&str]| -> Result<i32> {
        println!("$ weft {}", args.join(" "));
        let st = Command::new("ip")
            .args(["netns", "exec", &names[0], &exe])
            .args(args)
            .env("WEFT_SSH_FROM", "operator")
            .env_remove("WEFT_CONFIG")
            .status()?;
        Ok(st.code().unwrap_or(-1))
    };
    let ssh_hosts = [
        "--hosts",
        &hosts,
        "--via",
        "ssh",
        "--ssh-config",
        &cfg_s,
        "--remote-weft",
        &exe,
        "--mgmt-if",
        "=mgmt0",
        "--data-if",
        "=data0",
    ];
    let id = format!("{ds}/id.{{host}}");
    let kh = format!("{ds}/known_hosts.{{host}}");
    let ak = format!("{ds}/auth.{{host}}");
    let expect_s = format!("{ds}/expect");
    step("weft mesh: host keys confirmed by fingerprint, a key per host, all 12 pairs proven");
    let mut a = vec!["mesh"];
    a.extend(ssh_hosts);
    a.extend([
        "--identity",
        &id,
        "--known-hosts",
        &kh,
        "--authorized-keys",
        &ak,
    ]);
    a.extend(["--yes", "--expect-fingerprints", &expect_s]);
    expect_ok(as_operator(&a)?, "weft mesh")?;

    step("weft sync: a 64 MiB directory from host 0 to hosts 1-3 as a chain over the data links");
    let src = d.join("model");
    std::fs::create_dir_all(&src)?;
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut big = vec![0u8; 64 << 20];
    for w in big.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        w.copy_from_slice(&x.to_le_bytes()[..w.len()]);
    }
    std::fs::write(src.join("model.safetensors"), &big)?;
    std::fs::write(src.join("config.json"), "{\"hidden_size\": 4096}\n")?;
    let src_s = src.display().to_string();
    let dest = format!("{ds}/dest/{{host}}");
    let targets = names[1..].join(",");
    let sync = [
        "sync",
        &src_s,
        "--hosts",
        &targets,
        "--via",
        "netns",
        "--dest",
        &dest,
        "--data-if",
        "=data0",
        "--mgmt-if",
        "=mgmt0",
    ];
    expect_ok(as_operator(&sync)?, "weft sync")?;
    step("weft sync again: every hash compared, nothing sent");
    expect_ok(as_operator(&sync)?, "weft sync")?;

    step("weft run: one command on every host with its rank and interfaces");
    let mut a = vec!["run"];
    a.extend(ssh_hosts);
    a.extend(["--no-version-check", "--nccl", "weft", "--"]);
    a.extend([
        "sh",
        "-c",
        "echo \"rank $RANK of $WORLD_SIZE, master $MASTER_ADDR:$MASTER_PORT, gloo on $GLOO_SOCKET_IFNAME ($VLLM_HOST_IP), NCCL_NET_PLUGIN=$NCCL_NET_PLUGIN WEFT_DATA_IFNAME=$WEFT_DATA_IFNAME\"",
    ]);
    expect_ok(as_operator(&a)?, "weft run")?;
    drop(sshds);
    drop(c);
    let _ = std::fs::remove_dir_all(&tmp);
    Ok(())
}

/// A fresh scratch directory under the system temp dir.
/// Blocks until SIGINT or SIGTERM arrives, so that the caller's destructors (the simulated
/// fabric's) run instead of the default action killing the process mid-way.
fn wait_for_stop_signal() {
    // SAFETY: the sigset is initialised by sigemptyset before use; blocking SIGINT and
    // SIGTERM in this thread and then waiting for them with sigwait is the documented way to
    // take them synchronously; no handler is installed, so nothing runs in signal context.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        let mut sig: libc::c_int = 0;
        libc::sigwait(&set, &mut sig);
    }
}

fn tempfile_dir() -> Result<PathBuf> {
    let p = std::env::temp_dir().join(format!("weft-demo-launch-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&p);
    std::fs::create_dir_all(&p)?;
    Ok(p)
}

fn nix_kill() -> weft_testbed::Signal {
    weft_testbed::Signal::SIGKILL
}
