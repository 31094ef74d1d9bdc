//! Example agent: a payment that waits for a person to approve it.
//!
//! It prepares the payment (once), waits for an `approval` signal for at most
//! `timeout_s` seconds — holding no instance and no memory while it waits — and then
//! pays exactly once if the approval says so. Send the signal with
//!
//! ```sh
//! idem signal RUN approval --payload '{"approved": true, "by": "alice"}'
//! ```
//!
//! Input: `{"payment": {"id": "p-17", "to": "acme", "cents": 12500},
//! "log": "/data/payments.log", "timeout_s": 86400}`. Each side effect appends one line
//! to the log: `prepared p-17 ...` and `paid p-17 ...`. Output: `{"payment": "p-17",
//! "status": "paid" | "refused" | "expired", "by": "alice"}`.

use std::fs::OpenOptions;
use std::io::Write;
use std::time::Duration;

use idem_sdk::{Agent, Error, Key, run_once};
use serde::{Deserialize, Serialize};

#[derive(Deserialize, Serialize)]
struct Payment {
    id: String,
    to: String,
    cents: u64,
}

#[derive(Deserialize)]
struct Input {
    payment: Payment,
    log: String,
    #[serde(default = "a_day")]
    timeout_s: u64,
}

fn a_day() -> u64 {
    24 * 3600
}

/// What the approver sends.
#[derive(Deserialize)]
struct Approval {
    approved: bool,
    #[serde(default)]
    by: String,
}

#[derive(Serialize)]
struct Output {
    payment: String,
    status: &'static str,
    by: Option<String>,
}

fn append(log: &str, line: &str) -> Result<(), std::io::Error> {
    let mut file = OpenOptions::new().create(true).append(true).open(log)?;
    // One write per line: runs appending at once never interleave their lines.
    file.write_all(format!("{line}\n").as_bytes())
}

struct Approver;

impl Agent for Approver {
    type Input = Input;
    type Output = Output;

    fn run(input: Input) -> Result<Output, Error> {
        let payment = &input.payment;
        let log = input.log.as_str();
        // Keys from the payment itself: a resumed instance finds the same steps.
        run_once(&Key::for_run("prepare", payment)?, |step| {
            append(
                log,
                &format!(
                    "prepared {} to {} {} cents token={}",
                    payment.id,
                    payment.to,
                    payment.cents,
                    step.token()
                ),
            )
        })?;
        let timeout = Duration::from_secs(input.timeout_s);
        let approval = match idem_sdk::wait_for_signal::<Approval>(
            &format!("approve-{}", payment.id),
            "approval",
            Some(timeout),
        ) {
            Ok(approval) => approval,
            Err(Error::TimedOut(_)) => {
                return Ok(Output {
                    payment: payment.id.clone(),
                    status: "expired",
                    by: None,
                });
            }
            Err(e) => return Err(e),
        };
        if !approval.approved {
            return Ok(Output {
                payment: payment.id.clone(),
                status: "refused",
                by: Some(approval.by),
            });
        }
        run_once(&Key::for_run("pay", payment)?, |step| {
            // The real transfer would send `step.key()` as its idempotency key.
            append(
                log,
                &format!(
                    "paid {} to {} {} cents approved by {} token={}",
                    payment.id,
                    payment.to,
                    payment.cents,
                    approval.by,
                    step.token()
                ),
            )
        })?;
        Ok(Output {
            payment: payment.id.clone(),
            status: "paid",
            by: Some(approval.by),
        })
    }
}

idem_sdk::export_agent!(Approver);
