//! What a test does when it cannot run here: skip on a developer's machine, fail in CI.
//!
//! A test that needs root, network namespaces, libfabric or sshd calls [`skip`] with why it
//! cannot run. Without [`REQUIRE_ENV`] it prints the reason and the test returns; with
//! `WEFT_TEST_REQUIRE=all` (which `.ci/run` sets) it panics, so a suite cannot go green
//! having run nothing of the namespace or libfabric parts.
//!
//! ```no_run
//! if let Err(why) = weft_netns::available() {
//!     weft_netns::require::skip("cluster tests", &why);
//!     return;
//! }
//! ```

/// The environment variable that turns a skip into a failure (value `all`).
pub const REQUIRE_ENV: &str = "WEFT_TEST_REQUIRE";

/// True when tests that cannot run must fail (`WEFT_TEST_REQUIRE=all`).
pub fn required() -> bool {
    std::env::var(REQUIRE_ENV).is_ok_and(|v| v == "all")
}

/// `test` cannot run here because of `why`: panics under `WEFT_TEST_REQUIRE=all`, else
/// prints `skipped: TEST: WHY` on stderr and returns (the caller then returns).
#[track_caller]
pub fn skip(test: &str, why: &str) {
    if let Err(msg) = verdict(required(), test, why) {
        panic!("{msg}");
    }
    eprintln!("skipped: {test}: {why}");
}

/// The failure message when skipping is forbidden, else `Ok`.
fn verdict(required: bool, test: &str, why: &str) -> Result<(), String> {
    if required {
        Err(format!(
            "{test} cannot run here and {REQUIRE_ENV}=all forbids skipping it: {why}"
        ))
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_skip_fails_only_when_required() {
        assert_eq!(verdict(false, "probe", "no root"), Ok(()));
        let msg = verdict(true, "probe", "no root").unwrap_err();
        assert!(msg.contains("probe") && msg.contains("no root") && msg.contains(REQUIRE_ENV));
    }
}
