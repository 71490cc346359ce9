//! The secret rules: what they find, and what they must not (placeholders, low entropy).

use super::*;

/// Scans `text` and returns the rule ids found, in order.
fn rules_in(text: &str) -> Vec<&'static str> {
    SecretScanner::new().scan(text).into_iter().map(|f| f.rule).collect()
}

/// A true positive and a near miss for one rule.
fn check(rule: &str, positive: &str, near_miss: &str) {
    assert_eq!(rules_in(positive), vec![rule], "expected {rule} in {positive:?}");
    assert_eq!(rules_in(near_miss), Vec::<&str>::new(), "false positive in {near_miss:?}");
}

#[test]
fn every_rule_has_a_true_positive_and_a_near_miss() {
    check(
        "private-key",
        "-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEA75xpQ3v8Zk2Lm9Nq4Rt6Ws1Xy3Za5Bc7De9Fg2Hj4Kl6Mn8\n-----END RSA PRIVATE KEY-----\n",
        "const PEM_HEADER: &str = \"-----BEGIN PRIVATE KEY-----\";\n",
    );
    check(
        "private-key",
        "let key = \"-----BEGIN OPENSSH PRIVATE KEY-----\\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW\";",
        "if line.starts_with(\"-----BEGIN EC PRIVATE KEY-----\") { parse(line) }",
    );
    check(
        "aws-access-key-id",
        "aws_access_key_id = AKIAQ3MZ7K2N4PVW5XYT\n",
        "let prefix = \"AKIAQ3MZ7K2N4PVW\"; // twelve after AKIA: too short\n",
    );
    check(
        "aws-secret-access-key",
        "AWS_SECRET_ACCESS_KEY: \"wJalrXUtnFEMI/K7MDENG/bPxRfiCYzQ3kd8Lm2v\"\n",
        "aws_secret_access_key = os.environ[\"AWS_SECRET_ACCESS_KEY\"]\n",
    );
    check(
        "github-token",
        "GITHUB = \"ghp_R4nd0mT0k3nV4lu3AbCdEfGhIjKlMnOpQrSt\"\n",
        "if token.starts_with(\"ghp_\") && token.len() == 40 { classic(token) }\n",
    );
    check("gitlab-token", "gitlab_token: glpat-Xy7Zq2Vb9Nm4Lk8Jh3Gf\n", "const PREFIX: &str = \"glpat-\";\n");
    check(
        "slack-token",
        "let bot = \"xoxb-123456789012-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx\";\n",
        "// tokens look like xoxb-your-bot-token-here\n",
    );
    check(
        "slack-webhook",
        "url = \"https://hooks.slack.com/services/T01ABCDEF/B02GHIJKL/AbCdEfGhIjKlMnOpQrStUvWx\"\n",
        "See https://hooks.slack.com/services/ for how webhooks work.\n",
    );
    check(
        "stripe-key",
        "Stripe.api_key = 'sk_live_4eC39HqLyjWDarjtT1zdp7dc'\n",
        "const publishable = 'pk_live_4eC39HqLyjWDarjtT1zdp7dc';\n",
    );
    check(
        "google-api-key",
        "const MAPS = \"AIzaSyD-9tSrke72PouQMnMX-a7eZSW0jkFMBWY\";\n",
        "if key.startswith(\"AIza\") and len(key) == 39: ok()\n",
    );
    check(
        "jwt",
        "Authorization: Bearer eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4ifQ.SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c\n",
        "x = \"eyJub3QiOiJhIGp3dCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.c29tZXRoaW5nIGVsc2UgZW50aXJlbHk\"\n",
    );
    check(
        "connection-string-password",
        "DATABASE_URL = \"postgres://app:S3cr3tPa55w0rd@db.internal:5432/app\"\n",
        "DATABASE_URL = \"postgres://app:${DB_PASSWORD}@db.internal:5432/app\"\n",
    );
    check("generic-secret", "api_key = \"Zx9Qm2Lr7Tp4Vw8Ks3Nb\"\n", "api_key = \"your-api-key-here-1234\"\n");
    check(
        "generic-secret",
        "let body = \"{\\\"client_secret\\\": \\\"hK8mP2vL9qR4xT7w\\\"}\";\n",
        "let body = \"{\\\"client_secret\\\": \\\"${CLIENT_SECRET}\\\"}\";\n",
    );
    check(
        "generic-secret",
        "export SECRET_TOKEN=9f8a7b6c5d4e3f2a1b0c9d8e\n",
        "export SECRET_TOKEN=$(vault read -field=token secret/app)\n",
    );
}

#[test]
fn ordinary_code_has_no_findings() {
    // The last lines are false positives once seen in real crate sources.
    let code = r##"
const EMPTY_SHA256: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
let uuid = "123e4567-e89b-12d3-a456-426614174000";
password = "correct horse battery staple"
token = "${GITHUB_TOKEN}"
let token_type = "access_token_bearer";
password_field = "user_password_input_1"
tokenizer = "sentence-transformers/all-MiniLM-L6-v2"
secret_name = "prod/db/credentials"
max_tokens: "4096"
if password == "" { return Err(Error::EmptyPassword) }
let api_key = std::env::var("OPENAI_API_KEY")?;
db = "postgres://postgres:postgres@localhost:5432/test"
docs = "mysql://user:password@host/db"
headers["Authorization"] = f"Bearer {token}"
self.secret_key = secret_key
key_id: "AKIAIOSFODNN7EXAMPLE".to_string(),
EnvConfigFileKind::Credentials => "~/.aws/credentials",
let input = r#"<XmlBodyInput token="&quot;&apos;&amp;">"#;
let password = "secret_fish!!";
ClientApplicationTrafficSecret => "CLIENT_TRAFFIC_SECRET_0",
let url = Url::parse("ftp://rms:secret123@example.com")?;
"input": "redis://foo:bar@somehost:6379/0",
("ftp://😅:🙂@🙂.com", "ftp://🙂.com"),
"##;
    assert_eq!(SecretScanner::new().scan(code), vec![]);
}

#[test]
fn findings_report_line_but_never_the_value() {
    let text = "fn main() {}\n\nlet k = \"AKIAQ3MZ7K2N4PVW5XYT\";\n";
    let findings = SecretScanner::new().scan(text);
    assert_eq!(findings.len(), 1);
    assert_eq!(findings[0].line, 3);
    let json = serde_json::to_string(&findings[0]).unwrap();
    assert_eq!(json, r#"{"rule":"aws-access-key-id","line":3}"#);
}

#[test]
fn every_documented_rule_exists() {
    let ids: std::collections::BTreeSet<_> = patterns().into_iter().map(|p| p.0).collect();
    let documented: std::collections::BTreeSet<_> = RULES.iter().map(|r| r.0).collect();
    assert_eq!(ids, documented);
}
