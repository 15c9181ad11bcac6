//! `cargo xtask demo`: every capability of weft, briefly, on embedded defaults.
//!
//! No InfiniBand hardware is configured here, so the demo builds one: a two-level fat
//! tree of 32 HCAs (every fourth with two ports) in ibsim, a primary and a standby
//! OpenSM, each with its own partitions file as if on its own host. Then it drives the
//! real `weft` binary as an operator would, one step after another:
//!
//! 1. the fabric as code: check a plan against the live fabric, show the diff, apply,
//!    verify, move a node between tenants, a typo refused;
//! 2. `weft plan` on a real model's headers; `weft bench llm` against llama.cpp's own server
//!    (a prebuilt wheel from PyPI in a virtual environment: nothing to compile);
//! 3. the controller: it adopts the file `weft fabric apply` wrote, three agents report
//!    their fixture hosts' ports, a tenant's group, a move through the API, the audit log;
//!    then the hook points where the console and the lease steps go ([`console_step`],
//!    [`leases_step`]);
//! 4. kill -9 of the master SM: the standby takes over with every P_Key intact;
//! 5. on network-namespace hosts: `weft doctor` naming a planted fault, `weft bench p2p`,
//!    `weft bench collectives` through the NCCL plugin, then `weft mesh`, `sync`, `run`.
//!
//! It installs only the Debian packages it shows ([`DEMO_PACKAGES`]) and the three PyPI
//! wheels of the llm step ([`LLM_PIP_PACKAGES`], in a virtual environment), and builds only
//! what it runs: `weft`, and the plugin for the collectives.

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

/// The Debian packages the demo shows (the tests need more: `cargo xtask test`).
pub const DEMO_PACKAGES: &[(&str, &str)] = &[
    ("opensm", "/usr/sbin/opensm"),
    ("ibsim-utils", "/usr/bin/ibsim"),
    ("infiniband-diags", "/usr/sbin/smpquery"),
    (
        "libumad2sim0",
        "/usr/lib/x86_64-linux-gnu/umad2sim/libumad2sim.so",
    ),
    ("iproute2", "/usr/sbin/ip"),
    ("openssh-server", "/usr/sbin/sshd"),
    ("openssh-client", "/usr/bin/ssh"),
    // `python3 -m venv` for the llm step's wheels (Debian's python3 has no venv without it)
    ("python3-venv", "/usr/share/doc/python3-venv"),
];

/// Builds `packages` (debug) and returns the target directory's `debug/`.
fn build(packages: &[&str]) -> Result<PathBuf> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.args(["build", "--quiet"]);
    for p in packages {
        cmd.args(["--package", p]);
    }
    let status = cmd.status().context("cannot run cargo build")?;
    if !status.success() {
        bail!("cargo build {packages:?} failed");
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"));
    Ok(target.join("debug"))
}

fn weft_binary() -> Result<PathBuf> {
    Ok(build(&["weft"])?.join("weft"))
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
    // With --keep the controller tour below does not run (the fabric stays a person's to
    // work on): a controller of its own, on the agents' fixtures, serves the console then.
    let _console = if keep {
        Some(crate::console_tour::tour(&bin, &dir)?)
    } else {
        None
    };

    step("a typo never reaches OpenSM");
    std::fs::write(
        dir.join("typo.toml"),
        plan(true).replace("node = \"node7\"", "node = \"nod7\""),
    )?;
    let code = weft(&bin, &dir, &["fabric", "apply", "typo.toml"])?;
    if code != 1 {
        bail!("a plan naming an unknown node should exit 1, got {code}");
    }
    // The controller takes the fabric over from here (not with --keep, which leaves the
    // file `weft fabric apply` wrote for a person to work on).
    let controller = if keep {
        None
    } else {
        let tour = controller_tour(&bin, &dir, &topology)?;
        console_step(&tour)?;
        leases_step(&tour)?;
        Some(tour)
    };

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
    // Against the plan, or (once the controller owns the file) against what it applied.
    let verify: &[&str] = if controller.is_some() {
        &["fabric", "verify"]
    } else {
        &["fabric", "verify", "plan.toml"]
    };
    expect_ok(weft(&bin, &dir, verify)?, "verify")?;
    // The controller stays up for the checks below: `weft bench p2p --report-to` stores
    // its pairs there (its fabric is gone by then; it only records).
    let report_to = controller
        .as_ref()
        .map(|t| (t.url.clone(), t.admin_token.clone()));
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
    checks_tour(report_to.as_ref())?;
    drop(controller);
    launch_tour()?;
    println!("\ndemo done");
    Ok(())
}

/// `weft plan` on carol's nodes: a real model's config and safetensors headers (no
/// weights), every layout of her GPUs ranked by predicted single-stream speed, refused ones
/// with the rule they break.
fn plan_step(bin: &Path, dir: &Path) -> Result<()> {
    let nodes = TENANTS
        .iter()
        .find(|(t, _)| *t == "carol")
        .map_or(8, |(_, r)| r.clone().count());
    step(&format!(
        "will Qwen2.5-7B-Instruct fit on carol's {nodes} nodes of one 24 GiB GPU, and how fast will one stream go? (headers only)"
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
        "--device",
        "rtx-4090",
    ];
    expect_ok(weft(bin, dir, &args)?, "plan")
}

/// The PyPI packages of the `bench llm` step, pinned: llama.cpp's own server as a prebuilt
/// wheel (xllamacpp: no compiler, about 34 MB), and what `make_tiny_gguf.py` writes a tiny
/// model and its tokenizer with.
const LLM_PIP_PACKAGES: &[&str] = &[
    "xllamacpp==2026.10.11549",
    "gguf==0.19.0",
    "tokenizers==0.23.3",
];

/// A Python virtual environment under the target directory with [`LLM_PIP_PACKAGES`]
/// (made once, then reused: a file in it names what was installed); returns its python.
pub(crate) fn llm_python() -> Result<PathBuf> {
    let venv = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"))
        .join("demo-llm-venv");
    let python = venv.join("bin/python");
    let stamp = venv.join("weft-demo-packages");
    let want = LLM_PIP_PACKAGES.join(" ");
    if std::fs::read_to_string(&stamp).is_ok_and(|have| have == want) {
        return Ok(python);
    }
    println!("$ python3 -m venv {} && pip install {want}", venv.display());
    let status = Command::new("python3")
        .args(["-m", "venv", "--clear"])
        .arg(&venv)
        .status()
        .context("cannot run python3 -m venv")?;
    if !status.success() {
        bail!("python3 -m venv {} failed ({status})", venv.display());
    }
    let status = Command::new(&python)
        .args(["-m", "pip", "install", "--quiet", "--only-binary=:all:"])
        .args(LLM_PIP_PACKAGES)
        .status()
        .context("cannot run pip")?;
    if !status.success() {
        bail!("pip install {want} failed ({status})");
    }
    std::fs::write(&stamp, want)?;
    Ok(python)
}

/// `weft bench llm` against llama.cpp's own server (the prebuilt xllamacpp wheel, see
/// `xtask/demo/llama_server.py`) serving a tiny random-weights GGUF written on the spot: a
/// short run at two depths.
fn llm_step(bin: &Path, dir: &Path) -> Result<()> {
    step("weft bench llm against a local llama.cpp server (tiny random-weights model)");
    let python = llm_python()?;
    let llm = dir.join("llm");
    std::fs::create_dir_all(&llm)?;
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../crates/weft-llmbench/tests/make_tiny_gguf.py");
    let out = Command::new(&python)
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
    let server_script = Path::new(env!("CARGO_MANIFEST_DIR")).join("demo/llama_server.py");
    let mut server = Command::new(&python)
        .arg(&server_script)
        .arg(llm.join("tiny.gguf"))
        .args(["--alias", "weft-tiny", "--ctx", "4096", "--port"])
        .arg(port.to_string())
        .stdout(std::process::Stdio::null())
        .stderr(log)
        .spawn()
        .context("cannot start llama.cpp's server (xtask/demo/llama_server.py)")?;
    let result = (|| {
        let t0 = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if t0.elapsed() > Duration::from_secs(60) {
                bail!(
                    "llama.cpp's server did not listen within 60 s (see {}/server.log)",
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

/// What the controller's part of the demo left running, for the steps that follow it (the
/// console's and the leases'): the controller, its URL and an admin token, the agents.
pub struct ControllerTour {
    /// The `weft` binary.
    pub bin: PathBuf,
    /// The demo's directory (weft.toml, the store, the agents' files).
    pub dir: PathBuf,
    /// The API, `http://127.0.0.1:PORT`.
    pub url: String,
    /// An admin token of the controller.
    pub admin_token: String,
    children: Vec<std::process::Child>,
}

impl ControllerTour {
    /// `weft ARGS` against this controller (its URL and admin token in the environment).
    pub fn weft(&self, args: &[&str]) -> Result<i32> {
        println!("$ weft {}", args.join(" "));
        let status = Command::new(&self.bin)
            .args(args)
            .current_dir(&self.dir)
            .env("WEFT_CONFIG", self.dir.join("weft.toml"))
            .env("WEFT_CONTROLLER", &self.url)
            .env("WEFT_TOKEN", &self.admin_token)
            .status()
            .with_context(|| format!("cannot run {}", self.bin.display()))?;
        Ok(status.code().unwrap_or(-1))
    }

    /// The same, its stdout captured (and shown).
    fn output(&self, args: &[&str]) -> Result<String> {
        println!("$ weft {}", args.join(" "));
        let o = Command::new(&self.bin)
            .args(args)
            .current_dir(&self.dir)
            .env("WEFT_CONFIG", self.dir.join("weft.toml"))
            .env("WEFT_CONTROLLER", &self.url)
            .env("WEFT_TOKEN", &self.admin_token)
            .output()
            .with_context(|| format!("cannot run {}", self.bin.display()))?;
        let out = String::from_utf8_lossy(&o.stdout).into_owned();
        print!("{out}");
        eprint!("{}", String::from_utf8_lossy(&o.stderr));
        if !o.status.success() {
            bail!("weft {} exited with {}", args.join(" "), o.status);
        }
        Ok(out)
    }
}

impl Drop for ControllerTour {
    fn drop(&mut self) {
        // The agents first, then the controller (the last child).
        for c in self.children.iter_mut().rev() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The controller on the demo's two SMs: it adopts the partitions `weft fabric apply` wrote,
/// three agents (node1-3, fixture sysfs trees with the fabric's port GUIDs) enroll and
/// report, a tenant's group takes node1 and node2, node2 moves to another group through
/// the API (verified on the ports), and the audit log says who did what.
fn controller_tour(bin: &Path, dir: &Path, topology: &Topology) -> Result<ControllerTour> {
    use weft_agent::fixtures::{HcaSpec, HostSpec, PortSpec, write_host};
    step("the controller takes the fabric over: agents report, a tenant's group, a move");
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let url = format!("http://127.0.0.1:{port}");
    // 32 random bytes from the kernel, hex: the admin token.
    let mut raw = [0u8; 16];
    std::io::Read::read_exact(&mut std::fs::File::open("/dev/urandom")?, &mut raw)?;
    let admin_token: String = raw.iter().map(|b| format!("{b:02x}")).collect();
    println!(
        "$ WEFT_ADMIN_TOKEN=... weft controller --listen 127.0.0.1:{port} --db controller.db --init --adopt --recheck-s 2 &"
    );
    let ctl = Command::new(bin)
        .args(["controller", "--listen"])
        .arg(format!("127.0.0.1:{port}"))
        .args([
            "--metrics-listen",
            "127.0.0.1:0",
            "--db",
            "controller.db",
            "--init",
            "--adopt",
            "--recheck-s",
            "2",
        ])
        .current_dir(dir)
        .env("WEFT_CONFIG", dir.join("weft.toml"))
        .env("WEFT_ADMIN_TOKEN", &admin_token)
        .env("WEFT_LOG", "warn")
        .stdout(std::fs::File::create(dir.join("controller.out"))?)
        .spawn()
        .context("cannot start weft controller")?;
    let mut tour = ControllerTour {
        bin: bin.to_path_buf(),
        dir: dir.to_path_buf(),
        url,
        admin_token,
        children: vec![ctl],
    };
    let t0 = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if t0.elapsed() > Duration::from_secs(20) {
            bail!(
                "weft controller did not listen within 20 s (see {})",
                dir.display()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let nodes: Vec<_> = topology
        .end_nodes()
        .filter(|h| ["node1", "node2", "node3"].contains(&h.name.as_str()))
        .collect();
    for h in &nodes {
        let root = dir.join(format!("host-{}", h.name));
        let mut hca = HcaSpec::new("mlx5_0", weft_fabric::Guid(h.node_guid), "0000:01:00.0");
        for (p, _) in &h.port_guids {
            hca = hca.with_port(PortSpec::infiniband(u32::from(*p)));
        }
        write_host(&root, &HostSpec::new(h.name.clone()).with_hca(hca))
            .map_err(|e| anyhow::anyhow!("the fixture host {}: {e}", h.name))?;
        let token = tour.output(&["nodes", "enroll", "--server", &h.name])?;
        println!(
            "$ weft agent --enroll-token ... --state-file {0}.json --sysfs-root host-{0} &",
            h.name
        );
        let agent = Command::new(bin)
            .args(["agent", "--state-file"])
            .arg(format!("{}.json", h.name))
            .arg("--sysfs-root")
            .arg(&root)
            .args(["--heartbeat-s", "1"])
            .current_dir(dir)
            .env("WEFT_CONFIG", dir.join("weft.toml"))
            .env("WEFT_CONTROLLER", &tour.url)
            .env("WEFT_ENROLL_TOKEN", token.trim())
            .env("WEFT_LOG", "warn")
            .stdout(std::process::Stdio::null())
            .spawn()
            .context("cannot start weft agent")?;
        tour.children.insert(0, agent);
    }
    let t0 = Instant::now();
    loop {
        let o = Command::new(bin)
            .args(["nodes"])
            .current_dir(dir)
            .env("WEFT_CONFIG", dir.join("weft.toml"))
            .env("WEFT_CONTROLLER", &tour.url)
            .env("WEFT_TOKEN", &tour.admin_token)
            .output()?;
        let text = String::from_utf8_lossy(&o.stdout);
        if text.lines().filter(|l| l.contains(" ok ")).count() >= nodes.len() {
            break;
        }
        if t0.elapsed() > Duration::from_secs(30) {
            bail!("the agents did not report within 30 s: {text}");
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    expect_ok(tour.weft(&["nodes"])?, "nodes")?;
    tour.output(&["tenant", "create", "dave"])?;
    // The controller's Default policy isolates; what its first delivery takes from the
    // ports (the file `weft fabric apply` wrote isolated them already) is in its output.
    expect_ok(
        tour.weft(&["group", "create", "train", "--tenant", "dave"])?,
        "group create",
    )?;
    expect_ok(
        tour.weft(&["group", "create", "serve", "--tenant", "dave"])?,
        "group create",
    )?;
    expect_ok(
        tour.weft(&["group", "add", "train", "node1", "node2"])?,
        "group add",
    )?;
    expect_ok(
        tour.weft(&["group", "move", "node2", "--to", "serve"])?,
        "group move",
    )?;
    expect_ok(tour.weft(&["group", "list"])?, "group list")?;
    expect_ok(tour.weft(&["audit", "--limit", "8"])?, "audit")?;
    Ok(tour)
}

/// The console of the tour's controller: its URL and an admin login, for a person to open
/// (the controller serves it on the API's own address, TLS and tokens).
fn console_step(tour: &ControllerTour) -> Result<()> {
    step("the web console");
    println!(
        "  open {}/console and log in with the admin token {}",
        tour.url, tour.admin_token
    );
    println!("  (overview, partitions matrix, moves with their diff, history, /docs, links)");
    Ok(())
}

/// A lease from request to release (`demo_lease.rs`: a controller of its own, without a
/// fabric, so that the lease's timing does not depend on the tour's subnet managers).
fn leases_step(tour: &ControllerTour) -> Result<()> {
    crate::demo_lease::run(&tour.bin)
}

/// `weft doctor` naming a fault planted on one of three namespace hosts (its data link's
/// MTU lowered to 1500 where the others run 9000), then `weft bench p2p` and `weft bench
/// collectives` through the NCCL plugin once it is fixed. With `report_to` (the tour
/// controller's URL and admin token), the p2p pairs and the links the collectives timed
/// through the plugin are stored there (`--report-to`) and its console's Links page shows
/// them.
fn checks_tour(report_to: Option<&(String, String)>) -> Result<()> {
    let debug = build(&["weft", "weft-nccl-net"])?;
    let bin = debug.join("weft");
    step("three hosts in network namespaces; weft doctor names the one fault planted on them");
    weft_netns::available().map_err(|e| anyhow::anyhow!("network namespaces: {e}"))?;
    let c = weft_netns::Cluster::create(&weft_netns::ClusterSpec::new(3, 1))?;
    let hosts = c
        .hosts()
        .iter()
        .map(|h| h.name.clone())
        .collect::<Vec<_>>()
        .join(",");
    let faulty = c.hosts()[2].name.clone();
    println!("$ ip -n {faulty} link set data0 mtu 1500   # the planted fault");
    c.set_mtu(2, "data0", 1500)?;
    let tmp = tempfile_dir()?;
    // No settings file: every setting is on the command line here.
    std::fs::write(tmp.join("weft.toml"), "")?;
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
    let mut doctor = vec!["doctor"];
    doctor.extend(on_hosts);
    doctor.extend(["--expect-mtu", "9000", "--no-throughput"]);
    println!("$ weft {}", doctor.join(" "));
    let o = Command::new(&bin)
        .args(&doctor)
        .current_dir(&tmp)
        .env_remove("WEFT_CONFIG")
        .output()?;
    let out = String::from_utf8_lossy(&o.stdout);
    print!("{out}");
    if o.status.code() != Some(1)
        || !out
            .lines()
            .any(|l| l.starts_with("FAIL") && l.contains(&faulty))
    {
        bail!(
            "weft doctor should fail naming {faulty} (exit {:?})",
            o.status.code()
        );
    }
    println!("$ ip -n {faulty} link set data0 mtu 9000   # fixed");
    c.set_mtu(2, "data0", 9000)?;
    step("weft bench p2p: every ordered pair of hosts over the data links");
    let mut p2p = vec!["bench", "p2p"];
    p2p.extend(on_hosts);
    p2p.extend(["--duration", "0.5", "--threshold", "0.05"]);
    match report_to {
        None => expect_ok(weft(&bin, &tmp, &p2p)?, "bench p2p")?,
        Some((url, token)) => {
            p2p.extend(["--report-to", url.as_str()]);
            println!("$ WEFT_TOKEN=... weft {}", p2p.join(" "));
            let status = Command::new(&bin)
                .args(&p2p)
                .current_dir(&tmp)
                .env("WEFT_CONFIG", tmp.join("weft.toml"))
                .env("WEFT_TOKEN", token)
                .status()
                .with_context(|| format!("cannot run {}", bin.display()))?;
            expect_ok(status.code().unwrap_or(-1), "bench p2p --report-to")?;
            println!("  the pairs as a heat map, flagged links and trends: {url}/console/links");
        }
    }
    step(
        "weft bench collectives: all_reduce and all_gather through the NCCL plugin, one rank a host",
    );
    let mut coll = vec!["bench", "collectives", "all_reduce", "all_gather"];
    coll.extend(on_hosts);
    // Rank 0's management address is where the ranks meet.
    let rendezvous = format!("{}:29517", c.hosts()[0].mgmt_addr);
    coll.extend([
        "--rendezvous",
        rendezvous.as_str(),
        "-b",
        "1K",
        "-e",
        "1M",
        "-f",
        "32",
    ]);
    match report_to {
        None => expect_ok(weft(&bin, &tmp, &coll)?, "bench collectives")?,
        Some((url, token)) => {
            coll.extend(["--report-to", url.as_str()]);
            println!("$ WEFT_TOKEN=... weft {}", coll.join(" "));
            let status = Command::new(&bin)
                .args(&coll)
                .current_dir(&tmp)
                .env("WEFT_CONFIG", tmp.join("weft.toml"))
                .env("WEFT_TOKEN", token)
                .status()
                .with_context(|| format!("cannot run {}", bin.display()))?;
            expect_ok(status.code().unwrap_or(-1), "bench collectives --report-to")?;
            println!("  stored beside the p2p run, labelled `collectives`: {url}/console/links");
        }
    }
    Ok(())
}
