//! `weft`: the command a person types. Argument parsing, configuration and output
//! formatting only; every decision is made in the library crates.

mod bench;
mod bench_llm;
mod cluster;
mod config;
mod doctor;
mod fabric;
mod output;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Exit codes: 0 ok, 1 a check failed, 2 usage or environment error.
pub const EXIT_OK: u8 = 0;
pub const EXIT_CHECK_FAILED: u8 = 1;
pub const EXIT_ENVIRONMENT: u8 = 2;

#[derive(Parser)]
#[command(
    name = "weft",
    version,
    about = "Weave a handful of GPU servers into one supercomputer",
    after_help = "Examples:\n  weft fabric check plan.toml\n  weft --config weft.toml fabric apply plan.toml --json\n\nExit codes: 0 ok, 1 a check failed, 2 usage or environment error."
)]
struct Cli {
    /// Config file (TOML); default ./weft.toml when present.
    #[arg(long, global = true, env = "WEFT_CONFIG")]
    config: Option<PathBuf>,
    /// Print machine-readable JSON instead of tables.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// InfiniBand partitions as code: check, diff, apply, verify, import.
    #[command(subcommand)]
    Fabric(fabric::FabricCommand),
    #[command(flatten)]
    Cluster(cluster::ClusterCommand),
    /// Benchmarks over the plugin: collectives (nccl-tests style).
    #[command(subcommand)]
    Bench(bench::BenchCommand),
    /// Checks every host before a job: links, speed, MTU and jumbo frames, roles, RDMA, clocks.
    Doctor(Box<doctor::DoctorArgs>),
}

fn main() -> ExitCode {
    // Like other Unix tools, end quietly when the reader of our output goes away
    // (`weft ... | head`) instead of panicking on a failed print.
    // SAFETY: called first in main, before any other thread exists; SIG_DFL is a valid
    // disposition for SIGPIPE.
    unsafe {
        let _ = nix::sys::signal::signal(
            nix::sys::signal::Signal::SIGPIPE,
            nix::sys::signal::SigHandler::SigDfl,
        );
    }
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let code = if e.use_stderr() {
                EXIT_ENVIRONMENT
            } else {
                EXIT_OK
            };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("WEFT_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let outcome = config::Config::load(cli.config.as_deref()).and_then(|cfg| match cli.command {
        Command::Fabric(cmd) => fabric::run(cmd, &cfg, cli.json),
        Command::Cluster(cmd) => cluster::run(cmd, &cfg, cli.json),
        Command::Bench(cmd) => bench::run(cmd, cli.json),
        Command::Doctor(a) => doctor::run(*a, cli.json),
    });
    match outcome {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("weft: error: {e:#}");
            ExitCode::from(EXIT_ENVIRONMENT)
        }
    }
}
