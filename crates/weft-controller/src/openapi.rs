//! The OpenAPI 3.1 description served at `/openapi.json`, written by hand next to the
//! routes it describes (a test checks every route of the router is in it).

use serde_json::{Value, json};

fn op(summary: &str, security: &str, body: Option<&str>, response: &str) -> Value {
    let mut o = json!({
        "summary": summary,
        "responses": {
            "200": { "description": "ok", "content": { "application/json": { "schema": { "$ref": format!("#/components/schemas/{response}") } } } },
            "401": { "description": "no or unknown token", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } },
            "403": { "description": "the token's role does not allow this" },
            "404": { "description": "not found, or not visible to this token" },
            "409": { "description": "contradicts the current state" },
            "400": { "description": "a body or parameter the API refuses (unknown field, bad name, number out of range)" },
            "413": { "description": "a body over 1 MiB" },
            "429": { "description": "too many requests without a token from this source" }
        }
    });
    if security != "none" {
        o["security"] = json!([{ security: [] }]);
    }
    if let Some(b) = body {
        o["requestBody"] = json!({ "required": true, "content": { "application/json": { "schema": { "$ref": format!("#/components/schemas/{b}") } } } });
    }
    o
}

fn obj(props: &[(&str, &str)]) -> Value {
    let mut p = serde_json::Map::new();
    for (name, ty) in props {
        let schema = match *ty {
            "string" | "integer" | "boolean" | "object" => json!({ "type": ty }),
            "string[]" => json!({ "type": "array", "items": { "type": "string" } }),
            other if other.ends_with("[]") => {
                json!({ "type": "array", "items": { "$ref": format!("#/components/schemas/{}", other.trim_end_matches("[]")) } })
            }
            other => json!({ "$ref": format!("#/components/schemas/{other}") }),
        };
        p.insert(name.to_string(), schema);
    }
    json!({ "type": "object", "properties": p })
}

/// A request body's schema: the API refuses a field not listed, and one `required` lacks.
fn req(props: &[(&str, &str)], required: &[&str]) -> Value {
    let mut o = obj(props);
    o["additionalProperties"] = json!(false);
    o["required"] = json!(required);
    o
}

/// The document, with every `{param}` of a path declared on its operations.
pub fn document() -> Value {
    let mut doc = paths_and_schemas();
    if let Some(paths) = doc["paths"].as_object_mut() {
        for (path, item) in paths.iter_mut() {
            let params: Vec<Value> = path
                .split('/')
                .filter_map(|seg| seg.strip_prefix('{').and_then(|s| s.strip_suffix('}')))
                .map(|name| {
                    // Claim and operation ids are integers; a token id is 16 hex digits.
                    let integer = name == "id" && !path.starts_with("/v1/tokens");
                    json!({
                        "name": name,
                        "in": "path",
                        "required": true,
                        "schema": { "type": if integer { "integer" } else { "string" } }
                    })
                })
                .collect();
            if params.is_empty() {
                continue;
            }
            if let Some(ops) = item.as_object_mut() {
                for op in ops.values_mut() {
                    op["parameters"] = json!(params);
                }
            }
        }
    }
    doc
}

fn paths_and_schemas() -> Value {
    let mut doc = core_paths_and_schemas();
    // Added beside the macro, which is at its recursion limit.
    doc["paths"]["/v1/groups/{group}/nodes"] = json!({ "get": op("a group's members with liveness and the GPUs their agents reported", "api", None, "NodeList") });
    let schemas = &mut doc["components"]["schemas"];
    schemas["Gpu"] = obj(&[
        ("index", "integer"),
        ("name", "string"),
        ("uuid", "string"),
        ("memory_total_bytes", "integer"),
        ("pci", "string"),
    ]);
    schemas["Node"] = obj(&[
        ("name", "string"),
        ("liveness", "string"),
        ("last_seen", "integer"),
        ("gpus", "Gpu[]"),
    ]);
    schemas["NodeList"] =
        json!({ "type": "array", "items": { "$ref": "#/components/schemas/Node" } });
    doc
}

fn core_paths_and_schemas() -> Value {
    json!({
        "openapi": "3.1.0",
        "info": { "title": "weft fabric controller", "version": "1" },
        "paths": {
            "/healthz": { "get": { "summary": "liveness", "responses": { "200": { "description": "ok" } } } },
            "/v1/agents/enroll": { "post": op("enroll an agent with a one-time token; returns its secret once", "none", Some("EnrollRequest"), "Enrolled") },
            "/v1/agents/report": { "post": op("report a host's ports (weft-agent HostReport)", "agent", Some("HostReport"), "ReportAck") },
            "/v1/agents/heartbeat": { "post": op("heartbeat", "agent", None, "Empty") },
            "/v1/enrollments": { "post": op("create a one-time enrollment token", "admin", Some("EnrollmentRequest"), "EnrollmentToken") },
            "/v1/servers": { "get": op("servers, their ports, liveness and group", "admin", None, "ServerList") },
            "/v1/claims": { "get": op("GUID claims", "admin", None, "ClaimList") },
            "/v1/claims/{id}/approve": { "post": op("give a claimed GUID to its claimant", "admin", None, "Accepted") },
            "/v1/claims/{id}/reject": { "post": op("reject a claim", "admin", None, "Empty") },
            "/v1/tenants": {
                "get": op("tenants (a tenant token sees its own)", "api", None, "TenantList"),
                "post": op("create a tenant; returns its first token once", "admin", Some("CreateTenant"), "TenantCreated")
            },
            "/v1/tenants/{tenant}": { "delete": op("delete a tenant that owns no group, and its tokens", "admin", None, "Empty") },
            "/v1/tokens": {
                "get": op("API tokens: ids and metadata, never a token", "admin", None, "TokenList"),
                "post": op("create an API token; the role is always explicit", "admin", Some("CreateToken"), "TokenCreated")
            },
            "/v1/tokens/{id}": { "delete": op("revoke a token by its id", "admin", None, "Empty") },
            "/v1/servers/{server}": { "delete": op("forget a server that is in no group", "admin", None, "Empty") },
            "/v1/groups": {
                "get": op("groups (a tenant token sees its own)", "api", None, "GroupList"),
                "post": op("create a group (a partition with a fresh P_Key)", "admin", Some("CreateGroup"), "Accepted")
            },
            "/v1/groups/{group}": {
                "get": op("one group", "api", None, "Group"),
                "delete": op("delete a group", "admin", None, "Accepted")
            },
            "/v1/groups/{group}/members": { "post": op("add a server to a group", "admin", Some("AddMember"), "Accepted") },
            "/v1/groups/{group}/members/{server}": { "delete": op("remove a server from a group", "admin", None, "Accepted") },
            "/v1/moves": { "post": op("move a server to another group in one step", "admin", Some("MoveServer"), "Accepted") },
            "/v1/operations": { "get": op("operations, newest first (?pending=true)", "admin", None, "OperationList") },
            "/v1/operations/{id}": { "get": op("one operation", "admin", None, "Operation") },
            "/v1/audit": { "get": op("the audit log, oldest first (?limit=N)", "admin", None, "AuditList") },
            "/v1/status": { "get": op("desired against observed", "admin", None, "Status") }
        },
        "components": {
            "securitySchemes": {
                "admin": { "type": "http", "scheme": "bearer", "description": "an admin API token" },
                "api": { "type": "http", "scheme": "bearer", "description": "an admin or tenant API token" },
                "agent": { "type": "http", "scheme": "bearer", "description": "an enrolled agent's secret" }
            },
            "schemas": {
                "Empty": { "type": "object" },
                "Error": obj(&[("error", "string")]),
                "EnrollRequest": req(&[("token", "string"), ("hostname", "string")], &["token", "hostname"]),
                "Enrolled": obj(&[("server", "string"), ("secret", "string")]),
                "HostReport": { "type": "object", "description": "weft_agent::HostReport: hostname, rdma, netdevs, gpus" },
                "ReportAck": obj(&[("server", "string"), ("owned", "string[]"), ("pending", "string[]")]),
                "EnrollmentRequest": req(&[("server", "string"), ("ttl_s", "integer")], &[]),
                "EnrollmentToken": obj(&[("token", "string"), ("expires", "integer")]),
                "Port": obj(&[("guid", "string"), ("device", "string"), ("num", "integer"), ("lid", "integer"), ("state", "string")]),
                "Server": obj(&[("name", "string"), ("liveness", "string"), ("last_seen", "integer"), ("ports", "Port[]"), ("group", "string"), ("pending_claims", "string[]")]),
                "ServerList": { "type": "array", "items": { "$ref": "#/components/schemas/Server" } },
                "Claim": obj(&[("id", "integer"), ("guid", "string"), ("claimant", "string"), ("owner", "string"), ("state", "string"), ("created", "integer")]),
                "ClaimList": { "type": "array", "items": { "$ref": "#/components/schemas/Claim" } },
                "Tenant": obj(&[("name", "string"), ("groups", "string[]")]),
                "TenantList": { "type": "array", "items": { "$ref": "#/components/schemas/Tenant" } },
                "CreateTenant": req(&[("name", "string")], &["name"]),
                "TenantCreated": obj(&[("tenant", "Tenant"), ("token", "string")]),
                "CreateToken": {
                    "type": "object",
                    "additionalProperties": false,
                    "required": ["role"],
                    "properties": {
                        "role": { "type": "string", "enum": ["admin", "tenant"] },
                        "tenant": { "type": "string", "description": "for and only for role tenant" },
                        "ttl_s": { "type": "integer", "minimum": 60, "maximum": 315_360_000u64 }
                    }
                },
                "TokenCreated": obj(&[("token", "string"), ("id", "string"), ("expires", "integer")]),
                "Token": obj(&[("id", "string"), ("role", "string"), ("tenant", "string"), ("source", "string"), ("created", "integer"), ("expires", "integer"), ("revoked", "integer")]),
                "TokenList": { "type": "array", "items": { "$ref": "#/components/schemas/Token" } },
                "Group": obj(&[("name", "string"), ("tenant", "string"), ("pkey", "string"), ("members", "string[]"), ("ports", "string[]")]),
                "GroupList": { "type": "array", "items": { "$ref": "#/components/schemas/Group" } },
                "CreateGroup": req(&[("name", "string"), ("tenant", "string")], &["name", "tenant"]),
                "AddMember": req(&[("server", "string")], &["server"]),
                "MoveServer": req(&[("server", "string"), ("to", "string")], &["server", "to"]),
                "Operation": obj(&[("id", "integer"), ("actor", "string"), ("action", "string"), ("generation", "integer"), ("state", "string"), ("attempts", "integer"), ("last_error", "string"), ("diff", "string"), ("created", "integer"), ("finished", "integer"), ("warning", "string")]),
                "OperationList": { "type": "array", "items": { "$ref": "#/components/schemas/Operation" } },
                "Accepted": obj(&[("operation", "Operation")]),
                "AuditEntry": obj(&[("id", "integer"), ("at", "integer"), ("actor", "string"), ("action", "string"), ("subject", "string"), ("diff", "string"), ("outcome", "string"), ("detail", "string")]),
                "AuditList": { "type": "array", "items": { "$ref": "#/components/schemas/AuditEntry" } },
                "Status": obj(&[("desired_generation", "integer"), ("applied_generation", "integer"), ("applied_checksum", "string"), ("pending_operations", "integer"), ("stale_servers", "string[]"), ("delivers", "boolean"), ("drift", "object"), ("applied_conf", "string")])
            }
        }
    })
}
