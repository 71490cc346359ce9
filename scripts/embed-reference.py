#!/usr/bin/env python3
"""The reference Python implementation of the default embedding model, for comparison with
`caret bench embed`.

    caret bench embed PATH --chunks 300 --dump /tmp/texts.json
    python3 scripts/embed-reference.py MODEL_DIR /tmp/texts.json

Needs `pip install torch sentence-transformers` (not part of Caret). Embeds the same texts
with sentence-transformers on the CPU (mean pooling, normalised, 256-token window, batches
of 32, all cores), prints chunks/s and tokens/s, and the agreement with Caret's vectors
(cosine of each pair)."""
import json
import sys
import time

import torch
from sentence_transformers import SentenceTransformer, models

model_dir, dump = sys.argv[1], sys.argv[2]
data = json.load(open(dump))
texts = data["texts"]
word = models.Transformer(model_dir, max_seq_length=256)
pool = models.Pooling(word.get_word_embedding_dimension(), pooling_mode="mean")
model = SentenceTransformer(modules=[word, pool], device="cpu")
tokens = sum(min(len(model.tokenizer(t)["input_ids"]), 256) for t in texts)
model.encode(texts[:8], normalize_embeddings=True)  # warm-up
start = time.perf_counter()
vectors = model.encode(texts, batch_size=32, normalize_embeddings=True)
took = time.perf_counter() - start
print(f"sentence-transformers (torch {torch.__version__}, {torch.get_num_threads()} threads): "
      f"{len(texts)} chunks, {tokens} tokens in {took:.2f} s: {len(texts) / took:.1f} chunks/s, {tokens / took:.0f} tokens/s")
cos = [float(sum(a * b for a, b in zip(v, w))) for v, w in zip(vectors, data["vectors"])]
print(f"agreement with caret: min cosine {min(cos):.6f}, mean {sum(cos) / len(cos):.6f}")
