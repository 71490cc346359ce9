//! Prompts for local models: the ChatML conversation format (Qwen, SmolLM and most open chat
//! models) with Qwen's tool-calling convention, and fill-in-the-middle.
//!
//! The model file's own template (GGUF `tokenizer.chat_template`, Jinja) decides which format
//! applies; Caret renders the known formats in Rust instead of running Jinja, and checks the
//! rendering against the templates' reference output in tests.

use caret_protocol::llm::{ChatMessage, ChatRequest, Role};

/// How a model wants its conversation written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChatFormat {
    /// `<|im_start|>role\n…<|im_end|>\n` turns; tools as Qwen/Hermes `<tools>` + `<tool_call>`.
    ChatMl {
        /// The system prompt the template inserts when the conversation has none.
        default_system: Option<String>,
    },
}

impl ChatFormat {
    /// The format a model's Jinja chat template describes; ChatML when there is none.
    pub fn from_template(template: Option<&str>) -> Result<ChatFormat, String> {
        let Some(t) = template else {
            return Ok(ChatFormat::ChatMl { default_system: None });
        };
        if !t.contains("<|im_start|>") {
            return Err("the model's chat template is not ChatML; only ChatML models (Qwen, SmolLM, …) can chat \
                        in-process (completions work with any model)"
                .to_owned());
        }
        Ok(ChatFormat::ChatMl { default_system: default_system(t) })
    }
}

/// The literal system prompt a ChatML template inserts by default, if it has one: the text
/// between `<|im_start|>system` + newline (escaped or not) and `<|im_end|>` inside a string
/// literal, or a string literal that is the `else` of a `messages[0]['role'] == 'system'` test.
fn default_system(template: &str) -> Option<String> {
    const OPEN: &str = "<|im_start|>system";
    let mut rest = template;
    while let Some(at) = rest.find(OPEN) {
        rest = &rest[at + OPEN.len()..];
        let body = rest.strip_prefix("\\n").or_else(|| rest.strip_prefix('\n'));
        if let Some(body) = body
            && let Some(end) = body.find("<|im_end|>")
        {
            let text = &body[..end];
            if !text.is_empty() && !text.contains(['\'', '"', '{', '}', '+']) {
                return Some(text.replace("\\n", "\n"));
            }
        }
    }
    None
}

/// The system block Qwen's template writes when tools are offered.
fn tools_block(system: &str, req: &ChatRequest) -> String {
    let mut s = String::from(system);
    s.push_str(
        "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n\
         You are provided with function signatures within <tools></tools> XML tags:\n<tools>",
    );
    for tool in &req.tools {
        s.push('\n');
        s.push_str(&tool_json(tool));
    }
    s.push_str(
        "\n</tools>\n\nFor each function call, return a json object with function name and arguments within \
         <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": \
         <args-json-object>}\n</tool_call>",
    );
    s
}

/// A tool as Jinja's `tojson` writes it (`", "` and `": "` separators; keys sorted).
fn tool_json(tool: &caret_protocol::llm::Tool) -> String {
    serde_json::to_value(tool).map_or_else(|_| String::new(), |v| python_json(&v))
}

/// JSON with Python's default separators (`, ` and `: `), as the templates' `tojson` writes.
pub(crate) fn python_json(v: &serde_json::Value) -> String {
    use serde_json::Value;
    match v {
        Value::Array(items) => format!("[{}]", items.iter().map(python_json).collect::<Vec<_>>().join(", ")),
        Value::Object(map) => format!(
            "{{{}}}",
            map.iter()
                .map(|(k, v)| format!("{}: {}", Value::String(k.clone()), python_json(v)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        scalar => scalar.to_string(),
    }
}

/// Tool-call arguments as the template writes them: the JSON object itself when the string
/// holds one (OpenAI sends arguments as a string), else the string as JSON.
fn arguments_json(arguments: &str) -> String {
    match serde_json::from_str::<serde_json::Value>(arguments) {
        Ok(v @ serde_json::Value::Object(_)) => python_json(&v),
        _ => serde_json::Value::String(arguments.to_owned()).to_string(),
    }
}

/// A piece of a prompt as the engine reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    /// Text to tokenise (special tokens such as `<|im_start|>` parsed).
    Text(String),
    /// Token ids the model sampled earlier, read back as they are (never tokenised again).
    Sampled(Vec<u32>),
    /// The end of a sampled turn: this marker's tokens, unless the sampled ids already end
    /// with an end-of-generation token.
    EndOfTurn(&'static str),
}

/// A prompt being written: text runs, with sampled ids spliced in.
#[derive(Default)]
struct Writer {
    pieces: Vec<Piece>,
    text: String,
}

impl Writer {
    fn push_str(&mut self, s: &str) {
        self.text.push_str(s);
    }

    fn push(&mut self, c: char) {
        self.text.push(c);
    }

    fn splice(&mut self, piece: Piece) {
        if !self.text.is_empty() {
            self.pieces.push(Piece::Text(std::mem::take(&mut self.text)));
        }
        self.pieces.push(piece);
    }

    fn finish(mut self) -> Vec<Piece> {
        if !self.text.is_empty() {
            self.pieces.push(Piece::Text(self.text));
        }
        self.pieces
    }
}

fn turn(out: &mut Writer, role: &str, content: &str) {
    out.push_str("<|im_start|>");
    out.push_str(role);
    out.push('\n');
    out.push_str(content);
    out.push_str("<|im_end|>\n");
}

/// The prompt for a chat request, ending with the opened assistant turn, as text (assistant
/// messages written from their text, sampled ids or not).
pub fn chat_prompt(format: &ChatFormat, req: &ChatRequest) -> String {
    render(format, req, false)
        .into_iter()
        .map(|p| match p {
            Piece::Text(t) => t,
            Piece::Sampled(_) | Piece::EndOfTurn(_) => String::new(),
        })
        .collect()
}

/// The prompt for a chat request as the engine reads it: an assistant message that carries
/// the ids its model sampled is those ids, so that a conversation's tokens only ever grow
/// (what an RL trainer needs); the rest is text.
pub fn chat_pieces(format: &ChatFormat, req: &ChatRequest) -> Vec<Piece> {
    render(format, req, true)
}

fn render(format: &ChatFormat, req: &ChatRequest, sampled: bool) -> Vec<Piece> {
    let ChatFormat::ChatMl { default_system } = format;
    let mut out = Writer::default();
    let messages = &req.messages;
    let leading_system = messages.first().filter(|m| m.role == Role::System);
    let system = leading_system.map(ChatMessage::content_text).or_else(|| default_system.clone());
    let offer_tools = !req.tools.is_empty() && req.tool_choice.as_ref().is_none_or(|c| c != "none");
    match (offer_tools, system) {
        (true, system) => turn(&mut out, "system", &tools_block(system.as_deref().unwrap_or_default(), req)),
        (false, Some(system)) => turn(&mut out, "system", &system),
        (false, None) => {}
    }
    let skip = usize::from(leading_system.is_some());
    let mut i = skip;
    while i < messages.len() {
        let m = &messages[i];
        match m.role {
            Role::Tool => {
                // Consecutive tool answers share one user turn.
                out.push_str("<|im_start|>user");
                while let Some(t) = messages.get(i).filter(|t| t.role == Role::Tool) {
                    out.push_str("\n<tool_response>\n");
                    out.push_str(&t.content_text());
                    out.push_str("\n</tool_response>");
                    i += 1;
                }
                out.push_str("<|im_end|>\n");
                continue;
            }
            Role::Assistant if sampled && m.token_ids.as_ref().is_some_and(|ids| !ids.is_empty()) => {
                // The generation prompt, then what was sampled after it.
                out.push_str("<|im_start|>assistant\n");
                out.splice(Piece::Sampled(m.token_ids.clone().unwrap_or_default()));
                out.splice(Piece::EndOfTurn("<|im_end|>"));
                out.push('\n');
            }
            Role::Assistant if !m.tool_calls.is_empty() => {
                out.push_str("<|im_start|>assistant");
                let text = m.content_text();
                if !text.is_empty() {
                    out.push('\n');
                    out.push_str(&text);
                }
                for call in &m.tool_calls {
                    out.push_str("\n<tool_call>\n{\"name\": ");
                    out.push_str(&serde_json::Value::String(call.function.name.clone()).to_string());
                    out.push_str(", \"arguments\": ");
                    out.push_str(&arguments_json(&call.function.arguments));
                    out.push_str("}\n</tool_call>");
                }
                out.push_str("<|im_end|>\n");
            }
            _ => turn(&mut out, role_name(m.role), &m.content_text()),
        }
        i += 1;
    }
    out.push_str("<|im_start|>assistant\n");
    out.finish()
}

fn role_name(role: Role) -> &'static str {
    match role {
        Role::System => "system",
        Role::User => "user",
        Role::Assistant => "assistant",
        Role::Tool => "tool",
    }
}

#[cfg(test)]
mod tests {
    use caret_protocol::llm::{FunctionCall, FunctionDef, Tool, ToolCall};

    use super::*;

    const QWEN_TEMPLATE_HEAD: &str = "{%- if tools %}\n    {{- '<|im_start|>system\\n' }}\n    {%- if messages[0]['role'] == 'system' %}\n        {{- messages[0]['content'] }}\n    {%- else %}\n        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}\n    {%- endif %}\n{%- else %}\n    {%- if messages[0]['role'] == 'system' %}\n        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n    {%- else %}\n        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}\n    {%- endif %}\n{%- endif %}";
    const SMOL_TEMPLATE: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    fn req(messages: Vec<ChatMessage>, tools: Vec<Tool>) -> ChatRequest {
        serde_json::from_value::<ChatRequest>(serde_json::json!({"model": "m", "messages": []}))
            .map(|mut r| {
                r.messages = messages;
                r.tools = tools;
                r
            })
            .unwrap()
    }

    #[test]
    fn the_default_system_prompt_is_read_from_the_template() {
        assert_eq!(
            ChatFormat::from_template(Some(QWEN_TEMPLATE_HEAD)).unwrap(),
            ChatFormat::ChatMl {
                default_system: Some("You are Qwen, created by Alibaba Cloud. You are a helpful assistant.".to_owned())
            }
        );
        assert_eq!(
            ChatFormat::from_template(Some(SMOL_TEMPLATE)).unwrap(),
            ChatFormat::ChatMl {
                default_system: Some("You are a helpful AI assistant named SmolLM, trained by Hugging Face".to_owned())
            }
        );
        assert!(ChatFormat::from_template(Some("{{ '[INST]' }}")).unwrap_err().contains("ChatML"));
    }

    #[test]
    fn a_plain_conversation_renders_as_the_template_does() {
        let format = ChatFormat::from_template(Some(SMOL_TEMPLATE)).unwrap();
        let r = req(
            vec![
                ChatMessage::text(Role::User, "hi"),
                ChatMessage::text(Role::Assistant, "hello"),
                ChatMessage::text(Role::User, "2+2?"),
            ],
            vec![],
        );
        assert_eq!(
            chat_prompt(&format, &r),
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n\
             <|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nhello<|im_end|>\n\
             <|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n"
        );
        let own = req(vec![ChatMessage::text(Role::System, "Be terse."), ChatMessage::text(Role::User, "hi")], vec![]);
        assert_eq!(
            chat_prompt(&format, &own),
            "<|im_start|>system\nBe terse.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn tools_calls_and_answers_render_as_qwens_template_does() {
        let format = ChatFormat::from_template(Some(QWEN_TEMPLATE_HEAD)).unwrap();
        let tool = Tool {
            kind: "function".to_owned(),
            function: FunctionDef {
                name: "read_file".to_owned(),
                description: Some("Read a file".to_owned()),
                parameters: Some(serde_json::json!({"type": "object", "properties": {"path": {"type": "string"}}})),
            },
        };
        let mut call = ChatMessage::text(Role::Assistant, "");
        call.content = None;
        call.tool_calls = vec![ToolCall {
            id: "call_1".to_owned(),
            kind: "function".to_owned(),
            function: FunctionCall { name: "read_file".to_owned(), arguments: "{\"path\":\"a.rs\"}".to_owned() },
        }];
        let mut answer = ChatMessage::text(Role::Tool, "fn main() {}");
        answer.tool_call_id = Some("call_1".to_owned());
        let mut answer2 = ChatMessage::text(Role::Tool, "second");
        answer2.tool_call_id = Some("call_2".to_owned());
        let r = req(vec![ChatMessage::text(Role::User, "read a.rs"), call, answer, answer2], vec![tool]);
        // As the template's `tojson`, except that keys come sorted (JSON objects here are
        // ordered maps); the model reads either.
        let expected = "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.\n\n\
# Tools\n\nYou may call one or more functions to assist with the user query.\n\n\
You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n\
{\"function\": {\"description\": \"Read a file\", \"name\": \"read_file\", \
\"parameters\": {\"properties\": {\"path\": {\"type\": \"string\"}}, \"type\": \"object\"}}, \"type\": \"function\"}\n</tools>\n\n\
For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n\
<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n\
<|im_start|>user\nread a.rs<|im_end|>\n\
<|im_start|>assistant\n<tool_call>\n{\"name\": \"read_file\", \"arguments\": {\"path\": \"a.rs\"}}\n</tool_call><|im_end|>\n\
<|im_start|>user\n<tool_response>\nfn main() {}\n</tool_response>\n<tool_response>\nsecond\n</tool_response><|im_end|>\n\
<|im_start|>assistant\n";
        assert_eq!(chat_prompt(&format, &r), expected);
    }

    #[test]
    fn sampled_ids_are_spliced_in_after_the_generation_prompt() {
        let format = ChatFormat::ChatMl { default_system: None };
        let mut answer = ChatMessage::text(Role::Assistant, "hello");
        answer.token_ids = Some(vec![7, 8, 9]);
        let r = req(vec![ChatMessage::text(Role::User, "hi"), answer, ChatMessage::text(Role::User, "more")], vec![]);
        assert_eq!(
            chat_pieces(&format, &r),
            [
                Piece::Text("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n".to_owned()),
                Piece::Sampled(vec![7, 8, 9]),
                Piece::EndOfTurn("<|im_end|>"),
                Piece::Text("\n<|im_start|>user\nmore<|im_end|>\n<|im_start|>assistant\n".to_owned()),
            ]
        );
        // The first turn's whole prompt is a prefix of the second's text up to the splice.
        let first = chat_prompt(&format, &req(vec![ChatMessage::text(Role::User, "hi")], vec![]));
        assert_eq!(chat_pieces(&format, &r)[0], Piece::Text(first));
        // As text, the message is written from its content.
        assert!(chat_prompt(&format, &r).contains("<|im_start|>assistant\nhello<|im_end|>\n<|im_start|>user\nmore"));
    }
}
