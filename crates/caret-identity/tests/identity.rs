//! People, credentials and the audit trail on both databases, through the public interface.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use caret_identity::audit::{Event, Filter};
use caret_identity::people::{Membership, NewUser};
use caret_identity::tokens::{Holder, NewCredential};
use caret_identity::{CredentialKind, Error, Identity, Role, Scope, Scopes, UserState};
use caret_test_support::TempDir;
use caret_test_support::database::Which;

async fn identity(dir: &TempDir, which: Which) -> Option<Identity> {
    let pool = caret_test_support::database::scratch_on(dir.path(), which, "CARET_TEST_DATABASE_URL").await?;
    let dialect = if which == Which::Postgres { caret_db::Dialect::Postgres } else { caret_db::Dialect::Sqlite };
    Some(Identity::open(pool, dialect).await.unwrap())
}

fn person(email: &str, role: Role) -> NewUser {
    NewUser { email: email.into(), name: String::new(), role, source: "admin".into() }
}

fn pat(user: &str, scopes: &str) -> NewCredential {
    NewCredential {
        holder: Holder::User(user.into()),
        kind: CredentialKind::Personal,
        name: "laptop".into(),
        scopes: Scopes::parse(scopes).unwrap(),
        expires_at: None,
    }
}

#[tokio::test]
async fn people_roles_and_credentials_on_both_databases() {
    for which in Which::ALL {
        let dir = TempDir::new();
        let Some(id) = identity(&dir, which).await else { continue };
        let owner = id.create_user("org-a", person("Ada@Example.com", Role::Owner)).await.unwrap();
        assert_eq!((owner.email.as_str(), owner.name.as_str()), ("ada@example.com", "ada"));
        let bob = id.create_user("org-a", person("bob@example.com", Role::Member)).await.unwrap();
        let eve = id.create_user("org-b", person("eve@example.com", Role::Owner)).await.unwrap();
        // The same email twice in one organisation; a bad one; another organisation's person.
        assert!(matches!(
            id.create_user("org-a", person("ADA@example.com", Role::Member)).await,
            Err(Error::Conflict(_))
        ));
        assert!(matches!(
            id.create_user("org-a", person("not an email", Role::Member)).await,
            Err(Error::BadRequest(_))
        ));
        assert!(matches!(id.user("org-a", &eve.id).await, Err(Error::NotFound(_))));
        assert_eq!(id.users("org-a").await.unwrap().len(), 2);

        // The last owner keeps the role and cannot be deactivated.
        assert!(matches!(id.set_role("org-a", &owner.id, Role::Admin).await, Err(Error::Conflict(_))));
        assert!(matches!(id.set_state("org-a", &owner.id, UserState::Deactivated).await, Err(Error::Conflict(_))));

        // A member's token: scopes within the role; it acts as them.
        assert!(matches!(id.create_credential("org-a", pat(&bob.id, "search,admin")).await, Err(Error::Forbidden(_))));
        let (token, cred) = id.create_credential("org-a", pat(&bob.id, "search,sync")).await.unwrap();
        let who = id.authenticate(&token).await.unwrap().unwrap();
        assert_eq!(
            (who.tenant.as_str(), who.user.as_deref(), who.role),
            ("org-a", Some(bob.id.as_str()), Role::Member)
        );
        assert!(who.may(Scope::Search) && !who.may(Scope::Runs) && !who.may(Scope::Admin));
        assert_eq!(who.actor(), format!("user:{}", bob.id));
        assert!(id.authenticate("caret_not_a_token").await.unwrap().is_none());

        // Revoked: refused, and the epoch moved (replicas drop their caches).
        let epoch = id.epoch().await.unwrap();
        let revoked = id.revoke("org-a", &cred.id).await.unwrap();
        assert!(revoked.revoked_at.is_some());
        assert!(id.authenticate(&token).await.unwrap().is_none());
        assert!(id.epoch().await.unwrap() > epoch);
        assert!(matches!(id.revoke("org-b", &cred.id).await, Err(Error::NotFound(_))), "another organisation's");

        // Expired: refused; an expiry in the past is not accepted.
        let soon = caret_identity::db::now_ms() + 300;
        let (short, _) = id
            .create_credential("org-a", NewCredential { expires_at: Some(soon), ..pat(&bob.id, "search") })
            .await
            .unwrap();
        assert!(id.authenticate(&short).await.unwrap().is_some());
        tokio::time::sleep(std::time::Duration::from_millis(400)).await;
        assert!(id.authenticate(&short).await.unwrap().is_none());
        let past = NewCredential { expires_at: Some(1), ..pat(&bob.id, "search") };
        assert!(matches!(id.create_credential("org-a", past).await, Err(Error::BadRequest(_))));

        // A service account: its own role; a person's role change reaches their tokens.
        let service = NewCredential {
            holder: Holder::Service(Role::Member),
            kind: CredentialKind::Service,
            name: "ci".into(),
            scopes: Scopes::parse("runs").unwrap(),
            expires_at: None,
        };
        let (ci, _) = id.create_credential("org-a", service).await.unwrap();
        let ci_who = id.authenticate(&ci).await.unwrap().unwrap();
        assert_eq!((ci_who.user, ci_who.name.as_str(), ci_who.kind), (None, "ci", CredentialKind::Service));
        let (admin_token, _) = id.create_credential("org-a", pat(&bob.id, "all")).await.map_or_else(
            |e| {
                assert!(matches!(e, Error::Forbidden(_)), "a member may not hold admin: {e}");
                (String::new(), None::<()>)
            },
            |(t, _)| (t, None),
        );
        assert!(admin_token.is_empty());
        id.set_role("org-a", &bob.id, Role::Admin).await.unwrap();
        let (all, _) = id.create_credential("org-a", pat(&bob.id, "all")).await.unwrap();
        assert!(id.authenticate(&all).await.unwrap().unwrap().may(Scope::Admin));
        id.set_role("org-a", &bob.id, Role::Member).await.unwrap();
        assert!(!id.authenticate(&all).await.unwrap().unwrap().may(Scope::Admin), "the role now allows less");

        // Deactivated: every credential of theirs ends at once.
        let (t1, _) = id.create_credential("org-a", pat(&bob.id, "search")).await.unwrap();
        id.set_state("org-a", &bob.id, UserState::Deactivated).await.unwrap();
        assert!(id.authenticate(&t1).await.unwrap().is_none() && id.authenticate(&all).await.unwrap().is_none());
        assert!(matches!(id.create_credential("org-a", pat(&bob.id, "search")).await, Err(Error::Conflict(_))));
        id.set_state("org-a", &bob.id, UserState::Active).await.unwrap();
        assert!(id.authenticate(&t1).await.unwrap().is_none(), "reactivation does not bring old tokens back");
        let listed = id.credentials("org-a", Some(&bob.id)).await.unwrap();
        assert!(listed.iter().all(|c| c.revoked_at.is_some() || c.expires_at.is_some()), "{listed:?}");
        assert_eq!(id.credentials("org-a", None).await.unwrap().iter().filter(|c| c.user.is_none()).count(), 1);

        // Groups.
        let g = id.create_group("org-a", "backend", "admin").await.unwrap();
        assert!(matches!(id.create_group("org-a", "backend", "admin").await, Err(Error::Conflict(_))));
        id.set_member("org-a", &g.id, &bob.id, Membership::In).await.unwrap();
        id.set_member("org-a", &g.id, &bob.id, Membership::In).await.unwrap();
        assert!(matches!(id.set_member("org-a", &g.id, &eve.id, Membership::In).await, Err(Error::NotFound(_))));
        assert_eq!(id.groups("org-a").await.unwrap()[0].members, vec![bob.id.clone()]);
        assert_eq!(id.groups_of("org-a", &bob.id).await.unwrap(), vec!["backend".to_owned()]);
        id.set_member("org-a", &g.id, &bob.id, Membership::Out).await.unwrap();
        assert!(id.groups_of("org-a", &bob.id).await.unwrap().is_empty());
        id.delete_group("org-a", &g.id).await.unwrap();
        assert!(id.groups("org-a").await.unwrap().is_empty());
    }
}

fn event(tenant: &str, action: &str, n: usize) -> Event {
    Event {
        tenant: tenant.into(),
        actor: format!("user:u{n}"),
        address: "127.0.0.1".into(),
        action: action.into(),
        target: format!("t{n}"),
        outcome: "ok".into(),
    }
}

#[tokio::test]
async fn the_audit_chain_survives_racing_writers_and_reports_tampering() {
    for which in Which::ALL {
        let dir = TempDir::new();
        let Some(id) = identity(&dir, which).await else { continue };
        // Writers racing for the head, as replicas do.
        let mut tasks = Vec::new();
        for n in 0..40 {
            let id = id.clone();
            let tenant = if n % 2 == 0 { "org-a" } else { "org-b" };
            tasks.push(tokio::spawn(async move { id.audit(event(tenant, "token.create", n)).await.unwrap() }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        let v = id.verify_audit().await.unwrap();
        assert_eq!((v.records, v.problems.len()), (40, 0), "{which:?}: {v:?}");
        let a =
            id.audit_records(&Filter { tenant: Some("org-a".into()), limit: 100, ..Filter::default() }).await.unwrap();
        assert_eq!(a.len(), 20);
        assert!(a.windows(2).all(|w| w[0].seq < w[1].seq) && a.iter().all(|r| r.event.tenant == "org-a"));
        let one =
            id.audit_records(&Filter { actor: Some("user:u3".into()), limit: 100, ..Filter::default() }).await.unwrap();
        assert_eq!(one.len(), 1);
        let page = id.audit_records(&Filter { after_seq: Some(38), limit: 100, ..Filter::default() }).await.unwrap();
        assert_eq!(page.iter().map(|r| r.seq).collect::<Vec<_>>(), vec![39, 40]);

        // Altered: the record's hash is not its own. Deleted: a gap, and the next one unchained.
        let tamper = |sql: &'static str| sqlx::query(sql).execute(id.pool());
        tamper("UPDATE audit_log SET outcome = 'denied' WHERE seq = 7").await.unwrap();
        let v = id.verify_audit().await.unwrap();
        assert_eq!(v.problems, vec!["record 7 was altered (its hash is not its own)".to_owned()], "{which:?}");
        tamper("DELETE FROM audit_log WHERE seq = 20").await.unwrap();
        let v = id.verify_audit().await.unwrap();
        assert!(v.problems.contains(&"records 20 to 20 are missing".to_owned()), "{v:?}");
        assert!(v.problems.contains(&"record 21 is not chained to the record before it".to_owned()), "{v:?}");
    }
}

#[tokio::test]
async fn an_invitation_is_used_once_before_it_expires() {
    for which in Which::ALL {
        let dir = TempDir::new();
        let Some(id) = identity(&dir, which).await else { continue };
        let (code, inv) = id.invite("org-a", "Dan@Example.com", Role::Admin, 7, "user:ada").await.unwrap();
        assert_eq!((inv.email.as_str(), inv.role), ("dan@example.com", Role::Admin));
        // Two at once: one joins, the other is refused; a third try too.
        let (a, b) = tokio::join!(id.accept(&code, "Dan"), id.accept(&code, "Dan"));
        assert!(a.is_ok() != b.is_ok(), "{a:?} {b:?}");
        let joined = a.or(b).unwrap();
        assert_eq!((joined.user.role, joined.user.source.as_str()), (Role::Admin, "invitation"));
        let who = id.authenticate(&joined.token).await.unwrap().unwrap();
        assert!(who.may(Scope::Search) && !who.may(Scope::Admin), "the first token holds no admin scope");
        assert!(matches!(id.accept(&code, "Dan").await, Err(Error::BadRequest(_))));
        assert!(matches!(id.accept("caret_inv_madeup", "x").await, Err(Error::BadRequest(_))));
        // An existing person is not invited; an expired invitation is refused.
        assert!(matches!(id.invite("org-a", "dan@example.com", Role::Member, 7, "x").await, Err(Error::Conflict(_))));
        let (late, _) = id.invite("org-a", "eve@example.com", Role::Member, 1, "x").await.unwrap();
        sqlx::query("UPDATE invitations SET expires_at = 1").execute(id.pool()).await.unwrap();
        assert!(matches!(id.accept(&late, "Eve").await, Err(Error::BadRequest(_))));
        assert!(id.user_by_email("org-a", "eve@example.com").await.unwrap().is_none(), "nothing written");
    }
}

#[tokio::test]
async fn closed_hours_are_exported_once_and_a_rewritten_chain_differs_from_them() {
    use caret_identity::audit::hash_of;
    let dir = TempDir::new();
    let id = identity(&dir, Which::Sqlite).await.unwrap();
    // Five records two hours ago (chained as the writer would have), then two now.
    let two_hours_ago = caret_identity::db::now_ms() - 2 * 3_600_000;
    let mut prev = caret_identity::audit::GENESIS.to_owned();
    for seq in 1..=5_i64 {
        let e = event("org-a", "token.create", seq as usize);
        let at = two_hours_ago + seq;
        let hash = hash_of(&prev, seq, at, &e);
        sqlx::query("INSERT INTO audit_log (seq, tenant_id, at_ms, actor, address, action, target, outcome, prev_hash, hash) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)")
            .bind(seq).bind(&e.tenant).bind(at).bind(&e.actor).bind(&e.address).bind(&e.action).bind(&e.target).bind(&e.outcome).bind(&prev).bind(&hash)
            .execute(id.pool()).await.unwrap();
        prev = hash;
    }
    id.audit(event("org-a", "user.add", 6)).await.unwrap();
    id.audit(event("org-b", "user.add", 7)).await.unwrap();
    assert!(id.verify_audit().await.unwrap().problems.is_empty());
    let store = object_store::memory::InMemory::new();
    assert_eq!(id.export_audit(&store).await.unwrap(), 1, "the closed hour only");
    assert_eq!(id.export_audit(&store).await.unwrap(), 0, "once");
    assert!(id.verify_exports(&store).await.unwrap().is_empty());
    // Someone with the database rewrites record 4 and re-chains everything after it: the
    // chain is whole again, but the export remembers.
    let all = id.audit_records(&Filter { limit: 100, ..Filter::default() }).await.unwrap();
    let mut prev = all[2].hash.clone();
    for r in &all[3..] {
        let mut e = r.event.clone();
        if r.seq == 4 {
            e.outcome = "failed: forbidden".into();
        }
        let hash = hash_of(&prev, r.seq, r.at_ms, &e);
        sqlx::query("UPDATE audit_log SET outcome = $1, prev_hash = $2, hash = $3 WHERE seq = $4")
            .bind(&e.outcome)
            .bind(&prev)
            .bind(&hash)
            .bind(r.seq)
            .execute(id.pool())
            .await
            .unwrap();
        prev = hash;
    }
    assert!(id.verify_audit().await.unwrap().problems.is_empty(), "a rewritten chain is whole");
    let problems = id.verify_exports(&store).await.unwrap();
    assert!(problems.contains(&"record 4 differs from its export".to_owned()), "{problems:?}");
    sqlx::query("DELETE FROM audit_log WHERE seq = 5").execute(id.pool()).await.unwrap();
    let problems = id.verify_exports(&store).await.unwrap();
    assert!(problems.contains(&"record 5 (exported) is missing from the database".to_owned()), "{problems:?}");
}

#[tokio::test]
async fn owners_are_read_for_the_ids_asked_and_shared_by_kind() {
    for which in Which::ALL {
        let dir = TempDir::new();
        let Some(id) = identity(&dir, which).await else { continue };
        id.own("org-a", "run", "r1", "u1").await.unwrap();
        id.own("org-a", "run", "r2", "u2").await.unwrap();
        id.own("org-b", "run", "r3", "u3").await.unwrap();
        let ids: Vec<String> = ["r1", "r2", "r3", "r4"].map(String::from).to_vec();
        let found = id.owners("org-a", "run", &ids).await.unwrap();
        assert_eq!(found.len(), 2, "another organisation's and an unowned run are left out");
        assert_eq!(found["r1"].user, "u1");
        assert!(id.owners("org-a", "run", &[]).await.unwrap().is_empty());
        let many: Vec<String> = (0..450).map(|i| format!("x{i}")).chain(["r2".to_owned()]).collect();
        assert_eq!(id.owners("org-a", "run", &many).await.unwrap().len(), 1, "asked in chunks");
        id.share("org-a", "run", "r1", true).await.unwrap();
        assert!(id.owner("org-a", "run", "r1").await.unwrap().unwrap().shared);
        assert!(id.owner("org-a", "session", "r1").await.unwrap().is_none(), "by kind");
        assert!(matches!(id.share("org-a", "run", "r4", true).await, Err(Error::NotFound(_))));
    }
}
