//! `weft bench collectives` as a person runs it: local rank processes over loopback through the
//! real plugin, nccl-tests' table and footer, exit codes for wrong data and --min-bw.

mod llm;
mod report;

use crate::text;
use std::path::PathBuf;
use std::process::{Command, Output};

fn plugin() -> PathBuf {
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_weft"));
    let p = bin.parent().unwrap().join("libnccl_net_weft.so");
    if !p.exists() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let st = Command::new(cargo)
            .args(["build", "-p", "weft-nccl-net"])
            .status()
            .unwrap();
        assert!(st.success());
    }
    p
}

fn bench(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_weft"))
        .args(["bench", "collectives", "--timeout", "60"])
        .args(args)
        .env("WEFT_PLUGIN", plugin())
        .env("WEFT_NTHREADS", "0")
        .env_remove("WEFT_CONFIG")
        .env_remove("NCCL_TESTS_MIN_BW")
        .env_remove("NCCL_ALGO")
        .output()
        .expect("weft runs")
}

#[test]
fn collectives_print_the_nccl_tests_table_and_footer() {
    let o = bench(&[
        "--nranks", "3", "-b", "1K", "-e", "64K", "-f", "8", "-n", "2",
    ]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(0), "{t}");
    assert!(
        t.contains(
            "#       size         count      type   redop    root     time   algbw   busbw  #wrong"
        ),
        "{t}"
    );
    assert!(t.contains("# Out of bounds values : 0 OK"), "{t}");
    assert!(t.contains("# Avg bus bandwidth    : "), "{t}");
    let rows: Vec<&str> = t
        .lines()
        .filter(|l| l.contains("float     sum      -1"))
        .collect();
    assert_eq!(rows.len(), 3, "{t}");
}

#[test]
fn a_minimum_bandwidth_that_is_not_reached_fails_the_run_and_json_says_so() {
    let o = bench(&[
        "--nranks", "2", "-b", "4K", "-e", "4K", "-n", "1", "--min-bw", "100000", "--json",
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON on stdout");
    assert_eq!(v["passed"], false);
    assert_eq!(v["report"]["wrong"], 0);
    assert_eq!(v["report"]["rows"][0]["collective"], "all_reduce");
}

#[test]
fn bad_flags_are_usage_errors_and_help_has_an_example() {
    let o = bench(&["-d", "float128"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let o = bench(&["--help"]);
    assert!(text(&o).contains("Example"), "{}", text(&o));
}

/// The benchmark of docs/benchmarks.md ("## weft bench"): all-reduce bus bandwidth over 4
/// namespace hosts against the pairwise link bandwidth of the same run, every data egress at
/// 1 Gbit/s. Ignored (it measures, it does not check): `cargo test -p weft --test it
/// bench::allreduce_vs_links -- --ignored --nocapture`.
#[test]
#[ignore = "benchmark of docs/benchmarks.md: it measures, it does not check; run with --ignored --nocapture"]
fn allreduce_vs_links() {
    if let Err(why) = weft_netns::available() {
        weft_netns::require::skip("allreduce_vs_links", &why);
        return;
    }
    let c = weft_netns::Cluster::create(&weft_netns::ClusterSpec::new(4, 1)).unwrap();
    for i in 0..4 {
        c.shape(i, "data0", &weft_netns::Shape::rate("1gbit"))
            .unwrap();
    }
    let hosts = c
        .hosts()
        .iter()
        .map(|h| h.name.as_str())
        .collect::<Vec<_>>()
        .join(",");
    let o = Command::new(env!("CARGO_BIN_EXE_weft"))
        .args(["bench", "p2p", "--hosts", &hosts, "--via", "netns"])
        .args([
            "--mgmt-if",
            "=mgmt0",
            "--data-if",
            "=data0",
            "--duration",
            "3",
        ])
        .args(["--json"])
        .env_remove("WEFT_CONFIG")
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("p2p JSON");
    let link = v["matrix"]["median_gbps"].as_f64().unwrap();
    println!("p2p median {link:.3} Gbit/s = {:.4} GB/s", link / 8.0);
    let rdv = format!("{}:29600", c.host(0).mgmt_addr);
    let o = Command::new(env!("CARGO_BIN_EXE_weft"))
        .args(["bench", "collectives", "--hosts", &hosts, "--via", "netns"])
        .args(["--rendezvous", &rdv, "-b", "64M", "-e", "128M", "-n", "5"])
        .args(["-c", "0", "--timeout", "120"])
        .env("WEFT_PLUGIN", plugin())
        .env("WEFT_MGMT_IFNAME", "=mgmt0")
        .env("WEFT_DATA_IFNAME", "=data0")
        .env_remove("WEFT_CONFIG")
        .output()
        .unwrap();
    let t = text(&o);
    println!("{t}");
    for l in t.lines().filter(|l| l.contains("float     sum")) {
        let f: Vec<&str> = l.split_whitespace().collect();
        // From the time column: the busbw column has two decimals only.
        let (size, us): (f64, f64) = (f[0].parse().unwrap(), f[5].parse().unwrap());
        let busbw = size / us / 1e3 * 1.5;
        println!(
            "size {} busbw {busbw:.4} GB/s = {:.0}% of the link",
            f[0],
            100.0 * busbw / (link / 8.0)
        );
    }
}

/// One parsed nccl-tests block: the test's name, the ranks of `# Using devices`, the rows
/// (size, count, type, redop, root, then time/algbw/busbw/#wrong twice) and the footer.
#[derive(Debug, Default)]
struct NcclTestsBlock {
    name: String,
    ranks: Vec<(usize, String, String)>,
    rows: Vec<Vec<String>>,
    wrong: Option<u64>,
    avg_busbw: Option<f64>,
    concluded: Option<String>,
}

/// Parses text as nccl-tests (src/util.cu, 2.19) writes it, by its own fixed formats: rows
/// are `%12li  %12li  %8s  %6s  %6s` then `  %7s  %6s  %6s  %6g` per variant, so every field
/// is read from its columns, not split on spaces; device lines are
/// `#  Rank %2d Group %2d Pid %6d on %10s device %2d [%04x:%02x:%02x] %s`; the footer is
/// `# %-20s : %d %s` and `# %-20s : %g %s`.
fn parse_nccl_tests(t: &str) -> Vec<NcclTestsBlock> {
    let mut out: Vec<NcclTestsBlock> = Vec::new();
    for l in t.lines() {
        if let Some(n) = l.strip_prefix("# Collective test starting: ") {
            out.push(NcclTestsBlock {
                name: n.to_string(),
                ..Default::default()
            });
            continue;
        }
        let Some(b) = out.last_mut() else { continue };
        if let Some(r) = l.strip_prefix("#  Rank ") {
            // "%2d Group %2d Pid %6d on %10s device %2d [...] %s"
            assert_eq!(&r[2..9], " Group ", "{l}");
            assert_eq!(&r[11..16], " Pid ", "{l}");
            assert_eq!(&r[22..26], " on ", "{l}");
            let rest = &r[26..];
            let (host, rest) = rest.split_at(rest.find(" device ").expect(l));
            let rank = r[..2].trim().parse().expect(l);
            let what = rest[" device ".len() + 2..].trim_start();
            assert!(what.starts_with("[0000:00:00] "), "{l}");
            b.ranks
                .push((rank, host.trim().to_string(), what[13..].to_string()));
        } else if let Some(v) = l.strip_prefix("# Out of bounds values : ") {
            b.wrong = v.split_whitespace().next().and_then(|x| x.parse().ok());
        } else if let Some(v) = l.strip_prefix("# Avg bus bandwidth    : ") {
            b.avg_busbw = v.split_whitespace().next().and_then(|x| x.parse().ok());
        } else if let Some(n) = l.strip_prefix("# Collective test concluded: ") {
            b.concluded = Some(n.to_string());
        } else if !l.starts_with('#') && !l.trim().is_empty() {
            let widths = [12, 12, 8, 6, 6, 7, 6, 6, 6, 7, 6, 6, 6];
            let mut at = 0;
            let mut f = Vec::new();
            for (k, w) in widths.iter().enumerate() {
                if k > 0 {
                    assert_eq!(&l[at..at + 2], "  ", "two spaces before field {k}: {l:?}");
                    at += 2;
                }
                let field = &l[at..at + w];
                assert!(!field.ends_with(' '), "field {k} right-aligned: {l:?}");
                f.push(field.trim().to_string());
                at += w;
            }
            assert_eq!(at, l.len(), "nothing after the last field: {l:?}");
            b.rows.push(f);
        }
    }
    out
}

#[test]
fn collectives_output_parses_as_nccl_tests_output() {
    let o = bench(&[
        "all_reduce",
        "all_gather",
        "reduce_scatter",
        "alltoall",
        "--nranks",
        "4",
        "-b",
        "4K",
        "-e",
        "64K",
        "-f",
        "16",
        "-n",
        "2",
    ]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(0), "{t}");
    let blocks = parse_nccl_tests(&String::from_utf8_lossy(&o.stdout));
    let names: Vec<&str> = blocks.iter().map(|b| b.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "all_reduce_perf",
            "all_gather_perf",
            "reduce_scatter_perf",
            "alltoall_perf"
        ],
        "{t}"
    );
    for b in &blocks {
        assert_eq!(b.concluded.as_deref(), Some(b.name.as_str()), "{t}");
        assert_eq!(b.wrong, Some(0), "{t}");
        assert!(b.avg_busbw.is_some_and(|x| x > 0.0), "{t}");
        let ranks: Vec<usize> = b.ranks.iter().map(|r| r.0).collect();
        assert_eq!(ranks, [0, 1, 2, 3], "{t}");
        // Every rank says which interfaces the plugin gives it (local ranks: loopback).
        assert!(
            b.ranks.iter().all(|r| r.2.contains("data lo 127.0.0.1")),
            "{t}"
        );
        assert_eq!(b.rows.len(), 2, "{t}");
        for r in &b.rows {
            let (size, count): (usize, usize) = (r[0].parse().unwrap(), r[1].parse().unwrap());
            // The count is per rank where nccl-tests' is: each rank's piece for all-gather,
            // reduce-scatter and all-to-all, the whole buffer for all-reduce.
            let per_rank = b.name != "all_reduce_perf";
            let want = if per_rank { size / 4 / 4 } else { size / 4 };
            assert_eq!(count, want, "{}: {r:?}", b.name);
            assert_eq!(r[2], "float");
            let redop = if b.name.starts_with("all_gather") || b.name.starts_with("alltoall") {
                "none"
            } else {
                "sum"
            };
            assert_eq!((r[3].as_str(), r[4].as_str()), (redop, "-1"), "{r:?}");
            for v in [5, 6, 7, 9, 10, 11] {
                assert!(r[v].parse::<f64>().is_ok(), "{r:?}");
            }
            assert_eq!((r[8].as_str(), r[12].as_str()), ("0", "0"), "{r:?}");
        }
    }
}

/// `weft bench collectives` over 4 namespace hosts whose data egress is 400 Mbit/s, host 2's
/// 80 Mbit/s (tc): the report times every link through the plugin before the collectives and
/// names exactly host 2, as the sender of its slow links, in `--json` and in the `#` lines of
/// the human report (which still parse as nccl-tests output).
#[test]
fn collectives_name_the_host_whose_data_link_is_rate_limited() {
    if let Err(why) = weft_netns::available() {
        weft_netns::require::skip(
            "collectives_name_the_host_whose_data_link_is_rate_limited",
            &why,
        );
        return;
    }
    let c = weft_netns::Cluster::create(&weft_netns::ClusterSpec::new(4, 1)).unwrap();
    for i in 0..4 {
        let rate = if i == 2 { "80mbit" } else { "400mbit" };
        c.shape(i, "data0", &weft_netns::Shape::rate(rate)).unwrap();
    }
    let names: Vec<String> = c.hosts().iter().map(|h| h.name.clone()).collect();
    let hosts = names.join(",");
    let rdv = format!("{}:29600", c.host(0).mgmt_addr);
    let run = |json: bool| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_weft"));
        cmd.args(["bench", "collectives", "--hosts", &hosts, "--via", "netns"])
            .args([
                "--rendezvous",
                &rdv,
                "--mgmt-if",
                "=mgmt0",
                "--data-if",
                "=data0",
            ])
            .args(["-b", "64K", "-e", "64K", "-n", "1", "--link-bytes", "2M"])
            .args(["--timeout", "60"])
            .env("WEFT_PLUGIN", plugin())
            .env_remove("WEFT_CONFIG")
            .env_remove("WEFT_MGMT_IFNAME")
            .env_remove("WEFT_DATA_IFNAME");
        if json {
            cmd.arg("--json");
        }
        cmd.output().unwrap()
    };
    let o = run(true);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
    let l = &v["links"];
    assert_eq!(l["hosts"], serde_json::json!(names), "{l:#}");
    assert_eq!(l["links"].as_array().unwrap().len(), 12, "{l:#}");
    let blamed: Vec<(String, String, String)> = l["blamed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| {
            (
                b["host"].as_str().unwrap().to_string(),
                b["what"].as_str().unwrap().to_string(),
                b["direction"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        blamed,
        [(names[2].clone(), "bandwidth".into(), "sending".into())],
        "{l:#}"
    );
    // The slow links are exactly host 2's three outgoing ones.
    let slow: Vec<(String, String)> = l["slow"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["src"].as_str().unwrap().into(),
                s["dst"].as_str().unwrap().into(),
            )
        })
        .collect();
    assert_eq!(slow.len(), 3, "{l:#}");
    assert!(slow.iter().all(|(s, _)| s == &names[2]), "{l:#}");
    // The links carried the data interfaces' rates (the unshaped management link would give
    // several Gb/s): the healthy ones near 400 Mbit/s, tbf's burst allowing a little more.
    let fast: Vec<f64> = l["links"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|x| x["src_rank"] != 2)
        .map(|x| x["gbps"].as_f64().unwrap())
        .collect();
    assert!(fast.iter().all(|g| (0.2..0.6).contains(g)), "{l:#}");

    // The human report says the same in nccl-tests comment lines; the rows still parse.
    let o = run(false);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(0), "{t}");
    let stdout = String::from_utf8_lossy(&o.stdout);
    let slow_lines: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("# SLOW HOST"))
        .collect();
    assert_eq!(slow_lines.len(), 1, "{t}");
    assert!(
        slow_lines[0].starts_with(&format!("# SLOW HOST {} (sending): ", names[2])),
        "{t}"
    );
    let blocks = parse_nccl_tests(&stdout);
    assert_eq!(blocks.len(), 1, "{t}");
    assert_eq!(blocks[0].rows.len(), 1, "{t}");
    assert_eq!(blocks[0].wrong, Some(0), "{t}");
}

/// What nccl-tests' own summary tool, `tools/analyze_perf_json.py` (nccl-tests 2.19.6), reads
/// from a `-J` file, by its rules (reimplemented here, not copied): `version`, `config`
/// (`iterations`, `aggregated_iterations` defaulting to 1, `devices[].hostname` for its node
/// groups), `results[]` with `size` and, per placement (`out_of_place_per_iter` or
/// `in_place_per_iter`), `avg_us`, `min_us`, `max_us`, `p99_us`, `cv_pct`, `times_us` and
/// `per_process_max_times_us` (one row per process). Its consistency check: `times_us` equals
/// the maximum over the process rows, iteration by iteration, within 0.001 us.
#[derive(Debug)]
struct PerfJsonAnalysis {
    version: i64,
    iterations: i64,
    aggregated: i64,
    process_rows: usize,
    consistent: bool,
    /// (size, avg, min, max, p99, cv, spike = max / avg) per result.
    stats: Vec<(u64, f64, f64, f64, f64, f64, f64)>,
    /// Per result: the process with the smallest and the largest average.
    stragglers: Vec<(usize, usize)>,
    /// Node groups: hostname -> processes, in first-seen order.
    nodes: Vec<(String, Vec<usize>)>,
}

fn analyze_perf_json(data: &serde_json::Value, placement_key: &str) -> PerfJsonAnalysis {
    let results = data["results"].as_array().expect("results is a list");
    let cfg = &data["config"];
    let process_rows = |r: &serde_json::Value| -> Vec<Vec<f64>> {
        r[placement_key]
            .get("per_process_max_times_us")
            .and_then(|v| v.as_array())
            .map(|rows| {
                rows.iter()
                    .map(|row| {
                        row.as_array()
                            .expect("a process row is a list")
                            .iter()
                            .map(|x| x.as_f64().expect("a time is a number"))
                            .collect()
                    })
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut consistent = true;
    let mut stats = Vec::new();
    let mut stragglers = Vec::new();
    for r in results {
        let p = &r[placement_key];
        let num = |k: &str| {
            p[k].as_f64()
                .unwrap_or_else(|| panic!("{k} is a number: {p}"))
        };
        let (avg, max) = (num("avg_us"), num("max_us"));
        let spike = if avg > 0.0 { max / avg } else { 0.0 };
        stats.push((
            r["size"].as_u64().expect("size is an integer"),
            avg,
            num("min_us"),
            max,
            num("p99_us"),
            num("cv_pct"),
            spike,
        ));
        let rows = process_rows(r);
        let t: Vec<f64> = p["times_us"]
            .as_array()
            .expect("times_us")
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect();
        if !rows.is_empty() && !t.is_empty() {
            let n = rows.iter().map(Vec::len).min().unwrap();
            let want: Vec<f64> = (0..n)
                .map(|i| rows.iter().map(|row| row[i]).fold(f64::MIN, f64::max))
                .collect();
            consistent &=
                t.len() == want.len() && t.iter().zip(&want).all(|(a, b)| (a - b).abs() < 0.001);
            let avgs: Vec<f64> = rows
                .iter()
                .map(|row| row.iter().sum::<f64>() / row.len() as f64)
                .collect();
            let by = |f: fn(&f64, &f64) -> bool| {
                (0..avgs.len())
                    .reduce(|a, b| if f(&avgs[b], &avgs[a]) { b } else { a })
                    .unwrap()
            };
            stragglers.push((by(|x, y| x < y), by(|x, y| x > y)));
        }
    }
    let nprocs = results.first().map_or(0, |r| process_rows(r).len());
    let devices = cfg["devices"].as_array().cloned().unwrap_or_default();
    let mut nodes: Vec<(String, Vec<usize>)> = Vec::new();
    if devices.len() >= nprocs
        && devices[..nprocs]
            .iter()
            .all(|d| d.get("hostname").is_some())
    {
        for (proc, d) in devices[..nprocs].iter().enumerate() {
            let h = d["hostname"]
                .as_str()
                .expect("hostname is a string")
                .to_string();
            match nodes.iter_mut().find(|n| n.0 == h) {
                Some(n) => n.1.push(proc),
                None => nodes.push((h, vec![proc])),
            }
        }
    }
    PerfJsonAnalysis {
        version: data["version"].as_i64().expect("version"),
        iterations: cfg["iterations"].as_i64().expect("iterations"),
        aggregated: cfg
            .get("aggregated_iterations")
            .map_or(1, |v| v.as_i64().unwrap()),
        process_rows: nprocs,
        consistent,
        stats,
        stragglers,
        nodes,
    }
}

/// `-J` writes nccl-tests' JSON (one file per collective, never overwriting: FILE, FILE.0),
/// and with `-I 1` its per-iteration records: nccl-tests' own summary tool's reading rules
/// find what they look for, its consistency check passes, and the text table gains the four
/// per-iteration columns at nccl-tests' widths.
#[test]
fn json_output_reads_as_nccl_tests_json_and_per_iteration_timing_as_theirs() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run.json");
    let path_s = path.display().to_string();
    let o = bench(&[
        "all_reduce",
        "all_gather",
        "--nranks",
        "3",
        "-b",
        "4K",
        "-e",
        "16K",
        "-f",
        "4",
        "-n",
        "4",
        "-I",
        "1",
        "-J",
        &path_s,
    ]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(0), "{t}");
    let second = dir.path().join("run.json.0");
    assert!(
        t.contains(&format!("JSON output written to {}", second.display())),
        "{t}"
    );
    for (file, coll) in [(&path, "all_reduce"), (&second, "all_gather")] {
        let data: serde_json::Value =
            serde_json::from_slice(&std::fs::read(file).unwrap()).expect("JSON");
        for key in ["out_of_place_per_iter", "in_place_per_iter"] {
            let a = analyze_perf_json(&data, key);
            assert_eq!((a.version, a.iterations, a.aggregated), (3, 4, 1), "{a:?}");
            assert_eq!(a.process_rows, 3, "{a:?}");
            assert!(a.consistent, "{coll} {key}: {a:?}");
            // nccl-tests' size is what moves: all-gather's a multiple of 3 ranks x 4 bytes.
            let sizes: Vec<u64> = a.stats.iter().map(|s| s.0).collect();
            let want: [u64; 2] = if coll == "all_gather" {
                [4092, 16380]
            } else {
                [4096, 16384]
            };
            assert_eq!(sizes, want, "{coll}: {a:?}");
            for s in &a.stats {
                assert!(s.2 > 0.0 && s.2 <= s.1 && s.1 <= s.3 && s.4 <= s.3, "{s:?}");
                assert!(s.5 >= 0.0 && s.6 >= 1.0, "{s:?}");
            }
            assert_eq!(a.stragglers.len(), 2, "{a:?}");
            // Local ranks share one hostname: one node with the three processes.
            assert_eq!(a.nodes.len(), 1, "{a:?}");
            assert_eq!(a.nodes[0].1, [0, 1, 2], "{a:?}");
        }
        // The rest of nccl-tests' record: the text root, the string booleans, the summary.
        let r0 = &data["results"][0];
        assert_eq!(r0["root"], "    -1");
        assert_eq!(r0["out_of_place"]["nwrong"], 0.0);
        assert!(r0["in_place"]["bus_bw"].as_f64().unwrap() > 0.0);
        assert_eq!(r0["type"], "float");
        assert_eq!(data["config"]["per_iter_timing"], "true");
        assert_eq!(data["config"]["step_factor"], 4);
        assert_eq!(data["config"]["devices"].as_array().unwrap().len(), 3);
        assert_eq!(data["out_of_bounds"]["okay"], "true");
        assert_eq!(data["average_bus_bandwidth"]["okay"], "unchecked");
        assert_eq!(data["errors"], serde_json::json!([]));
        let redop = if coll == "all_gather" { "none" } else { "sum" };
        assert_eq!(r0["redop"], redop);
    }
    // The table: nccl-tests' -I header and 21 fixed-width fields per row.
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        stdout.contains("#       size         count      type   redop    root     time   algbw   busbw  #wrong    i_min    i_max    i_p99    i_cv%     time   algbw   busbw  #wrong    i_min    i_max    i_p99    i_cv% \n"),
        "{stdout}"
    );
    let widths = [
        12, 12, 8, 6, 6, 7, 6, 6, 6, 7, 7, 7, 7, 7, 6, 6, 6, 7, 7, 7, 7,
    ];
    let rows: Vec<&str> = stdout
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .collect();
    assert_eq!(rows.len(), 4, "{stdout}");
    for l in rows {
        let mut at = 0;
        for (k, w) in widths.iter().enumerate() {
            if k > 0 {
                assert_eq!(&l[at..at + 2], "  ", "field {k}: {l:?}");
                at += 2;
            }
            assert!(!l[at..at + w].ends_with(' '), "field {k}: {l:?}");
            at += w;
        }
        assert_eq!(at, l.len(), "{l:?}");
    }
}

/// What the link probe and the loss check cost (docs/benchmarks.md, "What the per-link
/// report and the loss check cost"): wall time of a one-row collectives run on 4 namespace
/// hosts (400 Mbit/s data links, one at 80) with and without `--link-bytes 2M`, and of
/// `weft doctor --no-throughput` with and without `--no-loss`; medians of 3. Ignored (it
/// measures): `cargo test -p weft --test it bench::link_probe_and_loss_check_cost --
/// --ignored --nocapture`.
#[test]
#[ignore = "benchmark of docs/benchmarks.md: it measures, it does not check; run with --ignored --nocapture"]
fn link_probe_and_loss_check_cost() {
    if let Err(why) = weft_netns::available() {
        weft_netns::require::skip("link_probe_and_loss_check_cost", &why);
        return;
    }
    let c = weft_netns::Cluster::create(&weft_netns::ClusterSpec::new(4, 1)).unwrap();
    for i in 0..4 {
        let rate = if i == 2 { "80mbit" } else { "400mbit" };
        c.shape(i, "data0", &weft_netns::Shape::rate(rate)).unwrap();
    }
    let hosts = c
        .hosts()
        .iter()
        .map(|h| h.name.clone())
        .collect::<Vec<_>>()
        .join(",");
    let rdv = format!("{}:29600", c.host(0).mgmt_addr);
    let time = |args: &[&str]| -> f64 {
        let mut v: Vec<f64> = (0..3)
            .map(|_| {
                let t = std::time::Instant::now();
                let o = Command::new(env!("CARGO_BIN_EXE_weft"))
                    .args(args)
                    .env("WEFT_PLUGIN", plugin())
                    .env_remove("WEFT_CONFIG")
                    .output()
                    .unwrap();
                assert!(o.status.code().is_some_and(|c| c <= 1), "{}", text(&o));
                t.elapsed().as_secs_f64()
            })
            .collect();
        v.sort_by(f64::total_cmp);
        v[1]
    };
    let coll = |link: &str| {
        time(&[
            "bench",
            "collectives",
            "--hosts",
            &hosts,
            "--via",
            "netns",
            "--rendezvous",
            &rdv,
            "--mgmt-if",
            "=mgmt0",
            "--data-if",
            "=data0",
            "-b",
            "64K",
            "-e",
            "64K",
            "-n",
            "1",
            "--link-bytes",
            link,
        ])
    };
    let doctor = |extra: &[&str]| {
        let mut a = vec![
            "doctor",
            "--hosts",
            &hosts,
            "--via",
            "netns",
            "--mgmt-if",
            "=mgmt0",
            "--data-if",
            "=data0",
            "--no-throughput",
        ];
        a.extend(extra);
        time(&a)
    };
    println!("collectives --link-bytes 0: {:.2} s", coll("0"));
    println!("collectives --link-bytes 2M: {:.2} s", coll("2M"));
    println!(
        "doctor --no-throughput --no-loss: {:.2} s",
        doctor(&["--no-loss"])
    );
    println!("doctor --no-throughput: {:.2} s", doctor(&[]));
}
