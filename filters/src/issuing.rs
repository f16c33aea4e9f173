//! Issuing cluster credentials: the Concierge's login API ([`login_api`]: TokenCredentialRequest
//! and WhoAmIRequest, served by the proxy and the aggregated API alike) and the client
//! certificate signer it issues with ([`signer`]).

pub mod login_api;
pub mod signer;
