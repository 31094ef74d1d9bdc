//! The `idem` command: parses arguments, sets up logging, runs a subcommand from
//! `commands/` on a tokio runtime, and maps the outcome to an exit code and a hint.

use std::process::ExitCode;

use clap::Parser;

mod commands;

fn main() -> ExitCode {
    let args = commands::Args::parse();
    // A proof crashes the agent on purpose hundreds of times: the warnings each crash
    // would log are its findings, reported as such at the end.
    let default_level = match args.command {
        commands::Command::Prove(_) => "error",
        _ => "warn",
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("IDEM_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level)),
        )
        .with_writer(std::io::stderr)
        .init();
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
    let outcome = runtime.block_on(args.command.execute());
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
