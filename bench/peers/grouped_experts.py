"""The torch peer's mixture-of-experts layers: transformers' Qwen3-MoE-style experts (weights
[E, 2I, H] and [E, H, I]) through torch's grouped GEMM in the autocast dtype. transformers' own
grouped_mm experts cast the tokens to the weights' dtype, which under fp32 master weights and
bf16 autocast (so_train's mixed precision) runs the experts in fp32; here the weights are cast to
bf16 per forward, as autocast does for every nn.Linear. The CPU has no grouped GEMM backward in
torch: there each expert runs its own GEMMs (the dry run's tiny shapes only)."""
import torch

NAME = "peer_grouped_mm_autocast"


def _grouped_mm(x, w, offs):
    if x.device.type == "cuda":
        if hasattr(torch.nn.functional, "grouped_mm"):
            return torch.nn.functional.grouped_mm(x, w, offs=offs)
        return torch._grouped_mm(x, w, offs=offs)
    ends = offs.tolist()
    starts = [0] + ends[:-1]
    return torch.cat([x[s:e] @ w[i] for i, (s, e) in enumerate(zip(starts, ends))])


def grouped_experts_forward(self, hidden_states, top_k_index, top_k_weights):
    device = hidden_states.device.type
    dt = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else self.gate_up_proj.dtype
    k = top_k_index.size(-1)
    expert, order = torch.sort(top_k_index.reshape(-1))
    token = order // k
    # Tokens per expert without a host round trip (histc; CUDA takes integers, the CPU floats).
    counts = torch.histc(expert.int() if device == "cuda" else expert.float(), bins=self.num_experts, min=0,
                         max=self.num_experts - 1)
    offs = torch.cumsum(counts, dim=0, dtype=torch.int32)
    gate, up = _grouped_mm(hidden_states[token].to(dt), self.gate_up_proj.to(dt).transpose(-2, -1), offs).chunk(2, -1)
    out = _grouped_mm(self.act_fn(gate) * up, self.down_proj.to(dt).transpose(-2, -1), offs)
    out = out * top_k_weights.reshape(-1)[order, None].to(dt)
    return torch.zeros_like(hidden_states).index_add_(0, token, out.to(hidden_states.dtype))


def install(model_config, device):
    """Registers the experts function with transformers; returns (experts_implementation for the
    model config or None, a description for the result line). None where transformers has no
    experts interface (its own experts then run, as said)."""
    if "num_experts" not in model_config and "num_local_experts" not in model_config:
        return None, None
    try:
        from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS
    except ImportError as e:
        return None, f"transformers' own experts (no experts interface: {e})"
    ALL_EXPERTS_FUNCTIONS.register(NAME, grouped_experts_forward)
    how = "torch grouped_mm" if device.type == "cuda" else "a GEMM per expert (CPU)"
    return NAME, f"{how} in the autocast dtype"
