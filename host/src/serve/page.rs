//! The web page: one HTML shell, a script and a style sheet, embedded in the binary so
//! the page works offline. The script reads the JSON API (the same routes a client
//! calls) and redraws every second; it sets every string as text, never as HTML.

use axum::http::header::{CACHE_CONTROL, CONTENT_SECURITY_POLICY, CONTENT_TYPE};
use axum::response::IntoResponse;

const INDEX: &str = include_str!("page/index.html");
const SCRIPT: &str = include_str!("page/app.js");
const STYLE: &str = include_str!("page/app.css");

/// Only this server's own script, style and API: no inline script, no other origin.
const POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
                      connect-src 'self'; img-src 'self'; base-uri 'none'; \
                      form-action 'none'; frame-ancestors 'none'";

pub(super) async fn index() -> impl IntoResponse {
    (
        [
            (CONTENT_TYPE, "text/html; charset=utf-8"),
            (CONTENT_SECURITY_POLICY, POLICY),
            (CACHE_CONTROL, "no-cache"),
        ],
        INDEX,
    )
}

pub(super) async fn script() -> impl IntoResponse {
    (
        [
            (CONTENT_TYPE, "text/javascript; charset=utf-8"),
            (CACHE_CONTROL, "no-cache"),
        ],
        SCRIPT,
    )
}

pub(super) async fn style() -> impl IntoResponse {
    (
        [
            (CONTENT_TYPE, "text/css; charset=utf-8"),
            (CACHE_CONTROL, "no-cache"),
        ],
        STYLE,
    )
}
