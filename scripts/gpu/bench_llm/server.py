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
usage when stream_options.include_usage; chunked transfer encoding, so connections stay
open) or not, one request at a time (a lock; others wait). The model is transformers'
Qwen3ForCausalLM; the forward pass over its weights is written out here (see Engine) so that
decoding runs against a static KV cache as one CUDA graph per token, and is checked against
transformers' own forward at start. Python's standard library only, besides torch,
transformers and tokenizers: `transformers serve` needs fastapi and uvicorn, which the GPU
machine lacks.

The first version called the model through transformers per token with a dynamic cache and
left Nagle's algorithm on: ~12 tokens/s and ~44 ms per request latency on an H200.

Without a GPU, `--device cpu --layers 2` runs the same code eagerly (slowly), to try it.
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
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers import Qwen3Config, Qwen3ForCausalLM

# The attention backends the prefill may use (see --cudnn-attention); all of them by default.
PREFILL_ATTENTION = [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]

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


def rms(x, w, eps):
    """Qwen3RMSNorm, as transformers computes it (float32 inside, weight applied in bf16)."""
    dt = x.dtype
    x = x.float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return w * x.to(dt)


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class Engine:
    """transformers' Qwen3ForCausalLM (built from the published config, random weights) for the
    weights, run by a hand-written forward pass over them: prefill in one pass with a causal
    SDPA, then decode one token per step against a static KV cache of `max_len` positions. On
    CUDA the whole decode step (embedding, 28 layers, head, sampling, the next step's inputs)
    is one captured CUDA graph, so a token costs one graph launch and one 4-byte copy to the
    host, and the next step is launched before the host turns the last token into text. At
    start the pass is checked against transformers' own forward on the same weights."""

    def __init__(self, tok, allowed, device, max_len=8192, layers=28, graphs=True):
        cfg = Qwen3Config(
            vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=layers,
            num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
            rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=True,
        )
        cfg._attn_implementation = "sdpa"
        torch.manual_seed(0)
        self.hf = Qwen3ForCausalLM(cfg).to(device=device, dtype=torch.bfloat16).eval().requires_grad_(False)
        self.cfg = cfg
        self.tok = tok
        self.device = device
        self.max_len = max_len
        self.H, self.KVH, self.D = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.eps = cfg.rms_norm_eps
        m = self.hf.model
        self.embed = m.embed_tokens.weight
        self.norm = m.norm.weight
        self.head = self.hf.lm_head.weight
        self.layers = []
        for l in m.layers:
            a, f = l.self_attn, l.mlp
            self.layers.append(dict(
                ln1=l.input_layernorm.weight, ln2=l.post_attention_layernorm.weight,
                qkv=torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]).contiguous(),
                qn=a.q_norm.weight, kn=a.k_norm.weight, o=a.o_proj.weight,
                gu=torch.cat([f.gate_proj.weight, f.up_proj.weight]).contiguous(), down=f.down_proj.weight,
            ))
        # The rotary tables from transformers' own rotary embedding (its inverse frequencies and
        # scaling), as it computes them: float32, then bf16.
        rot = m.rotary_emb
        inv = rot.inv_freq.float().to(device)
        scaling = float(getattr(rot, "attention_scaling", 1.0))
        fr = torch.outer(torch.arange(max_len, device=device, dtype=torch.float32), inv)
        emb = torch.cat((fr, fr), dim=-1)
        self.cos = (emb.cos() * scaling).to(torch.bfloat16)
        self.sin = (emb.sin() * scaling).to(torch.bfloat16)
        shape = (len(self.layers), 1, self.KVH, max_len, self.D)
        self.kc = torch.zeros(shape, device=device, dtype=torch.bfloat16)
        self.vc = torch.zeros(shape, device=device, dtype=torch.bfloat16)
        mask = torch.full((cfg.vocab_size,), float("-inf"), device=device)
        mask[torch.tensor(allowed, device=device)] = 0.0
        self.vmask = mask
        self.positions = torch.arange(max_len, device=device)
        # The decode step's static inputs and outputs.
        self.tok_in = torch.zeros(1, dtype=torch.long, device=device)
        self.pos = torch.zeros(1, dtype=torch.long, device=device)
        self.tok_out = torch.zeros(1, dtype=torch.long, device=device)
        self.logits = torch.zeros(1, cfg.vocab_size, dtype=torch.float32, device=device)
        self.lock = threading.Lock()
        self.graph = None
        self.check()
        if graphs and device == "cuda":
            self.capture()

    def sample(self, logits):
        return torch.argmax(logits + self.vmask + torch.rand_like(logits) * 4.0, dim=-1)

    def attn_proj(self, x, L, pos_cos, pos_sin):
        n = x.shape[0]
        qkv = rms(x, L["ln1"], self.eps) @ L["qkv"].t()
        q, k, v = qkv.split([self.H * self.D, self.KVH * self.D, self.KVH * self.D], dim=-1)
        q = rms(q.view(n, self.H, self.D), L["qn"], self.eps).transpose(0, 1)
        k = rms(k.view(n, self.KVH, self.D), L["kn"], self.eps).transpose(0, 1)
        v = v.view(n, self.KVH, self.D).transpose(0, 1)
        q = q * pos_cos + rotate_half(q) * pos_sin
        k = k * pos_cos + rotate_half(k) * pos_sin
        return q, k, v

    def mlp(self, x, L):
        g, u = (rms(x, L["ln2"], self.eps) @ L["gu"].t()).chunk(2, dim=-1)
        return (torch.nn.functional.silu(g) * u) @ L["down"].t()

    def prefill(self, ids):
        """The whole prompt in one pass (fills the cache); the last position's logits."""
        n = len(ids)
        x = self.embed[torch.tensor(ids, device=self.device)]
        c, s = self.cos[:n], self.sin[:n]
        for i, L in enumerate(self.layers):
            q, k, v = self.attn_proj(x, L, c, s)
            self.kc[i, 0, :, :n] = k
            self.vc[i, 0, :, :n] = v
            with sdpa_kernel(PREFILL_ATTENTION):
                a = torch.nn.functional.scaled_dot_product_attention(
                    q[None], k[None], v[None], is_causal=True, scale=self.D ** -0.5, enable_gqa=True)
            x = x + a[0].transpose(0, 1).reshape(n, self.H * self.D) @ L["o"].t()
            x = x + self.mlp(x, L)
        return (rms(x[-1:], self.norm, self.eps) @ self.head.t()).float()

    def step(self):
        """One decode step on the static buffers: token tok_in at position pos."""
        x = self.embed[self.tok_in]
        c, s = self.cos[self.pos], self.sin[self.pos]
        valid = (self.positions <= self.pos).view(1, 1, 1, self.max_len)
        for i, L in enumerate(self.layers):
            q, k, v = self.attn_proj(x, L, c, s)
            self.kc[i, 0].index_copy_(1, self.pos, k)
            self.vc[i, 0].index_copy_(1, self.pos, v)
            a = torch.nn.functional.scaled_dot_product_attention(
                q[None], self.kc[i], self.vc[i], attn_mask=valid, scale=self.D ** -0.5, enable_gqa=True)
            x = x + a[0].transpose(0, 1).reshape(1, self.H * self.D) @ L["o"].t()
            x = x + self.mlp(x, L)
        self.logits.copy_((rms(x, self.norm, self.eps) @ self.head.t()).float())
        self.tok_out.copy_(self.sample(self.logits))
        # The next step's inputs, on the device, so it can be launched before the host has read
        # this token.
        self.tok_in.copy_(self.tok_out)
        self.pos.add_(1)

    def capture(self):
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                self.pos.zero_()
                self.step()
        torch.cuda.current_stream().wait_stream(s)
        self.graph = torch.cuda.CUDAGraph()
        self.pos.zero_()
        with torch.cuda.graph(self.graph):
            self.step()
        torch.cuda.synchronize()

    def run_step(self):
        if self.graph is not None:
            self.graph.replay()
        else:
            self.step()

    @torch.inference_mode()
    def check(self):
        """This forward pass against transformers' own on the same weights: the prefill's last
        logits and one decode step's. Prints the largest difference against the logits'
        spread; exits when they disagree (then the figures would not be of this model)."""
        ids = self.tok.encode("<|im_start|>user\nThe river runs past the old mill.<|im_end|>\n").ids
        ref = self.hf(input_ids=torch.tensor([ids], device=self.device)).logits[0, -1].float()
        got = self.prefill(ids)[0]
        nxt = int(torch.argmax(ref))
        ref2 = self.hf(input_ids=torch.tensor([ids + [nxt]], device=self.device)).logits[0, -1].float()
        self.tok_in.fill_(nxt)
        self.pos.fill_(len(ids))
        self.step()
        got2 = self.logits[0]
        scale = float(ref.std())
        d1, d2 = float((got - ref).abs().max()), float((got2 - ref2).abs().max())
        cos1 = float(torch.nn.functional.cosine_similarity(got, ref, dim=0))
        cos2 = float(torch.nn.functional.cosine_similarity(got2, ref2, dim=0))
        print(f"check against transformers' forward: prefill max |diff| {d1:.4f}, decode {d2:.4f} "
              f"(logits std {scale:.4f}); cosine {cos1:.5f}, {cos2:.5f}", flush=True)
        if min(cos1, cos2) < 0.99:
            raise SystemExit("the forward pass disagrees with transformers' own: not serving")

    @torch.inference_mode()
    def generate(self, prompt, max_tokens):
        """Yields the prompt's token count, then (token id, text) one at a time."""
        ids = self.tok.encode(prompt).ids
        if len(ids) + max_tokens + 1 > self.max_len:
            raise ValueError(f"{len(ids)} prompt tokens + {max_tokens} > the cache's {self.max_len} positions")
        yield len(ids)
        logits = self.prefill(ids)
        self.tok_in.copy_(self.sample(logits))
        self.pos.fill_(len(ids))
        first = int(self.tok_in)
        yield first, self.tok.decode([first])
        if max_tokens <= 1:
            return
        host = torch.zeros(2, dtype=torch.long, pin_memory=self.device == "cuda")
        ev = [torch.cuda.Event() if self.device == "cuda" else None for _ in range(2)]
        self.run_step()
        for k in range(1, max_tokens):
            host[k % 2].copy_(self.tok_out[0], non_blocking=True)
            if ev[0] is not None:
                ev[k % 2].record()
            if k + 1 < max_tokens:
                self.run_step()
            if ev[0] is not None:
                ev[k % 2].synchronize()
            t = int(host[k % 2])
            yield t, self.tok.decode([t])


def make_handler(engine, name):
    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # Each SSE event is one small write: with Nagle's algorithm on, a write waits for the
        # ACK of the one before, which the client delays (up to 40 ms on Linux), which held
        # the first version of this server to ~12 tokens/s and put ~44 ms into every request
        # latency (the headers and the body of `GET /v1/models` are two writes).
        disable_nagle_algorithm = True

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
                try:
                    gen = engine.generate(prompt, max_tokens)
                    n_prompt = next(gen)
                except ValueError as e:
                    return self.send_json(400, {"error": {"message": str(e)}})
                if not body.get("stream"):
                    text = "".join(t for _, t in gen)
                    choice = {"index": 0, "finish_reason": "length"}
                    if chat:
                        choice["message"] = {"role": "assistant", "content": text}
                    else:
                        choice["text"] = text
                    return self.send_json(200, {"id": rid, "choices": [choice], "usage": {"prompt_tokens": n_prompt, "completion_tokens": max_tokens, "total_tokens": n_prompt + max_tokens}})
                # Chunked transfer encoding, so the connection outlives the stream (a client's
                # pool reuses it, as with a real engine's server).
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Cache-Control", "no-cache")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()

                def send(obj):
                    d = b"data: " + json.dumps(obj).encode() + b"\n\n"
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(d), d))

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
                d = b"data: [DONE]\n\n"
                self.wfile.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(d), d))

    return H


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--out", required=True)
    ap.add_argument("--words", required=True)
    ap.add_argument("--model-name", default="qwen3-0.6b-random")
    ap.add_argument("--max-len", type=int, default=8192, help="KV cache positions (prompt + generated)")
    ap.add_argument("--layers", type=int, default=28, help="fewer for a quick check on a CPU")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--no-graphs", action="store_true", help="decode eagerly instead of one CUDA graph per step")
    ap.add_argument("--cudnn-attention", action="store_true",
                    help="let PyTorch pick cuDNN's attention (a plan per prompt length; off by default)")
    a = ap.parse_args()
    # Inference only: no autograd bookkeeping anywhere, the CUDA graph capture included.
    torch.set_grad_enabled(False)
    if not a.cudnn_attention:
        # cuDNN's attention builds an execution plan for every new prompt length (tens of ms
        # the first time a length is seen), which made the prefill time depend on whether the
        # same length came before: the prefill uses flash or memory-efficient attention, which
        # have no such plans. The decode step keeps cuDNN: its one shape is planned at capture.
        PREFILL_ATTENTION[:] = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
    tok, allowed = build_tokenizer(a.words, a.out)
    engine = Engine(tok, allowed, a.device, max_len=a.max_len, layers=a.layers, graphs=not a.no_graphs)
    # One throwaway generation loads the CUDA kernels before anyone measures.
    list(engine.generate("<|im_start|>user\nHello.<|im_end|>\n", 4))
    t0 = time.perf_counter()
    n = sum(1 for _ in engine.generate("<|im_start|>user\nHello there.<|im_end|>\n", 257 if a.device == "cuda" else 3)) - 1
    dt = time.perf_counter() - t0
    srv = ThreadingHTTPServer(("127.0.0.1", a.port), make_handler(engine, a.model_name))
    print(f"serving {a.model_name} on 127.0.0.1:{a.port} ({len(allowed)} sampled tokens, "
          f"{'one CUDA graph per decode step' if engine.graph is not None else 'eager decode'}, "
          f"{n} tokens generated in {dt * 1e3:.1f} ms in-process: {n / dt:.0f} tokens/s)", flush=True)
    srv.serve_forever()


if __name__ == "__main__":
    main()
