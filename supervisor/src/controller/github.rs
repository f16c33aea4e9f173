//! The GitHubIdentityProvider reconciler: Pinniped's six conditions (`ClientCredentialsSecretValid`,
//! `ClaimsValid`, `OrganizationsPolicyValid`, `HostValid`, `TLSConfigurationValid`,
//! `GitHubConnectionValid`; no `Ready`, as in Pinniped's source) and, when they all hold, the
//! upstream logins use. The connection probe (`GET <api>/rate_limit`) runs once per address and CA
//! bundle; a failed one is retried with backoff while the last working form keeps serving.

use std::{sync::Arc, time::Duration};

use selkie_api::supervisor_idp::{
    GitHubAllowedAuthOrganizationsPolicy, GitHubIdentityProvider, GitHubIdentityProviderStatus, Phase,
};
use selkie_kube::{
    conditions::{self, Check},
    tls_spec::{self, CaSources as _},
};
use selkie_oidc::https::{HttpsClient, TlsOptions};

use crate::controller::identity_provider::{Evaluation, Interim, Provider};
use crate::controller::sources::Sources;
use crate::idp::github::{self, GitHub};
use crate::idp::{GitHubUpstream, Upstream};

/// The kind's name.
pub(crate) const KIND: &str = "GitHubIdentityProvider";
/// The type of a GitHubIdentityProvider's client Secret.
pub(crate) const GITHUB_CLIENT_SECRET_TYPE: &str = "secrets.pinniped.dev/github-client";
/// The bound of one connection probe.
const PROBE_TIMEOUT: Duration = Duration::from_secs(30);
const SECRET: &str = "ClientCredentialsSecretValid";
const CLAIMS: &str = "ClaimsValid";
const POLICY: &str = "OrganizationsPolicyValid";
const HOST: &str = "HostValid";
const CONNECTION: &str = "GitHubConnectionValid";

/// What was built for one object: the probe that passed (address and CA bundle), the settings and
/// the upstream serving them.
#[derive(Clone)]
pub(crate) struct Built {
    probed: String,
    github: GitHub,
    upstream: Arc<Upstream>,
}

/// The GitHubIdentityProvider kind (see the module documentation).
pub(crate) struct GitHubProvider;

impl Provider for GitHubProvider {
    const KIND: &'static str = KIND;
    const SECRET_NAMES: &'static [&'static str] = &["/spec/client/secretName"];
    const TLS_SPECS: &'static [&'static str] = &["/spec/githubAPI/tls"];
    type Object = GitHubIdentityProvider;
    type Built = Built;

    /// The conditions of `idp`, what to serve when they all hold (a new upstream only when the
    /// settings changed, else the one already serving), and why the probe failed when it did.
    async fn evaluate(
        &self,
        sources: &Sources,
        name: &str,
        idp: &GitHubIdentityProvider,
        previous: Option<Built>,
        interim: &Interim<'_, Self>,
    ) -> Evaluation<Built> {
        let spec = &idp.spec;
        let mut checks = Vec::new();

        let secret_name = &spec.client.secret_name;
        let credentials = github_credentials(sources, secret_name);
        checks.push(match &credentials {
            Ok(_) => Check::success(
                SECRET,
                format!("clientID and clientSecret have been read from spec.client.SecretName (\"{secret_name}\")"),
            ),
            Err(prefix) => Check::failure(
                SECRET,
                "SecretNotFound",
                format!(
                    "{prefix}: secret from spec.client.SecretName (\"{secret_name}\") must be found in namespace \"{}\" with type \"{GITHUB_CLIENT_SECRET_TYPE}\" and keys \"clientID\" and \"clientSecret\"",
                    sources.namespace
                ),
            ),
        });

        let claims = match (spec.claims.username, spec.claims.groups) {
            (None, _) => Err("spec.claims.username is required"),
            (_, None) => Err("spec.claims.groups is required"),
            (Some(username), Some(groups)) => Ok((username, groups)),
        };
        checks.push(match &claims {
            Ok(_) => Check::success(CLAIMS, "spec.claims are valid"),
            Err(message) => Check::failure(CLAIMS, "Invalid", *message),
        });

        let organizations = &spec.allow_authentication.organizations;
        let policy = organizations.policy;
        let allowed = &organizations.allowed;
        let policy_ok = matches!(
            (policy, allowed.is_empty()),
            (Some(GitHubAllowedAuthOrganizationsPolicy::AllGitHubUsers), true)
                | (
                    Some(GitHubAllowedAuthOrganizationsPolicy::OnlyUsersFromAllowedOrganizations),
                    false
                )
        );
        checks.push(if policy_ok {
            let policy = policy.map(|policy| format!("{policy:?}")).unwrap_or_default();
            Check::success(POLICY, format!("spec.allowAuthentication.organizations.policy (\"{policy}\") is valid"))
        } else if !allowed.is_empty() {
            Check::failure(POLICY, "Invalid", "spec.allowAuthentication.organizations.policy must be 'OnlyUsersFromAllowedOrganizations' when spec.allowAuthentication.organizations.allowed has organizations listed")
        } else {
            Check::failure(POLICY, "Invalid", "spec.allowAuthentication.organizations.policy must be 'AllGitHubUsers' when spec.allowAuthentication.organizations.allowed is empty")
        });

        let host = spec.github_api.host.clone().unwrap_or_default();
        let endpoints = github::Endpoints::of(&host);
        checks.push(match &endpoints {
            Ok(_) => Check::success(HOST, format!("spec.githubAPI.host (\"{host}\") is valid")),
            Err(reason) => Check::failure(
                HOST,
                "InvalidHost",
                format!("spec.githubAPI.host (\"{host}\") is not valid: {reason}"),
            ),
        });

        let tls = tls_spec::validate_at(
            spec.github_api.tls.as_ref(),
            "spec.githubAPI.tls",
            &sources.namespace,
            sources,
        );
        checks.push(tls.check.clone());

        let (Ok(endpoints), true) = (endpoints, tls.ok()) else {
            checks.push(Check::unable_to_validate(CONNECTION));
            return Evaluation::settled(checks);
        };
        let https = match HttpsClient::new(&TlsOptions {
            ca_pem: tls.ca_bundle_pem.as_ref().map(|pem| pem.as_bytes().to_vec()),
            ..TlsOptions::default()
        }) {
            Ok(https) => https,
            Err(error) => {
                checks.push(Check::failure(
                    CONNECTION,
                    "UnableToMakeRequest",
                    format!(
                        "cannot make connection probe request for spec.githubAPI.host (\"{host}\"): {error}"
                    ),
                ));
                return Evaluation::settled(checks);
            }
        };
        // The probe depends on where GitHub is and which CAs are trusted, nothing else.
        let probe_key = format!("{}|{:?}", endpoints.address, tls.ca_bundle_pem);
        let probed = if previous.as_ref().is_some_and(|built| built.probed == probe_key) {
            Ok(())
        } else {
            let mut waiting = checks.clone();
            waiting.push(Check::unknown(
                CONNECTION,
                format!(
                    "probing the connection to \"{}\" for spec.githubAPI.host (\"{host}\")",
                    endpoints.address
                ),
            ));
            interim.report(&waiting).await;
            match tokio::time::timeout(PROBE_TIMEOUT, github::probe(&endpoints, &https)).await {
                Ok(probed) => probed,
                Err(_) => Err(format!("no answer within {} seconds", PROBE_TIMEOUT.as_secs())),
            }
        };
        checks.push(match &probed {
            Ok(()) => Check::success(
                CONNECTION,
                format!(
                    "probed connection to \"{}\" for spec.githubAPI.host (\"{host}\"): host is reachable and TLS verification succeeds",
                    endpoints.address
                ),
            ),
            Err(reason) => Check::failure(
                CONNECTION,
                "UnableToMakeRequest",
                format!("cannot make connection probe request for spec.githubAPI.host (\"{host}\"): {reason}"),
            ),
        });
        if let Err(reason) = probed {
            return Evaluation {
                checks,
                built: None,
                unavailable: Some(reason),
            };
        }
        let (Ok((client_id, client_secret)), Ok((username, groups)), true) = (credentials, claims, policy_ok)
        else {
            return Evaluation::settled(checks);
        };
        let github = GitHub::new(
            endpoints,
            client_id,
            client_secret,
            username,
            groups,
            allowed,
            https,
        );
        let uid = idp.metadata.uid.clone().unwrap_or_default();
        let upstream = match previous {
            // Unchanged: the same upstream (and its connection pool) keeps serving.
            Some(built) if built.github.same_settings(&github) && uid == built.upstream.resource_uid() => {
                built.upstream
            }
            _ => Arc::new(Upstream::GitHub(GitHubUpstream {
                display_name: name.to_string(),
                resource_name: name.to_string(),
                resource_uid: uid,
                github: Arc::new(github.clone()),
            })),
        };
        let built = Built {
            probed: probe_key,
            github,
            upstream,
        };
        Evaluation {
            checks,
            built: Some(built),
            unavailable: None,
        }
    }

    fn upstream(built: &Built) -> Arc<Upstream> {
        built.upstream.clone()
    }

    /// Pinniped's GitHub status: the conditions and a phase, no `Ready`.
    fn status(idp: &GitHubIdentityProvider, checks: &[Check]) -> serde_json::Value {
        let phase = if conditions::had_error(checks) {
            Phase::Error
        } else {
            Phase::Ready
        };
        let status = GitHubIdentityProviderStatus {
            phase,
            conditions: conditions::merge(
                &idp.status.clone().unwrap_or_default().conditions,
                checks,
                idp.metadata.generation,
                &conditions::now(),
            ),
        };
        serde_json::to_value(status).unwrap_or_default()
    }
}

/// The `clientID` and `clientSecret` of a GitHubIdentityProvider's client Secret, or what is
/// wrong with it in Pinniped's words (the condition's message begins with it).
fn github_credentials(sources: &Sources, name: &str) -> Result<(String, String), String> {
    let Some(secret) = sources.secret(name) else {
        return Err(format!("secret \"{name}\" not found"));
    };
    let found_type = secret.type_.clone().unwrap_or_default();
    if found_type != GITHUB_CLIENT_SECRET_TYPE {
        return Err(format!("wrong secret type \"{found_type}\""));
    }
    let data = secret.data.clone().unwrap_or_default();
    let value = |key: &str| {
        data.get(key)
            .and_then(|bytes| String::from_utf8(bytes.0.clone()).ok())
            .filter(|value| !value.is_empty())
    };
    let Some(client_id) = value("clientID") else {
        return Err("missing key \"clientID\"".into());
    };
    let Some(client_secret) = value("clientSecret") else {
        return Err("missing key \"clientSecret\"".into());
    };
    if data.len() != 2 {
        return Err("extra keys found".into());
    }
    Ok((client_id, client_secret))
}
