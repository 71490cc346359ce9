//! `fetch_rule`: the text of one of the project's rules files, by the name the system prompt
//! lists it under (rules that apply on request, from their description).

use serde_json::{Value, json};

use super::{Ctx, Spec, Tool, ToolError, ToolResult, string_arg};

/// The tool.
pub struct FetchRule {
    spec: Spec,
}

impl FetchRule {
    /// The tool.
    pub fn new() -> FetchRule {
        FetchRule {
            spec: Spec {
                name: "fetch_rule",
                description: "Fetch one of the project's rules files by the name listed under \"More project \
                              rules\" in your instructions, when its description concerns the task.",
                parameters: json!({
                    "type": "object",
                    "properties": {"name": {"type": "string", "description": "The rule's name as listed"}},
                    "required": ["name"]
                }),
                read_only: true,
            },
        }
    }
}

impl Default for FetchRule {
    fn default() -> Self {
        FetchRule::new()
    }
}

#[async_trait::async_trait]
impl Tool for FetchRule {
    fn spec(&self) -> &Spec {
        &self.spec
    }

    async fn call(&self, args: Value, ctx: &Ctx) -> ToolResult {
        let name = string_arg(&args, "name")?;
        let Some(rule) = ctx.rules.get(name) else {
            let known: Vec<&str> = ctx.rules.on_request.iter().map(|r| r.name.as_str()).collect();
            return Err(ToolError::new(format!("there is no rule named {name:?}; the rules to fetch: {known:?}")));
        };
        let mut attached = ctx.attached.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if !attached.contains(&rule.name) {
            attached.push(rule.name.clone());
        }
        Ok(rule.text.clone())
    }
}
