//! Plan mode: only read-only tools run, and the agent ends its turn by calling `submit_plan`
//! with the steps, the files each touches and the risks; the person edits and approves the
//! plan (or asks for changes), and building starts with its steps as the todo list.

use caret_protocol::agent::{Plan, TodoItem, TodoStatus};
use serde_json::{Value, json};

use crate::tools::{Ctx, Spec, Tool, ToolError, ToolResult};

/// The tool's name.
pub const SUBMIT_PLAN: &str = "submit_plan";

/// What a request in plan mode carries for the model.
pub const REMINDER: &str = "[Plan mode: do not change anything. Explore with the read-only tools, then call \
submit_plan with a short summary, the steps in order (each with the files it reads or changes), and the risks. \
The person approves or edits the plan before anything is built.]";

/// The plan a `submit_plan` call's arguments hold, or why they do not hold one.
pub fn parse(args: &Value) -> Result<Plan, String> {
    let plan: Plan = serde_json::from_value(args.clone()).map_err(|e| format!("not a plan: {e}"))?;
    if plan.steps.is_empty() || plan.steps.iter().any(|s| s.title.trim().is_empty()) {
        return Err("a plan needs at least one step, each with a title".into());
    }
    Ok(plan)
}

/// The plan's steps as a todo list (the first in progress).
pub fn todos(plan: &Plan) -> Vec<TodoItem> {
    plan.steps
        .iter()
        .enumerate()
        .map(|(i, s)| TodoItem {
            id: format!("plan-{}", i + 1),
            content: s.title.clone(),
            status: if i == 0 { TodoStatus::InProgress } else { TodoStatus::Pending },
        })
        .collect()
}

/// The approved plan as the request that starts building it.
pub fn build_request(plan: &Plan) -> String {
    let mut out =
        format!("The plan is approved. Carry it out step by step, keeping the todo list current.\n\n{}", plan.summary);
    for (i, s) in plan.steps.iter().enumerate() {
        out.push_str(&format!("\n{}. {}", i + 1, s.title));
        if !s.files.is_empty() {
            out.push_str(&format!(" ({})", s.files.join(", ")));
        }
        if !s.details.is_empty() {
            out.push_str(&format!(": {}", s.details));
        }
    }
    if !plan.risks.is_empty() {
        out.push_str(&format!("\n\nRisks to watch: {}", plan.risks.join("; ")));
    }
    out
}

/// `submit_plan`: offered in plan mode only; the session takes the plan from the call.
pub struct SubmitPlan {
    spec: Spec,
}

impl Default for SubmitPlan {
    fn default() -> Self {
        SubmitPlan {
            spec: Spec {
                name: SUBMIT_PLAN,
                description: "Proposes your plan to the person (plan mode): a summary, the steps in order with the \
                              files each reads or changes, and the risks. Call it once you know enough; the turn \
                              ends and the person approves, edits or asks for changes.",
                parameters: json!({
                    "type": "object",
                    "properties": {
                        "summary": {"type": "string"},
                        "steps": {"type": "array", "items": {"type": "object", "properties": {
                            "title": {"type": "string"},
                            "files": {"type": "array", "items": {"type": "string"}},
                            "details": {"type": "string"}
                        }, "required": ["title"]}},
                        "risks": {"type": "array", "items": {"type": "string"}}
                    },
                    "required": ["summary", "steps"]
                }),
                read_only: true,
            },
        }
    }
}

#[async_trait::async_trait]
impl Tool for SubmitPlan {
    fn spec(&self) -> &Spec {
        &self.spec
    }

    async fn call(&self, args: Value, _ctx: &Ctx) -> ToolResult {
        parse(&args).map_err(ToolError)?;
        Ok("The plan is with the person now: they approve it, edit it, or ask for changes.".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plan_is_read_checked_and_turned_into_todos_and_a_request() {
        let args = json!({"summary": "Fix the subtraction", "steps": [
            {"title": "Read add.sh", "files": ["add.sh"]},
            {"title": "Use + instead of -", "files": ["add.sh"], "details": "one character"}
        ], "risks": ["none really"]});
        let plan = parse(&args).unwrap();
        let todos = todos(&plan);
        assert_eq!((todos[0].status, todos[1].status), (TodoStatus::InProgress, TodoStatus::Pending));
        let request = build_request(&plan);
        assert!(
            request.contains("1. Read add.sh (add.sh)\n2. Use + instead of - (add.sh): one character"),
            "{request}"
        );
        assert!(parse(&json!({"summary": "x", "steps": []})).is_err());
        assert!(parse(&json!({"summary": "x", "steps": [{"title": "a", "extra": 1}]})).is_err());
        assert!(parse(&json!("a plan")).is_err());
    }
}
