//! `weft sync` from host 0 to hosts 1..=4 over data links limited to 1 Gbit/s each: every
//! file equal (checked here by hashing the copies independently of weft's report); a byte
//! changed on one host is found and only its chunk resent; a kill -9 midway leaves no helper
//! behind and the re-run resumes (sends less than everything); a host whose data link is
//! down is skipped and named while the others complete.

use std::path::Path;
use std::time::{Duration, Instant};

use weft_launch::manifest::{CHUNK, Manifest};
use weft_netns::{Cluster, ClusterSpec, Shape};

use super::{need_netns, processes_with, weft_in, weft_in_cmd};
use crate::text;

/// A model-like directory: one large file (last in order), some medium, many small ones.
fn make_source(dir: &Path, large_mib: usize) -> u64 {
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut bytes = |n: usize| {
        let mut v = Vec::with_capacity(n);
        while v.len() < n {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            v.extend_from_slice(&seed.to_le_bytes());
        }
        v.truncate(n);
        v
    };
    std::fs::create_dir_all(dir.join("tokenizer")).unwrap();
    let mut total = 0u64;
    for i in 0..150 {
        let b = bytes(512 + i * 37);
        total += b.len() as u64;
        std::fs::write(dir.join(format!("tokenizer/piece-{i:03}.json")), b).unwrap();
    }
    std::fs::write(dir.join("tokenizer/empty"), b"").unwrap();
    for i in 0..6 {
        let b = bytes((1 << 20) + i * 4099);
        total += b.len() as u64;
        std::fs::write(dir.join(format!("model-0000{i}-of-00006.safetensors")), b).unwrap();
    }
    let b = bytes((large_mib << 20) + 12345);
    total += b.len() as u64;
    std::fs::write(dir.join("zz-large.bin"), b).unwrap();
    total
}

fn json(o: &std::process::Output) -> serde_json::Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("no JSON ({e}): {}", text(o)))
}

fn node<'a>(v: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    v["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["name"] == name)
        .unwrap_or_else(|| panic!("{name} not in {v:#}"))
}

fn dir_bytes(d: &Path) -> u64 {
    let mut n = 0;
    // Files are renamed while we look: what vanished is counted on the next poll.
    for e in std::fs::read_dir(d).into_iter().flatten().flatten() {
        let Ok(m) = e.metadata() else { continue };
        n += if m.is_dir() {
            dir_bytes(&e.path())
        } else {
            m.len()
        };
    }
    n
}

#[test]
fn sync_to_four_hosts_resumes_finds_changes_and_routes_around_a_dead_host() {
    need_netns();
    let c = Cluster::create(&ClusterSpec::new(5, 1)).expect("cluster");
    for i in 0..5 {
        c.shape(i, "data0", &Shape::rate("1gbit")).expect("tc");
    }
    let names: Vec<String> = c.hosts().iter().map(|h| h.name.clone()).collect();
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    let total = make_source(&src, 40);
    let dest = tmp.path().join("dst");
    let dest_t = format!("{}/{{host}}/model", dest.display());
    let hosts = names[1..].join(",");
    let src_s = src.display().to_string();
    let args = |json: bool| {
        let mut v = vec![
            "sync",
            &src_s,
            "--hosts",
            &hosts,
            "--via",
            "netns",
            "--dest",
            &dest_t,
            "--data-if",
            "=data0",
            "--mgmt-if",
            "=mgmt0",
            "--timeout",
            "10",
        ];
        if json {
            v.push("--json");
        }
        v
    };
    let want = Manifest::scan(&src, CHUNK).unwrap();
    let copies_equal = |hs: &[&String]| {
        for h in hs {
            let got = Manifest::scan(&dest.join(h.as_str()).join("model"), CHUNK).unwrap();
            assert_eq!(got, want, "{h}");
        }
    };

    // From nothing: every host gets everything, the source sends it once.
    let t0 = Instant::now();
    let o = weft_in(&names[0], &args(true));
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let v = json(&o);
    eprintln!(
        "first sync of {total} bytes to 4 hosts: {:?} (data phase {} s)",
        t0.elapsed(),
        v["transfer_s"]
    );
    assert_eq!(v["bytes_sent"].as_u64(), Some(total), "{v:#}");
    assert_eq!(v["mismatches"].as_array().unwrap().len(), 0);
    for h in &names[1..] {
        assert_eq!(node(&v, h)["status"], "ok", "{v:#}");
        assert_eq!(node(&v, h)["bytes_written"].as_u64(), Some(total), "{v:#}");
    }
    copies_equal(&names[1..].iter().collect::<Vec<_>>());
    // Each host's data link carried about one copy: the chain, not a star from the source.
    let (_, tx0) = c.counters(0, "data0").unwrap();
    assert!(tx0 < total * 13 / 10, "source sent {tx0} bytes for {total}");

    // A byte changed on host 3: the re-run finds that file and resends only its chunk.
    let victim = dest.join(&names[3]).join("model/zz-large.bin");
    let mut b = std::fs::read(&victim).unwrap();
    b[5 << 20] ^= 0xff;
    std::fs::write(&victim, b).unwrap();
    let o = weft_in(&names[0], &args(false));
    let t = text(&o);
    assert_eq!(o.status.code(), Some(0), "{t}");
    assert!(t.contains("zz-large.bin"), "the changed file is named: {t}");
    assert!(t.contains("sent 4.0 MiB"), "one chunk resent: {t}");
    copies_equal(&[&names[3]]);

    // kill -9 midway; no helper is left; the re-run resumes.
    for h in &names[1..] {
        std::fs::remove_dir_all(dest.join(h)).unwrap();
    }
    let mut child = weft_in_cmd(&names[0], &args(true))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let last = dest.join(&names[4]);
    let t0 = Instant::now();
    while dir_bytes(&last) < total / 3 {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "no progress on the last host"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap();
    let _ = child.wait();
    let marker = dest.display().to_string();
    let t0 = Instant::now();
    loop {
        let left = processes_with(&["sync-serve", &marker]);
        if left.is_empty() {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "helpers left after kill -9: {left:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let o = weft_in(&names[0], &args(true));
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let v = json(&o);
    let resent = v["bytes_sent"].as_u64().unwrap();
    eprintln!(
        "after kill -9 at >= 1/3 on the last host, the re-run sent {resent} of {total} bytes"
    );
    assert!(resent > 0 && resent < total * 3 / 4, "{v:#}");
    copies_equal(&names[1..].iter().collect::<Vec<_>>());

    // Host 2's data link is down: it is skipped and named; the others still complete.
    std::fs::write(src.join("added.txt"), b"one more file").unwrap();
    c.set_link(2, "data0", false).unwrap();
    let o = weft_in(&names[0], &args(true));
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let v = json(&o);
    assert_eq!(node(&v, &names[2])["status"], "unreachable", "{v:#}");
    assert!(
        node(&v, &names[2])["error"]
            .as_str()
            .unwrap()
            .contains("connect"),
        "{v:#}"
    );
    for h in [&names[1], &names[3], &names[4]] {
        assert_eq!(node(&v, h)["status"], "ok", "{v:#}");
        assert!(dest.join(h.as_str()).join("model/added.txt").exists());
    }
    assert!(processes_with(&["sync-serve", &marker]).is_empty());
}

/// Kills a child by its pid when dropped.
struct Daemon(std::process::Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The benchmark of docs/benchmarks.md: `weft sync` to 4 hosts against one copy to one host,
/// rsync to the 4 hosts one after another and rsync to all 4 at once from the source (rsync
/// daemons on the hosts' data addresses, so that no SSH cipher is in rsync's way), every
/// data link limited to 1 Gbit/s (WEFT_SYNC_BENCH_RATE, tc syntax), in the same run. Size:
/// WEFT_SYNC_BENCH_MIB (default 256). WEFT_SYNC_BENCH_RUNS rounds of the four (default 1),
/// interleaved, and the medians; WEFT_SYNC_BENCH_WEFT: the `weft` binary to measure (a
/// release build; default the one this test was built with).
#[test]
#[ignore = "benchmark: a few minutes of wall time; run by hand (docs/benchmarks.md)"]
fn sync_benchmark_against_rsync() {
    need_netns();
    assert!(
        Path::new("/usr/bin/rsync").exists(),
        "install rsync (cargo xtask deps)"
    );
    let env_num = |k: &str, d: usize| {
        std::env::var(k)
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(d)
    };
    let mib = env_num("WEFT_SYNC_BENCH_MIB", 256);
    let runs = env_num("WEFT_SYNC_BENCH_RUNS", 1).max(1);
    let rate = std::env::var("WEFT_SYNC_BENCH_RATE").unwrap_or_else(|_| "1gbit".into());
    let exe = std::env::var("WEFT_SYNC_BENCH_WEFT")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_weft").to_string());
    let loadavg = || {
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    };
    let load_before = loadavg();
    let c = Cluster::create(&ClusterSpec::new(5, 1)).expect("cluster");
    for i in 0..5 {
        c.shape(i, "data0", &Shape::rate(&rate)).expect("tc");
    }
    let names: Vec<String> = c.hosts().iter().map(|h| h.name.clone()).collect();
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    let total = make_source(&src, mib.saturating_sub(7).max(1));
    let src_s = src.display().to_string();
    // CPU seconds of the processes this test has waited for: `weft sync` reaps its helpers,
    // so a run's difference is the CPU of the whole chain (source and every node), a
    // per-byte cost that the machine's load changes far less than the wall time.
    let tick: f64 = std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(100.0);
    let children_cpu = || -> f64 {
        let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
        let after_comm = &stat[stat.rfind(')').unwrap() + 2..];
        // Fields 16 and 17 of stat(5) (cutime, cstime); after the comm, the 3rd is field 3.
        let f: Vec<&str> = after_comm.split_whitespace().collect();
        (f[13].parse::<f64>().unwrap() + f[14].parse::<f64>().unwrap()) / tick
    };
    let weft_sync = |hosts: &[String], tag: &str| -> (f64, f64) {
        let dest = format!("{}/{tag}/{{host}}", tmp.path().display());
        let _ = std::fs::remove_dir_all(tmp.path().join(tag));
        let hs = hosts.join(",");
        let cpu0 = children_cpu();
        let t0 = Instant::now();
        let o = std::process::Command::new("ip")
            .args(["netns", "exec", &names[0], &exe])
            .args([
                "sync",
                &src_s,
                "--hosts",
                &hs,
                "--via",
                "netns",
                "--dest",
                &dest,
                "--data-if",
                "=data0",
                "--mgmt-if",
                "=mgmt0",
                "--json",
            ])
            .env_remove("WEFT_CONFIG")
            .env_remove("WEFT_DATA_IFNAME")
            .env_remove("WEFT_MGMT_IFNAME")
            .output()
            .expect("weft runs");
        let t = t0.elapsed().as_secs_f64();
        let cpu = children_cpu() - cpu0;
        assert_eq!(o.status.code(), Some(0), "{}", text(&o));
        let v = json(&o);
        assert_eq!(v["bytes_sent"].as_u64(), Some(total), "{v:#}");
        eprintln!(
            "weft sync {tag}: {t:.2} s wall, data phase {} s, {cpu:.2} CPU s",
            v["transfer_s"]
        );
        (t, cpu)
    };
    // rsync daemons on hosts 1..=4, on their data addresses.
    let mut daemons = Vec::new();
    for i in 1..5 {
        let d = tmp.path().join(format!("rsyncd-{i}"));
        std::fs::create_dir_all(d.join("dst")).unwrap();
        let conf = d.join("rsyncd.conf");
        std::fs::write(
            &conf,
            format!(
                "pid file = {p}/pid\nuse chroot = false\n[m]\n  path = {p}/dst\n  read only = false\n  uid = root\n  gid = root\n",
                p = d.display()
            ),
        )
        .unwrap();
        let addr = c.host(i).data_ifs[0].1.to_string();
        let conf_s = conf.display().to_string();
        daemons.push(Daemon(
            c.spawn(
                i,
                "rsync",
                &[
                    "--daemon",
                    "--no-detach",
                    "--config",
                    &conf_s,
                    "--address",
                    &addr,
                    "--port",
                    "8730",
                ],
                &[],
            )
            .unwrap(),
        ));
    }
    std::thread::sleep(Duration::from_millis(500));
    let rsync_to = |i: usize| {
        let url = format!("rsync://{}:8730/m/", c.host(i).data_ifs[0].1);
        let o = c
            .exec(
                0,
                "rsync",
                &["-a", &format!("{src_s}/"), &url],
                Duration::from_secs(600),
            )
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    };
    let clear_rsync = || {
        for i in 1..5 {
            let d = tmp.path().join(format!("rsyncd-{i}/dst"));
            std::fs::remove_dir_all(&d).unwrap();
            std::fs::create_dir_all(&d).unwrap();
        }
    };

    let (mut ones, mut fours, mut seqs, mut pars) = (vec![], vec![], vec![], vec![]);
    let (mut cpu_ones, mut cpu_fours) = (vec![], vec![]);
    for run in 1..=runs {
        let (one, cpu_one) = weft_sync(&names[1..2], "one");
        let (four, cpu_four) = weft_sync(&names[1..], "four");
        cpu_ones.push(cpu_one);
        cpu_fours.push(cpu_four);
        clear_rsync();
        let t0 = Instant::now();
        for i in 1..5 {
            rsync_to(i);
        }
        let seq = t0.elapsed().as_secs_f64();
        clear_rsync();
        let t0 = Instant::now();
        std::thread::scope(|s| {
            for i in 1..5 {
                s.spawn(move || rsync_to(i));
            }
        });
        let par = t0.elapsed().as_secs_f64();
        eprintln!(
            "BENCH run {run}/{runs}, {} MiB, {rate} links: weft one host {one:.2} s; \
             weft 4 hosts {four:.2} s ({:.2}x one copy); rsync one by one {seq:.2} s ({:.2}x weft); \
             rsync all at once {par:.2} s ({:.2}x weft)",
            total >> 20,
            four / one,
            seq / four,
            par / four
        );
        ones.push(one);
        fours.push(four);
        seqs.push(seq);
        pars.push(par);
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (one, four, seq, par) = (
        median(&mut ones),
        median(&mut fours),
        median(&mut seqs),
        median(&mut pars),
    );
    let (cpu_one, cpu_four) = (median(&mut cpu_ones), median(&mut cpu_fours));
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    eprintln!(
        "BENCH medians of {runs}, {} MiB, {rate} links, {cpus} CPUs, load average {load_before} \
         before / {} after, weft {exe}: weft one host {one:.2} s; weft 4 hosts {four:.2} s \
         ({:.2}x one copy); rsync one by one {seq:.2} s ({:.2}x weft); rsync all at once \
         {par:.2} s ({:.2}x weft); CPU of the whole chain: one host {cpu_one:.2} s, \
         4 hosts {cpu_four:.2} s ({:.2} s per GiB per node beyond the first)",
        total >> 20,
        loadavg(),
        four / one,
        seq / four,
        par / four,
        (cpu_four - cpu_one) / 3.0 / (total as f64 / f64::from(1u32 << 30))
    );
    drop(daemons);
    assert!(
        four / one <= 1.25,
        "weft to 4 hosts took {:.2}x one copy",
        four / one
    );
}

/// A host killed in the middle of the stream (kill -9 of its `sync-serve` once the last
/// host holds a third of the data): the chain is routed around it, the hosts behind it
/// still end with every file, and the dead host is named with why, exit 1.
#[test]
fn sync_routes_around_a_host_killed_mid_stream_and_names_it() {
    need_netns();
    let c = Cluster::create(&ClusterSpec::new(5, 1)).expect("cluster");
    for i in 0..5 {
        c.shape(i, "data0", &Shape::rate("1gbit")).expect("tc");
    }
    let names: Vec<String> = c.hosts().iter().map(|h| h.name.clone()).collect();
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    let total = make_source(&src, 40);
    let dest = tmp.path().join("dst");
    let dest_t = format!("{}/{{host}}/model", dest.display());
    let hosts = names[1..].join(",");
    let src_s = src.display().to_string();
    let child = weft_in_cmd(
        &names[0],
        &[
            "sync",
            &src_s,
            "--hosts",
            &hosts,
            "--via",
            "netns",
            "--dest",
            &dest_t,
            "--data-if",
            "=data0",
            "--mgmt-if",
            "=mgmt0",
            "--timeout",
            "10",
            "--json",
        ],
    )
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped())
    .spawn()
    .unwrap();
    let last = dest.join(&names[4]);
    let t0 = Instant::now();
    while dir_bytes(&last) < total / 3 {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "no progress on the last host"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // Host 2, in the middle of the chain: its receiving side dies with kill -9.
    let victim_dest = dest.join(&names[2]).display().to_string();
    let pids = processes_with(&["sync-serve", &victim_dest]);
    assert!(!pids.is_empty(), "host 2's sync-serve is running");
    for p in &pids {
        let _ = std::process::Command::new("kill")
            .args(["-9", &p.to_string()])
            .status();
    }
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let v = json(&o);
    let dead = node(&v, &names[2]);
    assert_ne!(dead["status"], "ok", "{v:#}");
    assert!(
        dead["error"].as_str().is_some_and(|e| !e.is_empty()),
        "the dead host is named with why: {v:#}"
    );
    let want = Manifest::scan(&src, CHUNK).unwrap();
    for h in [&names[1], &names[3], &names[4]] {
        assert_eq!(node(&v, h)["status"], "ok", "{h}: {v:#}");
        let got = Manifest::scan(&dest.join(h.as_str()).join("model"), CHUNK).unwrap();
        assert_eq!(got, want, "{h}");
    }
    let marker = dest.display().to_string();
    let t0 = Instant::now();
    while !processes_with(&["sync-serve", &marker]).is_empty() {
        assert!(t0.elapsed() < Duration::from_secs(5), "helpers left behind");
        std::thread::sleep(Duration::from_millis(50));
    }
}
