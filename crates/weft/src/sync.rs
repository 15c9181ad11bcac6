//! `weft sync`: a directory to every node as a pipelined chain; `weft sync-serve` (hidden):
//! the receiving side started on each node.

use std::io::IsTerminal as _;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, Result};
use clap::Args;
use weft_launch::sync::{self, ServeOptions, SyncOptions};

use crate::bench::HostArgs;
use crate::{EXIT_CHECK_FAILED, EXIT_OK};

#[derive(Args)]
#[command(
    after_help = "Examples:\n  weft sync /models/Llama-3.1-70B --hosts spark2,spark3,spark4\n  weft sync ./model --hosts ns1,ns2 --via netns --dest /tmp/{host}/model --data-if =data0 --json\n\nThe source (this machine) sends every chunk once, to the first host; each host writes what it\nlacks and forwards at once what the hosts after it lack, so N hosts take about one copy's\ntime. Chunks are blake3-hashed: a re-run sends only what is missing or different (resume\nafter an interruption, unchanged files skipped). At the end every host's hash of every file\nis compared with the source's. A host that cannot be reached is skipped and named; hosts\ncut off behind one that dies are served again without it. The receiving side is\n`REMOTE_WEFT sync-serve` on each host, listening on its data address only while the sync\nruns.\n\nExit codes: 0 every host has every file, 1 a host failed or a hash differs, 2 usage."
)]
pub struct SyncArgs {
    /// The directory to replicate.
    dir: PathBuf,
    #[command(flatten)]
    hosts: HostArgs,
    #[command(flatten)]
    group: crate::group::GroupArgs,
    /// Destination on the hosts (default: the source's absolute path); `{host}` is replaced
    /// by each host's name.
    #[arg(long)]
    dest: Option<String>,
    /// Chunk size in MiB.
    #[arg(long, default_value_t = 4)]
    chunk_mib: u64,
    /// At most this many chains: the first, plus new ones for hosts cut off behind a lost one.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
}

pub fn run(a: SyncArgs, json: bool) -> Result<u8> {
    if !(1..=256).contains(&a.chunk_mib) {
        anyhow::bail!("--chunk-mib must be 1..=256");
    }
    let dir = std::fs::canonicalize(&a.dir).with_context(|| format!("{}", a.dir.display()))?;
    let mut a = a;
    crate::group::fill_hosts(&mut a.hosts, &a.group)?;
    let (hosts, remote) = a.hosts.runners()?;
    let o = SyncOptions {
        dest: a.dest.unwrap_or_else(|| dir.display().to_string()),
        remote_exe: remote.exe.clone(),
        data_if: a.hosts.data_if.clone(),
        mgmt_if: a.hosts.mgmt_if.clone(),
        timeout: remote.timeout,
        chunk_size: a.chunk_mib << 20,
        rounds: a.rounds,
    };
    let bar = (!json && std::io::stderr().is_terminal()).then(|| {
        let b = indicatif::ProgressBar::new(0);
        b.set_style(
            indicatif::ProgressStyle::with_template(
                "{bar:40} {bytes}/{total_bytes} {bytes_per_sec} {elapsed}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        b
    });
    let r = sync::sync(&dir, &hosts, &o, &mut |p| {
        if let Some(b) = &bar {
            b.set_length(p.total);
            b.set_position(p.sent);
        }
    })?;
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    if json {
        crate::output::json(&r)?;
    } else {
        let mib = |b: u64| format!("{:.1}", b as f64 / (1 << 20) as f64);
        println!(
            "{}",
            crate::output::table(
                [
                    "HOST",
                    "STATUS",
                    "NEEDED MiB",
                    "WRITTEN MiB",
                    "CHANGED",
                    "ERROR"
                ],
                r.nodes.iter().map(|n| [
                    n.name.clone(),
                    n.status.to_uppercase(),
                    mib(n.bytes_needed),
                    mib(n.bytes_written),
                    if n.changed.is_empty() {
                        "-".into()
                    } else {
                        n.changed.join(",")
                    },
                    n.error.clone().unwrap_or_else(|| "-".into()),
                ])
            )
        );
        for m in &r.mismatches {
            println!(
                "MISMATCH {} {}: source {} host {}",
                m.node,
                m.path,
                &m.expected[..12],
                m.found.as_deref().map_or("missing", |h| &h[..12])
            );
        }
        let ok = r.nodes.iter().filter(|n| n.status == "ok").count();
        println!(
            "\n{} files, {} MiB; sent {} MiB in {} chain(s), {:.1} s; {ok} of {} hosts {}",
            r.files,
            mib(r.bytes),
            mib(r.bytes_sent),
            r.chains,
            r.elapsed_s,
            r.nodes.len(),
            if r.ok {
                "have every file, every hash equal to the source's"
            } else {
                "complete"
            }
        );
    }
    Ok(if r.ok { EXIT_OK } else { EXIT_CHECK_FAILED })
}

#[derive(Args)]
pub struct ServeArgs {
    #[arg(long)]
    dest: PathBuf,
    #[arg(long, default_value_t = 30_000)]
    timeout_ms: u64,
    #[arg(long, default_value_t = 120_000)]
    accept_timeout_ms: u64,
    #[arg(long)]
    listen: Option<std::net::IpAddr>,
    #[arg(long)]
    data_if: Option<String>,
    #[arg(long)]
    mgmt_if: Option<String>,
    /// Exit at once when stdin closes (the source went away).
    #[arg(long)]
    exit_on_stdin_eof: bool,
}

pub fn serve(a: ServeArgs) -> Result<u8> {
    if a.exit_on_stdin_eof {
        std::thread::spawn(|| {
            let mut sink = [0u8; 64];
            let mut stdin = std::io::stdin();
            while let Ok(n) = std::io::Read::read(&mut stdin, &mut sink) {
                if n == 0 {
                    break;
                }
            }
            eprintln!("weft sync-serve: the source went away (stdin closed); exiting");
            std::process::exit(3);
        });
    }
    let o = ServeOptions {
        dest: a.dest,
        listen: a.listen,
        data_if: a.data_if,
        mgmt_if: a.mgmt_if,
        timeout: Duration::from_millis(a.timeout_ms.max(100)),
        accept_timeout: Duration::from_millis(a.accept_timeout_ms.max(100)),
    };
    sync::serve(&o, &mut std::io::stdout())?;
    Ok(EXIT_OK)
}
