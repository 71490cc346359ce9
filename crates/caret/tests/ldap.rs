//! Signing in to a team server with a directory: OpenLDAP's `slapd` (Debian's), StartTLS with
//! a certificate the server checks against the configured CA, search then bind: `caret login
//! --ldap`, the team page's session, roles from the directory's groups, wrong passwords and
//! LDAP filter metacharacters in user names refused with 401 and nothing made, every attempt in
//! the audit trail.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

#[path = "common/server.rs"]
mod harness;
use harness::{Client, Server, http};

/// A directory: slapd on a free port, its data and certificate in a temporary directory.
struct Slapd {
    child: Child,
    url: String,
    ca: std::path::PathBuf,
    _dir: caret_test_support::TempDir,
}

impl Slapd {
    fn start() -> Option<Slapd> {
        if !Path::new("/usr/sbin/slapd").exists() {
            caret_test_support::skip("slapd is not installed (apt-get install slapd ldap-utils; .ci/run does)");
            return None;
        }
        let dir = caret_test_support::TempDir::new();
        let d = dir.path();
        std::fs::create_dir_all(d.join("db")).unwrap();
        // A CA, and the directory's certificate signed by it (rustls refuses a CA as an end
        // entity, so not one self-signed certificate).
        let openssl = |args: &[&str]| {
            let done = Command::new("openssl").args(args).current_dir(d).stderr(Stdio::null()).status().unwrap();
            assert!(done.success(), "openssl {args:?}");
        };
        openssl(
            &["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=caret-test-ca"]
                .iter()
                .copied()
                .chain(["-keyout", "ca.key", "-out", "ca.pem"])
                .collect::<Vec<_>>(),
        );
        openssl(&[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            "/CN=127.0.0.1",
            "-keyout",
            "key.pem",
            "-out",
            "server.csr",
        ]);
        std::fs::write(d.join("ext.cnf"), "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n")
            .unwrap();
        openssl(&[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            "ext.cnf",
            "-out",
            "cert.pem",
        ]);
        let conf = format!(
            "include /etc/ldap/schema/core.schema\ninclude /etc/ldap/schema/cosine.schema\n\
             include /etc/ldap/schema/inetorgperson.schema\ninclude /etc/ldap/schema/nis.schema\n\
             modulepath /usr/lib/ldap\nmoduleload back_mdb\npidfile {d}/slapd.pid\n\
             TLSCertificateFile {d}/cert.pem\nTLSCertificateKeyFile {d}/key.pem\n\
             database mdb\nsuffix \"dc=acme,dc=example\"\nrootdn \"cn=admin,dc=acme,dc=example\"\n\
             rootpw secret\ndirectory {d}/db\n",
            d = d.display()
        );
        std::fs::write(d.join("slapd.conf"), conf).unwrap();
        let person = |uid: &str, name: &str, mail: &str| {
            format!(
                "dn: uid={uid},ou=people,dc=acme,dc=example\nobjectClass: inetOrgPerson\nuid: {uid}\ncn: {name}\n\
                 sn: {name}\nmail: {mail}\nuserPassword: {uid}-pass\n\n"
            )
        };
        let ldif = format!(
            "dn: dc=acme,dc=example\nobjectClass: dcObject\nobjectClass: organization\no: Acme\ndc: acme\n\n\
             dn: ou=people,dc=acme,dc=example\nobjectClass: organizationalUnit\nou: people\n\n{}{}{}\
             dn: cn=caret-admins,dc=acme,dc=example\nobjectClass: groupOfNames\ncn: caret-admins\n\
             member: uid=ada,ou=people,dc=acme,dc=example\n\n\
             dn: cn=eng,dc=acme,dc=example\nobjectClass: groupOfNames\ncn: eng\n\
             member: uid=ada,ou=people,dc=acme,dc=example\nmember: uid=bob,ou=people,dc=acme,dc=example\n",
            person("ada", "Ada Lovelace", "ada@acme.example"),
            person("bob", "Bob", "bob@acme.example"),
            person("eve", "Eve", "eve@evil.example"),
        );
        std::fs::write(d.join("data.ldif"), ldif).unwrap();
        let loaded = Command::new("/usr/sbin/slapadd")
            .arg("-f")
            .arg(d.join("slapd.conf"))
            .arg("-l")
            .arg(d.join("data.ldif"))
            .output()
            .unwrap();
        assert!(loaded.status.success(), "slapadd: {}", String::from_utf8_lossy(&loaded.stderr));
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let url = format!("ldap://127.0.0.1:{port}");
        let child = Command::new("/usr/sbin/slapd")
            .arg("-f")
            .arg(d.join("slapd.conf"))
            .args(["-h", &format!("{url}/"), "-d", "0"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let until = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < until, "slapd did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        Some(Slapd { child, url, ca: d.join("ca.pem"), _dir: dir })
    }
}

impl Drop for Slapd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn people_sign_in_with_the_organisations_directory() {
    let Some(slapd) = Slapd::start() else { return };
    let settings = format!(
        "[server.ldap]\nurl = \"{}\"\nstarttls = true\nca_cert = \"{}\"\nbind_dn = \"cn=admin,dc=acme,dc=example\"\n\
         bind_password = \"secret\"\nbase_dn = \"ou=people,dc=acme,dc=example\"\ngroup_base_dn = \"dc=acme,dc=example\"\n\
         organisation = \"acme\"\nallowed_domains = [\"acme.example\"]\ngroup_roles = {{ \"caret-admins\" = \"admin\" }}\n",
        slapd.url,
        slapd.ca.display()
    );
    let server = Server::start_with_config(&[], &[], Some(&settings));
    let owner = server.admin(&["admin", "bootstrap", "--organisation", "acme", "--email", "owner@acme.example"]);
    let h = http();
    let methods: Value = h.get(format!("{}/v1/auth/methods", server.url)).send().unwrap().json().unwrap();
    assert_eq!((methods["ldap"].as_bool(), methods["oidc"].as_bool()), (Some(true), Some(false)));

    // `caret login --ldap`: search then bind over StartTLS; the directory's group makes Ada an
    // admin, and her groups follow the directory's.
    let ada = Client::new();
    let out = ada.run(&["login", "--server", &server.url, "--ldap", "ada"], &[("CARET_PASSWORD", "ada-pass")]);
    let log = || std::fs::read_to_string(&server.log).unwrap_or_default();
    assert!(out.status.success(), "{out:?}\n{}", log());
    assert!(String::from_utf8_lossy(&out.stdout).contains("ada@acme.example (admin)"), "{out:?}");
    let who = ada.run(&["whoami", "--server", &server.url, "--json"], &[]);
    let me: Value = serde_json::from_slice(&who.stdout).unwrap();
    assert_eq!((me["role"].as_str(), me["kind"].as_str()), (Some("admin"), Some("access")));
    let groups: Value =
        h.get(format!("{}/v1/admin/groups", server.url)).bearer_auth(&owner).send().unwrap().json().unwrap();
    let names: Vec<&str> = groups.as_array().unwrap().iter().map(|g| g["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["caret-admins", "eng"]);

    // The page's session from the same directory account.
    let page = h
        .post(format!("{}/v1/auth/ldap", server.url))
        .json(&json!({"username": "bob", "password": "bob-pass", "page": true}))
        .send()
        .unwrap();
    assert_eq!(page.status(), 204);
    let cookie = page
        .headers()
        .get_all("set-cookie")
        .iter()
        .map(|c| c.to_str().unwrap().split(';').next().unwrap().to_owned())
        .collect::<Vec<_>>()
        .join("; ");
    let bobs_me: Value =
        h.get(format!("{}/v1/me", server.url)).header("cookie", &cookie).send().unwrap().json().unwrap();
    assert_eq!((bobs_me["name"].as_str(), bobs_me["role"].as_str()), (Some("bob@acme.example"), Some("member")));

    // Wrong passwords, an empty one, filter metacharacters (which unescaped would find Ada),
    // a domain not allowed: 401 or 403, nothing made.
    let people_before: Value =
        h.get(format!("{}/v1/admin/users", server.url)).bearer_auth(&owner).send().unwrap().json().unwrap();
    for (user, password, status) in [
        ("ada", "wrong", 401),
        ("ada", "", 401),
        ("nobody", "x", 401),
        ("ada)(uid=*", "ada-pass", 401),
        ("a*", "ada-pass", 401),
        ("*", "ada-pass", 401),
        ("ada\\29", "ada-pass", 401),
        ("eve", "eve-pass", 403),
    ] {
        let r = h
            .post(format!("{}/v1/auth/ldap", server.url))
            .json(&json!({"username": user, "password": password}))
            .send()
            .unwrap();
        assert_eq!(r.status(), status, "{user:?}/{password:?}");
        let body: Value = r.json().unwrap();
        if status == 401 {
            assert_eq!(body["error"]["message"], "the user name or password is wrong", "{body}");
        }
    }
    let people_after: Value =
        h.get(format!("{}/v1/admin/users", server.url)).bearer_auth(&owner).send().unwrap().json().unwrap();
    assert_eq!(people_before, people_after, "nothing made by refused sign-ins");
    let malformed = h.post(format!("{}/v1/auth/ldap", server.url)).body("{").header("content-type", "application/json");
    assert_eq!(malformed.send().unwrap().status(), 400);

    // The audit trail holds every attempt, never a password.
    let audit: Value =
        h.get(format!("{}/v1/admin/audit?limit=1000", server.url)).bearer_auth(&owner).send().unwrap().json().unwrap();
    let attempts: Vec<&Value> = audit.as_array().unwrap().iter().filter(|r| r["action"] == "sign_in.ldap").collect();
    assert_eq!(attempts.iter().filter(|r| r["outcome"] == "ok").count(), 2, "{attempts:?}");
    assert_eq!(attempts.iter().filter(|r| r["outcome"] != "ok").count(), 8, "{attempts:?}");
    assert!(!audit.to_string().contains("ada-pass"));
}
