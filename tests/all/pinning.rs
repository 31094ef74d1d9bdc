//! A run is pinned to the component it started with: resuming it with another is
//! refused unless `--upgrade`, which is recorded.

use idem_test_artifacts::STEPS;

use crate::util::{raw_db, read_log, run_cli, stderr, stdout};

/// The same component with one more custom section: another digest, the same code.
fn rebuilt(dir: &std::path::Path) -> String {
    let mut bytes = std::fs::read(STEPS).unwrap();
    let (name, payload) = (b"idem-test", b"rebuild");
    bytes.push(0); // custom section
    bytes.push((1 + name.len() + payload.len()) as u8);
    bytes.push(name.len() as u8);
    bytes.extend_from_slice(name);
    bytes.extend_from_slice(payload);
    let path = dir.join("steps-v2.wasm");
    std::fs::write(&path, bytes).unwrap();
    path.to_str().unwrap().to_string()
}

#[test]
fn resuming_with_another_component_needs_upgrade() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("data")).unwrap();
    let db = dir.path().join("idem.db").to_str().unwrap().to_string();
    let grant = format!("{}::/data", dir.path().join("data").display());
    let input = r#"{"steps":5,"log":"/data/log.txt","fail_at":2}"#;
    let run = |agent: &str, extra: &[&str]| {
        let mut args = vec![
            "run", agent, "--db", &db, "--dir", &grant, "--input", input, "--run-id", "pinned",
        ];
        args.extend_from_slice(extra);
        run_cli(&args)
    };
    assert_eq!(
        run(STEPS, &[]).status.code(),
        Some(1),
        "step 2 fails on its first attempt"
    );
    let v2 = rebuilt(dir.path());

    let refused = run(&v2, &[]);
    assert_eq!(refused.status.code(), Some(2), "{}", stderr(&refused));
    let err = stderr(&refused);
    assert!(
        err.contains("was started with component") && err.contains("--upgrade"),
        "{err}"
    );
    let status = run_cli(&["status", "--db", &db, "pinned"]);
    assert!(
        stdout(&status).contains("failed"),
        "the refusal changed nothing: {}",
        stdout(&status)
    );
    assert_eq!(read_log(&dir.path().join("data/log.txt")).len(), 2);

    let upgraded = run(&v2, &["--upgrade"]);
    assert!(upgraded.status.success(), "{}", stderr(&upgraded));
    assert_eq!(read_log(&dir.path().join("data/log.txt")).len(), 5);
    let conn = raw_db(std::path::Path::new(&db));
    let upgrades: i64 = conn
        .query_row(
            "SELECT count(*) FROM run_upgrades WHERE run_id = 'pinned'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(upgrades, 1);
}
