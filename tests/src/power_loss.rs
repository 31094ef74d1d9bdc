//! A simulated disk for power-loss tests: a SQLite VFS over the default one (`unix`)
//! that knows, for every file, what has been made durable, and can cut the power.
//!
//! Every call goes through to the real file, so SQLite behaves as it does on a real
//! disk. What the shim adds:
//!
//! - **What survives.** At every completed `xSync` of a file it copies the file's whole
//!   content as the file's *durable image*: what `fsync` promises is on the platter.
//!   A file that existed before the VFS first opened it (in this "boot") is durable as
//!   found. A file created and never synced has no image, and after a power cut it is
//!   gone: the stricter of the two models (gone, or there and empty), and the one POSIX
//!   allows, since neither its data nor its directory entry was ever synced (SQLite's
//!   `unix` VFS syncs the directory at a new WAL's or journal's first sync, which is
//!   when the file gets its first image here). A deletion is taken as durable at once:
//!   SQLite deletes only a WAL it has checkpointed into a synced database, and a
//!   rollback journal whose transaction it committed; this store runs in WAL mode.
//!   Unsynced writes never survive, none of them: of everything a power loss may do to
//!   unsynced data, this loses the most.
//! - **The cut.** [`PowerLossVfs::arm`] names the completed sync or write after which
//!   the power goes; [`PowerLossVfs::cut_now`] cuts at once. From the cut on, every
//!   read, write, sync, truncate, size query, open, delete and shared-memory mapping
//!   fails with an I/O error, as on a machine that is gone, while closes and unlocks go
//!   through, so that the dead connection can be dropped.
//! - **The reboot.** [`PowerLossVfs::reboot`], once every file opened through the VFS is
//!   closed, writes each file's durable image back (or removes the file), and starts a
//!   new "boot": what is on disk is then durable, and nothing is cut.
//! - **Counts.** Completed syncs and writes, and the WAL frames written, per committed
//!   transaction ([`PowerLossVfs::take_counts`]): the bench quotes frames per step
//!   from them.
//!
//! The `-shm` file is the WAL index, mapped into memory and never synced by SQLite; it
//! is left as the cut found it. SQLite rebuilds it from the WAL at the first open after
//! a crash (the first connection takes the `DMS` lock and truncates it), as it does
//! after a real one.
//!
//! This is test code: it lives in `idem-test-artifacts`, a dev-dependency only, so no
//! `idem` binary ever contains it. The store reaches it through the hidden
//! `OpenOptions::vfs`.

// The VFS is a C interface: SQLite calls these functions with pointers it owns.
#![allow(unsafe_code)]
// Test support: a VFS that cannot register is a failed test, said at once.
#![allow(clippy::expect_used)]

use std::collections::HashMap;
use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::path::PathBuf;
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use rusqlite::ffi;

/// When the power goes: right after the `n`-th (from 1) sync or write that completes
/// after [`PowerLossVfs::arm`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CutAt {
    /// After the `n`-th completed `xSync` (the data it synced survives).
    Sync(u64),
    /// After the `n`-th completed `xWrite` (it reached the page cache only: lost unless
    /// a sync had followed, and none does).
    Write(u64),
}

/// What went through the VFS since it was registered, or since the last
/// [`PowerLossVfs::take_counts`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counts {
    /// Completed `xSync`s, of any file.
    pub syncs: u64,
    /// Completed `xWrite`s, of any file.
    pub writes: u64,
    /// WAL frames written (one per page a transaction wrote).
    pub wal_frames: u64,
    /// The frames of each committed WAL transaction, in commit order.
    pub transactions: Vec<u32>,
}

/// The VFS, registered with SQLite under [`PowerLossVfs::name`] until dropped.
pub struct PowerLossVfs {
    vfs: *mut ShimVfs,
    name: String,
}

// SAFETY: the handle only reaches `State` (a Mutex and atomics, shared with SQLite's
// threads by design) and the registration, which SQLite's own mutex guards.
unsafe impl Send for PowerLossVfs {}
// SAFETY: as for `Send`: every method goes through `State`'s locks.
unsafe impl Sync for PowerLossVfs {}

/// Our `sqlite3_vfs`: SQLite hands back a pointer to `base`, the first field of a
/// `#[repr(C)]` struct, so the same pointer reaches the rest.
#[repr(C)]
struct ShimVfs {
    base: ffi::sqlite3_vfs,
    /// The default VFS, which does the real work. SQLite's built-in VFSes live as long
    /// as the process.
    under: *mut ffi::sqlite3_vfs,
    /// `base.zName` points into it.
    name: CString,
    state: State,
}

/// Our `sqlite3_file`, laid out by SQLite in `szOsFile` bytes it allocates: this
/// header, then the real file's bytes at [`REAL_OFFSET`].
#[repr(C)]
struct ShimFile {
    base: ffi::sqlite3_file,
    /// The VFS this file was opened through; it outlives its files (`Drop` leaks the
    /// VFS rather than free it under an open file).
    vfs: *const ShimVfs,
    /// The file's path (from `Box::into_raw`), or null for SQLite's nameless temp
    /// files, which no crash needs to keep.
    path: *mut PathBuf,
    /// A WAL file, whose frames are counted.
    wal: bool,
    /// Frames of the WAL transaction being written.
    frames: u32,
}

/// Where the real file starts in a [`ShimFile`]'s allocation: after the header,
/// aligned for anything the real VFS keeps there.
const REAL_OFFSET: usize = std::mem::size_of::<ShimFile>().next_multiple_of(16);

/// A WAL frame's header: 24 bytes, written by SQLite in a write of its own before the
/// page; bytes 4..8 are the database size after the commit, non-zero only in a
/// transaction's last frame.
const WAL_FRAME_HEADER: c_int = 24;
/// The WAL file's own header, before the first frame.
const WAL_HEADER: i64 = 32;

/// Whether a write of `amount` bytes to a WAL, past its header, starts a frame: the
/// frame's header alone, or (through the store's VFS, which joins them) the header and
/// its page, a power of two from 512 to 65,536 bytes.
fn starts_frame(amount: c_int) -> bool {
    amount == WAL_FRAME_HEADER
        || u32::try_from(amount - WAL_FRAME_HEADER)
            .is_ok_and(|page| page.is_power_of_two() && (512..=65536).contains(&page))
}

struct State {
    /// Set at the cut, cleared at the reboot: read on every call, so an atomic.
    cut: AtomicBool,
    /// Whether syncs record durable images; the bench counts frames only.
    images: bool,
    /// Files opened through this VFS and not closed yet.
    open: AtomicU64,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    /// Per path: the durable image, or `None` for a file that would not exist after a
    /// cut. Every named file opened in this boot has an entry.
    durable: HashMap<PathBuf, Option<Vec<u8>>>,
    plan: Option<CutAt>,
    /// Completed syncs and writes since the plan was armed.
    since_armed: (u64, u64),
    counts: Counts,
}

impl State {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic cannot cross the FFI boundary (it would abort), so a poisoned lock
        // only means a test thread panicked holding it: the data is still whole.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn is_cut(&self) -> bool {
        self.cut.load(Ordering::SeqCst)
    }
}

impl PowerLossVfs {
    /// Registers a fresh VFS (its own name, its own files) over the default one, with
    /// durable images recorded at every sync.
    pub fn register() -> PowerLossVfs {
        Self::register_with(true)
    }

    /// Registers a fresh VFS that only counts (no durable images, no cuts): for the
    /// bench, where copying the WAL at every sync would cost more than the step.
    pub fn counting() -> PowerLossVfs {
        Self::register_with(false)
    }

    fn register_with(images: bool) -> PowerLossVfs {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let name = format!(
            "idem-power-loss-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        // SAFETY: `sqlite3_initialize` may be called any number of times, from any
        // thread; `sqlite3_vfs_find(NULL)` returns the default VFS, which SQLite never
        // frees, or null if there is none.
        let under = unsafe {
            assert_eq!(ffi::sqlite3_initialize(), ffi::SQLITE_OK, "SQLite starts");
            ffi::sqlite3_vfs_find(ptr::null())
        };
        assert!(!under.is_null(), "SQLite has a default VFS");
        // SAFETY: `under` is a live, never-freed VFS (above); the copy takes its
        // function pointers and `pAppData`, which its functions read through the VFS
        // pointer they are given (our copy hands them the same values).
        let mut base: ffi::sqlite3_vfs = unsafe { *under };
        let real_size = usize::try_from(base.szOsFile).expect("szOsFile is positive");
        base.szOsFile = c_int::try_from(REAL_OFFSET + real_size).expect("file size fits");
        base.pNext = ptr::null_mut();
        base.xOpen = Some(x_open);
        base.xDelete = Some(x_delete);
        let name_c = CString::new(name.clone()).expect("no NUL in the name");
        let shim = Box::into_raw(Box::new(ShimVfs {
            base,
            under,
            name: name_c,
            state: State {
                cut: AtomicBool::new(false),
                images,
                open: AtomicU64::new(0),
                inner: Mutex::default(),
            },
        }));
        // SAFETY: `shim` is a fresh allocation we own; `zName` points into its
        // `name`, which lives as long as it. Registering hands SQLite a pointer that
        // stays valid until `Drop` unregisters it.
        unsafe {
            (*shim).base.zName = (*shim).name.as_ptr();
            let rc = ffi::sqlite3_vfs_register(&raw mut (*shim).base, 0);
            assert_eq!(rc, ffi::SQLITE_OK, "the VFS registers");
        }
        PowerLossVfs { vfs: shim, name }
    }

    /// The name to open a database with (`OpenOptions::vfs`).
    pub fn name(&self) -> &str {
        &self.name
    }

    fn state(&self) -> &State {
        // SAFETY: `self.vfs` is our allocation, freed only in `Drop`.
        unsafe { &(*self.vfs).state }
    }

    /// Cuts the power right after the sync or write `at` names, counted from now.
    pub fn arm(&self, at: CutAt) {
        let mut inner = self.state().lock();
        inner.plan = Some(at);
        inner.since_armed = (0, 0);
    }

    /// Cuts the power now.
    pub fn cut_now(&self) {
        self.state().cut.store(true, Ordering::SeqCst);
    }

    /// Whether the power is cut.
    pub fn is_cut(&self) -> bool {
        self.state().is_cut()
    }

    /// Files opened through this VFS and not closed yet.
    pub fn open_files(&self) -> u64 {
        self.state().open.load(Ordering::SeqCst)
    }

    /// What went through since registering or the last take.
    pub fn take_counts(&self) -> Counts {
        std::mem::take(&mut self.state().lock().counts)
    }

    /// Completed syncs and writes since the plan was last armed.
    pub fn since_armed(&self) -> (u64, u64) {
        self.state().lock().since_armed
    }

    /// The machine comes back: every file holds its durable image again (or is gone),
    /// and a new boot begins with nothing cut. Fails if a file is still open through
    /// the VFS: a connection of the old boot must be gone first, or its in-process
    /// locks and WAL index would outlive the machine.
    pub fn reboot(&self) -> std::io::Result<()> {
        if !self.state().images {
            return Err(std::io::Error::other(
                "a counting VFS keeps no durable images to reboot from",
            ));
        }
        let open = self.open_files();
        if open != 0 {
            return Err(std::io::Error::other(format!(
                "{open} files are still open through {}",
                self.name
            )));
        }
        let mut inner = self.state().lock();
        for (path, image) in inner.durable.drain() {
            match image {
                Some(bytes) => std::fs::write(&path, bytes)?,
                None => match std::fs::remove_file(&path) {
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
                    _ => {}
                },
            }
        }
        inner.plan = None;
        inner.since_armed = (0, 0);
        self.state().cut.store(false, Ordering::SeqCst);
        Ok(())
    }
}

impl Drop for PowerLossVfs {
    fn drop(&mut self) {
        // SAFETY: unregistering a VFS we registered; SQLite takes its own mutex.
        unsafe {
            ffi::sqlite3_vfs_unregister(&raw mut (*self.vfs).base);
        }
        if self.open_files() == 0 {
            // SAFETY: unregistered, and no file refers to it any more: ours to free.
            drop(unsafe { Box::from_raw(self.vfs) });
        }
        // Otherwise a connection still uses it: leaked, never freed under it.
    }
}

/// The shim of the file SQLite handed us.
///
/// # Safety
/// `file` must be a `ShimFile` that `x_open` filled in (SQLite only calls the I/O
/// methods of files whose open succeeded).
unsafe fn shim<'a>(file: *mut ffi::sqlite3_file) -> &'a mut ShimFile {
    // SAFETY: per the contract above.
    unsafe { &mut *file.cast::<ShimFile>() }
}

/// The real file inside a shim's allocation.
///
/// # Safety
/// `file` must point to an allocation of our `szOsFile` bytes.
unsafe fn real(file: *mut ffi::sqlite3_file) -> *mut ffi::sqlite3_file {
    // SAFETY: the allocation is `REAL_OFFSET + real size` bytes long.
    unsafe { file.cast::<u8>().add(REAL_OFFSET).cast() }
}

/// The real file's methods.
///
/// # Safety
/// `real` must be a file the real VFS opened successfully.
unsafe fn methods<'a>(real: *mut ffi::sqlite3_file) -> &'a ffi::sqlite3_io_methods {
    // SAFETY: an open file's `pMethods` points to the real VFS's static table.
    unsafe { &*(*real).pMethods }
}

/// The VFS state of an open file.
///
/// # Safety
/// As for [`shim`].
unsafe fn state<'a>(file: *mut ffi::sqlite3_file) -> &'a State {
    // SAFETY: the VFS outlives its files (see `ShimFile::vfs`).
    unsafe { &(*shim(file).vfs).state }
}

/// Calls a real method, or fails with `missing` if the real VFS has none.
macro_rules! real_call {
    ($file:expr, $method:ident, $missing:expr $(, $arg:expr)*) => {{
        let real = real($file);
        match methods(real).$method {
            Some(f) => f(real $(, $arg)*),
            None => $missing,
        }
    }};
}

/// Reads a whole file through its real methods: its durable image at a sync.
///
/// # Safety
/// `file` must be an open shim.
unsafe fn read_whole(file: *mut ffi::sqlite3_file) -> Option<Vec<u8>> {
    // SAFETY (whole body): `file` is an open shim; the buffers passed are as long as
    // the sizes passed with them.
    unsafe {
        let mut size: ffi::sqlite3_int64 = 0;
        if real_call!(file, xFileSize, ffi::SQLITE_IOERR, &raw mut size) != ffi::SQLITE_OK {
            return None;
        }
        let mut bytes = vec![0u8; usize::try_from(size).ok()?];
        let mut at = 0usize;
        // xRead takes an int: read in chunks.
        while at < bytes.len() {
            let chunk = (bytes.len() - at).min(1 << 30);
            let rc = real_call!(
                file,
                xRead,
                ffi::SQLITE_IOERR,
                bytes.as_mut_ptr().add(at).cast::<c_void>(),
                c_int::try_from(chunk).ok()?,
                i64::try_from(at).ok()?
            );
            if rc != ffi::SQLITE_OK {
                return None;
            }
            at += chunk;
        }
        Some(bytes)
    }
}

static IO_METHODS: ffi::sqlite3_io_methods = ffi::sqlite3_io_methods {
    // Version 2: shared memory (WAL needs it), but no memory-mapped reads (`xFetch`),
    // which would read the file behind the shim's back.
    iVersion: 2,
    xClose: Some(x_close),
    xRead: Some(x_read),
    xWrite: Some(x_write),
    xTruncate: Some(x_truncate),
    xSync: Some(x_sync),
    xFileSize: Some(x_file_size),
    xLock: Some(x_lock),
    xUnlock: Some(x_unlock),
    xCheckReservedLock: Some(x_check_reserved_lock),
    xFileControl: Some(x_file_control),
    xSectorSize: Some(x_sector_size),
    xDeviceCharacteristics: Some(x_device_characteristics),
    xShmMap: Some(x_shm_map),
    xShmLock: Some(x_shm_lock),
    xShmBarrier: Some(x_shm_barrier),
    xShmUnmap: Some(x_shm_unmap),
    xFetch: None,
    xUnfetch: None,
};

unsafe extern "C" fn x_open(
    vfs: *mut ffi::sqlite3_vfs,
    name: ffi::sqlite3_filename,
    file: *mut ffi::sqlite3_file,
    flags: c_int,
    out_flags: *mut c_int,
) -> c_int {
    // SAFETY (whole body): SQLite passes our registered VFS (a `ShimVfs`, see
    // `ShimVfs::base`) and a `szOsFile`-byte allocation for the file; `name` is null
    // or a NUL-terminated path that outlives the file. A file whose `pMethods` stays
    // null is never used or closed by SQLite, so it is set last, on success.
    unsafe {
        let shim_vfs = vfs.cast::<ShimVfs>();
        let state = &(*shim_vfs).state;
        (*file).pMethods = ptr::null();
        if state.is_cut() {
            return ffi::SQLITE_IOERR;
        }
        let path = (!name.is_null())
            .then(|| PathBuf::from(CStr::from_ptr(name).to_string_lossy().into_owned()));
        let existed = match &path {
            Some(_) => {
                let mut exists: c_int = 0;
                let access = (*(*shim_vfs).under).xAccess;
                match access {
                    Some(f) => {
                        f(
                            (*shim_vfs).under,
                            name,
                            ffi::SQLITE_ACCESS_EXISTS,
                            &raw mut exists,
                        );
                    }
                    None => return ffi::SQLITE_IOERR,
                }
                exists != 0
            }
            None => false,
        };
        let real = real(file);
        (*real).pMethods = ptr::null();
        let Some(open) = (*(*shim_vfs).under).xOpen else {
            return ffi::SQLITE_IOERR;
        };
        let rc = open((*shim_vfs).under, name, real, flags, out_flags);
        if rc != ffi::SQLITE_OK {
            // A real VFS may leave methods set on failure: then the file is closed.
            if !(*real).pMethods.is_null()
                && let Some(close) = methods(real).xClose
            {
                close(real);
            }
            return rc;
        }
        ptr::write(
            file.cast::<ShimFile>(),
            ShimFile {
                base: ffi::sqlite3_file {
                    pMethods: ptr::null(),
                },
                vfs: shim_vfs,
                path: path
                    .clone()
                    .map_or(ptr::null_mut(), |p| Box::into_raw(Box::new(p))),
                wal: flags & ffi::SQLITE_OPEN_WAL != 0,
                frames: 0,
            },
        );
        if let Some(path) = path {
            // First open in this boot: a file that was there is durable as found (a
            // reboot wrote it back, or it predates the VFS); a new one is not.
            state.lock().durable.entry(path).or_insert_with(|| {
                if existed && state.images {
                    read_whole(file)
                } else if existed {
                    Some(Vec::new())
                } else {
                    None
                }
            });
        }
        state.open.fetch_add(1, Ordering::SeqCst);
        (*file).pMethods = &raw const IO_METHODS;
        ffi::SQLITE_OK
    }
}

unsafe extern "C" fn x_delete(
    vfs: *mut ffi::sqlite3_vfs,
    name: *const c_char,
    sync_dir: c_int,
) -> c_int {
    // SAFETY (whole body): `vfs` is our `ShimVfs` (see `x_open`); `name` is a
    // NUL-terminated path.
    unsafe {
        let shim_vfs = vfs.cast::<ShimVfs>();
        let state = &(*shim_vfs).state;
        if state.is_cut() {
            return ffi::SQLITE_IOERR_DELETE;
        }
        let mut inner = state.lock();
        let Some(delete) = (*(*shim_vfs).under).xDelete else {
            return ffi::SQLITE_IOERR_DELETE;
        };
        let rc = delete((*shim_vfs).under, name, sync_dir);
        if rc == ffi::SQLITE_OK || rc == ffi::SQLITE_IOERR_DELETE_NOENT {
            let path = PathBuf::from(CStr::from_ptr(name).to_string_lossy().into_owned());
            inner.durable.insert(path, None);
        }
        rc
    }
}

unsafe extern "C" fn x_close(file: *mut ffi::sqlite3_file) -> c_int {
    // SAFETY (whole body): SQLite closes each file it opened once; `path` came from
    // `Box::into_raw` in `x_open` and is freed here only.
    unsafe {
        let rc = real_call!(file, xClose, ffi::SQLITE_OK);
        let shim = shim(file);
        if !shim.path.is_null() {
            drop(Box::from_raw(shim.path));
            shim.path = ptr::null_mut();
        }
        state(file).open.fetch_sub(1, Ordering::SeqCst);
        rc
    }
}

unsafe extern "C" fn x_read(
    file: *mut ffi::sqlite3_file,
    buf: *mut c_void,
    amount: c_int,
    offset: ffi::sqlite3_int64,
) -> c_int {
    // SAFETY: an open shim, and SQLite's own buffer and sizes passed through.
    unsafe {
        if state(file).is_cut() {
            return ffi::SQLITE_IOERR_READ;
        }
        real_call!(file, xRead, ffi::SQLITE_IOERR_READ, buf, amount, offset)
    }
}

unsafe extern "C" fn x_write(
    file: *mut ffi::sqlite3_file,
    buf: *const c_void,
    amount: c_int,
    offset: ffi::sqlite3_int64,
) -> c_int {
    // SAFETY (whole body): an open shim; `buf` holds `amount` bytes (SQLite's).
    unsafe {
        let state = state(file);
        if state.is_cut() {
            return ffi::SQLITE_IOERR_WRITE;
        }
        // Held across the write, so that a sync's image never catches another
        // connection's write half-way.
        let mut inner = state.lock();
        let rc = real_call!(file, xWrite, ffi::SQLITE_IOERR_WRITE, buf, amount, offset);
        if rc != ffi::SQLITE_OK {
            return rc;
        }
        let shim = shim(file);
        if shim.wal && starts_frame(amount) && offset >= WAL_HEADER {
            let header = std::slice::from_raw_parts(buf.cast::<u8>(), 8);
            shim.frames += 1;
            inner.counts.wal_frames += 1;
            if header[4..8] != [0, 0, 0, 0] {
                inner.counts.transactions.push(shim.frames);
                shim.frames = 0;
            }
        }
        inner.counts.writes += 1;
        inner.since_armed.1 += 1;
        if inner.plan == Some(CutAt::Write(inner.since_armed.1)) {
            state.cut.store(true, Ordering::SeqCst);
        }
        rc
    }
}

unsafe extern "C" fn x_truncate(file: *mut ffi::sqlite3_file, size: ffi::sqlite3_int64) -> c_int {
    // SAFETY: an open shim.
    unsafe {
        let state = state(file);
        if state.is_cut() {
            return ffi::SQLITE_IOERR_TRUNCATE;
        }
        let _inner = state.lock();
        real_call!(file, xTruncate, ffi::SQLITE_IOERR_TRUNCATE, size)
    }
}

unsafe extern "C" fn x_sync(file: *mut ffi::sqlite3_file, flags: c_int) -> c_int {
    // SAFETY (whole body): an open shim.
    unsafe {
        let state = state(file);
        if state.is_cut() {
            return ffi::SQLITE_IOERR_FSYNC;
        }
        let mut inner = state.lock();
        let rc = real_call!(file, xSync, ffi::SQLITE_IOERR_FSYNC, flags);
        if rc != ffi::SQLITE_OK {
            return rc;
        }
        let shim = shim(file);
        if state.images && !shim.path.is_null() {
            let Some(image) = read_whole(file) else {
                return ffi::SQLITE_IOERR_FSYNC;
            };
            inner.durable.insert((*shim.path).clone(), Some(image));
        }
        inner.counts.syncs += 1;
        inner.since_armed.0 += 1;
        if inner.plan == Some(CutAt::Sync(inner.since_armed.0)) {
            state.cut.store(true, Ordering::SeqCst);
        }
        rc
    }
}

unsafe extern "C" fn x_file_size(
    file: *mut ffi::sqlite3_file,
    size: *mut ffi::sqlite3_int64,
) -> c_int {
    // SAFETY: an open shim; `size` is SQLite's out-parameter.
    unsafe {
        if state(file).is_cut() {
            return ffi::SQLITE_IOERR_FSTAT;
        }
        real_call!(file, xFileSize, ffi::SQLITE_IOERR_FSTAT, size)
    }
}

unsafe extern "C" fn x_lock(file: *mut ffi::sqlite3_file, level: c_int) -> c_int {
    // SAFETY: an open shim. Locks are process state, not disk state: they go through.
    unsafe { real_call!(file, xLock, ffi::SQLITE_IOERR_LOCK, level) }
}

unsafe extern "C" fn x_unlock(file: *mut ffi::sqlite3_file, level: c_int) -> c_int {
    // SAFETY: an open shim.
    unsafe { real_call!(file, xUnlock, ffi::SQLITE_IOERR_UNLOCK, level) }
}

unsafe extern "C" fn x_check_reserved_lock(file: *mut ffi::sqlite3_file, out: *mut c_int) -> c_int {
    // SAFETY: an open shim; `out` is SQLite's out-parameter.
    unsafe {
        real_call!(
            file,
            xCheckReservedLock,
            ffi::SQLITE_IOERR_CHECKRESERVEDLOCK,
            out
        )
    }
}

unsafe extern "C" fn x_file_control(
    file: *mut ffi::sqlite3_file,
    op: c_int,
    arg: *mut c_void,
) -> c_int {
    // SAFETY: an open shim; `arg` is whatever SQLite passes for `op`, handed on.
    unsafe { real_call!(file, xFileControl, ffi::SQLITE_NOTFOUND, op, arg) }
}

unsafe extern "C" fn x_sector_size(file: *mut ffi::sqlite3_file) -> c_int {
    // SAFETY: an open shim.
    unsafe { real_call!(file, xSectorSize, 4096) }
}

unsafe extern "C" fn x_device_characteristics(file: *mut ffi::sqlite3_file) -> c_int {
    // SAFETY: an open shim.
    unsafe { real_call!(file, xDeviceCharacteristics, 0) }
}

unsafe extern "C" fn x_shm_map(
    file: *mut ffi::sqlite3_file,
    page: c_int,
    size: c_int,
    extend: c_int,
    out: *mut *mut c_void,
) -> c_int {
    // SAFETY: an open shim; `out` is SQLite's out-parameter.
    unsafe {
        if state(file).is_cut() {
            return ffi::SQLITE_IOERR_SHMMAP;
        }
        real_call!(
            file,
            xShmMap,
            ffi::SQLITE_IOERR_SHMMAP,
            page,
            size,
            extend,
            out
        )
    }
}

unsafe extern "C" fn x_shm_lock(
    file: *mut ffi::sqlite3_file,
    offset: c_int,
    n: c_int,
    flags: c_int,
) -> c_int {
    // SAFETY: an open shim.
    unsafe { real_call!(file, xShmLock, ffi::SQLITE_IOERR_SHMLOCK, offset, n, flags) }
}

unsafe extern "C" fn x_shm_barrier(file: *mut ffi::sqlite3_file) {
    // SAFETY: an open shim.
    unsafe { real_call!(file, xShmBarrier, ()) }
}

unsafe extern "C" fn x_shm_unmap(file: *mut ffi::sqlite3_file, delete: c_int) -> c_int {
    // SAFETY: an open shim. Unmapping goes through even after the cut: the dead
    // connection must be able to let go.
    unsafe { real_call!(file, xShmUnmap, ffi::SQLITE_OK, delete) }
}
