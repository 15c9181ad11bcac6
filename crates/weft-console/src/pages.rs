//! The pages, as maud templates (checked and compiled with the crate; every value is
//! HTML-escaped by maud). One layout; each page is a function of what [`crate::view`]
//! computed. No inline script or style: the Content-Security-Policy allows only our own
//! files.

use maud::{DOCTYPE, Markup, PreEscaped, html};
use weft_controller::model::{
    AuditEntry, GroupView, Liveness, OpState, OperationView, ServerView, StatusView,
};

use weft_controller::links::SlowNic;

use crate::view::{HistoryFilter, Matrix};

/// Which page the navigation marks current.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Nav {
    /// Overview.
    Overview,
    /// Partitions.
    Partitions,
    /// Move.
    Move,
    /// History.
    History,
    /// API docs.
    Docs,
    /// None (login).
    None,
    /// Links (link health).
    Links,
    /// Leases.
    Leases,
}

/// Who is logged in, as the header shows it.
pub struct Who<'a> {
    /// `admin` or `tenant alice`.
    pub label: String,
    /// The session's CSRF token (for the logout form).
    pub csrf: &'a str,
    /// Whether admin-only pages are linked.
    pub admin: bool,
}

/// The page around `body`.
pub fn layout(title: &str, nav: Nav, who: Option<&Who<'_>>, body: Markup) -> Markup {
    let link = |href: &str, label: &str, me: Nav| {
        html! {
            li { a href=(href) aria-current=[(nav == me).then_some("page")] { (label) } }
        }
    };
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                meta name="htmx-config" content=r#"{"includeIndicatorStyles":false,"allowEval":false}"#;
                title { (title) " · weft console" }
                link rel="stylesheet" href="/console/assets/console.css";
                script src="/console/assets/htmx.min.js" defer {}
                script src="/console/assets/htmx-ext-sse.min.js" defer {}
            }
            body {
                a.skip href="#main" { "Skip to content" }
                header {
                    span.brand { "weft" }
                    @if let Some(w) = who {
                        nav aria-label="Console" {
                            ul {
                                (link("/console", "Overview", Nav::Overview))
                                (link("/console/partitions", "Partitions", Nav::Partitions))
                                @if w.admin {
                                    (link("/console/move", "Move", Nav::Move))
                                    (link("/console/history", "History", Nav::History))
                                }
                                (link("/docs", "API docs", Nav::Docs))
                                (link("/console/links", "Links", Nav::Links))
                                (link("/console/leases", "Leases", Nav::Leases))
                            }
                        }
                        div.who {
                            span { "Logged in as " strong { (w.label) } }
                            form.inline method="post" action="/console/logout" {
                                input type="hidden" name="csrf" value=(w.csrf);
                                button type="submit" { "Log out" }
                            }
                        }
                    } @else {
                        nav aria-label="Console" { ul { (link("/docs", "API docs", Nav::Docs)) } }
                    }
                }
                main #main { (body) }
            }
        }
    }
}

/// The login form (`error`: why the last try failed).
pub fn login(error: Option<&str>) -> Markup {
    html! {
        div.login {
            h1 { "Log in to the weft console" }
            p { "Paste an API token (an admin token, or a tenant's). It is sent once, in this form's body; the browser then holds only a session cookie." }
            @if let Some(e) = error { p.error role="alert" { (e) } }
            form method="post" action="/console/login" {
                label for="token" { "API token" }
                input #token type="password" name="token" autocomplete="off" required;
                button.primary type="submit" { "Log in" }
            }
        }
    }
}

/// `12 s ago`, `3 min ago`, `never`.
pub fn ago(now: u64, t: Option<u64>) -> String {
    match t {
        None => "never".into(),
        Some(t) => {
            let d = now.saturating_sub(t);
            if d < 120 {
                format!("{d} s ago")
            } else if d < 7200 {
                format!("{} min ago", d / 60)
            } else {
                format!("{} h ago", d / 3600)
            }
        }
    }
}

/// A speed in Mb/s as people say it: `200 Gb/s`, `2.5 Gb/s`, `100 Mb/s`.
pub fn speed(mbps: Option<u32>) -> String {
    match mbps {
        None => "speed unknown".into(),
        Some(m) if m >= 1000 && m % 1000 == 0 => format!("{} Gb/s", m / 1000),
        Some(m) if m >= 1000 => format!("{:.1} Gb/s", f64::from(m) / 1000.0),
        Some(m) => format!("{m} Mb/s"),
    }
}

/// The nodes table (also served alone, refreshed by htmx every few seconds); a link
/// below its peers' or the expected speed (`expected_mbps`) is marked where it is listed.
pub fn nodes_table(
    servers: &[ServerView],
    now: u64,
    stale_after_s: u64,
    expected_mbps: Option<u32>,
) -> Markup {
    let (slow, _) = weft_controller::links::slow_nics(servers, expected_mbps);
    html! {
        div #nodes hx-get="/console/nodes" hx-trigger="every 5s" hx-swap="outerHTML" {
            table {
                caption { "Nodes: an agent is stale after " (stale_after_s) " s without a report or heartbeat" }
                thead { tr {
                    th scope="col" { "Node" } th scope="col" { "Agent" } th scope="col" { "Group" }
                    th scope="col" { "InfiniBand ports" } th scope="col" { "RoCE devices" }
                    th scope="col" { "NICs" } th scope="col" { "GPUs" }
                } }
                tbody {
                    @if servers.is_empty() { tr { td colspan="7" { "No node is visible to you." } } }
                    @for s in servers {
                        tr data-node=(s.name) {
                            th scope="row" { (s.name) }
                            td {
                                span class=(s.liveness.as_str()) data-liveness=(s.liveness.as_str()) {
                                    (match s.liveness { Liveness::Ok => "ok", Liveness::Stale => "stale", Liveness::Never => "never reported" })
                                }
                                br; span.muted { "last seen " (ago(now, s.last_seen)) }
                            }
                            td { (s.group.as_deref().unwrap_or("—")) }
                            td { @if s.ports.is_empty() { "—" } @else { ul { @for p in &s.ports {
                                li data-port=(p.guid) { code { (p.guid) } " " (p.device) "/" (p.num) " LID " (p.lid) " " (p.state)
                                     br; span data-rate=(p.rate.as_deref().unwrap_or("")) { (p.rate.as_deref().unwrap_or("rate unknown")) }
                                     ", " (p.mtu.map_or("no netdev: MTU unknown".to_string(), |m| format!("netdev MTU {m}"))) }
                            } } } }
                            td { @if s.roce.is_empty() { "—" } @else { ul { @for r in &s.roce {
                                li { (r.device) "/" (r.num) " " (r.rate.as_deref().unwrap_or("rate unknown")) " " (r.state)
                                     @if let Some(n) = &r.netdev { " on " code { (n) } } }
                            } } } }
                            td { @if s.nics.is_empty() { "—" } @else { ul { @for n in &s.nics {
                                li { code { (n.name) } " " (speed(n.speed_mbps)) ", MTU " (n.mtu) ", " (n.link_layer) ", " (n.operstate)
                                     @if let Some(l) = slow.iter().find(|l| l.node == s.name && l.nic == n.name) {
                                         br; span.stale { (below(l)) }
                                     } }
                            } } } }
                            td { @if s.gpus.is_empty() { "—" } @else { ul { @for g in &s.gpus {
                                li { (g.name) @if let Some(b) = g.memory_total_bytes { ", " (b >> 30) " GiB" } @else { ", memory not reported" } }
                            } } } }
                        }
                    }
                }
            }
        }
    }
}

/// What a flagged link is below: `below its peers' 200 Gb/s`, `below the expected 400 Gb/s`.
pub fn below(l: &SlowNic) -> String {
    let mut parts = Vec::new();
    if let Some(p) = l.peers_mbps {
        parts.push(format!("below its peers' {}", speed(Some(p))));
    }
    if let Some(e) = l.expected_mbps {
        parts.push(format!("below the expected {}", speed(Some(e))));
    }
    parts.join(" and ")
}

/// The link-health section: every RDMA link below its peers' or the expected speed, named.
pub fn link_health(slow: &[SlowNic], compared: usize) -> Markup {
    html! {
        h2 { "Link health" }
        p { a href="/console/links" { "Measured links: the heat map, trends per node and every flagged link" } }
        @if slow.is_empty() {
            p #link-health data-slow="0" {
                @if compared == 0 { "No two RDMA links of one kind report a speed yet: nothing to compare." }
                @else { span.ok { "Every RDMA link runs at its peers' speed" } " (" (compared) " links compared)." }
            }
        } @else {
            div role="alert" { ul #link-health data-slow=(slow.len()) {
                @for l in slow {
                    li data-link=(format!("{}/{}", l.node, l.nic)) {
                        span.stale { (l.node) " " code { (l.nic) } ": " (speed(Some(l.speed_mbps))) }
                        ", " (below(l)) " (" (l.compared) " links of its kind compared): check the cable and the switch port"
                    } }
                }
            }
        }
    }
}

/// The Overview page.
pub fn overview(
    servers: &[ServerView],
    status: Option<&StatusView>,
    now: u64,
    stale_after_s: u64,
    expected_mbps: Option<u32>,
) -> Markup {
    let stale = servers
        .iter()
        .filter(|s| s.liveness != Liveness::Ok)
        .count();
    let (slow, compared) = weft_controller::links::slow_nics(servers, expected_mbps);
    html! {
        h1 { "Overview" }
        div.cards {
            div.card { b { (servers.len()) } "nodes" }
            div.card { b class=[(stale > 0).then_some("stale")] { (stale) } "not reporting" }
            div.card { b class=[(!slow.is_empty()).then_some("stale")] { (slow.len()) } "links below their peers' or the expected speed" }
            @if let Some(st) = status {
                div.card { b { (st.pending_operations) } "operations pending" }
                div.card { b class=(if st.drift.state == weft_controller::model::DriftState::Drift { "stale" } else { "ok" }) { (st.drift.state.as_str()) } "subnet managers" }
            }
        }
        (nodes_table(servers, now, stale_after_s, expected_mbps))
        (link_health(&slow, compared))
        @if let Some(st) = status {
            h2 { "Subnet managers" }
            (crate::sms::table(&st.drift, now))
            table {
                caption { "What was applied, and whether every SM's file and every port still hold it" }
                tbody {
                    tr { th scope="row" { "Delivers to SMs" } td { (if st.delivers { "yes: changes are verified on the ports" } else { "no (--no-fabric): applied means recorded only" }) } }
                    tr { th scope="row" { "Generation" } td { "desired " (st.desired_generation) ", applied " (st.applied_generation) } }
                    tr { th scope="row" { "Applied file checksum" } td { code { (st.applied_checksum.as_deref().unwrap_or("none yet")) } } }
                    tr { th scope="row" { "Agreement" } td {
                        @if st.drift.files.is_empty() && st.drift.unreadable.is_empty() {
                            @if st.drift.files_checked_at.is_some() { span.ok { "every SM holds the applied file" } } @else { "not checked yet" }
                        } @else {
                            @for f in &st.drift.files { span.stale { (f) ": holds another file" } br; }
                            @for f in &st.drift.unreadable { span.warn { (f) ": could not be read" } br; }
                        }
                        br; span.muted { "files read " (ago(now, st.drift.files_checked_at)) }
                    } }
                    tr { th scope="row" { "Drift" } td {
                        (st.drift.state.as_str())
                        @for p in &st.drift.ports { br; span.stale { (p) } }
                        br; span.muted { "ports read " (ago(now, st.drift.ports_checked_at)) ", repairs since start " (st.drift.repairs) }
                    } }
                }
            }
        }
    }
}

/// The Partitions page.
pub fn partitions(m: &Matrix) -> Markup {
    html! {
        h1 { "Partitions" }
        p { (m.default) }
        table #matrix {
            caption { "Membership of each node's ports in each group's partition (full, limited or none), groups under their tenants" }
            thead {
                tr {
                    td rowspan="2" {}
                    th scope="col" rowspan="2" { "Default" }
                    @for (t, cols) in &m.tenants { th scope="colgroup" colspan=(cols.len()) { "tenant " (t) } }
                }
                tr { @for (_, cols) in &m.tenants { @for c in cols { th scope="col" data-group=(c.group) { (c.group) br; code { (c.pkey) } } } } }
            }
            tbody {
                @for (name, d, cells) in &m.rows {
                    tr data-node=(name) {
                        th scope="row" { (name) }
                        td class=(d.as_str()) { (d.as_str()) }
                        @for c in cells { td class=(c.as_str()) data-cell=(c.as_str()) { (c.as_str()) } }
                    }
                }
            }
        }
    }
}

/// The Move form.
pub fn move_form(servers: &[ServerView], groups: &[GroupView], csrf: &str) -> Markup {
    html! {
        h1 { "Move a node" }
        p { "Choose a node and the group it should belong to. You see the change to the partitions file before anything is changed." }
        form #move-form method="post" action="/console/move/preview" hx-post="/console/move/preview" hx-target="#preview" hx-swap="innerHTML" {
            input type="hidden" name="csrf" value=(csrf);
            label for="server" { "Node" }
            select #server name="server" required {
                @for s in servers { option value=(s.name) { (s.name) " (" (s.group.as_deref().unwrap_or("no group")) ")" } }
            }
            label for="to" { "Target group" }
            select #to name="to" required {
                @for g in groups { option value=(g.name) { (g.name) " (tenant " (g.tenant) ")" } }
            }
            button.primary #preview-button type="submit" { "Show the change" }
        }
        div #preview aria-live="polite" {}
    }
}

/// A diff, `+` lines and `-` lines marked.
pub fn diff(text: &str) -> Markup {
    html! {
        pre.diff {
            @for l in text.lines() {
                @if l.starts_with('+') { span.add { (l) } "\n" }
                @else if l.starts_with('-') { span.del { (l) } "\n" }
                @else { (l) "\n" }
            }
        }
    }
}

/// The preview of a move, with the form that confirms it.
pub fn move_preview(server: &str, to: &str, diff_text: &str, csrf: &str) -> Markup {
    html! {
        h2 { "Moving " (server) " to " (to) }
        p { "The partitions file changes so (ports losing a key: -, gaining one: +):" }
        (diff(diff_text))
        form #confirm-form method="post" action="/console/move" hx-post="/console/move" hx-target="#preview" hx-swap="innerHTML" {
            input type="hidden" name="csrf" value=(csrf);
            input type="hidden" name="server" value=(server);
            input type="hidden" name="to" value=(to);
            button.primary #confirm type="submit" { "Confirm the move" }
        }
    }
}

/// The operation being followed: htmx's SSE extension swaps each `progress` event in.
pub fn follow(op: &OperationView) -> Markup {
    html! {
        h2 { "Operation " (op.id) ": " (op.action) }
        div hx-ext="sse" sse-connect=(format!("/console/operations/{}/events", op.id)) sse-close="done" {
            div.progress #progress sse-swap="progress" role="status" aria-live="polite" { (progress(op, None)) }
        }
        (diff(&op.diff))
    }
}

/// One progress line: `verified`, `pending (attempt n: error)`, or the reason it failed.
pub fn progress(op: &OperationView, gave_up: Option<&str>) -> Markup {
    html! {
        @if op.state == OpState::Applied {
            span.ok data-state="verified" { "verified" }
            " — delivered to every subnet manager and checked on the ports"
            @if let Some(w) = &op.warning { br; span.warn { (w) } }
        } @else if let Some(why) = gave_up {
            span.stale data-state="failed" { "failed" } ": " (why)
        } @else {
            span.warn data-state="pending" { "pending" }
            @if op.attempts > 0 { " — attempt " (op.attempts) " failed: " (op.last_error.as_deref().unwrap_or("")) "; retrying" }
            @else { " — being delivered" }
        }
    }
}

/// The History page.
pub fn history(
    ops: &[&OperationView],
    audit: &[&AuditEntry],
    f: &HistoryFilter,
    actions: &[String],
) -> Markup {
    html! {
        h1 { "History" }
        form #filter method="get" action="/console/history" {
            label for="f-tenant" { "Tenant" } input #f-tenant type="text" name="tenant" value=(f.tenant);
            label for="f-node" { "Node" } input #f-node type="text" name="node" value=(f.node);
            label for="f-action" { "Action" }
            select #f-action name="action" {
                option value="" selected[f.action.is_empty()] { "any" }
                @for a in actions { option value=(a) selected[*a == f.action] { (a) } }
            }
            button.primary type="submit" { "Filter" }
        }
        h2 { "Operations" }
        table #operations {
            thead { tr { th scope="col" { "#" } th scope="col" { "What" } th scope="col" { "Who" } th scope="col" { "State" } th scope="col" { "Diff" } } }
            tbody {
                @if ops.is_empty() { tr { td colspan="5" { "None." } } }
                @for o in ops {
                    tr data-op=(o.id) {
                        td { (o.id) } td { (o.action) } td { code { (o.actor) } }
                        td { (match o.state { OpState::Applied => "verified", OpState::Pending => "pending" })
                             @if let Some(e) = &o.last_error { br; span.warn { (e) } } }
                        td { details { summary { "diff (" (o.diff.lines().count()) " lines)" } (diff(&o.diff)) } }
                    }
                }
            }
        }
        h2 { "Audit log" }
        table #audit {
            thead { tr { th scope="col" { "#" } th scope="col" { "When (UTC s)" } th scope="col" { "Who" } th scope="col" { "Action" } th scope="col" { "Subject" } th scope="col" { "Outcome" } th scope="col" { "Detail" } } }
            tbody {
                @if audit.is_empty() { tr { td colspan="7" { "None." } } }
                @for e in audit {
                    tr data-action=(e.action) data-outcome=(e.outcome) {
                        td { (e.id) } td { (e.at) } td { code { (e.actor) } } td { (e.action) } td { (e.subject) }
                        td { (e.outcome) }
                        td { (e.detail) @if !e.diff.is_empty() { details { summary { "diff" } (diff(&e.diff)) } } }
                    }
                }
            }
        }
    }
}

/// `/docs`: every operation of the OpenAPI document, with its parameters, body and
/// answers, and a link to the document itself.
pub fn docs(doc: &serde_json::Value) -> Markup {
    let empty = serde_json::Map::new();
    let paths = doc["paths"].as_object().unwrap_or(&empty);
    let s = |v: &serde_json::Value| v.as_str().unwrap_or("").to_string();
    html! {
        h1 { "API: " (s(&doc["info"]["title"])) " " (s(&doc["info"]["version"])) }
        p { "Generated from " a href="/openapi.json" { "/openapi.json" } " (OpenAPI " (s(&doc["openapi"])) "), the document the controller serves. Authenticate with " code { "Authorization: Bearer <token>" } "." }
        nav aria-label="Operations" { ul { @for (path, _) in paths { li { a href=(format!("#{}", anchor(path))) { code { (path) } } } } } }
        @for (path, item) in paths {
            section id=(anchor(path)) {
                h2 { code { (path) } }
                @for (method, op) in item.as_object().unwrap_or(&empty) {
                    h3 { code { (method.to_uppercase()) " " (path) } }
                    p { (s(&op["summary"])) }
                    @if !op["description"].is_null() && op["description"] != op["summary"] { p { (s(&op["description"])) } }
                    @if let Some(sec) = op["security"].as_array() {
                        p { "Who: " @for x in sec { @for (k, _) in x.as_object().unwrap_or(&empty) { code { (k) } " " } } }
                    }
                    @if let Some(params) = op["parameters"].as_array() {
                        table { caption { "Parameters" } tbody { @for p in params {
                            tr { th scope="row" { code { (s(&p["name"])) } } td { (s(&p["in"])) } td { (s(&p["description"])) } }
                        } } }
                    }
                    @if let Some(body) = op["requestBody"]["content"]["application/json"]["schema"]["$ref"].as_str() {
                        p { "Body: " code { (body.rsplit('/').next().unwrap_or(body)) } }
                    }
                    table { caption { "Answers" } tbody {
                        @for (code, r) in op["responses"].as_object().unwrap_or(&empty) {
                            tr { th scope="row" { (code) } td { (s(&r["description"])) } }
                        }
                    } }
                }
            }
        }
    }
}

fn anchor(path: &str) -> String {
    let a: String = path
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    format!("op{a}")
}

/// A page that says the request was refused, and why.
pub fn refused(why: &str) -> Markup {
    html! { h1 { "Refused" } p.error role="alert" { (why) } p { a href="/console" { "Back to the overview" } } }
}

/// Raw HTML passthrough for a server-sent event's data (one line).
pub fn one_line(m: Markup) -> String {
    PreEscaped(m.into_string().replace('\n', "&#10;")).into_string()
}
