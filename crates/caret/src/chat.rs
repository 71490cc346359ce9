//! `caret chat`: a conversation with a model of the gateway — the embedded one (from the
//! `[[models]]` of the config) or a server's (`--server`).

use std::io::{BufRead as _, IsTerminal as _, Write as _};
use std::process::ExitCode;

use anyhow::Context as _;
use caret_models::Event;
use caret_protocol::llm::{ChatMessage, ChatRequest, Role};
use futures::StreamExt as _;

use caret_host::backend::Backend;
use caret_host::config::Config;
use caret_host::runtime::runtime;

#[derive(Debug, clap::Args)]
pub struct ChatArgs {
    /// The message; without one, a conversation on standard input (one line a turn).
    message: Option<String>,
    /// Model alias (default: the first configured, or `chat` on a server).
    #[arg(long, short)]
    model: Option<String>,
    /// A system prompt.
    #[arg(long)]
    system: Option<String>,
    /// Most tokens an answer may have.
    #[arg(long, default_value_t = 1024)]
    max_tokens: u32,
    /// Sampling temperature (0: always the likeliest token; default: the model's).
    #[arg(long)]
    temperature: Option<f32>,
    /// Talk to this server's gateway instead of the embedded one (env CARET_SERVER).
    #[arg(long, env = "CARET_SERVER")]
    server: Option<String>,
    /// API token for --server (env CARET_TOKEN).
    #[arg(long, env = "CARET_TOKEN", hide_env_values = true)]
    token: Option<String>,
}

pub fn run(config: &Config, args: ChatArgs) -> anyhow::Result<ExitCode> {
    let (backend, model) =
        Backend::connect(config, args.server.as_deref(), args.token.as_deref(), args.model.as_deref(), &[], "chat")?
            .context(
                "no models are configured: add [[models]] to the config (see the README; for a local model, \
                 `caret models pull qwen2.5-coder-1.5b-instruct-q4` and a deployment with provider = \"local\"), \
                 or use --server",
            )?;
    let mut history: Vec<ChatMessage> = args.system.iter().map(|s| ChatMessage::text(Role::System, s)).collect();
    let rt = runtime()?;
    let turn = |history: &mut Vec<ChatMessage>, text: String| -> anyhow::Result<()> {
        history.push(ChatMessage::text(Role::User, text));
        let mut req = ChatRequest::new(model.clone(), history.clone());
        req.max_tokens = Some(args.max_tokens);
        req.temperature = args.temperature;
        let answer = rt.block_on(async {
            let mut stream = backend.chat(req).await?;
            let mut answer = String::new();
            let mut out = std::io::stdout().lock();
            while let Some(event) = stream.next().await {
                if let Event::Text(t) = event? {
                    answer.push_str(&t);
                    let _ = out.write_all(t.as_bytes());
                    let _ = out.flush();
                }
            }
            let _ = writeln!(out);
            Ok::<_, caret_models::Error>(answer)
        })?;
        history.push(ChatMessage::text(Role::Assistant, answer));
        Ok(())
    };
    if let Some(message) = args.message {
        turn(&mut history, message)?;
        return Ok(ExitCode::SUCCESS);
    }
    let stdin = std::io::stdin();
    let tty = stdin.is_terminal();
    loop {
        if tty {
            eprint!("> ");
        }
        let mut line = String::new();
        if stdin.lock().read_line(&mut line)? == 0 || line.trim() == "/exit" {
            break;
        }
        if !line.trim().is_empty() {
            turn(&mut history, line.trim().to_owned())?;
        }
    }
    Ok(ExitCode::SUCCESS)
}
