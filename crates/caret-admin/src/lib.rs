//! `caret admin …` and `caret whoami`: the operator's commands on the server host (they open
//! the database: tenants, tenant and operator tokens, recovery, flags, usage, the first owner)
//! and the organisation's admin commands through a team server's admin API (people, groups,
//! tokens, the audit trail), which need a token and no database credentials. It never holds
//! logic the server would need: the rules are the server's.

pub mod api;
pub mod args;
mod local;
mod signin;
mod usage;

use std::process::ExitCode;

pub use args::{AdminCommand, LoginArgs, ServerArgs, StorageArgs};
use args::{AuditVerify, TokenCommand};
use caret_host::config::Config;

/// Runs `caret admin CMD`.
pub fn run(config: &Config, cmd: AdminCommand) -> anyhow::Result<ExitCode> {
    caret_host::runtime::runtime()?.block_on(async {
        match cmd {
            AdminCommand::Bootstrap { organisation, email, name, days, storage } => {
                local::bootstrap(config, &organisation, &email, &name, days, &storage).await
            }
            AdminCommand::Invite { email, role, days, server } => api::invite(config, email, role, days, &server).await,
            AdminCommand::User(c) => api::user(config, c).await,
            AdminCommand::Spend { days, server } => api::spend(config, days, &server).await,
            AdminCommand::Group(c) => api::group(config, c).await,
            AdminCommand::Audit(a) => match a.verify {
                Some(AuditVerify::Verify { server, storage }) => {
                    let v = match server.server.is_some() {
                        true => api::verify(config, &server).await?,
                        false => {
                            let v = local::verify(config, &storage).await?;
                            caret_protocol::admin::AuditVerification {
                                records: v.records,
                                head: v.head,
                                problems: v.problems,
                            }
                        }
                    };
                    if server.json {
                        println!("{}", serde_json::to_string_pretty(&v)?);
                    } else if v.problems.is_empty() {
                        println!("intact: {} records, head {}", v.records, v.head);
                    } else {
                        for p in &v.problems {
                            println!("{p}");
                        }
                    }
                    anyhow::ensure!(
                        v.problems.is_empty(),
                        "the audit trail is not intact ({} problems)",
                        v.problems.len()
                    );
                    Ok(())
                }
                None => api::audit(config, a.since.as_deref(), a.user.as_deref(), &a.server).await,
            },
            AdminCommand::Token(TokenCommand::Create {
                name, scopes, role, scim, days, server, tenant: None, ..
            }) if server.server.is_some() || config.sync.server.is_some() => {
                let kind = scim.then(|| "scim".to_owned());
                api::create_token(
                    config,
                    caret_protocol::admin::CreateToken { name, scopes, expires_in_days: days, role, kind },
                    &server,
                )
                .await
            }
            AdminCommand::Token(TokenCommand::Ls { server }) => api::tokens(config, &server).await,
            AdminCommand::Token(TokenCommand::Revoke { id, server }) => api::revoke(config, &id, &server).await,
            other => local::run(config, other).await,
        }
    })?;
    Ok(ExitCode::SUCCESS)
}

/// Runs `caret whoami`.
pub fn whoami(config: &Config, args: &ServerArgs) -> anyhow::Result<ExitCode> {
    caret_host::runtime::runtime()?.block_on(api::whoami(config, args))?;
    Ok(ExitCode::SUCCESS)
}

/// Runs `caret login`.
pub fn login(config: &Config, args: &LoginArgs) -> anyhow::Result<ExitCode> {
    caret_host::runtime::runtime()?.block_on(api::login(config, args))?;
    Ok(ExitCode::SUCCESS)
}

/// Runs `caret logout`.
pub fn logout(config: &Config, args: &ServerArgs) -> anyhow::Result<ExitCode> {
    caret_host::runtime::runtime()?.block_on(api::logout(config, args))?;
    Ok(ExitCode::SUCCESS)
}
