//! `cargo xtask fresh-demo`: how long `cargo xtask demo` takes on a fresh machine, its build
//! measured apart.
//!
//! A clean Debian of this machine's release (`debootstrap --variant=minbase`, as `cargo
//! xtask deb-test` makes it: [`crate::deb::debootstrap`]) with only what the README asks of
//! a user: a C compiler for Rust's linker, curl and CA certificates to install rustup's
//! stable toolchain. The repository's committed tree at HEAD goes in with `git archive` (no
//! target directory, no cargo cache). Then, each step in a `systemd-nspawn` container on
//! two CPUs (`--cpu-affinity=0-1`), timed on its own:
//!
//! 1. rustup's stable toolchain (`rustup-init --profile minimal`), from the network;
//! 2. `cargo fetch`: the crates, from the network;
//! 3. the build `cargo xtask demo` needs, as the demo builds it (xtask, then `weft`, then
//!    `weft` with the NCCL plugin), offline and with no network at all (`--private-network`);
//! 4. `cargo xtask demo-deps`: what the demo installs on its first run (its Debian packages
//!    with apt, the llm step's wheels with pip), from the network;
//! 5. `cargo xtask demo` itself, built and installed, offline with no network: its veths,
//!    namespaces, sshds and ports are the container's own, never this machine's.
//!
//! Where this machine trusts local CA certificates (`/usr/local/share/ca-certificates`: a
//! site's proxy to the registries), the container trusts them too.
//!
//! The container and its root are removed at the end, also when a step fails or runs past
//! its bound; nothing is mounted outside the container's own mount namespace.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

/// Debian packages the README asks of a user on top of a minimal Debian: gcc and the C
/// library's headers (rustc links with `cc`), curl and CA certificates for rustup.
const USER_PACKAGES: &[&str] = &["ca-certificates", "curl", "gcc", "libc6-dev"];

/// rustup's installer for this architecture, as `sh.rustup.rs` fetches it.
const RUSTUP_INIT: &str =
    "https://static.rust-lang.org/rustup/dist/x86_64-unknown-linux-gnu/rustup-init";

/// Where the repository goes inside the container.
const REPO: &str = "/root/weft";

/// One timed step in the container.
struct Step {
    name: &'static str,
    script: String,
    network: bool,
    limit: Duration,
}

/// Removes the container's root when dropped (after the container has ended).
struct Root(PathBuf);

impl Drop for Root {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.0) {
            eprintln!("xtask: cannot remove {}: {e}", self.0.display());
        }
    }
}

pub fn run(repo: &Path) -> Result<()> {
    crate::ensure(&[
        ("debootstrap", "/usr/sbin/debootstrap"),
        ("systemd-container", "/usr/bin/systemd-nspawn"),
    ])?;
    let commit = git_head(repo)?;
    let machine = machine();
    let load_before = load_average();
    let root = Root(std::env::temp_dir().join(format!("weft-fresh-demo-{}", std::process::id())));
    let mut times: Vec<(&str, Duration)> = Vec::new();

    let t = Instant::now();
    crate::deb::debootstrap(&root.0, USER_PACKAGES)?;
    times.push(("a minimal Debian with gcc, curl (debootstrap)", t.elapsed()));
    copy_tree(repo, &root.0.join(REPO.trim_start_matches('/')))?;
    let local_cas = copy_local_cas(&root.0)?;

    let steps = [
        Step {
            name: "rustup's stable toolchain (network)",
            script: format!(
                "update-ca-certificates >/dev/null && curl --proto '=https' --tlsv1.2 -sSf {RUSTUP_INIT} -o /tmp/rustup-init && chmod +x /tmp/rustup-init && /tmp/rustup-init -y --quiet --profile minimal --default-toolchain stable && rustc --version"
            ),
            network: true,
            limit: Duration::from_secs(15 * 60),
        },
        Step {
            name: "cargo fetch: the crates (network)",
            script: "cargo fetch --locked".into(),
            network: true,
            limit: Duration::from_secs(15 * 60),
        },
        Step {
            name: "BUILD: what `cargo xtask demo` builds (offline, no network)",
            // As the demo builds: `cargo xtask` builds xtask, the demo `weft`, its checks
            // `weft` with the plugin (each a separate cargo invocation, so each has its own
            // feature resolution, as in the demo).
            script: "cargo build -p xtask && cargo build -p weft && cargo build -p weft -p weft-nccl-net".into(),
            network: false,
            limit: Duration::from_secs(90 * 60),
        },
        Step {
            name: "cargo xtask demo-deps: the demo's Debian packages and wheels (network)",
            script: "cargo xtask demo-deps".into(),
            network: true,
            limit: Duration::from_secs(15 * 60),
        },
        Step {
            name: "DEMO: cargo xtask demo, built (offline, no network)",
            script: "cargo xtask demo".into(),
            network: false,
            limit: Duration::from_secs(20 * 60),
        },
    ];
    for step in &steps {
        eprintln!("\nxtask: fresh-demo: {} ...", step.name);
        let t = Instant::now();
        in_container(&root.0, step)?;
        let took = t.elapsed();
        eprintln!("xtask: fresh-demo: {} took {}", step.name, mmss(took));
        times.push((step.name, took));
    }
    let load_after = load_average();
    println!("\ncargo xtask fresh-demo: commit {commit}, {machine}");
    println!("container: systemd-nspawn --cpu-affinity=0-1 on a debootstrapped minimal Debian");
    println!("load average before: {load_before}; after: {load_after}");
    if local_cas > 0 {
        println!(
            "this machine's {local_cas} local CA certificate(s) (/usr/local/share/ca-certificates) trusted in the container too"
        );
    }
    for (name, took) in &times {
        println!("  {:>8}  {name}", mmss(*took));
    }
    Ok(())
}

/// Runs one step's script as root in the container (`bash -e`, in the repository), with the
/// host's network or none, within its bound.
fn in_container(root: &Path, step: &Step) -> Result<()> {
    let mut cmd = Command::new("systemd-nspawn");
    cmd.args([
        "--quiet",
        // this machine has no systemd of its own to register with
        "--register=no",
        "--keep-unit",
        // a stub init as PID 1 that reaps what the demo leaves behind
        "--as-pid2",
        "--cpu-affinity=0-1",
        "--setenv=HOME=/root",
        "--setenv=PATH=/root/.cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "--setenv=DEBIAN_FRONTEND=noninteractive",
        // Debian's bundle (this machine's local CAs added: `copy_local_cas`) for every
        // client, pip's own copy of certifi included.
        "--setenv=SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt",
        "--setenv=PIP_CERT=/etc/ssl/certs/ca-certificates.crt",
    ]);
    cmd.arg(format!("--chdir={REPO}"));
    if step.network {
        cmd.arg("--resolv-conf=copy-host");
    } else {
        cmd.args(["--private-network", "--setenv=CARGO_NET_OFFLINE=true"]);
    }
    cmd.arg("--directory")
        .arg(root)
        .args(["bash", "-euo", "pipefail", "-c", &step.script])
        .stdin(std::process::Stdio::null());
    let mut child = cmd.spawn().context("cannot start systemd-nspawn")?;
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait()? {
            break s;
        }
        if start.elapsed() > step.limit {
            stop(&mut child);
            bail!(
                "fresh-demo: `{}` ran past its bound of {} and was stopped",
                step.name,
                mmss(step.limit)
            );
        }
        std::thread::sleep(Duration::from_millis(250));
    };
    if !status.success() {
        bail!("fresh-demo: `{}` failed ({status})", step.name);
    }
    Ok(())
}

/// SIGTERM to systemd-nspawn, which kills the container's PID 1 (and so everything in its
/// PID namespace); SIGKILL if it has not ended within 20 s.
fn stop(child: &mut std::process::Child) {
    if let Ok(pid) = libc::pid_t::try_from(child.id()) {
        // SAFETY: kill has no memory preconditions; `pid` is our own child, not yet reaped
        // (try_wait has not returned it), so the id cannot have been reused.
        unsafe { libc::kill(pid, libc::SIGTERM) };
    }
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(20) {
        if matches!(child.try_wait(), Ok(Some(_))) {
            return;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// The repository's committed tree at HEAD (`git archive`), unpacked into `dest`.
fn copy_tree(repo: &Path, dest: &Path) -> Result<()> {
    std::fs::create_dir_all(dest)?;
    let mut archive = Command::new("git")
        .current_dir(repo)
        .args(["archive", "--format=tar", "HEAD"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .context("cannot run git archive")?;
    let tar_in = archive.stdout.take().context("git archive's output")?;
    let untar = Command::new("tar")
        .arg("-x")
        .arg("-C")
        .arg(dest)
        .stdin(tar_in)
        .status()
        .context("cannot run tar")?;
    let archived = archive.wait()?;
    if !archived.success() || !untar.success() {
        bail!("git archive HEAD | tar -x into {} failed", dest.display());
    }
    Ok(())
}

/// This machine's local CA certificates (`/usr/local/share/ca-certificates`, what a site
/// adds to Debian's bundle, e.g. for a TLS-inspecting proxy on the way to the registries)
/// copied into the container, where `update-ca-certificates` adds them to its bundle as
/// here; how many. None on most machines.
fn copy_local_cas(root: &Path) -> Result<usize> {
    let from = Path::new("/usr/local/share/ca-certificates");
    let to = root.join("usr/local/share/ca-certificates");
    let mut n = 0;
    let Ok(entries) = std::fs::read_dir(from) else {
        return Ok(0);
    };
    std::fs::create_dir_all(&to)?;
    for e in entries.flatten() {
        let p = e.path();
        if p.extension().is_some_and(|x| x == "crt") && p.is_file() {
            std::fs::copy(&p, to.join(e.file_name()))
                .with_context(|| format!("cannot copy {} into the container", p.display()))?;
            n += 1;
        }
    }
    Ok(n)
}

fn git_head(repo: &Path) -> Result<String> {
    let out = Command::new("git")
        .current_dir(repo)
        .args(["log", "-1", "--format=%h %cI"])
        .output()
        .context("cannot run git")?;
    if !out.status.success() {
        bail!("git log in {} failed", repo.display());
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// This machine in a line: CPUs, their model, memory.
fn machine() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpus = cpuinfo
        .lines()
        .filter(|l| l.starts_with("processor"))
        .count();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .and_then(|l| l.split_once(':'))
        .map_or("unknown CPU", |(_, m)| m.trim())
        .to_string();
    let mem_gib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        })
        .map_or(0, |kib| kib / 1024 / 1024);
    format!("{cpus} CPUs ({model}), {mem_gib} GiB")
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

fn mmss(d: Duration) -> String {
    let s = d.as_secs();
    format!("{}:{:02}", s / 60, s % 60)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_minutes_and_seconds() {
        assert_eq!(mmss(Duration::from_secs(0)), "0:00");
        assert_eq!(mmss(Duration::from_secs(61)), "1:01");
        assert_eq!(mmss(Duration::from_secs(16 * 60 + 42)), "16:42");
    }
}
