//! The README's commands, run: every fenced block marked ```` ```sh test ```` is executed
//! line by line against the simulated fabric of [`crate::live`] (two real OpenSMs on ibsim),
//! with the README's own `# plan.toml` block as the plan, and each command must exit 0. So the
//! README cannot show a command that does not work as shown.
//!
//! What the harness substitutes, so that the README can show the paths a user has: the
//! `weft` binary comes first on `PATH`, `WEFT_CONFIG` points at the test fabric's weft.toml
//! (the README's weft.toml names `/etc` paths of a real host), and
//! `/etc/opensm/partitions.conf` is the primary SM's file.

use std::process::Command;

/// The fenced blocks of `markdown` as (info string, body).
fn blocks(markdown: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut current: Option<(String, String)> = None;
    for line in markdown.lines() {
        let fence = line.trim_start().strip_prefix("```");
        match (fence, current.take()) {
            (Some(_), Some(done)) => out.push(done),
            (Some(info), None) => current = Some((info.trim().to_string(), String::new())),
            (None, Some((info, mut body))) => {
                body.push_str(line.trim_start());
                body.push('\n');
                current = Some((info, body));
            }
            (None, None) => {}
        }
    }
    out
}

#[test]
fn blocks_are_found_with_their_info_strings() {
    let md = "text\n```sh test\nweft a\n  weft b\n```\n```toml\n# plan.toml\nx = 1\n```\n";
    let b = blocks(md);
    assert_eq!(b.len(), 2);
    assert_eq!(b[0], ("sh test".into(), "weft a\nweft b\n".into()));
    assert!(b[1].1.starts_with("# plan.toml"));
}

#[test]
fn every_runnable_readme_command_works_on_the_simulated_fabric() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md"))
        .expect("README.md");
    let all = blocks(&readme);
    let plan = all
        .iter()
        .find(|(info, body)| info == "toml" && body.starts_with("# plan.toml"))
        .map(|(_, b)| b.clone())
        .expect("the README shows a plan.toml");
    let runnable: Vec<&String> = all
        .iter()
        .filter(|(info, _)| info == "sh test")
        .map(|(_, b)| b)
        .collect();
    assert!(!runnable.is_empty(), "no ```sh test block in README.md");
    let l = crate::live(2);
    let dir = l.fabric.dir();
    std::fs::write(dir.join("plan.toml"), plan).unwrap();
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_weft"))
        .parent()
        .unwrap()
        .to_path_buf();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let master_file = l.sms[0].1.display().to_string();
    for block in runnable {
        for line in block.lines() {
            let cmd = line.split(" #").next().unwrap_or("").trim();
            if cmd.is_empty() || cmd.starts_with('#') {
                continue;
            }
            let cmd = cmd.replace("/etc/opensm/partitions.conf", &master_file);
            let o = Command::new("bash")
                .args(["-euo", "pipefail", "-c", &cmd])
                .current_dir(dir)
                .env("PATH", &path)
                .env("WEFT_CONFIG", dir.join("weft.toml"))
                .output()
                .unwrap();
            assert!(
                o.status.success(),
                "README command `{line}` exited {:?}:\n{}{}",
                o.status.code(),
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            );
        }
    }
}
