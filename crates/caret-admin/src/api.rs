//! The commands that go through a team server's API with a token: `caret whoami`, and the
//! admin API's people, groups, tokens and audit trail. No database credentials needed.

use anyhow::Context as _;
use caret_host::config::Config;
use caret_host::remote::{Api, Remote};
use caret_protocol::admin::{
    AcceptInvitation, AddPerson, AuditRecord, AuditVerification, ChangePerson, CreateGroup, CreateToken, GroupInfo,
    Invite, Invited, Joined, Me, Person, TokenCreated, TokenInfo,
};
use serde_json::Value;

use crate::args::{GroupCommand, LoginArgs, ServerArgs, UserCommand};

/// The server and token: the arguments', else the configuration's (`[sync]`).
fn api(config: &Config, args: &ServerArgs) -> anyhow::Result<Api> {
    let target = Remote {
        server: args.server.clone().or_else(|| config.sync.server.clone()),
        token: args.token.clone().or_else(|| config.sync.token.clone()),
    };
    Api::open(&target)?.context("name the team server: --server URL (or CARET_SERVER) and --token (or CARET_TOKEN)")
}

/// Prints `value` as JSON when asked, else each line `text` makes of it.
fn print<T: serde::Serialize>(
    args: &ServerArgs,
    value: &T,
    text: impl FnOnce(&T) -> Vec<String>,
) -> anyhow::Result<()> {
    if args.json {
        println!("{}", serde_json::to_string_pretty(value)?);
    } else {
        for line in text(value) {
            println!("{line}");
        }
    }
    Ok(())
}

fn when(ms: Option<i64>) -> String {
    ms.map_or_else(|| "-".to_owned(), |ms| caret_usage::hour_name(ms / 3_600_000).replace('T', " ") + "h")
}

/// `caret whoami`.
pub async fn whoami(config: &Config, args: &ServerArgs) -> anyhow::Result<()> {
    let api = api(config, args)?;
    let me: Me = api.call(api.client.get(api.url("/v1/me"))).await?;
    print(args, &me, |m| {
        vec![
            format!("{} ({}) in {}", m.name, m.role, m.organisation_name),
            format!("scopes: {}", m.scopes.join(",")),
            format!(
                "token: {}{}",
                m.kind,
                m.expires_at.map_or(String::new(), |e| format!(", expires {}", when(Some(e))))
            ),
        ]
    })
}

/// A person's id from an id or an email.
async fn person_id(api: &Api, who: &str) -> anyhow::Result<String> {
    if !who.contains('@') {
        return Ok(who.to_owned());
    }
    let people: Vec<Person> = api.call(api.client.get(api.url("/v1/admin/users"))).await?;
    people
        .into_iter()
        .find(|p| p.email.eq_ignore_ascii_case(who))
        .map(|p| p.id)
        .with_context(|| format!("no person with the email {who}"))
}

fn person_line(p: &Person) -> String {
    format!("{}\t{}\t{}\t{}\t{}", p.id, p.email, p.role, p.state, p.name)
}

/// `caret admin user …`.
pub async fn user(config: &Config, cmd: UserCommand) -> anyhow::Result<()> {
    let change = |role: Option<String>, state: Option<&str>| ChangePerson { role, state: state.map(String::from) };
    let (args, answer) = match cmd {
        UserCommand::Ls { server } => {
            let api = api(config, &server)?;
            let people: Vec<Person> = api.call(api.client.get(api.url("/v1/admin/users"))).await?;
            return print(&server, &people, |p| p.iter().map(person_line).collect());
        }
        UserCommand::Add { email, name, role, server } => {
            let api = api(config, &server)?;
            let body = AddPerson { email, name, role };
            (server, api.call::<Person>(api.client.post(api.url("/v1/admin/users")).json(&body)).await?)
        }
        UserCommand::Role { user, role, server } => {
            let api = api(config, &server)?;
            let id = person_id(&api, &user).await?;
            let req = api.client.patch(api.url(&format!("/v1/admin/users/{id}"))).json(&change(Some(role), None));
            (server, api.call(req).await?)
        }
        UserCommand::Deactivate { user, server } => {
            let api = api(config, &server)?;
            let id = person_id(&api, &user).await?;
            let req =
                api.client.patch(api.url(&format!("/v1/admin/users/{id}"))).json(&change(None, Some("deactivated")));
            (server, api.call(req).await?)
        }
        UserCommand::Activate { user, server } => {
            let api = api(config, &server)?;
            let id = person_id(&api, &user).await?;
            let req = api.client.patch(api.url(&format!("/v1/admin/users/{id}"))).json(&change(None, Some("active")));
            (server, api.call(req).await?)
        }
    };
    print(&args, &answer, |p| vec![person_line(p)])
}

/// A group's id from an id or a name.
async fn group_id(api: &Api, group: &str) -> anyhow::Result<String> {
    let groups: Vec<GroupInfo> = api.call(api.client.get(api.url("/v1/admin/groups"))).await?;
    groups
        .into_iter()
        .find(|g| g.id == group || g.name == group)
        .map(|g| g.id)
        .with_context(|| format!("no group named {group}"))
}

/// `caret admin group …`.
pub async fn group(config: &Config, cmd: GroupCommand) -> anyhow::Result<()> {
    match cmd {
        GroupCommand::Ls { server } => {
            let api = api(config, &server)?;
            let groups: Vec<GroupInfo> = api.call(api.client.get(api.url("/v1/admin/groups"))).await?;
            print(&server, &groups, |g| {
                g.iter().map(|g| format!("{}\t{}\t{} member(s)\t{}", g.id, g.name, g.members.len(), g.source)).collect()
            })
        }
        GroupCommand::Create { name, server } => {
            let api = api(config, &server)?;
            let g: GroupInfo =
                api.call(api.client.post(api.url("/v1/admin/groups")).json(&CreateGroup { name })).await?;
            print(&server, &g, |g| vec![format!("{}\t{}", g.id, g.name)])
        }
        GroupCommand::Rm { group, server } => {
            let api = api(config, &server)?;
            let id = group_id(&api, &group).await?;
            api.call::<Value>(api.client.delete(api.url(&format!("/v1/admin/groups/{id}")))).await?;
            println!("group {group} deleted");
            Ok(())
        }
        GroupCommand::Models { group, models, clear, server } => {
            let api = api(config, &server)?;
            let id = group_id(&api, &group).await?;
            let body = caret_protocol::admin::GroupModels { models: (!clear).then_some(models) };
            api.call::<Value>(api.client.put(api.url(&format!("/v1/admin/groups/{id}/models"))).json(&body)).await?;
            println!("group {group}: {}", body.models.map_or_else(|| "every model".to_owned(), |m| m.join(", ")));
            Ok(())
        }
        GroupCommand::Budget { group, tokens, clear, server } => {
            let api = api(config, &server)?;
            let id = group_id(&api, &group).await?;
            let body = caret_protocol::admin::GroupBudget { daily_tokens: if clear { None } else { tokens } };
            api.call::<Value>(api.client.put(api.url(&format!("/v1/admin/groups/{id}/budget"))).json(&body)).await?;
            let said = body.daily_tokens.map_or_else(|| "no budget".to_owned(), |t| format!("{t} tokens a day each"));
            println!("group {group}: {said}");
            Ok(())
        }
        GroupCommand::Add { group, user, server } => membership(config, &group, &user, &server, true).await,
        GroupCommand::Remove { group, user, server } => membership(config, &group, &user, &server, false).await,
    }
}

async fn membership(config: &Config, group: &str, user: &str, server: &ServerArgs, put: bool) -> anyhow::Result<()> {
    let api = api(config, server)?;
    let (g, u) = (group_id(&api, group).await?, person_id(&api, user).await?);
    let url = api.url(&format!("/v1/admin/groups/{g}/members/{u}"));
    let req = if put { api.client.put(url) } else { api.client.delete(url) };
    api.call::<Value>(req).await?;
    println!("{user} {} {group}", if put { "is in" } else { "is out of" });
    Ok(())
}

fn token_line(t: &TokenInfo) -> String {
    let state = match (t.revoked_at, t.expires_at) {
        (Some(_), _) => "revoked".to_owned(),
        (None, Some(e)) => format!("expires {}", when(Some(e))),
        (None, None) => "no expiry".to_owned(),
    };
    let owner = t.user.clone().unwrap_or_else(|| format!("service ({})", t.role));
    format!(
        "{}\t{}\t{}\t{}\t{}\tlast used {}\t{}",
        t.id,
        t.name,
        t.kind,
        owner,
        t.scopes.join(","),
        when(t.last_used_at),
        state
    )
}

/// `caret admin token create --server`: a service account's token (or the SCIM token).
pub async fn create_token(config: &Config, body: CreateToken, server: &ServerArgs) -> anyhow::Result<()> {
    let api = api(config, server)?;
    let made: TokenCreated = api.call(api.client.post(api.url("/v1/admin/tokens")).json(&body)).await?;
    if server.json {
        println!("{}", serde_json::to_string_pretty(&made)?);
    } else {
        println!("{}", made.token);
        eprintln!("(shown once: only its hash is stored) {}", token_line(&made.info));
    }
    Ok(())
}

/// `caret admin token ls`.
pub async fn tokens(config: &Config, server: &ServerArgs) -> anyhow::Result<()> {
    let api = api(config, server)?;
    let list: Vec<TokenInfo> = api.call(api.client.get(api.url("/v1/admin/tokens"))).await?;
    print(server, &list, |l| l.iter().map(token_line).collect())
}

/// `caret admin token revoke`.
pub async fn revoke(config: &Config, id: &str, server: &ServerArgs) -> anyhow::Result<()> {
    let api = api(config, server)?;
    api.call::<Value>(api.client.delete(api.url(&format!("/v1/admin/tokens/{id}")))).await?;
    println!("token {id} revoked");
    Ok(())
}

/// `caret admin audit`.
pub async fn audit(
    config: &Config,
    since: Option<&str>,
    user: Option<&str>,
    server: &ServerArgs,
) -> anyhow::Result<()> {
    let api = api(config, server)?;
    let mut query: Vec<(&str, String)> = vec![("limit", "1000".into())];
    if let Some(since) = since {
        let back = caret_host::config::parse_duration(since).context("--since")?;
        let ms = caret_identity::db::now_ms() - i64::try_from(back.as_millis()).unwrap_or(i64::MAX);
        query.push(("since_ms", ms.to_string()));
    }
    if let Some(user) = user {
        query.push(("user", person_id(&api, user).await?));
    }
    let mut all: Vec<AuditRecord> = Vec::new();
    loop {
        let mut q = query.clone();
        if let Some(last) = all.last() {
            q.push(("after", last.seq.to_string()));
        }
        let page: Vec<AuditRecord> = api.call(api.client.get(api.url("/v1/admin/audit")).query(&q)).await?;
        let done = page.len() < 1000;
        all.extend(page);
        if done {
            break;
        }
    }
    if server.json {
        for r in &all {
            println!("{}", serde_json::to_string(r)?);
        }
        return Ok(());
    }
    for r in &all {
        let at = caret_usage::hour_name(r.at_ms / 3_600_000);
        println!("{}\t{at}\t{}\t{}\t{}\t{}\t{}", r.seq, r.actor, r.address, r.action, r.target, r.outcome);
    }
    Ok(())
}

/// `caret admin audit verify --server`.
pub async fn verify(config: &Config, server: &ServerArgs) -> anyhow::Result<AuditVerification> {
    let api = api(config, server)?;
    api.call(api.client.post(api.url("/v1/admin/audit/verify"))).await
}

/// `caret admin invite`.
pub async fn invite(
    config: &Config,
    email: String,
    role: Option<String>,
    days: u32,
    server: &ServerArgs,
) -> anyhow::Result<()> {
    let api = api(config, server)?;
    let body = Invite { email, role, days: Some(days) };
    let made: Invited = api.call(api.client.post(api.url("/v1/admin/invitations")).json(&body)).await?;
    print(server, &made, |m| {
        vec![
            m.code.clone(),
            format!(
                "(shown once) {} joins as {} with `caret login --server {} --invitation CODE` before {}",
                m.email,
                m.role,
                api.base,
                when(Some(m.expires_at))
            ),
        ]
    })
}

/// `caret login`: a sign-in through the identity provider, an invitation used, or a token
/// checked; what it gives kept for the server.
pub async fn login(config: &Config, args: &LoginArgs) -> anyhow::Result<()> {
    let server = args.server.trim_end_matches('/').to_owned();
    let mut refresh_token = None;
    let token = match (&args.invitation, &args.token) {
        (Some(code), _) => {
            // The code is the credential: no token goes with it.
            let anonymous = Api { base: server.clone(), token: String::new(), client: reqwest::Client::new() };
            let body = AcceptInvitation { code: code.clone(), name: args.name.clone() };
            let req = anonymous.client.post(anonymous.url("/v1/invitations/accept")).json(&body);
            let joined: Joined = anonymous.call(req).await?;
            joined.token.token
        }
        (None, Some(token)) => token.clone(),
        (None, None) => {
            let tokens = match (&args.ldap, args.device) {
                (Some(user), _) => crate::signin::ldap(&server, user).await?,
                (None, true) => crate::signin::device(&server).await?,
                (None, false) => crate::signin::browser(&server, !args.no_browser).await?,
            };
            refresh_token = tokens.refresh_token;
            tokens.access_token
        }
    };
    let check = ServerArgs { server: Some(server.clone()), token: Some(token.clone()), json: false };
    let api = api(config, &check)?;
    let me: Me = api.call(api.client.get(api.url("/v1/me"))).await.context("checking the token")?;
    let saved = caret_host::credentials::Saved {
        token,
        name: me.name.clone(),
        organisation: me.organisation_name.clone(),
        expires_at: me.expires_at,
        refresh_token,
    };
    caret_host::credentials::save(&config.home, &server, saved)?;
    println!("signed in to {} as {} ({}) on {server}", me.organisation_name, me.name, me.role);
    Ok(())
}

/// `caret logout`: the kept token revoked on the server (when it is a person's own) and
/// forgotten here.
pub async fn logout(config: &Config, server: &ServerArgs) -> anyhow::Result<()> {
    let url = server.server.clone().or_else(|| config.sync.server.clone()).context("name the server: --server URL")?;
    let Some(token) = caret_host::credentials::token_for(&config.home, &url) else {
        caret_host::credentials::remove(&config.home, &url)?;
        println!("no token kept for {url}");
        return Ok(());
    };
    let check = ServerArgs { server: Some(url.clone()), token: Some(token), json: false };
    let api = api(config, &check)?;
    if let Ok(me) = api.call::<Me>(api.client.get(api.url("/v1/me"))).await
        && matches!(me.kind.as_str(), "personal" | "access")
    {
        // A sign-in ends with every token it gave; a personal token is revoked.
        let revoked = match me.kind.as_str() {
            "access" => api.call::<Value>(api.client.post(api.url("/v1/auth/logout"))).await,
            _ => api.call::<Value>(api.client.delete(api.url(&format!("/v1/me/tokens/{}", me.credential)))).await,
        };
        if let Err(e) = revoked {
            eprintln!("caret: the token was not revoked on the server: {e:#}");
        }
    }
    caret_host::credentials::remove(&config.home, &url)?;
    println!("signed out of {url}");
    Ok(())
}

/// `caret admin spend`: model tokens spent per person, model and group.
pub async fn spend(config: &Config, days: i64, server: &ServerArgs) -> anyhow::Result<()> {
    let api = api(config, server)?;
    let report: caret_protocol::admin::UsageReport =
        api.call(api.client.get(api.url(&format!("/v1/admin/usage?days={days}")))).await?;
    print(server, &report, |r| {
        let mut lines = vec![format!("model tokens since {}", r.since)];
        for (title, totals) in [("person", &r.by_person), ("model", &r.by_model), ("group", &r.by_group)] {
            lines.push(format!("by {title}:"));
            lines.extend(
                totals.iter().map(|t| format!("  {:<40} {:>12} tokens {:>8} calls", t.name, t.tokens, t.requests)),
            );
        }
        lines
    })
}
