//! `weft bench llm` and `weft bench llm compare` as a person runs them, against the scripted
//! stand-in server of weft-llmbench (it measures weft itself and imitates no engine; the real
//! llama.cpp server is exercised in weft-llmbench's own tests): the table, `--save`, exit codes,
//! `--json` errors, and a scaling report with its PNG plots.

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use crate::text;
use weft_llmbench::scripted::{Fault, Script, ScriptedServer, start};

fn llm(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_weft"))
        .args(["bench", "llm"])
        .args(args)
        .current_dir(dir)
        .env_remove("WEFT_CONFIG")
        .env_remove("WEFT_LLM_URL")
        .env_remove("OPENAI_API_KEY")
        .output()
        .expect("weft runs")
}

/// A scripted server on its own runtime, alive as long as the returned pair.
fn serve(script: Script) -> (tokio::runtime::Runtime, ScriptedServer) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let s = rt.block_on(start(script)).unwrap();
    (rt, s)
}

#[test]
fn llm_scripted_runs_save_and_compare_into_a_scaling_report_with_png_plots() {
    let dir = tempfile::tempdir().unwrap();
    let mut saved = Vec::new();
    for (nodes, itl) in [(1u32, 30u64), (2, 15)] {
        let (_rt, s) = serve(Script {
            itl: Duration::from_millis(itl),
            ttft: Duration::from_millis(20),
            ..Default::default()
        });
        let file = format!("{nodes}n.json");
        let o = llm(
            dir.path(),
            &[
                "--base-url",
                &s.base_url(),
                "--model",
                "scripted",
                "--pp",
                "32",
                "--tg",
                "10",
                "--depth",
                "0,64",
                "--runs",
                "1",
                "--nodes",
                &nodes.to_string(),
                "--layout",
                &format!("tp{nodes}"),
                "--save",
                &file,
            ],
        );
        let t = text(&o);
        assert_eq!(o.status.code(), Some(0), "{t}");
        assert!(t.contains("| model ") && t.contains("| tg10 @ d64 "), "{t}");
        assert!(t.contains(&format!("{nodes} node")), "{t}");
        assert!(dir.path().join(&file).exists());
        saved.push(file);
    }
    let o = llm(
        dir.path(),
        &["compare", &saved[0], &saved[1], "--plot", "scaling"],
    );
    let t = text(&o);
    assert_eq!(o.status.code(), Some(0), "{t}");
    assert!(t.contains("| tg10 | 2 nodes tp2 |"), "{t}");
    let mut pngs = 0;
    for e in std::fs::read_dir(dir.path()).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "png") {
            let b = std::fs::read(&p).unwrap();
            assert!(
                b.starts_with(b"\x89PNG") && b.len() > 2000,
                "{}",
                p.display()
            );
            assert!(
                t.contains(&format!(
                    "plot: {}",
                    p.file_name().unwrap().to_string_lossy()
                )) || t.contains(&p.display().to_string()),
                "{t}"
            );
            pngs += 1;
        }
    }
    assert!(pngs >= 2, "{t}");
    // compare --json carries the plots' paths.
    let o = llm(
        dir.path(),
        &["compare", &saved[0], &saved[1], "--no-plot", "--json"],
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(v["rows"].as_array().is_some_and(|r| !r.is_empty()), "{v}");
}

#[test]
fn llm_scripted_errors_exit_2_with_json_and_a_failed_test_exits_1_keeping_results() {
    let dir = tempfile::tempdir().unwrap();
    let (_rt, s) = serve(Script::default());
    let o = llm(
        dir.path(),
        &["--base-url", &s.base_url(), "--model", "nope", "--json"],
    );
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["exit"], 2, "{v}");
    let e = format!("{} {}", v["error"].as_str().unwrap(), v["causes"]);
    assert!(
        e.contains("\"nope\" is not served") && e.contains("scripted"),
        "{e}"
    );
    let o = llm(dir.path(), &["--model", "m"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o).contains("--base-url is required"), "{}", text(&o));

    // The server dies in the second test: exit 1, the first test printed and saved.
    let (_rt2, d) = serve(Script {
        // The warm-up sends 4 completion requests and the first test 1: the 6th dies.
        fault: Fault::DieAfter {
            after_requests: 5,
            chunks: 2,
        },
        ttft: Duration::from_millis(5),
        itl: Duration::from_millis(2),
        ..Default::default()
    });
    let o = llm(
        dir.path(),
        &[
            "--base-url",
            &d.base_url(),
            "--model",
            "scripted",
            "--pp",
            "16",
            "--tg",
            "6",
            "--depth",
            "0,64",
            "--runs",
            "1",
            "--retries",
            "0",
            "--save",
            "partial.json",
        ],
    );
    let t = text(&o);
    assert_eq!(o.status.code(), Some(1), "{t}");
    assert!(
        t.contains("| tg6 ") && t.contains("FAILED at pp16 @ d64"),
        "{t}"
    );
    let saved: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("partial.json")).unwrap())
            .unwrap();
    assert_eq!(saved["failure"]["test"], "pp16 @ d64");
    assert_eq!(saved["results"].as_array().unwrap().len(), 1);
}
