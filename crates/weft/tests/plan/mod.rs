//! `weft plan` and `weft run --plan` as a person runs them: `--group` against a real
//! controller (`weft controller --no-fabric` and `weft agent` processes whose fixture
//! hosts report GPUs), a saved plan driving `weft run`'s vLLM recipe.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::{ok, text, until};
use weft_agent::Gpu;
use weft_agent::fixtures::{HcaSpec, HostSpec, PortSpec, write_host};
use weft_fabric::Guid;

const ADMIN: &str = "wfa_plan-test-admin-0123456789abcdef0123";

/// A child process killed (by its pid) when dropped.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn weft_cmd(dir: &Path, url: &str, token: &str, args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_weft"));
    c.args(args)
        .current_dir(dir)
        .env_remove("WEFT_CONFIG")
        .env("WEFT_CONTROLLER", url)
        .env("WEFT_TOKEN", token);
    c
}

/// A header-only checkpoint of a real config (fixtures of weft-plan).
fn model_dir(dir: &Path, config: &str) -> String {
    let p = format!(
        "{}/../weft-plan/fixtures/configs/{config}.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let config: serde_json::Value = serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap();
    let arch = weft_plan::arch::from_config(&config).unwrap();
    let tensors = weft_plan::synth::tensors(&arch, &config).unwrap();
    let out = dir.join(config["architectures"][0].as_str().unwrap());
    weft_plan::synth::write_checkpoint(&out, &config, &tensors, 2).unwrap();
    out.display().to_string()
}

fn h200(i: u32) -> Gpu {
    Gpu {
        index: i,
        name: "NVIDIA H200".into(),
        uuid: Some(format!("GPU-{i:08x}")),
        // What NVML reports for an H200: 143,771 MiB.
        memory_total_bytes: Some(143_771 << 20),
        pci: None,
    }
}

#[test]
fn plan_group_takes_nodes_gpus_and_memory_from_a_real_controller() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}");
    let listen = format!("127.0.0.1:{port}");
    let mut child = weft_cmd(
        d,
        &url,
        ADMIN,
        &[
            "controller",
            "--init",
            "--listen",
            &listen,
            "--metrics-listen",
            "127.0.0.1:0",
            "--db",
            "controller.db",
            "--no-fabric",
        ],
    )
    .env("WEFT_ADMIN_TOKEN", ADMIN)
    .stdout(Stdio::piped())
    .stderr(Stdio::inherit())
    .spawn()
    .expect("weft controller starts");
    let stdout = child.stdout.take().unwrap();
    let _controller = Proc(child);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    let line = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("the controller says where it listens");
    assert!(line.contains(&listen), "{line}");
    let weft = |token: &str, args: &[&str]| weft_cmd(d, &url, token, args).output().unwrap();

    // Three agents: node1 and node2 with 8 H200s each, node3 with 4.
    let mut agents = Vec::new();
    for (i, gpus) in [(1u64, 8u32), (2, 8), (3, 4)] {
        let name = format!("node{i}");
        let mut spec = HostSpec::new(name.clone()).with_hca(
            HcaSpec::new("mlx5_0", Guid(0x7000 + i * 0x100), "0000:01:00.0")
                .with_port(PortSpec::infiniband(1)),
        );
        for g in 0..gpus {
            spec = spec.with_gpu(h200(g));
        }
        let root = d.join(format!("host-{name}"));
        write_host(&root, &spec).unwrap();
        let token = ok(weft(ADMIN, &["nodes", "enroll", "--server", &name]))
            .trim()
            .to_string();
        let state = format!("{name}.json");
        agents.push(Proc(
            weft_cmd(
                d,
                &url,
                ADMIN,
                &[
                    "agent",
                    "--state-file",
                    &state,
                    "--sysfs-root",
                    root.to_str().unwrap(),
                    "--heartbeat-s",
                    "0.5",
                ],
            )
            .env("WEFT_ENROLL_TOKEN", token)
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
        ));
    }
    until("three agents reporting", Duration::from_secs(20), || {
        let v: serde_json::Value =
            serde_json::from_str(&ok(weft(ADMIN, &["--json", "nodes"]))).ok()?;
        let a = v.as_array()?;
        (a.len() == 3 && a.iter().all(|s| s["liveness"] == "ok")).then_some(())
    });
    let alice = ok(weft(ADMIN, &["tenant", "create", "alice"]))
        .trim()
        .to_string();
    ok(weft(ADMIN, &["tenant", "create", "bob"]));
    ok(weft(ADMIN, &["group", "create", "a", "--tenant", "alice"]));
    ok(weft(
        ADMIN,
        &["group", "create", "mixed", "--tenant", "bob"],
    ));
    ok(weft(
        ADMIN,
        &["group", "add", "a", "node1", "node2", "--no-wait"],
    ));
    ok(weft(
        ADMIN,
        &["group", "add", "mixed", "node3", "--no-wait"],
    ));

    let model = model_dir(d, "llama-3-8b");
    // The tenant's own token: the cluster is the group's two nodes of 8 GPUs of 143,771 MiB.
    let o = weft(&alice, &["plan", &model, "--group", "a", "--json"]);
    let v: serde_json::Value =
        serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&o)));
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_eq!(v["cluster"]["nodes"], 2, "{v:#}");
    assert_eq!(v["cluster"]["gpus_per_node"], 8, "{v:#}");
    assert_eq!(v["cluster"]["gpu_memory_bytes"], 143_771u64 << 20, "{v:#}");
    assert_eq!(v["nodes"].as_array().unwrap().len(), 2, "{v:#}");
    // The speed is predicted for the GPU the agents reported (NVIDIA H200).
    assert_eq!(v["speed"]["hardware"]["device"], "h200", "{v:#}");
    assert!(
        v["warnings"]
            .as_array()
            .unwrap()
            .iter()
            .any(|w| w.as_str().unwrap().contains("node1, node2")),
        "the plan says where its cluster came from: {v:#}"
    );
    // --gpu-memory replaces the reported memory, and says so.
    let o = weft(
        &alice,
        &[
            "plan",
            &model,
            "--group",
            "a",
            "--gpu-memory",
            "24GiB",
            "--json",
        ],
    );
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["cluster"]["gpu_memory_bytes"], 24u64 << 30, "{v:#}");
    // Another tenant's group answers as one that does not exist: exit 2, named.
    let o = weft(&alice, &["plan", &model, "--group", "mixed"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("no group `mixed`"), "{}", text(&o));
    // The admin sees it; a group of one 4-GPU node plans on 4 GPUs.
    let o = weft(ADMIN, &["plan", &model, "--group", "mixed", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["cluster"]["gpus_per_node"], 4, "{v:#}");
    // Nodes of different GPU counts are refused, each named with its count.
    ok(weft(
        ADMIN,
        &["group", "remove", "mixed", "node3", "--no-wait"],
    ));
    ok(weft(ADMIN, &["group", "add", "a", "node3", "--no-wait"]));
    let o = weft(ADMIN, &["plan", &model, "--group", "a"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("node1 has 8, node2 has 8, node3 has 4"),
        "{}",
        text(&o)
    );
    // --group with --nodes is a usage error.
    let o = weft(ADMIN, &["plan", &model, "--group", "a", "--nodes", "2"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    drop(agents);
}

#[test]
fn run_plan_sets_the_vllm_layout_and_refuses_a_plan_for_other_hosts() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let model = model_dir(d, "llama-3-8b");
    let o = Command::new(env!("CARGO_BIN_EXE_weft"))
        .args([
            "plan",
            &model,
            "--nodes",
            "2",
            "--gpus-per-node",
            "1",
            "--gpu-memory",
            "24GiB",
            "--tp",
            "2",
            "--max-model-len",
            "8192",
            "--json",
        ])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    std::fs::write(d.join("plan.json"), &o.stdout).unwrap();
    // The plan takes 2 nodes; 3 hosts are refused before anything is reached.
    let o = Command::new(env!("CARGO_BIN_EXE_weft"))
        .current_dir(d)
        .args([
            "run",
            "--hosts",
            "a,b,c",
            "--plan",
            "plan.json",
            "--",
            "vllm",
            "serve",
            &model,
        ])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("takes 2 node(s), but the job has 3 host(s)"),
        "{}",
        text(&o)
    );
    // A tensor-parallel size that disagrees with the plan is refused, naming both.
    let o = Command::new(env!("CARGO_BIN_EXE_weft"))
        .current_dir(d)
        .args([
            "run",
            "--hosts",
            "a,b",
            "--plan",
            "plan.json",
            "--",
            "vllm",
            "serve",
            &model,
            "--tensor-parallel-size",
            "1",
        ])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("--tensor-parallel-size 1 in the command, but --plan plan.json says 2"),
        "{}",
        text(&o)
    );
}

/// Nodes that differ: `--gpu-memory` one per node and `--device` one per node plan an uneven
/// pipeline that --json carries (`pp_layer_partition`) and the table says; a node that
/// cannot hold one layer is refused by name (exit 2); `weft run --plan` checks the plan's
/// nodes against the hosts.
#[test]
fn nodes_that_differ_get_an_uneven_split_and_a_node_too_small_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let model = model_dir(d, "llama-3-8b");
    let plan = |mem: &str, json: bool| {
        let mut a = vec![
            "plan",
            &model,
            "--gpu-memory",
            mem,
            "--device",
            "gb10,rtx-4090",
            "--max-model-len",
            "8192",
        ];
        if json {
            a.push("--json");
        }
        Command::new(env!("CARGO_BIN_EXE_weft"))
            .args(&a)
            .output()
            .unwrap()
    };
    let o = plan("128GiB,24GiB", true);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let part: Vec<u64> = serde_json::from_value(v["pp_layer_partition"].clone()).unwrap();
    assert_eq!(part.iter().sum::<u64>(), 32, "{v}");
    // The RTX 4090 reads 3.7x faster than a GB10: it takes most layers.
    assert!(part[1] > 2 * part[0], "{part:?}");
    assert_eq!(v["nodes"][1]["memory_bytes"], 24u64 << 30);
    std::fs::write(d.join("plan.json"), &o.stdout).unwrap();
    let o = plan("128GiB,24GiB", false);
    assert!(
        text(&o).contains(&format!("VLLM_PP_LAYER_PARTITION={},{}", part[0], part[1])),
        "{}",
        text(&o)
    );
    let o = plan("128GiB,1GiB", true);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let e: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(
        e["error"]
            .as_str()
            .unwrap()
            .contains("node1 (rtx-4090) (0.90 GiB usable) cannot hold one layer"),
        "{e}"
    );
    let o = Command::new(env!("CARGO_BIN_EXE_weft"))
        .current_dir(d)
        .args([
            "run",
            "--hosts",
            "a,b,c",
            "--plan",
            "plan.json",
            "--",
            "vllm",
            "serve",
            &model,
        ])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("takes 2 node(s), but the job has 3"),
        "{}",
        text(&o)
    );
}

/// The speed prediction as a user gets it: the link from a `weft bench p2p --json` file (its
/// median pair, half its round trip), every term in `--json`, layouts ranked by predicted
/// decode; a file that is not p2p output is refused naming it; a default context that does
/// not fit is planned shorter and the first line says so.
#[test]
fn plan_predicts_speed_from_a_p2p_file_and_says_first_when_the_context_is_shortened() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let model = format!(
        "{}/../weft-plan/fixtures/qwen2.5-7b-instruct",
        env!("CARGO_MANIFEST_DIR")
    );
    let pair = |src: &str, dst: &str, gbps: f64, rtt: f64| {
        serde_json::json!({"src": src, "dst": dst, "src_if": "data0", "dst_addr": "10.0.0.2",
            "rail": 0, "gbps": gbps, "rtt_us": rtt, "mss": 8948, "error": null})
    };
    let p2p = serde_json::json!({
        "hosts": ["a", "b"], "pairs": [pair("a", "b", 1.0, 400.0), pair("b", "a", 1.0, 400.0)],
        "median_gbps": 1.0, "median_rtt_us": 400.0, "threshold": 0.5,
        "slow": [], "small_mss": [], "blamed": []
    });
    std::fs::write(d.join("p2p.json"), p2p.to_string()).unwrap();
    let plan = |extra: &[&str]| {
        let mut args = vec![
            "plan",
            &model,
            "--nodes",
            "4",
            "--gpu-memory",
            "24GiB",
            "--max-model-len",
            "8192",
            "--device",
            "rtx-4090",
        ];
        args.extend_from_slice(extra);
        Command::new(env!("CARGO_BIN_EXE_weft"))
            .current_dir(d)
            .args(&args)
            .output()
            .unwrap()
    };
    // 1 Gb/s at 200 us one way: a pipeline beats every TP all-reduce.
    let o = plan(&["--links", "p2p.json", "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let hw = &v["speed"]["hardware"];
    assert_eq!(hw["link_gbps"], 1.0, "{v:#}");
    assert_eq!(hw["link_latency_us"], 200.0, "{v:#}");
    assert_eq!(v["layout"]["pp"], 4, "{v:#}");
    let decode = &v["speed"]["decode"];
    assert!(decode["tokens_per_s"].as_f64().unwrap() > 0.0, "{v:#}");
    for term in [
        "memory_s",
        "compute_s",
        "tp_latency_s",
        "pp_latency_s",
        "overhead_s",
    ] {
        assert!(decode["terms"][term].is_number(), "{term}: {v:#}");
    }
    let c = v["candidates"].as_array().unwrap();
    let tps: Vec<f64> = c
        .iter()
        .filter_map(|c| c["decode_tokens_per_s"].as_f64())
        .collect();
    assert!(
        tps.windows(2).all(|w| w[0] >= w[1]),
        "fastest first: {tps:?}"
    );
    // The same cluster on a 200 Gb/s, 10 us link: tensor parallel first.
    let o = plan(&["--link-gbps", "200", "--link-latency-us", "10", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["layout"]["tp"], 4, "{v:#}");
    // Not p2p output: refused, naming the file.
    std::fs::write(d.join("bad.json"), "{\"pairs\": 3}").unwrap();
    let o = plan(&["--links", "bad.json"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("bad.json"), "{}", text(&o));
    // 2 x 11 GiB with 2 GiB of overhead: the weights fit, the config's 32,768 tokens do not.
    let o = Command::new(env!("CARGO_BIN_EXE_weft"))
        .args([
            "plan",
            &model,
            "--nodes",
            "2",
            "--gpu-memory",
            "11GiB",
            "--overhead",
            "2GiB",
            "--tp",
            "2",
        ])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let first = String::from_utf8_lossy(&o.stdout)
        .lines()
        .next()
        .unwrap_or("")
        .to_string();
    assert!(
        first.starts_with("fits at up to ") && first.contains("32,768 does not fit"),
        "{}",
        text(&o)
    );
}

/// `weft bench llm compare --plan` as a person runs it: a saved plan, runs on 1 and 2
/// "nodes" measured against the scripted stand-in server (it measures weft's arithmetic and
/// imitates no engine: its token schedule is set per node count), the one-node run fitting
/// the step overhead; a plan file that is not `weft plan --json` refused by name.
#[test]
fn compare_plan_puts_the_prediction_beside_each_run_and_fits_the_overhead() {
    use weft_llmbench::scripted::{Script, start};
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let model = format!(
        "{}/../weft-plan/fixtures/qwen2.5-7b-instruct",
        env!("CARGO_MANIFEST_DIR")
    );
    let weft = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_weft"))
            .args(args)
            .current_dir(d)
            .env_remove("WEFT_CONFIG")
            .env_remove("WEFT_LLM_URL")
            .output()
            .unwrap()
    };
    let o = weft(&[
        "plan",
        &model,
        "--nodes",
        "2",
        "--gpu-memory",
        "24GiB",
        "--max-model-len",
        "8192",
        "--device",
        "rtx-4090",
        "--json",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    std::fs::write(d.join("plan.json"), &o.stdout).unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    for (nodes, itl) in [(1u32, 30u64), (2, 15)] {
        let s = rt
            .block_on(start(Script {
                itl: Duration::from_millis(itl),
                ttft: Duration::from_millis(5),
                ..Default::default()
            }))
            .unwrap();
        let o = weft(&[
            "bench",
            "llm",
            "--base-url",
            &s.base_url(),
            "--model",
            "scripted",
            "--pp",
            "32",
            "--tg",
            "10",
            "--runs",
            "1",
            "--nodes",
            &nodes.to_string(),
            "--save",
            &format!("{nodes}n.json"),
        ]);
        assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    }
    let o = weft(&[
        "bench",
        "llm",
        "compare",
        "--plan",
        "plan.json",
        "1n.json",
        "2n.json",
        "--no-plot",
        "--json",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let p = &v["predicted"];
    // A 30 ms step against the 15.1 ms the 1-node model reads (15.2 GB at 1,008 GB/s).
    let fit = p["calibration"]["step_overhead_us"].as_f64().unwrap();
    assert!((12_000.0..18_000.0).contains(&fit), "{p:#}");
    let rows = p["rows"].as_array().unwrap();
    let tg2 = rows
        .iter()
        .find(|r| r["nodes"] == 2 && r["test"].as_str().unwrap().starts_with("tg"))
        .unwrap_or_else(|| panic!("{p:#}"));
    assert_eq!(tg2["layout"], "tp2 pp1", "{p:#}");
    assert!(tg2["corrected_tps"].as_f64().unwrap() < tg2["predicted_tps"].as_f64().unwrap());
    // The table, for a person.
    let o = weft(&[
        "bench",
        "llm",
        "compare",
        "--plan",
        "plan.json",
        "1n.json",
        "2n.json",
        "--no-plot",
    ]);
    let t = text(&o);
    assert!(
        t.contains("measured/corrected") && t.contains("fitted to the one-node run"),
        "{t}"
    );
    // A RUN.json given as the plan is refused, naming it.
    let o = weft(&[
        "bench",
        "llm",
        "compare",
        "--plan",
        "1n.json",
        "1n.json",
        "2n.json",
        "--no-plot",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("--plan 1n.json"), "{}", text(&o));
}
