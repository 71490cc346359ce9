//! Fill-in-the-middle prompts per model family.
//!
//! Each family was trained with its own sentinel strings and order. The prompt is plain text
//! with the sentinels in it: a server's `/v1/completions` and the in-process llama.cpp
//! provider (which parses special tokens in a prompt) both read it as the model was trained.
//! Families with repository-level training (Qwen2.5-Coder, StarCoder2) get other files'
//! snippets as `file_sep` blocks before the current file; the others get them as comments at
//! the top of the prefix, which every code model reads.

use serde::{Deserialize, Serialize};

use crate::context::Context;

/// A model family's fill-in-the-middle format.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Family {
    /// Qwen2.5-Coder: `<|fim_prefix|>…<|fim_suffix|>…<|fim_middle|>`, repository context
    /// as `<|repo_name|>` / `<|file_sep|>` blocks.
    QwenCoder,
    /// StarCoder2: `<fim_prefix>…<fim_suffix>…<fim_middle>`, `<repo_name>` / `<file_sep>`.
    StarCoder2,
    /// DeepSeek-Coder: `<｜fim▁begin｜>…<｜fim▁hole｜>…<｜fim▁end｜>`.
    DeepSeekCoder,
    /// CodeLlama: `<PRE> … <SUF>… <MID>`.
    CodeLlama,
    /// A template from the configuration.
    Custom(Template),
}

/// A fill-in-the-middle template: `{prefix}`, `{suffix}` and optionally `{context}` (other
/// files' snippets as comments) and `{middle}` (the cursor's line up to the cursor, which the
/// model continues; without it that text ends `{prefix}`) are filled in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Template {
    /// The prompt, e.g. `<PRE> {prefix} <SUF>{suffix} <MID>`.
    pub prompt: String,
    /// Strings that end the middle (the model's end-of-text and file separators).
    #[serde(default)]
    pub stop: Vec<String>,
}

impl Family {
    /// The family a model name suggests (`qwen2.5-coder-1.5b`, `starcoder2-3b`,
    /// `deepseek-coder-1.3b-base`, `codellama-7b`); `None` when nothing matches.
    pub fn guess(model: &str) -> Option<Family> {
        let m = model.to_lowercase();
        if m.contains("qwen") && m.contains("coder") {
            Some(Family::QwenCoder)
        } else if m.contains("starcoder") {
            Some(Family::StarCoder2)
        } else if m.contains("deepseek") && m.contains("coder") {
            Some(Family::DeepSeekCoder)
        } else if m.contains("codellama") || m.contains("code-llama") {
            Some(Family::CodeLlama)
        } else {
            None
        }
    }

    /// Strings that end a completion for this family.
    pub fn stop(&self) -> Vec<String> {
        let s: &[&str] = match self {
            Family::QwenCoder => &["<|endoftext|>", "<|fim_pad|>", "<|file_sep|>", "<|im_end|>", "<|repo_name|>"],
            Family::StarCoder2 => &["<|endoftext|>", "<file_sep>", "<repo_name>"],
            Family::DeepSeekCoder => &["<｜end▁of▁sentence｜>", "<|EOT|>", "<｜fim▁begin｜>"],
            Family::CodeLlama => &[" <EOT>", "<EOT>", "</s>"],
            Family::Custom(t) => return t.stop.clone(),
        };
        s.iter().map(|s| (*s).to_owned()).collect()
    }

    /// Whether the format lets a prompt start the middle (text after the middle sentinel
    /// that the model continues). CodeLlama's sentinels carry spaces the middle would have
    /// to match, so it gets the whole prefix; a custom template says so with `{middle}`.
    pub fn starts_middle(&self) -> bool {
        match self {
            Family::QwenCoder | Family::StarCoder2 | Family::DeepSeekCoder => true,
            Family::CodeLlama => false,
            Family::Custom(t) => t.prompt.contains("{middle}"),
        }
    }

    /// The prompt for a context.
    pub fn render(&self, ctx: &Context) -> String {
        match self {
            Family::QwenCoder => {
                repo_level(ctx, "<|repo_name|>", "<|file_sep|>", ["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"])
            }
            Family::StarCoder2 => {
                repo_level(ctx, "<repo_name>", "<file_sep>", ["<fim_prefix>", "<fim_suffix>", "<fim_middle>"])
            }
            Family::DeepSeekCoder => {
                format!(
                    "<｜fim▁begin｜>{}{}<｜fim▁hole｜>{}<｜fim▁end｜>{}",
                    commented(ctx),
                    ctx.prefix,
                    ctx.suffix,
                    ctx.middle
                )
            }
            Family::CodeLlama => {
                format!("<PRE> {}{}{} <SUF>{} <MID>", commented(ctx), ctx.prefix, ctx.middle, ctx.suffix)
            }
            Family::Custom(t) if t.prompt.contains("{middle}") => t
                .prompt
                .replace("{context}", &commented(ctx))
                .replace("{suffix}", &ctx.suffix)
                .replace("{middle}", &ctx.middle)
                .replace("{prefix}", &ctx.prefix),
            Family::Custom(t) => t
                .prompt
                .replace("{context}", &commented(ctx))
                .replace("{suffix}", &ctx.suffix)
                .replace("{prefix}", &format!("{}{}", ctx.prefix, ctx.middle)),
        }
    }
}

/// Repository-level format: `<repo_name>NAME` then one `<file_sep>PATH\nTEXT` block per
/// snippet, then the current file's path and its FIM prompt.
fn repo_level(ctx: &Context, repo: &str, sep: &str, [pre, suf, mid]: [&str; 3]) -> String {
    let mut out = String::new();
    if !ctx.snippets.is_empty() || ctx.path.is_some() {
        out.push_str(repo);
        out.push_str(ctx.repo.as_deref().unwrap_or("workspace"));
        out.push('\n');
        for s in &ctx.snippets {
            out.push_str(sep);
            out.push_str(&s.path);
            out.push('\n');
            out.push_str(&s.text);
            if !s.text.ends_with('\n') {
                out.push('\n');
            }
        }
        out.push_str(sep);
        out.push_str(ctx.path.as_deref().unwrap_or("untitled"));
        out.push('\n');
    }
    out.push_str(pre);
    out.push_str(&ctx.prefix);
    out.push_str(suf);
    out.push_str(&ctx.suffix);
    out.push_str(mid);
    out.push_str(&ctx.middle);
    out
}

/// Other files' snippets as comments in the current file's comment syntax.
fn commented(ctx: &Context) -> String {
    let mark = ctx.path.as_deref().map_or("//", comment_for);
    let mut out = String::new();
    for s in &ctx.snippets {
        out.push_str(&format!("{mark} Path: {}\n", s.path));
        for line in s.text.lines() {
            out.push_str(mark);
            if !line.is_empty() {
                out.push(' ');
                out.push_str(line);
            }
            out.push('\n');
        }
    }
    out
}

/// The line-comment opener for a path's language.
pub fn comment_for(path: &str) -> &'static str {
    let ext = path.rsplit('.').next().unwrap_or("");
    match ext {
        "py" | "pyi" | "rb" | "sh" | "bash" | "toml" | "yml" | "yaml" | "pl" | "r" | "jl" | "ex" | "exs" | "nix" => "#",
        "lua" | "sql" | "hs" | "elm" => "--",
        "lisp" | "el" | "clj" | "scm" => ";;",
        "erl" | "hrl" | "tex" => "%",
        _ => "//",
    }
}
