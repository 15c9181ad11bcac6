//! Which free nodes a grant takes: nodes under one leaf switch when they fit there (the
//! switch with the fewest free nodes that still holds the request, so that large blocks
//! stay whole), otherwise, unless the request insists on one switch, as few switches as
//! possible, fullest first.

use std::collections::BTreeMap;

use crate::PoolNode;

/// `n` of the `free` nodes, or `None` when they cannot hold the request. Deterministic:
/// the same free nodes always give the same answer. Nodes whose switch is unknown never
/// count as being under one switch.
pub fn pick(free: &[&PoolNode], n: u32, same_switch: bool) -> Option<Vec<String>> {
    let n = usize::try_from(n).ok()?;
    if n == 0 || free.len() < n {
        return None;
    }
    let mut by_switch: BTreeMap<Option<&str>, Vec<&str>> = BTreeMap::new();
    for node in free {
        by_switch
            .entry(node.switch.as_deref())
            .or_default()
            .push(node.name.as_str());
    }
    for names in by_switch.values_mut() {
        names.sort_unstable();
    }
    let best_fit = by_switch
        .iter()
        .filter(|(s, names)| s.is_some() && names.len() >= n)
        .min_by_key(|(s, names)| (names.len(), **s));
    if let Some((_, names)) = best_fit {
        return Some(names.iter().take(n).map(|s| s.to_string()).collect());
    }
    if same_switch {
        return None;
    }
    let mut groups: Vec<(Option<&str>, Vec<&str>)> = by_switch.into_iter().collect();
    // Fullest known switch first; the nodes of unknown place last.
    groups.sort_by_key(|(s, names)| (s.is_none(), std::cmp::Reverse(names.len()), *s));
    Some(
        groups
            .into_iter()
            .flat_map(|(_, names)| names)
            .take(n)
            .map(str::to_string)
            .collect(),
    )
}

/// The largest number of pool nodes under one known switch, and that switch.
pub fn largest_switch(pool: &[PoolNode]) -> Option<(usize, &str)> {
    let mut count: BTreeMap<&str, usize> = BTreeMap::new();
    for node in pool {
        if let Some(s) = &node.switch {
            *count.entry(s).or_default() += 1;
        }
    }
    count
        .into_iter()
        .map(|(s, c)| (c, s))
        .max_by_key(|(c, s)| (*c, std::cmp::Reverse(*s)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, switch: Option<&str>) -> PoolNode {
        PoolNode {
            name: name.into(),
            switch: switch.map(str::to_string),
        }
    }

    #[test]
    fn one_switch_is_preferred_and_the_tightest_fit_is_taken() {
        let pool = [
            node("a1", Some("leaf-a")),
            node("a2", Some("leaf-a")),
            node("a3", Some("leaf-a")),
            node("b1", Some("leaf-b")),
            node("b2", Some("leaf-b")),
            node("x", None),
        ];
        let free: Vec<&PoolNode> = pool.iter().collect();
        assert_eq!(pick(&free, 2, false).unwrap(), ["b1", "b2"]);
        assert_eq!(pick(&free, 3, true).unwrap(), ["a1", "a2", "a3"]);
        assert_eq!(pick(&free, 4, true), None);
        assert_eq!(pick(&free, 4, false).unwrap(), ["a1", "a2", "a3", "b1"]);
        assert_eq!(pick(&free, 6, false).unwrap().len(), 6);
        assert_eq!(pick(&free, 7, false), None);
        assert_eq!(pick(&free, 0, false), None);
        assert_eq!(largest_switch(&pool), Some((3, "leaf-a")));
    }
}
