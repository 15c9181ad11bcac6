//! Records the git commit the binary is built from, for `weft --version`.
//!
//! Outside a git checkout (a source tarball) the commit is "unknown"; the build never fails
//! for want of git.

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let s = String::from_utf8(out.stdout).ok()?;
    let s = s.trim();
    (!s.is_empty()).then(|| s.to_string())
}

fn main() {
    let commit = git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".into());
    let dirty = git(&["status", "--porcelain", "--untracked-files=no"]).is_some();
    let commit = if dirty && commit != "unknown" {
        format!("{commit}-modified")
    } else {
        commit
    };
    println!("cargo:rustc-env=WEFT_GIT_COMMIT={commit}");
    // Rebuild when HEAD moves (a checkout or a commit), not on every build: these paths exist
    // in a plain clone and in a worktree alike.
    for p in ["HEAD", "index"] {
        if let Some(path) = git(&["rev-parse", "--path-format=absolute", "--git-path", p]) {
            println!("cargo:rerun-if-changed={path}");
        }
    }
    let head_ref = git(&["symbolic-ref", "-q", "HEAD"]);
    let ref_path = head_ref
        .and_then(|r| git(&["rev-parse", "--path-format=absolute", "--git-path", &r]))
        .filter(|p| std::path::Path::new(p).exists());
    if let Some(path) = ref_path {
        println!("cargo:rerun-if-changed={path}");
    }
    println!("cargo:rerun-if-changed=build.rs");
}
