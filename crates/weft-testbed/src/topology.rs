//! Simulated fabric descriptions and their rendering to an ibsim `net` file.
//!
//! # GUID scheme
//!
//! Every GUID is pinned in the rendered `net` file (`caguid=` / `switchguid=` lines), so the
//! same topology always yields the same GUIDs. All GUIDs share the Mellanox OUI prefix
//! `0x0002c903` in the upper 32 bits; the lower 32 bits encode the role:
//!
//! | node | node GUID | port GUID(s) |
//! |---|---|---|
//! | HCA `nodeN` (N = 1, 2, …) | `0x0002c903_0000_0000 + N·0x100` | node GUID + port number |
//! | SM host `smhost` / `smhost2` | `0x0002c903_0100_0100` / `0x0002c903_0100_0200` | node GUID + port number |
//! | k-th switch (k = 1, 2, …, in [`Topology::switches`] order) | `0x0002c903_1000_0000 + k·0x100` | = node GUID (switch port 0) |
//!
//! So `node1` has node GUID `0x0002c90300000100` and port GUID `0x0002c90300000101`; port 2 of
//! a dual-port `node12` is `0x0002c90300000c02`. This is ibsim's own rule (for a CA, port GUID
//! = `caguid` + port number), see `parse_guidbase` in ibsim's `sim_net.c`.

use std::collections::{BTreeSet, HashMap};
use std::fmt::Write as _;

use crate::TestbedError;

/// Upper 32 bits shared by every GUID of a rendered topology.
pub const GUID_PREFIX: u64 = 0x0002_c903_0000_0000;

/// Node GUID of the HCA `node<n>` (n starts at 1).
pub const fn hca_node_guid(n: u32) -> u64 {
    GUID_PREFIX + (n as u64) * 0x100
}

/// Node GUID of the k-th SM host (1 = `smhost`, 2 = `smhost2`).
pub const fn sm_host_node_guid(k: u32) -> u64 {
    GUID_PREFIX + 0x0100_0000 + (k as u64) * 0x100
}

/// Node GUID (= port GUID) of the k-th switch (k starts at 1).
pub const fn switch_node_guid(k: u32) -> u64 {
    GUID_PREFIX + 0x1000_0000 + (k as u64) * 0x100
}

/// Name of the first SM host that [`Topology::single_switch`] and [`Topology::fat_tree`] add.
pub const SM_HOST: &str = "smhost";
/// Name of the second SM host (for a standby SM).
pub const SM_HOST2: &str = "smhost2";

/// A host channel adapter (end node) of a [`Topology`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimHca {
    /// Node name, also its NodeDescription and the `SIM_HOST` value that attaches to it.
    pub name: String,
    /// Pinned node GUID.
    pub node_guid: u64,
    /// `(port number, port GUID)` of every port, port numbers from 1. Only cabled ports are
    /// listed (every port that the built-in topologies create is cabled).
    pub port_guids: Vec<(u8, u64)>,
}

impl SimHca {
    /// GUID of port 1 (the port that `SIM_HOST=<name>` clients, such as an SM, use).
    pub fn first_port_guid(&self) -> Option<u64> {
        self.port_guids.first().map(|&(_, g)| g)
    }
}

/// A switch of a [`Topology`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimSwitch {
    /// Node name (NodeDescription).
    pub name: String,
    /// Pinned node GUID; also the GUID of switch port 0.
    pub node_guid: u64,
    /// Number of external ports.
    pub num_ports: u8,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Switch,
    Hca,
}

#[derive(Debug, Clone)]
struct Node {
    kind: Kind,
    name: String,
    guid: u64,
    ports: u8,
}

/// A simulated fabric description: switches, HCAs and cables, with pinned GUIDs.
///
/// Build one with [`Topology::single_switch`], [`Topology::fat_tree`], or by hand with
/// [`Topology::new`] + [`Topology::add_switch`] / [`Topology::add_hca`] / [`Topology::link`].
/// [`Topology::validate`] (also run by `SimFabric::start`) checks a hand-built one.
#[derive(Debug, Clone, Default)]
pub struct Topology {
    nodes: Vec<Node>,
    /// Cables: `((node index, port), (node index, port))`.
    links: Vec<((usize, u8), (usize, u8))>,
    hcas: Vec<SimHca>,
    switches: Vec<SimSwitch>,
}

impl Topology {
    /// An empty topology, for building by hand.
    pub fn new() -> Topology {
        Topology::default()
    }

    /// One switch `sw1`, `n` single-port HCAs named `node1..node<n>`, plus the two SM hosts
    /// `smhost` and `smhost2` (single-port HCAs).
    ///
    /// Cabling: `smhost` on sw1 port 1, `smhost2` on port 2, `node<i>` on port `i + 2`.
    /// The switch has `max(8, n + 2)` ports (at most 254, so `n <= 252`; larger values are
    /// rejected by [`Topology::validate`]).
    pub fn single_switch(n: usize) -> Topology {
        let mut t = Topology::new();
        let ports = (n + 2).max(8).min(usize::from(u8::MAX)) as u8;
        let sw = t.add_switch("sw1", ports, switch_node_guid(1));
        let sm1 = t.add_hca(SM_HOST, 1, sm_host_node_guid(1));
        let sm2 = t.add_hca(SM_HOST2, 1, sm_host_node_guid(2));
        t.link(sw, 1, sm1, 1);
        t.link(sw, 2, sm2, 1);
        for i in 1..=n {
            let h = t.add_hca(&format!("node{i}"), 1, hca_node_guid(i as u32));
            let port = (i + 2).min(usize::from(u8::MAX)) as u8;
            t.link(sw, port, h, 1);
        }
        t
    }

    /// Two-level fat tree.
    ///
    /// * `leaves` leaf switches `leaf1..` (at least 1; 0 is treated as 1) and `spines` spine
    ///   switches `spine1..`; every leaf is cabled to every spine (leaf `i` port `j` ↔ spine
    ///   `j` port `i`, so leaf ports `1..=spines` are uplinks).
    /// * `hcas` HCAs `node1..node<hcas>`; every `dual_every`-th one (`node<dual_every>`,
    ///   `node<2·dual_every>`, …) has two ports, both cabled (to different leaves when there is
    ///   more than one leaf). `dual_every == 0` means no dual-port HCAs.
    /// * plus `smhost` and `smhost2` (single-port).
    ///
    /// HCA ports are dealt round-robin over the leaves in the order `smhost`, `smhost2`,
    /// `node1` port 1, `node1` port 2 (if dual), `node2` …, so the load is even and the two
    /// ports of a dual HCA land on consecutive (different) leaves. Switch numbering for the
    /// GUID scheme: leaves first (`leaf1` = switch 1), then spines.
    pub fn fat_tree(leaves: usize, spines: usize, hcas: usize, dual_every: usize) -> Topology {
        let leaves = leaves.max(1);
        // Port plan: every HCA port in round-robin order.
        let mut plan: Vec<(String, u64, u8)> = Vec::new(); // (name, node guid, num ports)
        plan.push((SM_HOST.to_string(), sm_host_node_guid(1), 1));
        plan.push((SM_HOST2.to_string(), sm_host_node_guid(2), 1));
        for i in 1..=hcas {
            let dual = dual_every != 0 && i % dual_every == 0;
            plan.push((
                format!("node{i}"),
                hca_node_guid(i as u32),
                if dual { 2 } else { 1 },
            ));
        }
        let total_hca_ports: usize = plan.iter().map(|p| usize::from(p.2)).sum();
        let down_per_leaf = total_hca_ports.div_ceil(leaves);
        let leaf_ports = (spines + down_per_leaf).clamp(1, usize::from(u8::MAX)) as u8;
        let spine_ports = leaves.clamp(1, usize::from(u8::MAX)) as u8;

        let mut t = Topology::new();
        let mut leaf_idx = Vec::with_capacity(leaves);
        for l in 1..=leaves {
            leaf_idx.push(t.add_switch(
                &format!("leaf{l}"),
                leaf_ports,
                switch_node_guid(l as u32),
            ));
        }
        let mut spine_idx = Vec::with_capacity(spines);
        for s in 1..=spines {
            spine_idx.push(t.add_switch(
                &format!("spine{s}"),
                spine_ports,
                switch_node_guid((leaves + s) as u32),
            ));
        }
        for (li, &leaf) in leaf_idx.iter().enumerate() {
            for (si, &spine) in spine_idx.iter().enumerate() {
                t.link(leaf, port_num(si + 1), spine, port_num(li + 1));
            }
        }
        let mut next_free: Vec<usize> = vec![spines + 1; leaves];
        let mut rr = 0usize;
        for (name, guid, nports) in plan {
            let h = t.add_hca(&name, nports, guid);
            for p in 1..=nports {
                let leaf = rr % leaves;
                rr += 1;
                let lp = next_free[leaf];
                next_free[leaf] += 1;
                t.link(leaf_idx[leaf], port_num(lp), h, p);
            }
        }
        t
    }

    /// Add a switch with `ports` external ports; returns its node index for [`Topology::link`].
    pub fn add_switch(&mut self, name: &str, ports: u8, node_guid: u64) -> usize {
        self.nodes.push(Node {
            kind: Kind::Switch,
            name: name.to_string(),
            guid: node_guid,
            ports,
        });
        self.switches.push(SimSwitch {
            name: name.to_string(),
            node_guid,
            num_ports: ports,
        });
        self.nodes.len() - 1
    }

    /// Add an HCA with `ports` ports; port `p` gets GUID `node_guid + p`. Returns its node
    /// index for [`Topology::link`].
    pub fn add_hca(&mut self, name: &str, ports: u8, node_guid: u64) -> usize {
        self.nodes.push(Node {
            kind: Kind::Hca,
            name: name.to_string(),
            guid: node_guid,
            ports,
        });
        self.hcas.push(SimHca {
            name: name.to_string(),
            node_guid,
            port_guids: Vec::new(),
        });
        self.nodes.len() - 1
    }

    /// Cable port `a_port` of node `a` to port `b_port` of node `b` (node indexes as returned
    /// by the `add_*` methods). Mistakes are reported by [`Topology::validate`].
    pub fn link(&mut self, a: usize, a_port: u8, b: usize, b_port: u8) {
        self.links.push(((a, a_port), (b, b_port)));
        for (n, p) in [(a, a_port), (b, b_port)] {
            let Some(node) = self.nodes.get(n) else {
                continue;
            };
            if node.kind != Kind::Hca {
                continue;
            }
            let guid = node.guid + u64::from(p);
            if let Some(h) = self.hcas.iter_mut().find(|h| h.name == node.name)
                && !h.port_guids.iter().any(|&(q, _)| q == p)
            {
                h.port_guids.push((p, guid));
                h.port_guids.sort_unstable();
            }
        }
    }

    /// Every HCA, SM hosts included, in creation order (for the built-in topologies:
    /// `smhost`, `smhost2`, then `node1..`).
    pub fn hcas(&self) -> &[SimHca] {
        &self.hcas
    }

    /// The HCAs named `node*`, i.e. [`Topology::hcas`] without the SM hosts.
    pub fn end_nodes(&self) -> impl Iterator<Item = &SimHca> {
        self.hcas
            .iter()
            .filter(|h| h.name != SM_HOST && h.name != SM_HOST2)
    }

    /// Every switch, in creation order.
    pub fn switches(&self) -> &[SimSwitch] {
        &self.switches
    }

    /// The HCA with this name.
    pub fn hca(&self, name: &str) -> Option<&SimHca> {
        self.hcas.iter().find(|h| h.name == name)
    }

    /// Port GUID of `port` on the HCA `name`.
    pub fn port_guid(&self, name: &str, port: u8) -> Option<u64> {
        self.hca(name)?
            .port_guids
            .iter()
            .find(|&&(p, _)| p == port)
            .map(|&(_, g)| g)
    }

    /// Check names (non-empty, `[A-Za-z0-9_.-]`, unique), GUIDs (unique), port numbers
    /// (1..=ports) and that no port is cabled twice.
    pub fn validate(&self) -> Result<(), TestbedError> {
        let bad = |m: String| Err(TestbedError::InvalidTopology(m));
        let mut names = BTreeSet::new();
        let mut guids: HashMap<u64, &str> = HashMap::new();
        for n in &self.nodes {
            if n.name.is_empty()
                || !n
                    .name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
            {
                return bad(format!("bad node name {:?}", n.name));
            }
            if !names.insert(n.name.as_str()) {
                return bad(format!("duplicate node name {:?}", n.name));
            }
            if n.ports == 0 || (n.kind == Kind::Switch && n.ports == u8::MAX) {
                return bad(format!("node {:?} has bad port count {}", n.name, n.ports));
            }
            let own: Vec<u64> = match n.kind {
                Kind::Switch => vec![n.guid],
                Kind::Hca => std::iter::once(n.guid)
                    .chain((1..=n.ports).map(|p| n.guid + u64::from(p)))
                    .collect(),
            };
            for g in own {
                if let Some(other) = guids.insert(g, &n.name) {
                    return bad(format!("GUID {g:#018x} used by {other:?} and {:?}", n.name));
                }
            }
        }
        let mut used = BTreeSet::new();
        for &((a, ap), (b, bp)) in &self.links {
            for (i, p) in [(a, ap), (b, bp)] {
                let Some(n) = self.nodes.get(i) else {
                    return bad(format!("link refers to unknown node index {i}"));
                };
                if p == 0 || p > n.ports {
                    return bad(format!("node {:?} has no port {p}", n.name));
                }
                if !used.insert((i, p)) {
                    return bad(format!("port {p} of {:?} cabled twice", n.name));
                }
            }
            if a == b {
                return bad(format!("node {:?} cabled to itself", self.nodes[a].name));
            }
        }
        Ok(())
    }

    /// The ibsim `net` file (ibnetdiscover syntax plus ibsim's `caguid=`/`switchguid=` GUID
    /// pins). Every cable is written on both of its ends. Deterministic: the same topology
    /// always renders the same text. See the module docs for the GUID scheme.
    pub fn render_ibsim_net(&self) -> String {
        // (node, port) -> (remote node, remote port)
        let mut peer: HashMap<(usize, u8), (usize, u8)> = HashMap::new();
        for &(a, b) in &self.links {
            peer.insert(a, b);
            peer.insert(b, a);
        }
        let mut out = String::from("# ibsim net file generated by weft-testbed\n");
        for (i, n) in self.nodes.iter().enumerate() {
            out.push('\n');
            // `write!` into a String cannot fail.
            let _ = match n.kind {
                Kind::Switch => writeln!(
                    out,
                    "switchguid={:#018x}\nSwitch\t{} \"{}\"",
                    n.guid, n.ports, n.name
                ),
                Kind::Hca => writeln!(
                    out,
                    "caguid={:#018x}\nHca\t{} \"{}\"",
                    n.guid, n.ports, n.name
                ),
            };
            for p in 1..=n.ports {
                if let Some(&(r, rp)) = peer.get(&(i, p))
                    && let Some(rn) = self.nodes.get(r)
                {
                    let _ = writeln!(out, "[{p}]\t\"{}\"[{rp}]", rn.name);
                }
            }
        }
        out
    }
}

fn port_num(p: usize) -> u8 {
    // Out-of-range values are clamped to 255, which `validate` rejects (no node has port 255).
    u8::try_from(p).unwrap_or(u8::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn single_switch_guids_and_render() {
        let t = Topology::single_switch(4);
        t.validate().unwrap();
        assert_eq!(t.hcas().len(), 6);
        let n1 = t.hca("node1").unwrap();
        assert_eq!(n1.node_guid, 0x0002c90300000100);
        assert_eq!(n1.port_guids, vec![(1, 0x0002c90300000101)]);
        assert_eq!(t.port_guid("smhost", 1), Some(0x0002c90301000101));
        let net = t.render_ibsim_net();
        assert!(
            net.contains("switchguid=0x0002c90310000100\nSwitch\t8 \"sw1\"\n[1]\t\"smhost\"[1]\n")
        );
        assert!(net.contains("caguid=0x0002c90300000400\nHca\t1 \"node4\"\n[1]\t\"sw1\"[6]\n"));
        assert_eq!(net, Topology::single_switch(4).render_ibsim_net());
    }

    #[test]
    fn fat_tree_dual_ports_on_different_leaves() {
        let t = Topology::fat_tree(4, 2, 36, 4);
        t.validate().unwrap();
        assert_eq!(t.end_nodes().count(), 36);
        assert_eq!(t.switches().len(), 6);
        let n4 = t.hca("node4").unwrap();
        assert_eq!(
            n4.port_guids,
            vec![(1, 0x0002c90300000401), (2, 0x0002c90300000402)]
        );
        let n5 = t.hca("node5").unwrap();
        assert_eq!(n5.port_guids.len(), 1);
        let net = t.render_ibsim_net();
        let block = net
            .split("\n\n")
            .find(|b| b.contains("\"node4\"\n"))
            .unwrap();
        let lines: Vec<&str> = block.lines().collect();
        assert_eq!(lines[1], "Hca\t2 \"node4\"");
        let leaf_of = |l: &str| l.split('"').nth(1).unwrap().to_string();
        assert_ne!(leaf_of(lines[2]), leaf_of(lines[3]));
        // Every leaf-spine cable is there, on both ends.
        assert!(net.contains("[2]\t\"spine2\"[1]"));
        assert!(net.contains("[1]\t\"leaf2\"[1]") || net.contains("[2]\t\"leaf2\"[1]"));
    }

    #[test]
    fn fat_tree_hundreds_and_single_leaf() {
        Topology::fat_tree(8, 4, 200, 3).validate().unwrap();
        let t = Topology::fat_tree(0, 0, 5, 2);
        t.validate().unwrap();
        assert_eq!(t.switches().len(), 1);
    }

    #[test]
    fn validate_rejects_mistakes() {
        let mut t = Topology::new();
        let s = t.add_switch("s", 4, switch_node_guid(1));
        let h = t.add_hca("h", 1, hca_node_guid(1));
        t.link(s, 1, h, 1);
        t.validate().unwrap();
        t.link(s, 2, h, 1);
        assert!(t.validate().is_err());
        let mut t = Topology::new();
        t.add_hca("a b", 1, 1);
        assert!(t.validate().is_err());
        let mut t = Topology::new();
        t.add_hca("a", 1, 0x100);
        t.add_hca("b", 1, 0x100);
        assert!(t.validate().is_err());
        assert!(Topology::single_switch(300).validate().is_err());
    }
}
