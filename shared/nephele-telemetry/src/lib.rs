//! A small metrics registry rendered in the Prometheus text exposition format (0.0.4).
//!
//! Every process (control plane, edge and pool agents) registers its metrics here and
//! serves [`Registry::render`] at `/metrics`, so later capabilities add to one place.
//! It has no dependencies and does no IO. Metric names follow Prometheus conventions:
//! `nephele_<what>_<unit>` with `_total` for counters.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Latency buckets in seconds, from 100 µs to 10 s.
pub const LATENCY_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0,
];

type LabelSet = Vec<(String, String)>;

#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    pub fn inc(&self) {
        self.add(1);
    }
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

#[derive(Debug, Default)]
pub struct Gauge(AtomicI64);

impl Gauge {
    pub fn set(&self, value: i64) {
        self.0.store(value, Ordering::Relaxed);
    }
    pub fn add(&self, delta: i64) {
        self.0.fetch_add(delta, Ordering::Relaxed);
    }
    pub fn get(&self) -> i64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// A cumulative histogram with fixed buckets.
#[derive(Debug)]
pub struct Histogram {
    bounds: Vec<f64>,
    state: Mutex<HistogramState>,
}

#[derive(Debug, Clone, Default)]
struct HistogramState {
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    pub fn new(bounds: &[f64]) -> Self {
        Histogram {
            bounds: bounds.to_vec(),
            state: Mutex::new(HistogramState {
                counts: vec![0; bounds.len()],
                ..HistogramState::default()
            }),
        }
    }

    pub fn observe(&self, value: f64) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(idx) = self.bounds.iter().position(|bound| value <= *bound) {
            state.counts[idx] += 1;
        }
        state.sum += value;
        state.count += 1;
    }

    pub fn count(&self) -> u64 {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).count
    }
}

enum Metric {
    Counter(Arc<Counter>),
    Gauge(Arc<Gauge>),
    Histogram(Arc<Histogram>),
}

struct Family {
    help: String,
    kind: &'static str,
    series: BTreeMap<LabelSet, Metric>,
}

/// A set of metric families. Cheap to clone; all clones share the same metrics.
#[derive(Clone, Default)]
pub struct Registry {
    families: Arc<Mutex<BTreeMap<String, Family>>>,
}

impl Registry {
    pub fn new() -> Self {
        Self::default()
    }

    fn get_or_insert(
        &self,
        name: &str,
        help: &str,
        kind: &'static str,
        labels: &[(&str, &str)],
        make: impl FnOnce() -> Metric,
    ) -> Option<Metric> {
        let mut families = self.families.lock().unwrap_or_else(|p| p.into_inner());
        let family = families.entry(name.to_string()).or_insert_with(|| Family {
            help: help.to_string(),
            kind,
            series: BTreeMap::new(),
        });
        if family.kind != kind {
            return None;
        }
        let key: LabelSet = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let metric = family.series.entry(key).or_insert_with(make);
        Some(match metric {
            Metric::Counter(c) => Metric::Counter(c.clone()),
            Metric::Gauge(g) => Metric::Gauge(g.clone()),
            Metric::Histogram(h) => Metric::Histogram(h.clone()),
        })
    }

    /// The counter `name{labels}`, created on first use. Registering a name twice with
    /// different kinds is a programming error; the second kind gets a detached metric.
    pub fn counter(&self, name: &str, help: &str, labels: &[(&str, &str)]) -> Arc<Counter> {
        match self.get_or_insert(name, help, "counter", labels, || {
            Metric::Counter(Arc::default())
        }) {
            Some(Metric::Counter(c)) => c,
            _ => Arc::default(),
        }
    }

    pub fn gauge(&self, name: &str, help: &str, labels: &[(&str, &str)]) -> Arc<Gauge> {
        match self.get_or_insert(
            name,
            help,
            "gauge",
            labels,
            || Metric::Gauge(Arc::default()),
        ) {
            Some(Metric::Gauge(g)) => g,
            _ => Arc::default(),
        }
    }

    pub fn histogram(
        &self,
        name: &str,
        help: &str,
        labels: &[(&str, &str)],
        bounds: &[f64],
    ) -> Arc<Histogram> {
        match self.get_or_insert(name, help, "histogram", labels, || {
            Metric::Histogram(Arc::new(Histogram::new(bounds)))
        }) {
            Some(Metric::Histogram(h)) => h,
            _ => Arc::new(Histogram::new(bounds)),
        }
    }

    /// Removes the series of `name` whose label `label.0` is `label.1` (a deleted
    /// object's), leaving the others.
    pub fn remove_series(&self, name: &str, label: (&str, &str)) {
        let mut families = self.families.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(family) = families.get_mut(name) {
            family
                .series
                .retain(|key, _| !key.iter().any(|(k, v)| k == label.0 && v == label.1));
        }
    }

    /// Replaces every series of the gauge `name` with `series` (labels, value): for
    /// per-object gauges whose objects come and go (a deleted device's series goes).
    pub fn set_gauges(&self, name: &str, help: &str, series: &[(Vec<(&str, &str)>, i64)]) {
        let mut families = self.families.lock().unwrap_or_else(|p| p.into_inner());
        let family = families.entry(name.to_string()).or_insert_with(|| Family {
            help: help.to_string(),
            kind: "gauge",
            series: BTreeMap::new(),
        });
        if family.kind != "gauge" {
            return;
        }
        family.series = series
            .iter()
            .map(|(labels, value)| {
                let key: LabelSet = labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect();
                let gauge = Gauge::default();
                gauge.set(*value);
                (key, Metric::Gauge(Arc::new(gauge)))
            })
            .collect();
    }

    /// Renders all metrics in the Prometheus text format.
    pub fn render(&self) -> String {
        let families = self.families.lock().unwrap_or_else(|p| p.into_inner());
        let mut out = String::new();
        for (name, family) in families.iter() {
            let _ = writeln!(out, "# HELP {name} {}", escape_help(&family.help));
            let _ = writeln!(out, "# TYPE {name} {}", family.kind);
            for (labels, metric) in &family.series {
                match metric {
                    Metric::Counter(c) => {
                        let _ = writeln!(out, "{name}{} {}", fmt_labels(labels, None), c.get());
                    }
                    Metric::Gauge(g) => {
                        let _ = writeln!(out, "{name}{} {}", fmt_labels(labels, None), g.get());
                    }
                    Metric::Histogram(h) => {
                        let state = h.state.lock().unwrap_or_else(|p| p.into_inner()).clone();
                        let mut cumulative = 0;
                        for (bound, count) in h.bounds.iter().zip(&state.counts) {
                            cumulative += count;
                            let le = format!("{bound}");
                            let _ = writeln!(
                                out,
                                "{name}_bucket{} {cumulative}",
                                fmt_labels(labels, Some(&le))
                            );
                        }
                        let _ = writeln!(
                            out,
                            "{name}_bucket{} {}",
                            fmt_labels(labels, Some("+Inf")),
                            state.count
                        );
                        let _ =
                            writeln!(out, "{name}_sum{} {}", fmt_labels(labels, None), state.sum);
                        let _ = writeln!(
                            out,
                            "{name}_count{} {}",
                            fmt_labels(labels, None),
                            state.count
                        );
                    }
                }
            }
        }
        out
    }
}

fn escape_help(text: &str) -> String {
    text.replace('\\', "\\\\").replace('\n', "\\n")
}

fn escape_value(text: &str) -> String {
    text.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn fmt_labels(labels: &LabelSet, le: Option<&str>) -> String {
    let mut parts: Vec<String> = labels
        .iter()
        .map(|(k, v)| format!("{k}=\"{}\"", escape_value(v)))
        .collect();
    if let Some(le) = le {
        parts.push(format!("le=\"{le}\""));
    }
    if parts.is_empty() {
        String::new()
    } else {
        format!("{{{}}}", parts.join(","))
    }
}

/// Quantile over a window of recent samples, for telemetry that must be exact rather
/// than bucketed (p50/p99 reported to the control plane).
#[derive(Debug, Clone)]
pub struct LatencyWindow {
    samples: Vec<u64>,
    next: usize,
    capacity: usize,
}

impl LatencyWindow {
    pub fn new(capacity: usize) -> Self {
        LatencyWindow {
            samples: Vec::with_capacity(capacity),
            next: 0,
            capacity: capacity.max(1),
        }
    }

    pub fn record(&mut self, value: u64) {
        if self.samples.len() < self.capacity {
            self.samples.push(value);
        } else {
            self.samples[self.next] = value;
        }
        self.next = (self.next + 1) % self.capacity;
    }

    /// The `q` quantile (0..=1) by the nearest-rank method; 0 when empty.
    pub fn quantile(&self, q: f64) -> u64 {
        quantile(&self.samples, q)
    }
}

/// Nearest-rank quantile of unsorted samples; 0 when empty.
pub fn quantile(samples: &[u64], q: f64) -> u64 {
    if samples.is_empty() {
        return 0;
    }
    let mut sorted = samples.to_vec();
    sorted.sort_unstable();
    let rank = (q.clamp(0.0, 1.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn removing_a_series_leaves_the_others() {
        let registry = Registry::new();
        for device in ["a", "b"] {
            registry
                .gauge("online", "help", &[("device", device), ("role", "edge")])
                .set(1);
        }
        registry.remove_series("online", ("device", "a"));
        registry.remove_series("missing", ("device", "a"));
        let text = registry.render();
        assert!(!text.contains("device=\"a\""), "{text}");
        assert!(
            text.contains("online{device=\"b\",role=\"edge\"} 1"),
            "{text}"
        );
    }

    #[test]
    fn renders_prometheus_text() {
        let registry = Registry::new();
        registry
            .counter("nephele_requests_total", "Requests.", &[("where", "local")])
            .add(3);
        registry.gauge("nephele_queue_length", "Queue.", &[]).set(2);
        let histogram = registry.histogram("nephele_latency_seconds", "Latency.", &[], &[0.1, 1.0]);
        histogram.observe(0.05);
        histogram.observe(0.5);
        histogram.observe(5.0);
        let text = registry.render();
        for line in [
            "# TYPE nephele_requests_total counter",
            "nephele_requests_total{where=\"local\"} 3",
            "nephele_queue_length 2",
            "nephele_latency_seconds_bucket{le=\"0.1\"} 1",
            "nephele_latency_seconds_bucket{le=\"1\"} 2",
            "nephele_latency_seconds_bucket{le=\"+Inf\"} 3",
            "nephele_latency_seconds_count 3",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in\n{text}"
            );
        }
    }

    #[test]
    fn same_name_and_labels_share_one_series() {
        let registry = Registry::new();
        registry.counter("c_total", "C.", &[("a", "1")]).inc();
        registry.counter("c_total", "C.", &[("a", "1")]).inc();
        assert_eq!(registry.counter("c_total", "C.", &[("a", "1")]).get(), 2);
        assert_eq!(registry.counter("c_total", "C.", &[("a", "2")]).get(), 0);
    }

    #[test]
    fn label_values_are_escaped() {
        let registry = Registry::new();
        registry.counter("x_total", "X.", &[("v", "a\"b\\c")]).inc();
        assert!(registry.render().contains(r#"x_total{v="a\"b\\c"} 1"#));
    }

    #[test]
    fn quantiles_use_nearest_rank() {
        let samples: Vec<u64> = (1..=100).collect();
        assert_eq!(quantile(&samples, 0.5), 50);
        assert_eq!(quantile(&samples, 0.99), 99);
        assert_eq!(quantile(&samples, 1.0), 100);
        assert_eq!(quantile(&[], 0.5), 0);
        let mut window = LatencyWindow::new(3);
        for v in [10, 20, 30, 40] {
            window.record(v);
        }
        assert_eq!(window.quantile(0.0), 20);
    }
}
