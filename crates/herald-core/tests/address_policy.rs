//! Tests of the SSRF address policy (`herald_core::address`) against the shared vectors, the deny list as the
//! design writes it (an independent copy, so a typo in the implementation's table cannot hide), and properties
//! over random addresses.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use herald_core::address::{AddressDenied, AddressPolicy, DenyRule, TargetHost, UrlRejected};
use ipnet::IpNet;
use proptest::prelude::*;

const VECTORS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/vectors/ssrf-urls.txt");

/// The deny list exactly as STACK.md / the brief write it, plus the documented extras (`::/8` reserved,
/// `3fff::/20` documentation), and the embedding forms that are denied as a whole (`::ffff:0:0/96`, `::/96`).
const SPEC_DENIED: &[&str] = &[
    "0.0.0.0/8",
    "10.0.0.0/8",
    "100.64.0.0/10",
    "127.0.0.0/8",
    "169.254.0.0/16",
    "172.16.0.0/12",
    "192.0.0.0/24",
    "192.0.2.0/24",
    "192.88.99.0/24",
    "192.168.0.0/16",
    "198.18.0.0/15",
    "198.51.100.0/24",
    "203.0.113.0/24",
    "224.0.0.0/4",
    "240.0.0.0/4",
    "255.255.255.255/32",
    "::/128",
    "::1/128",
    "::ffff:0:0/96",
    "::/96",
    "64:ff9b::/96",
    "64:ff9b:1::/48",
    "100::/64",
    "2001::/23",
    "2001:db8::/32",
    "2002::/16",
    "fc00::/7",
    "fe80::/10",
    "fec0::/10",
    "ff00::/8",
    // Documented extras beyond the brief's list.
    "::/8",
    "3fff::/20",
];

fn spec_nets() -> Vec<IpNet> {
    SPEC_DENIED.iter().map(|s| s.parse().unwrap()).collect()
}

fn in_spec(ip: IpAddr) -> bool {
    spec_nets().iter().any(|n| n.contains(&ip))
}

fn strict() -> AddressPolicy {
    AddressPolicy::new(vec![], true)
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn net(s: &str) -> IpNet {
    s.parse().unwrap()
}

/// Sections of the vectors file: (section letter, lines), comments and blanks dropped.
fn vector_sections() -> Vec<(char, Vec<String>)> {
    let text = std::fs::read_to_string(VECTORS).unwrap_or_else(|e| panic!("reading {VECTORS}: {e}"));
    let mut sections: Vec<(char, Vec<String>)> = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            sections.push((name.chars().next().unwrap(), Vec::new()));
            continue;
        }
        sections
            .last_mut()
            .expect("URL before the first section")
            .1
            .push(line.to_owned());
    }
    sections
}

fn section(letter: char) -> Vec<String> {
    vector_sections()
        .into_iter()
        .filter(|(l, _)| *l == letter)
        .flat_map(|(_, urls)| urls)
        .collect()
}

// ---------------------------------------------------------------------------------------------------------------
// The shared vectors
// ---------------------------------------------------------------------------------------------------------------

#[test]
fn vectors_section_a_loopback_is_rejected() {
    let urls = section('A');
    assert!(urls.len() >= 19, "section A looks truncated: {urls:?}");
    for url in urls {
        let url = url.replace("{port}", "8080");
        match strict().check_url(&url) {
            Err(UrlRejected::Denied(AddressDenied { rule, .. })) => {
                assert_eq!(rule, DenyRule::Loopback, "{url}")
            }
            Err(UrlRejected::LocalhostName) => {}
            other => panic!("{url} was not refused as loopback: {other:?}"),
        }
    }
}

#[test]
fn vectors_section_b_other_denied_ranges_are_rejected() {
    let urls = section('B');
    assert!(urls.len() >= 26, "section B looks truncated: {urls:?}");
    for url in urls {
        match strict().check_url(&url) {
            Err(UrlRejected::Denied(d)) => {
                assert_ne!(d.rule, DenyRule::Loopback, "{url} is in section B, not A");
                assert!(d.cidr().is_some(), "{url}: {d}");
            }
            other => panic!("{url} was not refused by the address policy: {other:?}"),
        }
    }
}

#[test]
fn vectors_section_c_is_rejected_for_its_scheme() {
    let urls = section('C');
    for url in &urls {
        match strict().check_url(url) {
            Err(UrlRejected::SchemeNotAllowed(scheme)) => {
                assert!(url.starts_with(&scheme), "{url}: {scheme}")
            }
            other => panic!("{url} was not refused for its scheme: {other:?}"),
        }
    }
}

#[test]
fn vector_sections_are_all_known() {
    for (letter, urls) in vector_sections() {
        assert!(
            matches!(letter, 'A' | 'B' | 'C'),
            "unknown section [{letter}]: teach this test about it"
        );
        assert!(!urls.is_empty(), "section [{letter}] is empty");
    }
}

// ---------------------------------------------------------------------------------------------------------------
// URL parsing and the shape checks
// ---------------------------------------------------------------------------------------------------------------

#[test]
fn public_addresses_and_names_pass() {
    let p = AddressPolicy::new(vec![], false);
    for a in [
        "93.184.215.14",
        "1.1.1.1",
        "8.8.8.8",
        "2606:4700::1111",
        "2a00:1450:4001::200e",
    ] {
        p.check_ip(ip(a)).unwrap_or_else(|e| panic!("{a}: {e}"));
    }
    let t = p.check_url("https://example.com/hook").unwrap();
    assert_eq!(t.host, TargetHost::Domain("example.com".into()));
    assert_eq!(t.port, 443);
    assert_eq!(t.url.as_str(), "https://example.com/hook");

    let t = p.check_url("https://93.184.215.14/hook").unwrap();
    assert_eq!(t.host, TargetHost::Ip(ip("93.184.215.14")));

    let t = p.check_url("https://[2606:4700::1111]:8443/x?y=1").unwrap();
    assert_eq!(t.host, TargetHost::Ip(ip("2606:4700::1111")));
    assert_eq!(t.port, 8443);
    assert_eq!(t.host.to_string(), "[2606:4700::1111]");
}

#[test]
fn http_only_when_allowed() {
    let https_only = AddressPolicy::new(vec![], false);
    assert!(!https_only.allows_http());
    assert_eq!(
        https_only.check_url("http://example.com/hook"),
        Err(UrlRejected::SchemeNotAllowed("http".into()))
    );
    let with_http = AddressPolicy::new(vec![], true);
    assert!(with_http.allows_http());
    let t = with_http.check_url("http://example.com/hook").unwrap();
    assert_eq!(t.port, 80);
    // Scheme matching is case-insensitive (WHATWG lower-cases it) and never widened beyond http(s).
    assert!(https_only.check_url("HTTPS://example.com/").is_ok());
    for url in [
        "ws://example.com/",
        "wss://example.com/",
        "data:text/plain,x",
        "blob:https://example.com/x",
    ] {
        assert!(
            matches!(with_http.check_url(url), Err(UrlRejected::SchemeNotAllowed(_))),
            "{url}"
        );
    }
}

#[test]
fn allowlist_opens_only_its_range() {
    let p = AddressPolicy::new(vec![net("127.0.0.0/8")], true);
    assert_eq!(p.allow_cidrs(), &[net("127.0.0.0/8")]);
    p.check_ip(ip("127.0.0.1")).unwrap();
    p.check_ip(ip("::ffff:127.0.0.1")).unwrap();
    p.check_ip(ip("127.255.0.9")).unwrap();
    assert_eq!(p.check_ip(ip("10.0.0.1")).unwrap_err().rule, DenyRule::Private);
    assert_eq!(p.check_ip(ip("::ffff:10.0.0.1")).unwrap_err().rule, DenyRule::Private);
    // ::1 is not an alias of 127.0.0.1; it needs its own entry.
    assert_eq!(p.check_ip(ip("::1")).unwrap_err().rule, DenyRule::Loopback);
    // With 127.0.0.1 allowlisted, localhost names are acceptable (the resolver still vets what they resolve to).
    let t = p.check_url("http://localhost:8080/hook").unwrap();
    assert_eq!(t.host, TargetHost::Domain("localhost".into()));
    assert_eq!(t.port, 8080);
    p.check_url("http://[::ffff:127.0.0.1]:8080/hook").unwrap();
    assert!(matches!(p.check_url("http://10.0.0.1/"), Err(UrlRejected::Denied(_))));

    let v6 = AddressPolicy::new(vec![net("fd00:ec2::/32"), net("::1/128")], false);
    v6.check_ip(ip("fd00:ec2::254")).unwrap();
    v6.check_ip(ip("::1")).unwrap();
    assert!(v6.check_ip(ip("fd01::1")).is_err());
    // Allowlisting ::1 does not allowlist 127.0.0.1, so localhost names stay refused.
    assert_eq!(v6.check_url("https://localhost/"), Err(UrlRejected::LocalhostName));
}

#[test]
fn allowlist_applies_to_embedded_ipv4() {
    let p = AddressPolicy::new(vec![net("10.0.0.0/8")], false);
    for a in ["::ffff:10.1.2.3", "::10.1.2.3", "64:ff9b::a01:203", "2002:a01:203::1"] {
        p.check_ip(ip(a)).unwrap_or_else(|e| panic!("{a}: {e}"));
    }
    assert!(p.check_ip(ip("::ffff:192.168.0.1")).is_err());
    // The embedding form itself can also be allowlisted directly.
    let p = AddressPolicy::new(vec![net("64:ff9b::/96")], false);
    p.check_ip(ip("64:ff9b::a00:5")).unwrap();
}

#[test]
fn whatwg_normalises_obfuscated_ipv4_before_the_check() {
    // With loopback allowlisted, the obfuscated spellings pass, which shows what they normalise to.
    let p = AddressPolicy::new(vec![net("127.0.0.0/8")], true);
    let cases = [
        ("http://127.1/", "127.0.0.1"),
        ("http://127.0.1/", "127.0.0.1"),
        ("http://2130706433/", "127.0.0.1"),
        ("http://0x7f000001/", "127.0.0.1"),
        ("http://0x7f.0.0.1/", "127.0.0.1"),
        ("http://0177.0.0.1/", "127.0.0.1"),
        ("http://017700000001/", "127.0.0.1"),
        ("http://%31%32%37.0.0.1/", "127.0.0.1"),
        ("http://127.0.0.1./", "127.0.0.1"),
        ("http://１２７．０．０．１/", "127.0.0.1"),
        ("http://127。0。0。1/", "127.0.0.1"),
        ("http:\\\\127.0.0.1\\x", "127.0.0.1"),
        ("http:127.0.0.1/", "127.0.0.1"),
        (" http://127.0.0.1/ ", "127.0.0.1"),
        ("http://127.0.0.\t1/", "127.0.0.1"),
        ("http://[0:0:0:0:0:ffff:7f00:1]/", "::ffff:127.0.0.1"),
    ];
    for (url, want) in cases {
        let t = p.check_url(url).unwrap_or_else(|e| panic!("{url}: {e}"));
        assert_eq!(t.host, TargetHost::Ip(ip(want)), "{url}");
        // And the strict policy refuses every one of them.
        assert!(matches!(strict().check_url(url), Err(UrlRejected::Denied(_))), "{url}");
    }
}

#[test]
fn ipv6_zone_ids_are_rejected_by_the_parser() {
    for url in [
        "http://[fe80::1%25eth0]/",
        "http://[fe80::1%eth0]/",
        "http://[::1%25lo]:8080/",
        "http://[v1.fe80::a+en1]/",
    ] {
        assert!(
            matches!(strict().check_url(url), Err(UrlRejected::Unparseable(_))),
            "{url}"
        );
    }
}

#[test]
fn localhost_names_are_rejected_in_every_spelling() {
    for url in [
        "http://localhost/",
        "http://LOCALHOST/",
        "http://LocalHost./",
        "http://localhost%2e/",
        "http://api.localhost/",
        "http://A.B.LOCALHOST./",
        "http://ｌｏｃａｌｈｏｓｔ/",
        "https://user:pw@localhost:443/",
    ] {
        assert_eq!(strict().check_url(url), Err(UrlRejected::LocalhostName), "{url}");
    }
    // Names that merely contain the word are ordinary domains.
    for url in [
        "http://localhost.example.com/",
        "http://notlocalhost/",
        "http://localhostx/",
    ] {
        assert!(strict().check_url(url).is_ok(), "{url}");
    }
}

#[test]
fn domain_is_lower_cased_and_trailing_dot_stripped() {
    let t = strict().check_url("HTTPS://Example.COM./Hook").unwrap();
    assert_eq!(t.host, TargetHost::Domain("example.com".into()));
    assert_eq!(t.url.as_str(), "https://example.com./Hook");
    let t = strict().check_url("https://bücher.example/").unwrap();
    assert_eq!(t.host, TargetHost::Domain("xn--bcher-kva.example".into()));
}

#[test]
fn malformed_hosts_are_rejected() {
    for url in [
        "http://./",
        "http://a..b/",
        "http://example.com../",
        "http://.example.com/",
    ] {
        assert!(
            matches!(strict().check_url(url), Err(UrlRejected::InvalidDomain(_))),
            "{url}"
        );
    }
    let long_label = format!("https://{}.example/", "a".repeat(64));
    assert!(matches!(
        strict().check_url(&long_label),
        Err(UrlRejected::InvalidDomain(_))
    ));
    for url in [
        "",
        "not a url",
        "https://",
        "http://:80/",
        "https://exa mple.com/",
        "http://1.2.3.4.5/",
    ] {
        assert!(
            matches!(strict().check_url(url), Err(UrlRejected::Unparseable(_))),
            "{url:?}"
        );
    }
}

#[test]
fn userinfo_is_ignored_the_host_counts() {
    let t = strict().check_url("https://user:pass@example.com/hook").unwrap();
    assert_eq!(t.host, TargetHost::Domain("example.com".into()));
    let t = strict().check_url("https://127.0.0.1@example.com/").unwrap();
    assert_eq!(t.host, TargetHost::Domain("example.com".into()));
    assert!(matches!(
        strict().check_url("https://example.com@127.0.0.1/"),
        Err(UrlRejected::Denied(_))
    ));
}

#[test]
fn the_host_is_the_one_the_connection_uses() {
    // Every trick that makes a URL *look* like it goes somewhere else: the host WHATWG (and so the client)
    // connects to is the one checked.
    let loopback = AddressPolicy::new(vec![net("127.0.0.0/8")], true);
    for (url, host, port) in [
        ("http://a@127.0.0.1/", "127.0.0.1", 80),
        ("http://example.com@127.0.0.1:8080/", "127.0.0.1", 8080),
        ("http://user:pass@127.0.0.1/", "127.0.0.1", 80),
        ("http://a@b@127.0.0.1/", "127.0.0.1", 80),
        ("http://example.com:443@127.0.0.1/", "127.0.0.1", 80),
        // A backslash is a path separator in special schemes: the host ends before it.
        ("http://127.0.0.1\\@example.com/", "127.0.0.1", 80),
        ("http://127.0.0.1:8080\\@example.com/", "127.0.0.1", 8080),
        ("http://127.0.0.1/@example.com/", "127.0.0.1", 80),
        ("http://127.0.0.1?@example.com/", "127.0.0.1", 80),
        ("http://127.0.0.1#@example.com/", "127.0.0.1", 80),
        ("http://%31%32%37%2e0.0.1/", "127.0.0.1", 80),
        ("http://127.0.0.1.:80/", "127.0.0.1", 80),
    ] {
        let t = loopback.check_url(url).unwrap_or_else(|e| panic!("{url}: {e}"));
        assert_eq!(t.host, TargetHost::Ip(ip(host)), "{url}");
        assert_eq!(t.port, port, "{url}");
        assert_eq!(t.url.host_str(), Some(host), "{url}");
        // Without the allowlist, the same URL is refused as loopback: the check saw the real host.
        assert!(
            matches!(strict().check_url(url), Err(UrlRejected::Denied(d)) if d.rule == DenyRule::Loopback),
            "{url}"
        );
    }
    // The reverse: a loopback-looking userinfo, fragment or path does not make a public host refused.
    for url in [
        "https://127.0.0.1@example.com/",
        "https://example.com/127.0.0.1",
        "https://example.com#@127.0.0.1",
        "https://example.com?@127.0.0.1",
    ] {
        let t = strict().check_url(url).unwrap_or_else(|e| panic!("{url}: {e}"));
        assert_eq!(t.host, TargetHost::Domain("example.com".into()), "{url}");
    }
}

#[test]
fn other_schemes_are_refused_whatever_the_other_settings() {
    let open = AddressPolicy::new(vec![net("0.0.0.0/0"), net("::/0")], true);
    for url in [
        "file:///etc/passwd",
        "file://localhost/etc/passwd",
        "gopher://example.com:70/_x",
        "ftp://example.com/",
        "data:text/plain,x",
        "javascript:alert(1)",
        "dict://example.com:11211/",
        "ldap://example.com/",
        "sftp://example.com/",
        "tftp://example.com/x",
        "jar:http://example.com/x!/",
        "netdoc:///etc/passwd",
        "ws://example.com/",
        "view-source:http://example.com/",
        "mailto:a@example.com",
        " gopher://example.com/",
    ] {
        for policy in [strict(), open.clone()] {
            assert!(
                matches!(policy.check_url(url), Err(UrlRejected::SchemeNotAllowed(_))),
                "{url}: {:?}",
                policy.check_url(url)
            );
        }
    }
}

#[test]
fn port_allowlist() {
    let p = strict().with_allowed_ports([8443, 443, 443]);
    assert_eq!(p.allowed_ports(), &[443, 8443]);
    assert_eq!(p.check_url("https://example.com/").unwrap().port, 443);
    assert_eq!(p.check_url("https://example.com:443/").unwrap().port, 443);
    assert_eq!(p.check_url("https://example.com:8443/").unwrap().port, 8443);
    // http's default port 80 is not in the list, whether written or implied.
    for (url, port) in [
        ("http://example.com/", 80),
        ("http://example.com:80/", 80),
        ("https://example.com:6379/", 6379),
        ("https://93.184.215.14:22/", 22),
        ("https://user@example.com:25/", 25),
    ] {
        let e = p.check_url(url).unwrap_err();
        assert_eq!(
            e,
            UrlRejected::PortNotAllowed {
                port,
                allowed: vec![443, 8443]
            },
            "{url}"
        );
        assert_eq!(e.code(), "port_not_allowed");
        assert_eq!(
            e.to_string(),
            format!("endpoint URL port {port} is not allowed; the port allowlist is 443, 8443")
        );
    }
    // No list: any port but 0.
    assert_eq!(strict().check_url("https://example.com:6379/").unwrap().port, 6379);
    assert_eq!(
        strict().check_url("https://example.com:0/").unwrap_err().to_string(),
        "endpoint URL port 0 is not allowed"
    );
    assert!(p.check_port(0).is_err());
    // The address check comes first, so a denied host is reported as such even on an allowed port.
    assert!(matches!(
        p.check_url("https://10.0.0.1:443/"),
        Err(UrlRejected::Denied(_))
    ));
}

#[test]
fn rejection_messages_are_user_facing() {
    let e = strict().check_url("http://127.0.0.1:8080/hook").unwrap_err();
    assert_eq!(
        e.to_string(),
        "endpoint URL host is not allowed: 127.0.0.1 is loopback (127.0.0.0/8)"
    );
    assert_eq!(e.code(), "address_denied");
    let e = strict().check_url("file:///etc/passwd").unwrap_err();
    assert!(e.to_string().contains("`file`"), "{e}");
    assert_eq!(e.code(), "scheme_not_allowed");
    let e = strict().check_url("http://[::ffff:a9fe:a9fe]/").unwrap_err();
    assert_eq!(
        e.to_string(),
        "endpoint URL host is not allowed: ::ffff:169.254.169.254 embeds 169.254.169.254, which is link-local (169.254.0.0/16)"
    );
    assert_eq!(UrlRejected::LocalhostName.code(), "localhost_name");
    assert_eq!(UrlRejected::MissingHost.to_string(), "endpoint URL has no host");
}

// ---------------------------------------------------------------------------------------------------------------
// One test per DenyRule
// ---------------------------------------------------------------------------------------------------------------

/// (rule, stable code, sample addresses, expected CIDR for the first sample)
const RULE_SAMPLES: &[(DenyRule, &str, &[&str], &str)] = &[
    (DenyRule::Unspecified, "unspecified", &["0.0.0.0", "::"], "0.0.0.0/32"),
    (
        DenyRule::ThisNetwork,
        "this_network",
        &["0.0.0.1", "0.255.255.255"],
        "0.0.0.0/8",
    ),
    (
        DenyRule::Private,
        "private",
        &["10.0.0.5", "172.16.0.1", "172.31.255.254", "192.168.1.1"],
        "10.0.0.0/8",
    ),
    (
        DenyRule::SharedAddressSpace,
        "shared_address_space",
        &["100.64.0.1", "100.100.100.200", "100.127.255.255"],
        "100.64.0.0/10",
    ),
    (
        DenyRule::Loopback,
        "loopback",
        &["127.0.0.1", "127.255.255.254", "::1"],
        "127.0.0.0/8",
    ),
    (
        DenyRule::LinkLocal,
        "link_local",
        &["169.254.169.254", "fe80::1", "febf::1"],
        "169.254.0.0/16",
    ),
    (
        DenyRule::IetfProtocol,
        "ietf_protocol",
        &["192.0.0.1", "192.0.0.170", "2001:1::1", "2001:20::1", "2001:1ff::1"],
        "192.0.0.0/24",
    ),
    (
        DenyRule::Documentation,
        "documentation",
        &["192.0.2.1", "198.51.100.7", "203.0.113.200", "2001:db8::1", "3fff::1"],
        "192.0.2.0/24",
    ),
    (
        DenyRule::Benchmarking,
        "benchmarking",
        &["198.18.0.1", "198.19.255.255", "2001:2::1"],
        "198.18.0.0/15",
    ),
    (
        DenyRule::SixToFourRelayAnycast,
        "six_to_four_relay_anycast",
        &["192.88.99.1"],
        "192.88.99.0/24",
    ),
    (
        DenyRule::Multicast,
        "multicast",
        &["224.0.0.1", "239.255.255.250", "ff02::1", "ff0e::1"],
        "224.0.0.0/4",
    ),
    (
        DenyRule::Reserved,
        "reserved",
        &["240.0.0.1", "255.255.255.254", "1::1", "ff::1"],
        "240.0.0.0/4",
    ),
    (
        DenyRule::Broadcast,
        "broadcast",
        &["255.255.255.255"],
        "255.255.255.255/32",
    ),
    (
        DenyRule::UniqueLocal,
        "unique_local",
        &["fc00::1", "fd00:ec2::254", "fd12:3456::1"],
        "fc00::/7",
    ),
    (DenyRule::SiteLocal, "site_local", &["fec0::1", "feff::1"], "fec0::/10"),
    (
        DenyRule::Ipv4Mapped,
        "ipv4_mapped",
        &["::ffff:93.184.215.14", "::ffff:1.1.1.1"],
        "::ffff:0:0/96",
    ),
    (
        DenyRule::Ipv4Compatible,
        "ipv4_compatible",
        &["::93.184.215.14", "::1.1.1.1"],
        "::/96",
    ),
    (
        DenyRule::Nat64,
        "nat64",
        &["64:ff9b::5db8:d70e", "64:ff9b::1.1.1.1", "64:ff9b:1::5db8:d70e"],
        "64:ff9b::/96",
    ),
    (
        DenyRule::SixToFour,
        "six_to_four",
        &["2002:5db8:d70e::1", "2002:101:101::"],
        "2002::/16",
    ),
    (
        DenyRule::Teredo,
        "teredo",
        &["2001::1", "2001:0:4136:e378:8000:63bf:3fff:fdd2"],
        "2001::/32",
    ),
    (
        DenyRule::Discard,
        "discard",
        &["100::", "100::ffff:ffff:ffff:ffff"],
        "100::/64",
    ),
];

#[test]
fn every_rule_has_samples() {
    for rule in DenyRule::ALL {
        assert!(
            RULE_SAMPLES.iter().any(|(r, ..)| *r == rule),
            "{rule:?} has no sample in RULE_SAMPLES"
        );
    }
    assert_eq!(RULE_SAMPLES.len(), DenyRule::ALL.len());
}

#[test]
fn each_rule_denies_its_samples_with_its_code_and_cidr() {
    for (rule, code, samples, cidr) in RULE_SAMPLES {
        assert_eq!(rule.name(), *code);
        for (i, s) in samples.iter().enumerate() {
            let denied = strict().check_ip(ip(s)).expect_err(s);
            assert_eq!(denied.rule, *rule, "{s}");
            assert_eq!(denied.ip, ip(s));
            assert!(
                rule.ranges().iter().any(|n| n.contains(&ip(s))),
                "{s} outside {rule:?}'s ranges"
            );
            if i == 0 {
                assert_eq!(denied.cidr(), Some(net(cidr)), "{s}");
                let msg = denied.to_string();
                assert!(msg.starts_with(&format!("{} is ", ip(s))), "{msg}");
                assert!(msg.ends_with(&format!("({})", net(cidr))), "{msg}");
            }
            // The URL path reaches the same verdict for the literal.
            let url = match ip(s) {
                IpAddr::V4(a) => format!("https://{a}/"),
                IpAddr::V6(a) => format!("https://[{a}]/"),
            };
            assert_eq!(strict().check_url(&url), Err(UrlRejected::Denied(denied)), "{url}");
        }
        // Display on the rule lists the family's CIDRs.
        let shown = rule.to_string();
        for n in rule.ranges() {
            assert!(shown.contains(&n.to_string()), "{shown} lacks {n}");
        }
        assert!(shown.starts_with(rule.description()));
    }
}

#[test]
fn loopback_message_matches_the_documented_example() {
    let d = strict().check_ip(ip("127.0.0.1")).unwrap_err();
    assert_eq!(d.to_string(), "127.0.0.1 is loopback (127.0.0.0/8)");
    assert_eq!(DenyRule::Loopback.to_string(), "loopback (127.0.0.0/8, ::1/128)");
}

#[test]
fn implementation_ranges_match_the_spec_list() {
    let spec = spec_nets();
    let ours: Vec<IpNet> = DenyRule::ALL.iter().flat_map(|r| r.ranges().iter().copied()).collect();
    for n in &spec {
        assert!(ours.iter().any(|o| o.contains(n)), "spec range {n} not covered");
    }
    for o in &ours {
        assert!(
            spec.iter().any(|n| n.contains(o)),
            "implementation denies {o}, which the spec list lacks"
        );
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Properties
// ---------------------------------------------------------------------------------------------------------------

/// A random address inside `net`: its network bits, random host bits.
fn inside(net: IpNet, bits: u128) -> IpAddr {
    match net {
        IpNet::V4(n) => {
            let host = u32::from(n.hostmask()) & (bits as u32);
            IpAddr::V4(Ipv4Addr::from(u32::from(n.network()) | host))
        }
        IpNet::V6(n) => {
            let host = u128::from(n.hostmask()) & bits;
            IpAddr::V6(Ipv6Addr::from(u128::from(n.network()) | host))
        }
    }
}

fn spec_v4_nets() -> Vec<IpNet> {
    spec_nets().into_iter().filter(|n| matches!(n, IpNet::V4(_))).collect()
}

fn denied_v4() -> impl Strategy<Value = Ipv4Addr> {
    (proptest::sample::select(spec_v4_nets()), any::<u128>()).prop_map(|(n, bits)| match inside(n, bits) {
        IpAddr::V4(a) => a,
        IpAddr::V6(_) => unreachable!(),
    })
}

fn url_for(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(a) => format!("https://{a}:8443/hook"),
        IpAddr::V6(a) => format!("https://[{a}]:8443/hook"),
    }
}

proptest! {
    #[test]
    fn any_address_inside_a_denied_range_is_denied(
        n in proptest::sample::select(spec_nets()),
        bits in any::<u128>(),
    ) {
        let a = inside(n, bits);
        let denied = strict().check_ip(a);
        prop_assert!(denied.is_err(), "{a} inside {n} passed");
        prop_assert!(matches!(strict().check_url(&url_for(a)), Err(UrlRejected::Denied(_))));
    }

    #[test]
    fn embeddings_of_denied_ipv4_are_denied_as_that_ipv4(v4 in denied_v4(), low in any::<u128>()) {
        let want = strict().check_ip(IpAddr::V4(v4)).unwrap_err().rule;
        let bits = u32::from(v4) as u128;
        let subnet_and_iid = low & ((1u128 << 80) - 1);
        let forms = [
            ("mapped", Ipv6Addr::from(0xffff_0000_0000u128 | bits)),
            ("compatible", Ipv6Addr::from(bits)),
            ("nat64", Ipv6Addr::from((0x0064_ff9bu128 << 96) | bits)),
            ("nat64-local", Ipv6Addr::from((0x0064_ff9b_0001u128 << 80) | bits)),
            ("6to4", Ipv6Addr::from((0x2002u128 << 112) | (bits << 80) | subnet_and_iid)),
        ];
        for (form, a) in forms {
            let d = strict().check_ip(IpAddr::V6(a));
            prop_assert!(d.is_err(), "{form} {a} of {v4} passed");
            let d = d.unwrap_err();
            // `::` and `::1` are themselves unspecified/loopback rather than compatible forms of 0.0.0.x.
            if !(form == "compatible" && bits <= 1) {
                prop_assert_eq!(d.rule, want, "{} {} of {}: {}", form, a, v4, d);
            }
            prop_assert!(matches!(strict().check_url(&url_for(IpAddr::V6(a))), Err(UrlRejected::Denied(_))));
        }
    }

    #[test]
    fn embeddings_are_denied_even_for_public_ipv4(v4 in any::<u32>()) {
        let v4 = Ipv4Addr::from(v4);
        prop_assume!(!in_spec(IpAddr::V4(v4)));
        let bits = u32::from(v4) as u128;
        let forms = [
            (DenyRule::Ipv4Mapped, Ipv6Addr::from(0xffff_0000_0000u128 | bits)),
            (DenyRule::Ipv4Compatible, Ipv6Addr::from(bits)),
            (DenyRule::Nat64, Ipv6Addr::from((0x0064_ff9bu128 << 96) | bits)),
            (DenyRule::SixToFour, Ipv6Addr::from((0x2002u128 << 112) | (bits << 80))),
        ];
        for (rule, a) in forms {
            prop_assert_eq!(strict().check_ip(IpAddr::V6(a)).unwrap_err().rule, rule, "{}", a);
        }
        strict().check_ip(IpAddr::V4(v4)).unwrap();
    }

    #[test]
    fn allowlisted_loopback_passes_in_mapped_form(host in any::<u32>()) {
        let p = AddressPolicy::new(vec![net("127.0.0.0/8")], true);
        let v4 = Ipv4Addr::from(0x7f00_0000 | (host & 0x00ff_ffff));
        prop_assert!(p.check_ip(IpAddr::V4(v4)).is_ok());
        prop_assert!(p.check_ip(IpAddr::V6(v4.to_ipv6_mapped())).is_ok());
        let ten = Ipv4Addr::from(0x0a00_0000 | (host & 0x00ff_ffff));
        prop_assert_eq!(p.check_ip(IpAddr::V4(ten)).unwrap_err().rule, DenyRule::Private);
    }

    #[test]
    fn random_ipv4_outside_all_ranges_passes(a in any::<u32>()) {
        let a = IpAddr::V4(Ipv4Addr::from(a));
        prop_assume!(!in_spec(a));
        prop_assert!(strict().check_ip(a).is_ok(), "{}", a);
        let t = strict().check_url(&url_for(a)).unwrap();
        prop_assert_eq!(t.host, TargetHost::Ip(a));
        prop_assert_eq!(t.port, 8443);
    }

    #[test]
    fn random_ipv6_outside_all_ranges_passes(a in any::<u128>(), global in any::<bool>()) {
        // Half the cases inside global unicast 2000::/3, where real endpoints live.
        let a = if global { (a >> 3) | (1u128 << 125) } else { a };
        let a = IpAddr::V6(Ipv6Addr::from(a));
        prop_assume!(!in_spec(a));
        prop_assert!(strict().check_ip(a).is_ok(), "{}", a);
        prop_assert!(strict().check_url(&url_for(a)).is_ok());
    }

    #[test]
    fn a_port_outside_the_allowlist_never_passes(port in any::<u16>(), host in any::<u32>()) {
        let p = strict().with_allowed_ports([443, 8443]);
        let a = IpAddr::V4(Ipv4Addr::from(host));
        prop_assume!(!in_spec(a));
        let url = format!("https://{a}:{port}/hook");
        let passed = p.check_url(&url).is_ok();
        prop_assert_eq!(passed, port == 443 || port == 8443, "{}", url);
    }

    #[test]
    fn check_url_never_panics_and_never_returns_a_denied_literal(s in "\\PC{0,60}") {
        for url in [s.clone(), format!("https://{s}"), format!("http://{s}:8080/")] {
            if let Ok(t) = strict().check_url(&url) {
                match t.host {
                    TargetHost::Ip(a) => prop_assert!(strict().check_ip(a).is_ok()),
                    TargetHost::Domain(d) => {
                        prop_assert!(!d.is_empty() && !d.ends_with('.'));
                        prop_assert_eq!(d.to_ascii_lowercase(), d.clone());
                        prop_assert!(d != "localhost" && !d.ends_with(".localhost"));
                    }
                }
            }
        }
    }
}
