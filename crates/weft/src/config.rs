//! weft's configuration: a TOML file, then environment variables, then flags.
//!
//! The file is found at `--config`, else `$WEFT_CONFIG`, else `./weft.toml`; a missing
//! default file means the built-in defaults. Unknown keys are an error that names them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use serde::Deserialize;
use weft_fabric::Guid;
use weft_opensm::{DiagTools, LocalSm, VerifyScope};

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub fabric: FabricConfig,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FabricConfig {
    /// How long the master may take to finish the sweep that follows a reread.
    #[serde(default = "default_sweep_ms")]
    pub sweep_timeout_ms: u64,
    /// How long ports may take to show the planned tables after that sweep.
    #[serde(default = "default_verify_ms")]
    pub verify_timeout_ms: u64,
    /// Mirrors OpenSM's `allow_both_pkeys`; it changes what `=both` programs.
    #[serde(default)]
    pub allow_both_pkeys: bool,
    /// Which ports an apply reads back: "changed" (touched ports, SM ports and
    /// canaries) or "all".
    #[serde(default)]
    pub verify_scope: VerifyScope,
    #[serde(default)]
    pub diag: DiagConfig,
    /// The subnet managers that share the partitions config: one master, any standbys.
    #[serde(default)]
    pub sm: Vec<SmConfig>,
}

fn default_sweep_ms() -> u64 {
    5000
}
fn default_verify_ms() -> u64 {
    5000
}

impl Default for FabricConfig {
    fn default() -> Self {
        FabricConfig {
            sweep_timeout_ms: default_sweep_ms(),
            verify_timeout_ms: default_verify_ms(),
            allow_both_pkeys: false,
            verify_scope: VerifyScope::default(),
            diag: DiagConfig::default(),
            sm: Vec::new(),
        }
    }
}

/// How to run the InfiniBand diagnostic tools (on a simulated fabric, with the preload).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DiagConfig {
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    pub cwd: Option<PathBuf>,
    #[serde(default = "default_diag_ms")]
    pub timeout_ms: u64,
    #[serde(default = "default_parallel")]
    pub parallel: usize,
}

fn default_diag_ms() -> u64 {
    10_000
}
fn default_parallel() -> usize {
    4
}

impl Default for DiagConfig {
    fn default() -> Self {
        DiagConfig {
            env: BTreeMap::new(),
            cwd: None,
            timeout_ms: default_diag_ms(),
            parallel: default_parallel(),
        }
    }
}

/// One OpenSM on this machine.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SmConfig {
    pub name: String,
    /// The port OpenSM is bound to (its `-g`); `sminfo` names the master by it.
    pub port_guid: String,
    #[serde(default = "default_partitions_file")]
    pub partitions_file: PathBuf,
    pub pid_file: PathBuf,
    #[serde(default = "default_log_file")]
    pub log_file: PathBuf,
}

fn default_partitions_file() -> PathBuf {
    "/etc/opensm/partitions.conf".into()
}
fn default_log_file() -> PathBuf {
    "/var/log/opensm.log".into()
}

impl Config {
    /// Loads the file named by `explicit`, else `$WEFT_CONFIG` (the caller passes it via
    /// clap), else `./weft.toml` when it exists.
    pub fn load(explicit: Option<&Path>) -> Result<Config> {
        let (path, required) = match explicit {
            Some(p) => (p.to_path_buf(), true),
            None => (PathBuf::from("weft.toml"), false),
        };
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if !required && e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(Config::default());
            }
            Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
        };
        toml::from_str(&text).with_context(|| format!("config file {}", path.display()))
    }
}

impl FabricConfig {
    pub fn diag_tools(&self) -> DiagTools {
        DiagTools {
            env: self
                .diag
                .env
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            cwd: self.diag.cwd.clone(),
            timeout: Duration::from_millis(self.diag.timeout_ms),
            parallel: self.diag.parallel.max(1),
        }
    }

    pub fn local_sms(&self) -> Result<Vec<LocalSm>> {
        self.sm
            .iter()
            .map(|s| {
                let port_guid: Guid = s.port_guid.parse().map_err(|e| {
                    anyhow::anyhow!("config: SM `{}`: port_guid `{}`: {e}", s.name, s.port_guid)
                })?;
                Ok(LocalSm {
                    name: s.name.clone(),
                    port_guid,
                    partitions_file: s.partitions_file.clone(),
                    pid_file: s.pid_file.clone(),
                    log_file: s.log_file.clone(),
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_keys_are_named() {
        let err = toml::from_str::<Config>("[fabric]\nsweep_timeout = 3\n").unwrap_err();
        assert!(err.to_string().contains("sweep_timeout"), "{err}");
    }

    #[test]
    fn defaults_fill_what_the_file_leaves_out() {
        let c: Config = toml::from_str(
            "[[fabric.sm]]\nname = \"primary\"\nport_guid = \"0x0002c90300000a01\"\npid_file = \"/run/opensm.pid\"\n",
        )
        .unwrap();
        assert_eq!(c.fabric.sweep_timeout_ms, 5000);
        let sms = c.fabric.local_sms().unwrap();
        assert_eq!(sms[0].port_guid, Guid(0x0002c90300000a01));
        assert_eq!(
            sms[0].partitions_file,
            PathBuf::from("/etc/opensm/partitions.conf")
        );
    }

    #[test]
    fn a_bad_guid_names_the_sm() {
        let c: Config = toml::from_str(
            "[[fabric.sm]]\nname = \"primary\"\nport_guid = \"node3\"\npid_file = \"/p\"\n",
        )
        .unwrap();
        let err = c.fabric.local_sms().unwrap_err().to_string();
        assert!(err.contains("primary") && err.contains("node3"), "{err}");
    }
}
