//! The service's own metrics (`lockprobe_service_*`), beside the store's on `GET /metrics`.
//!
//! `lockprobe_service_document_bytes{phase}`: the serialized size of each document
//! version a lock call of this service wrote, as the store holds it (contract 1.3's
//! document-size budget, seen from the writer). The monitor measures the versions it
//! reads from the change stream (`lockprobe_monitor_document_bytes`), every writer's
//! together; this is one service's own view, with the same buckets.

use prometheus::{HistogramOpts, HistogramVec, Registry};

use crate::document::{LocationDocument, LOCK_STATES};
use crate::exposition::DOCUMENT_BYTES_BUCKETS;

/// Why the service's metrics could not be registered (a name already taken on the
/// registry, e.g. a second service started on it).
#[derive(Debug, thiserror::Error)]
#[error("cannot register the service's metrics: {0}")]
pub struct MetricsError(#[from] prometheus::Error);

/// The service's metrics, registered once per registry and shared by its instances.
#[derive(Debug, Clone)]
pub struct ServiceMetrics {
    document_bytes: HistogramVec,
}

impl ServiceMetrics {
    /// Creates the metrics and registers them on `registry`.
    pub fn register(registry: &Registry) -> Result<Self, MetricsError> {
        let document_bytes = HistogramVec::new(
            HistogramOpts::new(
                "lockprobe_service_document_bytes",
                "Serialized size of each document version this service's lock calls wrote, as stored, by the lock phase it is in (contract budget: 4 KiB at p99).",
            )
            .buckets(DOCUMENT_BYTES_BUCKETS.to_vec()),
            &["phase"],
        )?;
        registry.register(Box::new(document_bytes.clone()))?;
        // A closed set of label values: every series exists at 0, for `increase()` and
        // `histogram_quantile` alike.
        for state in LOCK_STATES {
            document_bytes.with_label_values(&[state]);
        }
        Ok(Self { document_bytes })
    }

    /// Observes one version a lock call wrote (see [`crate::routing::CommitObserver`]).
    /// Its size is counted, not serialized into a buffer: this runs on every lock call.
    pub fn document_committed(&self, doc: &LocationDocument) {
        self.document_bytes.with_label_values(&[doc.lock_state()]).observe(doc.serialized_len() as f64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_phase_is_exported_at_zero_and_a_version_lands_under_its_phase() {
        let registry = Registry::new();
        let metrics = ServiceMetrics::register(&registry).unwrap();
        let text = crate::exposition::render(&registry);
        for state in LOCK_STATES {
            assert!(
                text.contains(&format!("lockprobe_service_document_bytes_count{{phase=\"{state}\"}} 0")),
                "{state}:\n{text}"
            );
        }
        let doc = LocationDocument::new("r1", "westeurope");
        metrics.document_committed(&doc);
        let text = crate::exposition::render(&registry);
        assert!(text.contains("lockprobe_service_document_bytes_count{phase=\"unlocked\"} 1"), "{text}");
        let sum = format!("lockprobe_service_document_bytes_sum{{phase=\"unlocked\"}} {}", doc.serialized_len());
        assert!(text.contains(&sum), "{text}");
        // A second registration on the same registry is refused, not silently split.
        assert!(ServiceMetrics::register(&registry).is_err());
    }
}
