//! The status page every coordinator serves over HTTP (`rampart coordinator
//! --metrics-addr`, on by default under `cluster up`):
//!
//! * `/` — an HTML page of the cluster: problems and their fixes first, then the
//!   coordinators, the servers (state, memory, replicas, frames, lease), replicas per
//!   backup as a bar chart, the tables and their tablets with owners, and a timeline of
//!   each recent recovery. It refreshes itself every [`REFRESH_SECONDS`] with a few lines
//!   of inline script that fetch `/fragment` (no external scripts, styles or fonts: the
//!   page works where the cluster has no Internet).
//! * `/fragment` — the page's body alone, rendered on the server.
//! * `/api/status` — the same [`ClusterView`] as JSON.
//! * `/metrics` — this coordinator's Prometheus metrics.
//!
//! A follower's page is the leader's view: the view is gathered through the
//! coordinators' RPCs ([`ClusterView::gather`]), which find the leader. A view is
//! served again for [`VIEW_REUSE`] (one gathering a second however many browsers
//! watch), and a page that cannot be gathered within [`PAGE_TIMEOUT`] is answered 503. Rendering
//! ([`render_page`], [`render_fragment`]) is pure and tested alone.

use rampart_common::http::{Handler, Request, Response};
use rampart_common::metrics::metrics_response;
use rampart_common::protocol::coordinator::RecoveryReport;
use rampart_common::rpc::RpcPool;
use std::fmt::Write;
use std::sync::Arc;

use crate::cluster_view::{ClusterView, ServerState, ServerView};

/// Seconds between the page's refreshes.
pub const REFRESH_SECONDS: u32 = 2;

/// The HTTP handler of a coordinator: the status page, its JSON, and the metrics in
/// `registries`. `coordinators`: every member's RPC address (this one's included).
pub fn handler(coordinators: Vec<String>, registries: Vec<prometheus::Registry>) -> Handler {
    let shared = Arc::new(Shared {
        coordinators,
        registries,
        pool: RpcPool::new(),
        last: tokio::sync::Mutex::new(None),
    });
    Arc::new(move |request: Request| {
        let shared = Arc::clone(&shared);
        Box::pin(async move {
            match tokio::time::timeout(PAGE_TIMEOUT, answer(&shared, &request)).await {
                Ok(response) => response,
                Err(_) => Response::error(
                    503,
                    format!("the cluster's state was not gathered within {PAGE_TIMEOUT:?}"),
                ),
            }
        })
    })
}

/// Longest a page takes to gather (its calls have shorter deadlines of their own).
pub const PAGE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(8);

/// How long a gathered view is served again: many browsers on the page cost the
/// cluster one gathering a second.
pub const VIEW_REUSE: std::time::Duration = std::time::Duration::from_secs(1);

struct Shared {
    coordinators: Vec<String>,
    registries: Vec<prometheus::Registry>,
    pool: RpcPool,
    /// The last view gathered and when; held while one is gathered, so concurrent
    /// requests wait for it rather than gather too.
    last: tokio::sync::Mutex<Option<(tokio::time::Instant, Arc<ClusterView>)>>,
}

impl Shared {
    async fn view(&self) -> Arc<ClusterView> {
        let mut last = self.last.lock().await;
        if let Some((at, view)) = &*last {
            if at.elapsed() < VIEW_REUSE {
                return Arc::clone(view);
            }
        }
        let view = Arc::new(ClusterView::gather(&self.coordinators, &self.pool).await);
        *last = Some((tokio::time::Instant::now(), Arc::clone(&view)));
        view
    }
}

async fn answer(shared: &Shared, request: &Request) -> Response {
    match request.path.as_str() {
        "/" | "/index.html" => {
            let view = shared.view().await;
            Response::ok("text/html; charset=utf-8", render_page(&view))
        }
        "/fragment" => {
            let view = shared.view().await;
            Response::ok("text/html; charset=utf-8", render_fragment(&view))
        }
        "/api/status" => {
            let view = shared.view().await;
            match serde_json::to_vec_pretty(&*view) {
                Ok(json) => Response::ok("application/json", json),
                Err(error) => Response::error(500, format!("status not encoded: {error}")),
            }
        }
        _ => metrics_response(request, &shared.registries),
    }
}

const STYLE: &str = "body{font-family:sans-serif;margin:1.5em;color:#222}\
h1{font-size:1.4em}h2{font-size:1.1em;margin-top:1.4em}\
table{border-collapse:collapse}td,th{padding:3px 9px;border-bottom:1px solid #ddd;text-align:left;white-space:nowrap}\
td.n,th.n{text-align:right}.badge{padding:1px 6px;border-radius:3px;color:#fff;font-size:.9em}\
.up{background:#2ca02c}.crashed{background:#d62728}.recovering{background:#ff7f0e}\
.recovery-waiting{background:#9467bd}.removed{background:#999}.draining{background:#e377c2}\
.problems{background:#fde8e8;border:1px solid #d62728;padding:.5em 1em}\
.ok{background:#e8f6e8;border:1px solid #2ca02c;padding:.5em 1em}\
.mem{display:inline-block;width:120px;height:10px;background:#eee;vertical-align:middle}\
.mem span{display:block;height:10px;background:#1f77b4}.muted{color:#777}";

/// The whole page: the fragment, and the script that refreshes it.
pub fn render_page(view: &ClusterView) -> String {
    format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <title>Rampart cluster</title><style>{STYLE}</style></head>\n<body>\
         <h1>Rampart cluster</h1>\n<div id=\"status\">{}</div>\n<script>\n\
         async function refresh() {{\n\
           try {{\n\
             const reply = await fetch('/fragment', {{cache: 'no-store'}});\n\
             if (reply.ok) document.getElementById('status').innerHTML = await reply.text();\n\
           }} catch (e) {{}}\n\
         }}\n\
         setInterval(refresh, {});\n</script>\n</body></html>\n",
        render_fragment(view),
        REFRESH_SECONDS * 1000
    )
}

/// The page's body (module doc).
pub fn render_fragment(view: &ClusterView) -> String {
    let mut html = String::new();
    let _ = render_into(&mut html, view);
    html
}

fn render_into(html: &mut String, view: &ClusterView) -> std::fmt::Result {
    if view.problems.is_empty() {
        writeln!(html, "<div class=\"ok\" id=\"problems\">No problems.</div>")?;
    } else {
        writeln!(
            html,
            "<div class=\"problems\" id=\"problems\"><b>Problems</b><ul>"
        )?;
        for problem in &view.problems {
            writeln!(html, "<li>{}</li>", escape(problem))?;
        }
        writeln!(html, "</ul></div>")?;
    }
    writeln!(
        html,
        "<p>Leader {} · configuration version {} · servers: {} up, {} recovering, {} crashed, \
         {} removed · {} table(s) · <span class=\"muted\">as of {}</span></p>",
        escape(view.leader.as_deref().unwrap_or("none")),
        view.config_version,
        view.count(ServerState::Up),
        view.count(ServerState::Recovering) + view.count(ServerState::RecoveryWaiting),
        view.count(ServerState::Crashed),
        view.count(ServerState::Removed),
        view.tables.len(),
        utc_time(view.gathered_unix_ms),
    )?;
    coordinators(html, view)?;
    servers(html, view)?;
    replica_chart(html, view)?;
    tables(html, view)?;
    drains(html, view)?;
    rebalancing(html, view)?;
    recoveries(html, &view.recoveries, view.gathered_unix_ms)
}

/// Each master's load, the rebalancer's state and its last decisions.
fn rebalancing(html: &mut String, view: &ClusterView) -> std::fmt::Result {
    let Some(rebalance) = &view.rebalance else {
        return Ok(());
    };
    let state = match (rebalance.enabled, rebalance.paused) {
        (false, _) => "off",
        (true, true) => "paused",
        (true, false) => "on",
    };
    writeln!(
        html,
        "<h2>Load and rebalancing</h2><p>Rebalancing <b id=\"rebalancing\">{state}</b>{}</p>",
        if rebalance.pinned.is_empty() {
            String::new()
        } else {
            format!(" · {} pinned range(s)", rebalance.pinned.len())
        }
    )?;
    let busiest = rebalance
        .servers
        .iter()
        .map(|s| s.ops_per_s)
        .max()
        .unwrap_or(0)
        .max(1);
    writeln!(html, "<table id=\"load\"><tr><th class=\"n\">master</th><th class=\"n\">ops/s</th><th></th><th>log bytes</th><th class=\"n\">tablets</th></tr>")?;
    for server in &rebalance.servers {
        writeln!(
            html,
            "<tr><td class=\"n\">{}</td><td class=\"n\">{}</td><td><span class=\"mem\"><span style=\"width:{:.0}%\"></span></span></td><td>{}</td><td class=\"n\">{}</td></tr>",
            server.server,
            server.ops_per_s,
            server.ops_per_s as f64 * 100.0 / busiest as f64,
            mib(server.bytes),
            server.tablets.len()
        )?;
    }
    writeln!(html, "</table>")?;
    if rebalance.decisions.is_empty() {
        return writeln!(html, "<p class=\"muted\">No rebalancing decisions yet.</p>");
    }
    writeln!(html, "<ol id=\"decisions\">")?;
    for decision in &rebalance.decisions {
        writeln!(
            html,
            "<li>{}: <b>{}</b> — {}; <i>{}</i></li>",
            utc_time(decision.at_unix_ms),
            escape(&decision.action),
            escape(&decision.why),
            escape(&decision.outcome)
        )?;
    }
    writeln!(html, "</ol>")
}

fn drains(html: &mut String, view: &ClusterView) -> std::fmt::Result {
    if view.drains.is_empty() {
        return Ok(());
    }
    writeln!(html, "<h2>Drains</h2><ul id=\"drains\">")?;
    for drain in &view.drains {
        writeln!(
            html,
            "<li><b>{}</b>: {} tablets left, {} masters still using its backup; {}</li>",
            drain.server,
            drain.tablets_left,
            drain.masters_waiting,
            escape(&drain.detail)
        )?;
    }
    writeln!(html, "</ul>")
}

fn coordinators(html: &mut String, view: &ClusterView) -> std::fmt::Result {
    writeln!(html, "<h2>Coordinators</h2><table id=\"coordinators\"><tr><th>address</th><th class=\"n\">id</th><th>role</th><th class=\"n\">term</th><th class=\"n\">leader</th><th class=\"n\">commit</th><th class=\"n\">applied</th></tr>")?;
    for c in &view.coordinators {
        match (&c.raft, &c.error) {
            (Some(r), _) => writeln!(
                html,
                "<tr><td>{}</td><td class=\"n\">{}</td><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td></tr>",
                escape(&c.addr), r.id, escape(&r.role), r.term, r.leader_id, r.commit, r.applied
            )?,
            (None, error) => writeln!(
                html,
                "<tr><td>{}</td><td colspan=\"6\"><span class=\"badge crashed\">unreachable</span> {}</td></tr>",
                escape(&c.addr),
                escape(error.as_deref().unwrap_or(""))
            )?,
        }
    }
    writeln!(html, "</table>")
}

fn badge(state: ServerState) -> String {
    let class = state.word().replace(' ', "-");
    format!("<span class=\"badge {class}\">{}</span>", state.word())
}

fn servers(html: &mut String, view: &ClusterView) -> std::fmt::Result {
    writeln!(html, "<h2>Servers</h2><table id=\"servers\"><tr><th class=\"n\">id</th><th>address</th><th>state</th><th>domain</th><th class=\"n\">objects</th><th>log memory</th><th class=\"n\">replicas</th><th class=\"n\">open</th><th class=\"n\">unflushed</th><th class=\"n\">short of R</th><th class=\"n\">lease</th></tr>")?;
    for s in &view.servers {
        write!(
            html,
            "<tr id=\"server-{}\"><td class=\"n\">{}</td><td>{}</td><td>{}{}</td><td>{}</td>",
            s.id,
            s.id,
            escape(&s.addr),
            badge(s.state),
            if view.drain(s.id).is_some() {
                " <span class=\"badge draining\">draining</span>"
            } else {
                ""
            },
            escape(&s.failure_domain)
        )?;
        match (&s.stats, &s.error) {
            (Some(st), _) => {
                let used = st.log_bytes_used as f64 / st.log_bytes_max.max(1) as f64;
                let lease = st
                    .lease_remaining_ms
                    .map_or("-".to_string(), |ms| format!("{:.1} s", ms as f64 / 1000.0));
                writeln!(
                    html,
                    "<td class=\"n\">{}</td><td><span class=\"mem\"><span style=\"width:{:.0}%\"></span></span> {} / {}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td></tr>",
                    st.objects,
                    (used * 100.0).min(100.0),
                    mib(st.log_bytes_used),
                    mib(st.log_bytes_max),
                    st.backup_replicas + st.frames_open,
                    st.frames_open,
                    st.frames_unflushed,
                    st.segments_under_replicated,
                    lease
                )?;
            }
            (None, Some(error)) => writeln!(
                html,
                "<td colspan=\"7\" class=\"muted\">no answer: {}</td></tr>",
                escape(error)
            )?,
            (None, None) => writeln!(html, "<td colspan=\"7\"></td></tr>")?,
        }
    }
    writeln!(html, "</table>")
}

/// Replicas per backup, as horizontal bars (stored replicas plus open frames).
fn replica_chart(html: &mut String, view: &ClusterView) -> std::fmt::Result {
    let rows: Vec<(&ServerView, u64, u64)> = view
        .servers
        .iter()
        .filter_map(|s| {
            let st = s.stats.as_ref()?;
            Some((s, st.backup_replicas, st.frames_open))
        })
        .collect();
    writeln!(html, "<h2>Replicas per backup</h2>")?;
    if rows.is_empty() {
        return writeln!(html, "<p class=\"muted\">No backup answered.</p>");
    }
    let most = rows.iter().map(|(_, a, b)| a + b).max().unwrap_or(0).max(1) as f64;
    let (row, width) = (22.0, 600.0);
    writeln!(
        html,
        "<svg id=\"replica-chart\" xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" font-family=\"sans-serif\" font-size=\"12\">",
        width + 220.0,
        row * rows.len() as f64 + 24.0
    )?;
    for (i, (server, stored, open)) in rows.iter().enumerate() {
        let y = i as f64 * row;
        let stored_w = *stored as f64 / most * width;
        let open_w = *open as f64 / most * width;
        writeln!(
            html,
            "<text x=\"0\" y=\"{:.0}\">server {}</text><rect x=\"80\" y=\"{y:.0}\" width=\"{stored_w:.1}\" height=\"16\" fill=\"#1f77b4\"/><rect x=\"{:.1}\" y=\"{y:.0}\" width=\"{open_w:.1}\" height=\"16\" fill=\"#ff7f0e\"/><text x=\"{:.1}\" y=\"{:.0}\">{stored} stored, {open} open</text>",
            y + 13.0,
            server.id,
            80.0 + stored_w,
            86.0 + stored_w + open_w,
            y + 13.0
        )?;
    }
    writeln!(html, "</svg>")
}

fn tables(html: &mut String, view: &ClusterView) -> std::fmt::Result {
    writeln!(html, "<h2>Tables</h2>")?;
    if view.tables.is_empty() {
        return writeln!(html, "<p class=\"muted\">No tables.</p>");
    }
    writeln!(html, "<table id=\"tables\"><tr><th>table</th><th class=\"n\">id</th><th>tablet (key hashes)</th><th class=\"n\">owner</th><th>owner state</th><th class=\"n\">ops/s</th><th>log bytes</th></tr>")?;
    for table in &view.tables {
        for (i, tablet) in table.tablets.iter().enumerate() {
            let name = if i == 0 {
                escape(&table.name)
            } else {
                String::new()
            };
            let id = if i == 0 {
                table.id.to_string()
            } else {
                String::new()
            };
            let load = view.tablet_load(table.id, tablet.start_hash);
            writeln!(
                html,
                "<tr><td>{name}</td><td class=\"n\">{id}</td><td><code>{:016x}–{:016x}</code></td><td class=\"n\">{}</td><td>{}</td><td class=\"n\">{}</td><td>{}</td></tr>",
                tablet.start_hash,
                tablet.end_hash,
                tablet.owner,
                badge(tablet.owner_state),
                load.map_or("-".to_string(), |l| l.ops.to_string()),
                load.map_or("-".to_string(), |l| mib(l.bytes)),
            )?;
        }
    }
    writeln!(html, "</table>")
}

fn recoveries(
    html: &mut String,
    reports: &[RecoveryReport],
    gathered_unix_ms: u64,
) -> std::fmt::Result {
    writeln!(html, "<h2>Recoveries</h2>")?;
    if reports.is_empty() {
        return writeln!(
            html,
            "<p class=\"muted\">No recoveries since this leader took over.</p>"
        );
    }
    writeln!(html, "<div id=\"recoveries\">")?;
    for report in reports.iter().rev() {
        let state = match (&report.waiting, report.done_ms) {
            (Some(why), _) => format!("waiting: {}", escape(why)),
            (None, 0) => "in progress".to_string(),
            (None, done) => format!("done in {done} ms after it was declared"),
        };
        let objects: u64 = report.partitions.iter().map(|p| p.objects).sum();
        let bytes: u64 = report.partitions.iter().map(|p| p.bytes).sum();
        let lease = match report.lease_end {
            Some(end) => format!(", live from {} ms: {end}", report.lease_end_ms),
            None => String::new(),
        };
        writeln!(
            html,
            "<div class=\"recovery\" id=\"recovery-{}\"><p><b>Recovery of {}</b> · declared {} · detection {} ms, setup {} ms{} · {} segments, {} partitions, {} objects, {} · {}</p>",
            report.crashed.0,
            report.crashed,
            utc_time(report.declared_unix_ms),
            report.detection_ms,
            report.setup_ms,
            lease,
            report.segments,
            report.partitions.len(),
            objects,
            mib(bytes),
            state
        )?;
        let now = gathered_unix_ms.saturating_sub(report.declared_unix_ms);
        html.push_str(&rampart_common::recovery_timeline::svg(
            report,
            report.detection_ms,
            report.detection_ms,
            Some(now),
        ));
        writeln!(html, "</div>")?;
    }
    writeln!(html, "</div>")
}

fn mib(bytes: u64) -> String {
    rampart_common::config::ByteSize(bytes).readable()
}

/// `HH:MM:SS UTC` of a Unix time in milliseconds (the status page's and `rampart
/// recovery`'s times).
pub fn utc_time(unix_ms: u64) -> String {
    let seconds = unix_ms / 1000 % 86_400;
    format!(
        "{:02}:{:02}:{:02} UTC",
        seconds / 3600,
        seconds / 60 % 60,
        seconds % 60
    )
}

/// Text made safe inside HTML elements and attribute values.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster_view::{CoordinatorView, ServerView, TableView, TabletView};
    use rampart_common::ids::ServerId;
    use rampart_common::ids::TableId;
    use rampart_common::protocol::coordinator::{
        DrainReply, DrainState, LeaseEnd, PartitionReport, RebalanceDecision, RebalanceReply,
        ServerLoad,
    };
    use rampart_common::protocol::master::ServerStatsReply;
    use rampart_common::tablet::{HashRange, TabletLoad};

    fn view() -> ClusterView {
        let server = |id: u64, state: ServerState, stats: Option<ServerStatsReply>| ServerView {
            id,
            addr: format!("127.0.0.1:{}", 9000 + id),
            state,
            failure_domain: "rack<1>".into(),
            master: true,
            backup: true,
            stats,
            error: None,
        };
        let stats = ServerStatsReply {
            objects: 12,
            log_bytes_used: 16 << 20,
            log_bytes_max: 64 << 20,
            replicas: 1,
            backup_replicas: 5,
            frames_open: 2,
            ..ServerStatsReply::default()
        };
        ClusterView {
            gathered_unix_ms: 3_600_000 + 61_000,
            coordinators: vec![CoordinatorView {
                addr: "127.0.0.1:7001".into(),
                raft: None,
                error: Some("cannot connect".into()),
            }],
            leader: Some("127.0.0.1:7000".into()),
            config_version: 9,
            config_error: None,
            servers: vec![
                server(1, ServerState::Up, Some(stats.clone())),
                server(2, ServerState::Up, Some(stats)),
                server(3, ServerState::Removed, None),
            ],
            tables: vec![TableView {
                id: 1,
                name: "<users>".into(),
                tablets: vec![TabletView {
                    start_hash: 0,
                    end_hash: u64::MAX,
                    owner: 1,
                    owner_state: ServerState::Up,
                }],
            }],
            recoveries: vec![RecoveryReport {
                crashed: ServerId(3),
                declared_unix_ms: 3_600_000,
                detection_ms: 400,
                setup_ms: 20,
                done_ms: 700,
                segments: 4,
                waiting: None,
                partitions: vec![PartitionReport {
                    partition: 0,
                    master: ServerId(1),
                    live_ms: 650,
                    replay_ms: 200,
                    replay_start_ms: 30,
                    bytes: 1 << 20,
                    objects: 100,
                    attempts: 1,
                }],
                lease_end: Some(LeaseEnd::ExitSeen),
                lease_end_ms: 3,
            }],
            drains: vec![DrainReply {
                server: ServerId(2),
                state: DrainState::Draining,
                tablets_left: 0,
                masters_waiting: 1,
                detail: "masters re-creating <replicas>".into(),
                bytes_moved: 0,
            }],
            rebalance: Some(RebalanceReply {
                enabled: true,
                paused: false,
                pinned: Vec::new(),
                move_cap_mb_s: 0,
                moves: Vec::new(),
                servers: vec![ServerLoad {
                    server: ServerId(1),
                    ops_per_s: 5_000,
                    bytes: 3 << 20,
                    tablets: vec![TabletLoad {
                        range: HashRange::new(TableId(1), 0, u64::MAX),
                        ops: 5_000,
                        bytes: 3 << 20,
                        split_at: None,
                    }],
                }],
                decisions: vec![RebalanceDecision {
                    at_unix_ms: 3_600_000,
                    action: "move table 1 [0x0, 0x7f] from server-1 to server-2".into(),
                    why: "master server-1 at <5000> ops/s".into(),
                    outcome: "moved".into(),
                    done_unix_ms: 3_600_100,
                    bytes_moved: 1 << 20,
                }],
            }),
            problems: vec!["coordinator 127.0.0.1:7001 does not answer".into()],
        }
    }

    #[test]
    fn the_page_shows_servers_tables_and_a_finished_recovery_escaped() {
        let page = render_page(&view());
        assert!(page.starts_with("<!doctype html>"));
        assert!(page.contains("id=\"server-1\""));
        assert!(page.contains("id=\"server-3\""));
        assert!(page.contains("badge removed"));
        assert!(page.contains("&lt;users&gt;"), "names are escaped");
        assert!(!page.contains("<users>"));
        assert!(page.contains("rack&lt;1&gt;"));
        assert!(page.contains("Recovery of server-3"));
        assert!(page.contains("done in 700 ms"));
        assert!(
            page.contains("live from 3 ms: supervisor saw it exit"),
            "which case let the tablets go live"
        );
        assert!(page.contains("id=\"replica-chart\""));
        assert!(page.contains("5 stored, 2 open"));
        assert!(page.contains("does not answer"));
        assert!(page.contains("01:01:01 UTC"));
        assert!(page.contains("setInterval(refresh, 2000)"));
        assert!(page.contains("badge draining"));
        assert!(page.contains("server-2</b>: 0 tablets left, 1 masters"));
        assert!(page.contains("re-creating &lt;replicas&gt;"));
        assert!(page.contains("Rebalancing <b id=\"rebalancing\">on</b>"));
        assert!(page.contains("id=\"load\""));
        assert!(
            page.contains("at &lt;5000&gt; ops/s"),
            "decisions are escaped"
        );
        assert!(
            page.contains("<td class=\"n\">5000</td><td>3MiB</td>"),
            "tablet load"
        );
        for external in [" src=", "<link", "@import", "url("] {
            assert!(
                !page.contains(external),
                "no external resources: {external}"
            );
        }
    }

    #[test]
    fn a_cluster_without_problems_says_so() {
        let mut view = view();
        view.problems.clear();
        view.recoveries.clear();
        let fragment = render_fragment(&view);
        assert!(fragment.contains("No problems."));
        assert!(fragment.contains("No recoveries since this leader took over."));
    }
}
