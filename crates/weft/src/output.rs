//! Human tables and JSON: the two ways every command prints a result.

use comfy_table::{Table, presets};
use serde::Serialize;

/// A borderless table with a header row, in the style of `kubectl get`.
pub fn table<const N: usize>(
    header: [&str; N],
    rows: impl IntoIterator<Item = [String; N]>,
) -> String {
    let mut t = Table::new();
    t.load_preset(presets::NOTHING).set_header(header);
    for row in rows {
        t.add_row(row.map(|c| clean(&c)));
    }
    // comfy-table pads the first column with a leading space; trim for flush output.
    t.to_string()
        .lines()
        .map(|l| l.strip_prefix(' ').unwrap_or(l).trim_end())
        .collect::<Vec<_>>()
        .join("\n")
}

/// `s` safe to print on a terminal: every control or bidirectional-formatting character
/// (ESC, BEL, CR, a newline, U+202E, ...) written as `\u{..}`, so that a value from the
/// API (a host name an agent sent, an audit line) cannot move the cursor or forge lines.
pub fn clean(s: &str) -> String {
    weft_controller::input::escape_control(s)
}

pub fn json<T: Serialize>(value: &T) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

/// P_Keys as `0x8a0a 0x7fff`, or `-` when there are none.
pub fn keys(keys: &[u16]) -> String {
    if keys.is_empty() {
        return "-".into();
    }
    keys.iter()
        .map(|k| format!("{k:#06x}"))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_aligns_columns_under_the_header() {
        let t = table(
            ["NAME", "PKEY"],
            [
                ["a".to_string(), "0x0001".to_string()],
                ["long-name".into(), "0x0002".into()],
            ],
        );
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 3, "{t}");
        let col = lines[0].find("PKEY").unwrap();
        assert_eq!(lines[2].find("0x0002").unwrap(), col, "{t}");
    }

    #[test]
    fn tables_print_no_control_character() {
        let t = table(
            ["SUBJECT"],
            [["node1\x1b[2K\r2026-01-01 admin group.move\x07\nnode2".to_string()]],
        );
        assert_eq!(t.lines().count(), 2, "{t}");
        assert!(!t.chars().any(|c| c.is_control() && c != '\n'), "{t:?}");
        assert!(t.contains("\\u{1b}[2K"), "{t}");
    }

    #[test]
    fn keys_are_hex_with_four_digits() {
        assert_eq!(keys(&[0x8a0a, 0x7f]), "0x8a0a 0x007f");
        assert_eq!(keys(&[]), "-");
    }
}
