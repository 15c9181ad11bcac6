//! `compare --plan`'s arithmetic: runs whose step time is the plan's model plus a known
//! engine overhead give that overhead back from the one-node run, and the corrected
//! prediction for two nodes matches what was "measured" there; the uncorrected one does not.

use weft_llmbench::predicted::{Measured, predicted, scaling_from_plan};
use weft_plan::plan::{Cluster, Format, Model, Options};
use weft_plan::speed::{self, Hardware, ScalePoint};

fn scaling() -> Vec<ScalePoint> {
    let p = format!(
        "{}/../weft-plan/fixtures/configs/qwen2.5-7b-instruct.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let config: serde_json::Value = serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap();
    let arch = weft_plan::arch::from_config(&config).unwrap();
    let model = Model {
        source: "qwen2.5-7b".into(),
        tensors: weft_plan::synth::tensors(&arch, &config).unwrap(),
        arch,
        format: Format::Safetensors,
        warnings: vec![],
    };
    let hw = Hardware::new(
        speed::device("rtx-4090").unwrap(),
        weft_plan::plan::Engine::Vllm,
    );
    let opts = Options {
        max_model_len: Some(8192),
        hardware: Some(hw),
        ..Options::default()
    };
    let cluster = Cluster {
        nodes: 2,
        gpus_per_node: 1,
        gpu_memory_bytes: 24 << 30,
    };
    speed::scaling(&model, cluster, &opts)
}

fn test(run: usize, nodes: u32, kind: &str, size: u64, depth: u64, tps: f64) -> Measured {
    Measured {
        run,
        file: format!("{nodes}n.json"),
        nodes,
        test: format!("{kind}{size} @ d{depth}"),
        kind: kind.into(),
        size,
        depth,
        tps,
    }
}

#[test]
fn a_one_node_run_calibrates_the_step_overhead_for_the_other_node_counts() {
    let s = scaling();
    assert_eq!(s.iter().map(|p| p.nodes).collect::<Vec<_>>(), vec![1, 2]);
    let true_overhead_us = 4000.0;
    // "Measured": the model's own terms with the true overhead.
    let truth = |nodes: u32, kind: &str, size: u64, depth: u64| {
        let mut m = s[nodes as usize - 1].model.clone();
        m.step_overhead_us = true_overhead_us;
        if kind == "tg" {
            m.decode(depth + size / 2).tokens_per_s
        } else {
            m.prompt(size, depth).tokens_per_s
        }
    };
    let mut tests = Vec::new();
    for (run, nodes) in [(0usize, 1u32), (1, 2)] {
        for depth in [0, 4096] {
            tests.push(test(
                run,
                nodes,
                "tg",
                32,
                depth,
                truth(nodes, "tg", 32, depth),
            ));
            tests.push(test(
                run,
                nodes,
                "pp",
                2048,
                depth,
                truth(nodes, "pp", 2048, depth),
            ));
        }
    }
    let p = predicted(&tests, &s);
    let cal = p.calibration.as_ref().expect("a one-node run");
    assert!(
        (cal.step_overhead_us - true_overhead_us).abs() < 1.0,
        "{cal:?}"
    );
    assert_eq!(cal.assumed_us, 1500.0);
    assert_eq!(cal.tests.len(), 2, "{cal:?}");
    for r in &p.rows {
        let c = r.corrected_ratio.unwrap();
        assert!((c - 1.0).abs() < 1e-3, "{r:?}");
        if r.test.starts_with("tg") {
            // The plan's 1.5 ms under-counts a 4 ms step: slower than predicted.
            assert!(r.ratio < 0.9, "{r:?}");
        }
    }
    let two: Vec<_> = p.rows.iter().filter(|r| r.nodes == 2).collect();
    assert_eq!(two.len(), 4);
    assert_eq!(two[0].layout, "tp2 pp1");
    assert!(p.markdown().contains("fitted to the one-node run: 4000 us"));
    // The plot's predicted lines: per test, the corrected prediction over its one-node
    // value, which here is what was "measured".
    let lines = p.speedup_lines();
    assert_eq!(lines.len(), 4, "{lines:?}");
    for (name, pts) in &lines {
        assert_eq!(pts.iter().map(|x| x.0).collect::<Vec<_>>(), vec![1, 2]);
        assert_eq!(pts[0].1, 1.0);
        let m = |n: u32| {
            tests
                .iter()
                .find(|t| t.test == *name && t.nodes == n)
                .unwrap()
                .tps
        };
        assert!((pts[1].1 - m(2) / m(1)).abs() < 1e-3, "{name}: {pts:?}");
    }
    // A node count the plan does not cover is named; without a one-node run nothing is fitted.
    let p = predicted(&[test(0, 3, "tg", 32, 0, 50.0)], &s);
    assert!(p.rows.is_empty() && p.calibration.is_none());
    assert!(
        p.warnings
            .iter()
            .any(|w| w.contains("3n.json") && w.contains("3 node")),
        "{:?}",
        p.warnings
    );
    assert!(p.warnings.iter().any(|w| w.contains("no one-node run")));
}

#[test]
fn a_plan_without_speed_models_is_refused_by_name() {
    let err = scaling_from_plan(b"{\"model\": \"x\"}", "old-plan.json").unwrap_err();
    assert!(err.to_string().contains("old-plan.json"), "{err}");
    let err = scaling_from_plan(b"{\"scaling\": []}", "p.json").unwrap_err();
    assert!(err.to_string().contains("no layout fits"), "{err}");
    let s = scaling();
    let json = serde_json::json!({"scaling": s}).to_string();
    let back = scaling_from_plan(json.as_bytes(), "p.json").unwrap();
    assert_eq!(back.len(), s.len());
    for (a, b) in back.iter().zip(&s) {
        assert_eq!((a.nodes, a.layout), (b.nodes, b.layout));
        // JSON keeps the figures to the last bit or so.
        let (x, y) = (
            a.model.decode(0).tokens_per_s,
            b.model.decode(0).tokens_per_s,
        );
        assert!((x - y).abs() < 1e-9 * y, "{x} vs {y}");
    }
}
