//! Collectives across N real processes (this test binary, re-executed as ranks) talking through
//! `libnccl_net_weft.so` over loopback; every element checked against a reference computed in
//! higher precision.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use weft_bench::comm::{Algo, Coll};
use weft_bench::dtype::{DataType, RedOp};
use weft_bench::perf::{PerfOptions, Report};
use weft_bench::{RankSpec, run_rank};

const RANK_ENV: &str = "WEFT_BENCH_TEST_RANK";

pub fn plugin_path() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    for dir in [deps, deps.parent().unwrap()] {
        let p = dir.join("libnccl_net_weft.so");
        if p.exists() {
            return p;
        }
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let st = Command::new(cargo)
        .args(["build", "-p", "weft-nccl-net"])
        .status()
        .unwrap();
    assert!(st.success());
    deps.parent().unwrap().join("libnccl_net_weft.so")
}

fn opts_from_env() -> PerfOptions {
    let v = std::env::var("WEFT_BENCH_TEST_OPTS").unwrap();
    let f: Vec<&str> = v.split(';').collect();
    PerfOptions {
        colls: f[0].split(',').map(|s| s.parse().unwrap()).collect(),
        types: f[1].split(',').map(|s| s.parse().unwrap()).collect(),
        ops: f[2].split(',').map(|s| s.parse().unwrap()).collect(),
        algo: f[3].parse().unwrap(),
        min_bytes: f[4].parse().unwrap(),
        max_bytes: f[5].parse().unwrap(),
        step_factor: f[6].parse().unwrap(),
        root: f[7].parse().unwrap(),
        iters: 0,
        warmup: 0,
        check: 1,
        ..PerfOptions::default()
    }
}

/// The rank body: does nothing unless started by [`run_ranks`].
#[test]
fn rank_worker() {
    let Ok(rank) = std::env::var(RANK_ENV) else {
        return;
    };
    let spec = RankSpec {
        rank: rank.parse().unwrap(),
        nranks: std::env::var("WEFT_BENCH_TEST_NRANKS")
            .unwrap()
            .parse()
            .unwrap(),
        rendezvous: std::env::var("WEFT_BENCH_TEST_ADDR")
            .unwrap()
            .parse()
            .unwrap(),
        plugin: plugin_path(),
        timeout: Duration::from_secs(60),
        dev: 0,
    };
    let rep = run_rank(&spec, &opts_from_env(), &mut |_, _, _| {}).unwrap();
    if spec.rank == 0 {
        println!("REPORT:{}", serde_json::to_string(&rep).unwrap());
    }
}

struct Job {
    colls: Vec<Coll>,
    types: Vec<DataType>,
    ops: Vec<RedOp>,
    algo: Algo,
    sizes: (usize, usize, f64),
    root: usize,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn join<T: ToString>(v: &[T]) -> String {
    v.iter().map(T::to_string).collect::<Vec<_>>().join(",")
}

/// Runs `job` on `n` rank processes; rank 0's report.
fn run_ranks(n: usize, job: &Job) -> Report {
    let _ = plugin_path();
    let addr = format!("127.0.0.1:{}", free_port());
    let algo = match job.algo {
        Algo::Ring => "ring",
        Algo::Tree => "tree",
    };
    let opts = format!(
        "{};{};{};{algo};{};{};{};{}",
        join(&job.colls),
        join(&job.types),
        join(&job.ops),
        job.sizes.0,
        job.sizes.1,
        job.sizes.2,
        job.root
    );
    let exe = std::env::current_exe().unwrap();
    let mut kids: Vec<_> = (0..n)
        .map(|r| {
            Command::new(&exe)
                .args([
                    "--exact",
                    "collectives::rank_worker",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env(RANK_ENV, r.to_string())
                .env("WEFT_BENCH_TEST_NRANKS", n.to_string())
                .env("WEFT_BENCH_TEST_ADDR", &addr)
                .env("WEFT_BENCH_TEST_OPTS", &opts)
                .env("WEFT_MGMT_IFNAME", "=lo")
                .env("WEFT_DATA_IFNAME", "=lo")
                .env("WEFT_NTHREADS", "0")
                .env("WEFT_NSOCKS_PERTHREAD", "1")
                .env("WEFT_TIMEOUT_MS", "30000")
                .stdout(if r == 0 {
                    Stdio::piped()
                } else {
                    Stdio::null()
                })
                .stderr(Stdio::inherit())
                .spawn()
                .unwrap()
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(240);
    let mut out = String::new();
    if let Some(mut o) = kids[0].stdout.take() {
        // Rank 0 ends when the run ends (or its bounded waits run out).
        std::io::Read::read_to_string(&mut o, &mut out).unwrap();
    }
    for (r, k) in kids.iter_mut().enumerate() {
        loop {
            if let Some(st) = k.try_wait().unwrap() {
                assert!(st.success(), "rank {r} of {n} failed: {st}");
                break;
            }
            if Instant::now() > deadline {
                for k in &mut kids {
                    let _ = k.kill();
                }
                panic!("rank {r} of {n} still running after 240 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let line = out
        .lines()
        .find_map(|l| l.split_once("REPORT:").map(|(_, r)| r))
        .unwrap_or_else(|| panic!("no report from rank 0"));
    serde_json::from_str(line).unwrap()
}

fn sweep(n: usize, algo: Algo, colls: &[Coll]) {
    let job = Job {
        colls: colls.to_vec(),
        types: DataType::ALL.to_vec(),
        ops: RedOp::ALL.to_vec(),
        algo,
        // 8 B to 200 KB: counts that do not divide by n, pieces of zero elements, several
        // pipeline slices.
        sizes: (8, 200_000, 25.0),
        root: n / 2,
    };
    let t0 = Instant::now();
    let rep = run_ranks(n, &job);
    let per_coll: usize = colls
        .iter()
        .map(|c| if c.reduces() { RedOp::ALL.len() } else { 1 })
        .sum();
    assert_eq!(rep.rows.len(), per_coll * DataType::ALL.len() * 4, "n={n}");
    let checked = rep
        .rows
        .iter()
        .flat_map(|r| [r.out_of_place.wrong, r.in_place.wrong])
        .all(|w| w.is_some());
    assert!(checked);
    let bad: Vec<String> = rep
        .rows
        .iter()
        .filter(|r| r.out_of_place.wrong != Some(0) || r.in_place.wrong != Some(0))
        .map(weft_bench::perf::format_row)
        .collect();
    assert!(
        bad.is_empty(),
        "n={n} {algo:?}: wrong elements\n{}",
        bad.join("\n")
    );
    eprintln!(
        "n={n} {algo:?}: {} rows correct in {:?}",
        rep.rows.len(),
        t0.elapsed()
    );
}

#[test]
fn every_collective_type_and_op_is_correct_on_2_to_8_ranks_ring() {
    for n in 2..=8 {
        sweep(n, Algo::Ring, &Coll::ALL);
    }
}

#[test]
fn tree_all_reduce_broadcast_and_reduce_are_correct_on_odd_and_even_ranks() {
    for n in [2, 3, 8] {
        sweep(
            n,
            Algo::Tree,
            &[Coll::AllReduce, Coll::Broadcast, Coll::Reduce],
        );
    }
}
