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

/// The one shape of an error under `--json`, printed on stdout where a script reads the
/// result: `{"error": "<message>", "causes": ["<cause>", ...], "exit": N}` (`causes` the
/// source chain, outermost first, each said once; `exit` the process's exit code), plus, for
/// some commands, keys that say more (`http_status`, `operation`, `owner`, `removals`, ...).
/// The message and its causes also go to stderr, as `weft: a: b: c`, for the person.
pub fn error(as_json: bool, exit: u8, message: &str, causes: &[String], extra: serde_json::Value) {
    if as_json {
        println!("{}", error_value(message, causes, exit, extra));
    }
    if causes.is_empty() {
        eprintln!("weft: {message}");
    } else {
        eprintln!("weft: {message}: {}", causes.join(": "));
    }
}

/// The value [`error`] prints.
pub fn error_value(
    message: &str,
    causes: &[String],
    exit: u8,
    extra: serde_json::Value,
) -> serde_json::Value {
    let mut v = serde_json::json!({ "error": message, "causes": causes, "exit": exit });
    if let (Some(obj), serde_json::Value::Object(more)) = (v.as_object_mut(), extra) {
        for (k, x) in more {
            obj.entry(k).or_insert(x);
        }
    }
    v
}

/// An `anyhow` error as [`error`] prints it: the outermost message, then each cause that
/// the line does not already hold (see `weft_chain`).
pub fn anyhow_error(as_json: bool, exit: u8, e: &anyhow::Error) {
    let message = e.to_string();
    let mut causes: Vec<String> = Vec::new();
    for c in e.chain().skip(1) {
        let t = c.to_string();
        if !t.is_empty() && !message.contains(&t) && !causes.iter().any(|p| p.contains(&t)) {
            causes.push(t);
        }
    }
    error(as_json, exit, &message, &causes, serde_json::Value::Null);
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
    fn errors_have_one_shape_and_extra_keys_never_replace_it() {
        let v = error_value(
            "no",
            &["because".into()],
            2,
            serde_json::json!({ "operation": 7, "exit": 0, "error": "x" }),
        );
        assert_eq!(v["error"], "no");
        assert_eq!(v["causes"][0], "because");
        assert_eq!(v["exit"], 2);
        assert_eq!(v["operation"], 7);
        let plain = error_value("no", &[], 1, serde_json::Value::Null);
        assert_eq!(plain.as_object().unwrap().len(), 3, "{plain}");
    }

    #[test]
    fn keys_are_hex_with_four_digits() {
        assert_eq!(keys(&[0x8a0a, 0x7f]), "0x8a0a 0x007f");
        assert_eq!(keys(&[]), "-");
    }
}
