//! The arguments of `caret admin …` and `caret whoami`.

use std::path::PathBuf;

use caret_host::config::Config;

/// Where the server keeps its data (shared by `serve` and `admin`).
#[derive(Debug, clap::Args)]
pub struct StorageArgs {
    /// Data directory (SQLite file and local objects by default); default $CARET_HOME/server.
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// `sqlite://FILE` or `postgres://…` (env CARET_DATABASE_URL).
    #[arg(long)]
    pub database_url: Option<String>,
    /// A directory, or `s3://bucket/prefix` with AWS_* settings from the environment
    /// (env CARET_OBJECT_STORE).
    #[arg(long)]
    pub object_store: Option<String>,
}

impl StorageArgs {
    /// Puts these settings into `config`.
    pub fn apply(&self, config: &mut Config) {
        if let Some(d) = &self.data_dir {
            config.server.data_dir = Some(d.clone());
        }
        if let Some(u) = &self.database_url {
            config.server.database_url = Some(u.clone());
        }
        if let Some(o) = &self.object_store {
            config.server.object_store = Some(o.clone());
        }
    }
}

/// `caret admin …`.
#[derive(Debug, clap::Subcommand)]
pub enum AdminCommand {
    /// The first owner of an organisation, made on the server host: the organisation (a
    /// tenant) if it is new, the person, and a personal token with every scope, printed once.
    /// With `caret admin … --server`, nothing else needs the database's credentials.
    Bootstrap {
        /// The organisation's name.
        #[arg(long)]
        organisation: String,
        /// The owner's email.
        #[arg(long)]
        email: String,
        /// The owner's name.
        #[arg(long, default_value = "")]
        name: String,
        /// Days until the token expires.
        #[arg(long, default_value_t = 90)]
        days: u32,
        /// Where the server keeps its data.
        #[command(flatten)]
        storage: StorageArgs,
    },
    /// Invite someone by email: a single-use code for `caret login --invitation` (through the
    /// admin API).
    Invite {
        /// Their email.
        email: String,
        /// `member` (default), `admin` or `owner`.
        #[arg(long)]
        role: Option<String>,
        /// Days until it expires (1 to 30).
        #[arg(long, default_value_t = 7)]
        days: u32,
        /// The team server and a token.
        #[command(flatten)]
        server: ServerArgs,
    },
    /// People of the organisation (through the admin API).
    #[command(subcommand)]
    User(UserCommand),
    /// Groups of people (through the admin API).
    #[command(subcommand)]
    Group(GroupCommand),
    /// The audit trail: the organisation's records (through the admin API), or `verify`.
    Audit(AuditArgs),
    /// Tenants.
    #[command(subcommand)]
    Tenant(TenantCommand),
    /// Tokens: with --server, the organisation's (through the admin API); without, a tenant
    /// token made in the database.
    #[command(subcommand)]
    Token(TokenCommand),
    /// Operator tokens: for `caret worker` processes and the fleet dashboard.
    #[command(subcommand)]
    OperatorToken(OperatorTokenCommand),
    /// Recovery admission of the model gateway: after an incident, admit a stable share of
    /// tenants that widens over time, on every replica.
    #[command(subcommand)]
    Recovery(RecoveryCommand),
    /// Feature flags and kill switches, per capability (`sync`, `embedding`, `search.hybrid`,
    /// `search.lexical`, `search.semantic`, `tab`, `apply`, `agent`, `runs`, `rollouts`,
    /// `model.<alias>`, `deployment.<name>`, `experiment.<name>`): every replica applies a
    /// change within a second or two, without a restart.
    #[command(subcommand)]
    Flags(FlagsCommand),
    /// Model tokens the organisation's people spent, per person, model and group, through
    /// the admin API.
    Spend {
        /// Days back, today included.
        #[arg(long, default_value_t = 7)]
        days: i64,
        /// The team server and a token.
        #[command(flatten)]
        server: ServerArgs,
    },
    /// Usage telemetry (when `[usage] collect` is on): counts, failures and latencies per
    /// tenant, event and label, from the hourly files in the object store.
    Usage {
        /// Only this tenant (by name).
        #[arg(long)]
        tenant: Option<String>,
        /// From when: a span back from now (`90m`, `24h`, `7d`) or an hour or day UTC
        /// (`2026-11-26T15`, `2026-11-26`).
        #[arg(long, default_value = "7d")]
        since: String,
        /// As JSON.
        #[arg(long)]
        json: bool,
        /// Where the server keeps its data.
        #[command(flatten)]
        storage: StorageArgs,
    },
}

/// `caret admin flags …`.
#[derive(Debug, clap::Subcommand)]
pub enum FlagsCommand {
    /// Set a flag on or off, for every tenant or one, for all or a percentage of tenants.
    Set {
        /// The flag.
        name: String,
        /// `on` or `off`.
        state: String,
        /// Only this tenant (by name); its rule wins over the rule for all.
        #[arg(long)]
        tenant: Option<String>,
        /// The share of tenants (0-100, by a stable hash) the state applies to; the rest get
        /// the opposite.
        #[arg(long, default_value_t = 100)]
        percent: u8,
        /// Why (kept for operators).
        #[arg(long, default_value = "")]
        reason: String,
        /// Where the server keeps its data.
        #[command(flatten)]
        storage: StorageArgs,
    },
    /// The rules in force.
    List {
        /// As JSON.
        #[arg(long)]
        json: bool,
        /// Where the server keeps its data.
        #[command(flatten)]
        storage: StorageArgs,
    },
    /// Remove a flag's rule (for every tenant, or one): back to the default.
    Clear {
        /// The flag.
        name: String,
        /// Only this tenant's rule (by name).
        #[arg(long)]
        tenant: Option<String>,
        /// Where the server keeps its data.
        #[command(flatten)]
        storage: StorageArgs,
    },
}

/// `caret admin recovery …`.
#[derive(Debug, clap::Subcommand)]
pub enum RecoveryCommand {
    /// Start (or restart) it.
    Start {
        /// Share of tenants admitted at once (0 to 1).
        #[arg(long, default_value_t = 0.1)]
        from: f64,
        /// Seconds until every tenant is admitted.
        #[arg(long, default_value_t = 600)]
        ramp_s: u64,
        /// Where the server keeps its data.
        #[command(flatten)]
        storage: StorageArgs,
    },
    /// End it: admit everyone now.
    Stop {
        /// Where the server keeps its data.
        #[command(flatten)]
        storage: StorageArgs,
    },
    /// Whether it is on, and the share admitted now.
    Status {
        /// Where the server keeps its data.
        #[command(flatten)]
        storage: StorageArgs,
    },
}

/// `caret admin operator-token …`.
#[derive(Debug, clap::Subcommand)]
pub enum OperatorTokenCommand {
    /// Create one; it is printed once and only its hash is stored.
    Create {
        /// A label for the token.
        #[arg(long, default_value = "operator")]
        name: String,
        /// Where the server keeps its data.
        #[command(flatten)]
        storage: StorageArgs,
    },
}

/// `caret admin tenant …`.
#[derive(Debug, clap::Subcommand)]
pub enum TenantCommand {
    /// Create a tenant.
    Create {
        /// Its name.
        name: String,
        /// Where the server keeps its data.
        #[command(flatten)]
        storage: StorageArgs,
    },
    /// List tenants.
    List {
        /// Where the server keeps its data.
        #[command(flatten)]
        storage: StorageArgs,
    },
}

/// `caret admin token …`.
#[derive(Debug, clap::Subcommand)]
pub enum TokenCommand {
    /// Make a token, printed once (only its hash is stored): with --server, a service
    /// account's through the admin API; without, a tenant token in the database (--tenant).
    Create {
        /// The tenant's name (a tenant token made in the database).
        #[arg(long, conflicts_with = "server")]
        tenant: Option<String>,
        /// A label for the token.
        #[arg(long, default_value = "default")]
        name: String,
        /// Scopes, comma-separated (`search,sync`, `all`; default: all but `admin`).
        #[arg(long, value_delimiter = ',')]
        scopes: Vec<String>,
        /// The service account's role (`member` or `admin`).
        #[arg(long)]
        role: Option<String>,
        /// The identity provider's SCIM token (it opens /scim/v2 only).
        #[arg(long, conflicts_with_all = ["role", "scopes"])]
        scim: bool,
        /// Days until it expires.
        #[arg(long)]
        days: Option<u32>,
        /// The team server and a token.
        #[command(flatten)]
        server: ServerArgs,
        /// Where the server keeps its data.
        #[command(flatten)]
        storage: StorageArgs,
    },
    /// The organisation's tokens.
    Ls {
        /// The team server and a token.
        #[command(flatten)]
        server: ServerArgs,
    },
    /// Revoke a token (every replica refuses it within seconds).
    Revoke {
        /// Its id.
        id: String,
        /// The team server and a token.
        #[command(flatten)]
        server: ServerArgs,
    },
}

/// A team server and a token for its API.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ServerArgs {
    /// The `caret serve` URL (env CARET_SERVER).
    #[arg(long, env = "CARET_SERVER")]
    pub server: Option<String>,
    /// A token of the organisation (env CARET_TOKEN).
    #[arg(long, env = "CARET_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// `caret admin user …`.
#[derive(Debug, clap::Subcommand)]
pub enum UserCommand {
    /// The organisation's people.
    Ls {
        /// The team server and a token.
        #[command(flatten)]
        server: ServerArgs,
    },
    /// Add a person.
    Add {
        /// Their email.
        email: String,
        /// Their name.
        #[arg(long, default_value = "")]
        name: String,
        /// `member` (default), `admin` or `owner`.
        #[arg(long)]
        role: Option<String>,
        /// The team server and a token.
        #[command(flatten)]
        server: ServerArgs,
    },
    /// Give a person a role.
    Role {
        /// Their id or email.
        user: String,
        /// `member`, `admin` or `owner`.
        role: String,
        /// The team server and a token.
        #[command(flatten)]
        server: ServerArgs,
    },
    /// Deactivate a person: every token and session of theirs ends at once.
    Deactivate {
        /// Their id or email.
        user: String,
        /// The team server and a token.
        #[command(flatten)]
        server: ServerArgs,
    },
    /// Activate a person again (their old tokens stay revoked).
    Activate {
        /// Their id or email.
        user: String,
        /// The team server and a token.
        #[command(flatten)]
        server: ServerArgs,
    },
}

/// `caret admin group …`.
#[derive(Debug, clap::Subcommand)]
pub enum GroupCommand {
    /// The organisation's groups.
    Ls {
        /// The team server and a token.
        #[command(flatten)]
        server: ServerArgs,
    },
    /// Make a group.
    Create {
        /// Its name.
        name: String,
        /// The team server and a token.
        #[command(flatten)]
        server: ServerArgs,
    },
    /// Delete a group.
    Rm {
        /// Its name or id.
        group: String,
        /// The team server and a token.
        #[command(flatten)]
        server: ServerArgs,
    },
    /// The model aliases a group's members may use (a person in groups with lists may use
    /// any of theirs; in none, every alias; others answer 403 `model_not_allowed`).
    Models {
        /// The group's name or id.
        group: String,
        /// The aliases.
        #[arg(required_unless_present = "clear")]
        models: Vec<String>,
        /// This group restricts nothing.
        #[arg(long, conflicts_with = "models")]
        clear: bool,
        /// The team server and a token.
        #[command(flatten)]
        server: ServerArgs,
    },
    /// A daily budget of model tokens for each of a group's members (a person's is the
    /// largest of their groups'; at 80% answers carry a warning, at 100% model calls answer 429
    /// until 00:00 UTC).
    Budget {
        /// The group's name or id.
        group: String,
        /// Tokens a day.
        #[arg(required_unless_present = "clear")]
        tokens: Option<i64>,
        /// This group sets no budget.
        #[arg(long, conflicts_with = "tokens")]
        clear: bool,
        /// The team server and a token.
        #[command(flatten)]
        server: ServerArgs,
    },
    /// Put a person in a group.
    Add {
        /// The group's name or id.
        group: String,
        /// The person's id or email.
        user: String,
        /// The team server and a token.
        #[command(flatten)]
        server: ServerArgs,
    },
    /// Take a person out of a group.
    Remove {
        /// The group's name or id.
        group: String,
        /// The person's id or email.
        user: String,
        /// The team server and a token.
        #[command(flatten)]
        server: ServerArgs,
    },
}

/// `caret admin audit`: the records, or `verify`.
#[derive(Debug, clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct AuditArgs {
    /// Check the chain instead.
    #[command(subcommand)]
    pub verify: Option<AuditVerify>,
    /// From when: a span back from now (`90m`, `24h`, `7d`).
    #[arg(long)]
    pub since: Option<String>,
    /// Only this person's (id or email).
    #[arg(long)]
    pub user: Option<String>,
    /// The team server and a token.
    #[command(flatten)]
    pub server: ServerArgs,
}

/// `caret admin audit verify`.
#[derive(Debug, clap::Subcommand)]
pub enum AuditVerify {
    /// Check the hash chain of the whole trail: an altered, inserted or deleted record is
    /// reported. With --server through the admin API, else in the database.
    Verify {
        /// The team server and a token.
        #[command(flatten)]
        server: ServerArgs,
        /// Where the server keeps its data.
        #[command(flatten)]
        storage: StorageArgs,
    },
}

/// `caret login`: signs in to a team server through its identity provider (a browser, or
/// `--device` on a machine without one), or keeps a token you have; what it keeps under
/// `$CARET_HOME` (mode 0600) every client then uses for that server.
#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("with").args(["invitation", "token", "device", "ldap"])))]
pub struct LoginArgs {
    /// The `caret serve` URL (env CARET_SERVER).
    #[arg(long, env = "CARET_SERVER")]
    pub server: String,
    /// An invitation's code (`caret admin invite`): you join and get your first token.
    #[arg(long)]
    pub invitation: Option<String>,
    /// A token you have (a personal access token, a service account's).
    #[arg(long)]
    pub token: Option<String>,
    /// Your name, when joining.
    #[arg(long, default_value = "")]
    pub name: String,
    /// Sign in on another device's browser (a code to confirm), for a machine without one.
    #[arg(long)]
    pub device: bool,
    /// Print the sign-in address instead of opening a browser.
    #[arg(long)]
    pub no_browser: bool,
    /// Sign in with this directory (LDAP) user name; the password is read from
    /// `CARET_PASSWORD` or, without echo, from the terminal.
    #[arg(long, value_name = "USERNAME")]
    pub ldap: Option<String>,
}
