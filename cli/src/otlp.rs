//! The `otlp` feature: the host's spans (`idem.run`, `idem.step`) exported over
//! OTLP/HTTP (protobuf) to the collector that `OTEL_EXPORTER_OTLP_ENDPOINT` names,
//! flushed before the process exits.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::trace::{SdkTracerProvider, SpanData, SpanExporter};
use tracing_subscriber::Layer;
use tracing_subscriber::filter::Targets;

/// The variable that turns export on, as OpenTelemetry names it.
const ENDPOINT: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";

/// Runs each export on the process's tokio runtime: the HTTP client needs one, and the
/// batch processor exports from a thread of its own, which has none.
#[derive(Debug)]
struct OnRuntime {
    inner: Arc<opentelemetry_otlp::SpanExporter>,
    runtime: tokio::runtime::Handle,
}

impl SpanExporter for OnRuntime {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let inner = Arc::clone(&self.inner);
        match self
            .runtime
            .spawn(async move { inner.export(batch).await })
            .await
        {
            Ok(result) => result,
            Err(e) => Err(OTelSdkError::InternalFailure(e.to_string())),
        }
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }
}

/// Spans going out over OTLP; [`Otlp::shutdown`] sends what is left.
pub struct Otlp {
    provider: SdkTracerProvider,
}

/// A layer for the process's subscriber.
pub type BoxedLayer = Box<dyn Layer<tracing_subscriber::Registry> + Send + Sync>;

impl Otlp {
    /// The exporter and its layer (the host's spans, at info and above) when
    /// `OTEL_EXPORTER_OTLP_ENDPOINT` is set; `None` when it is not.
    pub fn from_env(
        runtime: &tokio::runtime::Handle,
    ) -> anyhow::Result<Option<(Otlp, BoxedLayer)>> {
        if std::env::var_os(ENDPOINT).is_none() {
            return Ok(None);
        }
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpBinary)
            .build()
            .with_context(|| format!("cannot export spans to {ENDPOINT}"))?;
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(OnRuntime {
                inner: Arc::new(exporter),
                runtime: runtime.clone(),
            })
            .with_resource(
                opentelemetry_sdk::Resource::builder()
                    .with_service_name("idem")
                    .build(),
            )
            .build();
        let layer = tracing_opentelemetry::layer()
            .with_tracer(provider.tracer("idem"))
            .with_filter(Targets::new().with_target("idem", tracing::Level::INFO))
            .boxed();
        Ok(Some((Otlp { provider }, layer)))
    }

    /// Sends the spans not sent yet and stops; the runtime must still run.
    pub fn shutdown(self) {
        if let Err(e) = self.provider.shutdown() {
            eprintln!("warning: cannot send the last spans over OTLP: {e}");
        }
    }
}
