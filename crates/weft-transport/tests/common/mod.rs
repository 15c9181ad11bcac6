//! What the libfabric tests (`ofi.rs`, `ofi_progress.rs`) share: the configuration they start
//! from, and the rule that a missing libfabric skips a test while an installed one that cannot
//! run the configured provider fails it.

use std::time::Duration;

use weft_transport::{BackendKind, Config, Transport};

/// The ofi backend on `provider` (and `domain`, unless empty) over loopback, 20 s bounds.
pub fn ofi_cfg(provider: &str, domain: &str) -> Config {
    Config {
        mgmt_ifname: Some("=lo".parse().expect("a valid interface spec")),
        timeout: Duration::from_secs(20),
        accept_timeout: Duration::from_secs(20),
        nthreads: 0,
        nsocks_per_thread: 1,
        backend: BackendKind::Ofi,
        ofi_provider: Some(provider.into()),
        ofi_domain: (!domain.is_empty()).then(|| domain.to_string()),
        ..Config::default()
    }
}

/// The transport of `c`, or None when libfabric is not installed (the test is then skipped,
/// and says so). Panics, naming `what`, when libfabric is installed but `c` cannot use it.
pub fn ofi_transport(c: Config, what: &str) -> Option<Transport> {
    let t = Transport::new(c).expect("a transport");
    if !t.is_ofi() {
        let note = t.backend_note().unwrap_or_default().to_string();
        assert!(
            !std::path::Path::new("/usr/lib/x86_64-linux-gnu/libfabric.so.1").exists(),
            "libfabric is installed but {what} is unusable: {note}"
        );
        eprintln!("skipped: {note}");
        return None;
    }
    Some(t)
}
