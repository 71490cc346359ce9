//! Feature flags and kill switches, kept in the metadata database so that every replica
//! applies the same rules (each reloads them every few seconds, without a restart).
//!
//! A flag is a capability's name: `sync`, `embedding`, `search.hybrid`, `search.lexical`,
//! `search.semantic`, `tab`, `apply`, `agent`, `runs`, `rollouts`, `model.<alias>`,
//! `deployment.<name>`, or `experiment.<name>`. A rule sets it `on` or `off`, for every
//! tenant or for one, optionally for a percentage of tenants chosen by a stable hash of the
//! flag and the tenant (the same tenants stay in as the percentage grows). A tenant's own rule
//! wins over the rule for all. Without a rule, capabilities are on and experiments off.

use sqlx::Row as _;

use crate::db::{Db, now};
use crate::{Error, Result};

/// The capabilities a flag may name (besides the `model.`, `deployment.` and `experiment.`
/// families).
pub const CAPABILITIES: &[&str] = &[
    "sync",
    "embedding",
    "search.hybrid",
    "search.lexical",
    "search.semantic",
    "tab",
    "apply",
    "agent",
    "runs",
    "rollouts",
];

/// Families of flags whose second part is a name of the operator's.
const FAMILIES: &[&str] = &["model.", "deployment.", "experiment."];

/// On or off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Allowed.
    On,
    /// Switched off: answered 503 `disabled`.
    Off,
}

impl State {
    /// `on` or `off`.
    pub fn as_str(self) -> &'static str {
        match self {
            State::On => "on",
            State::Off => "off",
        }
    }

    /// Parses `on` or `off`.
    pub fn parse(s: &str) -> Result<State> {
        match s {
            "on" => Ok(State::On),
            "off" => Ok(State::Off),
            other => Err(Error::BadRequest(format!("a flag is on or off, not {other:?}"))),
        }
    }
}

/// One rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// The flag.
    pub name: String,
    /// One tenant's id, or `None` for every tenant.
    pub tenant: Option<String>,
    /// What the rule sets.
    pub state: State,
    /// The share of tenants (by a stable hash) the state applies to; the others get the
    /// opposite. 100: all.
    pub percent: u8,
    /// Why (shown to operators, never to tenants).
    pub reason: String,
}

/// Checks a flag's name.
pub fn check_name(name: &str) -> Result<()> {
    let family = FAMILIES.iter().find(|f| name.starts_with(*f));
    let ok = match family {
        Some(f) => {
            let rest = &name[f.len()..];
            !rest.is_empty() && rest.len() <= 128 && !rest.chars().any(char::is_whitespace)
        }
        None => CAPABILITIES.contains(&name),
    };
    if ok {
        Ok(())
    } else {
        Err(Error::BadRequest(format!(
            "unknown flag {name:?}: one of {}, or model.<alias>, deployment.<name>, experiment.<name>",
            CAPABILITIES.join(", ")
        )))
    }
}

/// Where a tenant falls in a flag's rollout: 0-99, stable for the pair.
pub fn bucket(name: &str, tenant: &str) -> u8 {
    let digest = caret_crypto::hash_api_token(&format!("flag\u{0}{name}\u{0}{tenant}"));
    let n = u64::from_str_radix(digest.get(..12).unwrap_or("0"), 16).unwrap_or(0);
    (n % 100) as u8
}

/// Every rule in force, for deciding without the database.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Flags {
    rules: Vec<Rule>,
}

impl Flags {
    /// A set of rules.
    pub fn new(rules: Vec<Rule>) -> Flags {
        Flags { rules }
    }

    /// The rules.
    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }

    /// Whether `name` is on for `tenant` (`None`: a request of no tenant's, such as an
    /// operator's: only rules for all apply, percentages counted as all).
    pub fn allows(&self, name: &str, tenant: Option<&str>) -> bool {
        let own = tenant.and_then(|t| self.rules.iter().find(|r| r.name == name && r.tenant.as_deref() == Some(t)));
        let rule = own.or_else(|| self.rules.iter().find(|r| r.name == name && r.tenant.is_none()));
        match rule {
            None => !name.starts_with("experiment."),
            Some(r) => {
                let within = r.percent >= 100 || tenant.is_some_and(|t| bucket(name, t) < r.percent);
                (r.state == State::On) == within
            }
        }
    }
}

impl Db {
    /// Sets a rule (replacing the flag's rule for the same tenant, or for all).
    pub async fn set_flag(&self, rule: &Rule) -> Result<()> {
        check_name(&rule.name)?;
        if rule.percent > 100 {
            return Err(Error::BadRequest(format!("a percentage is 0-100, not {}", rule.percent)));
        }
        let tenant = rule.tenant.as_deref().unwrap_or("");
        let mut tx = self.pool.begin().await?;
        sqlx::query("DELETE FROM flags WHERE name = $1 AND tenant = $2")
            .bind(&rule.name)
            .bind(tenant)
            .execute(&mut *tx)
            .await?;
        sqlx::query(
            "INSERT INTO flags (name, tenant, state, percent, reason, updated_at) VALUES ($1, $2, $3, $4, $5, $6)",
        )
        .bind(&rule.name)
        .bind(tenant)
        .bind(rule.state.as_str())
        .bind(i64::from(rule.percent))
        .bind(&rule.reason)
        .bind(now())
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Removes a flag's rule (for one tenant, or for all); whether there was one.
    pub async fn clear_flag(&self, name: &str, tenant: Option<&str>) -> Result<bool> {
        let r = sqlx::query("DELETE FROM flags WHERE name = $1 AND tenant = $2")
            .bind(name)
            .bind(tenant.unwrap_or(""))
            .execute(&self.pool)
            .await?;
        Ok(r.rows_affected() > 0)
    }

    /// Every rule, by flag then tenant.
    pub async fn flags(&self) -> Result<Flags> {
        let rows = sqlx::query("SELECT name, tenant, state, percent, reason FROM flags ORDER BY name, tenant")
            .fetch_all(&self.pool)
            .await?;
        let mut rules = Vec::with_capacity(rows.len());
        for r in rows {
            let tenant: String = r.try_get(1)?;
            let state: String = r.try_get(2)?;
            let percent: i64 = r.try_get(3)?;
            rules.push(Rule {
                name: r.try_get(0)?,
                tenant: (!tenant.is_empty()).then_some(tenant),
                state: State::parse(&state)?,
                percent: u8::try_from(percent.clamp(0, 100)).unwrap_or(100),
                reason: r.try_get(4)?,
            });
        }
        Ok(Flags { rules })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(name: &str, tenant: Option<&str>, state: State, percent: u8) -> Rule {
        Rule { name: name.into(), tenant: tenant.map(Into::into), state, percent, reason: String::new() }
    }

    #[test]
    fn defaults_tenant_rules_and_percentages() {
        let none = Flags::default();
        assert!(none.allows("tab", Some("t1")), "capabilities are on without a rule");
        assert!(!none.allows("experiment.x", Some("t1")), "experiments are off without a rule");

        let flags = Flags::new(vec![
            rule("tab", None, State::Off, 100),
            rule("tab", Some("t2"), State::On, 100),
            rule("experiment.x", None, State::On, 30),
        ]);
        assert!(!flags.allows("tab", Some("t1")), "the kill switch for all");
        assert!(flags.allows("tab", Some("t2")), "a tenant's own rule wins");
        assert!(!flags.allows("tab", None));
        let tenants: Vec<String> = (0..1000).map(|i| format!("tenant-{i}")).collect();
        let on = tenants.iter().filter(|t| flags.allows("experiment.x", Some(t))).count();
        assert!((230..=370).contains(&on), "about 30% of 1000 tenants, got {on}");
        for t in &tenants {
            assert_eq!(flags.allows("experiment.x", Some(t)), bucket("experiment.x", t) < 30, "stable by the hash");
        }
        // Growing the percentage keeps those already in.
        let grown = Flags::new(vec![rule("experiment.x", None, State::On, 60)]);
        assert!(
            tenants
                .iter()
                .filter(|t| flags.allows("experiment.x", Some(t)))
                .all(|t| grown.allows("experiment.x", Some(t)))
        );
        // Off for a percentage: the others keep it.
        let partial_off = Flags::new(vec![rule("agent", None, State::Off, 50)]);
        let off = tenants.iter().filter(|t| !partial_off.allows("agent", Some(t))).count();
        assert!((400..=600).contains(&off), "about half switched off, got {off}");
    }

    #[test]
    fn names_are_checked() {
        for ok in ["tab", "search.lexical", "model.chat", "deployment.gpu-1", "experiment.next-edit"] {
            assert!(check_name(ok).is_ok(), "{ok}");
        }
        for bad in ["tabs", "model.", "experiment.a b", "", "search"] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
    }
}
