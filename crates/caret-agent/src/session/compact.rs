//! Compaction: when the conversation nears the model's window, older turns become a summary
//! the model writes (or, failing that, old tool results are shortened).

use caret_protocol::agent::Event;
use caret_protocol::llm::{ChatMessage, Content, Role};
use tokio::sync::mpsc;

use super::{COMPACT_AT, KEEP_RECENT, Session, emit};

const SUMMARY_PROMPT: &str = "You summarise the first part of a coding agent's conversation so that the agent can \
continue from the summary alone. Keep: the user's requests word for word; what was found (files, functions, \
facts with their paths); every change made to files; commands run and their results when they matter; \
decisions and why; what remains to do. Leave out file contents that can be read again. Answer with the \
summary only.";

impl Session {
    /// Replaces older messages by a summary the model writes, when the conversation is past
    /// [`COMPACT_AT`] of the window. The system prompt and the last [`KEEP_RECENT`] messages
    /// stay (the kept part starts at a user or assistant message, never at a tool result cut
    /// from its call). Without a summary (the model failed) old tool results are shortened
    /// instead, which loses less than failing the turn.
    pub(super) async fn compact_if_needed(&mut self, events: &mpsc::UnboundedSender<Event>) {
        let before = self.context_tokens();
        if (before as f32) < COMPACT_AT * self.context_window as f32 || self.messages.len() < KEEP_RECENT + 3 {
            return;
        }
        let mut split = self.messages.len() - KEEP_RECENT;
        while split > 1 && self.messages[split].role == Role::Tool {
            split -= 1;
        }
        if split <= 1 {
            return;
        }
        let messages_before = self.messages.len();
        self.hook(&crate::hooks::Moment::PreCompact("auto"), events).await;
        // The transcript to summarise, each message cut to its share of half the window.
        let room = (self.context_window as usize / 2) * 3;
        let share = (room / (split - 1)).max(200);
        let mut transcript = String::new();
        for m in &self.messages[1..split] {
            let mut body = m.content_text();
            for c in &m.tool_calls {
                body.push_str(&format!("\n[calls {}({})]", c.function.name, c.function.arguments));
            }
            if body.len() > share {
                let mut cut = share;
                while !body.is_char_boundary(cut) {
                    cut -= 1;
                }
                body.truncate(cut);
                body.push_str(" [...]");
            }
            let who = match m.role {
                Role::User => "user",
                Role::Assistant => "agent",
                Role::Tool => "tool result",
                Role::System => "system",
            };
            transcript.push_str(&format!("## {who}\n{body}\n\n"));
        }
        let mut req = self.request();
        req.tools = Vec::new();
        req.max_tokens = Some(1024);
        req.messages = vec![
            ChatMessage::text(Role::System, SUMMARY_PROMPT),
            ChatMessage::text(Role::User, format!("The conversation so far:\n\n{transcript}")),
        ];
        let summary = match self.model.chat(req).await {
            Ok(stream) => caret_models::collect_chat(stream).await.map(|c| {
                if let Some(u) = c.usage {
                    self.usage.0 += u64::from(u.prompt_tokens);
                    self.usage.1 += u64::from(u.completion_tokens);
                    self.usage.2 += 1;
                }
                c.message.content_text()
            }),
            Err(e) => Err(e),
        };
        match summary {
            Ok(summary) if !summary.trim().is_empty() => {
                let head = ChatMessage::text(
                    Role::User,
                    format!("[The earlier part of this session, summarised to save room]\n{}", summary.trim()),
                );
                self.messages.splice(1..split, [head]);
            }
            other => {
                let why = other.err().map_or_else(|| "an empty summary".to_owned(), |e| e.to_string());
                emit(
                    events,
                    Event::Error { message: format!("compaction: {why}; old tool results shortened instead") },
                );
                for m in &mut self.messages[1..split] {
                    if m.role == Role::Tool && m.content_text().len() > 200 {
                        let text = m.content_text();
                        let mut cut = 200;
                        while !text.is_char_boundary(cut) {
                            cut -= 1;
                        }
                        m.content = Some(Content::Text(format!("{} [... shortened to save room]", &text[..cut])));
                    }
                }
            }
        }
        self.counted = None;
        if let Err(e) = self.rewrite_log() {
            tracing::warn!("session file: {e}");
            self.log = None;
        }
        emit(
            events,
            Event::Compacted {
                messages_before: u32::try_from(messages_before).unwrap_or(u32::MAX),
                messages_after: u32::try_from(self.messages.len()).unwrap_or(u32::MAX),
                tokens_before: before,
                tokens_after: self.context_tokens(),
            },
        );
    }
}
