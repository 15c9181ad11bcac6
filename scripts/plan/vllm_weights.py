"""Run inside each vLLM worker by scripts/plan/vllm_cpu_compare.py (LLM.apply_model): the
bytes of the parameters this rank's loaded model holds. A module of its own so that the
workers, started as fresh processes, can import it."""


def param_bytes(model):
    seen, total = set(), 0
    for p in model.parameters():
        key = p.untyped_storage().data_ptr()
        if key in seen:
            continue
        seen.add(key)
        total += p.numel() * p.element_size()
    return total
