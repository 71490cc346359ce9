//! SCIM PATCH (RFC 7644, 3.5.2) applied to a resource's JSON: `add`, `replace` and `remove`
//! (any case, as Entra writes them), with or without a path; paths `attr`, `attr.sub`,
//! `attr[filter]` and `attr[filter].sub`, a schema URN before them allowed. A `remove` of
//! `members` with a value removes the members it lists (as identity providers send it).

use serde_json::{Map, Value};

use super::ScimError;
use super::filter::Filter;

fn bad_path(why: impl Into<String>) -> ScimError {
    ScimError::new(400, Some("invalidPath"), why)
}

/// A parsed path.
struct Path {
    attr: String,
    filter: Option<Filter>,
    sub: Option<String>,
}

fn parse_path(text: &str) -> Result<Path, ScimError> {
    let text = text.trim();
    // A schema URN before the attribute: `urn:…:User:userName` → `userName`.
    let text = match text.find('[') {
        Some(b) => match text[..b].rsplit_once(':') {
            Some((_, rest)) => format!("{rest}{}", &text[b..]),
            None => text.to_owned(),
        },
        None => text.rsplit_once(':').map_or(text, |(_, rest)| rest).to_owned(),
    };
    if let Some(open) = text.find('[') {
        let close = text.rfind(']').ok_or_else(|| bad_path("a [ without its ]"))?;
        let filter = Filter::parse(&text[open + 1..close]).map_err(|e| bad_path(e.detail))?;
        let sub = text[close + 1..].strip_prefix('.').map(str::to_owned);
        if !text[close + 1..].is_empty() && sub.is_none() {
            return Err(bad_path(format!("{text:?} is not a path")));
        }
        return Ok(Path { attr: text[..open].to_owned(), filter: Some(filter), sub });
    }
    let (attr, sub) = match text.split_once('.') {
        Some((a, s)) => (a.to_owned(), Some(s.to_owned())),
        None => (text.clone(), None),
    };
    let ok =
        |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '$' || c == '-');
    if !ok(&attr) || sub.as_deref().is_some_and(|s| !ok(s)) {
        return Err(bad_path(format!("{text:?} is not a path")));
    }
    Ok(Path { attr, filter: None, sub })
}

/// The key of `name` in `map`, matched case-insensitively (or `name` itself).
fn key(map: &Map<String, Value>, name: &str) -> String {
    map.keys().find(|k| k.eq_ignore_ascii_case(name)).cloned().unwrap_or_else(|| name.to_owned())
}

fn set(map: &mut Map<String, Value>, name: &str, value: Value) {
    let k = key(map, name);
    map.insert(k, value);
}

/// `add`: onto a list, appended (without repeating an element); otherwise set.
fn add(map: &mut Map<String, Value>, name: &str, value: Value) {
    let k = key(map, name);
    match (map.get_mut(&k), value) {
        (Some(Value::Array(list)), Value::Array(more)) => {
            for v in more {
                if !list.contains(&v) {
                    list.push(v);
                }
            }
        }
        (Some(Value::Array(list)), one) => {
            if !list.contains(&one) {
                list.push(one);
            }
        }
        (Some(Value::Object(inner)), Value::Object(more)) => {
            for (sk, sv) in more {
                set(inner, &sk, sv);
            }
        }
        (_, v) => {
            map.insert(k, v);
        }
    }
}

/// Applies a PATCH request's `Operations` to `resource`.
pub fn apply(resource: &mut Value, request: &Value) -> Result<(), ScimError> {
    let Some(ops) = request.get("Operations").or_else(|| request.get("operations")).and_then(Value::as_array) else {
        return Err(ScimError::new(400, Some("invalidSyntax"), "a PATCH needs Operations"));
    };
    if ops.len() > 1000 {
        return Err(ScimError::new(400, Some("tooMany"), "over 1000 operations"));
    }
    let Value::Object(map) = resource else {
        return Err(ScimError::new(500, None, "a resource that is not an object"));
    };
    for op in ops {
        let kind = op.get("op").and_then(Value::as_str).unwrap_or_default().to_ascii_lowercase();
        let path = op.get("path").and_then(Value::as_str).filter(|p| !p.trim().is_empty());
        let value = op.get("value").cloned();
        match (kind.as_str(), path) {
            ("add" | "replace", None) => {
                let Some(Value::Object(attrs)) = value else {
                    return Err(ScimError::new(
                        400,
                        Some("invalidValue"),
                        "an op without a path needs an object value",
                    ));
                };
                for (k, v) in attrs {
                    // `name.givenName` as a key is a path too (Entra writes those).
                    let p = parse_path(&k)?;
                    apply_at(map, &kind, &p, Some(v))?;
                }
            }
            ("add" | "replace" | "remove", Some(p)) => {
                if kind != "remove" && value.is_none() {
                    return Err(ScimError::new(400, Some("invalidValue"), format!("{kind} needs a value")));
                }
                apply_at(map, &kind, &parse_path(p)?, value)?;
            }
            ("remove", None) => return Err(ScimError::new(400, Some("noTarget"), "remove needs a path")),
            (other, _) => {
                return Err(ScimError::new(400, Some("invalidSyntax"), format!("{other:?} is not a PATCH op")));
            }
        }
    }
    Ok(())
}

fn apply_at(map: &mut Map<String, Value>, kind: &str, path: &Path, value: Option<Value>) -> Result<(), ScimError> {
    let k = key(map, &path.attr);
    match (&path.filter, &path.sub) {
        (None, None) => match kind {
            "add" => add(map, &k, value.unwrap_or(Value::Null)),
            "replace" => set(map, &k, value.unwrap_or(Value::Null)),
            _ => match (map.get_mut(&k), value) {
                // Remove the listed elements (by their `value`).
                (Some(Value::Array(list)), Some(Value::Array(gone))) => {
                    let ids: Vec<&Value> = gone.iter().filter_map(|g| g.get("value")).collect();
                    list.retain(|e| e.get("value").is_none_or(|v| !ids.contains(&v)));
                }
                _ => {
                    map.remove(&k);
                }
            },
        },
        (None, Some(sub)) => {
            let inner = map.entry(k).or_insert_with(|| Value::Object(Map::new()));
            let Value::Object(inner) = inner else {
                return Err(bad_path(format!("{} has no sub-attributes", path.attr)));
            };
            match (kind, value) {
                ("remove", _) => {
                    let sk = key(inner, sub);
                    inner.remove(&sk);
                }
                (_, v) => set(inner, sub, v.unwrap_or(Value::Null)),
            }
        }
        (Some(filter), sub) => {
            let Some(Value::Array(list)) = map.get_mut(&k) else {
                if kind == "remove" {
                    return Ok(());
                }
                return Err(ScimError::new(400, Some("noTarget"), format!("{} has no elements", path.attr)));
            };
            let hit = |e: &Value| filter.matches(e);
            if !list.iter().any(hit) && kind == "replace" {
                return Err(ScimError::new(400, Some("noTarget"), "no element matches the filter"));
            }
            match (kind, sub) {
                ("remove", None) => list.retain(|e| !hit(e)),
                (_, None) => {
                    for e in list.iter_mut().filter(|e| hit(e)) {
                        if let (Value::Object(e), Some(Value::Object(v))) = (e, value.clone()) {
                            for (vk, vv) in v {
                                set(e, &vk, vv);
                            }
                        }
                    }
                }
                (_, Some(sub)) => {
                    for e in list.iter_mut().filter(|e| hit(e)) {
                        if let Value::Object(e) = e {
                            match kind {
                                "remove" => {
                                    let sk = key(e, sub);
                                    e.remove(&sk);
                                }
                                _ => set(e, sub, value.clone().unwrap_or(Value::Null)),
                            }
                        }
                    }
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn patched(mut r: Value, ops: Value) -> Value {
        apply(&mut r, &json!({ "Operations": ops })).unwrap();
        r
    }

    #[test]
    fn patch_operations_change_what_they_name() {
        let group = json!({ "displayName": "eng", "members": [{ "value": "a" }, { "value": "b" }] });
        let g = patched(
            group.clone(),
            json!([{ "op": "add", "path": "members", "value": [{ "value": "c" }, { "value": "a" }] }]),
        );
        assert_eq!(g["members"], json!([{ "value": "a" }, { "value": "b" }, { "value": "c" }]));
        let g = patched(group.clone(), json!([{ "op": "remove", "path": "members[value eq \"a\"]" }]));
        assert_eq!(g["members"], json!([{ "value": "b" }]));
        let g = patched(group.clone(), json!([{ "op": "Remove", "path": "members", "value": [{ "value": "b" }] }]));
        assert_eq!(g["members"], json!([{ "value": "a" }]));
        let g = patched(group.clone(), json!([{ "op": "Replace", "value": { "displayName": "ops" } }]));
        assert_eq!(g["displayName"], "ops");
        let g = patched(group, json!([{ "op": "remove", "path": "members" }]));
        assert!(g.get("members").is_none());

        let user =
            json!({ "userName": "ada", "active": true, "emails": [{ "value": "a@x.example", "primary": true }] });
        let u = patched(user.clone(), json!([{ "op": "replace", "path": "active", "value": false }]));
        assert_eq!(u["active"], false);
        let u = patched(
            user.clone(),
            json!([{ "op": "replace", "path": "emails[primary eq true].value", "value": "b@x.example" }]),
        );
        assert_eq!(u["emails"][0]["value"], "b@x.example");
        let u = patched(user.clone(), json!([{ "op": "add", "path": "name.givenName", "value": "Ada" }]));
        assert_eq!(u["name"]["givenName"], "Ada");
        let u = patched(
            user.clone(),
            json!([{ "op": "replace", "path": "urn:ietf:params:scim:schemas:core:2.0:User:USERNAME", "value": "bob" }]),
        );
        assert_eq!(u["userName"], "bob");

        for (ops, why) in [
            (json!([{ "op": "remove" }]), "noTarget"),
            (json!([{ "op": "move", "path": "x" }]), "invalidSyntax"),
            (json!([{ "op": "add", "path": "a b", "value": 1 }]), "invalidPath"),
            (json!([{ "op": "replace", "path": "emails[value eq \"none\"].value", "value": 1 }]), "noTarget"),
            (json!([{ "op": "add", "value": 3 }]), "invalidValue"),
        ] {
            let e = apply(&mut user.clone(), &json!({ "Operations": ops })).unwrap_err();
            assert_eq!(e.scim_type, Some(why), "{ops}");
        }
        assert!(apply(&mut user.clone(), &json!({})).is_err());
    }
}
