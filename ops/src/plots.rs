//! Where the benchmarks and `rampart simulate` write their plots, and the colours of
//! their line charts.

use plotters::style::RGBColor;

/// The colours of a line chart's lines, in order (matplotlib's first eight).
pub(crate) const LINE_COLOURS: [RGBColor; 8] = [
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0x8c, 0x56, 0x4b),
    RGBColor(0xe3, 0x77, 0xc2),
    RGBColor(0x7f, 0x7f, 0x7f),
];

/// `json` with its extension replaced by `-NAME.svg`: where a benchmark (or `rampart
/// simulate`) writes its plot NAME beside its JSON.
pub(crate) fn plot_path(json: &std::path::Path, name: &str) -> std::path::PathBuf {
    let stem = json
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "figures".to_string());
    json.with_file_name(format!("{stem}-{name}.svg"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plots_go_beside_the_json() {
        assert_eq!(
            plot_path(std::path::Path::new("out/compare.json"), "ycsb"),
            std::path::Path::new("out/compare-ycsb.svg")
        );
    }
}
