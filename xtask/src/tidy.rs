//! `cargo xtask tidy`: the habits of ARCHITECTURE.md that a machine can check.
//!
//! Each check reads the tree as text (and the manifests as TOML) and reports every place that
//! breaks a rule, with its path, so that nobody has to remember the rules:
//!
//! * every source file of a crate opens with a `//!` paragraph;
//! * a crate with no `unsafe` in its sources says `#![forbid(unsafe_code)]`;
//! * every shipped crate denies `unwrap`/`expect` outside tests (clippy then enforces it);
//! * `weft-fabric` does no I/O (no files, sockets, processes or clocks);
//! * `weft-transport` names no NCCL type;
//! * the test-only crates (`weft-testbed`, `weft-netns`) are never normal dependencies of a
//!   shipped crate;
//! * no source file is longer than [`MAX_LINES`] without a `tidy: long-file` note saying why;
//! * every crate has its heading in ARCHITECTURE.md's code map;
//! * only the crates of [`MANY_TEST_BINARIES`] have more than one integration test binary;
//! * weft-plan's core ([`PLAN_CORE`]) does no I/O;
//! * weft-launch reaches hosts only through `weft-hosts`, and only in `src/hosts.rs`; it does
//!   not depend on weft-bench;
//! * no `pub fn` of a library crate (every crate but `weft`, the binary) returns
//!   `Result<_, String>`, except those of [`STRING_ERRORS`], each with its reason: a library
//!   names its errors with a type ([`string_error_fns`]).

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

/// Longest source file, in lines, that needs no note.
pub const MAX_LINES: usize = 1500;

/// Crates that only tests and xtask may depend on.
const TEST_ONLY: &[&str] = &["weft-testbed", "weft-netns"];

/// The line a shipped crate's root carries so that clippy refuses `unwrap` and `expect` in
/// code that is not a test.
pub const NO_UNWRAP: &str =
    "#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]";

/// What in `weft-fabric`'s sources would be I/O.
const IO_NAMES: &[&str] = &[
    "std::fs",
    "TcpStream",
    "TcpListener",
    "UdpSocket",
    "UnixStream",
    "std::process",
    "std::io::stdin",
    "std::io::stdout",
    "std::env",
    "SystemTime",
    "Instant::now",
    "tokio",
    "File::open",
    "File::create",
];

/// The files of weft-plan that do no I/O: bytes and values in, a plan out.
const PLAN_CORE: &[&str] = &[
    "tensor.rs",
    "arch.rs",
    "rules.rs",
    "plan.rs",
    "choose.rs",
    "speed.rs",
    "cluster.rs",
];

/// Crates allowed more than one integration test binary, and why: the plugin's and the
/// transport's tests that need a process of their own (a libfabric provider initialised
/// once per process, a freshly loaded plugin, progress measured without other tests); the
/// console's browser test (Chromium, a fabric) apart from its monitoring-file checks, so that
/// the alert rules and dashboard can be checked without a browser.
const MANY_TEST_BINARIES: &[&str] = &["weft-nccl-net", "weft-transport", "weft-console"];

/// The `pub fn`s of library crates allowed to return `Result<_, String>`: (crate, function,
/// why a `String` is the right error there).
const STRING_ERRORS: &[(&str, &str, &str)] = &[
    (
        "weft-netns",
        "available",
        "a test's skip reason, cached in a OnceLock for the process and printed as is by the skip macro",
    ),
    (
        "weft-netns",
        "netem_available",
        "a test's skip reason, cached in a OnceLock for the process and printed as is by the skip macro",
    ),
    (
        "weft-testbed",
        "available",
        "a test's skip reason (PostgreSQL's binaries missing), printed as is by the skip macro",
    ),
];

/// NCCL names that must stay in the plugin crate.
const NCCL_NAMES: &[&str] = &[
    "ncclNet_v",
    "ncclResult_t",
    "ncclDebugLogger",
    "ncclNetProperties",
];

/// Runs every check from the workspace root; fails with the list of findings.
pub fn run(root: &Path) -> Result<()> {
    let mut findings = Vec::new();
    let arch_path = root.join("ARCHITECTURE.md");
    let arch = fs::read_to_string(&arch_path)
        .with_context(|| format!("cannot read {}", arch_path.display()))?;
    for krate in crates(root)? {
        check_crate(&krate, &mut findings)?;
        if !arch.contains(&format!("### `crates/{}`", krate.name)) {
            findings.push(format!(
                "{}: no `### `crates/{}`` heading in ARCHITECTURE.md's code map",
                krate.dir.display(),
                krate.name
            ));
        }
        let bins = test_binaries(&krate.dir)?;
        if bins > 1 && !MANY_TEST_BINARIES.contains(&krate.name.as_str()) {
            findings.push(format!(
                "{}: {bins} integration test binaries; one (`tests/it.rs` or `tests/it/main.rs`) unless listed in tidy's MANY_TEST_BINARIES with why",
                krate.dir.join("tests").display()
            ));
        }
    }
    if findings.is_empty() {
        eprintln!("tidy: ok");
        return Ok(());
    }
    for f in &findings {
        eprintln!("tidy: {f}");
    }
    bail!("{} tidy finding(s)", findings.len())
}

/// One crate of `crates/`, its name and whether it ships.
struct Crate {
    name: String,
    dir: PathBuf,
    manifest: toml::Table,
}

impl Crate {
    fn ships(&self) -> bool {
        !TEST_ONLY.contains(&self.name.as_str())
    }
}

fn crates(root: &Path) -> Result<Vec<Crate>> {
    let mut out = Vec::new();
    let dir = root.join("crates");
    let mut entries: Vec<_> = fs::read_dir(&dir)
        .with_context(|| format!("cannot list {}", dir.display()))?
        .collect::<Result<_, _>>()?;
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let manifest_path = e.path().join("Cargo.toml");
        if !manifest_path.exists() {
            continue;
        }
        let text = fs::read_to_string(&manifest_path)
            .with_context(|| format!("cannot read {}", manifest_path.display()))?;
        let manifest: toml::Table = text
            .parse()
            .with_context(|| format!("{} is not valid TOML", manifest_path.display()))?;
        let name = manifest
            .get("package")
            .and_then(|p| p.get("name"))
            .and_then(|n| n.as_str())
            .with_context(|| format!("{} has no package.name", manifest_path.display()))?
            .to_string();
        out.push(Crate {
            name,
            dir: e.path(),
            manifest,
        });
    }
    Ok(out)
}

fn check_crate(c: &Crate, findings: &mut Vec<String>) -> Result<()> {
    let folder = c.dir.file_name().and_then(|n| n.to_str()).unwrap_or("");
    if folder != c.name {
        findings.push(format!(
            "{}: folder name differs from the crate name {}",
            c.dir.display(),
            c.name
        ));
    }
    let src = c.dir.join("src");
    let files = rust_files(&src)?;
    let library = c.name != "weft";
    let mut any_unsafe = false;
    for f in &files {
        let text = fs::read_to_string(f).with_context(|| format!("cannot read {}", f.display()))?;
        if !opens_with_doc(&text) {
            findings.push(format!("{}: no `//!` paragraph at the top", f.display()));
        }
        if code_lines(&text).any(|l| has_word(l, "unsafe")) {
            any_unsafe = true;
        }
        let lines = text.lines().count();
        if lines > MAX_LINES && !text.contains("tidy: long-file") {
            findings.push(format!(
                "{}: {lines} lines (over {MAX_LINES}) without a `tidy: long-file` note saying why",
                f.display()
            ));
        }
        if c.name == "weft-fabric" {
            for name in IO_NAMES {
                if code_lines(&text).any(|l| l.contains(name)) {
                    findings.push(format!(
                        "{}: uses {name}; weft-fabric does no I/O",
                        f.display()
                    ));
                }
            }
        }
        let file = f.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if c.name == "weft-plan" && f.parent() == Some(src.as_path()) && PLAN_CORE.contains(&file) {
            for name in IO_NAMES {
                if code_lines(&text).any(|l| l.contains(name)) {
                    findings.push(format!(
                        "{}: uses {name}; weft-plan's core does no I/O",
                        f.display()
                    ));
                }
            }
        }
        if c.name == "weft-launch"
            && file != "hosts.rs"
            && code_lines(&text).any(|l| l.contains("weft_hosts"))
        {
            findings.push(format!(
                "{}: names weft_hosts; weft-launch reaches hosts only through src/hosts.rs",
                f.display()
            ));
        }
        if library {
            for f_name in string_error_fns(&text) {
                let allowed = STRING_ERRORS
                    .iter()
                    .any(|(k, n, _)| *k == c.name && *n == f_name);
                if !allowed {
                    findings.push(format!(
                        "{}: `pub {f_name}` is a Result<_, String>; give it an error type naming the input and the cause (or list it in tidy's STRING_ERRORS with why)",
                        f.display()
                    ));
                }
            }
        }
        if c.name == "weft-transport" {
            for name in NCCL_NAMES {
                if code_lines(&text).any(|l| l.contains(name)) {
                    findings.push(format!(
                        "{}: names {name}; only weft-nccl-net knows NCCL types",
                        f.display()
                    ));
                }
            }
        }
    }
    let roots: Vec<PathBuf> = ["lib.rs", "main.rs"]
        .iter()
        .map(|r| src.join(r))
        .filter(|p| p.exists())
        .collect();
    for root in &roots {
        let text = fs::read_to_string(root)?;
        if !any_unsafe && !text.contains("#![forbid(unsafe_code)]") {
            findings.push(format!(
                "{}: the crate has no unsafe code but does not say #![forbid(unsafe_code)]",
                root.display()
            ));
        }
        if c.ships() && !text.contains(NO_UNWRAP) {
            findings.push(format!(
                "{}: a shipped crate's root needs `{NO_UNWRAP}`",
                root.display()
            ));
        }
    }
    let deps = c.manifest.get("dependencies").and_then(|d| d.as_table());
    if c.name == "weft-launch" && deps.is_some_and(|d| d.contains_key("weft-bench")) {
        findings.push(format!(
            "{}: weft-launch depends on weft-bench; it reaches hosts through weft-hosts",
            c.dir.join("Cargo.toml").display()
        ));
    }
    if let (true, Some(deps)) = (c.ships(), deps) {
        for t in TEST_ONLY.iter().filter(|t| deps.contains_key(**t)) {
            findings.push(format!(
                "{}: {t} is test-only and may only be a dev-dependency of {}",
                c.dir.join("Cargo.toml").display(),
                c.name
            ));
        }
    }
    Ok(())
}

/// How many integration test binaries a crate has: `tests/*.rs` and `tests/*/main.rs`.
fn test_binaries(krate: &Path) -> Result<usize> {
    let dir = krate.join("tests");
    if !dir.is_dir() {
        return Ok(0);
    }
    let mut n = 0;
    for e in fs::read_dir(&dir).with_context(|| format!("cannot list {}", dir.display()))? {
        let p = e?.path();
        if (p.is_file() && p.extension().is_some_and(|x| x == "rs"))
            || (p.is_dir() && p.join("main.rs").is_file())
        {
            n += 1;
        }
    }
    Ok(n)
}

/// The `.rs` files under `dir`, recursively, sorted.
fn rust_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).with_context(|| format!("cannot list {}", d.display()))? {
            let p = e?.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    out.sort();
    Ok(out)
}

/// True when the first line that is not blank or an attribute is a `//!` line.
fn opens_with_doc(text: &str) -> bool {
    text.lines()
        .map(str::trim)
        .find(|l| !l.is_empty() && !l.starts_with("#!["))
        .is_some_and(|l| l.starts_with("//!"))
}

/// The lines of `text` that are code: comments and doc comments left out, and a file's
/// `#[cfg(test)]` module (which by the project's habit closes the file) cut off.
fn code_lines(text: &str) -> impl Iterator<Item = &str> {
    text.lines()
        .take_while(|l| l.trim() != "#[cfg(test)]")
        .map(|l| match l.find("//") {
            Some(i) => &l[..i],
            None => l,
        })
        .filter(|l| !l.trim().is_empty())
}

/// The names of the `pub fn`s in `text` (its code lines) whose return type has a
/// `Result` whose error is `String` (`Result<T, String>`, `std::result::Result<T, String>`,
/// nested ones too), and of the `pub type` aliases of one. `pub(crate)` and private
/// functions are left alone.
fn string_error_fns(text: &str) -> Vec<String> {
    let code: String = code_lines(text).collect::<Vec<_>>().join("\n");
    let mut out = Vec::new();
    let mut at = 0;
    while let Some(i) = code[at..].find("pub fn ") {
        let start = at + i;
        at = start + "pub fn ".len();
        if code[..start]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_alphanumeric() || c == '_')
        {
            continue;
        }
        let rest = &code[at..];
        let name: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        // The parameters end where the first `(` closes; the return type runs from there to
        // the body, the `;` of a declaration, or a `where` clause.
        let Some(open) = rest.find('(') else { continue };
        let mut depth = 0usize;
        let mut close = None;
        for (j, ch) in rest[open..].char_indices() {
            match ch {
                '(' => depth += 1,
                ')' => {
                    depth -= 1;
                    if depth == 0 {
                        close = Some(open + j);
                        break;
                    }
                }
                _ => {}
            }
        }
        let Some(close) = close else { continue };
        let after = &rest[close + 1..];
        let end = ['{', ';']
            .iter()
            .filter_map(|c| after.find(*c))
            .chain(after.find(" where"))
            .min()
            .unwrap_or(after.len());
        let ret: String = after[..end]
            .chars()
            .filter(|c| !c.is_whitespace())
            .collect();
        if ret.starts_with("->") && has_string_error(&ret) {
            out.push(name);
        }
    }
    // A public alias of such a Result would let a function dodge the check.
    let mut at = 0;
    while let Some(i) = code[at..].find("pub type ") {
        let start = at + i;
        at = start + "pub type ".len();
        let rest = &code[at..];
        let name: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        let ty: String = rest[..rest.find(';').unwrap_or(rest.len())]
            .chars()
            .filter(|c| !c.is_whitespace())
            .collect();
        if let Some(eq) = ty.find('=')
            && has_string_error(&ty[eq + 1..])
        {
            out.push(name);
        }
    }
    out
}

/// Whether a return type (whitespace removed) holds a `Result<.., String>`.
fn has_string_error(ty: &str) -> bool {
    ty.match_indices("Result<").any(|(i, m)| {
        if ty[..i]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_alphanumeric() || c == '_')
        {
            return false;
        }
        // The top-level generic arguments of this Result.
        let inner = &ty[i + m.len()..];
        let (mut depth, mut last) = (1usize, 0usize);
        for (j, ch) in inner.char_indices() {
            match ch {
                '<' | '(' | '[' => depth += 1,
                '>' | ')' | ']' => {
                    depth -= 1;
                    if depth == 0 {
                        // One argument (`io::Result<String>`): no error type given here.
                        return last > 0 && &inner[last..j] == "String";
                    }
                }
                ',' if depth == 1 => last = j + 1,
                _ => {}
            }
        }
        false
    })
}

/// `word` in `line` as a whole identifier.
fn has_word(line: &str, word: &str) -> bool {
    line.match_indices(word).any(|(i, _)| {
        let before = line[..i].chars().next_back();
        let after = line[i + word.len()..].chars().next();
        let ident = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_');
        !ident(before) && !ident(after)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doc_paragraph_may_follow_inner_attributes() {
        assert!(opens_with_doc("#![forbid(unsafe_code)]\n//! What it is.\n"));
        assert!(opens_with_doc("\n//! What it is.\nfn x() {}\n"));
        assert!(!opens_with_doc("use std::fs;\n//! late\n"));
        assert!(!opens_with_doc("/// item doc\nfn x() {}\n"));
    }

    #[test]
    fn code_lines_leave_out_comments_and_the_test_module() {
        let text = "// std::fs in a comment\nlet a = 1; // std::net\n#[cfg(test)]\nuse std::fs;\n";
        let lines: Vec<_> = code_lines(text).collect();
        assert_eq!(lines, ["let a = 1; "]);
    }

    #[test]
    fn a_pub_fn_with_a_string_error_is_found_and_others_are_not() {
        let text = "\
pub fn a(x: &str) -> Result<(), String> {}
pub fn b(
    x: &str,
) -> std::result::Result<Vec<u8>, String> {
pub fn c() -> Result<BTreeMap<Guid, String>, MyError> {}
pub fn d(f: impl Fn(&str) -> Result<(), String>) -> Result<(), MyError> {}
pub(crate) fn e() -> Result<(), String> {}
fn f() -> Result<(), String> {}
pub fn g() -> Result<Result<(), String>, MyError> {}
pub fn h<T>(t: T) -> Result<T, String> where T: Clone {}
pub fn i() -> io::Result<String> {}
pub fn j() -> FooResult<(), String> {}
pub type R<T> = std::result::Result<T, String>;
pub type S = Result<(), MyError>;
// pub fn k() -> Result<(), String> {}
#[cfg(test)]
pub fn l() -> Result<(), String> {}
";
        assert_eq!(string_error_fns(text), ["a", "b", "g", "h", "R"]);
    }

    #[test]
    fn every_allowed_string_error_says_why() {
        for (krate, name, why) in STRING_ERRORS {
            assert!(
                krate.starts_with("weft-") && !name.is_empty(),
                "{krate} {name}"
            );
            assert!(why.len() > 20, "{krate}::{name} needs a reason");
        }
    }

    #[test]
    fn unsafe_is_found_as_a_word_only() {
        assert!(has_word("unsafe { x() }", "unsafe"));
        assert!(has_word("    unsafe fn f()", "unsafe"));
        assert!(!has_word("forbid(unsafe_code)", "unsafe"));
        assert!(!has_word("let not_unsafe = 1;", "unsafe"));
    }
}
