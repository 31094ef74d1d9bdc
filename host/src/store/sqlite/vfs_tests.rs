//! Tests of the coalescing VFS's one rule, on a WAL file of its own: a held header is
//! joined to the write that follows it, and written as it was before anything else.

// The file is driven through SQLite's C interface, as SQLite drives it.
#![allow(unsafe_code, clippy::unwrap_used)]

use std::ffi::CString;
use std::path::Path;

use super::*;

/// A WAL file opened through the coalescing VFS over SQLite's default.
struct Wal {
    /// `szOsFile` bytes, 16-aligned, as SQLite would allocate them.
    file: Vec<u128>,
    _path: CString,
}

impl Wal {
    fn open(path: &Path) -> Wal {
        let name = coalescing(None).unwrap();
        let name = CString::new(name).unwrap();
        let path = CString::new(path.to_str().unwrap()).unwrap();
        // SAFETY: `vfs` is registered (above); the allocation is `szOsFile` bytes and
        // outlives the file, as does the path, which `_path` keeps.
        unsafe {
            let vfs = ffi::sqlite3_vfs_find(name.as_ptr());
            assert!(!vfs.is_null());
            let size = usize::try_from((*vfs).szOsFile).unwrap();
            let mut file = vec![0u128; size.div_ceil(16)];
            let flags = ffi::SQLITE_OPEN_WAL | ffi::SQLITE_OPEN_READWRITE | ffi::SQLITE_OPEN_CREATE;
            let mut out = 0;
            let rc = ((*vfs).xOpen.unwrap())(
                vfs,
                path.as_ptr(),
                file.as_mut_ptr().cast(),
                flags,
                &raw mut out,
            );
            assert_eq!(rc, ffi::SQLITE_OK);
            Wal { file, _path: path }
        }
    }

    fn ptr(&mut self) -> *mut ffi::sqlite3_file {
        self.file.as_mut_ptr().cast()
    }

    fn methods(&mut self) -> &'static ffi::sqlite3_io_methods {
        // SAFETY: an open file's methods are a static table.
        unsafe { &*(*self.ptr()).pMethods }
    }

    fn write(&mut self, bytes: &[u8], at: i64) {
        let write = self.methods().xWrite.unwrap();
        let len = c_int::try_from(bytes.len()).unwrap();
        // SAFETY: an open file; `bytes` is `len` bytes long.
        let rc = unsafe { write(self.ptr(), bytes.as_ptr().cast(), len, at) };
        assert_eq!(rc, ffi::SQLITE_OK);
    }

    fn read(&mut self, len: usize, at: i64) -> Vec<u8> {
        let read = self.methods().xRead.unwrap();
        let mut bytes = vec![0u8; len];
        let amount = c_int::try_from(len).unwrap();
        // SAFETY: an open file; `bytes` is `len` bytes long.
        let rc = unsafe { read(self.ptr(), bytes.as_mut_ptr().cast(), amount, at) };
        assert_eq!(rc, ffi::SQLITE_OK);
        bytes
    }

    fn size(&mut self) -> i64 {
        let size = self.methods().xFileSize.unwrap();
        let mut out = 0;
        // SAFETY: an open file; `out` is ours.
        assert_eq!(unsafe { size(self.ptr(), &raw mut out) }, ffi::SQLITE_OK);
        out
    }

    fn close(mut self) {
        let close = self.methods().xClose.unwrap();
        // SAFETY: an open file, closed once.
        assert_eq!(unsafe { close(self.ptr()) }, ffi::SQLITE_OK);
    }
}

#[test]
fn a_held_header_is_written_as_it_was_before_anything_else() {
    let dir = tempfile::tempdir().unwrap();
    // SQLite opens a WAL beside its database, whose file mode it copies.
    std::fs::write(dir.path().join("x.db"), b"").unwrap();
    let path = dir.path().join("x.db-wal");
    let mut wal = Wal::open(&path);
    // The header alone is not on disk yet; asking for the size writes it first.
    wal.write(&[b'a'; HOLD], 32);
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 0);
    assert_eq!(wal.size(), 32 + HOLD as i64);

    // A header, then a page that does not follow it: both land where they were sent.
    wal.write(&[b'b'; HOLD], 56);
    wal.write(&[b'c'; 100], 1000);
    assert_eq!(wal.read(HOLD, 56), [b'b'; HOLD]);
    assert_eq!(wal.read(100, 1000), [b'c'; 100]);

    // A header and the page right after it: one write, both in place.
    wal.write(&[b'd'; HOLD], 2000);
    wal.write(&[b'e'; 4096], 2024);
    let frame = wal.read(HOLD + 4096, 2000);
    assert_eq!(frame[..HOLD], [b'd'; HOLD]);
    assert!(frame[HOLD..].iter().all(|&b| b == b'e'));

    // Two headers in a row: the first is written before the second is held.
    wal.write(&[b'f'; HOLD], 7000);
    wal.write(&[b'g'; HOLD], 9000);
    assert_eq!(wal.read(HOLD, 7000), [b'f'; HOLD]);
    assert_eq!(wal.read(HOLD, 9000), [b'g'; HOLD]);

    // Closing writes what is held.
    wal.write(&[b'h'; HOLD], 10_000);
    wal.close();
    let bytes = std::fs::read(&path).unwrap();
    assert_eq!(bytes.len(), 10_000 + HOLD);
    assert_eq!(bytes[10_000..], [b'h'; HOLD]);
    assert_eq!(bytes[2000..2000 + HOLD], [b'd'; HOLD]);
}

#[test]
fn a_store_through_the_vfs_reads_back_what_it_wrote() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("x.db");
    let name = coalescing(None).unwrap();
    let flags =
        rusqlite::OpenFlags::SQLITE_OPEN_READ_WRITE | rusqlite::OpenFlags::SQLITE_OPEN_CREATE;
    let conn = rusqlite::Connection::open_with_flags_and_vfs(&path, flags, name.as_str()).unwrap();
    conn.execute_batch("PRAGMA journal_mode = WAL; CREATE TABLE t (v BLOB)")
        .unwrap();
    for i in 0..200u16 {
        conn.execute("INSERT INTO t VALUES (?1)", [vec![(i % 251) as u8; 3000]])
            .unwrap();
    }
    // Another connection, through the default VFS, reads the WAL the first one wrote.
    let other = rusqlite::Connection::open(&path).unwrap();
    let total: i64 = other
        .query_row("SELECT count(*) FROM t WHERE length(v) = 3000", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(total, 200);
    let check: String = other
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(check, "ok");
}

#[test]
fn a_missing_vfs_underneath_is_named_in_the_error() {
    let err = coalescing(Some("no-such-vfs")).unwrap_err();
    assert!(err.to_string().contains("\"no-such-vfs\""), "{err}");
    // Nothing was registered for it: asking again fails the same way.
    assert!(coalescing(Some("no-such-vfs")).is_err());
}
