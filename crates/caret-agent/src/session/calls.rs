//! A model turn's tool calls: hooks and the policy first (approvals asked in call order), then
//! the batch, then what each call answered back into the conversation.

use caret_protocol::agent::{Decision, Event, Op};
use caret_protocol::llm::{ChatMessage, Content, ContentPart, Role};
use serde_json::Value;
use tokio::sync::mpsc;

use super::{Session, TERMINAL, emit, tool_message};
use crate::batch::{Call, Outcome, run_calls};
use crate::hooks::{Decision as HookDecision, HookEvent, Moment};
use crate::policy::Verdict;

impl Session {
    /// Asks for approvals, runs the calls, reports what they did; `None` when interrupted.
    pub(super) async fn run_tools(
        &mut self,
        asked: &[Call],
        events: &mpsc::UnboundedSender<Event>,
        ops: &mut mpsc::UnboundedReceiver<Op>,
    ) -> Option<Vec<Outcome>> {
        let (calls, hooked) = self.pre_tool_hooks(asked, events).await;
        let calls = calls.as_slice();
        // Tools that came since the model call (a server that answered meanwhile); a call of a
        // tool not known yet waits for servers still starting (up to 30 s).
        self.refresh_dynamic_tools();
        if let Some((source, _)) = &self.dynamic
            && calls.iter().any(|c| self.tools.get(&c.name).is_none())
        {
            let source = source.clone();
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
            while source.starting() && std::time::Instant::now() < deadline {
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
            self.refresh_dynamic_tools();
        }
        // Terminal commands pass the policy (and the user) first, in call order; so do calls
        // of tools whose own settings ask (an MCP server's, configured so).
        let mut refused: Vec<Option<String>> = vec![None; calls.len()];
        for (i, c) in calls.iter().enumerate() {
            if let HookDecision::Block(why) = &hooked[i] {
                refused[i] = Some(format!("error: refused by a hook: {why}"));
                continue;
            }
            if let Some(tool) = self.tools.get(&c.name)
                && !self.offered_in_mode(&c.name, tool.spec().read_only)
            {
                refused[i] = Some(match self.mode {
                    caret_protocol::agent::Mode::Plan => {
                        format!("error: plan mode: {} does not run until the plan is approved", c.name)
                    }
                    caret_protocol::agent::Mode::Build => format!("error: {} is for plan mode", c.name),
                });
                continue;
            }
            let (verdict, command) = if c.name == TERMINAL {
                // A call without a command looks at a background job: nothing runs.
                let Some(command) = c.arguments.get("command").and_then(Value::as_str).map(str::to_owned) else {
                    continue;
                };
                (self.policy.check(&command), command)
            } else {
                let command = format!("{} {}", c.name, c.arguments);
                match self.tools.get(&c.name).and_then(|t| t.approval()) {
                    Some(crate::tools::ToolApproval::Never) => {
                        (Verdict::Refuse(format!("{} is switched off by its configuration", c.name)), command)
                    }
                    Some(crate::tools::ToolApproval::Ask)
                        if !self.approved_tools.contains(&c.name)
                            && self.policy.approval != crate::policy::Approval::Never =>
                    {
                        (Verdict::Ask(format!("{} asks before each call (its configuration)", c.name)), command)
                    }
                    _ => (Verdict::Run, command),
                }
            };
            // A hook may allow what would be asked, or ask about what would run; what the
            // operator's rules refuse stays refused.
            let verdict = match (&hooked[i], verdict) {
                (_, Verdict::Refuse(why)) => Verdict::Refuse(why),
                (HookDecision::Allow, _) => Verdict::Run,
                (HookDecision::Ask(why), _) => Verdict::Ask(format!("a hook asks: {why}")),
                (_, verdict) => verdict,
            };
            if let Verdict::Ask(reason) = &verdict {
                let note = format!("Caret asks to run {}: {reason}", c.name);
                self.hook(&crate::hooks::Moment::Notification(&note), events).await;
            }
            match verdict {
                Verdict::Run => {}
                Verdict::Refuse(why) => refused[i] = Some(format!("error: refused by policy: {why}")),
                Verdict::Ask(reason) => {
                    emit(events, Event::ApprovalRequest { call_id: c.id.clone(), command: command.clone(), reason });
                    // An answer may have come early.
                    let early = self
                        .pending
                        .iter()
                        .position(|op| matches!(op, Op::Approval { call_id, .. } if *call_id == c.id));
                    let mut early = early.and_then(|i| self.pending.remove(i));
                    loop {
                        let next = match early.take() {
                            Some(op) => Some(op),
                            None => ops.recv().await,
                        };
                        match next {
                            Some(Op::Approval { call_id, decision }) if call_id == c.id => {
                                match decision {
                                    Decision::Approve => {}
                                    Decision::ApproveForSession if c.name == TERMINAL => {
                                        self.policy.approve_for_session(&command);
                                    }
                                    Decision::ApproveForSession => {
                                        self.approved_tools.insert(c.name.clone());
                                    }
                                    Decision::Deny => refused[i] = Some("error: the user refused to run it".into()),
                                }
                                break;
                            }
                            Some(Op::Shutdown) => {
                                self.pending.push_back(Op::Shutdown);
                                return None;
                            }
                            Some(Op::Interrupt) | None => return None,
                            Some(other) => self.pending.push_back(other),
                        }
                    }
                }
            }
        }
        let runnable: Vec<Call> =
            calls.iter().zip(&refused).filter(|(_, r)| r.is_none()).map(|(c, _)| c.clone()).collect();
        let refusal = |c: &Call, why: &str| Outcome {
            id: c.id.clone(),
            name: c.name.clone(),
            ok: false,
            output: why.to_owned(),
            images: Vec::new(),
            duration: std::time::Duration::ZERO,
        };
        let on_start = |c: &Call| {
            emit(
                events,
                Event::ToolCallBegin {
                    call_id: c.id.clone(),
                    name: c.name.clone(),
                    arguments: c.arguments.clone(),
                    server: self.tools.get(&c.name).and_then(|t| t.server()).map(str::to_owned),
                },
            )
        };
        let on_end = |o: &Outcome| {
            emit(
                events,
                Event::ToolCallEnd {
                    call_id: o.id.clone(),
                    name: o.name.clone(),
                    ok: o.ok,
                    output: o.output.clone(),
                    duration_ms: o.duration.as_secs_f64() * 1e3,
                },
            )
        };
        for (c, why) in calls.iter().zip(&refused) {
            if let Some(why) = why {
                on_start(c);
                on_end(&refusal(c, why));
            }
        }
        let before = self.attached_rules();
        let ran = tokio::select! {
            ran = run_calls(&self.tools, &runnable, &self.ctx, &on_start, &on_end) => ran,
            () = interrupted(ops, &mut self.pending) => return None,
        };
        self.emit_new_rules(events, before);
        for change in self.ctx.take_changes() {
            emit(events, Event::FileChange { path: change.path, kind: change.kind, diff: change.diff });
        }
        if calls.iter().any(|c| c.name == "todo_write") {
            let items = self.ctx.todos.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
            emit(events, Event::TodoUpdate { items });
        }
        let mut ran = ran.into_iter();
        let mut outcomes: Vec<Outcome> = calls
            .iter()
            .zip(&refused)
            .map(|(c, r)| match r {
                Some(why) => refusal(c, why),
                None => ran.next().unwrap_or_else(|| refusal(c, "error: not run")),
            })
            .collect();
        self.post_tool_hooks(calls, &refused, &mut outcomes, events).await;
        Some(outcomes)
    }

    /// The calls as `PreToolUse` hooks leave them (an input a hook changed), with what each
    /// call's hooks decided.
    async fn pre_tool_hooks(
        &mut self,
        asked: &[Call],
        events: &mpsc::UnboundedSender<Event>,
    ) -> (Vec<Call>, Vec<HookDecision>) {
        let mut calls = asked.to_vec();
        let mut decided = vec![HookDecision::Pass; calls.len()];
        if !self.hooks.as_ref().is_some_and(|h| h.any(HookEvent::PreToolUse)) {
            return (calls, decided);
        }
        for i in 0..calls.len() {
            let c = &calls[i];
            let moment = Moment::PreToolUse { tool: &c.name, id: &c.id, input: &c.arguments };
            let Some(v) = self.hook(&moment, events).await else { continue };
            if let Some(input) = v.input {
                calls[i].arguments = input;
            }
            if v.stop.is_some() {
                self.halted = v.stop;
            }
            decided[i] = v.decision;
        }
        (calls, decided)
    }

    /// `PostToolUse` hooks of the calls that ran: what they say goes to the model with the
    /// call's result.
    async fn post_tool_hooks(
        &mut self,
        calls: &[Call],
        refused: &[Option<String>],
        outcomes: &mut [Outcome],
        events: &mpsc::UnboundedSender<Event>,
    ) {
        if !self.hooks.as_ref().is_some_and(|h| h.any(HookEvent::PostToolUse)) {
            return;
        }
        for ((c, r), o) in calls.iter().zip(refused).zip(outcomes.iter_mut()) {
            if r.is_some() {
                continue;
            }
            let v = {
                let moment = Moment::PostToolUse {
                    tool: &c.name,
                    id: &c.id,
                    input: &c.arguments,
                    output: &o.output,
                    ok: o.ok,
                    duration: o.duration,
                };
                self.hook(&moment, events).await
            };
            let Some(v) = v else { continue };
            if let HookDecision::Block(why) = v.decision {
                o.output.push_str(&format!("\n\n[A PostToolUse hook says] {why}"));
            }
            for context in v.context {
                o.output.push_str(&format!("\n\n[Context from a PostToolUse hook] {context}"));
            }
            if v.stop.is_some() {
                self.halted = v.stop;
            }
        }
    }
}

impl Session {
    /// The calls' results, in order; their images attached after them in one user message
    /// when the model takes images (a tool message holds text only).
    pub(super) fn push_results(&mut self, outcomes: &[Outcome]) {
        let mut attached = Vec::new();
        for o in outcomes {
            let mut text = o.output.clone();
            if !o.images.is_empty() {
                let kinds: Vec<&str> = o.images.iter().map(|i| i.mime.as_str()).collect();
                text.push_str(&if self.images {
                    format!("\n[{} image(s) ({}) attached below]", o.images.len(), kinds.join(", "))
                } else {
                    format!("\n[{} image(s) ({}): this model does not take images]", o.images.len(), kinds.join(", "))
                });
                if self.images {
                    attached.push(ContentPart::text(format!("Images from {} (call {}):", o.name, o.id)));
                    attached.extend(o.images.iter().map(|i| ContentPart::image(&i.mime, &i.base64)));
                }
            }
            self.push(tool_message(&o.id, &text));
        }
        if !attached.is_empty() {
            let mut message = ChatMessage::text(Role::User, "");
            message.content = Some(Content::Parts(attached));
            self.push(message);
        }
    }
}

/// Resolves when the user interrupts (or the front end goes away); other ops are kept.
async fn interrupted(ops: &mut mpsc::UnboundedReceiver<Op>, pending: &mut std::collections::VecDeque<Op>) {
    loop {
        match ops.recv().await {
            Some(Op::Shutdown) => {
                pending.push_back(Op::Shutdown);
                return;
            }
            Some(Op::Interrupt) | None => return,
            Some(other) => pending.push_back(other),
        }
    }
}
