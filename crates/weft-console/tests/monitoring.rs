//! The monitoring files shipped in `packaging/monitoring/`: the Prometheus alert rules pass
//! `promtool check rules`, and every metric the rules and the Grafana dashboard name is one
//! the controller exposes (so a renamed metric fails here, not silently in production).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn monitoring() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../packaging/monitoring")
}

/// The metric families the controller's `/metrics` describes (`# TYPE` lines).
fn exposed() -> BTreeSet<String> {
    let text = weft_controller::metrics::Metrics::default().encode();
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

/// The `weft_...` metric names in a PromQL expression, sample suffixes taken off.
fn names(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = expr;
    while let Some(i) = rest.find("weft_") {
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        let mut n = &tail[..end];
        for suffix in ["_total", "_bucket", "_sum", "_count"] {
            if let Some(s) = n.strip_suffix(suffix) {
                n = s;
                break;
            }
        }
        out.push(n.to_string());
        rest = &tail[end..];
    }
    out
}

#[test]
fn promtool_accepts_the_alert_rules() {
    let rules = monitoring().join("weft-alerts.yml");
    let out = match std::process::Command::new("promtool")
        .args(["check", "rules"])
        .arg(&rules)
        .output()
    {
        Ok(o) => o,
        Err(e) => {
            weft_netns::require::skip(
                "promtool check rules",
                &format!("promtool: {e} (Debian package prometheus)"),
            );
            return;
        }
    };
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("SUCCESS: 5 rules found"), "{text}");
}

#[test]
fn the_rules_and_the_dashboard_name_only_metrics_the_controller_exposes() {
    let exposed = exposed();
    assert!(exposed.contains("weft_fabric_drift"), "{exposed:?}");
    let rules = std::fs::read_to_string(monitoring().join("weft-alerts.yml")).unwrap();
    let exprs: Vec<&str> = rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("expr:"))
        .collect();
    assert_eq!(exprs.len(), 5);
    let dash: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(monitoring().join("grafana-weft-controller.json")).unwrap(),
    )
    .unwrap();
    let mut all: Vec<String> = exprs.iter().map(|e| e.to_string()).collect();
    for p in dash["panels"].as_array().unwrap() {
        for t in p["targets"].as_array().unwrap() {
            all.push(t["expr"].as_str().unwrap().to_string());
        }
    }
    assert!(all.len() >= 12, "{all:?}");
    for e in &all {
        let ns = names(e);
        assert!(!ns.is_empty(), "{e}");
        for n in ns {
            assert!(
                exposed.contains(&n),
                "`{n}` (in `{e}`) is not a metric the controller exposes: {exposed:?}"
            );
        }
    }
}
