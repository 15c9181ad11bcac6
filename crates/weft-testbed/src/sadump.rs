//! OpenSM's SA database dump (`opensm-sa.dump`, written after a sweep when the SM runs
//! with `sa_db_dump TRUE`): the multicast groups the SM holds, read back for tests.

use std::net::Ipv6Addr;

/// One `MC Group` line of the dump: the group's MCMemberRecord as OpenSM stores it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct DumpedGroup {
    /// The MGID.
    pub mgid: Ipv6Addr,
    /// Q_Key.
    pub qkey: u32,
    /// MTU byte (selector in the top two bits).
    pub mtu: u8,
    /// Traffic class.
    pub tclass: u8,
    /// P_Key.
    pub pkey: u16,
    /// Rate byte (selector in the top two bits).
    pub rate: u8,
    /// Packet lifetime byte.
    pub pkt_life: u8,
    /// SL (4 bits), flow label (20), hop limit (8).
    pub sl_flow_hop: u32,
    /// Scope (high nibble) and join state (low nibble).
    pub scope_state: u8,
    /// Whether OpenSM marks it well known (made from the partitions config).
    pub well_known: bool,
    /// The MLID it was given (allocated at run time).
    pub mlid: u16,
}

fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let at = line.find(&format!(" {key}="))? + key.len() + 2;
    line[at..].split_whitespace().next()
}

fn hex(s: &str) -> Option<u64> {
    u64::from_str_radix(s.trim_start_matches("0x"), 16).ok()
}

/// The `MC Group` lines of a dump, in file order; a line that does not read is skipped.
pub fn parse_sa_dump_groups(text: &str) -> Vec<DumpedGroup> {
    text.lines()
        .filter(|l| l.starts_with("MC Group "))
        .filter_map(|l| {
            let (hi, lo) = field(l, "mgid")?.split_once(':')?;
            let mgid = (u128::from(hex(hi)?) << 64) | u128::from(hex(lo)?);
            let num = |k: &str| field(l, k).and_then(hex);
            Some(DumpedGroup {
                mgid: Ipv6Addr::from(mgid),
                qkey: u32::try_from(num("qkey")?).ok()?,
                mtu: u8::try_from(num("mtu")?).ok()?,
                tclass: u8::try_from(num("tclass")?).ok()?,
                pkey: u16::try_from(num("pkey")?).ok()?,
                rate: u8::try_from(num("rate")?).ok()?,
                pkt_life: u8::try_from(num("pkt_life")?).ok()?,
                sl_flow_hop: u32::try_from(num("sl_flow_hop")?).ok()?,
                scope_state: u8::try_from(num("scope_state")?).ok()?,
                well_known: l.contains("(well known)"),
                mlid: u16::try_from(num("mlid")?).ok()?,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_an_mc_group_line() {
        let text = "GUIDInfo Record: base_guid=0x1\n\nMC Group 0xc000  (well known): mgid=0xff12401bffff0000:0x00000000ffffffff port_gid=0x0000000000000000:0x0000000000000000 qkey=0x00000b1b mlid=0xc000 mtu=0x84 tclass=0x00 pkey=0xffff rate=0x83 pkt_life=0x12 sl_flow_hop=0x00000000 scope_state=0x21 proxy_join=0x0\n\n";
        let g = parse_sa_dump_groups(text);
        assert_eq!(g.len(), 1);
        assert_eq!(g[0].mgid.to_string(), "ff12:401b:ffff::ffff:ffff");
        assert_eq!(
            (
                g[0].qkey,
                g[0].mtu,
                g[0].pkey,
                g[0].rate,
                g[0].scope_state,
                g[0].mlid
            ),
            (0xb1b, 0x84, 0xffff, 0x83, 0x21, 0xc000)
        );
        assert!(g[0].well_known);
    }
}
