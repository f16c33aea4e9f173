//! Kubernetes' object-name rules (`k8s.io/apimachinery/pkg/util/validation`), in one place for
//! every crate that must decide exactly as kube-apiserver does.

/// `IsDNS1123Label`: at most 63 lowercase ASCII letters, digits and '-', starting and ending with
/// a letter or digit. Namespace names are labels.
pub fn is_dns1123_label(name: &str) -> bool {
    name.len() <= 63 && is_label(name)
}

/// `IsDNS1123Subdomain`: at most 253 characters of dot-separated [`is_dns1123_label`]-shaped
/// labels (each non-empty; their length is bounded only by the whole). Most object names,
/// service-account names among them, are subdomains.
pub fn is_dns1123_subdomain(name: &str) -> bool {
    name.len() <= 253 && name.split('.').all(is_label)
}

fn is_label(label: &str) -> bool {
    let alnum = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    label.starts_with(alnum) && label.ends_with(alnum) && label.chars().all(|c| alnum(c) || c == '-')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_follow_kubernetes() {
        for good in ["a", "kube-system", "0", "a-b-9", &"x".repeat(63)] {
            assert!(is_dns1123_label(good), "{good:?}");
        }
        for bad in ["", "-a", "a-", "A", "a.b", "a_b", "a b", "ä", &"x".repeat(64)] {
            assert!(!is_dns1123_label(bad), "{bad:?}");
        }
    }

    #[test]
    fn subdomains_follow_kubernetes() {
        for good in ["a", "a.b", "builder", "my-sa.v2", &"x".repeat(253)] {
            assert!(is_dns1123_subdomain(good), "{good:?}");
        }
        for bad in [
            "",
            ".",
            "a.",
            ".a",
            "a..b",
            "A",
            "a_b",
            "a:b",
            " a",
            &"x".repeat(254),
        ] {
            assert!(!is_dns1123_subdomain(bad), "{bad:?}");
        }
    }
}
