//! A cache entry mapped read-only, so that its MAC is computed over the page cache's
//! pages rather than over a copy.

use std::fs::File;

/// `file`'s contents, mapped private and read-only until dropped.
pub(super) struct Mapped {
    ptr: *mut std::ffi::c_void,
    len: usize,
}

impl Mapped {
    pub(super) fn new(file: &File) -> std::io::Result<Mapped> {
        let len = usize::try_from(file.metadata()?.len()).map_err(std::io::Error::other)?;
        if len == 0 {
            // mmap refuses an empty length; an empty entry is simply too short.
            return Ok(Mapped {
                ptr: std::ptr::null_mut(),
                len,
            });
        }
        // POPULATE: one call maps every page (the entry is hashed whole, at once) instead
        // of a fault per few pages.
        let flags = rustix::mm::MapFlags::PRIVATE | rustix::mm::MapFlags::POPULATE;
        // SAFETY: a fresh mapping chosen by the kernel, of a file whose length was just
        // read; read-only, so nothing in this process writes through it. Only the user
        // can change the file (`ComponentCache::open_entry` checks it is theirs and
        // writable by nobody else, in a directory only they can write), and idem never
        // truncates an entry in place.
        #[allow(unsafe_code)]
        let ptr = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                len,
                rustix::mm::ProtFlags::READ,
                flags,
                file,
                0,
            )?
        };
        Ok(Mapped { ptr, len })
    }

    pub(super) fn bytes(&self) -> &[u8] {
        if self.ptr.is_null() {
            return &[];
        }
        // SAFETY: `ptr` maps `len` readable bytes until `drop`, and the slice borrows
        // `self`.
        #[allow(unsafe_code)]
        unsafe {
            std::slice::from_raw_parts(self.ptr.cast::<u8>(), self.len)
        }
    }
}

impl Drop for Mapped {
    fn drop(&mut self) {
        if !self.ptr.is_null() {
            // SAFETY: the mapping made in `new`, unmapped once; no slice of it outlives
            // `self`.
            #[allow(unsafe_code)]
            let _ = unsafe { rustix::mm::munmap(self.ptr, self.len) };
        }
    }
}
