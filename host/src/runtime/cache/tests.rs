//! Unit tests of the component cache: what is sealed loads, anything else is refused
//! without being deserialized, and directories others could change are not used.

use std::os::unix::fs::PermissionsExt;

use super::entry::{FIELDS_LEN, TRAILER_LEN};
use super::*;

/// The smallest component: the magic, version 0x0d, layer 1, no sections.
const EMPTY_COMPONENT: &[u8] = b"\0asm\x0d\0\x01\0";

fn engine() -> Engine {
    let mut config = wasmtime::Config::new();
    config.wasm_component_model(true);
    Engine::new(&config).unwrap()
}

fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn mode(path: &Path) -> u32 {
    std::fs::symlink_metadata(path)
        .unwrap()
        .permissions()
        .mode()
        & 0o7777
}

/// A cache in a fresh temp dir, with one entry stored under digest `[1; 32]`.
fn cache_with_entry() -> (tempfile::TempDir, Engine, ComponentCache) {
    let dir = tempfile::tempdir().unwrap();
    let engine = engine();
    let cache = ComponentCache::open(dir.path().join("cache"), &engine).unwrap();
    let component = Component::new(&engine, EMPTY_COMPONENT).unwrap();
    cache.store(&[1; 32], &component);
    (dir, engine, cache)
}

#[test]
fn sealed_entries_load_and_the_cache_is_private() {
    let (_dir, engine, cache) = cache_with_entry();
    assert!(cache.load(&engine, &[1; 32]).is_some());
    assert!(cache.load(&engine, &[2; 32]).is_none(), "no entry: a miss");
    assert_eq!(mode(&cache.dir), 0o700);
    assert_eq!(mode(&cache.dir.join(KEY_FILE)), 0o600);
    assert_eq!(mode(&cache.entry_path(&[1; 32])), 0o600);

    // Another process opening the same directory shares the key.
    let again = ComponentCache::open(cache.dir.clone(), &engine).unwrap();
    assert_eq!(again.mac_key, cache.mac_key);
    assert!(again.load(&engine, &[1; 32]).is_some());
}

#[test]
fn entries_idem_did_not_seal_for_this_component_are_refused() {
    let (_dir, engine, cache) = cache_with_entry();
    let sealed = std::fs::read(cache.entry_path(&[1; 32])).unwrap();

    // Another component's entry under this one's name.
    std::fs::write(cache.entry_path(&[2; 32]), &sealed).unwrap();
    assert!(matches!(
        cache.seal().verify(&sealed, &[2; 32]),
        Err(Rejected::OtherComponent)
    ));
    assert!(cache.load(&engine, &[2; 32]).is_none());

    // Any byte changed, code or trailer.
    let trailer = sealed.len() - TRAILER_LEN;
    for at in [
        0,
        10,
        trailer - 1,
        trailer,
        trailer + 10,
        trailer + FIELDS_LEN - 1,
        sealed.len() - 1,
    ] {
        let mut forged = sealed.clone();
        forged[at] ^= 0x40;
        assert!(cache.seal().verify(&forged, &[1; 32]).is_err(), "byte {at}");
    }

    // Sealed under another key (another user's cache, or a guessed key).
    let mut other = ComponentCache::open(cache.dir.clone(), &engine).unwrap();
    other.mac_key = [7; 32];
    assert!(matches!(
        other.seal().verify(&sealed, &[1; 32]),
        Err(Rejected::Mac)
    ));

    // Sealed for another engine, with this key.
    other.mac_key = cache.mac_key;
    other.engine_key = [9; 32];
    assert!(matches!(
        other.seal().verify(&sealed, &[1; 32]),
        Err(Rejected::OtherEngine)
    ));

    // Truncated or padded.
    let seal = cache.seal();
    assert!(seal.verify(&sealed[..sealed.len() - 1], &[1; 32]).is_err());
    assert!(
        seal.verify(&[&sealed[..], b"x"].concat(), &[1; 32])
            .is_err()
    );
    assert_eq!(
        seal.verify(&sealed, &[1; 32]).unwrap(),
        sealed.len() - TRAILER_LEN
    );
}

#[test]
fn arbitrary_bytes_never_panic() {
    let (_dir, _engine, cache) = cache_with_entry();
    let sealed = std::fs::read(cache.entry_path(&[1; 32])).unwrap();
    let mut rng = fastrand::Rng::with_seed(7);
    let sealed_fields = &sealed[sealed.len() - TRAILER_LEN..][..FIELDS_LEN];
    for _ in 0..2000 {
        let len = rng.usize(..TRAILER_LEN + 64);
        let mut bytes: Vec<u8> = (0..len).map(|_| rng.u8(..)).collect();
        if rng.bool() && len >= TRAILER_LEN {
            // A plausible trailer, so that parsing goes past the magic.
            let at = len - TRAILER_LEN;
            bytes[at..at + FIELDS_LEN].copy_from_slice(sealed_fields);
        }
        if rng.bool() && len >= 12 {
            // A plausible old header.
            bytes[..12].copy_from_slice(&sealed_fields[..12]);
        }
        assert!(cache.seal().verify(&bytes, &[1; 32]).is_err());
    }
}

#[test]
fn entry_files_must_be_the_users_own_regular_files() {
    let (dir, engine, cache) = cache_with_entry();
    let entry = cache.entry_path(&[1; 32]);
    let elsewhere = dir.path().join("elsewhere");
    std::fs::rename(&entry, &elsewhere).unwrap();
    std::os::unix::fs::symlink(&elsewhere, &entry).unwrap();
    assert!(matches!(
        cache.open_entry(&entry),
        Err(Rejected::NotRegular)
    ));
    assert!(cache.load(&engine, &[1; 32]).is_none());
    std::fs::remove_file(&entry).unwrap();

    // A FIFO must not hang the read; a directory is no entry either.
    rustix::fs::mknodat(
        rustix::fs::CWD,
        &entry,
        rustix::fs::FileType::Fifo,
        Mode::RUSR | Mode::WUSR,
        0,
    )
    .unwrap();
    assert!(matches!(
        cache.open_entry(&entry),
        Err(Rejected::NotRegular)
    ));
    std::fs::remove_file(&entry).unwrap();
    std::fs::create_dir(&entry).unwrap();
    assert!(matches!(
        cache.open_entry(&entry),
        Err(Rejected::NotRegular)
    ));
    std::fs::remove_dir(&entry).unwrap();

    std::fs::copy(&elsewhere, &entry).unwrap();
    chmod(&entry, 0o666);
    assert!(matches!(
        cache.open_entry(&entry),
        Err(Rejected::WritableByOthers(0o666))
    ));
    // A refused entry is rewritten by the next store.
    let component = Component::new(&engine, EMPTY_COMPONENT).unwrap();
    cache.store(&[1; 32], &component);
    assert_eq!(mode(&entry), 0o600);
    assert!(cache.load(&engine, &[1; 32]).is_some());
}

#[test]
fn a_key_others_could_read_is_replaced() {
    let (_dir, engine, cache) = cache_with_entry();
    let key = cache.dir.join(KEY_FILE);
    chmod(&key, 0o644);
    let reopened = ComponentCache::open(cache.dir.clone(), &engine).unwrap();
    assert_ne!(reopened.mac_key, cache.mac_key);
    assert_eq!(mode(&key), 0o600);
    assert!(
        reopened.load(&engine, &[1; 32]).is_none(),
        "entries sealed with the old key are not trusted"
    );

    std::fs::write(&key, b"short").unwrap();
    let reopened = ComponentCache::open(cache.dir.clone(), &engine).unwrap();
    assert_eq!(std::fs::read(&key).unwrap(), reopened.mac_key);
}

#[test]
fn directories_others_can_change_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let engine = engine();
    let open = |path: &Path| ComponentCache::open(path.to_path_buf(), &engine).map(drop);
    let problem = |path: &Path| match ComponentCache::open(path.to_path_buf(), &engine) {
        Err(CacheError::Unsafe { problem, .. }) => problem,
        other => panic!("{path:?}: expected refusal, got {other:?}"),
    };

    let shared = root.join("shared");
    std::fs::create_dir(&shared).unwrap();
    chmod(&shared, 0o775);
    assert_eq!(
        problem(&shared),
        UnsafeDir::Writable {
            path: shared.clone(),
            mode: 0o775
        }
    );
    assert!(
        !shared.join(KEY_FILE).exists(),
        "a refused cache is left as it was"
    );
    assert_eq!(
        problem(&shared.join("below")),
        UnsafeDir::AncestorWritable {
            path: shared.clone(),
            mode: 0o775
        }
    );
    assert!(
        !shared.join("below").exists(),
        "nothing is created under it"
    );
    chmod(&shared, 0o1777);
    open(&shared.join("below")).unwrap();
    assert_eq!(mode(&shared.join("below")), 0o700);

    let real = root.join("real");
    std::os::unix::fs::symlink(&shared, &real).unwrap();
    assert_eq!(
        problem(&real),
        UnsafeDir::SymbolicLink { path: real.clone() }
    );
    // Through a link, the directories of its target are the ones checked.
    open(&real.join("below")).unwrap();
    chmod(&shared, 0o777);
    assert_eq!(
        problem(&real.join("below")),
        UnsafeDir::AncestorWritable {
            path: shared.clone(),
            mode: 0o777
        }
    );

    let file = root.join("file");
    std::fs::write(&file, "").unwrap();
    assert_eq!(
        problem(&file),
        UnsafeDir::NotADirectory { path: file.clone() }
    );

    // Missing directories are created private, parents included.
    let deep = root.join("a/b/c");
    open(&deep).unwrap();
    assert_eq!(mode(&root.join("a")), 0o700);
    assert_eq!(mode(&deep), 0o700);
}

#[test]
fn entries_of_the_old_format_are_named_as_such_and_replaced() {
    let (_dir, engine, cache) = cache_with_entry();
    let entry = cache.entry_path(&[1; 32]);
    let sealed = std::fs::read(&entry).unwrap();
    let code = &sealed[..sealed.len() - TRAILER_LEN];
    // Format 1: magic, format, digest, engine, length, MAC, then the code.
    let mut old = Vec::new();
    old.extend_from_slice(&entry::MAGIC);
    old.extend_from_slice(&1u32.to_le_bytes());
    old.extend_from_slice(&[1; 32]);
    old.extend_from_slice(&cache.engine_key);
    old.extend_from_slice(&(code.len() as u64).to_le_bytes());
    old.extend_from_slice(&[0; 32]);
    old.extend_from_slice(code);
    assert!(matches!(
        cache.seal().verify(&old, &[1; 32]),
        Err(Rejected::Format(1))
    ));
    std::fs::write(&entry, &old).unwrap();
    assert!(cache.load(&engine, &[1; 32]).is_none());
    let component = Component::new(&engine, EMPTY_COMPONENT).unwrap();
    cache.store(&[1; 32], &component);
    assert!(cache.load(&engine, &[1; 32]).is_some());
}

/// Sets `path`'s modification time to `secs_ago` seconds before now.
fn age(path: &Path, secs_ago: u64) {
    let file = std::fs::File::options().write(true).open(path).unwrap();
    file.set_modified(SystemTime::now() - Duration::from_secs(secs_ago))
        .unwrap();
}

#[test]
fn the_least_recently_used_entries_are_evicted_beyond_the_bound() {
    let (_dir, engine, mut cache) = cache_with_entry();
    let component = Component::new(&engine, EMPTY_COMPONENT).unwrap();
    let one = std::fs::metadata(cache.entry_path(&[1; 32])).unwrap().len();
    cache.store(&[2; 32], &component);
    cache.store(&[3; 32], &component);
    // Used long ago: 1, then 3; 2 most recently.
    age(&cache.entry_path(&[1; 32]), 3 * 3600);
    age(&cache.entry_path(&[3; 32]), 2 * 3600);
    age(&cache.entry_path(&[2; 32]), 1800);
    // A hit on an entry last used over an hour ago makes it the most recent.
    assert!(cache.load(&engine, &[1; 32]).is_some());

    // Room for four entries: nothing goes.
    cache.max_bytes = 4 * one;
    cache.store(&[4; 32], &component);
    assert_eq!(std::fs::read_dir(&cache.dir).unwrap().count(), 1 + 4);
    age(&cache.entry_path(&[4; 32]), 1200);
    // Room for two: the new entry stays, and of the rest the most recently used.
    cache.max_bytes = 2 * one;
    cache.store(&[5; 32], &component);
    let left: Vec<bool> = (1..=5u8)
        .map(|d| cache.entry_path(&[d; 32]).exists())
        .collect();
    assert_eq!(left, [true, false, false, false, true]);
    assert!(
        cache.dir.join(KEY_FILE).exists(),
        "the key is never evicted"
    );

    // Even alone over the bound, the entry just written stays.
    cache.max_bytes = 1;
    cache.store(&[6; 32], &component);
    assert!(cache.entry_path(&[6; 32]).exists());
    assert!(!cache.entry_path(&[1; 32]).exists());
    assert!(cache.load(&engine, &[6; 32]).is_some());
}

#[test]
fn a_files_digest_is_remembered_until_the_file_changes() {
    let (dir, _engine, mut cache) = cache_with_entry();
    let file = dir.path().join("agent.wasm");
    std::fs::write(&file, b"\0asm one").unwrap();
    let meta = || std::fs::metadata(&file).unwrap();

    // Just written: a write in the same clock tick could leave its times unchanged.
    cache.remember_digest(&meta(), &[1; 32]);
    assert_eq!(cache.known_digest(&meta()), None);

    cache.settled_after = Duration::ZERO;
    cache.remember_digest(&meta(), &[1; 32]);
    assert_eq!(cache.known_digest(&meta()), Some([1; 32]));
    let record = std::fs::read_dir(&cache.dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| digests::is_record(p))
        .unwrap();
    assert_eq!(mode(&record), 0o600);

    // Rewritten with bytes of the same length: its change time moved.
    std::thread::sleep(Duration::from_millis(20));
    std::fs::write(&file, b"\0asm two").unwrap();
    assert_eq!(cache.known_digest(&meta()), None);

    // A record that was not sealed with this cache's key says nothing.
    cache.remember_digest(&meta(), &[2; 32]);
    let mut forged = std::fs::read(&record).unwrap();
    let at = forged.len() - 33;
    forged[at] ^= 1;
    std::fs::write(&record, &forged).unwrap();
    assert_eq!(cache.known_digest(&meta()), None);
    cache.remember_digest(&meta(), &[2; 32]);
    assert_eq!(cache.known_digest(&meta()), Some([2; 32]));
    chmod(&record, 0o666);
    assert_eq!(cache.known_digest(&meta()), None, "writable by others");
}
