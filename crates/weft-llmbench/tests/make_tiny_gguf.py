#!/usr/bin/env python3
"""Writes a tiny llama-architecture GGUF model with random weights and its tokenizer, for
weft-llmbench's tests against a real llama.cpp server (llama-cpp-python).

    make_tiny_gguf.py OUT_DIR [--ctx 16384] [--layers 2]

OUT_DIR gets:
  tiny.gguf              2 layers (--layers), 64 wide, a byte-level BPE vocabulary of 768 tokens trained on
                         the crate's word list, a ChatML chat template; random weights, no download
  tokenizer/tokenizer.json, tokenizer/tokenizer_config.json
                         the same tokenizer for Hugging Face loaders (weft --tokenizer, llama-benchy)

The weights are random, with two exceptions so that every request generates exactly max_tokens
tokens and its text re-tokenises to exactly those tokens: every embedding carries a large
constant in dimension 0, and the output rows of every token but whole words with their leading
space (" river") weigh that dimension strongly negative, so the special tokens (end of text,
ChatML markers), word pieces, punctuation and byte tokens are never sampled.
"""
import argparse
import json
import os
import sys

import numpy as np
import gguf
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def byte_level_chars():
    """GPT-2's byte-to-unicode table: the visible character for each byte."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--ctx", type=int, default=16384)
    ap.add_argument("--vocab", type=int, default=768)
    ap.add_argument("--layers", type=int, default=2)
    a = ap.parse_args()
    here = os.path.dirname(os.path.abspath(__file__))
    words = open(os.path.join(here, "..", "data", "words.txt")).read().split()
    rng = np.random.default_rng(1234)
    lines = []
    for _ in range(4000):
        n = int(rng.integers(6, 16))
        s = " ".join(words[int(i)] for i in rng.integers(0, len(words), n))
        lines.append(s[0].upper() + s[1:] + ".")

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=a.vocab,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(lines, trainer)
    tdir = os.path.join(a.out, "tokenizer")
    os.makedirs(tdir, exist_ok=True)
    tok.save(os.path.join(tdir, "tokenizer.json"))
    with open(os.path.join(tdir, "tokenizer_config.json"), "w") as f:
        json.dump(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "model_max_length": a.ctx,
                "eos_token": "<|im_end|>",
                "pad_token": "<|endoftext|>",
                "chat_template": TEMPLATE,
                "add_bos_token": False,
            },
            f,
        )

    spec = json.load(open(os.path.join(tdir, "tokenizer.json")))
    vocab = spec["model"]["vocab"]
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    for t in spec.get("added_tokens", []):
        vocab[t["content"]] = t["id"]
    nv = max(vocab.values()) + 1
    tokens = [""] * nv
    for t, i in vocab.items():
        tokens[i] = t
    b2 = byte_level_chars()
    types = []
    banned = []
    allowed = []
    for i, t in enumerate(tokens):
        if t in SPECIAL:
            types.append(gguf.TokenType.CONTROL)
            banned.append(i)
            continue
        types.append(gguf.TokenType.NORMAL)
        # Only whole words with their leading space may be generated: " word" that the
        # tokenizer encodes back to this one token. Any sequence of them then re-tokenises
        # to exactly the tokens generated, so a count of the text on the whole is the
        # server's own count.
        bs = bytes(b2[c] for c in t if c in b2)
        word = bs.decode("latin-1")
        if (
            len(word) >= 3
            and word[0] == " "
            and word[1:].isalpha()
            and word[1:].isascii()
            and tok.encode(word).ids == [i]
        ):
            allowed.append(i)
        else:
            banned.append(i)
    if len(allowed) < 50:
        sys.exit(f"only {len(allowed)} whole-word tokens in the vocabulary; raise --vocab")

    n_embd, n_layer, n_head, n_ff = 64, a.layers, 4, 128
    path = os.path.join(a.out, "tiny.gguf")
    w = gguf.GGUFWriter(path, "llama")
    w.add_name("weft-tiny")
    w.add_context_length(a.ctx)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head)
    w.add_rope_dimension_count(n_embd // n_head)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(nv)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(vocab["<|endoftext|>"])
    w.add_eos_token_id(vocab["<|im_end|>"])
    w.add_add_bos_token(False)
    w.add_chat_template(TEMPLATE)

    f32 = np.float32
    emb = rng.normal(0, 0.02, (nv, n_embd)).astype(f32)
    emb[:, 0] = 8.0
    w.add_tensor("token_embd.weight", emb)
    for L in range(n_layer):
        p = f"blk.{L}."
        w.add_tensor(p + "attn_norm.weight", np.ones(n_embd, f32))
        w.add_tensor(p + "ffn_norm.weight", np.ones(n_embd, f32))
        for n in ["attn_q", "attn_k", "attn_v", "attn_output"]:
            w.add_tensor(p + n + ".weight", rng.normal(0, 0.02, (n_embd, n_embd)).astype(f32))
        w.add_tensor(p + "ffn_gate.weight", rng.normal(0, 0.02, (n_ff, n_embd)).astype(f32))
        w.add_tensor(p + "ffn_up.weight", rng.normal(0, 0.02, (n_ff, n_embd)).astype(f32))
        w.add_tensor(p + "ffn_down.weight", rng.normal(0, 0.02, (n_embd, n_ff)).astype(f32))
    w.add_tensor("output_norm.weight", np.ones(n_embd, f32))
    out = rng.normal(0, 1.0, (nv, n_embd)).astype(f32)
    out[:, 0] = 0.0
    out[banned, 0] = -6.0
    w.add_tensor("output.weight", out)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(path)


if __name__ == "__main__":
    sys.exit(main())
