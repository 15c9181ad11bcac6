//! Project automation: `cargo xtask demo` and `cargo xtask test`.
//!
//! Both install the Debian packages weft's real-component tests need (OpenSM, ibsim,
//! the InfiniBand diagnostics, iproute2, iperf3, OpenSSH) when they are missing, so that the two
//! commands in the README work on a fresh machine.

mod demo;

use std::process::{Command, ExitCode};

use anyhow::{Context, Result, bail};

/// Debian packages, and a file each one provides, that tests and the demo need.
const PACKAGES: &[(&str, &str)] = &[
    ("opensm", "/usr/sbin/opensm"),
    ("ibsim-utils", "/usr/bin/ibsim"),
    ("infiniband-diags", "/usr/sbin/smpquery"),
    (
        "libumad2sim0",
        "/usr/lib/x86_64-linux-gnu/umad2sim/libumad2sim.so",
    ),
    ("iproute2", "/usr/sbin/ip"),
    ("iperf3", "/usr/bin/iperf3"),
    ("openssh-server", "/usr/sbin/sshd"),
    ("openssh-client", "/usr/bin/ssh"),
    ("libfabric1", "/usr/lib/x86_64-linux-gnu/libfabric.so.1"),
    ("libfabric-bin", "/usr/bin/fi_pingpong"),
];

const USAGE: &str = "usage: cargo xtask <command>

commands:
  demo    start a simulated InfiniBand fabric with a primary and a standby OpenSM,
          apply weft's partition plan, verify it on every port, move a node, fail over
  test    install what the tests need, then run fmt, clippy and the whole test suite
  deps    only install the Debian packages the tests need";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("demo") => ensure_packages().and_then(|()| demo::run()),
        Some("test") => ensure_packages().and_then(|()| test(&args[1..])),
        Some("deps") => ensure_packages(),
        Some("-h" | "--help" | "help") => {
            println!("{USAGE}");
            Ok(())
        }
        _ => {
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// PyPI packages weft-llmbench's tests need (a real llama.cpp server, the GGUF writer, the
/// tokenizer trainer and llama-benchy), each with a Python module that shows it is installed.
const PIP_PACKAGES: &[(&str, &str)] = &[
    ("llama-cpp-python[server]", "llama_cpp.server"),
    ("gguf", "gguf"),
    ("tokenizers", "tokenizers"),
    ("llama-benchy", "llama_benchy"),
];

/// Installs the missing PyPI packages with pip (llama-cpp-python compiles llama.cpp: minutes).
fn ensure_pip_packages() -> Result<()> {
    let missing: Vec<&str> = PIP_PACKAGES
        .iter()
        .filter(|(_, module)| {
            !Command::new("python3")
                .args(["-c", &format!("import importlib.util,sys; sys.exit(importlib.util.find_spec('{}'.split('.')[0]) is None)", module)])
                .status()
                .is_ok_and(|s| s.success())
        })
        .map(|(pkg, _)| *pkg)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    eprintln!("xtask: pip installing {}", missing.join(" "));
    run(Command::new("python3")
        .args(["-m", "pip", "install", "-q"])
        .args(&missing)
        .env("CMAKE_ARGS", "-DGGML_NATIVE=OFF"))
}

fn ensure_packages() -> Result<()> {
    ensure_pip_packages()?;
    let missing: Vec<&str> = PACKAGES
        .iter()
        .filter(|(_, file)| !std::path::Path::new(file).exists())
        .map(|(pkg, _)| *pkg)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    // SAFETY: geteuid has no preconditions and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    if !root {
        bail!(
            "missing Debian packages: {}. Install them as root: apt-get install -y {}",
            missing.join(" "),
            missing.join(" ")
        );
    }
    eprintln!("xtask: installing {}", missing.join(" "));
    run(Command::new("apt-get").args(["update", "-qq"]))?;
    run(Command::new("apt-get")
        .args(["install", "-y", "-qq", "--no-install-recommends"])
        .args(&missing)
        .env("DEBIAN_FRONTEND", "noninteractive"))
}

fn cargo() -> Command {
    Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
}

fn run(cmd: &mut Command) -> Result<()> {
    let shown = format!("{cmd:?}");
    let status = cmd
        .status()
        .with_context(|| format!("cannot start {shown}"))?;
    if !status.success() {
        bail!("{shown} failed with {status}");
    }
    Ok(())
}

fn test(extra: &[String]) -> Result<()> {
    run(cargo().args(["fmt", "--all", "--", "--check"]))?;
    run(cargo().args([
        "clippy",
        "--workspace",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]))?;
    run(cargo().args(["test", "--workspace"]).args(extra))
}
