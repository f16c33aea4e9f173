//! The kit of an aggregated (extension) API server behind kube-apiserver: discovery as the
//! aggregator and kubectl ask for it (legacy `APIGroupList`/`APIGroup`/`APIResourceList`, and the
//! aggregated v2 / v2beta1 document with an ETag), health and minimal OpenAPI answers, reading a
//! request object the way kube-apiserver does (JSON or YAML, size limit, `apiVersion`/`kind`
//! checks, errors that never quote the body), and `metav1.Status` responses.
//!
//! A server lists its [`ApiResource`]s once ([`Discovery::new`]), answers
//! [`Discovery::respond`] and [`common`] first, and routes the rest to its own handlers; the
//! [`server`] runs it (TLS, who the caller is, the serving certificate, graceful drain).

pub mod server;

use std::{
    collections::BTreeMap,
    hash::{Hash as _, Hasher as _},
};

use bytes::Bytes;
use http::{header, HeaderMap, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt as _, Full, Limited};
use selkie_api::json::error_without_values;
use serde_json::{json, Value};

/// A response body.
pub type Body = Full<Bytes>;

/// The largest request body read (kube-apiserver's limit is larger; these objects are small).
pub const MAX_BODY_BYTES: usize = 256 * 1024;
/// How long a request's whole body may take to arrive (a slow body would keep its connection and
/// task forever).
pub const BODY_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
/// `Accept` (and `Content-Type`) of the aggregated discovery document, v2.
pub const DISCOVERY_V2: &str = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";
/// The same, v2beta1 (still asked for by kube-apiserver 1.35, after v2).
pub const DISCOVERY_V2BETA1: &str =
    "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList";

/// One resource an aggregated API serves.
#[derive(Debug, Clone)]
pub struct ApiResource {
    /// Its API group (suffixed).
    pub group: String,
    /// Its version.
    pub version: &'static str,
    /// Plural name, as in the URL.
    pub plural: &'static str,
    /// Singular name.
    pub singular: &'static str,
    /// Kind.
    pub kind: &'static str,
    /// Verbs.
    pub verbs: &'static [&'static str],
    /// Whether it lives in namespaces.
    pub namespaced: bool,
}

/// A group's versions, each with its resources, in first-seen order.
type Versions<'a> = Vec<(&'static str, Vec<&'a ApiResource>)>;

/// One group's documents: `APIGroup` and, by version, `APIResourceList`.
#[derive(Debug)]
struct Group {
    name: String,
    document: Bytes,
    versions: Vec<(&'static str, Bytes)>,
}

/// The discovery documents of a set of resources, computed once.
#[derive(Debug)]
pub struct Discovery {
    group_list: Bytes,
    v2: Bytes,
    v2beta1: Bytes,
    etag: String,
    groups: Vec<Group>,
}

impl Discovery {
    /// The documents for `resources`, grouped by group and version in the order given.
    pub fn new(resources: &[ApiResource]) -> Self {
        // group → version → resources, in first-seen order.
        let mut order: Vec<&str> = Vec::new();
        let mut by_group: BTreeMap<&str, Versions<'_>> = BTreeMap::new();
        for resource in resources {
            let versions = by_group.entry(&resource.group).or_insert_with(|| {
                order.push(&resource.group);
                Vec::new()
            });
            match versions
                .iter_mut()
                .find(|(version, _)| *version == resource.version)
            {
                Some((_, list)) => list.push(resource),
                None => versions.push((resource.version, vec![resource])),
            }
        }
        let grouped: Vec<(&str, &Versions<'_>)> = order
            .iter()
            .filter_map(|group| by_group.get(group).map(|versions| (*group, versions)))
            .collect();
        let api_group = |group: &str, versions: &Versions<'_>| {
            let listed: Vec<Value> = versions
                .iter()
                .map(|(version, _)| json!({"groupVersion": format!("{group}/{version}"), "version": version}))
                .collect();
            json!({"kind": "APIGroup", "apiVersion": "v1", "name": group,
                   "versions": listed, "preferredVersion": listed.first().cloned().unwrap_or(Value::Null)})
        };
        let group_list = json!({"kind": "APIGroupList", "apiVersion": "v1",
            "groups": grouped.iter().map(|(group, versions)| api_group(group, versions)).collect::<Vec<_>>()});
        let discovery = |api_version: &str| {
            let items: Vec<Value> = grouped
                .iter()
                .map(|(group, versions)| {
                    json!({
                        "metadata": {"name": group, "creationTimestamp": null},
                        "versions": versions.iter().map(|(version, resources)| json!({
                            "version": version,
                            "resources": resources.iter().map(|r| json!({
                                "resource": r.plural,
                                "responseKind": {"group": r.group, "version": version, "kind": r.kind},
                                "scope": if r.namespaced { "Namespaced" } else { "Cluster" },
                                "singularResource": r.singular,
                                "verbs": r.verbs,
                            })).collect::<Vec<_>>(),
                            "freshness": "Current",
                        })).collect::<Vec<_>>(),
                    })
                })
                .collect();
            Bytes::from(
                json!({"kind": "APIGroupDiscoveryList",
                    "apiVersion": format!("apidiscovery.k8s.io/{api_version}"),
                    "metadata": {}, "items": items})
                .to_string(),
            )
        };
        let v2 = discovery("v2");
        let mut hasher = std::hash::DefaultHasher::new();
        v2.hash(&mut hasher);
        let groups = grouped
            .iter()
            .map(|(group, versions)| Group {
                name: group.to_string(),
                document: Bytes::from(api_group(group, versions).to_string()),
                versions: versions
                    .iter()
                    .map(|(version, resources)| {
                        let list = json!({
                            "kind": "APIResourceList", "apiVersion": "v1",
                            "groupVersion": format!("{group}/{version}"),
                            "resources": resources.iter().map(|r| json!({
                                "name": r.plural, "singularName": r.singular, "namespaced": r.namespaced,
                                "kind": r.kind, "verbs": r.verbs})).collect::<Vec<_>>(),
                        });
                        (*version, Bytes::from(list.to_string()))
                    })
                    .collect(),
            })
            .collect();
        Self {
            group_list: Bytes::from(group_list.to_string()),
            v2,
            v2beta1: discovery("v2beta1"),
            etag: format!("\"{:016x}\"", hasher.finish()),
            groups,
        }
    }

    /// What an aggregated server answers before its own routes: [`common`] (health and OpenAPI
    /// titled `title`; `/readyz` fails until `ready`, the serving certificate and the front
    /// proxy's settings loaded), then these discovery documents. `None`: the request is for the
    /// server's own routes.
    pub fn answer_shared(
        &self,
        segments: &[&str],
        method: &Method,
        headers: &HeaderMap,
        ready: bool,
        title: &str,
    ) -> Option<Response<Body>> {
        common(
            segments,
            method,
            ready,
            "serving certificate or extension-apiserver-authentication not loaded yet",
            title,
        )
        .or_else(|| self.respond(segments, method, headers))
    }

    /// The answer to a discovery request: `/apis` (aggregated when asked for, v2 before v2beta1,
    /// with `ETag` and `304` on `If-None-Match`), `/apis/<group>` and `/apis/<group>/<version>`
    /// (`404` for groups and versions not served, `405` for other methods). `None` when `segments`
    /// (the path split at `/`, without empty ends) is not a discovery path.
    pub fn respond(&self, segments: &[&str], method: &Method, headers: &HeaderMap) -> Option<Response<Body>> {
        let get = *method == Method::GET || *method == Method::HEAD;
        let group = |name: &str| self.groups.iter().find(|group| group.name == name);
        Some(match segments {
            ["apis"] if get => self.group_list(headers),
            ["apis", name] if get => match group(name) {
                Some(group) => json_response(StatusCode::OK, "application/json", group.document.clone()),
                None => not_found(),
            },
            ["apis", name, version] => {
                let found = group(name).and_then(|group| group.versions.iter().find(|(v, _)| v == version));
                match found {
                    Some((_, list)) if get => json_response(StatusCode::OK, "application/json", list.clone()),
                    Some(_) => method_not_allowed(),
                    None if get => not_found(),
                    // Another method on a served version's group path is refused as a method.
                    None if self
                        .groups
                        .iter()
                        .any(|g| g.versions.iter().any(|(v, _)| v == version)) =>
                    {
                        method_not_allowed()
                    }
                    None => return None,
                }
            }
            ["apis"] | ["apis", _] => method_not_allowed(),
            _ => return None,
        })
    }

    fn group_list(&self, headers: &HeaderMap) -> Response<Body> {
        let accept = headers
            .get_all(header::ACCEPT)
            .iter()
            .filter_map(|value| value.to_str().ok())
            .flat_map(|value| value.split(','))
            .map(|range| range.split(';').map(str::trim).collect::<Vec<_>>())
            .find_map(|parts| {
                let wants = |version: &str| {
                    parts
                        .first()
                        .is_some_and(|t| t.eq_ignore_ascii_case("application/json"))
                        && parts.contains(&"g=apidiscovery.k8s.io")
                        && parts.contains(&"as=APIGroupDiscoveryList")
                        && parts.contains(&version)
                };
                if wants("v=v2") {
                    Some(true)
                } else if wants("v=v2beta1") {
                    Some(false)
                } else {
                    None
                }
            });
        let (content_type, body) = match accept {
            Some(true) => (DISCOVERY_V2, self.v2.clone()),
            Some(false) => (DISCOVERY_V2BETA1, self.v2beta1.clone()),
            None => return json_response(StatusCode::OK, "application/json", self.group_list.clone()),
        };
        let unchanged = headers
            .get(header::IF_NONE_MATCH)
            .is_some_and(|tag| tag.as_bytes() == self.etag.as_bytes());
        let mut response = if unchanged {
            let mut response = Response::new(Body::default());
            *response.status_mut() = StatusCode::NOT_MODIFIED;
            response
        } else {
            json_response(StatusCode::OK, content_type, body)
        };
        if let Ok(tag) = HeaderValue::from_str(&self.etag) {
            response.headers_mut().insert(header::ETAG, tag);
        }
        response
    }
}

/// The answers every aggregated server gives alike: `/healthz` and `/livez` (`ok`), `/readyz`
/// (`ok` when `ready`, else a 500 naming `not_ready`), `/openapi/v2` (an empty Swagger document
/// titled `title`) and `/openapi/v3`. `None` for any other path.
pub fn common(
    segments: &[&str],
    method: &Method,
    ready: bool,
    not_ready: &str,
    title: &str,
) -> Option<Response<Body>> {
    let get = *method == Method::GET || *method == Method::HEAD;
    Some(match segments {
        ["healthz"] | ["livez"] if get => text(StatusCode::OK, Bytes::from_static(b"ok")),
        ["readyz"] if get => {
            if ready {
                text(StatusCode::OK, Bytes::from_static(b"ok"))
            } else {
                text(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    Bytes::from(format!("[-]{not_ready}\nreadyz check failed")),
                )
            }
        }
        ["healthz"] | ["livez"] | ["readyz"] => method_not_allowed(),
        ["openapi", "v2"] if get => json_response(
            StatusCode::OK,
            "application/json",
            Bytes::from(
                json!({"swagger": "2.0", "info": {"title": title, "version": "v1alpha1"}, "paths": {}})
                    .to_string(),
            ),
        ),
        ["openapi", "v3"] if get => json_response(
            StatusCode::OK,
            "application/json",
            Bytes::from_static(b"{\"paths\":{}}"),
        ),
        _ => return None,
    })
}

/// How a request body is encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Encoding {
    Json,
    Yaml,
}

/// The body's encoding by `Content-Type` (none means JSON), or the 415 refusal.
fn encoding(headers: &HeaderMap) -> Result<Encoding, Box<Response<Body>>> {
    let Some(value) = headers.get(header::CONTENT_TYPE) else {
        return Ok(Encoding::Json);
    };
    let media_type = value
        .to_str()
        .ok()
        .and_then(|value| value.split(';').next())
        .map(|media| media.trim().to_ascii_lowercase());
    match media_type.as_deref() {
        Some("application/json") => Ok(Encoding::Json),
        Some("application/yaml") => Ok(Encoding::Yaml),
        _ => Err(Box::new(status(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "UnsupportedMediaType",
            &format!(
                "the body of the request was in an unknown format ({}) - accepted media types include: application/json, application/yaml",
                value.to_str().unwrap_or("<not text>")
            ),
        ))),
    }
}

/// A 406 when `Accept` rules out JSON (the only encoding served).
pub fn not_acceptable(headers: &HeaderMap) -> Option<Response<Body>> {
    let values: Vec<&str> = headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .map(str::trim)
        .filter(|range| !range.is_empty())
        .collect();
    let acceptable = values.is_empty()
        || values.iter().any(|range| {
            let media = range.split(';').next().unwrap_or_default().trim();
            ["*/*", "application/*", "application/json"]
                .iter()
                .any(|ok| media.eq_ignore_ascii_case(ok))
        });
    (!acceptable).then(|| {
        status(
            StatusCode::NOT_ACCEPTABLE,
            "NotAcceptable",
            "only the following media types are accepted: application/json",
        )
    })
}

/// Reads and decodes the body as `T`, checking `apiVersion` and `kind` when present. Refuses a
/// wrong `Content-Type` (415), a body over [`MAX_BODY_BYTES`] (413), and anything undecodable or of
/// another kind (400). The refusal never quotes the body.
pub async fn read_object<T, B>(
    request: Request<B>,
    api_version: &str,
    kind: &str,
) -> Result<T, Box<Response<Body>>>
where
    T: serde::de::DeserializeOwned,
    B: hyper::body::Body<Data = Bytes> + Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let encoding = encoding(request.headers())?;
    let too_large = || {
        Box::new(status(
            StatusCode::PAYLOAD_TOO_LARGE,
            "RequestEntityTooLarge",
            &format!("the request body is larger than {MAX_BODY_BYTES} bytes"),
        ))
    };
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse::<u64>().ok());
    if declared.is_some_and(|length| length > MAX_BODY_BYTES as u64) {
        return Err(too_large());
    }
    let reading = Limited::new(request.into_body(), MAX_BODY_BYTES).collect();
    let body = match tokio::time::timeout(BODY_READ_TIMEOUT, reading).await {
        Ok(Ok(collected)) => collected.to_bytes(),
        Ok(Err(error)) if error.is::<http_body_util::LengthLimitError>() => return Err(too_large()),
        Ok(Err(error)) => {
            tracing::debug!(%error, "reading a request body failed");
            return Err(Box::new(status(
                StatusCode::BAD_REQUEST,
                "BadRequest",
                "the request body could not be read",
            )));
        }
        Err(_) => {
            return Err(Box::new(status(
                StatusCode::REQUEST_TIMEOUT,
                "Timeout",
                &format!(
                    "the request body was not received within {} seconds",
                    BODY_READ_TIMEOUT.as_secs()
                ),
            )))
        }
    };
    let bad = |message: String| Box::new(status(StatusCode::BAD_REQUEST, "BadRequest", &message));
    let value: Value = match encoding {
        Encoding::Json => serde_json::from_slice(&body).map_err(|e| {
            bad(format!(
                "the request body is not valid JSON: {}",
                error_without_values(&e)
            ))
        })?,
        Encoding::Yaml => {
            serde_yaml::from_slice(&body).map_err(|_| bad("the request body is not valid YAML".into()))?
        }
    };
    let Value::Object(fields) = &value else {
        return Err(bad(format!("the request body must be a {kind} object")));
    };
    let field = |name: &str| fields.get(name).and_then(Value::as_str).unwrap_or_default();
    if fields.get("apiVersion").is_some_and(|v| !v.is_string())
        || fields.get("kind").is_some_and(|v| !v.is_string())
    {
        return Err(bad("apiVersion and kind must be strings".into()));
    }
    if !field("apiVersion").is_empty() && field("apiVersion") != api_version {
        return Err(bad(format!(
            "the API version in the data ({}) does not match the expected API version ({api_version})",
            field("apiVersion")
        )));
    }
    if !field("kind").is_empty() && field("kind") != kind {
        return Err(bad(format!(
            "the kind in the data ({}) does not match the expected kind ({kind})",
            field("kind")
        )));
    }
    serde_json::from_value(value).map_err(|e| {
        bad(format!(
            "the request body is not a valid {kind}: {}",
            error_without_values(&e)
        ))
    })
}

/// `201 Created` with `object` as JSON (a 500 `Status` if it cannot be encoded).
pub fn created(object: &impl serde::Serialize) -> Response<Body> {
    match serde_json::to_vec(object) {
        Ok(body) => json_response(StatusCode::CREATED, "application/json", Bytes::from(body)),
        Err(_) => status(
            StatusCode::INTERNAL_SERVER_ERROR,
            "InternalError",
            "the answer could not be encoded",
        ),
    }
}

/// A `metav1.Status` failure.
pub fn status(code: StatusCode, reason: &str, message: &str) -> Response<Body> {
    json_response(
        code,
        "application/json",
        crate::status::status_body(code.as_u16(), reason, message),
    )
}

/// `404` as kube-apiserver words it.
pub fn not_found() -> Response<Body> {
    status(
        StatusCode::NOT_FOUND,
        "NotFound",
        "the server could not find the requested resource",
    )
}

/// `405` as kube-apiserver words it.
pub fn method_not_allowed() -> Response<Body> {
    status(
        StatusCode::METHOD_NOT_ALLOWED,
        "MethodNotAllowed",
        "the server does not allow this method on the requested resource",
    )
}

fn text(code: StatusCode, body: Bytes) -> Response<Body> {
    let mut response = Response::new(Body::new(body));
    *response.status_mut() = code;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

/// A response with `body` of `content_type`.
pub fn json_response(code: StatusCode, content_type: &'static str, body: Bytes) -> Response<Body> {
    let mut response = Response::new(Body::new(body));
    *response.status_mut() = code;
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resource(group: &str, plural: &'static str, namespaced: bool) -> ApiResource {
        ApiResource {
            group: group.into(),
            version: "v1alpha1",
            plural,
            singular: "thing",
            kind: "Thing",
            verbs: &["create"],
            namespaced,
        }
    }

    fn body(response: Response<Body>) -> Value {
        let bytes = futures::executor::block_on(response.into_body().collect())
            .unwrap()
            .to_bytes();
        serde_json::from_slice(&bytes).unwrap()
    }

    #[test]
    fn resources_of_one_group_share_its_documents_and_scope_is_kept() {
        let discovery = Discovery::new(&[
            resource("a.example", "ones", false),
            resource("a.example", "twos", true),
            resource("b.example", "threes", true),
        ]);
        let headers = HeaderMap::new();
        let list = body(discovery.respond(&["apis"], &Method::GET, &headers).unwrap());
        assert_eq!(list["groups"].as_array().unwrap().len(), 2);
        let resources = body(
            discovery
                .respond(&["apis", "a.example", "v1alpha1"], &Method::GET, &headers)
                .unwrap(),
        );
        assert_eq!(resources["resources"][1]["name"], "twos");
        assert_eq!(resources["resources"][1]["namespaced"], true);
        let mut accept = HeaderMap::new();
        accept.insert(header::ACCEPT, HeaderValue::from_static(DISCOVERY_V2));
        let v2 = body(discovery.respond(&["apis"], &Method::GET, &accept).unwrap());
        assert_eq!(
            v2["items"][1]["versions"][0]["resources"][0]["scope"],
            "Namespaced"
        );
        assert_eq!(v2["items"][0]["versions"][0]["resources"][0]["scope"], "Cluster");
        let missing = discovery
            .respond(&["apis", "c.example"], &Method::GET, &headers)
            .unwrap();
        assert_eq!(missing.status(), StatusCode::NOT_FOUND);
        assert!(discovery
            .respond(
                &["apis", "a.example", "v1alpha1", "ones"],
                &Method::POST,
                &headers
            )
            .is_none());
    }
}
