//! A loopback TCP proxy between idem and PostgreSQL that a test drives: every
//! connection cut (FIN) or reset (RST) at once, added latency, a black hole (new
//! connections accepted and never answered, live ones silenced half-open), and a trap
//! that fires on the Nth commit (or any request) that goes through: cut before the
//! commit reaches the server, or after it did and before its answer comes back.
//!
//! It reads the client's side of the wire protocol just enough to know where each
//! request ends (a `Sync`, or a simple `Query`) and whether it commits: a simple query
//! `COMMIT`, or the execution of a prepared statement that writes a step's result
//! (`UPDATE steps ... result = ...`, idem's one-row and group commits). The server's
//! side is relayed as bytes. It runs on a runtime of its own; dropping it closes every
//! connection.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// What becomes of new connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Relayed to the server.
    Pass,
    /// Accepted, read, and never answered nor passed on: a server behind a black hole.
    BlackHole,
    /// Reset at once: a server whose port is closed.
    Refuse,
}

/// Which requests a [`Trap`] counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum On {
    /// Commits only.
    Commit,
    /// Any request (a `Sync` or a simple query).
    Request,
}

/// What a [`Trap`] does to the request it fires on, and its connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Then {
    /// The request never reaches the server; the connection is reset.
    CutBefore,
    /// The request reaches the server; its answer never comes back: reset.
    CutAfter,
    /// The request reaches the server; then the connection goes silent both ways and
    /// stays open (half-open), its server session left as it was.
    HoleAfter,
}

/// Fires once, on the request `skip` requests of kind `on` after it was armed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Trap {
    pub on: On,
    pub skip: u32,
    pub then: Then,
}

/// What to do to a live connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cut {
    None,
    /// Closed both ways (FIN).
    Close,
    /// Reset (RST to the client; the server side closed).
    Reset,
    /// Silenced both ways, left open.
    Hole,
}

#[derive(Default)]
struct State {
    mode: Option<Mode>,
    delay: Duration,
    trap: Option<Trap>,
    conns: Vec<(u64, watch::Sender<Cut>)>,
    next_id: u64,
}

/// Counts of what the proxy saw and did.
#[derive(Debug, Default)]
pub struct Stats {
    pub connections: AtomicU64,
    pub commits: AtomicU64,
    pub traps_fired: AtomicU64,
    pub commit_traps_fired: AtomicU64,
}

struct Shared {
    upstream: SocketAddr,
    state: Mutex<State>,
    stats: Stats,
}

impl Shared {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The proxy: listening on a loopback port of its own, relaying to `upstream`.
pub struct FaultProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl FaultProxy {
    pub fn start(upstream: SocketAddr) -> FaultProxy {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("fault-proxy")
            .enable_all()
            .build()
            .unwrap();
        let listener = runtime.block_on(TcpListener::bind("127.0.0.1:0")).unwrap();
        let addr = listener.local_addr().unwrap();
        let shared = Arc::new(Shared {
            upstream,
            state: Mutex::new(State {
                mode: Some(Mode::Pass),
                ..State::default()
            }),
            stats: Stats::default(),
        });
        runtime.spawn(accept(listener, Arc::clone(&shared)));
        FaultProxy {
            addr,
            shared,
            runtime: Some(runtime),
        }
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    pub fn stats(&self) -> &Stats {
        &self.shared.stats
    }

    /// What becomes of connections made from now on.
    pub fn set_mode(&self, mode: Mode) {
        self.shared.state().mode = Some(mode);
    }

    /// Latency added to every chunk relayed, either way.
    pub fn set_delay(&self, delay: Duration) {
        self.shared.state().delay = delay;
    }

    /// Arms `trap`, replacing one not yet fired.
    pub fn arm(&self, trap: Trap) {
        self.shared.state().trap = Some(trap);
    }

    /// Closes every live connection (FIN both ways).
    pub fn cut_all(&self) {
        self.cut(Cut::Close);
    }

    /// Resets every live connection.
    pub fn reset_all(&self) {
        self.cut(Cut::Reset);
    }

    /// Silences every live connection, leaving it open: a half-open connection, which
    /// never speaks again.
    pub fn hole_all(&self) {
        self.cut(Cut::Hole);
    }

    /// Faults end: connections relayed again, no delay, no trap. Connections already
    /// silenced stay so, as half-open ones do.
    pub fn heal(&self) {
        let mut state = self.shared.state();
        state.mode = Some(Mode::Pass);
        state.delay = Duration::ZERO;
        state.trap = None;
    }

    fn cut(&self, cut: Cut) {
        for (_, ctl) in &self.shared.state().conns {
            ctl.send_replace(cut);
        }
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

async fn accept(listener: TcpListener, shared: Arc<Shared>) {
    while let Ok((client, _)) = listener.accept().await {
        let _ = client.set_nodelay(true);
        shared.stats.connections.fetch_add(1, Ordering::Relaxed);
        let (id, ctl, mode) = {
            let mut state = shared.state();
            let id = state.next_id;
            state.next_id += 1;
            let (tx, rx) = watch::channel(Cut::None);
            state.conns.push((id, tx));
            (id, rx, state.mode.unwrap_or(Mode::Pass))
        };
        let shared = Arc::clone(&shared);
        tokio::spawn(async move {
            match mode {
                Mode::Refuse => reset(client),
                Mode::BlackHole => swallow(client, None).await,
                Mode::Pass => relay(client, &shared, ctl).await,
            }
            shared.state().conns.retain(|(c, _)| *c != id);
        });
    }
}

/// Closes `stream` with a reset.
fn reset(stream: TcpStream) {
    // Deprecated because a non-zero linger blocks the thread on drop; a zero one
    // resets at once, which is the point here.
    #[allow(deprecated)]
    let _ = stream.set_linger(Some(Duration::ZERO));
    drop(stream);
}

/// How long a silenced connection's server side stays open after its client hung up:
/// the server learns nothing of the hang-up meanwhile, as across a real black hole, and
/// its session (a transaction left open, its locks) lives on until its own timeouts end
/// it. Bounded, so that the shared server's connections are not used up.
const SERVER_HELD: Duration = Duration::from_secs(8);

/// Reads and drops whatever the client sends, answering nothing, until it hangs up;
/// `server` (if any) is never read, and kept open a while longer.
async fn swallow(mut client: TcpStream, server: Option<TcpStream>) {
    let mut buf = vec![0u8; 16 * 1024];
    while matches!(client.read(&mut buf).await, Ok(n) if n > 0) {}
    if let Some(server) = server {
        tokio::time::sleep(SERVER_HELD).await;
        drop(server);
    }
}

/// The client's messages, parsed as far as the proxy needs.
#[derive(Default)]
struct ClientStream {
    buf: Vec<u8>,
    started: bool,
    /// Names of prepared statements that commit a step's result.
    commit_statements: HashSet<String>,
    /// The request under way executes one of them.
    commit_pending: bool,
}

/// One whole message of the client's, and what it means.
struct Message {
    bytes: Vec<u8>,
    /// It ends a request.
    ends_request: bool,
    /// The request it ends (or starts, for a simple query) commits.
    commits: bool,
}

impl ClientStream {
    /// The next whole message in the buffer, if one is there.
    fn next(&mut self) -> Option<Message> {
        if !self.started {
            // The startup message (or an SSL/GSS request before it): no type byte.
            let len = u32::from_be_bytes(self.buf.get(..4)?.try_into().ok()?) as usize;
            if self.buf.len() < len || len < 8 {
                return None;
            }
            let bytes: Vec<u8> = self.buf.drain(..len).collect();
            let code = u32::from_be_bytes(bytes[4..8].try_into().unwrap());
            self.started = !(len == 8 && (code == 80_877_103 || code == 80_877_104));
            return Some(Message {
                bytes,
                ends_request: false,
                commits: false,
            });
        }
        let len = u32::from_be_bytes(self.buf.get(1..5)?.try_into().ok()?) as usize;
        if self.buf.len() < len + 1 {
            return None;
        }
        let bytes: Vec<u8> = self.buf.drain(..len + 1).collect();
        let body = &bytes[5..];
        let (mut ends_request, mut commits) = (false, false);
        match bytes[0] {
            b'P' => {
                let mut parts = body.split(|b| *b == 0);
                let name = String::from_utf8_lossy(parts.next().unwrap_or_default());
                let query = String::from_utf8_lossy(parts.next().unwrap_or_default());
                if commits_a_result(&query) {
                    self.commit_statements.insert(name.into_owned());
                } else {
                    self.commit_statements.remove(name.as_ref());
                }
            }
            b'B' => {
                let mut parts = body.split(|b| *b == 0);
                let _portal = parts.next();
                let statement = String::from_utf8_lossy(parts.next().unwrap_or_default());
                if self.commit_statements.contains(statement.as_ref()) {
                    self.commit_pending = true;
                }
            }
            b'S' => {
                ends_request = true;
                commits = std::mem::take(&mut self.commit_pending);
            }
            b'Q' => {
                let query = String::from_utf8_lossy(body.split(|b| *b == 0).next().unwrap());
                ends_request = true;
                commits = query
                    .split(';')
                    .any(|q| q.trim().eq_ignore_ascii_case("commit"));
            }
            _ => {}
        }
        Some(Message {
            bytes,
            ends_request,
            commits,
        })
    }
}

/// Whether a statement's text commits a step's result: idem's one-row and group
/// commits set `result` in `steps`.
fn commits_a_result(query: &str) -> bool {
    query.contains("UPDATE steps") && query.contains("result =")
}

/// What the trap (if armed) does to a request that ends with `message`.
fn spring(shared: &Shared, message: &Message) -> Option<Then> {
    if !message.ends_request {
        return None;
    }
    if message.commits {
        shared.stats.commits.fetch_add(1, Ordering::Relaxed);
    }
    let mut state = shared.state();
    let trap = state.trap.as_mut()?;
    if trap.on == On::Commit && !message.commits {
        return None;
    }
    if trap.skip > 0 {
        trap.skip -= 1;
        return None;
    }
    let then = trap.then;
    state.trap = None;
    shared.stats.traps_fired.fetch_add(1, Ordering::Relaxed);
    if message.commits {
        shared
            .stats
            .commit_traps_fired
            .fetch_add(1, Ordering::Relaxed);
    }
    Some(then)
}

/// Relays one connection until either side hangs up or a fault ends it.
async fn relay(mut client: TcpStream, shared: &Shared, mut ctl: watch::Receiver<Cut>) {
    let mut server = match TcpStream::connect(shared.upstream).await {
        Ok(server) => server,
        Err(_) => return reset(client),
    };
    let _ = server.set_nodelay(true);
    let mut parsed = ClientStream::default();
    let (mut up, mut down) = (vec![0u8; 16 * 1024], vec![0u8; 16 * 1024]);
    let ended = loop {
        let delay = shared.state().delay;
        tokio::select! {
            read = client.read(&mut up) => {
                let n = match read {
                    Ok(n) if n > 0 => n,
                    _ => break Cut::Close,
                };
                parsed.buf.extend_from_slice(&up[..n]);
                let mut out = Vec::new();
                let mut fired = None;
                while let Some(message) = parsed.next() {
                    match spring(shared, &message) {
                        Some(Then::CutBefore) => {
                            fired = Some(Then::CutBefore);
                            break;
                        }
                        Some(then) => {
                            out.extend_from_slice(&message.bytes);
                            fired = Some(then);
                            break;
                        }
                        None => out.extend_from_slice(&message.bytes),
                    }
                }
                if !delay.is_zero() {
                    tokio::time::sleep(delay).await;
                }
                if server.write_all(&out).await.is_err() {
                    break Cut::Close;
                }
                match fired {
                    None => {}
                    Some(Then::CutBefore | Then::CutAfter) => break Cut::Reset,
                    Some(Then::HoleAfter) => break Cut::Hole,
                }
            }
            read = server.read(&mut down) => {
                let n = match read {
                    Ok(n) if n > 0 => n,
                    _ => break Cut::Close,
                };
                if !delay.is_zero() {
                    tokio::time::sleep(delay).await;
                }
                if client.write_all(&down[..n]).await.is_err() {
                    break Cut::Close;
                }
            }
            changed = ctl.changed() => {
                let cut = *ctl.borrow_and_update();
                if changed.is_err() || cut != Cut::None {
                    break cut;
                }
            }
        }
    };
    match ended {
        Cut::Reset => {
            reset(client);
            drop(server);
        }
        Cut::Hole => swallow(client, Some(server)).await,
        Cut::None | Cut::Close => {
            let _ = client.shutdown().await;
            drop(server);
        }
    }
}
