//! The OpenAPI 3.1 description served at `/openapi.json`, generated from the handlers:
//! each handler in [`crate::api`] carries a `#[utoipa::path]` (method, path, parameters,
//! body, every status it answers with) and every type of [`crate::model`] derives
//! `ToSchema`; utoipa-axum builds the router and the document from the same `routes!`
//! lists, so a route cannot be served without being described. What lives here is what
//! the handlers share: the document's head, its security schemes, the error answers
//! (as sets a handler names in its `responses(...)`), and the schema of the agent's
//! report, whose type lives in weft-agent.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::OnceLock;

use utoipa::openapi::schema::{ObjectBuilder, Schema, Type};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{ContentBuilder, HeaderBuilder, Ref, RefOr, Response, ResponseBuilder};
use utoipa::{IntoResponses, Modify, OpenApi, PartialSchema, ToSchema};

use crate::model::ErrorBody;

/// The document's head: title, version, the error body, the security schemes. The paths
/// and their schemas come from the router ([`crate::api::documented`]).
#[derive(OpenApi)]
#[openapi(
    info(
        title = "weft fabric controller",
        version = "1",
        description = "Agents report their hosts' ports; tenants own groups (partitions); the controller renders, delivers and verifies the partitions."
    ),
    components(schemas(ErrorBody, crate::model::NotLeaderBody)),
    modifiers(&SecuritySchemes)
)]
pub(crate) struct ApiDoc;

/// The three bearer schemes: an admin token, an admin or tenant token, an agent secret.
struct SecuritySchemes;

impl Modify for SecuritySchemes {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        let components = doc.components.get_or_insert_with(Default::default);
        for (name, what) in [
            ("admin", "an admin API token"),
            ("api", "an admin or tenant API token"),
            ("agent", "an enrolled agent's secret"),
        ] {
            components.add_security_scheme(
                name,
                SecurityScheme::Http(
                    HttpBuilder::new()
                        .scheme(HttpAuthScheme::Bearer)
                        .description(Some(what))
                        .build(),
                ),
            );
        }
    }
}

/// The document, built once.
pub fn document() -> &'static serde_json::Value {
    static DOC: OnceLock<serde_json::Value> = OnceLock::new();
    DOC.get_or_init(|| {
        let (_, mut doc) = crate::api::documented().split_for_parts();
        not_leader(&mut doc);
        // Serializing a document of plain maps and strings cannot fail; `Null` would make
        // every validator fail loudly rather than serve half a document.
        serde_json::to_value(&doc).unwrap_or(serde_json::Value::Null)
    })
}

/// Adds 421 `not_leader` to every write (`api::leader_only_writes` answers it for the whole
/// router, so no handler names it).
fn not_leader(doc: &mut utoipa::openapi::OpenApi) {
    for item in doc.paths.paths.values_mut() {
        for op in [
            &mut item.post,
            &mut item.put,
            &mut item.patch,
            &mut item.delete,
        ]
        .into_iter()
        .flatten()
        {
            op.responses.responses.insert(
                "421".into(),
                ResponseBuilder::new()
                    .description("this controller does not lead (several controllers on one PostgreSQL): `code` is `not_leader`, `leader` the leader's advertised URL or null while none is elected")
                    .content(
                        "application/json",
                        ContentBuilder::new()
                            .schema(Some(Ref::from_schema_name("NotLeaderBody")))
                            .build(),
                    )
                    .build()
                    .into(),
            );
        }
    }
}

/// An error answer: `{"error": "..."}`.
fn error(description: &str) -> RefOr<Response> {
    ResponseBuilder::new()
        .description(description)
        .content(
            "application/json",
            ContentBuilder::new()
                .schema(Some(Ref::from_schema_name("ErrorBody")))
                .build(),
        )
        .build()
        .into()
}

macro_rules! error_set {
    ($(#[$doc:meta])* $name:ident: $($code:literal => $what:literal),+ $(,)?) => {
        $(#[$doc])*
        pub(crate) struct $name;

        impl IntoResponses for $name {
            fn responses() -> BTreeMap<String, RefOr<Response>> {
                [$(($code, $what)),+]
                    .into_iter()
                    .map(|(code, what)| (code.to_string(), error(what)))
                    .collect()
            }
        }
    };
}

error_set!(
    /// What every route with a token can answer.
    Authed:
    "401" => "no token, one the controller does not know, or one that expired or was revoked",
    "500" => "something inside failed (the detail is in the controller's log)",
    "503" => "the store cannot write now (a full disk, an I/O error): the body names the store and the cause",
);
error_set!(
    /// What every admin-only route can answer.
    AdminOnly:
    "401" => "no token, one the controller does not know, or one that expired or was revoked",
    "403" => "the token's role does not allow this (it needs an admin token)",
    "500" => "something inside failed (the detail is in the controller's log)",
    "503" => "the store cannot write now (a full disk, an I/O error): the body names the store and the cause",
);
error_set!(
    /// A parameter or a stored-state rule refuses the request.
    Invalid:
    "400" => "a parameter the API refuses (a bad name, an id that is not a number, an unknown query field)",
);
error_set!(
    /// A JSON body that does not parse or is too large.
    BodyErrors:
    "400" => "a body the API refuses (an unknown or missing field, a bad name, a number out of range)",
    "413" => "a body over 1 MiB",
);
error_set!(
    /// Something named that is not there.
    Missing:
    "404" => "not found, or not visible to this token",
);
error_set!(
    /// A change that contradicts the current state.
    Conflicting:
    "409" => "contradicts the current state (exists already, still in use, no free P_Key)",
);

/// What the routes without a token can answer past their limit.
pub(crate) struct RateLimited;

impl IntoResponses for RateLimited {
    fn responses() -> BTreeMap<String, RefOr<Response>> {
        let r = ResponseBuilder::new()
            .description("too many requests without a token from this source")
            .content(
                "application/json",
                ContentBuilder::new()
                    .schema(Some(Ref::from_schema_name("ErrorBody")))
                    .build(),
            )
            .header(
                "Retry-After",
                HeaderBuilder::new()
                    .schema(ObjectBuilder::new().schema_type(Type::Integer))
                    .description(Some("seconds to wait"))
                    .build(),
            )
            .build();
        BTreeMap::from([("429".to_string(), r.into())])
    }
}

/// The schema of `weft_agent::HostReport` in the document: an object whose fields the
/// agent's type defines (weft-agent does not depend on utoipa).
pub(crate) struct HostReportSchema;

impl PartialSchema for HostReportSchema {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::Object)
            .description(Some(
                "weft_agent::HostReport: `hostname`, `rdma` (devices and their ports), `netdevs`, `gpus`; an unknown field is refused",
            ))
            .required("hostname")
            .required("rdma")
            .required("netdevs")
            .required("gpus")
            .property("hostname", ObjectBuilder::new().schema_type(Type::String))
            .property(
                "rdma",
                utoipa::openapi::schema::ArrayBuilder::new()
                    .items(ObjectBuilder::new().schema_type(Type::Object)),
            )
            .property(
                "netdevs",
                utoipa::openapi::schema::ArrayBuilder::new()
                    .items(ObjectBuilder::new().schema_type(Type::Object)),
            )
            .property(
                "gpus",
                utoipa::openapi::schema::ArrayBuilder::new()
                    .items(Ref::from_schema_name("Gpu")),
            )
            .into()
    }
}

impl ToSchema for HostReportSchema {
    fn name() -> Cow<'static, str> {
        Cow::Borrowed("HostReport")
    }

    fn schemas(schemas: &mut Vec<(String, RefOr<Schema>)>) {
        schemas.push((
            "Gpu".to_string(),
            <crate::model::GpuSchema as PartialSchema>::schema(),
        ));
    }
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::document;

    fn ops(doc: &Value) -> Vec<(String, String, &Value)> {
        let mut out = Vec::new();
        for (path, item) in doc["paths"].as_object().unwrap() {
            for (method, op) in item.as_object().unwrap() {
                out.push((path.clone(), method.clone(), op));
            }
        }
        out
    }

    /// Every `{param}` of a path is declared on each of its operations, in the path.
    #[test]
    fn every_path_parameter_is_declared() {
        let doc = document();
        for (path, method, op) in ops(doc) {
            let declared: Vec<&str> = op["parameters"]
                .as_array()
                .map(|ps| {
                    ps.iter()
                        .filter(|p| p["in"] == "path" && p["required"] == true)
                        .filter_map(|p| p["name"].as_str())
                        .collect()
                })
                .unwrap_or_default();
            let wanted: Vec<&str> = path
                .split('/')
                .filter_map(|s| s.strip_prefix('{').and_then(|s| s.strip_suffix('}')))
                .collect();
            assert_eq!(declared, wanted, "{method} {path}");
        }
    }

    /// What a token-taking route answers without a good token (401) and when the store
    /// fails (500) is documented on every one, with the error body; admin routes also
    /// document 403, and routes with a JSON body 400 and 413.
    #[test]
    fn every_operation_documents_its_refusals() {
        let doc = document();
        let mut n = 0;
        for (path, method, op) in ops(doc) {
            let codes: Vec<&String> = op["responses"].as_object().unwrap().keys().collect();
            let has = |c: &str| codes.iter().any(|k| k.as_str() == c);
            let security = op["security"].as_array();
            if let Some(sec) = security {
                n += 1;
                assert!(has("401") && has("500"), "{method} {path}: {codes:?}");
                if sec.iter().any(|s| s.get("admin").is_some()) {
                    assert!(has("403"), "{method} {path}: {codes:?}");
                }
                assert_eq!(
                    op["responses"]["401"]["content"]["application/json"]["schema"]["$ref"],
                    "#/components/schemas/ErrorBody"
                );
            } else {
                // What answers without a token is rate-limited.
                assert!(has("429"), "{method} {path}: {codes:?}");
            }
            if op.get("requestBody").is_some() {
                assert!(has("400") && has("413"), "{method} {path}: {codes:?}");
            }
            if path.contains('{') {
                assert!(
                    has("400") || method == "get" && !path.contains("{id}"),
                    "{method} {path}: {codes:?}"
                );
            }
        }
        assert!(n >= 25, "{n} operations with a token");
    }

    /// A field the server may send as `null` is nullable in the schema, and a schema
    /// of a request body refuses unknown fields as the API does.
    #[test]
    fn nullable_fields_and_closed_request_bodies() {
        let s = &document()["components"]["schemas"];
        for (schema, field) in [
            ("ServerView", "last_seen"),
            ("ServerView", "group"),
            ("OperationView", "finished"),
            ("OperationView", "last_error"),
            ("TokenCreated", "expires"),
            ("TokenView", "revoked"),
            ("StatusView", "applied_conf"),
            ("Gpu", "memory_total_bytes"),
        ] {
            let ty = &s[schema]["properties"][field]["type"];
            assert!(
                ty.as_array().is_some_and(|t| t.iter().any(|t| t == "null")),
                "{schema}.{field}: {ty}"
            );
        }
        for body in [
            "EnrollRequest",
            "CreateToken",
            "CreateGroup",
            "MoveServer",
            "AddMember",
        ] {
            assert_eq!(s[body]["additionalProperties"], false, "{body}");
        }
        assert_eq!(s["CreateToken"]["required"], serde_json::json!(["role"]));
        // What a response always carries is required, `null` or not.
        for (schema, field) in [
            ("ServerView", "last_seen"),
            ("TokenView", "revoked"),
            ("Accepted", "operation"),
            ("StatusView", "drift"),
        ] {
            let req = s[schema]["required"].as_array().unwrap();
            assert!(req.iter().any(|r| r == field), "{schema}.{field}: {req:?}");
        }
        let op = s["OperationView"]["required"].as_array().unwrap();
        assert!(
            !op.iter().any(|r| r == "warning"),
            "sent only when there is one"
        );
        assert_eq!(
            s["TokenRole"]["enum"],
            serde_json::json!(["admin", "tenant"])
        );
    }

    /// The hand-kept `Gpu` schema names exactly the fields a serialized
    /// `weft_agent::Gpu` has.
    #[test]
    fn the_gpu_schema_matches_the_agent_type() {
        let gpu = weft_agent::Gpu {
            index: 0,
            name: "NVIDIA H200".into(),
            uuid: None,
            memory_total_bytes: None,
            pci: None,
        };
        let value = serde_json::to_value(&gpu).unwrap();
        let mut sent: Vec<&String> = value.as_object().unwrap().keys().collect();
        let schema = &document()["components"]["schemas"]["Gpu"]["properties"];
        let mut documented: Vec<&String> = schema.as_object().unwrap().keys().collect();
        sent.sort();
        documented.sort();
        assert_eq!(sent, documented);
    }
}
