"""A minimal OpenAI-compatible server over Hugging Face transformers, for measuring a model's
speed with `weft bench llm` where no serving engine is installed (the GPU machine has PyTorch
and transformers but no vLLM, and nothing can be fetched there).

It is an engine in its own right, not a stand-in: every token is a real forward pass of the
model on the GPU (prefill of the whole prompt, then one decode step per token with the KV
cache, greedy), so its speed is what transformers' eager PyTorch gives. What it leaves out,
and says so:
  - weights are random, from a real config (the speed of a dense model does not depend on the
    values; the text it generates is meaningless);
  - the tokenizer is one token per whitespace-separated word (hashed into the vocabulary): the
    real tokenizer cannot be fetched there, and `weft bench llm` adapts its prompt to the
    server's reported `usage.prompt_tokens`, so prompts still have the asked-for token counts;
  - end-of-sequence is ignored (every request generates max_tokens);
  - one request at a time (a lock): concurrency > 1 queues.

  python3 scripts/gpu/serve_hf.py --config DIR --port 8000 [--name NAME]

Endpoints: GET /v1/models; POST /v1/completions and /v1/chat/completions, streamed (SSE,
one token per chunk, `stream_options.include_usage` honoured) or not.
"""
import argparse
import json
import threading
import time
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import torch
from transformers import AutoConfig, AutoModelForCausalLM

LOCK = threading.Lock()


def load(config_dir, device):
    cfg = AutoConfig.from_pretrained(config_dir)
    t0 = time.time()
    with torch.device(device):
        try:
            model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
        except TypeError:
            model = AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.bfloat16)
    model.eval()
    n = sum(p.numel() for p in model.parameters())
    print(f"serve_hf: {n / 1e9:.2f} B parameters on {torch.cuda.get_device_name() if device == 'cuda' else device} "
          f"in {time.time() - t0:.1f} s", flush=True)
    return cfg, model


def tokenize(text, vocab):
    """One token per word, hashed into the vocabulary (see the module's doc)."""
    return [zlib.crc32(w.encode()) % vocab for w in text.split()] or [1]


def prompt_text(body, chat):
    if not chat:
        p = body.get("prompt", "")
        return p if isinstance(p, str) else " ".join(p)
    parts = []
    for m in body.get("messages", []):
        c = m.get("content", "")
        parts.append(c if isinstance(c, str) else " ".join(x.get("text", "") for x in c))
    return " ".join(parts)


def generate(model, ids, max_tokens):
    dev = next(model.parameters()).device
    """Yields token ids: prefill, then one decode step per token."""
    with torch.inference_mode():
        x = torch.tensor([ids], device=dev)
        out = model(input_ids=x, use_cache=True, logits_to_keep=1)
        past = out.past_key_values
        nxt = out.logits[:, -1].argmax(-1)
        yield int(nxt.item())
        for _ in range(max_tokens - 1):
            out = model(input_ids=nxt[:, None], past_key_values=past, use_cache=True)
            past = out.past_key_values
            nxt = out.logits[:, -1].argmax(-1)
            yield int(nxt.item())


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"
    server_version = "serve_hf"

    def log_message(self, *a):
        pass

    def send_json(self, code, obj):
        data = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path.rstrip("/") == "/v1/models":
            self.send_json(200, {"object": "list", "data": [
                {"id": self.server.name, "object": "model", "owned_by": "serve_hf"}]})
        else:
            self.send_json(404, {"error": {"message": f"no route {self.path}"}})

    def do_POST(self):
        chat = self.path.rstrip("/") == "/v1/chat/completions"
        if not chat and self.path.rstrip("/") != "/v1/completions":
            return self.send_json(404, {"error": {"message": f"no route {self.path}"}})
        try:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
            max_tokens = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
        except (ValueError, TypeError) as e:
            return self.send_json(400, {"error": {"message": f"bad request: {e}"}})
        ids = tokenize(prompt_text(body, chat), self.server.vocab)
        usage = {"prompt_tokens": len(ids), "completion_tokens": max_tokens,
                 "total_tokens": len(ids) + max_tokens}
        kind = "chat.completion" if chat else "text_completion"
        with LOCK:
            if not body.get("stream"):
                toks = list(generate(self.server.model, ids, max_tokens))
                text = "".join(f" w{t}" for t in toks)
                choice = ({"index": 0, "message": {"role": "assistant", "content": text},
                           "finish_reason": "length"} if chat else
                          {"index": 0, "text": text, "finish_reason": "length"})
                return self.send_json(200, {"id": "x", "object": kind, "model": self.server.name,
                                            "choices": [choice], "usage": usage})
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.end_headers()
            n = 0
            for t in generate(self.server.model, ids, max_tokens):
                n += 1
                fin = "length" if n == max_tokens else None
                choice = ({"index": 0, "delta": {"content": f" w{t}"}, "finish_reason": fin}
                          if chat else {"index": 0, "text": f" w{t}", "finish_reason": fin})
                self.event({"id": "x", "object": kind + (".chunk" if chat else ""),
                            "model": self.server.name, "choices": [choice]})
            if (body.get("stream_options") or {}).get("include_usage"):
                self.event({"id": "x", "object": kind, "model": self.server.name,
                            "choices": [], "usage": usage})
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()

    def event(self, obj):
        self.wfile.write(b"data: " + json.dumps(obj).encode() + b"\n\n")
        self.wfile.flush()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", required=True, help="a directory holding config.json")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--name", default="model")
    p.add_argument("--device", default="cuda", help="cuda, or cpu to try it with a tiny config")
    a = p.parse_args()
    cfg, model = load(a.config, a.device)
    srv = ThreadingHTTPServer(("127.0.0.1", a.port), Handler)
    srv.model, srv.name, srv.vocab = model, a.name, cfg.vocab_size
    print(f"serve_hf: listening on 127.0.0.1:{a.port}", flush=True)
    srv.serve_forever()


if __name__ == "__main__":
    main()
