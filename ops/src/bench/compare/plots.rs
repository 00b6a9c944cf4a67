//! The comparison's plots, beside its JSON: YCSB throughput (`-ycsb.svg`) and the loss
//! of a server (`-loss.svg`).

use anyhow::{bail, Context, Result};

use super::args::CompareArgs;
use super::loss::Loss;
use super::ycsb_runs::{Measured, Results, SYSTEMS};
use crate::bench::lost_writes::LostWrites;

/// Throughput per workload, a bar per system.
pub(super) fn write_svg(
    path: &std::path::Path,
    args: &CompareArgs,
    results: &Results,
) -> Result<()> {
    use plotters::prelude::{
        ChartBuilder, Color, IntoDrawingArea, IntoSegmentedCoord, RGBColor, Rectangle, SVGBackend,
        SegmentValue, BLACK, WHITE,
    };
    const COLOURS: [RGBColor; 3] = [
        RGBColor(0x1f, 0x77, 0xb4),
        RGBColor(0xd6, 0x27, 0x28),
        RGBColor(0xff, 0x7f, 0x0e),
    ];
    let workloads = &args.workloads;
    let y_max = results
        .values()
        .map(Measured::throughput)
        .fold(0.0_f64, f64::max)
        * 1.35;
    if y_max <= 0.0 {
        bail!("nothing to plot");
    }
    let slots = workloads.len() * (SYSTEMS.len() + 1);
    let draw = || -> Result<()> {
        let root = SVGBackend::new(path, (900, 520)).into_drawing_area();
        root.fill(&WHITE)?;
        let caption = format!(
            "bench compare: ops/s, {} clients, {} records, {}-byte values, zipf {}",
            args.clients, args.records, args.value_bytes, args.zipf
        );
        let mut chart = ChartBuilder::on(&root)
            .caption(caption, ("sans-serif", 16))
            .margin(16)
            .x_label_area_size(40)
            .y_label_area_size(72)
            .build_cartesian_2d((0..slots as i32).into_segmented(), 0.0..y_max)?;
        let names: Vec<&str> = workloads.iter().map(|w| w.name()).collect();
        let per = SYSTEMS.len() + 1;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(slots)
            .x_label_formatter(&|v| match v {
                SegmentValue::Exact(i) | SegmentValue::CenterOf(i) => {
                    let i = *i as usize;
                    if i % per == 1 {
                        names.get(i / per).map_or(String::new(), |n| n.to_string())
                    } else {
                        String::new()
                    }
                }
                SegmentValue::Last => String::new(),
            })
            .y_desc("operations/s")
            .y_label_formatter(&|y| format!("{:.0}k", y / 1000.0))
            .draw()?;
        for (w, workload) in workloads.iter().enumerate() {
            for (s, system) in SYSTEMS.iter().enumerate() {
                let Some(m) = results.get(&(*workload, *system)) else {
                    continue;
                };
                let x = (w * per + s) as i32;
                let bar = chart.draw_series(std::iter::once(Rectangle::new(
                    [
                        (SegmentValue::Exact(x), 0.0),
                        (SegmentValue::Exact(x + 1), m.throughput()),
                    ],
                    COLOURS[s].filled(),
                )))?;
                // One legend entry per system.
                if w == 0 {
                    bar.label(system.label(args.replicas))
                        .legend(move |(x, y)| {
                            Rectangle::new([(x, y - 5), (x + 10, y + 5)], COLOURS[s].filled())
                        });
                }
            }
        }
        chart
            .configure_series_labels()
            .border_style(BLACK)
            .background_style(WHITE.mix(0.9))
            .draw()?;
        root.present()?;
        Ok(())
    };
    draw().with_context(|| format!("cannot write {}", path.display()))
}

/// The loss comparison: milliseconds until the data is served again, a bar per system.
pub(super) fn write_loss_svg(path: &std::path::Path, loss: &Loss) -> Result<()> {
    use plotters::prelude::{
        ChartBuilder, Color, IntoDrawingArea, IntoSegmentedCoord, RGBColor, Rectangle, SVGBackend,
        SegmentValue, Text, WHITE,
    };
    let bars = [
        (
            "rampart: crash recovery",
            loss.rampart_ms,
            RGBColor(0x1f, 0x77, 0xb4),
            &loss.rampart_lost,
        ),
        (
            "redis: restart from RDB",
            loss.rdb_ms,
            RGBColor(0xd6, 0x27, 0x28),
            &loss.rdb_lost,
        ),
        (
            "redis: restart from AOF",
            loss.aof_ms,
            RGBColor(0xff, 0x7f, 0x0e),
            &loss.aof_lost,
        ),
        (
            "redis: sentinel failover",
            loss.sentinel_ms,
            RGBColor(0x2c, 0xa0, 0x2c),
            &loss.sentinel_lost,
        ),
    ];
    let y_max = bars.iter().map(|b| b.1).fold(0.0_f64, f64::max) * 1.2;
    if y_max <= 0.0 {
        bail!("nothing to plot");
    }
    let draw = || -> Result<()> {
        let root = SVGBackend::new(path, (900, 460)).into_drawing_area();
        root.fill(&WHITE)?;
        let caption = format!(
            "bench compare: loss of a server holding {} GiB, kill to data served again; \
             acknowledged writes lost",
            loss.gib
        );
        let mut chart = ChartBuilder::on(&root)
            .caption(caption, ("sans-serif", 15))
            .margin(16)
            .x_label_area_size(40)
            .y_label_area_size(64)
            .build_cartesian_2d((0..bars.len() as i32 - 1).into_segmented(), 0.0..y_max)?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_label_formatter(&|v| match v {
                SegmentValue::CenterOf(i) | SegmentValue::Exact(i) => bars
                    .get(*i as usize)
                    .map_or(String::new(), |b| b.0.to_string()),
                SegmentValue::Last => String::new(),
            })
            .y_desc("milliseconds")
            .y_label_formatter(&|y| format!("{y:.0}"))
            .draw()?;
        for (i, (_, ms, colour, lost)) in bars.iter().enumerate() {
            let i = i as i32;
            chart.draw_series(std::iter::once(Rectangle::new(
                [
                    (SegmentValue::Exact(i), 0.0),
                    (SegmentValue::Exact(i + 1), *ms),
                ],
                colour.filled(),
            )))?;
            chart.draw_series(std::iter::once(Text::new(
                lost_label(lost),
                (SegmentValue::Exact(i), *ms + y_max * 0.02),
                ("sans-serif", 12),
            )))?;
        }
        root.present()?;
        Ok(())
    };
    draw().with_context(|| format!("cannot write {}", path.display()))
}

/// What a bar of the loss plot says above it: the load's acknowledged writes lost.
fn lost_label(lost: &LostWrites) -> String {
    format!(" {} of {} writes lost", lost.lost, lost.acknowledged)
}
