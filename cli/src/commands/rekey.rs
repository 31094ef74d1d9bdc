//! `idem rekey`: rotates the key of a store encrypted at rest. The store's data keys
//! are rewrapped under the new store key in one transaction; no value is rewritten, so
//! it takes milliseconds whatever the store's size, and runs keep going meanwhile
//! (processes already running hold their data keys; processes started after it need
//! the new key).

use std::path::PathBuf;

use clap::Parser;

use super::args::{DbArgs, read_key};
use crate::exit::{BadInput, Exit};

#[derive(Debug, Parser)]
pub struct RekeyCommand {
    /// The store, opened with its current key (`--key-file` or IDEM_STORE_KEY).
    #[command(flatten)]
    db: DbArgs,
    /// The file holding the new key (64 hex digits: `openssl rand -hex 32`).
    #[arg(long, value_name = "PATH")]
    new_key_file: PathBuf,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

impl RekeyCommand {
    pub async fn execute(self) -> anyhow::Result<Exit> {
        let Some(old) = self.db.key()? else {
            return Err(BadInput(
                "idem rekey needs the store's current key: --key-file (or IDEM_STORE_KEY)"
                    .to_owned(),
            )
            .into());
        };
        let new = read_key(&self.new_key_file)?;
        let store = self.db.open_existing().await?;
        let report = idem::store::rewrap(store.as_ref(), &old, &new).await?;
        if self.json {
            println!("{}", serde_json::to_string(&report)?);
        } else {
            println!(
                "rekeyed: {} data key(s) now wrapped by store key {} (was {}); give the new \
                 key to every process started from now on",
                report.data_keys, report.to, report.from
            );
        }
        Ok(Exit::Done)
    }
}
