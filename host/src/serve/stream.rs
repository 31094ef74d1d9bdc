//! `GET /api/runs/{run_id}/stream`: a run's live stream as server-sent events. The
//! chunks the store keeps first, then each new one as it reaches the store (polled,
//! [`FOLLOW_POLL`](crate::ops::FOLLOW_POLL)), each an event whose `id` is its sequence
//! number and whose data is `{"seq", "key", "text"}`; a client that reconnects with
//! `Last-Event-ID` resumes after it. When the run ends, an `end` event carries its
//! status and the response ends. Not durable: chunks trimmed or lost in a crash are
//! not sent; the run's committed results are the truth.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde_json::json;
use tokio::sync::{mpsc, watch};

use super::ServeState;
use super::error::ApiError;
use crate::ops::{Follow, Followed};
use crate::store::{Store, StoreError};

/// The events waiting for a slow client: a follower that gets ahead waits for it
/// rather than hold more.
const BUFFERED: usize = 64;

pub(super) async fn stream_run(
    State(state): State<ServeState>,
    Path(run_id): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let after = match headers.get("last-event-id") {
        None => None,
        Some(value) => Some(
            value
                .to_str()
                .ok()
                .and_then(|v| v.trim().parse::<u64>().ok())
                .ok_or_else(|| {
                    ApiError::new(
                        "bad_request",
                        "Last-Event-ID must be the sequence number of an event",
                    )
                })?,
        ),
    };
    if state.store.run(&run_id).await?.is_none() {
        return Err(StoreError::UnknownRun { run_id }.into());
    }
    let (events, rx) = mpsc::channel(BUFFERED);
    let follow = Follow::new(&run_id, after);
    tokio::spawn(pump(
        state.store.clone(),
        follow,
        events,
        state.stopping.clone(),
    ));
    Ok(Sse::new(Events(rx))
        .keep_alive(KeepAlive::default())
        .into_response())
}

/// Follows the run into `events` until it ends, the client goes away or the server
/// stops.
async fn pump(
    store: std::sync::Arc<dyn Store>,
    mut follow: Follow,
    events: mpsc::Sender<Event>,
    mut stopping: watch::Receiver<()>,
) {
    loop {
        let next = tokio::select! {
            next = follow.next(store.as_ref()) => next,
            () = events.closed() => return,
            _ = stopping.changed() => return,
        };
        let chunks = match next {
            Ok(Followed::Chunks(chunks)) => chunks,
            Ok(Followed::Ended(status)) => {
                let status = status.map(|s| s.as_str());
                let end = Event::default()
                    .event("end")
                    .data(json!({ "status": status }).to_string());
                send(&events, end, &mut stopping).await;
                return;
            }
            Err(e) => {
                // The client learns why its stream stopped; it may reconnect.
                let error = Event::default()
                    .event("failure")
                    .data(json!({ "message": e.to_string() }).to_string());
                send(&events, error, &mut stopping).await;
                return;
            }
        };
        for c in chunks {
            let event = Event::default()
                .id(c.seq.to_string())
                .data(json!({"seq": c.seq, "key": c.key, "text": c.text}).to_string());
            if !send(&events, event, &mut stopping).await {
                return;
            }
        }
    }
}

/// Hands `event` to the response; whether it was taken (not if the client went away,
/// or the server stops while a client that reads nothing holds the stream full).
async fn send(
    events: &mpsc::Sender<Event>,
    event: Event,
    stopping: &mut watch::Receiver<()>,
) -> bool {
    tokio::select! {
        sent = events.send(event) => sent.is_ok(),
        _ = stopping.changed() => false,
    }
}

/// The events of one response, as axum's [`Sse`] reads them.
struct Events(mpsc::Receiver<Event>);

impl futures_core::Stream for Events {
    type Item = Result<Event, Infallible>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.0.poll_recv(cx).map(|event| event.map(Ok))
    }
}
