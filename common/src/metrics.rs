//! Prometheus metrics: the RPC layer's own, and how a process serves them.
//!
//! The RPC server counts requests per opcode and status in plain atomics
//! (`crate::rpc::stats`, which knows nothing of metrics); [`rpc_families`] names them
//! as Prometheus families at each scrape. Each component (a master, a backup, a
//! coordinator) registers a collector that reads its state when scraped, in a registry
//! of its own so that an in-process cluster can hold several (the `prometheus` crate).
//! [`handler`] serves all of them as text at `/metrics` ([`crate::http`]).
//!
//! Names follow Prometheus conventions: a `rampart_` prefix, the unit in the name
//! (`_seconds`, `_bytes`), `_total` on counters.

use crate::http::{Handler, Request, Response};
use crate::rpc::stats::{rpc_stats, OpcodeCounts, LATENCY_BOUNDS_SECONDS};
use prometheus::core::Collector;
use prometheus::proto::{
    Bucket, Counter as CounterSample, Histogram as HistogramSample, LabelPair, Metric,
    MetricFamily, MetricType,
};
use prometheus::{Encoder, Opts, Registry};
use std::sync::Arc;

/// The RPC server's counts of this process (`crate::rpc::stats`) as two families:
/// `rampart_rpc_requests_total{operation,status}` and
/// `rampart_rpc_duration_seconds{operation}`; none before the first request.
// The label and bucket lists are `Vec`s when this crate builds alone, but `protobuf`'s
// `RepeatedField` when another crate of the workspace turns on prometheus's `protobuf`
// feature: `.into()` fits both, and is a no-op in the first.
#[allow(clippy::useless_conversion)]
pub fn rpc_families() -> Vec<MetricFamily> {
    let counts = rpc_stats().snapshot();
    if counts.is_empty() {
        return Vec::new();
    }
    let mut requests = Vec::new();
    let mut durations = Vec::new();
    for opcode in &counts {
        let operation = operation_name(opcode);
        for (status, n) in &opcode.statuses {
            let status = status.map_or("Unrecognized".to_string(), |s| format!("{s:?}"));
            let mut counter = CounterSample::default();
            counter.set_value(*n as f64);
            let mut metric = Metric::default();
            metric.set_label(vec![label("operation", operation), label("status", &status)].into());
            metric.set_counter(counter);
            requests.push(metric);
        }
        let mut cumulative = 0;
        let buckets: Vec<Bucket> = LATENCY_BOUNDS_SECONDS
            .iter()
            .zip(&opcode.buckets)
            .map(|(bound, n)| {
                cumulative += n;
                let mut bucket = Bucket::default();
                bucket.set_upper_bound(*bound);
                bucket.set_cumulative_count(cumulative);
                bucket
            })
            .collect();
        let mut histogram = HistogramSample::default();
        histogram.set_sample_count(opcode.count());
        histogram.set_sample_sum(opcode.sum_seconds);
        histogram.set_bucket(buckets.into());
        let mut metric = Metric::default();
        metric.set_label(vec![label("operation", operation)].into());
        metric.set_histogram(histogram);
        durations.push(metric);
    }
    vec![
        family(
            "rampart_rpc_requests_total",
            "RPC requests served, by operation and reply status.",
            MetricType::COUNTER,
            requests,
        ),
        family(
            "rampart_rpc_duration_seconds",
            "Time from a request's arrival to its reply, by operation.",
            MetricType::HISTOGRAM,
            durations,
        ),
    ]
}

fn operation_name(counts: &OpcodeCounts) -> &'static str {
    counts
        .opcode
        .and_then(crate::protocol::opcode_name)
        .unwrap_or("unknown")
}

fn label(name: &str, value: &str) -> LabelPair {
    let mut pair = LabelPair::default();
    pair.set_name(name.to_string());
    pair.set_value(value.to_string());
    pair
}

// `.into()`: as for `rpc_families`.
#[allow(clippy::useless_conversion)]
fn family(name: &str, help: &str, kind: MetricType, metrics: Vec<Metric>) -> MetricFamily {
    let mut family = MetricFamily::default();
    family.set_name(name.to_string());
    family.set_help(help.to_string());
    family.set_field_type(kind);
    family.set_metric(metrics.into());
    family
}

/// A registry holding `collectors` (a component's own).
pub fn registry_of(collectors: Vec<Box<dyn Collector>>) -> Registry {
    let registry = Registry::new();
    for collector in collectors {
        if let Err(error) = registry.register(collector) {
            tracing::warn!(%error, "metrics collector not registered");
        }
    }
    registry
}

/// The text exposition of the default registry and `registries`.
pub fn render(registries: &[Registry]) -> String {
    let mut families = prometheus::default_registry().gather();
    families.extend(rpc_families());
    for registry in registries {
        families.extend(registry.gather());
    }
    families.sort_by(|a, b| a.get_name().cmp(b.get_name()));
    let mut out = Vec::new();
    if let Err(error) = prometheus::TextEncoder::new().encode(&families, &mut out) {
        tracing::warn!(%error, "metrics not encoded");
    }
    String::from_utf8(out).unwrap_or_default()
}

/// An HTTP handler serving `/metrics` (the default registry and `registries`), with a
/// short index at `/`.
pub fn handler(registries: Vec<Registry>) -> Handler {
    let registries = Arc::new(registries);
    Arc::new(move |request: Request| {
        let registries = Arc::clone(&registries);
        Box::pin(async move { metrics_response(&request, &registries) })
    })
}

/// The answer of [`handler`] to `request`, or `None`-like 404 for other paths; shared
/// with coordinators, whose HTTP server serves the status page too.
pub fn metrics_response(request: &Request, registries: &[Registry]) -> Response {
    match request.path.as_str() {
        "/metrics" => Response::ok(
            "text/plain; version=0.0.4; charset=utf-8",
            render(registries),
        ),
        "/" => Response::ok(
            "text/plain; charset=utf-8",
            "Rampart: metrics at /metrics (Prometheus text format)\n",
        ),
        path => Response::error(404, format!("no page at {path}: try /metrics")),
    }
}

/// A gauge for a collector (`unreachable!` on an invalid name: names are literals).
pub fn gauge(name: &str, help: &str) -> prometheus::Gauge {
    match prometheus::Gauge::new(name, help) {
        Ok(gauge) => gauge,
        Err(error) => unreachable!("metric {name}: {error}"),
    }
}

/// A labelled gauge for a collector.
pub fn gauge_vec(name: &str, help: &str, labels: &[&str]) -> prometheus::GaugeVec {
    match prometheus::GaugeVec::new(Opts::new(name, help), labels) {
        Ok(gauge) => gauge,
        Err(error) => unreachable!("metric {name}: {error}"),
    }
}

/// A counter-typed metric for a collector whose value is read from a component (set to
/// the component's running total at each scrape).
pub fn counter(name: &str, help: &str) -> prometheus::Counter {
    match prometheus::Counter::new(name, help) {
        Ok(counter) => counter,
        Err(error) => unreachable!("metric {name}: {error}"),
    }
}

/// Sets a counter read from a component to `total` (counters only go up; a total that
/// is lower — the component restarted its count — is left as is). Not atomic: the
/// collector calling it must run one scrape at a time.
pub fn set_counter(counter: &prometheus::Counter, total: f64) {
    let now = counter.get();
    if total > now {
        counter.inc_by(total - now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rpc::{Opcode, Rpc};
    use crate::status::Status;
    use std::time::Duration;

    #[test]
    fn rpc_requests_are_rendered_by_operation_and_status() {
        let stats = crate::rpc::stats::rpc_stats();
        let ping = crate::protocol::master::Ping::OPCODE;
        stats.observe(ping, Status::Ok, Duration::from_micros(30));
        stats.observe(ping, Status::Retry, Duration::from_micros(50));
        stats.observe(
            Opcode(4000),
            Status::UnknownOpcode,
            Duration::from_micros(5),
        );
        let text = render(&[]);
        assert!(text.contains(r#"rampart_rpc_requests_total{operation="Ping",status="Ok"}"#));
        assert!(text.contains(r#"rampart_rpc_requests_total{operation="Ping",status="Retry"}"#));
        assert!(text
            .contains(r#"rampart_rpc_requests_total{operation="unknown",status="UnknownOpcode"}"#));
        assert!(
            text.contains(r#"rampart_rpc_duration_seconds_bucket{operation="Ping",le="0.00001"}"#)
        );
        assert!(text.contains(r#"rampart_rpc_duration_seconds_bucket{operation="Ping",le="+Inf"}"#));
        assert!(text.contains("# TYPE rampart_rpc_duration_seconds histogram"));
    }

    #[test]
    fn a_component_registry_is_rendered_beside_the_default_one() {
        let memory = gauge("rampart_test_memory_bytes", "Test.");
        memory.set(42.0);
        let total = counter("rampart_test_things_total", "Test.");
        set_counter(&total, 7.0);
        set_counter(&total, 5.0);
        let registry = registry_of(vec![Box::new(memory), Box::new(total)]);
        let text = render(&[registry]);
        assert!(text.contains("rampart_test_memory_bytes 42"));
        assert!(text.contains("rampart_test_things_total 7"));
    }
}
