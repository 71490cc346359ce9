//! Signing in on both databases, through the public interface: states used once, people made
//! (or refused) on first sign-in, loopback codes with PKCE, device codes, refresh rotation and
//! its reuse detection.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use caret_identity::oidc::{SignedIn, Signup, challenge_of, pkce};
use caret_identity::signins::{DevicePoll, Joining, Purpose};
use caret_identity::{Error, Identity, Role, UserState};
use caret_test_support::TempDir;
use caret_test_support::database::Which;

async fn identity(dir: &TempDir, which: Which) -> Option<Identity> {
    let pool = caret_test_support::database::scratch_on(dir.path(), which, "CARET_TEST_DATABASE_URL").await?;
    let dialect = if which == Which::Postgres { caret_db::Dialect::Postgres } else { caret_db::Dialect::Sqlite };
    Some(Identity::open(pool, dialect).await.unwrap())
}

fn who(email: &str, groups: &[&str]) -> SignedIn {
    SignedIn {
        subject: email.into(),
        email: email.into(),
        name: "Ada L".into(),
        groups: groups.iter().map(|g| g.to_string()).collect(),
    }
}

fn joining(signup: Signup, role: Option<Role>) -> Joining {
    Joining { source: "oidc", signup, role, sync_groups: true }
}

fn bad_token<T: std::fmt::Debug>(r: Result<T, Error>) -> String {
    match r {
        Err(Error::BadToken(why)) => why,
        other => panic!("expected a bad token, got {other:?}"),
    }
}

#[tokio::test]
async fn sign_ins_codes_devices_and_refreshes_on_both_databases() {
    for which in Which::ALL {
        let dir = TempDir::new();
        let Some(id) = identity(&dir, which).await else { continue };

        // A state is taken once.
        let (state, pending) = id.begin_sign_in("acme", Purpose::Page { next: "/admin".into() }).await.unwrap();
        let taken = id.take_sign_in(&state).await.unwrap();
        assert_eq!(taken, pending);
        assert!(bad_token(id.take_sign_in(&state).await).contains("used already"));
        assert!(bad_token(id.take_sign_in("made-up").await).contains("unknown"));

        // Invited-only: a stranger is refused and nothing is made; an invitation lets them in
        // with its role, once.
        let invited = joining(Signup::Invited, None);
        assert!(matches!(
            id.signed_in("acme", &who("ada@acme.example", &[]), &invited).await,
            Err(Error::Forbidden(_))
        ));
        assert!(id.users("acme").await.unwrap().is_empty());
        id.invite("acme", "ada@acme.example", Role::Admin, 7, "user:x").await.unwrap();
        let ada = id.signed_in("acme", &who("ada@acme.example", &["eng"]), &invited).await.unwrap();
        assert_eq!((ada.role, ada.source.as_str()), (Role::Admin, "oidc"));
        assert!(matches!(id.accept("no-such-code", "x").await, Err(Error::BadRequest(_))));
        // Open sign-up with roles from groups; groups follow the provider.
        let mapped = joining(Signup::Open, Some(Role::Member));
        let bob = id.signed_in("acme", &who("bob@acme.example", &["eng", "ops"]), &mapped).await.unwrap();
        assert_eq!(bob.role, Role::Member);
        let groups = id.groups("acme").await.unwrap();
        let names: Vec<_> = groups.iter().map(|g| g.name.as_str()).collect();
        assert_eq!(names, ["eng", "ops"]);
        id.signed_in("acme", &who("bob@acme.example", &["eng"]), &joining(Signup::Open, Some(Role::Admin)))
            .await
            .unwrap();
        assert_eq!(id.user_by_email("acme", "bob@acme.example").await.unwrap().unwrap().role, Role::Admin);
        assert_eq!(id.groups_of("acme", &bob.id).await.unwrap().len(), 1, "left ops");

        // A loopback code: the client's verifier and redirect, once; a replay revokes.
        let (verifier, challenge) = pkce().unwrap();
        let redirect = "http://127.0.0.1:5555/callback";
        let code = id.issue_code("acme", &ada.id, redirect, &challenge).await.unwrap();
        assert!(bad_token(id.redeem_code(&code, "wrong-verifier", redirect).await).contains("verifier"));
        let code = id.issue_code("acme", &ada.id, redirect, &challenge).await.unwrap();
        assert!(
            bad_token(id.redeem_code(&code, &verifier, "http://127.0.0.1:6666/callback").await).contains("redirect")
        );
        let code = id.issue_code("acme", &ada.id, redirect, &challenge).await.unwrap();
        let tokens = id.redeem_code(&code, &verifier, redirect).await.unwrap();
        assert_eq!(tokens.user.id, ada.id);
        let me = id.authenticate(&tokens.access_token).await.unwrap().unwrap();
        assert_eq!((me.user.as_deref(), me.role), (Some(ada.id.as_str()), Role::Admin));
        let refresh = tokens.refresh_token.clone().unwrap();
        assert!(id.authenticate(&refresh).await.unwrap().is_none(), "a refresh token is no bearer");
        assert!(bad_token(id.redeem_code(&code, &verifier, redirect).await).contains("used already"));
        assert!(id.authenticate(&tokens.access_token).await.unwrap().is_none(), "the replay revoked the first use");
        assert_eq!(challenge_of(&verifier), challenge);

        // Refresh rotation: the new pair works, the old refresh token does not, and presenting
        // it again revokes the whole sign-in.
        let code = id.issue_code("acme", &ada.id, redirect, &challenge).await.unwrap();
        let first = id.redeem_code(&code, &verifier, redirect).await.unwrap();
        let second = id.refresh(first.refresh_token.as_deref().unwrap()).await.unwrap();
        assert!(id.authenticate(&second.access_token).await.unwrap().is_some());
        assert!(bad_token(id.refresh(first.refresh_token.as_deref().unwrap()).await).contains("used already"));
        assert!(id.authenticate(&second.access_token).await.unwrap().is_none(), "reuse revoked the family");
        assert!(bad_token(id.refresh(second.refresh_token.as_deref().unwrap()).await).contains("used already"));

        // Sign-out ends one sign-in, not the others.
        let a = id.issue_session("acme", &ada, "sign-in", 60_000, true, None).await.unwrap();
        let b = id.issue_session("acme", &ada, "sign-in", 60_000, true, None).await.unwrap();
        id.sign_out("acme", &a.credential).await.unwrap();
        assert!(id.authenticate(&a.access_token).await.unwrap().is_none());
        assert!(bad_token(id.refresh(a.refresh_token.as_deref().unwrap()).await).contains("used already"));
        assert!(id.authenticate(&b.access_token).await.unwrap().is_some());

        // A device: pending, too fast, approved by its person, given once.
        let device = id.start_device("acme").await.unwrap();
        assert_eq!(device.user_code.len(), 9);
        assert_eq!(id.poll_device(&device.device_code).await.unwrap(), DevicePoll::Pending);
        assert_eq!(id.poll_device(&device.device_code).await.unwrap(), DevicePoll::SlowDown);
        assert_eq!(id.device_tenant(&device.user_code.to_lowercase()).await.unwrap(), "acme");
        assert!(bad_token(id.approve_device("other-org", &device.user_code, &ada.id).await).contains("unknown"));
        id.approve_device("acme", &device.user_code, &ada.id).await.unwrap();
        assert!(bad_token(id.approve_device("acme", &device.user_code, &bob.id).await).contains("used already"));
        let DevicePoll::Done(tokens) = id.poll_device(&device.device_code).await.unwrap() else { panic!("not done") };
        assert_eq!(tokens.user.id, ada.id);
        assert!(bad_token(id.poll_device(&device.device_code).await).contains("used already"));
        assert!(bad_token(id.poll_device("made-up").await).contains("unknown"));

        // Deactivation ends every sign-in and refuses the next.
        id.set_state("acme", &ada.id, UserState::Deactivated).await.unwrap();
        assert!(id.authenticate(&b.access_token).await.unwrap().is_none());
        assert!(id.refresh(b.refresh_token.as_deref().unwrap()).await.is_err());
        let refused = id.signed_in("acme", &who("ada@acme.example", &[]), &invited).await;
        assert!(matches!(refused, Err(Error::Forbidden(why)) if why.contains("deactivated")));
    }
}
