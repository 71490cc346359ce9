//! The people's operations: who the caller is, their own tokens, signing in, invitations and
//! the admin API.

use caret_protocol::{admin, auth};
use serde_json::{Value, json};

use super::{Access, Operation, Schemas, content, id, limit, no_content, ok, op, path_param, query};

/// A 303 to somewhere else.
fn see_other(what: &'static str) -> Vec<(u16, &'static str, serde_json::Map<String, Value>)> {
    vec![(303, what, serde_json::Map::new())]
}

pub(super) fn operations(s: &mut Schemas) -> Vec<Operation> {
    use Access::{Admin, Public, Tenant};
    let form = |fields: Value| {
        let schema = json!({ "type": "object", "properties": fields, "required": ["grant_type"] });
        json!({ "required": true, "content": { "application/x-www-form-urlencoded": { "schema": schema } } })
    };
    let text = || json!({ "type": "string" });
    let mut token_answers = ok(s.json::<auth::TokenResponse>());
    token_answers.push((400, "Refused (RFC 6749 5.2; `authorization_pending` or `slow_down` while a device waits)", {
        let schema = s.written::<auth::OAuthError>();
        content("application/json", schema)
    }));
    vec![
        // Signing in.
        Operation {
            answers: ok(s.json::<auth::Methods>()),
            ..op("get", "/v1/auth/methods", "auth_methods", "How one signs in on this server.", Public)
        },
        Operation {
            parameters: vec![
                query("next", "A page's path to return to, signed in with a session cookie.", text()),
                query("redirect_uri", "A client's loopback redirect (http://127.0.0.1:PORT/…).", text()),
                query("state", "The client's state, handed back with the code.", text()),
                query("code_challenge", "The client's PKCE challenge.", text()),
                query("code_challenge_method", "`S256`.", json!({ "type": "string", "enum": ["S256"] })),
            ],
            answers: see_other("To the identity provider"),
            ..op(
                "get",
                "/v1/auth/login",
                "auth_login",
                "Signs in through the organisation's identity provider.",
                Public,
            )
        },
        Operation {
            parameters: vec![
                query("code", "The provider's code.", text()),
                query("state", "The sign-in's state.", text()),
                query("error", "The provider's refusal.", text()),
                query("error_description", "Why.", text()),
            ],
            answers: {
                let mut a =
                    see_other("Signed in: to the page (with its cookies) or the client's redirect (with a code)");
                a.push((200, "A device is signed in", super::text("text/html")));
                a
            },
            ..op("get", "/v1/auth/callback", "auth_callback", "The identity provider's answer.", Public)
        },
        Operation {
            parameters: vec![
                query("user_code", "The code the device shows.", text()),
                query("confirm", "`yes`: its person confirmed starting this sign-in.", text()),
            ],
            answers: {
                let mut a = ok(super::text("text/html"));
                a.extend(see_other("To the identity provider"));
                a
            },
            ..op("get", "/v1/auth/device", "auth_device_page", "Where a device's person signs in.", Public)
        },
        Operation {
            answers: ok(s.json::<auth::DeviceAuthorization>()),
            ..op("post", "/v1/auth/device", "auth_device", "Starts a device's sign-in (RFC 8628).", Public)
        },
        Operation {
            body: Some(form(json!({
                "grant_type": { "type": "string", "enum": [
                    "authorization_code", "refresh_token", "urn:ietf:params:oauth:grant-type:device_code"] },
                "code": text(), "code_verifier": text(), "redirect_uri": text(),
                "refresh_token": text(), "device_code": text(),
            }))),
            answers: token_answers,
            ..op(
                "post",
                "/v1/auth/token",
                "auth_token",
                "Sign-in tokens for a code, a refresh token or a device.",
                Public,
            )
        },
        Operation {
            body: Some(s.read::<auth::LdapSignIn>()),
            answers: {
                let mut a = ok(s.json::<auth::TokenResponse>());
                a.push((204, "A page's session started (its cookies set)", serde_json::Map::new()));
                a
            },
            ..op(
                "post",
                "/v1/auth/ldap",
                "auth_ldap",
                "Signs in with a user name and password checked by the organisation's directory.",
                Public,
            )
        },
        Operation {
            answers: no_content(),
            ..op("post", "/v1/auth/logout", "auth_logout", "Ends the caller's sign-in and every token it gave.", Tenant)
        },
        // Who the caller is, their own tokens, and the admin API.
        Operation {
            answers: ok(s.json::<admin::Me>()),
            ..op("get", "/v1/me", "me", "Who the credential acts as.", Tenant)
        },
        Operation {
            answers: ok(s.json::<Vec<admin::TokenInfo>>()),
            ..op("get", "/v1/me/tokens", "my_tokens", "The caller's own tokens.", Tenant)
        },
        Operation {
            body: Some(s.read::<admin::CreateToken>()),
            answers: vec![(201, "Made; the token is shown this once", s.json::<admin::TokenCreated>())],
            ..op("post", "/v1/me/tokens", "create_my_token", "Makes a personal access token.", Tenant)
        },
        Operation {
            parameters: vec![id("The token's id.")],
            answers: ok(s.json::<admin::TokenInfo>()),
            ..op("delete", "/v1/me/tokens/{id}", "revoke_my_token", "Revokes one of the caller's tokens.", Tenant)
        },
        Operation {
            body: Some(s.read::<admin::AcceptInvitation>()),
            answers: vec![(201, "Joined; the first token is shown this once", s.json::<admin::Joined>())],
            ..op(
                "post",
                "/v1/invitations/accept",
                "accept_invitation",
                "Uses an invitation's code (once, before it expires): the person joins and gets a token.",
                Public,
            )
        },
        Operation {
            body: Some(s.read::<admin::Invite>()),
            answers: vec![(201, "Made; the code is shown this once", s.json::<admin::Invited>())],
            ..op("post", "/v1/admin/invitations", "invite", "Invites someone by email, as a role.", Admin)
        },
        Operation {
            answers: ok(s.json::<Vec<admin::Person>>()),
            ..op("get", "/v1/admin/users", "users", "The organisation's people.", Admin)
        },
        Operation {
            body: Some(s.read::<admin::AddPerson>()),
            answers: vec![(201, "Added", s.json::<admin::Person>())],
            ..op("post", "/v1/admin/users", "add_user", "Adds a person (an owner only by an owner).", Admin)
        },
        Operation {
            parameters: vec![id("The person's id.")],
            answers: ok(s.json::<admin::Person>()),
            ..op("get", "/v1/admin/users/{id}", "user", "A person.", Admin)
        },
        Operation {
            parameters: vec![id("The person's id.")],
            body: Some(s.read::<admin::ChangePerson>()),
            answers: ok(s.json::<admin::Person>()),
            ..op(
                "patch",
                "/v1/admin/users/{id}",
                "change_user",
                "Changes a person's role or state; deactivation ends their tokens at once.",
                Admin,
            )
        },
        Operation {
            answers: ok(s.json::<Vec<admin::TokenInfo>>()),
            ..op("get", "/v1/admin/tokens", "tokens", "The organisation's tokens.", Admin)
        },
        Operation {
            body: Some(s.read::<admin::CreateToken>()),
            answers: vec![(201, "Made; the token is shown this once", s.json::<admin::TokenCreated>())],
            ..op("post", "/v1/admin/tokens", "create_token", "Makes a service account's token.", Admin)
        },
        Operation {
            parameters: vec![id("The token's id.")],
            answers: no_content(),
            ..op("delete", "/v1/admin/tokens/{id}", "revoke_token", "Revokes any token of the organisation.", Admin)
        },
        Operation {
            answers: ok(s.json::<Vec<admin::GroupInfo>>()),
            ..op("get", "/v1/admin/groups", "groups", "The organisation's groups.", Admin)
        },
        Operation {
            body: Some(s.read::<admin::CreateGroup>()),
            answers: vec![(201, "Made", s.json::<admin::GroupInfo>())],
            ..op("post", "/v1/admin/groups", "create_group", "Makes a group.", Admin)
        },
        Operation {
            parameters: vec![id("The group's id.")],
            answers: no_content(),
            ..op("delete", "/v1/admin/groups/{id}", "delete_group", "Deletes a group.", Admin)
        },
        Operation {
            parameters: vec![id("The group's id.")],
            body: Some(s.read::<admin::GroupModels>()),
            answers: no_content(),
            ..op(
                "put",
                "/v1/admin/groups/{id}/models",
                "group_models",
                "Sets the model aliases a group's members may use.",
                Admin,
            )
        },
        Operation {
            parameters: vec![
                id("The group's id."),
                path_param("user", "The person's id.", json!({ "type": "string", "minLength": 1, "maxLength": 128 })),
            ],
            answers: no_content(),
            ..op("put", "/v1/admin/groups/{id}/members/{user}", "add_member", "Puts a person in a group.", Admin)
        },
        Operation {
            parameters: vec![
                id("The group's id."),
                path_param("user", "The person's id.", json!({ "type": "string", "minLength": 1, "maxLength": 128 })),
            ],
            answers: no_content(),
            ..op(
                "delete",
                "/v1/admin/groups/{id}/members/{user}",
                "remove_member",
                "Takes a person out of a group.",
                Admin,
            )
        },
        Operation {
            parameters: vec![
                query("since_ms", "From this time, Unix ms.", json!({ "type": "integer" })),
                query("user", "Only this person's.", json!({ "type": "string" })),
                query("after", "After this record.", json!({ "type": "integer" })),
                limit(100),
            ],
            answers: ok(s.json::<Vec<admin::AuditRecord>>()),
            ..op("get", "/v1/admin/audit", "audit", "The organisation's audit trail, oldest first.", Admin)
        },
        Operation {
            parameters: vec![id("The group's id.")],
            body: Some(s.read::<admin::GroupBudget>()),
            answers: no_content(),
            ..op(
                "put",
                "/v1/admin/groups/{id}/budget",
                "group_budget",
                "Sets a group's daily budget of model tokens per member.",
                Admin,
            )
        },
        Operation {
            parameters: vec![query(
                "days",
                "Days back, today included (default 7).",
                json!({ "type": "integer", "minimum": 1, "maximum": 366 }),
            )],
            answers: ok(s.json::<admin::UsageReport>()),
            ..op("get", "/v1/admin/usage", "usage", "Model tokens spent per person, model and group.", Admin)
        },
        Operation {
            answers: ok(s.json::<admin::Settings>()),
            ..op("get", "/v1/admin/settings", "settings", "The organisation's settings as they hold.", Admin)
        },
        Operation {
            body: Some(s.read::<admin::ChangeSettings>()),
            answers: ok(s.json::<admin::Settings>()),
            ..op("patch", "/v1/admin/settings", "change_settings", "Changes the organisation's settings.", Admin)
        },
        Operation {
            answers: ok(s.json::<Vec<admin::FlagInfo>>()),
            ..op("get", "/v1/admin/flags", "flags", "The operator's flags as they fall for the organisation.", Admin)
        },
        Operation {
            answers: ok(s.json::<admin::AuditVerification>()),
            ..op("post", "/v1/admin/audit/verify", "verify_audit", "Checks the audit trail's hash chain.", Admin)
        },
    ]
}
