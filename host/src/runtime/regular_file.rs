//! Opening a file a user named (an agent, an input) without ever waiting on it: only a
//! regular file is read, and nothing else is opened in a way that can block.

use std::fs::{File, FileType, OpenOptions};
use std::io;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

/// Opens `path` for reading if it is a regular file (symbolic links followed), and
/// refuses anything else with an [`io::ErrorKind::InvalidInput`] error that says what it
/// is: a named pipe (FIFO) with no writer would hold an `open` forever, and a device,
/// a socket or a directory is no file to read a component or JSON from.
///
/// ```
/// use idem::runtime::open_regular_file;
///
/// let dir = tempfile::tempdir()?;
/// let file = dir.path().join("input.json");
/// std::fs::write(&file, "{}")?;
/// assert!(open_regular_file(&file).is_ok());
/// let refused = open_regular_file(dir.path()).unwrap_err();
/// assert!(refused.to_string().contains("a directory"));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn open_regular_file(path: &Path) -> io::Result<File> {
    // Looked at before it is opened, so that no device is opened at all (opening some
    // has effects: a tape rewinds, a serial line raises DTR).
    refuse_irregular(std::fs::metadata(path)?.file_type())?;
    // And again on what was opened, in case the path changed since: non-blocking, so
    // that a FIFO swapped in is refused rather than waited on. The flag changes nothing
    // for reads of a regular file, which never wait.
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(rustix::fs::OFlags::NONBLOCK.bits() as i32)
        .open(path)?;
    refuse_irregular(file.metadata()?.file_type())?;
    Ok(file)
}

fn refuse_irregular(kind: FileType) -> io::Result<()> {
    if kind.is_file() {
        return Ok(());
    }
    let what = if kind.is_dir() {
        "a directory"
    } else if kind.is_fifo() {
        "a named pipe (FIFO)"
    } else if kind.is_socket() {
        "a socket"
    } else if kind.is_block_device() || kind.is_char_device() {
        "a device"
    } else {
        "not a regular file"
    };
    Err(io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("it is {what}, not a regular file"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A FIFO nobody writes to is refused at once, however it is reached.
    #[test]
    fn a_fifo_is_refused_without_waiting_for_a_writer() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &fifo,
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::RUSR | rustix::fs::Mode::WUSR,
            0,
        )
        .unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&fifo, &link).unwrap();
        for path in [&fifo, &link] {
            let err = open_regular_file(path).unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
            assert!(err.to_string().contains("named pipe (FIFO)"), "{err}");
        }
        let err = open_regular_file(Path::new("/dev/null")).unwrap_err();
        assert!(err.to_string().contains("a device"), "{err}");
    }
}
