//! The API's OpenAPI 3 document, served at `/v1/openapi.json`: every route with its
//! parameters, request body and answers, the bodies' schemas generated (schemars) from
//! the very types the handlers parse and serialise, so the document cannot drift from
//! what is sent. Every error is the `Problem` schema (`application/problem+json`).
//! Schemathesis checks the running API against it in the test suite.

use schemars::generate::{Contract, SchemaGenerator, SchemaSettings};
use schemars::JsonSchema;
use serde_json::{json, Map, Value};

use super::{GridPushBody, InterruptBody, TokenRequest};
use crate::federation::{
    ApiTokenSpec, ApiTokenView, DeploymentSpec, DeploymentStatus, DeviceDeploymentStatus,
    DeviceView, JoinTokenView, ModelView, RegionView, RolloutView, TenantView,
};
use crate::scheduler::{GridPushView, GridView, JobSpec, JobView, NodeView, ReplicaSetView};
use crate::store::AuditRecord;

/// What a route takes as its body.
enum Body {
    None,
    Json(Value),
    /// A model upload: the ONNX file's bytes, or a JSON push.
    Model,
}

/// A route's answer on success.
enum Answer {
    Json(u16, Value),
    Empty(u16),
    /// A model push: 200 (the same file), 201 (built, `?wait=true`) or 202 (building).
    Model(Value),
    /// Server-sent events.
    Events,
    /// A PUT that creates (201) or replaces (200), answering the object either way.
    Put(Value),
}

struct Query {
    name: &'static str,
    schema: Value,
    about: &'static str,
}

struct Route {
    method: &'static str,
    path: &'static str,
    id: &'static str,
    summary: &'static str,
    /// The least role that may call it (see `federation::access`).
    role: &'static str,
    query: Vec<Query>,
    body: Body,
    answer: Answer,
}

/// Both contracts' generators: responses as they are serialised, requests as they
/// are parsed (a field with a default is optional in a request, a field skipped when
/// empty is optional in an answer).
struct Schemas {
    out: SchemaGenerator,
    input: SchemaGenerator,
}

impl Schemas {
    fn new() -> Schemas {
        let settings = |contract| {
            SchemaSettings::openapi3().with(|s| {
                s.contract = contract;
                s.meta_schema = None;
            })
        };
        Schemas {
            out: settings(Contract::Serialize).into_generator(),
            input: settings(Contract::Deserialize).into_generator(),
        }
    }

    fn out<T: JsonSchema>(&mut self) -> Value {
        self.out.subschema_for::<T>().to_value()
    }

    fn list<T: JsonSchema>(&mut self) -> Value {
        json!({"type": "array", "items": self.out::<T>()})
    }

    /// A request schema; its components are renamed `…Input` below.
    fn input<T: JsonSchema>(&mut self) -> Value {
        rename_refs(self.input.subschema_for::<T>().to_value())
    }
}

const REF: &str = "#/components/schemas/";

/// Points a request schema's references at the `…Input` components.
fn rename_refs(value: Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.into_iter()
                .map(|(k, v)| match (k.as_str(), v) {
                    ("$ref", Value::String(r)) => {
                        let renamed = match r.strip_prefix(REF) {
                            Some(name) => format!("{REF}{name}Input"),
                            None => r,
                        };
                        (k, Value::String(renamed))
                    }
                    (_, v) => (k, rename_refs(v)),
                })
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.into_iter().map(rename_refs).collect()),
        other => other,
    }
}

fn string() -> Value {
    json!({"type": "string"})
}

fn name_param() -> Value {
    json!({"type": "string", "minLength": 1})
}

fn routes(s: &mut Schemas) -> Vec<Route> {
    let q = |name, schema, about| Query {
        name,
        schema,
        about,
    };
    let job_query = || {
        vec![
            q(
                "region",
                string(),
                "the job's region (default: every region is searched)",
            ),
            q("tenant", string(), "another tenant's job (admins only)"),
        ]
    };
    let route = |method, path, id, summary, role, body, answer| Route {
        method,
        path,
        id,
        summary,
        role,
        query: Vec::new(),
        body,
        answer,
    };
    let mut routes = vec![
        route(
            "post",
            "/v1/tokens",
            "createJoinToken",
            "Create a single-use join token for enrolling a device (returned once).",
            "operator",
            Body::Json(s.input::<TokenRequest>()),
            Answer::Json(201, s.out::<JoinTokenView>()),
        ),
        route(
            "get",
            "/v1/tokens",
            "listJoinTokens",
            "Join tokens (never their secrets).",
            "operator",
            Body::None,
            Answer::Json(200, s.list::<JoinTokenView>()),
        ),
        route(
            "get",
            "/v1/devices",
            "listDevices",
            "Enrolled devices with profile, accelerators, labels and health.",
            "viewer",
            Body::None,
            Answer::Json(200, s.list::<DeviceView>()),
        ),
        route(
            "get",
            "/v1/devices/{name}",
            "getDevice",
            "One device: role, region, profile, labels, health, link and what it runs (another tenant's deployments left out).",
            "viewer",
            Body::None,
            Answer::Json(200, s.out::<DeviceView>()),
        ),
        route(
            "delete",
            "/v1/devices/{name}",
            "deleteDevice",
            "Remove a device from the fleet; its certificate is refused from then on.",
            "operator",
            Body::None,
            Answer::Empty(204),
        ),
        route(
            "get",
            "/v1/devices/{name}/usage",
            "deviceUsage",
            "What the device reported serving, per deployment, each record counted once.",
            "viewer",
            Body::None,
            Answer::Json(200, json!({"type": "object"})),
        ),
        route(
            "get",
            "/v1/models",
            "listModels",
            "Every version of every model of the caller's tenant.",
            "viewer",
            Body::None,
            Answer::Json(200, s.list::<ModelView>()),
        ),
        route(
            "get",
            "/v1/models/{name}",
            "getModel",
            "One model version (`name:version`), or a name's latest version or build.",
            "viewer",
            Body::None,
            Answer::Json(200, s.out::<ModelView>()),
        ),
        route(
            "delete",
            "/v1/models/{name}",
            "deleteModel",
            "Delete a model version (`name:version`), or every version of a name; refused (409) while a deployment runs one. Answers with what was deleted.",
            "developer",
            Body::None,
            Answer::Json(200, s.list::<ModelView>()),
        ),
        route(
            "post",
            "/v1/deployments",
            "createDeployment",
            "Deploy a model to the devices a selector picks.",
            "developer",
            Body::Json(s.input::<DeploymentSpec>()),
            Answer::Json(201, s.out::<DeploymentStatus>()),
        ),
        route(
            "get",
            "/v1/deployments",
            "listDeployments",
            "Deployments of the caller's tenant with their status per device.",
            "viewer",
            Body::None,
            Answer::Json(200, s.list::<DeploymentStatus>()),
        ),
        route(
            "get",
            "/v1/deployments/{name}",
            "getDeployment",
            "A deployment's status per device.",
            "viewer",
            Body::None,
            Answer::Json(200, s.out::<DeploymentStatus>()),
        ),
        route(
            "put",
            "/v1/deployments/{name}",
            "updateDeployment",
            "Change a deployment; what devices run is rolled out in gated steps.",
            "developer",
            Body::Json(s.input::<DeploymentSpec>()),
            Answer::Json(200, s.out::<DeploymentStatus>()),
        ),
        route(
            "delete",
            "/v1/deployments/{name}",
            "deleteDeployment",
            "Undeploy.",
            "developer",
            Body::None,
            Answer::Empty(204),
        ),
        route(
            "get",
            "/v1/deployments/{name}/devices",
            "listDeploymentDevices",
            "A deployment's row per device (edge devices and pool agents), in name order.",
            "viewer",
            Body::None,
            Answer::Json(200, s.list::<DeviceDeploymentStatus>()),
        ),
        route(
            "get",
            "/v1/deployments/{name}/rollout",
            "getRollout",
            "The deployment's latest rollout.",
            "viewer",
            Body::None,
            Answer::Json(200, s.out::<RolloutView>()),
        ),
        route(
            "post",
            "/v1/deployments/{name}/rollout/{action}",
            "actOnRollout",
            "Pause, resume or roll back the rollout under way.",
            "developer",
            Body::None,
            Answer::Json(200, s.out::<DeploymentStatus>()),
        ),
        route(
            "get",
            "/v1/deployments/{name}/replicas",
            "deploymentReplicas",
            "Its cloud replicas per region and the autoscaler's last decision.",
            "viewer",
            Body::None,
            Answer::Json(200, s.list::<ReplicaSetView>()),
        ),
        route(
            "get",
            "/v1/regions",
            "listRegions",
            "Regions, their pools and device counts.",
            "viewer",
            Body::None,
            Answer::Json(200, s.list::<RegionView>()),
        ),
        route(
            "get",
            "/v1/regions/{name}/nodes",
            "listNodes",
            "The region's node slots.",
            "viewer",
            Body::None,
            Answer::Json(200, s.list::<NodeView>()),
        ),
        route(
            "post",
            "/v1/regions/{name}/nodes/{node}/interrupt",
            "interruptNode",
            "A spot interruption notice: the node's work moves away within the notice.",
            "operator",
            Body::Json(s.input::<InterruptBody>()),
            Answer::Json(200, s.list::<NodeView>()),
        ),
        route(
            "post",
            "/v1/regions/{name}/nodes/{node}/drain",
            "drainNode",
            "Move the node's work away, then release it.",
            "operator",
            Body::None,
            Answer::Json(200, s.list::<NodeView>()),
        ),
        route(
            "put",
            "/v1/regions/{name}/grid",
            "pushGrid",
            "Hourly carbon intensity and prices from a feed; all stored or none.",
            "admin",
            Body::Json(s.input::<GridPushBody>()),
            Answer::Json(200, s.out::<GridPushView>()),
        ),
        route(
            "get",
            "/v1/regions/{name}/grid",
            "getGrid",
            "The region's grid signal and the next 72 hours.",
            "viewer",
            Body::None,
            Answer::Json(200, s.out::<GridView>()),
        ),
        route(
            "post",
            "/v1/jobs",
            "submitJob",
            "Queue a job (a pod, or a gang placed all or none).",
            "developer",
            Body::Json(s.input::<JobSpec>()),
            Answer::Json(201, s.out::<JobView>()),
        ),
        route(
            "post",
            "/v1/api-tokens",
            "createApiToken",
            "Create an API token; the token is in this answer only.",
            "admin",
            Body::Json(s.input::<ApiTokenSpec>()),
            Answer::Json(201, s.out::<ApiTokenView>()),
        ),
        route(
            "get",
            "/v1/api-tokens",
            "listApiTokens",
            "Every API token, never a secret.",
            "admin",
            Body::None,
            Answer::Json(200, s.list::<ApiTokenView>()),
        ),
        route(
            "delete",
            "/v1/api-tokens/{id}",
            "revokeApiToken",
            "Revoke a token at once.",
            "admin",
            Body::None,
            Answer::Json(200, s.out::<ApiTokenView>()),
        ),
        route(
            "post",
            "/v1/api-tokens/{id}/rotate",
            "rotateApiToken",
            "A new secret for the token (in this answer only); the old one stops working.",
            "admin",
            Body::None,
            Answer::Json(200, s.out::<ApiTokenView>()),
        ),
        route(
            "get",
            "/v1/tenants",
            "listTenants",
            "Tenants with their quotas and holdings (the caller's; admins: all).",
            "viewer",
            Body::None,
            Answer::Json(200, s.list::<TenantView>()),
        ),
        route(
            "get",
            "/v1/tenants/{name}",
            "getTenant",
            "One tenant with its quotas and holdings.",
            "viewer",
            Body::None,
            Answer::Json(200, s.out::<TenantView>()),
        ),
        route(
            "put",
            "/v1/tenants/{name}",
            "putTenant",
            "Create a tenant (201) or replace its weight and quotas (200); its regions take them at once.",
            "admin",
            Body::Json(s.input::<super::tenants::TenantBody>()),
            Answer::Put(s.out::<TenantView>()),
        ),
        route(
            "delete",
            "/v1/tenants/{name}",
            "deleteTenant",
            "Delete a tenant that holds nothing (no jobs, API tokens, models or deployments).",
            "admin",
            Body::None,
            Answer::Json(200, s.out::<TenantView>()),
        ),
    ];
    let model = s.out::<ModelView>();
    routes.push(Route {
        query: vec![
            q("wait", json!({"type": "boolean"}), "answer once built (201) instead of at once (202)"),
            q("input", json!({"type": "array", "items": {"type": "string"}}), "NAME=DIMS[:DTYPE][=VALUE]: an input's shape (repeatable)"),
            q("state", json!({"type": "array", "items": {"type": "string"}}), "INPUT=OUTPUT: a recurrent state (repeatable)"),
            q("accept", json!({"type": "array", "items": {"type": "string"}}), "[OUTPUT=]RULE: what a variant's outputs are judged on against full: cosine[:MIN], argmax, topk:K, detections:score=S (repeatable)"),
            q("tenant", string(), "push for another tenant (admins only)"),
        ],
        ..route("put", "/v1/models/{name}", "pushModel", "Upload a model (ONNX bytes, or a JSON push with validation rows); builds and measures its variants.", "developer", Body::Model, Answer::Model(model))
    });
    let jobs = s.list::<JobView>();
    let job = s.out::<JobView>();
    let mut list_query = job_query();
    list_query.push(q(
        "state",
        json!({"type": "string", "enum": super::JOB_STATES}),
        "only the jobs in this state",
    ));
    routes.push(Route {
        query: list_query,
        ..route(
            "get",
            "/v1/jobs",
            "listJobs",
            "Jobs of the caller's tenant (admins: every tenant unless one is named).",
            "viewer",
            Body::None,
            Answer::Json(200, jobs),
        )
    });
    routes.push(Route {
        query: job_query(),
        ..route(
            "get",
            "/v1/jobs/{name}",
            "getJob",
            "A job's state, placement per member and why it waits.",
            "viewer",
            Body::None,
            Answer::Json(200, job.clone()),
        )
    });
    routes.push(Route {
        query: job_query(),
        ..route(
            "delete",
            "/v1/jobs/{name}",
            "deleteJob",
            "Cancel or end a job; answers with the job as it was.",
            "developer",
            Body::None,
            Answer::Json(200, job),
        )
    });
    let mut logs_query = job_query();
    logs_query.extend([
        q(
            "member",
            json!({"type": "integer", "minimum": 0}),
            "the gang member (default 0)",
        ),
        q(
            "attempt",
            json!({"type": "integer", "minimum": 0}),
            "the attempt (default: the latest)",
        ),
        q(
            "offset",
            json!({"type": "integer", "minimum": 0}),
            "from this byte",
        ),
        q(
            "max_bytes",
            json!({"type": "integer", "minimum": 1}),
            "at most this many bytes",
        ),
    ]);
    let logs = s.out::<nephele_api::JobLogsView>();
    routes.push(Route {
        query: logs_query,
        ..route(
            "get",
            "/v1/jobs/{name}/logs",
            "jobLogs",
            "A member's output, read from its pool agent.",
            "viewer",
            Body::None,
            Answer::Json(200, logs),
        )
    });
    routes.push(Route {
        query: vec![
            q(
                "kinds",
                string(),
                "comma-separated: device, model, deployment, job, node (default: all)",
            ),
            q(
                "since",
                string(),
                "resume after this event id (or send Last-Event-ID)",
            ),
            q(
                "timeout_s",
                json!({"type": "integer", "minimum": 1, "maximum": 86400}),
                "end the stream after this long",
            ),
        ],
        ..route(
            "get",
            "/v1/watch",
            "watch",
            "Follow changes to devices, models, deployments, jobs and nodes as server-sent events.",
            "viewer",
            Body::None,
            Answer::Events,
        )
    });
    let report_query = || {
        vec![
            q(
                "from",
                json!({"type": "integer", "minimum": 0}),
                "unix seconds, rounded down to the hour (default: 24 hours before `to`)",
            ),
            q(
                "to",
                json!({"type": "integer", "minimum": 0}),
                "unix seconds, rounded up to the hour (default: now)",
            ),
            q(
                "group",
                json!({"type": "string", "enum": ["workload", "tenant"]}),
                "a row per job and deployment (default), or per tenant",
            ),
            q("tenant", string(), "only this tenant's rows (admins only)"),
            q("region", string(), "only this region's pools"),
        ]
    };
    let cost = s.out::<crate::reports::CostReport>();
    routes.push(Route {
        query: report_query(),
        ..route(
            "get",
            "/v1/reports/cost",
            "reportCost",
            "Chargeback: GPU- and CPU-seconds, cost, and requests served on devices, per job, deployment or tenant over a range.",
            "viewer",
            Body::None,
            Answer::Json(200, cost),
        )
    });
    let carbon = s.out::<crate::reports::CarbonReport>();
    routes.push(Route {
        query: report_query(),
        ..route(
            "get",
            "/v1/reports/carbon",
            "reportCarbon",
            "Showback: energy and the carbon it emitted at each hour's measured intensity, per job, deployment or tenant over a range.",
            "viewer",
            Body::None,
            Answer::Json(200, carbon),
        )
    });
    let audit = s.list::<AuditRecord>();
    routes.push(Route {
        query: vec![
            q(
                "after",
                json!({"type": "integer", "minimum": 0}),
                "entries after this sequence number",
            ),
            q(
                "limit",
                json!({"type": "integer", "minimum": 1, "maximum": 1000}),
                "the newest this many (default 100)",
            ),
            q("tenant", string(), "only this tenant's"),
        ],
        ..route(
            "get",
            "/v1/audit",
            "listAudit",
            "The audit log, oldest first: every change, allowed or refused.",
            "admin",
            Body::None,
            Answer::Json(200, audit),
        )
    });
    // A deployment's status with or without its row per device.
    for route in routes
        .iter_mut()
        .filter(|r| r.id == "listDeployments" || r.id == "getDeployment")
    {
        route.query.push(q(
            "devices",
            json!({"type": "boolean", "default": true}),
            "false: the counts per phase only, without a row per device",
        ));
    }
    // Lists that take `limit` and `after` (`api::page`).
    for route in routes.iter_mut().filter(|r| PAGED.contains(&r.id)) {
        route.query.push(q(
            "limit",
            json!({"type": "integer", "minimum": 1, "maximum": super::page::MAX_LIMIT}),
            "items per page; the next page is in the Link header (rel=\"next\")",
        ));
        route.query.push(q(
            "after",
            string(),
            "the key after which the page starts (from the previous page's Link header)",
        ));
    }
    routes
}

/// The operations whose lists are paged.
const PAGED: [&str; 7] = [
    "listJoinTokens",
    "listDevices",
    "listModels",
    "listDeployments",
    "listDeploymentDevices",
    "listJobs",
    "listApiTokens",
];

fn problem_schema() -> Value {
    json!({
        "type": "object",
        "description": "RFC 9457 problem details; `field` names the value at fault when there is one.",
        "required": ["type", "title", "status", "detail"],
        "properties": {
            "type": {"type": "string"},
            "title": {"type": "string"},
            "status": {"type": "integer"},
            "detail": {"type": "string"},
            "field": {"type": "string"},
            "retry_after_s": {"type": "integer"},
            "error": {"type": "string"},
            "message": {"type": "string"}
        }
    })
}

fn operation(route: &Route) -> Value {
    let mut parameters: Vec<Value> = route
        .path
        .split('/')
        .filter_map(|segment| segment.strip_prefix('{')?.strip_suffix('}'))
        .map(|name| {
            let schema = if name == "action" {
                json!({"type": "string", "enum": ["pause", "resume", "rollback"]})
            } else {
                name_param()
            };
            json!({"name": name, "in": "path", "required": true, "schema": schema})
        })
        .collect();
    for query in &route.query {
        let mut parameter = json!({
            "name": query.name, "in": "query", "required": false,
            "schema": query.schema, "description": query.about
        });
        if query.schema["type"] == "array" {
            parameter["style"] = "form".into();
            parameter["explode"] = true.into();
        }
        parameters.push(parameter);
    }
    let problem = json!({"description": "a problem (RFC 9457)", "content": {
        "application/problem+json": {"schema": {"$ref": format!("{REF}Problem")}}
    }});
    let mut responses = Map::new();
    match &route.answer {
        Answer::Json(status, schema) => {
            let mut answer =
                json!({"description": "done", "content": {"application/json": {"schema": schema}}});
            if PAGED.contains(&route.id) {
                answer["headers"] = json!({
                    "Link": {"description": "the next page: `<URL>; rel=\"next\"` (absent on the last)", "schema": {"type": "string"}},
                    "X-Total-Count": {"description": "items in the whole list", "schema": {"type": "integer"}}
                });
            }
            responses.insert(status.to_string(), answer);
        }
        Answer::Empty(status) => {
            responses.insert(status.to_string(), json!({"description": "done"}));
        }
        Answer::Events => {
            responses.insert(
                "200".into(),
                json!({"description": "server-sent events: `id: <epoch>-<version>`, `event: <kind>` (or `reset`), `data:` {version, kind, name, action, tenant?, region?, unix_ms}", "content": {"text/event-stream": {"schema": {"type": "string"}}}}),
            );
        }
        Answer::Put(schema) => {
            for (status, about) in [("200", "replaced"), ("201", "created")] {
                responses.insert(
                    status.into(),
                    json!({"description": about, "content": {"application/json": {"schema": schema}}}),
                );
            }
        }
        Answer::Model(schema) => {
            for (status, about) in [
                ("200", "the same file is stored already"),
                ("201", "built and stored (`?wait=true`)"),
                ("202", "building; poll GET /v1/models/{name}"),
            ] {
                responses.insert(
                    status.into(),
                    json!({"description": about, "content": {"application/json": {"schema": schema}}}),
                );
            }
        }
    }
    responses.insert("default".into(), problem);
    let mut op = json!({
        "operationId": route.id,
        "summary": route.summary,
        "description": format!("Needs the {} role or above.", route.role),
        "parameters": parameters,
        "responses": responses,
    });
    match &route.body {
        Body::None => {}
        Body::Json(schema) => {
            op["requestBody"] =
                json!({"required": true, "content": {"application/json": {"schema": schema}}});
        }
        Body::Model => {
            op["requestBody"] = json!({"required": true, "content": {
                "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
                "application/json": {"schema": {"type": "object", "description": "{\"onnx_base64\", \"validation\"?: {\"rows\", \"labels\"?}} or {\"bert\": {…}}"}}
            }});
        }
    }
    op
}

/// The whole document.
pub fn document() -> Value {
    let mut schemas = Schemas::new();
    let routes = routes(&mut schemas);
    let mut paths = Map::new();
    for route in &routes {
        let item = paths
            .entry(route.path.to_string())
            .or_insert_with(|| json!({}));
        item[route.method] = operation(route);
    }
    let mut components = schemas.out.take_definitions(true);
    for (name, schema) in schemas.input.take_definitions(true) {
        components.insert(format!("{name}Input"), rename_refs(schema));
    }
    components.insert("Problem".into(), problem_schema());
    json!({
        "openapi": "3.0.3",
        "info": {
            "title": "nephele API",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "The control plane's REST API. Every route needs `Authorization: Bearer <token>`; what each role may call is in each operation's description. Errors are application/problem+json."
        },
        "servers": [{"url": "/"}],
        "security": [{"bearer": []}],
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every `$ref` in the document resolves, and every route of the API is in it.
    #[test]
    fn the_document_is_whole() {
        let doc = document();
        let text = doc.to_string();
        let components = doc["components"]["schemas"].as_object().unwrap();
        for piece in text.split("\"$ref\":\"").skip(1) {
            let target = piece.split('"').next().unwrap();
            let name = target.strip_prefix(REF).unwrap();
            assert!(components.contains_key(name), "{target} does not resolve");
        }
        let paths = doc["paths"].as_object().unwrap();
        assert_eq!(
            paths
                .values()
                .map(|p| p.as_object().unwrap().len())
                .sum::<usize>(),
            42
        );
        assert!(components.contains_key("DeploymentSpecInput"));
        assert!(components.contains_key("DeploymentStatus"));
        // A request's optional fields are optional; an answer's always-sent ones required.
        let spec = &components["DeploymentSpecInput"];
        assert_eq!(spec["required"], json!(["name", "model"]));
        let status = &components["DeploymentStatus"];
        assert!(status["required"]
            .as_array()
            .unwrap()
            .contains(&json!("tenant")));
    }
}
