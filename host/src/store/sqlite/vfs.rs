//! One write per WAL frame: a SQLite VFS over another (the default, `unix`) that joins
//! the two writes SQLite makes for each frame of its write-ahead log into one.
//!
//! SQLite writes a WAL frame as two `pwrite`s: the frame's 24-byte header, then the
//! page right after it. A write costs mostly its system call and the file system's
//! bookkeeping, not its bytes, and a step writes three to four frames: half of its
//! writes were headers. Joined, a durable step under `sync normal` takes ~2.3 µs
//! (6.5 %) less, and the busiest writer, SQLite's one connection, has that much less
//! to do per step (BENCHMARKS.md, 2026-12-05, session 12).
//!
//! The one rule, which keeps the file exactly what SQLite wrote: a 24-byte write to a
//! WAL file is *held*, not written, until the file's next call. If that call is a write
//! that starts where the held bytes end, both go out as one write; any other call (a
//! read, sync, truncate, size query, lock, file control or close) first writes the held
//! bytes as they were. So every call but the very next write sees the file as if the
//! held write had happened, and that write sees it too once it has. Nobody else looks
//! in between: a frame becomes visible to other connections only when SQLite publishes
//! it in the WAL index, after the frame's page was written, and SQLite makes every
//! frame of a transaction with the file's write lock held. A held write that then
//! fails is reported by the call that wrote it, the frame's page write, and SQLite
//! fails the transaction as it would for the page itself.
//!
//! Every other file (the database, the WAL index) is the underlying VFS's own, opened
//! into the same allocation with its own methods: nothing stands between SQLite and it.
//!
//! The store opens every connection through [`coalescing`]; the power-loss tests put
//! their simulated disk under it, so they check the store as it runs.

// SQLite's VFS is a C interface: SQLite calls these functions with pointers it owns.
#![allow(unsafe_code)]

use std::collections::BTreeMap;
use std::ffi::{CString, c_char, c_int, c_void};
use std::ptr;
use std::sync::{Mutex, PoisonError};

use rusqlite::ffi;

/// The size of a WAL frame's header, the one write that is held.
const HOLD: usize = 24;

/// The name of the coalescing VFS over `under` (a registered VFS, or SQLite's default
/// for `None`), registered on first use and kept for the life of the process.
pub(super) fn coalescing(under: Option<&str>) -> rusqlite::Result<String> {
    static REGISTERED: Mutex<BTreeMap<Option<String>, String>> = Mutex::new(BTreeMap::new());
    let mut registered = REGISTERED.lock().unwrap_or_else(PoisonError::into_inner);
    let key = under.map(str::to_owned);
    if let Some(name) = registered.get(&key) {
        return Ok(name.clone());
    }
    let name = match under {
        None => "idem-wal".to_owned(),
        Some(under) => format!("idem-wal:{under}"),
    };
    register(under, &name)?;
    registered.insert(key, name.clone());
    Ok(name)
}

fn failure(message: String) -> rusqlite::Error {
    rusqlite::Error::SqliteFailure(ffi::Error::new(ffi::SQLITE_ERROR), Some(message))
}

fn nul_in(name: &str) -> rusqlite::Error {
    failure(format!("SQLite VFS name {name:?} holds a NUL byte"))
}

/// Our `sqlite3_vfs`. SQLite hands its functions a pointer to `base`, the first field
/// of a `#[repr(C)]` struct, so the same pointer reaches the rest.
#[repr(C)]
struct Vfs {
    base: ffi::sqlite3_vfs,
    /// The VFS that does the work. Registered VFSes outlive this one: SQLite's own
    /// live as long as the process, and a test's disk outlives every store on it.
    under: *mut ffi::sqlite3_vfs,
    /// `base.zName` points into it.
    name: CString,
}

fn register(under_name: Option<&str>, name: &str) -> rusqlite::Result<()> {
    let under_c = under_name
        .map(CString::new)
        .transpose()
        .map_err(|_| nul_in(under_name.unwrap_or_default()))?;
    // SAFETY: `sqlite3_initialize` may be called any number of times from any thread;
    // `sqlite3_vfs_find` takes null (the default) or a NUL-terminated name and returns
    // a registered VFS or null.
    let under = unsafe {
        let rc = ffi::sqlite3_initialize();
        if rc != ffi::SQLITE_OK {
            return Err(rusqlite::Error::SqliteFailure(ffi::Error::new(rc), None));
        }
        ffi::sqlite3_vfs_find(under_c.as_ref().map_or(ptr::null(), |c| c.as_ptr()))
    };
    if under.is_null() {
        return Err(failure(format!(
            "no SQLite VFS named {:?}",
            under_name.unwrap_or("(default)")
        )));
    }
    // SAFETY: `under` is a registered VFS (above), alive for the process.
    let (version, os_file, max_path) =
        unsafe { ((*under).iVersion, (*under).szOsFile, (*under).mxPathname) };
    if version < 2 {
        return Err(failure(format!(
            "SQLite VFS {name:?} needs a VFS of version 2 or later under it"
        )));
    }
    let size = usize::try_from(os_file)
        .ok()
        .and_then(|os_file| c_int::try_from(REAL_OFFSET + os_file).ok())
        .ok_or_else(|| {
            failure(format!(
                "SQLite VFS {:?} gives its files a size out of range ({os_file} bytes)",
                under_name.unwrap_or("(default)")
            ))
        })?;
    let name_c = CString::new(name).map_err(|_| nul_in(name))?;
    let vfs = Box::leak(Box::new(Vfs {
        base: ffi::sqlite3_vfs {
            iVersion: 2,
            szOsFile: size,
            mxPathname: max_path,
            pNext: ptr::null_mut(),
            zName: ptr::null(),
            pAppData: ptr::null_mut(),
            xOpen: Some(x_open),
            xDelete: Some(x_delete),
            xAccess: Some(x_access),
            xFullPathname: Some(x_full_pathname),
            xDlOpen: Some(x_dl_open),
            xDlError: Some(x_dl_error),
            xDlSym: Some(x_dl_sym),
            xDlClose: Some(x_dl_close),
            xRandomness: Some(x_randomness),
            xSleep: Some(x_sleep),
            xCurrentTime: Some(x_current_time),
            xGetLastError: Some(x_get_last_error),
            xCurrentTimeInt64: Some(x_current_time_int64),
            xSetSystemCall: None,
            xGetSystemCall: None,
            xNextSystemCall: None,
        },
        under,
        name: name_c,
    }));
    vfs.base.zName = vfs.name.as_ptr();
    // SAFETY: `vfs` is leaked, so it stays valid for as long as SQLite may use it;
    // `zName` points into it.
    let rc = unsafe { ffi::sqlite3_vfs_register(&raw mut vfs.base, 0) };
    if rc != ffi::SQLITE_OK {
        return Err(rusqlite::Error::SqliteFailure(ffi::Error::new(rc), None));
    }
    Ok(())
}

/// A WAL file as SQLite sees it: this header, then the underlying VFS's file at
/// [`REAL_OFFSET`] of the `szOsFile` bytes SQLite allocated.
#[repr(C)]
struct WalFile {
    base: ffi::sqlite3_file,
    /// Whether a write is held, where it goes, and its bytes.
    holding: bool,
    held_at: ffi::sqlite3_int64,
    held: [u8; HOLD],
    /// Where a held header and its page are joined; kept for the next frame.
    joined: Vec<u8>,
}

/// Where the underlying file starts in a [`WalFile`]'s allocation: after the header,
/// aligned for anything the underlying VFS keeps there.
const REAL_OFFSET: usize = std::mem::size_of::<WalFile>().next_multiple_of(16);

/// The VFS under `vfs`.
///
/// # Safety
/// `vfs` must be one of ours (SQLite passes each VFS its own pointer).
unsafe fn under(vfs: *mut ffi::sqlite3_vfs) -> *mut ffi::sqlite3_vfs {
    // SAFETY: per the contract, `vfs` is the `base` of a leaked `Vfs`.
    unsafe { (*vfs.cast::<Vfs>()).under }
}

unsafe extern "C" fn x_open(
    vfs: *mut ffi::sqlite3_vfs,
    name: ffi::sqlite3_filename,
    file: *mut ffi::sqlite3_file,
    flags: c_int,
    out_flags: *mut c_int,
) -> c_int {
    // SAFETY (whole body): SQLite passes our VFS and a `szOsFile`-byte allocation for
    // the file, which our `szOsFile` makes large enough for a `WalFile` followed by
    // the underlying file. A file whose `pMethods` is null is never used or closed.
    unsafe {
        let under = under(vfs);
        let Some(open) = (*under).xOpen else {
            return ffi::SQLITE_CANTOPEN;
        };
        (*file).pMethods = ptr::null();
        if flags & ffi::SQLITE_OPEN_WAL == 0 {
            // Not a WAL: the underlying file itself, at the start of the allocation.
            return open(under, name, file, flags, out_flags);
        }
        let real = real(file);
        (*real).pMethods = ptr::null();
        let rc = open(under, name, real, flags, out_flags);
        if rc != ffi::SQLITE_OK {
            // A VFS may leave methods set on a failed open, and expects them closed;
            // SQLite will not, as the file it sees has none.
            if !(*real).pMethods.is_null()
                && let Some(close) = (*(*real).pMethods).xClose
            {
                close(real);
            }
            return rc;
        }
        ptr::write(
            file.cast::<WalFile>(),
            WalFile {
                base: ffi::sqlite3_file {
                    pMethods: &raw const WAL_METHODS,
                },
                holding: false,
                held_at: 0,
                held: [0; HOLD],
                joined: Vec::new(),
            },
        );
        ffi::SQLITE_OK
    }
}

/// The underlying file inside a WAL file's allocation.
///
/// # Safety
/// `file` must be an allocation of our `szOsFile` bytes.
unsafe fn real(file: *mut ffi::sqlite3_file) -> *mut ffi::sqlite3_file {
    // SAFETY: the allocation is `REAL_OFFSET` + the underlying file's size long.
    unsafe { file.cast::<u8>().add(REAL_OFFSET).cast() }
}

/// The WAL file SQLite handed back.
///
/// # Safety
/// `file` must be a WAL file `x_open` opened (only those have [`WAL_METHODS`]).
unsafe fn wal<'a>(file: *mut ffi::sqlite3_file) -> &'a mut WalFile {
    // SAFETY: per the contract; SQLite calls a file's methods from one thread at a
    // time, so this is the only reference.
    unsafe { &mut *file.cast::<WalFile>() }
}

/// Calls the underlying file's method, or answers `missing` if it has none.
macro_rules! real_call {
    ($file:expr, $method:ident, $missing:expr $(, $arg:expr)*) => {{
        let real = real($file);
        match (*(*real).pMethods).$method {
            Some(f) => f(real $(, $arg)*),
            None => $missing,
        }
    }};
}

/// Writes what is held, if anything: before any call but the write that may join it.
///
/// # Safety
/// As for [`wal`].
unsafe fn flush(file: *mut ffi::sqlite3_file) -> c_int {
    // SAFETY (whole body): an open WAL file; `held` is `HOLD` bytes long.
    unsafe {
        let wal = wal(file);
        if !wal.holding {
            return ffi::SQLITE_OK;
        }
        wal.holding = false;
        let (at, held) = (wal.held_at, wal.held);
        real_call!(
            file,
            xWrite,
            ffi::SQLITE_IOERR_WRITE,
            held.as_ptr().cast::<c_void>(),
            HOLD as c_int,
            at
        )
    }
}

/// Flushes, then makes the call, unless the flush failed.
macro_rules! flushed {
    ($file:expr, $method:ident, $missing:expr $(, $arg:expr)*) => {{
        let rc = flush($file);
        if rc != ffi::SQLITE_OK {
            return rc;
        }
        real_call!($file, $method, $missing $(, $arg)*)
    }};
}

static WAL_METHODS: ffi::sqlite3_io_methods = ffi::sqlite3_io_methods {
    // Version 1: SQLite keeps its shared memory (version 2) on the database file and
    // maps only the database into memory (version 3), never a WAL.
    iVersion: 1,
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
    xShmMap: None,
    xShmLock: None,
    xShmBarrier: None,
    xShmUnmap: None,
    xFetch: None,
    xUnfetch: None,
};

unsafe extern "C" fn x_write(
    file: *mut ffi::sqlite3_file,
    buf: *const c_void,
    amount: c_int,
    offset: ffi::sqlite3_int64,
) -> c_int {
    // SAFETY (whole body): an open WAL file; `buf` holds `amount` bytes (SQLite's).
    unsafe {
        let Ok(len) = usize::try_from(amount) else {
            return ffi::SQLITE_IOERR_WRITE;
        };
        let wal = wal(file);
        if wal.holding
            && offset == wal.held_at + HOLD as ffi::sqlite3_int64
            && let Ok(joined_len) = c_int::try_from(HOLD + len)
        {
            wal.holding = false;
            wal.joined.clear();
            wal.joined.extend_from_slice(&wal.held);
            wal.joined
                .extend_from_slice(std::slice::from_raw_parts(buf.cast::<u8>(), len));
            let (joined, at) = (wal.joined.as_ptr().cast::<c_void>(), wal.held_at);
            return real_call!(
                file,
                xWrite,
                ffi::SQLITE_IOERR_WRITE,
                joined,
                joined_len,
                at
            );
        }
        let rc = flush(file);
        if rc != ffi::SQLITE_OK {
            return rc;
        }
        if len == HOLD {
            let wal = self::wal(file);
            wal.held
                .copy_from_slice(std::slice::from_raw_parts(buf.cast::<u8>(), HOLD));
            wal.held_at = offset;
            wal.holding = true;
            return ffi::SQLITE_OK;
        }
        real_call!(file, xWrite, ffi::SQLITE_IOERR_WRITE, buf, amount, offset)
    }
}

unsafe extern "C" fn x_close(file: *mut ffi::sqlite3_file) -> c_int {
    // SAFETY (whole body): SQLite closes each file it opened once, and never uses it
    // again: the `WalFile` is dropped here.
    unsafe {
        let flushed = flush(file);
        let closed = real_call!(file, xClose, ffi::SQLITE_OK);
        ptr::drop_in_place(file.cast::<WalFile>());
        (*file).pMethods = ptr::null();
        if flushed != ffi::SQLITE_OK {
            flushed
        } else {
            closed
        }
    }
}

unsafe extern "C" fn x_read(
    file: *mut ffi::sqlite3_file,
    buf: *mut c_void,
    amount: c_int,
    offset: ffi::sqlite3_int64,
) -> c_int {
    // SAFETY: an open WAL file; SQLite's buffer and sizes passed through.
    unsafe { flushed!(file, xRead, ffi::SQLITE_IOERR_READ, buf, amount, offset) }
}

unsafe extern "C" fn x_truncate(file: *mut ffi::sqlite3_file, size: ffi::sqlite3_int64) -> c_int {
    // SAFETY: an open WAL file.
    unsafe { flushed!(file, xTruncate, ffi::SQLITE_IOERR_TRUNCATE, size) }
}

unsafe extern "C" fn x_sync(file: *mut ffi::sqlite3_file, flags: c_int) -> c_int {
    // SAFETY: an open WAL file.
    unsafe { flushed!(file, xSync, ffi::SQLITE_IOERR_FSYNC, flags) }
}

unsafe extern "C" fn x_file_size(
    file: *mut ffi::sqlite3_file,
    size: *mut ffi::sqlite3_int64,
) -> c_int {
    // SAFETY: an open WAL file; `size` is SQLite's out-parameter.
    unsafe { flushed!(file, xFileSize, ffi::SQLITE_IOERR_FSTAT, size) }
}

unsafe extern "C" fn x_lock(file: *mut ffi::sqlite3_file, level: c_int) -> c_int {
    // SAFETY: an open WAL file.
    unsafe { flushed!(file, xLock, ffi::SQLITE_IOERR_LOCK, level) }
}

unsafe extern "C" fn x_unlock(file: *mut ffi::sqlite3_file, level: c_int) -> c_int {
    // SAFETY: an open WAL file.
    unsafe { flushed!(file, xUnlock, ffi::SQLITE_IOERR_UNLOCK, level) }
}

unsafe extern "C" fn x_check_reserved_lock(file: *mut ffi::sqlite3_file, out: *mut c_int) -> c_int {
    // SAFETY: an open WAL file; `out` is SQLite's out-parameter.
    unsafe {
        flushed!(
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
    // SAFETY: an open WAL file; `arg` is whatever SQLite passes for `op`, handed on.
    unsafe { flushed!(file, xFileControl, ffi::SQLITE_NOTFOUND, op, arg) }
}

unsafe extern "C" fn x_sector_size(file: *mut ffi::sqlite3_file) -> c_int {
    // SAFETY: an open WAL file. A property of the device: nothing to flush for it.
    unsafe { real_call!(file, xSectorSize, 4096) }
}

unsafe extern "C" fn x_device_characteristics(file: *mut ffi::sqlite3_file) -> c_int {
    // SAFETY: an open WAL file. A property of the device: nothing to flush for it.
    unsafe { real_call!(file, xDeviceCharacteristics, 0) }
}

// The rest of the VFS is the underlying one's, called with its own pointer (a VFS may
// read its own state through it).

/// Calls the underlying VFS's method, or answers `missing` if it has none.
macro_rules! under_call {
    ($vfs:expr, $method:ident, $missing:expr $(, $arg:expr)*) => {{
        let under = under($vfs);
        match (*under).$method {
            Some(f) => f(under $(, $arg)*),
            None => $missing,
        }
    }};
}

unsafe extern "C" fn x_delete(
    vfs: *mut ffi::sqlite3_vfs,
    name: *const c_char,
    sync_dir: c_int,
) -> c_int {
    // SAFETY: our VFS; SQLite's arguments passed on.
    unsafe { under_call!(vfs, xDelete, ffi::SQLITE_IOERR_DELETE, name, sync_dir) }
}

unsafe extern "C" fn x_access(
    vfs: *mut ffi::sqlite3_vfs,
    name: *const c_char,
    flags: c_int,
    out: *mut c_int,
) -> c_int {
    // SAFETY: our VFS; SQLite's arguments passed on.
    unsafe { under_call!(vfs, xAccess, ffi::SQLITE_IOERR_ACCESS, name, flags, out) }
}

unsafe extern "C" fn x_full_pathname(
    vfs: *mut ffi::sqlite3_vfs,
    name: *const c_char,
    size: c_int,
    out: *mut c_char,
) -> c_int {
    // SAFETY: our VFS; SQLite's arguments passed on.
    unsafe { under_call!(vfs, xFullPathname, ffi::SQLITE_CANTOPEN, name, size, out) }
}

unsafe extern "C" fn x_dl_open(vfs: *mut ffi::sqlite3_vfs, name: *const c_char) -> *mut c_void {
    // SAFETY: our VFS; SQLite's arguments passed on.
    unsafe { under_call!(vfs, xDlOpen, ptr::null_mut(), name) }
}

unsafe extern "C" fn x_dl_error(vfs: *mut ffi::sqlite3_vfs, size: c_int, out: *mut c_char) {
    // SAFETY: our VFS; SQLite's arguments passed on.
    unsafe { under_call!(vfs, xDlError, (), size, out) }
}

type Symbol = unsafe extern "C" fn(*mut ffi::sqlite3_vfs, *mut c_void, *const c_char);

unsafe extern "C" fn x_dl_sym(
    vfs: *mut ffi::sqlite3_vfs,
    handle: *mut c_void,
    symbol: *const c_char,
) -> Option<Symbol> {
    // SAFETY: our VFS; SQLite's arguments passed on.
    unsafe { under_call!(vfs, xDlSym, None, handle, symbol) }
}

unsafe extern "C" fn x_dl_close(vfs: *mut ffi::sqlite3_vfs, handle: *mut c_void) {
    // SAFETY: our VFS; SQLite's arguments passed on.
    unsafe { under_call!(vfs, xDlClose, (), handle) }
}

unsafe extern "C" fn x_randomness(
    vfs: *mut ffi::sqlite3_vfs,
    size: c_int,
    out: *mut c_char,
) -> c_int {
    // SAFETY: our VFS; SQLite's arguments passed on.
    unsafe { under_call!(vfs, xRandomness, 0, size, out) }
}

unsafe extern "C" fn x_sleep(vfs: *mut ffi::sqlite3_vfs, micros: c_int) -> c_int {
    // SAFETY: our VFS; SQLite's arguments passed on.
    unsafe { under_call!(vfs, xSleep, 0, micros) }
}

unsafe extern "C" fn x_current_time(vfs: *mut ffi::sqlite3_vfs, out: *mut f64) -> c_int {
    // SAFETY: our VFS; SQLite's arguments passed on.
    unsafe { under_call!(vfs, xCurrentTime, ffi::SQLITE_ERROR, out) }
}

unsafe extern "C" fn x_get_last_error(
    vfs: *mut ffi::sqlite3_vfs,
    size: c_int,
    out: *mut c_char,
) -> c_int {
    // SAFETY: our VFS; SQLite's arguments passed on.
    unsafe { under_call!(vfs, xGetLastError, 0, size, out) }
}

unsafe extern "C" fn x_current_time_int64(
    vfs: *mut ffi::sqlite3_vfs,
    out: *mut ffi::sqlite3_int64,
) -> c_int {
    // SAFETY: our VFS (whose underlying VFS is of version 2 or later, `register`);
    // SQLite's arguments passed on.
    unsafe { under_call!(vfs, xCurrentTimeInt64, ffi::SQLITE_ERROR, out) }
}

#[cfg(test)]
#[path = "vfs_tests.rs"]
mod tests;
