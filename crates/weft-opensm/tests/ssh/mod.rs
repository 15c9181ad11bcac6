//! Delivery over SSH: each OpenSM "behind" its own real sshd (the test bed's [`Sshd`] on
//! a loopback port, strict host-key checking against a known_hosts file it writes).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use weft_fabric::conf;
use weft_opensm::{
    Applier, ApplyError, RemotePaths, SmError, SmHost, SshConfig, SshSm, VerifyScope, checksum,
};
use weft_testbed::{Sshd, Topology};

use super::{Bed, OPEN, TWO_TENANTS, bed, compile};

fn ssh_config(sshd: &Sshd, multiplex: bool) -> SshConfig {
    let mut c = SshConfig::new(
        sshd.host(),
        sshd.user(),
        sshd.identity_file(),
        sshd.known_hosts_file(),
    );
    c.port = sshd.port();
    c.multiplex = multiplex;
    c.connect_timeout = Duration::from_secs(3);
    c.command_timeout = Duration::from_secs(10);
    c
}

impl Bed {
    /// SM `i` of the bed, reached through `sshd` instead of the local file system.
    fn ssh_sm(&self, i: usize, sshd: &Sshd, multiplex: bool) -> SshSm {
        let (h, file) = &self.sms[i];
        SshSm::new(
            h.name.clone(),
            weft_fabric::Guid(h.port_guid),
            ssh_config(sshd, multiplex),
            RemotePaths {
                partitions_file: file.clone(),
                pid_file: h.pid_file.clone(),
                log_file: h.log_file.clone(),
            },
        )
        .expect("valid SSH settings")
    }

    fn ssh_applier(&self, sms: Vec<SshSm>) -> Applier {
        let mut a = self.applier(Default::default());
        a.sms = sms
            .into_iter()
            .map(|s| Box::new(s) as Box<dyn SmHost>)
            .collect();
        a
    }
}

/// Temporary files a write left in `dir`.
fn temps_in(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.contains(".weft-") && n.ends_with(".tmp"))
        })
        .collect()
}

#[test]
fn two_sms_behind_their_own_sshd_hold_the_same_file_and_the_ports_verify() {
    let bed = bed(&Topology::single_switch(4), true);
    let (d1, d2) = (Sshd::start().unwrap(), Sshd::start().unwrap());
    assert_ne!(d1.port(), d2.port());
    let sms = vec![bed.ssh_sm(0, &d1, true), bed.ssh_sm(1, &d2, true)];
    assert!(sms.iter().all(SshSm::multiplexed));
    let a = bed.ssh_applier(sms);
    let snap = a.diag.snapshot().unwrap();
    let conf = compile(TWO_TENANTS, &snap.inventory);
    let report = a.apply(&conf, &snap).unwrap();
    assert!(report.changed && report.degraded.is_empty(), "{report:?}");
    assert!(report.ports_verified >= 6, "{report:?}");
    let want = checksum(conf::render(&conf).as_bytes());
    for s in &report.sms {
        assert_eq!(s.checksum.as_deref(), Some(want.as_str()), "{report:?}");
    }
    for (_, file) in &bed.sms {
        assert_eq!(std::fs::read_to_string(file).unwrap(), conf::render(&conf));
        assert!(temps_in(file.parent().unwrap()).is_empty());
    }
    assert!(a.verify(&conf).unwrap().mismatches.is_empty());
    // Both sessions came through sshd with the throwaway key.
    for d in [&d1, &d2] {
        assert!(d.log().contains("Accepted publickey"), "{}", d.log());
    }
}

/// The standby's known_hosts holds another key: the apply stops before anything is
/// written anywhere, with an error that says host-key verification failed. It is not
/// treated as an unreachable standby.
#[test]
fn a_host_key_mismatch_fails_the_apply_and_nothing_is_written() {
    let bed = bed(&Topology::single_switch(4), true);
    let (d1, d2) = (Sshd::start().unwrap(), Sshd::start().unwrap());
    let wrong = d2.dir().join("wrong_known_hosts");
    d2.write_known_hosts(&wrong, &d2.other_host_key().unwrap())
        .unwrap();
    let standby = {
        let (h, file) = &bed.sms[1];
        let mut c = ssh_config(&d2, true);
        c.known_hosts_file = wrong;
        SshSm::new(
            h.name.clone(),
            weft_fabric::Guid(h.port_guid),
            c,
            RemotePaths {
                partitions_file: file.clone(),
                pid_file: h.pid_file.clone(),
                log_file: h.log_file.clone(),
            },
        )
        .unwrap()
    };
    let direct = standby.write_partitions(b"nope\n").unwrap_err();
    assert!(
        matches!(&direct, SmError::HostKey { sm, .. } if sm == "standby"),
        "{direct}"
    );
    assert!(!direct.is_unreachable());
    let a = bed.ssh_applier(vec![bed.ssh_sm(0, &d1, true), standby]);
    let snap = a.diag.snapshot().unwrap();
    let conf = compile(TWO_TENANTS, &snap.inventory);
    let err = a.apply(&conf, &snap).unwrap_err();
    assert!(
        matches!(&err, ApplyError::Sm(SmError::HostKey { .. })),
        "{err}"
    );
    let text = err.to_string();
    assert!(
        text.contains("host-key verification failed") && text.contains("standby"),
        "{text}"
    );
    assert!(text.contains(&format!("127.0.0.1:{}", d2.port())), "{text}");
    for (_, file) in &bed.sms {
        assert_eq!(std::fs::read_to_string(file).unwrap(), OPEN);
        assert!(temps_in(file.parent().unwrap()).is_empty());
    }
    // The sshd never let the mismatched client in.
    assert!(!d2.log().contains("Accepted publickey"), "{}", d2.log());
}

/// The standby's host goes down (sshd and its sessions killed) after a first apply over
/// multiplexed connections: the next apply updates and verifies the master, does not
/// hang, and reports the standby as degraded. A retry once the host is back brings the
/// standby in line.
#[test]
fn a_standby_host_that_is_down_leaves_the_apply_degraded_and_a_retry_heals_it() {
    let bed = bed(&Topology::single_switch(4), true);
    let (d1, mut d2) = (Sshd::start().unwrap(), Sshd::start().unwrap());
    let a = bed.ssh_applier(vec![bed.ssh_sm(0, &d1, true), bed.ssh_sm(1, &d2, true)]);
    let snap = a.diag.snapshot().unwrap();
    a.apply(&compile(TWO_TENANTS, &snap.inventory), &snap)
        .unwrap();

    d2.kill().unwrap();
    let before = a.diag.snapshot().unwrap();
    // node2 and node4 swap tenants.
    let moved = compile(
        &TWO_TENANTS
            .replace("{ node = \"node2\" }", "{ node = \"node4\" }")
            .replace(
                "{ node = \"node4\", membership = \"limited\" }",
                "{ node = \"node2\", membership = \"limited\" }",
            ),
        &before.inventory,
    );
    let start = Instant::now();
    let report = a.apply(&moved, &before).unwrap();
    let took = start.elapsed();
    assert_eq!(report.degraded, vec!["standby".to_string()], "{report:?}");
    assert!(took < Duration::from_secs(10), "took {took:?}");
    let standby = report.sms.iter().find(|s| s.name == "standby").unwrap();
    assert!(
        standby.checksum.is_none()
            && standby
                .error
                .as_deref()
                .is_some_and(|e| e.contains("unreachable")),
        "{standby:?}"
    );
    let text = conf::render(&moved);
    assert_eq!(std::fs::read_to_string(&bed.sms[0].1).unwrap(), text);
    assert_ne!(std::fs::read_to_string(&bed.sms[1].1).unwrap(), text);
    assert!(a.verify(&moved).unwrap().mismatches.is_empty());

    // The host is back (a new sshd, as after a reboot): the retry brings the standby in.
    let d2 = Sshd::start().unwrap();
    let a = bed.ssh_applier(vec![bed.ssh_sm(0, &d1, true), bed.ssh_sm(1, &d2, true)]);
    let now = a.diag.snapshot().unwrap();
    let report = a.apply(&moved, &now).unwrap();
    assert!(report.changed && report.degraded.is_empty(), "{report:?}");
    assert_eq!(std::fs::read_to_string(&bed.sms[1].1).unwrap(), text);
}

/// The master's host is down: the apply fails within its bounds, names the SM and the
/// host, and leaves the standby's file as it was.
#[test]
fn a_master_host_that_is_down_fails_the_apply_within_the_bound() {
    let bed = bed(&Topology::single_switch(4), true);
    let (mut d1, d2) = (Sshd::start().unwrap(), Sshd::start().unwrap());
    let a = bed.ssh_applier(vec![bed.ssh_sm(0, &d1, true), bed.ssh_sm(1, &d2, true)]);
    let snap = a.diag.snapshot().unwrap();
    let conf = compile(TWO_TENANTS, &snap.inventory);
    d1.kill().unwrap();
    let start = Instant::now();
    let err = a.apply(&conf, &snap).unwrap_err();
    assert!(start.elapsed() < Duration::from_secs(10), "{err}");
    let text = err.to_string();
    assert!(
        text.contains("primary") && text.contains("unreachable"),
        "{text}"
    );
    assert!(text.contains(&format!("127.0.0.1:{}", d1.port())), "{text}");
    assert_eq!(std::fs::read_to_string(&bed.sms[1].1).unwrap(), OPEN);
}

/// The remote side of every `SmHost` operation, against a plain directory (no fabric):
/// the same answers as `LocalSm`, for paths a shell would misread unquoted.
#[test]
fn every_remote_operation_answers_like_the_local_one() {
    let sshd = Sshd::start().unwrap();
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path().join("it's a $(dir) `x`");
    std::fs::create_dir(&dir).unwrap();
    let paths = RemotePaths {
        partitions_file: dir.join("partitions.conf"),
        pid_file: dir.join("opensm.pid"),
        log_file: dir.join("osm log"),
    };
    let sm = SshSm::new(
        "t",
        weft_fabric::Guid(1),
        ssh_config(&sshd, true),
        paths.clone(),
    )
    .unwrap();

    assert_eq!(sm.read_partitions().unwrap(), None);
    sm.write_partitions(b"one\n").unwrap();
    let bytes: Vec<u8> = (0..=255u8).collect();
    sm.write_partitions(&bytes).unwrap();
    assert_eq!(sm.read_partitions().unwrap(), Some(bytes.clone()));
    assert_eq!(std::fs::read(&paths.partitions_file).unwrap(), bytes);
    assert!(temps_in(&dir).is_empty());
    sm.write_partitions(b"").unwrap();
    assert_eq!(sm.read_partitions().unwrap(), Some(Vec::new()));
    sm.remove_partitions().unwrap();
    sm.remove_partitions().unwrap();
    assert_eq!(sm.read_partitions().unwrap(), None);

    // No pid file: the reread says the SM is not running, naming the host.
    let err = sm.request_reread().unwrap_err();
    assert!(matches!(err, SmError::NotRunning { .. }), "{err}");
    assert!(err.to_string().contains("127.0.0.1"), "{err}");

    // The log: only lines after the cursor count; a rejected file fails fast; a dead SM
    // is an error, not a hang.
    assert_eq!(sm.log_cursor().unwrap(), 0);
    std::fs::write(&paths.pid_file, format!("{}\n", std::process::id())).unwrap();
    std::fs::write(&paths.log_file, "x 0x02 -> SUBNET UP\n").unwrap();
    let cursor = sm.log_cursor().unwrap();
    assert_eq!(cursor, 20);
    let err = sm
        .wait_for_sweep(cursor, Duration::from_millis(300))
        .unwrap_err();
    assert!(matches!(err, SmError::SweepTimeout { .. }), "{err}");
    {
        use std::io::Write as _;
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&paths.log_file)
            .unwrap();
        write!(f, "y 0x02 -> SUBNET").unwrap();
        f.flush().unwrap();
        let err = sm
            .wait_for_sweep(cursor, Duration::from_millis(300))
            .unwrap_err();
        assert!(
            matches!(err, SmError::SweepTimeout { .. }),
            "half a line: {err}"
        );
        writeln!(f, " UP").unwrap();
    }
    sm.wait_for_sweep(cursor, Duration::from_secs(5)).unwrap();
    std::fs::write(
        &paths.log_file,
        "PARSE ERROR: line 3: bad PortGUID\nSUBNET UP\n",
    )
    .unwrap();
    let err = sm.wait_for_sweep(0, Duration::from_secs(5)).unwrap_err();
    assert!(
        matches!(&err, SmError::ConfigRejected { line, .. } if line.contains("line 3")),
        "{err}"
    );
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let pid = child.id();
    child.wait().unwrap();
    std::fs::write(&paths.pid_file, pid.to_string()).unwrap();
    std::fs::write(&paths.log_file, "").unwrap();
    let start = Instant::now();
    let err = sm.wait_for_sweep(0, Duration::from_secs(5)).unwrap_err();
    assert!(matches!(err, SmError::DiedDuringSweep { .. }), "{err}");
    assert!(start.elapsed() < Duration::from_secs(3));

    // Reread signals the pid in the pid file (here: a sleeping child of the test).
    let mut sleeper = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    std::fs::write(&paths.pid_file, format!("{}\n", sleeper.id())).unwrap();
    sm.request_reread().unwrap();
    let status = sleeper.wait().unwrap();
    use std::os::unix::process::ExitStatusExt as _;
    assert_eq!(status.signal(), Some(weft_testbed::Signal::SIGHUP as i32));
}

/// kill -9 of the ssh client in the middle of a large write: the remote script sees its
/// input end short, refuses it by length and checksum and removes its temporary file; the
/// target stays whole (the old file). The client runs behind a wrapper that passes the
/// first 64 KiB through a FIFO and then stalls, so the kill lands mid-write every time. (A
/// background job's stdin is /dev/null unless redirected: hence `exec 3<&0` and `<&3`.)
#[test]
fn killing_the_ssh_client_mid_write_never_leaves_a_partial_file() {
    let sshd = Sshd::start().unwrap();
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path().join("etc");
    std::fs::create_dir(&dir).unwrap();
    let paths = RemotePaths {
        partitions_file: dir.join("partitions.conf"),
        pid_file: dir.join("opensm.pid"),
        log_file: dir.join("osm.log"),
    };
    std::fs::write(&paths.partitions_file, OPEN).unwrap();
    let pid_file = scratch.path().join("ssh.pid");
    let wrapper = scratch.path().join("stalling-ssh");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\n\
             echo $$ > '{pid}'\n\
             mkfifo '{fifo}'\n\
             exec 3<&0\n\
             ( head -c 65536; sleep 20; cat ) <&3 >'{fifo}' 2>/dev/null &\n\
             exec ssh \"$@\" <'{fifo}'\n",
            pid = pid_file.display(),
            fifo = scratch.path().join("fifo").display(),
        ),
    )
    .unwrap();
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let mut c = ssh_config(&sshd, false);
    c.ssh_program = wrapper.to_string_lossy().into_owned();
    c.command_timeout = Duration::from_secs(15);
    let sm = SshSm::new("t", weft_fabric::Guid(1), c, paths.clone()).unwrap();
    let big: Vec<u8> = b"0123456789abcdef\n".repeat(1 << 20);

    let start = Instant::now();
    let result = std::thread::scope(|s| {
        let writer = s.spawn(|| sm.write_partitions(&big));
        // Kill the client once its first bytes have landed in the remote temp file.
        let deadline = Instant::now() + Duration::from_secs(12);
        let mut killed = false;
        while !killed && Instant::now() < deadline && !writer.is_finished() {
            let landing = temps_in(&dir)
                .iter()
                .any(|t| std::fs::metadata(t).is_ok_and(|m| m.len() > 0));
            if landing && let Ok(pid) = std::fs::read_to_string(&pid_file) {
                let pid: i32 = pid.trim().parse().unwrap();
                nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                )
                .unwrap();
                killed = true;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        assert!(killed, "the write never started landing");
        writer.join().unwrap()
    });
    let err = result.unwrap_err();
    assert!(err.to_string().contains("write"), "{err}");
    assert!(start.elapsed() < Duration::from_secs(12), "{err}");
    assert_eq!(
        std::fs::read(&paths.partitions_file).unwrap(),
        OPEN.as_bytes()
    );
    // The remote script removes its temporary file when its input ends short.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !temps_in(&dir).is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(temps_in(&dir).is_empty(), "{:?}", temps_in(&dir));
    assert_eq!(
        std::fs::read(&paths.partitions_file).unwrap(),
        OPEN.as_bytes()
    );
}

/// With a scope of `All` the standby's unreachability is still only a degradation; the
/// apply's own bound holds when the host does not answer at all (a stopped sshd).
#[test]
fn a_standby_host_that_hangs_is_bounded_by_the_command_timeout() {
    let bed = bed(&Topology::single_switch(4), true);
    let (d1, d2) = (Sshd::start().unwrap(), Sshd::start().unwrap());
    let mut standby_cfg = bed.ssh_sm(1, &d2, false);
    // Rebuild the standby with short bounds.
    {
        let mut c = standby_cfg.ssh().clone();
        c.connect_timeout = Duration::from_secs(1);
        c.command_timeout = Duration::from_secs(2);
        standby_cfg = SshSm::new(
            "standby",
            standby_cfg.port_guid(),
            c,
            standby_cfg.paths().clone(),
        )
        .unwrap();
    }
    let mut a = bed.ssh_applier(vec![bed.ssh_sm(0, &d1, true), standby_cfg]);
    a.verify_scope = VerifyScope::All;
    let snap = a.diag.snapshot().unwrap();
    let conf = compile(TWO_TENANTS, &snap.inventory);
    // A stopped sshd accepts TCP connections (the kernel's backlog) but never answers.
    let pid = nix::unistd::Pid::from_raw(d2.pid().unwrap() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
    let start = Instant::now();
    let result = a.apply(&conf, &snap);
    let took = start.elapsed();
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT).unwrap();
    let report = result.unwrap();
    assert_eq!(report.degraded, vec!["standby".to_string()], "{report:?}");
    // One bounded attempt (read of the previous file); the standby is not asked again.
    assert!(took < Duration::from_secs(8), "took {took:?}");
}

/// A remote account whose shell startup prints to stdout (a banner in ~/.bashrc; here a
/// client wrapper prints it, which reaches the parser the same way): the answers are
/// still exact, so a rollback can never write the banner into a partitions file.
#[test]
fn output_of_the_remote_shell_startup_is_not_taken_for_data() {
    let sshd = Sshd::start().unwrap();
    let scratch = tempfile::tempdir().unwrap();
    let wrapper = scratch.path().join("noisy-ssh");
    std::fs::write(
        &wrapper,
        "#!/bin/sh\nprintf 'Welcome to the SM host\\nFweft-answer-1\\n'\nexec ssh \"$@\"\n",
    )
    .unwrap();
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let mut c = ssh_config(&sshd, true);
    c.ssh_program = wrapper.to_string_lossy().into_owned();
    let paths = RemotePaths {
        partitions_file: scratch.path().join("partitions.conf"),
        pid_file: scratch.path().join("opensm.pid"),
        log_file: scratch.path().join("osm.log"),
    };
    let sm = SshSm::new("t", weft_fabric::Guid(1), c, paths).unwrap();
    assert_eq!(sm.read_partitions().unwrap(), None);
    sm.write_partitions(OPEN.as_bytes()).unwrap();
    assert_eq!(sm.read_partitions().unwrap().unwrap(), OPEN.as_bytes());
    assert_eq!(sm.log_cursor().unwrap(), 0);
}

/// The lock over SSH: one remote session holds flock(2) on the lock file beside the
/// partitions file; a second apply's lock (through another connection, and against a
/// local apply on the same host too) waits, then fails naming the holder; dropping the
/// holder, or killing the SSH client that holds it (a killed apply), frees it.
#[test]
fn the_lock_over_ssh_excludes_other_applies_and_ends_with_its_session() {
    use weft_opensm::LocalSm;
    let sshd = Sshd::start().unwrap();
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path().join("etc");
    std::fs::create_dir(&dir).unwrap();
    let paths = RemotePaths {
        partitions_file: dir.join("partitions.conf"),
        pid_file: dir.join("opensm.pid"),
        log_file: dir.join("osm.log"),
    };
    std::fs::write(&paths.partitions_file, OPEN).unwrap();
    let one = SshSm::new(
        "sm",
        weft_fabric::Guid(1),
        ssh_config(&sshd, true),
        paths.clone(),
    )
    .unwrap();
    let two = SshSm::new(
        "sm",
        weft_fabric::Guid(1),
        ssh_config(&sshd, false),
        paths.clone(),
    )
    .unwrap();
    let local = LocalSm {
        name: "sm".into(),
        port_guid: weft_fabric::Guid(1),
        partitions_file: paths.partitions_file.clone(),
        pid_file: paths.pid_file.clone(),
        log_file: paths.log_file.clone(),
    };
    let held = one
        .lock("weft apply first on host a, pid 1", Duration::from_secs(5))
        .unwrap();
    for (who, sm) in [
        ("ssh", &two as &dyn SmHost),
        ("local", &local as &dyn SmHost),
    ] {
        let start = Instant::now();
        let err = sm.lock("second", Duration::from_millis(300)).unwrap_err();
        assert!(
            matches!(&err, SmError::Locked { holder, .. } if holder.contains("first on host a")),
            "{who}: {err}"
        );
        assert!(
            start.elapsed() < Duration::from_secs(8),
            "{who}: {:?}",
            start.elapsed()
        );
    }
    // A waiter gets it once the holder lets go.
    std::thread::scope(|s| {
        let waiter = s.spawn(|| two.lock("third", Duration::from_secs(10)));
        std::thread::sleep(Duration::from_millis(300));
        drop(held);
        drop(waiter.join().unwrap().unwrap());
    });
    // A holder whose SSH client is killed (the apply killed with SIGKILL) frees it too.
    let pid_file = scratch.path().join("ssh.pid");
    let wrapper = scratch.path().join("recording-ssh");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\necho $$ > '{}'\nexec ssh \"$@\"\n",
            pid_file.display()
        ),
    )
    .unwrap();
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let mut c = ssh_config(&sshd, false);
    c.ssh_program = wrapper.to_string_lossy().into_owned();
    let three = SshSm::new("sm", weft_fabric::Guid(1), c, paths.clone()).unwrap();
    let held = three.lock("fourth", Duration::from_secs(5)).unwrap();
    let pid: i32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    local.lock("fifth", Duration::from_secs(10)).unwrap();
    drop(held);
    assert_eq!(
        std::fs::read(&paths.partitions_file).unwrap(),
        OPEN.as_bytes()
    );
}

/// Fencing over SSH: a delivery is stamped, and one older than what an SM's file holds
/// (a lower fencing number, or the same number and a newer generation the store never
/// wrote) is refused under the SMs' locks, naming the SM and both stamps, with every file
/// left as it was; the writer's own file in flight, and a higher number, go through.
#[test]
fn an_older_stamp_is_refused_over_ssh_naming_both_and_nothing_is_written() {
    use weft_opensm::{Fence, Stamp};
    let bed = bed(&Topology::single_switch(4), true);
    let (d1, d2) = (Sshd::start().unwrap(), Sshd::start().unwrap());
    let a = bed.ssh_applier(vec![bed.ssh_sm(0, &d1, false), bed.ssh_sm(1, &d2, false)]);
    let snap = a.diag.snapshot().unwrap();
    let conf = compile(TWO_TENANTS, &snap.inventory);
    let fence = |fencing, generation, applied, in_flight: Vec<String>| Fence {
        stamp: Stamp {
            fencing,
            generation,
        },
        applied,
        in_flight,
        until: None,
    };
    a.apply_fenced(&conf, &snap, "controller abc", &fence(2, 5, 4, vec![]))
        .unwrap();
    let held: Vec<String> = bed
        .sms
        .iter()
        .map(|(_, f)| std::fs::read_to_string(f).unwrap())
        .collect();
    assert!(
        held[0].contains("# weft-fence: fencing 2 generation 5"),
        "{}",
        held[0]
    );
    let open = conf::parse(OPEN).unwrap();
    for (f, words) in [
        (
            fence(1, 50, 50, vec![]),
            ["fencing 2 generation 5", "fencing 1 generation 50"],
        ),
        (
            fence(2, 9, 3, vec![]),
            ["fencing 2 generation 5", "restore"],
        ),
    ] {
        let e = a
            .apply_fenced(&open, &snap, "controller abc", &f)
            .unwrap_err();
        let text = e.to_string();
        assert!(matches!(e, ApplyError::Fenced { .. }), "{text}");
        assert!(
            text.contains("primary") || text.contains("standby"),
            "{text}"
        );
        for w in words {
            assert!(text.contains(w), "{text}");
        }
        for ((_, file), before) in bed.sms.iter().zip(&held) {
            assert_eq!(&std::fs::read_to_string(file).unwrap(), before);
        }
    }
    // Its own file in flight (killed before it was recorded as verified) is replaced.
    let mine = checksum(held[0].as_bytes());
    a.apply_fenced(&open, &snap, "controller abc", &fence(2, 9, 3, vec![mine]))
        .unwrap();
    // A higher fencing number replaces whatever generation.
    a.apply_fenced(&conf, &snap, "controller abc", &fence(3, 1, 0, vec![]))
        .unwrap();
    assert!(
        std::fs::read_to_string(&bed.sms[1].1)
            .unwrap()
            .contains("# weft-fence: fencing 3 generation 1")
    );
}
