//! `caret mcp serve`: Caret as an MCP server over stdio, for the workspace it runs in, so that
//! other agents can use what only Caret has: `codebase_search` (the synced index: hits with
//! paths, lines and the code read from the local disk) and `grep` (the agent's own, honouring
//! the ignore files), and `docs_search` (the documentation sources of `caret docs add`, when
//! there are any). The tools' schemas come from their argument types.

use std::path::PathBuf;

use rmcp::ErrorData;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ListToolsResult, PaginatedRequestParams,
    ServerConfig,
};
use rmcp::service::{MaybeSendFuture, RequestContext, RoleServer};
use serde::Deserialize;

use crate::config::Config;
use crate::remote::Remote;

/// `codebase_search`'s arguments.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SearchArgs {
    /// What to look for, in words (a concept, a behaviour) or names.
    pub query: String,
    /// How many hits (default 10, at most 50).
    #[serde(default)]
    pub k: Option<usize>,
}

/// `docs_search`'s arguments.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DocsArgs {
    /// A question about a library or tool whose documentation was added.
    pub query: String,
    /// One source by name (default: all).
    #[serde(default)]
    pub source: Option<String>,
    /// How many hits (default 5, at most 20).
    #[serde(default)]
    pub k: Option<usize>,
}

/// `grep`'s arguments (the agent's `grep` tool takes the same).
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GrepArgs {
    /// A regular expression (Rust syntax).
    pub pattern: String,
    /// A workspace-relative file or directory to search in (default: the workspace).
    #[serde(default)]
    pub path: Option<String>,
    /// Only files whose name matches this glob (`*.rs`).
    #[serde(default)]
    pub glob: Option<String>,
    /// Ignore case.
    #[serde(default)]
    pub case_insensitive: Option<bool>,
    /// Most matching lines.
    #[serde(default)]
    pub max_matches: Option<u64>,
}

/// The server of one workspace.
pub struct CaretServer {
    config: Config,
    root: PathBuf,
    remote: Remote,
    ctx: caret_agent::tools::Ctx,
    grep: caret_agent::tools::grep::Grep,
    /// Whether this process synced the workspace yet (the first search does).
    synced: tokio::sync::Mutex<bool>,
}

impl CaretServer {
    /// The server of the workspace at `root`, searching the index `remote` names.
    pub fn new(config: Config, root: PathBuf, remote: Remote) -> std::io::Result<CaretServer> {
        let ctx = caret_agent::tools::Ctx::new(&root)?;
        let grep = caret_agent::tools::grep::Grep::new();
        Ok(CaretServer { config, root, remote, ctx, grep, synced: tokio::sync::Mutex::new(false) })
    }

    /// Syncs the workspace once per process, before its first search: a workspace never
    /// indexed is searchable lexically as soon as this returns, and its vectors are computed
    /// in the background. What it did, when it did anything.
    async fn sync_once(&self) -> anyhow::Result<Option<String>> {
        let mut synced = self.synced.lock().await;
        if *synced {
            return Ok(None);
        }
        let ws = crate::remote::open_workspace(&self.config, &self.root)?;
        let transport: std::sync::Arc<dyn caret_client::transport::Transport> =
            std::sync::Arc::from(crate::remote::transport(&self.config, &self.remote).await?);
        let report = crate::remote::engine(&self.config)?.sync(&ws, transport.as_ref()).await?;
        *synced = true;
        let scanner = std::sync::Arc::new(self.config.scanner()?);
        tokio::spawn(async move {
            if let Err(e) = caret_client::index::embed_missing(scanner, &ws, transport.as_ref(), |_| {}).await {
                tracing::warn!("embedding the workspace for codebase_search: {e}");
            }
        });
        let (added, changed, removed) = (report.added, report.modified, report.deleted);
        Ok((added + changed + removed > 0)
            .then(|| format!("(indexed just now: {added} files added, {changed} changed, {removed} removed)")))
    }

    /// Serves on standard input and output until the client goes.
    pub async fn serve_stdio(self) -> anyhow::Result<()> {
        use rmcp::ServiceExt as _;
        let running = self.serve(rmcp::transport::stdio()).await?;
        running.waiting().await?;
        Ok(())
    }

    async fn call(&self, request: CallToolRequestParams) -> Result<CallToolResult, String> {
        let args = serde_json::Value::Object(request.arguments.unwrap_or_default());
        match request.name.as_ref() {
            "codebase_search" => {
                let a: SearchArgs = serde_json::from_value(args).map_err(|e| format!("arguments: {e}"))?;
                let k = a.k.unwrap_or(10).clamp(1, 50);
                let indexed = self.sync_once().await.map_err(|e| format!("indexing the workspace: {e:#}"))?;
                let found = crate::search::search_workspace(
                    &self.config,
                    &self.root,
                    &self.remote,
                    &a.query,
                    k,
                    caret_protocol::SearchMode::Hybrid,
                )
                .await
                .map_err(|e| format!("{e:#}"))?;
                let text: Vec<String> = found
                    .hits
                    .iter()
                    .map(|h| format!("{}:{}-{}\n{}", h.path, h.start_line, h.end_line, h.snippet.trim_end()))
                    .collect();
                let mut text = if text.is_empty() { "no hits".to_owned() } else { text.join("\n\n") };
                if !found.semantic && found.embedded < found.embeddable {
                    text.push_str(&format!(
                        "\n\n(matched by words only for now: {} of {} chunks have vectors, the rest are being \
                         computed)",
                        found.embedded, found.embeddable
                    ));
                }
                if let Some(note) = indexed {
                    text.push_str(&format!("\n\n{note}"));
                }
                Ok(CallToolResult::success(vec![ContentBlock::text(text)]))
            }
            "grep" => {
                use caret_agent::tools::Tool as _;
                let _: GrepArgs = serde_json::from_value(args.clone()).map_err(|e| format!("arguments: {e}"))?;
                let out = self.grep.call(args, &self.ctx).await.map_err(|e| e.to_string())?;
                Ok(CallToolResult::success(vec![ContentBlock::text(out)]))
            }
            "docs_search" => {
                let a: DocsArgs = serde_json::from_value(args).map_err(|e| format!("arguments: {e}"))?;
                let names: Vec<String> = a.source.into_iter().collect();
                let hits = crate::docs::search(&self.config, &a.query, &names, a.k.unwrap_or(5).clamp(1, 20))
                    .await
                    .map_err(|e| format!("{e:#}"))?;
                let structured = serde_json::json!({ "hits": hits });
                let text: Vec<String> = hits
                    .iter()
                    .map(|h| {
                        let heading = if h.heading.is_empty() { String::new() } else { format!(" › {}", h.heading) };
                        format!("{}{heading} — {}\n{}", h.title, h.url, h.text.trim_end())
                    })
                    .collect();
                let text = if text.is_empty() { "no hits".to_owned() } else { text.join("\n\n") };
                let mut result = CallToolResult::success(vec![ContentBlock::text(text)]);
                result.structured_content = Some(structured);
                Ok(result)
            }
            other => Err(format!("there is no tool named {other:?}")),
        }
    }
}

impl rmcp::ServerHandler for CaretServer {
    fn get_info(&self) -> ServerConfig {
        caret_server::mcp::server_info()
    }

    fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> impl Future<Output = Result<ListToolsResult, ErrorData>> + MaybeSendFuture + '_ {
        let mut tools = vec![
            caret_server::mcp::tool::<SearchArgs>(
                "codebase_search",
                "Search the workspace by meaning and by words (Caret's private index of it, kept in step by \
                 `caret sync`): hits with their path, lines and code as it is on disk now.",
            ),
            caret_server::mcp::tool::<GrepArgs>(
                "grep",
                "Search the workspace's files for a regular expression (ignored files left out): matching lines \
                 with their path and line number.",
            ),
        ];
        if !crate::docs::source_names(&self.config).is_empty() {
            tools.push(caret_server::mcp::tool::<DocsArgs>(
                "docs_search",
                "Search the third-party documentation added to Caret (`caret docs add`) by meaning and words: \
                 sections with their page's URL, title and heading.",
            ));
        }
        std::future::ready(Ok(ListToolsResult::with_all_items(tools)))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        Ok(caret_server::mcp::answer(self.call(request).await))
    }
}
