//! The units of the figures: microseconds from a latency histogram, CPU seconds per
//! million replicated writes, and how a figure that could not be had prints.

use hdrhistogram::Histogram;

/// The `quantile` of `h` (nanoseconds), in µs.
pub(super) fn us(h: &Histogram<u64>, quantile: f64) -> f64 {
    h.value_at_quantile(quantile) as f64 / 1000.0
}

/// Seconds of CPU per million replicated writes (`writes × replicas`), or `None`
/// without writes.
pub(super) fn cpu_s_per_million(seconds: f64, writes: u64, replicas: u32) -> Option<f64> {
    let replicated = writes * u64::from(replicas);
    (replicated > 0).then(|| seconds / replicated as f64 * 1e6)
}

/// `value` with `decimals` decimals, or `n/a`.
pub(super) fn fmt_opt(value: Option<f64>, decimals: usize) -> String {
    value.map_or_else(|| "n/a".to_string(), |v| format!("{v:.decimals$}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_per_million_divides_by_replicated_writes() {
        assert_eq!(cpu_s_per_million(3.0, 1_000_000, 3), Some(1.0));
        assert_eq!(cpu_s_per_million(1.0, 0, 3), None);
    }
}
