//! The Supervisor's aggregated API: `OIDCClientSecretRequest`
//! (`clientsecret.supervisor.<suffix>/v1alpha1`, namespaced, create — and an always-empty list, as
//! Pinniped answers `kubectl get`), reached through kube-apiserver's aggregation layer like
//! Pinniped's (REFERENCE.md §1.3).
//!
//! A request names an OIDCClient of the Supervisor's namespace; it may generate a new client
//! secret (32 random bytes, hex; returned once, in this answer; stored as a bcrypt hash of cost
//! [`clients::BCRYPT_COST`], newest first) and/or revoke the old ones (all but the newest), at
//! most [`clients::MAX_CLIENT_SECRETS`] kept. Errors are `metav1.Status` answers with Pinniped's
//! reasons and messages. Only callers kube-apiserver's front proxy vouches for are served, and
//! each is authorized again with a SubjectAccessReview (`create` of the resource in the
//! namespace), as a delegating API server does. One audit line per change, never the secret.

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use k8s_openapi::api::authorization::v1::{ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec};
use kube::{
    api::{ApiResource, DynamicObject, PostParams},
    Api, Client,
};
use selkie_api::{
    supervisor_clientsecret::{OIDCClientSecretRequest, OIDCClientSecretRequestStatus, KIND, PLURAL},
    supervisor_config::{OIDCClient, OIDC_CLIENT_NAME_PREFIX},
};
use selkie_filters::identity::UserInfo;
use selkie_kube::aggregated::{
    created, json_response, method_not_allowed, not_acceptable, not_found, read_object, status,
    ApiResource as ServedResource, Body, Discovery,
};
use serde_json::json;

use crate::clients::{self, SecretStorage, SecretStorageError};

/// The only version served.
pub const VERSION: &str = "v1alpha1";

/// The routes of one Supervisor (its namespace and group suffix).
pub struct Routes {
    group: String,
    namespace: String,
    discovery: Discovery,
    oidc_clients: Api<DynamicObject>,
    oidc_client_api_version: String,
    storage: SecretStorage,
    reviews: Api<SubjectAccessReview>,
}

impl std::fmt::Debug for Routes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Routes")
            .field("group", &self.group)
            .field("namespace", &self.namespace)
            .finish_non_exhaustive()
    }
}

impl Routes {
    /// The routes of the Supervisor of `namespace` under `api_group_suffix`, reading OIDCClients
    /// and writing their storage Secrets with `client`.
    pub fn new(
        client: Client,
        namespace: &str,
        api_group_suffix: &str,
    ) -> Result<Self, selkie_api::crds::CrdError> {
        let group = selkie_api::group_suffix::replace_group_suffix(
            selkie_api::supervisor_clientsecret::GROUP,
            api_group_suffix,
        )
        .unwrap_or_else(|| selkie_api::supervisor_clientsecret::GROUP.to_string());
        let resource: ApiResource =
            selkie_api::crds::api_resource_with_group_suffix::<OIDCClient>(api_group_suffix)?;
        Ok(Self {
            discovery: Discovery::new(&[ServedResource {
                group: group.clone(),
                version: VERSION,
                plural: PLURAL,
                singular: "oidcclientsecretrequest",
                kind: KIND,
                verbs: &["create", "list"],
                namespaced: true,
            }]),
            group,
            namespace: namespace.to_string(),
            oidc_clients: Api::namespaced_with(client.clone(), namespace, &resource),
            oidc_client_api_version: resource.api_version,
            storage: SecretStorage::new(Api::namespaced(client.clone(), namespace)),
            reviews: Api::all(client),
        })
    }

    /// The API group served (`clientsecret.supervisor.<suffix>`).
    pub fn group(&self) -> &str {
        &self.group
    }

    /// Answers one request from `caller` (who kube-apiserver's front proxy says sent it; anonymous
    /// otherwise). `ready`: the serving certificate and the front proxy's settings are loaded.
    pub async fn handle<B>(&self, request: Request<B>, caller: UserInfo, ready: bool) -> Response<Body>
    where
        B: hyper::body::Body<Data = Bytes> + Send,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let path = request.uri().path().to_string();
        let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
        let method = request.method().clone();
        if let Some(response) = self.discovery.answer_shared(
            &segments,
            &method,
            request.headers(),
            ready,
            "Selkie Supervisor aggregated API",
        ) {
            return response;
        }
        match segments.as_slice() {
            ["apis", group, VERSION, "namespaces", namespace, PLURAL] if *group == self.group => {
                if let Some(refusal) = not_acceptable(request.headers()) {
                    return refusal;
                }
                let get = method == Method::GET || method == Method::HEAD;
                if method == Method::POST {
                    let dry_run = request.uri().query().is_some_and(|query| {
                        form_urlencoded::parse(query.as_bytes()).any(|(name, _)| name == "dryRun")
                    });
                    self.create(request, namespace, &caller, dry_run).await
                } else if get {
                    let list = json!({"kind": "OIDCClientSecretRequestList",
                        "apiVersion": format!("{}/{VERSION}", self.group),
                        "metadata": {"resourceVersion": "0"}, "items": []});
                    json_response(StatusCode::OK, "application/json", Bytes::from(list.to_string()))
                } else {
                    method_not_allowed()
                }
            }
            _ => not_found(),
        }
    }

    /// `POST .../namespaces/<namespace>/oidcclientsecretrequests`.
    async fn create<B>(
        &self,
        request: Request<B>,
        namespace: &str,
        caller: &UserInfo,
        dry_run: bool,
    ) -> Response<Body>
    where
        B: hyper::body::Body<Data = Bytes> + Send,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        if let Some(refusal) = self.authorize(caller, namespace).await {
            return refusal;
        }
        let api_version = format!("{}/{VERSION}", self.group);
        let object: OIDCClientSecretRequest = match read_object(request, &api_version, KIND).await {
            Ok(object) => object,
            Err(refusal) => return *refusal,
        };
        let name = object.metadata.name.clone().unwrap_or_default();
        let qualified = format!("{KIND}.{}", self.group);
        let invalid = |field: &str, problem: &str| {
            status(
                StatusCode::UNPROCESSABLE_ENTITY,
                "Invalid",
                &format!("{qualified} {name:?} is invalid: {field}: {problem}"),
            )
        };
        if object
            .metadata
            .namespace
            .as_deref()
            .is_some_and(|inside| !inside.is_empty() && inside != namespace)
        {
            return status(
                StatusCode::BAD_REQUEST,
                "BadRequest",
                "the namespace of the provided object does not match the namespace sent on the request",
            );
        }
        if namespace != self.namespace {
            return status(
                StatusCode::BAD_REQUEST,
                "BadRequest",
                &format!(
                    "namespace must be {} on OIDCClientSecretRequest, was {namespace}",
                    self.namespace
                ),
            );
        }
        if name.is_empty() {
            let problem = if object.metadata.generate_name.is_some() {
                "Invalid value: \"\": generateName is not supported"
            } else {
                "Required value: name or generateName is required"
            };
            return invalid("metadata.name", problem);
        }
        if name == OIDC_CLIENT_NAME_PREFIX {
            return invalid(
                "metadata.name",
                &format!("Invalid value: {name:?}: must not equal '{OIDC_CLIENT_NAME_PREFIX}'"),
            );
        }
        if !name.starts_with(OIDC_CLIENT_NAME_PREFIX) {
            return invalid(
                "metadata.name",
                &format!("Invalid value: {name:?}: must start with '{OIDC_CLIENT_NAME_PREFIX}'"),
            );
        }
        if name == "." || name == ".." || name.contains('/') || name.contains('%') {
            return invalid(
                "metadata.name",
                &format!("Invalid value: {name:?}: may not contain '/' or '%' or be '.' or '..'"),
            );
        }
        if dry_run {
            return invalid("dryRun", "Unsupported value: [\"All\"]");
        }
        let oidc_client = match self.oidc_clients.get_opt(&name).await {
            Ok(Some(found)) => found,
            Ok(None) => return invalid("metadata.name", &format!("Not found: {name:?}")),
            Err(error) => {
                tracing::error!(%error, client = %name, "reading an OIDCClient for a secret request failed");
                return internal(&format!("getting client {name:?} failed"));
            }
        };
        let uid = oidc_client.metadata.uid.clone().unwrap_or_default();
        let (version, mut hashes) = match self.storage.get(&uid).await {
            Ok(stored) => stored,
            Err(error) => {
                tracing::error!(%error, client = %name, "reading an OIDCClient's secrets failed");
                return internal(&format!("getting secret for client {name:?} failed"));
            }
        };
        let previously = hashes.len();
        let mut generated = String::new();
        if object.spec.generate_new_secret {
            let Some(secret) = new_secret() else {
                return internal("client secret generation failed");
            };
            let hashed = {
                let secret = secret.clone();
                let deadline = tokio::time::Instant::now() + clients::BCRYPT_WAIT;
                clients::run_bcrypt(deadline, move || bcrypt::hash(secret, clients::BCRYPT_COST)).await
            };
            let hash = match hashed {
                Ok(Ok(hash)) => hash,
                Ok(Err(_)) => return internal("hash generation failed"),
                Err(clients::Busy) => {
                    return status(
                        StatusCode::TOO_MANY_REQUESTS,
                        "TooManyRequests",
                        "too many client secrets are being hashed at once; try again later",
                    )
                }
            };
            hashes.insert(0, hash);
            generated = secret;
        }
        let revoke = object.spec.revoke_old_secrets && !hashes.is_empty();
        let mut revoked = 0;
        if revoke {
            hashes.truncate(1);
            revoked = if generated.is_empty() {
                previously.saturating_sub(1)
            } else {
                previously
            };
        }
        if object.spec.generate_new_secret || revoke {
            if hashes.len() > clients::MAX_CLIENT_SECRETS {
                return status(
                    StatusCode::BAD_REQUEST,
                    "BadRequest",
                    &format!("OIDCClient {name} has too many secrets, spec.revokeOldSecrets must be true"),
                );
            }
            match self
                .storage
                .set(version, &name, &uid, &self.oidc_client_api_version, &hashes)
                .await
            {
                Ok(()) => {}
                Err(SecretStorageError::Conflict) => {
                    return status(
                        StatusCode::CONFLICT,
                        "Conflict",
                        &format!(
                            "Operation cannot be fulfilled on {PLURAL}.{} {name:?}: multiple concurrent secret generation requests for same client",
                            self.group
                        ),
                    )
                }
                Err(error) => {
                    tracing::error!(%error, client = %name, "writing an OIDCClient's secrets failed");
                    return internal("setting client secret failed");
                }
            }
            tracing::info!(
                target: "audit",
                event = "OIDCClientSecretRequest Updated Secrets",
                client_id = %name,
                generated_secret = !generated.is_empty(),
                revoked_secrets = revoked,
                total_secrets = hashes.len(),
                "client secrets changed"
            );
        }
        let answer = OIDCClientSecretRequest {
            api_version,
            kind: KIND.into(),
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some(name),
                namespace: Some(namespace.to_string()),
                creation_timestamp: Some(selkie_kube::conditions::now()),
                ..Default::default()
            },
            spec: object.spec,
            status: OIDCClientSecretRequestStatus {
                generated_secret: generated,
                total_client_secrets: i32::try_from(hashes.len()).unwrap_or(i32::MAX),
            },
        };
        created(&answer)
    }

    /// `None` when `caller` may create OIDCClientSecretRequests in `namespace`; else the refusal:
    /// 401 for a caller the front proxy did not vouch for, 403 when the SubjectAccessReview says
    /// no, 500 when it cannot be asked.
    async fn authorize(&self, caller: &UserInfo, namespace: &str) -> Option<Response<Body>> {
        if caller.username.is_empty() || caller.username == selkie_filters::front_proxy::ANONYMOUS_USER {
            return Some(status(StatusCode::UNAUTHORIZED, "Unauthorized", "Unauthorized"));
        }
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(caller.username.clone()),
                uid: caller.uid.clone(),
                groups: Some(caller.groups.clone()),
                extra: Some(caller.extra.clone()),
                resource_attributes: Some(ResourceAttributes {
                    group: Some(self.group.clone()),
                    version: Some(VERSION.into()),
                    resource: Some(PLURAL.into()),
                    namespace: Some(namespace.to_string()),
                    verb: Some("create".into()),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        match self.reviews.create(&PostParams::default(), &review).await {
            Ok(answer) if answer.status.as_ref().is_some_and(|status| status.allowed) => None,
            Ok(_) => Some(status(
                StatusCode::FORBIDDEN,
                "Forbidden",
                &format!(
                    "{PLURAL}.{} is forbidden: User {:?} cannot create resource {PLURAL:?} in API group {:?} in the namespace {namespace:?}",
                    self.group, caller.username, self.group
                ),
            )),
            Err(error) => {
                tracing::error!(%error, "a SubjectAccessReview failed");
                Some(internal("authorizing the request failed"))
            }
        }
    }
}

/// A new client secret: 32 random bytes in lower-case hex (Pinniped's form). `None` when the
/// system's random source fails.
fn new_secret() -> Option<String> {
    use ring::rand::SecureRandom as _;
    let mut bytes = [0u8; 32];
    ring::rand::SystemRandom::new().fill(&mut bytes).ok()?;
    Some(bytes.iter().map(|byte| format!("{byte:02x}")).collect())
}

/// A 500 `metav1.Status` (`InternalError`) with `message`.
fn internal(message: &str) -> Response<Body> {
    status(
        StatusCode::INTERNAL_SERVER_ERROR,
        "InternalError",
        &format!("Internal error occurred: {message}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_32_random_bytes_in_hex() {
        let (one, two) = (new_secret().unwrap(), new_secret().unwrap());
        assert_eq!(one.len(), 64);
        assert!(one
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
        assert_ne!(one, two);
    }
}
