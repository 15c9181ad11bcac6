//! The Links page: what `weft bench p2p`, `weft bench collectives` and `weft doctor`
//! stored with `--report-to`, and what the agents report, judged by the controller's one
//! link check ([`weft_controller::links`], which the metrics use too):
//! - every link flagged now, named: an RDMA NIC below its peers' or the expected speed, a
//!   measured link below 70% of its run's median, or one that failed;
//! - the newest p2p run as a heat map (the newest run of another source only when no p2p
//!   run is stored): a table of senders x receivers whose cells carry the value in Gb/s
//!   (the colour only repeats it, in five steps);
//! - every stored run labelled with what measured it ([`source_words`]): a collectives
//!   run's links were timed through the plugin, not with TCP streams as p2p's;
//! - a trend per node: the median it sent in each run, as an inline SVG drawn here (no
//!   script; the CSP allows no inline style, and SVG presentation attributes are not
//!   styles), with its figures in words beside it.
//!
//! A tenant sees the links whose both ends are its nodes, as the API shows them.

use maud::{Markup, html};
use weft_controller::links::{
    LinkHealthView, LinkResult, LinkRunView, LinkSource, SlowPair, TrendPoint, run_median, trend,
};

/// How many runs the page reads (newest first) for the trends.
pub const RUNS: usize = 50;

/// Gb/s with three figures.
fn gbps(g: f64) -> String {
    if g >= 100.0 {
        format!("{g:.0}")
    } else if g >= 10.0 {
        format!("{g:.1}")
    } else {
        format!("{g:.2}")
    }
}

/// What a flagged measured link did, in words.
fn pair_words(p: &SlowPair) -> String {
    match &p.error {
        Some(e) => format!("failed: {e}"),
        None => format!(
            "{} Gb/s, below 70% of its run's median {} Gb/s",
            gbps(p.gbps),
            gbps(p.peers_gbps)
        ),
    }
}

/// What measured a run, in words, after its source's name.
pub fn source_words(source: LinkSource) -> &'static str {
    match source {
        LinkSource::P2p => "TCP streams between every ordered pair of hosts",
        LinkSource::Collectives => {
            "each ordered pair of ranks timed through the NCCL plugin before the collectives"
        }
        LinkSource::Doctor => "the doctor's short throughput check",
    }
}

/// The newest run of `source`, if any.
fn newest(runs: &[LinkRunView], source: LinkSource) -> Option<&LinkRunView> {
    runs.iter().find(|r| r.source == source)
}

/// The heat-map step (0 = slowest, 4 = fastest) of `g` against the run's fastest link.
fn step(g: f64, max: f64) -> u8 {
    if max <= 0.0 {
        return 0;
    }
    ((g / max) * 4.0).round().clamp(0.0, 4.0) as u8
}

/// The heat map of one run: senders as rows, receivers as columns, every cell its value.
pub fn heat_map(run: &LinkRunView, slow: &[SlowPair]) -> Markup {
    let mut hosts: Vec<&str> = Vec::new();
    for r in &run.results {
        for h in [r.src.as_str(), r.dst.as_str()] {
            if !hosts.contains(&h) {
                hosts.push(h);
            }
        }
    }
    hosts.sort_unstable();
    let max = run
        .results
        .iter()
        .filter(|r| r.error.is_none())
        .map(|r| r.gbps)
        .fold(0.0, f64::max);
    let cell = |src: &str, dst: &str| -> Vec<&LinkResult> {
        run.results
            .iter()
            .filter(|r| r.src == src && r.dst == dst)
            .collect()
    };
    let is_slow = |r: &LinkResult| {
        slow.iter()
            .any(|s| s.run == run.id && s.src == r.src && s.dst == r.dst && s.nic == r.nic)
    };
    html! {
        table #heatmap .heatmap data-run=(run.id) {
            caption {
                (run.source.as_str()) " run " (run.id) " (" (source_words(run.source)) "): Gb/s from each sender (row) to each receiver (column); "
                "median " (run_median(run).map_or("-".into(), gbps)) " Gb/s, fastest " (gbps(max)) " Gb/s. "
                "Darker green is faster; a link marked “slow” ran below 70% of the median."
            }
            thead { tr {
                th scope="col" { "from \\ to" }
                @for h in &hosts { th scope="col" { (h) } }
            } }
            tbody {
                @for src in &hosts {
                    tr {
                        th scope="row" { (src) }
                        @for dst in &hosts {
                            @if src == dst {
                                td.diag { span.muted { "—" } }
                            } @else {
                                @let rs = cell(src, dst);
                                @if rs.is_empty() {
                                    td { span.muted { "not measured" } }
                                } @else {
                                    @let worst = rs.iter().map(|r| if r.error.is_some() { 0.0 } else { r.gbps }).fold(f64::INFINITY, f64::min);
                                    @let any_slow = rs.iter().any(|r| is_slow(r));
                                    td class=(format!("heat{}", step(worst, max))) data-link=(format!("{src}->{dst}")) data-slow=(any_slow) {
                                        @for (i, r) in rs.iter().enumerate() {
                                            @if i > 0 { br; }
                                            @if rs.len() > 1 { code { (r.nic) } " " }
                                            @if r.error.is_some() { strong { "failed" } }
                                            @else { (gbps(r.gbps)) }
                                            @if is_slow(r) && r.error.is_none() { " " strong { "slow" } }
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// A node's trend as an inline SVG (oldest run left; 0 at the bottom): the median it sent
/// per run (solid) and its slowest link (dashed), with its figures as its label.
pub fn sparkline(node: &str, points: &[TrendPoint]) -> Markup {
    const W: f64 = 240.0;
    const H: f64 = 48.0;
    let max = points
        .iter()
        .map(|p| p.median.max(p.slowest))
        .fold(0.0, f64::max)
        .max(1e-9);
    let n = points.len();
    let x = |i: usize| {
        if n > 1 {
            4.0 + (W - 8.0) * i as f64 / (n - 1) as f64
        } else {
            W / 2.0
        }
    };
    let y = |g: f64| H - 4.0 - (H - 8.0) * g / max;
    let line = |f: fn(&TrendPoint) -> f64| -> String {
        points
            .iter()
            .enumerate()
            .map(|(i, p)| format!("{:.1},{:.1}", x(i), y(f(p))))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let lowest = |f: fn(&TrendPoint) -> f64| points.iter().map(f).fold(max, f64::min);
    let label = format!(
        "{node}: {n} run(s); median sent from {} to {} Gb/s; slowest link last {} Gb/s, lowest {} Gb/s",
        gbps(lowest(|p| p.median)),
        gbps(points.iter().map(|p| p.median).fold(0.0, f64::max)),
        gbps(points.last().map_or(0.0, |p| p.slowest)),
        gbps(lowest(|p| p.slowest)),
    );
    html! {
        svg.trend width=(W) height=(H) viewBox=(format!("0 0 {W} {H}")) role="img" aria-label=(label) xmlns="http://www.w3.org/2000/svg" {
            title { (label) }
            line x1="0" y1=(H - 4.0) x2=(W) y2=(H - 4.0) stroke="#c9d1d9" stroke-width="1" {}
            polyline points=(line(|p| p.slowest)) fill="none" stroke="#8a4b00" stroke-width="2" stroke-dasharray="4 3" {}
            polyline points=(line(|p| p.median)) fill="none" stroke="#0b5cad" stroke-width="2" {}
            @for (i, p) in points.iter().enumerate() {
                circle cx=(format!("{:.1}", x(i))) cy=(format!("{:.1}", y(p.median))) r="2.5" fill="#0b5cad" {}
            }
        }
    }
}

/// The Links page. `runs` newest first, `health` already limited to what the viewer sees.
pub fn page(runs: &[LinkRunView], health: &LinkHealthView, now: u64) -> Markup {
    let flagged = health.nics.len() + health.pairs.len();
    let mut nodes: Vec<&str> = runs
        .iter()
        .flat_map(|r| r.results.iter().map(|x| x.src.as_str()))
        .collect();
    nodes.sort_unstable();
    nodes.dedup();
    let heat = newest(runs, LinkSource::P2p).or(runs.first());
    html! {
        h1 { "Links" }
        p.muted {
            "What " code { "weft bench p2p" } ", " code { "weft bench collectives" } " and " code { "weft doctor" }
            " stored with " code { "--report-to" } ", and the speed every agent reports for its RDMA links. "
            @match health.expected_gbps {
                Some(e) => { "Every RDMA link is expected to negotiate " (gbps(e)) " Gb/s (" code { "[controller] expected_link_gbps" } "). " }
                None => { "No expected speed is set (" code { "[controller] expected_link_gbps" } "): links are compared with their peers only. " }
            }
        }
        h2 #flagged-heading { "Flagged links" }
        @if flagged == 0 {
            p #links-flagged data-flagged="0" { span.ok { "No link is flagged." } }
        } @else {
            div role="alert" aria-labelledby="flagged-heading" {
                ul #links-flagged data-flagged=(flagged) {
                    @for l in &health.nics {
                        li data-link=(format!("{}/{}", l.node, l.nic)) {
                            span.stale { (l.node) " " code { (l.nic) } } ": negotiated "
                            (crate::pages::speed(Some(l.speed_mbps))) ", " (crate::pages::below(l))
                            " (reported by its agent): check the cable and the switch port"
                        }
                    }
                    @for p in &health.pairs {
                        li data-link=(format!("{}->{}/{}", p.src, p.dst, p.nic)) {
                            span.stale { (p.src) " " code { (p.nic) } " → " (p.dst) } ": " (pair_words(p))
                            " (" (p.source.as_str()) " run " (p.run) ")"
                        }
                    }
                }
            }
        }
        h2 { "Last results per link" }
        @match heat {
            None => p #heatmap-none { "No results yet: run " code { "weft bench p2p --hosts ... --report-to <controller URL>" } "." },
            Some(r) => {
                p.muted { "Stored " (crate::pages::ago(now, Some(r.at))) " by " code { (r.actor) } "." }
                (heat_map(r, &health.pairs))
            }
        }
        h2 { "Trend per node" }
        @if nodes.is_empty() {
            p { "No node has sent in a stored run yet." }
        } @else {
            table #trends {
                caption { "Per node and run, oldest left (the newest " (runs.len()) " runs): the median it sent (solid blue) and its slowest link (dashed brown)" }
                thead { tr { th scope="col" { "Node" } th scope="col" { "Trend" } th scope="col" { "Runs" } th scope="col" { "Last median (Gb/s)" } th scope="col" { "Last slowest (Gb/s)" } } }
                tbody {
                    @for n in &nodes {
                        @let t = trend(n, runs);
                        tr data-node=(n) {
                            th scope="row" { (n) }
                            td { (sparkline(n, &t)) }
                            td { (t.len()) }
                            td { (t.last().map_or("-".into(), |p| gbps(p.median))) }
                            td { (t.last().map_or("-".into(), |p| gbps(p.slowest))) }
                        }
                    }
                }
            }
        }
        h2 { "Stored runs" }
        table #runs {
            caption { "The newest runs, newest first" }
            thead { tr { th scope="col" { "Run" } th scope="col" { "Source" } th scope="col" { "Stored" } th scope="col" { "By" } th scope="col" { "Links" } th scope="col" { "Median (Gb/s)" } } }
            tbody {
                @if runs.is_empty() { tr { td colspan="6" { "None yet." } } }
                @for r in runs {
                    tr {
                        th scope="row" { (r.id) }
                        td data-source=(r.source.as_str()) { (r.source.as_str()) br; span.muted { (source_words(r.source)) } }
                        td { (crate::pages::ago(now, Some(r.at))) }
                        td { code { (r.actor) } }
                        td { (r.results.len()) }
                        td { (run_median(r).map_or("-".into(), gbps)) }
                    }
                }
            }
        }
    }
}

/// `GET /console/links`.
pub(crate) async fn links_page(
    axum::extract::State(c): axum::extract::State<crate::Console>,
    headers: axum::http::HeaderMap,
) -> Result<axum::response::Response, axum::response::Response> {
    let v = crate::page_viewer(&c, &headers).await?;
    let stale = c.app.stale_after_s;
    let (servers, groups, runs) = crate::db(&c, move |s| {
        Ok((
            s.servers(crate::now(), stale)?,
            s.groups()?,
            s.link_runs(RUNS)?,
        ))
    })
    .await?;
    // Judged among every link, as the API and the metrics judge them; shown as far as the
    // viewer may see (a tenant: the links among its nodes).
    let mut health = weft_controller::links::health(&servers, &runs, c.app.expected_link_gbps);
    let runs = if v.principal.is_admin() {
        runs
    } else {
        let groups = crate::view::visible_groups(groups, &v.principal);
        let mine: Vec<String> = crate::view::visible_servers(servers, &groups, &v.principal)
            .into_iter()
            .map(|s| s.name)
            .collect();
        health.nics.retain(|x| mine.contains(&x.node));
        health
            .pairs
            .retain(|x| mine.contains(&x.src) && mine.contains(&x.dst));
        runs.iter()
            .filter_map(|r| weft_controller::links::among(r, &mine))
            .collect()
    };
    Ok(v.page(
        "Links",
        crate::pages::Nav::Links,
        page(&runs, &health, crate::now()),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(id: i64, links: &[(&str, &str, f64)]) -> LinkRunView {
        of(LinkSource::P2p, id, links)
    }

    fn of(source: LinkSource, id: i64, links: &[(&str, &str, f64)]) -> LinkRunView {
        LinkRunView {
            id,
            at: 100,
            source,
            actor: "admin:x".into(),
            results: links
                .iter()
                .map(|(s, d, g)| LinkResult {
                    src: s.to_string(),
                    dst: d.to_string(),
                    nic: "data0".into(),
                    gbps: *g,
                    rtt_us: None,
                    error: None,
                })
                .collect(),
        }
    }

    #[test]
    fn the_heat_map_writes_every_value_and_names_the_slow_link() {
        let r = run(
            3,
            &[
                ("a", "b", 10.0),
                ("b", "a", 10.0),
                ("a", "c", 10.0),
                ("c", "a", 7.5),
                ("b", "c", 10.0),
                ("c", "b", 10.0),
            ],
        );
        let health = weft_controller::links::health(&[], std::slice::from_ref(&r), None);
        assert_eq!(health.pairs.len(), 0, "7.5 of 10 is not below 70%");
        let r2 = run(4, &[("a", "b", 10.0), ("b", "a", 10.0), ("c", "a", 4.0)]);
        let health = weft_controller::links::health(&[], std::slice::from_ref(&r2), None);
        let html = page(std::slice::from_ref(&r2), &health, 200).into_string();
        assert!(html.contains("data-flagged=\"1\""), "{html}");
        assert!(html.contains("c <code>data0</code> → a"), "{html}");
        assert!(html.contains("data-link=\"c-&gt;a\""), "{html}");
        for v in ["10.0", "4.00"] {
            assert!(html.contains(v), "{v} in {html}");
        }
        assert!(html.contains("<svg"), "{html}");
        assert!(!html.contains("style="), "no inline style under the CSP");
    }

    #[test]
    fn a_collectives_run_is_labelled_and_the_heat_map_still_shows_the_newest_p2p_run() {
        let links = [("a", "b", 10.0), ("b", "a", 10.0), ("b", "c", 3.0)];
        // Newest first: a collectives run (5) after a p2p run (4).
        let runs = vec![of(LinkSource::Collectives, 5, &links), run(4, &links)];
        let health = weft_controller::links::health(&[], &runs, None);
        let html = page(&runs, &health, 200).into_string();
        assert!(html.contains("data-run=\"4\""), "{html}");
        assert!(!html.contains("data-run=\"5\""), "{html}");
        assert!(html.contains("data-source=\"collectives\""), "{html}");
        assert!(
            html.contains(source_words(LinkSource::Collectives)),
            "{html}"
        );
        // Its slow link is flagged under its own source.
        assert!(html.contains("(collectives run 5)"), "{html}");
        // With only collectives runs, the heat map is the newest of them, labelled.
        let only = vec![of(LinkSource::Collectives, 6, &links)];
        let health = weft_controller::links::health(&[], &only, None);
        let html = page(&only, &health, 200).into_string();
        assert!(html.contains("data-run=\"6\""), "{html}");
        assert!(
            html.contains("collectives run 6 (each ordered pair of ranks"),
            "{html}"
        );
    }

    #[test]
    fn a_sparkline_spans_its_runs_and_says_its_figures() {
        let p = |run, median, slowest| TrendPoint {
            run,
            at: 0,
            median,
            slowest,
        };
        let svg = sparkline("a", &[p(1, 10.0, 10.0), p(2, 10.0, 5.0)]).into_string();
        assert!(svg.contains("points=\"4.0,4.0 236.0,24.0\""), "{svg}");
        assert!(svg.contains("points=\"4.0,4.0 236.0,4.0\""), "{svg}");
        assert!(
            svg.contains(
                "median sent from 10.0 to 10.0 Gb/s; slowest link last 5.00 Gb/s, lowest 5.00 Gb/s"
            ),
            "{svg}"
        );
    }
}
