//! Prometheus metrics: the server's counters and histograms, and the text exposition writer.
//!
//! A few dozen series do not justify a metrics framework: counters are atomics or small maps
//! behind std mutexes (never held across an await), and `Exposition` writes the text format.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// Upper bounds (seconds) of the request-duration histogram buckets.
const DURATION_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

#[derive(Default)]
pub struct Metrics {
    api_errors: AtomicU64,
    http_requests: Mutex<BTreeMap<(&'static str, u16), u64>>,
    http_durations: Mutex<BTreeMap<&'static str, Histogram>>,
    grpc_requests: Mutex<BTreeMap<(String, &'static str), u64>>,
    /// Server streams cut off because their client read nothing (`limits.grpc_stream_stall`).
    grpc_streams_cut: AtomicU64,
}

#[derive(Default, Clone)]
struct Histogram {
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

/// Upper bounds (seconds) of the fan-out duration buckets: a job waits for its slowest agent,
/// from well under a second to the 24 h timeout.
const FAN_OUT_BUCKETS: &[f64] = &[
    0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0,
];

/// How long fan-outs take (`fleet::jobs::run`), by job kind (exec, state, module,
/// command_keys), from the first command sent to the last answer or deadline.
#[derive(Default)]
pub struct FanOuts {
    durations: Mutex<BTreeMap<&'static str, Histogram>>,
}

impl FanOuts {
    pub fn record(&self, kind: &'static str, elapsed: Duration) {
        let seconds = elapsed.as_secs_f64();
        let mut durations = self.durations.lock().expect("metrics lock poisoned");
        let histogram = durations.entry(kind).or_insert_with(|| Histogram {
            counts: vec![0; FAN_OUT_BUCKETS.len()],
            ..Histogram::default()
        });
        if let Some(index) = FAN_OUT_BUCKETS.iter().position(|bound| seconds <= *bound) {
            histogram.counts[index] += 1;
        }
        histogram.sum += seconds;
        histogram.count += 1;
    }

    pub fn write(&self, out: &mut Exposition) {
        let durations = self
            .durations
            .lock()
            .expect("metrics lock poisoned")
            .clone();
        write_histogram(
            out,
            "svc_fan_out_duration_seconds",
            "How long a job took from its first command sent to its last answer or deadline, by kind.",
            "kind",
            FAN_OUT_BUCKETS,
            &durations,
        );
    }
}

/// Writes one histogram family with a series per value of `label`.
fn write_histogram(
    out: &mut Exposition,
    name: &str,
    help: &str,
    label: &str,
    bounds: &[f64],
    series: &BTreeMap<&'static str, Histogram>,
) {
    out.family(name, "histogram", help);
    for (value, histogram) in series {
        let mut cumulative = 0;
        for (bound, count) in bounds.iter().zip(&histogram.counts) {
            cumulative += count;
            let le = bound.to_string();
            out.sample(
                &format!("{name}_bucket"),
                &[(label, value), ("le", &le)],
                cumulative as f64,
            );
        }
        out.sample(
            &format!("{name}_bucket"),
            &[(label, value), ("le", "+Inf")],
            histogram.count as f64,
        );
        out.sample(&format!("{name}_sum"), &[(label, value)], histogram.sum);
        out.sample(
            &format!("{name}_count"),
            &[(label, value)],
            histogram.count as f64,
        );
    }
}

impl Metrics {
    /// Records one REST request by its route template (`/api/v1/apikeys/{id}`), not its path,
    /// so ids never become label values.
    pub fn record_http(&self, route: &'static str, status: u16, elapsed: Duration) {
        if status >= 400 {
            self.api_errors.fetch_add(1, Ordering::Relaxed);
        }
        *self
            .http_requests
            .lock()
            .expect("metrics lock poisoned")
            .entry((route, status))
            .or_default() += 1;
        let seconds = elapsed.as_secs_f64();
        let mut durations = self.http_durations.lock().expect("metrics lock poisoned");
        let histogram = durations.entry(route).or_insert_with(|| Histogram {
            counts: vec![0; DURATION_BUCKETS.len()],
            ..Histogram::default()
        });
        if let Some(index) = DURATION_BUCKETS.iter().position(|bound| seconds <= *bound) {
            histogram.counts[index] += 1;
        }
        histogram.sum += seconds;
        histogram.count += 1;
    }

    /// Records one gRPC call by method and outcome code name.
    pub fn record_grpc(&self, method: &str, code: &'static str) {
        if code != "ok" {
            self.api_errors.fetch_add(1, Ordering::Relaxed);
        }
        *self
            .grpc_requests
            .lock()
            .expect("metrics lock poisoned")
            .entry((method.to_string(), code))
            .or_default() += 1;
    }

    /// Counts one server stream cut off for a client that stopped reading.
    pub fn record_grpc_stream_cut(&self) {
        self.grpc_streams_cut.fetch_add(1, Ordering::Relaxed);
    }

    /// Writes the series this struct owns.
    pub fn write(&self, out: &mut Exposition) {
        out.family(
            "svc_api_errors_total",
            "counter",
            "API requests that ended in an error.",
        );
        out.sample(
            "svc_api_errors_total",
            &[],
            self.api_errors.load(Ordering::Relaxed) as f64,
        );

        out.family(
            "svc_http_requests_total",
            "counter",
            "REST requests by route and status code.",
        );
        for ((route, code), count) in self
            .http_requests
            .lock()
            .expect("metrics lock poisoned")
            .iter()
        {
            let code = code.to_string();
            out.sample(
                "svc_http_requests_total",
                &[("route", route), ("code", &code)],
                *count as f64,
            );
        }

        out.family(
            "svc_grpc_requests_total",
            "counter",
            "gRPC calls by method and status code.",
        );
        for ((method, code), count) in self
            .grpc_requests
            .lock()
            .expect("metrics lock poisoned")
            .iter()
        {
            out.sample(
                "svc_grpc_requests_total",
                &[("method", method), ("code", code)],
                *count as f64,
            );
        }

        out.family(
            "svc_grpc_streams_cut_total",
            "counter",
            "gRPC server streams cut off because their client read nothing for limits.grpc_stream_stall.",
        );
        out.sample(
            "svc_grpc_streams_cut_total",
            &[],
            self.grpc_streams_cut.load(Ordering::Relaxed) as f64,
        );

        let durations = self
            .http_durations
            .lock()
            .expect("metrics lock poisoned")
            .clone();
        write_histogram(
            out,
            "svc_http_request_duration_seconds",
            "REST request latency by route.",
            "route",
            DURATION_BUCKETS,
            &durations,
        );
    }
}

/// Builds a Prometheus text exposition document.
#[derive(Default)]
pub struct Exposition {
    text: String,
}

impl Exposition {
    /// Starts a metric family with its HELP and TYPE lines.
    pub fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.text, "# HELP {name} {help}");
        let _ = writeln!(self.text, "# TYPE {name} {kind}");
    }

    /// Writes one sample line; label values are escaped as the format requires.
    pub fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) {
        self.text.push_str(name);
        if !labels.is_empty() {
            self.text.push('{');
            for (i, (key, value)) in labels.iter().enumerate() {
                if i > 0 {
                    self.text.push(',');
                }
                let escaped = value
                    .replace('\\', "\\\\")
                    .replace('"', "\\\"")
                    .replace('\n', "\\n");
                let _ = write!(self.text, "{key}=\"{escaped}\"");
            }
            self.text.push('}');
        }
        let _ = writeln!(self.text, " {value}");
    }

    pub fn finish(self) -> String {
        self.text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposition_lines() {
        let metrics = Metrics::default();
        metrics.record_http("/health/live", 200, Duration::from_millis(1));
        metrics.record_http("/api/v1/apikeys", 401, Duration::from_millis(3));
        let mut out = Exposition::default();
        metrics.write(&mut out);
        out.sample("x", &[("v", "a\"b\\c")], 1.5);
        let text = out.finish();
        assert!(text.contains("svc_api_errors_total 1\n"), "{text}");
        assert!(
            text.contains("svc_http_requests_total{route=\"/api/v1/apikeys\",code=\"401\"} 1\n")
        );
        assert!(text.contains(
            "svc_http_request_duration_seconds_bucket{route=\"/health/live\",le=\"+Inf\"} 1\n"
        ));
        assert!(text.contains("x{v=\"a\\\"b\\\\c\"} 1.5\n"));
    }

    #[test]
    fn fan_out_histogram() {
        let fan_outs = FanOuts::default();
        fan_outs.record("exec", Duration::from_millis(300));
        let mut out = Exposition::default();
        fan_outs.write(&mut out);
        let text = out.finish();
        let cases = [
            "svc_fan_out_duration_seconds_bucket{kind=\"exec\",le=\"0.25\"} 0\n",
            "svc_fan_out_duration_seconds_bucket{kind=\"exec\",le=\"0.5\"} 1\n",
            "svc_fan_out_duration_seconds_bucket{kind=\"exec\",le=\"+Inf\"} 1\n",
            "svc_fan_out_duration_seconds_count{kind=\"exec\"} 1\n",
        ];
        for line in cases {
            assert!(text.contains(line), "{line} in {text}");
        }
    }
}
