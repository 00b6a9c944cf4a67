//! What an operator sees: the coordinators' status page in a real browser (headless
//! Chromium), its JSON, `rampart status`, `rampart recovery list|show`, and the
//! Prometheus metrics of every process, on a `cluster up` cluster before and after a
//! server is killed with SIGKILL and recovered.
//!
//! The browser is Debian's `chromium` (`.ci/run` installs it). Without it the browser
//! part is skipped with a message — unless `RAMPART_REQUIRE_TOOLS=1` (set by
//! `.ci/run`), when its absence fails the test. The screenshot is saved as
//! `target/status-page.png` (docs/operating.md shows one).

// A failed unwrap is a failed test, with its location.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use rampart_tests::{http_get, LocalCluster};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const HTTP_TIMEOUT: Duration = Duration::from_secs(10);

/// Debian's Chromium, if installed.
fn chromium() -> Option<PathBuf> {
    [
        "/usr/bin/chromium",
        "/usr/bin/chromium-browser",
        "/usr/bin/google-chrome",
    ]
    .iter()
    .map(PathBuf::from)
    .find(|path| path.exists())
}

/// Runs headless Chromium on `url` with `extra` flags; returns its stdout.
fn browse(browser: &Path, url: &str, extra: &[String]) -> String {
    let profile = tempfile::TempDir::new().unwrap();
    let output = Command::new(browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--hide-scrollbars",
            "--window-size=1280,1150",
            // Lets the page's refresh script run (a fetch of /fragment every 2 s).
            "--virtual-time-budget=5000",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .args(extra)
        .arg(url)
        .output()
        .expect("chromium runs");
    assert!(
        output.status.success(),
        "chromium failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"))
}

#[test]
fn the_status_page_shows_the_servers_and_a_finished_recovery_in_a_browser() {
    let cluster = LocalCluster::start(4, &["--replicas", "1", "--memory", "64MiB"]).unwrap();
    assert_eq!(
        cluster.status_pages.len(),
        3,
        "every coordinator serves a page"
    );
    assert_eq!(cluster.metrics.len(), 3 + 4, "every process serves metrics");
    let created = cluster
        .rampart(&["kv", "create-table", "users", "--span", "4"], None)
        .unwrap();
    assert!(created.status.success(), "{created:?}");
    for i in 0..20 {
        let put = cluster
            .rampart(&["kv", "put", "users", &format!("user{i}"), "x"], None)
            .unwrap();
        assert!(put.status.success(), "{put:?}");
    }
    // Metrics of a server under load: its objects and its RPCs by operation.
    let (_, server_metrics) = http_get(&cluster.metrics[3], HTTP_TIMEOUT).unwrap();
    assert!(
        server_metrics.contains("rampart_master_objects "),
        "{server_metrics}"
    );
    assert!(server_metrics.contains("rampart_rpc_duration_seconds_bucket{operation="));
    // A coordinator's: Raft and the configuration.
    let (_, coordinator_metrics) = http_get(&cluster.metrics[0], HTTP_TIMEOUT).unwrap();
    assert!(
        coordinator_metrics.contains("rampart_raft_term "),
        "{coordinator_metrics}"
    );
    assert!(coordinator_metrics.contains("rampart_cluster_servers{status=\"up\"} 4"));

    // Kill a server; its recovery finishes.
    let (victim, _, pid) = cluster.servers[0].clone();
    // SAFETY: kill(2) on a child process id this test's cluster started.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    let api = format!("{}api/status", cluster.status_pages[1]);
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let (status, json) = http_get(&api, HTTP_TIMEOUT).unwrap();
        assert_eq!(status, 200, "{json}");
        let done =
            json.contains(&format!("\"crashed\": {victim}")) && !json.contains("\"done_ms\": 0");
        if done && json.contains("\"state\": \"removed\"") {
            break;
        }
        assert!(Instant::now() < deadline, "recovery did not finish: {json}");
        std::thread::sleep(Duration::from_millis(250));
    }
    // `rampart status` and `rampart recovery list|show` say the same.
    let status = cluster.rampart(&["status"], None).unwrap();
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(text.contains("users (id "), "{text}");
    assert!(text.contains(" removed"), "{text}");
    let list = cluster
        .rampart(
            &["recovery", "list", "--coordinator", &cluster.coordinator],
            None,
        )
        .unwrap();
    let listed = String::from_utf8_lossy(&list.stdout);
    assert!(list.status.success(), "{list:?}");
    assert!(listed.contains("done"), "{listed}");
    let show = cluster
        .rampart(&["recovery", "show", &victim.to_string()], None)
        .unwrap();
    let shown = String::from_utf8_lossy(&show.stdout);
    assert!(show.status.success(), "{show:?}");
    assert!(
        shown.contains("detection") && shown.contains("replay"),
        "{shown}"
    );

    let Some(browser) = chromium() else {
        assert!(
            std::env::var("RAMPART_REQUIRE_TOOLS").as_deref() != Ok("1"),
            "RAMPART_REQUIRE_TOOLS=1 but no chromium is installed"
        );
        eprintln!("skipping the browser part: no chromium (apt-get install chromium)");
        return;
    };
    // A follower's page: the leader's view, rendered, then refreshed by its script.
    let page = &cluster.status_pages[2];
    let dom = browse(&browser, page, &["--dump-dom".to_string()]);
    for (id, _, _) in &cluster.servers {
        assert!(
            dom.contains(&format!("id=\"server-{id}\"")),
            "server {id}: {dom}"
        );
    }
    assert!(dom.contains("badge removed"), "{dom}");
    assert!(dom.contains(&format!("id=\"recovery-{victim}\"")), "{dom}");
    assert!(dom.contains("done in"), "{dom}");
    assert!(dom.contains("id=\"replica-chart\""), "{dom}");
    let shot = target_dir().join("status-page.png");
    let _ = std::fs::remove_file(&shot);
    browse(
        &browser,
        page,
        &[format!("--screenshot={}", shot.display())],
    );
    let bytes = std::fs::read(&shot).expect("a screenshot");
    assert!(bytes.starts_with(b"\x89PNG"), "a PNG at {}", shot.display());
    eprintln!("status page screenshot: {}", shot.display());
}
