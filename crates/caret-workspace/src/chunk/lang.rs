//! Languages: detection from file names, grammars, and which syntax nodes are definitions.

use crate::RelPath;

/// The language of a file, as far as chunking cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Language {
    /// Rust.
    Rust,
    /// Python.
    Python,
    /// JavaScript (and JSX).
    JavaScript,
    /// TypeScript.
    TypeScript,
    /// TypeScript with JSX.
    Tsx,
    /// Go.
    Go,
    /// Java.
    Java,
    /// C.
    C,
    /// C++ (also used for `.h` headers, which it parses as well as C).
    Cpp,
    /// C#.
    CSharp,
    /// Ruby.
    Ruby,
    /// PHP.
    Php,
    /// Markdown, chunked by headings.
    Markdown,
    /// Any other text, chunked by paragraphs and lines.
    Text,
}

/// What a file is for; ranking can prefer implementation over tests and prose.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FileKind {
    /// Source code.
    Code,
    /// Tests.
    Test,
    /// Documentation and prose.
    Docs,
    /// Configuration.
    Config,
    /// Bulk data — translation catalogs, tables: searched by their words, not embedded (many
    /// chunks of little meaning each, that would delay the vectors of everything else).
    Data,
}

impl Language {
    /// Every language with a grammar, for tests and documentation.
    pub const SYNTAX: [Language; 12] = [
        Language::Rust,
        Language::Python,
        Language::JavaScript,
        Language::TypeScript,
        Language::Tsx,
        Language::Go,
        Language::Java,
        Language::C,
        Language::Cpp,
        Language::CSharp,
        Language::Ruby,
        Language::Php,
    ];

    /// Detects the language from a path's extension or file name.
    pub fn detect(path: &RelPath) -> Language {
        let name = path.file_name();
        if matches!(name, b"Rakefile" | b"Gemfile" | b"Guardfile" | b"Vagrantfile" | b"Podfile") {
            return Language::Ruby;
        }
        match path.extension().as_deref() {
            Some("rs") => Language::Rust,
            Some("py" | "pyi" | "pyw") => Language::Python,
            Some("js" | "mjs" | "cjs" | "jsx") => Language::JavaScript,
            Some("ts" | "mts" | "cts") => Language::TypeScript,
            Some("tsx") => Language::Tsx,
            Some("go") => Language::Go,
            Some("java") => Language::Java,
            Some("c") => Language::C,
            Some("cc" | "cpp" | "cxx" | "c++" | "h" | "hh" | "hpp" | "hxx" | "h++" | "ipp" | "inl") => Language::Cpp,
            Some("cs") => Language::CSharp,
            Some("rb" | "rake" | "gemspec" | "ru") => Language::Ruby,
            Some("php" | "phtml") => Language::Php,
            Some("md" | "markdown" | "mdx") => Language::Markdown,
            _ => Language::Text,
        }
    }

    /// The lowercase name.
    pub fn name(self) -> &'static str {
        match self {
            Language::Rust => "rust",
            Language::Python => "python",
            Language::JavaScript => "javascript",
            Language::TypeScript => "typescript",
            Language::Tsx => "tsx",
            Language::Go => "go",
            Language::Java => "java",
            Language::C => "c",
            Language::Cpp => "cpp",
            Language::CSharp => "csharp",
            Language::Ruby => "ruby",
            Language::Php => "php",
            Language::Markdown => "markdown",
            Language::Text => "text",
        }
    }

    /// The tree-sitter grammar, for languages chunked by syntax.
    pub fn grammar(self) -> Option<tree_sitter::Language> {
        let f = match self {
            Language::Rust => tree_sitter_rust::LANGUAGE,
            Language::Python => tree_sitter_python::LANGUAGE,
            Language::JavaScript => tree_sitter_javascript::LANGUAGE,
            Language::TypeScript => tree_sitter_typescript::LANGUAGE_TYPESCRIPT,
            Language::Tsx => tree_sitter_typescript::LANGUAGE_TSX,
            Language::Go => tree_sitter_go::LANGUAGE,
            Language::Java => tree_sitter_java::LANGUAGE,
            Language::C => tree_sitter_c::LANGUAGE,
            Language::Cpp => tree_sitter_cpp::LANGUAGE,
            Language::CSharp => tree_sitter_c_sharp::LANGUAGE,
            Language::Ruby => tree_sitter_ruby::LANGUAGE,
            Language::Php => tree_sitter_php::LANGUAGE_PHP,
            Language::Markdown | Language::Text => return None,
        };
        Some(f.into())
    }

    /// Node kinds that define something (functions, types, modules): a chunk prefers to start
    /// at one, and its header becomes context for the chunks inside it.
    pub fn definitions(self) -> &'static [&'static str] {
        const JS: &[&str] = &[
            "function_declaration",
            "generator_function_declaration",
            "class_declaration",
            "method_definition",
            "export_statement",
        ];
        const TS: &[&str] = &[
            "function_declaration",
            "generator_function_declaration",
            "class_declaration",
            "abstract_class_declaration",
            "method_definition",
            "export_statement",
            "interface_declaration",
            "type_alias_declaration",
            "enum_declaration",
            "module",
            "internal_module",
        ];
        const C: &[&str] =
            &["function_definition", "struct_specifier", "enum_specifier", "union_specifier", "type_definition"];
        match self {
            Language::Rust => &[
                "function_item",
                "function_signature_item",
                "impl_item",
                "trait_item",
                "struct_item",
                "enum_item",
                "union_item",
                "mod_item",
                "macro_definition",
                "const_item",
                "static_item",
                "type_item",
            ],
            Language::Python => &["function_definition", "class_definition", "decorated_definition"],
            Language::JavaScript => JS,
            Language::TypeScript | Language::Tsx => TS,
            Language::Go => &["function_declaration", "method_declaration", "type_declaration"],
            Language::Java => &[
                "class_declaration",
                "interface_declaration",
                "enum_declaration",
                "record_declaration",
                "annotation_type_declaration",
                "method_declaration",
                "constructor_declaration",
            ],
            Language::C => C,
            Language::Cpp => &[
                "function_definition",
                "struct_specifier",
                "enum_specifier",
                "union_specifier",
                "type_definition",
                "class_specifier",
                "namespace_definition",
            ],
            Language::CSharp => &[
                "class_declaration",
                "struct_declaration",
                "interface_declaration",
                "enum_declaration",
                "record_declaration",
                "method_declaration",
                "constructor_declaration",
                "property_declaration",
                "namespace_declaration",
                "delegate_declaration",
            ],
            Language::Ruby => &["method", "singleton_method", "class", "module", "singleton_class"],
            Language::Php => &[
                "function_definition",
                "class_declaration",
                "method_declaration",
                "interface_declaration",
                "trait_declaration",
                "enum_declaration",
                "namespace_definition",
            ],
            Language::Markdown | Language::Text => &[],
        }
    }
}

/// Node kinds that belong with the node after them: comments, attributes, decorators.
pub(crate) fn attaches_to_next(kind: &str) -> bool {
    kind.contains("comment")
        || matches!(kind, "attribute_item" | "decorator" | "annotation" | "marker_annotation" | "attribute_list")
}

impl FileKind {
    /// The lowercase name.
    pub fn name(self) -> &'static str {
        match self {
            FileKind::Code => "code",
            FileKind::Test => "test",
            FileKind::Docs => "docs",
            FileKind::Config => "config",
            FileKind::Data => "data",
        }
    }

    /// Classifies a file by its path and language.
    pub fn detect(path: &RelPath, language: Language) -> FileKind {
        let name = String::from_utf8_lossy(path.file_name()).to_ascii_lowercase();
        let in_dir = |dirs: &[&str]| {
            path.segments().rev().skip(1).any(|s| dirs.iter().any(|d| s.eq_ignore_ascii_case(d.as_bytes())))
        };
        let stem = name.split('.').next().unwrap_or_default();
        let test_name = stem.starts_with("test_")
            || stem == "conftest"
            || (stem == "tests" || stem == "test") && name.ends_with(".rs")
            || stem.ends_with("_test")
            || stem.ends_with("_tests")
            || stem.ends_with("_spec")
            || stem.ends_with("test") && name.ends_with(".java")
            || stem.ends_with("tests") && name.ends_with(".cs")
            || name.contains(".test.")
            || name.contains(".spec.");
        if test_name || in_dir(&["test", "tests", "testing", "__tests__", "spec", "specs", "testdata", "test_data"]) {
            return FileKind::Test;
        }
        // A package's documentation kept in a source file of its own (Go's `doc.go`, Java's
        // `package-info.java`): prose, not the code that implements it.
        if name == "doc.go" || name == "package-info.java" {
            return FileKind::Docs;
        }
        match language {
            Language::Markdown => return FileKind::Docs,
            Language::Text => {}
            _ => return FileKind::Code,
        }
        let ext = path.extension().unwrap_or_default();
        // Manual pages (`man/tool.1`, `syncthing-bep.7`): roff prose.
        let manual = ext.len() == 1 && ext.as_bytes()[0].is_ascii_digit() && ext != "0" || ext == "man";
        if manual {
            return FileKind::Docs;
        }
        if matches!(ext.as_str(), "po" | "pot" | "xliff" | "xlf" | "csv" | "tsv") {
            return FileKind::Data;
        }
        if matches!(ext.as_str(), "rst" | "txt" | "adoc" | "asciidoc" | "org" | "tex")
            || name.starts_with("readme")
            || name.starts_with("changelog")
            || in_dir(&["doc", "docs", "docsrc", "doc-src", "documentation", "man", "manual"])
        {
            FileKind::Docs
        } else if matches!(
            ext.as_str(),
            "toml" | "yaml" | "yml" | "json" | "jsonc" | "ini" | "cfg" | "conf" | "xml" | "properties"
        ) {
            FileKind::Config
        } else {
            FileKind::Code
        }
    }
}
