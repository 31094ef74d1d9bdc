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

/// The review's attack: a different component saved under the real agent's file name
/// (`payments.wasm`) must not read the real agent's committed results, nor commit a
/// forged one for a key the real agent has not run yet. A name belongs to the
/// components an operator put there; a new one joins only by an explicit act.
#[test]
fn another_component_under_an_agents_file_name_cannot_reach_its_keys() {
    use idem_test_artifacts::{DEDUPE, HOSTILE};

    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("data")).unwrap();
    let db = dir.path().join("idem.db").to_str().unwrap().to_string();
    let grant = format!("{}::/data", dir.path().join("data").display());
    let real = dir.path().join("real");
    let fake = dir.path().join("fake");
    std::fs::create_dir_all(&real).unwrap();
    std::fs::create_dir_all(&fake).unwrap();
    std::fs::copy(DEDUPE, real.join("payments.wasm")).unwrap();
    std::fs::copy(HOSTILE, fake.join("payments.wasm")).unwrap();
    let run = |agent: &std::path::Path, run_id: &str, input: &str, extra: &[&str]| {
        let agent = agent.join("payments.wasm");
        let mut args = vec![
            "run",
            agent.to_str().unwrap(),
            "--db",
            &db,
            "--dir",
            &grant,
            "--run-id",
            run_id,
            "--input",
            input,
        ];
        args.extend_from_slice(extra);
        run_cli(&args)
    };
    let charges = r#"{"items":["a"],"log":"/data/charges.log"}"#;
    let out = run(&real, "real-1", charges, &[]);
    assert!(out.status.success(), "{}", stderr(&out));

    // The impostor, same file name, other code: refused before it runs, naming the
    // namespace and how an operator would let it in.
    let forged = r#"{"mode":"key","text":"forged"}"#;
    let out = run(&fake, "fake-1", forged, &[]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("namespace \"payments\" belongs to other components")
            && err.contains("idem deploy"),
        "{err}"
    );
    // Nothing of it reached the store: no run, no key.
    let conn = raw_db(std::path::Path::new(&db));
    let fake_runs: i64 = conn
        .query_row(
            "SELECT count(*) FROM runs WHERE run_id = 'fake-1'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(fake_runs, 0);
    let forged_keys: i64 = conn
        .query_row(
            "SELECT count(*) FROM steps WHERE key LIKE 'payments:forged%'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(forged_keys, 0);
    // Its own namespace is its own.
    let out = run(&fake, "fake-2", forged, &["--namespace", "impostor"]);
    assert!(out.status.success(), "{}", stderr(&out));

    // An explicit deploy under the name lets a new build in.
    let out = run_cli(&[
        "deploy",
        fake.join("payments.wasm").to_str().unwrap(),
        "--name",
        "payments",
        "--db",
        &db,
        "--dir",
        &grant,
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = run(&fake, "fake-3", forged, &[]);
    assert!(out.status.success(), "{}", stderr(&out));
}
