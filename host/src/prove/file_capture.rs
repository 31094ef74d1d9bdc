//! The proof's capture across processes: a process that may be killed at any moment
//! answers its agent's requests from the clean run's answers (`answers.json` in a
//! directory the proof makes) and appends every request, before answering it, and
//! every refusal to `requests.jsonl` beside them, one line each. A line cut short by a
//! kill is ignored when the proof reads them back.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use serde::{Deserialize, Serialize};

use super::capture::{Answers, Captured, Exchange};
use crate::runtime::{
    CaptureError, CaptureFuture, CapturedRequest, DenialKind, DeniedRequest, HttpCapture,
};

const ANSWERS: &str = "answers.json";
const REQUESTS: &str = "requests.jsonl";

/// One line of `requests.jsonl`.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
enum Line {
    Request(Exchange),
    Denied {
        method: String,
        url: String,
        kind: DenialKind,
        reason: String,
    },
}

/// Answers a run's HTTP from a proof's recorded answers and logs what it saw to
/// files, for a run driven in another process than the proof's.
#[derive(Debug)]
pub struct FileCapture {
    answers: Answers,
    log: Arc<Mutex<File>>,
    path: PathBuf,
}

impl FileCapture {
    /// Opens the capture a proof prepared in `dir`.
    pub fn open(dir: &Path) -> std::io::Result<FileCapture> {
        let answers = std::fs::read(dir.join(ANSWERS))?;
        let answers: Answers = serde_json::from_slice(&answers)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
        let path = dir.join(REQUESTS);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)?;
        Ok(FileCapture {
            answers,
            log: Arc::new(Mutex::new(log)),
            path,
        })
    }

    fn append(&self, line: &Line) {
        let Ok(mut text) = serde_json::to_vec(line) else {
            return;
        };
        text.push(b'\n');
        let mut log = self.log.lock().unwrap_or_else(PoisonError::into_inner);
        // One write per line: a kill leaves at most the last line cut short.
        if let Err(e) = log.write_all(&text) {
            tracing::warn!(path = %self.path.display(), error = %e, "cannot log a captured request");
        }
    }
}

impl HttpCapture for FileCapture {
    fn exchange(&self, request: CapturedRequest) -> CaptureFuture {
        let answer = self.answers.find(&request);
        let (status, response_headers, response_body) = match &answer {
            Some(a) => (a.status, a.headers.clone(), a.body.clone()),
            None => (0, Vec::new(), Vec::new()),
        };
        let (method, url) = (request.method.clone(), request.url.clone());
        self.append(&Line::Request(Exchange {
            method: request.method,
            url: request.url,
            body: request.body,
            key: request.key,
            token: request.token,
            status,
            response_headers,
            response_body,
        }));
        let answer = answer.ok_or(CaptureError::NoAnswer { method, url });
        Box::pin(async move { answer })
    }

    fn denied(&self, denial: DeniedRequest) {
        self.append(&Line::Denied {
            method: denial.method,
            url: denial.url,
            kind: denial.kind,
            reason: denial.reason,
        });
    }
}

/// Writes the answers a [`FileCapture`] in `dir` will give.
pub(crate) fn prepare(dir: &Path, answers: &Answers) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let bytes = serde_json::to_vec(answers)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
    std::fs::write(dir.join(ANSWERS), bytes)
}

/// Everything the processes' captures in `dir` logged.
pub(crate) fn read(dir: &Path, run_id: &str) -> std::io::Result<Captured> {
    let text = match std::fs::read(dir.join(REQUESTS)) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(e),
    };
    let mut captured = Captured::default();
    for line in text.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
        match serde_json::from_slice::<Line>(line) {
            Ok(Line::Request(exchange)) => captured.exchanges.push(exchange),
            Ok(Line::Denied {
                method,
                url,
                kind,
                reason,
            }) => captured.denials.push(DeniedRequest {
                run_id: run_id.to_string(),
                method,
                url,
                kind,
                reason,
            }),
            // A line cut short by a kill.
            Err(_) => {}
        }
    }
    Ok(captured)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn what_one_process_logs_the_proof_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        prepare(dir.path(), &Answers::default()).unwrap();
        let capture = FileCapture::open(dir.path()).unwrap();
        let request = CapturedRequest {
            run_id: "r".into(),
            method: "POST".into(),
            url: "http://x/1".into(),
            headers: Vec::new(),
            body: b"1".to_vec(),
            key: Some("k".into()),
            token: Some(3),
        };
        assert!(capture.exchange(request).await.is_err(), "nothing recorded");
        capture.denied(DeniedRequest {
            run_id: "r".into(),
            method: "GET".into(),
            url: "http://x/out".into(),
            kind: DenialKind::OutsideClaim,
            reason: "outside".into(),
        });
        // A line cut short, as a kill leaves it.
        std::fs::OpenOptions::new()
            .append(true)
            .open(dir.path().join(REQUESTS))
            .unwrap()
            .write_all(b"{\"request\":{\"meth")
            .unwrap();
        let seen = read(dir.path(), "r").unwrap();
        assert_eq!(seen.exchanges.len(), 1);
        assert_eq!(seen.exchanges[0].token, Some(3));
        assert_eq!(seen.denials[0].kind, DenialKind::OutsideClaim);
    }
}
