//! Directory answers and typed usernames into the Supervisor's LDAP and Active Directory identity
//! providers (`selkie_supervisor::fuzzing`): search result entries as the directory client reads
//! them off the wire (`ldap_entry`), entries as a login and a refresh read them (`ldap_identity`,
//! `ldap_group_filter`, `ldap_group_names`, `active_directory_refresh`), and search filters made
//! of what users type (`ldap_fill_filter`). No directory is asked.
//!
//! The selector's bits 0-1 pick the mode: 0, the rest is a BER-encoded `SearchResultEntry`, read
//! and then used as a user's entry; 1, the rest describes entries — split at 0xFE, the user's first
//! and then groups; each `DN, 0x00, attributes split by 0x00`, an attribute `name, 0x01, values
//! split by 0x02` (binary values when the name starts with 0x03); 2 and 3, the rest (lossy UTF-8)
//! is a value filled into the filter templates of [`TEMPLATES`]. Bit 2 makes the directory Active
//! Directory; bits 3-4 pick the UID attribute (`dn`, `uidNumber`, `objectGUID`, `entryUUID`),
//! bit 5 the username attribute (`dn`, else `uid` — `userPrincipalName` for Active Directory),
//! bit 6 a group name attribute (`cn`, else the default), bit 7 `uid` as the group search's user
//! attribute instead of the DN.
//!
//! Invariants (a violation panics): no panic leaves the Supervisor's code (ldap3 panics on an
//! entry it cannot read; the Supervisor catches that, so the target lets that one panic pass
//! silently); an identity has the entry's DN, the username attribute's one value, the UID as
//! that attribute's value in base64url (a GUID string for Active Directory's `objectGUID`), no
//! groups, and `pwdLastSet` among its refresh attributes exactly for Active Directory; a refresh
//! of the very entry of the login never finds the password changed; group names are sorted
//! without duplicates, with `@<domain>` by Active Directory's default; and every filter made of a
//! value is one ldap3 parses to the template's structure, with the value, unescaped, where the
//! template has `{}`.

#![no_main]

use std::collections::{BTreeMap, HashMap};

use base64::{engine::general_purpose::URL_SAFE_NO_PAD, Engine as _};
use ldap3::asn1::{ASNTag as _, StructureTag, PL};
use libfuzzer_sys::fuzz_target;
use selkie_fuzz::text;
use selkie_supervisor::{
    fuzzing::{
        active_directory_refresh, directory, ldap_entry, ldap_fill_filter, ldap_group_filter,
        ldap_group_names, ldap_identity, microsoft_guid, Entry,
    },
    Directory, Flavor, GroupSearch, UserSearch,
};

/// Filter templates, `{}` standing for the value (user filters and group filters).
const TEMPLATES: [&str; 4] = [
    "uid={}",
    "(&(objectClass=person)(|(uid={})(mail={})))",
    "(&(objectClass=group)(member:1.2.840.113556.1.4.1941:={}))",
    "(&(objectClass=posixGroup)(memberUid={}))",
];
const UID_ATTRIBUTES: [&str; 4] = ["dn", "uidNumber", "objectGUID", "entryUUID"];

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    match selector & 0b11 {
        0 => {
            let Some(read) = read_entry(rest) else {
                return;
            };
            if let Ok(entry) = read {
                let directory = directory_of(selector);
                login(&directory, selector, &entry, &[entry.clone()]);
            }
        }
        1 => {
            let mut entries = rest.split(|byte| *byte == 0xfe).map(entry_of);
            let Some(user) = entries.next() else {
                return;
            };
            let groups: Vec<Entry> = entries.collect();
            login(&directory_of(selector), selector, &user, &groups);
        }
        _ => {
            let value = text(rest);
            for template in TEMPLATES {
                filter_holds(template, &value);
            }
        }
    }
});

/// The entry ldap3 reads from `ber`, with the panic hook silenced: ldap3 panics on an entry it
/// cannot read and the Supervisor catches that; any panic that comes out is still a crash.
fn read_entry(ber: &[u8]) -> Option<Result<Entry, selkie_supervisor::LdapError>> {
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let read = std::panic::catch_unwind(|| ldap_entry(ber));
    std::panic::set_hook(hook);
    match read {
        Ok(read) => read,
        Err(_) => panic!("reading a search result entry panicked through the Supervisor"),
    }
}

fn directory_of(selector: u8) -> Directory {
    let active_directory = selector & 0b100 != 0;
    let username = match (selector & 0x20 != 0, active_directory) {
        (true, _) => "dn",
        (false, true) => "userPrincipalName",
        (false, false) => "uid",
    };
    directory(
        if active_directory {
            Flavor::ActiveDirectory
        } else {
            Flavor::Ldap
        },
        UserSearch {
            base: "dc=fuzz,dc=test".into(),
            filter: String::new(),
            username_attribute: username.into(),
            uid_attribute: UID_ATTRIBUTES[usize::from((selector >> 3) & 0b11)].into(),
        },
        GroupSearch {
            base: "ou=groups,dc=fuzz,dc=test".into(),
            filter: if selector & 0x80 != 0 {
                "(&(objectClass=posixGroup)(memberUid={}))".into()
            } else {
                String::new()
            },
            user_attribute_for_filter: (selector & 0x80 != 0).then(|| "uid".into()),
            group_name_attribute: if selector & 0x40 != 0 {
                "cn".into()
            } else {
                String::new()
            },
            skip_group_refresh: false,
        },
    )
    .expect("a directory")
}

fn entry_of(bytes: &[u8]) -> Entry {
    let mut parts = bytes.split(|byte| *byte == 0);
    let mut entry = Entry {
        dn: text(parts.next().unwrap_or_default()),
        ..Entry::default()
    };
    for attribute in parts {
        let (name, values) = match attribute.iter().position(|byte| *byte == 1) {
            Some(at) => (&attribute[..at], &attribute[at + 1..]),
            None => (attribute, &[][..]),
        };
        let values = values.split(|byte| *byte == 2);
        match name.strip_prefix(&[3]) {
            Some(name) => entry
                .bin_attrs
                .push((text(name), values.map(<[u8]>::to_vec).collect())),
            None => entry.attrs.push((text(name), values.map(text).collect())),
        }
    }
    entry
}

/// The one non-empty value of `attribute` in `entry`, names compared without case: an entry
/// naming the attribute more than once (as text or binary) has none. As the directory client
/// reads it, a name repeated exactly keeps its last values (the entry's attributes are maps).
fn single_value(entry: &Entry, attribute: &str) -> Option<Vec<u8>> {
    if attribute == "dn" {
        return Some(entry.dn.as_bytes().to_vec());
    }
    let text: HashMap<&str, Vec<Vec<u8>>> = entry
        .attrs
        .iter()
        .map(|(name, values)| {
            (
                name.as_str(),
                values.iter().map(|value| value.as_bytes().to_vec()).collect(),
            )
        })
        .collect();
    let binary: HashMap<&str, Vec<Vec<u8>>> = entry
        .bin_attrs
        .iter()
        .map(|(name, values)| (name.as_str(), values.clone()))
        .collect();
    let mut found = text
        .iter()
        .chain(binary.iter())
        .filter(|(name, _)| name.eq_ignore_ascii_case(attribute));
    match (found.next(), found.next()) {
        (Some((_, values)), None) => match values.as_slice() {
            [value] if !value.is_empty() => Some(value.clone()),
            _ => None,
        },
        _ => None,
    }
}

fn login(directory: &Directory, selector: u8, user: &Entry, groups: &[Entry]) {
    let active_directory = selector & 0b100 != 0;
    let config = directory.config();
    if let Ok(identity) = ldap_identity(directory, user) {
        assert_eq!(identity.dn, user.dn);
        assert!(identity.groups.is_empty(), "groups before the group search");
        let username = single_value(user, &config.user_search.username_attribute)
            .expect("an identity whose username attribute has no single value");
        assert_eq!(identity.username.as_bytes(), username.as_slice(), "the username");
        let uid_attribute = &config.user_search.uid_attribute;
        let raw = single_value(user, uid_attribute).expect("a UID attribute without a single value");
        if active_directory && uid_attribute == "objectGUID" {
            assert_eq!(
                Some(identity.uid.clone()),
                microsoft_guid(&raw),
                "the objectGUID as a GUID"
            );
            assert_eq!(identity.uid.len(), 36, "{}", identity.uid);
        } else {
            assert_eq!(identity.uid, URL_SAFE_NO_PAD.encode(&raw), "the UID in base64url");
        }
        assert_eq!(
            identity.refresh_attributes.contains_key("pwdLastSet"),
            active_directory,
            "{:?}",
            identity.refresh_attributes
        );
        if active_directory {
            let at_login: BTreeMap<String, String> = identity.refresh_attributes.clone();
            if let Err(error) = active_directory_refresh(user, &at_login) {
                assert!(
                    !error.to_string().contains("password changed"),
                    "the entry of the login looks changed to itself: {error}"
                );
            }
        }
    }
    if let Ok(filter) = ldap_group_filter(directory, user) {
        let value = if selector & 0x80 != 0 {
            single_value(user, "uid").map(|value| text(&value))
        } else {
            Some(user.dn.clone())
        };
        let value = value.expect("a group filter without the value it is made of");
        let template = if selector & 0x80 != 0 {
            "(&(objectClass=posixGroup)(memberUid={}))"
        } else {
            "member={}"
        };
        assert_eq!(filter, ldap_fill_filter(template, &value), "the group filter");
        filter_holds(template, &value);
    }
    if let Ok(names) = ldap_group_names(directory, groups) {
        assert!(names.len() <= groups.len(), "more group names than groups");
        assert!(
            names.windows(2).all(|pair| pair[0] < pair[1]),
            "group names not sorted or with duplicates: {names:?}"
        );
        if active_directory && selector & 0x40 == 0 {
            assert!(names.iter().all(|name| name.contains('@')), "{names:?}");
        }
    }
}

/// `value` filled into `template` parses to the structure of a plain value filled in, with
/// `value` where the template has `{}`.
fn filter_holds(template: &str, value: &str) {
    if value.is_empty() {
        return;
    }
    let filled = ldap_fill_filter(template, value);
    let plain = ldap_fill_filter(template, "x");
    let parsed = ldap3::parse_filter(&filled)
        .unwrap_or_else(|()| panic!("ldap3 cannot parse the filter {filled:?}"))
        .into_structure();
    let expected = ldap3::parse_filter(&plain)
        .expect("a plain filter parses")
        .into_structure();
    let mut found = Vec::new();
    assert!(
        same_shape(&parsed, &expected, &mut found),
        "the value {value:?} changed the filter's structure: {filled:?}"
    );
    assert!(!found.is_empty(), "the value is nowhere in {filled:?}");
    for at in found {
        assert_eq!(at, value.as_bytes(), "the value as the filter carries it");
    }
}

/// Whether `tag` has the structure of `expected`; collects the primitive values of `tag` where
/// `expected` has `x` (the plain value).
fn same_shape(tag: &StructureTag, expected: &StructureTag, found: &mut Vec<Vec<u8>>) -> bool {
    if tag.class != expected.class || tag.id != expected.id {
        return false;
    }
    match (&tag.payload, &expected.payload) {
        (PL::P(value), PL::P(plain)) => {
            if plain.as_slice() == b"x" {
                found.push(value.clone());
                true
            } else {
                value == plain
            }
        }
        (PL::C(children), PL::C(expected_children)) => {
            children.len() == expected_children.len()
                && children
                    .iter()
                    .zip(expected_children)
                    .all(|(child, expected)| same_shape(child, expected, found))
        }
        _ => false,
    }
}
