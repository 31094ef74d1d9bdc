//! Argument values and flag groups shared by the subcommands: raw flags become the
//! library's validated types here, before anything runs.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use idem::runtime::{
    Authority, DirGrant, HttpDestination, LoadedAgent, Protected, Runtime, check_grants,
    default_cache_dir, open_regular_file,
};
use idem::store::{self, Location, Store, StoreKey, StoreOptions, SyncMode};

use crate::exit::BadInput;

/// Where the store is: `--db`.
#[derive(Debug, Clone, Args)]
pub struct DbArgs {
    /// The store: a SQLite file, or a PostgreSQL database as a URL
    /// (`postgres://USER[:PASSWORD]@HOST[:PORT]/DB`) that processes on many machines
    /// share.
    #[arg(long, default_value = "idem.db", value_name = "PATH|URL")]
    pub db: String,
    /// PostgreSQL only: most connections this process opens (each in-flight write of a
    /// run holds one).
    #[arg(long, default_value_t = 16, value_name = "N")]
    pub db_pool: usize,
    /// PostgreSQL only: how long one call to the server may wait for its answer before
    /// its connection is given up (a server that stopped answering never holds a
    /// command or a worker longer); the server is given the same bound for a statement.
    #[arg(long, default_value = "10s", value_parser = duration, value_name = "DURATION")]
    pub db_timeout: Duration,
    /// The key of a store encrypted at rest: a file holding 64 hex digits (`openssl
    /// rand -hex 32 > idem.key`). Given for a new store, it makes the store encrypted;
    /// an encrypted store opens only with it. IDEM_STORE_KEY may hold the digits
    /// themselves instead.
    #[arg(long, env = "IDEM_STORE_KEY_FILE", value_name = "PATH")]
    pub key_file: Option<PathBuf>,
}

impl DbArgs {
    /// Opens (creating and migrating if needed) the store for writing.
    pub async fn open(&self) -> anyhow::Result<Arc<dyn Store>> {
        Ok(store::open(&self.db, &self.options()?).await?)
    }

    /// Opens an existing store for reading only: looking never changes it.
    pub async fn open_read_only(&self) -> anyhow::Result<Arc<dyn Store>> {
        if let Some(path) = self.path() {
            self.must_exist(path)?;
        }
        let options = StoreOptions {
            read_only: true,
            ..self.options()?
        };
        Ok(store::open(&self.db, &options).await?)
    }

    /// Opens an existing store for writing; a missing one is a mistake, not a new store.
    pub async fn open_existing(&self) -> anyhow::Result<Arc<dyn Store>> {
        if let Some(path) = self.path() {
            self.must_exist(path)?;
        }
        let options = StoreOptions {
            existing_only: true,
            ..self.options()?
        };
        Ok(store::open(&self.db, &options).await?)
    }

    /// The store's file, or `None` for a PostgreSQL URL.
    pub fn path(&self) -> Option<&std::path::Path> {
        Location::parse(&self.db).path()
    }

    fn options(&self) -> anyhow::Result<StoreOptions> {
        Ok(StoreOptions {
            pool_size: self.db_pool.max(1),
            call_timeout: self.db_timeout,
            key: self.key()?,
            ..StoreOptions::default()
        })
    }

    /// The store key given, from `--key-file` (or IDEM_STORE_KEY_FILE), else from
    /// IDEM_STORE_KEY; `None` for a store that is not encrypted.
    pub fn key(&self) -> anyhow::Result<Option<StoreKey>> {
        if let Some(path) = &self.key_file {
            return read_key(path).map(Some);
        }
        match std::env::var("IDEM_STORE_KEY") {
            Ok(text) => StoreKey::from_hex(&text)
                .map(Some)
                .map_err(|e| BadInput(format!("IDEM_STORE_KEY: {e}")).into()),
            Err(std::env::VarError::NotPresent) => Ok(None),
            Err(std::env::VarError::NotUnicode(_)) => {
                Err(BadInput("IDEM_STORE_KEY: not a store key: it is not text".to_owned()).into())
            }
        }
    }

    fn must_exist(&self, path: &std::path::Path) -> anyhow::Result<()> {
        if !path.exists() {
            return Err(BadInput(format!("no store at {}", path.display())).into());
        }
        Ok(())
    }
}

/// The store key in the file at `path` (64 hex digits, a newline allowed).
pub fn read_key(path: &Path) -> anyhow::Result<StoreKey> {
    let mut text = String::new();
    open_regular_file(path)
        .and_then(|file| file.take(1024).read_to_string(&mut text))
        .map_err(|e| BadInput(format!("cannot read the key file {}: {e}", path.display())))?;
    StoreKey::from_hex(&text)
        .map_err(|e| BadInput(format!("the key file {}: {e}", path.display())).into())
}

/// What no directory grant may expose: the store and its key file, the cache in use,
/// and the default cache even for a command that does not use it, since its key seals
/// what later runs load.
pub fn protected(
    db: Option<&std::path::Path>,
    key: Option<&std::path::Path>,
    cache: Option<&std::path::Path>,
) -> Vec<Protected> {
    let mut protected: Vec<Protected> = db
        .map(|db| Protected::Store(db.to_path_buf()))
        .into_iter()
        .collect();
    protected.extend(key.map(|key| Protected::Key(key.to_path_buf())));
    protected.extend(cache.map(|dir| Protected::Cache(dir.to_path_buf())));
    protected.extend(
        default_cache_dir()
            .filter(|dir| Some(dir.as_path()) != cache)
            .map(Protected::Cache),
    );
    protected
}

/// The engine (with `cache`) and `agent` loaded from its file, once the grants of
/// `authority` were checked against the store and the cache: a refused grant or a bad
/// agent changes nothing, not even the cache.
pub fn load_agent(
    agent: &std::path::Path,
    authority: &Authority,
    db: &DbArgs,
    cache: Option<PathBuf>,
) -> anyhow::Result<(Runtime, LoadedAgent)> {
    check_grants(
        &authority.dirs,
        &protected(db.path(), db.key_file.as_deref(), cache.as_deref()),
    )?;
    let cached = cache.is_some();
    let mut runtime = Runtime::new(cache)?;
    runtime.on_compile(move |path, size| say_compiling(path, size, cached));
    let agent = runtime.load(agent)?;
    Ok((runtime, agent))
}

/// Components at least this large take seconds to compile and to store (a Python agent
/// is ~19 MB): idem says what it is doing rather than sit silent. Smaller ones (a Rust
/// agent, ~0.2–2 MB) are done before anyone would wonder.
pub const LARGE_COMPONENT: u64 = 4 << 20;

/// One line on stderr before a large component is compiled, terminal or not: a pipe
/// or a CI log would otherwise show nothing for up to a minute.
fn say_compiling(path: &Path, size: u64, cached: bool) {
    if size < LARGE_COMPONENT {
        return;
    }
    let then = if cached {
        "once per build: the cache keeps the compiled code"
    } else {
        "every time: --no-cache keeps no compiled code"
    };
    eprintln!(
        "idem: compiling {} ({}), {then}…",
        super::display::name(&path.to_string_lossy()),
        megabytes(size)
    );
}

/// One line on stderr before the first run of a large component copies it into a
/// store that does not hold it yet (runs are made from what the store holds, so that
/// any worker can resume them): the first run is slower by that copy, once per build.
pub async fn say_storing(
    store: &dyn Store,
    agent: &LoadedAgent,
    path: &Path,
) -> anyhow::Result<()> {
    let size = std::fs::metadata(path).map_or(0, |m| m.len());
    if size >= LARGE_COMPONENT && !store.has_component(agent.digest()).await? {
        eprintln!(
            "idem: storing {} ({}) in the store, once per build: runs are made from the \
             component the store holds",
            super::display::name(&path.to_string_lossy()),
            megabytes(size)
        );
    }
    Ok(())
}

fn megabytes(bytes: u64) -> String {
    format!("{:.1} MB", bytes as f64 / 1e6)
}

/// What a run may reach, as flags. With `idem run` and `idem deploy` the flags given
/// make the whole authority (unset ones take their defaults); with `idem submit` they
/// replace only what they name in the deployment's authority, which must allow them.
#[derive(Debug, Clone, Default, Args)]
pub struct AuthorityArgs {
    /// Grant a host directory to the agent: `HOST::GUEST`. Repeatable.
    #[arg(long = "dir", value_name = "HOST::GUEST", value_parser = dir_grant)]
    pub dirs: Vec<DirGrant>,
    /// Grant an environment variable to the agent: `K=V`. Repeatable.
    #[arg(long = "env", value_name = "K=V", value_parser = env_var)]
    pub env: Vec<(String, String)>,
    /// Let the agent send HTTP requests to HOST (any port) or HOST:PORT; IPv6 in
    /// brackets. Repeatable. Without it the agent reaches no network.
    #[arg(long = "allow-http", value_name = "HOST[:PORT]")]
    pub allow_http: Vec<HttpDestination>,
    /// Let granted HTTP requests through even when the agent holds no claim (by
    /// default such requests are refused: side effects belong inside run-once).
    #[arg(long)]
    pub allow_http_outside_claims: bool,
    /// Durability: `normal` (fast; a power loss may undo the last commits) or `full`
    /// (every commit is fsync'd).
    #[arg(long, value_name = "normal|full", value_parser = sync_mode)]
    pub sync: Option<SyncMode>,
    /// How long a claim (and the run) is held before another holder may take it over.
    #[arg(long, value_parser = duration, value_name = "DURATION")]
    pub lease: Option<Duration>,
    /// How long to wait for another holder's commit before giving up.
    #[arg(long, value_parser = duration, value_name = "DURATION")]
    pub await_timeout: Option<Duration>,
    /// Longest idempotency key, in bytes [default: 512].
    #[arg(long, value_parser = size, value_name = "SIZE")]
    pub max_key_bytes: Option<usize>,
    /// Largest committed result [default: 1MiB].
    #[arg(long, value_parser = size, value_name = "SIZE")]
    pub max_result_bytes: Option<usize>,
    /// Largest checkpoint state [default: 1MiB].
    #[arg(long, value_parser = size, value_name = "SIZE")]
    pub max_state_bytes: Option<usize>,
    /// Largest output the agent may return [default: 1MiB].
    #[arg(long, value_parser = size, value_name = "SIZE")]
    pub max_output_bytes: Option<usize>,
    /// Most memory an instance may make the host hold: all its linear memories plus 128 KiB
    /// per live resource handle [default: 256MiB].
    #[arg(long, value_parser = size, value_name = "SIZE")]
    pub max_memory: Option<usize>,
    /// Most live resource handles (HTTP fields, bodies, streams) of an instance
    /// [default: 10000].
    #[arg(long, value_name = "N")]
    pub max_handles: Option<usize>,
    /// Most claims an instance may hold at once, its side effects in flight together
    /// [default: 64].
    #[arg(long, value_name = "N")]
    pub max_claims: Option<usize>,
    /// Most child runs one run may spawn, and children one join may list
    /// [default: 10000].
    #[arg(long, value_name = "N")]
    pub max_children: Option<usize>,
    /// Deepest a run may be spawned (a run started from outside is at depth 0)
    /// [default: 8].
    #[arg(long, value_name = "N")]
    pub max_depth: Option<usize>,
    /// Most elements of an instance's tables [default: 100000].
    #[arg(long, value_name = "N")]
    pub max_table_elements: Option<usize>,
    /// Longest an instance holding no claim may go without calling idem, computing or
    /// waiting [default: 60s].
    #[arg(long, value_parser = duration, value_name = "DURATION")]
    pub max_compute: Option<Duration>,
    /// Fuel (about one unit per wasm instruction) one drive of the run may burn; no
    /// limit by default.
    #[arg(long, value_name = "UNITS")]
    pub max_fuel: Option<u64>,
    /// Longest a side effect may run, from its claim to its commit [default: 5m].
    #[arg(long, value_parser = duration, value_name = "DURATION")]
    pub effect_timeout: Option<Duration>,
}

impl AuthorityArgs {
    /// `base` with what these flags name replaced.
    pub fn apply(&self, base: &Authority) -> Authority {
        let mut a = base.clone();
        if !self.dirs.is_empty() {
            a.dirs = self.dirs.clone();
        }
        if !self.env.is_empty() {
            a.env = self.env.clone();
        }
        if !self.allow_http.is_empty() {
            a.http.allow = self.allow_http.clone();
        }
        if self.allow_http_outside_claims {
            a.http.outside_claims = true;
        }
        if let Some(sync) = self.sync {
            a.sync = sync;
        }
        let l = &mut a.limits;
        set(&mut l.lease, self.lease);
        set(&mut l.await_timeout, self.await_timeout);
        set(&mut l.max_key_bytes, self.max_key_bytes);
        set(&mut l.max_result_bytes, self.max_result_bytes);
        set(&mut l.max_state_bytes, self.max_state_bytes);
        set(&mut l.max_output_bytes, self.max_output_bytes);
        set(&mut l.max_memory_bytes, self.max_memory);
        set(&mut l.max_handles, self.max_handles);
        set(&mut l.max_claims, self.max_claims);
        set(&mut l.max_children, self.max_children);
        set(&mut l.max_depth, self.max_depth);
        set(&mut l.max_table_elements, self.max_table_elements);
        set(&mut l.max_compute, self.max_compute);
        set(&mut l.effect_timeout, self.effect_timeout);
        if self.max_fuel.is_some() {
            l.max_fuel = self.max_fuel;
        }
        a
    }

    /// The whole authority these flags make, defaults for the rest.
    pub fn authority(&self) -> anyhow::Result<Authority> {
        let authority = self.apply(&Authority::default());
        authority
            .check()
            .map_err(|e| BadInput(flag_error(&e.to_string())))?;
        Ok(authority)
    }
}

fn set<T>(field: &mut T, value: Option<T>) {
    if let Some(value) = value {
        *field = value;
    }
}

/// The flag that sets each field of `idem::runtime::Limits`, for messages and hints.
pub fn limit_flag(name: &str) -> &'static str {
    match name {
        "lease" => "--lease",
        "await_timeout" => "--await-timeout",
        "max_key_bytes" => "--max-key-bytes",
        "max_result_bytes" => "--max-result-bytes",
        "max_state_bytes" => "--max-state-bytes",
        "max_output_bytes" => "--max-output-bytes",
        "max_memory_bytes" => "--max-memory",
        "max_handles" => "--max-handles",
        "max_claims" => "--max-claims",
        "max_children" => "--max-children",
        "max_depth" => "--max-depth",
        "max_table_elements" => "--max-table-elements",
        "max_compute" => "--max-compute",
        "max_fuel" => "--max-fuel",
        "effect_timeout" => "--effect-timeout",
        _ => "the limit's flag",
    }
}

/// A library message about a limit field, with the flag's name in place of the
/// field's.
fn flag_error(message: &str) -> String {
    let fields = [
        "max_memory_bytes",
        "max_table_elements",
        "max_result_bytes",
        "max_state_bytes",
        "max_output_bytes",
        "max_key_bytes",
        "max_handles",
        "max_claims",
        "max_children",
        "max_depth",
        "max_compute",
        "max_fuel",
        "effect_timeout",
        "await_timeout",
        "lease",
    ];
    for field in fields {
        if message.contains(&format!("limit {field} ")) {
            return message.replacen(
                &format!("limit {field} "),
                &format!("{} ", limit_flag(field)),
                1,
            );
        }
    }
    message.to_string()
}

/// Reads `--input`-like values: JSON, `@FILE` to read it from a regular file, or `@-`
/// to read it from stdin. A FIFO or a device as `@FILE` is refused rather than waited
/// on (a FIFO with no writer never opens): what a pipe carries comes through `@-`.
pub fn json_or_file(flag: &str, value: &str) -> anyhow::Result<Vec<u8>> {
    let bytes = text_or_file(flag, value)?;
    serde_json::from_slice::<serde_json::Value>(&bytes)
        .map_err(|e| BadInput(format!("{flag} is not valid JSON: {e}")))?;
    Ok(bytes)
}

/// A flag's value as given, or `@FILE` read from a regular file (`@-`: from stdin).
pub fn text_or_file(flag: &str, value: &str) -> anyhow::Result<Vec<u8>> {
    Ok(match value.strip_prefix('@') {
        Some("-") => {
            let mut bytes = Vec::new();
            std::io::stdin()
                .lock()
                .read_to_end(&mut bytes)
                .map_err(|e| BadInput(format!("cannot read {flag} from stdin: {e}")))?;
            bytes
        }
        Some(path) => read_regular(Path::new(path)).map_err(|e| {
            let pipe = if e.kind() == std::io::ErrorKind::InvalidInput {
                "; to read it from a pipe, give it on stdin with @-"
            } else {
                ""
            };
            BadInput(format!("cannot read {flag} file {path}: {e}{pipe}"))
        })?,
        None => value.as_bytes().to_vec(),
    })
}

fn read_regular(path: &Path) -> std::io::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    open_regular_file(path)?.read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// Parses `HOST::GUEST`.
pub fn dir_grant(s: &str) -> Result<DirGrant, String> {
    let (host, guest) = s
        .split_once("::")
        .ok_or_else(|| format!("expected HOST::GUEST, got {s:?}"))?;
    if host.is_empty() || guest.is_empty() {
        return Err(format!("expected HOST::GUEST with both parts, got {s:?}"));
    }
    Ok(DirGrant {
        host: PathBuf::from(host),
        guest: guest.to_string(),
    })
}

/// Parses `K=V`.
pub fn env_var(s: &str) -> Result<(String, String), String> {
    let (k, v) = s
        .split_once('=')
        .ok_or_else(|| format!("expected K=V, got {s:?}"))?;
    if k.is_empty() {
        return Err(format!("expected K=V with a name, got {s:?}"));
    }
    Ok((k.to_string(), v.to_string()))
}

/// Parses a duration: a number followed by `ms`, `s`, `m` or `h`, up to 365 days.
pub fn duration(s: &str) -> Result<Duration, String> {
    let err = || format!("expected a duration such as 500ms, 30s, 2m or 1h, got {s:?}");
    let split = s.find(|c: char| !c.is_ascii_digit()).ok_or_else(err)?;
    let (n, unit) = s.split_at(split);
    let n: u64 = n.parse().map_err(|_| err())?;
    let millis = match unit {
        "ms" => Some(n),
        "s" => n.checked_mul(1_000),
        "m" => n.checked_mul(60_000),
        "h" => n.checked_mul(3_600_000),
        _ => return Err(err()),
    };
    const MAX_MILLIS: u64 = 365 * 24 * 3_600_000;
    match millis {
        Some(ms) if ms <= MAX_MILLIS => Ok(Duration::from_millis(ms)),
        _ => Err(format!(
            "duration {s:?} is over the longest accepted, 365 days"
        )),
    }
}

/// Parses a size: a number of bytes, optionally followed by `KiB`, `MiB` or `GiB`.
pub fn size(s: &str) -> Result<usize, String> {
    let err = || format!("expected a size such as 4096, 512KiB, 1MiB or 2GiB, got {s:?}");
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (n, unit) = s.split_at(split);
    let n: usize = n.parse().map_err(|_| err())?;
    let shift = match unit {
        "" | "B" => 0,
        "KiB" => 10,
        "MiB" => 20,
        "GiB" => 30,
        _ => return Err(err()),
    };
    n.checked_mul(1 << shift).ok_or_else(err)
}

/// Parses `normal` or `full`.
pub fn sync_mode(s: &str) -> Result<SyncMode, String> {
    s.parse()
        .map_err(|_| format!("expected normal or full, got {s:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_values() {
        assert_eq!(
            dir_grant("/tmp/x::/data").unwrap(),
            DirGrant {
                host: "/tmp/x".into(),
                guest: "/data".into()
            }
        );
        assert!(dir_grant("/tmp/x").is_err());
        assert!(dir_grant("::/data").is_err());
        assert_eq!(env_var("A=b=c").unwrap(), ("A".into(), "b=c".into()));
        assert!(env_var("=x").is_err());
        assert_eq!(duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(duration("3s").unwrap(), Duration::from_secs(3));
        assert_eq!(duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(duration("1h").unwrap(), Duration::from_secs(3600));
        assert!(duration("3").is_err());
        assert!(duration("3d").is_err());
        assert!(duration("99999999999999999999s").is_err());
        assert!(
            duration("18446744073709551615m")
                .unwrap_err()
                .contains("365 days")
        );
        assert_eq!(size("4096").unwrap(), 4096);
        assert_eq!(size("512KiB").unwrap(), 512 << 10);
        assert_eq!(size("1MiB").unwrap(), 1 << 20);
        assert_eq!(size("2GiB").unwrap(), 2 << 30);
        assert!(size("1MB").is_err());
        assert!(size("MiB").is_err());
    }

    #[test]
    fn limit_errors_name_flags() {
        let args = AuthorityArgs {
            lease: Some(Duration::ZERO),
            ..AuthorityArgs::default()
        };
        let err = args.authority().unwrap_err().to_string();
        assert!(err.starts_with("--lease is 0ms"), "{err}");
    }
}

/// Where compiled agents are kept: the flags every command that loads agents shares.
#[derive(Debug, Args)]
pub struct CacheArgs {
    /// Where precompiled agents are kept. Defaults to $XDG_CACHE_HOME/idem.
    #[arg(long)]
    cache_dir: Option<PathBuf>,
    /// Compile agents in memory every time, keeping nothing on disk.
    #[arg(long, conflicts_with = "cache_dir")]
    no_cache: bool,
}

impl CacheArgs {
    /// The cache directory, or `None` when nothing is to be kept.
    pub fn dir(&self) -> Option<PathBuf> {
        if self.no_cache {
            None
        } else {
            self.cache_dir.clone().or_else(default_cache_dir)
        }
    }
}

/// An optional price table: `--prices`.
#[derive(Debug, Clone, Args)]
pub struct PricesArgs {
    /// A price table (JSON: per model, the price of a million input, output and cached
    /// tokens, `{"gpt-4o-mini": {"input": 0.15, "output": 0.6, "cached": -0.075}}`)
    /// that turns token usage into cost where it is shown.
    #[arg(long, value_name = "FILE")]
    pub prices: Option<PathBuf>,
}

impl PricesArgs {
    /// The table, if one was given; a bad one is bad input, naming its bad entry.
    pub fn load(&self) -> anyhow::Result<Option<idem::ops::Prices>> {
        match &self.prices {
            None => Ok(None),
            Some(path) => idem::ops::Prices::load(path)
                .map(Some)
                .map_err(|e| BadInput(e.to_string()).into()),
        }
    }
}
