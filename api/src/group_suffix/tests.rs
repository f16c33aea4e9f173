use super::*;

#[test]
fn replace_swaps_only_the_pinniped_dev_suffix() {
    assert_eq!(
        replace_group_suffix("authentication.concierge.pinniped.dev", "acme.example.com").as_deref(),
        Some("authentication.concierge.acme.example.com")
    );
    assert_eq!(
        replace_group_suffix("config.concierge.pinniped.dev", "pinniped.dev").as_deref(),
        Some("config.concierge.pinniped.dev"),
        "the default suffix is a no-op"
    );
}

#[test]
fn replace_leaves_groups_that_are_not_ours() {
    for group in [
        "apps",
        "authentication.k8s.io",
        "pinniped.dev",
        ".pinniped.dev",
        "notpinniped.dev",
        "evilpinniped.dev",
    ] {
        assert_eq!(replace_group_suffix(group, "acme.example.com"), None, "{group}");
    }
}

#[test]
fn unreplace_inverts_replace() {
    for group in [
        "authentication.concierge.pinniped.dev",
        "config.concierge.pinniped.dev",
        "login.concierge.pinniped.dev",
        "idp.supervisor.pinniped.dev",
    ] {
        let replaced = replace_group_suffix(group, "acme.example.com").unwrap();
        assert_eq!(
            unreplace_group_suffix(&replaced, "acme.example.com").as_deref(),
            Some(group)
        );
    }
    assert_eq!(
        unreplace_group_suffix("authentication.k8s.io", "acme.example.com"),
        None
    );
    assert_eq!(
        unreplace_group_suffix("x.notacme.example.com", "acme.example.com"),
        None
    );
}

#[test]
fn validate_accepts_domain_names_with_a_dot() {
    for suffix in ["pinniped.dev", "acme.example.com", "a.b", "x-1.y-2.z", "123.456"] {
        assert_eq!(validate_api_group_suffix(suffix), Ok(()), "{suffix}");
    }
}

#[test]
fn validate_rejects_what_kubernetes_rejects() {
    assert_eq!(
        validate_api_group_suffix("acme"),
        Err(GroupSuffixError::NoDot("acme".into()))
    );
    let too_long = format!("{}.com", "a".repeat(250));
    for suffix in [
        "",
        "Acme.example.com",
        "acme..com",
        ".acme.com",
        "acme.com.",
        "-acme.com",
        "acme-.com",
        "acme_corp.com",
        "acme.com/x",
        too_long.as_str(),
    ] {
        assert_eq!(
            validate_api_group_suffix(suffix),
            Err(GroupSuffixError::NotDns1123Subdomain(suffix.into())),
            "{suffix:?}"
        );
    }
}

#[test]
fn every_supervisor_group_is_rewritten_too() {
    for (group, renamed) in [
        (
            "config.supervisor.pinniped.dev",
            "config.supervisor.acme.example.com",
        ),
        ("idp.supervisor.pinniped.dev", "idp.supervisor.acme.example.com"),
        (
            "clientsecret.supervisor.pinniped.dev",
            "clientsecret.supervisor.acme.example.com",
        ),
    ] {
        assert_eq!(
            replace_group_suffix(group, "acme.example.com").as_deref(),
            Some(renamed)
        );
        assert_eq!(
            unreplace_group_suffix(renamed, "acme.example.com").as_deref(),
            Some(group)
        );
    }
    // The group constants of the Supervisor's API modules are the ones rewritten above.
    #[cfg(feature = "crds")]
    for group in [
        crate::supervisor_config::GROUP,
        crate::supervisor_idp::GROUP,
        crate::supervisor_clientsecret::GROUP,
    ] {
        assert!(
            replace_group_suffix(group, "acme.example.com").is_some(),
            "{group}"
        );
    }
}
