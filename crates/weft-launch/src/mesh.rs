//! `weft mesh`: every node reaches every other over SSH without a password, host keys
//! checked.
//!
//! 1. The operator (where `weft mesh` runs) must already reach every node with strict host
//!    key checking: that is how it learns nothing blindly. A node it cannot reach is named.
//! 2. The nodes' host keys are collected once (`ssh-keyscan` of the address `ssh -G` gives
//!    for each name) and shown by SHA256 fingerprint; they are written only after the
//!    operator confirms them, on a terminal or with an expected-fingerprints file.
//! 3. Every node gets a key of its own if it has none (`ssh-keygen -t ed25519`, the private
//!    key never leaves the node); every node's public key is appended to every other node's
//!    authorized_keys, and every other node's host key to its known_hosts, once
//!    (idempotent: a second run adds nothing).
//! 4. A known_hosts entry on any node that holds another key for a node is a changed host
//!    key: refused and named, and nothing is written anywhere.
//! 5. Every ordered pair is proven with the doctor's SSH check
//!    ([`crate::hosts::probe_all`]).
//!
//! `check` does 1, 2, 4 and 5 and writes nothing.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;

use crate::LaunchError;
use crate::hosts::{self, HostRunner, Outcome, sh_path};

/// Where the keys live on the nodes; `~/` is the remote home, `{host}` the host's name.
#[derive(Debug, Clone)]
pub struct MeshOptions {
    pub identity: String,
    pub known_hosts: String,
    pub authorized_keys: String,
    /// Only report.
    pub check: bool,
    /// `(host, SHA256:...)` fingerprints the operator expects; every collected key must be
    /// among them. `None`: the caller confirmed the fingerprints some other way.
    pub expect: Option<Vec<(String, String)>>,
    pub connect_timeout: Duration,
    pub bound: Duration,
}

/// A node's SSH identity as the others see it.
#[derive(Debug, Clone, Serialize)]
pub struct HostKey {
    pub host: String,
    /// `addr` or `[addr]:port`, as known_hosts names it.
    pub known_as: String,
    pub key_type: String,
    pub key: String,
    pub fingerprint: String,
}

/// A host key some node holds that is not the one the host presents.
#[derive(Debug, Clone, Serialize)]
pub struct Changed {
    pub host: String,
    /// The node whose known_hosts holds the old key.
    pub on: String,
    pub known: String,
    pub presented: String,
}

/// One ordered pair.
#[derive(Debug, Clone, Serialize)]
pub struct Pair {
    pub from: String,
    pub to: String,
    pub ok: bool,
    pub error: Option<String>,
    pub remedy: Option<String>,
}

/// What `weft mesh` found and did.
#[derive(Debug, Clone, Serialize)]
pub struct MeshReport {
    pub keys: Vec<HostKey>,
    pub changed: Vec<Changed>,
    /// Node keys generated this run.
    pub generated: Vec<String>,
    /// Lines added to authorized_keys / known_hosts, all nodes together.
    pub authorized_added: usize,
    pub known_added: usize,
    /// Lines that would be added (`check`).
    pub missing: usize,
    pub pairs: Vec<Pair>,
    pub ok: bool,
}

/// `f(i, host)` for every host at once, results in host order.
fn par<T: Send>(
    hosts_: &[Box<dyn HostRunner>],
    f: impl Fn(usize, &dyn HostRunner) -> Result<T, LaunchError> + Sync,
) -> Result<Vec<T>, LaunchError> {
    let idx: Vec<usize> = (0..hosts_.len()).collect();
    hosts::each_host(&idx, |&i| f(i, hosts_[i].as_ref()))
        .into_iter()
        .collect()
}

/// Where `ssh` goes for `name` with `opts`: (address, port), from `ssh -G`.
pub fn resolve(name: &str, opts: &[String]) -> Result<(String, u16), LaunchError> {
    let mut c = std::process::Command::new("ssh");
    c.arg("-G").args(opts).arg(name);
    let o = crate::hosts::run_local(c, Duration::from_secs(10)).map_err(|e| LaunchError::Host {
        host: name.into(),
        msg: format!("ssh -G: {e}"),
    })?;
    let text = String::from_utf8_lossy(&o.stdout);
    let mut host = None;
    let mut port = 22u16;
    for l in text.lines() {
        if let Some(h) = l.strip_prefix("hostname ") {
            host = Some(h.trim().to_string());
        } else if let Some(p) = l.strip_prefix("port ") {
            port = p.trim().parse().unwrap_or(22);
        }
    }
    host.map(|h| (h, port)).ok_or_else(|| LaunchError::Host {
        host: name.into(),
        msg: format!(
            "ssh -G printed no hostname: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        ),
    })
}

/// `addr` on port 22, else `[addr]:port`: how known_hosts names a host.
pub fn known_as(addr: &str, port: u16) -> String {
    if port == 22 {
        addr.to_string()
    } else {
        format!("[{addr}]:{port}")
    }
}

/// `SHA256:...` of a key (`base64` of the key blob), as `ssh-keygen -l` prints it.
pub fn fingerprint(key_b64: &str) -> Result<String, LaunchError> {
    use sha2::Digest as _;
    let blob = b64_decode(key_b64)
        .ok_or_else(|| LaunchError::Usage(format!("not a base64 key: {key_b64:.20}...")))?;
    let d = sha2::Sha256::digest(&blob);
    Ok(format!("SHA256:{}", b64_encode_nopad(&d)))
}

const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

fn b64_encode_nopad(data: &[u8]) -> String {
    let mut s = String::new();
    for c in data.chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        for k in 0..=c.len() {
            s.push(B64[(n >> (18 - 6 * k) & 63) as usize] as char);
        }
    }
    s
}

fn b64_decode(s: &str) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    let mut acc = 0u32;
    let mut bits = 0;
    for b in s.trim_end_matches('=').bytes() {
        let v = B64.iter().position(|&x| x == b)? as u32;
        acc = acc << 6 | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    Some(out)
}

/// Reads an expected-fingerprints file: lines `HOST SHA256:...` or `ssh-keygen -l` output
/// (`256 SHA256:... HOST (ED25519)`); `#` comments.
pub fn parse_expect(text: &str) -> Result<Vec<(String, String)>, LaunchError> {
    let mut v = Vec::new();
    for (n, l) in text.lines().enumerate() {
        let l = l.trim();
        if l.is_empty() || l.starts_with('#') {
            continue;
        }
        let w: Vec<&str> = l.split_whitespace().collect();
        let pair = match w.as_slice() {
            [h, f] if f.starts_with("SHA256:") => (h.to_string(), f.to_string()),
            [_, f, h, ..] if f.starts_with("SHA256:") => (h.to_string(), f.to_string()),
            _ => {
                return Err(LaunchError::Usage(format!(
                    "expected fingerprints, line {}: {l:?} is neither `HOST SHA256:...` nor `BITS SHA256:... HOST (TYPE)`",
                    n + 1
                )));
            }
        };
        v.push(pair);
    }
    Ok(v)
}

/// Collects every node's host key (ed25519) by `ssh-keyscan` of its address.
pub fn collect_keys(
    hosts_: &[Box<dyn HostRunner>],
    timeout: Duration,
) -> Result<Vec<HostKey>, LaunchError> {
    par(hosts_, |_, h| {
        let opts = h.ssh_options().ok_or_else(|| {
            LaunchError::Usage(format!(
                "{}: weft mesh works on hosts reached over SSH (--via ssh)",
                h.name()
            ))
        })?;
        let (addr, port) = resolve(h.name(), &opts)?;
        let mut c = std::process::Command::new("ssh-keyscan");
        c.args([
            "-T",
            &timeout.as_secs().max(1).to_string(),
            "-t",
            "ed25519",
            "-p",
            &port.to_string(),
            &addr,
        ]);
        let o = crate::hosts::run_local(c, timeout + Duration::from_secs(5)).map_err(|e| {
            LaunchError::Host {
                host: h.name().into(),
                msg: format!("ssh-keyscan: {e}"),
            }
        })?;
        let text = String::from_utf8_lossy(&o.stdout);
        let line = text
            .lines()
            .find(|l| !l.starts_with('#') && l.split_whitespace().count() >= 3)
            .ok_or_else(|| LaunchError::Host {
                host: h.name().into(),
                msg: format!(
                    "ssh-keyscan of {} found no ed25519 host key: {}",
                    known_as(&addr, port),
                    String::from_utf8_lossy(&o.stderr).trim()
                ),
            })?;
        let w: Vec<&str> = line.split_whitespace().collect();
        Ok(HostKey {
            host: h.name().into(),
            known_as: known_as(&addr, port),
            key_type: w[1].into(),
            key: w[2].into(),
            fingerprint: fingerprint(w[2])?,
        })
    })
}

/// Checks `keys` against the operator's expected fingerprints; the first that is not there
/// is an error naming the host.
pub fn confirm(keys: &[HostKey], expect: &[(String, String)]) -> Result<(), LaunchError> {
    for k in keys {
        let ok = expect
            .iter()
            .any(|(h, f)| (h == &k.host || h == &k.known_as) && f == &k.fingerprint);
        if !ok {
            let known: Vec<&str> = expect
                .iter()
                .filter(|(h, _)| h == &k.host || h == &k.known_as)
                .map(|(_, f)| f.as_str())
                .collect();
            return Err(LaunchError::Usage(format!(
                "host key of {} ({}) is {}, {}: refused",
                k.host,
                k.known_as,
                k.fingerprint,
                if known.is_empty() {
                    "which the expected fingerprints do not list".to_string()
                } else {
                    format!("the expected fingerprints say {}", known.join(" or "))
                }
            )));
        }
    }
    Ok(())
}

/// The key lines a node's known_hosts file holds for each of `names` (`ssh-keygen -F`), in
/// one session.
fn known_lines(
    h: &dyn HostRunner,
    file: &str,
    names: &[String],
    bound: Duration,
) -> Result<Vec<Vec<(String, String)>>, LaunchError> {
    let script = format!(
        "f={f}; for n in \"$@\"; do echo \"@@ $n\"; [ -f \"$f\" ] && ssh-keygen -F \"$n\" -f \"$f\" 2>/dev/null; done; true",
        f = sh_path(file)
    );
    let out = hosts::sh(h, "read known_hosts", &script, names, bound)?;
    let mut v: Vec<Vec<(String, String)>> = Vec::new();
    for l in out.lines() {
        if l.starts_with("@@ ") {
            v.push(Vec::new());
            continue;
        }
        let w: Vec<&str> = l.split_whitespace().collect();
        if !l.starts_with('#')
            && w.len() >= 3
            && let Some(cur) = v.last_mut()
        {
            cur.push((w[1].to_string(), w[2].to_string()));
        }
    }
    if v.len() != names.len() {
        return Err(LaunchError::Host {
            host: h.name().into(),
            msg: format!(
                "read known_hosts: {} answers for {} names",
                v.len(),
                names.len()
            ),
        });
    }
    Ok(v)
}

/// Runs the mesh. See the module docs.
pub fn mesh(
    hosts_: &[Box<dyn HostRunner>],
    keys: &[HostKey],
    o: &MeshOptions,
) -> Result<MeshReport, LaunchError> {
    let n = hosts_.len();
    let b = o.bound;
    if !o.check
        && let Some(e) = &o.expect
    {
        confirm(keys, e)?;
    }
    // The operator reaches every node (strictly, the first call to each): nothing below
    // runs on a host it cannot. Changed host keys anywhere: refuse before writing.
    let names: Vec<String> = keys.iter().map(|k| k.known_as.clone()).collect();
    let found = par(hosts_, |_, h| {
        known_lines(h, &hosts::per_host(&o.known_hosts, h.name()), &names, b)
    })?;
    let mut changed = Vec::new();
    let mut missing_known: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for (i, h) in hosts_.iter().enumerate() {
        for (j, k) in keys.iter().enumerate() {
            if i == j {
                continue;
            }
            let lines = &found[i][j];
            let same = lines
                .iter()
                .any(|(t, key)| t == &k.key_type && key == &k.key);
            for (t, key) in lines {
                if t == &k.key_type && key != &k.key {
                    changed.push(Changed {
                        host: k.host.clone(),
                        on: h.name().into(),
                        known: fingerprint(key).unwrap_or_else(|_| "?".into()),
                        presented: k.fingerprint.clone(),
                    });
                }
            }
            if !same {
                missing_known.entry(i).or_default().push(j);
            }
        }
    }
    let mut report = MeshReport {
        keys: keys.to_vec(),
        changed: changed.clone(),
        generated: vec![],
        authorized_added: 0,
        known_added: 0,
        missing: missing_known.values().map(Vec::len).sum(),
        pairs: vec![],
        ok: false,
    };
    if !changed.is_empty() {
        return Ok(report);
    }
    if !o.check {
        // Node keys.
        let got = par(hosts_, |_, h| {
            let id = sh_path(&hosts::per_host(&o.identity, h.name()));
            let script = format!(
                "id={id}; if [ ! -f \"$id\" ]; then mkdir -p \"$(dirname \"$id\")\" && ssh-keygen -q -t ed25519 -N '' -C \"weft-mesh@$1\" -f \"$id\" </dev/null && echo generated; fi; cat \"$id.pub\""
            );
            let out = hosts::sh(h, "node key", &script, &[h.name().to_string()], b)?;
            let key = out
                .lines()
                .rev()
                .find(|l| l.starts_with("ssh-"))
                .ok_or_else(|| LaunchError::Host {
                    host: h.name().into(),
                    msg: "no public key printed".into(),
                })?;
            Ok((
                out.lines().next() == Some("generated"),
                key.trim().to_string(),
            ))
        })?;
        let mut pubs: Vec<String> = Vec::with_capacity(n);
        for (h, (generated, key)) in hosts_.iter().zip(got) {
            if generated {
                report.generated.push(h.name().into());
            }
            pubs.push(key);
        }
        // authorized_keys and known_hosts, each line once.
        let add = |path: &str| {
            format!(
                "set -e; f={}; mkdir -p \"$(dirname \"$f\")\"; [ -e \"$f\" ] || {{ touch \"$f\"; chmod 600 \"$f\"; }}; n=0; for l in \"$@\"; do grep -qxF \"$l\" \"$f\" || {{ printf '%s\\n' \"$l\" >> \"$f\"; n=$((n+1)); }}; done; echo $n",
                sh_path(path)
            )
        };
        let added = par(hosts_, |i, h| {
            let auth = hosts::per_host(&o.authorized_keys, h.name());
            let args: Vec<String> = (0..n)
                .filter(|&j| j != i)
                .map(|j| pubs[j].clone())
                .collect();
            let a = hosts::sh(h, "authorized_keys", &add(&auth), &args, b)?;
            let mut k = String::from("0");
            if let Some(js) = missing_known.get(&i) {
                let kh = hosts::per_host(&o.known_hosts, h.name());
                let args: Vec<String> = js
                    .iter()
                    .map(|&j| format!("{} {} {}", keys[j].known_as, keys[j].key_type, keys[j].key))
                    .collect();
                k = hosts::sh(h, "known_hosts", &add(&kh), &args, b)?;
            }
            Ok((
                a.trim().parse::<usize>().unwrap_or(0),
                k.trim().parse::<usize>().unwrap_or(0),
            ))
        })?;
        for (a, k) in added {
            report.authorized_added += a;
            report.known_added += k;
        }
        report.missing = 0;
    }
    let all: Vec<usize> = (0..n).collect();
    let pairs = hosts::probe_all(hosts_, &all, &all, o.connect_timeout, b);
    report.pairs = pairs
        .into_iter()
        .map(|p| {
            let (from, to) = (
                hosts_[p.src].name().to_string(),
                hosts_[p.dst].name().to_string(),
            );
            match p.outcome {
                Outcome::Reached => Pair {
                    from,
                    to,
                    ok: true,
                    error: None,
                    remedy: None,
                },
                Outcome::Failed { status, error } => Pair {
                    remedy: Some(hosts::remedy(&from, &to, status, &error)),
                    from,
                    to,
                    ok: false,
                    error: Some(error),
                },
                Outcome::NotRun(e) => Pair {
                    from,
                    to,
                    ok: false,
                    error: Some(e),
                    remedy: None,
                },
            }
        })
        .collect();
    report.ok =
        report.changed.is_empty() && report.missing == 0 && report.pairs.iter().all(|p| p.ok);
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprints_match_ssh_keygen() {
        let d = tempfile::tempdir().unwrap();
        let key = d.path().join("k");
        let st = std::process::Command::new("ssh-keygen")
            .args(["-q", "-t", "ed25519", "-N", "", "-f"])
            .arg(&key)
            .status()
            .expect("ssh-keygen (openssh-client) runs");
        assert!(st.success());
        let o = std::process::Command::new("ssh-keygen")
            .arg("-lf")
            .arg(&key)
            .output()
            .unwrap();
        let want = String::from_utf8_lossy(&o.stdout)
            .split_whitespace()
            .nth(1)
            .unwrap()
            .to_string();
        let pubkey = std::fs::read_to_string(key.with_extension("pub")).unwrap();
        let b64 = pubkey.split_whitespace().nth(1).unwrap();
        assert_eq!(fingerprint(b64).unwrap(), want);
        assert_eq!(
            b64_decode(&b64_encode_nopad(b"weft mesh")).unwrap(),
            b"weft mesh"
        );
    }

    #[test]
    fn expected_fingerprints_in_both_forms() {
        let v =
            parse_expect("# cluster\nnode1 SHA256:abc\n256 SHA256:def node2 (ED25519)\n").unwrap();
        assert_eq!(
            v,
            [
                ("node1".to_string(), "SHA256:abc".to_string()),
                ("node2".into(), "SHA256:def".into())
            ]
        );
        assert!(
            parse_expect("node1 abc\n")
                .unwrap_err()
                .to_string()
                .contains("line 1")
        );
        let keys = [HostKey {
            host: "node1".into(),
            known_as: "10.0.0.1".into(),
            key_type: "ssh-ed25519".into(),
            key: "x".into(),
            fingerprint: "SHA256:zzz".into(),
        }];
        let e = confirm(&keys, &v).unwrap_err().to_string();
        assert!(
            e.contains("node1") && e.contains("SHA256:zzz") && e.contains("SHA256:abc"),
            "{e}"
        );
        confirm(&keys, &[("10.0.0.1".into(), "SHA256:zzz".into())]).unwrap();
    }
}
