//! One sync of the CredentialIssuer and the impersonation proxy's Services and Secrets: read
//! everything, write what differs (as leader), publish the serving certificate, report the
//! strategy.

use super::*;

/// A failed sync: the `Error` strategy's reason and message.
#[derive(Debug)]
pub(super) struct SyncError {
    pub(super) reason: StrategyReason,
    pub(super) message: String,
}

impl From<String> for SyncError {
    fn from(message: String) -> Self {
        Self {
            reason: StrategyReason::ErrorDuringSetup,
            message,
        }
    }
}

impl From<kube::Error> for SyncError {
    /// Pinniped's `strategyReasonForError`: conflicts and already-exists errors are expected
    /// while two replicas race, so they are Pending; the message is the API's (Go's
    /// `err.Error()`).
    fn from(error: kube::Error) -> Self {
        match error {
            kube::Error::Api(status) => Self {
                reason: if status.is_conflict() || status.is_already_exists() {
                    StrategyReason::Pending
                } else {
                    StrategyReason::ErrorDuringSetup
                },
                message: status.message,
            },
            other => other.to_string().into(),
        }
    }
}

/// The outcome of a successful sync.
pub(super) struct Synced {
    pub(super) strategy: CredentialIssuerStrategy,
    pub(super) serving: Option<ServingKeyPair>,
}

pub(super) struct Reconciler {
    pub(super) client: Client,
    pub(super) config: Arc<ControlPlaneConfig>,
    pub(super) publisher: Publisher,
    pub(super) nodes: watch::Receiver<NodeState>,
    pub(super) issuers: Api<DynamicObject>,
    pub(super) services: Api<Service>,
    pub(super) secrets: Api<Secret>,
    /// Since when the leader has seen the CredentialIssuer missing ([`CREATE_GRACE`]).
    pub(super) missing_since: std::sync::Mutex<Option<std::time::Instant>>,
}

/// How long the leader leaves a missing CredentialIssuer to its installer before creating one
/// with the default spec. Installers create it together with the Deployment, but Helm creates
/// custom resources last: a Concierge that starts fast would otherwise win that race, and Helm
/// then refuses the install ("already exists", not the release's).
pub(super) const CREATE_GRACE: Duration = Duration::from_secs(10);

pub(super) fn strategy(
    status: StrategyStatus,
    reason: StrategyReason,
    message: &str,
) -> CredentialIssuerStrategy {
    CredentialIssuerStrategy {
        r#type: StrategyType::ImpersonationProxy,
        status,
        reason,
        message: message.into(),
        last_update_time: now(),
        frontend: None,
    }
}

pub(super) fn secret_string(secret: &Secret, key: &str) -> Option<String> {
    let bytes = secret.data.as_ref()?.get(key)?;
    String::from_utf8(bytes.0.clone()).ok()
}

impl Reconciler {
    /// One pass: read everything, write what differs (leader), publish, report. Returns how soon
    /// to pass again when that must be before the next event or resync (a missing CredentialIssuer
    /// is created once it has been missing for [`CREATE_GRACE`]).
    pub(super) async fn sync(&self, leading: bool) -> Option<Duration> {
        let name = &self.config.credential_issuer_name;
        let missing_since = || {
            self.missing_since
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
        };
        let issuer = match self.issuers.get_opt(name).await {
            Ok(Some(issuer)) => {
                *missing_since() = None;
                issuer
            }
            Ok(None) => {
                if !leading {
                    return None;
                }
                let missing_for = missing_since()
                    .get_or_insert_with(std::time::Instant::now)
                    .elapsed();
                if missing_for < CREATE_GRACE {
                    return Some(CREATE_GRACE - missing_for);
                }
                self.create_issuer().await;
                return None;
            }
            Err(error) => {
                tracing::warn!(%error, credential_issuer = %name, "reading the CredentialIssuer");
                return None;
            }
        };
        let strategy = match self.do_sync(&issuer, leading).await {
            Ok(synced) => {
                self.publisher
                    .update(|published| replace(&mut published.proxy_serving, synced.serving));
                synced.strategy
            }
            Err(error) => {
                tracing::warn!(reason = ?error.reason, message = %error.message, "impersonation proxy configuration");
                strategy(StrategyStatus::Error, error.reason, &error.message)
            }
        };
        if leading {
            if let Err(error) = set_strategy(&self.client, &self.config, strategy).await {
                tracing::warn!(%error, "writing the ImpersonationProxy strategy");
            }
        }
        None
    }

    async fn create_issuer(&self) {
        let name = &self.config.credential_issuer_name;
        let mut issuer = DynamicObject::new(name, &self.config.api_resource::<CredentialIssuer>())
            .data(json!({ "spec": default_spec() }));
        issuer.metadata.labels = Some(self.config.labels.clone());
        match self.issuers.create(&PostParams::default(), &issuer).await {
            Ok(_) => {
                tracing::info!(credential_issuer = %name, "created the CredentialIssuer with the default spec")
            }
            Err(kube::Error::Api(status)) if status.is_already_exists() => {}
            Err(error) => tracing::warn!(%error, credential_issuer = %name, "creating the CredentialIssuer"),
        }
    }

    /// Pinniped's `doSync`: the strategy and what to serve, or why not.
    async fn do_sync(&self, issuer: &DynamicObject, leading: bool) -> Result<Synced, SyncError> {
        let Some(raw) = issuer.data.get("spec").and_then(|s| s.get("impersonationProxy")) else {
            return Err("could not load CredentialIssuer: spec.impersonationProxy is nil"
                .to_string()
                .into());
        };
        let invalid =
            |message: String| format!("could not load CredentialIssuer spec.impersonationProxy: {message}");
        let spec: ImpersonationProxySpec =
            serde_json::from_value(raw.clone()).map_err(|e| invalid(e.to_string()))?;
        spec::validate(&spec).map_err(invalid)?;

        let enabled = match spec.mode {
            ImpersonationProxyMode::Enabled => true,
            ImpersonationProxyMode::Disabled => false,
            ImpersonationProxyMode::Auto => !self.has_control_plane_nodes().await?,
        };
        let service_type = spec.service.r#type;
        if leading {
            let lb = load_balancer_service_name(&self.config);
            let cip = cluster_ip_service_name(&self.config);
            if enabled && service_type == ImpersonationProxyServiceType::LoadBalancer {
                self.ensure_service(&spec, lb, "LoadBalancer").await?;
            } else {
                self.ensure_service_removed(&lb).await?;
            }
            if enabled && service_type == ImpersonationProxyServiceType::ClusterIP {
                self.ensure_service(&spec, cip, "ClusterIP").await?;
            } else {
                self.ensure_service_removed(&cip).await?;
            }
        }

        let desired = self.desired_name(&spec).await?;
        let (ca_bundle, serving) = if enabled {
            match &spec.tls {
                Some(tls) => self.external_tls(tls, leading).await?,
                None => self.generated_tls(desired.as_ref(), leading).await?,
            }
        } else {
            if leading {
                self.ensure_tls_secret_removed().await?;
            }
            (None, None)
        };

        let result = if spec.mode == ImpersonationProxyMode::Disabled {
            strategy(
                StrategyStatus::Error,
                StrategyReason::Disabled,
                "impersonation proxy was explicitly disabled by configuration",
            )
        } else if !enabled {
            strategy(
                StrategyStatus::Error,
                StrategyReason::Disabled,
                "automatically determined that impersonation proxy should be disabled",
            )
        } else if let Some(desired) = &desired {
            let mut listening = strategy(
                StrategyStatus::Success,
                StrategyReason::Listening,
                "impersonation proxy is ready to accept client connections",
            );
            listening.frontend = Some(CredentialIssuerFrontend {
                r#type: FrontendType::ImpersonationProxy,
                token_credential_request_api_info: None,
                impersonation_proxy_info: Some(ImpersonationProxyInfo {
                    endpoint: format!("https://{}", desired.client_endpoint),
                    certificate_authority_data: base64::engine::general_purpose::STANDARD
                        .encode(ca_bundle.unwrap_or_default()),
                }),
            });
            listening
        } else {
            strategy(
                StrategyStatus::Error,
                StrategyReason::Pending,
                "waiting for load balancer Service to be assigned IP or hostname",
            )
        };
        Ok(Synced {
            strategy: result,
            serving: if enabled && desired.is_some() {
                serving
            } else {
                None
            },
        })
    }

    /// Whether a Node has a control-plane role (waiting up to 10 s for the first list).
    async fn has_control_plane_nodes(&self) -> Result<bool, SyncError> {
        let mut nodes = self.nodes.clone();
        let state = tokio::time::timeout(
            Duration::from_secs(10),
            nodes.wait_for(|state| *state != NodeState::Unknown),
        )
        .await
        .ok()
        .and_then(Result::ok)
        .map(|state| state.clone());
        match state {
            Some(NodeState::Known { any: false, .. }) => Err("no nodes found".to_string().into()),
            Some(NodeState::Known { control_plane, .. }) => Ok(control_plane),
            Some(NodeState::Error(message)) => Err(message.into()),
            Some(NodeState::Unknown) | None => Err("error fetching nodes: timed out".to_string().into()),
        }
    }

    async fn ensure_service(
        &self,
        spec: &ImpersonationProxySpec,
        name: String,
        type_: &str,
    ) -> Result<(), SyncError> {
        let desired = services::desired(&self.config, name.clone(), type_, &spec.service);
        match self.services.get_opt(&name).await? {
            None => {
                tracing::info!(service = %name, "creating the impersonation proxy's {type_} Service");
                self.services.create(&PostParams::default(), &desired).await?;
            }
            Some(existing) => {
                if let Some(updated) = services::updated(&existing, &desired) {
                    tracing::info!(service = %name, "updating the impersonation proxy's {type_} Service");
                    self.services
                        .replace(&name, &PostParams::default(), &updated)
                        .await?;
                }
            }
        }
        Ok(())
    }

    async fn ensure_service_removed(&self, name: &str) -> Result<(), SyncError> {
        if let Some(existing) = self.services.get_opt(name).await? {
            tracing::info!(service = %name, "deleting the impersonation proxy's Service");
            delete_exact(&self.services, name, &existing.metadata).await?;
        }
        Ok(())
    }

    async fn ensure_tls_secret_removed(&self) -> Result<(), SyncError> {
        let name = tls_secret_name(&self.config);
        if let Some(existing) = self.secrets.get_opt(&name).await? {
            tracing::info!(secret = %name, "deleting the impersonation proxy's generated serving certificate");
            delete_exact(&self.secrets, &name, &existing.metadata).await?;
        }
        Ok(())
    }

    /// Pinniped's `findDesiredTLSCertificateName`: `None` while waiting for an address.
    async fn desired_name(&self, spec: &ImpersonationProxySpec) -> Result<Option<DesiredName>, SyncError> {
        if let Some(endpoint) = spec.external_endpoint.as_deref().filter(|e| !e.is_empty()) {
            // Validated already.
            let parsed = spec::parse_endpoint(endpoint, spec::DEFAULT_HTTPS_PORT)?;
            let client_endpoint = parsed.client_endpoint();
            return Ok(Some(match parsed.host.parse::<IpAddr>() {
                Ok(ip) => DesiredName {
                    ips: vec![ip],
                    hostname: None,
                    client_endpoint,
                },
                Err(_) => DesiredName {
                    ips: vec![],
                    hostname: Some(parsed.host),
                    client_endpoint,
                },
            }));
        }
        if spec.service.r#type == ImpersonationProxyServiceType::ClusterIP {
            let Some(service) = self
                .services
                .get_opt(&cluster_ip_service_name(&self.config))
                .await?
            else {
                return Ok(None);
            };
            let spec = service.spec.unwrap_or_default();
            let Some(ip) = spec.cluster_ip.filter(|ip| !ip.is_empty()) else {
                return Ok(None);
            };
            let ips = match spec.cluster_ips.filter(|ips| !ips.is_empty()) {
                Some(ips) => ips,
                None => vec![ip.clone()],
            };
            let ips = ips.iter().filter_map(|ip| ip.parse().ok()).collect();
            return Ok(Some(DesiredName {
                ips,
                hostname: None,
                client_endpoint: ip,
            }));
        }
        let name = load_balancer_service_name(&self.config);
        let Some(service) = self.services.get_opt(&name).await? else {
            return Ok(None);
        };
        let ingresses = service
            .status
            .and_then(|s| s.load_balancer)
            .and_then(|lb| lb.ingress)
            .unwrap_or_default();
        let first_is_empty = ingresses.first().is_none_or(|i| {
            i.hostname.as_deref().unwrap_or_default().is_empty()
                && i.ip.as_deref().unwrap_or_default().is_empty()
        });
        if first_is_empty {
            return Ok(None);
        }
        if let Some(hostname) = ingresses
            .iter()
            .filter_map(|i| i.hostname.clone())
            .find(|h| !h.is_empty())
        {
            return Ok(Some(DesiredName {
                ips: vec![],
                hostname: Some(hostname.clone()),
                client_endpoint: hostname,
            }));
        }
        if let Some((ip, parsed)) = ingresses
            .iter()
            .filter_map(|i| i.ip.clone())
            .find_map(|ip| ip.parse::<IpAddr>().ok().map(|parsed| (ip, parsed)))
        {
            return Ok(Some(DesiredName {
                ips: vec![parsed],
                hostname: None,
                client_endpoint: ip,
            }));
        }
        Err(format!(
            "could not find valid IP addresses or hostnames from load balancer {}/{name}",
            self.config.namespace
        )
        .into())
    }

    /// The generated serving CA, created by the leader when missing; `None` for a follower
    /// before the leader created it.
    async fn serving_ca(&self, leading: bool) -> Result<Option<CertPair>, SyncError> {
        let name = ca_secret_name(&self.config);
        if let Some(secret) = self.secrets.get_opt(&name).await? {
            let (Some(cert_pem), Some(key_pem)) = (
                secret_string(&secret, CA_CRT_KEY),
                secret_string(&secret, CA_KEY_KEY),
            ) else {
                return Err(format!("the Secret {name} has no PEM {CA_CRT_KEY} and {CA_KEY_KEY}").into());
            };
            return Ok(Some(CertPair { cert_pem, key_pem }));
        }
        if !leading {
            return Ok(None);
        }
        let ca = generate_ca(SERVING_CA_COMMON_NAME, CERT_LIFETIME)
            .map_err(|e| format!("could not create impersonation CA: {e}"))?;
        let secret = Secret {
            metadata: self.metadata(&name),
            data: Some(BTreeMap::from([
                (
                    CA_CRT_KEY.to_string(),
                    ByteString(ca.cert_pem.clone().into_bytes()),
                ),
                (
                    CA_KEY_KEY.to_string(),
                    ByteString(ca.key_pem.clone().into_bytes()),
                ),
            ])),
            type_: Some("Opaque".into()),
            ..Secret::default()
        };
        tracing::info!(secret = %name, "creating the impersonation proxy's serving CA");
        self.secrets.create(&PostParams::default(), &secret).await?;
        Ok(Some(ca))
    }

    fn metadata(&self, name: &str) -> ObjectMeta {
        ObjectMeta {
            name: Some(name.into()),
            namespace: Some(self.config.namespace.clone()),
            labels: Some(self.config.labels.clone()),
            ..ObjectMeta::default()
        }
    }

    /// Pinniped's `ensureCAAndTLSSecrets`: the CA bundle to advertise and the serving pair.
    async fn generated_tls(
        &self,
        desired: Option<&DesiredName>,
        leading: bool,
    ) -> Result<(Option<Vec<u8>>, Option<ServingKeyPair>), SyncError> {
        let Some(ca) = self.serving_ca(leading).await? else {
            return Ok((None, None));
        };
        let bundle = Some(ca.cert_pem.clone().into_bytes());
        let name = tls_secret_name(&self.config);
        if let Some(secret) = self.secrets.get_opt(&name).await? {
            let cert_pem = secret_string(&secret, TLS_CRT_KEY).unwrap_or_default();
            let key_pem = secret_string(&secret, TLS_KEY_KEY).unwrap_or_default();
            if tls::generated_cert_fits(&cert_pem, &key_pem, &ca.cert_pem, desired) {
                return Ok((bundle, Some(ServingKeyPair { cert_pem, key_pem })));
            }
            if !leading {
                return Ok((bundle, None));
            }
            tracing::info!(secret = %name, "the impersonation proxy's serving certificate no longer fits; replacing it");
            delete_exact(&self.secrets, &name, &secret.metadata).await?;
        }
        let (Some(desired), true) = (desired, leading) else {
            return Ok((bundle, None));
        };
        let pair = issue_serving(&ca, &desired.sans(), CERT_LIFETIME)
            .map_err(|e| format!("could not create impersonation cert: {e}"))?;
        let secret = Secret {
            metadata: self.metadata(&name),
            data: Some(BTreeMap::from([
                (
                    TLS_CRT_KEY.to_string(),
                    ByteString(pair.cert_pem.clone().into_bytes()),
                ),
                (
                    TLS_KEY_KEY.to_string(),
                    ByteString(pair.key_pem.clone().into_bytes()),
                ),
            ])),
            type_: Some("kubernetes.io/tls".into()),
            ..Secret::default()
        };
        tracing::info!(secret = %name, names = ?desired.sans(), "issuing the impersonation proxy's serving certificate");
        self.secrets.create(&PostParams::default(), &secret).await?;
        Ok((
            bundle,
            Some(ServingKeyPair {
                cert_pem: pair.cert_pem,
                key_pem: pair.key_pem,
            }),
        ))
    }

    /// Pinniped's `evaluateExternallyProvidedTLSSecret`.
    async fn external_tls(
        &self,
        tls: &ImpersonationProxyTLSSpec,
        leading: bool,
    ) -> Result<(Option<Vec<u8>>, Option<ServingKeyPair>), SyncError> {
        let Some(secret_name) = tls.secret_name.as_deref().filter(|n| !n.is_empty()) else {
            return Err(
                "must provide impersonationSpec.TLS.secretName if impersonationSpec.TLS is provided"
                    .to_string()
                    .into(),
            );
        };
        if leading {
            self.ensure_tls_secret_removed().await.map_err(|e| SyncError {
                message: format!(
                    "unable to remove generated TLS secret with name {}: {}",
                    tls_secret_name(&self.config),
                    e.message
                ),
                ..e
            })?;
        }
        let load_error = |message: String| {
            format!(
                "could not load the externally provided TLS secret for the impersonation proxy: {message}"
            )
        };
        let secret = match self.secrets.get_opt(secret_name).await? {
            Some(secret) => secret,
            None => return Err(load_error(format!("secrets {secret_name:?} not found")).into()),
        };
        let cert_pem = secret_string(&secret, TLS_CRT_KEY).unwrap_or_default();
        let key_pem = secret_string(&secret, TLS_KEY_KEY).unwrap_or_default();
        tls::check_key_pair(&cert_pem, &key_pem)
            .map_err(|e| load_error(format!("could not parse TLS cert PEM data from Secret: {e}")))?;
        let mut bundle = None;
        if let Some(ca) = secret
            .data
            .as_ref()
            .and_then(|d| d.get(CA_CRT_KEY))
            .filter(|ca| !ca.0.is_empty())
        {
            if !tls::is_pem_certificate(&ca.0) {
                return Err(
                    load_error("unable to read provided ca.crt: data is not a certificate".into()).into(),
                );
            }
            bundle = Some(ca.0.clone());
        }
        if let Some(data) = tls
            .certificate_authority_data
            .as_deref()
            .filter(|d| !d.is_empty())
        {
            let decoded = base64::engine::general_purpose::STANDARD
                .decode(data)
                .map_err(|e| {
                    format!("could not decode impersonationSpec.TLS.certificateAuthorityData: {e}")
                })?;
            if !tls::is_pem_certificate(&decoded) {
                return Err("could not decode impersonationSpec.TLS.certificateAuthorityData: data is not a certificate"
                    .to_string()
                    .into());
            }
            bundle = Some(decoded);
        }
        // Pinniped would advertise an empty bundle here, which the CRD's minLength refuses, so
        // its status would never be written; say why instead.
        if bundle.is_none() {
            return Err(load_error(format!(
                "the Secret {secret_name:?} has no {CA_CRT_KEY} and impersonationSpec.TLS.certificateAuthorityData \
                 is empty, so there is no CA bundle to advertise"
            ))
            .into());
        }
        Ok((bundle, Some(ServingKeyPair { cert_pem, key_pem })))
    }
}

/// Deletes `name` only if it is still the object `meta` describes (same UID and resource
/// version); already gone counts as deleted.
pub(super) async fn delete_exact<K>(api: &Api<K>, name: &str, meta: &ObjectMeta) -> Result<(), SyncError>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: meta.uid.clone(),
            resource_version: meta.resource_version.clone(),
        }),
        ..DeleteParams::default()
    };
    match api.delete(name, &params).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.is_not_found() => Ok(()),
        Err(error) => Err(error.into()),
    }
}
