//! Signing in to a team server through a real OpenID Connect provider (`oidc-provider` from
//! npm, OpenID Certified, run by `tests/idp/provider.mjs`), as people would: the admin page in
//! Chromium (session cookie, CSRF), `caret login` in a browser (loopback + PKCE) and with the
//! device flow, the tokens refreshed and signed out; the provider's key rotated; replayed codes,
//! wrong states and forged grants refused with a 4xx and nothing written; the audit trail
//! holding every sign-in and failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead as _, BufReader, Read as _};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

#[path = "common/server.rs"]
mod harness;
use harness::{Client, Server, http};
#[path = "common/browser.rs"]
mod browser;
use browser::Browser;

/// The provider: a node process, killed with the test.
struct Idp {
    child: Child,
    issuer: String,
}

impl Idp {
    /// Starts the provider on `port`, its keys in `dir` (a new signing key when `rotate`).
    fn start(dir: &Path, port: u16, redirect: &str, rotate: bool) -> Option<Idp> {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/idp");
        if !script.join("node_modules/oidc-provider").exists() {
            caret_test_support::skip("oidc-provider is not installed (npm ci in crates/caret/tests/idp)");
            return None;
        }
        let accounts = serde_json::json!({
            "ada": { "email": "ada@acme.example", "name": "Ada Lovelace", "groups": ["caret-admins", "eng"] },
            "bob": { "email": "bob@acme.example", "name": "Bob", "groups": ["eng"] },
            "eve": { "email": "eve@evil.example", "name": "Eve", "groups": [] },
        });
        let mut child = Command::new("node")
            .arg(script.join("provider.mjs"))
            .env("IDP_PORT", port.to_string())
            .env("IDP_DIR", dir)
            .env("IDP_REDIRECT_URIS", redirect)
            .env("IDP_ACCOUNTS", accounts.to_string())
            .env("IDP_ROTATE", if rotate { "1" } else { "" })
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        // The provider's notices go on being read (a closed pipe would end it).
        std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
        let issuer =
            line.trim().strip_prefix("listening ").unwrap_or_else(|| panic!("the provider: {line:?}")).to_owned();
        Some(Idp { child, issuer })
    }
}

impl Drop for Idp {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Goes through the provider's sign-in as a browser would (cookies kept, redirects followed
/// by hand) and answers the provider's redirect back to the server, not followed.
fn provider_answer(server: &str, login: &str) -> String {
    let c = reqwest::blocking::Client::builder()
        .cookie_store(true)
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let mut url = format!("{server}/v1/auth/login?next=/admin");
    for _ in 0..20 {
        if url.starts_with(&format!("{server}/v1/auth/callback")) {
            return url;
        }
        let r = c.get(&url).send().unwrap();
        let page = url::Url::parse(&url).unwrap();
        let r = if r.status() == 200 && page.path().starts_with("/interaction/") {
            c.post(&url).form(&[("login", login), ("password", "x")]).send().unwrap()
        } else {
            r
        };
        let to = r.headers().get("location").unwrap_or_else(|| panic!("{url}: {}", r.status())).to_str().unwrap();
        url = page.join(to).unwrap().to_string();
    }
    panic!("the provider never answered the server")
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Signs in at the provider's form when it asks (a provider session may skip it), and waits
/// until `done` holds.
fn sign_in_at_provider(browser: &Browser, login: &str, done: &str) {
    let until = Instant::now() + Duration::from_secs(20);
    let mut submitted = Value::Null;
    loop {
        if browser.eval(done) == true {
            return;
        }
        // A device's sign-in is confirmed by its person first.
        if browser.eval("return !!document.querySelector('#confirm')") == true {
            browser.eval("document.querySelector('#confirm').click(); return true");
            std::thread::sleep(Duration::from_millis(100));
            continue;
        }
        let here = browser.eval("return location.href");
        if here != submitted
            && browser
                .eval("return !!document.querySelector('#login') && location.pathname.startsWith('/interaction/')")
                == true
        {
            submitted = here;
            browser.eval(&format!(
                "document.querySelector('#login').value = '{login}'; document.querySelector('#password').value = 'x'; \
                 document.querySelector('form').submit(); return true"
            ));
        }
        assert!(
            Instant::now() < until,
            "the sign-in did not finish: {} {}",
            browser.eval("return location.href"),
            browser.eval("return document.body.innerText.slice(0, 500)")
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Runs `caret login` with `args`, hands the address it prints to the browser, and waits.
fn login_through(client: &Client, browser: &Browser, server: &str, args: &[&str], login: &str) -> String {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_caret"));
    cmd.args(["login", "--server", server]).args(args);
    cmd.env("CARET_HOME", client.home.join("home")).env("HOME", client.home.path()).env_remove("RUST_LOG");
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut address = String::new();
    while !address.starts_with("http") {
        address.clear();
        assert!(err.read_line(&mut address).unwrap() > 0, "caret login printed no address");
        address = address.trim().trim_start_matches('(').trim_end_matches(')').to_owned();
    }
    browser.open(&address);
    let done = "return document.body.innerText.includes('Signed in') || document.body.innerText.includes('signed in')";
    sign_in_at_provider(browser, login, done);
    let status = child.wait().unwrap();
    let (mut out, mut rest) = (String::new(), String::new());
    child.stdout.take().unwrap().read_to_string(&mut out).unwrap();
    err.read_to_string(&mut rest).unwrap();
    assert!(status.success(), "caret login {args:?}: {out}{rest}");
    out
}

#[test]
fn people_sign_in_through_the_organisations_provider() {
    let idp_dir = caret_test_support::TempDir::new();
    let idp_port = free_port();
    let settings = format!(
        "[server.oidc]\nissuer = \"http://127.0.0.1:{idp_port}\"\nclient_id = \"caret\"\nclient_secret = \"caret-secret\"\n\
         organisation = \"acme\"\nscopes = [\"openid\", \"email\", \"profile\", \"groups\"]\n\
         allowed_domains = [\"acme.example\"]\ngroup_roles = {{ \"caret-admins\" = \"admin\" }}\n"
    );
    let server = Server::start_with_config(&[], &[], Some(&settings));
    let owner = server.admin(&["admin", "bootstrap", "--organisation", "acme", "--email", "owner@acme.example"]);
    let callback = format!("{}/v1/auth/callback", server.url);
    let Some(idp) = Idp::start(idp_dir.path(), idp_port, &callback, false) else { return };
    assert_eq!(idp.issuer, format!("http://127.0.0.1:{idp_port}"));
    let h = http();
    let methods: Value = h.get(format!("{}/v1/auth/methods", server.url)).send().unwrap().json().unwrap();
    assert_eq!(methods["oidc"], true);

    // The admin page: not signed in, then through the provider, from the first redirect to
    // the signed-in page.
    let browser = Browser::start();
    browser.open(&format!("{}/admin", server.url));
    browser.wait_for("the sign-in link", 10, "return !document.querySelector('#sso').hidden");
    let started = Instant::now();
    browser.eval("document.querySelector('#sso-link').click(); return true");
    let signed_in = "return !document.querySelector('#board')?.hidden && \
                     (document.querySelector('#status')?.textContent || '').startsWith('ada@acme.example')";
    sign_in_at_provider(&browser, "ada", signed_in);
    let took = started.elapsed();
    println!("browser sign-in through OIDC, first redirect to a signed-in page: {} ms", took.as_millis());
    let shown = browser.eval("return document.querySelector('#status').textContent");
    assert!(shown.as_str().unwrap().contains("(admin)"), "the provider's group made Ada an admin: {shown}");
    // The page's changes carry the CSRF token; the same change without it is refused.
    browser.eval(
        "document.querySelector('#add-person input[name=email]').value = 'carl@acme.example'; \
                  document.querySelector('#add-person').requestSubmit(); return true",
    );
    browser.wait_for(
        "the new person",
        10,
        "return document.querySelector('#people').innerText.includes('carl@acme.example')",
    );
    let forged = browser.eval_async(
        "const done = arguments[arguments.length - 1]; \
         fetch('/v1/admin/users', {method: 'POST', credentials: 'same-origin', headers: {'Content-Type': 'application/json'}, \
           body: JSON.stringify({email: 'forged@acme.example'})}).then(r => r.json().then(b => done([r.status, b.error.code])));",
        serde_json::json!([]),
    );
    assert_eq!(forged, serde_json::json!([403, "csrf"]));
    // The cookie is HttpOnly: the page's script never sees the session.
    let cookies = browser.eval("return document.cookie");
    assert!(!cookies.as_str().unwrap().contains("caret_session"), "{cookies}");
    assert!(cookies.as_str().unwrap().contains("caret_csrf"), "{cookies}");

    // `caret login` in a browser: the loopback redirect with PKCE; every client then uses it.
    let ada = Client::new();
    let out = login_through(&ada, &browser, &server.url, &["--no-browser"], "ada");
    assert!(out.contains("ada@acme.example (admin)"), "{out}");
    let kept: Value =
        serde_json::from_str(&std::fs::read_to_string(ada.home.join("home/credentials.json")).unwrap()).unwrap();
    let saved = &kept[&server.url];
    assert!(saved["refresh_token"].is_string() && saved["expires_at"].is_i64(), "{kept}");
    let who = ada.run(&["whoami", "--server", &server.url, "--json"], &[]);
    let me: Value = serde_json::from_slice(&who.stdout).unwrap();
    assert_eq!((me["name"].as_str(), me["kind"].as_str()), (Some("ada@acme.example"), Some("access")));
    let people = ada.run(&["admin", "user", "ls", "--server", &server.url], &[]);
    assert!(String::from_utf8_lossy(&people.stdout).contains("owner@acme.example"), "{people:?}");

    // A nearly spent access token is refreshed by the next command (and the old refresh token
    // then refused, its reuse revoking the sign-in).
    let mut spent = kept.clone();
    spent[&server.url]["expires_at"] = serde_json::json!(1);
    std::fs::write(ada.home.join("home/credentials.json"), spent.to_string()).unwrap();
    let who = ada.run(&["whoami", "--server", &server.url], &[]);
    assert!(who.status.success(), "{who:?}");
    let after: Value =
        serde_json::from_str(&std::fs::read_to_string(ada.home.join("home/credentials.json")).unwrap()).unwrap();
    assert_ne!(after[&server.url]["token"], kept[&server.url]["token"], "refreshed");
    let old_refresh = kept[&server.url]["refresh_token"].as_str().unwrap();
    let reused = h
        .post(format!("{}/v1/auth/token", server.url))
        .form(&[("grant_type", "refresh_token"), ("refresh_token", old_refresh)])
        .send()
        .unwrap();
    assert_eq!(reused.status(), 400);
    assert_eq!(reused.json::<Value>().unwrap()["error"], "invalid_grant");
    // (Every replica honours the revocation within 5 s.)
    let until = Instant::now() + Duration::from_secs(5);
    while ada.run(&["whoami", "--server", &server.url], &[]).status.success() {
        assert!(Instant::now() < until, "the reuse revoked the refreshed sign-in too");
        std::thread::sleep(Duration::from_millis(200));
    }

    // The device flow: the code confirmed in the browser (already signed in at the provider).
    let bob = Client::new();
    let out = login_through(&bob, &browser, &server.url, &["--device"], "bob");
    assert!(out.contains("ada@acme.example") || out.contains("bob@acme.example"), "{out}");
    let who = bob.run(&["whoami", "--server", &server.url, "--json"], &[]);
    let me: Value = serde_json::from_slice(&who.stdout).unwrap();
    let device_person = me["name"].as_str().unwrap().to_owned();
    // Signing out ends that sign-in on the server.
    let token = me["credential"].as_str().unwrap().to_owned();
    let out = bob.run(&["logout", "--server", &server.url], &[]);
    assert!(out.status.success(), "{out:?}");
    let listed: Value =
        h.get(format!("{}/v1/admin/tokens", server.url)).bearer_auth(&owner).send().unwrap().json().unwrap();
    assert!(listed.as_array().unwrap().iter().all(|t| t["id"] != token.as_str()), "sign-ins are not listed");

    // Bad input: a wrong state, a replayed provider answer, forged grants: 4xx, nothing written.
    let people_before: Value =
        h.get(format!("{}/v1/admin/users", server.url)).bearer_auth(&owner).send().unwrap().json().unwrap();
    let no_redirects =
        reqwest::blocking::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap();
    let wrong = no_redirects.get(format!("{}/v1/auth/callback?code=abc&state=made-up", server.url)).send().unwrap();
    assert_eq!(wrong.status(), 400);
    for form in [
        vec![
            ("grant_type", "authorization_code"),
            ("code", "forged"),
            ("code_verifier", "v"),
            ("redirect_uri", "http://127.0.0.1:1/callback"),
        ],
        vec![("grant_type", "refresh_token"), ("refresh_token", "forged")],
        vec![("grant_type", "urn:ietf:params:oauth:grant-type:device_code"), ("device_code", "forged")],
        vec![("grant_type", "password")],
    ] {
        let r = h.post(format!("{}/v1/auth/token", server.url)).form(&form).send().unwrap();
        assert_eq!(r.status(), 400, "{form:?}");
    }
    let bad_redirect = no_redirects
        .get(format!("{}/v1/auth/login?redirect_uri=https://evil.example/cb&state=s&code_challenge={}&code_challenge_method=S256", server.url, "a".repeat(43)))
        .send()
        .unwrap();
    assert_eq!(bad_redirect.status(), 400);
    // The provider's answer with a wrong state is refused; the right one signs in once; the
    // same answer replayed is refused.
    let answer = provider_answer(&server.url, "ada");
    let wrong_state = answer.replace("state=", "state=x");
    assert_eq!(no_redirects.get(&wrong_state).send().unwrap().status(), 400);
    let first = no_redirects.get(&answer).send().unwrap();
    assert_eq!(first.status(), 303);
    assert!(first.headers().get_all("set-cookie").iter().any(|c| {
        let c = c.to_str().unwrap();
        c.starts_with("caret_session=") && c.contains("HttpOnly") && c.contains("Secure") && c.contains("SameSite=Lax")
    }));
    let replayed = no_redirects.get(&answer).send().unwrap();
    assert_eq!(replayed.status(), 400);
    assert!(replayed.text().unwrap().contains("used already"));
    // A person of a domain not allowed is refused and recorded.
    let eve = Browser::start();
    eve.open(&format!("{}/v1/auth/login?next=/admin", server.url));
    sign_in_at_provider(&eve, "eve", "return document.body.innerText.includes('not among the domains')");
    let people_after: Value =
        h.get(format!("{}/v1/admin/users", server.url)).bearer_auth(&owner).send().unwrap().json().unwrap();
    let emails =
        |v: &Value| v.as_array().unwrap().iter().map(|p| p["email"].as_str().unwrap().to_owned()).collect::<Vec<_>>();
    assert_eq!(emails(&people_before), emails(&people_after), "nothing made by bad input");
    assert!(!emails(&people_after).contains(&"eve@evil.example".to_owned()));

    // The provider rotates its signing key: the next sign-in reads the new key.
    drop(idp);
    let idp = Idp::start(idp_dir.path(), idp_port, &callback, true).unwrap();
    let carol = Browser::start();
    carol.open(&format!("{}/v1/auth/login?next=/admin", server.url));
    sign_in_at_provider(
        &carol,
        "bob",
        "return location.pathname === '/admin' && document.cookie.includes('caret_csrf')",
    );
    drop(idp);

    // The audit trail holds the sign-ins and the failures (no code, no token).
    let audit: Value =
        h.get(format!("{}/v1/admin/audit?limit=1000", server.url)).bearer_auth(&owner).send().unwrap().json().unwrap();
    let sign_ins: Vec<&Value> = audit.as_array().unwrap().iter().filter(|r| r["action"] == "sign_in.oidc").collect();
    let ok = sign_ins.iter().filter(|r| r["outcome"] == "ok").count();
    let failed = sign_ins.iter().filter(|r| r["outcome"].as_str().unwrap().starts_with("failed")).count();
    assert!(ok >= 5 && failed >= 2, "{sign_ins:?}");
    assert!(sign_ins.iter().any(|r| r["target"] == device_person.as_str()));
    let text = audit.to_string();
    assert!(!text.contains(old_refresh) && !text.contains("caret-secret"));
}
