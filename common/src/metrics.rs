//! Prometheus metrics: the RPC layer's own, and how a process serves them.
//!
//! Every process keeps its metrics in Prometheus registries (the `prometheus` crate):
//! the RPC server's request counts and latency histograms per operation live in the
//! process's default registry ([`rpc`]); each component (a master, a backup, a
//! coordinator) registers a collector that reads its state when scraped, in a registry
//! of its own so that an in-process cluster can hold several. [`handler`] serves all of
//! them as text at `/metrics` ([`crate::http`]).
//!
//! Names follow Prometheus conventions: a `rampart_` prefix, the unit in the name
//! (`_seconds`, `_bytes`), `_total` on counters.

use crate::http::{Handler, Request, Response};
use crate::rpc::Opcode;
use crate::status::Status;
use prometheus::core::Collector;
use prometheus::{Encoder, Histogram, HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry};
use std::sync::{Arc, LazyLock, OnceLock};
use std::time::Duration;

/// Opcodes below this get a cached histogram (every opcode of every service does).
const OPCODES_CACHED: usize = 300;

/// The RPC server's metrics of this process.
#[derive(Debug)]
pub struct RpcMetrics {
    requests: IntCounterVec,
    duration: HistogramVec,
    /// Per opcode, its histogram and its `Ok` counter, looked up once: the label lookup
    /// of a vector takes a lock, a hash and the label strings per request.
    cached: Box<[OnceLock<(Histogram, prometheus::IntCounter)>]>,
    /// The counters of other statuses by (opcode, status code), looked up once each
    /// (a read miss answers `ObjectDoesntExist`, as often as reads hit).
    other: parking_lot::RwLock<std::collections::HashMap<(u16, u16), prometheus::IntCounter>>,
}

/// Latency buckets: 10 µs to 10 s, about ×3 apart (written out: computed ones print as
/// 0.000030000000000000004).
fn latency_buckets() -> Vec<f64> {
    vec![
        0.000_01, 0.000_03, 0.000_1, 0.000_3, 0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0,
    ]
}

impl RpcMetrics {
    fn new() -> RpcMetrics {
        let requests = IntCounterVec::new(
            Opts::new(
                "rampart_rpc_requests_total",
                "RPC requests served, by operation and reply status.",
            ),
            &["operation", "status"],
        );
        let duration = HistogramVec::new(
            HistogramOpts::new(
                "rampart_rpc_duration_seconds",
                "Time from a request's arrival to its reply, by operation.",
            )
            .buckets(latency_buckets()),
            &["operation"],
        );
        let (Ok(requests), Ok(duration)) = (requests, duration) else {
            unreachable!("the metric names and labels are valid");
        };
        let registry = prometheus::default_registry();
        // Registered once per process (this runs inside a LazyLock).
        let _ = registry.register(Box::new(requests.clone()));
        let _ = registry.register(Box::new(duration.clone()));
        RpcMetrics {
            requests,
            duration,
            cached: (0..OPCODES_CACHED).map(|_| OnceLock::new()).collect(),
            other: parking_lot::RwLock::new(std::collections::HashMap::new()),
        }
    }

    /// Counts one request of `opcode` answered `status` after `elapsed`.
    pub fn observe(&self, opcode: Opcode, status: Status, elapsed: Duration) {
        let seconds = elapsed.as_secs_f64();
        let name = || crate::protocol::opcode_name(opcode).unwrap_or("unknown");
        if let Some(slot) = self.cached.get(opcode.0 as usize) {
            let (histogram, ok) = slot.get_or_init(|| {
                (
                    self.duration.with_label_values(&[name()]),
                    self.requests.with_label_values(&[name(), "Ok"]),
                )
            });
            histogram.observe(seconds);
            if status == Status::Ok {
                ok.inc();
                return;
            }
        } else {
            self.duration.with_label_values(&[name()]).observe(seconds);
        }
        let key = (opcode.0, status.code());
        if let Some(counter) = self.other.read().get(&key) {
            counter.inc();
            return;
        }
        let counter = self
            .requests
            .with_label_values(&[name(), &format!("{status:?}")]);
        counter.inc();
        // Bounded: opcodes × statuses, both small fixed sets (unknown opcodes share one
        // name but not one key, so they are counted without being cached).
        if crate::protocol::opcode_name(opcode).is_some() {
            self.other.write().insert(key, counter);
        }
    }
}

/// This process's RPC metrics.
pub fn rpc() -> &'static RpcMetrics {
    static METRICS: LazyLock<RpcMetrics> = LazyLock::new(RpcMetrics::new);
    &METRICS
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
    use crate::rpc::Rpc;

    #[test]
    fn rpc_requests_are_counted_by_operation_and_status() {
        let ping = crate::protocol::master::Ping::OPCODE;
        rpc().observe(ping, Status::Ok, Duration::from_micros(30));
        rpc().observe(ping, Status::Retry, Duration::from_micros(50));
        rpc().observe(
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
