//! Where model answers come from for a front end: the gateway in this process (from the
//! config's `[[models]]`) or a server's gateway over HTTP, behind one type.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use caret_models::{CallContext, Class, EventStream, Gateway, Provider};
use caret_protocol::llm::ChatRequest;

use crate::config::Config;

/// Where answers come from: a gateway in this process (calls charged to `tenant`: `local`
/// for the embedded one, the caller's on a team's page) or a server's.
pub enum Backend {
    /// The gateway in this process, calls charged to `tenant`.
    Embedded {
        /// The gateway.
        gateway: Arc<Gateway>,
        /// Whose quotas the calls count against.
        tenant: String,
    },
    /// A server's gateway over its OpenAI-compatible API.
    Server(caret_models::openai::OpenAiProvider),
}

impl Backend {
    /// A chat completion, streamed.
    pub async fn chat(&self, req: ChatRequest) -> caret_models::Result<EventStream> {
        match self {
            Backend::Embedded { gateway, tenant } => {
                gateway.chat(req, CallContext::new(Class::Interactive, Duration::from_secs(600), tenant.clone())).await
            }
            Backend::Server(p) => p.chat(req).await,
        }
    }

    /// A text completion, streamed.
    pub async fn complete(&self, req: caret_protocol::llm::CompletionRequest) -> caret_models::Result<EventStream> {
        match self {
            Backend::Embedded { gateway, tenant } => {
                gateway
                    .complete(req, CallContext::new(Class::Interactive, Duration::from_secs(30), tenant.clone()))
                    .await
            }
            Backend::Server(p) => p.complete(req).await,
        }
    }

    /// A text completion read to its end: the text, and whether it ended by itself or at a
    /// stop sequence (rather than at the token limit).
    pub async fn complete_text(
        &self,
        req: caret_protocol::llm::CompletionRequest,
    ) -> caret_models::Result<(String, bool)> {
        use futures::StreamExt as _;
        let mut stream = self.complete(req).await?;
        let (mut out, mut ended) = (String::new(), false);
        while let Some(e) = stream.next().await {
            match e? {
                caret_models::Event::Text(t) => out.push_str(&t),
                caret_models::Event::Finish(r) => ended = r == caret_protocol::llm::FinishReason::Stop,
                _ => {}
            }
        }
        Ok((out, ended))
    }

    /// The server's gateway (with `token`) or the embedded one, and the model alias to use:
    /// `model`, else the first of `preferred` the embedded gateway has, else its first alias
    /// (a server's: `server_default`). `None`: no server and no models configured.
    pub fn connect(
        config: &Config,
        server: Option<&str>,
        token: Option<&str>,
        model: Option<&str>,
        preferred: &[&str],
        server_default: &str,
    ) -> anyhow::Result<Option<(Backend, String)>> {
        if let Some(url) = server {
            let token = token.context("--server needs an API token: --token or CARET_TOKEN")?;
            let provider = caret_models::openai::OpenAiProvider::new(url, Some(token.to_owned()))?.caret_upstream();
            return Ok(Some((Backend::Server(provider), model.unwrap_or(server_default).to_owned())));
        }
        let Some(gateway) = config.gateway()? else { return Ok(None) };
        let model = Backend::alias(&gateway, model, preferred)?;
        Ok(Some((Backend::Embedded { gateway, tenant: "local".to_owned() }, model)))
    }

    /// `model`, else the first of `preferred` that `gateway` has, else its first alias.
    pub fn alias(gateway: &Gateway, model: Option<&str>, preferred: &[&str]) -> anyhow::Result<String> {
        let aliases = gateway.aliases();
        match model {
            Some(m) => Ok(m.to_owned()),
            None => preferred
                .iter()
                .find(|p| aliases.iter().any(|a| a == *p))
                .map(|p| (*p).to_owned())
                .or_else(|| aliases.first().cloned())
                .context("no model aliases"),
        }
    }
}
