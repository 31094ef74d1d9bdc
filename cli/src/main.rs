//! The `idem` command: parses arguments, sets up logging, runs a subcommand from
//! `commands/` on a tokio runtime, and maps the outcome to an exit code and a hint.
//!
//! # Layout
//! - `commands/`: a file per subcommand and the dispatcher (`commands/mod.rs`), with the
//!   flag groups (`args`) and the output helpers (`display`) the subcommands share.
//! - `exit.rs`: the exit codes, and how an error maps to one.
//! - `hint.rs`: the `hint:` line that names the flag or command mending an error.
//! - `shutdown.rs`: SIGTERM and SIGINT, wired once for the commands that drain.
//! - `otlp.rs`: the export of spans over OTLP (cargo feature `otlp`).
//! - `commit.rs`: the commit `idem --version` names, read by `build.rs`.

use std::process::ExitCode;

use clap::Parser;
use tracing_subscriber::Layer;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

mod commands;
// build.rs includes it to stamp the version; its tests run with the binary's.
#[cfg(test)]
mod commit;
mod exit;
mod hint;
#[cfg(feature = "otlp")]
mod otlp;
mod shutdown;

use exit::Exit;

/// Whether warnings may be coloured: only on a terminal, and never when `NO_COLOR` is
/// set to anything but the empty string (<https://no-color.org>). A pipe or a log file
/// would otherwise keep the escape codes as text.
fn colour_on_stderr() -> bool {
    use std::io::IsTerminal;
    let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
    !no_color && std::io::stderr().is_terminal()
}

/// Output piped into a reader that stopped (`idem ls | head`) ends the process quietly
/// with 141, as a shell reports a process SIGPIPE ended, instead of a panic: Rust
/// ignores SIGPIPE, so `println!` to a closed pipe panics. Any other panic is reported
/// as before.
fn quiet_on_closed_stdout() {
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let message = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or_default();
        if message.starts_with("failed printing to stdout") && message.contains("Broken pipe") {
            std::process::exit(141);
        }
        report(info);
    }));
}

fn main() -> ExitCode {
    quiet_on_closed_stdout();
    let args = commands::Args::parse();
    let default_level = args.command.log_level();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("idem")
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return Exit::Host.into();
        }
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("IDEM_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level));
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(colour_on_stderr())
        .with_filter(filter)
        .boxed();
    #[cfg(feature = "otlp")]
    let (otlp, exported) = match otlp::Otlp::from_env(runtime.handle()) {
        Ok(Some((otlp, layer))) => (Some(otlp), Some(layer)),
        Ok(None) => (None, None),
        Err(e) => {
            eprintln!("error: {e:#}");
            return Exit::BadInput.into();
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
            let code = Exit::classify(&err);
            // Errors carry keys, run ids and agents' words: never raw to a terminal.
            eprintln!("error: {}", idem::text::escape(&format!("{err:#}"), true));
            if let Some(hint) = hint::for_error(&err) {
                eprintln!("hint: {hint}");
            }
            code.into()
        }
    }
}
