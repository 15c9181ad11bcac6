"""llama.cpp's own HTTP server (OpenAI-compatible), from the prebuilt xllamacpp wheel.

xllamacpp links llama.cpp's server (tools/server) into a Python extension; `Server(params)`
starts its HTTP listener on `params.hostnames`/`params.port` and serves until this process
ends. `cargo xtask demo` runs it for its `weft bench llm` step: a wheel from PyPI instead of
compiling llama.cpp (llama-cpp-python builds it from source: minutes on two cores).

usage: llama_server.py MODEL.gguf --port N [--alias NAME] [--ctx N]
"""

import argparse
import signal

import xllamacpp


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--alias", default="weft-tiny")
    ap.add_argument("--ctx", type=int, default=4096)
    a = ap.parse_args()
    p = xllamacpp.CommonParams()
    p.model.path = a.model
    p.n_ctx = a.ctx
    p.hostnames = ["127.0.0.1"]
    p.port = a.port
    # a set of names: a plain string would be taken as a set of its letters
    p.model_alias = {a.alias}
    p.cpuparams.n_threads = 1
    server = xllamacpp.Server(p)
    print(f"listening on {server.listening_address}", flush=True)
    signal.sigwait([signal.SIGTERM, signal.SIGINT])


if __name__ == "__main__":
    main()
