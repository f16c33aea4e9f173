//! Nested impersonation: a caller of the proxy who sends its own `Impersonate-*` headers
//! (`kubectl --as`, `--as-group`, `--as-uid`) asks to act as someone else, which it may only do
//! where RBAC lets it `impersonate` that user, each group, the uid and each extra value.
//!
//! [`plan`] applies kube-apiserver's impersonation rules (its `WithImpersonation` filter) to what
//! was asked: who the request then acts as, and the SubjectAccessReviews that must all allow it.
//! The result keeps the caller in the extra [`ORIGINAL_USER_INFO_KEY`] (the JSON of its
//! `authentication.k8s.io/v1` `UserInfo`, as Pinniped writes it), so kube-apiserver's audit log
//! shows the original user, the impersonated user and the proxy.

use crate::{access_review::ResourceAttributes, identity::UserInfo};
use selkie_api::names::{is_dns1123_label, is_dns1123_subdomain};

use super::headers::RequestedImpersonation;

/// The extra key that carries the original caller.
pub const ORIGINAL_USER_INFO_KEY: &str = "original-user-info.impersonation-proxy.concierge.pinniped.dev";
/// Extra keys with this suffix belong to the proxy; nobody may set them.
const RESERVED_SUFFIX: &str = ".impersonation-proxy.concierge.pinniped.dev";
/// kube-apiserver's group of all authenticated users.
const ALL_AUTHENTICATED: &str = "system:authenticated";
/// kube-apiserver's group of anonymous users.
const ALL_UNAUTHENTICATED: &str = "system:unauthenticated";
/// The anonymous user.
const ANONYMOUS: &str = "system:anonymous";
/// Prefix of service-account user names.
const SERVICE_ACCOUNT_PREFIX: &str = "system:serviceaccount:";

/// A nested impersonation that cannot be honoured whatever RBAC says.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NestedError {
    /// Groups, a uid or extras were asked for without a user.
    #[error("Impersonate-Group, Impersonate-Uid and Impersonate-Extra- headers require an Impersonate-User header")]
    NoUser,
    /// An extra key reserved for the proxy was asked for, or the caller already carries one.
    #[error("the extra key {0:?} is reserved for the impersonation proxy")]
    ReservedExtra(String),
    /// An extra key that cannot be passed on faithfully (see [`check_extra_keys`]).
    #[error("the extra key {0:?} is not allowed: extra keys must match ^[a-z0-9/\\-._]+$")]
    InvalidExtraKey(String),
}

/// What a nested impersonation becomes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NestedPlan {
    /// The user the request acts as upstream, with the original caller in its extras.
    pub user: UserInfo,
    /// The permissions the caller needs, one SubjectAccessReview each.
    pub checks: Vec<ResourceAttributes>,
}

/// The extra keys of `user` that only the proxy may set, if any.
pub fn reserved_extra(user: &UserInfo) -> Option<&str> {
    user.extra
        .keys()
        .map(String::as_str)
        .find(|key| key.ends_with(RESERVED_SUFFIX))
}

/// Checks one extra key the proxy is to send upstream, as Pinniped's impersonation proxy does:
/// it must match `^[a-z0-9/\-._]+$` (the key as decoded; header names are case-insensitive and
/// kube-apiserver unescapes them, so anything else could arrive as another key), and must not
/// end in the proxy's reserved suffix (compared exactly: the character rule already refuses
/// look-alikes in another case or with whitespace).
pub fn check_extra_key(key: &str) -> Result<(), NestedError> {
    let allowed = |byte: u8| byte.is_ascii_lowercase() || byte.is_ascii_digit() || b"/-._".contains(&byte);
    if key.is_empty() || !key.bytes().all(allowed) {
        return Err(NestedError::InvalidExtraKey(key.to_string()));
    }
    if key.ends_with(RESERVED_SUFFIX) {
        return Err(NestedError::ReservedExtra(key.to_string()));
    }
    Ok(())
}

/// [`check_extra_key`] for every extra key of `user`: run on every identity the proxy
/// impersonates with its own extras, whichever authenticator produced them.
pub fn check_extra_keys(user: &UserInfo) -> Result<(), NestedError> {
    user.extra.keys().try_for_each(|key| check_extra_key(key))
}

/// kube-apiserver's `serviceaccount.SplitUsername`: `system:serviceaccount:<namespace>:<name>`
/// names a service account only when the namespace is a DNS-1123 label and the name a DNS-1123
/// subdomain (and neither holds another ':'); any other user name is an ordinary user, whose
/// impersonation needs `users/impersonate`.
pub fn service_account(username: &str) -> Option<(&str, &str)> {
    let (namespace, name) = username.strip_prefix(SERVICE_ACCOUNT_PREFIX)?.split_once(':')?;
    (is_dns1123_label(namespace) && is_dns1123_subdomain(name)).then_some((namespace, name))
}

fn impersonate(group: &str, resource: &str, name: &str) -> ResourceAttributes {
    ResourceAttributes {
        verb: "impersonate".into(),
        group: group.into(),
        resource: resource.into(),
        name: name.into(),
        ..ResourceAttributes::default()
    }
}

/// Applies kube-apiserver's impersonation rules to what `original` asked for. See the module
/// documentation. Fails for requests kube-apiserver would refuse before any authorization (no
/// user), for extra keys that [`check_extra_key`] refuses, and for a caller that carries a
/// reserved extra key itself.
pub fn plan(requested: &RequestedImpersonation, original: &UserInfo) -> Result<NestedPlan, NestedError> {
    let username = requested.user.clone().ok_or(NestedError::NoUser)?;
    for (key, _) in &requested.extra {
        check_extra_key(key)?;
    }
    if let Some(key) = reserved_extra(original) {
        return Err(NestedError::ReservedExtra(key.to_string()));
    }

    let mut checks = Vec::with_capacity(1 + requested.groups.len() + requested.extra.len());
    let mut groups = requested.groups.clone();
    match service_account(&username) {
        Some((namespace, name)) => {
            let mut check = impersonate("", "serviceaccounts", name);
            check.namespace = Some(namespace.to_string());
            checks.push(check);
            if requested.groups.is_empty() {
                // A service account's groups are fixed; kube-apiserver fills them in.
                groups = vec![
                    "system:serviceaccounts".to_string(),
                    format!("system:serviceaccounts:{namespace}"),
                ];
            }
        }
        None => checks.push(impersonate("", "users", &username)),
    }
    for group in &requested.groups {
        checks.push(impersonate("", "groups", group));
    }
    let mut extra = std::collections::BTreeMap::<String, Vec<String>>::new();
    for (key, value) in &requested.extra {
        let mut check = impersonate("authentication.k8s.io", "userextras", value);
        check.subresource = Some(key.clone());
        checks.push(check);
        extra.entry(key.clone()).or_default().push(value.clone());
    }
    if let Some(uid) = &requested.uid {
        checks.push(impersonate("authentication.k8s.io", "uids", uid));
    }

    let membership = if username == ANONYMOUS {
        ALL_UNAUTHENTICATED
    } else {
        ALL_AUTHENTICATED
    };
    if !groups.iter().any(|group| group == membership) {
        groups.push(membership.to_string());
    }
    extra.insert(
        ORIGINAL_USER_INFO_KEY.to_string(),
        vec![original_user_info(original)],
    );
    Ok(NestedPlan {
        user: UserInfo {
            username,
            uid: requested.uid.clone(),
            groups,
            extra,
        },
        checks,
    })
}

/// `original` as the JSON of an `authentication.k8s.io/v1` `UserInfo` (empty fields omitted).
fn original_user_info(original: &UserInfo) -> String {
    let mut info = serde_json::Map::new();
    info.insert("username".into(), original.username.clone().into());
    if let Some(uid) = &original.uid {
        info.insert("uid".into(), uid.clone().into());
    }
    if !original.groups.is_empty() {
        info.insert("groups".into(), original.groups.clone().into());
    }
    if !original.extra.is_empty() {
        info.insert(
            "extra".into(),
            serde_json::to_value(&original.extra).unwrap_or_default(),
        );
    }
    serde_json::Value::Object(info).to_string()
}

/// kube-apiserver's wording for a refused impersonation, e.g. `users "bob" is forbidden: User
/// "alice" cannot impersonate resource "users" in API group "" at the cluster scope`.
pub fn forbidden_message(caller: &str, check: &ResourceAttributes, reason: &str) -> String {
    let resource = match &check.subresource {
        Some(subresource) => format!("{}/{subresource}", check.resource),
        None => check.resource.clone(),
    };
    let scope = match &check.namespace {
        Some(namespace) => format!("in the namespace {namespace:?}"),
        None => "at the cluster scope".to_string(),
    };
    let mut message = format!(
        "{} {:?} is forbidden: User {caller:?} cannot impersonate resource {resource:?} in API group {:?} {scope}",
        check.resource, check.name, check.group
    );
    if !reason.is_empty() {
        message.push_str(": ");
        message.push_str(reason);
    }
    message
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alice() -> UserInfo {
        UserInfo {
            username: "alice".into(),
            groups: vec!["devs".into(), "system:authenticated".into()],
            ..UserInfo::default()
        }
    }

    fn asking(user: Option<&str>) -> RequestedImpersonation {
        RequestedImpersonation {
            user: user.map(str::to_string),
            ..RequestedImpersonation::default()
        }
    }

    #[test]
    fn a_user_gets_the_authenticated_group_and_the_original_user_in_an_extra() {
        let plan = plan(&asking(Some("bob")), &alice()).unwrap();
        assert_eq!(plan.user.username, "bob");
        assert_eq!(plan.user.groups, ["system:authenticated"]);
        assert_eq!(plan.checks, [impersonate("", "users", "bob")]);
        let original: serde_json::Value =
            serde_json::from_str(&plan.user.extra[ORIGINAL_USER_INFO_KEY][0]).unwrap();
        assert_eq!(
            original,
            serde_json::json!({"username": "alice", "groups": ["devs", "system:authenticated"]})
        );
    }

    #[test]
    fn every_group_extra_and_uid_is_checked() {
        let requested = RequestedImpersonation {
            user: Some("bob".into()),
            groups: vec!["ops".into(), "system:authenticated".into()],
            uid: Some("1234".into()),
            extra: vec![("scopes".into(), "view".into()), ("scopes".into(), "edit".into())],
        };
        let plan = plan(&requested, &alice()).unwrap();
        assert_eq!(
            plan.user.groups,
            ["ops", "system:authenticated"],
            "not added twice"
        );
        assert_eq!(plan.user.uid.as_deref(), Some("1234"));
        assert_eq!(plan.user.extra["scopes"], ["view", "edit"]);
        let resources: Vec<_> = plan
            .checks
            .iter()
            .map(|c| (c.resource.as_str(), c.subresource.as_deref(), c.name.as_str()))
            .collect();
        assert_eq!(
            resources,
            [
                ("users", None, "bob"),
                ("groups", None, "ops"),
                ("groups", None, "system:authenticated"),
                ("userextras", Some("scopes"), "view"),
                ("userextras", Some("scopes"), "edit"),
                ("uids", None, "1234"),
            ]
        );
        assert!(plan.checks[3..]
            .iter()
            .all(|c| c.group == "authentication.k8s.io"));
    }

    #[test]
    fn service_accounts_are_checked_in_their_namespace_and_get_their_groups() {
        let plan = plan(&asking(Some("system:serviceaccount:apps:builder")), &alice()).unwrap();
        assert_eq!(plan.checks.len(), 1);
        assert_eq!(plan.checks[0].resource, "serviceaccounts");
        assert_eq!(plan.checks[0].namespace.as_deref(), Some("apps"));
        assert_eq!(plan.checks[0].name, "builder");
        assert_eq!(
            plan.user.groups,
            [
                "system:serviceaccounts",
                "system:serviceaccounts:apps",
                "system:authenticated"
            ]
        );
        let dotted = super::plan(&asking(Some("system:serviceaccount:apps:builder.v2")), &alice()).unwrap();
        assert_eq!(
            dotted.checks[0].resource, "serviceaccounts",
            "a name is a subdomain"
        );
    }

    #[test]
    fn malformed_service_account_names_are_ordinary_users_as_in_kube_apiserver() {
        for odd in [
            "system:serviceaccount:apps",
            "system:serviceaccount:apps:",
            "system:serviceaccount::builder",
            "system:serviceaccount:apps:builder:x",
            "system:serviceaccount:Apps:builder",
            "system:serviceaccount:apps:Builder",
            "system:serviceaccount:apps:build_er",
            "system:serviceaccount:apps.v2:builder",
            "system:serviceaccount:-apps:builder",
            "system:serviceaccount:apps:builder ",
        ] {
            let plan = plan(&asking(Some(odd)), &alice()).unwrap();
            assert_eq!(plan.checks, [impersonate("", "users", odd)], "{odd:?}");
            assert_eq!(plan.user.groups, ["system:authenticated"], "{odd:?}");
        }
        let long_namespace = format!("system:serviceaccount:{}:builder", "n".repeat(64));
        assert_eq!(service_account(&long_namespace), None);
        let longest = format!("system:serviceaccount:{}:builder", "n".repeat(63));
        assert!(service_account(&longest).is_some());
    }

    #[test]
    fn extra_keys_must_be_lower_case_names_and_never_the_reserved_key_in_any_disguise() {
        for good in [
            "scopes",
            "example.com/team",
            "a-b_c.d/e",
            "authentication.kubernetes.io/pod-name",
        ] {
            assert_eq!(check_extra_key(good), Ok(()), "{good:?}");
        }
        for bad in [
            "",
            "Scopes",
            "scopes ",
            " scopes",
            "sco pes",
            "scopes\t",
            "scöpes",
            "a:b",
            "original-user-info.impersonation-proxy.concierge.pinniped.Dev",
            "original-user-info.impersonation-proxy.concierge.pinniped.dev ",
            "ORIGINAL-USER-INFO.impersonation-proxy.concierge.pinniped.dev",
        ] {
            assert!(
                matches!(check_extra_key(bad), Err(NestedError::InvalidExtraKey(_))),
                "{bad:?}"
            );
        }
        assert_eq!(
            check_extra_key(ORIGINAL_USER_INFO_KEY),
            Err(NestedError::ReservedExtra(ORIGINAL_USER_INFO_KEY.into()))
        );
        let mut requested = asking(Some("bob"));
        requested.extra.push((
            "original-user-info.impersonation-proxy.concierge.pinniped.Dev".into(),
            "{}".into(),
        ));
        assert!(matches!(
            plan(&requested, &alice()),
            Err(NestedError::InvalidExtraKey(_))
        ));
        let mut produced = alice();
        produced.extra.insert("Team".into(), vec!["a".into()]);
        assert!(check_extra_keys(&produced).is_err());
        produced.extra.clear();
        produced.extra.insert("team".into(), vec!["a".into()]);
        assert_eq!(check_extra_keys(&produced), Ok(()));
    }

    #[test]
    fn anonymous_is_unauthenticated() {
        let plan = plan(&asking(Some("system:anonymous")), &alice()).unwrap();
        assert_eq!(plan.user.groups, ["system:unauthenticated"]);
    }

    #[test]
    fn groups_without_a_user_and_reserved_keys_are_refused() {
        let mut requested = asking(None);
        requested.groups.push("ops".into());
        assert_eq!(plan(&requested, &alice()), Err(NestedError::NoUser));

        let mut requested = asking(Some("bob"));
        requested
            .extra
            .push((ORIGINAL_USER_INFO_KEY.into(), "{\"username\":\"root\"}".into()));
        assert!(matches!(
            plan(&requested, &alice()),
            Err(NestedError::ReservedExtra(_))
        ));

        let mut original = alice();
        original.extra.insert(
            "x.impersonation-proxy.concierge.pinniped.dev".into(),
            vec!["1".into()],
        );
        assert!(matches!(
            plan(&asking(Some("bob")), &original),
            Err(NestedError::ReservedExtra(_))
        ));
    }

    #[test]
    fn refusals_read_like_kube_apiserver() {
        let check = impersonate("", "users", "bob");
        assert_eq!(
            forbidden_message("alice", &check, ""),
            r#"users "bob" is forbidden: User "alice" cannot impersonate resource "users" in API group "" at the cluster scope"#
        );
    }
}
