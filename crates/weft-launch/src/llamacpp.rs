//! The llama.cpp recipe: `weft run --hosts a,b,c -- llama-server -m MODEL.gguf ...` runs
//! llama.cpp's RPC backend across the nodes.
//!
//! * Every node but the first runs ggml's RPC server (`ggml-rpc-server`, or `rpc-server`
//!   as older builds name it; the one beside the `llama-server` named, else the node's PATH)
//!   with `--host <its data address> --port <MASTER_PORT>`. It binds the data address only: ggml's RPC protocol has no
//!   authentication, so it must not listen on a management or public network.
//! * The first node waits until every rpc-server accepts a connection (each connection
//!   attempt bounded by 2 s, all of them by [`RPC_WAIT_S`]; a server that never answers is a
//!   failure naming its address), then runs the user's `llama-server` with `--rpc` listing
//!   them in node order. llama.cpp then treats each remote node as one device: the layers it
//!   offloads (`-ngl`) are split over them (`--tensor-split`), the others stay on the first
//!   node's own device. One sequence runs through the devices in turn: a pipeline.
//! * [`placement`]: the `-ngl` and `--tensor-split` that put a planned pipeline's stages
//!   (layers per node, stage 0 on the first node) on the nodes, which `weft run --plan`
//!   adds.
//!
//! A single node runs the command as it is. The job ends when `llama-server` exits (the
//! rpc-servers are then stopped), like the vLLM recipe.

use crate::LaunchError;
use crate::hosts::shell_quote;
use crate::run::NodeNet;

/// How long the first node waits for every rpc-server to accept connections.
pub const RPC_WAIT_S: u64 = 120;

/// Whether `cmd` is llama.cpp's server (by its file name).
pub fn is_llama_server(cmd: &[String]) -> bool {
    cmd.first()
        .is_some_and(|c| c.rsplit('/').next() == Some("llama-server"))
}

/// The names of ggml's RPC server: `ggml-rpc-server` since llama.cpp renamed it, then the
/// older `rpc-server`.
pub const RPC_SERVERS: [&str; 2] = ["ggml-rpc-server", "rpc-server"];

/// Where to look for the RPC server that goes with `llama_server`, in order: beside it when
/// the command names a path, else on the node's PATH.
pub fn rpc_server_for(llama_server: &str) -> Vec<String> {
    match llama_server.rsplit_once('/') {
        Some((dir, _)) => RPC_SERVERS.iter().map(|b| format!("{dir}/{b}")).collect(),
        None => RPC_SERVERS.iter().map(|b| b.to_string()).collect(),
    }
}

/// The `host:port` of node `i`'s rpc-server.
fn endpoint(n: &NodeNet, port: u16) -> String {
    format!("{}:{port}", n.data_addr)
}

/// The command node `rank` of `nodes` runs (see the module docs).
pub fn node_argv(
    cmd: &[String],
    nodes: &[NodeNet],
    rank: usize,
    port: u16,
) -> Result<Vec<String>, LaunchError> {
    if let Some(a) = cmd[1..]
        .iter()
        .find(|a| *a == "--rpc" || a.starts_with("--rpc="))
    {
        return Err(LaunchError::Usage(format!(
            "{a}: weft run starts an rpc-server on every node but the first and passes --rpc itself; leave it out"
        )));
    }
    if nodes.len() <= 1 {
        return Ok(cmd.to_vec());
    }
    if rank > 0 {
        // The first of the candidates the node has; none is a failure naming them.
        let cands = rpc_server_for(&cmd[0]);
        let list = cands
            .iter()
            .map(|c| shell_quote(c))
            .collect::<Vec<_>>()
            .join(" ");
        let script = format!(
            "for b in {list}; do p=$(command -v \"$b\") && exec \"$p\" \"$@\"; done; \
             echo \"weft run: none of {list} on this node (llama.cpp built with GGML_RPC=ON has it)\" >&2; exit 127"
        );
        return Ok(vec![
            "bash".into(),
            "-c".into(),
            script,
            "rpc-server".into(),
            "--host".into(),
            nodes[rank].data_addr.to_string(),
            "--port".into(),
            port.to_string(),
        ]);
    }
    let eps: Vec<String> = nodes[1..].iter().map(|n| endpoint(n, port)).collect();
    let mut line: Vec<String> = cmd.iter().map(|a| shell_quote(a)).collect();
    line.push("--rpc".into());
    line.push(eps.join(","));
    // bash for /dev/tcp; `timeout` bounds each attempt (an unreachable address would
    // otherwise wait for TCP's own timeout), SECONDS the whole wait.
    let script = format!(
        "for ep in {eps}; do h=${{ep%:*}}; p=${{ep##*:}}; \
         until timeout 2 bash -c \"exec 3<>/dev/tcp/$h/$p\" 2>/dev/null; do \
         if [ \"$SECONDS\" -ge {wait} ]; then echo \"weft run: the rpc-server on $ep did not accept a connection within {wait} s\" >&2; exit 1; fi; \
         sleep 0.2; done; done; exec {line}",
        eps = eps.join(" "),
        wait = RPC_WAIT_S,
        line = line.join(" "),
    );
    Ok(vec!["bash".into(), "-c".into(), script])
}

/// `-ngl` and `--tensor-split` for a pipeline of `stage_layers` (layers per stage, in
/// order; stage 0 on the first node, stage i on the i-th rpc-server): the first stage's
/// layers stay on the first node, the others are offloaded, split in proportion to their
/// layer counts, the output layer with the last stage. llama.cpp offloads the last
/// `n_gpu_layers` of its `n_layer + 1` layers (the output counted as one) and gives each
/// device the layers whose index falls in its share of the split, so counts as the split
/// place exactly these layers.
pub fn placement(stage_layers: &[u64]) -> Result<Vec<String>, LaunchError> {
    if stage_layers.len() < 2 {
        return Ok(Vec::new());
    }
    if let Some(i) = stage_layers.iter().position(|&l| l == 0) {
        return Err(LaunchError::Usage(format!(
            "pipeline stage {i} has no layers: llama.cpp cannot place an empty stage"
        )));
    }
    let offloaded: u64 = stage_layers[1..].iter().sum::<u64>() + 1;
    let last = stage_layers.len() - 1;
    let split: Vec<String> = stage_layers[1..]
        .iter()
        .enumerate()
        .map(|(i, &l)| (if i + 1 == last { l + 1 } else { l }).to_string())
        .collect();
    Ok(vec![
        "--n-gpu-layers".into(),
        offloaded.to_string(),
        "--tensor-split".into(),
        split.join(","),
    ])
}

/// The layer each device gets under llama.cpp's rule (see [`placement`]): for layer `il`
/// of `n_layer + 1`, the first device whose cumulative share exceeds
/// `(il - first_offloaded) / offloaded`; `None` for the first node's own layers. Used to
/// check [`placement`] against the rule it relies on.
pub fn device_of_layer(n_layer: u64, ngl: u64, split: &[u64], il: u64) -> Option<usize> {
    let total = n_layer + 1;
    let act = ngl.min(total);
    let start = total - act;
    if il < start {
        return None;
    }
    let sum: u64 = split.iter().sum();
    let mut cum = 0.0;
    let x = (il - start) as f64 / act as f64;
    for (d, s) in split.iter().enumerate() {
        cum += *s as f64 / sum as f64;
        if x < cum {
            return Some(d);
        }
    }
    Some(split.len() - 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn nodes(n: usize) -> Vec<NodeNet> {
        (0..n)
            .map(|i| NodeNet {
                host: format!("n{i}"),
                mgmt_if: "mgmt0".into(),
                mgmt_addr: Ipv4Addr::new(10, 0, 0, 1 + i as u8),
                data_ifs: vec!["data0".into()],
                data_addr: Ipv4Addr::new(10, 1, 0, 1 + i as u8),
                rdma_devs: vec![],
            })
            .collect()
    }

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn the_head_waits_for_every_rpc_server_and_the_others_serve_their_data_address() {
        let cmd = s(&["/opt/llama/bin/llama-server", "-m", "/m/a b.gguf"]);
        assert!(is_llama_server(&cmd));
        let ns = nodes(3);
        let w = node_argv(&cmd, &ns, 2, 29500).unwrap();
        assert_eq!(w[0], "bash");
        assert!(
            w[2].starts_with(
                "for b in /opt/llama/bin/ggml-rpc-server /opt/llama/bin/rpc-server; do"
            ),
            "{w:?}"
        );
        assert_eq!(w[4..].join(" "), "--host 10.1.0.3 --port 29500");
        // The script runs the first candidate there is, with the arguments.
        let dir = tempfile::tempdir().unwrap();
        let fake = dir.path().join("rpc-server");
        std::fs::write(&fake, "#!/bin/sh\necho \"$0 $*\"\n").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
        let server = format!("{}/llama-server", dir.path().display());
        let w = node_argv(&s(&[&server]), &ns, 1, 7).unwrap();
        let o = std::process::Command::new(&w[0])
            .args(&w[1..])
            .output()
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&o.stdout).trim(),
            format!("{} --host 10.1.0.2 --port 7", fake.display())
        );
        std::fs::remove_file(&fake).unwrap();
        let o = std::process::Command::new(&w[0])
            .args(&w[1..])
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(127));
        assert!(String::from_utf8_lossy(&o.stderr).contains("none of"));
        let h = node_argv(&cmd, &ns, 0, 29500).unwrap();
        assert_eq!(h[0], "bash");
        assert!(
            h[2].contains("for ep in 10.1.0.2:29500 10.1.0.3:29500;"),
            "{h:?}"
        );
        assert!(
            h[2].ends_with(
                "exec /opt/llama/bin/llama-server -m '/m/a b.gguf' --rpc 10.1.0.2:29500,10.1.0.3:29500"
            ),
            "{h:?}"
        );
        assert!(h[2].contains("within 120 s"), "{h:?}");
        // One node: the command as it is.
        assert_eq!(node_argv(&cmd, &ns[..1], 0, 1).unwrap(), cmd);
        assert_eq!(
            rpc_server_for("llama-server"),
            ["ggml-rpc-server", "rpc-server"]
        );
        let e = node_argv(&s(&["llama-server", "--rpc", "x:1"]), &ns, 0, 1).unwrap_err();
        assert!(e.to_string().contains("--rpc: weft run starts"), "{e}");
    }

    #[test]
    fn placement_puts_each_planned_stage_on_its_node() {
        for stages in [vec![3u64, 3], vec![2, 2, 2], vec![5, 1, 2], vec![1, 6]] {
            let f = placement(&stages).unwrap();
            let ngl: u64 = f[1].parse().unwrap();
            let split: Vec<u64> = f[3].split(',').map(|x| x.parse().unwrap()).collect();
            let n_layer: u64 = stages.iter().sum();
            let mut got = vec![0u64; stages.len()];
            for il in 0..n_layer {
                got[device_of_layer(n_layer, ngl, &split, il).map_or(0, |d| d + 1)] += 1;
            }
            assert_eq!(got, stages, "{f:?}");
            // The output layer goes with the last stage.
            assert_eq!(
                device_of_layer(n_layer, ngl, &split, n_layer),
                Some(stages.len() - 2)
            );
        }
        assert!(placement(&[4]).unwrap().is_empty());
        assert!(
            placement(&[4, 0])
                .unwrap_err()
                .to_string()
                .contains("stage 1")
        );
    }
}
