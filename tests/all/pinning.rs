//! A run is pinned to the component it started with: resuming it with another is
//! refused unless `--upgrade`, which is recorded.

use idem_test_artifacts::STEPS;

use crate::util::{raw_db, read_log, run_cli, stderr, stdout};

/// The same component with one more custom section: another digest, the same code.
fn rebuilt_bytes() -> Vec<u8> {
    let mut bytes = std::fs::read(STEPS).unwrap();
    let (name, payload) = (b"idem-test", b"rebuild");
    bytes.push(0); // custom section
    bytes.push((1 + name.len() + payload.len()) as u8);
    bytes.push(name.len() as u8);
    bytes.extend_from_slice(name);
    bytes.extend_from_slice(payload);
    bytes
}

/// [`rebuilt_bytes`] in another file, `steps-v2.wasm`.
fn rebuilt(dir: &std::path::Path) -> String {
    let path = dir.join("steps-v2.wasm");
    std::fs::write(&path, rebuilt_bytes()).unwrap();
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

/// The dev loop: the run fails, the agent is rebuilt in place (the same file, another
/// component), and the same `idem run` with no flag takes the new build, says so, and
/// resumes the run where it failed, recording the rebuild and the upgrade. A different
/// component under the same file name elsewhere is still refused, as is the rebuild
/// once an operator deployed the name.
#[test]
fn a_rebuild_of_the_same_file_resumes_with_no_flag_and_an_impostor_is_refused() {
    use idem_test_artifacts::HOSTILE;

    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("data")).unwrap();
    let db = dir.path().join("idem.db").to_str().unwrap().to_string();
    let grant = format!("{}::/data", dir.path().join("data").display());
    let input = r#"{"steps":5,"log":"/data/log.txt","fail_at":2}"#;
    let run = |agent: &std::path::Path, run_id: &str| {
        run_cli(&[
            "run",
            agent.to_str().unwrap(),
            "--db",
            &db,
            "--dir",
            &grant,
            "--input",
            input,
            "--run-id",
            run_id,
        ])
    };
    let agent = dir.path().join("steps.wasm");
    std::fs::copy(STEPS, &agent).unwrap();
    let failed = run(&agent, "dev");
    assert_eq!(failed.status.code(), Some(1), "{}", stderr(&failed));
    assert_eq!(read_log(&dir.path().join("data/log.txt")).len(), 2);

    std::fs::write(&agent, rebuilt_bytes()).unwrap();
    let resumed = run(&agent, "dev");
    let err = stderr(&resumed);
    assert!(resumed.status.success(), "{err}");
    assert!(
        err.contains("is a new build of the same file: namespace \"steps\" runs it now")
            && err.contains("run \"dev\" resumes on it, upgraded from"),
        "{err}"
    );
    assert_eq!(
        read_log(&dir.path().join("data/log.txt")).len(),
        5,
        "resumed at step 2, not run again from the start"
    );
    let conn = raw_db(std::path::Path::new(&db));
    let count = |sql: &str| -> i64 { conn.query_row(sql, [], |r| r.get(0)).unwrap() };
    assert_eq!(
        count("SELECT count(*) FROM run_upgrades WHERE run_id = 'dev'"),
        1
    );
    assert_eq!(
        count(
            "SELECT count(*) FROM deployments WHERE name = 'steps' AND admission = 'rebuild' \
             AND source LIKE '%/steps.wasm'"
        ),
        1
    );

    // Another component saved as steps.wasm in another folder: refused, nothing run.
    let other = dir.path().join("other");
    std::fs::create_dir(&other).unwrap();
    std::fs::copy(HOSTILE, other.join("steps.wasm")).unwrap();
    let refused = run(&other.join("steps.wasm"), "impostor");
    assert_eq!(refused.status.code(), Some(2), "{}", stderr(&refused));
    assert!(
        stderr(&refused).contains("namespace \"steps\" belongs to other components"),
        "{}",
        stderr(&refused)
    );
    assert_eq!(
        count("SELECT count(*) FROM runs WHERE run_id = 'impostor'"),
        0
    );

    // Once an operator deployed the name (here with no grant: a deployment of its own,
    // not the run's again), a rebuild needs an explicit act again.
    let out = run_cli(&[
        "deploy",
        agent.to_str().unwrap(),
        "--name",
        "steps",
        "--db",
        &db,
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let mut third = rebuilt_bytes();
    third.extend_from_slice(&[0, 3, 1, b'x', b'3']);
    std::fs::write(&agent, third).unwrap();
    let out = run(&agent, "after-deploy");
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
}
