//! The API client: what the CLI, the agent, the tests and the benchmark speak through.
//! Every request has a timeout; nothing waits unbounded.
//!
//! A client knows one or more controller URLs (`[controller] urls`: the controllers of one
//! store, one of them the leader) and fails over between them within one bound per call
//! ([`Client::failover_bound`]):
//! - no connection (refused, connect timeout, TLS handshake): nothing was sent, so the next
//!   URL is tried, for every request;
//! - `421 Misdirected Request` with `code: "not_leader"` (a follower refusing a write; it
//!   applied nothing): the call goes once to the `leader` it names, but only when that is
//!   one of the configured URLs (the token is never handed to an address the operator did
//!   not configure: a follower's, or a stranger's, word is not enough); with `leader: null`
//!   (no leader elected yet) the call waits briefly and asks again, at most
//!   [`Client::leader_wait`] in all;
//! - sent but no answer (a timeout or reset after the request went out): a read, an agent's
//!   report or heartbeat (each replaces what the last one said) goes to the next URL; any
//!   other write is **never sent again** (the API has no idempotency keys: a second
//!   `POST /v1/tokens` or `/v1/leases` would make a second one), and the call fails with
//!   [`ClientError::OutcomeUnknown`], which says how to check what happened.
//!
//! An error of a call that tried more than one URL names every URL tried and what each said.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use reqwest::{Method, StatusCode};
use serde::Serialize;
use serde::de::DeserializeOwned;
use weft_agent::HostReport;
use weft_chain::error_chain;

use crate::auth::Secret;
use crate::model::*;
use crate::tls::{ClientTls, TlsError};

/// Why a call did not succeed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// No answer: connection refused, timeout, reset.
    #[error("cannot reach the controller at {url}: {reason}")]
    Unreachable {
        /// The URL.
        url: String,
        /// Why.
        reason: String,
    },
    /// The TLS handshake failed: the controller's certificate is not the pinned one, not
    /// signed by the CA, or not for its name; nothing was sent.
    #[error("refusing the controller at {url}: {reason}")]
    Untrusted {
        /// The URL.
        url: String,
        /// Why (names the certificate's fingerprint for a pin mismatch).
        reason: String,
    },
    /// The controller answered with a 4xx.
    #[error("{message} (HTTP {status})")]
    Refused {
        /// The status.
        status: u16,
        /// The controller's message.
        message: String,
    },
    /// The controller answered with a 5xx.
    #[error("the controller failed: {message} (HTTP {status})")]
    Server {
        /// The status.
        status: u16,
        /// The controller's message.
        message: String,
    },
    /// The client's settings: a URL, a CA file, a pin, plain HTTP off loopback.
    #[error("{0}")]
    Config(String),
    /// An answer that is not what the API promises.
    #[error("unexpected answer: {0}")]
    Decode(String),
    /// No configured controller took the call: every URL tried, and what each said.
    #[error("no controller took {request}; tried {}", tried_list(.tried))]
    NoController {
        /// The request (`POST /v1/moves`).
        request: String,
        /// Each URL tried, in order, and what it said.
        tried: Vec<Tried>,
    },
    /// A write was sent but no answer came back: it may or may not have been applied, and it
    /// was not sent again (it could apply twice).
    #[error(
        "the outcome of {request} is unknown: it was sent to {url} and no answer came ({reason}); it was not sent again, as it could apply twice. Check whether it was applied (`weft audit`, or the list it changes) before running it again{}",
        earlier(.tried)
    )]
    OutcomeUnknown {
        /// The request (`POST /v1/moves`).
        request: String,
        /// Where it was sent.
        url: String,
        /// Why no answer came.
        reason: String,
        /// The URLs tried before it, and what each said.
        tried: Vec<Tried>,
    },
    /// An operation that did not finish within the wait.
    #[error("operation {id} not applied after {waited:?}: {last_error}")]
    NotApplied {
        /// The operation.
        id: i64,
        /// How long it waited.
        waited: Duration,
        /// Its last error, if any.
        last_error: String,
    },
}

/// One URL a call tried, and what it said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tried {
    /// The URL (base and path).
    pub url: String,
    /// What happened there.
    pub said: String,
    /// It answered `421`: it is not the leader.
    pub not_leader: bool,
}

fn tried_list(tried: &[Tried]) -> String {
    tried
        .iter()
        .map(|t| format!("{}: {}", t.url, t.said))
        .collect::<Vec<_>>()
        .join("; ")
}

fn earlier(tried: &[Tried]) -> String {
    if tried.is_empty() {
        String::new()
    } else {
        format!(" (tried before: {})", tried_list(tried))
    }
}

/// The URLs of a comma-separated list (`WEFT_CONTROLLER_URLS`), trimmed, empty items dropped.
pub fn split_urls(list: &str) -> Vec<String> {
    list.split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .map(String::from)
        .collect()
}

/// How long a call waits, in all, for a leader to be elected while controllers answer
/// `421` with `leader: null` (the default of [`Client::leader_wait`]).
pub const LEADER_WAIT: Duration = Duration::from_secs(10);

impl From<TlsError> for ClientError {
    fn from(e: TlsError) -> Self {
        ClientError::Config(e.to_string())
    }
}

/// Whether a rustls error is among `e`'s causes (an `io::Error` hides its inner error
/// from `source()`, so look inside those too).
fn is_tls(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    let mut depth = 0;
    while let Some(c) = cur {
        if c.downcast_ref::<rustls::Error>().is_some() || depth > 16 {
            return depth <= 16;
        }
        depth += 1;
        cur = match c.downcast_ref::<std::io::Error>() {
            Some(io) => match io.get_ref() {
                Some(inner) => Some(inner as &(dyn std::error::Error + 'static)),
                None => None,
            },
            None => c.source(),
        };
    }
    false
}

/// An answer: itself when it is a success, else the error it carries.
async fn answer(resp: reqwest::Response) -> Result<reqwest::Response, ClientError> {
    let status = resp.status();
    if status.is_success() {
        return Ok(resp);
    }
    let message = resp
        .json::<ErrorBody>()
        .await
        .map(|b| b.error)
        .unwrap_or_else(|_| status.canonical_reason().unwrap_or("error").to_string());
    if status.is_server_error() {
        Err(ClientError::Server {
            status: status.as_u16(),
            message,
        })
    } else {
        Err(ClientError::Refused {
            status: status.as_u16(),
            message,
        })
    }
}

impl ClientError {
    /// The HTTP status, for refusals and server errors.
    pub fn status(&self) -> Option<u16> {
        match self {
            ClientError::Refused { status, .. } | ClientError::Server { status, .. } => {
                Some(*status)
            }
            // Every controller tried answered "not the leader" (and none it named was
            // followed): that is the call's status too.
            ClientError::NoController { tried, .. }
                if !tried.is_empty() && tried.iter().all(|t| t.not_leader) =>
            {
                Some(421)
            }
            _ => None,
        }
    }
}

/// A client of one or more controllers (one store: a leader and its followers), with one
/// token. Clones share which URL answered last, and try it first.
#[derive(Debug, Clone)]
pub struct Client {
    http: reqwest::Client,
    bases: Arc<[String]>,
    preferred: Arc<AtomicUsize>,
    timeout: Duration,
    bound: Duration,
    leader_wait: Duration,
    token: Option<Secret>,
}

/// One attempt at one URL.
enum Attempt {
    /// An HTTP answer other than "not the leader".
    Answer(reqwest::Response),
    /// `421`: this controller is not the leader; it names the leader, or none.
    NotLeader {
        leader: Option<String>,
        said: String,
    },
    /// No connection: nothing was sent.
    NotSent { reason: String, untrusted: bool },
    /// Sent, and no answer.
    Lost { reason: String },
}

/// What a `421` says (the project's error shape, with `code` and `leader`).
#[derive(serde::Deserialize)]
struct NotLeaderBody {
    #[serde(default)]
    error: String,
    #[serde(default)]
    code: Option<String>,
    #[serde(default)]
    leader: Option<String>,
}

fn trim_base(u: &str) -> String {
    u.trim().trim_end_matches('/').to_string()
}

impl Client {
    /// A client for `base` (`http://127.0.0.1:7100`); every request times out after
    /// `timeout` (connecting after at most 5 s of it). Plain HTTP only to loopback; see
    /// [`Client::with_tls`] for `https://`.
    pub fn new(
        base: &str,
        token: Option<Secret>,
        timeout: Duration,
    ) -> Result<Client, ClientError> {
        Client::with_tls(base, token, timeout, &ClientTls::default())
    }

    /// [`Client::new`], trusting the controller as `tls` says (a CA file or a pinned
    /// certificate); `http://` off loopback is refused unless `tls.insecure_http`.
    pub fn with_tls(
        base: &str,
        token: Option<Secret>,
        timeout: Duration,
        tls: &ClientTls,
    ) -> Result<Client, ClientError> {
        Client::over(&[base.to_string()], token, timeout, tls)
    }

    /// A client of the controllers at `bases` (tried in this order, then the one that
    /// answered last first); each request times out after `timeout`, a whole call with its
    /// failovers after [`Client::failover_bound`]. Every URL is checked as
    /// [`Client::with_tls`] checks one; duplicates are dropped.
    pub fn over(
        bases: &[String],
        token: Option<Secret>,
        timeout: Duration,
        tls: &ClientTls,
    ) -> Result<Client, ClientError> {
        let mut list: Vec<String> = Vec::new();
        for b in bases {
            let base = trim_base(b);
            crate::tls::check_plain_http(&base, tls.insecure_http)?;
            if !(base.starts_with("http://") || base.starts_with("https://")) {
                return Err(ClientError::Config(format!(
                    "controller URL `{base}`: expected http://HOST:PORT (loopback) or https://HOST:PORT"
                )));
            }
            if !list.contains(&base) {
                list.push(base);
            }
        }
        if list.is_empty() {
            return Err(ClientError::Config(
                "no controller URL: give `[controller] urls`, WEFT_CONTROLLER_URLS or --controller"
                    .into(),
            ));
        }
        let mut builder = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout.min(Duration::from_secs(5)));
        if let Some(config) = tls.rustls_config()? {
            builder = builder.use_preconfigured_tls(config);
        }
        let http = builder
            .build()
            .map_err(|e| ClientError::Config(error_chain(&e)))?;
        let n = u32::try_from(list.len()).unwrap_or(u32::MAX);
        Ok(Client {
            http,
            bound: timeout.saturating_mul(n) + LEADER_WAIT,
            bases: list.into(),
            preferred: Arc::new(AtomicUsize::new(0)),
            timeout,
            leader_wait: LEADER_WAIT,
            token,
        })
    }

    /// The same client with another token.
    pub fn with_token(&self, token: Option<Secret>) -> Client {
        Client {
            token,
            ..self.clone()
        }
    }

    /// The same client with another bound on a whole call, failovers and waits for a
    /// leader included (default: the request timeout once per URL, plus [`LEADER_WAIT`]).
    pub fn with_failover_bound(&self, bound: Duration) -> Client {
        Client {
            bound,
            ..self.clone()
        }
    }

    /// The same client waiting at most `wait` in all for a leader to be elected.
    pub fn with_leader_wait(&self, wait: Duration) -> Client {
        Client {
            leader_wait: wait,
            ..self.clone()
        }
    }

    /// The bound on a whole call.
    pub fn failover_bound(&self) -> Duration {
        self.bound
    }

    /// The longest a call waits for a leader to be elected.
    pub fn leader_wait(&self) -> Duration {
        self.leader_wait
    }

    /// The controller URLs, in the order given.
    pub fn urls(&self) -> &[String] {
        &self.bases
    }

    /// The URL that answered last (the first one until one has).
    pub fn current_url(&self) -> &str {
        let i = self.preferred.load(Ordering::Relaxed);
        &self.bases[i.min(self.bases.len() - 1)]
    }

    /// One request to `bases[i]`, bounded by `limit`.
    async fn attempt(
        &self,
        i: usize,
        method: &Method,
        path: &str,
        body: Option<&[u8]>,
        limit: Duration,
    ) -> (String, Attempt) {
        let url = format!("{}{path}", self.bases[i]);
        let mut req = self
            .http
            .request(method.clone(), &url)
            .timeout(limit.min(self.timeout));
        if let Some(t) = &self.token {
            req = req.bearer_auth(t.expose());
        }
        if let Some(b) = body {
            req = req
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(b.to_vec());
        }
        let resp = match req.send().await {
            Ok(r) => r,
            Err(e) => {
                // reqwest's own line repeats the URL ("error sending request for url (...)");
                // the message names it once, so the reason is the causes alone.
                let untrusted = is_tls(&e);
                let (timeout, connect) = (e.is_timeout(), e.is_connect());
                let reason = match std::error::Error::source(&e) {
                    Some(cause) => error_chain(cause),
                    None => e.without_url().to_string(),
                };
                let reason = if timeout && !reason.contains("timed out") {
                    format!("{reason} (timed out)")
                } else {
                    reason
                };
                // A connect error (refused, connect timeout, TLS handshake) sent nothing.
                let a = if connect || untrusted {
                    Attempt::NotSent { reason, untrusted }
                } else {
                    Attempt::Lost { reason }
                };
                return (url, a);
            }
        };
        if resp.status() == StatusCode::MISDIRECTED_REQUEST {
            let b = resp.json::<NotLeaderBody>().await.ok();
            let (leader, said) = match b {
                Some(b) => {
                    let code = b.code.unwrap_or_else(|| "no code".into());
                    (b.leader, format!("{} ({code})", b.error))
                }
                None => (None, "misdirected request".into()),
            };
            return (url, Attempt::NotLeader { leader, said });
        }
        (url, Attempt::Answer(resp))
    }

    /// Sends a request with the failover of the module's doc. `resend`: whether the request
    /// may be sent again after it went out and no answer came (reads, and writes whose
    /// second arrival changes nothing).
    async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<&(impl Serialize + ?Sized)>,
        resend: bool,
    ) -> Result<reqwest::Response, ClientError> {
        let body = match body {
            Some(b) => Some(serde_json::to_vec(b).map_err(|e| ClientError::Decode(e.to_string()))?),
            None => None,
        };
        let request = format!("{method} {path}");
        let start = Instant::now();
        let deadline = start + self.bound;
        let n = self.bases.len();
        let first = self.preferred.load(Ordering::Relaxed).min(n - 1);
        let mut queue: VecDeque<usize> = (0..n).map(|k| (first + k) % n).collect();
        let mut tried: Vec<Tried> = Vec::new();
        let mut errors: Vec<ClientError> = Vec::new();
        let mut redirected = false;
        let mut leader_waited = Duration::ZERO;
        let mut pause = Duration::from_millis(250);
        while let Some(i) = queue.pop_front() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                tried.push(Tried {
                    url: format!("{}{path}", self.bases[i]),
                    said: format!("not tried: the call's bound of {:?} ran out", self.bound),
                    not_leader: false,
                });
                break;
            }
            let (url, a) = self.attempt(i, &method, path, body.as_deref(), left).await;
            match a {
                Attempt::Answer(resp) => {
                    if i != first {
                        tracing::info!(url = %self.bases[i], "failed over to another controller");
                    }
                    self.preferred.store(i, Ordering::Relaxed);
                    return answer(resp).await;
                }
                Attempt::NotSent { reason, untrusted } => {
                    tried.push(Tried {
                        url: url.clone(),
                        said: reason.clone(),
                        not_leader: false,
                    });
                    errors.push(if untrusted {
                        ClientError::Untrusted { url, reason }
                    } else {
                        ClientError::Unreachable { url, reason }
                    });
                }
                Attempt::Lost { reason } if resend => {
                    tried.push(Tried {
                        url: url.clone(),
                        said: format!("no answer: {reason}"),
                        not_leader: false,
                    });
                    errors.push(ClientError::Unreachable { url, reason });
                }
                Attempt::Lost { reason } => {
                    return Err(ClientError::OutcomeUnknown {
                        request,
                        url,
                        reason,
                        tried,
                    });
                }
                Attempt::NotLeader { leader, said } => {
                    let named = leader.as_deref().map(trim_base);
                    let at = named
                        .as_deref()
                        .and_then(|l| self.bases.iter().position(|b| b == l));
                    let what = match (&named, at) {
                        (None, _) => format!("not the leader, and no leader is elected: {said}"),
                        (Some(l), Some(_)) if !redirected => {
                            format!("not the leader; the leader is {l}: {said}")
                        }
                        (Some(l), Some(_)) => format!(
                            "not the leader; the leader is {l}, already followed once in this call: {said}"
                        ),
                        (Some(l), None) => format!(
                            "not the leader; it names {l} as the leader, which is not among the configured URLs, so it was not followed: {said}"
                        ),
                    };
                    tried.push(Tried {
                        url: url.clone(),
                        said: what.clone(),
                        not_leader: true,
                    });
                    errors.push(ClientError::Refused {
                        status: 421,
                        message: what,
                    });
                    match (named, at) {
                        (Some(_), Some(j)) if !redirected && j != i => {
                            redirected = true;
                            queue.retain(|&k| k != j);
                            queue.push_front(j);
                        }
                        (None, _) if queue.is_empty() => {
                            // No leader anywhere yet: wait a little and ask every URL again.
                            let left = deadline.saturating_duration_since(Instant::now());
                            let nap = pause
                                .min(self.leader_wait.saturating_sub(leader_waited))
                                .min(left);
                            if !nap.is_zero() {
                                tokio::time::sleep(nap).await;
                                leader_waited += nap;
                                pause = (pause * 2).min(Duration::from_secs(1));
                                queue.extend((0..n).map(|k| (i + 1 + k) % n));
                            }
                        }
                        _ => {}
                    }
                }
            }
        }
        // One URL, no connection: its own error (it names the URL), as a one-controller
        // client always said.
        if tried.len() == 1
            && let [ClientError::Unreachable { .. } | ClientError::Untrusted { .. }] =
                errors.as_slice()
            && let Some(e) = errors.pop()
        {
            return Err(e);
        }
        // Every URL refused the certificate: that, not "unreachable".
        if !errors.is_empty()
            && errors
                .iter()
                .all(|e| matches!(e, ClientError::Untrusted { .. }))
        {
            return Err(errors.swap_remove(0));
        }
        Err(ClientError::NoController { request, tried })
    }

    async fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&(impl Serialize + ?Sized)>,
    ) -> Result<T, ClientError> {
        let resend = method == Method::GET;
        self.call_as(method, path, body, resend).await
    }

    async fn call_as<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&(impl Serialize + ?Sized)>,
        resend: bool,
    ) -> Result<T, ClientError> {
        let resp = self.send(method, path, body, resend).await?;
        resp.json::<T>()
            .await
            .map_err(|e| ClientError::Decode(e.to_string()))
    }

    async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, ClientError> {
        self.call(Method::GET, path, None::<&()>).await
    }

    /// `GET /v1/servers`.
    pub async fn servers(&self) -> Result<Vec<ServerView>, ClientError> {
        self.get("/v1/servers").await
    }

    /// `GET /v1/groups`.
    pub async fn groups(&self) -> Result<Vec<GroupView>, ClientError> {
        self.get("/v1/groups").await
    }

    /// `GET /v1/groups/{name}`.
    pub async fn group(&self, name: &str) -> Result<GroupView, ClientError> {
        self.get(&format!("/v1/groups/{name}")).await
    }

    /// `GET /v1/groups/{name}/nodes`: members with liveness and reported GPUs.
    pub async fn group_nodes(&self, name: &str) -> Result<Vec<NodeView>, ClientError> {
        self.get(&format!("/v1/groups/{name}/nodes")).await
    }

    /// `GET /v1/tenants`.
    pub async fn tenants(&self) -> Result<Vec<TenantView>, ClientError> {
        self.get("/v1/tenants").await
    }

    /// `POST /v1/tenants`.
    pub async fn create_tenant(&self, name: &str) -> Result<TenantCreated, ClientError> {
        self.call(
            Method::POST,
            "/v1/tenants",
            Some(&CreateTenant { name: name.into() }),
        )
        .await
    }

    /// `POST /v1/tokens`: a tenant token for `Some(tenant)`, an admin token for `None`
    /// (the request names the role either way); `ttl_s` as the API takes it.
    pub async fn create_token(
        &self,
        tenant: Option<&str>,
        ttl_s: Option<u64>,
    ) -> Result<TokenCreated, ClientError> {
        self.call(
            Method::POST,
            "/v1/tokens",
            Some(&CreateToken {
                role: if tenant.is_some() {
                    TokenRole::Tenant
                } else {
                    TokenRole::Admin
                },
                tenant: tenant.map(String::from),
                ttl_s,
            }),
        )
        .await
    }

    /// `GET /v1/tokens`.
    pub async fn tokens(&self) -> Result<Vec<TokenView>, ClientError> {
        self.get("/v1/tokens").await
    }

    /// `DELETE /v1/tokens/{id}`.
    pub async fn revoke_token(&self, id: &str) -> Result<(), ClientError> {
        self.send(
            Method::DELETE,
            &format!("/v1/tokens/{id}"),
            None::<&()>,
            false,
        )
        .await
        .map(|_| ())
    }

    /// `DELETE /v1/tenants/{name}`.
    pub async fn delete_tenant(&self, name: &str) -> Result<(), ClientError> {
        self.send(
            Method::DELETE,
            &format!("/v1/tenants/{name}"),
            None::<&()>,
            false,
        )
        .await
        .map(|_| ())
    }

    /// `DELETE /v1/servers/{name}`.
    pub async fn remove_server(&self, name: &str) -> Result<(), ClientError> {
        self.send(
            Method::DELETE,
            &format!("/v1/servers/{name}"),
            None::<&()>,
            false,
        )
        .await
        .map(|_| ())
    }

    /// `POST /v1/groups`.
    pub async fn create_group(&self, name: &str, tenant: &str) -> Result<Accepted, ClientError> {
        self.call(
            Method::POST,
            "/v1/groups",
            Some(&CreateGroup {
                name: name.into(),
                tenant: tenant.into(),
            }),
        )
        .await
    }

    /// `DELETE /v1/groups/{name}`.
    pub async fn delete_group(&self, name: &str) -> Result<Accepted, ClientError> {
        self.call(Method::DELETE, &format!("/v1/groups/{name}"), None::<&()>)
            .await
    }

    /// `POST /v1/groups/{group}/members`.
    pub async fn add_member(&self, group: &str, server: &str) -> Result<Accepted, ClientError> {
        self.call(
            Method::POST,
            &format!("/v1/groups/{group}/members"),
            Some(&AddMember {
                server: server.into(),
            }),
        )
        .await
    }

    /// `DELETE /v1/groups/{group}/members/{server}`.
    pub async fn remove_member(&self, group: &str, server: &str) -> Result<Accepted, ClientError> {
        self.call(
            Method::DELETE,
            &format!("/v1/groups/{group}/members/{server}"),
            None::<&()>,
        )
        .await
    }

    /// `POST /v1/moves`.
    pub async fn move_server(&self, server: &str, to: &str) -> Result<Accepted, ClientError> {
        self.call(
            Method::POST,
            "/v1/moves",
            Some(&MoveServer {
                server: server.into(),
                to: to.into(),
            }),
        )
        .await
    }

    /// `GET /v1/operations/{id}`.
    pub async fn operation(&self, id: i64) -> Result<OperationView, ClientError> {
        self.get(&format!("/v1/operations/{id}")).await
    }

    /// `GET /v1/operations`.
    pub async fn operations(&self, pending_only: bool) -> Result<Vec<OperationView>, ClientError> {
        self.get(&format!("/v1/operations?pending={pending_only}"))
            .await
    }

    /// Polls an operation until it is applied, at most `timeout`.
    pub async fn wait_applied(
        &self,
        id: i64,
        timeout: Duration,
    ) -> Result<OperationView, ClientError> {
        let start = Instant::now();
        let mut pause = Duration::from_millis(20);
        loop {
            let op = self.operation(id).await?;
            if op.state == OpState::Applied {
                return Ok(op);
            }
            if start.elapsed() >= timeout {
                return Err(ClientError::NotApplied {
                    id,
                    waited: start.elapsed(),
                    last_error: op.last_error.unwrap_or_else(|| "still pending".into()),
                });
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(200));
        }
    }

    /// `GET /v1/audit?limit=N`.
    pub async fn audit(&self, limit: usize) -> Result<Vec<AuditEntry>, ClientError> {
        self.get(&format!("/v1/audit?limit={limit}")).await
    }

    /// `GET /v1/claims`.
    pub async fn claims(&self) -> Result<Vec<ClaimView>, ClientError> {
        self.get("/v1/claims").await
    }

    /// `POST /v1/claims/{id}/approve`.
    pub async fn approve_claim(&self, id: i64) -> Result<Accepted, ClientError> {
        self.call(
            Method::POST,
            &format!("/v1/claims/{id}/approve"),
            None::<&()>,
        )
        .await
    }

    /// `POST /v1/enrollments`.
    pub async fn create_enrollment(
        &self,
        server: Option<&str>,
    ) -> Result<EnrollmentToken, ClientError> {
        self.call(
            Method::POST,
            "/v1/enrollments",
            Some(&EnrollmentRequest {
                server: server.map(String::from),
                ttl_s: None,
            }),
        )
        .await
    }

    /// `GET /v1/status`.
    pub async fn status(&self) -> Result<StatusView, ClientError> {
        self.get("/v1/status").await
    }

    /// `POST /v1/agents/enroll` (no token on the client).
    pub async fn enroll(&self, token: &Secret, hostname: &str) -> Result<Enrolled, ClientError> {
        self.call(
            Method::POST,
            "/v1/agents/enroll",
            Some(&EnrollRequest {
                token: token.clone(),
                hostname: hostname.into(),
            }),
        )
        .await
    }

    /// `POST /v1/agents/report` (the client's token is the agent's secret).
    pub async fn report(&self, report: &HostReport) -> Result<ReportAck, ClientError> {
        // A second arrival of the same report changes nothing: it may be sent again.
        self.call_as(Method::POST, "/v1/agents/report", Some(report), true)
            .await
    }

    /// `POST /v1/agents/heartbeat`.
    pub async fn heartbeat(&self) -> Result<(), ClientError> {
        let resp = self
            .send(Method::POST, "/v1/agents/heartbeat", None::<&()>, true)
            .await?;
        if resp.status() == StatusCode::NO_CONTENT || resp.status().is_success() {
            Ok(())
        } else {
            Err(ClientError::Decode(format!("status {}", resp.status())))
        }
    }
}

/// The node-lease calls ([`crate::lease`]).
impl Client {
    /// `GET /v1/leases`.
    pub async fn leases(&self) -> Result<crate::lease::model::LeaseList, ClientError> {
        self.get("/v1/leases").await
    }

    /// `POST /v1/leases`.
    pub async fn request_lease(
        &self,
        req: &crate::lease::model::LeaseRequest,
    ) -> Result<crate::lease::model::LeaseAccepted, ClientError> {
        self.call(Method::POST, "/v1/leases", Some(req)).await
    }

    /// `GET /v1/leases/{id}`.
    pub async fn lease(&self, id: u64) -> Result<crate::lease::model::LeaseDetail, ClientError> {
        self.get(&format!("/v1/leases/{id}")).await
    }

    /// `POST /v1/leases/{id}/extend`.
    pub async fn extend_lease(
        &self,
        id: u64,
        by_s: u64,
    ) -> Result<crate::lease::model::LeaseAccepted, ClientError> {
        self.call(
            Method::POST,
            &format!("/v1/leases/{id}/extend"),
            Some(&crate::lease::model::ExtendLease { by_s }),
        )
        .await
    }

    /// `POST /v1/leases/{id}/release`.
    pub async fn release_lease(
        &self,
        id: u64,
    ) -> Result<crate::lease::model::LeaseAccepted, ClientError> {
        self.call(
            Method::POST,
            &format!("/v1/leases/{id}/release"),
            None::<&()>,
        )
        .await
    }

    /// `GET /v1/lease-quotas`.
    pub async fn lease_quotas(
        &self,
    ) -> Result<Vec<crate::lease::model::LeaseQuotaView>, ClientError> {
        self.get("/v1/lease-quotas").await
    }

    /// `PUT /v1/lease-quotas/{tenant}`.
    pub async fn set_lease_quota(
        &self,
        tenant: &str,
        quota: &crate::lease::model::SetLeaseQuota,
    ) -> Result<(), ClientError> {
        self.send(
            Method::PUT,
            &format!("/v1/lease-quotas/{tenant}"),
            Some(quota),
            false,
        )
        .await
        .map(|_| ())
    }

    /// `DELETE /v1/lease-quotas/{tenant}`.
    pub async fn delete_lease_quota(&self, tenant: &str) -> Result<(), ClientError> {
        self.send(
            Method::DELETE,
            &format!("/v1/lease-quotas/{tenant}"),
            None::<&()>,
            false,
        )
        .await
        .map(|_| ())
    }

    /// `GET /v1/agents/notices`: leases that end on this agent's server.
    pub async fn lease_notices(
        &self,
    ) -> Result<Vec<crate::lease::model::LeaseNotice>, ClientError> {
        self.get("/v1/agents/notices").await
    }

    /// `POST /v1/link-results`: stores a run of link measurements (an admin token).
    pub async fn add_link_run(
        &self,
        run: &crate::links::LinkRunIn,
    ) -> Result<crate::links::api::LinkRunAccepted, ClientError> {
        self.call(Method::POST, "/v1/link-results", Some(run)).await
    }

    /// `GET /v1/link-results?limit=N`: the newest runs this token may see, newest first.
    pub async fn link_runs(
        &self,
        limit: usize,
    ) -> Result<Vec<crate::links::LinkRunView>, ClientError> {
        self.get(&format!("/v1/link-results?limit={limit}")).await
    }

    /// `GET /v1/link-health`: the links flagged now.
    pub async fn link_health(&self) -> Result<crate::links::LinkHealthView, ClientError> {
        self.get("/v1/link-health").await
    }
}
