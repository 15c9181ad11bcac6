//! `weft sync`, `weft run` and `weft mesh` across network-namespace hosts: real sockets over
//! veth links shaped with `tc`, a real sshd per host for `run` and `mesh`, the real `weft`
//! binary on every host. A test that cannot run here (no root, no iproute2, no sshd, no
//! torch) fails with the reason.

mod llamacpp;
mod mesh;
mod roles;
mod run;
mod sync;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use weft_netns::{Cluster, ClusterSpec};
use weft_testbed::{SSHD, Sshd, SshdOptions};

/// `ip netns exec NS weft ARGS`.
pub fn weft_in(ns: &str, args: &[&str]) -> Output {
    weft_in_cmd(ns, args).output().expect("weft runs")
}

pub fn weft_in_cmd(ns: &str, args: &[&str]) -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", ns, env!("CARGO_BIN_EXE_weft")])
        .args(args)
        .env_remove("WEFT_CONFIG")
        .env_remove("WEFT_DATA_IFNAME")
        .env_remove("WEFT_MGMT_IFNAME");
    c
}

/// Panics (the test fails) when namespaces cannot be used here.
pub fn need_netns() {
    if let Err(why) = weft_netns::available() {
        panic!("this test needs network namespaces (root, iproute2): {why}");
    }
}

/// Pids of processes whose command line contains every one of `words`.
pub fn processes_with(words: &[&str]) -> Vec<u32> {
    let mut v = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if pid == std::process::id() {
            continue;
        }
        let Ok(raw) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let line = String::from_utf8_lossy(&raw).replace('\0', " ");
        if words.iter().all(|w| line.contains(w)) {
            v.push(pid);
        }
    }
    v
}

/// Namespace hosts with a real sshd each (on its management address, port 22) and one
/// ssh_config for every `ssh` (the operator's and the hosts': they share the filesystem).
/// Each host's sessions get `WEFT_SSH_FROM=<host>` from its sshd, and the config reads
/// `id.${WEFT_SSH_FROM}` and `known_hosts.${WEFT_SSH_FROM}`, so each host has keys of its
/// own; the operator (`WEFT_SSH_FROM=operator`, inside host 0: the head node) holds host
/// 0's sshd user key, which every sshd authorizes, and knows every host key.
/// `auth.<host>` links to each sshd's authorized_keys.
pub struct SshCluster {
    pub c: Cluster,
    pub sshds: Vec<Sshd>,
    pub names: Vec<String>,
    pub dir: tempfile::TempDir,
    pub extra_env: Vec<Vec<(String, String)>>,
}

impl SshCluster {
    pub fn start(n: usize, extra_env: Vec<Vec<(String, String)>>) -> SshCluster {
        need_netns();
        assert!(
            Path::new(SSHD).exists(),
            "{SSHD} missing (install openssh-server)"
        );
        let c = Cluster::create(&ClusterSpec::new(n, 1)).expect("cluster");
        let names: Vec<String> = c.hosts().iter().map(|h| h.name.clone()).collect();
        let dir = tempfile::tempdir().unwrap();
        let mut sc = SshCluster {
            c,
            sshds: Vec::new(),
            names,
            dir,
            extra_env,
        };
        for i in 0..n {
            let s = sc.sshd_for(i);
            sc.sshds.push(s);
        }
        let d = sc.dir.path().to_path_buf();
        std::fs::copy(sc.sshds[0].identity_file(), d.join("id.operator")).unwrap();
        let mut cfg = String::new();
        for h in sc.c.hosts() {
            cfg.push_str(&format!("Host {}\n    HostName {}\n", h.name, h.mgmt_addr));
        }
        cfg.push_str(&format!(
            "Host *\n    User {user}\n    IdentityFile {d}/id.${{WEFT_SSH_FROM}}\n    IdentitiesOnly yes\n    \
             UserKnownHostsFile {d}/known_hosts.${{WEFT_SSH_FROM}}\n    GlobalKnownHostsFile /dev/null\n    \
             StrictHostKeyChecking yes\n    BatchMode yes\n    ConnectTimeout 5\n    LogLevel ERROR\n",
            user = sc.sshds[0].user(),
            d = d.display(),
        ));
        std::fs::write(d.join("ssh_config"), cfg).unwrap();
        sc.write_operator_known_hosts();
        sc
    }

    /// (Re)starts host `i`'s sshd: a new host key.
    pub fn sshd_for(&self, i: usize) -> Sshd {
        let h = self.c.host(i);
        let mut set_env = vec![("WEFT_SSH_FROM".to_string(), h.name.clone())];
        set_env.extend(self.extra_env.get(i).cloned().unwrap_or_default());
        let operator_key = self.sshds.first().map(|s| s.user_public_key().to_string());
        let o = SshdOptions {
            netns: Some(h.name.clone()),
            listen: Some(h.mgmt_addr.into()),
            port: None,
            authorized_keys: operator_key.into_iter().collect(),
            set_env,
        };
        let s = Sshd::start_with(&o).unwrap_or_else(|e| panic!("sshd in {}: {e}", h.name));
        let link = self.dir.path().join(format!("auth.{}", h.name));
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(s.dir().join("authorized_keys"), &link).unwrap();
        s
    }

    pub fn write_operator_known_hosts(&self) {
        let all: String = self.sshds.iter().map(Sshd::known_hosts_line).collect();
        std::fs::write(self.dir.path().join("known_hosts.operator"), all).unwrap();
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `--hosts ... --via ssh --ssh-config ... --remote-weft ...` for these hosts.
    pub fn host_args(&self, hosts: &[String]) -> Vec<String> {
        vec![
            "--hosts".into(),
            hosts.join(","),
            "--via".into(),
            "ssh".into(),
            "--ssh-config".into(),
            self.path("ssh_config").display().to_string(),
            "--remote-weft".into(),
            env!("CARGO_BIN_EXE_weft").into(),
            "--mgmt-if".into(),
            "=mgmt0".into(),
            "--data-if".into(),
            "=data0".into(),
        ]
    }

    /// `weft ARGS` as the operator, inside host 0.
    pub fn weft(&self, args: &[String]) -> Command {
        let mut c = weft_in_cmd(&self.names[0], &[]);
        c.args(args).env("WEFT_SSH_FROM", "operator");
        c
    }
}
