//! The engine, the linker and loading agents: one `Engine` per process, each component
//! compiled once (or loaded precompiled from the cache), one `InstancePre` per
//! component digest.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use sha2::{Digest, Sha256};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use wasmtime::component::{Component, Linker};
use wasmtime::{Config, Engine};

use super::agent_bytes::AgentBytes;
use super::bindings::{AgentPre, idem as idem_wit};
use super::cache::{ComponentCache, hex};
use super::error::HostError;
use super::state::InstanceState;
use super::view::HasIdem;

/// The first eight bytes of a core module: magic, then version 1.
const CORE_MODULE_HEADER: [u8; 8] = *b"\0asm\x01\0\0\0";

/// The compiled-code side of a host: engine, linker, component cache. Shared by every
/// run of a process.
pub struct Runtime {
    engine: Engine,
    linker: Linker<InstanceState>,
    cache: Option<ComponentCache>,
    on_compile: Option<CompileNotice>,
    /// One permit per instance the engine's pool has room for.
    slots: Arc<Semaphore>,
    _ticker: EpochTicker,
}

/// Instances a process holds at once unless told otherwise: what the bench's and a
/// worker's thousand runs waiting on HTTP need.
pub const DEFAULT_INSTANCES: usize = 1000;

/// Most instances one process can be told to hold at once. The pool reserves address
/// space (not memory) for two linear memories an instance, about 4 GiB
/// each with their guards: 8,192 instances take half of the 128 TiB x86-64 gives a
/// process.
pub const MAX_INSTANCES: usize = 8_192;

/// Builds the engine with wasmtime's pooling allocator: an instance's memory, tables
/// and fiber stack come from slots mapped once, reset between uses, where the default
/// allocator maps and unmaps them for every instance. That mapping was half of a
/// worker's CPU for each short run (`perf`: `mmap`, `munmap` and the page-table work
/// and TLB shootdowns they cause across cores). The pool is sized for `instances`
/// instances of any agent idem builds: a Rust component is a handful of core
/// instances, a Python one (componentize-py) a few dozen with one memory and a table of
/// tens of thousands of functions. Where the address space cannot be reserved (a
/// `ulimit -v`), the engine falls back to mapping each instance on its own, slower but
/// the same to every run.
fn pooled_engine(config: &mut Config, instances: usize) -> Result<Engine, HostError> {
    let n = u32::try_from(instances).unwrap_or(u32::MAX);
    let mut pool = wasmtime::PoolingAllocationConfig::default();
    pool.total_component_instances(n)
        .total_core_instances(n.saturating_mul(CORE_INSTANCES_EACH))
        .total_memories(n.saturating_mul(MEMORIES_EACH))
        .total_tables(n.saturating_mul(TABLES_EACH))
        .total_stacks(n)
        .max_memories_per_module(MEMORIES_EACH)
        .max_tables_per_module(TABLES_EACH)
        .table_elements(TABLE_ELEMENTS);
    config.allocation_strategy(wasmtime::InstanceAllocationStrategy::Pooling(pool));
    Engine::new(config).or_else(|e| {
        tracing::warn!(error = %format!("{e:#}"), "cannot reserve the instance pool; mapping each instance on its own");
        config.allocation_strategy(wasmtime::InstanceAllocationStrategy::OnDemand);
        Engine::new(config).map_err(|e| HostError::Engine(format!("{e:#}")))
    })
}

/// Core instances one component instance may use: a Rust agent uses a few, a Python
/// one some thirty (its libraries linked as modules of their own).
const CORE_INSTANCES_EACH: u32 = 64;

/// Linear memories a module may define, and slots kept per instance.
const MEMORIES_EACH: u32 = 2;

/// Tables a module may define, and slots kept per instance.
const TABLES_EACH: u32 = 4;

/// Most elements of one table: CPython's table of functions is in the tens of
/// thousands. The pool reserves address space for this many in every table slot, and
/// touches only what an instance uses.
const TABLE_ELEMENTS: usize = 200_000;

/// Called with the agent's path and size just before a component is compiled (neither
/// the cache nor this process had its code): compiling a large one (a Python agent,
/// ~19 MB) takes seconds to a minute, which a caller may want to say.
pub type CompileNotice = Box<dyn Fn(&Path, u64) + Send + Sync>;

/// How often the engine's epoch advances: the resolution of wall-clock limits.
pub(crate) const EPOCH_TICK: Duration = Duration::from_millis(10);

/// Advances the engine's epoch every [`EPOCH_TICK`] until dropped.
struct EpochTicker {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl EpochTicker {
    fn start(engine: &Engine) -> EpochTicker {
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (engine, stop) = (engine.clone(), Arc::clone(&stop));
            std::thread::Builder::new()
                .name("idem-epoch".into())
                .spawn(move || {
                    // Parked rather than asleep, so that dropping the ticker wakes it at
                    // once: a sleep made every process exit wait up to a tick for the
                    // join (5 ms on average, an eighth of a Python agent's cold start).
                    let mut next = std::time::Instant::now() + EPOCH_TICK;
                    while !stop.load(Ordering::Acquire) {
                        let now = std::time::Instant::now();
                        if now < next {
                            std::thread::park_timeout(next - now);
                            continue;
                        }
                        engine.increment_epoch();
                        // Late by more than a tick (a loaded or suspended machine): one
                        // increment, as a sleep would have given, not a burst.
                        next = if now > next + EPOCH_TICK {
                            now + EPOCH_TICK
                        } else {
                            next + EPOCH_TICK
                        };
                    }
                })
                .map_err(|e| tracing::error!(error = %e, "cannot start the epoch ticker; wall-clock limits are off"))
                .ok()
        };
        EpochTicker { stop, thread }
    }
}

impl Drop for EpochTicker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(thread) = self.thread.take() {
            thread.thread().unpark();
            let _ = thread.join();
        }
    }
}

/// An agent ready to be instantiated any number of times.
#[derive(Clone)]
pub struct LoadedAgent {
    pub(crate) name: String,
    pub(crate) digest: String,
    pub(crate) pre: AgentPre<InstanceState>,
    pub(crate) from_cache: bool,
    /// The component's bytes, for the store: runs are made from what is deployed.
    pub(crate) bytes: Arc<AgentBytes>,
}

impl std::fmt::Debug for LoadedAgent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedAgent")
            .field("name", &self.name)
            .field("digest", &self.digest)
            .field("from_cache", &self.from_cache)
            .finish_non_exhaustive()
    }
}

impl LoadedAgent {
    /// The agent's name: its file stem, or the name it was deployed under.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Hex SHA-256 of the component's bytes.
    pub fn digest(&self) -> &str {
        &self.digest
    }

    /// Whether the compiled code came from the cache rather than a compile.
    pub fn from_cache(&self) -> bool {
        self.from_cache
    }

    /// The component's bytes. Read from the agent file now if loading did not need to
    /// (the cache knew the file); an error if the file changed since.
    pub fn bytes(&self) -> Result<&[u8], HostError> {
        self.bytes.get()
    }
}

impl Runtime {
    /// Builds the engine and the linker. `cache_dir` enables the precompiled-component
    /// cache; a directory that others could change is refused ([`HostError::Cache`]).
    /// The process holds at most [`DEFAULT_INSTANCES`] instances at once
    /// ([`Runtime::with_instances`]).
    pub fn new(cache_dir: Option<PathBuf>) -> Result<Runtime, HostError> {
        Runtime::with_instances(cache_dir, DEFAULT_INSTANCES)
    }

    /// Like [`Runtime::new`], holding at most `instances` instances at once (at least
    /// one): a run that needs an instance while that many are alive waits until one
    /// ends. A worker driving N runs at once needs N (a run in a durable wait holds
    /// none).
    pub fn with_instances(
        cache_dir: Option<PathBuf>,
        instances: usize,
    ) -> Result<Runtime, HostError> {
        let instances = instances.clamp(1, MAX_INSTANCES);
        let mut config = Config::new();
        config.wasm_component_model(true);
        // Fuel lets the host end an instance in the middle of guest computation at a
        // point chosen by a seed, reproducibly (epoch interruption is wall-clock based).
        config.consume_fuel(true);
        // Epochs end instances by wall-clock time (compute and side-effect limits); a
        // ticker thread advances them.
        config.epoch_interruption(true);
        let engine = pooled_engine(&mut config, instances)?;
        let ticker = EpochTicker::start(&engine);

        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker)
            .map_err(|e| HostError::Engine(format!("{e:#}")))?;
        super::guest_links::add_to_linker(&mut linker)
            .map_err(|e| HostError::Engine(format!("{e:#}")))?;
        // Always linked, so agents built with HTTP load; the gate in `http.rs` refuses
        // every request the run's policy does not grant.
        wasmtime_wasi_http::p2::add_only_http_to_linker_async(&mut linker)
            .map_err(|e| HostError::Engine(format!("{e:#}")))?;
        // idem's own interfaces one by one: the world also imports wasi:http, which is
        // linked above from wasmtime's crates.
        add_idem_to_linker(&mut linker).map_err(|e| HostError::Engine(format!("{e:#}")))?;

        let cache = cache_dir
            .map(|dir| ComponentCache::open(dir, &engine))
            .transpose()?;
        Ok(Runtime {
            engine,
            linker,
            cache,
            on_compile: None,
            slots: Arc::new(Semaphore::new(instances)),
            _ticker: ticker,
        })
    }

    /// Calls `notice` before each compile from now on.
    pub fn on_compile(&mut self, notice: impl Fn(&Path, u64) + Send + Sync + 'static) {
        self.on_compile = Some(Box::new(notice));
    }

    pub(crate) fn engine(&self) -> &Engine {
        &self.engine
    }

    /// A slot for one instance, waited for while the pool is full; the instance must
    /// be dropped before the slot is.
    pub(crate) async fn slot(&self) -> OwnedSemaphorePermit {
        Arc::clone(&self.slots)
            .acquire_owned()
            .await
            // The semaphore is never closed.
            .unwrap_or_else(|_| unreachable!("the instance slots are never closed"))
    }

    /// Reads, checks and compiles (or loads from the cache) the agent at `path`.
    ///
    /// With a cache that remembers this file's digest (the file unchanged since it was
    /// last hashed) and holds its compiled code, the file is not read at all. Anything
    /// but a regular file (a FIFO, a device, a directory) is refused with
    /// [`HostError::ReadAgent`] before it is read: see [`open_regular_file`].
    ///
    /// [`open_regular_file`]: super::open_regular_file
    pub fn load(&self, path: &Path) -> Result<LoadedAgent, HostError> {
        let failed = |source| HostError::ReadAgent {
            path: path.to_path_buf(),
            source,
        };
        let name = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "agent".to_string());
        let mut file = super::regular_file::open_regular_file(path).map_err(failed)?;
        // Taken before reading: a write during the read changes the file's times, so a
        // digest remembered under these is never the digest of other bytes.
        let meta = file.metadata().map_err(failed)?;
        let remembered = self
            .cache
            .as_ref()
            .and_then(|cache| Some((cache, cache.known_digest(&meta)?)));
        if let Some((cache, digest)) = remembered
            && let Some(component) = cache.load(&self.engine, &digest)
        {
            let bytes = AgentBytes::unread(file, path.to_path_buf(), digest);
            return self.prepare(path, &name, digest, component, true, bytes);
        }
        let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
        file.read_to_end(&mut bytes).map_err(failed)?;
        // The cache was just asked for the remembered digest: not twice.
        let tried = remembered.map(|(_, digest)| digest);
        let agent = self.load_checked(path, &name, bytes, tried)?;
        if let Some(cache) = &self.cache {
            cache.remember_digest(&meta, &agent.bytes.digest());
        }
        Ok(agent)
    }

    /// Like [`Runtime::load`] for bytes already in memory; `path` only names them in
    /// errors.
    pub fn load_bytes(
        &self,
        path: &Path,
        name: &str,
        bytes: &[u8],
    ) -> Result<LoadedAgent, HostError> {
        self.load_owned(path, name, bytes.to_vec())
    }

    /// Like [`Runtime::load_bytes`], keeping `bytes` rather than a copy.
    pub(crate) fn load_owned(
        &self,
        path: &Path,
        name: &str,
        bytes: Vec<u8>,
    ) -> Result<LoadedAgent, HostError> {
        self.load_checked(path, name, bytes, None)
    }

    /// Checks, hashes and compiles `bytes`, or loads their code from the cache unless
    /// the cache already missed for their digest (`tried`).
    fn load_checked(
        &self,
        path: &Path,
        name: &str,
        bytes: Vec<u8>,
        tried: Option<[u8; 32]>,
    ) -> Result<LoadedAgent, HostError> {
        if !bytes.starts_with(b"\0asm") {
            return Err(HostError::NotWasm {
                path: path.to_path_buf(),
            });
        }
        if bytes.starts_with(&CORE_MODULE_HEADER) {
            return Err(HostError::CoreModule {
                path: path.to_path_buf(),
            });
        }
        let raw_digest: [u8; 32] = Sha256::digest(&bytes).into();
        let cached = self
            .cache
            .as_ref()
            .filter(|_| tried != Some(raw_digest))
            .and_then(|c| c.load(&self.engine, &raw_digest));
        let from_cache = cached.is_some();
        let component = match cached {
            Some(component) => component,
            None => {
                if let Some(notice) = &self.on_compile {
                    notice(path, u64::try_from(bytes.len()).unwrap_or(u64::MAX));
                }
                let component = Component::new(&self.engine, &bytes).map_err(|e| {
                    HostError::InvalidComponent {
                        path: path.to_path_buf(),
                        reason: format!("{e:#}"),
                    }
                })?;
                if let Some(cache) = &self.cache {
                    cache.store(&raw_digest, &component);
                }
                component
            }
        };
        let bytes = AgentBytes::read(bytes, raw_digest);
        self.prepare(path, name, raw_digest, component, from_cache, bytes)
    }

    /// Links `component` (the component `digest` names) for instantiation.
    fn prepare(
        &self,
        path: &Path,
        name: &str,
        digest: [u8; 32],
        component: Component,
        from_cache: bool,
        bytes: AgentBytes,
    ) -> Result<LoadedAgent, HostError> {
        let wrong_world = |e: wasmtime::Error| HostError::WrongWorld {
            path: path.to_path_buf(),
            reason: format!("{e:#}"),
        };
        let instance_pre = self
            .linker
            .instantiate_pre(&component)
            .map_err(wrong_world)?;
        let pre = AgentPre::new(instance_pre).map_err(wrong_world)?;
        Ok(LoadedAgent {
            name: name.to_string(),
            digest: hex(&digest),
            pre,
            from_cache,
            bytes: Arc::new(bytes),
        })
    }
}

/// Links idem's own interfaces of the world, each for the store's [`IdemView`](super::view::IdemView).
fn add_idem_to_linker(linker: &mut Linker<InstanceState>) -> wasmtime::Result<()> {
    fn view(s: &mut InstanceState) -> crate::runtime::view::IdemCtxView<'_> {
        crate::runtime::view::IdemView::idem(s)
    }
    idem_wit::agent::types::add_to_linker::<_, HasIdem>(linker, view)?;
    idem_wit::agent::once::add_to_linker::<_, HasIdem>(linker, view)?;
    idem_wit::agent::progress::add_to_linker::<_, HasIdem>(linker, view)?;
    idem_wit::agent::run_info::add_to_linker::<_, HasIdem>(linker, view)?;
    idem_wit::agent::outbound::add_to_linker::<_, HasIdem>(linker, view)?;
    idem_wit::agent::waits::add_to_linker::<_, HasIdem>(linker, view)?;
    idem_wit::agent::children::add_to_linker::<_, HasIdem>(linker, view)?;
    idem_wit::agent::usage::add_to_linker::<_, HasIdem>(linker, view)?;
    idem_wit::agent::live::add_to_linker::<_, HasIdem>(linker, view)?;
    Ok(())
}
