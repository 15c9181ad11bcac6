//! Integration tests: collectives across real processes over the real plugin (loopback), and
//! `weft doctor` / `weft bench p2p` logic across network-namespace hosts.

mod collectives;
