//! The timeline of one recovery as an SVG picture: a row for the coordinator
//! (detection, setup) and one per partition (its recovery master's replay, then the
//! wait for the lease, the commit and the handover), and a line where the crashed
//! master's lease ended or its death was proven, named by which. Drawn by `rampart bench recovery`
//! and by the coordinators' status page from the same `RecoveryReport`.

use crate::protocol::coordinator::RecoveryReport;

/// The SVG of `report`. Times are drawn from 0 = the crash; `shift` is added to the
/// report's times (which count from the declared crash) and `detection` is the length
/// of the first bar (the bench knows when it killed the server; the coordinator knows
/// how long the server was silent before it was declared crashed). `now`, in the
/// report's time, draws a recovery still under way: each partition not live yet runs
/// to it, in a lighter shade.
pub fn svg(report: &RecoveryReport, shift: u64, detection: u64, now: Option<u64>) -> String {
    let live = report.partitions.iter().filter(|p| p.live_ms > 0).count();
    let under_way = live < report.partitions.len();
    let now = now.filter(|_| under_way).map(|now| now + shift);
    let end = report
        .partitions
        .iter()
        .map(|p| p.live_ms + shift)
        .chain([report.setup_ms + shift, detection])
        .chain(now)
        .max()
        .unwrap_or(1)
        .max(1) as f64;
    let width = 1000.0;
    let x = |ms: u64| 150.0 + (ms as f64 / end) * (width - 170.0);
    let row = 26.0;
    let mut svg = String::new();
    let height = 80.0 + row * (report.partitions.len() as f64 + 1.0);
    svg.push_str(&format!(
        "<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' font-family='sans-serif' font-size='12'>\n"
    ));
    let title = if under_way {
        format!(
            "{live} of {} partitions live, {end:.0} ms after the crash",
            report.partitions.len()
        )
    } else {
        format!("crash at 0 ms, last partition live at {end:.0} ms")
    };
    svg.push_str(&format!(
        "<text x='10' y='20'>Recovery of {} ({title})</text>\n",
        report.crashed
    ));
    let bar = |svg: &mut String, y: f64, from: u64, to: u64, colour: &str| {
        let (a, b) = (x(from), x(to.max(from)));
        svg.push_str(&format!(
            "<rect x='{a:.1}' y='{y:.1}' width='{:.1}' height='18' fill='{colour}'/>\n",
            (b - a).max(1.0)
        ));
    };
    let mut y = 40.0;
    svg.push_str(&format!(
        "<text x='10' y='{:.1}'>coordinator</text>\n",
        y + 13.0
    ));
    bar(&mut svg, y, 0, detection, "#d62728");
    bar(&mut svg, y, detection, report.setup_ms + shift, "#ff7f0e");
    for p in &report.partitions {
        y += row;
        svg.push_str(&format!(
            "<text x='10' y='{:.1}'>p{} on {}</text>\n",
            y + 13.0,
            p.partition,
            p.master
        ));
        let start = p.replay_start_ms + shift;
        let replayed = start + p.replay_ms;
        match (p.live_ms > 0, p.replay_ms > 0, now) {
            (true, _, _) => {
                bar(&mut svg, y, start, replayed, "#1f77b4");
                bar(&mut svg, y, replayed, p.live_ms + shift, "#2ca02c");
            }
            // Replayed, not live yet: waiting for the lease or the commit.
            (false, true, Some(now)) => {
                bar(&mut svg, y, start, replayed, "#1f77b4");
                bar(&mut svg, y, replayed, now, "#98df8a");
            }
            // Replaying.
            (false, false, Some(now)) => bar(&mut svg, y, start, now, "#aec7e8"),
            (false, _, None) => bar(&mut svg, y, start, replayed, "#1f77b4"),
        }
    }
    if let Some(end) = report.lease_end {
        let lx = x(report.lease_end_ms + shift);
        svg.push_str(&format!(
            "<line x1='{lx:.1}' y1='30' x2='{lx:.1}' y2='{:.1}' stroke='#555' stroke-dasharray='4 3'/>\n<text x='{:.1}' y='36' fill='#555'>{end} at {} ms</text>\n",
            y + row,
            lx + 4.0,
            report.lease_end_ms + shift
        ));
    }
    y += row + 10.0;
    let mut lx = 10.0;
    for (name, colour) in [
        ("detection", "#d62728"),
        ("setup", "#ff7f0e"),
        ("turn wait + fetch + replay + re-replication", "#1f77b4"),
        ("lease wait, commit, take tablets", "#2ca02c"),
    ] {
        // About 7 px per character at 12 px: each label clear of the next.
        let next = lx + 40.0 + 7.0 * name.len() as f64;
        svg.push_str(&format!(
            "<rect x='{lx}' y='{y:.1}' width='12' height='12' fill='{colour}'/><text x='{:.1}' y='{:.1}'>{name}</text>\n",
            lx + 16.0,
            y + 11.0
        ));
        lx = next;
    }
    svg.push_str("</svg>\n");
    svg
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::ServerId;
    use crate::protocol::coordinator::PartitionReport;

    #[test]
    fn every_partition_gets_a_row_and_unfinished_ones_no_live_bar() {
        let partition = |partition, live_ms| PartitionReport {
            partition,
            master: ServerId(2),
            live_ms,
            replay_ms: 100,
            replay_start_ms: 20,
            bytes: 1,
            objects: 1,
            attempts: 1,
        };
        let report = RecoveryReport {
            crashed: ServerId(1),
            declared_unix_ms: 0,
            detection_ms: 300,
            setup_ms: 10,
            done_ms: 0,
            segments: 2,
            waiting: None,
            partitions: vec![partition(0, 400), partition(1, 0)],
            lease_end: None,
            lease_end_ms: 0,
        };
        let drawn = svg(&report, 300, 300, None);
        assert!(!drawn.contains("<line"));
        assert!(drawn.starts_with("<svg"));
        assert!(drawn.contains(">p0 on "));
        assert!(drawn.contains(">p1 on "));
        // Bars: detection, setup, two replays, one live.
        assert_eq!(drawn.matches("height='18'").count(), 5);
        assert!(drawn.contains("1 of 2 partitions live"));
        // Under way: the partition replayed but not live waits until now, lighter.
        let drawn = svg(&report, 300, 300, Some(900));
        assert_eq!(drawn.matches("height='18'").count(), 6);
        assert!(drawn.contains("#98df8a"));
        assert!(drawn.contains("1200 ms after the crash"), "{drawn}");
    }

    #[test]
    fn the_lease_end_is_a_line_named_by_what_ended_it() {
        let report = RecoveryReport {
            crashed: ServerId(1),
            declared_unix_ms: 0,
            detection_ms: 5,
            setup_ms: 10,
            done_ms: 90,
            segments: 2,
            waiting: None,
            partitions: Vec::new(),
            lease_end: Some(crate::protocol::coordinator::LeaseEnd::Refused),
            lease_end_ms: 0,
        };
        let drawn = svg(&report, 5, 5, None);
        assert_eq!(drawn.matches("<line").count(), 1);
        assert!(drawn.contains(">refused at 5 ms</text>"), "{drawn}");
    }
}
