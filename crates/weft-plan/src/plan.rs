//! The plan: per-rank weights, KV cache and fit for one layout, and the layouts that fit
//! a cluster, ranked. Pure: a `Model` and options in, a `Plan` out.

use std::borrow::Cow;
use std::collections::HashMap;

use serde::Serialize;

use crate::PlanError;
use crate::arch::{Arch, Family, LayerKind};
use crate::rules::{self, Expert, Note, Split, Stage};
use crate::speed::{self, Hardware, Prediction};
use crate::tensor::Tensor;

/// How the tensors are named, which decides the rules that apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Format {
    Safetensors,
    Gguf,
}

/// A model as headers and config describe it.
#[derive(Debug, Clone)]
pub struct Model {
    /// What the user named: a path or a repo id.
    pub source: String,
    pub arch: Arch,
    pub tensors: Vec<Tensor>,
    pub format: Format,
    pub warnings: Vec<String>,
}

/// The inference engine whose rules and overhead apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Engine {
    Vllm,
    Sglang,
    LlamaCpp,
}

impl Engine {
    pub fn name(&self) -> &'static str {
        match self {
            Engine::Vllm => "vllm",
            Engine::Sglang => "sglang",
            Engine::LlamaCpp => "llama.cpp",
        }
    }
    pub fn parse(s: &str) -> Option<Engine> {
        match s {
            "vllm" => Some(Engine::Vllm),
            "sglang" => Some(Engine::Sglang),
            "llama.cpp" | "llamacpp" | "llama-cpp" => Some(Engine::LlamaCpp),
            _ => None,
        }
    }
}

/// The KV cache's element type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum KvDtype {
    /// The model's own dtype (vLLM's `--kv-cache-dtype auto`).
    Auto,
    Fp8,
    Bf16,
}

/// The parallel layout: tensor, pipeline and data parallel sizes; expert parallelism on
/// or off (when on, experts are spread over EP = TP x DP ranks).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Layout {
    pub tp: u64,
    pub pp: u64,
    pub ep: bool,
    pub dp: u64,
}

impl Layout {
    pub fn world(&self) -> u64 {
        self.tp * self.pp * self.dp
    }
    pub fn ep_size(&self) -> u64 {
        if self.ep { self.tp * self.dp } else { 1 }
    }
}

/// The machines: identical nodes with identical GPUs.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Cluster {
    pub nodes: u64,
    pub gpus_per_node: u64,
    pub gpu_memory_bytes: u64,
}

/// What the engine will be asked for.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Options {
    pub engine: Engine,
    pub gpu_memory_utilization: f64,
    pub kv_dtype: KvDtype,
    /// Context length the engine must hold for one sequence; default the config's
    /// `max_position_embeddings`.
    pub max_model_len: Option<u64>,
    pub max_num_seqs: u64,
    /// Runtime memory per GPU besides weights and KV cache; default the engine's figure.
    pub overhead_bytes: Option<u64>,
    /// Device and link figures: with them every plan carries a speed prediction and
    /// layouts are ranked by it.
    pub hardware: Option<Hardware>,
    /// Nodes that differ ([`crate::uneven`]): each node's GPU memory (replacing the
    /// cluster's), and the decoder layers of each pipeline stage (replacing the engine's
    /// even split).
    pub node_memory_bytes: Option<Vec<u64>>,
    pub pp_partition: Option<Vec<u64>>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            engine: Engine::Vllm,
            gpu_memory_utilization: 0.9,
            kv_dtype: KvDtype::Auto,
            max_model_len: None,
            max_num_seqs: 1,
            overhead_bytes: None,
            hardware: None,
            node_memory_bytes: None,
            pp_partition: None,
        }
    }
}

const GIB: u64 = 1 << 30;

/// The engine's runtime memory per GPU besides weights and KV cache (activations, CUDA
/// graphs, NCCL and allocator), and where the figure comes from.
pub fn default_overhead(engine: Engine) -> (u64, &'static str) {
    match engine {
        // 5.5 GiB per GPU measured on a large model, against the flat 2.3 GiB KAITO had
        // assumed; CUDA graphs alone 1.5-1.9 GiB (kaito-project/kaito PR #2139).
        Engine::Vllm => (
            11 * GIB / 2,
            "vLLM: ~5.5 GiB/GPU measured on a large model (kaito-project/kaito PR #2139); pass --overhead to use your own",
        ),
        Engine::Sglang => (
            11 * GIB / 2,
            "SGLang: vLLM's 5.5 GiB/GPU figure (kaito-project/kaito PR #2139) assumed, no SGLang figure checked; pass --overhead",
        ),
        Engine::LlamaCpp => (
            GIB,
            "llama.cpp: 1 GiB compute buffer assumed, no published figure checked; pass --overhead",
        ),
    }
}

/// vLLM allocates the KV cache in blocks of 16 tokens (the default `--block-size`).
pub const KV_BLOCK_TOKENS: u64 = 16;

#[derive(Debug, Clone, Serialize)]
pub struct RankPlan {
    pub rank: u64,
    pub node: u64,
    pub tp_rank: u64,
    pub pp_stage: u64,
    pub dp_rank: u64,
    pub ep_rank: Option<u64>,
    /// Decoder layers [start, end) of this rank's stage.
    pub layers: [u64; 2],
    pub weights_bytes: u64,
    /// Of `weights_bytes`, the routed experts' (a decoded token reads its top-k of them).
    pub expert_bytes: u64,
    /// Of `weights_bytes`, the input embedding's when it is not also the LM head here (a
    /// token reads one row of it).
    pub lookup_bytes: u64,
    /// KV bytes one token takes on this rank, counting every attention layer of its stage
    /// (what vLLM divides by when it logs "GPU KV cache size: N tokens").
    pub kv_bytes_per_token: u64,
    /// Tokens of KV cache that fit after weights and overhead, in whole 16-token blocks.
    pub kv_tokens: u64,
    /// The longest sequence each of `max_num_seqs` sequences can hold (sliding-window
    /// layers keep only their window).
    pub max_context_per_seq: u64,
    /// Memory left after weights, overhead and one sequence of `max_model_len` tokens;
    /// negative when short.
    pub headroom_bytes: i64,
    pub fits: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct NodePlan {
    pub node: u64,
    pub gpus: u64,
    pub memory_bytes: u64,
    pub weights_bytes: u64,
    /// The least KV capacity of its ranks.
    pub kv_tokens: u64,
    pub headroom_bytes: i64,
    pub fits: bool,
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Flagged {
    /// The tensor name, with layer and expert numbers written `*` when many share a rule.
    pub tensor: String,
    pub why: String,
    pub count: u64,
}

/// A simple per-generated-token communication estimate (one sequence, decode).
#[derive(Debug, Clone, Copy, Serialize, Default)]
pub struct Comm {
    /// Bytes each rank sends for TP all-reduces: 2 per layer of hidden x 2 bytes, ring
    /// traffic 2(tp-1)/tp.
    pub tp_allreduce_bytes_per_token: u64,
    /// Bytes crossing PP stage boundaries: hidden states and residual, hidden x 2 bytes each.
    pub pp_bytes_per_token: u64,
    /// Bytes of MoE all-to-all per rank: top-k x hidden x 2 bytes, dispatch and combine.
    pub ep_bytes_per_token: u64,
    /// Of all the above, what crosses between nodes.
    pub internode_bytes_per_token: u64,
    /// Collectives per token that cross between nodes (each pays the link's latency).
    pub internode_collectives_per_token: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Plan {
    pub model: String,
    pub architecture: String,
    pub family: Family,
    pub format: Format,
    pub quantization: String,
    pub engine: Engine,
    pub layout: Layout,
    pub ep_size: u64,
    pub cluster: Cluster,
    pub gpu_memory_utilization: f64,
    pub overhead_bytes: u64,
    pub overhead_source: String,
    pub kv_dtype: KvDtype,
    pub kv_bytes_per_element: u64,
    pub max_model_len: u64,
    pub max_num_seqs: u64,
    pub checkpoint_bytes: u64,
    pub tensors: u64,
    pub ranks: Vec<RankPlan>,
    pub nodes: Vec<NodePlan>,
    pub fits: bool,
    /// When one sequence of `max_model_len` does not fit but the weights do: the longest
    /// `--max-model-len` that fits, in whole KV blocks.
    pub fits_up_to: Option<u64>,
    /// When `max_model_len` was not asked for and the config's default did not fit: that
    /// default; the plan is then for the longest context that fits.
    pub shortened_from: Option<u64>,
    pub comm: Comm,
    /// One sequence's decode and prompt speed, when device figures were given.
    pub speed: Option<Prediction>,
    /// Layers per pipeline stage when they were split unevenly (nodes that differ,
    /// [`crate::uneven`]); vLLM's `VLLM_PP_LAYER_PARTITION`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pp_layer_partition: Option<Vec<u64>>,
    pub replicated: Vec<Flagged>,
    pub uneven: Vec<Flagged>,
    pub skipped: Vec<Flagged>,
    pub warnings: Vec<String>,
}

fn refuse(rule: &str, detail: String) -> PlanError {
    PlanError::Layout {
        rule: rule.to_string(),
        detail,
    }
}

/// Checks the layout against the engine's rules; an error names the rule it breaks.
pub fn check_layout(
    arch: &Arch,
    layout: &Layout,
    cluster: &Cluster,
    opts: &Options,
) -> Result<(), PlanError> {
    let Layout { tp, pp, dp, .. } = *layout;
    if tp == 0 || pp == 0 || dp == 0 {
        return Err(refuse(
            "sizes are positive",
            format!("tp={tp} pp={pp} dp={dp}"),
        ));
    }
    let gpus = cluster.nodes * cluster.gpus_per_node;
    if layout.world() > gpus {
        return Err(refuse(
            "tp x pp x dp GPUs are needed",
            format!(
                "tp={tp} x pp={pp} x dp={dp} = {} ranks, but the cluster has {gpus} GPUs ({} nodes x {})",
                layout.world(),
                cluster.nodes,
                cluster.gpus_per_node
            ),
        ));
    }
    if let Some(part) = &opts.pp_partition
        && (part.len() as u64 != pp || part.iter().sum::<u64>() != arch.layers || part.contains(&0))
    {
        return Err(refuse(
            "a pipeline partition gives every stage at least one layer, and all layers",
            format!("{part:?} for pp={pp} and {} layers", arch.layers),
        ));
    }
    if opts.engine == Engine::LlamaCpp && tp > 1 {
        return Err(refuse(
            "llama.cpp splits layers, not tensors",
            format!("tp={tp}: plan llama.cpp with --pp (one stage per GPU)"),
        ));
    }
    if !arch.heads.is_multiple_of(tp) {
        return Err(refuse(
            "attention heads must be divisible by tp (vLLM: \"Total number of attention heads must be divisible by tensor parallel size\")",
            format!("{} heads, tp={tp}", arch.heads),
        ));
    }
    if arch.mla.is_none() {
        let kv = arch.kv_heads;
        if tp >= kv && tp % kv != 0 {
            return Err(refuse(
                "when tp >= KV heads, tp must be a multiple of the KV heads (vLLM QKVParallelLinear)",
                format!("{kv} KV heads, tp={tp}"),
            ));
        }
        if tp < kv && !kv.is_multiple_of(tp) {
            return Err(refuse(
                "KV heads must be divisible by tp (vLLM QKVParallelLinear)",
                format!("{kv} KV heads, tp={tp}"),
            ));
        }
    }
    if let Some(la) = arch.linear {
        for (what, n) in [
            ("linear_num_key_heads", la.key_heads),
            ("linear_num_value_heads", la.value_heads),
        ] {
            if !n.is_multiple_of(tp) {
                return Err(refuse(
                    "Gated DeltaNet heads must divide by tp (vLLM divide() in qwen3_next.py)",
                    format!("{what} {n}, tp={tp}"),
                ));
            }
        }
    }
    if pp > arch.layers {
        return Err(refuse(
            "each pipeline stage needs at least one layer",
            format!("{} layers, pp={pp}", arch.layers),
        ));
    }
    let padded = arch.vocab.div_ceil(rules::VOCAB_PADDING) * rules::VOCAB_PADDING;
    if !padded.is_multiple_of(tp) {
        return Err(refuse(
            "the padded vocabulary must divide by tp (vLLM VocabParallelEmbedding)",
            format!("vocab {} padded to {padded}, tp={tp}", arch.vocab),
        ));
    }
    let moe_tp = if layout.ep { 1 } else { tp };
    if arch.experts > 0 && !arch.moe_intermediate.is_multiple_of(moe_tp) {
        return Err(refuse(
            "moe_intermediate_size must divide by tp when experts are split by TP",
            format!(
                "moe_intermediate_size {}, tp={tp}; try --ep",
                arch.moe_intermediate
            ),
        ));
    }
    if arch.experts == 0 && layout.ep {
        return Err(refuse(
            "--ep needs a mixture-of-experts model",
            format!("{} has no routed experts", arch.name),
        ));
    }
    if !arch.intermediate.is_multiple_of(tp) && arch.experts == 0 {
        return Err(refuse(
            "intermediate_size must divide by tp (column-parallel gate/up)",
            format!("intermediate_size {}, tp={tp}", arch.intermediate),
        ));
    }
    if let Err((rule, detail)) =
        rules::quant_rule(arch, moe_tp.max(if arch.experts > 0 { 1 } else { tp }))
    {
        return Err(refuse(&rule, detail));
    }
    if !(0.0..=1.0).contains(&opts.gpu_memory_utilization) || opts.gpu_memory_utilization == 0.0 {
        return Err(refuse(
            "gpu-memory-utilization is in (0, 1]",
            format!("{}", opts.gpu_memory_utilization),
        ));
    }
    if opts.max_num_seqs == 0 {
        return Err(refuse("max-num-seqs is at least 1", "0".into()));
    }
    if let Some(hw) = &opts.hardware {
        hw.check().map_err(|e| {
            refuse(
                "device and link figures are positive numbers",
                e.to_string(),
            )
        })?;
    }
    Ok(())
}

/// Flags grouped by why and by name pattern (numbers in a name become `*`), counted.
/// Built without an allocation per tensor: a pattern or a reason is copied only the first
/// time it is seen.
#[derive(Default)]
struct Flags {
    by_why: HashMap<Cow<'static, str>, HashMap<String, u64>>,
    buf: String,
}

impl Flags {
    // A `&Cow`, not a `&str`: a borrowed reason is kept without a copy.
    #[allow(clippy::ptr_arg)]
    fn add(&mut self, name: &str, why: &Cow<'static, str>) {
        self.buf.clear();
        for (i, part) in name.split('.').enumerate() {
            if i > 0 {
                self.buf.push('.');
            }
            let number = part.as_bytes().first().is_some_and(u8::is_ascii_digit)
                && part.parse::<u64>().is_ok();
            self.buf.push_str(if number { "*" } else { part });
        }
        let bump = |m: &mut HashMap<String, u64>, pat: &str| match m.get_mut(pat) {
            Some(c) => *c += 1,
            None => {
                m.insert(pat.to_string(), 1);
            }
        };
        match self.by_why.get_mut(why.as_ref()) {
            Some(m) => bump(m, &self.buf),
            None => {
                let mut m = HashMap::new();
                bump(&mut m, &self.buf);
                self.by_why.insert(why.clone(), m);
            }
        }
    }

    /// Sorted by pattern, then why.
    fn into_list(self) -> Vec<Flagged> {
        let mut out: Vec<Flagged> = self
            .by_why
            .into_iter()
            .flat_map(|(why, m)| {
                m.into_iter().map(move |(tensor, count)| Flagged {
                    tensor,
                    why: why.to_string(),
                    count,
                })
            })
            .collect();
        out.sort_by(|a, b| a.tensor.cmp(&b.tensor).then_with(|| a.why.cmp(&b.why)));
        out
    }
}

/// Per layer KV bytes per token on one TP rank.
pub(crate) fn kv_layer_bytes(arch: &Arch, tp: u64, elt: u64) -> u64 {
    match arch.mla {
        // MLA caches the compressed latent and the shared RoPE key, K only, and vLLM keeps
        // it whole on every TP rank (kaito-project/kaito PR #2139; TensorRT-LLM PR #16707).
        Some((rank, rope)) => (rank + rope) * elt,
        None => (arch.kv_heads / tp).max(1) * (arch.head_dim + arch.v_head_dim) * elt,
    }
}

/// Plans one layout. Without `--max-model-len`, a model whose default context (the
/// config's `max_position_embeddings`) does not fit but whose weights do is planned at the
/// longest context that fits, and says so (`shortened_from`, first warning): that is the
/// length the engine must then be given.
pub fn plan(
    model: &Model,
    layout: Layout,
    cluster: Cluster,
    opts: &Options,
) -> Result<Plan, PlanError> {
    let p = plan_at(model, layout, cluster, opts)?;
    let Some(n) = p
        .fits_up_to
        .filter(|_| opts.max_model_len.is_none() && !p.fits)
    else {
        return Ok(p);
    };
    let shorter = Options {
        max_model_len: Some(n),
        ..opts.clone()
    };
    let mut q = plan_at(model, layout, cluster, &shorter)?;
    if !q.fits {
        return Ok(p);
    }
    q.shortened_from = Some(p.max_model_len);
    q.warnings.retain(|w| !w.starts_with("the weights fit but"));
    q.warnings.insert(
        0,
        format!(
            "fits at up to {n} tokens: the config's context of {} tokens does not fit, so the plan is for --max-model-len {n}",
            p.max_model_len
        ),
    );
    Ok(q)
}

/// Rounds a token count up to whole KV blocks: vLLM reserves a sequence's cache in blocks
/// (`cdiv(max_model_len, block_size)` blocks in its startup check).
fn in_blocks(n: u64) -> u64 {
    n.div_ceil(KV_BLOCK_TOKENS) * KV_BLOCK_TOKENS
}

fn plan_at(
    model: &Model,
    layout: Layout,
    cluster: Cluster,
    opts: &Options,
) -> Result<Plan, PlanError> {
    let arch = &model.arch;
    check_layout(arch, &layout, &cluster, opts)?;
    if model.format == Format::Gguf && opts.engine != Engine::LlamaCpp {
        return Err(refuse(
            "a GGUF file is planned for llama.cpp",
            "pass --engine llama.cpp".into(),
        ));
    }
    if model.format == Format::Safetensors && opts.engine == Engine::LlamaCpp {
        return Err(refuse(
            "llama.cpp loads GGUF files",
            "plan the GGUF file of this model, or --engine vllm".into(),
        ));
    }
    let Layout { tp, pp, dp, .. } = layout;
    let mut warnings = model.warnings.clone();
    warnings.extend(arch.assumed.iter().map(|a| format!("assumed: {a}")));
    if !rules::known(arch) {
        warnings.push(format!(
            "architecture {} is not one weft plan knows; placement follows the tensor-name rules only",
            arch.name
        ));
    }
    if opts.engine == Engine::Sglang {
        warnings.push(
            "SGLang: vLLM's sharding rules are applied; SGLang's differences are not modelled"
                .into(),
        );
    }
    if layout.world() < cluster.nodes * cluster.gpus_per_node {
        warnings.push(format!(
            "{} of {} GPUs are used",
            layout.world(),
            cluster.nodes * cluster.gpus_per_node
        ));
    }
    let (def_overhead, def_src) = default_overhead(opts.engine);
    let (overhead, overhead_source) = match opts.overhead_bytes {
        Some(b) => (b, "--overhead".to_string()),
        None => (def_overhead, def_src.to_string()),
    };
    let kv_elt = match opts.kv_dtype {
        KvDtype::Auto => arch.dtype_bytes,
        KvDtype::Fp8 => 1,
        KvDtype::Bf16 => 2,
    };
    let max_model_len = opts.max_model_len.unwrap_or(arch.max_position);
    let linear_layers = arch
        .layer_kinds
        .iter()
        .filter(|k| **k == LayerKind::Linear)
        .count() as u64;
    if let (Some(la), true) = (arch.linear, linear_layers > 0) {
        // vLLM's MambaStateShapeCalculator.gated_delta_net_state_shape: a conv state of
        // (2 key_dim + value_dim)/tp x (kernel - 1) and a recurrent state of
        // value_heads/tp x key_head_dim x value_head_dim, per layer and sequence.
        let conv = (2 * la.key_heads * la.key_head_dim + la.value_heads * la.value_head_dim) / tp
            * la.conv_kernel.saturating_sub(1);
        let ssm = la.value_heads / tp * la.key_head_dim * la.value_head_dim;
        let per_seq = linear_layers * (conv + ssm) * arch.dtype_bytes;
        warnings.push(format!(
            "{linear_layers} Gated DeltaNet layers keep no KV cache per token but a fixed state of {per_seq} bytes per sequence on each TP rank (in the model's dtype); it is not counted in KV bytes per token or in the headroom"
        ));
    }

    // Decoder layers of each stage, as the engine splits them.
    let llama_cpp = opts.engine == Engine::LlamaCpp;
    let stage_layers: Vec<(u64, u64)> = (0..pp)
        .map(|s| {
            if let Some(part) = &opts.pp_partition {
                let start: u64 = part[..s as usize].iter().sum();
                (start, start + part[s as usize])
            } else if llama_cpp {
                llama_cpp_layers(arch.layers, pp, s)
            } else {
                rules::pp_layers(arch.layers, pp, s)
            }
        })
        .collect();
    let mut stage_of_layer = vec![0u64; arch.layers as usize];
    for (s, (l0, l1)) in stage_layers.iter().enumerate() {
        for l in *l0..*l1 {
            stage_of_layer[l as usize] = s as u64;
        }
    }

    // One pass over the tensors for every rank: place each tensor, flag it, and add its
    // bytes where they live. What every TP rank of a stage holds alike (most tensors) is
    // summed once per stage; uneven splits per (stage, TP rank); routed experts under
    // expert parallelism per (DP replica, stage, TP rank), as vLLM numbers EP ranks
    // (ep_rank = dp_rank x tp + tp_rank).
    let ep_size = layout.ep_size();
    let mut stage_all = vec![0u64; pp as usize];
    let mut stage_rank = vec![0u64; (pp * tp) as usize];
    // Of those: routed experts (a decoded token reads top-k of them) and the input
    // embedding (a token reads one row of it), for the speed model.
    let (mut exp_all, mut exp_rank) = (vec![0u64; pp as usize], vec![0u64; (pp * tp) as usize]);
    let (mut lookup_all, mut lookup_rank) =
        (vec![0u64; pp as usize], vec![0u64; (pp * tp) as usize]);
    let mut ep_acc = vec![
        0u64;
        if layout.ep {
            (dp * pp * tp) as usize
        } else {
            0
        }
    ];
    let mut replicated = Flags::default();
    let mut uneven = Flags::default();
    let mut skipped = Flags::default();
    let skip_why: Cow<'static, str> = Cow::Owned(format!(
        "layer index >= num_hidden_layers ({}): a multi-token-prediction layer, not loaded without speculative decoding",
        arch.layers
    ));
    let mtp_why: Cow<'static, str> = Cow::Borrowed(
        "multi-token-prediction module (mtp.*): not loaded without speculative decoding",
    );
    let host_why: Cow<'static, str> =
        Cow::Borrowed("llama.cpp keeps the input embeddings in host memory");
    let kv_why = |kv: u64| -> Cow<'static, str> {
        Cow::Owned(format!(
            "KV heads replicated: {kv} KV heads over tp={tp}, each head on {} ranks (vLLM: num_kv_heads = max(1, kv/tp))",
            tp / kv.max(1)
        ))
    };
    let kv_why_arch = kv_why(arch.kv_heads);
    let ep_why: Cow<'static, str> = Cow::Owned(format!(
        "{} experts over EP={ep_size}: the first {} ranks hold one more",
        arch.experts,
        arch.experts % ep_size.max(1)
    ));
    let ep_uneven = layout.ep && !arch.experts.is_multiple_of(ep_size);
    let mut has_lm_head = false;
    // The input embedding (the first vocab-parallel tensor of the first stage), for a
    // tied LM head on the last stage.
    let mut embed: Option<(&Tensor, Split, u64)> = None;
    for t in &model.tensors {
        let p = match model.format {
            Format::Safetensors => rules::place_hf(t, arch, tp),
            Format::Gguf => rules::place_gguf(t, arch),
        };
        let b = rules::loaded_bytes(t, arch.dtype_bytes);
        if t.name == "lm_head.weight" || t.name == "output.weight" {
            has_lm_head = true;
        }
        match &p.note {
            Some(Note::Replicated(why)) => replicated.add(&t.name, why),
            Some(Note::Uneven(why)) => uneven.add(&t.name, why),
            None => {}
        }
        let stage = match p.stage {
            Stage::Layer(l) => stage_of_layer.get(l as usize).copied(),
            Stage::First => Some(0),
            Stage::Last => Some(pp - 1),
            Stage::Skip => {
                let why = if t.name.starts_with("mtp.") {
                    &mtp_why
                } else {
                    &skip_why
                };
                skipped.add(&t.name, why);
                None
            }
            Stage::Host => {
                skipped.add(&t.name, &host_why);
                None
            }
        };
        if tp > 1 {
            match &p.split {
                Split::KvHeads { kv } | Split::Qkv { kv, .. } if tp > *kv => {
                    if *kv == arch.kv_heads {
                        replicated.add(&t.name, &kv_why_arch);
                    } else {
                        replicated.add(&t.name, &kv_why(*kv));
                    }
                }
                Split::Dim(d) if t.shape.get(*d).is_some_and(|n| n % tp != 0) => uneven.add(
                    &t.name,
                    &Cow::Owned(format!(
                        "dimension {d} of {} does not divide by tp={tp}",
                        t.shape[*d]
                    )),
                ),
                _ => {}
            }
        }
        if ep_uneven && p.expert.is_some() {
            uneven.add(&t.name, &ep_why);
        }
        if embed.is_none() && matches!(p.split, Split::Vocab(_)) && p.stage == Stage::First {
            embed = Some((t, p.split.clone(), b));
        }
        let Some(s) = stage else { continue };
        match p.expert {
            Some(e) if layout.ep => match e {
                Expert::One(i) => {
                    let owner = rules::ep_owner(arch.experts, ep_size, i);
                    if owner < ep_size {
                        let (d, r) = (owner / tp, owner % tp);
                        ep_acc[((d * pp + s) * tp + r) as usize] += b;
                    }
                }
                Expert::Fused => {
                    for owner in 0..ep_size {
                        let (d, r) = (owner / tp, owner % tp);
                        ep_acc[((d * pp + s) * tp + r) as usize] +=
                            rules::ep_rank_bytes(t, b, e, arch.experts, ep_size, owner);
                    }
                }
            },
            _ => {
                let lookup = embed.as_ref().is_some_and(|(e, _, _)| std::ptr::eq(*e, t));
                if rules::uniform(t, &p.split, tp) {
                    let x = rules::rank_bytes(t, b, &p.split, tp, 0);
                    stage_all[s as usize] += x;
                    if p.expert.is_some() {
                        exp_all[s as usize] += x;
                    }
                    if lookup {
                        lookup_all[s as usize] += x;
                    }
                } else {
                    for r in 0..tp {
                        let x = rules::rank_bytes(t, b, &p.split, tp, r);
                        let i = (s * tp + r) as usize;
                        stage_rank[i] += x;
                        if p.expert.is_some() {
                            exp_rank[i] += x;
                        }
                        if lookup {
                            lookup_rank[i] += x;
                        }
                    }
                }
            }
        }
    }
    let tied_head = arch.tied && pp > 1 && !has_lm_head;
    if tied_head && let Some((t, _, _)) = embed {
        replicated.add(
            "lm_head.weight",
            &Cow::Owned(format!(
                "tied embeddings with pp={pp}: the last stage holds its own copy of {} for the LM head",
                t.name
            )),
        );
    }
    if tied_head
        && !llama_cpp
        && let Some((t, split, b)) = &embed
    {
        // Vocab-parallel: the same on every TP rank.
        stage_all[(pp - 1) as usize] += rules::rank_bytes(t, *b, split, tp, 0);
    }
    if pp > 1 && !arch.layers.is_multiple_of(pp) {
        uneven.add(
            "model.layers",
            &Cow::Owned(format!(
                "{} layers over pp={pp}: stages hold {:?} layers (vLLM get_pp_indices)",
                arch.layers,
                (0..pp)
                    .map(|s| {
                        let (a, b) = rules::pp_layers(arch.layers, pp, s);
                        b - a
                    })
                    .collect::<Vec<_>>()
            )),
        );
    }

    // Per-rank accounting. Ranks are numbered as vLLM numbers them: dp outermost, then
    // pp, then tp.
    let per_node = cluster.gpus_per_node;
    let memory_of = |node: u64| {
        opts.node_memory_bytes
            .as_ref()
            .and_then(|m| m.get(node as usize).copied())
            .unwrap_or(cluster.gpu_memory_bytes)
    };
    let budget_of = |node: u64| (memory_of(node) as f64 * opts.gpu_memory_utilization) as u64;
    let layer_b = kv_layer_bytes(arch, tp, kv_elt);
    let mut ranks = Vec::with_capacity(layout.world() as usize);
    for d in 0..dp {
        for s in 0..pp {
            let (l0, l1) = stage_layers[s as usize];
            for r in 0..tp {
                let rank = (d * pp + s) * tp + r;
                let ep_rank = layout.ep.then_some(d * tp + r);
                let ep_bytes = if layout.ep {
                    ep_acc[((d * pp + s) * tp + r) as usize]
                } else {
                    0
                };
                let weights = stage_all[s as usize] + stage_rank[(s * tp + r) as usize] + ep_bytes;
                let expert_bytes = exp_all[s as usize] + exp_rank[(s * tp + r) as usize] + ep_bytes;
                // A tied embedding that is also this stage's LM head is read whole.
                let lookup_bytes = if arch.tied && pp == 1 {
                    0
                } else {
                    lookup_all[s as usize] + lookup_rank[(s * tp + r) as usize]
                };
                let mut full_b = 0u64;
                let mut swa: Vec<(u64, u64)> = Vec::new();
                for l in l0..l1 {
                    match arch
                        .layer_kinds
                        .get(l as usize)
                        .copied()
                        .unwrap_or(LayerKind::Full)
                    {
                        LayerKind::Full => full_b += layer_b,
                        LayerKind::Sliding { window } => swa.push((layer_b, window)),
                        LayerKind::Linear => {}
                    }
                }
                let kv_per_token = full_b + swa.iter().map(|x| x.0).sum::<u64>();
                let budget = budget_of(rank / per_node);
                let avail = budget as i128 - weights as i128 - overhead as i128;
                let kv_tokens = if avail <= 0 || kv_per_token == 0 {
                    0
                } else {
                    (avail as u64 / kv_per_token) / KV_BLOCK_TOKENS * KV_BLOCK_TOKENS
                };
                let max_ctx = if avail <= 0 {
                    0
                } else {
                    max_context(
                        avail as u64 / opts.max_num_seqs,
                        full_b,
                        &swa,
                        max_model_len,
                    )
                };
                let one_seq = full_b as i128 * in_blocks(max_model_len) as i128
                    + swa
                        .iter()
                        .map(|(b, w)| *b as i128 * in_blocks((*w).min(max_model_len)) as i128)
                        .sum::<i128>();
                let headroom = (avail - one_seq).clamp(i64::MIN as i128, i64::MAX as i128) as i64;
                ranks.push(RankPlan {
                    rank,
                    node: rank / per_node,
                    tp_rank: r,
                    pp_stage: s,
                    dp_rank: d,
                    ep_rank,
                    layers: [l0, l1],
                    weights_bytes: weights,
                    expert_bytes,
                    lookup_bytes,
                    kv_bytes_per_token: kv_per_token,
                    kv_tokens,
                    max_context_per_seq: max_ctx,
                    headroom_bytes: headroom,
                    fits: headroom >= 0,
                });
            }
        }
    }
    let used_nodes = layout.world().div_ceil(per_node);
    let nodes: Vec<NodePlan> = (0..used_nodes)
        .map(|n| {
            let rs: Vec<&RankPlan> = ranks.iter().filter(|r| r.node == n).collect();
            NodePlan {
                node: n,
                gpus: per_node,
                memory_bytes: per_node * memory_of(n),
                weights_bytes: rs.iter().map(|r| r.weights_bytes).sum(),
                kv_tokens: rs.iter().map(|r| r.kv_tokens).min().unwrap_or(0),
                headroom_bytes: rs.iter().map(|r| r.headroom_bytes).min().unwrap_or(0),
                fits: rs.iter().all(|r| r.fits),
            }
        })
        .collect();
    let fits = nodes.iter().all(|n| n.fits);
    let mut fits_up_to = None;
    if !fits {
        let best = ranks
            .iter()
            .map(|r| r.max_context_per_seq)
            .min()
            .unwrap_or(0);
        if ranks
            .iter()
            .all(|r| r.weights_bytes + overhead <= budget_of(r.node))
            && best > 0
        {
            fits_up_to = Some(best);
            warnings.push(format!(
                "the weights fit but one sequence of max_model_len {max_model_len} does not: --max-model-len {best} would"
            ));
        }
    }
    let comm = comm(arch, &layout, &cluster);
    let mut plan = Plan {
        model: model.source.clone(),
        architecture: arch.name.clone(),
        family: arch.family,
        format: model.format,
        quantization: arch.quant.label(),
        engine: opts.engine,
        layout,
        ep_size: layout.ep_size(),
        cluster,
        gpu_memory_utilization: opts.gpu_memory_utilization,
        overhead_bytes: overhead,
        overhead_source,
        kv_dtype: opts.kv_dtype,
        kv_bytes_per_element: kv_elt,
        max_model_len,
        max_num_seqs: opts.max_num_seqs,
        checkpoint_bytes: model.tensors.iter().map(|t| t.bytes).sum(),
        tensors: model.tensors.len() as u64,
        ranks,
        nodes,
        fits,
        fits_up_to,
        shortened_from: None,
        comm,
        replicated: replicated.into_list(),
        uneven: uneven.into_list(),
        skipped: skipped.into_list(),
        warnings,
        speed: None,
        pp_layer_partition: opts.pp_partition.clone(),
    };
    plan.speed = opts
        .hardware
        .as_ref()
        .map(|hw| speed::predict(&plan, arch, hw));
    Ok(plan)
}

/// llama.cpp's default layer split over equal devices: contiguous, as even as it goes.
fn llama_cpp_layers(layers: u64, devices: u64, d: u64) -> (u64, u64) {
    (d * layers / devices, (d + 1) * layers / devices)
}

/// The longest sequence that fits `budget` bytes: full layers grow with it, sliding
/// layers stop at their window, each reserved in whole KV blocks (so the answer is a
/// whole number of blocks unless it is `cap`). Capped at `cap`.
fn max_context(budget: u64, full_b: u64, swa: &[(u64, u64)], cap: u64) -> u64 {
    let cost = |n: u64| -> u128 {
        u128::from(full_b) * u128::from(in_blocks(n))
            + swa
                .iter()
                .map(|(b, w)| u128::from(*b) * u128::from(in_blocks((*w).min(n))))
                .sum::<u128>()
    };
    if cost(cap) <= u128::from(budget) {
        return cap;
    }
    // cost is monotone in n: bisect.
    let (mut lo, mut hi) = (0u64, cap);
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if cost(mid) <= u128::from(budget) {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    lo
}

fn comm(arch: &Arch, layout: &Layout, cluster: &Cluster) -> Comm {
    let act = 2u64; // bf16 activations
    let h = arch.hidden;
    let g = cluster.gpus_per_node;
    let Layout { tp, pp, .. } = *layout;
    let tp_bytes = if tp > 1 {
        arch.layers * 2 * h * act * 2 * (tp - 1) / tp
    } else {
        0
    };
    let pp_bytes = (pp - 1) * 2 * h * act;
    let ep = layout.ep_size();
    let moe_layers = if arch.experts > 0 { arch.layers } else { 0 };
    let ep_bytes = if ep > 1 {
        moe_layers * 2 * arch.experts_per_token * h * act * (ep - 1) / ep
    } else {
        0
    };
    // A TP group spans nodes when it is wider than a node (ranks are tp-innermost).
    let tp_cross = tp > g;
    // Stage s and s+1 sit on different nodes when their first ranks do.
    let pp_cross = (0..pp.saturating_sub(1))
        .filter(|s| (s * tp) / g != ((s + 1) * tp) / g)
        .count() as u64;
    let ep_cross = ep > g;
    let mut inter = 0;
    let mut coll = 0;
    if tp_cross {
        inter += tp_bytes;
        coll += arch.layers * 2;
    }
    inter += pp_cross * 2 * h * act;
    coll += pp_cross;
    if ep_cross {
        inter += ep_bytes;
        coll += moe_layers * 2;
    }
    Comm {
        tp_allreduce_bytes_per_token: tp_bytes,
        pp_bytes_per_token: pp_bytes,
        ep_bytes_per_token: ep_bytes,
        internode_bytes_per_token: inter,
        internode_collectives_per_token: coll,
    }
}

/// One candidate layout of a cluster: its plan, or why the engine refuses it.
#[derive(Debug, Clone, Serialize)]
pub struct Candidate {
    pub layout: Layout,
    pub fits: bool,
    pub max_rank_weights_bytes: u64,
    pub min_kv_tokens: u64,
    pub internode_bytes_per_token: u64,
    pub internode_collectives_per_token: u64,
    /// The context planned for (shorter than the config's when that did not fit).
    pub max_model_len: u64,
    /// Predicted single-stream decode and prompt tokens/s and the term that dominates
    /// decode, when device figures were given.
    pub decode_tokens_per_s: Option<f64>,
    pub prompt_tokens_per_s: Option<f64>,
    pub dominant: Option<String>,
    pub refused: Option<String>,
}

/// Every layout that uses the whole cluster (tp x pp = GPUs, dp = 1, EP on and off for
/// MoE models), ranked: those that fit first (at the full context before those planned
/// shorter), then, with device figures, the fastest predicted single-stream decode (then
/// prompt), then the fewest collectives and bytes between nodes per token, then the most KV
/// capacity.
pub fn candidates(
    model: &Model,
    cluster: Cluster,
    opts: &Options,
) -> Vec<(Candidate, Option<Plan>)> {
    let world = cluster.nodes * cluster.gpus_per_node;
    let mut out = Vec::new();
    for tp in (1..=world).filter(|t| world.is_multiple_of(*t)) {
        let pp = world / tp;
        for ep in [false, true] {
            if ep && (model.arch.experts == 0 || tp == 1) {
                continue;
            }
            let layout = Layout { tp, pp, ep, dp: 1 };
            match plan(model, layout, cluster, opts) {
                Ok(p) => out.push((
                    Candidate {
                        layout,
                        fits: p.fits,
                        max_rank_weights_bytes: p
                            .ranks
                            .iter()
                            .map(|r| r.weights_bytes)
                            .max()
                            .unwrap_or(0),
                        min_kv_tokens: p.ranks.iter().map(|r| r.kv_tokens).min().unwrap_or(0),
                        internode_bytes_per_token: p.comm.internode_bytes_per_token,
                        internode_collectives_per_token: p.comm.internode_collectives_per_token,
                        max_model_len: p.max_model_len,
                        decode_tokens_per_s: p.speed.as_ref().map(|s| s.decode.tokens_per_s),
                        prompt_tokens_per_s: p.speed.as_ref().map(|s| s.prompt.tokens_per_s),
                        dominant: p.speed.as_ref().map(|s| s.decode.dominant.to_string()),
                        refused: None,
                    },
                    Some(p),
                )),
                Err(e) => out.push((
                    Candidate {
                        layout,
                        fits: false,
                        max_rank_weights_bytes: 0,
                        min_kv_tokens: 0,
                        internode_bytes_per_token: 0,
                        internode_collectives_per_token: 0,
                        max_model_len: 0,
                        decode_tokens_per_s: None,
                        prompt_tokens_per_s: None,
                        dominant: None,
                        refused: Some(e.to_string()),
                    },
                    None,
                )),
            }
        }
    }
    let shortened = |p: &Option<Plan>| p.as_ref().is_some_and(|p| p.shortened_from.is_some());
    let speed = |c: &Candidate| {
        (
            c.decode_tokens_per_s.unwrap_or(0.0),
            c.prompt_tokens_per_s.unwrap_or(0.0),
        )
    };
    out.sort_by(|(a, pa), (b, pb)| {
        (a.refused.is_some(), !a.fits, shortened(pa))
            .cmp(&(b.refused.is_some(), !b.fits, shortened(pb)))
            // Faster first, when predicted.
            .then(
                speed(b)
                    .partial_cmp(&speed(a))
                    .unwrap_or(std::cmp::Ordering::Equal),
            )
            .then(
                a.internode_collectives_per_token
                    .cmp(&b.internode_collectives_per_token),
            )
            .then(
                a.internode_bytes_per_token
                    .cmp(&b.internode_bytes_per_token),
            )
            .then(b.min_kv_tokens.cmp(&a.min_kv_tokens))
    });
    out
}
