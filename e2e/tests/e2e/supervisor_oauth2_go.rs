//! The pinniped CLI's own OAuth 2.0 library, golang.org/x/oauth2, at the Supervisor's token
//! endpoint: with the library's defaults (the public client `pinniped-cli`, no secret, client
//! authentication auto-detected), every token request is first sent with HTTP Basic
//! `pinniped-cli:` (an empty secret) and no `client_id` in the body. Pinniped's Supervisor accepts
//! that for its public client, so the CLI redeems a code and refreshes with one request each;
//! Selkie must too — refusing it with `invalid_client` made the library retry every grant with
//! `client_id` in the body, and counted an `invalid_client` each time.

use selkie_e2e::{
    ldap::{LdapUser, Slapd},
    oauth2_go::{self, Grant, TokenRequest},
    pinniped_cli,
    supervisor::Supervisor,
    Cluster,
};

const IDP_NAME: &str = "Corp LDAP";
const PASSWORD: &str = "seal-of-approval";
const GRANTS_METRIC: &str = "selkie_supervisor_token_grants_total{";

/// Fails unless `grant` returned the tokens a Pinniped login returns (`pin_at_` and `pin_rt_`
/// tokens, an ID token, type Bearer, an expiry in the future).
fn ensure_pinniped_tokens(name: &str, grant: Option<&Grant>) -> anyhow::Result<()> {
    let grant = grant.ok_or_else(|| anyhow::anyhow!("{name}: not attempted"))?;
    anyhow::ensure!(
        grant.ok
            && grant.token_type.eq_ignore_ascii_case("bearer")
            && grant.has_access_token
            && grant.access_token_pinniped_format
            && grant.has_refresh_token
            && grant.refresh_token_pinniped_format
            && grant.has_id_token
            && grant.expiry_set
            && grant.expires_in_future,
        "{name}: {grant:?}"
    );
    Ok(())
}

#[tokio::test]
async fn the_pinniped_clis_oauth2_library_authenticates_with_basic_and_an_empty_secret_at_once(
) -> anyhow::Result<()> {
    let cluster = Cluster::shared().await?;
    let client = cluster.client().await?;
    let namespace = cluster.create_namespace(&client, "supervisor-oauth2-go").await?;
    let slapd = Slapd::start(&[LdapUser {
        uid: "pinny".into(),
        password: PASSWORD.into(),
        uid_number: 1001,
        groups: vec!["seals".into()],
    }])
    .await?;
    let supervisor = Supervisor::start(cluster, &namespace, &slapd, IDP_NAME).await?;
    cluster
        .kubectl()
        .run(&[
            "wait",
            "-n",
            &namespace,
            "--timeout=60s",
            "--for=jsonpath={.status.phase}=Ready",
            "ldapidentityprovider/openldap",
        ])
        .await
        .map_err(|e| crate::with_log(e, supervisor.log()))?;

    // The authorization request of the cli_password flow, as the pinniped CLI sends it: a code.
    let http = supervisor.client()?;
    let (base, path) = pinniped_cli::split_issuer(supervisor.issuer());
    let authorize = pinniped_cli::authorize_url(
        &base,
        &path,
        &["pinniped_idp_name"],
        &[("pinniped_idp_name", IDP_NAME)],
    );
    let params =
        pinniped_cli::redirected(&pinniped_cli::get(&http, &authorize, Some(PASSWORD), "pinny").await?)
            .map_err(|e| crate::with_log(e, supervisor.log()))?;
    anyhow::ensure!(
        pinniped_cli::param(&params, "state") == Some(pinniped_cli::STATE),
        "{params:?}"
    );
    let code = pinniped_cli::param(&params, "code")
        .ok_or_else(|| anyhow::anyhow!("no code: {params:?}"))?
        .to_string();

    // golang.org/x/oauth2 redeems it and refreshes, with its defaults.
    let report = oauth2_go::redeem_and_refresh(supervisor.issuer(), &supervisor.ca_pem(), &code).await?;
    let metrics = supervisor.metrics().await?;
    let grants: Vec<&str> = metrics
        .lines()
        .filter(|line| line.starts_with(GRANTS_METRIC))
        .collect();
    let token_statuses: Vec<&str> = metrics
        .lines()
        .filter(|line| line.starts_with("selkie_supervisor_requests_total{endpoint=\"token\","))
        .collect();
    let context = format!(
        "the library's token requests: {:#?}\nthe Supervisor's token grants: {grants:#?}\nits token \
         endpoint's answers: {token_statuses:#?}",
        report.token_requests
    );

    // The Supervisor counted no refused client: the library's first attempt was accepted.
    for grant_type in ["authorization_code", "refresh_token"] {
        let refused = format!("{GRANTS_METRIC}grant_type=\"{grant_type}\",result=\"invalid_client\"}}");
        anyhow::ensure!(
            !grants.iter().any(|line| line.starts_with(&refused)),
            "{grant_type}: the Supervisor refused the library's Basic authentication with an empty \
             secret (invalid_client) before accepting client_id in the body\n{context}"
        );
        let ok = format!("{GRANTS_METRIC}grant_type=\"{grant_type}\",result=\"ok\"}} 1");
        anyhow::ensure!(grants.contains(&ok.as_str()), "{ok} is not counted\n{context}");
    }
    anyhow::ensure!(
        token_statuses == ["selkie_supervisor_requests_total{endpoint=\"token\",code=\"200\"} 2"],
        "the token endpoint answered other than two 200s\n{context}"
    );

    // Both grants worked, each with one request authenticated as golang.org/x/oauth2 first tries.
    anyhow::ensure!(
        report.ok && report.error.is_empty(),
        "{report:?}\n{}",
        supervisor.log()
    );
    anyhow::ensure!(
        report.token_endpoint == format!("{}/oauth2/token", supervisor.issuer()),
        "{}",
        report.token_endpoint
    );
    anyhow::ensure!(
        report.code_challenge == pinniped_cli::challenge() && report.code_challenge_method == "S256",
        "the library's PKCE challenge is not the authorization request's: {report:?}"
    );
    ensure_pinniped_tokens("the code", report.exchange.as_ref())?;
    ensure_pinniped_tokens("the refresh", report.refresh.as_ref())?;
    anyhow::ensure!(
        report
            .refresh
            .as_ref()
            .and_then(|grant| grant.refresh_token_rotated)
            == Some(true),
        "the refresh token was not rotated: {report:?}"
    );
    let basic_with_empty_secret = |grant_type: &str| TokenRequest {
        grant_type: grant_type.into(),
        auth: "basic".into(),
        basic_client_id: pinniped_cli::CLIENT_ID.into(),
        basic_secret_empty: true,
        body_client_id: String::new(),
        body_client_secret: false,
        status: 200,
        error: String::new(),
    };
    anyhow::ensure!(
        report.token_requests
            == [
                basic_with_empty_secret("authorization_code"),
                basic_with_empty_secret("refresh_token"),
            ],
        "not one accepted Basic request per grant\n{context}"
    );

    // The program reported facts, not tokens.
    anyhow::ensure!(
        !report.output.contains("pin_at_")
            && !report.output.contains("pin_rt_")
            && !report.output.contains(&code),
        "the client printed a token or the code"
    );
    Ok(())
}
