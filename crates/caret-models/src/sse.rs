//! Server-sent events read from a byte stream.

use bytes::Bytes;
use futures::{Stream, StreamExt as _};

/// One event: its `event:` name (if any) and its `data:` lines joined.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SseEvent {
    pub event: Option<String>,
    pub data: String,
}

/// Splits a body into events (blank-line separated; `data:` lines joined by `\n`; comments
/// and other fields ignored). A transport error ends the stream with that error.
pub(crate) fn events<S, E>(body: S) -> impl Stream<Item = Result<SseEvent, E>>
where
    S: Stream<Item = Result<Bytes, E>> + Unpin,
{
    futures::stream::unfold((body, Vec::<u8>::new(), false), |(mut body, mut buf, mut done)| async move {
        loop {
            if let Some(event) = take_event(&mut buf, done) {
                return Some((Ok(event), (body, buf, done)));
            }
            if done {
                return None;
            }
            match body.next().await {
                Some(Ok(bytes)) => buf.extend_from_slice(&bytes),
                Some(Err(e)) => return Some((Err(e), (body, Vec::new(), true))),
                None => done = true,
            }
        }
    })
}

/// Takes the first complete event out of `buf` (at the end of input, whatever is left).
fn take_event(buf: &mut Vec<u8>, at_end: bool) -> Option<SseEvent> {
    loop {
        let (block_len, skip) = match find_blank_line(buf) {
            Some(found) => found,
            None if at_end && !buf.is_empty() => (buf.len(), 0),
            None => return None,
        };
        let block: Vec<u8> = buf.drain(..block_len + skip).take(block_len).collect();
        let text = String::from_utf8_lossy(&block);
        let mut event = None;
        let mut data: Vec<&str> = Vec::new();
        for line in text.lines() {
            let (field, value) = line.split_once(':').unwrap_or((line, ""));
            let value = value.strip_prefix(' ').unwrap_or(value);
            match field {
                "event" => event = Some(value.to_owned()),
                "data" => data.push(value),
                _ => {}
            }
        }
        if !data.is_empty() || event.is_some() {
            return Some(SseEvent { event, data: data.join("\n") });
        }
        if buf.is_empty() {
            return None;
        }
    }
}

/// The end of the first event block: its length and the separator's.
fn find_blank_line(buf: &[u8]) -> Option<(usize, usize)> {
    (0..buf.len()).find_map(|i| {
        if buf[i..].starts_with(b"\n\n") {
            Some((i, 2))
        } else if buf[i..].starts_with(b"\r\n\r\n") {
            Some((i, 4))
        } else {
            None
        }
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[tokio::test]
    async fn splits_events_across_arbitrary_chunk_boundaries() {
        let text = ": comment\n\nevent: message_start\ndata: {\"a\":1}\n\ndata: one\ndata: two\r\n\r\ndata: [DONE]";
        for cut in 1..text.len() {
            let parts: Vec<Result<Bytes, std::io::Error>> =
                text.as_bytes().chunks(cut).map(|c| Ok(Bytes::copy_from_slice(c))).collect();
            let got: Vec<SseEvent> = events(futures::stream::iter(parts)).map(|e| e.unwrap()).collect().await;
            assert_eq!(
                got,
                vec![
                    SseEvent { event: Some("message_start".into()), data: "{\"a\":1}".into() },
                    SseEvent { event: None, data: "one\ntwo".into() },
                    SseEvent { event: None, data: "[DONE]".into() },
                ],
                "chunks of {cut}"
            );
        }
    }
}
