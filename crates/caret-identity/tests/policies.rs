//! Budgets, spending and an organisation's settings on both databases, through the public
//! interface.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use caret_identity::budgets::Crossed;
use caret_identity::people::{Membership, NewUser};
use caret_identity::settings::Change;
use caret_identity::{Error, Identity, Role};
use caret_test_support::TempDir;
use caret_test_support::database::Which;

async fn identity(dir: &TempDir, which: Which) -> Option<Identity> {
    let pool = caret_test_support::database::scratch_on(dir.path(), which, "CARET_TEST_DATABASE_URL").await?;
    let dialect = if which == Which::Postgres { caret_db::Dialect::Postgres } else { caret_db::Dialect::Sqlite };
    Some(Identity::open(pool, dialect).await.unwrap())
}

#[tokio::test]
async fn budgets_spending_and_settings_on_both_databases() {
    for which in Which::ALL {
        let dir = TempDir::new();
        let Some(id) = identity(&dir, which).await else { continue };
        let new = |email: &str| NewUser {
            email: email.into(),
            name: String::new(),
            role: Role::Member,
            source: "admin".into(),
        };
        let ada = id.create_user("acme", new("ada@acme.example")).await.unwrap();
        let bob = id.create_user("acme", new("bob@acme.example")).await.unwrap();
        let (small, big) = (
            id.create_group("acme", "small", "admin").await.unwrap(),
            id.create_group("acme", "big", "admin").await.unwrap(),
        );
        for (g, u) in [(&small, &ada), (&big, &ada), (&small, &bob)] {
            id.set_member("acme", &g.id, &u.id, Membership::In).await.unwrap();
        }
        assert_eq!(id.budget_of("acme", &ada.id).await.unwrap(), None, "no group sets one");
        id.set_group_budget("acme", &small.id, Some(100)).await.unwrap();
        id.set_group_budget("acme", &big.id, Some(1000)).await.unwrap();
        assert_eq!(id.budget_of("acme", &ada.id).await.unwrap(), Some(1000), "the most generous group's");
        assert_eq!(id.budget_of("acme", &bob.id).await.unwrap(), Some(100));
        assert!(matches!(id.set_group_budget("acme", "no-group", Some(1)).await, Err(Error::NotFound(_))));
        assert!(matches!(id.set_group_budget("acme", &small.id, Some(-1)).await, Err(Error::BadRequest(_))));

        // Spending crosses 80% once, then 100% once.
        assert_eq!(id.spent_today("acme", &bob.id).await.unwrap(), 0);
        assert_eq!(id.spend("acme", &bob.id, "fast", 70, Some(100)).await.unwrap(), Crossed::Nothing);
        assert_eq!(id.spend("acme", &bob.id, "fast", 15, Some(100)).await.unwrap(), Crossed::Warning);
        assert_eq!(id.spend("acme", &bob.id, "big", 5, Some(100)).await.unwrap(), Crossed::Nothing);
        assert_eq!(id.spend("acme", &bob.id, "big", 20, Some(100)).await.unwrap(), Crossed::Exhausted);
        assert_eq!(id.spend("acme", &bob.id, "big", 20, Some(100)).await.unwrap(), Crossed::Nothing);
        assert_eq!(id.spent_today("acme", &bob.id).await.unwrap(), 130);
        id.spend("acme", &ada.id, "fast", 7, None).await.unwrap();
        let today = caret_identity::budgets::day_of(caret_identity::db::now_ms());
        let spent = id.spending("acme", today).await.unwrap();
        let bobs_big = spent.iter().find(|s| s.user == bob.id && s.model == "big").unwrap();
        assert_eq!((bobs_big.tokens, bobs_big.requests), (45, 3));
        assert_eq!(spent.len(), 3);
        assert!(id.spending("other", today).await.unwrap().is_empty(), "another organisation's");

        // Settings: unset, set, refused, back to the default.
        assert_eq!(id.settings("acme").await.unwrap(), Default::default());
        let changed =
            id.change_settings("acme", Some(Change::Set("admins".into())), Some(Change::Set(30))).await.unwrap();
        assert_eq!(changed, ["docs_sources", "token_max_days"]);
        let s = id.settings("acme").await.unwrap();
        assert_eq!((s.docs_sources.as_deref(), s.token_max_days), (Some("admins"), Some(30)));
        assert!(matches!(
            id.change_settings("acme", Some(Change::Set("all".into())), None).await,
            Err(Error::BadRequest(_))
        ));
        assert!(matches!(id.change_settings("acme", None, Some(Change::Set(400))).await, Err(Error::BadRequest(_))));
        id.change_settings("acme", None, Some(Change::Default)).await.unwrap();
        let s = id.settings("acme").await.unwrap();
        assert_eq!((s.docs_sources.as_deref(), s.token_max_days), (Some("admins"), None));
        assert_eq!(id.settings("other").await.unwrap(), Default::default());
    }
}
