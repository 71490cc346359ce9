//! The commands that open the server's database directly, on the server host: tenants,
//! tenant and operator tokens, recovery, flags, usage, the first owner (`bootstrap`) and a
//! check of the audit chain.

use anyhow::Context as _;
use caret_host::config::Config;
use caret_index::StorageConfig;

use crate::args::{
    AdminCommand, FlagsCommand, OperatorTokenCommand, RecoveryCommand, StorageArgs, TenantCommand, TokenCommand,
};

/// The commands on the database: tenants, tenant tokens, operator tokens, recovery, flags,
/// usage (the rest go through the admin API, see [`crate::api`]).
pub(crate) async fn run(config: &Config, cmd: AdminCommand) -> anyhow::Result<()> {
    let storage_of = |args: &StorageArgs| -> StorageConfig {
        let mut c = config.clone();
        args.apply(&mut c);
        c.storage()
    };
    {
        match cmd {
            AdminCommand::Tenant(TenantCommand::Create { name, storage }) => {
                let service = caret_index::open(&storage_of(&storage)).await?;
                let t = service.db().create_tenant(&name).await?;
                println!("created tenant {} ({})", t.name, t.id);
            }
            AdminCommand::Tenant(TenantCommand::List { storage }) => {
                let service = caret_index::open(&storage_of(&storage)).await?;
                for t in service.db().tenants().await? {
                    println!("{}\t{}", t.name, t.id);
                }
            }
            AdminCommand::Token(TokenCommand::Create { tenant, name, storage, .. }) => {
                let tenant = tenant.context("give --tenant (a tenant token in the database) or --server")?;
                let service = caret_index::open(&storage_of(&storage)).await?;
                let t =
                    service.db().tenant_by_name(&tenant).await?.with_context(|| format!("no tenant named {tenant}"))?;
                println!("{}", service.db().create_token(&t, &name).await?);
                eprintln!("(shown once: only its hash is stored)");
            }
            AdminCommand::OperatorToken(OperatorTokenCommand::Create { name, storage }) => {
                let service = caret_index::open(&storage_of(&storage)).await?;
                println!("{}", service.db().create_operator_token(&name).await?);
                eprintln!("(shown once: only its hash is stored; it lets workers take any tenant's runs)");
            }
            AdminCommand::Recovery(RecoveryCommand::Start { from, ramp_s, storage }) => {
                anyhow::ensure!((0.0..=1.0).contains(&from), "--from is a share between 0 and 1, not {from}");
                let service = caret_index::open(&storage_of(&storage)).await?;
                let permille = (from * 1000.0).round() as i64;
                service.db().start_recovery(permille, i64::try_from(ramp_s).unwrap_or(i64::MAX)).await?;
                println!(
                    "recovery admission on: {:.1}% of tenants now, all in {ramp_s} s (servers pick it up within 5 s)",
                    from * 100.0
                );
            }
            AdminCommand::Flags(FlagsCommand::Set { name, state, tenant, percent, reason, storage }) => {
                let service = caret_index::open(&storage_of(&storage)).await?;
                let tenant_id = crate::usage::tenant_id(service.db(), tenant.as_deref()).await?;
                let rule = caret_index::flags::Rule {
                    name: name.clone(),
                    tenant: tenant_id.clone(),
                    state: caret_index::flags::State::parse(&state)?,
                    percent,
                    reason,
                };
                service.db().set_flag(&rule).await?;
                let outcome = format!("{state} for {}%", percent.min(100));
                flag_recorded(&service, tenant_id.as_deref(), "flag.set", &name, &outcome).await?;
                let whom = tenant.map_or_else(|| "every tenant".to_owned(), |t| format!("tenant {t}"));
                let share = if percent >= 100 { String::new() } else { format!(" ({percent}% of them)") };
                println!("{name} {state} for {whom}{share}; servers apply it within 2 s");
            }
            AdminCommand::Flags(FlagsCommand::List { json, storage }) => {
                let service = caret_index::open(&storage_of(&storage)).await?;
                let names: std::collections::HashMap<String, String> =
                    service.db().tenants().await?.into_iter().map(|t| (t.id, t.name)).collect();
                let flags = service.db().flags().await?;
                let rows: Vec<serde_json::Value> = flags
                    .rules()
                    .iter()
                    .map(|r| {
                        serde_json::json!({
                            "name": r.name,
                            "tenant": r.tenant.as_ref().map(|id| names.get(id).cloned().unwrap_or_else(|| id.clone())),
                            "state": r.state.as_str(),
                            "percent": r.percent,
                            "reason": r.reason,
                        })
                    })
                    .collect();
                if json {
                    println!("{}", serde_json::to_string_pretty(&rows)?);
                } else if rows.is_empty() {
                    println!("no rules: capabilities on, experiments off");
                } else {
                    for r in &rows {
                        println!(
                            "{}\t{}\t{}\t{}%\t{}",
                            r["name"].as_str().unwrap_or(""),
                            r["tenant"].as_str().unwrap_or("(all)"),
                            r["state"].as_str().unwrap_or(""),
                            r["percent"],
                            r["reason"].as_str().unwrap_or("")
                        );
                    }
                }
            }
            AdminCommand::Flags(FlagsCommand::Clear { name, tenant, storage }) => {
                let service = caret_index::open(&storage_of(&storage)).await?;
                let tenant_id = crate::usage::tenant_id(service.db(), tenant.as_deref()).await?;
                let had = service.db().clear_flag(&name, tenant_id.as_deref()).await?;
                let outcome = if had { "ok" } else { "no such rule" };
                flag_recorded(&service, tenant_id.as_deref(), "flag.clear", &name, outcome).await?;
                println!("{}", if had { format!("{name}: rule removed") } else { format!("{name}: no such rule") });
            }
            AdminCommand::Usage { tenant, since, json, storage } => {
                let service = caret_index::open(&storage_of(&storage)).await?;
                crate::usage::report(&service, tenant.as_deref(), &since, json).await?;
            }
            AdminCommand::Recovery(RecoveryCommand::Stop { storage }) => {
                let service = caret_index::open(&storage_of(&storage)).await?;
                service.db().stop_recovery().await?;
                println!("recovery admission off: every tenant is admitted");
            }
            AdminCommand::Recovery(RecoveryCommand::Status { storage }) => {
                let service = caret_index::open(&storage_of(&storage)).await?;
                match service.db().recovery().await? {
                    None => println!("off"),
                    Some(r) => {
                        let now = std::time::SystemTime::now()
                            .duration_since(std::time::UNIX_EPOCH)
                            .map_or(0, |d| d.as_secs() as i64);
                        let elapsed = std::time::Duration::from_secs((now - r.started_at).max(0) as u64);
                        let ramp = std::time::Duration::from_secs(r.ramp_s.max(0) as u64);
                        let share = caret_models::recovery_share(r.from_permille as f64 / 1000.0, ramp, elapsed);
                        println!(
                            "on for {} s: {:.1}% of tenants admitted (ramp {} s)",
                            elapsed.as_secs(),
                            share * 100.0,
                            r.ramp_s
                        );
                    }
                }
            }
            other => anyhow::bail!("not a command on the database: {other:?}"),
        }
        anyhow::Ok(())
    }
}

/// `caret admin bootstrap`: the organisation (made if new), its owner, and a personal token
/// with every scope, printed once.
/// Writes an operator's flag change to the audit trail: the organisation's when the rule is
/// one organisation's, else the server's (`*`, read on the host).
async fn flag_recorded(
    service: &caret_index::Service,
    tenant: Option<&str>,
    action: &str,
    flag: &str,
    outcome: &str,
) -> anyhow::Result<()> {
    let identity = caret_server::open_identity(service).await?;
    let event = caret_identity::audit::Event {
        tenant: tenant.unwrap_or("*").to_owned(),
        actor: "operator".into(),
        address: "server host".into(),
        action: action.into(),
        target: flag.into(),
        outcome: outcome.into(),
    };
    identity.audit(event).await?;
    Ok(())
}

pub(crate) async fn bootstrap(
    config: &Config,
    organisation: &str,
    email: &str,
    name: &str,
    days: u32,
    storage: &StorageArgs,
) -> anyhow::Result<()> {
    let mut c = config.clone();
    storage.apply(&mut c);
    let service = caret_index::open(&c.storage()).await?;
    let identity = caret_server::open_identity(&service).await?;
    let tenant = match service.db().tenant_by_name(organisation).await? {
        Some(t) => t,
        None => service.db().create_tenant(organisation).await?,
    };
    let user = match identity.user_by_email(&tenant.id, email).await? {
        Some(u) if u.role == caret_identity::Role::Owner => u,
        Some(u) => {
            anyhow::bail!("{} is already a {} of {organisation}: an owner changes roles", u.email, u.role.name())
        }
        None => {
            let new = caret_identity::people::NewUser {
                email: email.to_owned(),
                name: name.to_owned(),
                role: caret_identity::Role::Owner,
                source: "bootstrap".into(),
            };
            identity.create_user(&tenant.id, new).await?
        }
    };
    anyhow::ensure!((1..=366).contains(&days), "--days is 1 to 366, not {days}");
    let new = caret_identity::tokens::NewCredential {
        holder: caret_identity::tokens::Holder::User(user.id.clone()),
        kind: caret_identity::CredentialKind::Personal,
        name: "bootstrap".into(),
        scopes: caret_identity::Scopes::ALL,
        expires_at: Some(caret_identity::db::now_ms() + i64::from(days) * 86_400_000),
    };
    let (token, credential) = identity.create_credential(&tenant.id, new).await?;
    let event = caret_identity::audit::Event {
        tenant: tenant.id.clone(),
        actor: "operator".into(),
        address: "server host".into(),
        action: "user.bootstrap".into(),
        target: user.id.clone(),
        outcome: "ok".into(),
    };
    identity.audit(event).await?;
    println!("{token}");
    eprintln!(
        "{} is an owner of {} ({}); the token above (id {}) expires in {days} days and is shown once",
        user.email, tenant.name, tenant.id, credential.id
    );
    Ok(())
}

/// `caret admin audit verify` on the database.
pub(crate) async fn verify(
    config: &Config,
    storage: &StorageArgs,
) -> anyhow::Result<caret_identity::audit::Verification> {
    let mut c = config.clone();
    storage.apply(&mut c);
    let service = caret_index::open(&c.storage()).await?;
    let identity = caret_server::open_identity(&service).await?;
    let mut v = identity.verify_audit().await?;
    v.problems.extend(identity.verify_exports(service.store().as_ref()).await?);
    Ok(v)
}
