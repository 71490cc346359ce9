#!/usr/bin/env python3
"""The reference Python implementations of the embedding models, for comparison with
`caret bench embed`.

    caret bench embed PATH --chunks 300 --dump /tmp/texts.json
    python3 scripts/embed-reference.py MODEL_DIR /tmp/texts.json

MODEL_DIR with `model.safetensors` (all-minilm-l6-v2): sentence-transformers on torch
(`pip install torch sentence-transformers`), mean pooling, normalised, 256-token window,
batches of 32 (its default), all cores.
MODEL_DIR with `model.onnx` (all-minilm-l6-v2-int8): onnxruntime's Python API
(`pip install onnxruntime tokenizers numpy`), the same pooling, batches of 32 sorted by
length, all cores.
Prints chunks/s and tokens/s, and the agreement with the vectors in the dump (cosine of
each pair). Not part of Caret."""
import json
import os
import sys
import time

model_dir, dump = sys.argv[1], sys.argv[2]
data = json.load(open(dump))
texts = data["texts"]


def sentence_transformers():
    import torch
    from sentence_transformers import SentenceTransformer, models

    word = models.Transformer(model_dir, max_seq_length=256)
    pool = models.Pooling(word.get_word_embedding_dimension(), pooling_mode="mean")
    model = SentenceTransformer(modules=[word, pool], device="cpu")
    tokens = sum(min(len(model.tokenizer(t)["input_ids"]), 256) for t in texts)
    model.encode(texts[:8], normalize_embeddings=True)  # warm-up
    start = time.perf_counter()
    vectors = model.encode(texts, batch_size=32, normalize_embeddings=True)
    took = time.perf_counter() - start
    name = f"sentence-transformers (torch {torch.__version__}, {torch.get_num_threads()} threads)"
    return name, tokens, took, [list(map(float, v)) for v in vectors]


def onnxruntime():
    import numpy as np
    import onnxruntime as ort
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    tok.enable_truncation(256)
    tok.no_padding()
    session = ort.InferenceSession(os.path.join(model_dir, "model.onnx"))
    names = {i.name for i in session.get_inputs()}
    ids = [tok.encode(t).ids for t in texts]
    order = sorted(range(len(texts)), key=lambda i: len(ids[i]))

    def run():
        out = [None] * len(texts)
        for b in range(0, len(order), 32):
            members = order[b:b + 32]
            width = max(len(ids[i]) for i in members)
            x = np.zeros((len(members), width), np.int64)
            mask = np.zeros_like(x)
            for r, i in enumerate(members):
                x[r, :len(ids[i])] = ids[i]
                mask[r, :len(ids[i])] = 1
            feed = {"input_ids": x, "attention_mask": mask, "token_type_ids": np.zeros_like(x)}
            hidden = session.run(None, {k: v for k, v in feed.items() if k in names})[0]
            v = (hidden * mask[:, :, None]).sum(1)
            v /= np.linalg.norm(v, axis=1, keepdims=True)
            for r, i in enumerate(members):
                out[i] = v[r]
        return out

    run()  # warm-up
    start = time.perf_counter()
    vectors = run()
    took = time.perf_counter() - start
    return f"onnxruntime {ort.__version__} (default threads)", sum(map(len, ids)), took, vectors


onnx = os.path.exists(os.path.join(model_dir, "model.onnx"))
name, tokens, took, vectors = onnxruntime() if onnx else sentence_transformers()
print(f"{name}: {len(texts)} chunks, {tokens} tokens in {took:.2f} s: "
      f"{len(texts) / took:.1f} chunks/s, {tokens / took:.0f} tokens/s")
cos = [float(sum(a * b for a, b in zip(v, w))) for v, w in zip(vectors, data["vectors"])]
print(f"agreement with the dump ({data['model']}): min cosine {min(cos):.6f}, mean {sum(cos) / len(cos):.6f}")
