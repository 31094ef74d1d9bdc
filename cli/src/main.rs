//! The `idem` command: parses arguments, sets up logging, runs a subcommand from
//! `commands/` on a tokio runtime, and maps the outcome to an exit code and a hint.

use std::process::ExitCode;

use clap::Parser;
use tracing_subscriber::Layer;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

mod commands;
#[cfg(feature = "otlp")]
mod otlp;

fn main() -> ExitCode {
    let args = commands::Args::parse();
    // A proof crashes the agent on purpose hundreds of times: the warnings each crash
    // would log are its findings, reported as such at the end.
    let default_level = match args.command {
        commands::Command::Prove(_) => "error",
        _ => "warn",
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("idem")
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return commands::Exit::Host.into();
        }
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("IDEM_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level));
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_filter(filter)
        .boxed();
    #[cfg(feature = "otlp")]
    let (otlp, exported) = match otlp::Otlp::from_env(runtime.handle()) {
        Ok(Some((otlp, layer))) => (Some(otlp), Some(layer)),
        Ok(None) => (None, None),
        Err(e) => {
            eprintln!("error: {e:#}");
            return commands::Exit::BadInput.into();
        }
    };
    #[cfg(not(feature = "otlp"))]
    let exported: Option<Box<dyn Layer<tracing_subscriber::Registry> + Send + Sync>> = None;
    let layers: Vec<_> = std::iter::once(fmt).chain(exported).collect();
    tracing_subscriber::registry().with(layers).init();
    let outcome = runtime.block_on(args.command.execute());
    #[cfg(feature = "otlp")]
    if let Some(otlp) = otlp {
        otlp.shutdown();
    }
    // Runs still holding tasks (a heartbeat) are not waited for: the process is done.
    runtime.shutdown_background();
    match outcome {
        Ok(code) => code.into(),
        Err(err) => {
            let code = commands::Exit::classify(&err);
            // Errors carry keys, run ids and agents' words: never raw to a terminal.
            eprintln!("error: {}", idem::text::escape(&format!("{err:#}"), true));
            if let Some(hint) = commands::hint(&err) {
                eprintln!("hint: {hint}");
            }
            code.into()
        }
    }
}
