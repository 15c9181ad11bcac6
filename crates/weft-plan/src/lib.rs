//! weft-plan: will a model fit on these nodes, and what will each GPU hold, before
//! anything is downloaded or loaded.
//!
//! From a model's `config.json` and its safetensors (or GGUF) headers, the planner applies
//! an inference engine's sharding rules (vLLM's first) tensor by tensor and gives, per
//! rank and per node: weight bytes, KV-cache bytes per token, KV capacity in tokens after
//! the engine's runtime overhead, whether it fits, and which tensors are replicated or
//! split unevenly, with why. With device and link figures ([`speed`]) each plan predicts one
//! sequence's decode and prompt speed with its terms, and the layouts of a cluster that fit
//! are ranked by it (else by what they send between nodes per generated token).
//!
//! The core ([`plan`], [`choose`], [`rules`], [`arch`], [`tensor`], [`speed`]) is pure: bytes
//! and values in, a plan out. [`source`] is the only module that does I/O: it reads local headers and, over
//! HTTP Range requests, the headers of a Hugging Face repository, never the weights.
//! [`synth`] writes header-only checkpoints for tests, benchmarks and the demo.
//!
//! It is not a loader, not an engine and not a profiler: the overhead of an engine is a
//! figure with its source, which a measurement can replace (`--overhead`).
//!
//! ```
//! use weft_plan::{arch, plan, synth};
//! let config = serde_json::json!({
//!     "architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "num_hidden_layers": 32,
//!     "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
//!     "intermediate_size": 14336, "max_position_embeddings": 8192, "torch_dtype": "bfloat16",
//! });
//! let arch = arch::from_config(&config).unwrap();
//! let model = plan::Model {
//!     source: "llama-3-8b".into(),
//!     tensors: synth::tensors(&arch, &config).unwrap(),
//!     arch,
//!     format: plan::Format::Safetensors,
//!     warnings: vec![],
//! };
//! let layout = plan::Layout { tp: 2, pp: 1, ep: false, dp: 1 };
//! let cluster = plan::Cluster { nodes: 2, gpus_per_node: 1, gpu_memory_bytes: 24 << 30 };
//! let p = plan::plan(&model, layout, cluster, &plan::Options::default()).unwrap();
//! // Llama-3-8B: 2 x 32 layers x 8 KV heads x 128 x 2 bytes = 131,072 B/token, halved by TP=2.
//! assert_eq!(p.ranks[0].kv_bytes_per_token, 131_072 / 2);
//! ```

#![forbid(unsafe_code)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod arch;
pub mod choose;
pub mod cluster;
pub mod plan;
pub mod rules;
pub mod source;
pub mod speed;
pub mod synth;
pub mod tensor;
pub mod uneven;

pub use plan::{Cluster, Engine, KvDtype, Layout, Model, Options, Plan};

/// Everything that can go wrong, each naming the input at fault.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// A header that is malformed, too large, or lies about its length.
    #[error("{what}: {why}")]
    Header { what: String, why: String },
    /// A config field that is missing or wrong.
    #[error("config.json field {field}: {why}")]
    Config { field: String, why: String },
    /// A layout the engine refuses: the rule it breaks and the numbers.
    #[error("layout refused: {rule}: {detail}")]
    Layout { rule: String, detail: String },
    /// A local file or directory that cannot be read as a model.
    #[error("{what}: {why}")]
    Source { what: String, why: String },
    /// An HTTP request that failed after its retries.
    #[error("{url}: {why}")]
    Http { url: String, why: String },
    /// No layout of the cluster's GPUs could be planned: every refusal, joined.
    #[error("no layout of {gpus} GPUs is possible: {why}")]
    NoLayout { gpus: u64, why: String },
    /// A device name the table does not have, and the names it has.
    #[error("--device {name:?}: one of {known}")]
    UnknownDevice { name: String, known: String },
    /// A device or link figure that is not a positive number.
    #[error("device and link figures: {0}")]
    Figures(#[from] speed::FigureError),
    /// Flags that contradict one another or name what the tables do not have (the message
    /// names the flag to change).
    #[error("{0}")]
    Flags(String),
}
