//! Daily token budgets and the tokens people spend: a group may give its members a daily
//! budget of model tokens (prompt and completion); a person's budget is the most generous of
//! their groups' (none when no group of theirs sets one, as with model lists). What each
//! person spends on each model is counted per UTC day in the metadata database, so every
//! replica sees the same count. Counts hold numbers only, never prompts or answers.

use sqlx::Row as _;

use crate::db::{Identity, now_ms};
use crate::error::{Error, Result};

/// The UTC day of `ms` (days since 1970-01-01).
pub fn day_of(ms: i64) -> i64 {
    ms.div_euclid(86_400_000)
}

/// Milliseconds until the next UTC day.
pub fn ms_to_next_day(now_ms: i64) -> i64 {
    86_400_000 - now_ms.rem_euclid(86_400_000)
}

/// A person's spending on a model on a day.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Spent {
    /// The person's id.
    pub user: String,
    /// The UTC day (days since 1970-01-01).
    pub day: i64,
    /// The model alias.
    pub model: String,
    /// Tokens (prompt and completion).
    pub tokens: i64,
    /// Model calls.
    pub requests: i64,
}

/// Where a spend leaves its person against their budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Crossed {
    /// Nothing new.
    Nothing,
    /// This spend took them past 80% of today's budget.
    Warning,
    /// This spend took them to or past all of it.
    Exhausted,
}

impl Identity {
    /// Gives `group`'s members a daily budget of `tokens` (none: the group sets none).
    pub async fn set_group_budget(&self, tenant: &str, group: &str, tokens: Option<i64>) -> Result<()> {
        if tokens.is_some_and(|t| t < 0) {
            return Err(Error::BadRequest("a budget is a number of tokens, 0 or more".into()));
        }
        let set = "UPDATE user_groups SET daily_tokens = $1 WHERE tenant_id = $2 AND id = $3";
        self.set_group_policy(set, tokens, tenant, group).await
    }

    /// `user`'s daily budget: the largest of their groups' (none: unlimited).
    pub async fn budget_of(&self, tenant: &str, user: &str) -> Result<Option<i64>> {
        Ok(sqlx::query(
            "SELECT MAX(g.daily_tokens) FROM user_groups g JOIN group_members m ON m.group_id = g.id \
             WHERE g.tenant_id = $1 AND m.user_id = $2 AND g.daily_tokens IS NOT NULL",
        )
        .bind(tenant)
        .bind(user)
        .fetch_one(&self.pool)
        .await?
        .get::<Option<i64>, _>(0))
    }

    /// Tokens `user` spent today (UTC).
    pub async fn spent_today(&self, tenant: &str, user: &str) -> Result<i64> {
        Ok(sqlx::query(
            "SELECT CAST(COALESCE(SUM(tokens), 0) AS BIGINT) FROM token_usage \
             WHERE tenant_id = $1 AND user_id = $2 AND day = $3",
        )
        .bind(tenant)
        .bind(user)
        .bind(day_of(now_ms()))
        .fetch_one(&self.pool)
        .await?
        .get::<i64, _>(0))
    }

    /// Counts `tokens` spent by `user` on `model` now; says whether it crossed 80% or all of
    /// `budget`.
    pub async fn spend(
        &self,
        tenant: &str,
        user: &str,
        model: &str,
        tokens: i64,
        budget: Option<i64>,
    ) -> Result<Crossed> {
        let tokens = tokens.max(0);
        sqlx::query(
            "INSERT INTO token_usage (tenant_id, user_id, day, model, tokens, requests) VALUES ($1, $2, $3, $4, $5, 1) \
             ON CONFLICT (tenant_id, user_id, day, model) DO UPDATE \
             SET tokens = token_usage.tokens + excluded.tokens, requests = token_usage.requests + 1",
        )
        .bind(tenant)
        .bind(user)
        .bind(day_of(now_ms()))
        .bind(model)
        .bind(tokens)
        .execute(&self.pool)
        .await?;
        let Some(budget) = budget.filter(|b| *b > 0) else { return Ok(Crossed::Nothing) };
        let after = self.spent_today(tenant, user).await?;
        let before = after - tokens;
        Ok(if before < budget && after >= budget {
            Crossed::Exhausted
        } else if before * 5 < budget * 4 && after * 5 >= budget * 4 {
            Crossed::Warning
        } else {
            Crossed::Nothing
        })
    }

    /// What `tenant`'s people spent from UTC day `since` on, by person, day and model.
    pub async fn spending(&self, tenant: &str, since: i64) -> Result<Vec<Spent>> {
        Ok(sqlx::query(
            "SELECT user_id, day, model, tokens, requests FROM token_usage WHERE tenant_id = $1 AND day >= $2 \
             ORDER BY day, user_id, model",
        )
        .bind(tenant)
        .bind(since)
        .fetch_all(&self.pool)
        .await?
        .iter()
        .map(|r| Spent { user: r.get(0), day: r.get(1), model: r.get(2), tokens: r.get(3), requests: r.get(4) })
        .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn days_are_utc() {
        assert_eq!(day_of(0), 0);
        assert_eq!(day_of(86_399_999), 0);
        assert_eq!(day_of(86_400_000), 1);
        assert_eq!(ms_to_next_day(86_400_000 - 5), 5);
        assert_eq!(ms_to_next_day(86_400_000), 86_400_000);
    }
}
