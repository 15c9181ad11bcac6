//! `weft run torchrun` across 3 namespace hosts over real SSH: a real PyTorch DDP job on
//! CPU (gloo), whose ranks check that gloo's connections run between the data addresses
//! (and the rendezvous on management) and that an all-reduce gives the right sum; one rank
//! made to fail stops the others and is named; Ctrl-C stops every node and leaves no
//! process; a host with another torch version is refused before anything starts. The skew
//! is faked: host 2's sshd sets `PYTHONPATH` to a directory where the test puts a stand-in
//! `torch` package that only declares `__version__`.

use std::time::{Duration, Instant};

use super::{SshCluster, processes_with};
use crate::text;

const DDP: &str = r#"
import datetime, os, socket, sys, time
import torch, torch.distributed as dist

mode, marker = sys.argv[1], sys.argv[2]
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
r, w = dist.get_rank(), dist.get_world_size()
if mode == "fail":
    if r == 1:
        print("rank 1 fails on purpose", flush=True)
        sys.exit(3)
    time.sleep(600)  # the others hang, as ranks waiting for a dead peer do
if mode == "sleep":
    open(os.path.join(marker, "ready.%d" % r), "w").write(str(os.getpid()))
    print("READY", flush=True)
    time.sleep(600)
t = torch.tensor([float(r + 1)])
dist.all_reduce(t)

def addr(h):
    ip, port = h.split(":")
    return socket.inet_ntoa(bytes.fromhex(ip)[::-1]), int(port, 16)

inodes = set()
for fd in os.listdir("/proc/self/fd"):
    try:
        l = os.readlink("/proc/self/fd/" + fd)
    except OSError:
        continue
    if l.startswith("socket:["):
        inodes.add(l[8:-1])
master = os.environ["MASTER_ADDR"]
local, peers = set(), set()
for line in open("/proc/self/net/tcp").readlines()[1:]:
    f = line.split()
    if f[9] in inodes and f[3] == "01":
        (la, _), (ra, _) = addr(f[1]), addr(f[2])
        if master in (la, ra):
            continue  # the rendezvous store, on management
        local.add(la)
        peers.add(ra)
print("RANK %d SUM %s GLOO %s LOCAL %s PEERS %d" % (r, t.item(), os.environ["GLOO_SOCKET_IFNAME"], ",".join(sorted(local)), len(peers)), flush=True)
ok = t.item() == w * (w + 1) / 2 and local == {os.environ["VLLM_HOST_IP"]} and len(peers) == w - 1
sys.exit(0 if ok else 4)
"#;

#[test]
fn torchrun_ddp_over_gloo_on_the_data_network_failures_interrupts_and_version_skew() {
    // The python3 on this PATH with torch (cargo xtask deps installs it from PyPI); the
    // hosts' sessions get the same one by absolute path.
    let o = std::process::Command::new("python3")
        .args(["-c", "import sys, torch; print(sys.executable)"])
        .output()
        .expect("python3 runs");
    assert!(
        o.status.success(),
        "this test needs PyTorch for python3 (cargo xtask deps: pip install torch): {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let python = String::from_utf8_lossy(&o.stdout).trim().to_string();
    let torchrun = std::path::Path::new(&python).with_file_name("torchrun");
    assert!(torchrun.exists(), "{} missing", torchrun.display());
    let torchrun = torchrun.display().to_string();
    let shim = tempfile::tempdir().unwrap();
    let shim_s = shim.path().display().to_string();
    let env2 = vec![("PYTHONPATH".to_string(), shim_s.clone())];
    let sc = SshCluster::start(3, vec![vec![], vec![], env2]);
    let script = sc.path("ddp.py");
    std::fs::write(&script, DDP).unwrap();
    let marker = sc.path("marker");
    std::fs::create_dir_all(&marker).unwrap();
    let script_s = script.display().to_string();
    let marker_s = marker.display().to_string();
    // The version check (an `import torch` on every host) runs for the first job and the
    // skewed one; the others skip it to keep the test short.
    let job = |mode: &str| -> Vec<String> {
        let mut a = vec!["run".to_string()];
        a.extend(sc.host_args(&sc.names));
        if mode == "fail" || mode == "sleep-unchecked" {
            a.push("--no-version-check".into());
        }
        let mode = if mode == "sleep-unchecked" {
            "sleep"
        } else {
            mode
        };
        a.extend([
            "--grace-s".into(),
            "3".into(),
            "--nccl".into(),
            "socket".into(),
            "--python".into(),
            python.clone(),
        ]);
        a.extend([
            "--".into(),
            torchrun.clone(),
            script_s.clone(),
            mode.into(),
            marker_s.clone(),
        ]);
        a
    };
    let nothing_left = || {
        let t0 = Instant::now();
        loop {
            let left = processes_with(&[&script_s]);
            if left.is_empty() {
                return;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "processes left: {left:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    };

    // The job: every rank's sum is right and its gloo sockets are on its data address.
    let t0 = Instant::now();
    let o = sc.weft(&job("ok")).output().unwrap();
    let t = text(&o);
    eprintln!("DDP job on 3 hosts: {:?}", t0.elapsed());
    assert_eq!(o.status.code(), Some(0), "{t}");
    for (i, h) in sc.c.hosts().iter().enumerate() {
        let want = format!(
            "[{} n{i}] RANK {i} SUM 6.0 GLOO data0 LOCAL {} PEERS 2",
            h.name, h.data_ifs[0].1
        );
        assert!(t.contains(&want), "{want}\n{t}");
    }
    nothing_left();

    // Rank 1 exits 3 after init; the others, hanging, are stopped.
    let t0 = Instant::now();
    let o = sc.weft(&job("fail")).output().unwrap();
    let t = text(&o);
    assert_eq!(o.status.code(), Some(1), "{t}");
    assert!(
        t.contains(&format!("FAIL node 1 ({}) exited first with", sc.names[1])),
        "{t}"
    );
    assert!(t.contains("rank 1 fails on purpose"), "its last lines: {t}");
    assert!(t0.elapsed() < Duration::from_secs(90), "{:?}", t0.elapsed());
    nothing_left();

    // Ctrl-C while every rank sleeps: every node stops, nothing is left.
    let child = sc
        .weft(&job("sleep-unchecked"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while (0..3).any(|r| !marker.join(format!("ready.{r}")).exists()) {
        assert!(
            t0.elapsed() < Duration::from_secs(90),
            "ranks never got ready"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(!processes_with(&[&script_s]).is_empty());
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let t1 = Instant::now();
    let o = child.wait_with_output().unwrap();
    let t = text(&o);
    assert_eq!(o.status.code(), Some(1), "{t}");
    assert!(t.contains("interrupted: every node stopped"), "{t}");
    assert!(t1.elapsed() < Duration::from_secs(20), "{:?}", t1.elapsed());
    nothing_left();

    // Host 2 has another torch: refused before launch, nothing started.
    std::fs::create_dir_all(shim.path().join("torch")).unwrap();
    std::fs::write(
        shim.path().join("torch/__init__.py"),
        "__version__ = '0.0.1+shim'\n",
    )
    .unwrap();
    for r in 0..3 {
        let _ = std::fs::remove_file(marker.join(format!("ready.{r}")));
    }
    let o = sc.weft(&job("sleep")).output().unwrap();
    let t = text(&o);
    assert_eq!(o.status.code(), Some(1), "{t}");
    assert!(
        t.contains(&format!(
            "FAIL {} [versions]: torch 0.0.1+shim",
            sc.names[2]
        )),
        "{t}"
    );
    assert!(t.contains("nothing launched"), "{t}");
    assert!((0..3).all(|r| !marker.join(format!("ready.{r}")).exists()));
    assert!(processes_with(&[&script_s]).is_empty());

    // A hang: rank 1 stops printing after its NCCL line while the others go on; it is named
    // with that line, and everything is stopped.
    shim.close().unwrap();
    let mut a = vec!["run".to_string()];
    a.extend(sc.host_args(&sc.names));
    a.extend(
        [
            "--no-version-check",
            "--stall-timeout",
            "3",
            "--grace-s",
            "2",
            "--",
            "sh",
            "-c",
        ]
        .map(String::from),
    );
    a.push(format!(
        "echo 'NCCL INFO comm 0x1 rank '$RANK' init'; if [ $RANK = 1 ]; then sleep 100 # {marker_s}\nfi; while :; do echo tick; sleep 0.5; done # {marker_s}"
    ));
    let o = sc.weft(&a).output().unwrap();
    let t = text(&o);
    assert_eq!(o.status.code(), Some(1), "{t}");
    assert!(
        t.contains(&format!(
            "STALL node 1 ({}): nothing printed for 3 s; last line: NCCL INFO comm 0x1 rank 1 init",
            sc.names[1]
        )),
        "{t}"
    );
    assert!(!t.contains("STALL node 0"), "{t}");
    let t0 = Instant::now();
    while !processes_with(&[&marker_s]).is_empty() {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "{:?}",
            processes_with(&[&marker_s])
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Issue 34: a frozen rank among three namespace hosts over real SSH. Each rank prints a
/// step, leaves a file for it and waits for every rank's file of that step, as ranks wait in
/// a collective; rank 1 stops itself (SIGSTOP) at step 4. All three go quiet together, so
/// silence alone names them all; `--stall-timeout` names rank 1 as the one that froze first,
/// from its process state (T) on its node, with its last line, and stops everything (the
/// stopped shell too).
#[test]
fn stall_timeout_names_the_frozen_rank_among_three_namespace_hosts() {
    let sc = SshCluster::start(3, Vec::new());
    let steps = sc.path("steps");
    std::fs::create_dir_all(&steps).unwrap();
    let d = steps.display().to_string();
    let mut a = vec!["run".to_string()];
    a.extend(sc.host_args(&sc.names));
    a.extend(
        [
            "--no-version-check",
            "--stall-timeout",
            "3",
            "--grace-s",
            "2",
            "--json",
            "--",
            "sh",
            "-c",
        ]
        .map(String::from),
    );
    a.push(format!(
        "d={d}; i=0; while :; do echo \"step $i\"; if [ $RANK = 1 ] && [ $i = 4 ]; then kill -STOP $$; fi; : > $d/s.$RANK.$i; for r in 0 1 2; do while [ ! -e $d/s.$r.$i ]; do sleep 0.02; done; done; i=$((i+1)); sleep 0.1; done"
    ));
    let o = sc.weft(&a).output().unwrap();
    let t = text(&o);
    assert_eq!(o.status.code(), Some(1), "{t}");
    let v: serde_json::Value =
        serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {t}"));
    let s = &v["suspect"];
    assert_eq!(s["node_rank"], 1, "{t}");
    assert_eq!(s["host"], sc.names[1].as_str(), "{t}");
    assert_eq!(s["kind"], "stopped", "{t}");
    assert!(s["why"].as_str().unwrap().contains("T (stopped)"), "{t}");
    assert_eq!(s["last_line"], "step 4", "{t}");
    // The others were stalled too, waiting for it.
    assert!(!v["stalled"].as_array().unwrap().is_empty(), "{t}");
    let t0 = Instant::now();
    while !processes_with(&[&d]).is_empty() {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "{:?}",
            processes_with(&[&d])
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}
