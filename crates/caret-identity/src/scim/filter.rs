//! SCIM filters (RFC 7644, 3.4.2.2): `userName eq "ada@acme.example"`, `emails.value co "@acme"`,
//! `active eq true and not (displayName sw "B")`, `externalId pr`, evaluated against a resource's
//! JSON. Attribute names are case-insensitive; string comparisons too (every attribute served is
//! `caseExact: false` but `id`).

use serde_json::Value;

use super::ScimError;

/// A parsed filter.
#[derive(Debug, Clone, PartialEq)]
pub enum Filter {
    /// `attr op value`.
    Compare(String, Op, Value),
    /// `attr pr`.
    Present(String),
    /// Both.
    And(Box<Filter>, Box<Filter>),
    /// Either.
    Or(Box<Filter>, Box<Filter>),
    /// Its negation.
    Not(Box<Filter>),
}

/// A comparison.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Equal.
    Eq,
    /// Not equal.
    Ne,
    /// Contains.
    Co,
    /// Starts with.
    Sw,
    /// Ends with.
    Ew,
    /// Greater than.
    Gt,
    /// Greater or equal.
    Ge,
    /// Less than.
    Lt,
    /// Less or equal.
    Le,
}

fn invalid(why: impl Into<String>) -> ScimError {
    ScimError::new(400, Some("invalidFilter"), why)
}

#[derive(Debug, Clone, PartialEq)]
enum Token {
    Word(String),
    Text(String),
    Open,
    Close,
}

fn tokens(text: &str) -> Result<Vec<Token>, ScimError> {
    let mut out = Vec::new();
    let mut chars = text.chars().peekable();
    while let Some(&c) = chars.peek() {
        match c {
            c if c.is_whitespace() => {
                chars.next();
            }
            '(' => {
                chars.next();
                out.push(Token::Open);
            }
            ')' => {
                chars.next();
                out.push(Token::Close);
            }
            '"' => {
                chars.next();
                let mut s = String::new();
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some('\\') => match chars.next() {
                            Some(e) => s.push(e),
                            None => return Err(invalid("an unfinished escape")),
                        },
                        Some(ch) => s.push(ch),
                        None => return Err(invalid("an unfinished string")),
                    }
                }
                out.push(Token::Text(s));
            }
            '[' | ']' => return Err(invalid("value filters ([...]) are not supported in a query")),
            _ => {
                let mut w = String::new();
                while let Some(&ch) = chars.peek() {
                    if ch.is_whitespace() || matches!(ch, '(' | ')' | '"' | '[' | ']') {
                        break;
                    }
                    w.push(ch);
                    chars.next();
                }
                out.push(Token::Word(w));
            }
        }
    }
    Ok(out)
}

struct Parser {
    tokens: Vec<Token>,
    at: usize,
}

impl Parser {
    fn peek_word(&self) -> Option<String> {
        match self.tokens.get(self.at) {
            Some(Token::Word(w)) => Some(w.to_ascii_lowercase()),
            _ => None,
        }
    }

    fn or(&mut self) -> Result<Filter, ScimError> {
        let mut left = self.and()?;
        while self.peek_word().as_deref() == Some("or") {
            self.at += 1;
            left = Filter::Or(Box::new(left), Box::new(self.and()?));
        }
        Ok(left)
    }

    fn and(&mut self) -> Result<Filter, ScimError> {
        let mut left = self.unary()?;
        while self.peek_word().as_deref() == Some("and") {
            self.at += 1;
            left = Filter::And(Box::new(left), Box::new(self.unary()?));
        }
        Ok(left)
    }

    fn unary(&mut self) -> Result<Filter, ScimError> {
        if self.peek_word().as_deref() == Some("not") {
            self.at += 1;
            return Ok(Filter::Not(Box::new(self.unary()?)));
        }
        if self.tokens.get(self.at) == Some(&Token::Open) {
            self.at += 1;
            let inner = self.or()?;
            if self.tokens.get(self.at) != Some(&Token::Close) {
                return Err(invalid("a ( without its )"));
            }
            self.at += 1;
            return Ok(inner);
        }
        let Some(Token::Word(attr)) = self.tokens.get(self.at).cloned() else {
            return Err(invalid("an attribute was expected"));
        };
        self.at += 1;
        let op = self.peek_word().ok_or_else(|| invalid(format!("an operator after {attr}")))?;
        self.at += 1;
        let op = match op.as_str() {
            "pr" => return Ok(Filter::Present(attr)),
            "eq" => Op::Eq,
            "ne" => Op::Ne,
            "co" => Op::Co,
            "sw" => Op::Sw,
            "ew" => Op::Ew,
            "gt" => Op::Gt,
            "ge" => Op::Ge,
            "lt" => Op::Lt,
            "le" => Op::Le,
            other => return Err(invalid(format!("{other:?} is not an operator"))),
        };
        let value = match self.tokens.get(self.at).cloned() {
            Some(Token::Text(s)) => Value::String(s),
            Some(Token::Word(w)) => match w.to_ascii_lowercase().as_str() {
                "true" => Value::Bool(true),
                "false" => Value::Bool(false),
                "null" => Value::Null,
                n => n
                    .parse::<f64>()
                    .ok()
                    .and_then(serde_json::Number::from_f64)
                    .map(Value::Number)
                    .ok_or_else(|| invalid(format!("{w:?} is not a value (strings are quoted)")))?,
            },
            _ => return Err(invalid(format!("a value after {attr}"))),
        };
        self.at += 1;
        Ok(Filter::Compare(attr, op, value))
    }
}

impl Filter {
    /// Parses `text`.
    pub fn parse(text: &str) -> Result<Filter, ScimError> {
        if text.len() > 4096 {
            return Err(invalid("the filter is over 4 KiB"));
        }
        let mut p = Parser { tokens: tokens(text)?, at: 0 };
        let f = p.or()?;
        if p.at != p.tokens.len() {
            return Err(invalid("more after the filter's end"));
        }
        Ok(f)
    }

    /// Whether `resource` matches.
    pub fn matches(&self, resource: &Value) -> bool {
        match self {
            Filter::And(a, b) => a.matches(resource) && b.matches(resource),
            Filter::Or(a, b) => a.matches(resource) || b.matches(resource),
            Filter::Not(a) => !a.matches(resource),
            Filter::Present(attr) => {
                values(resource, attr).iter().any(|v| !v.is_null() && **v != Value::String(String::new()))
            }
            Filter::Compare(attr, op, want) => {
                let found = values(resource, attr);
                if *op == Op::Ne {
                    return !found.iter().any(|v| compare(v, Op::Eq, want));
                }
                found.iter().any(|v| compare(v, *op, want))
            }
        }
    }
}

/// The values at `path` (`emails.value`: every email's), keys matched case-insensitively.
pub(crate) fn values<'a>(resource: &'a Value, path: &str) -> Vec<&'a Value> {
    let path = path.rsplit_once(':').map_or(path, |(_, attr)| attr);
    let mut current = vec![resource];
    for part in path.split('.') {
        let mut next = Vec::new();
        for v in current {
            let Value::Object(map) = v else { continue };
            if let Some((_, found)) = map.iter().find(|(k, _)| k.eq_ignore_ascii_case(part)) {
                match found {
                    Value::Array(items) => next.extend(items.iter()),
                    other => next.push(other),
                }
            }
        }
        current = next;
    }
    current
}

fn compare(have: &Value, op: Op, want: &Value) -> bool {
    match (have, want) {
        (Value::String(h), Value::String(w)) => {
            let (h, w) = (h.to_lowercase(), w.to_lowercase());
            match op {
                Op::Eq => h == w,
                Op::Ne => h != w,
                Op::Co => h.contains(&w),
                Op::Sw => h.starts_with(&w),
                Op::Ew => h.ends_with(&w),
                Op::Gt => h > w,
                Op::Ge => h >= w,
                Op::Lt => h < w,
                Op::Le => h <= w,
            }
        }
        (Value::Bool(h), Value::Bool(w)) => matches!(op, Op::Eq) == (h == w),
        (Value::Number(h), Value::Number(w)) => {
            let (h, w) = (h.as_f64().unwrap_or(f64::NAN), w.as_f64().unwrap_or(f64::NAN));
            match op {
                Op::Eq => h == w,
                Op::Ne => h != w,
                Op::Gt => h > w,
                Op::Ge => h >= w,
                Op::Lt => h < w,
                Op::Le => h <= w,
                _ => false,
            }
        }
        (_, Value::Null) => matches!(op, Op::Eq) && have.is_null(),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn filters_parse_and_match_as_rfc_7644_says() {
        let ada = json!({
            "userName": "Ada@Acme.example", "active": true, "displayName": "Ada",
            "emails": [{ "value": "ada@acme.example", "primary": true }, { "value": "a@home.example" }],
        });
        let yes = [
            r#"userName eq "ada@acme.example""#,
            r#"USERNAME Eq "ADA@ACME.EXAMPLE""#,
            r#"emails.value co "@home""#,
            r#"urn:ietf:params:scim:schemas:core:2.0:User:userName sw "ada""#,
            "active eq true and displayName pr",
            r#"not (displayName sw "B") or userName eq "x""#,
            r#"displayName ne "Bob""#,
            r#"userName gt "a" and userName lt "b""#,
        ];
        for f in yes {
            assert!(Filter::parse(f).unwrap().matches(&ada), "{f}");
        }
        let no = [r#"userName eq "bob@acme.example""#, "externalId pr", r#"displayName ne "ada""#, "active eq false"];
        for f in no {
            assert!(!Filter::parse(f).unwrap().matches(&ada), "{f}");
        }
        for bad in [
            "userName",
            "userName eq",
            "userName xx \"a\"",
            "(active eq true",
            "userName eq bob",
            r#"emails[type eq "work"]"#,
            "\"unfinished",
        ] {
            let e = Filter::parse(bad).unwrap_err();
            assert_eq!((e.status, e.scim_type), (400, Some("invalidFilter")), "{bad}");
        }
    }
}
