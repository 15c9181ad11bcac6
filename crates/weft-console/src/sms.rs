//! The subnet managers on the Overview: each configured SM with its role as the fabric
//! reports it (the master `sminfo` names; the others standby), the checksum of the
//! partitions file it holds, and whether that is the file the controller applied, as the
//! controller's drift check last read them ([`weft_controller::model::DriftView::sms`]).

use maud::{Markup, html};
use weft_controller::model::DriftView;

use crate::pages::ago;

/// The first 12 hex digits of a checksum, as the controller's messages print it.
fn short(c: &str) -> &str {
    &c[..12.min(c.len())]
}

/// The per-SM table (or why there is none yet).
pub fn table(drift: &DriftView, now: u64) -> Markup {
    html! {
        @if drift.sms.is_empty() {
            p #sms data-sms="0" { "No SM has been read yet (nothing applied, no fabric, or the first check has not run)." }
        } @else {
            table #sms data-sms=(drift.sms.len()) {
                caption { "Each subnet manager: its role, the file it holds, whether that is the applied file (read " (ago(now, drift.files_checked_at)) ")" }
                thead { tr { th scope="col" { "SM" } th scope="col" { "Role" } th scope="col" { "File checksum" } th scope="col" { "Agrees" } } }
                tbody {
                    @for sm in &drift.sms {
                        tr data-sm=(sm.name) data-role=(sm.role) data-agrees=(sm.agrees) {
                            th scope="row" { (sm.name) }
                            td { @if sm.role == "master" { strong { "master" } } @else { (sm.role) } }
                            td { @match &sm.checksum {
                                Some(c) => { code title=(c) { (short(c)) } }
                                None => { span.warn { "none" } }
                            } }
                            td {
                                @if sm.agrees { span.ok { "yes: the applied file" } }
                                @else { span.stale { "no" } }
                                @if let Some(e) = &sm.error { br; span.warn { (e) } }
                            }
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use weft_controller::model::SmView;

    #[test]
    fn the_table_names_each_sm_with_its_role_and_marks_one_that_disagrees() {
        let mut d = DriftView::default();
        assert!(
            table(&d, 10)
                .into_string()
                .contains("No SM has been read yet")
        );
        d.files_checked_at = Some(5);
        d.sms = vec![
            SmView {
                name: "sm-a".into(),
                role: "master".into(),
                checksum: Some("0123456789abcdef".into()),
                agrees: true,
                error: None,
            },
            SmView {
                name: "sm-b".into(),
                role: "standby".into(),
                checksum: None,
                agrees: false,
                error: Some("host unreachable".into()),
            },
        ];
        let h = table(&d, 10).into_string();
        assert!(
            h.contains(r#"data-sm="sm-a" data-role="master" data-agrees="true""#),
            "{h}"
        );
        assert!(
            h.contains(r#"data-sm="sm-b" data-role="standby" data-agrees="false""#),
            "{h}"
        );
        assert!(
            h.contains("0123456789ab") && h.contains("host unreachable"),
            "{h}"
        );
        assert!(h.contains("read 5 s ago"), "{h}");
    }
}
