//! The SCIM 2.0 operations (RFC 7644): discovery, and the organisation's Users and Groups for
//! its identity provider. Their bodies are SCIM's own resources (RFC 7643), described by
//! `/scim/v2/Schemas`, so they appear here as objects.

use serde_json::{Map, Value, json};

use super::{Access, Errors, Operation, content, no_content, op, path_param, query};

fn scim_json() -> Map<String, Value> {
    content("application/scim+json", json!({ "type": "object" }))
}

fn body() -> Value {
    json!({ "required": true, "content": {
        "application/scim+json": { "schema": { "type": "object" } },
        "application/json": { "schema": { "type": "object" } },
    } })
}

pub(super) fn operations() -> Vec<Operation> {
    use Access::{Public, Scim};
    let ok = || vec![(200, "OK", scim_json())];
    let created = || vec![(201, "Made", scim_json())];
    let id = || path_param("id", "The resource's id.", json!({ "type": "string" }));
    let listing = || {
        vec![
            query("filter", "A SCIM filter (`userName eq \"ada@acme.example\"`).", json!({ "type": "string" })),
            query("startIndex", "The first result, from 1.", json!({ "type": "integer", "minimum": 1 })),
            query("count", "At most this many (up to 1000).", json!({ "type": "integer", "minimum": 0 })),
        ]
    };
    let scim = |o: Operation| Operation { errors: Errors::Scim, ..o };
    vec![
        scim(Operation {
            answers: ok(),
            ..op("get", "/scim/v2/ServiceProviderConfig", "scim_config", "What this SCIM service supports.", Public)
        }),
        scim(Operation {
            answers: ok(),
            ..op("get", "/scim/v2/Schemas", "scim_schemas", "The resources' schemas.", Public)
        }),
        scim(Operation {
            parameters: vec![id()],
            answers: ok(),
            ..op("get", "/scim/v2/Schemas/{id}", "scim_schema", "A schema.", Public)
        }),
        scim(Operation {
            answers: ok(),
            ..op("get", "/scim/v2/ResourceTypes", "scim_resource_types", "The resource types.", Public)
        }),
        scim(Operation {
            parameters: vec![id()],
            answers: ok(),
            ..op("get", "/scim/v2/ResourceTypes/{id}", "scim_resource_type", "A resource type.", Public)
        }),
        scim(Operation {
            parameters: listing(),
            answers: ok(),
            ..op("get", "/scim/v2/Users", "scim_users", "The organisation's people, filtered and paged.", Scim)
        }),
        scim(Operation {
            body: Some(body()),
            answers: created(),
            ..op("post", "/scim/v2/Users", "scim_create_user", "Adds a person.", Scim)
        }),
        scim(Operation {
            parameters: vec![id()],
            answers: ok(),
            ..op("get", "/scim/v2/Users/{id}", "scim_user", "A person.", Scim)
        }),
        scim(Operation {
            parameters: vec![id()],
            body: Some(body()),
            answers: ok(),
            ..op(
                "put",
                "/scim/v2/Users/{id}",
                "scim_replace_user",
                "Replaces a person (active false deactivates).",
                Scim,
            )
        }),
        scim(Operation {
            parameters: vec![id()],
            body: Some(body()),
            answers: ok(),
            ..op("patch", "/scim/v2/Users/{id}", "scim_patch_user", "Changes a person (RFC 7644 PATCH).", Scim)
        }),
        scim(Operation {
            parameters: vec![id()],
            answers: no_content(),
            ..op("delete", "/scim/v2/Users/{id}", "scim_delete_user", "Removes a person (their tokens end).", Scim)
        }),
        scim(Operation {
            parameters: listing(),
            answers: ok(),
            ..op("get", "/scim/v2/Groups", "scim_groups", "The organisation's groups, filtered and paged.", Scim)
        }),
        scim(Operation {
            body: Some(body()),
            answers: created(),
            ..op("post", "/scim/v2/Groups", "scim_create_group", "Makes a group.", Scim)
        }),
        scim(Operation {
            parameters: vec![id()],
            answers: ok(),
            ..op("get", "/scim/v2/Groups/{id}", "scim_group", "A group.", Scim)
        }),
        scim(Operation {
            parameters: vec![id()],
            body: Some(body()),
            answers: ok(),
            ..op("put", "/scim/v2/Groups/{id}", "scim_replace_group", "Replaces a group and its members.", Scim)
        }),
        scim(Operation {
            parameters: vec![id()],
            body: Some(body()),
            answers: ok(),
            ..op("patch", "/scim/v2/Groups/{id}", "scim_patch_group", "Changes a group (RFC 7644 PATCH).", Scim)
        }),
        scim(Operation {
            parameters: vec![id()],
            answers: no_content(),
            ..op("delete", "/scim/v2/Groups/{id}", "scim_delete_group", "Deletes a group.", Scim)
        }),
    ]
}
