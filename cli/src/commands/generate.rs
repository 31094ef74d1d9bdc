//! What is generated from the clap definitions themselves, so that it cannot drift from
//! the flags the binary parses: `idem completions SHELL` and `idem man` for packagers,
//! and the hidden `idem cli-reference` that writes `docs/reference/cli.md`.
//!
//! Each takes the whole command tree from the dispatcher rather than building it here:
//! what is generated is always the tree `idem` parses with.

use std::io::Write;
use std::path::PathBuf;

use clap::Parser;
use clap_complete::Shell;

use crate::exit::{BadInput, Exit};

/// The command that regenerates the committed CLI reference.
pub const REGENERATE: &str = "cargo run -p idem-cli -- cli-reference > docs/reference/cli.md";

#[derive(Debug, Parser)]
pub struct CompletionsCommand {
    /// The shell to complete idem's commands and flags in.
    shell: Shell,
}

impl CompletionsCommand {
    pub fn execute(self, mut cli: clap::Command) -> anyhow::Result<Exit> {
        let mut out = Vec::new();
        clap_complete::generate(self.shell, &mut cli, "idem", &mut out);
        std::io::stdout().write_all(&out)?;
        Ok(Exit::Done)
    }
}

#[derive(Debug, Parser)]
pub struct ManCommand {
    /// Write `idem.1` and a page per subcommand (`idem-run.1`, ...) into DIR (created if
    /// missing) instead of `idem.1` alone to stdout.
    #[arg(long, value_name = "DIR")]
    out_dir: Option<PathBuf>,
}

impl ManCommand {
    pub fn execute(self, cli: clap::Command) -> anyhow::Result<Exit> {
        match &self.out_dir {
            Some(dir) => std::fs::create_dir_all(dir)
                .and_then(|()| clap_mangen::generate_to(cli, dir))
                .map_err(|e| {
                    BadInput(format!(
                        "cannot write the man pages into {}: {e}",
                        dir.display()
                    ))
                })?,
            None => {
                let mut out = Vec::new();
                clap_mangen::Man::new(cli).render(&mut out)?;
                std::io::stdout().write_all(&out)?;
            }
        }
        Ok(Exit::Done)
    }
}

#[derive(Debug, Parser)]
pub struct CliReferenceCommand {}

impl CliReferenceCommand {
    pub fn execute(self, cli: clap::Command) -> anyhow::Result<Exit> {
        print!("{}", reference(&cli));
        Ok(Exit::Done)
    }
}

/// The CLI reference in Markdown: every visible command with its usage, arguments and
/// options, under a note that says how it is made.
fn reference(cli: &clap::Command) -> String {
    let options = clap_markdown::MarkdownOptions::new()
        .title("The `idem` command line".into())
        .show_footer(false);
    let body = clap_markdown::help_markdown_command_custom(cli, &options);
    // The note goes below the title, where a reader of the page sees it first.
    let (title, rest) = body.split_once('\n').unwrap_or((&body, ""));
    // One blank line between blocks and none at the end, as Markdown linters and `git
    // diff --check` expect (clap-markdown leaves up to four).
    let mut text = format!(
        "{title}\n\n<!-- Generated from the clap definitions in cli/src: do not edit. Regenerate \
         with `{REGENERATE}`. -->\n{}\n",
        rest.trim_end()
    );
    while text.contains("\n\n\n") {
        text = text.replace("\n\n\n", "\n\n");
    }
    text
}
