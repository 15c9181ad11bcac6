//! The API client: what the CLI, the agent, the tests and the benchmark speak through.
//! Every request has a timeout; nothing waits unbounded.

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

impl ClientError {
    /// The HTTP status, for refusals and server errors.
    pub fn status(&self) -> Option<u16> {
        match self {
            ClientError::Refused { status, .. } | ClientError::Server { status, .. } => {
                Some(*status)
            }
            _ => None,
        }
    }
}

/// A client of one controller, with one token.
#[derive(Debug, Clone)]
pub struct Client {
    http: reqwest::Client,
    base: String,
    token: Option<Secret>,
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
        crate::tls::check_plain_http(base, tls.insecure_http)?;
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            return Err(ClientError::Config(format!(
                "controller URL `{base}`: expected http://HOST:PORT (loopback) or https://HOST:PORT"
            )));
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
        Ok(Client {
            http,
            base: base.trim_end_matches('/').to_string(),
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

    async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<&(impl Serialize + ?Sized)>,
    ) -> Result<reqwest::Response, ClientError> {
        let url = format!("{}{path}", self.base);
        let mut req = self.http.request(method, &url);
        if let Some(t) = &self.token {
            req = req.bearer_auth(t.expose());
        }
        if let Some(b) = body {
            req = req.json(b);
        }
        let resp = req.send().await.map_err(|e| {
            // reqwest's own line repeats the URL ("error sending request for url (...)");
            // the message names it once, so the reason is the causes alone.
            let tls = is_tls(&e);
            let reason = match std::error::Error::source(&e) {
                Some(cause) => error_chain(cause),
                None => e.without_url().to_string(),
            };
            if tls {
                ClientError::Untrusted {
                    url: url.clone(),
                    reason,
                }
            } else {
                ClientError::Unreachable {
                    url: url.clone(),
                    reason,
                }
            }
        })?;
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

    async fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&(impl Serialize + ?Sized)>,
    ) -> Result<T, ClientError> {
        let resp = self.send(method, path, body).await?;
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
        self.send(Method::DELETE, &format!("/v1/tokens/{id}"), None::<&()>)
            .await
            .map(|_| ())
    }

    /// `DELETE /v1/tenants/{name}`.
    pub async fn delete_tenant(&self, name: &str) -> Result<(), ClientError> {
        self.send(Method::DELETE, &format!("/v1/tenants/{name}"), None::<&()>)
            .await
            .map(|_| ())
    }

    /// `DELETE /v1/servers/{name}`.
    pub async fn remove_server(&self, name: &str) -> Result<(), ClientError> {
        self.send(Method::DELETE, &format!("/v1/servers/{name}"), None::<&()>)
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
        self.call(Method::POST, "/v1/agents/report", Some(report))
            .await
    }

    /// `POST /v1/agents/heartbeat`.
    pub async fn heartbeat(&self) -> Result<(), ClientError> {
        let resp = self
            .send(Method::POST, "/v1/agents/heartbeat", None::<&()>)
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
