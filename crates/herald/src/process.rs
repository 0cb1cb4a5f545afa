//! What every long-running command (`serve`, `inbox`) shares: its logs and the signal that stops it.

use herald_telemetry::{LogFormat, Telemetry};

/// Logs go to standard error: JSON lines with `--json` (or `log_format`), else text, coloured only on a
/// terminal (a file or a pipe gets no escape codes).
pub(crate) fn init_logs(format: LogFormat) -> anyhow::Result<Telemetry> {
    Ok(Telemetry::init(format, None)?)
}

/// Resolves at SIGINT or SIGTERM.
pub(crate) async fn shutdown_signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        _ = interrupt => {},
        () = terminate => {},
    }
    tracing::info!("shutting down");
}
