//! Model merge of an edit the matcher cannot place: the answer collected with its timings
//! (the request is `caret_apply::merge::MergePlan::request`).

use std::time::{Duration, Instant};

use caret_models::{Event, EventStream};
use caret_protocol::llm::Usage;
use futures::StreamExt as _;

/// A model's answer to a merge request.
#[derive(Debug, Clone)]
pub struct Answer {
    /// The text.
    pub text: String,
    /// Token counts, with the prediction's accepted and rejected tokens when reported.
    pub usage: Option<Usage>,
    /// From sending the request to the first text.
    pub first_text: Duration,
    /// From sending the request to the end.
    pub total: Duration,
}

impl Answer {
    /// Generated tokens per second after the first one.
    pub fn decode_rate(&self) -> f64 {
        let n = self.usage.map_or(0, |u| u.completion_tokens).saturating_sub(1);
        f64::from(n) / (self.total.saturating_sub(self.first_text)).as_secs_f64().max(1e-9)
    }
}

/// Collects a streamed answer; `started`: when the request was sent.
pub async fn collect(mut stream: EventStream, started: Instant) -> caret_models::Result<Answer> {
    let (mut text, mut usage, mut first) = (String::new(), None, None);
    while let Some(event) = stream.next().await {
        match event? {
            Event::Text(t) => {
                first.get_or_insert_with(|| started.elapsed());
                text.push_str(&t);
            }
            Event::Usage(u) => usage = Some(u),
            _ => {}
        }
    }
    let total = started.elapsed();
    Ok(Answer { text, usage, first_text: first.unwrap_or(total), total })
}
