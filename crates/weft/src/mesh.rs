//! `weft mesh`: node keys, authorized_keys and known_hosts on every node, all pairs proven.

use std::io::{BufRead as _, IsTerminal as _, Write as _};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use clap::Args;
use weft_launch::mesh::{self, MeshOptions};

use crate::bench::HostArgs;
use crate::{EXIT_CHECK_FAILED, EXIT_ENVIRONMENT, EXIT_OK};

#[derive(Args)]
#[command(
    after_help = "Examples:\n  weft mesh --hosts spark1,spark2,spark3,spark4\n  weft mesh --hosts n1,n2 --yes --expect-fingerprints fingerprints.txt --json\n  weft mesh --hosts n1,n2 --check\n\nYou (this machine) must already reach every host over SSH with its host key known. weft\nmesh collects the hosts' host keys once (ssh-keyscan of the address `ssh -G` gives), shows\ntheir SHA256 fingerprints and writes nothing until you confirm them: on a terminal, or with\n--yes and --expect-fingerprints FILE (lines `HOST SHA256:...`, or `ssh-keygen -lf` output of\nthe hosts' keys). Then every host gets its own ed25519 key if it has none, every host's key\nis authorized on every other, every other host's key goes into its known_hosts, and every\nordered pair is proven with `ssh -o BatchMode=yes -o StrictHostKeyChecking=yes HOST true` run\non the host (the doctor's SSH check). A host key that differs from one a host already knows\nis refused and named; nothing is written then. Running it again adds nothing. --check only\nreports. `{host}` in a path is replaced by the host's name (hosts sharing one home).\n\nExit codes: 0 every pair proven, 1 a pair failed or a host key changed, 2 usage,\nunconfirmed keys or an unreachable host."
)]
pub struct MeshArgs {
    #[command(flatten)]
    hosts: HostArgs,
    #[command(flatten)]
    group: crate::group::GroupArgs,
    /// Only report: missing keys, changed host keys, the pairs.
    #[arg(long)]
    check: bool,
    /// Do not ask: the fingerprints are confirmed by --expect-fingerprints.
    #[arg(long)]
    yes: bool,
    /// The host keys' expected fingerprints (`HOST SHA256:...` lines).
    #[arg(long, value_name = "FILE")]
    expect_fingerprints: Option<PathBuf>,
    /// Each host's own key (private; `.pub` beside it).
    #[arg(long, default_value = "~/.ssh/id_ed25519")]
    identity: String,
    #[arg(long, default_value = "~/.ssh/known_hosts")]
    known_hosts: String,
    #[arg(long, default_value = "~/.ssh/authorized_keys")]
    authorized_keys: String,
    /// Connect timeout in seconds of each host-to-host probe.
    #[arg(long, default_value_t = 5)]
    ssh_timeout_s: u64,
}

pub fn run(a: MeshArgs, json: bool) -> Result<u8> {
    if a.yes && a.expect_fingerprints.is_none() {
        bail!("--yes needs --expect-fingerprints FILE: host keys are never accepted blindly");
    }
    let mut a = a;
    crate::group::fill_hosts(&mut a.hosts, &a.group)?;
    let (hs, remote) = a.hosts.runners()?;
    let keys = mesh::collect_keys(&hs, Duration::from_secs(a.ssh_timeout_s.clamp(1, 60)))?;
    let table = crate::output::table(
        ["HOST", "ADDRESS", "TYPE", "FINGERPRINT"],
        keys.iter().map(|k| {
            [
                k.host.clone(),
                k.known_as.clone(),
                k.key_type.clone(),
                k.fingerprint.clone(),
            ]
        }),
    );
    let expect = match &a.expect_fingerprints {
        Some(f) => Some(mesh::parse_expect(
            &std::fs::read_to_string(f).with_context(|| format!("{}", f.display()))?,
        )?),
        None => None,
    };
    if !a.check && expect.is_none() {
        if !std::io::stdin().is_terminal() {
            eprintln!("{table}");
            eprintln!(
                "weft mesh: confirm these host keys: run it on a terminal, or pass --yes --expect-fingerprints FILE"
            );
            return Ok(EXIT_ENVIRONMENT);
        }
        eprintln!("{table}\n");
        eprint!(
            "Are these the hosts' keys (compare with `ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub` on each)? [y/N] "
        );
        let _ = std::io::stderr().flush();
        let mut answer = String::new();
        std::io::stdin().lock().read_line(&mut answer)?;
        if !matches!(answer.trim(), "y" | "Y" | "yes") {
            eprintln!("weft mesh: not confirmed; nothing written");
            return Ok(EXIT_ENVIRONMENT);
        }
    } else if !json {
        println!("{table}\n");
    }
    let r = mesh::mesh(
        &hs,
        &keys,
        &MeshOptions {
            identity: a.identity,
            known_hosts: a.known_hosts,
            authorized_keys: a.authorized_keys,
            check: a.check,
            expect,
            connect_timeout: Duration::from_secs(a.ssh_timeout_s.clamp(1, 60)),
            bound: remote.timeout,
        },
    )?;
    if json {
        crate::output::json(&r)?;
    } else {
        for c in &r.changed {
            println!(
                "REFUSED {} [host key changed]: {}'s known_hosts holds {}, {} now presents {}; if the change is expected, remove the old entry on {} (ssh-keygen -R) and run weft mesh again",
                c.host, c.on, c.known, c.host, c.presented, c.on
            );
        }
        if !r.changed.is_empty() {
            println!("\nnothing written");
        } else {
            if !a.check {
                println!(
                    "keys generated on {} host(s); {} authorized_keys and {} known_hosts lines added",
                    r.generated.len(),
                    r.authorized_added,
                    r.known_added
                );
            } else if r.missing > 0 {
                println!("{} known_hosts entries missing", r.missing);
            }
            for p in r.pairs.iter().filter(|p| !p.ok) {
                println!(
                    "FAIL {} -> {} [ssh]: {}",
                    p.from,
                    p.to,
                    p.error.as_deref().unwrap_or("")
                );
                if let Some(rem) = &p.remedy {
                    println!("       fix: {rem}");
                }
            }
            let ok = r.pairs.iter().filter(|p| p.ok).count();
            println!("{ok} of {} ordered pairs proven", r.pairs.len());
        }
    }
    Ok(if r.ok { EXIT_OK } else { EXIT_CHECK_FAILED })
}
