//! `--group NAME` for the commands that work on a group's nodes (`weft plan`, `weft run`):
//! the members, their liveness and the GPUs their agents reported, from the controller's
//! `GET /v1/groups/{group}/nodes`. Glue only.

use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use weft_controller::auth::Secret;
use weft_controller::client::Client;
use weft_controller::model::{Liveness, NodeView};

/// Where the controller is, for `--group`.
#[derive(Args, Clone, Debug)]
pub struct GroupArgs {
    /// Take the nodes from this group of the controller (the members, and the GPUs their
    /// agents reported).
    #[arg(long, value_name = "NAME")]
    pub group: Option<String>,
    /// The controller's API (with --group).
    #[arg(long, env = "WEFT_CONTROLLER", default_value = "http://127.0.0.1:7100")]
    pub controller: String,
    /// API token (with --group): an admin's, or the group's tenant's.
    #[arg(long, env = "WEFT_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
}

/// The members of `name`, in the group's order, from the controller (bounded: 10 s).
pub fn nodes(a: &GroupArgs, name: &str) -> Result<Vec<NodeView>> {
    let client = Client::new(
        &a.controller,
        a.token.clone().map(Secret::new),
        Duration::from_secs(10),
    )?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(client.group_nodes(name)).with_context(|| {
        format!(
            "--group {name}: the nodes of the group from {}",
            a.controller
        )
    })
}

/// The planner's view of a node.
pub fn plan_node(n: &NodeView) -> weft_plan::cluster::NodeGpus {
    weft_plan::cluster::NodeGpus {
        name: n.name.clone(),
        memory_bytes: n.gpus.iter().map(|g| g.memory_total_bytes).collect(),
        live: n.liveness == Liveness::Ok,
    }
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
    hosts.hosts = nodes
        .iter()
        .map(|n| n.name.as_str())
        .collect::<Vec<_>>()
        .join(",");
    Ok(nodes)
}
