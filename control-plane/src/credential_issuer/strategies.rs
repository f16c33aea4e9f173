//! `status.strategies` of the CredentialIssuer: Pinniped's order, merging by type, and writing
//! only what changed.

use super::*;

/// `lastUpdateTime` for a strategy written now (whole seconds, as Kubernetes stores them).
pub fn now() -> Time {
    let now = k8s_openapi::jiff::Timestamp::now();
    Time(k8s_openapi::jiff::Timestamp::from_second(now.as_second()).unwrap_or(now))
}

/// Preference order of strategies in `status.strategies` (Pinniped's weights).
pub(super) fn strategy_weight(strategy: &Value) -> u8 {
    match strategy.get("type").and_then(Value::as_str) {
        Some("KubeClusterSigningCertificate") => 2,
        Some("ImpersonationProxy") => 1,
        _ => 0,
    }
}

pub(super) fn without_time(strategy: &Value) -> Value {
    let mut strategy = strategy.clone();
    if let Some(object) = strategy.as_object_mut() {
        object.remove("lastUpdateTime");
    }
    strategy
}

/// `strategies` with `strategy` merged in (Pinniped's `mergeStrategy`): the entry of the same
/// type replaced, others kept, sorted by preference then type. `None` when nothing but
/// `lastUpdateTime` would change.
pub(super) fn merge_strategy(strategies: &[Value], strategy: Value) -> Option<Vec<Value>> {
    let mut merged = strategies.to_vec();
    match merged.iter_mut().find(|s| s.get("type") == strategy.get("type")) {
        Some(existing) if without_time(existing) == without_time(&strategy) => {}
        Some(existing) => *existing = strategy,
        None => merged.push(strategy),
    }
    merged.sort_by(|a, b| {
        strategy_weight(b).cmp(&strategy_weight(a)).then_with(|| {
            let type_of = |s: &Value| {
                s.get("type")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string()
            };
            type_of(a).cmp(&type_of(b))
        })
    });
    (merged != strategies).then_some(merged)
}

/// Replaces the entry of `strategy.type` in the status of the CredentialIssuer
/// `config.credential_issuer_name` (keeping the other entries, in Pinniped's order), writing only
/// when something but `lastUpdateTime` changed. Retries a few times on write conflicts. Does not
/// check leadership: callers write only while they lead.
///
/// Fails when the CredentialIssuer cannot be read or its status written.
pub async fn set_strategy(
    client: &Client,
    config: &ControlPlaneConfig,
    strategy: CredentialIssuerStrategy,
) -> Result<(), CredentialIssuerError> {
    let name = &config.credential_issuer_name;
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &config.api_resource::<CredentialIssuer>());
    let status_error = |message: String| CredentialIssuerError::Status {
        name: name.clone(),
        message,
    };
    let entry = serde_json::to_value(&strategy).map_err(|e| status_error(e.to_string()))?;
    let mut attempt = 0;
    loop {
        attempt += 1;
        let current = api
            .get(name)
            .await
            .map_err(|source| CredentialIssuerError::Kube {
                action: format!("reading CredentialIssuer {name}"),
                source,
            })?;
        let strategies = match current.data.get("status").and_then(|s| s.get("strategies")) {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(strategies)) => strategies.clone(),
            Some(_) => return Err(status_error("status.strategies is not a list".into())),
        };
        let Some(merged) = merge_strategy(&strategies, entry.clone()) else {
            return Ok(());
        };
        let patch = json!({
            "metadata": {"resourceVersion": current.metadata.resource_version},
            "status": {"strategies": merged},
        });
        match api
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(status)) if status.is_conflict() && attempt < 5 => continue,
            Err(source) => {
                return Err(CredentialIssuerError::Kube {
                    action: format!("writing the status of CredentialIssuer {name}"),
                    source,
                })
            }
        }
    }
}
