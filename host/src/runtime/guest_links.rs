//! Symbolic links a guest makes stay inside its grant: idem links its own
//! `symlink-at` over wasmtime-wasi's, refusing a target that could lead out.
//!
//! wasmtime-wasi (48) keeps the guest itself inside its grants whatever links lie there:
//! it resolves every path within the preopened directory and refuses an absolute
//! target when making a link. But it writes a relative target as given, so a guest
//! could leave `up -> ../../idem.db` on the host's disk: harmless to the guest, a trap
//! for any host program (a backup, an operator's shell, another service sharing the
//! directory) that follows it. A target with no `..` component and no root resolves
//! below the directory the link sits in, and keeps doing so wherever the guest later
//! moves the link or its directories within the grant (each link a guest may make
//! descends, so a chain of them does too), so that is the rule; such a target gets
//! WASI's `not-permitted`, as an absolute one does from wasmtime.
//!
//! Links the operator put in a granted directory are the operator's: a guest can
//! rename one (and so move where a relative one with `..` points), as it can any file
//! of its grant.

use wasmtime::component::{Linker, Resource};
use wasmtime_wasi::WasiView;
use wasmtime_wasi::filesystem::WasiFilesystemView;
use wasmtime_wasi::p2::bindings::filesystem::types::{Descriptor, ErrorCode, Host, HostDescriptor};

/// The interface wasmtime-wasi 48 links (`wasi:filesystem@0.2.12`): a guest's import of
/// any 0.2 version resolves to it. A wasmtime that moves to another version makes this
/// a second, unused instance, which `guest_symlinks_stay_inside_their_grant` catches.
const TYPES: &str = "wasi:filesystem/types@0.2.12";

/// Links idem's `symlink-at` over the one `wasmtime_wasi::p2::add_to_linker_async`
/// linked (call it after that).
pub(crate) fn add_to_linker<T: WasiView + 'static>(linker: &mut Linker<T>) -> wasmtime::Result<()> {
    linker.allow_shadowing(true);
    let linked = linker.instance(TYPES).and_then(|mut types| {
        types.func_wrap_async(
            "[method]descriptor.symlink-at",
            |mut store, (dir, target, link): (Resource<Descriptor>, String, String)| {
                Box::new(async move {
                    if leads_out(&target) {
                        return Ok((Err(ErrorCode::NotPermitted),));
                    }
                    let mut fs = store.data_mut().filesystem();
                    match HostDescriptor::symlink_at(&mut fs, dir, target, link).await {
                        Ok(()) => Ok((Ok(()),)),
                        // Trappable errors (a bad handle) stay traps, as in wasmtime-wasi.
                        Err(e) => Ok((Err(Host::convert_error_code(&mut fs, e)?),)),
                    }
                })
            },
        )
    });
    linker.allow_shadowing(false);
    linked
}

/// Whether a link to `target` could resolve outside the directory it is made in.
fn leads_out(target: &str) -> bool {
    target.starts_with('/') || target.split('/').any(|part| part == "..")
}

#[cfg(test)]
mod tests {
    use super::leads_out;

    #[test]
    fn only_targets_that_descend_are_allowed() {
        for out in ["/etc", "..", "../x", "a/../../x", "a/..", "./..", "a/b/.."] {
            assert!(leads_out(out), "{out}");
        }
        for down in ["x", "a/b", "./a", ".", "a//b", "..x", "x..", "a/...", ""] {
            assert!(!leads_out(down), "{down}");
        }
    }
}
