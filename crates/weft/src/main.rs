//! `weft`: the command a person types. Argument parsing, configuration and output
//! formatting only; every decision is made in the library crates.

#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

mod bench;
mod bench_llm;
mod cluster;
mod config;
mod doctor;
mod fabric;
mod group;
mod lease;
mod mesh;
mod output;
mod plan;
mod report_to;
mod run;
mod sync;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// The version and the git commit it was built from (`weft --version`).
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (",
    env!("WEFT_GIT_COMMIT"),
    ")"
);

/// Exit codes: 0 ok, 1 a check failed, 2 usage or environment error.
pub const EXIT_OK: u8 = 0;
pub const EXIT_CHECK_FAILED: u8 = 1;
pub const EXIT_ENVIRONMENT: u8 = 2;

#[derive(Parser)]
#[command(
    name = "weft",
    version = VERSION,
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
    /// The log's format on stderr: `text` (colour on a terminal unless NO_COLOR is set) or
    /// `json` (one object a line: time, level, target, fields; for a log collector).
    #[arg(long, global = true, env = "WEFT_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
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
    /// weft.toml: print the commented reference of every setting, or check a file.
    #[command(subcommand)]
    Config(ConfigCommand),
    /// Prints a shell completion script.
    #[command(
        after_help = "Examples:\n  weft completions bash > /usr/share/bash-completion/completions/weft\n  weft completions zsh > \"${fpath[1]}/_weft\""
    )]
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Writes man pages for weft and every subcommand into DIR (for packagers).
    #[command(hide = true)]
    Manpages {
        /// Where the `.1` files go (created if missing).
        dir: PathBuf,
    },
    /// Will a model fit, and what will each GPU hold: weights, KV cache, layouts ranked.
    Plan(Box<plan::PlanArgs>),
    /// Replicates a directory (a model) to every host as a pipelined chain, hashes checked.
    Sync(Box<sync::SyncArgs>),
    #[command(hide = true)]
    SyncServe(sync::ServeArgs),
    /// Runs a command on every host with the job's environment (torchrun, vLLM, Ray recipes).
    Run(Box<run::RunArgs>),
    #[command(hide = true)]
    RunNode(run::NodeArgs),
    #[command(hide = true)]
    RunProbe(run::ProbeArgs),
    /// SSH between every pair of hosts: keys, known_hosts (fingerprints confirmed), proven.
    Mesh(Box<mesh::MeshArgs>),
}

#[derive(Subcommand)]
enum ConfigCommand {
    /// Prints every section and key of weft.toml, commented out, with its doc and default.
    #[command(after_help = "Example:\n  weft config reference > /etc/weft/weft.toml")]
    Reference,
    /// Reads the config file (--config, $WEFT_CONFIG or ./weft.toml) and reports the first
    /// fault with its line and key; exit 0 when it is valid.
    #[command(after_help = "Example:\n  weft --config /etc/weft/weft.toml config check")]
    Check,
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
        Err(e) if e.kind() == clap::error::ErrorKind::DisplayHelp => {
            // `--help` of a bench or doctor command shows `[bench]`'s values as defaults.
            let with_file = help_bench_section().map(|s| {
                s.apply(<Cli as clap::CommandFactory>::command())
                    .try_get_matches()
            });
            return match with_file {
                Some(Err(help)) => usage_error(help),
                _ => usage_error(e),
            };
        }
        Err(e) => return usage_error(e),
    };
    // `[bench]` of weft.toml gives the defaults of the bench and doctor flags: parsed
    // again with them (a flag or its variable still wins).
    let cli = match bench_section(&cli) {
        Ok(None) => cli,
        Ok(Some(section)) => {
            let cmd = section.apply(<Cli as clap::CommandFactory>::command());
            match cmd
                .try_get_matches()
                .and_then(|m| <Cli as clap::FromArgMatches>::from_arg_matches(&m))
            {
                Ok(c) => c,
                Err(e) => return usage_error(e),
            }
        }
        Err(e) => {
            output::anyhow_error(cli.json, EXIT_ENVIRONMENT, &e);
            return ExitCode::from(EXIT_ENVIRONMENT);
        }
    };
    // The services log what they do (enrolled, reported, applied) at INFO, for journald;
    // a command a person types only warns.
    let service = matches!(
        cli.command,
        Command::Cluster(
            cluster::ClusterCommand::Controller(_) | cluster::ClusterCommand::Agent(_)
        )
    );
    let default_level = if service {
        "warn,weft=info,weft_controller=info,weft_agent=info,weft_opensm=info"
    } else {
        "warn"
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("WEFT_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level));
    let log = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match cli.log_format {
        LogFormat::Json => log.json().with_current_span(false).init(),
        LogFormat::Text => log
            .with_ansi(log_colour(
                std::io::IsTerminal::is_terminal(&std::io::stderr()),
                std::env::var_os("NO_COLOR").as_deref(),
            ))
            .init(),
    }
    match &cli.command {
        Command::Completions { shell } => {
            let mut cmd = <Cli as clap::CommandFactory>::command();
            clap_complete::generate(*shell, &mut cmd, "weft", &mut std::io::stdout());
            return ExitCode::from(EXIT_OK);
        }
        Command::Manpages { dir } => {
            return match write_manpages(dir) {
                Ok(()) => ExitCode::from(EXIT_OK),
                Err(e) => {
                    output::anyhow_error(cli.json, EXIT_ENVIRONMENT, &e);
                    ExitCode::from(EXIT_ENVIRONMENT)
                }
            };
        }
        _ => {}
    }
    let _ = CONFIG_PATH.set(cli.config.clone());
    // Only the commands that use weft.toml read it, so that a broken file does not stop
    // `weft bench` or `weft plan`.
    let config = config::Config::load;
    let outcome = match cli.command {
        Command::Config(ConfigCommand::Reference) => {
            print!("{}", config::reference());
            Ok(EXIT_OK)
        }
        Command::Config(ConfigCommand::Check) => config(cli.config.as_deref()).map(|_| {
            if cli.json {
                println!("{}", serde_json::json!({ "ok": true }));
            } else {
                println!("ok");
            }
            EXIT_OK
        }),
        Command::Fabric(cmd) => {
            config(cli.config.as_deref()).and_then(|cfg| fabric::run(cmd, &cfg, cli.json))
        }
        Command::Cluster(cmd) => {
            config(cli.config.as_deref()).and_then(|cfg| cluster::run(cmd, &cfg, cli.json))
        }
        Command::Bench(cmd) => bench::run(cmd, cli.json),
        Command::Doctor(a) => doctor::run(*a, cli.json),
        Command::Completions { .. } | Command::Manpages { .. } => Ok(EXIT_OK),
        Command::Plan(a) => plan::run(*a, cli.json),
        Command::Sync(a) => sync::run(*a, cli.json),
        Command::SyncServe(a) => sync::serve(a),
        Command::Run(a) => run::run(*a, cli.json),
        Command::RunNode(a) => run::node(a),
        Command::RunProbe(a) => run::probe(a),
        Command::Mesh(a) => mesh::run(*a, cli.json),
    };
    match outcome {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            output::anyhow_error(cli.json, EXIT_ENVIRONMENT, &e);
            ExitCode::from(EXIT_ENVIRONMENT)
        }
    }
}

/// How the log is written (`--log-format`, `WEFT_LOG_FORMAT`).
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

/// Whether the text log is coloured: only for a person (a log file, a pipe or journald
/// gets plain text), and never when `NO_COLOR` is set to anything but the empty string
/// (no-color.org). An explicit `with_ansi` overrides tracing-subscriber's own NO_COLOR
/// check, so it is made here.
fn log_colour(terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    terminal && no_color.is_none_or(|v| v.is_empty())
}

/// A command-line error: usage (exit 2, JSON too under `--json`), or `--help` (exit 0).
fn usage_error(e: clap::Error) -> ExitCode {
    let code = if e.use_stderr() {
        EXIT_ENVIRONMENT
    } else {
        EXIT_OK
    };
    if code == EXIT_ENVIRONMENT && std::env::args_os().any(|a| a == "--json") {
        // A script that asked for JSON gets JSON, even for a usage error: clap's message
        // (its first line, without the `error: ` clap puts in front) and its kind as the cause.
        let text = e.render().to_string();
        let first = text.lines().next().unwrap_or_default();
        let message = first.strip_prefix("error: ").unwrap_or(first);
        let v = output::error_value(
            message,
            &[e.kind().to_string()],
            code,
            serde_json::Value::Null,
        );
        println!("{v}");
    }
    let _ = e.print();
    ExitCode::from(code)
}

/// The `[bench]` section, for the commands whose flags it gives defaults to (bench p2p,
/// collectives, llm, doctor), when the file has one; other commands never read it. A rank
/// of a collectives run takes what its launcher passes, not its host's file.
fn bench_section(cli: &Cli) -> anyhow::Result<Option<config::BenchFileConfig>> {
    use bench::BenchCommand as B;
    let reads = match &cli.command {
        Command::Doctor(_) => true,
        Command::Bench(B::P2p(_)) => true,
        Command::Bench(B::Llm(a)) => a.cmd.is_none(),
        Command::Bench(B::Collectives(_)) => !std::env::args().any(|a| a == "--rank"),
        _ => false,
    };
    if !reads {
        return Ok(None);
    }
    let section = config::BenchFileConfig::load(cli.config.as_deref())?;
    Ok((!section.defaults().is_empty()).then_some(section))
}

/// For `--help`, where no command line was parsed: `[bench]` when the words name a command
/// it gives defaults to and the file reads without fault (else the built-in help).
fn help_bench_section() -> Option<config::BenchFileConfig> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut config = std::env::var_os("WEFT_CONFIG").map(PathBuf::from);
    let mut words = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == "--config" {
            config = it.next().map(PathBuf::from);
        } else if let Some(p) = a.strip_prefix("--config=") {
            config = Some(PathBuf::from(p));
        } else if !a.starts_with('-') {
            words.push(a.as_str());
        }
    }
    let reads = match words.as_slice() {
        ["doctor", ..] | ["bench", "p2p" | "collectives", ..] => true,
        ["bench", "llm", rest @ ..] => rest.first() != Some(&"compare"),
        _ => false,
    };
    if !reads {
        return None;
    }
    config::BenchFileConfig::load(config.as_deref())
        .ok()
        .filter(|s| !s.defaults().is_empty())
}

/// `--config` (or `$WEFT_CONFIG`), for the commands that read weft.toml only on demand.
static CONFIG_PATH: std::sync::OnceLock<Option<PathBuf>> = std::sync::OnceLock::new();

/// The config file named on the command line, if any (else `./weft.toml` is looked for).
pub fn config_path() -> Option<PathBuf> {
    CONFIG_PATH.get().cloned().flatten()
}

/// One man page per command: `weft.1`, `weft-fabric.1`, `weft-fabric-apply.1`, ...
fn write_manpages(dir: &std::path::Path) -> anyhow::Result<()> {
    use anyhow::Context;
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let cmd = <Cli as clap::CommandFactory>::command();
    clap_mangen::generate_to(cmd, dir)
        .with_context(|| format!("cannot write man pages into {}", dir.display()))
}
