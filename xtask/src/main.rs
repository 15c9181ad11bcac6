//! Project automation: `cargo xtask demo` and `cargo xtask test`.
//!
//! Both install the Debian packages weft's real-component tests need (OpenSM, ibsim,
//! the InfiniBand diagnostics, iproute2, iperf3, OpenSSH) when they are missing, so that the two
//! commands in the README work on a fresh machine.

mod console_tour;
mod deb;
mod demo;
mod demo_lease;
mod fresh_demo;
mod llamacpp;
mod tidy;

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
    // the C headers, so that the libfabric struct-layout test runs instead of failing
    ("libfabric-dev", "/usr/include/rdma/fabric.h"),
    // `weft sync`'s benchmark compares against rsync.
    ("rsync", "/usr/bin/rsync"),
    // `promtool check metrics` checks what the controller's and agent's /metrics serve.
    ("prometheus", "/usr/bin/promtool"),
    // `cargo xtask deb-test`: a clean Debian, its units verified, then booted with systemd.
    ("debootstrap", "/usr/sbin/debootstrap"),
    ("systemd", "/usr/bin/systemd-analyze"),
    ("systemd-container", "/usr/bin/systemd-nspawn"),
    // `cargo xtask deb-test` fails on any lintian error or warning of the package.
    ("lintian", "/usr/bin/lintian"),
    // weft-console's browser test: headless Chromium over WebDriver.
    ("chromium", "/usr/bin/chromium"),
    ("chromium-driver", "/usr/bin/chromedriver"),
    // The PostgreSQL store's tests start a real PostgreSQL 15 (weft_testbed::Postgres).
    ("postgresql", "/usr/lib/postgresql/15/bin/postgres"),
    // llama.cpp's server and RPC server are built from source for `weft run`'s llama.cpp test.
    ("cmake", "/usr/bin/cmake"),
];

const USAGE: &str = "usage: cargo xtask <command>

commands:
  demo    start a simulated InfiniBand fabric with a primary and a standby OpenSM,
          apply weft's partition plan, verify it on every port, move a node, fail over;
          then weft mesh, sync and run across namespace hosts (`demo launch`: only those;
          `demo --keep`: leave the simulated fabric running to explore, until Ctrl-C)
  demo-deps   only install what the demo needs (its Debian packages, the llm step's wheels)
  fresh-demo  time the demo's build and the demo on a clean debootstrapped Debian in a
              systemd-nspawn container on 2 CPUs (root; downloads rustup's toolchain)
  test    install what the tests need, then run fmt, tidy, clippy and the whole test suite
  tidy    check the rules of ARCHITECTURE.md that a machine can check
  deb     build the Debian package (release build) into target/deb/
  deb-lint  build the package (debug build) and check it with lintian (errors and warnings fail)
  deb-test  install the package (debug build) on a clean debootstrapped Debian and run weft there
  deps    only install the Debian packages the tests need";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        // The demo installs only the Debian packages it shows (no PyPI package, nothing to
        // compile but weft and its plugin).
        Some("demo") if args.get(1).is_some_and(|a| a == "launch") => {
            ensure(demo::DEMO_PACKAGES).and_then(|()| demo::launch_tour())
        }
        Some("demo") if args.get(1).is_some_and(|a| a == "--keep") => {
            ensure(demo::DEMO_PACKAGES).and_then(|()| demo::run(true))
        }
        Some("demo") => ensure(demo::DEMO_PACKAGES).and_then(|()| demo::run(false)),
        Some("demo-deps") => {
            ensure(demo::DEMO_PACKAGES).and_then(|()| demo::llm_python().map(drop))
        }
        Some("fresh-demo") => workspace_root().and_then(|root| fresh_demo::run(&root)),
        Some("test") => ensure_packages()
            .and_then(|()| ensure_torch())
            .and_then(|()| workspace_root().and_then(|r| llamacpp::ensure(&r)))
            .and_then(|()| test(&args[1..])),
        Some("deps") => ensure_packages()
            .and_then(|()| ensure_torch())
            .and_then(|()| workspace_root().and_then(|r| llamacpp::ensure(&r))),
        Some("tidy") => workspace_root().and_then(|root| tidy::run(&root)),
        Some("deb") => {
            workspace_root().and_then(|root| deb::build(&root, deb::Build::Release).map(drop))
        }
        Some("deb-lint") => workspace_root().and_then(|root| {
            deb::build(&root, deb::Build::Debug).and_then(|deb| deb::lintian(&deb))
        }),
        Some("deb-test") => workspace_root().and_then(|root| deb::test(&root, deb::Build::Debug)),
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

/// PyPI packages the tests need, each with a Python module that shows it is installed:
/// schemathesis fuzzes the controller's live API from its OpenAPI document, which
/// openapi-spec-validator checks; weft-llmbench's
/// tests need a real llama.cpp server, the GGUF writer, the tokenizer trainer and llama-benchy.
const PIP_PACKAGES: &[(&str, &str)] = &[
    ("schemathesis==4.32.5", "schemathesis"),
    ("openapi-spec-validator", "openapi_spec_validator"),
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
        .args(["-m", "pip", "install", "--quiet", "--break-system-packages"])
        .args(&missing)
        .env("CMAKE_ARGS", "-DGGML_NATIVE=OFF"))
}

fn ensure_packages() -> Result<()> {
    ensure_pip_packages()?;
    ensure(PACKAGES)
}

/// Installs the Debian packages of `list` whose file is missing (as root, else an error).
fn ensure(list: &[(&str, &str)]) -> Result<()> {
    let missing: Vec<&str> = list
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

/// PyTorch for `python3`, for `weft run torchrun`'s test (a DDP job on CPU, gloo), from PyPI
/// when `import torch` fails. PyPI's Linux wheel pulls in the CUDA stack (cuDNN, cuBLAS,
/// NCCL, ...: about 4 GB); the CPU-only index is not reachable from here. Debian's
/// python3-torch (1.13) is no substitute: its torchrun fails on Python 3.11 (`Std.from_str`).
fn ensure_torch() -> Result<()> {
    let have = Command::new("python3")
        .args(["-c", "import torch"])
        .output()
        .is_ok_and(|o| o.status.success());
    if have {
        return Ok(());
    }
    eprintln!("xtask: installing torch from PyPI (python3 -m pip install torch)");
    run(Command::new("python3").args(["-m", "pip", "install", "-q", "torch"]))
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

/// The workspace root: xtask's manifest directory's parent.
fn workspace_root() -> Result<std::path::PathBuf> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    dir.parent()
        .map(std::path::Path::to_path_buf)
        .context("xtask has no parent directory")
}

fn test(extra: &[String]) -> Result<()> {
    run(cargo().args(["fmt", "--all", "--", "--check"]))?;
    tidy::run(&workspace_root()?)?;
    run(cargo().args([
        "clippy",
        "--workspace",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]))?;
    // Everything the tests need was installed above, so a test that cannot run is a failure.
    let require = std::env::var("WEFT_TEST_REQUIRE").unwrap_or_else(|_| "all".into());
    run(cargo()
        .args(["test", "--workspace"])
        .args(extra)
        .env("WEFT_TEST_REQUIRE", require))?;
    deb::test(&workspace_root()?, deb::Build::Prebuilt)
}
