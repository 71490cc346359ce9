//! Server-sent event streams: every event kept so far, then the live feed, each event one
//! `data:` line of JSON; streams end when the server stops. Used by the agent sessions' and
//! the runs' routes, and by front ends that serve the same streams.

use std::convert::Infallible;

use axum::body::Body;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use futures::StreamExt as _;
use serde::Serialize;
use tokio::sync::broadcast;

use crate::Error;

/// A server-sent event stream of `past`, then of `live` until it closes or the server stops
/// (a subscriber too slow for the channel's capacity loses the oldest and goes on). Each event
/// is one `data:` line of JSON.
pub fn event_stream<T: Serialize + Clone + Send + 'static>(
    past: Vec<T>,
    live: Option<broadcast::Receiver<T>>,
    stopping: tokio::sync::watch::Receiver<bool>,
) -> Response {
    let live = futures::stream::unfold(live, |rx| async move {
        let mut rx = rx?;
        loop {
            match rx.recv().await {
                Ok(e) => return Some((e, Some(rx))),
                Err(broadcast::error::RecvError::Lagged(_)) => {}
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    });
    let body = until_stopping(
        futures::stream::iter(past)
            .chain(live)
            .map(|e| format!("data: {}\n\n", serde_json::to_string(&e).unwrap_or_default()))
            .map(|s| Ok::<_, Infallible>(bytes::Bytes::from(s))),
        stopping,
    );
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(body))
        .unwrap_or_else(|e| Error::Unavailable(e.to_string()).into_response())
}

/// `stream` until `stopping` turns true (or its sender goes away): a server that stops ends
/// its event streams, so that draining the connections does not wait on them.
pub fn until_stopping<S: futures::Stream + Send + 'static>(
    stream: S,
    mut stopping: tokio::sync::watch::Receiver<bool>,
) -> impl futures::Stream<Item = S::Item> + Send + 'static {
    stream.take_until(Box::pin(async move {
        let _ = stopping.wait_for(|stop| *stop).await;
    }))
}
