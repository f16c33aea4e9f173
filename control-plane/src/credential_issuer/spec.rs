//! Validation of `spec.impersonationProxy` and the parsing of `externalEndpoint`, with
//! Pinniped's rules and messages (`validateCredentialIssuerSpec`, `endpointaddr.Parse`).

use std::net::IpAddr;

use selkie_api::concierge_config::{
    ImpersonationProxyMode, ImpersonationProxyServiceType, ImpersonationProxySpec,
};

/// The HTTPS port clients use when an endpoint names none, and the Services' port.
pub(crate) const DEFAULT_HTTPS_PORT: u16 = 443;

/// A validated `host[:port]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HostPort {
    /// A DNS name or an IP address (without brackets): usable as a certificate SAN.
    pub(crate) host: String,
    /// The port, `default_port` when the input named none.
    pub(crate) port: u16,
}

impl HostPort {
    /// `host:port`, with brackets around an IPv6 address.
    pub(crate) fn endpoint(&self) -> String {
        join_host_port(&self.host, &self.port.to_string())
    }

    /// What clients are told to connect to: [`Self::endpoint`] without a `:443` suffix.
    pub(crate) fn client_endpoint(&self) -> String {
        let endpoint = self.endpoint();
        endpoint
            .strip_suffix(":443")
            .map(str::to_string)
            .unwrap_or(endpoint)
    }
}

fn join_host_port(host: &str, port: &str) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// Go's `net.SplitHostPort`: `host:port` or `[host]:port`; the error is Go's message.
fn split_host_port(input: &str) -> Result<(String, String), String> {
    let missing_port = || format!("address {input}: missing port in address");
    let Some(colon) = input.rfind(':') else {
        return Err(missing_port());
    };
    let (host, port) = (&input[..colon], &input[colon + 1..]);
    let host = if let Some(rest) = host.strip_prefix('[') {
        let Some(inner) = rest.strip_suffix(']') else {
            return Err(if input.contains(']') {
                missing_port()
            } else {
                format!("address {input}: missing ']' in address")
            });
        };
        inner
    } else {
        if host.contains(':') {
            return Err(format!("address {input}: too many colons in address"));
        }
        host
    };
    if host.contains('[') || host.contains(']') {
        return Err(format!("address {input}: unexpected '[' or ']' in address"));
    }
    Ok((host.to_string(), port.to_string()))
}

/// Parses an endpoint address (`host`, `IPv4`, `IPv6`, `host:port`, `IPv4:port`,
/// `[IPv6]:port`), with `default_port` when none is given, as Pinniped's `endpointaddr.Parse`.
pub(crate) fn parse_endpoint(input: &str, default_port: u16) -> Result<HostPort, String> {
    let (host, port) = split_host_port(input)
        .or_else(|_| split_host_port(&join_host_port(input, &default_port.to_string())))?;
    let port = match port.parse::<u16>() {
        Ok(port) if port > 0 => port,
        _ => return Err(format!("invalid port {port:?}")),
    };
    if host.parse::<IpAddr>().is_err() && !selkie_api::names::is_dns1123_subdomain(&host.to_ascii_lowercase())
    {
        return Err(format!("host {host:?} is not a valid hostname or IP address"));
    }
    Ok(HostPort { host, port })
}

/// Pinniped's `validateCredentialIssuerSpec`: `Err` is the message that follows
/// "could not load CredentialIssuer spec.impersonationProxy: ".
pub(crate) fn validate(spec: &ImpersonationProxySpec) -> Result<(), String> {
    // A disabled proxy ignores every other field.
    if spec.mode == ImpersonationProxyMode::Disabled {
        return Ok(());
    }
    if let Some(ip) = spec.service.load_balancer_ip.as_deref() {
        if !ip.is_empty() && ip.parse::<IpAddr>().is_err() {
            return Err(format!("invalid LoadBalancerIP {ip:?}"));
        }
    }
    for range in spec.service.load_balancer_source_ranges.iter().flatten() {
        if !is_cidr(range) {
            return Err(format!(
                "invalid loadBalancerSourceRanges entry {range:?}: not a CIDR such as 203.0.113.0/24"
            ));
        }
    }
    let external_endpoint = spec.external_endpoint.as_deref().unwrap_or_default();
    if external_endpoint.is_empty() && spec.service.r#type == ImpersonationProxyServiceType::None {
        return Err("externalEndpoint must be set when service.type is None".into());
    }
    if !external_endpoint.is_empty() {
        parse_endpoint(external_endpoint, DEFAULT_HTTPS_PORT)
            .map_err(|e| format!("invalid ExternalEndpoint {external_endpoint:?}: {e}"))?;
    }
    Ok(())
}

/// Whether `text` is an IPv4 or IPv6 address range in CIDR notation (`<address>/<prefix>`, the
/// prefix in decimal without sign or leading zeros, at most 32 or 128), as a Service's
/// `loadBalancerSourceRanges` takes it.
fn is_cidr(text: &str) -> bool {
    let Some((address, prefix)) = text.split_once('/') else {
        return false;
    };
    let Ok(address) = address.parse::<IpAddr>() else {
        return false;
    };
    let canonical = prefix.bytes().all(|b| b.is_ascii_digit()) && (prefix == "0" || !prefix.starts_with('0'));
    let bits = if address.is_ipv4() { 32 } else { 128 };
    canonical && prefix.parse::<u8>().is_ok_and(|prefix| prefix <= bits)
}

#[cfg(test)]
mod tests {
    use selkie_api::concierge_config::ImpersonationProxyServiceSpec;

    use super::*;

    fn spec(mode: ImpersonationProxyMode, r#type: ImpersonationProxyServiceType) -> ImpersonationProxySpec {
        ImpersonationProxySpec {
            mode,
            service: ImpersonationProxyServiceSpec {
                r#type,
                ..ImpersonationProxyServiceSpec::default()
            },
            external_endpoint: None,
            tls: None,
        }
    }

    #[test]
    fn endpoints_parse_like_pinnipeds_endpointaddr() {
        let parsed = |s: &str| parse_endpoint(s, 443).unwrap();
        assert_eq!(parsed("proxy.example.com").client_endpoint(), "proxy.example.com");
        assert_eq!(
            parsed("proxy.example.com:443").client_endpoint(),
            "proxy.example.com"
        );
        assert_eq!(
            parsed("proxy.example.com:8443").client_endpoint(),
            "proxy.example.com:8443"
        );
        assert_eq!(parsed("Proxy.Example.com").host, "Proxy.Example.com");
        assert_eq!(parsed("10.1.2.3").host, "10.1.2.3");
        assert_eq!(parsed("10.1.2.3:8443").port, 8443);
        assert_eq!(parsed("::1").host, "::1");
        assert_eq!(parsed("::1").client_endpoint(), "[::1]");
        assert_eq!(parsed("[fd00::7]:8443").client_endpoint(), "[fd00::7]:8443");

        let error = |s: &str| parse_endpoint(s, 443).unwrap_err();
        assert_eq!(error("proxy.example.com:0"), r#"invalid port "0""#);
        assert_eq!(error("proxy.example.com:http"), r#"invalid port "http""#);
        assert_eq!(error("proxy.example.com:99999"), r#"invalid port "99999""#);
        assert_eq!(
            error("bad_host!"),
            r#"host "bad_host!" is not a valid hostname or IP address"#
        );
        assert_eq!(
            error("a:b:c"),
            r#"host "a:b:c" is not a valid hostname or IP address"#
        );
        assert_eq!(error(""), r#"host "" is not a valid hostname or IP address"#);
    }

    #[test]
    fn validation_gives_pinnipeds_messages() {
        use ImpersonationProxyMode::*;
        use ImpersonationProxyServiceType::*;
        assert_eq!(
            validate(&spec(Enabled, None)).unwrap_err(),
            "externalEndpoint must be set when service.type is None"
        );
        // Disabled ignores everything else.
        validate(&spec(Disabled, None)).unwrap();
        validate(&spec(Auto, LoadBalancer)).unwrap();

        let mut bad_ip = spec(Enabled, LoadBalancer);
        bad_ip.service.load_balancer_ip = Some("1.2.3".into());
        assert_eq!(
            validate(&bad_ip).unwrap_err(),
            r#"invalid LoadBalancerIP "1.2.3""#
        );
        bad_ip.service.load_balancer_ip = Some("fd00::1".into());
        validate(&bad_ip).unwrap();

        let mut ranges = spec(Enabled, LoadBalancer);
        ranges.service.load_balancer_source_ranges = Some(vec![
            "203.0.113.0/24".into(),
            "10.0.0.7/32".into(),
            "fd00::/8".into(),
            "0.0.0.0/0".into(),
        ]);
        validate(&ranges).unwrap();
        for bad in [
            "203.0.113.0",
            "203.0.113.0/33",
            "fd00::/129",
            "10.0.0.0/+8",
            "10.0.0.0/08",
            "10.0.0/8",
            "/8",
            "",
            "any",
        ] {
            ranges.service.load_balancer_source_ranges = Some(vec!["10.0.0.0/8".into(), bad.into()]);
            assert_eq!(
                validate(&ranges).unwrap_err(),
                format!("invalid loadBalancerSourceRanges entry {bad:?}: not a CIDR such as 203.0.113.0/24"),
            );
        }
        ranges.service.load_balancer_source_ranges = Some(vec![]);
        validate(&ranges).unwrap();

        let mut bad_endpoint = spec(Enabled, None);
        bad_endpoint.external_endpoint = Some("proxy.example.com:http".into());
        assert_eq!(
            validate(&bad_endpoint).unwrap_err(),
            r#"invalid ExternalEndpoint "proxy.example.com:http": invalid port "http""#
        );
        bad_endpoint.external_endpoint = Some("proxy.example.com:8443".into());
        validate(&bad_endpoint).unwrap();
    }
}
