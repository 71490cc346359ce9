//! Secret scanning: text that must never leave the machine.
//!
//! Every chunk is checked before it is indexed; a chunk with a finding is withheld. A
//! [`Finding`] names the rule and the line, never the secret itself. Rules are regular
//! expressions followed by a validation step (entropy, placeholder and structure checks) that
//! keeps false positives on ordinary code low.

use regex::bytes::{Regex, RegexSet};

/// One secret found in a text: which rule, where. The matched value is deliberately absent.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Finding {
    /// The rule's id, e.g. `aws-access-key-id`.
    pub rule: &'static str,
    /// 1-based line of the start of the match.
    pub line: u32,
    /// Byte range of the match in the scanned text (used to withhold overlapping chunks).
    #[serde(skip)]
    pub span: std::ops::Range<usize>,
}

struct Rule {
    id: &'static str,
    regex: Regex,
    /// Index of the capture group holding the secret value (0: the whole match).
    group: usize,
    validate: fn(&Captures<'_>) -> bool,
}

type Captures<'h> = regex::bytes::Captures<'h>;

/// Rule ids and what they catch, in the order they are tried.
pub const RULES: &[(&str, &str)] = &[
    ("private-key", "PEM/OpenSSH/PGP private key block"),
    ("aws-access-key-id", "AWS access key id (AKIA…, ASIA…)"),
    ("aws-secret-access-key", "AWS secret access key assigned to an aws/secret key name"),
    ("github-token", "GitHub personal, OAuth, app or refresh token"),
    ("gitlab-token", "GitLab personal, pipeline or deploy token"),
    ("slack-token", "Slack bot/user/app token"),
    ("slack-webhook", "Slack incoming webhook URL"),
    ("stripe-key", "Stripe secret or restricted key"),
    ("google-api-key", "Google API key (AIza…)"),
    ("jwt", "JSON Web Token with a decodable header"),
    ("connection-string-password", "URL with an embedded password (databases, brokers, mail)"),
    ("generic-secret", "password/secret/token/api_key assigned a high-entropy literal"),
];

const KEY_WORDS: &str = r"(?:password|passwd|passphrase|pwd|secret|token|api[_-]?key|apikey|access[_-]?key|auth[_-]?key|private[_-]?key|client[_-]?secret|credentials?)";

fn always(_: &Captures<'_>) -> bool {
    true
}

/// A rule before compilation: id, pattern, capture group of the value, validation.
type RuleSpec = (&'static str, String, usize, fn(&Captures<'_>) -> bool);

fn patterns() -> Vec<RuleSpec> {
    vec![
        (
            "private-key",
            r"-----BEGIN[ A-Z0-9]*PRIVATE KEY(?: BLOCK)?-----(?:\\[rn]|[\s])*(?:[A-Za-z-]+: [^\n]*\n(?:\\[rn]|\s)*)*[A-Za-z0-9+/]{32,}".to_owned(),
            0,
            always,
        ),
        (
            "aws-access-key-id",
            r"\b(?:A3T[A-Z0-9]|AKIA|ASIA|ABIA|ACCA)[A-Z2-7]{16}\b".to_owned(),
            0,
            // AWS's documentation keys (AKIAIOSFODNN7EXAMPLE and kin) are public stand-ins.
            |c| !c[0].ends_with(b"EXAMPLE"),
        ),
        (
            "aws-secret-access-key",
            r#"(?i)aws[a-z0-9_.-]{0,20}(?:secret|sk)[a-z0-9_.-]{0,20}["']?\s*(?::=|=>|=|:)\s*["']?([A-Za-z0-9/+]{40})(?:[^A-Za-z0-9/+=]|$)"#.to_owned(),
            1,
            |c| is_random(&c[1], 4.0, 3) && !is_placeholder(&c[1]),
        ),
        (
            "github-token",
            r"\b(?:(?:ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9]{36}|github_pat_[A-Za-z0-9]{22}_[A-Za-z0-9]{59})\b".to_owned(),
            0,
            always,
        ),
        ("gitlab-token", r"\bgl(?:pat|ptt|dt|rt|cbt|oas|soat)-[A-Za-z0-9_-]{20,}".to_owned(), 0, always),
        ("slack-token", r"\bxox[abposre]-(?:[0-9]+-)*[A-Za-z0-9]{10,}(?:-[A-Za-z0-9]+)*".to_owned(), 0, |c| {
            c[0].iter().filter(|b| b.is_ascii_digit()).count() >= 6
        }),
        (
            "slack-webhook",
            r"https://hooks\.slack\.com/(?:services|workflows)/T[A-Z0-9]+/B[A-Z0-9]+/[A-Za-z0-9]{16,}".to_owned(),
            0,
            always,
        ),
        ("stripe-key", r"\b(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{20,}\b".to_owned(), 0, |c| {
            is_random(&c[0][8..], 3.5, 2)
        }),
        ("google-api-key", r"\bAIza[0-9A-Za-z_-]{35}(?:[^0-9A-Za-z_-]|$)".to_owned(), 0, always),
        (
            "jwt",
            r"\b(eyJ[A-Za-z0-9_-]{8,})\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{16,}".to_owned(),
            0,
            |c| jwt_header_is_json(&c[1]),
        ),
        (
            "connection-string-password",
            r#"(?i)\b(?:jdbc:)?(?:postgres(?:ql)?|mysql|mariadb|mongodb(?:\+srv)?|rediss?|amqps?|mssql|sqlserver|oracle|clickhouse|cockroachdb|ftps?|sftp|smtps?|ldaps?)://([^:/?#\s@'"`]+):([^@/?#\s'"`]+)@([^\s'"`/:?#]+)"#.to_owned(),
            2,
            |c| {
                let (user, password, host) = (&c[1], &c[2], &c[3]);
                password.len() >= 6
                    && password.is_ascii()
                    && user != password
                    && !is_placeholder(password)
                    && !is_stand_in_password(password)
                    && !is_documentation_host(host)
            },
        ),
        (
            "generic-secret",
            format!(
                r#"(?i)\b([a-z0-9_.-]*{KEY_WORDS}[a-z0-9_.-]*)\\?["']?\s*(?::=|=>|=|:)\s*(?:[a-z]?\\?["'`])([^"'`\s\\]{{10,200}})\\?["'`]"#
            ),
            2,
            |c| key_name_is_secret(&c[1]) && looks_like_secret_value(&c[2]),
        ),
        (
            "generic-secret",
            format!(r#"(?m)^[ \t]*(?:export[ \t]+)?([A-Z0-9_]*{}[A-Z0-9_]*)[ \t]*=[ \t]*([^\s"'#`]{{12,200}})[ \t\r]*$"#, KEY_WORDS.to_ascii_uppercase().replace("[_-]", "_")),
            2,
            |c| key_name_is_secret(&c[1]) && looks_like_secret_value(&c[2]),
        ),
    ]
}

/// Shannon entropy of a byte string, in bits per byte.
fn entropy(value: &[u8]) -> f64 {
    let mut counts = [0u32; 256];
    for b in value {
        counts[usize::from(*b)] += 1;
    }
    let n = value.len() as f64;
    counts
        .iter()
        .filter(|c| **c > 0)
        .map(|c| {
            let p = f64::from(*c) / n;
            -p * p.log2()
        })
        .sum()
}

/// Whether a value looks randomly generated: entropy at least `min_entropy` bits per byte and
/// at least `min_classes` of lowercase, uppercase, digits and symbols; plain words joined by
/// separators (identifiers, dotted names) do not count.
fn is_random(value: &[u8], min_entropy: f64, min_classes: usize) -> bool {
    let classes = [
        value.iter().any(u8::is_ascii_lowercase),
        value.iter().any(u8::is_ascii_uppercase),
        value.iter().any(u8::is_ascii_digit),
        value.iter().any(|b| !b.is_ascii_alphanumeric()),
    ];
    if classes.iter().filter(|c| **c).count() < min_classes {
        return false;
    }
    // snake_case, kebab-case or dotted identifiers without digits are names, not secrets.
    let wordy = value.iter().all(|b| b.is_ascii_alphabetic() || matches!(b, b'_' | b'-' | b'.' | b':' | b'/'));
    if wordy && value.iter().any(|b| matches!(b, b'_' | b'-' | b'.' | b':' | b'/')) {
        return false;
    }
    entropy(value) >= min_entropy
}

const PLACEHOLDER_WORDS: &[&str] = &[
    "example",
    "placeholder",
    "your",
    "xxxx",
    "****",
    "changeme",
    "change_me",
    "dummy",
    "redacted",
    "sample",
    "replace",
    "insert",
    "todo",
    "fixme",
    "secret_here",
    "token_here",
    "notreal",
    "fake",
    "test1234",
    "12345678",
];

/// Whether a value is a template, an environment reference or an obvious stand-in.
fn is_placeholder(value: &[u8]) -> bool {
    let lower = value.to_ascii_lowercase();
    let starts = |p: &[u8]| lower.starts_with(p);
    if starts(b"$") || starts(b"%") || starts(b"<") || starts(b"{") || starts(b"[") || starts(b"*") {
        return true;
    }
    let contains = |w: &[u8]| lower.windows(w.len()).any(|win| win == w);
    [&b"${"[..], b"{{", b"}}", b"%s", b"%(", b"#{", b"process.env", b"os.environ", b"getenv"]
        .iter()
        .any(|w| contains(w))
        || PLACEHOLDER_WORDS.iter().any(|w| contains(w.as_bytes()))
        || lower.iter().all(|b| *b == lower[0])
}

/// The value side of a generic `password = "…"` assignment: random-looking, and not a
/// path, URL, markup, a name that spells out what it is (`CLIENT_TRAFFIC_SECRET_0`), or
/// lowercase words (`secret_fish!!`).
fn looks_like_secret_value(value: &[u8]) -> bool {
    let lower = value.to_ascii_lowercase();
    let has = |w: &[u8]| lower.windows(w.len()).any(|win| win == w);
    let alnum_classes = [
        value.iter().any(u8::is_ascii_lowercase),
        value.iter().any(u8::is_ascii_uppercase),
        value.iter().any(u8::is_ascii_digit),
    ];
    let path_like = [&b"/"[..], b"~", b"./", b"../"].iter().any(|p| value.starts_with(p)) || has(b"://");
    let names_itself =
        [&b"password"[..], b"passwd", b"secret", b"token", b"credential", b"apikey", b"api_key"].iter().any(|w| has(w));
    alnum_classes.iter().filter(|c| **c).count() >= 2
        && !path_like
        && !names_itself
        && !has(b"&quot;")
        && !has(b"&amp;")
        && is_random(value, 3.0, 2)
        && !is_placeholder(value)
}

/// Hosts reserved for documentation and local examples.
fn is_documentation_host(host: &[u8]) -> bool {
    let lower = host.to_ascii_lowercase();
    [&b"example.com"[..], b"example.org", b"example.net", b"example"]
        .iter()
        .any(|h| lower == *h || lower.ends_with(&[b".", *h].concat()))
}

/// Words that stand in for a password in documentation URLs (`user:password@host`).
fn is_stand_in_password(value: &[u8]) -> bool {
    let lower = value.to_ascii_lowercase();
    [&b"password"[..], b"passwd", b"pass", b"pwd", b"secret", b"pw", b"foo", b"bar", b"baz", b"test"]
        .contains(&lower.as_slice())
}

/// Key names that mention a secret but name something else (a type, a field, a count…).
fn key_name_is_secret(name: &[u8]) -> bool {
    let lower = name.to_ascii_lowercase();
    const NOT_SECRET: &[&str] = &[
        "type",
        "name",
        "field",
        "path",
        "file",
        "url",
        "uri",
        "len",
        "length",
        "count",
        "size",
        "prefix",
        "suffix",
        "format",
        "regex",
        "pattern",
        "label",
        "hint",
        "placeholder",
        "input",
        "header",
        "env",
        "var",
        "param",
        "kind",
        "limit",
        "max",
        "min",
        "budget",
        "tokenizer",
        "expires",
        "expiry",
        "ttl",
        "endpoint",
        "policy",
        "id_",
        "_id",
        "hash",
        "salt",
        "digest",
        "version",
    ];
    !NOT_SECRET.iter().any(|w| lower.windows(w.len()).any(|win| win == w.as_bytes()))
}

fn jwt_header_is_json(header: &[u8]) -> bool {
    use base64::Engine as _;
    let engine = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let trimmed: Vec<u8> = header.iter().copied().filter(|b| *b != b'=').collect();
    // Decode a whole number of 4-character groups, enough to see the first keys.
    let usable = trimmed.len() - trimmed.len() % 4;
    match engine.decode(&trimmed[..usable]) {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            text.starts_with('{') && (text.contains("\"alg\"") || text.contains("\"typ\""))
        }
        Err(_) => false,
    }
}

/// Checks text against the built-in secret rules.
pub struct SecretScanner {
    rules: Vec<Rule>,
    set: RegexSet,
}

impl std::fmt::Debug for SecretScanner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecretScanner").field("rules", &self.rules.len()).finish()
    }
}

impl Default for SecretScanner {
    fn default() -> Self {
        Self::new()
    }
}

impl SecretScanner {
    /// The scanner with the built-in rules.
    #[allow(clippy::expect_used)]
    pub fn new() -> Self {
        let rules: Vec<Rule> = patterns()
            .into_iter()
            .map(|(id, pattern, group, validate)| Rule {
                id,
                regex: Regex::new(&format!("(?-u){pattern}"))
                    .expect("built-in secret rules are valid regexes (a unit test builds them)"),
                group,
                validate,
            })
            .collect();
        let set = RegexSet::new(rules.iter().map(|r| r.regex.as_str()))
            .expect("built-in secret rules are valid regexes (a unit test builds them)");
        SecretScanner { rules, set }
    }

    /// All findings in `text`, in order, at most one per overlapping span.
    pub fn scan(&self, text: &str) -> Vec<Finding> {
        let haystack = text.as_bytes();
        let mut findings: Vec<Finding> = Vec::new();
        for index in self.set.matches(haystack).iter() {
            let rule = &self.rules[index];
            for caps in rule.regex.captures_iter(haystack) {
                if !(rule.validate)(&caps) {
                    continue;
                }
                let Some(m) = caps.get(rule.group) else { continue };
                let span = m.start()..m.end();
                if findings.iter().any(|f| f.span.start < span.end && span.start < f.span.end) {
                    continue;
                }
                let line = memchr::memchr_iter(b'\n', &haystack[..span.start]).count() + 1;
                findings.push(Finding { rule: rule.id, line: u32::try_from(line).unwrap_or(u32::MAX), span });
            }
        }
        findings.sort_by_key(|f| f.span.start);
        findings
    }
}

#[cfg(test)]
mod tests;
