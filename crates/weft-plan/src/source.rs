//! Where models come from: a local directory, one safetensors file, a GGUF file, or a
//! Hugging Face repository read over HTTP Range requests. The only module of the crate
//! that does I/O. It reads configs and headers, never weights.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;
use weft_chain::error_chain;

use crate::PlanError;
use crate::arch;
use crate::plan::{Format, Model};
use crate::tensor::{self, GgufParse, Str, Tensor};

fn src_err(path: &Path, why: impl std::fmt::Display) -> PlanError {
    PlanError::Source {
        what: path.display().to_string(),
        why: why.to_string(),
    }
}

/// How the user named a model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelRef {
    Dir(PathBuf),
    Safetensors(PathBuf),
    Gguf(PathBuf),
    /// A Hugging Face repository id, `owner/name`.
    Repo(String),
}

/// A path that exists is local; `owner/name` otherwise is a repository id.
pub fn resolve(arg: &str) -> Result<ModelRef, PlanError> {
    let p = Path::new(arg);
    if p.is_dir() {
        return Ok(ModelRef::Dir(p.to_path_buf()));
    }
    if p.is_file() {
        return match p.extension().and_then(|e| e.to_str()) {
            Some("safetensors") => Ok(ModelRef::Safetensors(p.to_path_buf())),
            Some("gguf") => Ok(ModelRef::Gguf(p.to_path_buf())),
            _ => Err(src_err(
                p,
                "not a directory, a .safetensors or a .gguf file",
            )),
        };
    }
    let parts: Vec<&str> = arg.split('/').collect();
    let ok = |s: &str| {
        !s.is_empty()
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
            && s != "."
            && s != ".."
    };
    if parts.len() == 2 && parts.iter().all(|s| ok(s)) {
        return Ok(ModelRef::Repo(arg.to_string()));
    }
    Err(src_err(
        p,
        "no such file or directory, and not a Hugging Face repo id (owner/name)",
    ))
}

fn read_config(path: &Path) -> Result<Value, PlanError> {
    let bytes = std::fs::read(path).map_err(|e| src_err(path, e))?;
    serde_json::from_slice(&bytes).map_err(|e| src_err(path, format!("not JSON: {e}")))
}

/// Reads a safetensors file's header (never its data).
pub fn read_safetensors_header(path: &Path) -> Result<Vec<Tensor>, PlanError> {
    let what = path.display().to_string();
    let mut f = std::fs::File::open(path).map_err(|e| src_err(path, e))?;
    let size = f.metadata().map_err(|e| src_err(path, e))?.len();
    let mut len = [0u8; 8];
    f.read_exact(&mut len)
        .map_err(|e| src_err(path, format!("reading the 8-byte header length: {e}")))?;
    let n = tensor::safetensors_header_len(&len, Some(size), &what)?;
    let mut json = vec![0u8; n as usize];
    f.read_exact(&mut json)
        .map_err(|e| src_err(path, format!("reading the {n}-byte header: {e}")))?;
    tensor::parse_safetensors_header(&json, &what)
}

/// Reads the headers of `files`, spread over the machine's cores (a checkpoint of 163
/// shards is 12 MB of JSON); in the order of `files`, the first error wins.
fn read_headers(files: &[PathBuf]) -> Result<Vec<Vec<Tensor>>, PlanError> {
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .clamp(1, 8)
        .min(files.len().max(1));
    if threads <= 1 {
        return files.iter().map(|f| read_safetensors_header(f)).collect();
    }
    let per = files.len().div_ceil(threads);
    let parts: Vec<Result<Vec<Vec<Tensor>>, PlanError>> = std::thread::scope(|s| {
        let handles: Vec<_> = files
            .chunks(per)
            .map(|chunk| {
                s.spawn(move || {
                    chunk
                        .iter()
                        .map(|f| read_safetensors_header(f))
                        .collect::<Result<Vec<_>, _>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(PlanError::Source {
                        what: "header reader".into(),
                        why: "a reader thread panicked".into(),
                    })
                })
            })
            .collect()
    });
    let mut out = Vec::with_capacity(files.len());
    for p in parts {
        out.extend(p?);
    }
    Ok(out)
}

/// The safetensors files of a directory: those its index names, else every
/// `*.safetensors` in it.
fn shard_files(dir: &Path) -> Result<Vec<PathBuf>, PlanError> {
    let index = dir.join("model.safetensors.index.json");
    if index.is_file() {
        let bytes = std::fs::read(&index).map_err(|e| src_err(&index, e))?;
        return Ok(index_files(&bytes, &index.display().to_string())?
            .into_iter()
            .map(|f| dir.join(f))
            .collect());
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| src_err(dir, e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(src_err(
            dir,
            "no model.safetensors.index.json and no *.safetensors files",
        ));
    }
    Ok(files)
}

/// `model.safetensors.index.json` as far as the planner reads it: its `weight_map`, with
/// tensor and file names borrowed from the bytes (an index of 90,000 tensors is read without
/// building it as a JSON value).
#[derive(serde::Deserialize)]
struct RawIndex<'a> {
    #[serde(borrow)]
    weight_map: Option<WeightMap<'a>>,
}

struct WeightMap<'a>(Vec<(Str<'a>, Str<'a>)>);

impl<'de: 'a, 'a> serde::Deserialize<'de> for WeightMap<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = WeightMap<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an object of tensor name to shard file name")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<WeightMap<'de>, A::Error> {
                let mut out = Vec::new();
                while let Some(k) = map.next_key::<Str<'de>>()? {
                    let v = map.next_value::<Str<'de>>().map_err(|e: A::Error| {
                        serde::de::Error::custom(format!(
                            "weight_map entry {} is not a file name ({e})",
                            k.0
                        ))
                    })?;
                    out.push((k, v));
                }
                Ok(WeightMap(out))
            }
        }
        d.deserialize_map(V)
    }
}

/// The shard file names an index's `weight_map` points at, each once, sorted. `json` is
/// the index file's bytes; `what` names it in errors.
pub fn index_files(json: &[u8], what: &str) -> Result<Vec<String>, PlanError> {
    let bad = |why: String| PlanError::Header {
        what: what.to_string(),
        why,
    };
    let raw: RawIndex = serde_json::from_slice(json).map_err(|e| bad(format!("not JSON: {e}")))?;
    let map = raw
        .weight_map
        .ok_or_else(|| bad("no weight_map object".into()))?;
    let mut files: std::collections::BTreeSet<&str> = std::collections::BTreeSet::new();
    for (tensor, f) in &map.0 {
        let f = f.0.as_ref();
        if files.contains(f) {
            continue;
        }
        if f.contains('/') || f.contains("..") {
            return Err(bad(format!(
                "weight_map entry {} names {f:?}, outside the model",
                tensor.0
            )));
        }
        files.insert(f);
    }
    Ok(files.into_iter().map(str::to_string).collect())
}

/// Builds a model from a config and shard headers. `config_name` is where the config was
/// read (a path or a repo's `id/config.json`), named in an error about one of its fields.
pub fn model_from(
    source: String,
    config_name: &str,
    config: &Value,
    shards: Vec<Vec<Tensor>>,
) -> Result<Model, PlanError> {
    let arch = arch::from_config(config).map_err(|e| match e {
        PlanError::Config { field, why } => PlanError::Source {
            what: config_name.to_string(),
            why: format!("field {field}: {why}"),
        },
        other => other,
    })?;
    let mut tensors: Vec<Tensor> = shards.into_iter().flatten().collect();
    tensors.sort_unstable_by(|a, b| a.name.cmp(&b.name));
    if let Some(w) = tensors.windows(2).find(|w| w[0].name == w[1].name) {
        return Err(PlanError::Header {
            what: source,
            why: format!("tensor {} appears in two shards", w[0].name),
        });
    }
    if tensors.is_empty() {
        return Err(PlanError::Header {
            what: source,
            why: "the headers list no tensors".into(),
        });
    }
    Ok(Model {
        source,
        arch,
        tensors,
        format: Format::Safetensors,
        warnings: Vec::new(),
    })
}

/// Loads a local model: a directory, one safetensors file (with `config.json` beside
/// it), or a GGUF file.
pub fn load_local(r: &ModelRef) -> Result<Model, PlanError> {
    match r {
        ModelRef::Dir(dir) => {
            let cfg = dir.join("config.json");
            let config = read_config(&cfg)?;
            let shards = read_headers(&shard_files(dir)?)?;
            model_from(
                dir.display().to_string(),
                &cfg.display().to_string(),
                &config,
                shards,
            )
        }
        ModelRef::Safetensors(f) => {
            let cfg = f.with_file_name("config.json");
            if !cfg.is_file() {
                return Err(src_err(
                    f,
                    format!(
                        "no config.json beside it ({}): the planner needs the architecture",
                        cfg.display()
                    ),
                ));
            }
            let config = read_config(&cfg)?;
            model_from(
                f.display().to_string(),
                &cfg.display().to_string(),
                &config,
                vec![read_safetensors_header(f)?],
            )
        }
        ModelRef::Gguf(f) => load_gguf(f),
        ModelRef::Repo(id) => Err(PlanError::Source {
            what: id.clone(),
            why: "a repository is loaded with load_repo".into(),
        }),
    }
}

/// The most of a GGUF file read for its header (vocabularies can take tens of MB).
const GGUF_MAX_HEADER: u64 = 512 << 20;

fn load_gguf(f: &Path) -> Result<Model, PlanError> {
    let what = f.display().to_string();
    let mut file = std::fs::File::open(f).map_err(|e| src_err(f, e))?;
    let size = file.metadata().map_err(|e| src_err(f, e))?.len();
    let mut buf = Vec::new();
    let mut want: u64 = 4 << 20;
    loop {
        let target = want.min(size).min(GGUF_MAX_HEADER);
        let have = buf.len() as u64;
        if target > have {
            let mut more = vec![0u8; (target - have) as usize];
            file.read_exact(&mut more).map_err(|e| src_err(f, e))?;
            buf.extend(more);
        }
        match tensor::parse_gguf(&buf, &what)? {
            GgufParse::Done(h) => {
                let arch = arch::from_gguf(&h)?;
                return Ok(Model {
                    source: what,
                    arch,
                    tensors: h.tensors,
                    format: Format::Gguf,
                    warnings: Vec::new(),
                });
            }
            GgufParse::NeedMore(n) => {
                if buf.len() as u64 >= size.min(GGUF_MAX_HEADER) {
                    return Err(src_err(
                        f,
                        format!(
                            "the GGUF header does not end within {} bytes",
                            size.min(GGUF_MAX_HEADER)
                        ),
                    ));
                }
                want = n;
            }
        }
    }
}

/// How to reach a Hugging Face endpoint.
#[derive(Clone)]
pub struct HttpOptions {
    /// `HF_ENDPOINT`, default `https://huggingface.co`.
    pub endpoint: String,
    /// `HF_TOKEN`, sent as a bearer token.
    pub token: Option<String>,
    pub revision: String,
    /// Bound on each request, connect to last byte.
    pub timeout: Duration,
    /// Further attempts after a timeout, a connection error, 429 or 5xx.
    pub retries: u32,
    /// Bytes asked for by the first request of each shard; a header that fits needs no
    /// second request.
    pub first_read: u64,
    /// Shards read at the same time.
    pub parallel: usize,
}

impl std::fmt::Debug for HttpOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpOptions")
            .field("endpoint", &self.endpoint)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("revision", &self.revision)
            .field("timeout", &self.timeout)
            .field("retries", &self.retries)
            .finish()
    }
}

impl HttpOptions {
    /// From `HF_ENDPOINT` and `HF_TOKEN`.
    pub fn from_env() -> HttpOptions {
        HttpOptions {
            endpoint: std::env::var("HF_ENDPOINT")
                .ok()
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| "https://huggingface.co".into()),
            token: std::env::var("HF_TOKEN").ok().filter(|s| !s.is_empty()),
            revision: "main".into(),
            timeout: Duration::from_secs(30),
            retries: 3,
            first_read: 256 << 10,
            parallel: 8,
        }
    }
}

/// What reading a repository cost: requests per file.
#[derive(Debug, Clone, Default)]
pub struct HttpStats {
    pub requests: BTreeMap<String, u32>,
}

struct Fetcher {
    client: reqwest::Client,
    opts: HttpOptions,
    repo: String,
}

enum Got {
    Bytes(Vec<u8>, Option<u64>),
    NotFound,
}

impl Fetcher {
    fn url(&self, file: &str) -> String {
        format!(
            "{}/{}/resolve/{}/{}",
            self.opts.endpoint.trim_end_matches('/'),
            self.repo,
            self.opts.revision,
            file
        )
    }

    /// GET `file`, bytes [from, to] when a range is given, at most `max` bytes of body.
    /// Returns the body and the file's total size (from Content-Range or Content-Length).
    async fn get(
        &self,
        file: &str,
        range: Option<(u64, u64)>,
        max: u64,
        count: &mut u32,
    ) -> Result<Got, PlanError> {
        let url = self.url(file);
        let mut last = String::new();
        for attempt in 0..=self.opts.retries {
            if attempt > 0 {
                tokio::time::sleep(Duration::from_millis(200 << (attempt - 1).min(5))).await;
            }
            *count += 1;
            let mut req = self.client.get(&url);
            if let Some((a, b)) = range {
                req = req.header("Range", format!("bytes={a}-{b}"));
            }
            if let Some(t) = &self.opts.token {
                req = req.bearer_auth(t);
            }
            let res =
                match tokio::time::timeout(self.opts.timeout, self.send(req, range, max)).await {
                    Ok(r) => r,
                    Err(_) => Err(Retry::Again(format!(
                        "no complete answer within {:?}",
                        self.opts.timeout
                    ))),
                };
            match res {
                Ok(got) => return Ok(got),
                Err(Retry::Again(why)) => last = why,
                Err(Retry::Fatal(why)) => return Err(PlanError::Http { url, why }),
            }
        }
        Err(PlanError::Http {
            url,
            why: format!("{last} (after {} attempts)", self.opts.retries + 1),
        })
    }

    async fn send(
        &self,
        req: reqwest::RequestBuilder,
        range: Option<(u64, u64)>,
        max: u64,
    ) -> Result<Got, Retry> {
        let mut res = req
            .send()
            .await
            .map_err(|e| Retry::Again(error_chain(&e)))?;
        let status = res.status();
        if status == reqwest::StatusCode::NOT_FOUND {
            return Ok(Got::NotFound);
        }
        if status == reqwest::StatusCode::TOO_MANY_REQUESTS || status.is_server_error() {
            return Err(Retry::Again(format!("HTTP {status}")));
        }
        if status == reqwest::StatusCode::UNAUTHORIZED || status == reqwest::StatusCode::FORBIDDEN {
            return Err(Retry::Fatal(format!(
                "HTTP {status}: set HF_TOKEN to a token that may read this repository"
            )));
        }
        if !status.is_success() {
            return Err(Retry::Fatal(format!("HTTP {status}")));
        }
        let total = if let Some((a, b)) = range {
            if status != reqwest::StatusCode::PARTIAL_CONTENT {
                return Err(Retry::Fatal(format!(
                    "asked for bytes {a}-{b} and got HTTP {status}: the server ignores Range requests"
                )));
            }
            res.headers()
                .get("content-range")
                .and_then(|v| v.to_str().ok())
                .and_then(|s| s.rsplit('/').next())
                .and_then(|s| s.parse::<u64>().ok())
        } else {
            res.content_length()
        };
        if let Some(len) = res.content_length()
            && len > max
        {
            return Err(Retry::Fatal(format!(
                "the answer is {len} bytes, more than the {max} asked for"
            )));
        }
        let mut body = Vec::new();
        while let Some(chunk) = res
            .chunk()
            .await
            .map_err(|e| Retry::Again(error_chain(&e)))?
        {
            if body.len() as u64 + chunk.len() as u64 > max {
                return Err(Retry::Fatal(format!(
                    "the answer runs past the {max} bytes asked for"
                )));
            }
            body.extend_from_slice(&chunk);
        }
        Ok(Got::Bytes(body, total))
    }

    /// Reads one shard's header in at most two requests: a first read of `first_read`
    /// bytes, and the rest of the header if it is longer.
    async fn shard(&self, file: &str) -> Result<(Vec<Tensor>, u32), PlanError> {
        let mut count = 0;
        let what = format!("{}/{file}", self.repo);
        let first = self.opts.first_read.max(8);
        let (mut buf, total) = match self
            .get(file, Some((0, first - 1)), first, &mut count)
            .await?
        {
            Got::Bytes(b, t) => (b, t),
            Got::NotFound => {
                return Err(PlanError::Http {
                    url: self.url(file),
                    why: "HTTP 404: the index names a shard the repository lacks".into(),
                });
            }
        };
        let n = tensor::safetensors_header_len(&buf, total, &what)?;
        let need = 8 + n;
        if (buf.len() as u64) < need {
            let from = buf.len() as u64;
            match self
                .get(file, Some((from, need - 1)), need - from, &mut count)
                .await?
            {
                Got::Bytes(rest, _) => buf.extend(rest),
                Got::NotFound => {
                    return Err(PlanError::Http {
                        url: self.url(file),
                        why: "HTTP 404 on the second read".into(),
                    });
                }
            }
            if (buf.len() as u64) < need {
                return Err(PlanError::Header {
                    what,
                    why: format!(
                        "header claims {n} bytes but the server gave only {}",
                        buf.len().saturating_sub(8)
                    ),
                });
            }
        }
        let tensors = tensor::parse_safetensors_header(&buf[8..need as usize], &what)?;
        Ok((tensors, count))
    }
}

enum Retry {
    Again(String),
    Fatal(String),
}

/// The most bytes read for a config.json or an index.
const MAX_JSON: u64 = 64 << 20;

/// Loads a repository's config and shard headers over HTTP.
pub async fn load_repo(repo: &str, opts: HttpOptions) -> Result<(Model, HttpStats), PlanError> {
    let client = reqwest::Client::builder()
        .connect_timeout(opts.timeout)
        .build()
        .map_err(|e| PlanError::Http {
            url: opts.endpoint.clone(),
            why: e.to_string(),
        })?;
    let f = std::sync::Arc::new(Fetcher {
        client,
        opts: opts.clone(),
        repo: repo.to_string(),
    });
    let mut stats = HttpStats::default();
    let mut count = 0;
    let config: Value = match f.get("config.json", None, MAX_JSON, &mut count).await? {
        Got::Bytes(b, _) => serde_json::from_slice(&b).map_err(|e| PlanError::Header {
            what: format!("{repo}/config.json"),
            why: format!("not JSON: {e}"),
        })?,
        Got::NotFound => {
            return Err(PlanError::Http {
                url: f.url("config.json"),
                why:
                    "HTTP 404: no such repository, revision or config.json (private? set HF_TOKEN)"
                        .into(),
            });
        }
    };
    stats.requests.insert("config.json".into(), count);
    let mut count = 0;
    let files = match f
        .get("model.safetensors.index.json", None, MAX_JSON, &mut count)
        .await?
    {
        Got::Bytes(b, _) => index_files(&b, &format!("{repo}/model.safetensors.index.json"))?,
        Got::NotFound => vec!["model.safetensors".to_string()],
    };
    stats
        .requests
        .insert("model.safetensors.index.json".into(), count);
    let sem = std::sync::Arc::new(tokio::sync::Semaphore::new(opts.parallel.max(1)));
    let mut set = tokio::task::JoinSet::new();
    for (i, file) in files.iter().enumerate() {
        let f = f.clone();
        let sem = sem.clone();
        let file = file.clone();
        set.spawn(async move {
            let _permit = sem.acquire_owned().await;
            let r = f.shard(&file).await;
            (i, file, r)
        });
    }
    let mut shards: Vec<Option<Vec<Tensor>>> = vec![None; files.len()];
    let mut first_err = None;
    while let Some(joined) = set.join_next().await {
        let (i, file, r) = joined.map_err(|e| PlanError::Http {
            url: repo.to_string(),
            why: format!("a shard reader failed: {e}"),
        })?;
        match r {
            Ok((t, n)) => {
                stats.requests.insert(file, n);
                shards[i] = Some(t);
            }
            Err(e) => {
                if first_err.is_none() {
                    first_err = Some(e);
                }
            }
        }
    }
    if let Some(e) = first_err {
        return Err(e);
    }
    let model = model_from(
        repo.to_string(),
        &format!("{repo}/config.json"),
        &config,
        shards.into_iter().flatten().collect(),
    )?;
    Ok((model, stats))
}
