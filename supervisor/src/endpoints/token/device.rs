//! The device code grant (RFC 8628 §3.4): the CLI polls with its device code and PKCE verifier.
//! Until the user has finished the login in a browser the answer is `authorization_pending`
//! (`slow_down` to a client polling sooner than its interval, `expired_token` once the device
//! code expired, `access_denied` when the login failed); then the device login is marked
//! redeemed (one conditional `PATCH`: only one poll ever gets past it) and the login's
//! authorization code is redeemed as the authorization code grant redeems it, with the CLI's
//! verifier — so tokens come out once, and only to the client that asked.

use std::{collections::HashMap, sync::Arc, time::Instant};

use subtle::ConstantTimeEq as _;
use time::OffsetDateTime;

use crate::endpoints::authorize::verifier_matches;
use crate::endpoints::discovery::DEVICE_CALLBACK_PATH;
use crate::endpoints::oauth::{Code, OAuthError};
use crate::endpoints::token::code::authorization_code;
use crate::endpoints::token::{other_client, param, store_failed, TokenClient};
use crate::endpoints::Endpoints;
use crate::issuer::Issuer;
use crate::session::device::DeviceStatus;
use crate::session::store::StoreError;
use crate::session::tokens::Kind;

/// The device code grant; with `dpop_jkt`, the login it gives is bound to that DPoP key (see
/// [`authorization_code`]).
pub(crate) async fn device_code(
    endpoints: &Endpoints,
    issuer: &Arc<Issuer>,
    client: &TokenClient,
    params: &HashMap<String, String>,
    dpop_jkt: Option<&str>,
) -> Result<serde_json::Value, OAuthError> {
    if !issuer.device_authorization {
        return Err(OAuthError::new(
            Code::UnsupportedGrantType,
            "The device authorization grant is not enabled on this FederationDomain.",
        ));
    }
    let invalid = |hint: &str| OAuthError::new(Code::InvalidGrant, hint);
    let unknown = || invalid("The device code is unknown.");
    let device_code = param(params, "device_code")?;
    let verifier = param(params, "code_verifier")?;
    let device_of = issuer
        .token_key
        .check(Kind::DeviceCode, device_code)
        .ok()
        .and_then(|checked| Some((checked.signature, checked.login?)))
        .ok_or_else(|| invalid("The device code is malformed or was not issued by this FederationDomain."))?;
    let (signature, of) = device_of;
    // Before any request to kube-apiserver: a client polling too fast costs none.
    if !endpoints.device_polls.poll(of.id, Instant::now()) {
        return Err(OAuthError::new(
            Code::SlowDown,
            "Wait 5 seconds longer between polls from now on.",
        ));
    }
    let device = endpoints
        .store
        .get_device(&of.id)
        .await
        .map_err(|error| store_failed(&error))?
        .ok_or_else(unknown)?;
    let request = &device.request;
    let same_code = bool::from(
        request
            .device_code_signature
            .as_bytes()
            .ct_eq(signature.as_bytes()),
    );
    if !same_code || request.issuer != issuer.issuer {
        return Err(unknown());
    }
    if request.client_id != client.id {
        return Err(other_client());
    }
    if request.expired(OffsetDateTime::now_utc()) {
        return Err(OAuthError::new(
            Code::ExpiredToken,
            "Start the login again for a new device code.",
        ));
    }
    // Checked before the device login is marked redeemed: a poll without the verifier (someone
    // who has only the device code) must not use up the login.
    if !verifier_matches(&request.code_challenge, verifier) {
        return Err(invalid(
            "The PKCE code challenge did not match the code verifier.",
        ));
    }
    match &device.status {
        DeviceStatus::Pending => Err(OAuthError::new(
            Code::AuthorizationPending,
            "The user has not finished the login in the browser yet.",
        )),
        DeviceStatus::Denied { error } => Err(OAuthError::new(
            Code::AccessDenied,
            &format!("The login in the browser ended with the error {error:?}."),
        )),
        DeviceStatus::Redeemed => Err(invalid("The device code has already been used.")),
        DeviceStatus::Approved { code } => {
            match endpoints
                .store
                .change_device_status(&of.id, &device.status, &DeviceStatus::Redeemed)
                .await
            {
                Ok(true) => {}
                Ok(false) => return Err(unknown()),
                Err(StoreError::Conflict) => return Err(invalid("The device code has already been used.")),
                Err(error) => return Err(store_failed(&error)),
            }
            let redemption = HashMap::from([
                ("code".to_string(), code.clone()),
                (
                    "redirect_uri".to_string(),
                    format!("{}{DEVICE_CALLBACK_PATH}", issuer.issuer),
                ),
                ("code_verifier".to_string(), verifier.to_string()),
            ]);
            authorization_code(endpoints, issuer, client, &redemption, dpop_jkt).await
        }
    }
}
