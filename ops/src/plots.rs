//! Where the benchmarks and `rampart simulate` write their plots.

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
