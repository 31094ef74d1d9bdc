//! Opening a file as an idem SQLite store: refusing paths and files that are not ours
//! before SQLite touches them, setting the connection's pragmas, and applying the
//! numbered migrations.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rusqlite::{Connection, ErrorCode, MAIN_DB, OpenFlags, TransactionBehavior};

use super::{OpenOptions, database_fault, sqlite_detail};
use crate::store::{DatabaseFault, StoreError, SyncMode};

/// "idem" in ASCII, written to the database header (`PRAGMA application_id`) so that a
/// file can be recognised as an idem store before anything is written to it.
const APPLICATION_ID: i32 = 0x6964_656d;

/// `MIGRATIONS[i]` brings the schema from version `i` to version `i + 1`; the version
/// is kept in `PRAGMA user_version`.
pub(super) const MIGRATIONS: &[&str] = &[
    include_str!("../migrations/sqlite/0001_init.sql"),
    include_str!("../migrations/sqlite/0002_steps.sql"),
    include_str!("../migrations/sqlite/0003_leases.sql"),
    include_str!("../migrations/sqlite/0004_waits.sql"),
    include_str!("../migrations/sqlite/0005_epoch.sql"),
    include_str!("../migrations/sqlite/0006_retired.sql"),
    include_str!("../migrations/sqlite/0007_recycled.sql"),
    include_str!("../migrations/sqlite/0008_rebuilds.sql"),
    include_str!("../migrations/sqlite/0009_children.sql"),
    include_str!("../migrations/sqlite/0010_schedules.sql"),
    include_str!("../migrations/sqlite/0011_flow.sql"),
    include_str!("../migrations/sqlite/0012_pause.sql"),
    include_str!("../migrations/sqlite/0013_rates.sql"),
    include_str!("../migrations/sqlite/0014_sealing.sql"),
    include_str!("../migrations/sqlite/0015_usage.sql"),
    include_str!("../migrations/sqlite/0016_live.sql"),
    include_str!("../migrations/sqlite/0017_blobs.sql"),
    include_str!("../migrations/sqlite/0018_versions.sql"),
    include_str!("../migrations/sqlite/0019_events.sql"),
    include_str!("../migrations/sqlite/0020_history.sql"),
    include_str!("../migrations/sqlite/0021_latest_progress.sql"),
    include_str!("../migrations/sqlite/0022_progress_unreferenced.sql"),
];

/// The schema version this build writes and understands.
pub(super) const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// WAL pages between checkpoints, per durability (SQLite's default is 1000).
///
/// `Normal`: a step writes three pages, mostly the same hot ones (the run's progress
/// row, the newest `steps` leaf), and a checkpoint copies each distinct page once and
/// syncs the database file: checkpointing ten times less often cut a run's cost per
/// step by a quarter in the bench (BENCHMARKS.md). The WAL grows to about 40 MiB before
/// it is reused.
///
/// `Full`: every commit syncs the WAL, and a sync that grows the file costs about twice
/// one that overwrites it (the file's size must reach the disk too). SQLite deletes the
/// WAL when a store closes, so every process regrows it: to 40 MiB, a fresh `idem run`
/// synced a growing file for its first ~3,300 steps (a step at 590-780 µs against
/// 330-430 µs with 1,000 pages, dev build, 3,000-step runs on a fresh store); once the
/// WAL is reused the two cadences cost the same (360-425 µs over 12,000 steps).
pub(super) fn wal_autocheckpoint_pages(sync: SyncMode) -> i64 {
    match sync {
        SyncMode::Normal => 10_000,
        SyncMode::Full => 1_000,
    }
}

/// Puts the connection at `sync`: SQLite's `synchronous` and the checkpoint cadence
/// that goes with it ([`wal_autocheckpoint_pages`]). Outside a transaction only.
///
/// The database thread switches a `Full` run's `Retry` claims to `Normal` and back, so
/// twice per step. Not through the statement cache: SQLite applies a pragma as it
/// prepares it and expires the statement once it has run, so a cached pragma is parsed
/// again at every run anyway, and swapping the new statement in costs more than
/// preparing and finalizing a fresh one (6.8k against 4.0k instructions per pragma,
/// callgrind).
pub(super) fn set_durability(conn: &Connection, sync: SyncMode) -> rusqlite::Result<()> {
    let synchronous = match sync {
        SyncMode::Normal => "NORMAL",
        SyncMode::Full => "FULL",
    };
    let pages = wal_autocheckpoint_pages(sync);
    conn.execute_batch(&format!(
        "PRAGMA synchronous = {synchronous}; PRAGMA wal_autocheckpoint = {pages}"
    ))
}

/// Enough for every statement a worker's paths prepare (a run's lease, instance, steps,
/// end, the worker's polls, schedules, flow limits, events), so hot paths never
/// prepare again; the store has some 200 statements in all, most of them an operator's.
const STATEMENT_CACHE: usize = 128;

/// Prepares a connection's statements to stay prepared: a statement cache that holds
/// them, and the query planner's stability guarantee. Without the guarantee, SQLite
/// (built with `SQLITE_ENABLE_STAT4`, as the bundled one is) marks a statement whose
/// plan it chose by looking at a bound value, and prepares it again each time that
/// parameter is bound to another value: every run's record read by its id, every
/// submission, re-parsed and re-planned on each call (a sixth of a worker's CPU on short
/// runs, measured with `perf`). The store's queries are written for the plans its
/// indexes give, and it never runs `ANALYZE`, so a fixed plan loses nothing.
fn keep_prepared(conn: &Connection) -> rusqlite::Result<()> {
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    conn.set_db_config(
        rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG,
        true,
    )?;
    Ok(())
}

/// What a file holds, judged from its header and schema alone.
enum Contents {
    /// A new or empty database: ours to initialise.
    Empty,
    /// An idem store at this schema version.
    Idem { version: i64 },
    /// Some other SQLite database.
    Foreign { application_id: i32, objects: i64 },
}

/// Opens `path` and makes it a ready idem store, or explains why it cannot be one.
/// Returns the connection and the token floor of this open (`epoch.rs`).
pub(super) fn open(path: &Path, options: &OpenOptions) -> Result<(Connection, u64), StoreError> {
    let dir = directory_of(path);
    let fail = |reason: String| refuse(path, reason);
    let sql_fail = |e: rusqlite::Error| open_failure(path, dir, options.busy_timeout, &e);

    check_name(path).map_err(fail)?;
    check_location(path, dir).map_err(fail)?;
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
        | OpenFlags::SQLITE_OPEN_CREATE
        | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let name = sqlite_path(path).map_err(fail)?;
    let vfs = super::vfs::coalescing(options.vfs.as_deref()).map_err(sql_fail)?;
    let mut conn =
        Connection::open_with_flags_and_vfs(name, flags, vfs.as_str()).map_err(sql_fail)?;
    conn.busy_timeout(options.busy_timeout).map_err(sql_fail)?;
    // SQLite silently falls back to read-only when the file is write-protected.
    if conn.is_readonly(MAIN_DB).map_err(sql_fail)? {
        let why = if super::on_read_only_file_system(path) {
            "the file system holding the file is read-only (mounted or remounted so, as the \
             kernel does after a disk error under errors=remount-ro); idem needs to write to \
             it: check it, mount it read-write and try again"
        } else {
            "the file is write-protected; idem needs to write to it"
        };
        return Err(fail(why.to_owned()));
    }

    // Judge the file before changing anything: even switching to WAL rewrites the
    // header, and a file that is not ours must stay byte-identical.
    check_contents(path, inspect(&conn).map_err(sql_fail)?)?;

    let mode = enable_wal(&conn, options.busy_timeout).map_err(sql_fail)?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(fail(format!(
            "SQLite cannot use WAL mode here (journal mode is {mode:?})"
        )));
    }
    set_durability(&conn, options.sync).map_err(sql_fail)?;
    if let Some(max_size) = options.max_size {
        cap_size(&conn, max_size).map_err(sql_fail)?;
    }

    // Off while migrating: a migration that rebuilds a table other tables refer to
    // must drop the old one without SQLite deleting (cascading to) what refers to it.
    // The bundled SQLite turns them on by default, and takes this pragma only outside a
    // transaction.
    conn.pragma_update(None, "foreign_keys", false)
        .map_err(sql_fail)?;
    migrate(&mut conn, path).map_err(|e| match e {
        Failure::Sql(e) => sql_fail(e),
        Failure::Store(e) => e,
    })?;
    conn.pragma_update(None, "foreign_keys", true)
        .map_err(sql_fail)?;
    let floor =
        super::epoch::token_floor(&mut conn, options.boot_id.as_deref()).map_err(sql_fail)?;
    keep_prepared(&conn).map_err(sql_fail)?;
    Ok((conn, floor))
}

/// Opens an existing idem store for reading only: nothing is written, not even the
/// header, so looking at a store (`idem status`) never changes it.
pub(super) fn open_read_only(
    path: &Path,
    busy_timeout: Duration,
) -> Result<Connection, StoreError> {
    let dir = directory_of(path);
    let fail = |reason: String| refuse(path, reason);
    let sql_fail = |e: rusqlite::Error| open_failure(path, dir, busy_timeout, &e);
    check_name(path).map_err(fail)?;
    match std::fs::metadata(path) {
        Ok(meta) if meta.is_file() => {}
        Ok(meta) => return Err(fail(not_a_file(meta.file_type()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(fail("no such store file".to_owned()));
        }
        Err(e) => return Err(fail(format!("cannot look at the file: {e}"))),
    }
    check_header(path).map_err(fail)?;
    let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn =
        Connection::open_with_flags(sqlite_path(path).map_err(fail)?, flags).map_err(sql_fail)?;
    conn.busy_timeout(busy_timeout).map_err(sql_fail)?;
    match check_contents(path, inspect(&conn).map_err(sql_fail)?)? {
        applied if applied == MIGRATIONS.len() => {}
        applied => {
            return Err(fail(format!(
                "the store is at schema version {applied}; open it for writing (idem run) \
                 to upgrade it to {SCHEMA_VERSION}"
            )));
        }
    }
    keep_prepared(&conn).map_err(sql_fail)?;
    Ok(conn)
}

/// The name SQLite is given for `path`: always absolute. The bundled SQLite reads a
/// name that starts with `file:` as a URI (it is built with `SQLITE_USE_URI`, whatever
/// the open flags say), so a file named `file:x.db?vfs=memdb` would silently become an
/// in-memory database, or one with other options; an absolute path never starts with
/// `file:`, so the file is the file the user named.
fn sqlite_path(path: &Path) -> Result<PathBuf, String> {
    std::path::absolute(path).map_err(|e| format!("cannot resolve the path: {e}"))
}

/// Switches the file to WAL mode and returns the journal mode it ends up in.
///
/// Converting needs an exclusive lock and SQLite does not call the busy handler for
/// it, so a first open racing another one would fail at once: retry within the busy
/// timeout instead. WAL mode is a property of the file, so once it is set, later opens
/// only read it and take no lock.
fn enable_wal(conn: &Connection, busy_timeout: Duration) -> rusqlite::Result<String> {
    let mode = |conn: &Connection| -> rusqlite::Result<String> {
        conn.pragma_query_value(None, "journal_mode", |row| row.get(0))
    };
    let current = mode(conn)?;
    if current.eq_ignore_ascii_case("wal") {
        return Ok(current);
    }
    let deadline = Instant::now() + busy_timeout;
    let mut pause = Duration::from_millis(1);
    loop {
        match conn.pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get(0)) {
            Err(e) if e.sqlite_error_code() == Some(ErrorCode::DatabaseBusy) => {
                if Instant::now() >= deadline {
                    return Err(e);
                }
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(50));
            }
            result => return result,
        }
    }
}

/// Caps the database at `max_size` bytes, in whole pages: SQLite then fails a write
/// that would grow it further with `SQLITE_FULL`, as a full disk would. The cap holds
/// for this connection only; SQLite never sets it below the current size.
fn cap_size(conn: &Connection, max_size: u64) -> rusqlite::Result<()> {
    let page_size: i64 = conn.pragma_query_value(None, "page_size", |row| row.get(0))?;
    let page_size = u64::try_from(page_size).unwrap_or(1).max(1);
    let pages = i64::try_from(max_size / page_size)
        .unwrap_or(i64::MAX)
        .max(1);
    conn.pragma_update_and_check(None, "max_page_count", pages, |row| row.get::<_, i64>(0))?;
    Ok(())
}

/// Why migrating stopped.
enum Failure {
    Sql(rusqlite::Error),
    Store(StoreError),
}

impl From<rusqlite::Error> for Failure {
    fn from(e: rusqlite::Error) -> Self {
        Failure::Sql(e)
    }
}

/// Brings the schema to [`SCHEMA_VERSION`] in one `BEGIN IMMEDIATE` transaction.
///
/// The transaction always writes (the version, even when unchanged), so a database
/// that cannot be written fails here, at open, rather than at the first claim.
fn migrate(conn: &mut Connection, path: &Path) -> Result<(), Failure> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    // Judged again under the write lock: another process may have initialised (or
    // upgraded) the file since the first look.
    let from = check_contents(path, inspect(&tx)?).map_err(Failure::Store)?;
    for migration in MIGRATIONS.iter().skip(from) {
        tx.execute_batch(migration)?;
    }
    // Foreign keys are off while migrating (see `open`): check what they would have
    // refused, once, after a migration rather than at every open.
    let violations: i64 = if from < MIGRATIONS.len() {
        tx.query_row("SELECT count(*) FROM pragma_foreign_key_check", [], |row| {
            row.get(0)
        })?
    } else {
        0
    };
    if violations > 0 {
        return Err(Failure::Store(refuse(
            path,
            format!(
                "upgrading the schema would leave {violations} rows that refer to nothing; \
                 idem left the file as it was"
            ),
        )));
    }
    tx.pragma_update(None, "application_id", APPLICATION_ID)?;
    tx.pragma_update(None, "user_version", SCHEMA_VERSION)?;
    tx.commit()?;
    Ok(())
}

/// The number of migrations already applied, or why the file must not be touched.
fn check_contents(path: &Path, contents: Contents) -> Result<usize, StoreError> {
    match contents {
        Contents::Empty => Ok(0),
        Contents::Idem { version } => match usize::try_from(version) {
            Ok(applied) if applied <= MIGRATIONS.len() => Ok(applied),
            Ok(_) => Err(StoreError::SchemaTooNew {
                location: path.display().to_string(),
                found: version,
                supported: SCHEMA_VERSION,
            }),
            Err(_) => Err(refuse(
                path,
                format!("the idem store has an invalid schema version {version}"),
            )),
        },
        Contents::Foreign {
            application_id,
            objects,
        } => Err(refuse(
            path,
            format!(
                "the file is a SQLite database but not an idem store (application_id \
                 {application_id:#x}, {objects} schema objects); idem left it untouched"
            ),
        )),
    }
}

fn refuse(path: &Path, reason: String) -> StoreError {
    StoreError::Open {
        location: path.display().to_string(),
        reason,
    }
}

/// Reads what the file holds without writing to it.
fn inspect(conn: &Connection) -> rusqlite::Result<Contents> {
    // One statement, so one snapshot: read separately, the three could straddle another
    // process's initialisation and describe a file that never existed.
    let (application_id, version, objects): (i32, i64, i64) = conn.query_row(
        "SELECT (SELECT application_id FROM pragma_application_id()),
                (SELECT user_version FROM pragma_user_version()),
                (SELECT count(*) FROM sqlite_schema)",
        [],
        |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)),
    )?;
    Ok(if application_id == APPLICATION_ID {
        Contents::Idem { version }
    } else if application_id == 0 && version == 0 && objects == 0 {
        Contents::Empty
    } else {
        Contents::Foreign {
            application_id,
            objects,
        }
    })
}

/// Refuses `:memory:`, SQLite's name for a database that lives in the process only. idem
/// opens every path as a file (`sqlite_path`), so it would quietly be a file of that
/// name in the working directory, while whoever wrote it expects nothing on disk; and a
/// store that dies with its process cannot keep a side effect from happening twice. A
/// file of that name is still reachable as `./:memory:`.
fn check_name(path: &Path) -> Result<(), String> {
    if path.as_os_str() == ":memory:" {
        return Err(
            "`:memory:` names an in-memory database in SQLite, and an idem store \
                    must outlive its process to keep side effects from running twice; \
                    give a file path (`./:memory:` for a file of that name)"
                .to_owned(),
        );
    }
    Ok(())
}

/// Refuses locations SQLite would only report as "unable to open database file", or
/// would hang on.
fn check_location(path: &Path, dir: &Path) -> Result<(), String> {
    // Before anything opens it: opening a FIFO for reading waits for a writer forever,
    // and a device or socket is no place for a database. `metadata` only looks.
    match std::fs::metadata(path) {
        Ok(meta) if !meta.is_file() => return Err(not_a_file(meta.file_type())),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(format!("cannot look at the file: {e}")),
    }
    match std::fs::metadata(dir) {
        Ok(meta) if meta.is_dir() => Ok(()),
        Ok(_) => Err(format!("{} is not a directory", dir.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Err(format!("directory {} does not exist", dir.display()))
        }
        Err(e) => Err(format!("cannot access directory {}: {e}", dir.display())),
    }?;
    check_header(path)
}

/// Why a path that exists but is no regular file cannot be a store.
fn not_a_file(file_type: std::fs::FileType) -> String {
    let what = if file_type.is_dir() {
        "a directory"
    } else {
        special_file(file_type)
    };
    format!("it is {what}, not a database file")
}

#[cfg(unix)]
fn special_file(file_type: std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if file_type.is_fifo() {
        "a named pipe (FIFO)"
    } else if file_type.is_socket() {
        "a socket"
    } else if file_type.is_block_device() || file_type.is_char_device() {
        "a device"
    } else {
        "not a regular file"
    }
}

#[cfg(not(unix))]
fn special_file(_: std::fs::FileType) -> &'static str {
    "not a regular file"
}

/// SQLite takes a file shorter than its 100-byte header for an empty database and
/// overwrites it; refuse any non-empty file that does not start like a database.
fn check_header(path: &Path) -> Result<(), String> {
    const MAGIC: &[u8; 16] = b"SQLite format 3\0";
    let mut head = Vec::with_capacity(MAGIC.len());
    match std::fs::File::open(path) {
        Ok(file) => {
            use std::io::Read;
            file.take(MAGIC.len() as u64)
                .read_to_end(&mut head)
                .map_err(|e| format!("cannot read the file: {e}"))?;
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(format!("cannot open the file: {e}")),
    }
    if head.is_empty() || head == MAGIC {
        Ok(())
    } else {
        Err("the file is not a SQLite database; idem left it untouched".to_owned())
    }
}

/// The directory the database (and its `-wal` and `-shm` files) lives in.
fn directory_of(path: &Path) -> &Path {
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    }
}

/// The error for a SQLite failure while opening: the faults a store can meet at any
/// time (locked, full, corrupt, I/O) as [`StoreError::Database`], as they would be
/// reported during a run; anything else explained for a user who chose this path.
fn open_failure(
    path: &Path,
    dir: &Path,
    busy_timeout: Duration,
    e: &rusqlite::Error,
) -> StoreError {
    let code = e.sqlite_error_code();
    match database_fault(code, busy_timeout) {
        // Read-only files and non-databases get the explanations of `describe`, which
        // say what about this path is wrong.
        Some(fault)
            if fault != DatabaseFault::ReadOnly && code != Some(ErrorCode::NotADatabase) =>
        {
            StoreError::Database {
                location: path.display().to_string(),
                op: "open the store",
                fault,
                detail: sqlite_detail(fault, &e.to_string()),
            }
        }
        _ => refuse(path, describe(e, dir)),
    }
}

/// Puts a SQLite error met while opening into words a user can act on.
fn describe(e: &rusqlite::Error, dir: &Path) -> String {
    match e.sqlite_error_code() {
        Some(ErrorCode::NotADatabase) => {
            "the file is not a SQLite database; idem left it untouched".to_owned()
        }
        Some(ErrorCode::CannotOpen | ErrorCode::PermissionDenied) => format!(
            "cannot create or open the file; check that {} is writable (SQLite: {e})",
            dir.display()
        ),
        Some(ErrorCode::ReadOnly) => format!(
            "the database is not writable; idem needs write access to the file and to \
             {}, where SQLite keeps its -wal and -shm files (SQLite: {e})",
            dir.display()
        ),
        _ => e.to_string(),
    }
}
