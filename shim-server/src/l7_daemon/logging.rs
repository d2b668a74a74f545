//! tracing to stderr, as text or JSON. The plugin's request id is a span field on every line.

use tracing_subscriber::EnvFilter;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// `filter` uses tracing's syntax ("info", "dipam_shim=debug"). A bare level applies to
/// dipam's own crates; the libraries underneath (h2, hyper) stay at `warn`, since their debug
/// output drowns what an operator is looking for.
pub fn init(format: LogFormat, filter: &str) {
    let directives = match filter {
        "trace" | "debug" | "info" | "warn" | "error" => {
            format!("warn,dipam_shim={filter},dipam_state={filter}")
        }
        other => other.to_owned(),
    };
    let filter = EnvFilter::try_new(directives).unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder.with_ansi(false).try_init(),
        LogFormat::Json => builder
            .json()
            .with_current_span(true)
            .with_span_list(false)
            .try_init(),
    };
}
