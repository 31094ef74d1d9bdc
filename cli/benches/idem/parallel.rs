//! The `parallel` section: side effects in flight together in one step. The `parallel`
//! guest (`tests/guests/parallel`) claims a batch of keys with `run_once_all` and sends
//! one `POST` per key at once with `http::send_all`, to a loopback server that answers
//! each after 200 ms on a thread of its own. A run of one such effect against a run of
//! five in one step (about one effect's wall) and a run of the five one step after
//! another (five).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::ensure;
use idem::runtime::{Authority, FaultPlan, HttpPolicy, RunOptions};
use idem::store::{RunStatus, SyncMode};
use idem_test_artifacts::PARALLEL;
use serde_json::json;

use super::report::{Table, median, millis, sorted};
use super::{Bed, Plan, fresh_run_id, repeat};

/// How long the server takes to answer each request.
const EFFECT: Duration = Duration::from_millis(200);

pub(crate) fn parallel(bed: &Bed, plan: &Plan, table: &mut Table) -> anyhow::Result<()> {
    let server = SlowServer::start()?;
    let agent = bed.runtime.load(std::path::Path::new(PARALLEL))?;
    let host = bed.host(&bed.dir.join("parallel.db"), SyncMode::Normal)?;
    // A run of one batch of effects per entry of `batches`.
    let run = |batches: &[u32]| -> anyhow::Result<f64> {
        let n: u32 = batches.iter().sum();
        let opts = RunOptions {
            run_id: fresh_run_id(),
            input: serde_json::to_vec(&json!({ "url": server.url(), "batches": batches }))?,
            authority: Authority {
                http: HttpPolicy {
                    allow: vec![format!("127.0.0.1:{}", server.port).parse()?],
                    outside_claims: false,
                },
                ..Authority::default()
            },
            faults: FaultPlan::default(),
            ..RunOptions::default()
        };
        let t = Instant::now();
        let report = bed.tokio.block_on(host.host.run(&agent, &opts))?;
        let wall = millis(t.elapsed());
        ensure!(
            report.status == RunStatus::Completed && report.counts.executed == u64::from(n),
            "run {} ended {:?}: {}",
            opts.run_id,
            report.status,
            String::from_utf8_lossy(&report.outcome)
        );
        Ok(wall)
    };
    run(&[1])?; // the first instance of the agent, not a sample
    let (mut one, mut five, mut serial) = (Vec::new(), Vec::new(), Vec::new());
    repeat(plan.parallel, || {
        one.push(run(&[1])?);
        server.max.store(0, Ordering::SeqCst);
        five.push(run(&[5])?);
        ensure!(
            server.max.load(Ordering::SeqCst) == 5,
            "the five requests were not in flight together"
        );
        serial.push(run(&[1; 5])?);
        Ok(())
    })?;
    let one_median = median(&sorted(one.clone()));
    let ratio = |samples: &[f64]| median(&sorted(samples.to_vec())) / one_median;
    let (five_ratio, serial_ratio) = (ratio(&five), ratio(&serial));
    table.row("one 200 ms HTTP effect in a step: run wall", "ms", one);
    table.row_with_ratio(
        "five parallel 200 ms HTTP effects in one step (`run_once_all` + `send_all`): run wall"
            .into(),
        "ms",
        five,
        format!("{five_ratio:.2}× one effect"),
    );
    table.row_with_ratio(
        "the same five effects one step after another: run wall".into(),
        "ms",
        serial,
        format!("{serial_ratio:.2}× one effect"),
    );
    Ok(())
}

/// A loopback HTTP/1.1 server answering every request after [`EFFECT`], each on its own
/// thread, and counting how many it held at once.
struct SlowServer {
    port: u16,
    max: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
}

impl SlowServer {
    fn start() -> anyhow::Result<SlowServer> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let port = listener.local_addr()?.port();
        let (max, stop) = (
            Arc::new(AtomicUsize::new(0)),
            Arc::new(AtomicBool::new(false)),
        );
        let active = Arc::new(AtomicUsize::new(0));
        {
            let (max, stop) = (Arc::clone(&max), Arc::clone(&stop));
            std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    match listener.accept() {
                        Ok((stream, _)) => {
                            let (max, active) = (Arc::clone(&max), Arc::clone(&active));
                            std::thread::spawn(move || {
                                let now = active.fetch_add(1, Ordering::SeqCst) + 1;
                                max.fetch_max(now, Ordering::SeqCst);
                                // A client gone mid-way is no concern of the bench.
                                let _ = answer(stream);
                                active.fetch_sub(1, Ordering::SeqCst);
                            });
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(1)),
                    }
                }
            });
        }
        Ok(SlowServer { port, max, stop })
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

impl Drop for SlowServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

fn answer(stream: TcpStream) -> std::io::Result<()> {
    stream.set_nonblocking(false)?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut length = 0;
    loop {
        let mut line = String::new();
        reader.read_line(&mut line)?;
        let line = line.trim_end().to_ascii_lowercase();
        if line.is_empty() {
            break;
        }
        if let Some(v) = line.strip_prefix("content-length:") {
            length = v.trim().parse().unwrap_or(0);
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body)?;
    std::thread::sleep(EFFECT);
    let mut stream = stream;
    write!(
        stream,
        "HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok"
    )?;
    stream.flush()
}
