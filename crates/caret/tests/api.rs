//! The HTTP API against its description: the OpenAPI document holds every route and method of
//! the router (and nothing else), the committed copy is the generated one, and thousands of
//! requests generated from it (schemathesis) get no server error and no other tenant's data.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

use caret_server::openapi::Access;
use serde_json::Value;

#[path = "common/server.rs"]
mod harness;
use harness::{CARET, Server, http};

/// The committed description, relative to the workspace root.
const COMMITTED: &str = "docs/openapi.json";

fn repo_root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().and_then(Path::parent).unwrap()
}

/// A path template with sample values for its parameters.
fn sample(template: &str) -> String {
    template.replace("{id}", "x1").replace("{token}", "1").replace("{name}", "X")
}

#[test]
fn the_description_holds_every_route_and_method_and_nothing_else() {
    let server = Server::start(&[], &[]);
    let client = http();
    let served: Value = client.get(format!("{}/openapi.json", server.url)).send().unwrap().json().unwrap();

    // The committed copy, `caret openapi` and the served document are one.
    let printed = Command::new(CARET).arg("openapi").output().unwrap();
    assert!(printed.status.success());
    let printed: Value = serde_json::from_slice(&printed.stdout).unwrap();
    assert_eq!(printed, served, "`caret openapi` and /openapi.json differ");
    let committed_path = repo_root().join(COMMITTED);
    if std::env::var_os("CARET_BLESS").is_some() {
        std::fs::write(&committed_path, format!("{printed:#}\n")).unwrap();
    }
    let committed: Value = serde_json::from_str(&std::fs::read_to_string(&committed_path).unwrap()).unwrap();
    assert!(committed == served, "{COMMITTED} is stale: regenerate it with `caret openapi > {COMMITTED}`");

    // Paths, each with its methods and who may call them, as described...
    let mut described: BTreeMap<String, (BTreeSet<String>, BTreeSet<String>)> = BTreeMap::new();
    for (path, item) in served["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            let entry = described.entry(path.clone()).or_default();
            entry.0.insert(method.to_uppercase());
            let security = op["security"].as_array().unwrap();
            let access = security.first().and_then(|s| s.as_object()?.keys().next().cloned());
            entry.1.insert(access.unwrap_or_else(|| "public".into()));
        }
    }
    // ... and as the router answers: a method it lacks gets 405 and `Allow` names the rest.
    // (Behind a token, a wrong method is only told to those who bear one.)
    let tenant = server.tenant("described");
    let owner = server.owner("described-org");
    let operator = server.admin(&["admin", "operator-token", "create"]);
    let scim: Value = client
        .post(format!("{}/v1/admin/tokens", server.url))
        .bearer_auth(&owner)
        .json(&serde_json::json!({"name": "idp", "kind": "scim"}))
        .send()
        .unwrap()
        .json()
        .unwrap();
    let scim = scim["token"].as_str().unwrap().to_owned();
    let mut routed: BTreeMap<String, (BTreeSet<String>, BTreeSet<String>)> = BTreeMap::new();
    for (path, access) in caret_server::http::route_paths() {
        let url = format!("{}{}", server.url, sample(path));
        let token = match access {
            Access::Public => "",
            Access::Tenant => &tenant,
            Access::Admin => &owner,
            Access::Operator => &operator,
            Access::Scim => &scim,
        };
        let answer = client.request(reqwest::Method::TRACE, &url).bearer_auth(token).send().unwrap();
        assert_eq!(answer.status(), 405, "TRACE {path}");
        let allow = answer.headers()["allow"].to_str().unwrap().to_owned();
        let methods = allow.split(',').map(|m| m.trim().to_owned()).filter(|m| m != "HEAD").collect();
        let access = match access {
            Access::Public => "public",
            Access::Tenant | Access::Admin => "tenant",
            Access::Operator => "operator",
            Access::Scim => "scim",
        };
        routed.insert(path.to_owned(), (methods, BTreeSet::from([access.to_owned()])));
    }
    let only_described: Vec<_> = described.keys().filter(|p| !routed.contains_key(*p)).collect();
    let only_routed: Vec<_> = routed.keys().filter(|p| !described.contains_key(*p)).collect();
    assert!(only_described.is_empty(), "described, not routed: {only_described:?}");
    assert!(only_routed.is_empty(), "routed, not described: {only_routed:?}");
    for (path, (methods, access)) in &routed {
        assert_eq!(&described[path].0, methods, "the methods of {path}");
        assert_eq!(&described[path].1, access, "who may call {path}");
    }
    assert!(routed.len() >= 40, "{} routes", routed.len());

    // The description's example edit applies.
    let example = served["components"]["schemas"]["ApplyRequest"]["examples"][0].clone();
    let applied = client.post(format!("{}/v1/apply", server.url)).bearer_auth(&tenant).json(&example).send().unwrap();
    assert_eq!(applied.status(), 200);
    let applied: Value = applied.json().unwrap();
    assert_eq!(applied["text"], "def add(a, b):\n    return a + b\n", "{applied}");
}

/// Requests schemathesis makes per operation (`CARET_API_FUZZ_EXAMPLES`; thousands in the long
/// run of docs/reliability.md).
fn examples() -> u32 {
    std::env::var("CARET_API_FUZZ_EXAMPLES").ok().and_then(|v| v.parse().ok()).unwrap_or(60)
}

/// `caret_http_requests_total` of a server, by (method, route template, status).
fn request_counts(server: &Server) -> BTreeMap<(String, String, u16), u64> {
    let text = http().get(format!("{}/metrics", server.url)).send().unwrap().text().unwrap();
    let mut counts = BTreeMap::new();
    for line in text.lines().filter(|l| l.starts_with("caret_http_requests_total{")) {
        let (labels, count) = line.rsplit_once(' ').unwrap();
        let label = |name: &str| {
            let start = labels.find(&format!("{name}=\"")).unwrap() + name.len() + 2;
            labels[start..].split('"').next().unwrap().to_owned()
        };
        counts.insert((label("method"), label("route"), label("status").parse().unwrap()), count.parse().unwrap());
    }
    counts
}

#[test]
fn generated_requests_get_no_server_error_and_no_other_tenants_data() {
    use caret_test_support::scripted::ScriptedUpstream;
    use caret_test_support::{TempDir, skip};
    use serde_json::json;

    // The same Python as .ci/run installs it for.
    let schemathesis = || {
        let mut cmd = Command::new("python3");
        cmd.args(["-m", "schemathesis.cli"]);
        cmd
    };
    if !schemathesis().arg("--version").output().is_ok_and(|o| o.status.success()) {
        return skip("schemathesis is not installed (python3 -m pip install schemathesis)");
    }
    if caret_test_support::models::TestModel::Embedding.dir().is_none() {
        return skip(
            "the embedding model is not installed (CARET_TEST_MODEL_DIR): the embedding routes need the model",
        );
    }
    let rt = tokio::runtime::Runtime::new().unwrap();
    let up = rt.block_on(ScriptedUpstream::start("fuzzed"));
    let repo = TempDir::new();
    repo.write("add.sh", "echo $(( $1 - $2 ))\n");
    repo.write("test.sh", "[ \"$(sh add.sh 2 3)\" = 5 ]\n");
    repo.git_init();
    repo.git(&["add", "-A"]);
    repo.git(&["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "init"]);
    // Rate limits out of the way (the run is one client at full speed); every capability on.
    let config = format!(
        "[[models]]\nalias = \"agent\"\ndeployments = [{{ provider = \"openai\", url = \"{url}\", model = \"m\" }}]\n\n\
         [[models]]\nalias = \"tab\"\ndeployments = [{{ provider = \"openai\", url = \"{url}\", model = \"m\" }}]\n\n\
         [[models]]\nalias = \"embed\"\ndeployments = [{{ provider = \"openai\", url = \"{url}\", model = \"m\" }}]\n\n\
         [server]\nrate_limit_per_second = 100000.0\nrate_limit_burst = 100000\n\
         ip_rate_limit_per_second = 100000.0\nip_rate_limit_burst = 100000\n\n\
         [server.agent_workspaces]\ndemo = {repo:?}\n",
        url = up.url,
        repo = repo.path().display().to_string(),
    );
    let server = Server::start_with_config(&[], &[], Some(&config));
    let (alice, bob) = (server.tenant("alice"), server.tenant("bob"));
    let operator = server.admin(&["admin", "operator-token", "create"]);
    let client = http();
    let as_bob = |method: reqwest::Method, path: &str, body: Option<Value>| {
        let mut r = client.request(method, format!("{}{path}", server.url)).bearer_auth(&bob);
        if let Some(b) = body {
            r = r.json(&b);
        }
        let r = r.send().unwrap();
        (r.status().as_u16(), r.json::<Value>().unwrap_or(Value::Null))
    };

    // Bob's data: an indexed workspace, a secret, a queued run, an agent session.
    let bobs = harness::Client::new();
    let code = TempDir::new();
    code.write("src/ledger.rs", "pub fn settle_bob_ledger() -> u64 { 42 }\n");
    bobs.sync(code.path(), &server, &bob);
    let workspace = bobs.workspace_id(code.path());
    let secret = format!("BOB_SECRET_{}", fastrand::u32(..));
    let secret_value = format!("bob-value-{}", fastrand::u64(..));
    assert_eq!(
        as_bob(reqwest::Method::PUT, &format!("/v1/secrets/{secret}"), Some(json!({"value": secret_value}))).0,
        204
    );
    // A background run queued by `caret run` (no worker takes it: it stays queued).
    let queue_run = |token: &str, client: &harness::Client| {
        let out = Command::new(CARET)
            .args(["run", "make add.sh add", "-C", repo.path().to_str().unwrap()])
            .args(["--server", &server.url, "--token", token])
            .env("CARET_HOME", client.home.join("home"))
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    };
    let run = queue_run(&bob, &bobs);
    let (status, session) = as_bob(reqwest::Method::POST, "/v1/agent/sessions", Some(json!({"workspace": "demo"})));
    assert_eq!(status, 201, "{session}");
    let session = session["id"].as_str().unwrap().to_owned();
    // (An operator's token may lease and end bob's run: a worker's job. Its existence is bob's.)
    let bobs_state = || {
        let run = as_bob(reqwest::Method::GET, &format!("/v1/runs/{run}"), None);
        (
            as_bob(reqwest::Method::GET, &format!("/v1/workspaces/{workspace}"), None),
            as_bob(reqwest::Method::GET, "/v1/secrets", None),
            (run.0, run.1["id"].clone()),
        )
    };
    let before = bobs_state();

    // Alice's own workspace and run, for generated requests to reach past the lookups.
    let alices = harness::Client::new();
    let her_code = TempDir::new();
    her_code.write("src/notes.py", "def alice_notes():\n    return 1\n");
    alices.sync(her_code.path(), &server, &alice);
    let her_workspace = alices.workspace_id(her_code.path());
    let her_run = queue_run(&alice, &alices);

    // The run, as alice (and the operator on the workers' routes).
    let work = TempDir::new();
    let victim = json!({
        "own": { "workspace": her_workspace, "run": her_run },
        "workspace": workspace, "run": run, "session": session, "secret": secret,
        "private": [workspace, run, session, secret, secret_value],
        "server_named": [run, session],
    });
    let tests = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    // One run's seed (schemathesis prints it; CARET_API_FUZZ_SEED replays it).
    let seed: u32 =
        std::env::var("CARET_API_FUZZ_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or_else(|| fastrand::u32(..));
    // Two runs side by side, each on about half of the operations (people, sign-in and runs;
    // the rest): one run keeps a core busy, mostly in Python, so two halve the test's time.
    let people = r"^/(v1/)?(admin|scim|auth|invitations|me|runs)(/|$)";
    let runs: Vec<_> = [("--include-path-regex", people), ("--exclude-path-regex", people)]
        .into_iter()
        .map(|(filter, paths)| {
            schemathesis()
                .current_dir(work.path())
                .args(["--config-file", tests.join("api_schemathesis.toml").to_str().unwrap(), "run"])
                .arg(format!("{}/openapi.json", server.url))
                .args(["--url", &server.url, "--checks", "all", "--exclude-checks", "positive_data_acceptance"])
                .args(["--max-examples", &examples().to_string(), "--request-timeout", "20", "--no-color"])
                .args(["--seed", &seed.to_string(), "--generation-database", "none", "--workers", "1"])
                .args([filter, paths])
                .env("CARET_FUZZ_SEED", seed.to_string())
                .env("SCHEMATHESIS_HOOKS", tests.join("api_hooks.py"))
                .env("CARET_FUZZ_TENANT_TOKEN", &alice)
                .env("CARET_FUZZ_OPERATOR_TOKEN", &operator)
                .env("CARET_FUZZ_VICTIM", victim.to_string())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for run in runs {
        let out = run.wait_with_output().unwrap();
        let report = format!("{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        eprintln!("{report}");
        assert!(out.status.success(), "schemathesis found failures (above)");
    }

    // The server is up, saw no 5xx, and every operation got its share of requests.
    assert_eq!(client.get(format!("{}/healthz", server.url)).send().unwrap().status(), 200);
    let counts = request_counts(&server);
    let server_errors: Vec<_> = counts.iter().filter(|((_, _, s), _)| *s >= 500).collect();
    assert!(server_errors.is_empty(), "5xx answers: {server_errors:?}");
    let mut total = 0;
    for (method, path, _) in caret_server::openapi::operation_list() {
        let of_op = || counts.iter().filter(|((m, r, _), _)| m.eq_ignore_ascii_case(method) && r == path);
        let n: u64 = of_op().map(|(_, n)| n).sum();
        let ok: u64 = of_op().filter(|((_, _, s), _)| (200..300).contains(s)).map(|(_, n)| n).sum();
        eprintln!("{method:>6} {path}: {n} requests, {ok} 2xx");
        assert!(n > 0, "{method} {path} was never called");
        total += n;
    }
    eprintln!("{total} requests in all");

    // Bob's data is as it was.
    assert_eq!(before, bobs_state(), "another tenant's requests changed bob's data");
    assert!(before.1.1["names"].as_array().unwrap().contains(&json!(secret)));
}
