//! Apply-to-verified and SM failover times on a 48-HCA simulated fabric.
//!
//! `cargo bench -p weft-opensm --bench apply` (add `-- --runs N` for more apply rounds,
//! `--apply-only` to skip the SSH and failover parts, `--smpquery` to read the tables
//! with one `smpquery` per port, the fallback, instead of the one SMP client).
//! A two-level fat tree (4 leaves, 2 spines, 48 HCAs, every 4th dual-ported) under the
//! real OpenSM with a primary and a standby. Each round alternates between two plans
//! that move one node between tenants, so every apply changes the fabric. Reported: the
//! median, min and max of apply to verified as `weft fabric apply` does it, the snapshot
//! included (ibnetdiscover, the master SM and every end port's table read before the apply,
//! then `Applier::apply`: write to both SMs, reread, sweep, the chosen ports read back
//! and compared), and the time from kill -9 of the master to the standby
//! being master and every port verified. Targets (issue: partitions as code): apply
//! under 1 s; failover reported. Then the same apply with both SMs reached over SSH
//! (each behind its own real sshd on loopback), with and without connection
//! multiplexing; the fabric controller's target for move-to-verified is under 2 s.

use std::time::{Duration, Instant};

use weft_fabric::{FabricPlan, Guid, SmOptions};
use weft_opensm::{
    Applier, DiagTools, LocalSm, RemotePaths, SmHost, SshConfig, SshSm, VerifyScope,
};
use weft_testbed::{Signal, SimFabric, SmSpec, Sshd, Topology};

const HCAS: usize = 48;

/// Two tenants of 24 nodes; after the move, node5 belongs to bob.
fn plan(moved: bool) -> String {
    let owner = |n: usize| match n {
        5 if moved => "bob",
        1..=24 => "alice",
        _ => "bob",
    };
    let mut text = String::from("[default]\npolicy = \"isolate\"\n");
    for tenant in ["alice", "bob"] {
        let members: Vec<String> = (1..=HCAS)
            .filter(|&n| owner(n) == tenant)
            .map(|n| format!("{{ node = \"node{n}\" }}"))
            .collect();
        text.push_str(&format!(
            "[[partition]]\nname = \"{tenant}\"\ntenant = \"{tenant}\"\nipoib = true\nmembers = [{}]\n",
            members.join(", ")
        ));
    }
    text
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let runs: usize = args
        .iter()
        .position(|a| a == "--runs")
        .and_then(|i| args.get(i + 1))
        .and_then(|n| n.parse().ok())
        .unwrap_or(15);

    let topology = Topology::fat_tree(4, 2, HCAS, 4);
    let apply_only = args.iter().any(|a| a == "--apply-only");
    // `--smpquery`: read the tables with the tools' fallback (one process per port), to
    // compare with the one-client path on the same machine.
    let tools_only = args.iter().any(|a| a == "--smpquery");
    let mut fabric = SimFabric::start(&topology)?;
    let mut sms = Vec::new();
    for (name, host, prio) in [("primary", "smhost", 10u8), ("standby", "smhost2", 5)] {
        let etc = fabric.dir().join(format!("{name}-etc"));
        std::fs::create_dir_all(&etc)?;
        let file = etc.join("partitions.conf");
        std::fs::write(&file, "Default=0x7fff, ipoib : ALL=full ;\n")?;
        let h = fabric.start_sm(SmSpec {
            name: name.into(),
            sim_host: host.into(),
            priority: prio,
            partitions_file: file.clone(),
            extra_config: Vec::new(),
        })?;
        sms.push(LocalSm {
            name: name.into(),
            port_guid: Guid(h.port_guid),
            partitions_file: file,
            pid_file: h.pid_file.clone(),
            log_file: h.log_file.clone(),
        });
    }
    let applier = Applier {
        sms: sms
            .iter()
            .cloned()
            .map(|s| Box::new(s) as Box<dyn SmHost>)
            .collect(),
        diag: DiagTools {
            env: {
                let mut env = fabric.client_env("node1");
                if tools_only {
                    env.push(("WEFT_SMP".into(), "off".into()));
                }
                env
            },
            cwd: Some(fabric.dir().to_path_buf()),
            timeout: Duration::from_secs(10),
            parallel: 6,
        },
        sm_options: SmOptions::default(),
        verify_scope: VerifyScope::Changed,
        sweep_timeout: Duration::from_secs(5),
        verify_timeout: Duration::from_secs(5),
    };
    let inventory = applier.diag.snapshot()?.inventory;
    let confs: Vec<_> = [false, true]
        .iter()
        .map(|&moved| {
            let p = FabricPlan::from_toml(&plan(moved)).expect("bench plan parses");
            weft_fabric::compile(&p, Some(&inventory))
                .expect("bench plan is valid")
                .conf
        })
        .collect();

    let mut applier = applier;
    let mut current = 0;
    for scope in [VerifyScope::Changed, VerifyScope::All] {
        applier.verify_scope = scope;
        let rounds = if scope == VerifyScope::All {
            runs.div_ceil(3)
        } else {
            runs
        };
        let mut totals = Vec::new();
        let mut phases: Vec<(f64, f64, f64, f64)> = Vec::new();
        let mut verified = 0;
        let mut read_by = None;
        for _ in 0..rounds {
            current = (current + 1) % 2;
            // As `weft fabric apply` does: read the fabric first, then apply; both timed.
            let t0 = Instant::now();
            let before = applier.diag.snapshot()?;
            let snapshot = t0.elapsed();
            let r = applier
                .apply(&confs[current], &before)?
                .with_snapshot(snapshot);
            verified = r.ports_verified;
            read_by = Some((before.read_by.clone(), r.read_by.clone()));
            totals.push(r.total_ms);
            phases.push((r.snapshot_ms, r.write_ms, r.sweep_ms, r.verify_ms));
        }
        let m = median(totals.clone());
        println!(
            "apply to verified, snapshot included ({scope:?} scope: {verified} of {} end ports read back), {} HCAs, 2 SMs, {rounds} runs: median {m:.0} ms (snapshot {:.0}, write {:.0}, sweep {:.0}, verify {:.0}), min {:.0} ms, max {:.0} ms; target 1000 ms; median/target = {:.2}",
            inventory.ports.len(),
            topology.hcas().len(),
            median(phases.iter().map(|p| p.0).collect()),
            median(phases.iter().map(|p| p.1).collect()),
            median(phases.iter().map(|p| p.2).collect()),
            median(phases.iter().map(|p| p.3).collect()),
            totals.iter().cloned().fold(f64::INFINITY, f64::min),
            totals.iter().cloned().fold(0.0, f64::max),
            m / 1000.0
        );
        if let Some((snapshot, verify)) = read_by {
            println!("  tables read by: snapshot {snapshot}; verify {verify}");
        }
    }
    applier.verify_scope = VerifyScope::All;
    if apply_only {
        return Ok(());
    }

    // The same applies with each SM behind its own real sshd on loopback (strict host
    // keys, key auth), with and without OpenSSH connection multiplexing.
    let sshds = [Sshd::start()?, Sshd::start()?];
    for multiplex in [true, false] {
        let ssh_sms = sms
            .iter()
            .zip(&sshds)
            .map(|(sm, d)| {
                let mut c =
                    SshConfig::new(d.host(), d.user(), d.identity_file(), d.known_hosts_file());
                c.port = d.port();
                c.multiplex = multiplex;
                SshSm::new(
                    sm.name.clone(),
                    sm.port_guid,
                    c,
                    RemotePaths {
                        partitions_file: sm.partitions_file.clone(),
                        pid_file: sm.pid_file.clone(),
                        log_file: sm.log_file.clone(),
                    },
                )
                .map(|s| Box::new(s) as Box<dyn SmHost>)
            })
            .collect::<Result<Vec<_>, _>>()?;
        let over_ssh = Applier {
            sms: ssh_sms,
            diag: applier.diag.clone(),
            sm_options: SmOptions::default(),
            verify_scope: VerifyScope::Changed,
            sweep_timeout: Duration::from_secs(5),
            verify_timeout: Duration::from_secs(5),
        };
        let mut totals = Vec::new();
        let mut phases = Vec::new();
        // The first apply opens the control masters; it is counted like the others.
        for _ in 0..runs {
            current = (current + 1) % 2;
            let before = over_ssh.diag.snapshot()?;
            let r = over_ssh.apply(&confs[current], &before)?;
            totals.push(r.total_ms);
            phases.push((r.write_ms, r.sweep_ms, r.verify_ms));
        }
        let m = median(totals.clone());
        println!(
            "apply to verified over SSH ({} multiplexing), {} HCAs, 2 SMs, {runs} runs: median {m:.0} ms (write+checksum {:.0} ms, reread+sweep {:.0} ms, verify {:.0} ms), min {:.0} ms, max {:.0} ms; target 2000 ms",
            if multiplex { "with" } else { "without" },
            topology.hcas().len(),
            median(phases.iter().map(|p| p.0).collect()),
            median(phases.iter().map(|p| p.1).collect()),
            median(phases.iter().map(|p| p.2).collect()),
            totals.iter().cloned().fold(f64::INFINITY, f64::min),
            totals.iter().cloned().fold(0.0, f64::max),
        );
    }
    drop(sshds);

    let current = &confs[current];
    let t0 = Instant::now();
    fabric.kill_sm("primary", Signal::SIGKILL)?;
    let (_, to_master) = applier.wait_for_new_master(sms[0].port_guid, Duration::from_secs(60))?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if applier.verify(current)?.mismatches.is_empty() {
            break;
        }
        if Instant::now() > deadline {
            return Err("ports did not match the plan after failover".into());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    println!(
        "failover (kill -9 master, sminfo_polling_timeout 1000 ms, polling_retry_number 2): standby master after {:.2} s, every port verified after {:.2} s",
        to_master.as_secs_f64(),
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}
