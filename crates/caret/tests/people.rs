//! An organisation's people on a team server, as an admin and the people would use it: the
//! first owner made on the host, people, roles, groups and tokens through `caret admin …
//! --server` (no database credentials), scopes and revocation honoured, the audit trail
//! recording every change and its chain catching a record altered or deleted — and every
//! route of the OpenAPI document answering each kind of caller as its rule says.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Command, Output};

use serde_json::{Value, json};

#[path = "common/server.rs"]
mod harness;
use harness::{Client, Server, http};
#[path = "common/browser.rs"]
mod browser;
use browser::Browser;

/// Rate limits out of the way (one client at full speed).
const UNLIMITED: [&str; 8] = [
    "--rate-limit",
    "1000000",
    "--rate-limit-burst",
    "1000000",
    "--ip-rate-limit",
    "1000000",
    "--ip-rate-limit-burst",
    "1000000",
];

/// `caret ARGS --server URL --token TOKEN` from a machine with no database credentials.
fn as_client(client: &Client, server: &Server, token: &str, args: &[&str]) -> Output {
    let mut full: Vec<&str> = args.to_vec();
    full.extend(["--server", &server.url, "--token", token]);
    client.run(&full, &[])
}

fn ok(out: &Output) -> String {
    assert!(out.status.success(), "{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout.clone()).unwrap()
}

fn refused(out: &Output) -> String {
    assert!(!out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn an_organisation_lets_its_people_in_and_the_audit_trail_holds_what_admins_did() {
    // Two model aliases, on a scripted OpenAI-compatible upstream (a test double).
    let rt = tokio::runtime::Runtime::new().unwrap();
    let up = rt.block_on(caret_test_support::scripted::ScriptedUpstream::start("models"));
    let model = |alias: &str| {
        format!(
            "[[models]]\nalias = \"{alias}\"\ndeployments = [{{ provider = \"openai\", url = \"{}\", model = \"m\" }}]\n\n",
            up.url
        )
    };
    // Only admins manage @Docs sources here; an agent workspace for server sessions.
    let repo = harness::buggy_repo();
    let settings = format!(
        "{}{}[server]\ndocs_sources = \"admins\"\n[server.agent_workspaces]\ndemo = {:?}\n",
        model("fast"),
        model("big"),
        repo.path().display().to_string()
    );
    let server = Server::start_with_config(&[], &[], Some(&settings));
    let client = Client::new();
    let ada = server.admin(&["admin", "bootstrap", "--organisation", "acme", "--email", "Ada@Acme.example"]);
    let caret = |token: &str, args: &[&str]| as_client(&client, &server, token, args);

    // Who am I: the owner, every scope, a token that expires.
    let me: Value = serde_json::from_str(&ok(&caret(&ada, &["whoami", "--json"]))).unwrap();
    assert_eq!(
        (me["name"].as_str(), me["role"].as_str(), me["kind"].as_str()),
        (Some("ada@acme.example"), Some("owner"), Some("personal"))
    );
    assert_eq!(me["scopes"].as_array().unwrap().len(), 8, "{me}");
    assert!(me["expires_at"].as_i64().is_some());
    let text = ok(&caret(&ada, &["whoami"]));
    assert!(text.starts_with("ada@acme.example (owner) in acme"), "{text}");

    // People: added, listed, a role given; the last owner keeps theirs.
    let bob: Value =
        serde_json::from_str(&ok(&caret(&ada, &["admin", "user", "add", "bob@acme.example", "--json"]))).unwrap();
    assert_eq!(bob["role"], "member");
    let dup = refused(&caret(&ada, &["admin", "user", "add", "BOB@acme.example"]));
    assert!(dup.contains("409") && dup.contains("already"), "{dup}");
    ok(&caret(&ada, &["admin", "user", "role", "bob@acme.example", "admin"]));
    let people = ok(&caret(&ada, &["admin", "user", "ls"]));
    assert!(
        people.contains("bob@acme.example\tadmin\tactive") && people.contains("ada@acme.example\towner"),
        "{people}"
    );
    let last = refused(&caret(&ada, &["admin", "user", "role", "ada@acme.example", "member"]));
    assert!(last.contains("last owner"), "{last}");

    // Groups.
    ok(&caret(&ada, &["admin", "group", "create", "backend"]));
    ok(&caret(&ada, &["admin", "group", "add", "backend", "bob@acme.example"]));
    let groups: Value = serde_json::from_str(&ok(&caret(&ada, &["admin", "group", "ls", "--json"]))).unwrap();
    assert_eq!(groups[0]["members"], json!([bob["id"]]), "{groups}");

    // A service account's token for CI: only the scopes it was given.
    let ci = ok(&caret(&ada, &["admin", "token", "create", "--name", "ci", "--scopes", "runs,docs"])).trim().to_owned();
    let c = http();
    let get = |token: &str, path: &str| c.get(format!("{}{path}", server.url)).bearer_auth(token).send().unwrap();
    assert_eq!(get(&ci, "/v1/runs").status(), 200);
    let scoped = get(&ci, "/v1/workspaces");
    assert_eq!(scoped.status(), 403);
    let body: Value = scoped.json().unwrap();
    assert_eq!(body["error"]["code"], "insufficient_scope", "{body}");
    assert_eq!(get(&ci, "/v1/admin/users").status(), 403, "a member service account is no admin");
    // A personal token with fewer scopes than its owner's role.
    let r = c
        .post(format!("{}/v1/me/tokens", server.url))
        .bearer_auth(&ada)
        .json(&json!({"name": "search only", "scopes": ["search"]}))
        .send()
        .unwrap();
    assert_eq!(r.status(), 201);
    let narrow: Value = r.json().unwrap();
    let narrow_token = narrow["token"].as_str().unwrap();
    assert_eq!(get(narrow_token, "/v1/admin/users").status(), 403);
    assert_eq!(get(narrow_token, "/v1/me").status(), 200);
    // A tenant token from before people existed: a member service account of its organisation.
    let legacy = server.tenant("legacy");
    assert_eq!(get(&legacy, "/v1/workspaces").status(), 200);
    assert_eq!(get(&legacy, "/v1/admin/users").status(), 403);

    // Revoked: refused at once.
    let tokens: Value = serde_json::from_str(&ok(&caret(&ada, &["admin", "token", "ls", "--json"]))).unwrap();
    let ci_id =
        tokens.as_array().unwrap().iter().find(|t| t["name"] == "ci").unwrap()["id"].as_str().unwrap().to_owned();
    ok(&caret(&ada, &["admin", "token", "revoke", &ci_id]));
    assert_eq!(get(&ci, "/v1/runs").status(), 401);

    // Deactivated: every token of the person ends. (A second owner made on the host.)
    let carol = server.admin(&["admin", "bootstrap", "--organisation", "acme", "--email", "carol@acme.example"]);
    assert_eq!(get(&carol, "/v1/me").status(), 200);
    ok(&caret(&ada, &["admin", "user", "deactivate", "carol@acme.example"]));
    assert_eq!(get(&carol, "/v1/me").status(), 401);

    // Another organisation sees none of it: its people are as unknown as made-up ones.
    let globex = server.admin(&["admin", "bootstrap", "--organisation", "globex", "--email", "gus@globex.example"]);
    let bob_id = bob["id"].as_str().unwrap();
    let theirs = get(&globex, &format!("/v1/admin/users/{bob_id}"));
    let made_up = get(&globex, "/v1/admin/users/nosuchperson");
    assert_eq!((theirs.status(), made_up.status()), (reqwest::StatusCode::NOT_FOUND, reqwest::StatusCode::NOT_FOUND));
    let revoke_theirs = c
        .delete(format!("{}/v1/admin/tokens/{}", server.url, narrow["info"]["id"].as_str().unwrap()))
        .bearer_auth(&globex)
        .send()
        .unwrap();
    assert_eq!(revoke_theirs.status(), 404);
    assert_eq!(get(narrow_token, "/v1/me").status(), 200, "still alive");

    // An invitation: someone joins from their own machine without an identity provider; the
    // token is kept for the server (mode 0600) and used by every command naming it.
    let invite: Value =
        serde_json::from_str(&ok(&caret(&ada, &["admin", "invite", "dan@acme.example", "--json"]))).unwrap();
    let code = invite["code"].as_str().unwrap();
    let dan = Client::new();
    let login = ok(&dan.run(&["login", "--server", &server.url, "--invitation", code, "--name", "Dan"], &[]));
    assert!(login.starts_with("signed in to acme as dan@acme.example (member)"), "{login}");
    let kept = dan.home.join("home").join("credentials.json");
    use std::os::unix::fs::PermissionsExt as _;
    assert_eq!(std::fs::metadata(&kept).unwrap().permissions().mode() & 0o777, 0o600);
    let whoami = ok(&dan.run(&["whoami", "--server", &server.url], &[]));
    assert!(whoami.starts_with("dan@acme.example (member) in acme"), "{whoami}");
    let again = Client::new().run(&["login", "--server", &server.url, "--invitation", code], &[]);
    assert!(refused(&again).contains("not valid"), "an invitation is used once");
    let dans_token =
        serde_json::from_str::<Value>(&std::fs::read_to_string(&kept).unwrap()).unwrap()[&server.url]["token"]
            .as_str()
            .unwrap()
            .to_owned();
    assert_eq!(get(&dans_token, "/v1/me").status(), 200);

    // Model access by group: in a group that lists `fast`, dan may use it and not `big`.
    let chat = |token: &str, alias: &str| {
        let body = json!({"model": alias, "messages": [{"role": "user", "content": "hi"}]});
        let r = c.post(format!("{}/v1/chat/completions", server.url)).bearer_auth(token).json(&body).send().unwrap();
        let status = r.status().as_u16();
        (status, r.json::<Value>().unwrap_or(Value::Null))
    };
    assert_eq!(chat(&dans_token, "big").0, 200, "no group restricts him yet");
    ok(&caret(&ada, &["admin", "group", "create", "interns"]));
    ok(&caret(&ada, &["admin", "group", "models", "interns", "fast"]));
    ok(&caret(&ada, &["admin", "group", "add", "interns", "dan@acme.example"]));
    let (status, body) = chat(&dans_token, "big");
    assert_eq!((status, body["error"]["type"].as_str()), (403, Some("model_not_allowed")), "{body}");
    assert_eq!(chat(&dans_token, "fast").0, 200);
    assert_eq!(chat(&ada, "big").0, 200, "ada is in no group with a list");
    // The same list wherever a model is called for him: Tab, apply's merges, agent sessions,
    // background runs (the REST route and /mcp alike).
    let post = |token: &str, path: &str, body: Value| {
        let r = c.post(format!("{}{path}", server.url)).bearer_auth(token).json(&body).send().unwrap();
        (r.status().as_u16(), r.json::<Value>().unwrap_or(Value::Null))
    };
    let tab = json!({"text": "fn main() {", "cursor": 11, "model": "big"});
    // No line of the snippet is in the file: only a model could place it.
    let edit = "# ... existing code ...\n    return x + 2  # two now\n# ... existing code ...\n";
    let apply = json!({"text": "def f(x):\n    return x + 1\n", "edit": edit, "path": "m.py", "model": "big"});
    let session = json!({"workspace": "demo", "model": "big"});
    let run = json!({"repo": {"kind": "git", "url": "file:///nowhere"}, "task": "t", "model": "big"});
    for (path, body) in
        [("/v1/complete", tab), ("/v1/apply", apply), ("/v1/agent/sessions", session), ("/v1/runs", run)]
    {
        let (status, body) = post(&dans_token, path, body);
        assert_eq!((status, body["error"]["code"].as_str()), (403, Some("model_not_allowed")), "{path}: {body}");
    }
    let (status, body) = post(&dans_token, "/v1/agent/sessions", json!({"workspace": "demo"}));
    assert_eq!(status, 201, "his default is a model he may use: {body}");
    let docs = c.post(format!("{}/v1/docs/sources", server.url)).bearer_auth(&dans_token);
    let docs = docs.json(&json!({"name": "dans", "url": "https://docs.example/"})).send().unwrap();
    assert_eq!(docs.status(), 403, "docs_sources = admins");
    ok(&caret(&ada, &["admin", "group", "models", "interns", "--clear"]));
    assert_eq!(chat(&dans_token, "big").0, 200, "the list cleared");

    // A daily budget: counted from each answer's usage (13 tokens a call here); past 80% the
    // answers warn, past 100% model calls answer 429 until the next UTC day.
    let spent = |token: &str| get(token, "/v1/me").json::<Value>().unwrap()["spent_today"].as_i64().unwrap();
    let settle = |want: i64| {
        let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while spent(&dans_token) != want {
            assert!(std::time::Instant::now() < until, "dan's count never reached {want}");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    };
    settle(39);
    let budget = 39 + 20;
    ok(&caret(&ada, &["admin", "group", "budget", "interns", &budget.to_string()]));
    let chat_warned = |alias: &str| {
        let body = json!({"model": alias, "messages": [{"role": "user", "content": "hi"}]});
        let r =
            c.post(format!("{}/v1/chat/completions", server.url)).bearer_auth(&dans_token).json(&body).send().unwrap();
        (r.status().as_u16(), r.headers().get("x-caret-budget-warning").map(|w| w.to_str().unwrap().to_owned()))
    };
    assert_eq!(chat_warned("fast"), (200, None));
    settle(52);
    let (status, warning) = chat_warned("big");
    assert_eq!(status, 200);
    assert!(warning.as_deref().is_some_and(|w| w.contains("52 of today's 59")), "{warning:?}");
    settle(65);
    let (status, body) = chat(&dans_token, "fast");
    assert_eq!((status, body["error"]["type"].as_str()), (429, Some("budget_exhausted")), "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("renews at 00:00 UTC"));
    let tab = json!({"text": "fn main() {", "cursor": 11, "model": "fast"});
    let run = json!({"repo": {"kind": "git", "url": "file:///nowhere"}, "task": "t", "model": "fast"});
    for (path, body) in [("/v1/complete", tab), ("/v1/runs", run)] {
        let (status, body) = post(&dans_token, path, body);
        assert_eq!((status, body["error"]["code"].as_str()), (429, Some("budget_exhausted")), "{path}: {body}");
    }
    assert_eq!(chat(&ada, "fast").0, 200, "ada is in no group with a budget");
    let dans_me: Value = get(&dans_token, "/v1/me").json().unwrap();
    assert_eq!((dans_me["daily_tokens"].as_i64(), dans_me["spent_today"].as_i64()), (Some(59), Some(65)));
    // Usage per person, model and group, through the admin API.
    let report: Value = serde_json::from_str(&ok(&caret(&ada, &["admin", "spend", "--json"]))).unwrap();
    let total = |list: &str, name: &str| {
        report[list].as_array().unwrap().iter().find(|t| t["name"] == name).map(|t| t["tokens"].as_i64().unwrap())
    };
    assert_eq!(total("by_person", "dan@acme.example"), Some(65), "{report}");
    assert_eq!(total("by_group", "interns"), Some(65), "{report}");
    assert!(total("by_model", "fast").unwrap() + total("by_model", "big").unwrap() >= 65 + 13);
    ok(&caret(&ada, &["admin", "group", "budget", "interns", "--clear"]));
    // The organisation's settings: personal tokens live at most 30 days here.
    let settings = c.patch(format!("{}/v1/admin/settings", server.url)).bearer_auth(&ada);
    let settings: Value = settings.json(&json!({"token_max_days": 30})).send().unwrap().json().unwrap();
    assert_eq!(
        (settings["token_max_days"].as_u64(), settings["overridden"][0].as_str()),
        (Some(30), Some("token_max_days"))
    );
    let long = c.post(format!("{}/v1/me/tokens", server.url)).bearer_auth(&dans_token);
    let long = long.json(&json!({"name": "long", "expires_in_days": 90})).send().unwrap();
    assert_eq!(long.status(), 400, "past the organisation's longest");
    let refused_setting = c.patch(format!("{}/v1/admin/settings", server.url)).bearer_auth(&ada);
    assert_eq!(refused_setting.json(&json!({"docs_sources": "everyone"})).send().unwrap().status(), 400);
    // The operator's flag for this organisation: shown to its admins, and in its audit trail.
    server.admin(&["admin", "flags", "set", "experiment.people", "on", "--tenant", "acme"]);
    let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let flags: Value =
            c.get(format!("{}/v1/admin/flags", server.url)).bearer_auth(&ada).send().unwrap().json().unwrap();
        let shown = flags
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f["name"] == "experiment.people" && f["on"] == true && f["rule"] == "this organisation");
        if shown {
            break;
        }
        assert!(std::time::Instant::now() < until, "the flag never showed: {flags}");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert_eq!(chat(&dans_token, "fast").0, 200, "the budget cleared");
    assert!(ok(&dan.run(&["logout", "--server", &server.url], &[])).contains("signed out"));
    assert_eq!(get(&dans_token, "/v1/me").status(), 401, "logout revokes the token");
    assert!(refused(&dan.run(&["whoami", "--server", &server.url], &[])).contains("caret login"));

    // A docs source on an internal address: refused by the egress policy, and recorded.
    let docs = c.post(format!("{}/v1/docs/sources", server.url)).bearer_auth(&ada);
    let docs = docs.json(&json!({"name": "intranet", "url": "http://169.254.169.254/latest/"})).send().unwrap();
    assert_eq!(docs.status(), 400);

    // The audit trail: who did what, from where, with the outcome; none of globex's.
    let trail = ok(&caret(&ada, &["admin", "audit", "--json"]));
    let records: Vec<Value> = trail.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let actions: Vec<&str> = records.iter().map(|r| r["action"].as_str().unwrap()).collect();
    for want in [
        "user.bootstrap",
        "user.add",
        "user.role",
        "group.create",
        "group.member.add",
        "token.create",
        "token.revoke",
        "user.state",
        "group.budget",
        "settings.change",
        "flag.set",
        "budget.warning",
        "budget.exhausted",
    ] {
        assert!(actions.contains(&want), "{want} missing from {actions:?}");
    }
    let docs = records.iter().find(|r| r["action"] == "docs.add" && r["target"] == "intranet").unwrap();
    assert_eq!(docs["outcome"], "failed: bad_request", "{docs}");
    let dans = records.iter().find(|r| r["action"] == "docs.add" && r["target"] == "dans").unwrap();
    assert_eq!(dans["outcome"], "failed: forbidden", "{dans}");
    let failed = records.iter().find(|r| r["action"] == "user.add" && r["outcome"] != "ok").unwrap();
    assert_eq!(failed["outcome"], "failed: conflict", "{failed}");
    let ada_id = me["user"].as_str().unwrap();
    let revokes: Vec<&Value> = records.iter().filter(|r| r["action"] == "token.revoke").collect();
    assert!(
        revokes.iter().any(|r| r["actor"] == format!("user:{ada_id}") && r["address"] == "127.0.0.1"),
        "{revokes:?}"
    );
    assert_eq!(revokes.len(), 2, "ada's and dan's own at logout: {revokes:?}");
    assert!(!trail.contains("gus@globex"), "another organisation's records");
    let since = ok(&caret(&ada, &["admin", "audit", "--since", "1h", "--user", "ada@acme.example"]));
    assert!(since.lines().count() >= 8 && since.lines().all(|l| l.contains(&format!("user:{ada_id}"))), "{since}");

    // Verified intact; then a record altered and one deleted in the database: both reported.
    let intact = ok(&caret(&ada, &["admin", "audit", "verify"]));
    assert!(intact.starts_with("intact:"), "{intact}");
    let db = server.data.join("srv").join("caret.db");
    let tamper = |sql: &str| {
        let out = std::process::Command::new("python3")
            .args([
                "-c",
                "import sqlite3,sys; c=sqlite3.connect(sys.argv[1]); c.execute(sys.argv[2]); c.commit()",
                db.to_str().unwrap(),
                sql,
            ])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    };
    tamper("UPDATE audit_log SET outcome = 'ok' WHERE action = 'user.add' AND outcome != 'ok'");
    tamper("DELETE FROM audit_log WHERE action = 'group.create'");
    let broken = refused(&caret(&ada, &["admin", "audit", "verify"]));
    assert!(broken.contains("not intact"), "{broken}");
    let v: Value = {
        let out = caret(&ada, &["admin", "audit", "verify", "--json"]);
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let problems = v["problems"].to_string();
    assert!(problems.contains("are missing") && problems.contains("was altered"), "{problems}");
    // On the host, without the API, the same verdict.
    let host = Command::new(harness::CARET)
        .args(["admin", "audit", "verify", "--data-dir", server.data.join("srv").to_str().unwrap()])
        .env("CARET_HOME", server.data.join("home"))
        .env_remove("CARET_SERVER")
        .output()
        .unwrap();
    assert!(!host.status.success() && String::from_utf8_lossy(&host.stdout).contains("are missing"));
    server.stop();
}

/// Who calls, in the authorization matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Who {
    Nobody,
    MemberA,
    AdminA,
    OwnerA,
    MemberB,
    Revoked,
    Expired,
    /// A token of A's owner without the route's scope.
    Unscoped,
    Operator,
    /// Organisation A's SCIM token (the identity provider's).
    Scim,
}

/// Tenant routes open to any live credential of the organisation, whatever its scopes.
const UNSCOPED: [&str; 5] = ["/v1/me", "/v1/me/tokens", "/v1/me/tokens/{id}", "/v1/usage", "/v1/auth/logout"];

/// Every route of the OpenAPI document called as every kind of caller: each answer is the
/// route's rule (allowed: anything but 401 and 403). A route whose rule is not known here
/// (a new one) fails the test.
#[test]
fn every_route_answers_every_caller_as_its_rule_says() {
    use caret_server::openapi::Access;
    let server = Server::start(&[], &UNLIMITED);
    let c = reqwest::blocking::Client::builder().timeout(std::time::Duration::from_secs(20)).build().unwrap();
    let bootstrap =
        |org: &str, email: &str| server.admin(&["admin", "bootstrap", "--organisation", org, "--email", email]);
    let owner_a = bootstrap("matrix-a", "owner@a.example");
    let (admin_a, member_a) = (bootstrap("matrix-a", "admin@a.example"), bootstrap("matrix-a", "member@a.example"));
    let member_b = {
        bootstrap("matrix-b", "owner@b.example");
        bootstrap("matrix-b", "member@b.example")
    };
    let owner_b = bootstrap("matrix-b", "second@b.example");
    let client = Client::new();
    for (token, email, role) in [
        (&owner_a, "admin@a.example", "admin"),
        (&owner_a, "member@a.example", "member"),
        (&owner_b, "member@b.example", "member"),
    ] {
        ok(&as_client(&client, &server, token, &["admin", "user", "role", email, role]));
    }
    let personal = |token: &str, scopes: &[&str]| -> (String, String) {
        let r = c
            .post(format!("{}/v1/me/tokens", server.url))
            .bearer_auth(token)
            .json(&json!({"name": "m", "scopes": scopes}))
            .send()
            .unwrap();
        assert_eq!(r.status(), 201);
        let v: Value = r.json().unwrap();
        (v["token"].as_str().unwrap().to_owned(), v["info"]["id"].as_str().unwrap().to_owned())
    };
    let (revoked, revoked_id) = personal(&owner_a, &["all"]);
    ok(&as_client(&client, &server, &owner_a, &["admin", "token", "revoke", &revoked_id]));
    let (expired, expired_id) = personal(&owner_a, &["all"]);
    let db = server.data.join("srv").join("caret.db");
    let sql = format!("UPDATE credentials SET expires_at = 1000 WHERE id = '{expired_id}'");
    let out = Command::new("python3")
        .args([
            "-c",
            "import sqlite3,sys; c=sqlite3.connect(sys.argv[1]); c.execute(sys.argv[2]); c.commit()",
            db.to_str().unwrap(),
            &sql,
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    // (Changed before the token was ever used: no replica holds it yet.)
    let (search_only, _) = personal(&owner_a, &["search"]);
    let (docs_only, _) = personal(&owner_a, &["docs"]);
    let operator = server.admin(&["admin", "operator-token", "create"]);
    let scim: Value = c
        .post(format!("{}/v1/admin/tokens", server.url))
        .bearer_auth(&owner_a)
        .json(&json!({"name": "idp", "kind": "scim"}))
        .send()
        .unwrap()
        .json()
        .unwrap();
    let scim = scim["token"].as_str().unwrap().to_owned();

    let callers = [
        Who::Nobody,
        Who::MemberA,
        Who::AdminA,
        Who::OwnerA,
        Who::MemberB,
        Who::Revoked,
        Who::Expired,
        Who::Unscoped,
        Who::Operator,
        Who::Scim,
    ];
    let mut wrong = Vec::new();
    let mut calls = 0;
    let operations = caret_server::openapi::operation_list();
    for (method, path, access) in &operations {
        let scope = caret_server::state::scope(path);
        if matches!(access, Access::Tenant | Access::Admin) && scope.is_none() {
            assert!(UNSCOPED.contains(path), "{method} {path}: a tenant route with no scope and no rule here");
        }
        let url = format!(
            "{}{}",
            server.url,
            path.replace("{id}", "x1").replace("{token}", "1").replace("{name}", "X").replace("{user}", "u1")
        );
        for who in callers {
            let token = match who {
                Who::Nobody => None,
                Who::MemberA => Some(member_a.as_str()),
                Who::AdminA => Some(admin_a.as_str()),
                Who::OwnerA => Some(owner_a.as_str()),
                Who::MemberB => Some(member_b.as_str()),
                Who::Revoked => Some(revoked.as_str()),
                Who::Expired => Some(expired.as_str()),
                Who::Unscoped => Some(if scope.is_some_and(|s| s.name() == "search") {
                    docs_only.as_str()
                } else {
                    search_only.as_str()
                }),
                Who::Operator => Some(operator.as_str()),
                Who::Scim => Some(scim.as_str()),
            };
            let want: &[u16] = match (access, who) {
                (Access::Public, _) => &[],
                (Access::Operator, Who::Operator) => &[],
                (Access::Operator, _) => &[401],
                // SCIM takes the SCIM token only, and the SCIM token opens nothing else.
                (Access::Scim, Who::Scim) => &[],
                (Access::Scim, Who::Nobody | Who::Revoked | Who::Expired | Who::Operator) => &[401],
                (Access::Scim, _) => &[403],
                (_, Who::Scim) => &[403],
                (_, Who::Nobody | Who::Revoked | Who::Expired | Who::Operator) => &[401],
                (_, Who::Unscoped) if scope.is_some() => &[403],
                (Access::Admin, Who::MemberA | Who::MemberB) => &[403],
                _ => &[],
            };
            let mut req = c.request(method.to_uppercase().parse().unwrap(), &url);
            if let Some(t) = token {
                req = req.bearer_auth(t);
            }
            if matches!(*method, "post" | "put" | "patch") {
                req = req.json(&json!({}));
            }
            let status = req.send().map(|r| r.status().as_u16()).unwrap_or(0);
            calls += 1;
            let fine = if want.is_empty() { ![0, 401, 403].contains(&status) } else { want.contains(&status) };
            if !fine {
                wrong.push(format!(
                    "{method} {path} as {who:?}: {status}, the rule says {}",
                    if want.is_empty() { "allowed".to_owned() } else { format!("{want:?}") }
                ));
            }
        }
    }
    eprintln!(
        "{} routes × {} callers: {calls} calls, {} answers off the rule",
        operations.len(),
        callers.len(),
        wrong.len()
    );
    assert!(wrong.is_empty(), "{wrong:#?}");
    // Every route the router serves is in the matrix (the OpenAPI test holds the two equal).
    let routed: std::collections::BTreeSet<&str> =
        caret_server::http::route_paths().into_iter().map(|(p, _)| p).collect();
    let covered: std::collections::BTreeSet<&str> = operations.iter().map(|(_, p, _)| *p).collect();
    assert_eq!(routed, covered, "routes outside the matrix");
    server.stop();
}

/// The server killed (SIGKILL) while admins' changes stream in: every change that was
/// answered has its record, and the chain is whole after the restart.
#[test]
fn no_audit_record_is_lost_when_the_server_is_killed_mid_write() {
    let server = Server::start(&[], &UNLIMITED);
    let owner = server.owner("killed");
    let url = server.url.clone();
    let answered = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let writers: Vec<_> = (0..4)
        .map(|w| {
            let (url, owner, answered) = (url.clone(), owner.clone(), answered.clone());
            std::thread::spawn(move || {
                let c =
                    reqwest::blocking::Client::builder().timeout(std::time::Duration::from_secs(5)).build().unwrap();
                for i in 0..10_000 {
                    let name = format!("g{w}-{i}");
                    let r = c
                        .post(format!("{url}/v1/admin/groups"))
                        .bearer_auth(&owner)
                        .json(&json!({"name": name}))
                        .send();
                    match r {
                        Ok(r) if r.status() == 201 => answered.lock().unwrap().push(name),
                        Ok(r) => panic!("{}", r.status()),
                        Err(_) => return,
                    }
                }
            })
        })
        .collect();
    while answered.lock().unwrap().len() < 40 {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let server = server.kill_and_restart();
    for w in writers {
        w.join().unwrap();
    }
    let answered = answered.lock().unwrap().clone();
    let c = http();
    let mut records: Vec<Value> = Vec::new();
    loop {
        let after = records.last().map_or(0, |r| r["seq"].as_i64().unwrap());
        let page: Vec<Value> = c
            .get(format!("{}/v1/admin/audit?limit=1000&after={after}", server.url))
            .bearer_auth(&owner)
            .send()
            .unwrap()
            .json()
            .unwrap();
        let done = page.len() < 1000;
        records.extend(page);
        if done {
            break;
        }
    }
    let recorded: std::collections::BTreeSet<&str> = records
        .iter()
        .filter(|r| r["action"] == "group.create" && r["outcome"] == "ok")
        .map(|r| r["target"].as_str().unwrap())
        .collect();
    let lost: Vec<&String> = answered.iter().filter(|n| !recorded.contains(n.as_str())).collect();
    eprintln!("{} changes answered before the kill, {} recorded, {} lost", answered.len(), recorded.len(), lost.len());
    assert!(lost.is_empty(), "answered without a record: {lost:?}");
    let v: Value =
        c.post(format!("{}/v1/admin/audit/verify", server.url)).bearer_auth(&owner).send().unwrap().json().unwrap();
    assert_eq!(v["problems"], json!([]), "{v}");
    server.stop();
}

/// The admin page in a real Chromium: refused without the admin scope; with an owner's token
/// (taken from the address and kept in the tab), people, tokens, groups and the audit trail
/// as the API has them, and changes made from the page reaching the API.
#[test]
fn the_admin_page_shows_and_changes_what_the_admin_api_has() {
    let server = Server::start(&[], &[]);
    let ada = server.admin(&["admin", "bootstrap", "--organisation", "page", "--email", "ada@page.example"]);
    let client = Client::new();
    ok(&as_client(&client, &server, &ada, &["admin", "user", "add", "bob@page.example"]));
    ok(&as_client(&client, &server, &ada, &["admin", "group", "create", "backend"]));
    let legacy = server.tenant("no-admin");
    let browser = Browser::start();
    browser.open(&format!("{}/admin#token={legacy}", server.url));
    browser.wait_for(
        "the refusal",
        30,
        "return document.querySelector('#status').textContent.includes('holds no admin scope')",
    );
    browser.open(&format!("{}/admin#token={ada}", server.url));
    browser.wait_for("the people", 30, "return document.querySelectorAll('#people tbody tr').length === 2");
    assert_eq!(browser.eval("return location.hash"), "", "the token left the address bar");
    let status = browser.eval("return document.querySelector('#status').textContent");
    assert_eq!(status, "ada@page.example (owner) in page");
    let groups = browser.eval("return document.querySelector('#groups tbody').innerText");
    assert!(
        groups.as_str().unwrap().contains("backend") && groups.as_str().unwrap().contains("every model"),
        "{groups}"
    );

    // A service account's token made from the page: shown once, listed by the API.
    browser.eval("const f = document.querySelector('#add-token'); f.name.value = 'ci'; f.scopes.value = 'runs'; f.querySelector('button').click();");
    let made = browser.wait_for("the new token", 30, "return document.querySelector('#made').textContent");
    let token = made.as_str().unwrap().rsplit(' ').next().unwrap().to_owned();
    let c = http();
    let me: Value = c.get(format!("{}/v1/me", server.url)).bearer_auth(&token).send().unwrap().json().unwrap();
    assert_eq!((me["name"].as_str(), me["scopes"].clone()), (Some("ci"), json!(["runs"])));
    // Bob made an admin, then deactivated, from the page.
    let bob_row = "document.querySelector('#people tbody tr:nth-child(2)')";
    assert_eq!(browser.eval(&format!("return {bob_row}.children[0].textContent")), "bob@page.example");
    browser.eval(&format!(
        "const s = {bob_row}.querySelector('select'); s.value = 'admin'; s.dispatchEvent(new Event('change'));"
    ));
    browser.wait_for("bob an admin", 30, &format!("return {bob_row}.querySelector('select').value === 'admin' && document.querySelectorAll('#audit tbody tr').length >= 5"));
    browser.eval(&format!("{bob_row}.querySelector('button').click()"));
    browser.wait_for("bob deactivated", 30, &format!("return {bob_row}.children[3].textContent === 'deactivated'"));
    let people: Value =
        c.get(format!("{}/v1/admin/users", server.url)).bearer_auth(&ada).send().unwrap().json().unwrap();
    let bob = people.as_array().unwrap().iter().find(|p| p["email"] == "bob@page.example").unwrap();
    assert_eq!((bob["role"].as_str(), bob["state"].as_str()), (Some("admin"), Some("deactivated")));
    // The audit trail, newest first, and the chain verified from the page.
    let audit = browser.eval("return document.querySelector('#audit tbody').innerText");
    for action in ["user.state", "user.role", "token.create", "group.create", "user.add", "user.bootstrap"] {
        assert!(audit.as_str().unwrap().contains(action), "{action}: {audit}");
    }
    browser.eval("document.querySelector('#verify').click()");
    let verified = browser.wait_for("the verdict", 30, "return document.querySelector('#verified').textContent");
    assert!(verified.as_str().unwrap().starts_with("intact:"), "{verified}");
    // A setting changed on the page reaches the API.
    browser.eval(
        "const s = document.querySelector('#set-docs'); s.value = 'admins'; s.dispatchEvent(new Event('change'));",
    );
    let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let settings: Value =
            c.get(format!("{}/v1/admin/settings", server.url)).bearer_auth(&ada).send().unwrap().json().unwrap();
        if settings["docs_sources"] == "admins" {
            break;
        }
        assert!(std::time::Instant::now() < until, "the page's setting never reached the API: {settings}");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("admin-screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    browser.screenshot(&dir.join("admin-page.png"));
    println!("screenshot: {}", dir.join("admin-page.png").display());
    server.stop();
}

/// A person's background runs are theirs: a member sees their own and those shared with the
/// organisation (another's answers exactly as a missing one), an admin sees all.
#[test]
fn a_members_runs_are_theirs_unless_shared() {
    // Runs need a model to be queued for (a scripted upstream, a test double; no worker takes them).
    let rt = tokio::runtime::Runtime::new().unwrap();
    let up = rt.block_on(caret_test_support::scripted::ScriptedUpstream::start("agent-model"));
    let repo = harness::buggy_repo();
    let config = format!(
        "[[models]]\nalias = \"agent\"\ndeployments = [{{ provider = \"openai\", url = \"{}\", model = \"m\" }}]\n\n\
         [server.agent_workspaces]\ndemo = {:?}\n",
        up.url,
        repo.path().display().to_string()
    );
    let server = Server::start_with_config(&[], &[], Some(&config));
    let bootstrap = |email: &str| server.admin(&["admin", "bootstrap", "--organisation", "runs-org", "--email", email]);
    let ada = bootstrap("ada@runs.example");
    let (mia, max) = (bootstrap("mia@runs.example"), bootstrap("max@runs.example"));
    let client = Client::new();
    for email in ["mia@runs.example", "max@runs.example"] {
        ok(&as_client(&client, &server, &ada, &["admin", "user", "role", email, "member"]));
    }
    let submit = |token: &str| {
        let out = as_client(&client, &server, token, &["run", "make add.sh add", "-C", repo.path().to_str().unwrap()]);
        ok(&out).trim().to_owned()
    };
    let (mias, maxs) = (submit(&mia), submit(&max));
    let c = http();
    let ids = |token: &str| -> Vec<String> {
        let v: Value = c.get(format!("{}/v1/runs", server.url)).bearer_auth(token).send().unwrap().json().unwrap();
        let mut ids: Vec<String> =
            v["runs"].as_array().unwrap().iter().map(|r| r["id"].as_str().unwrap().to_owned()).collect();
        ids.sort();
        ids
    };
    let mut both = vec![mias.clone(), maxs.clone()];
    both.sort();
    assert_eq!(ids(&mia), vec![mias.clone()]);
    assert_eq!(ids(&ada), both, "an admin sees every run");
    let answer = |token: &str, method: reqwest::Method, path: String| {
        let r = c
            .request(method, format!("{}{path}", server.url))
            .bearer_auth(token)
            .json(&json!({"shared": true}))
            .send()
            .unwrap();
        (r.status().as_u16(), r.text().unwrap())
    };
    for path in ["", "/result", "/events?follow=false"] {
        let theirs = answer(&mia, reqwest::Method::GET, format!("/v1/runs/{maxs}{path}"));
        let made_up = answer(&mia, reqwest::Method::GET, format!("/v1/runs/r-madeup{path}"));
        assert_eq!(
            (theirs.0, theirs.1.replace(&maxs, "ID")),
            (made_up.0, made_up.1.replace("r-madeup", "ID")),
            "{path}"
        );
    }
    assert_eq!(answer(&mia, reqwest::Method::POST, format!("/v1/runs/{maxs}/cancel")).0, 404);
    assert_eq!(answer(&mia, reqwest::Method::DELETE, format!("/v1/runs/{maxs}")).0, 404);
    // Shared by its owner: the organisation sees it; nobody else may share another's.
    assert_eq!(answer(&max, reqwest::Method::POST, format!("/v1/runs/{mias}/share")).0, 404);
    assert_eq!(answer(&mia, reqwest::Method::POST, format!("/v1/runs/{mias}/share")).0, 200);
    assert_eq!(ids(&max), both);
    assert_eq!(answer(&max, reqwest::Method::GET, format!("/v1/runs/{mias}")).0, 200);
    assert_eq!(answer(&max, reqwest::Method::POST, format!("/v1/runs/{mias}/share")).0, 403, "not his to share");
    // `caret runs share --off`: hers alone again.
    let off = Client::new().run(&["runs", "share", &mias, "--off", "--server", &server.url, "--token", &mia], &[]);
    assert!(off.status.success(), "{off:?}");
    assert!(String::from_utf8_lossy(&off.stdout).contains("is yours alone"));
    let mut maxs_only = ids(&max);
    maxs_only.sort();
    assert_eq!(maxs_only, vec![maxs.clone()]);
    let audit: Value =
        c.get(format!("{}/v1/admin/audit", server.url)).bearer_auth(&ada).send().unwrap().json().unwrap();
    let actions: Vec<&str> = audit.as_array().unwrap().iter().map(|r| r["action"].as_str().unwrap()).collect();
    assert!(
        actions.iter().filter(|a| **a == "run.submit").count() == 2 && actions.contains(&"run.share"),
        "{actions:?}"
    );

    // An agent session is its person's too.
    let r = c
        .post(format!("{}/v1/agent/sessions", server.url))
        .bearer_auth(&mia)
        .json(&json!({"workspace": "demo"}))
        .send()
        .unwrap();
    assert_eq!(r.status(), 201);
    let session = r.json::<Value>().unwrap()["id"].as_str().unwrap().to_owned();
    let op = json!({"type": "user_input", "text": "hi"});
    let send = |token: &str, id: &str| {
        let r =
            c.post(format!("{}/v1/agent/sessions/{id}/ops", server.url)).bearer_auth(token).json(&op).send().unwrap();
        (r.status().as_u16(), r.text().unwrap().replace(id, "ID"))
    };
    assert_eq!(send(&max, &session), send(&max, "as-madeup"), "another member's session is unknown to him");
    assert_eq!(send(&max, &session).0, 404);
    assert_eq!(send(&mia, &session).0, 202);
    let events = c.get(format!("{}/v1/agent/sessions/{session}/events", server.url)).bearer_auth(&max).send().unwrap();
    assert_eq!(events.status(), 404);
    server.stop();
}
