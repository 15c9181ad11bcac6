//! `--group NAME` for the commands that work on a group's nodes (`weft plan`, `weft run`):
//! the members, their liveness and the GPUs their agents reported, from the controller's
//! `GET /v1/groups/{group}/nodes`. Glue only.

use anyhow::{Context, Result};
use clap::Args;
use weft_controller::model::NodeView;

/// Where the controller is, for `--group`: the same flags, variables and `[controller]`
/// section of weft.toml (URL, token, CA file or pin) as every other controller command.
#[derive(Args)]
pub struct GroupArgs {
    /// Take the nodes from this group of the controller (the members, and the GPUs their
    /// agents reported).
    #[arg(long, value_name = "NAME")]
    pub group: Option<String>,
    #[command(flatten)]
    pub remote: crate::cluster::Remote,
}

/// The members of `name`, in the group's order, from the controller (bounded by
/// `--timeout-s`). weft.toml is read here, only when `--group` is used.
pub fn nodes(a: &GroupArgs, name: &str) -> Result<Vec<NodeView>> {
    let cfg = crate::config::Config::load(crate::config_path().as_deref())?;
    let (client, _url) = crate::cluster::client_for(&a.remote, &cfg.controller)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(client.group_nodes(name))
        .with_context(|| format!("--group {name}: the nodes of the group"))
}

/// `--group NAME` in place of `--hosts`: the group's members, reached by name over SSH
/// (what `--via` says). Both, or neither, is a usage error.
pub fn fill_hosts(hosts: &mut crate::bench::HostArgs, g: &GroupArgs) -> Result<Vec<NodeView>> {
    let Some(name) = &g.group else {
        return Ok(Vec::new());
    };
    if !hosts.hosts.trim().is_empty() {
        anyhow::bail!("--hosts and --group {name}: give one of them");
    }
    let nodes = nodes(g, name)?;
    if nodes.is_empty() {
        anyhow::bail!("--group {name}: the group has no members");
    }
    hosts.members = nodes.iter().map(|n| n.name.clone()).collect();
    Ok(nodes)
}
