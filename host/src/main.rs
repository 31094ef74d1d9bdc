//! The `idem` command: parses arguments, sets up logging, dispatches to a subcommand in
//! `cli/`, and maps the outcome to an exit code.

use std::process::ExitCode;

use clap::Parser;

mod cli;

fn main() -> ExitCode {
    let args = cli::Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("IDEM_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    match args.command.execute() {
        Ok(code) => code.into(),
        Err(err) => {
            let code = cli::Exit::classify(&err);
            eprintln!("error: {err:#}");
            code.into()
        }
    }
}
