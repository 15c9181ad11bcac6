//! The fencing number and the deliveries in flight (`meta` keys `fencing` and
//! `in_flight`: one `generation checksum` line per delivery begun above the applied
//! generation).

use postgres::Transaction;

use super::{audit, meta, meta_i64, set_meta};
use crate::store::{Fencing, Result};

/// At most this many deliveries in flight are remembered (each retry of one generation
/// writes the same file, so it counts once).
const IN_FLIGHT: usize = 64;

fn number(tx: &mut Transaction<'_>) -> Result<u64> {
    Ok(u64::try_from(meta_i64(tx, "fencing")?).unwrap_or(0).max(1))
}

/// The lines of `in_flight` above the applied generation.
fn in_flight(tx: &mut Transaction<'_>) -> Result<Vec<(i64, String)>> {
    let applied = meta_i64(tx, "applied_generation")?;
    Ok(meta(tx, "in_flight")?
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let (g, sum) = l.split_once(' ')?;
            Some((g.parse::<i64>().ok()?, sum.to_string()))
        })
        .filter(|(g, _)| *g > applied)
        .collect())
}

pub(super) fn fencing(tx: &mut Transaction<'_>) -> Result<Fencing> {
    Ok(Fencing {
        number: number(tx)?,
        in_flight: in_flight(tx)?.into_iter().map(|(_, s)| s).collect(),
    })
}

pub(super) fn begin_delivery(
    tx: &mut Transaction<'_>,
    generation: i64,
    checksum: &str,
) -> Result<()> {
    let mut lines = in_flight(tx)?;
    if !lines.iter().any(|(g, s)| *g == generation && s == checksum) {
        lines.push((generation, checksum.to_string()));
    }
    let skip = lines.len().saturating_sub(IN_FLIGHT);
    let text: Vec<String> = lines
        .into_iter()
        .skip(skip)
        .map(|(g, s)| format!("{g} {s}"))
        .collect();
    set_meta(tx, "in_flight", &text.join("\n"))
}

pub(super) fn raise(
    tx: &mut Transaction<'_>,
    actor: &str,
    above: u64,
    held: Option<&str>,
    (diff, detail): (&str, &str),
    now: u64,
) -> Result<u64> {
    let old = number(tx)?;
    let new = old.max(above).saturating_add(1);
    set_meta(tx, "fencing", &new.to_string())?;
    set_meta(tx, "in_flight", "")?;
    if let Some(held) = held {
        set_meta(
            tx,
            "applied_checksum",
            &weft_opensm::checksum(held.as_bytes()),
        )?;
        set_meta(tx, "applied_conf", held)?;
    }
    audit(
        tx,
        now,
        actor,
        "fence",
        "store",
        diff,
        "raised",
        &format!("fencing number {old} -> {new}: {detail}"),
    )?;
    Ok(new)
}
