#!/usr/bin/env python3
"""A minimal OpenAI-compatible server on transformers, for weft bench llm on the GPU machine.

    server.py --port 8000 --out DIR [--model-name qwen3-0.6b-random]

It builds a Qwen3-0.6B-shaped model (the published config's sizes: 28 layers, hidden 1024,
16 query / 8 KV heads of 128, FFN 3072, vocab 151,936) with random weights in bf16 on CUDA (no
download), trains a small byte-level BPE tokenizer on weft's word list and writes it to
DIR/tokenizer/tokenizer.json (for weft --tokenizer and llama-benchy --tokenizer). Sampling is
limited to whole-word tokens of that tokenizer (" river"), so the text re-tokenises to exactly
the tokens generated, and end of text is never sampled, so every request generates max_tokens.

It serves GET /v1/models, POST /v1/chat/completions and /v1/completions, streamed (SSE, with
usage when stream_options.include_usage) or not, one request at a time (a lock; others wait),
with a KV cache (prefill once, then one token per step). Python's standard library only,
besides torch, transformers and tokenizers: `transformers serve` needs fastapi and uvicorn,
which the GPU machine lacks.
"""
import argparse
import json
import os
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import Qwen3Config, Qwen3ForCausalLM

TEMPLATE_ROLES = ("system", "user", "assistant")


def build_tokenizer(words_path, out_dir):
    words = open(words_path).read().split()
    g = torch.Generator().manual_seed(7)
    lines = []
    for _ in range(4000):
        idx = torch.randint(0, len(words), (12,), generator=g).tolist()
        s = " ".join(words[i] for i in idx)
        lines.append(s[0].upper() + s[1:] + ".")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok.train_from_iterator(
        lines,
        trainers.BpeTrainer(vocab_size=4096, special_tokens=special,
                            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False),
    )
    d = os.path.join(out_dir, "tokenizer")
    os.makedirs(d, exist_ok=True)
    tok.save(os.path.join(d, "tokenizer.json"))
    allowed = []
    for t, i in tok.get_vocab().items():
        w = tok.decode([i])
        if len(w) >= 3 and w[0] == " " and w[1:].isalpha() and w[1:].isascii() and tok.encode(w).ids == [i]:
            allowed.append(i)
    return tok, allowed


def chat_prompt(messages):
    s = ""
    for m in messages:
        s += f"<|im_start|>{m.get('role', 'user')}\n{m.get('content') or ''}<|im_end|>\n"
    return s + "<|im_start|>assistant\n"


class Engine:
    def __init__(self, tok, allowed, device):
        cfg = Qwen3Config(
            vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
            num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
            rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=True,
        )
        torch.manual_seed(0)
        self.model = Qwen3ForCausalLM(cfg).to(device=device, dtype=torch.bfloat16).eval()
        self.tok = tok
        self.device = device
        mask = torch.full((cfg.vocab_size,), float("-inf"), device=device)
        mask[torch.tensor(allowed, device=device)] = 0.0
        self.mask = mask
        self.lock = threading.Lock()

    @torch.inference_mode()
    def generate(self, prompt, max_tokens):
        """Yields (token id, text) one at a time; the prompt's token count first."""
        ids = self.tok.encode(prompt).ids
        yield len(ids)
        x = torch.tensor([ids], device=self.device)
        out = self.model(input_ids=x, use_cache=True)
        past = out.past_key_values
        logits = out.logits[0, -1].float()
        for _ in range(max_tokens):
            nxt = int(torch.argmax(logits + self.mask + torch.rand_like(logits) * 4.0))
            yield nxt, self.tok.decode([nxt])
            out = self.model(input_ids=torch.tensor([[nxt]], device=self.device), past_key_values=past, use_cache=True)
            past = out.past_key_values
            logits = out.logits[0, -1].float()


def make_handler(engine, name):
    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):
            pass

        def send_json(self, code, obj):
            b = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(b)))
            self.end_headers()
            self.wfile.write(b)

        def do_GET(self):
            if self.path.rstrip("/") == "/v1/models":
                return self.send_json(200, {"object": "list", "data": [{"id": name, "object": "model", "owned_by": "weft-gpu-script"}]})
            self.send_json(404, {"error": {"message": "not found"}})

        def do_POST(self):
            n = int(self.headers.get("Content-Length", "0"))
            try:
                body = json.loads(self.rfile.read(n) or b"{}")
            except json.JSONDecodeError:
                return self.send_json(400, {"error": {"message": "body is not JSON"}})
            chat = self.path.rstrip("/") == "/v1/chat/completions"
            if not chat and self.path.rstrip("/") != "/v1/completions":
                return self.send_json(404, {"error": {"message": "not found"}})
            if body.get("model") != name:
                return self.send_json(404, {"error": {"message": f"model {body.get('model')!r} not found"}})
            prompt = chat_prompt(body.get("messages", [])) if chat else str(body.get("prompt", ""))
            max_tokens = int(body.get("max_tokens") or 16)
            rid = f"cmpl-{uuid.uuid4().hex}"
            with engine.lock:
                gen = engine.generate(prompt, max_tokens)
                n_prompt = next(gen)
                if not body.get("stream"):
                    text = "".join(t for _, t in gen)
                    choice = {"index": 0, "finish_reason": "length"}
                    if chat:
                        choice["message"] = {"role": "assistant", "content": text}
                    else:
                        choice["text"] = text
                    return self.send_json(200, {"id": rid, "choices": [choice], "usage": {"prompt_tokens": n_prompt, "completion_tokens": max_tokens, "total_tokens": n_prompt + max_tokens}})
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Cache-Control", "no-cache")
                self.send_header("Connection", "close")
                self.end_headers()
                self.close_connection = True

                def send(obj):
                    self.wfile.write(b"data: " + json.dumps(obj).encode() + b"\n\n")
                    self.wfile.flush()

                k = 0
                for tid, text in gen:
                    if chat:
                        ch = {"index": 0, "delta": {"content": text}, "finish_reason": None}
                    else:
                        ch = {"index": 0, "text": text, "finish_reason": None}
                    send({"id": rid, "choices": [ch]})
                    k += 1
                fin = {"index": 0, "finish_reason": "length"}
                fin["delta" if chat else "text"] = {} if chat else ""
                send({"id": rid, "choices": [fin]})
                if (body.get("stream_options") or {}).get("include_usage"):
                    send({"id": rid, "choices": [], "usage": {"prompt_tokens": n_prompt, "completion_tokens": k, "total_tokens": n_prompt + k}})
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()

    return H


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--out", required=True)
    ap.add_argument("--words", required=True)
    ap.add_argument("--model-name", default="qwen3-0.6b-random")
    a = ap.parse_args()
    tok, allowed = build_tokenizer(a.words, a.out)
    engine = Engine(tok, allowed, "cuda")
    # One throwaway generation loads the CUDA kernels before anyone measures.
    list(engine.generate("<|im_start|>user\nHello.<|im_end|>\n", 4))
    srv = ThreadingHTTPServer(("127.0.0.1", a.port), make_handler(engine, a.model_name))
    print(f"serving {a.model_name} on 127.0.0.1:{a.port} ({len(allowed)} sampled tokens)", flush=True)
    srv.serve_forever()


if __name__ == "__main__":
    main()
