//! Opening a store by where it is, a PostgreSQL URL or a SQLite file, with whichever
//! backends this build has (the `sqlite` and `postgres` cargo features). A location
//! whose backend was left out is refused with [`StoreError::BackendNotBuilt`]: a
//! caller that takes locations from its users compiles the same with any features.

use std::path::Path;
use std::sync::Arc;

use super::{Store, StoreError, SyncMode};

/// Where a store is: a PostgreSQL database, named by its URL, or else a SQLite file.
///
/// ```
/// use std::path::Path;
/// use idem::store::Location;
///
/// let url = "postgres://idem@db/idem";
/// assert_eq!(Location::parse(url), Location::Postgres(url));
/// assert_eq!(Location::parse("idem.db"), Location::Sqlite(Path::new("idem.db")));
/// assert_eq!(Location::parse("idem.db").path(), Some(Path::new("idem.db")));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Location<'a> {
    /// A SQLite database file.
    Sqlite(&'a Path),
    /// A PostgreSQL database: a `postgres://` or `postgresql://` URL.
    Postgres(&'a str),
}

impl<'a> Location<'a> {
    /// What `location` names: a PostgreSQL database if it is such a URL
    /// ([`is_postgres_url`]), else a SQLite file.
    pub fn parse(location: &'a str) -> Location<'a> {
        if is_postgres_url(location) {
            Location::Postgres(location)
        } else {
            Location::Sqlite(Path::new(location))
        }
    }

    /// The store's file, or `None` for a PostgreSQL database.
    pub fn path(self) -> Option<&'a Path> {
        match self {
            Location::Sqlite(path) => Some(path),
            Location::Postgres(_) => None,
        }
    }
}

/// Whether `url` names a PostgreSQL database rather than a SQLite file.
///
/// ```
/// assert!(idem::store::is_postgres_url("postgres://idem@db/idem"));
/// assert!(idem::store::is_postgres_url("postgresql://localhost/idem"));
/// assert!(!idem::store::is_postgres_url("idem.db"));
/// ```
pub fn is_postgres_url(url: &str) -> bool {
    url.starts_with("postgres://") || url.starts_with("postgresql://")
}

/// How [`open`] opens a store, whichever its backend.
#[derive(Debug, Clone)]
pub struct StoreOptions {
    /// Durability of the writes that carry no [`RunFence`](super::RunFence).
    pub sync: SyncMode,
    /// Refuse a location without an idem store instead of creating one.
    pub existing_only: bool,
    /// Open for reading only: a SQLite file is opened read-only (writes fail, the file
    /// never changes); a PostgreSQL database, which has no such mode, is opened only if
    /// it holds a store, so looking never creates one.
    pub read_only: bool,
    /// PostgreSQL: the most connections the handle opens.
    pub pool_size: usize,
    /// PostgreSQL: how long one call to the server may wait for its answer
    /// ([`PostgresOptions::call_timeout`](super::PostgresOptions::call_timeout)).
    pub call_timeout: std::time::Duration,
    /// The store key of a store encrypted at rest (`store/sealing/`): required to open
    /// one; given for a new store, it makes the store encrypted.
    pub key: Option<super::StoreKey>,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            sync: SyncMode::Normal,
            existing_only: false,
            read_only: false,
            pool_size: 16,
            call_timeout: std::time::Duration::from_secs(10),
            key: None,
        }
    }
}

/// Opens the store at `location` ([`Location::parse`]) with the backend it names,
/// creating and migrating it unless `options` say otherwise.
///
/// Its values cross a [`ValueStore`](super::ValueStore): sealed and opened on the way
/// in a store encrypted at rest (opened with its key, [`StoreOptions::key`]), and kept
/// once by digest when large.
///
/// Fails with [`StoreError::BackendNotBuilt`] when this build has no such backend,
/// and as the backend's own `open` or `connect` fails otherwise; with
/// [`StoreError::Sealing`] when the key is missing, wrong, or given for a store that
/// is not encrypted and holds data already. Opening a SQLite file blocks the calling
/// thread briefly (it reads and may write the file).
pub async fn open(location: &str, options: &StoreOptions) -> Result<Arc<dyn Store>, StoreError> {
    let store = match Location::parse(location) {
        Location::Sqlite(path) => open_sqlite(path, options)?,
        Location::Postgres(url) => connect_postgres(url, options).await?,
    };
    super::sealing::seal_store(store, options.key.as_ref(), options.read_only).await
}

#[cfg(feature = "sqlite")]
fn open_sqlite(path: &Path, options: &StoreOptions) -> Result<Arc<dyn Store>, StoreError> {
    use super::{OpenOptions, SqliteStore};

    if (options.existing_only || options.read_only) && !path.exists() {
        return Err(StoreError::Open {
            location: path.display().to_string(),
            reason: "no idem store is there".to_owned(),
        });
    }
    if options.read_only {
        return Ok(Arc::new(SqliteStore::open_read_only(path)?));
    }
    let options = OpenOptions {
        sync: options.sync,
        ..OpenOptions::default()
    };
    Ok(Arc::new(SqliteStore::open_with(path, &options)?))
}

#[cfg(not(feature = "sqlite"))]
fn open_sqlite(path: &Path, _: &StoreOptions) -> Result<Arc<dyn Store>, StoreError> {
    Err(StoreError::BackendNotBuilt {
        location: path.display().to_string(),
        backend: "SQLite",
        feature: "sqlite",
    })
}

#[cfg(feature = "postgres")]
async fn connect_postgres(url: &str, options: &StoreOptions) -> Result<Arc<dyn Store>, StoreError> {
    use super::{PostgresOptions, PostgresStore};

    let options = PostgresOptions {
        sync: options.sync,
        pool_size: options.pool_size.max(1),
        call_timeout: options.call_timeout,
        existing_only: options.existing_only || options.read_only,
        ..PostgresOptions::default()
    };
    Ok(Arc::new(PostgresStore::connect_with(url, &options).await?))
}

#[cfg(not(feature = "postgres"))]
async fn connect_postgres(url: &str, _: &StoreOptions) -> Result<Arc<dyn Store>, StoreError> {
    Err(StoreError::BackendNotBuilt {
        location: super::error::redact(url),
        backend: "PostgreSQL",
        feature: "postgres",
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(not(feature = "postgres"))]
    #[tokio::test]
    async fn a_postgres_url_without_the_backend_is_refused_by_name() {
        let e = open("postgres://idem:s3cret@db/idem", &StoreOptions::default())
            .await
            .unwrap_err();
        assert!(
            matches!(
                e,
                StoreError::BackendNotBuilt {
                    feature: "postgres",
                    ..
                }
            ),
            "{e:?}"
        );
        assert_eq!(
            e.to_string(),
            "cannot open store postgres://idem@db/idem: this build of idem has no PostgreSQL \
             backend (the `postgres` cargo feature is off)"
        );
    }

    #[cfg(not(feature = "sqlite"))]
    #[tokio::test]
    async fn a_file_without_the_backend_is_refused_by_name() {
        let e = open("idem.db", &StoreOptions::default()).await.unwrap_err();
        assert!(
            matches!(
                e,
                StoreError::BackendNotBuilt {
                    feature: "sqlite",
                    ..
                }
            ),
            "{e:?}"
        );
        assert!(!std::path::Path::new("idem.db").exists());
    }

    #[cfg(feature = "sqlite")]
    #[tokio::test]
    async fn a_file_opens_on_sqlite_and_a_missing_one_only_when_asked() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("idem.db");
        let location = path.to_str().unwrap();
        let existing = StoreOptions {
            existing_only: true,
            ..StoreOptions::default()
        };
        assert!(matches!(
            open(location, &existing).await.unwrap_err(),
            StoreError::Open { .. }
        ));
        let store = open(location, &StoreOptions::default()).await.unwrap();
        assert!(store.run("nothing").await.unwrap().is_none());
        drop(store);
        let read_only = StoreOptions {
            read_only: true,
            ..StoreOptions::default()
        };
        let store = open(location, &read_only).await.unwrap();
        assert!(store.run("nothing").await.unwrap().is_none());
        assert!(matches!(
            store.put_component("00", b"").await.unwrap_err(),
            StoreError::Database {
                fault: crate::store::DatabaseFault::ReadOnly,
                ..
            }
        ));
    }
}
