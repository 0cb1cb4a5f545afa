//! The log subscriber and trace export of a Herald process.
//!
//! Logs go to standard error, as text (coloured only on a terminal) or as JSON lines. A JSON line carries
//! the fields of the span it was written in — the ingest request (`msg`, `app`) or the delivery attempt
//! (`msg`, `endpoint`, `attempt`) — so a log line, a trace and a dashboard row join on the message id.
//!
//! With a [`TraceExport`], the same spans are sent to an OpenTelemetry collector over OTLP/HTTP
//! (protobuf), in batches, from a task of the Tokio runtime that [`Telemetry::init`] is called in.

use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{Protocol, WithExportConfig as _};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{BatchConfigBuilder, SdkTracerProvider};
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{EnvFilter, Layer as _};

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    /// Human-readable lines, coloured on a terminal.
    #[default]
    Text,
    /// One JSON object per line, with the fields of the enclosing span.
    Json,
}

impl std::str::FromStr for LogFormat {
    type Err = TelemetryError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text.trim().to_ascii_lowercase().as_str() {
            "text" | "" => Ok(Self::Text),
            "json" => Ok(Self::Json),
            _ => Err(TelemetryError::LogFormat(text.to_owned())),
        }
    }
}

/// Where traces go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceExport {
    /// The collector's OTLP/HTTP base URL, e.g. `http://127.0.0.1:4318`; spans are posted to
    /// `{endpoint}/v1/traces`.
    pub endpoint: String,
    /// The `service.name` resource attribute.
    pub service_name: String,
    /// How long spans are gathered before a batch is sent.
    pub batch_delay: Duration,
}

impl TraceExport {
    /// Export to `endpoint` as `service_name`, in batches every second.
    pub fn new(endpoint: impl Into<String>, service_name: impl Into<String>) -> Self {
        Self {
            endpoint: endpoint.into(),
            service_name: service_name.into(),
            batch_delay: Duration::from_secs(1),
        }
    }
}

/// Telemetry could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// An unknown log format.
    #[error("log format {0:?}: expected \"text\" or \"json\"")]
    LogFormat(String),
    /// The OTLP exporter could not be built (e.g. a malformed endpoint).
    #[error("OTLP trace export to {endpoint}: {detail}")]
    Export {
        /// The endpoint given.
        endpoint: String,
        /// What was wrong.
        detail: String,
    },
}

/// The installed telemetry; [`Telemetry::shutdown`] sends the spans still buffered.
#[derive(Debug, Default)]
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Telemetry {
    /// Install the process's log subscriber (filtered by `RUST_LOG`, default `info`) and, with `traces`,
    /// the OTLP exporter. Must run inside a Tokio runtime when `traces` is given. A second call in the
    /// same process leaves the first subscriber in place (tests start several nodes).
    pub fn init(format: LogFormat, traces: Option<&TraceExport>) -> Result<Self, TelemetryError> {
        use std::io::IsTerminal as _;
        let provider = traces.map(tracer_provider).transpose()?;
        let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
        let json = (format == LogFormat::Json).then(|| {
            tracing_subscriber::fmt::layer()
                .json()
                .with_current_span(true)
                .with_span_list(false)
                .with_writer(std::io::stderr)
        });
        let text = (format == LogFormat::Text).then(|| {
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_ansi(std::io::stderr().is_terminal())
        });
        let otel = provider
            .as_ref()
            .map(|p| tracing_opentelemetry::layer().with_tracer(p.tracer("herald")).boxed());
        let _ = tracing_subscriber::registry()
            .with(filter)
            .with(json)
            .with(text)
            .with(otel)
            .try_init();
        Ok(Self { provider })
    }

    /// Whether spans are exported.
    pub fn exports_traces(&self) -> bool {
        self.provider.is_some()
    }

    /// Send the buffered spans and stop exporting.
    pub async fn shutdown(self) {
        if let Some(provider) = self.provider {
            // The SDK's shutdown blocks until the last batch is sent.
            let _ = tokio_blocking(move || provider.shutdown()).await;
        }
    }
}

async fn tokio_blocking<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(work());
    });
    // Poll without blocking the runtime, for at most five seconds.
    for _ in 0..100 {
        if let Ok(value) = rx.try_recv() {
            return Some(value);
        }
        tokio_sleep(Duration::from_millis(50)).await;
    }
    None
}

async fn tokio_sleep(duration: Duration) {
    // The SDK's runtime abstraction gives us Tokio's timer without a direct dependency.
    opentelemetry_sdk::runtime::Runtime::delay(&opentelemetry_sdk::runtime::Tokio, duration).await;
}

fn tracer_provider(export: &TraceExport) -> Result<SdkTracerProvider, TelemetryError> {
    let endpoint = format!("{}/v1/traces", export.endpoint.trim_end_matches('/'));
    let error = |detail: String| TelemetryError::Export {
        endpoint: endpoint.clone(),
        detail,
    };
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpBinary)
        .with_endpoint(&endpoint)
        .with_timeout(Duration::from_secs(10))
        .build()
        .map_err(|e| error(e.to_string()))?;
    let processor = opentelemetry_sdk::trace::span_processor_with_async_runtime::BatchSpanProcessor::builder(
        exporter,
        opentelemetry_sdk::runtime::Tokio,
    )
    .with_batch_config(
        BatchConfigBuilder::default()
            .with_scheduled_delay(export.batch_delay)
            .build(),
    )
    .build();
    Ok(SdkTracerProvider::builder()
        .with_span_processor(processor)
        .with_resource(
            Resource::builder()
                .with_service_name(export.service_name.clone())
                .build(),
        )
        .build())
}
