//! The fabric controller: the service that turns "move server node7 from group A to
//! group B" into verified P_Key tables on the fabric.
//!
//! It is for: an HTTP JSON API ([`api::app`]) that agents report their ports to and
//! operators drive; a [`store::Store`] (SQLite in WAL mode by default) holding servers,
//! their ports, tenants, groups, membership, the desired and the observed state, pending
//! GUID claims and an append-only audit log; a reconcile loop ([`reconcile`]) that renders
//! the desired state into a [`weft_fabric::FabricPlan`], compiles it and hands it to a
//! [`reconcile::Fabric`] (the OpenSM driver in production), retrying with backoff; the
//! agent's reporting loop ([`agent`]); and the API client the CLI and the tests use
//! ([`client`]). It is not for: reading sysfs (weft-agent does), talking to OpenSM
//! (weft-opensm does), or deciding partition syntax (weft-fabric does).
//!
//! ```no_run
//! use std::sync::Arc;
//! use weft_controller::{Controller, ControllerConfig, reconcile::RecordingFabric, store::SqliteStore};
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let store = SqliteStore::open(std::path::Path::new("/var/lib/weft/controller.db"))?;
//! let config = ControllerConfig::default();
//! let controller = Controller::start(Arc::new(store), Arc::new(RecordingFabric::default()), config)?;
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:7100").await?;
//! axum::serve(listener, controller.app()).await?;
//! # Ok(()) }
//! ```

#![forbid(unsafe_code)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod agent;
pub mod api;
pub mod auth;
pub mod client;
pub mod input;
pub mod leader;
pub mod lease;
pub mod links;
pub mod metrics;
pub mod model;
mod openapi;
pub mod pgdump;
pub mod reconcile;
pub mod render;
pub mod restore;
mod server;
pub mod store;
pub mod tls;

/// The OpenAPI document the API serves at `/openapi.json` (for the console's `/docs`).
pub fn openapi_document() -> &'static serde_json::Value {
    openapi::document()
}

pub use server::{
    Controller, ControllerConfig, LEASE_S, MIN_ADMIN_TOKEN_CHARS, StartError, check_admin_token,
    local, serve, serve_tls, shutdown_signal, unix_now,
};
